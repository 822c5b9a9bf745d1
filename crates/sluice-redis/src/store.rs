//! `RedisStore`: the [`Store`] on Redis. One call of the Lua code per operation, sent to the
//! primary (or, for a peek, a replica) that [`topology`] keeps track of, with the arguments
//! and reply of the [`codec`].

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use redis::Value;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{MultipleNodeRoutingInfo, ResponsePolicy, RoutingInfo};
use sluice::{Decision, Op, Policy, Store, StoreError, StoreErrorKind};

use crate::coalesce::{LaneId, Lanes, Pending, Turn};
use crate::codec::{self, Codec};
use crate::config::{ReadFrom, RedisConfig, Shortfall, WaitForReplicas};
use crate::error::{self, Failure, query};
use crate::keys;
use crate::script::{Code, Entry, ScriptMode};
use crate::topology::{self, Backend, Node, Nodes};

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

pub(crate) struct Inner {
    backend: Backend,
    name: String,
    /// `name` as a metrics label (cloned per call without allocating).
    label: metrics::SharedString,
    next_replica: AtomicUsize,
    config: RedisConfig,
    code: Code,
    codec: Codec,
    /// Sentinel subscriptions (`+switch-master`), stopped with the store.
    followers: std::sync::Mutex<Vec<tokio::task::AbortHandle>>,
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

/// One operation on its way to a node.
#[derive(Clone, Copy)]
struct Call<'a> {
    policy: &'a Policy,
    key: &'a str,
    op: Op,
    entry: Entry,
    now_ms: u64,
}

impl Drop for Inner {
    fn drop(&mut self) {
        for follower in self
            .followers
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .drain(..)
        {
            follower.abort();
        }
    }
}

impl RedisStore {
    /// Connects (lazily: the first call opens the connections) and loads the code on the
    /// primary (every primary of a Cluster). Fails if the primary cannot be reached (Sentinel:
    /// if no sentinel names one) or the configuration is invalid.
    pub async fn connect(config: RedisConfig) -> Result<Self, StoreError> {
        keys::validate_prefix(&config.key_prefix).map_err(StoreError::Backend)?;
        if let Some(wait) = &config.wait_for_replicas {
            wait.validate(config.timeout).map_err(StoreError::Backend)?;
        }
        let backend = Backend::connect(&config).await?;
        let name = config.topology.name();
        let store = Self {
            inner: Arc::new(Inner {
                backend,
                label: metrics::SharedString::from(name.clone()),
                name,
                next_replica: AtomicUsize::new(0),
                code: Code::new(config.script_mode),
                codec: Codec::new(&config),
                config,
                followers: std::sync::Mutex::new(Vec::new()),
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

    pub(crate) fn from_inner(inner: Arc<Inner>) -> Self {
        Self { inner }
    }

    /// On Sentinel: subscribes to every sentinel's failover announcements.
    async fn follow_sentinels(&self) {
        let topology::Backend::Direct {
            sentinel: Some(watch),
            ..
        } = self.backend()
        else {
            return;
        };
        let master = watch.master().to_owned();
        let mut followers = Vec::new();
        for (url, client) in watch.sentinel_clients().await {
            let task = tokio::spawn(crate::switches::follow(
                Arc::downgrade(&self.inner),
                url,
                client,
                master.clone(),
            ));
            followers.push(task.abort_handle());
        }
        *self
            .inner
            .followers
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = followers;
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

    pub(crate) fn backend(&self) -> &Backend {
        &self.inner.backend
    }

    pub(crate) fn config(&self) -> &RedisConfig {
        &self.inner.config
    }

    pub(crate) fn code(&self) -> &Code {
        &self.inner.code
    }

    /// The exact command a `check` sends (`FCALL …` or `EVALSHA …`), as strings: for
    /// benchmarks that replay it through `redis-benchmark` as the physical baseline.
    #[doc(hidden)]
    pub fn check_command(&self, policy: &Policy, key: &str, cost: u64, now_ms: u64) -> Vec<String> {
        let op = Op::Check { cost };
        let call = Call {
            policy,
            key,
            op,
            // The call a check makes when it goes alone: the lean one for a rate policy.
            entry: if codec::is_rate(policy, op) {
                Entry::Rate
            } else {
                Entry::Check
            },
            now_ms,
        };
        self.command(&call, false)
            .args_iter()
            .filter_map(|a| match a {
                redis::Arg::Simple(bytes) => Some(String::from_utf8_lossy(bytes).into_owned()),
                _ => None,
            })
            .collect()
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
                let nodes = nodes.read().unwrap_or_else(|p| p.into_inner()).clone();
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

    /// The command that runs `call` (`FCALL_RO`/`EVALSHA_RO` on a replica).
    fn command(&self, call: &Call<'_>, on_replica: bool) -> redis::Cmd {
        let mut cmd = self.inner.code.invocation(call.entry, on_replica);
        let codec = &self.inner.codec;
        match call.entry {
            Entry::Rate | Entry::RatePeek => {
                codec.encode_rate(&mut cmd, call.policy, call.key, call.op.cost(), call.now_ms);
            }
            _ => codec.encode(&mut cmd, call.policy, call.key, call.op, call.now_ms),
        }
        cmd
    }

    pub(crate) fn lanes(&self) -> &Lanes {
        &self.inner.lanes
    }

    /// The most decisions one batch carries (1: no coalescing).
    pub(crate) fn coalesce_max(&self) -> usize {
        self.inner.config.coalesce.max(1)
    }

    /// Decides a rate check (or a peek on the primary) through its lane: alone at once if the
    /// lane is idle, else in the next batch, waiting at most the call timeout.
    async fn coalesced(
        &self,
        policy: &Policy,
        key: &str,
        op: Op,
        now_ms: u64,
    ) -> Result<Decision, StoreError> {
        let lane: LaneId = match &self.inner.backend {
            Backend::Direct { .. } => None,
            Backend::Cluster { .. } => Some(redis::cluster_routing::Slot::for_key(keys::stem(
                &self.inner.config.key_prefix,
                policy,
                key,
            ))),
        };
        let entry = || codec::Entry {
            policy: policy.clone(),
            key: key.to_owned(),
            op,
            now_ms,
        };
        match self.inner.lanes.enter(self, lane, entry) {
            Turn::Lead(leader) => {
                let decided = self.single(policy, key, op, now_ms).await;
                drop(leader);
                decided
            }
            Turn::Wait(answer) => {
                let timeout = self.inner.config.timeout;
                match tokio::time::timeout(timeout, answer).await {
                    Err(_) => Err(StoreError::Timeout(timeout)),
                    Ok(Ok(decided)) => decided,
                    Ok(Err(_)) => Err(StoreError::Unavailable(
                        "the batch carrying this decision was dropped".to_owned(),
                    )),
                }
            }
        }
    }

    /// Sends `batch` (rate checks and peeks of one lane) as one call of the `batch` function
    /// to the primary (on a Cluster, the slot's primary) and answers each decision: with its
    /// own decision or error, or every one with the call's error.
    pub(crate) async fn send_batch(&self, batch: Vec<Pending>) {
        let entries: Vec<codec::Entry> = batch.iter().map(|p| p.entry.clone()).collect();
        let mut cmd = self.inner.code.invocation(Entry::Batch, false);
        self.inner.codec.encode_batch(&mut cmd, &entries);
        let writes = entries.iter().any(|e| !e.op.is_read_only());
        let what = || format!("a batch of {} decisions", entries.len());
        let reply = match &self.inner.backend {
            Backend::Cluster { conn } => self.send_cluster(&conn.get(), &cmd, writes, &what).await,
            Backend::Direct { nodes, .. } => {
                let nodes = nodes.read().unwrap_or_else(|p| p.into_inner()).clone();
                self.send_on(&nodes, &nodes.primary, false, &cmd, writes, &what)
                    .await
            }
        };
        let items = match reply {
            Ok(Value::Array(items)) if items.len() == batch.len() => items,
            Ok(other) => {
                let e = StoreError::Backend(format!(
                    "unexpected reply from the Sluice script to {}: {other:?}",
                    what()
                ));
                for p in batch {
                    let _ = p.answer.send(Err(e.clone()));
                }
                return;
            }
            Err(e) => {
                for p in batch {
                    let _ = p.answer.send(Err(e.clone()));
                }
                return;
            }
        };
        for (p, item) in batch.into_iter().zip(items) {
            let e = &p.entry;
            let decided = match item {
                Value::ServerError(failed) => Err(error::map_error(
                    &redis::RedisError::from(failed),
                    &keys::stem(&self.inner.config.key_prefix, &e.policy, &e.key),
                )),
                item => codec::decode_rate(&item, &e.policy, e.op),
            };
            let _ = p.answer.send(decided);
        }
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
        let call = Call {
            policy,
            key,
            op,
            entry,
            now_ms,
        };
        let inner = &self.inner;
        let on_replica = op.is_read_only() && inner.config.read_from == ReadFrom::Replicas;
        let reply = match &inner.backend {
            Backend::Cluster { conn } => self.call_cluster(&conn.get(), &call, on_replica).await?,
            Backend::Direct { nodes, .. } => {
                let nodes = nodes.read().unwrap_or_else(|p| p.into_inner()).clone();
                let mut answered = None;
                if on_replica && !nodes.replicas.is_empty() {
                    let i =
                        inner.next_replica.fetch_add(1, Ordering::Relaxed) % nodes.replicas.len();
                    let replica = &nodes.replicas[i];
                    match self.call_on(&nodes, replica, true, &call).await {
                        Ok(v) => answered = Some(v),
                        // A peek is a read: the primary answers it as well (with fresher data).
                        Err(e) => {
                            tracing::debug!(replica = %replica.url, error = %e, "peek falls back to the primary")
                        }
                    }
                }
                match answered {
                    Some(v) => v,
                    None => self.call_on(&nodes, &nodes.primary, false, &call).await?,
                }
            }
        };
        if rate {
            codec::decode_rate(&reply, policy, op)
        } else {
            codec::decode(&reply, policy, op)
        }
    }

    /// Sends `call` to `node` (one of `nodes`), loading the code once if it is missing.
    async fn call_on(
        &self,
        nodes: &Nodes,
        node: &Node,
        on_replica: bool,
        call: &Call<'_>,
    ) -> Result<Value, StoreError> {
        let cmd = self.command(call, on_replica);
        let what = || keys::stem(&self.inner.config.key_prefix, call.policy, call.key);
        self.send_on(
            nodes,
            node,
            on_replica,
            &cmd,
            !call.op.is_read_only(),
            &what,
        )
        .await
    }

    /// Sends `cmd` to `node` (one of `nodes`; followed by `WAIT` when configured and `writes`),
    /// loading the code once if it is missing. Errors name `what()`.
    async fn send_on(
        &self,
        nodes: &Nodes,
        node: &Node,
        on_replica: bool,
        cmd: &redis::Cmd,
        writes: bool,
        what: &(dyn Fn() -> String + Sync),
    ) -> Result<Value, StoreError> {
        let inner = &self.inner;
        let timeout = inner.config.timeout;
        let failed = |f: Failure| {
            node.failed(&f);
            if !on_replica && f.suggests_failover() {
                self.rediscover_soon();
            }
            f.into_store_error(&what())
        };
        let wait = self.wait_after(writes, on_replica);
        let mut conn = node.conn();
        match send(&mut conn, cmd, wait, timeout).await {
            Ok(sent) => self.replicated(sent, what),
            Err(f) if f.is_code_missing() => {
                // Nothing ran: the node did not know the code. Load it and try once more.
                let functions = inner.code.mode() == ScriptMode::Function;
                if on_replica && functions {
                    // Functions replicate from the primary; the caller falls back to it.
                    nodes.primary.load(&inner.code, timeout).await?;
                    return Err(StoreError::refused(
                        StoreErrorKind::CodeMissing,
                        format!("{}: function library missing", node.url),
                    ));
                }
                let target = if functions { &nodes.primary } else { node };
                target.load(&inner.code, timeout).await?;
                let sent = send(&mut conn, cmd, wait, timeout).await.map_err(failed)?;
                self.replicated(sent, what)
            }
            Err(f) => Err(failed(f)),
        }
    }

    /// [`RedisStore::call_on`] for a Cluster: the client routes by the keys' slot (`FCALL_RO`
    /// to a replica when reading from replicas) and follows MOVED/ASK.
    async fn call_cluster(
        &self,
        conn: &ClusterConnection,
        call: &Call<'_>,
        on_replica: bool,
    ) -> Result<Value, StoreError> {
        let cmd = self.command(call, on_replica);
        let what = || keys::stem(&self.inner.config.key_prefix, call.policy, call.key);
        let writes = !on_replica && !call.op.is_read_only();
        self.send_cluster(conn, &cmd, writes, &what).await
    }

    /// Sends `cmd` on a Cluster (followed by `WAIT` when configured and `writes`), loading the
    /// code everywhere once if a node lacks it. Errors name `what()`.
    async fn send_cluster(
        &self,
        conn: &ClusterConnection,
        cmd: &redis::Cmd,
        writes: bool,
        what: &(dyn Fn() -> String + Sync),
    ) -> Result<Value, StoreError> {
        let inner = &self.inner;
        let timeout = inner.config.timeout;
        let wait = self.wait_after(writes, false);
        let mut conn = conn.clone();
        match send(&mut conn, cmd, wait, timeout).await {
            Ok(sent) => self.replicated(sent, what),
            Err(f) if f.is_code_missing() => {
                // A node restarted empty (functions replicate, but a new or flushed primary
                // may not have them): load everywhere and try once more.
                topology::load_cluster(&conn, &inner.code, timeout, &inner.name).await?;
                let sent = send(&mut conn, cmd, wait, timeout).await.map_err(|f| {
                    self.reconnect_cluster_soon(&f);
                    f.into_store_error(&what())
                })?;
                self.replicated(sent, what)
            }
            Err(f) => {
                self.reconnect_cluster_soon(&f);
                Err(f.into_store_error(&what()))
            }
        }
    }

    /// The `WAIT` to send behind a call, if configured and the call `writes` on a primary.
    fn wait_after(&self, writes: bool, on_replica: bool) -> Option<&WaitForReplicas> {
        let wait = self.inner.config.wait_for_replicas.as_ref()?;
        (!on_replica && writes).then_some(wait)
    }

    /// The reply of a call that was sent, once its `WAIT` (if any) is judged: fewer replicas
    /// than asked are counted in `sluice_store_unreplicated_total{store}` and, with
    /// [`Shortfall::Fail`], fail the call.
    fn replicated(
        &self,
        sent: Sent,
        what: &(dyn Fn() -> String + Sync),
    ) -> Result<Value, StoreError> {
        let (Some(wait), Some(acked)) = (self.inner.config.wait_for_replicas, sent.acked) else {
            return Ok(sent.reply);
        };
        if acked >= i64::from(wait.replicas) {
            return Ok(sent.reply);
        }
        metrics::counter!("sluice_store_unreplicated_total", "store" => self.inner.label.clone())
            .increment(1);
        // A primary that lost its replicas may have been replaced (Sentinel moves the replicas
        // to the promoted node first): ask whether another node is the primary now.
        self.rediscover_soon();
        let message = format!(
            "{}: {acked} of {} replicas acknowledged the write within {}ms (WAIT)",
            what(),
            wait.replicas,
            wait.timeout.as_millis()
        );
        match wait.on_shortfall {
            Shortfall::Fail => Err(StoreError::Unavailable(message)),
            _ => {
                tracing::debug!(store = %self.inner.name, "{message}; the decision stands");
                Ok(sent.reply)
            }
        }
    }
}

/// What a node answered to a call: its reply and, when `WAIT` followed it, how many replicas
/// acknowledged.
struct Sent {
    reply: Value,
    acked: Option<i64>,
}

/// Sends `cmd`, followed on the same connection by `WAIT` when `wait` is given (`WAIT` may
/// not run inside a script, so it is pipelined right behind the call). The reply is as Redis
/// sent it: an error inside an array (one decision of a batch) stays a value.
async fn send<C: redis::aio::ConnectionLike>(
    conn: &mut C,
    cmd: &redis::Cmd,
    wait: Option<&WaitForReplicas>,
    timeout: std::time::Duration,
) -> Result<Sent, Failure> {
    let Some(wait) = wait else {
        let reply = match tokio::time::timeout(timeout, conn.req_packed_command(cmd)).await {
            Err(_) => return Err(Failure::Timeout(timeout)),
            Ok(reply) => reply.map_err(Failure::Redis)?,
        };
        return match reply {
            Value::ServerError(e) => Err(Failure::Redis(e.into())),
            reply => Ok(Sent { reply, acked: None }),
        };
    };
    let mut pipe = redis::pipe();
    pipe.add_command(cmd.clone())
        .cmd("WAIT")
        .arg(wait.replicas)
        .arg(u64::try_from(wait.timeout.as_millis()).unwrap_or(u64::MAX));
    let replies = match tokio::time::timeout(timeout, conn.req_packed_commands(&pipe, 0, 2)).await {
        Err(_) => return Err(Failure::Timeout(timeout)),
        Ok(replies) => replies.map_err(Failure::Redis)?,
    };
    let mut replies = replies.into_iter();
    match (replies.next(), replies.next()) {
        (Some(Value::ServerError(e)), _) => Err(Failure::Redis(e.into())),
        (Some(reply), Some(Value::Int(acked))) => Ok(Sent {
            reply,
            acked: Some(acked),
        }),
        (reply, acked) => Err(Failure::Redis(redis::RedisError::from((
            redis::ErrorKind::UnexpectedReturnType,
            "unexpected reply to a call and WAIT",
            format!("{reply:?}, {acked:?}"),
        )))),
    }
}

impl Store for RedisStore {
    /// [`Store::call`], measured: `sluice_store_latency_seconds{store}` and
    /// `sluice_store_errors_total{store, kind}` through the `metrics` facade (recorded only if
    /// the application installed a recorder).
    async fn call(
        &self,
        policy: &Policy,
        key: &str,
        op: Op,
        now_ms: u64,
    ) -> Result<Decision, StoreError> {
        let started = Instant::now();
        let result = self.run(policy, key, op, now_ms).await;
        let label = self.inner.label.clone();
        let took = started.elapsed();
        metrics::histogram!("sluice_store_latency_seconds", "store" => label.clone())
            .record(took.as_secs_f64());
        self.inner.latency.record(started, took);
        if let Err(e) = &result {
            metrics::counter!("sluice_store_errors_total", "store" => label, "kind" => e.kind().as_str())
                .increment(1);
        }
        result
    }

    async fn forget(&self, policy: &Policy, key: &str) -> Result<(), StoreError> {
        let prefix = &self.inner.config.key_prefix;
        let mut del = redis::cmd("DEL");
        let stem = keys::stem(prefix, policy, key);
        let limit_keys = keys::policy_keys(prefix, policy, key);
        // A fixed window's counter (layout v2) beside its hash, whichever layout this
        // process opens windows in: another process may have opened one there.
        let margin = self.inner.config.expiry_margin.as_millis().to_string();
        for (k, limit) in limit_keys.iter().zip(policy.limits()) {
            if limit.algorithm() == sluice::Algorithm::FixedWindow {
                del.arg(keys::counter_key(k, &margin));
            }
        }
        del.arg(&limit_keys)
            .arg(keys::holders_key(&stem))
            .arg(keys::units_key(&stem));
        let timeout = self.inner.config.timeout;
        let result = match &self.inner.backend {
            Backend::Direct { nodes, .. } => {
                let nodes = nodes.read().unwrap_or_else(|p| p.into_inner()).clone();
                nodes.primary.query(&del, timeout).await
            }
            Backend::Cluster { conn } => query(&mut conn.get(), &del, timeout).await,
        };
        result
            .map(drop)
            .map_err(|f| f.into_store_error(&keys::stem(prefix, policy, key)))
    }
}
