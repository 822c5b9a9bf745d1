//! What requests read: the current policies over the store, swapped whole on a reload.

use std::sync::{Arc, RwLock};

use sluice::breaker::{BreakerState, CircuitBreaker};
use sluice::{
    Clock, Decision, Limiter, MemoryStore, Op, Policy, Reserving, SharedStore, Store, StoreError,
    StoreExt,
};
use sluice_redis::{RedisStore, RegionsStore, ShardedStore};

use crate::config::Config;
use crate::observe::traces::Traces;
use crate::rls::RlsConfig;

/// The store behind the limiter, kept concrete for readiness checks.
#[derive(Debug, Clone)]
pub enum StoreHandle {
    /// In this process.
    Memory(Arc<MemoryStore>),
    /// Redis shards (one or more; a Sentinel-monitored primary is one shard), each behind a
    /// circuit breaker.
    Redis(ShardedStore),
    /// A Redis Cluster (its client routes around failed nodes; each call is bounded by the
    /// timeout).
    Cluster(RedisStore),
    /// One limit across regions (`store.regions`): decided on this region's own Redis, the
    /// other regions' usage read from local replicas of theirs.
    Regions(RegionsStore),
}

impl StoreHandle {
    /// Publishes each shard's circuit breaker to the metrics (called before rendering them).
    pub fn publish_circuits(&self) {
        if let Self::Redis(sharded) = self {
            crate::observe::metrics::circuits(sharded);
        }
    }

    /// What the store is, for the start-up log: `memory`, or the shards' names (never with
    /// credentials).
    pub fn describe(&self) -> String {
        match self {
            StoreHandle::Memory(_) => "memory".to_owned(),
            StoreHandle::Redis(r) => format!("redis shards [{}]", r.names().join(", ")),
            StoreHandle::Cluster(c) => format!("redis {}", c.name()),
            StoreHandle::Regions(r) => crate::observe::regions::describe(r),
        }
    }

    /// The regions store, when the store is one (for its metrics and `/v1/stats`).
    pub fn regions(&self) -> Option<&RegionsStore> {
        match self {
            StoreHandle::Regions(r) => Some(r),
            _ => None,
        }
    }

    fn shared(&self) -> SharedStore {
        match self {
            StoreHandle::Memory(m) => SharedStore::new(m.clone()),
            StoreHandle::Redis(r) => SharedStore::new(r.clone()),
            StoreHandle::Cluster(c) => SharedStore::new(c.clone()),
            StoreHandle::Regions(r) => SharedStore::new(r.clone()),
        }
    }

    /// The store as decisions call it: with traces on, each call is a span naming its shard.
    fn traced(&self, traces: &Traces) -> SharedStore {
        if traces.is_on() {
            SharedStore::new(TracedStore {
                inner: self.shared(),
                handle: self.clone(),
                traces: traces.clone(),
            })
        } else {
            self.shared()
        }
    }

    /// The shard that decides `key` under `policy`, as the store chooses it: a Redis shard's
    /// name and index; a Cluster's name (its client picks the node by slot); `memory`.
    fn shard_of(&self, policy: &Policy, key: &str) -> (String, Option<usize>) {
        match self {
            StoreHandle::Memory(_) => ("memory".to_owned(), None),
            StoreHandle::Redis(sharded) => {
                let i = sharded.shard_for(policy, key);
                let name = sharded.names().get(i).cloned().unwrap_or_default();
                (name, Some(i))
            }
            StoreHandle::Cluster(c) => (c.name().to_owned(), None),
            StoreHandle::Regions(r) => (r.local().name().to_owned(), None),
        }
    }
}

/// The store with a span around each call (`sluice.store`, a child of the decision being
/// made), carrying the shard the store chose and what it answered.
struct TracedStore {
    inner: SharedStore,
    handle: StoreHandle,
    traces: Traces,
}

impl Store for TracedStore {
    async fn call(
        &self,
        policy: &Policy,
        key: &str,
        op: Op,
        now_ms: u64,
    ) -> Result<Decision, StoreError> {
        let span = self.traces.store_call();
        span.set(|| {
            let (shard, index) = self.handle.shard_of(policy, key);
            let mut attributes = vec![
                opentelemetry::KeyValue::new("sluice.shard", shard),
                opentelemetry::KeyValue::new("sluice.policy", policy.name().to_owned()),
                opentelemetry::KeyValue::new("sluice.op", op.name()),
            ];
            if let Some(i) = index {
                let i = i64::try_from(i).unwrap_or(i64::MAX);
                attributes.push(opentelemetry::KeyValue::new("sluice.shard.index", i));
            }
            attributes
        });
        let result = self.inner.call(policy, key, op, now_ms).await;
        match &result {
            Ok(d) if d.allowed => span.finish("allowed", None),
            Ok(_) => span.finish("denied", None),
            Err(e) => {
                span.set(|| {
                    vec![opentelemetry::KeyValue::new(
                        "error.type",
                        e.kind().as_str(),
                    )]
                });
                span.finish("error", Some(e.to_string()));
            }
        }
        result
    }

    async fn forget(&self, policy: &Policy, key: &str) -> Result<(), StoreError> {
        self.inner.forget(policy, key).await
    }
}

/// The server's clock: the system clock, or a test's manual clock.
#[derive(Clone)]
pub struct ServerClock(Arc<dyn Clock>);

impl ServerClock {
    /// A server deciding on `clock`.
    pub fn new(clock: impl Clock) -> Self {
        Self(Arc::new(clock))
    }

    /// The operating system's clock.
    pub fn system() -> Self {
        Self::new(sluice::SystemClock)
    }
}

impl Clock for ServerClock {
    fn now_ms(&self) -> u64 {
        self.0.now_ms()
    }
}

impl std::fmt::Debug for ServerClock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ServerClock")
    }
}

/// The limiter every request goes through.
pub type ServerLimiter = Limiter<SharedStore, ServerClock>;

/// One configuration generation: its number, the policies (with their failure modes) over the
/// store, the Envoy rules and who may use the admin routes. A reload swaps it whole, so the
/// number and what it numbers never disagree.
#[derive(Debug)]
pub struct Generation {
    /// Configurations applied since start (1 = the initial one).
    pub number: u64,
    /// The limiter with this generation's policies.
    pub limiter: ServerLimiter,
    store: StoreHandle,
    /// Envoy rate limit service rules, when `rls.config_dir` is set or `rls.xds` has sent
    /// rules.
    pub rls: Option<Arc<RlsConfig>>,
    /// The `rls` settings that go with them.
    pub rls_settings: Option<crate::config::RlsSettings>,
    /// Envoy rate limit quota rules (`rlqs`), when configured.
    pub rlqs: Option<Arc<crate::rlqs::rules::RlqsConfig>>,
    /// Who may use the admin routes (reloaded with the rest).
    pub admin: Option<crate::config::admin::AdminConfig>,
    /// When an admitted decision counts as near its limit (`metrics.near_limit_ratio`).
    pub near_limit: crate::config::NearLimit,
}

impl Generation {
    fn new(
        number: u64,
        config: &Config,
        store: &StoreHandle,
        deciding: &SharedStore,
        insurance: &Arc<MemoryStore>,
        rls: Option<Arc<RlsConfig>>,
        clock: &ServerClock,
    ) -> Self {
        let limiter = Limiter::new(deciding.clone())
            .with_clock(clock.clone())
            .with_insurance(insurance.clone())
            .with_policies(config.policies.iter().map(|p| p.policy.clone()));
        Self {
            number,
            limiter,
            store: store.clone(),
            rls,
            rls_settings: config.rls.clone(),
            rlqs: config.rlqs.clone().map(Arc::new),
            admin: config.admin.clone(),
            near_limit: config.metrics.near_limit,
        }
    }

    /// The limiter's clock.
    pub fn now_ms(&self) -> u64 {
        self.limiter.clock().now_ms()
    }

    /// Whether the store can decide: every store shard answers `PING`, and with Redis shards
    /// at least one shard's circuit is closed. The error names the shards that do not answer,
    /// or every shard and the error that keeps its circuit open.
    pub async fn ping(&self) -> Result<(), String> {
        match &self.store {
            StoreHandle::Memory(_) => Ok(()),
            StoreHandle::Redis(sharded) => {
                let mut down = Vec::new();
                for (i, shard) in sharded.shards().iter().enumerate() {
                    if let Err(e) = shard.inner().ping().await {
                        down.push(format!("shard {i} {} ({e})", shard.name()));
                    }
                }
                if down.is_empty() {
                    any_circuit_closed(sharded, self.now_ms()).await
                } else {
                    Err(format!("shards not answering: {}", down.join(", ")))
                }
            }
            StoreHandle::Cluster(cluster) => cluster
                .ping()
                .await
                .map_err(|e| format!("shards not answering: {} ({e})", cluster.name())),
            // Ready when this region's own Redis answers: the other regions are read in the
            // background, and a region cut off from them decides by its fallback.
            StoreHandle::Regions(regions) => {
                let local = regions.local();
                local
                    .ping()
                    .await
                    .map_err(|e| format!("shards not answering: {} ({e})", local.name()))
            }
        }
    }
}

/// The policy of readiness probes: a decision of cost 0 on its own key records nothing.
static PROBE: std::sync::LazyLock<Option<Policy>> = std::sync::LazyLock::new(|| {
    Policy::from_specs(
        "sluice:ready",
        vec![sluice::LimitSpec::fixed_window(1, 1_000)],
    )
    .ok()
});

/// `Ok` while at least one shard's circuit is closed. When none is, each shard is probed
/// first, through its breaker, as a request would be (a check of cost 0 on a key of its own,
/// which fails as decisions fail: a `PING` passes where a decision meets `OOM` or `NOPERM`):
/// a server that is not ready gets no traffic to probe with, and must still find out that
/// the store is back.
async fn any_circuit_closed(sharded: &ShardedStore, now_ms: u64) -> Result<(), String> {
    let closed = |s: &CircuitBreaker<RedisStore>| s.state() == BreakerState::Closed;
    if sharded.shards().iter().any(closed) {
        return Ok(());
    }
    if let Some(probe) = PROBE.as_ref() {
        for shard in sharded.shards().iter() {
            // The outcome shows in the circuit's state.
            let _ = shard.check(probe, "probe", 0, now_ms).await;
        }
    }
    if sharded.shards().iter().any(closed) {
        return Ok(());
    }
    let open: Vec<String> = sharded
        .shards()
        .iter()
        .enumerate()
        .map(|(i, shard)| {
            let last = shard.last_error().unwrap_or_default();
            format!("shard {i} {} (last: {last})", shard.name())
        })
        .collect();
    Err(format!(
        "every shard's circuit is open: {}",
        open.join(", ")
    ))
}

/// Where a decision was asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Surface {
    /// The HTTP API.
    Http = 0,
    /// The gRPC rate limit service (`ShouldRateLimit`).
    Grpc = 1,
}

/// Reloads remembered.
pub const MAX_RELOADS: usize = 20;

/// What changed the configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ReloadSource {
    /// The configuration the server started with.
    Start,
    /// The configuration file changed.
    File,
    /// Rules from the xDS control plane (`rls.xds`).
    Xds,
}

/// One configuration change, applied or refused.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Reload {
    /// When, in Unix milliseconds (the server's clock).
    pub at_ms: u64,
    /// The generation in force after it.
    pub generation: u64,
    /// Why it was refused; `None` when it applied.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// What changed.
    pub source: ReloadSource,
}

impl Reload {
    /// Whether it applied.
    pub fn ok(&self) -> bool {
        self.error.is_none()
    }
}

/// Shared by every request handler.
#[derive(Debug)]
pub struct Shared {
    current: RwLock<Arc<Generation>>,
    store: StoreHandle,
    /// What limiters decide with: the store, or the reservation layer over it.
    deciding: SharedStore,
    /// The reservation layer (`local.enabled`), kept across reloads with its leases.
    reserving: Option<Arc<Reserving<SharedStore>>>,
    /// Decides `on_store_error: local` policies while the store is down; kept across reloads.
    insurance: Arc<MemoryStore>,
    /// The configuration the server started with: its `listen`, `store`, `local` and `top`
    /// sections are the ones in force until a restart.
    started_with: Config,
    /// The error of the last failed reload, cleared by a successful one.
    last_reload_error: RwLock<Option<String>>,
    /// The last [`MAX_RELOADS`] configuration changes, newest last.
    reloads: std::sync::Mutex<std::collections::VecDeque<Reload>>,
    clock: ServerClock,
    /// The heavy hitters per policy (`top`); sized at start.
    top: crate::observe::top::TopKeys,
    /// Checks per policy and outcome since start.
    counts: crate::observe::stats::DecisionCounts,
    /// Checks per Envoy rule and detailed key since start.
    rules: crate::observe::rules::RuleCounts,
    /// The last hour of checks per second, per policy and rule.
    history: crate::observe::history::History,
    /// How long decisions took over the last minute: the HTTP API's, then gRPC's.
    decision_latency: [sluice::latency::LatencyWindow; 2],
    /// The open RLQS streams.
    rlqs_streams: crate::observe::streams::Streams,
    /// The slots of `POST /v1/simulate` ([`crate::simulate::MAX_CONCURRENT`]).
    simulations: Arc<tokio::sync::Semaphore>,
    /// Decisions as spans over OTLP (`tracing`); off by default.
    traces: Traces,
}

impl Shared {
    /// The first generation, deciding with `clock`.
    pub fn new(
        config: &Config,
        store: StoreHandle,
        rls: Option<Arc<RlsConfig>>,
        clock: ServerClock,
    ) -> Self {
        Self::traced(config, store, rls, clock, Traces::off())
    }

    /// [`Shared::new`] recording decisions as spans with `traces`.
    pub(crate) fn traced(
        config: &Config,
        store: StoreHandle,
        rls: Option<Arc<RlsConfig>>,
        clock: ServerClock,
        traces: Traces,
    ) -> Self {
        let insurance = Arc::new(MemoryStore::new());
        let reserving = config
            .local
            .map(|local| Arc::new(Reserving::new(store.traced(&traces), local)));
        let deciding = match &reserving {
            Some(r) => SharedStore::new(r.clone()),
            None => store.traced(&traces),
        };
        let first = Generation::new(1, config, &store, &deciding, &insurance, rls, &clock);
        Self {
            current: RwLock::new(Arc::new(first)),
            store,
            deciding,
            reserving,
            insurance,
            started_with: config.clone(),
            last_reload_error: RwLock::new(None),
            reloads: std::sync::Mutex::new(std::collections::VecDeque::from([Reload {
                at_ms: clock.now_ms(),
                generation: 1,
                error: None,
                source: ReloadSource::Start,
            }])),
            clock,
            top: crate::observe::top::TopKeys::new(config.top.capacity, config.top.window_ms),
            counts: crate::observe::stats::DecisionCounts::default(),
            rules: crate::observe::rules::RuleCounts::default(),
            history: crate::observe::history::History::default(),
            decision_latency: Default::default(),
            rlqs_streams: crate::observe::streams::Streams::default(),
            simulations: Arc::new(tokio::sync::Semaphore::new(crate::simulate::MAX_CONCURRENT)),
            traces,
        }
    }

    /// The tracer of decisions (off unless `tracing` is configured).
    pub(crate) fn traces(&self) -> &Traces {
        &self.traces
    }

    /// The slots of `POST /v1/simulate`: a simulation runs holding one.
    pub fn simulations(&self) -> &Arc<tokio::sync::Semaphore> {
        &self.simulations
    }

    /// Checks per policy (and Envoy rule) and outcome since start.
    pub fn counts(&self) -> &crate::observe::stats::DecisionCounts {
        &self.counts
    }

    /// Checks per Envoy rule and detailed key since start.
    pub(crate) fn rules(&self) -> &crate::observe::rules::RuleCounts {
        &self.rules
    }

    /// How long decisions took over the last minute: `[http, grpc]`.
    pub fn decision_latency(&self) -> &[sluice::latency::LatencyWindow; 2] {
        &self.decision_latency
    }

    /// Records how long a decision that started at `started` took, in the metrics
    /// (`sluice_decision_latency_seconds{op}`) and in the last minute of its surface.
    pub(crate) fn decision_took(
        &self,
        op: &'static str,
        surface: Surface,
        started: std::time::Instant,
    ) {
        let took = started.elapsed();
        crate::observe::metrics::decision_latency(op, took);
        self.decision_latency[surface as usize].record(started, took);
    }

    /// The open RLQS streams.
    pub(crate) fn rlqs_streams(&self) -> &crate::observe::streams::Streams {
        &self.rlqs_streams
    }

    /// The last hour of checks per second.
    pub(crate) fn history(&self) -> &crate::observe::history::History {
        &self.history
    }

    /// Samples the counts into the history (once a second, by the server's background task;
    /// and before the history is read, so a reading is up to date with the clock).
    pub fn sample_history(&self) {
        let snapshot = self.snapshot();
        let mut counts: std::collections::HashMap<String, crate::observe::stats::Counts> =
            self.counts.read().into_iter().collect();
        for p in snapshot.limiter.policies() {
            counts.entry(p.name().to_owned()).or_default();
        }
        let rules = self.rules.totals();
        let rule_names: std::collections::HashSet<String> =
            rules.iter().map(|(name, _)| name.clone()).collect();
        counts.extend(rules);
        self.history.sample(self.clock.now_ms(), counts, |name| {
            snapshot.limiter.policy(name).is_some() || rule_names.contains(name)
        });
    }

    /// The heavy hitters per policy and per Envoy rule.
    pub fn top(&self) -> &crate::observe::top::TopKeys {
        &self.top
    }

    /// The current generation (cheap: one reference count).
    pub fn snapshot(&self) -> Arc<Generation> {
        match self.current.read() {
            Ok(g) => g.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// Applies a new configuration's policies to requests that arrive from now on (a change
    /// of the configuration file).
    pub fn apply(&self, config: &Config, rls: Option<Arc<RlsConfig>>) {
        self.swap(ReloadSource::File, |current| {
            Generation::new(
                current.number + 1,
                config,
                &self.store,
                &self.deciding,
                &self.insurance,
                rls,
                &self.clock,
            )
        });
    }

    /// Replaces the Envoy rules alone, keeping the policies and settings in force: an update
    /// from the xDS control plane (`rls.xds`), counted as a reload.
    pub fn replace_rls(&self, rls: Arc<RlsConfig>) {
        self.swap(ReloadSource::Xds, |current| Generation {
            number: current.number + 1,
            limiter: current.limiter.clone(),
            store: current.store.clone(),
            rls: Some(rls),
            rls_settings: current.rls_settings.clone(),
            rlqs: current.rlqs.clone(),
            admin: current.admin.clone(),
            near_limit: current.near_limit,
        });
    }

    /// Applies a new configuration keeping the Envoy rules in force: a reload of the
    /// configuration file while the rules come from xDS.
    pub fn apply_keeping_rls(&self, config: &Config) {
        self.swap(ReloadSource::File, |current| {
            Generation::new(
                current.number + 1,
                config,
                &self.store,
                &self.deciding,
                &self.insurance,
                current.rls.clone(),
                &self.clock,
            )
        });
    }

    /// Builds the next generation from the current one under the write lock, so the reload
    /// watcher and the xDS client never lose each other's update and each generation's
    /// number is its predecessor's plus one. The heavy hitters and the rule counts of what
    /// the new generation no longer has are forgotten.
    fn swap(&self, source: ReloadSource, next: impl FnOnce(&Generation) -> Generation) {
        let generation = {
            let mut current = self.current.write().unwrap_or_else(|p| p.into_inner());
            *current = Arc::new(next(&current));
            current.clone()
        };
        *self
            .last_reload_error
            .write()
            .unwrap_or_else(|p| p.into_inner()) = None;
        let domains: Vec<String> = generation
            .rls
            .iter()
            .flat_map(|r| r.domains().map(str::to_owned))
            .collect();
        let in_rules = |name: &str| {
            domains.iter().any(|d| {
                name.strip_prefix(d.as_str())
                    .is_some_and(|r| r.starts_with('.'))
            })
        };
        self.top
            .retain(|name| generation.limiter.policy(name).is_some() || in_rules(name));
        self.rules
            .retain_domains(|domain| domains.iter().any(|d| d == domain));
        self.record_reload(Reload {
            at_ms: self.clock.now_ms(),
            generation: generation.number,
            error: None,
            source,
        });
    }

    /// Records a reload that failed (the last good configuration stays).
    pub fn reload_failed(&self, source: ReloadSource, error: String) {
        *self
            .last_reload_error
            .write()
            .unwrap_or_else(|p| p.into_inner()) = Some(error.clone());
        self.record_reload(Reload {
            at_ms: self.clock.now_ms(),
            generation: self.snapshot().number,
            error: Some(error),
            source,
        });
    }

    fn record_reload(&self, reload: Reload) {
        let mut reloads = self.reloads.lock().unwrap_or_else(|p| p.into_inner());
        if reloads.len() >= MAX_RELOADS {
            reloads.pop_front();
        }
        reloads.push_back(reload);
    }

    /// The last [`MAX_RELOADS`] configuration changes, newest first.
    pub fn reloads(&self) -> Vec<Reload> {
        let reloads = self.reloads.lock().unwrap_or_else(|p| p.into_inner());
        reloads.iter().rev().cloned().collect()
    }

    /// The error of the last failed reload, cleared by a successful one.
    pub fn last_reload_error(&self) -> Option<String> {
        self.last_reload_error
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The configuration the server started with (a reload cannot change its `listen`,
    /// `store`, `local` and `top` sections).
    pub fn started_with(&self) -> &Config {
        &self.started_with
    }

    /// The store.
    pub fn store(&self) -> &StoreHandle {
        &self.store
    }

    /// The reservation layer, when `local.enabled`.
    pub fn reserving(&self) -> Option<&Arc<Reserving<SharedStore>>> {
        self.reserving.as_ref()
    }

    /// The server's clock.
    pub fn clock(&self) -> &ServerClock {
        &self.clock
    }

    /// The insurance store of `on_store_error: local` policies.
    pub fn insurance(&self) -> &Arc<MemoryStore> {
        &self.insurance
    }
}
