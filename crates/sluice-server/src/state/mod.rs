//! What requests read: the current policies over the store, swapped whole on a reload.

use std::sync::{Arc, RwLock};

use sluice::{Clock, Limiter, MemoryStore, Reserving};

use crate::config::Config;
use crate::observe::traces::Traces;
use sluice_envoy_rules::RlsConfig;

mod apply;
mod store_handle;
#[cfg(test)]
mod tests;

pub use apply::{MAX_RELOADS, Reload, ReloadSource};
use store_handle::TracedStore;
pub use store_handle::{DecidingStore, StoreDown, StoreHandle};

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
pub type ServerLimiter = Limiter<DecidingStore, ServerClock>;

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
    /// The policy of each of those rules, failing as the settings say: built here, so a
    /// descriptor finds its rule's policy without a lock.
    pub rls_policies: sluice_envoy_rules::RulePolicies,
    /// Envoy rate limit quota rules (`rlqs`), when configured.
    pub rlqs: Option<Arc<sluice_envoy_rules::rlqs::RlqsConfig>>,
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
        deciding: &DecidingStore,
        insurance: &Arc<MemoryStore>,
        rls: Option<Arc<RlsConfig>>,
        clock: &ServerClock,
    ) -> Self {
        let limiter = Limiter::new(deciding.clone())
            .with_clock(clock.clone())
            .with_insurance(insurance.clone())
            .with_policies(config.policies.iter().map(|p| p.policy.clone()));
        let rls_policies = rule_policies(rls.as_deref(), config.rls.as_ref());
        Self {
            number,
            limiter,
            store: store.clone(),
            rls,
            rls_settings: config.rls.clone(),
            rls_policies,
            rlqs: config.rlqs.clone().map(Arc::new),
            admin: config.admin.clone(),
            near_limit: config.metrics.near_limit,
        }
    }

    /// The limiter's clock.
    pub fn now_ms(&self) -> u64 {
        self.limiter.clock().now_ms()
    }

    /// Whether the store can decide ([`StoreHandle::ping`]).
    pub async fn ping(&self) -> Result<(), StoreDown> {
        self.store.ping(self.limiter.clock()).await
    }
}

/// The policies of `rules` under `settings` (none without both).
fn rule_policies(
    rules: Option<&RlsConfig>,
    settings: Option<&crate::config::RlsSettings>,
) -> sluice_envoy_rules::RulePolicies {
    match (rules, settings) {
        (Some(rules), Some(settings)) => {
            sluice_envoy_rules::RulePolicies::new(rules, settings.on_store_error)
        }
        _ => sluice_envoy_rules::RulePolicies::default(),
    }
}

/// Where a decision was asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Surface {
    /// The HTTP API.
    Http = 0,
    /// The gRPC rate limit service (`ShouldRateLimit`).
    Grpc = 1,
}

/// Shared by every request handler.
#[derive(Debug)]
pub struct Shared {
    current: RwLock<Arc<Generation>>,
    store: StoreHandle,
    /// What limiters decide with: the store, or the reservation layer over it.
    deciding: DecidingStore,
    /// The reservation layer (`local.enabled`), kept across reloads with its leases.
    reserving: Option<Arc<Reserving<TracedStore>>>,
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
    /// The slots of `POST /v1/simulate` ([`sluice_simulate::MAX_CONCURRENT`]).
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
        let traced = TracedStore::new(store.clone(), traces.clone());
        let reserving = config
            .local
            .map(|local| Arc::new(Reserving::new(traced.clone(), local)));
        let deciding = DecidingStore::new(traced, reserving.clone());
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
            simulations: Arc::new(tokio::sync::Semaphore::new(sluice_simulate::MAX_CONCURRENT)),
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
    pub(crate) fn reserving(&self) -> Option<&Arc<Reserving<TracedStore>>> {
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
