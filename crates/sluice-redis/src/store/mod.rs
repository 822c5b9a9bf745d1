//! `RedisStore`: the [`Store`] on Redis. One call of the Lua code per operation, sent to the
//! primary (or, for a peek, a replica) that [`topology`] keeps track of, with the arguments
//! and reply of the [`codec`].
//!
//! The store's methods are in three files, by stage: here, which node and which entry of the
//! code an operation goes to; `batch`, the operations coalesced into one call
//! ([`crate::coalesce`]); `send`, one command on the wire with its `WAIT`, the code loaded
//! again where a node lacks it. The two add methods to [`RedisStore`] and import from here;
//! this file calls their methods and imports nothing from them.

mod batch;
mod send;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Instant;

use redis::cluster_routing::{MultipleNodeRoutingInfo, ResponsePolicy, RoutingInfo};
use sluice::{Call, Decision, Op, Policy, Store, StoreError};

use crate::coalesce::{Batches, Lanes};
use crate::codec::{self, Codec};
use crate::config::{ReadFrom, RedisConfig};
use crate::error::{Failure, query};
use crate::keys;
use crate::script::{Code, Entry};
use crate::tasks::Tasks;
use crate::topology::Backend;

/// A [`Store`] on Redis: one primary with optional replicas (at fixed addresses or found
/// through Sentinel), or a Redis Cluster.
///
/// Every decision is **one** call of a Lua function that reads every limit's state, decides
/// all-or-nothing, writes only if all admit, and returns every limit's state: a denied check
/// carries its full state, no second read is needed for headers. All keys of one decision
/// share a hash tag, so in a Cluster they live in one slot. Concurrent calls share one
/// multiplexed connection per node (pipelined by the client); a dropped connection is
/// re-established in the background. Checks and peeks that arrive while a call to the same
/// Redis (Cluster: slot) is in flight are coalesced into one call of the `batch` function
/// ([`RedisConfig::coalesce`], docs/redis.md "Coalescing").
#[derive(Clone)]
pub struct RedisStore {
    inner: Arc<Inner>,
}

struct Inner {
    backend: Backend,
    name: String,
    /// Writes fewer replicas acknowledged than `wait_for_replicas` asks.
    unreplicated: AtomicU64,
    next_replica: AtomicUsize,
    config: RedisConfig,
    code: Code,
    codec: Codec,
    /// Sentinel subscriptions (`+switch-master`), stopped with the store.
    followers: Tasks,
    /// The lanes of coalesced decisions (`RedisConfig::coalesce`).
    lanes: Lanes,
    /// How long calls took over the last minute.
    latency: sluice::latency::LatencyWindow,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("name", &self.inner.name)
            .field("topology", &self.inner.config.topology)
            .field("library", &self.inner.code.library)
            .finish()
    }
}

impl RedisStore {
    /// Connects (lazily: the first call opens the connections) and loads the code on the
    /// primary (every primary of a Cluster). Fails if the primary cannot be reached (Sentinel:
    /// if no sentinel names one) or the configuration is invalid.
    pub async fn connect(config: RedisConfig) -> Result<Self, StoreError> {
        keys::validate_prefix(&config.key_prefix)
            .map_err(|e| StoreError::Backend(e.to_string()))?;
        if let Some(wait) = &config.wait_for_replicas {
            wait.validate(config.timeout)
                .map_err(|e| StoreError::Backend(e.to_string()))?;
        }
        let code = Code::new(config.script_mode);
        let backend = Backend::connect(&config, &code).await?;
        let name = config.topology.name();
        let store = Self {
            inner: Arc::new(Inner {
                backend,
                unreplicated: AtomicU64::new(0),
                name,
                next_replica: AtomicUsize::new(0),
                code,
                codec: Codec::new(&config),
                config,
                followers: Tasks::default(),
                lanes: Lanes::default(),
                latency: sluice::latency::LatencyWindow::new(),
            }),
        };
        let inner = &store.inner;
        inner
            .backend
            .load(&inner.code, inner.config.timeout, &inner.name)
            .await?;
        store.follow_sentinels().await;
        Ok(store)
    }

    /// On Sentinel: subscribes to every sentinel's failover announcements.
    async fn follow_sentinels(&self) {
        let followers = self.inner.backend.follow_sentinels().await;
        self.inner.followers.set(followers);
    }

    /// The store's identity: the primary's URL, `sentinel:<master>` or `cluster:<first
    /// node>` ([`Topology::name`](crate::Topology::name); a shard's name for client-side
    /// sharding).
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The URL of the primary in use now (for a Cluster, its first seed node).
    pub fn primary_url(&self) -> String {
        match self.inner.backend.nodes() {
            Some(nodes) => nodes.primary.url.clone(),
            None => self
                .inner
                .name
                .strip_prefix("cluster:")
                .unwrap_or(&self.inner.name)
                .to_owned(),
        }
    }

    /// The key prefix.
    pub fn key_prefix(&self) -> &str {
        &self.inner.config.key_prefix
    }

    /// The name of the loaded function library (`sluice_<hash>`).
    pub fn library(&self) -> &str {
        &self.inner.code.library
    }

    /// On Sentinel: asks the sentinels soon whether another node is the primary now.
    fn rediscover_soon(&self) {
        self.inner.backend.rediscover_soon();
    }

    /// On a Cluster: makes a new connection soon if `failure` suggests a stale slot map.
    fn reconnect_cluster_soon(&self, failure: &Failure) {
        self.inner.backend.reconnect_cluster_soon(failure);
    }

    /// The exact command a `check` sends (`FCALL …` or `EVALSHA …`), as strings: for
    /// benchmarks that replay it through `redis-benchmark` as the physical baseline.
    #[doc(hidden)]
    pub fn check_command(&self, policy: &Policy, key: &str, cost: u64, now_ms: u64) -> Vec<String> {
        let op = Op::Check { cost };
        // The call a check makes when it goes alone: the lean one for a rate policy.
        let entry = if codec::is_rate(policy, op) {
            Entry::Rate
        } else {
            Entry::Check
        };
        self.command(Call::new(policy, key, op, now_ms), entry, false)
            .args_iter()
            .filter_map(|a| match a {
                redis::Arg::Simple(bytes) => Some(String::from_utf8_lossy(bytes).into_owned()),
                _ => None,
            })
            .collect()
    }

    /// Writes fewer replicas acknowledged than [`RedisConfig::wait_for_replicas`] asks, since
    /// connect (the server publishes it as `sluice_store_unreplicated_total{store}`).
    pub fn unreplicated_total(&self) -> u64 {
        self.inner.unreplicated.load(Ordering::Relaxed)
    }

    /// How long this store's calls took over the last minute ([`sluice::latency`]).
    pub fn call_latency(&self) -> sluice::latency::Quantiles {
        self.inner.latency.read(Instant::now())
    }

    /// Each replica in use (none for a Cluster, whose client routes to its nodes): its
    /// address (without credentials) and how long a `PING` took, or why it failed, within
    /// the timeout.
    pub async fn ping_replicas(&self) -> Vec<(String, Result<std::time::Duration, StoreError>)> {
        let Some(nodes) = self.inner.backend.nodes() else {
            return Vec::new();
        };
        let timeout = self.inner.config.timeout;
        let mut out = Vec::with_capacity(nodes.replicas.len());
        for replica in &nodes.replicas {
            let started = Instant::now();
            let result = replica
                .query(&redis::cmd("PING"), timeout)
                .await
                .map(|_| started.elapsed())
                .map_err(|f| f.into_store_error(&crate::config::redact(&replica.url)));
            out.push((crate::config::redact(&replica.url), result));
        }
        out
    }

    /// Answers `PING` from the primary (every primary of a Cluster) within the timeout, for
    /// readiness checks.
    pub async fn ping(&self) -> Result<(), StoreError> {
        let timeout = self.inner.config.timeout;
        match &self.inner.backend {
            Backend::Direct { nodes, .. } => {
                let nodes = nodes.get();
                let primary = &nodes.primary;
                let result = primary.query(&redis::cmd("PING"), timeout).await;
                if let Err(f) = &result
                    && f.suggests_failover()
                {
                    self.rediscover_soon();
                }
                result
                    .map(drop)
                    .map_err(|f| f.into_store_error(&primary.url))
            }
            Backend::Cluster { conn } => {
                let routing = RoutingInfo::MultiNode((
                    MultipleNodeRoutingInfo::AllMasters,
                    Some(ResponsePolicy::AllSucceeded),
                ));
                let mut conn = conn.get();
                let ping = conn.route_command(redis::cmd("PING"), routing);
                let failure = match tokio::time::timeout(timeout, ping).await {
                    Ok(Ok(_)) => return Ok(()),
                    Ok(Err(e)) => Failure::Redis(e),
                    Err(_) => Failure::Timeout(timeout),
                };
                self.reconnect_cluster_soon(&failure);
                Err(failure.into_store_error(&self.inner.name))
            }
        }
    }

    /// Sends `cmd`, a plain command on at most one key, to the primary (on a Cluster, the
    /// node of its key's slot) within the timeout: the regions store's heartbeats.
    pub(crate) async fn query_primary(&self, cmd: &redis::Cmd) -> Result<redis::Value, StoreError> {
        let timeout = self.inner.config.timeout;
        match &self.inner.backend {
            Backend::Direct { nodes, .. } => {
                let nodes = nodes.get();
                let primary = &nodes.primary;
                primary
                    .query(cmd, timeout)
                    .await
                    .map_err(|f| f.into_store_error(&primary.url))
            }
            Backend::Cluster { conn } => query(&mut conn.get(), cmd, timeout)
                .await
                .map_err(|f| f.into_store_error(&self.inner.name)),
        }
    }

    /// The command that runs `call` through the script's `entry` (`FCALL_RO`/`EVALSHA_RO` on
    /// a replica).
    fn command(&self, call: Call<'_>, entry: Entry, on_replica: bool) -> redis::Cmd {
        let mut cmd = self.inner.code.invocation(entry, on_replica);
        let codec = &self.inner.codec;
        match entry {
            Entry::Rate | Entry::RatePeek => {
                codec.encode_rate(&mut cmd, call.policy, call.key, call.op.cost(), call.now_ms);
            }
            _ => codec.encode(&mut cmd, call.policy, call.key, call.op, call.now_ms),
        }
        cmd
    }

    /// Runs `op` on the primary, or on a replica for a peek when configured; reloads the code
    /// once if the node does not know it (after `FUNCTION FLUSH`, `SCRIPT FLUSH` or a restart).
    async fn run(
        &self,
        policy: &Policy,
        key: &str,
        op: Op,
        now_ms: u64,
    ) -> Result<Decision, StoreError> {
        let to_primary = !op.is_read_only() || self.inner.config.read_from == ReadFrom::Primary;
        if to_primary && self.coalesce_max() > 1 && codec::is_rate(policy, op) {
            return self.coalesced(policy, key, op, now_ms).await;
        }
        self.single(policy, key, op, now_ms).await
    }

    /// Runs `op` as a call of its own.
    async fn single(
        &self,
        policy: &Policy,
        key: &str,
        op: Op,
        now_ms: u64,
    ) -> Result<Decision, StoreError> {
        let rate = codec::is_rate(policy, op);
        let entry = match op {
            Op::Check { .. } if rate => Some(Entry::Rate),
            Op::Peek { .. } if rate => Some(Entry::RatePeek),
            _ => Entry::of(op),
        };
        let Some(entry) = entry else {
            return Err(StoreError::Backend(format!(
                "the Redis store cannot run {op:?}"
            )));
        };
        let call = Call::new(policy, key, op, now_ms);
        let inner = &self.inner;
        let on_replica = op.is_read_only() && inner.config.read_from == ReadFrom::Replicas;
        let reply = match &inner.backend {
            Backend::Cluster { conn } => {
                self.call_cluster(&conn.get(), call, entry, on_replica)
                    .await?
            }
            Backend::Direct { nodes, .. } => {
                let nodes = nodes.get();
                let mut answered = None;
                if on_replica && !nodes.replicas.is_empty() {
                    let i =
                        inner.next_replica.fetch_add(1, Ordering::Relaxed) % nodes.replicas.len();
                    let replica = &nodes.replicas[i];
                    match self.call_on(&nodes, replica, true, call, entry).await {
                        Ok(v) => answered = Some(v),
                        // A peek is a read: the primary answers it as well (with fresher data).
                        Err(e) => {
                            tracing::debug!(replica = %replica.url, error = %e, "peek falls back to the primary")
                        }
                    }
                }
                match answered {
                    Some(v) => v,
                    None => {
                        self.call_on(&nodes, &nodes.primary, false, call, entry)
                            .await?
                    }
                }
            }
        };
        if rate {
            codec::decode_rate(&reply, policy, op)
        } else {
            codec::decode(&reply, policy, op)
        }
    }
}

impl Store for RedisStore {
    /// [`Store::call`], its latency kept for [`RedisStore::call_latency`].
    async fn call(&self, call: Call<'_>) -> Result<Decision, StoreError> {
        let (policy, key, op, now_ms) = (call.policy, call.key, call.op, call.now_ms);
        let started = Instant::now();
        let result = match op {
            Op::Forget => self.forget(policy, key, now_ms).await,
            _ => self.run(policy, key, op, now_ms).await,
        };
        self.inner.latency.record(started, started.elapsed());
        result
    }
}

impl RedisStore {
    /// Deletes every key of `key`'s state under `policy` ([`Op::Forget`]).
    async fn forget(
        &self,
        policy: &Policy,
        key: &str,
        now_ms: u64,
    ) -> Result<Decision, StoreError> {
        let prefix = &self.inner.config.key_prefix;
        let mut del = redis::cmd("DEL");
        let stem = keys::stem(prefix, policy, key);
        let margin = self.inner.config.expiry_margin.as_millis().to_string();
        del.arg(keys::policy_keys(prefix, policy, key, &margin))
            .arg(keys::holders_key(&stem))
            .arg(keys::units_key(&stem));
        let timeout = self.inner.config.timeout;
        let result = match &self.inner.backend {
            Backend::Direct { nodes, .. } => {
                let nodes = nodes.get();
                nodes.primary.query(&del, timeout).await
            }
            Backend::Cluster { conn } => query(&mut conn.get(), &del, timeout).await,
        };
        result
            .map(|_| sluice::core::evaluate::apply(policy, &[], Op::Forget, now_ms).decision)
            .map_err(|f| f.into_store_error(&keys::stem(prefix, policy, key)))
    }
}
