//! Envoy's rate limit service: its configuration files and descriptor matching.
//!
//! Sluice is meant to replace the reference rate limit service,
//! [github.com/envoyproxy/ratelimit](https://github.com/envoyproxy/ratelimit), without changes
//! on the Envoy side or in the configuration. This module reads that service's YAML files
//! unchanged ([`RlsConfig::load_dir`]) and finds, for a request descriptor, the rule the
//! reference would apply and the counter it would count in ([`RlsConfig::get_limit`]). It is
//! pure: no I/O besides reading the files, no async, no gRPC.
//!
//! # What is mirrored, and where it comes from
//!
//! The behaviour follows the reference's source (current `main`: the version with
//! `quota_mode`, `value_to_metric`, `share_threshold` and wildcards anywhere in a value):
//!
//! * **File format** (`src/config/config_impl.go`, `YamlRoot`/`YamlDescriptor`/
//!   `YamlRateLimit`, read with `gopkg.in/yaml.v2`): `domain`, `descriptors`, and per
//!   descriptor `key`, `value`, `rate_limit` (`unit`, `requests_per_unit`, `unlimited`, `name`,
//!   `replaces: [{name}]`), `shadow_mode`, `quota_mode`, `detailed_metric`,
//!   `value_to_metric`, `share_threshold` and nested `descriptors`. Scalars convert as in
//!   yaml.v2 (YAML 1.1: `yes`/`on` are booleans, a string field takes the raw text); see the
//!   `yaml` submodule.
//! * **Unknown keys** (`validateYamlKeys`): every mapping key anywhere in the file must be one
//!   of the keys above, else the file is rejected; lists may hold only mappings; numbers may
//!   not be floating-point. A known key in the wrong place is *ignored* by the reference (its
//!   YAML decoding is not strict); Sluice ignores it too and reports a [`RlsConfigWarning`].
//! * **Units** (`strings.ToUpper(unit)` looked up in `rls.proto`'s `RateLimit.Unit`, and
//!   `UnitToDivider` in `src/utils/utilities.go`): `second`, `minute`, `hour`, `day`, `week`
//!   (7 days), `month` (30 days), `year` (365 days), in any letter case. See [`Unit`].
//! * **Validation** (`loadConfig`, `loadDescriptors`), each a [`RlsConfigError`] naming the
//!   file and line: empty or missing `domain`; a domain defined in two files (unless
//!   [`LoadOptions::merge_domains`], the reference's `MERGE_DOMAIN_CONFIG`); a descriptor
//!   without `key`; two descriptors with the same key and value at one level; a rate limit
//!   whose `unit` is missing or unknown; `unlimited: true` together with a valid `unit`
//!   (`requests_per_unit` alongside `unlimited` is accepted and ignored, as in the reference);
//!   an empty `replaces` name or one equal to the rule's own `name`; `share_threshold`
//!   without `*` in the value. `requests_per_unit: 0` is valid (everything is over the limit).
//! * **Loading a directory** (`src/config/file_provider.go` with `lyft/goruntime`'s loader):
//!   every file under the directory, in subdirectories too, whatever its extension; see
//!   [`RlsConfig::load_dir`].
//! * **Matching** (`GetLimit`): see [`RlsConfig::get_limit`].
//! * **Counter key** (`GenerateCacheKey`, `src/limiter/cache_key.go`): see [`Match`].
//! * **`replaces`, `unlimited`, `shadow_mode`** (`constructLimitsToCheck` and
//!   `shouldRateLimitWorker` in `src/service/ratelimit.go`, `GetResponseDescriptorStatus` in
//!   `src/limiter/base_limiter.go`): see [`RlsConfig::get_limits`] and [`Rule`].
//!
//! * **The limit a request descriptor carries** (`descriptor.limit`, checked first in
//!   `GetLimit`): see [`RlsConfig::override_limit`].
//!
//! Not here: the service-level handling of the response codes and its gRPC adapter (the
//! server's `rls::service` and `rls::grpc`).

pub mod answer;
mod config;
mod decode;
mod error;
mod matcher;
mod policies;
pub mod request;
pub mod rlqs;
mod rule;
mod scalar;
mod tree;
mod unit;
pub mod xds;
mod yaml;

pub use config::{Asked, LoadOptions, RlsConfig, is_kubelet_entry};
pub use error::{RlsConfigError, RlsConfigWarning};
pub use policies::{RulePolicies, rule_policy};
pub use rule::{Match, Rule};
pub use unit::Unit;
