//! `RedisStore`: one primary (decisions) and its replicas (peeks), one script call per decision.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
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

/// How to reach and use one primary and its replicas.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RedisConfig {
    /// The primary's URL, e.g. `redis://127.0.0.1:6379`.
    pub primary: String,
    /// Replica URLs, for peeks.
    pub replicas: Vec<String>,
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
        Self {
            primary: primary.into(),
            replicas: Vec::new(),
            read_from: ReadFrom::Replicas,
            timeout: Duration::from_millis(50),
            clock: ClockSource::App,
            key_prefix: keys::DEFAULT_PREFIX.to_owned(),
            expiry_margin: Duration::from_secs(1),
            script_mode: ScriptMode::Function,
        }
    }

    /// Adds replicas for peeks.
    pub fn replicas(mut self, urls: impl IntoIterator<Item = impl Into<String>>) -> Self {
        self.replicas = urls.into_iter().map(Into::into).collect();
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

/// A [`Store`] on one Redis primary with optional replicas.
///
/// Every decision is **one** call of a Lua function that reads every limit's state, decides
/// all-or-nothing, writes only if all admit, and returns every limit's state: a denied check
/// carries its full state, no second read is needed for headers. Concurrent calls share one
/// multiplexed connection per node (pipelined by the client); a dropped connection is
/// re-established in the background by redis-rs's `ConnectionManager`.
#[derive(Clone)]
pub struct RedisStore {
    inner: Arc<Inner>,
}

struct Inner {
    primary: Node,
    replicas: Vec<Node>,
    next_replica: AtomicUsize,
    config: RedisConfig,
    code: Code,
    margin_ms: String,
}

struct Node {
    url: String,
    conn: ConnectionManager,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("primary", &self.inner.primary.url)
            .field(
                "replicas",
                &self
                    .inner
                    .replicas
                    .iter()
                    .map(|n| &n.url)
                    .collect::<Vec<_>>(),
            )
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
}

impl Node {
    /// Sends one command on the node's shared connection, bounded by `timeout`.
    async fn query(&self, cmd: &redis::Cmd, timeout: Duration) -> Result<Value, Failure> {
        let mut conn = self.conn.clone();
        match tokio::time::timeout(timeout, cmd.query_async::<Value>(&mut conn)).await {
            Err(_) => Err(Failure::Timeout(timeout)),
            Ok(result) => result.map_err(Failure::Redis),
        }
    }
}

fn node(url: &str, timeout: Duration) -> Result<Node, StoreError> {
    let client = Client::open(url)
        .map_err(|e| StoreError::Unavailable(format!("invalid Redis URL `{url}`: {e}")))?;
    let config = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(timeout.max(Duration::from_millis(500))))
        .set_response_timeout(None)
        .set_number_of_retries(2)
        .set_max_delay(Duration::from_millis(500));
    let conn = ConnectionManager::new_lazy_with_config(client, config)
        .map_err(|e| StoreError::Unavailable(format!("{url}: {e}")))?;
    Ok(Node {
        url: url.to_owned(),
        conn,
    })
}

impl RedisStore {
    /// Connects (lazily: the first call opens the connections) and loads the code on the
    /// primary. Fails if the primary cannot be reached or the configuration is invalid.
    pub async fn connect(config: RedisConfig) -> Result<Self, StoreError> {
        keys::validate_prefix(&config.key_prefix).map_err(StoreError::Backend)?;
        let primary = node(&config.primary, config.timeout)?;
        let replicas = config
            .replicas
            .iter()
            .map(|url| node(url, config.timeout))
            .collect::<Result<Vec<_>, _>>()?;
        let margin_ms = config.expiry_margin.as_millis().to_string();
        let store = Self {
            inner: Arc::new(Inner {
                primary,
                replicas,
                next_replica: AtomicUsize::new(0),
                config,
                code: Code::new(),
                margin_ms,
            }),
        };
        store.load(&store.inner.primary).await?;
        if store.inner.config.script_mode == ScriptMode::EvalSha {
            for replica in &store.inner.replicas {
                // A replica that is down now gets the scripts when it first answers NOSCRIPT.
                if let Err(e) = store.load(replica).await {
                    tracing::warn!(replica = %replica.url, error = %e, "could not load scripts");
                }
            }
        }
        Ok(store)
    }

    /// The primary's URL (a shard's identity for client-side sharding).
    pub fn primary_url(&self) -> &str {
        &self.inner.primary.url
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
        let cmd = self.build_call(Op::Check, policy, key, cost, now_ms, false);
        cmd.args_iter()
            .filter_map(|a| match a {
                redis::Arg::Simple(bytes) => Some(String::from_utf8_lossy(bytes).into_owned()),
                _ => None,
            })
            .collect()
    }

    /// Answers `PING` from the primary within the timeout (for readiness checks).
    pub async fn ping(&self) -> Result<(), StoreError> {
        let primary = &self.inner.primary;
        primary
            .query(&redis::cmd("PING"), self.inner.config.timeout)
            .await
            .map(drop)
            .map_err(|f| f.into_store_error(&primary.url))
    }

    /// Loads the code on `node`: the function library on the primary (it replicates), or the
    /// scripts on any node.
    async fn load(&self, node: &Node) -> Result<(), StoreError> {
        let code = &self.inner.code;
        // Loading compiles the code: allow it more than one decision's timeout.
        let timeout = self.inner.config.timeout.max(Duration::from_secs(2));
        let result = match self.inner.config.script_mode {
            ScriptMode::Function => {
                let mut load = redis::cmd("FUNCTION");
                load.arg("LOAD").arg("REPLACE").arg(&code.library_source);
                node.query(&load, timeout).await
            }
            ScriptMode::EvalSha => {
                let mut last = Ok(Value::Nil);
                for op in Op::ALL {
                    let mut load = redis::cmd("SCRIPT");
                    load.arg("LOAD").arg(code.script(op).0);
                    last = node.query(&load, timeout).await;
                    if last.is_err() {
                        break;
                    }
                }
                last
            }
        };
        result.map(drop).map_err(|f| f.into_store_error(&node.url))
    }

    fn build_call(
        &self,
        op: Op,
        policy: &Policy,
        key: &str,
        cost: u64,
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
            let capped = if op == Op::Refund {
                cost.min(limit.burst())
            } else {
                cost.min(limit.max())
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
        cmd
    }

    /// Runs `op` on the primary, or on a replica for a peek when configured; reloads the code
    /// once if the node does not know it (after `FUNCTION FLUSH`, `SCRIPT FLUSH` or a restart).
    async fn call(
        &self,
        op: Op,
        policy: &Policy,
        key: &str,
        cost: u64,
        now_ms: u64,
    ) -> Result<Decision, StoreError> {
        let inner = &self.inner;
        if op == Op::Peek
            && inner.config.read_from == ReadFrom::Replicas
            && !inner.replicas.is_empty()
        {
            let i = inner.next_replica.fetch_add(1, Ordering::Relaxed) % inner.replicas.len();
            let replica = &inner.replicas[i];
            match self
                .call_on(replica, true, op, policy, key, cost, now_ms)
                .await
            {
                Ok(d) => return Ok(d),
                // A peek is a read: the primary answers it as well (with fresher data).
                Err(e) => {
                    tracing::debug!(replica = %replica.url, error = %e, "peek falls back to the primary")
                }
            }
        }
        self.call_on(&inner.primary, false, op, policy, key, cost, now_ms)
            .await
    }

    #[allow(clippy::too_many_arguments)]
    async fn call_on(
        &self,
        node: &Node,
        on_replica: bool,
        op: Op,
        policy: &Policy,
        key: &str,
        cost: u64,
        now_ms: u64,
    ) -> Result<Decision, StoreError> {
        let cmd = self.build_call(op, policy, key, cost, now_ms, on_replica);
        let timeout = self.inner.config.timeout;
        let what = || keys::stem(&self.inner.config.key_prefix, policy, key);
        let reply = match node.query(&cmd, timeout).await {
            Ok(v) => v,
            Err(Failure::Redis(e)) if code_missing(&e) => {
                // Nothing ran: the node did not know the code. Load it and try once more.
                let functions = self.inner.config.script_mode == ScriptMode::Function;
                if on_replica && functions {
                    // Functions replicate from the primary; the caller falls back to it.
                    self.load(&self.inner.primary).await?;
                    return Err(StoreError::Backend(format!(
                        "{}: function library missing",
                        node.url
                    )));
                }
                self.load(if functions { &self.inner.primary } else { node })
                    .await?;
                node.query(&cmd, timeout)
                    .await
                    .map_err(|f| f.into_store_error(&what()))?
            }
            Err(f) => return Err(f.into_store_error(&what())),
        };
        let cost = if op == Op::Refund { 0 } else { cost };
        parse_reply(&reply, policy, cost)
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
fn parse_reply(reply: &Value, policy: &Policy, cost: u64) -> Result<Decision, StoreError> {
    let bad = |what: &str| {
        StoreError::Backend(format!("unexpected reply from the Sluice script: {what}"))
    };
    let Value::Array(items) = reply else {
        return Err(bad("not an array"));
    };
    let limits = policy.limits();
    if items.len() != 2 + 4 * limits.len() {
        return Err(bad(&format!(
            "{} values for {} limits",
            items.len(),
            limits.len()
        )));
    }
    let allowed = int(&items[0]).ok_or_else(|| bad("allowed"))? == 1;
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
    Ok(Decision::new(allowed, cost, statuses))
}

impl Store for RedisStore {
    async fn check(
        &self,
        policy: &Policy,
        key: &str,
        cost: u64,
        now_ms: u64,
    ) -> Result<Decision, StoreError> {
        self.call(Op::Check, policy, key, cost, now_ms).await
    }

    async fn peek(
        &self,
        policy: &Policy,
        key: &str,
        cost: u64,
        now_ms: u64,
    ) -> Result<Decision, StoreError> {
        self.call(Op::Peek, policy, key, cost, now_ms).await
    }

    async fn refund(
        &self,
        policy: &Policy,
        key: &str,
        cost: u64,
        now_ms: u64,
    ) -> Result<Decision, StoreError> {
        self.call(Op::Refund, policy, key, cost, now_ms).await
    }

    async fn forget(&self, policy: &Policy, key: &str) -> Result<(), StoreError> {
        let prefix = &self.inner.config.key_prefix;
        let mut del = redis::cmd("DEL");
        del.arg(keys::policy_keys(prefix, policy, key));
        self.inner
            .primary
            .query(&del, self.inner.config.timeout)
            .await
            .map(drop)
            .map_err(|f| f.into_store_error(&keys::stem(prefix, policy, key)))
    }
}
