//! `RedisStore`: one primary (decisions) and its replicas (peeks), one script call per decision.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::cluster_read_routing::RandomReplicaStrategy;
use redis::cluster_routing::{MultipleNodeRoutingInfo, ResponsePolicy, RoutingInfo};
use redis::sentinel::Sentinel;
use redis::{Client, RedisError, Value};
use sluice::core::Algorithm;
use sluice::{Decision, LimitStatus, Policy, Store, StoreError};

use crate::keys;
use crate::script::{Code, Op, ScriptMode};

/// Where peeks read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum ReadFrom {
    /// Peeks go to a replica (round robin), or to the primary when none is configured or the
    /// replica cannot answer.
    #[default]
    Replicas,
    /// Everything goes to the primary.
    Primary,
}

/// Where "now" comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum ClockSource {
    /// The limiter's clock, passed to the script (testable with a manual clock).
    #[default]
    App,
    /// Redis `TIME`, read inside the script: for fleets whose clocks disagree.
    Redis,
}

/// Which Redis deployment a store talks to.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Topology {
    /// One primary (decisions) and its replicas (peeks), at fixed addresses.
    Standalone {
        /// The primary's URL, e.g. `redis://127.0.0.1:6379`.
        primary: String,
        /// Replica URLs, for peeks.
        replicas: Vec<String>,
    },
    /// A primary and its replicas found through Redis Sentinel; a failover is followed
    /// without a restart (the store asks the sentinels again when the primary fails).
    Sentinel {
        /// The monitored master's name (`sentinel monitor <name> …`).
        master: String,
        /// Sentinel URLs, e.g. `redis://127.0.0.1:26379`.
        sentinels: Vec<String>,
    },
    /// A Redis Cluster, reached through any of its nodes; the client follows MOVED/ASK and
    /// topology changes. Peeks read replicas when [`ReadFrom::Replicas`].
    Cluster {
        /// Seed node URLs.
        nodes: Vec<String>,
    },
}

/// How to reach and use Redis: where (the [`Topology`]) and how (timeouts, clock, keys).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RedisConfig {
    /// Where the data lives.
    pub topology: Topology,
    /// Where peeks read.
    pub read_from: ReadFrom,
    /// How long one call may take before it fails with [`StoreError::Timeout`].
    pub timeout: Duration,
    /// Where "now" comes from.
    pub clock: ClockSource,
    /// Prepended to every key (no braces).
    pub key_prefix: String,
    /// Keys expire this long after their state stops mattering. Expiry only cleans up (the
    /// script compares stored times with now), so the margin only needs to cover clock
    /// differences between the limiter and Redis. Default 1 s.
    pub expiry_margin: Duration,
    /// Function library or EVALSHA.
    pub script_mode: ScriptMode,
}

impl RedisConfig {
    /// A configuration for one primary with the defaults: 50 ms timeout, the app's clock,
    /// prefix `sluice:`, functions.
    pub fn new(primary: impl Into<String>) -> Self {
        Self::with_topology(Topology::Standalone {
            primary: primary.into(),
            replicas: Vec::new(),
        })
    }

    /// A primary (and replicas) found through Sentinel, with the defaults.
    pub fn sentinel(
        master: impl Into<String>,
        sentinels: impl IntoIterator<Item = impl Into<String>>,
    ) -> Self {
        Self::with_topology(Topology::Sentinel {
            master: master.into(),
            sentinels: sentinels.into_iter().map(Into::into).collect(),
        })
    }

    /// A Redis Cluster reached through `nodes`, with the defaults.
    pub fn cluster(nodes: impl IntoIterator<Item = impl Into<String>>) -> Self {
        Self::with_topology(Topology::Cluster {
            nodes: nodes.into_iter().map(Into::into).collect(),
        })
    }

    /// A configuration for `topology` with the defaults.
    pub fn with_topology(topology: Topology) -> Self {
        Self {
            topology,
            read_from: ReadFrom::Replicas,
            timeout: Duration::from_millis(50),
            clock: ClockSource::App,
            key_prefix: keys::DEFAULT_PREFIX.to_owned(),
            expiry_margin: Duration::from_secs(1),
            script_mode: ScriptMode::Function,
        }
    }

    /// Sets the replicas of a [`Topology::Standalone`] primary, for peeks (other topologies
    /// find their replicas themselves; there this does nothing).
    pub fn replicas(mut self, urls: impl IntoIterator<Item = impl Into<String>>) -> Self {
        if let Topology::Standalone { replicas, .. } = &mut self.topology {
            *replicas = urls.into_iter().map(Into::into).collect();
        }
        self
    }

    /// Sets where peeks read.
    pub fn read_from(mut self, read_from: ReadFrom) -> Self {
        self.read_from = read_from;
        self
    }

    /// Sets the per-call timeout.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Sets the clock source.
    pub fn clock(mut self, clock: ClockSource) -> Self {
        self.clock = clock;
        self
    }

    /// Sets the key prefix.
    pub fn key_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.key_prefix = prefix.into();
        self
    }

    /// Sets the expiry margin.
    pub fn expiry_margin(mut self, margin: Duration) -> Self {
        self.expiry_margin = margin;
        self
    }

    /// Sets how the code is loaded and called.
    pub fn script_mode(mut self, mode: ScriptMode) -> Self {
        self.script_mode = mode;
        self
    }
}

/// A [`Store`] on Redis: one primary with optional replicas (at fixed addresses or found
/// through Sentinel), or a Redis Cluster.
///
/// Every decision is **one** call of a Lua function that reads every limit's state, decides
/// all-or-nothing, writes only if all admit, and returns every limit's state: a denied check
/// carries its full state, no second read is needed for headers. All keys of one decision
/// share a hash tag, so in a Cluster they live in one slot. Concurrent calls share one
/// multiplexed connection per node (pipelined by the client); a dropped connection is
/// re-established in the background.
#[derive(Clone)]
pub struct RedisStore {
    inner: Arc<Inner>,
}

struct Inner {
    backend: Backend,
    name: String,
    /// `name` as a metrics label (cloned per call without allocating).
    label: metrics::SharedString,
    next_replica: AtomicUsize,
    config: RedisConfig,
    code: Code,
    margin_ms: String,
}

enum Backend {
    /// A primary and replicas; with `sentinel`, they are replaced after a failover.
    Direct {
        nodes: RwLock<Arc<Nodes>>,
        sentinel: Option<SentinelWatch>,
    },
    /// A Redis Cluster: the client routes each call by its keys' slot.
    Cluster { conn: ClusterConnection },
}

/// The nodes a direct store talks to now.
struct Nodes {
    primary: Node,
    replicas: Vec<Node>,
}

/// Asks the sentinels for the current primary when the one in use fails.
struct SentinelWatch {
    master: String,
    sentinel: tokio::sync::Mutex<Sentinel>,
    /// One lookup at a time, and not more often than every [`REDISCOVER_EVERY`].
    looking: AtomicBool,
    last_lookup: Mutex<Option<Instant>>,
}

/// The shortest time between two Sentinel lookups.
const REDISCOVER_EVERY: Duration = Duration::from_millis(100);

/// How long one Sentinel lookup may take: twice the call timeout, within these bounds. The
/// lookup checks the named primary's role, and a stalled old primary must not hold it long.
const SENTINEL_TIMEOUT_BOUNDS: (Duration, Duration) =
    (Duration::from_millis(100), Duration::from_secs(1));

struct Node {
    url: String,
    conn: ConnectionManager,
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

/// Why one command failed: no answer in time, or an error from the client or the server.
enum Failure {
    Timeout(Duration),
    Redis(RedisError),
}

impl Failure {
    /// The store error, naming `what` (a node or a key) in the message.
    fn into_store_error(self, what: &str) -> StoreError {
        match self {
            Failure::Timeout(after) => StoreError::Timeout(after),
            Failure::Redis(e) => map_error(&e, what),
        }
    }

    /// Whether the node may no longer be the primary, or be gone: worth asking Sentinel.
    fn suggests_failover(&self) -> bool {
        match self {
            Failure::Timeout(_) => true,
            Failure::Redis(e) => {
                e.is_io_error()
                    || e.is_connection_dropped()
                    || e.is_connection_refusal()
                    || e.is_timeout()
                    || matches!(e.code(), Some("READONLY" | "MASTERDOWN" | "LOADING"))
            }
        }
    }
}

/// Sends one command on a shared connection, bounded by `timeout`.
async fn query<C: redis::aio::ConnectionLike>(
    conn: &mut C,
    cmd: &redis::Cmd,
    timeout: Duration,
) -> Result<Value, Failure> {
    match tokio::time::timeout(timeout, cmd.query_async::<Value>(conn)).await {
        Err(_) => Err(Failure::Timeout(timeout)),
        Ok(result) => result.map_err(Failure::Redis),
    }
}

impl Node {
    /// Sends one command on the node's shared connection, bounded by `timeout`.
    async fn query(&self, cmd: &redis::Cmd, timeout: Duration) -> Result<Value, Failure> {
        query(&mut self.conn.clone(), cmd, timeout).await
    }
}

fn node(url: &str, timeout: Duration) -> Result<Node, StoreError> {
    let client = Client::open(url)
        .map_err(|e| StoreError::Unavailable(format!("invalid Redis URL `{url}`: {e}")))?;
    node_from_client(url.to_owned(), client, timeout)
}

fn node_from_client(url: String, client: Client, timeout: Duration) -> Result<Node, StoreError> {
    // Reconnect quickly: a restarted node must be usable again well within a second. The
    // circuit breaker, not the connection, is what spares a dead node its traffic.
    let config = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(timeout.max(Duration::from_millis(500))))
        .set_response_timeout(None)
        .set_number_of_retries(1)
        .set_min_delay(Duration::from_millis(10))
        .set_max_delay(Duration::from_millis(100));
    let conn = ConnectionManager::new_lazy_with_config(client, config)
        .map_err(|e| StoreError::Unavailable(format!("{url}: {e}")))?;
    Ok(Node { url, conn })
}

/// `redis://host:port` of a client's address.
fn client_url(client: &Client) -> String {
    match client.get_connection_info().addr() {
        redis::ConnectionAddr::Tcp(host, port) => format!("redis://{host}:{port}"),
        other => other.to_string(),
    }
}

/// Asks the sentinels for `master`'s primary and replicas (bounded in time).
async fn discover(
    sentinel: &mut Sentinel,
    master: &str,
    timeout: Duration,
) -> Result<Nodes, StoreError> {
    let limit = (timeout * 2).clamp(SENTINEL_TIMEOUT_BOUNDS.0, SENTINEL_TIMEOUT_BOUNDS.1);
    let primary = match tokio::time::timeout(limit, sentinel.async_master_for(master, None)).await {
        Err(_) => {
            return Err(StoreError::Unavailable(format!(
                "sentinels did not name a primary for `{master}` within {}ms",
                limit.as_millis()
            )));
        }
        Ok(Err(e)) => {
            return Err(StoreError::Unavailable(format!(
                "sentinels cannot name a primary for `{master}`: {e}"
            )));
        }
        Ok(Ok(primary)) => primary,
    };
    // Replicas are for peeks only, and one may be the stalled old primary: a lookup that
    // fails or hangs leaves none (peeks then read the primary) rather than delaying the
    // switch to the new primary.
    let replicas =
        match tokio::time::timeout(limit, sentinel.async_get_replica_clients(master, None)).await {
            Ok(Ok(replicas)) => replicas,
            _ => Vec::new(),
        };
    let primary = node_from_client(client_url(&primary), primary, timeout)?;
    let replicas = replicas
        .into_iter()
        .map(|c| node_from_client(client_url(&c), c, timeout))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Nodes { primary, replicas })
}

impl RedisStore {
    /// Connects (lazily: the first call opens the connections) and loads the code on the
    /// primary (every primary of a Cluster). Fails if the primary cannot be reached (Sentinel:
    /// if no sentinel names one) or the configuration is invalid.
    pub async fn connect(config: RedisConfig) -> Result<Self, StoreError> {
        keys::validate_prefix(&config.key_prefix).map_err(StoreError::Backend)?;
        let (backend, name) = match &config.topology {
            Topology::Standalone { primary, replicas } => {
                let nodes = Nodes {
                    primary: node(primary, config.timeout)?,
                    replicas: replicas
                        .iter()
                        .map(|url| node(url, config.timeout))
                        .collect::<Result<Vec<_>, _>>()?,
                };
                let backend = Backend::Direct {
                    nodes: RwLock::new(Arc::new(nodes)),
                    sentinel: None,
                };
                (backend, primary.clone())
            }
            Topology::Sentinel { master, sentinels } => {
                if sentinels.is_empty() {
                    return Err(StoreError::Backend(
                        "sentinel: at least one sentinel URL is needed".to_owned(),
                    ));
                }
                let mut sentinel = Sentinel::build(sentinels.clone()).map_err(|e| {
                    StoreError::Backend(format!("invalid sentinel URLs {sentinels:?}: {e}"))
                })?;
                let nodes = discover(&mut sentinel, master, config.timeout).await?;
                tracing::info!(master = %master, primary = %nodes.primary.url, "sentinel named the primary");
                let backend = Backend::Direct {
                    nodes: RwLock::new(Arc::new(nodes)),
                    sentinel: Some(SentinelWatch {
                        master: master.clone(),
                        sentinel: tokio::sync::Mutex::new(sentinel),
                        looking: AtomicBool::new(false),
                        last_lookup: Mutex::new(None),
                    }),
                };
                (backend, format!("sentinel:{master}"))
            }
            Topology::Cluster { nodes } => {
                let Some(first) = nodes.first() else {
                    return Err(StoreError::Backend(
                        "cluster: at least one node URL is needed".to_owned(),
                    ));
                };
                let mut builder = ClusterClientBuilder::new(nodes.clone())
                    .connection_timeout(config.timeout.max(Duration::from_millis(500)))
                    .response_timeout(config.timeout)
                    .retries(2)
                    .min_retry_wait(5)
                    .max_retry_wait(100);
                if config.read_from == ReadFrom::Replicas {
                    builder = builder.read_routing_strategy(RandomReplicaStrategy);
                }
                let client = builder.build().map_err(|e| {
                    StoreError::Backend(format!("invalid cluster node URLs {nodes:?}: {e}"))
                })?;
                let conn = tokio::time::timeout(
                    config.timeout.max(Duration::from_secs(2)),
                    client.get_async_connection(),
                )
                .await
                .map_err(|_| StoreError::Unavailable(format!("cluster {first}: no answer")))?
                .map_err(|e| StoreError::Unavailable(format!("cluster {first}: {e}")))?;
                (Backend::Cluster { conn }, format!("cluster:{first}"))
            }
        };
        let margin_ms = config.expiry_margin.as_millis().to_string();
        let store = Self {
            inner: Arc::new(Inner {
                backend,
                label: metrics::SharedString::from(name.clone()),
                name,
                next_replica: AtomicUsize::new(0),
                config,
                code: Code::new(),
                margin_ms,
            }),
        };
        match &store.inner.backend {
            Backend::Direct { nodes, .. } => {
                let nodes = nodes.read().unwrap_or_else(|p| p.into_inner()).clone();
                store.load(&nodes.primary).await?;
                if store.inner.config.script_mode == ScriptMode::EvalSha {
                    for replica in &nodes.replicas {
                        // A replica that is down now gets the scripts when it first answers
                        // NOSCRIPT.
                        if let Err(e) = store.load(replica).await {
                            tracing::warn!(replica = %replica.url, error = %e, "could not load scripts");
                        }
                    }
                }
            }
            Backend::Cluster { conn } => store.load_cluster(conn).await?,
        }
        Ok(store)
    }

    /// The store's identity: the primary's URL, `sentinel:<master>` or `cluster:<first
    /// node>` (a shard's name for client-side sharding).
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The URL of the primary in use now (for a Cluster, its first seed node).
    pub fn primary_url(&self) -> String {
        match self.nodes() {
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

    /// The exact command a `check` sends (`FCALL …` or `EVALSHA …`), as strings: for
    /// benchmarks that replay it through `redis-benchmark` as the physical baseline.
    #[doc(hidden)]
    pub fn check_command(&self, policy: &Policy, key: &str, cost: u64, now_ms: u64) -> Vec<String> {
        let cmd = self.build_call(Op::Check, policy, key, cost, 0, now_ms, false);
        cmd.args_iter()
            .filter_map(|a| match a {
                redis::Arg::Simple(bytes) => Some(String::from_utf8_lossy(bytes).into_owned()),
                _ => None,
            })
            .collect()
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
                let mut conn = conn.clone();
                let ping = conn.route_command(redis::cmd("PING"), routing);
                match tokio::time::timeout(timeout, ping).await {
                    Err(_) => Err(StoreError::Timeout(timeout)),
                    Ok(r) => r.map(drop).map_err(|e| map_error(&e, &self.inner.name)),
                }
            }
        }
    }

    /// The nodes in use now (`None` for a Cluster, whose client keeps its own).
    fn nodes(&self) -> Option<Arc<Nodes>> {
        match &self.inner.backend {
            Backend::Direct { nodes, .. } => {
                Some(nodes.read().unwrap_or_else(|p| p.into_inner()).clone())
            }
            Backend::Cluster { .. } => None,
        }
    }

    /// Asks the sentinels (in the background, at most every [`REDISCOVER_EVERY`]) whether
    /// another node is the primary now, and switches to it. Does nothing without Sentinel.
    fn rediscover_soon(&self) {
        let Backend::Direct {
            sentinel: Some(watch),
            ..
        } = &self.inner.backend
        else {
            return;
        };
        {
            let mut last = watch.last_lookup.lock().unwrap_or_else(|p| p.into_inner());
            if last.is_some_and(|t| t.elapsed() < REDISCOVER_EVERY) {
                return;
            }
            if watch.looking.swap(true, Ordering::AcqRel) {
                return;
            }
            *last = Some(Instant::now());
        }
        let store = self.clone();
        tokio::spawn(async move {
            store.rediscover().await;
            if let Backend::Direct {
                sentinel: Some(watch),
                ..
            } = &store.inner.backend
            {
                watch.looking.store(false, Ordering::Release);
            }
        });
    }

    async fn rediscover(&self) {
        let Backend::Direct {
            nodes,
            sentinel: Some(watch),
        } = &self.inner.backend
        else {
            return;
        };
        let found = {
            let mut sentinel = watch.sentinel.lock().await;
            discover(&mut sentinel, &watch.master, self.inner.config.timeout).await
        };
        let found = match found {
            Ok(found) => found,
            Err(e) => {
                tracing::debug!(master = %watch.master, error = %e, "sentinel lookup failed");
                return;
            }
        };
        let current = nodes.read().unwrap_or_else(|p| p.into_inner()).clone();
        let same_replicas = current.replicas.len() == found.replicas.len()
            && current
                .replicas
                .iter()
                .zip(&found.replicas)
                .all(|(a, b)| a.url == b.url);
        if current.primary.url == found.primary.url && same_replicas {
            return;
        }
        if current.primary.url != found.primary.url {
            // The library replicates, but a promoted node may have been restarted empty.
            if let Err(e) = self.load(&found.primary).await {
                tracing::warn!(master = %watch.master, primary = %found.primary.url, error = %e, "could not load the code on the new primary");
            }
            tracing::warn!(master = %watch.master, from = %current.primary.url, to = %found.primary.url, "sentinel failover: switching primary");
        }
        *nodes.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(found);
    }

    /// Loads the code on `node`: the function library on the primary (it replicates), or the
    /// scripts on any node.
    async fn load(&self, node: &Node) -> Result<(), StoreError> {
        let result = query(
            &mut node.conn.clone(),
            &self.load_command(),
            self.load_timeout(),
        )
        .await;
        let result = match (result, self.inner.config.script_mode) {
            (Ok(_), ScriptMode::EvalSha) => self.load_remaining_scripts(node).await,
            (result, _) => result,
        };
        result.map(drop).map_err(|f| f.into_store_error(&node.url))
    }

    /// Loads the code on every primary of a Cluster (scripts: on every node).
    async fn load_cluster(&self, conn: &ClusterConnection) -> Result<(), StoreError> {
        let mut conn = conn.clone();
        // `FUNCTION LOAD` and `SCRIPT LOAD` are routed to all primaries / all nodes by the
        // client, which fails if one fails.
        let mut result = query(&mut conn, &self.load_command(), self.load_timeout()).await;
        if result.is_ok() && self.inner.config.script_mode == ScriptMode::EvalSha {
            for op in &Op::ALL[1..] {
                let mut load = redis::cmd("SCRIPT");
                load.arg("LOAD").arg(self.inner.code.script(*op).0);
                result = query(&mut conn, &load, self.load_timeout()).await;
                if result.is_err() {
                    break;
                }
            }
        }
        result
            .map(drop)
            .map_err(|f| f.into_store_error(&self.inner.name))
    }

    /// Loading compiles the code: allow it more than one decision's timeout.
    fn load_timeout(&self) -> Duration {
        self.inner.config.timeout.max(Duration::from_secs(2))
    }

    /// `FUNCTION LOAD REPLACE <library>`, or `SCRIPT LOAD` of the first script.
    fn load_command(&self) -> redis::Cmd {
        let code = &self.inner.code;
        match self.inner.config.script_mode {
            ScriptMode::Function => {
                let mut load = redis::cmd("FUNCTION");
                load.arg("LOAD").arg("REPLACE").arg(&code.library_source);
                load
            }
            ScriptMode::EvalSha => {
                let mut load = redis::cmd("SCRIPT");
                load.arg("LOAD").arg(code.script(Op::ALL[0]).0);
                load
            }
        }
    }

    async fn load_remaining_scripts(&self, node: &Node) -> Result<Value, Failure> {
        let mut last = Ok(Value::Nil);
        for op in &Op::ALL[1..] {
            let mut load = redis::cmd("SCRIPT");
            load.arg("LOAD").arg(self.inner.code.script(*op).0);
            last = node.query(&load, self.load_timeout()).await;
            if last.is_err() {
                break;
            }
        }
        last
    }

    #[allow(clippy::too_many_arguments)]
    fn build_call(
        &self,
        op: Op,
        policy: &Policy,
        key: &str,
        cost: u64,
        batch: u64,
        now_ms: u64,
        on_replica: bool,
    ) -> redis::Cmd {
        let inner = &self.inner;
        let code = &inner.code;
        let keys = keys::policy_keys(&inner.config.key_prefix, policy, key);
        let mut cmd = match inner.config.script_mode {
            ScriptMode::Function => {
                let mut c = redis::cmd(if on_replica { "FCALL_RO" } else { "FCALL" });
                c.arg(code.function(op));
                c
            }
            ScriptMode::EvalSha => {
                let mut c = redis::cmd(if on_replica { "EVALSHA_RO" } else { "EVALSHA" });
                c.arg(code.script(op).1);
                c
            }
        };
        cmd.arg(keys.len()).arg(&keys);
        match inner.config.clock {
            ClockSource::App => cmd.arg(now_ms),
            ClockSource::Redis => cmd.arg("redis"),
        };
        cmd.arg(cost)
            .arg(&inner.margin_ms)
            .arg(policy.limits().len());
        for limit in policy.limits() {
            let alg = match limit.algorithm() {
                Algorithm::FixedWindow if limit.align() => 2,
                Algorithm::FixedWindow => 1,
                Algorithm::SlidingWindow => 3,
                _ => 4,
            };
            let (max, per) = (u128::from(limit.max()), u128::from(limit.per_ms()));
            let tau = u128::from(limit.burst()) * per;
            // The bucket's step. A check uses it only for costs it may admit (cost <= max;
            // larger ones are refused first). A refund of `burst` or more empties the bucket
            // whatever the cost, so capping it there keeps the step below 2^53 ms for Lua.
            // An acquire passes the step of one unit; the script scales it to the amount it
            // takes (at most max).
            let capped = match op {
                Op::Refund => cost.min(limit.burst()),
                Op::Acquire => 1,
                _ => cost.min(limit.max()),
            };
            let step = u128::from(capped) * per;
            cmd.arg(alg)
                .arg(limit.max())
                .arg(limit.per_ms())
                .arg(limit.precision_ms())
                .arg(limit.burst())
                .arg((tau / max).to_string())
                .arg((tau % max).to_string())
                .arg((step / max).to_string())
                .arg((step % max).to_string());
        }
        if op == Op::Acquire {
            cmd.arg(batch);
        }
        cmd
    }

    /// [`RedisStore::call_unmeasured`], measured: `sluice_store_latency_seconds{store}` and
    /// `sluice_store_errors_total{store, kind}` through the `metrics` facade (recorded only if
    /// the application installed a recorder).
    async fn call(
        &self,
        op: Op,
        policy: &Policy,
        key: &str,
        cost: u64,
        batch: u64,
        now_ms: u64,
    ) -> Result<Decision, StoreError> {
        let started = Instant::now();
        let result = self
            .call_unmeasured(op, policy, key, cost, batch, now_ms)
            .await;
        let label = self.inner.label.clone();
        metrics::histogram!("sluice_store_latency_seconds", "store" => label.clone())
            .record(started.elapsed().as_secs_f64());
        if let Err(e) = &result {
            let kind = match e {
                StoreError::Timeout(_) => "timeout",
                StoreError::Unavailable(_) => "unavailable",
                StoreError::Corrupt { .. } => "corrupt",
                _ => "other",
            };
            metrics::counter!("sluice_store_errors_total", "store" => label, "kind" => kind)
                .increment(1);
        }
        result
    }

    /// Runs `op` on the primary, or on a replica for a peek when configured; reloads the code
    /// once if the node does not know it (after `FUNCTION FLUSH`, `SCRIPT FLUSH` or a restart).
    async fn call_unmeasured(
        &self,
        op: Op,
        policy: &Policy,
        key: &str,
        cost: u64,
        batch: u64,
        now_ms: u64,
    ) -> Result<Decision, StoreError> {
        let inner = &self.inner;
        let on_replica = op == Op::Peek && inner.config.read_from == ReadFrom::Replicas;
        let reply = match &inner.backend {
            Backend::Cluster { conn } => {
                self.call_cluster(conn, op, policy, key, cost, batch, now_ms, on_replica)
                    .await?
            }
            Backend::Direct { nodes, .. } => {
                let nodes = nodes.read().unwrap_or_else(|p| p.into_inner()).clone();
                let mut answered = None;
                if on_replica && !nodes.replicas.is_empty() {
                    let i =
                        inner.next_replica.fetch_add(1, Ordering::Relaxed) % nodes.replicas.len();
                    let replica = &nodes.replicas[i];
                    match self
                        .call_on(&nodes, replica, true, op, policy, key, cost, batch, now_ms)
                        .await
                    {
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
                        self.call_on(
                            &nodes,
                            &nodes.primary,
                            false,
                            op,
                            policy,
                            key,
                            cost,
                            batch,
                            now_ms,
                        )
                        .await?
                    }
                }
            }
        };
        parse_reply(&reply, policy, op, cost)
    }

    #[allow(clippy::too_many_arguments)]
    async fn call_on(
        &self,
        nodes: &Nodes,
        node: &Node,
        on_replica: bool,
        op: Op,
        policy: &Policy,
        key: &str,
        cost: u64,
        batch: u64,
        now_ms: u64,
    ) -> Result<Value, StoreError> {
        let cmd = self.build_call(op, policy, key, cost, batch, now_ms, on_replica);
        let timeout = self.inner.config.timeout;
        let what = || keys::stem(&self.inner.config.key_prefix, policy, key);
        let failed = |f: Failure| {
            if !on_replica && f.suggests_failover() {
                self.rediscover_soon();
            }
            f.into_store_error(&what())
        };
        match node.query(&cmd, timeout).await {
            Ok(v) => Ok(v),
            Err(Failure::Redis(e)) if code_missing(&e) => {
                // Nothing ran: the node did not know the code. Load it and try once more.
                let functions = self.inner.config.script_mode == ScriptMode::Function;
                if on_replica && functions {
                    // Functions replicate from the primary; the caller falls back to it.
                    self.load(&nodes.primary).await?;
                    return Err(StoreError::Backend(format!(
                        "{}: function library missing",
                        node.url
                    )));
                }
                self.load(if functions { &nodes.primary } else { node })
                    .await?;
                node.query(&cmd, timeout).await.map_err(failed)
            }
            Err(f) => Err(failed(f)),
        }
    }

    /// [`RedisStore::call_on`] for a Cluster: the client routes by the keys' slot (`FCALL_RO`
    /// to a replica when reading from replicas) and follows MOVED/ASK.
    #[allow(clippy::too_many_arguments)]
    async fn call_cluster(
        &self,
        conn: &ClusterConnection,
        op: Op,
        policy: &Policy,
        key: &str,
        cost: u64,
        batch: u64,
        now_ms: u64,
        on_replica: bool,
    ) -> Result<Value, StoreError> {
        let cmd = self.build_call(op, policy, key, cost, batch, now_ms, on_replica);
        let timeout = self.inner.config.timeout;
        let what = || keys::stem(&self.inner.config.key_prefix, policy, key);
        let mut conn = conn.clone();
        match query(&mut conn, &cmd, timeout).await {
            Ok(v) => Ok(v),
            Err(Failure::Redis(e)) if code_missing(&e) => {
                // A node restarted empty (functions replicate, but a new or flushed primary
                // may not have them): load everywhere and try once more.
                self.load_cluster(&conn).await?;
                query(&mut conn, &cmd, timeout)
                    .await
                    .map_err(|f| f.into_store_error(&what()))
            }
            Err(f) => Err(f.into_store_error(&what())),
        }
    }
}

/// The node does not have the code: `NOSCRIPT`, or `ERR Function not found`.
fn code_missing(e: &RedisError) -> bool {
    e.code() == Some("NOSCRIPT")
        || e.detail().is_some_and(|d| d.contains("Function not found"))
        || e.to_string().contains("Function not found")
}

fn map_error(e: &RedisError, what: &str) -> StoreError {
    if e.is_timeout() {
        return StoreError::Unavailable(format!("{what}: {e}"));
    }
    if e.is_io_error() || e.is_connection_dropped() || e.is_connection_refusal() {
        return StoreError::Unavailable(format!("{what}: {e}"));
    }
    let text = e.to_string();
    if e.code() == Some("WRONGTYPE") {
        return StoreError::Corrupt {
            key: what.to_owned(),
            detail: "a key of this policy holds a value of the wrong Redis type".to_owned(),
        };
    }
    if let Some(at) = text.find("SLUICE_CORRUPT ") {
        let detail = text[at + "SLUICE_CORRUPT ".len()..].to_owned();
        return StoreError::Corrupt {
            key: what.to_owned(),
            detail,
        };
    }
    if matches!(
        e.code(),
        Some("LOADING" | "MASTERDOWN" | "TRYAGAIN" | "CLUSTERDOWN" | "READONLY")
    ) {
        return StoreError::Unavailable(format!("{what}: {e}"));
    }
    StoreError::Backend(format!("{what}: {text}"))
}

fn int(v: &Value) -> Option<i64> {
    match v {
        Value::Int(n) => Some(*n),
        _ => None,
    }
}

/// Turns the script's reply into a decision (the binding limit is chosen here, by the same
/// function the memory store uses).
fn parse_reply(reply: &Value, policy: &Policy, op: Op, cost: u64) -> Result<Decision, StoreError> {
    let bad = |what: &str| {
        StoreError::Backend(format!("unexpected reply from the Sluice script: {what}"))
    };
    let Value::Array(items) = reply else {
        return Err(bad("not an array"));
    };
    let limits = policy.limits();
    let expected = 2 + 4 * limits.len() + usize::from(op == Op::Acquire);
    // The decision's cost: what was asked; a refund reports the state (cost 0); an acquire
    // the amount it took (its last value).
    let cost = match op {
        Op::Refund => 0,
        Op::Acquire => items
            .last()
            .and_then(int)
            .and_then(|n| u64::try_from(n).ok())
            .ok_or_else(|| bad("the amount taken"))?,
        _ => cost,
    };
    if items.len() != expected {
        return Err(bad(&format!(
            "{} values for {} limits",
            items.len(),
            limits.len()
        )));
    }
    let allowed = int(&items[0]).ok_or_else(|| bad("allowed"))? == 1;
    let now = int(&items[1])
        .and_then(|n| u64::try_from(n).ok())
        .ok_or_else(|| bad("now"))?;
    let mut statuses = Vec::with_capacity(limits.len());
    for (i, limit) in limits.iter().enumerate() {
        let f = &items[2 + 4 * i..6 + 4 * i];
        let n = |j: usize| int(&f[j]).ok_or_else(|| bad("a limit's field"));
        let u = |j: usize| n(j).and_then(|v| u64::try_from(v).map_err(|_| bad("a negative field")));
        let retry = n(3)?;
        statuses.push(LimitStatus {
            max: limit.max(),
            per_ms: limit.per_ms(),
            algorithm: limit.algorithm(),
            admits: n(0)? == 1,
            remaining: u(1)?,
            reset_ms: u(2)?,
            retry_after_ms: u64::try_from(retry).ok(),
        });
    }
    Ok(Decision::new(allowed, cost, statuses, now))
}

impl Store for RedisStore {
    async fn check(
        &self,
        policy: &Policy,
        key: &str,
        cost: u64,
        now_ms: u64,
    ) -> Result<Decision, StoreError> {
        self.call(Op::Check, policy, key, cost, 0, now_ms).await
    }

    async fn peek(
        &self,
        policy: &Policy,
        key: &str,
        cost: u64,
        now_ms: u64,
    ) -> Result<Decision, StoreError> {
        self.call(Op::Peek, policy, key, cost, 0, now_ms).await
    }

    async fn refund(
        &self,
        policy: &Policy,
        key: &str,
        cost: u64,
        now_ms: u64,
    ) -> Result<Decision, StoreError> {
        self.call(Op::Refund, policy, key, cost, 0, now_ms).await
    }

    async fn acquire(
        &self,
        policy: &Policy,
        key: &str,
        min: u64,
        max: u64,
        now_ms: u64,
    ) -> Result<Decision, StoreError> {
        self.call(Op::Acquire, policy, key, min, max, now_ms).await
    }

    async fn forget(&self, policy: &Policy, key: &str) -> Result<(), StoreError> {
        let prefix = &self.inner.config.key_prefix;
        let mut del = redis::cmd("DEL");
        del.arg(keys::policy_keys(prefix, policy, key));
        let timeout = self.inner.config.timeout;
        let result = match &self.inner.backend {
            Backend::Direct { nodes, .. } => {
                let nodes = nodes.read().unwrap_or_else(|p| p.into_inner()).clone();
                nodes.primary.query(&del, timeout).await
            }
            Backend::Cluster { conn } => query(&mut conn.clone(), &del, timeout).await,
        };
        result
            .map(drop)
            .map_err(|f| f.into_store_error(&keys::stem(prefix, policy, key)))
    }
}
