//! `store`: the raw section as written, and the validated [`StoreConfig`]: the memory store,
//! or the Redis library's own [`RedisConfig`], built here while the section is read (the
//! server keeps no copy of the Redis settings).

use std::fmt;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use sluice_redis::{RedisConfig, Shard, Topology};

use super::{ClockSource, ReadFrom};
use super::{FieldError, PositiveDuration, RawSentinel, StoreConfig};

#[derive(Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
pub(super) struct RawStore {
    backend: Option<String>,
    shards: Vec<Shard>,
    cluster: Option<Vec<String>>,
    sentinel: Option<RawSentinel>,
    read_from: ReadFrom,
    timeout: Option<PositiveDuration>,
    clock: ClockSource,
    key_prefix: Option<String>,
    tls: Option<sluice_redis::TlsFiles>,
    auth: Option<RawAuth>,
    sentinel_auth: Option<RawAuth>,
    wait_for_replicas: Option<RawWait>,
    coalesce: Option<u64>,
    /// `store.regions`: one limit across regions (docs/regions.md).
    regions: Option<super::store_regions::RawRegions>,
}

/// `store.wait_for_replicas`: `WAIT` behind every write.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawWait {
    /// 1 when not given.
    replicas: Option<u32>,
    timeout: PositiveDuration,
    #[serde(default)]
    on_shortfall: sluice_redis::Shortfall,
}

/// The largest `store.coalesce`: a batch runs in Redis as one script, during which Redis
/// serves nobody else.
const MAX_COALESCE: u64 = 1_024;

/// `store.auth` (the data nodes) or `store.sentinel_auth` (the sentinels): a Redis user whose
/// password is read from a file or an environment variable.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAuth {
    username: Option<String>,
    password_file: Option<PathBuf>,
    password_env: Option<String>,
}

/// Reads the password of `section` (`store.auth`, `store.sentinel_auth`): a file's first line,
/// or a variable; never showing it.
fn read_credentials(
    section: &str,
    raw: RawAuth,
    base: Option<&Path>,
) -> Result<sluice_redis::Credentials, FieldError> {
    let from_file = raw.password_file.is_some();
    let secret = super::Secret {
        at: section,
        file: ("password_file", raw.password_file),
        env: ("password_env", raw.password_env),
        neither: "give exactly one of password_file and password_env",
    };
    let text = secret.read(base)?;
    // A file's first line: editors end files with a newline.
    let password = if from_file {
        text.lines().next().unwrap_or_default().trim().to_owned()
    } else {
        text
    };
    if password.is_empty() {
        return Err(FieldError::new(section, "the password is empty"));
    }
    Ok(sluice_redis::Credentials::new(raw.username, password))
}

/// One Redis at `url`, every other `store` setting at its default.
pub(super) fn single_redis(url: &str) -> Result<StoreConfig, FieldError> {
    store_config(
        RawStore {
            backend: Some("redis".to_owned()),
            shards: vec![Shard::new(url)],
            ..RawStore::default()
        },
        None,
    )
}

pub(super) fn store_config(
    mut raw: RawStore,
    base: Option<&Path>,
) -> Result<StoreConfig, FieldError> {
    match raw.backend.as_deref().unwrap_or("memory") {
        "memory" if raw.regions.is_some() => Err(FieldError::new(
            "store.regions",
            "a regions store keeps its counts in Redis; add `backend: redis`",
        )),
        "memory" => Ok(StoreConfig::Memory),
        "redis" => match raw.regions.take() {
            Some(regions) => regions_config(regions, raw, base).map(StoreConfig::Regions),
            None => redis_config(raw, base).map(StoreConfig::Redis),
        },
        other => Err(FieldError::new(
            "store.backend",
            format!("`{other}` is not a store; expected memory or redis"),
        )),
    }
}

/// `store.backend: redis`: each setting checked in the order of the section, onto one
/// [`RedisConfig`].
fn redis_config(mut raw: RawStore, base: Option<&Path>) -> Result<RedisConfig, FieldError> {
    let topology = topology(
        std::mem::take(&mut raw.shards),
        raw.cluster.take(),
        raw.sentinel.take(),
    )?;
    with_settings(topology, raw, base)
}

/// `store.regions`: this region's primary and the local replica of every other region's, each
/// with the section's other settings (timeout, prefix, TLS, user, …).
fn regions_config(
    regions: super::store_regions::RawRegions,
    raw: RawStore,
    base: Option<&Path>,
) -> Result<sluice_redis::RegionsConfig, FieldError> {
    if !raw.shards.is_empty() || raw.cluster.is_some() || raw.sentinel.is_some() {
        return Err(FieldError::new(
            "store",
            "give only one of store.shards, store.cluster, store.sentinel and store.regions \
             (whose primary is this region's own Redis)",
        ));
    }
    let (topology, regions) = super::store_regions::primary_topology(regions)?;
    let template = with_settings(topology, raw, base)?;
    super::store_regions::regions_config(regions, template)
}

/// The settings of `store` besides the topology, checked in the order of the section, onto
/// one [`RedisConfig`] of `topology`.
fn with_settings(
    topology: Topology,
    raw: RawStore,
    base: Option<&Path>,
) -> Result<RedisConfig, FieldError> {
    let key_prefix = raw
        .key_prefix
        .unwrap_or_else(|| sluice_redis::DEFAULT_PREFIX.to_owned());
    sluice_redis::keys::validate_prefix(&key_prefix)
        .map_err(|e| FieldError::new("store.key_prefix", e.to_string()))?;
    let credentials = raw
        .auth
        .map(|a| read_credentials("store.auth", a, base))
        .transpose()?;
    let sentinel_credentials = sentinel_credentials(raw.sentinel_auth, &topology, base)?;
    let timeout = raw.timeout.map_or(sluice_redis::DEFAULT_TIMEOUT, |t| t.0);
    let wait_for_replicas = raw
        .wait_for_replicas
        .map(|w| {
            let wait = sluice_redis::WaitForReplicas::new(w.replicas.unwrap_or(1), w.timeout.0)
                .on_shortfall(w.on_shortfall);
            wait.validate(timeout)
                .map(|()| wait)
                .map_err(|e| wait_error(&e))
        })
        .transpose()?;
    let mut config = RedisConfig::with_topology(topology)
        .read_from(raw.read_from)
        .timeout(timeout)
        .clock(raw.clock)
        .key_prefix(key_prefix)
        .coalesce(coalesce(raw.coalesce)?);
    config.tls = raw.tls.map(|t| crate::tls::relative_files(t, base));
    config.credentials = credentials;
    config.sentinel_credentials = sentinel_credentials;
    config.wait_for_replicas = wait_for_replicas;
    Ok(config)
}

/// Exactly one of `store.shards`, `store.cluster` and `store.sentinel`.
fn topology(
    shards: Vec<Shard>,
    cluster: Option<Vec<String>>,
    sentinel: Option<RawSentinel>,
) -> Result<Topology, FieldError> {
    match (shards.is_empty(), cluster, sentinel) {
        (false, None, None) => {
            // A shard is named by its primary (what rendezvous hashing scores).
            let names: Vec<&str> = shards.iter().map(|s| s.primary.as_str()).collect();
            sluice_redis::validate_shard_names(&names).map_err(|e| {
                FieldError::new(
                    format!("store.shards[{}].primary", e.index),
                    format!(
                        "`{}` is listed twice; a shard is identified by its primary",
                        sluice_redis::redact(&e.name)
                    ),
                )
            })?;
            Ok(Topology::Shards { shards })
        }
        (true, Some(nodes), None) => {
            if nodes.is_empty() {
                return Err(FieldError::new(
                    "store.cluster",
                    "list at least one node URL",
                ));
            }
            Ok(Topology::Cluster { nodes })
        }
        (true, None, Some(sentinel)) => sentinel.topology("store.sentinel"),
        (true, None, None) => Err(FieldError::new(
            "store",
            "the redis backend needs one of store.shards (- primary: redis://host:port), \
             store.cluster or store.sentinel",
        )),
        _ => Err(FieldError::new(
            "store",
            "give only one of store.shards, store.cluster and store.sentinel",
        )),
    }
}

/// `store.wait_for_replicas`'s error at the field the library names.
fn wait_error(e: &sluice_redis::WaitError) -> FieldError {
    let field = match e {
        sluice_redis::WaitError::NoReplica => "wait_for_replicas.replicas",
        _ => "wait_for_replicas.timeout",
    };
    let text = e.to_string();
    match text.strip_prefix(field).and_then(|m| m.strip_prefix(": ")) {
        Some(message) => FieldError::new(format!("store.{field}"), message),
        // `timeout (50ms) must be shorter …`: a sentence about the field as a whole.
        None => FieldError::whole(format!("store.{text}")),
    }
}

/// The sentinels' own user: sentinels often have a password of their own, or none while the
/// data nodes have one, so store.auth never applies to them.
fn sentinel_credentials(
    raw: Option<RawAuth>,
    topology: &Topology,
    base: Option<&Path>,
) -> Result<Option<sluice_redis::Credentials>, FieldError> {
    match (raw, topology) {
        (None, _) => Ok(None),
        (Some(a), Topology::Sentinel { .. }) => {
            read_credentials("store.sentinel_auth", a, base).map(Some)
        }
        (Some(_), _) => Err(FieldError::new(
            "store.sentinel_auth",
            "only for store.sentinel (the data nodes' user is store.auth)",
        )),
    }
}

/// `store.coalesce`: 1 (every decision alone) to [`MAX_COALESCE`].
fn coalesce(raw: Option<u64>) -> Result<usize, FieldError> {
    match raw {
        None => Ok(sluice_redis::DEFAULT_COALESCE),
        Some(n @ 1..=MAX_COALESCE) => Ok(usize::try_from(n).unwrap_or(1)),
        Some(n) => Err(FieldError::new(
            "store.coalesce",
            format!("{n} is not a batch size; give 1 (every decision alone) to {MAX_COALESCE}"),
        )),
    }
}

/// The store in one line, URLs without their passwords: what `config check --explain`, the
/// demo's banner and the start-up log show.
impl fmt::Display for StoreConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let urls = |list: &[String]| {
            let shown: Vec<String> = list.iter().map(|u| sluice_redis::redact(u)).collect();
            shown.join(", ")
        };
        let redis = match self {
            StoreConfig::Memory => return f.write_str("memory"),
            StoreConfig::Redis(redis) => redis,
            StoreConfig::Regions(regions) => {
                let remotes: Vec<String> = regions
                    .remotes
                    .iter()
                    .map(|r| format!("{} at {}", r.name, r.replica.topology.name()))
                    .collect();
                let text = |d: std::time::Duration| {
                    sluice::core::duration_text(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
                };
                return write!(
                    f,
                    "redis regions: {} (primary {}), remotes {}; refresh {}, max_lag {}",
                    regions.local,
                    regions.primary.topology.name(),
                    remotes.join(", "),
                    text(regions.refresh),
                    text(regions.max_lag),
                );
            }
        };
        match &redis.topology {
            Topology::Shards { shards } => {
                let shown: Vec<String> = shards
                    .iter()
                    .map(|s| {
                        let primary = sluice_redis::redact(&s.primary);
                        if s.replicas.is_empty() {
                            primary
                        } else {
                            format!("{primary} (replicas {})", urls(&s.replicas))
                        }
                    })
                    .collect();
                write!(f, "redis {}", shown.join("; "))
            }
            Topology::Cluster { nodes } => write!(f, "redis cluster {}", urls(nodes)),
            Topology::Sentinel { master, sentinels } => {
                write!(f, "redis sentinel {master} at {}", urls(sentinels))
            }
            other => write!(f, "redis {other:?}"),
        }
    }
}
