//! The Sluice server: the HTTP JSON API, Envoy's rate limit gRPC API and its rate limit quota
//! service ([`rlqs`]), configuration and metrics. [`app::run`] is the server, which tests
//! start on port-0 listeners; the `sluice` binary (crate `sluice-cli`) only parses the
//! command line and calls it. Only what serving needs is here: the load generator is
//! `sluice-bench`.
//!
//! # Module map
//!
//! The crate is layered: a module imports (through `crate::`/`super::` paths) only from its
//! own layer or the layers below it, never from above, so it reads top-down and no two files
//! name each other. A module in a folder belongs to the row of its longest listed path. The
//! table is the rule: a test (`tests/api/layer_rule.rs`) reads it from
//! this file and fails when a source file imports from a layer above its own.
//!
//! | layer | modules |
//! |-------|---------|
//! | 0 leaves | `reply`, `tls`, `conn`, `reflection`, `rlqs::assign`, `url`, `xds_settings`, `observe::metrics::settings`, `observe::top::settings`, `observe::traces::settings` |
//! | 1 configuration | `config` |
//! | 2 observation | `observe` |
//! | 3 runtime | `state`, `reload` |
//! | 4 surfaces | `http`, `rls`, `rlqs`, `rls_xds` |
//! | 5 composition | `app` |
//!
//! * **Leaves** know nothing of the server (and the text forms every surface reads, policy
//!   entries, durations, duplicate-refusing JSON and YAML and `FieldError`, are the crate
//!   `sluice_spec` below it, the Envoy rule language is the crate `sluice_envoy_rules` and
//!   the simulator engine the crate `sluice_simulate`): the JSON error body (`reply`), TLS
//!   and the connection loop ([`tls`], [`conn`]), the gRPC reflection's descriptors
//!   ([`reflection`]), the RLQS share maths (`rlqs::assign`) and where the xDS control plane
//!   is ([`xds_settings`]).
//! * **Configuration** ([`config`]) reads and validates the file, each section in its own
//!   module; the sections of observation (`metrics`, `top`, `tracing`) are read by the
//!   `settings` leaves of their [`observe`] modules, which the configuration composes.
//! * **Observation** ([`observe`]) is the metrics (those recorded and those computed at each
//!   scrape), the decision counts, the top keys and the OTLP traces of decisions.
//! * **Runtime** ([`state`]) is what requests read: the current policies over the store;
//!   `reload` watches the configuration and swaps them.
//! * **Surfaces** translate a protocol to the runtime and back: HTTP ([`http`]), Envoy RLS
//!   (the semantics in [`rls::service`], the protobuf in [`rls::grpc`]), RLQS ([`rlqs`]),
//!   and the xDS client that brings Envoy rules from a control plane ([`rls_xds`]).
//! * **Composition** ([`app`]) binds it together and spawns the servers.

pub mod app;
pub mod config;
pub(crate) mod conn;
pub mod http;
pub mod observe;
pub mod reflection;
pub(crate) mod reload;
pub(crate) mod reply;
pub(crate) mod rlqs;
pub(crate) mod rls;
pub mod rls_xds;
pub mod state;
pub(crate) mod tls;
pub mod url;
pub mod xds_settings;

/// The heavy-hitter summaries, for the `top` benchmark.
pub use observe::top;
