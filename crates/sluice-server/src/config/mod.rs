//! The configuration file (docs/configuration.md), parsed and validated in one pass.
//!
//! Every value is checked while it is read, so an error carries the file, the line and the
//! path of the value, e.g. `sluice.yaml:7:15: policies.api.limits[1].per: `0s` is not a
//! positive duration`; a check that needs a whole section (or two: an `rlqs` rule and the
//! policies) names the path, and its line is found from it ([`locate`]). Parse, don't
//! validate: what comes out is a [`Config`] of valid [`Policy`]s, addresses and durations.

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use serde::de::{self, Deserializer};
use sluice::{Algorithm, Limit, LimitSpec, Policy};

/// The default HTTP address.
pub const DEFAULT_HTTP: &str = "127.0.0.1:8080";
/// The default gRPC address.
pub const DEFAULT_GRPC: &str = "127.0.0.1:8081";

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

pub use sluice::FailureMode;

mod locate;
mod store;
use store::{RawStore, store_config};

/// A configured policy (its failure mode is part of the [`Policy`]).
#[derive(Debug, Clone)]
pub struct PolicyConfig {
    /// The validated policy.
    pub policy: Policy,
}

impl PolicyConfig {
    /// What the policy does when the store fails.
    pub fn on_store_error(&self) -> FailureMode {
        self.policy.failure_mode()
    }
}

/// Where peeks read and where "now" comes from: the Redis library's own types, read from
/// YAML through its `serde` feature, so both speak the same words.
pub use sluice_redis::{ClockSource, ReadFrom};

/// One primary and its replicas.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShardConfig {
    /// The primary's URL.
    pub primary: String,
    /// Replica URLs.
    #[serde(default)]
    pub replicas: Vec<String>,
}

/// A Sentinel-monitored primary.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SentinelConfig {
    /// The master's name in the sentinels' configuration.
    pub master: String,
    /// Sentinel URLs.
    pub nodes: Vec<String>,
}

/// How the Redis data is laid out: exactly one of `store.shards`, `store.cluster`,
/// `store.sentinel`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RedisLayout {
    /// Client-side shards, each a primary with replicas, in configuration order (at least one).
    Shards(Vec<ShardConfig>),
    /// A Redis Cluster, by seed node URLs.
    Cluster(Vec<String>),
    /// One primary with replicas, found through Sentinel.
    Sentinel(SentinelConfig),
}

/// The store.
#[derive(Debug, Clone, PartialEq, Eq)]
// Built once per (re)load and matched a few times: its size does not matter.
#[allow(clippy::large_enum_variant)]
pub enum StoreConfig {
    /// In this process.
    Memory,
    /// Redis: client-side shards, a Cluster, or a Sentinel-monitored primary.
    Redis {
        /// Where the data lives.
        layout: RedisLayout,
        /// Where peeks read.
        read_from: ReadFrom,
        /// Per-call timeout.
        timeout: Duration,
        /// Where "now" comes from.
        clock: ClockSource,
        /// Key prefix.
        key_prefix: String,
        /// Certificates for `rediss://` URLs (paths resolved against the configuration's
        /// directory).
        tls: Option<sluice_redis::TlsFiles>,
        /// The user for data nodes whose URLs name none (`store.auth`).
        credentials: Option<sluice_redis::Credentials>,
        /// The user for sentinels whose URLs name none (`store.sentinel_auth`).
        sentinel_credentials: Option<sluice_redis::Credentials>,
        /// `WAIT` behind every write (`store.wait_for_replicas`).
        wait_for_replicas: Option<sluice_redis::WaitForReplicas>,
        /// The most concurrent decisions sent to one Redis as one call (`store.coalesce`).
        coalesce: usize,
        /// Where fixed windows are opened (`store.layout`).
        state_layout: sluice_redis::Layout,
    },
}

/// Envoy rate limit service settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RlsSettings {
    /// The directory of Envoy ratelimit YAML files.
    pub config_dir: PathBuf,
    /// Every over-limit answer becomes `OK` (statuses unchanged): the reference's global
    /// `SHADOW_MODE`.
    pub shadow_mode: bool,
    /// Every descriptor is in quota mode: the reference's `GLOBAL_QUOTA_MODE`.
    pub quota_mode: bool,
    /// The headers Sluice asks Envoy to add to the client's response.
    pub response_headers: ResponseHeaders,
    /// Merge files that define the same domain: the reference's `MERGE_DOMAIN_CONFIG`.
    pub merge_domains: bool,
    /// Skip files and directories whose name starts with `.`: the reference's
    /// `RUNTIME_IGNOREDOTFILES` (for Kubernetes ConfigMap mounts).
    pub ignore_dot_files: bool,
    /// What a rule does when the store cannot answer: `closed` (the default: `UNAVAILABLE`,
    /// and Envoy's `failure_mode_deny` decides), `open` or `local`, as a policy's
    /// `on_store_error`.
    pub on_store_error: FailureMode,
}

impl RlsSettings {
    fn from_raw(r: RawRls) -> Result<Self, String> {
        let on_store_error = match r.on_store_error.as_deref() {
            None => FailureMode::Closed,
            Some(mode) => mode
                .parse::<FailureMode>()
                .map_err(|e| format!("rls.on_store_error: {}", e.reason))?,
        };
        Ok(Self {
            config_dir: r.config_dir,
            shadow_mode: r.shadow_mode,
            quota_mode: r.quota_mode,
            response_headers: r.response_headers,
            merge_domains: r.merge_domains,
            ignore_dot_files: r.ignore_dot_files,
            on_store_error,
        })
    }
}

/// Which rate-limit headers `ShouldRateLimit` answers in `response_headers_to_add`, for Envoy
/// to add to the client's response (allowed or limited).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ResponseHeaders {
    /// None.
    Off,
    /// `RateLimit-Policy` and `RateLimit` (draft-ietf-httpapi-ratelimit-headers-11): one item
    /// per limited descriptor.
    #[default]
    Ietf,
    /// `RateLimit-Limit`, `RateLimit-Remaining` and `RateLimit-Reset` (draft 03) for the
    /// descriptor closest to its limit: what the reference sends with
    /// `LIMIT_RESPONSE_HEADERS_ENABLED`.
    Draft03,
}

/// A whole, valid configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// Who may use the admin routes (`admin`); `None`: anyone who reaches the port.
    pub admin: Option<crate::admin::AdminConfig>,
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
    /// Policies by name, in name order.
    pub policies: Vec<PolicyConfig>,
    /// Envoy RLS settings, if any.
    pub rls: Option<RlsSettings>,
    /// Envoy's rate limit quota service (`rlqs`), if configured.
    pub rlqs: Option<crate::rlqs::rules::RlqsConfig>,
    /// The store.
    pub store: StoreConfig,
    /// The heavy-hitter summaries (`top`).
    pub top: TopSettings,
}

// ----- durations ----------------------------------------------------------------------------

/// A positive duration written `250ms`, `1s`, `5m`, `1h` or `1d`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PositiveDuration(pub Duration);

impl PositiveDuration {
    /// Parses `250ms`, `1s`, `5m`, `1h`, `1d`.
    pub fn parse(text: &str) -> Result<Self, String> {
        let t = text.trim();
        let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
        let (digits, unit) = t.split_at(split);
        let factor: u64 = match unit {
            "ms" => 1,
            "s" => 1_000,
            "m" => 60_000,
            "h" => 3_600_000,
            "d" => 86_400_000,
            _ => {
                return Err(format!(
                    "`{text}` is not a duration; write a whole number and a unit: 250ms, 1s, 5m, 1h, 1d"
                ));
            }
        };
        let n: u64 = digits
            .parse()
            .map_err(|_| format!("`{text}` is not a duration; write e.g. 250ms, 1s, 5m, 1h, 1d"))?;
        let ms = n
            .checked_mul(factor)
            .ok_or_else(|| format!("`{text}` is too long a duration"))?;
        if ms == 0 {
            return Err(format!("`{text}` is not a positive duration"));
        }
        Ok(Self(Duration::from_millis(ms)))
    }

    fn millis(self) -> u64 {
        u64::try_from(self.0.as_millis()).unwrap_or(u64::MAX)
    }
}

impl<'de> Deserialize<'de> for PositiveDuration {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl de::Visitor<'_> for V {
            type Value = PositiveDuration;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a duration such as 250ms, 1s, 5m, 1h or 1d")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                PositiveDuration::parse(v).map_err(E::custom)
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
                Err(E::custom(format!(
                    "`{v}` has no unit; write e.g. {v}s or {v}ms"
                )))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
                Err(E::custom(format!("`{v}` is not a positive duration")))
            }
        }
        d.deserialize_any(V)
    }
}

// ----- the raw file, validated while read ----------------------------------------------------

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLimit {
    max: u64,
    per: PositiveDuration,
    #[serde(default)]
    algorithm: Option<String>,
    #[serde(default)]
    precision: Option<PositiveDuration>,
    #[serde(default)]
    burst: Option<u64>,
    #[serde(default)]
    align: bool,
}

/// A limit validated as it is read, so its errors carry a line.
struct ValidLimit(Limit);

impl<'de> Deserialize<'de> for ValidLimit {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        // The limit is checked inside the visit of its own mapping, so that an error carries
        // the limit's place and path (`limits[1]`), not the list's.
        struct V;
        impl<'de> de::Visitor<'de> for V {
            type Value = ValidLimit;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a limit such as { max: 100, per: 1m }")
            }
            fn visit_map<A: de::MapAccess<'de>>(self, map: A) -> Result<ValidLimit, A::Error> {
                let raw = RawLimit::deserialize(de::value::MapAccessDeserializer::new(map))?;
                ValidLimit::from_raw(raw).map_err(de::Error::custom)
            }
        }
        d.deserialize_map(V)
    }
}

impl ValidLimit {
    fn from_raw(raw: RawLimit) -> Result<Self, String> {
        let algorithm = match raw.algorithm.as_deref() {
            None => Algorithm::FixedWindow,
            Some(a) => a.parse().map_err(|e: sluice::LimitError| e.to_string())?,
        };
        let spec = LimitSpec {
            max: raw.max,
            per_ms: raw.per.millis(),
            algorithm,
            precision_ms: raw.precision.map(PositiveDuration::millis),
            burst: raw.burst,
            align: raw.align,
        };
        Limit::new(spec).map(ValidLimit).map_err(|e| e.to_string())
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPolicy {
    #[serde(default)]
    on_store_error: Option<String>,
    limits: Vec<ValidLimit>,
}

/// A policy from its raw entry; an error is (the path below `policies.<name>`, e.g.
/// `.on_store_error`, and the reason).
fn build_policy(name: &str, raw: RawPolicy) -> Result<Policy, (String, String)> {
    let on_store_error = match raw.on_store_error.as_deref() {
        None => FailureMode::Open,
        Some(mode) => mode
            .parse::<FailureMode>()
            .map_err(|e| (".on_store_error".to_owned(), e.reason))?,
    };
    let limits = raw.limits.into_iter().map(|l| l.0).collect();
    let policy = Policy::new(name.to_owned(), limits).map_err(|e| {
        let field = if e.field == "name" {
            String::new()
        } else {
            format!(".{}", e.field)
        };
        (field, e.reason)
    })?;
    Ok(policy.with_failure_mode(on_store_error))
}

/// A policy defined inline, in the shape of a `policies.<name>` entry of the configuration
/// (`{limits: [{max, per, algorithm?, precision?, burst?, align?}], on_store_error?}`), read
/// from any self-describing value (a JSON body, a YAML flag) with the configuration's own
/// rules, so an inline policy means and refuses exactly what a configured one does. The
/// error names the path below the entry: `limits[1].per: `0s` is not a positive duration`.
pub fn inline_policy(name: &str, value: &serde_json::Value) -> Result<Policy, String> {
    let serde_json::Value::Object(map) = value else {
        return Err(
            "must be an object such as {\"limits\": [{\"max\": 100, \"per\": \"1m\"}]}".to_owned(),
        );
    };
    for field in map.keys() {
        if !matches!(field.as_str(), "limits" | "on_store_error") {
            return Err(format!(
                "unknown field `{field}`; a policy has limits and on_store_error"
            ));
        }
    }
    let on_store_error = match map.get("on_store_error") {
        None | Some(serde_json::Value::Null) => None,
        Some(serde_json::Value::String(s)) => Some(s.clone()),
        Some(_) => return Err("on_store_error: must be a string: open, closed or local".to_owned()),
    };
    let Some(serde_json::Value::Array(items)) = map.get("limits") else {
        return Err(
            "limits: must be a list of limits such as [{\"max\": 100, \"per\": \"1m\"}]".to_owned(),
        );
    };
    let mut limits = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let limit = ValidLimit::deserialize(item).map_err(|e| format!("limits[{i}]: {e}"))?;
        limits.push(limit);
    }
    build_policy(
        name,
        RawPolicy {
            on_store_error,
            limits,
        },
    )
    .map_err(|(field, reason)| match field.strip_prefix('.') {
        Some(field) => format!("{field}: {reason}"),
        None => format!("the name `{name}`: {reason}"),
    })
}

/// A listen address as written: `IP:port`. A port alone or a host name is refused with what
/// to write instead: which interfaces to expose is a decision to state, not to guess.
struct ListenAddr(SocketAddr);

impl ListenAddr {
    fn parse(text: &str) -> Result<Self, String> {
        if let Ok(addr) = text.trim().parse() {
            return Ok(Self(addr));
        }
        let port = text.trim().trim_start_matches(':');
        if port.parse::<u16>().is_ok() {
            return Err(format!(
                "`{text}` is a port alone; write IP:port: 127.0.0.1:{port} (this machine only) \
                 or 0.0.0.0:{port} (every interface; [::]:{port} for IPv6 too)"
            ));
        }
        if let Some((host, port)) = text.trim().rsplit_once(':')
            && port.parse::<u16>().is_ok()
        {
            let instead = if host == "localhost" {
                format!("127.0.0.1:{port} (or [::1]:{port})")
            } else {
                format!("the IP address {host} stands for, e.g. 10.0.0.5:{port}")
            };
            return Err(format!(
                "`{text}` names a host; a listener binds an IP address, not a name: write \
                 {instead}, or 0.0.0.0:{port} for every interface"
            ));
        }
        Err(format!(
            "`{text}` is not a socket address; write IP:port, e.g. 127.0.0.1:8080, \
             0.0.0.0:8080 or [::]:8080"
        ))
    }
}

impl<'de> Deserialize<'de> for ListenAddr {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl de::Visitor<'_> for V {
            type Value = ListenAddr;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an address such as 127.0.0.1:8080")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<ListenAddr, E> {
                ListenAddr::parse(v).map_err(E::custom)
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<ListenAddr, E> {
                ListenAddr::parse(&v.to_string()).map_err(E::custom)
            }
        }
        d.deserialize_any(V)
    }
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawListen {
    http: Option<ListenAddr>,
    grpc: Option<ListenAddr>,
    #[serde(default)]
    admin: Option<ListenAddr>,
    #[serde(default)]
    tls: Option<crate::tls::RawListenTls>,
    #[serde(default)]
    header_timeout: Option<PositiveDuration>,
    #[serde(default)]
    body_timeout: Option<PositiveDuration>,
    #[serde(default)]
    idle_timeout: Option<PositiveDuration>,
    #[serde(default)]
    max_connections: Option<usize>,
}

/// `listen.header_timeout` and the other bounds of a connection. An Envoy's RLQS stream is
/// silent between two reports, so with `rlqs` the idle timeout defaults to at least three
/// reporting intervals, and one given must be longer than an interval.
fn conn_limits(
    raw: &RawListen,
    reporting_interval: Option<Duration>,
) -> Result<crate::conn::ConnLimits, String> {
    let defaults = crate::conn::ConnLimits::default();
    let text =
        |d: Duration| sluice::core::duration_text(u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    let idle_timeout = match (raw.idle_timeout, reporting_interval) {
        (None, None) => defaults.idle_timeout,
        (None, Some(interval)) => defaults.idle_timeout.max(interval.saturating_mul(3)),
        (Some(idle), Some(interval)) if idle.0 <= interval => {
            return Err(format!(
                "listen.idle_timeout: {} is not longer than rlqs.reporting_interval ({}); an \
                 Envoy's quota stream is silent between two reports and would be closed",
                text(idle.0),
                text(interval)
            ));
        }
        (Some(idle), _) => idle.0,
    };
    let max_connections = match raw.max_connections {
        None => defaults.max_connections,
        Some(0) => {
            return Err(
                "listen.max_connections: 0 would accept nothing; give at least 1".to_owned(),
            );
        }
        Some(n) if n > crate::conn::MAX_CONNECTIONS => {
            return Err(format!(
                "listen.max_connections: {n} is more than {} (each open connection holds a file \
                 descriptor and memory)",
                crate::conn::MAX_CONNECTIONS
            ));
        }
        Some(n) => n,
    };
    Ok(crate::conn::ConnLimits {
        header_timeout: raw.header_timeout.map_or(defaults.header_timeout, |d| d.0),
        body_timeout: raw.body_timeout.map_or(defaults.body_timeout, |d| d.0),
        idle_timeout,
        max_connections,
    })
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRls {
    config_dir: PathBuf,
    #[serde(default)]
    shadow_mode: bool,
    #[serde(default)]
    quota_mode: bool,
    #[serde(default)]
    response_headers: ResponseHeaders,
    #[serde(default)]
    merge_domains: bool,
    #[serde(default)]
    ignore_dot_files: bool,
    #[serde(default)]
    on_store_error: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawTop {
    #[serde(default)]
    capacity: Option<usize>,
    #[serde(default)]
    window: Option<PositiveDuration>,
}

/// `top`: how many keys per policy the heavy-hitter summaries hold, over what window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TopSettings {
    /// Keys held per policy and measure (0: none).
    pub capacity: usize,
    /// The epoch length: a reading covers one to two of them.
    pub window_ms: u64,
}

/// The default `top.capacity`.
pub const DEFAULT_TOP_CAPACITY: usize = 64;
/// The largest `top.capacity`.
pub const MAX_TOP_CAPACITY: usize = 10_000;

fn top_config(raw: RawTop) -> Result<TopSettings, String> {
    let capacity = raw.capacity.unwrap_or(DEFAULT_TOP_CAPACITY);
    if capacity > MAX_TOP_CAPACITY {
        return Err(format!(
            "top.capacity: at most {MAX_TOP_CAPACITY} keys per policy, got {capacity}"
        ));
    }
    Ok(TopSettings {
        capacity,
        window_ms: raw.window.map_or(60_000, PositiveDuration::millis),
    })
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawLocal {
    #[serde(default)]
    enabled: bool,
    #[serde(default)]
    batch: Option<serde_yaml_ng::Value>,
    #[serde(default)]
    max_error: Option<f64>,
}

/// `local.batch`: `auto` or a fraction of max in (0, 1]; `local.max_error`: a fraction of max
/// in (0, 1].
fn local_config(raw: RawLocal) -> Result<Option<sluice::ReserveConfig>, String> {
    let batch = match &raw.batch {
        None => sluice::Batch::Auto,
        Some(serde_yaml_ng::Value::String(s)) if s == "auto" => sluice::Batch::Auto,
        Some(serde_yaml_ng::Value::Number(n)) => match n.as_f64() {
            Some(f) if f > 0.0 && f <= 1.0 => sluice::Batch::Fraction(f),
            _ => {
                return Err(format!(
                    "local.batch: {n} is not a fraction of max; expected a number in (0, 1], \
                     e.g. 0.01, or auto"
                ));
            }
        },
        Some(other) => {
            return Err(format!(
                "local.batch: expected auto or a fraction of max such as 0.01, got {}",
                serde_yaml_ng::to_string(other)
                    .unwrap_or_default()
                    .trim_end()
            ));
        }
    };
    let max_error = match raw.max_error {
        None => sluice::DEFAULT_MAX_ERROR,
        Some(f) if f > 0.0 && f <= 1.0 => f,
        Some(f) => {
            return Err(format!(
                "local.max_error: {f} is not a fraction of max; expected a number in (0, 1], \
                 e.g. 0.01 (1 %)"
            ));
        }
    };
    Ok(raw.enabled.then(|| {
        sluice::ReserveConfig::default()
            .batch(batch)
            .max_error(max_error)
    }))
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    #[serde(default)]
    listen: RawListen,
    #[serde(default)]
    policies: BTreeMap<String, RawPolicy>,
    #[serde(default)]
    rls: Option<RawRls>,
    #[serde(default)]
    rlqs: Option<crate::rlqs::rules::RawRlqs>,
    #[serde(default)]
    store: RawStore,
    #[serde(default)]
    local: RawLocal,
    #[serde(default)]
    admin: Option<crate::admin::RawAdmin>,
    #[serde(default)]
    top: RawTop,
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
        let mut config = Self::parse_in(&file, &text, path.parent())?;
        if let Some(rls) = &mut config.rls
            && rls.config_dir.is_relative()
            && let Some(dir) = path.parent()
        {
            // A relative directory is relative to the configuration file, not to the cwd.
            rls.config_dir = dir.join(&rls.config_dir);
        }
        Ok(config)
    }

    /// Validates a configuration given as text; `file` names it in errors. Relative files it
    /// names (`admin.tokens_file`) are relative to the working directory.
    pub fn parse(file: &str, text: &str) -> Result<Self, ConfigError> {
        Self::parse_in(file, text, None)
    }

    /// [`Config::parse`] with relative files relative to `base`.
    fn parse_in(file: &str, text: &str, base: Option<&Path>) -> Result<Self, ConfigError> {
        let raw = read_raw(file, text)?;
        let err = |message: String| ConfigError {
            file: file.to_owned(),
            line: locate::path_of(&message).and_then(|path| locate::locate(text, path)),
            message,
        };
        let mut policies = Vec::with_capacity(raw.policies.len());
        for (name, p) in raw.policies {
            let policy = build_policy(&name, p)
                .map_err(|(field, reason)| err(format!("policies.{name}{field}: {reason}")))?;
            policies.push(PolicyConfig { policy });
        }
        let rlqs = raw
            .rlqs
            .map(|r| {
                crate::rlqs::rules::rlqs_config(r, |name| {
                    policies.iter().find(|p| p.policy.name() == name).map(|p| {
                        let limits = p.policy.limits().iter();
                        limits.map(sluice::Limit::per_ms).min().unwrap_or(0)
                    })
                })
            })
            .transpose()
            .map_err(err)?;
        // Usage reports are counts of requests already admitted: nothing is held, so a
        // concurrency limit could never be enforced by them.
        if let Some(rlqs) = &rlqs {
            for (i, rule) in rlqs.buckets.iter().enumerate() {
                let concurrent = policies.iter().any(|p| {
                    p.policy.name() == rule.policy
                        && p.policy
                            .limits()
                            .iter()
                            .any(|l| l.algorithm() == Algorithm::Concurrency)
                });
                if concurrent {
                    return Err(err(format!(
                        "rlqs.buckets[{i}].policy: `{}` has a concurrency limit, which usage \
                         reports cannot enforce (they count requests, they hold nothing); \
                         use a policy of rates",
                        rule.policy
                    )));
                }
            }
        }
        let store = store_config(raw.store, base).map_err(err)?;
        let local = local_config(raw.local).map_err(err)?;
        let top = top_config(raw.top).map_err(err)?;
        let admin = raw
            .admin
            .map(|a| crate::admin::AdminConfig::resolve(a, base))
            .transpose()
            .map_err(err)?;
        let default_addr = |s: &str| s.parse::<SocketAddr>().map_err(|e| err(e.to_string()));
        let connections =
            conn_limits(&raw.listen, rlqs.as_ref().map(|r| r.reporting_interval)).map_err(err)?;
        let http = match raw.listen.http {
            Some(a) => a.0,
            None => default_addr(DEFAULT_HTTP)?,
        };
        let grpc = match raw.listen.grpc {
            Some(a) => a.0,
            None => default_addr(DEFAULT_GRPC)?,
        };
        let admin_http = raw.listen.admin.as_ref().map(|a| a.0);
        let clash = |a: SocketAddr, b: SocketAddr| a.port() != 0 && a == b;
        if clash(http, grpc) {
            return Err(err(format!(
                "listen: http and grpc are both {http}; give each its own port"
            )));
        }
        if let Some(admin) = admin_http
            && (clash(admin, http) || clash(admin, grpc))
        {
            return Err(err(format!(
                "listen.admin: {admin} is also the http or grpc address; the admin listener \
                 needs its own port"
            )));
        }
        let tls = raw
            .listen
            .tls
            .map(|t| crate::tls::ListenTls::resolve(t, base))
            .transpose()
            .map_err(err)?;
        Ok(Self {
            http,
            grpc,
            admin_http,
            tls,
            connections,
            policies,
            rls: raw
                .rls
                .map(RlsSettings::from_raw)
                .transpose()
                .map_err(err)?,
            rlqs,
            store,
            local,
            admin,
            top,
        })
    }

    /// The sections read at start only (`listen`, `store`, `local`, `top`) that differ in
    /// `next`: a reload applies its policies and rules, and these after a restart.
    pub fn restart_only_changes(&self, next: &Config) -> Vec<&'static str> {
        let listen = |c: &Config| (c.http, c.grpc, c.admin_http, c.tls.clone(), c.connections);
        let mut changed = Vec::new();
        if listen(self) != listen(next) {
            changed.push("listen");
        }
        if self.store != next.store {
            changed.push("store");
        }
        if self.local != next.local {
            changed.push("local");
        }
        if self.top != next.top {
            changed.push("top");
        }
        changed
    }

    /// The configuration used when none is given: the in-memory store and a demo policy.
    pub fn demo() -> Self {
        // The demo text is fixed and valid; parsing it cannot fail.
        match Self::parse("<built-in demo>", DEMO) {
            Ok(c) => c,
            Err(e) => unreachable!("the built-in demo configuration is invalid: {e}"),
        }
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

/// The file as written: refused when it is empty, when its YAML is not well-formed (reported
/// before any value is interpreted, so an unclosed `{` is reported as such and not as the odd
/// value it swallowed), or when a mapping names a key twice.
fn read_raw(file: &str, text: &str) -> Result<RawConfig, ConfigError> {
    let document: Option<de::IgnoredAny> =
        serde_yaml_ng::from_str(text).map_err(|e| yaml_error(file, text, &e))?;
    if document.is_none() {
        return Err(ConfigError {
            file: file.to_owned(),
            line: None,
            message: "the file is empty (or holds only comments): an empty file is refused, so \
                      that a file caught half-written never replaces a configuration; write `{}` \
                      for every default and no policy"
                .to_owned(),
        });
    }
    duplicate_keys(file, text)?;
    serde_yaml_ng::from_str(text).map_err(|e| yaml_error(file, text, &e))
}

/// A key given twice in one mapping (serde would keep the last one silently), named with the
/// lines of both.
fn duplicate_keys(file: &str, text: &str) -> Result<(), ConfigError> {
    use crate::unique::{Outcome, Probe, read};
    let Outcome::Duplicate { duplicate, error } =
        read(serde_yaml_ng::Deserializer::from_str(text), None)
    else {
        return Ok(());
    };
    let second = error.location().map(|l| (l.line(), l.column()));
    let first = match read(
        serde_yaml_ng::Deserializer::from_str(text),
        Some(Probe(duplicate.clone())),
    ) {
        Outcome::Probed(e) => e.location().map(|l| l.line()),
        _ => None,
    };
    let lines = match (first, second) {
        (Some(a), Some((b, _))) if a == b => format!(" on line {a}"),
        (Some(a), Some((b, _))) => format!(", at lines {a} and {b}"),
        _ => String::new(),
    };
    let at = if duplicate.path.is_empty() {
        String::new()
    } else {
        format!("{}: ", duplicate.path)
    };
    let why = if duplicate.path == "policies" {
        "each policy needs its own name"
    } else {
        "a key may appear once in a mapping (the second would silently replace the first)"
    };
    Err(ConfigError {
        file: file.to_owned(),
        line: second,
        message: format!("{at}`{}` is given twice{lines}; {why}", duplicate.key),
    })
}

/// serde's messages name Rust types (`expected u64`, `expected struct RawConfig`); this says
/// what to write instead.
pub(crate) fn plain_words(message: &str) -> String {
    const WORDS: &[(&str, &str)] = &[
        ("u8", "a whole number"),
        ("u16", "a whole number"),
        ("u32", "a whole number"),
        ("u64", "a whole number"),
        ("u128", "a whole number"),
        ("usize", "a whole number"),
        ("i8", "a whole number"),
        ("i16", "a whole number"),
        ("i32", "a whole number"),
        ("i64", "a whole number"),
        ("i128", "a whole number"),
        ("isize", "a whole number"),
        ("f32", "a number"),
        ("f64", "a number"),
        ("a map", "a mapping (key: value)"),
        ("a sequence", "a list"),
        ("path string", "a file path"),
        ("a borrowed string", "a string"),
    ];
    let is_word = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let mut out = String::with_capacity(message.len());
    let mut rest = message;
    while let Some(at) = rest.find("expected ") {
        let (before, after) = rest.split_at(at + "expected ".len());
        out.push_str(before);
        rest = after;
        if let Some(name) = rest.strip_prefix("struct ") {
            // `struct RawConfig`, `struct RawLimit`: a mapping of the section's keys.
            let end = name.find(|c: char| !is_word(c)).unwrap_or(name.len());
            out.push_str("a mapping (key: value)");
            rest = &name[end..];
            continue;
        }
        for (rust, words) in WORDS {
            if let Some(tail) = rest.strip_prefix(rust)
                && !tail.starts_with(is_word)
            {
                out.push_str(words);
                rest = tail;
                break;
            }
        }
    }
    out.push_str(rest);
    out
}

/// A YAML error with its line. The parser knows no line for a second document (`---`), so it
/// is found here: a configuration is one document, and the error points at the second. An
/// error that has no line says it is about the whole file.
fn yaml_error(file: &str, text: &str, e: &serde_yaml_ng::Error) -> ConfigError {
    let mut line = e.location().map(|l| (l.line(), l.column()));
    let mut message = plain_words(&strip_location(&e.to_string()));
    if line.is_none() && message.contains("more than one document") {
        let mut content = false;
        let mut markers = 0;
        for (i, l) in text.lines().enumerate() {
            if l.starts_with("---") {
                markers += 1;
                if content || markers == 2 {
                    line = Some((i + 1, 1));
                    break;
                }
            } else if !l.trim().is_empty() && !l.starts_with('#') && !l.starts_with('%') {
                content = true;
            }
        }
        message = "the file holds more than one YAML document (a second `---`); a \
                   configuration is one document"
            .to_owned();
    } else if line.is_none() {
        // The few errors the parser cannot place (e.g. a merge key `<<` of a scalar).
        message = format!("the file as a whole: {message}");
    }
    ConfigError {
        file: file.to_owned(),
        line,
        message,
    }
}

/// serde_yaml_ng appends " at line L column C"; the error already carries the location.
/// libyaml's own messages carry one inside (`did not find expected ',' or '}' at line 5 column
/// 8, while parsing a flow mapping`): every ` at line L column C` goes, and an unclosed flow
/// collection says so in words.
fn strip_location(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    let mut rest = message;
    while let Some(i) = rest.find(" at line ") {
        out.push_str(&rest[..i]);
        let after = &rest[i + " at line ".len()..];
        let digits = |t: &str| t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
        let after = &after[digits(after)..];
        rest = match after.strip_prefix(" column ") {
            Some(column) => &column[digits(column)..],
            None => after,
        };
    }
    out.push_str(rest);
    if out.contains("while parsing a flow mapping") {
        return "a `{` opened above is never closed: expected `,` or `}` here".to_owned();
    }
    if out.contains("while parsing a flow sequence") {
        return "a `[` opened above is never closed: expected `,` or `]` here".to_owned();
    }
    out
}
