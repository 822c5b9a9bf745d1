//! The configuration file (docs/configuration.md), parsed and validated in one pass.
//!
//! Every value is checked while it is read, so an error carries the file, the line and the
//! path of the value, e.g. `sluice.yaml:7:15: policies.api.limits[1].per: `0s` is not a
//! positive duration`; a check that needs a whole section (or two: an `rlqs` rule and the
//! policies) names the path, and its line is found from it ([`locate`]). Parse, don't
//! validate: what comes out is a [`Config`] of valid [`Policy`]s, addresses and durations.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::path::Path;

use serde::Deserialize;
use sluice::Policy;

pub use sluice_spec::FieldError;
use sluice_spec::policy_entry::{RawPolicy, entry_policy};
pub use sluice_spec::units::PositiveDuration;

/// The default HTTP address.
pub const DEFAULT_HTTP: SocketAddr = SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 8080));
/// The default gRPC address.
pub const DEFAULT_GRPC: SocketAddr = SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 8081));

/// A configuration that cannot be used, with where and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}{}: {message}", .line.map(|(l, c)| format!(":{l}:{c}")).unwrap_or_default())]
pub struct ConfigError {
    /// The file (or `<built-in>`).
    pub file: String,
    /// Line and column, when known.
    pub line: Option<(usize, usize)>,
    /// What is wrong, with the path of the value.
    pub message: String,
}

impl ConfigError {
    /// `e`, found in `file` (whose text is `text`): its line is that of the value its path
    /// names, when the text has one there.
    fn at(file: &str, text: &str, e: FieldError) -> Self {
        Self {
            file: file.to_owned(),
            line: locate::locate(text, &e.path),
            message: e.to_string(),
        }
    }
}

pub use sluice::FailureMode;

pub mod admin;
mod listen;
mod locate;
mod overrides;
mod rls;
mod store;
pub mod store_regions;
mod yaml;
use self::listen::{RawListen, listen_config};
pub use self::overrides::{
    ConfigSource, Declared, Explained, Given, NoFile, Override, Overrides, SETTINGS, Setting,
};
use self::rls::RawRls;
pub use self::rls::{ResponseHeaders, RlsSettings, RulesSource};
use crate::observe::metrics::settings::{MetricsSettings, RawMetrics, metrics_config};
use crate::observe::top::settings::{RawTop, TopSettings, top_config};
use crate::observe::traces::settings::{RawTracing, TraceSettings, trace_config};
pub use crate::url::ConfiguredUrl;
use store::{RawStore, store_config};
use yaml::read_raw;

/// A secret the configuration points at but never holds (`admin.tokens_file`,
/// `store.auth.password_env`): the text of a file (relative to the configuration file) or of
/// an environment variable, exactly one of them, so that the file can be shared without it.
struct Secret<'a> {
    /// The section: `admin`, `store.auth`.
    at: &'a str,
    /// The file's key and the file.
    file: (&'a str, Option<std::path::PathBuf>),
    /// The variable's key and the variable.
    env: (&'a str, Option<String>),
    /// What to say when neither or both are given.
    neither: &'a str,
}

impl Secret<'_> {
    /// The text, never shown in an error.
    fn read(self, base: Option<&Path>) -> Result<String, FieldError> {
        let at = |key: &str| format!("{}.{key}", self.at);
        match (self.file, self.env) {
            ((key, Some(file)), (_, None)) => {
                let path = sluice_spec::relative_to(base, file);
                std::fs::read_to_string(&path).map_err(|e| {
                    FieldError::new(at(key), format!("cannot read {}: {e}", path.display()))
                })
            }
            ((_, None), (key, Some(var))) => std::env::var(&var).map_err(|_| {
                FieldError::new(
                    at(key),
                    format!("the environment variable {var} is not set (or not UTF-8)"),
                )
            }),
            _ => Err(FieldError::new(self.at, self.neither)),
        }
    }
}

/// Where peeks read and where "now" comes from: the Redis library's own types, read from
/// YAML through its `serde` feature, so both speak the same words.
pub use sluice_redis::{ClockSource, ReadFrom};

/// `store.sentinel` (and `store.regions.primary.sentinel`) as written: the master's name and
/// the sentinels (`nodes`).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawSentinel {
    pub(super) master: String,
    pub(super) nodes: Vec<String>,
}

impl RawSentinel {
    /// The Sentinel topology at `path` (`store.sentinel`): a master named, a sentinel listed.
    fn topology(self, path: &str) -> Result<sluice_redis::Topology, FieldError> {
        if self.nodes.is_empty() {
            return Err(FieldError::new(
                format!("{path}.nodes"),
                "list at least one sentinel URL",
            ));
        }
        if self.master.is_empty() {
            return Err(FieldError::new(
                format!("{path}.master"),
                "name the monitored master",
            ));
        }
        Ok(sluice_redis::Topology::Sentinel {
            master: self.master,
            sentinels: self.nodes,
        })
    }
}

/// The store: in this process, or Redis as the Redis library's own [`RedisConfig`] (client-side
/// shards, a Cluster, or a Sentinel-monitored primary, with every setting of `store`), built by
/// the store section while it is read.
///
/// [`RedisConfig`]: sluice_redis::RedisConfig
#[derive(Debug, Clone, PartialEq, Eq)]
// Built once per (re)load and matched a few times: its size does not matter.
#[allow(clippy::large_enum_variant)]
pub enum StoreConfig {
    /// In this process.
    Memory,
    /// Redis.
    Redis(sluice_redis::RedisConfig),
    /// One limit across regions (`store.regions`, docs/regions.md): this region's own Redis
    /// and local replicas of the other regions', each a [`RedisConfig`](sluice_redis::RedisConfig)
    /// with every setting of `store`.
    Regions(sluice_redis::RegionsConfig),
}

/// A whole, valid configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// Who may use the admin routes (`admin`); `None`: anyone who reaches the port.
    pub admin: Option<crate::config::admin::AdminConfig>,
    /// Local token reservation (`local.enabled`), with its settings.
    pub local: Option<sluice::ReserveConfig>,
    /// HTTP listen address.
    pub http: SocketAddr,
    /// gRPC listen address.
    pub grpc: SocketAddr,
    /// The admin listener's address (`listen.admin`): when set, the admin routes are served
    /// there only, and the HTTP address serves what any client may call.
    pub admin_http: Option<SocketAddr>,
    /// TLS on every listener (`listen.tls`).
    pub tls: Option<crate::tls::ListenTls>,
    /// What a connection may hold: `listen.header_timeout`, `body_timeout`, `idle_timeout`,
    /// `max_connections`.
    pub connections: crate::conn::ConnLimits,
    /// Policies by name, in name order (each with its failure mode).
    pub policies: Vec<Policy>,
    /// Envoy RLS settings, if any.
    pub rls: Option<RlsSettings>,
    /// Envoy's rate limit quota service (`rlqs`), if configured.
    pub rlqs: Option<sluice_envoy_rules::rlqs::RlqsConfig>,
    /// The store.
    pub store: StoreConfig,
    /// The heavy-hitter summaries (`top`).
    pub top: TopSettings,
    /// What `/metrics` counts (`metrics`).
    pub metrics: MetricsSettings,
    /// Traces of decisions over OTLP (`tracing` and the `OTEL_*` variables); `None`: off.
    pub tracing: Option<TraceSettings>,
}

#[derive(Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
struct RawLocal {
    enabled: bool,
    batch: Option<serde_yaml_ng::Value>,
    max_error: Option<f64>,
}

/// `local.batch`: `auto` or a fraction of max in (0, 1]; `local.max_error`: a fraction of max
/// in (0, 1].
fn local_config(raw: RawLocal) -> Result<Option<sluice::ReserveConfig>, FieldError> {
    let batch = match &raw.batch {
        None => sluice::Batch::Auto,
        Some(serde_yaml_ng::Value::String(s)) if s == "auto" => sluice::Batch::Auto,
        Some(serde_yaml_ng::Value::Number(n)) => match n.as_f64() {
            Some(f) if f > 0.0 && f <= 1.0 => sluice::Batch::Fraction(f),
            _ => {
                return Err(FieldError::new(
                    "local.batch",
                    format!(
                        "{n} is not a fraction of max; expected a number in (0, 1], e.g. 0.01, \
                         or auto"
                    ),
                ));
            }
        },
        Some(other) => {
            return Err(FieldError::new(
                "local.batch",
                format!(
                    "expected auto or a fraction of max such as 0.01, got {}",
                    serde_yaml_ng::to_string(other)
                        .unwrap_or_default()
                        .trim_end()
                ),
            ));
        }
    };
    let max_error = match raw.max_error {
        None => sluice::DEFAULT_MAX_ERROR,
        Some(f) if f > 0.0 && f <= 1.0 => f,
        Some(f) => {
            return Err(FieldError::new(
                "local.max_error",
                format!(
                    "{f} is not a fraction of max; expected a number in (0, 1], e.g. 0.01 (1 %)"
                ),
            ));
        }
    };
    Ok(raw.enabled.then(|| {
        sluice::ReserveConfig::default()
            .batch(batch)
            .max_error(max_error)
    }))
}

/// `policies`: each entry built into a [`Policy`], in name order.
fn build_policies(raw: BTreeMap<String, RawPolicy>) -> Result<Vec<Policy>, FieldError> {
    raw.into_iter()
        .map(|(name, p)| entry_policy(&name, p).map_err(|e| e.within(&format!("policies.{name}"))))
        .collect()
}

/// `rlqs`: its rules, each naming a policy of `policies` whose limits are all rates.
fn rlqs_section(
    raw: sluice_envoy_rules::rlqs::RawRlqs,
    policies: &[Policy],
) -> Result<sluice_envoy_rules::rlqs::RlqsConfig, FieldError> {
    let rlqs = sluice_envoy_rules::rlqs::rlqs_rules(raw, |name| {
        policies
            .iter()
            .find(|p| p.name() == name)
            .map(Policy::shortest_per_ms)
    })?;
    // Usage reports are counts of requests already admitted: nothing is held, so a
    // concurrency limit could never be enforced by them.
    for (i, rule) in rlqs.buckets.iter().enumerate() {
        let concurrent = policies
            .iter()
            .any(|p| p.name() == rule.policy && p.concurrency_limit().is_some());
        if concurrent {
            return Err(FieldError::new(
                format!("rlqs.buckets[{i}].policy"),
                format!(
                    "`{}` has a concurrency limit, which usage reports cannot enforce (they \
                     count requests, they hold nothing); use a policy of rates",
                    rule.policy
                ),
            ));
        }
    }
    Ok(rlqs)
}

#[derive(Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
struct RawConfig {
    listen: RawListen,
    policies: BTreeMap<String, RawPolicy>,
    rls: Option<RawRls>,
    rlqs: Option<sluice_envoy_rules::rlqs::RawRlqs>,
    store: RawStore,
    local: RawLocal,
    admin: Option<crate::config::admin::RawAdmin>,
    top: RawTop,
    metrics: RawMetrics,
    tracing: Option<RawTracing>,
}

impl Config {
    /// Reads and validates a configuration file.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
            file: file.clone(),
            line: None,
            message: format!("cannot read the configuration: {e}"),
        })?;
        Self::parse_in(&file, &text, path.parent())
    }

    /// Validates a configuration given as text; `file` names it in errors. Relative files it
    /// names (`admin.tokens_file`) are relative to the working directory.
    pub fn parse(file: &str, text: &str) -> Result<Self, ConfigError> {
        Self::parse_in(file, text, None)
    }

    /// [`Config::parse`] with relative files relative to `base`: the YAML read whole, then
    /// each section in the order of docs/configuration.md, the first error returned.
    fn parse_in(file: &str, text: &str, base: Option<&Path>) -> Result<Self, ConfigError> {
        let raw: RawConfig = read_raw(file, text)?;
        Self::sections(raw, base).map_err(|e| ConfigError::at(file, text, e))
    }

    /// Each section of `raw`, in the order of docs/configuration.md; the first error.
    fn sections(raw: RawConfig, base: Option<&Path>) -> Result<Self, FieldError> {
        let policies = build_policies(raw.policies)?;
        let rlqs = raw.rlqs.map(|r| rlqs_section(r, &policies)).transpose()?;
        let store = store_config(raw.store, base)?;
        if let StoreConfig::Regions(r) = &store {
            store_regions::check(r, &policies)?;
        }
        let local = local_config(raw.local)?;
        let top = top_config(raw.top)?;
        let metrics = metrics_config(raw.metrics)?;
        let tracing = trace_config(raw.tracing, |name| std::env::var(name).ok())?;
        let admin = raw
            .admin
            .map(|a| crate::config::admin::AdminConfig::resolve(a, base))
            .transpose()?;
        let listen = listen_config(
            raw.listen,
            rlqs.as_ref().map(|r| r.reporting_interval),
            base,
        )?;
        Ok(Self {
            http: listen.http,
            grpc: listen.grpc,
            admin_http: listen.admin,
            tls: listen.tls,
            connections: listen.connections,
            policies,
            rls: raw
                .rls
                .map(|r| RlsSettings::from_raw(r, base))
                .transpose()?,
            rlqs,
            store,
            local,
            admin,
            top,
            metrics,
            tracing,
        })
    }

    /// The sections read at start only (`listen`, `store`, `local`, `top`, `tracing`) that differ in
    /// `next`: a reload applies its policies and rules, and these after a restart.
    pub fn restart_only_changes(&self, next: &Config) -> Vec<&'static str> {
        let listen = |c: &Config| (c.http, c.grpc, c.admin_http, c.tls.clone(), c.connections);
        // The xDS client is started with the server: its control plane is read at start only.
        let xds = |c: &Config| c.rls.as_ref().and_then(|r| r.xds().cloned());
        [
            ("listen", listen(self) != listen(next)),
            ("store", self.store != next.store),
            ("local", self.local != next.local),
            ("top", self.top != next.top),
            ("tracing", self.tracing != next.tracing),
            ("rls.xds", xds(self) != xds(next)),
        ]
        .into_iter()
        .filter_map(|(section, changed)| changed.then_some(section))
        .collect()
    }

    /// The configuration used when none is given: the in-memory store and a demo policy.
    pub fn demo() -> Self {
        // The demo text is fixed and valid; parsing it cannot fail.
        Self::parse("<built-in demo>", DEMO)
            .unwrap_or_else(|e| unreachable!("the built-in demo configuration is invalid: {e}"))
    }
}

/// The demo configuration served when no file is given (printed at start).
pub const DEMO: &str = "\
policies:
  demo:
    limits:
      - { max: 5, per: 10s }
      - { max: 100, per: 1h }
";
