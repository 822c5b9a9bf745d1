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
use sluice::Policy;

use crate::policy_entry::{RawPolicy, build_policy};
pub use crate::units::PositiveDuration;

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

pub mod admin;
mod listen;
mod locate;
mod metrics;
mod overrides;
pub mod regions;
mod rls;
mod store;
mod top;
mod traces;
use self::listen::*;
pub use self::metrics::{MetricsSettings, NearLimit};
use self::metrics::{RawMetrics, metrics_config};
pub use self::overrides::*;
pub use self::rls::*;
pub use self::top::*;
pub use self::traces::{DEFAULT_SERVICE_NAME, TraceProtocol, TraceSettings};
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
    /// One limit across regions: this region's own Redis and local replicas of the others'
    /// (`store.regions`, docs/regions.md).
    Regions(regions::RegionsLayout),
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
    /// What `/metrics` counts (`metrics`).
    pub metrics: MetricsSettings,
    /// Traces of decisions over OTLP (`tracing` and the `OTEL_*` variables); `None`: off.
    pub tracing: Option<TraceSettings>,
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
    admin: Option<crate::config::admin::RawAdmin>,
    #[serde(default)]
    top: RawTop,
    #[serde(default)]
    metrics: RawMetrics,
    tracing: Option<traces::RawTracing>,
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
            && let RulesSource::Dir(rules) = &mut rls.source
            && rules.is_relative()
            && let Some(dir) = path.parent()
        {
            // A relative directory is relative to the configuration file, not to the cwd.
            *rules = dir.join(&*rules);
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
                    policies
                        .iter()
                        .find(|p| p.policy.name() == name)
                        .map(|p| p.policy.shortest_per_ms())
                })
            })
            .transpose()
            .map_err(err)?;
        // Usage reports are counts of requests already admitted: nothing is held, so a
        // concurrency limit could never be enforced by them.
        if let Some(rlqs) = &rlqs {
            for (i, rule) in rlqs.buckets.iter().enumerate() {
                let concurrent = policies.iter().any(|p| {
                    p.policy.name() == rule.policy && p.policy.concurrency_limit().is_some()
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
        if let StoreConfig::Redis {
            layout: RedisLayout::Regions(r),
            clock,
            ..
        } = &store
        {
            regions::check(r, *clock, &policies).map_err(err)?;
        }
        let local = local_config(raw.local).map_err(err)?;
        let top = top_config(raw.top).map_err(err)?;
        let metrics = metrics_config(raw.metrics).map_err(err)?;
        let tracing =
            traces::trace_config(raw.tracing, |name| std::env::var(name).ok()).map_err(err)?;
        let admin = raw
            .admin
            .map(|a| crate::config::admin::AdminConfig::resolve(a, base))
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
        check_listen(http, grpc, admin_http).map_err(err)?;
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
                .map(|r| RlsSettings::from_raw(r, base))
                .transpose()
                .map_err(err)?,
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
        if self.tracing != next.tracing {
            changed.push("tracing");
        }
        // The xDS client is started with the server: its control plane is read at start only.
        let xds = |c: &Config| c.rls.as_ref().and_then(|r| r.xds().cloned());
        if xds(self) != xds(next) {
            changed.push("rls.xds");
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

/// Each listener needs its own port (port 0 asks for a free one, so it never clashes).
fn check_listen(
    http: SocketAddr,
    grpc: SocketAddr,
    admin_http: Option<SocketAddr>,
) -> Result<(), String> {
    let clash = |a: SocketAddr, b: SocketAddr| a.port() != 0 && a == b;
    if clash(http, grpc) {
        return Err(format!(
            "listen: http and grpc are both {http}; give each its own port"
        ));
    }
    if let Some(admin) = admin_http
        && (clash(admin, http) || clash(admin, grpc))
    {
        return Err(format!(
            "listen.admin: {admin} is also the http or grpc address; the admin listener \
             needs its own port"
        ));
    }
    Ok(())
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
