//! `store`: the raw section as written, and the validated [`StoreConfig`]: the memory store,
//! or the Redis library's own [`RedisConfig`], built here while the section is read (the
//! server keeps no copy of the Redis settings).

use std::path::{Path, PathBuf};

use serde::Deserialize;
use sluice_redis::{RedisConfig, Shard, Topology};

use super::{ClockSource, ReadFrom};
use super::{PositiveDuration, RawSentinel, StoreConfig};

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawStore {
    #[serde(default)]
    backend: Option<String>,
    #[serde(default)]
    shards: Vec<Shard>,
    #[serde(default)]
    cluster: Option<Vec<String>>,
    #[serde(default)]
    sentinel: Option<RawSentinel>,
    #[serde(default)]
    read_from: ReadFrom,
    #[serde(default)]
    timeout: Option<PositiveDuration>,
    #[serde(default)]
    clock: ClockSource,
    #[serde(default)]
    key_prefix: Option<String>,
    #[serde(default)]
    tls: Option<sluice_redis::TlsFiles>,
    #[serde(default)]
    auth: Option<RawAuth>,
    #[serde(default)]
    sentinel_auth: Option<RawAuth>,
    #[serde(default)]
    wait_for_replicas: Option<RawWait>,
    #[serde(default)]
    coalesce: Option<u64>,
    /// `store.regions`: one limit across regions (docs/regions.md).
    #[serde(default)]
    regions: Option<super::store_regions::RawRegions>,
}

/// `store.wait_for_replicas`: `WAIT` behind every write.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawWait {
    #[serde(default = "one")]
    replicas: u32,
    timeout: PositiveDuration,
    #[serde(default)]
    on_shortfall: sluice_redis::Shortfall,
}

/// The largest `store.coalesce`: a batch runs in Redis as one script, during which Redis
/// serves nobody else.
const MAX_COALESCE: u64 = 1_024;

fn one() -> u32 {
    1
}

/// `store.auth` (the data nodes) or `store.sentinel_auth` (the sentinels): a Redis user whose
/// password is read from a file or an environment variable.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAuth {
    #[serde(default)]
    username: Option<String>,
    #[serde(default)]
    password_file: Option<PathBuf>,
    #[serde(default)]
    password_env: Option<String>,
}

/// Reads the password of `section` (`store.auth`, `store.sentinel_auth`): a file's first line,
/// or a variable; never showing it.
fn read_credentials(
    section: &str,
    raw: RawAuth,
    base: Option<&Path>,
) -> Result<sluice_redis::Credentials, String> {
    let password = match (raw.password_file, raw.password_env) {
        (Some(file), None) => {
            let path = match base {
                Some(dir) if file.is_relative() => dir.join(file),
                _ => file,
            };
            let text = std::fs::read_to_string(&path).map_err(|e| {
                format!(
                    "{section}.password_file: cannot read {}: {e}",
                    path.display()
                )
            })?;
            text.lines().next().unwrap_or_default().trim().to_owned()
        }
        (None, Some(var)) => std::env::var(&var).map_err(|_| {
            format!(
                "{section}.password_env: the environment variable {var} is not set (or not UTF-8)"
            )
        })?,
        _ => {
            return Err(format!(
                "{section}: give exactly one of password_file and password_env"
            ));
        }
    };
    if password.is_empty() {
        return Err(format!("{section}: the password is empty"));
    }
    Ok(sluice_redis::Credentials::new(raw.username, password))
}

/// One Redis at `url`, every other `store` setting at its default.
pub(super) fn single_redis(url: &str) -> Result<StoreConfig, String> {
    store_config(
        RawStore {
            backend: Some("redis".to_owned()),
            shards: vec![Shard::new(url)],
            ..RawStore::default()
        },
        None,
    )
}

pub(super) fn store_config(mut raw: RawStore, base: Option<&Path>) -> Result<StoreConfig, String> {
    match raw.backend.as_deref().unwrap_or("memory") {
        "memory" if raw.regions.is_some() => Err(
            "store.regions: a regions store keeps its counts in Redis; add `backend: redis`"
                .to_owned(),
        ),
        "memory" => Ok(StoreConfig::Memory),
        "redis" => match raw.regions.take() {
            Some(regions) => regions_config(regions, raw, base).map(StoreConfig::Regions),
            None => redis_config(raw, base).map(StoreConfig::Redis),
        },
        other => Err(format!(
            "store.backend: `{other}` is not a store; expected memory or redis"
        )),
    }
}

/// `store.backend: redis`: each setting checked in the order of the section, onto one
/// [`RedisConfig`].
fn redis_config(mut raw: RawStore, base: Option<&Path>) -> Result<RedisConfig, String> {
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
) -> Result<sluice_redis::RegionsConfig, String> {
    if !raw.shards.is_empty() || raw.cluster.is_some() || raw.sentinel.is_some() {
        return Err(
            "store: give only one of store.shards, store.cluster, store.sentinel and \
                    store.regions (whose primary is this region's own Redis)"
                .to_owned(),
        );
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
) -> Result<RedisConfig, String> {
    let key_prefix = raw
        .key_prefix
        .unwrap_or_else(|| sluice_redis::DEFAULT_PREFIX.to_owned());
    sluice_redis::keys::validate_prefix(&key_prefix)
        .map_err(|e| format!("store.key_prefix: {e}"))?;
    let credentials = raw
        .auth
        .map(|a| read_credentials("store.auth", a, base))
        .transpose()?;
    let sentinel_credentials = sentinel_credentials(raw.sentinel_auth, &topology, base)?;
    let timeout = raw.timeout.map_or(sluice_redis::DEFAULT_TIMEOUT, |t| t.0);
    let wait_for_replicas = raw
        .wait_for_replicas
        .map(|w| {
            let wait = sluice_redis::WaitForReplicas::new(w.replicas, w.timeout.0)
                .on_shortfall(w.on_shortfall);
            wait.validate(timeout)
                .map(|()| wait)
                .map_err(|e| format!("store.{e}"))
        })
        .transpose()?;
    let mut config = RedisConfig::with_topology(topology)
        .read_from(raw.read_from)
        .timeout(timeout)
        .clock(raw.clock)
        .key_prefix(key_prefix)
        .coalesce(coalesce(raw.coalesce)?);
    config.tls = raw.tls.map(|t| tls_files(t, base));
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
) -> Result<Topology, String> {
    match (shards.is_empty(), cluster, sentinel) {
        (false, None, None) => {
            // A shard is named by its primary (what rendezvous hashing scores).
            let names: Vec<&str> = shards.iter().map(|s| s.primary.as_str()).collect();
            sluice_redis::validate_shard_names(&names).map_err(|e| {
                format!(
                    "store.shards[{}].primary: `{}` is listed twice; a shard is identified by \
                     its primary",
                    e.index,
                    sluice_redis::redact(&e.name)
                )
            })?;
            Ok(Topology::Shards { shards })
        }
        (true, Some(nodes), None) => {
            if nodes.is_empty() {
                return Err("store.cluster: list at least one node URL".to_owned());
            }
            Ok(Topology::Cluster { nodes })
        }
        (true, None, Some(sentinel)) => {
            if sentinel.nodes.is_empty() {
                return Err("store.sentinel.nodes: list at least one sentinel URL".to_owned());
            }
            if sentinel.master.is_empty() {
                return Err("store.sentinel.master: name the monitored master".to_owned());
            }
            Ok(Topology::Sentinel {
                master: sentinel.master,
                sentinels: sentinel.nodes,
            })
        }
        (true, None, None) => Err("store: the redis backend needs one of store.shards \
                                   (- primary: redis://host:port), store.cluster or store.sentinel"
            .to_owned()),
        _ => {
            Err("store: give only one of store.shards, store.cluster and store.sentinel".to_owned())
        }
    }
}

/// Certificate paths are relative to the configuration file.
fn tls_files(mut tls: sluice_redis::TlsFiles, base: Option<&Path>) -> sluice_redis::TlsFiles {
    for path in [&mut tls.ca_file, &mut tls.cert_file, &mut tls.key_file]
        .into_iter()
        .flatten()
    {
        if let Some(dir) = base
            && path.is_relative()
        {
            *path = dir.join(&*path);
        }
    }
    tls
}

/// The sentinels' own user: sentinels often have a password of their own, or none while the
/// data nodes have one, so store.auth never applies to them.
fn sentinel_credentials(
    raw: Option<RawAuth>,
    topology: &Topology,
    base: Option<&Path>,
) -> Result<Option<sluice_redis::Credentials>, String> {
    match (raw, topology) {
        (None, _) => Ok(None),
        (Some(a), Topology::Sentinel { .. }) => {
            read_credentials("store.sentinel_auth", a, base).map(Some)
        }
        (Some(_), _) => Err(
            "store.sentinel_auth: only for store.sentinel (the data nodes' \
                             user is store.auth)"
                .to_owned(),
        ),
    }
}

/// `store.coalesce`: 1 (every decision alone) to [`MAX_COALESCE`].
fn coalesce(raw: Option<u64>) -> Result<usize, String> {
    match raw {
        None => Ok(sluice_redis::DEFAULT_COALESCE),
        Some(n @ 1..=MAX_COALESCE) => Ok(usize::try_from(n).unwrap_or(1)),
        Some(n) => Err(format!(
            "store.coalesce: {n} is not a batch size; give 1 (every decision alone) to \
             {MAX_COALESCE}"
        )),
    }
}
