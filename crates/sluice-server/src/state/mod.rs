//! What requests read: the current policies over the store, swapped whole on a reload.

use std::sync::{Arc, RwLock};

use sluice::{Clock, Limiter, MemoryStore, Reserving};

use crate::config::Config;
use crate::observe::Observe;
use crate::observe::traces::Traces;
use sluice_envoy_rules::RlsConfig;

mod apply;
mod store_handle;
#[cfg(test)]
mod tests;

pub use apply::{MAX_RELOADS, Reload, ReloadSource};
pub use store_handle::{DecidingStore, StoreDown, StoreHandle};
use store_handle::{Stores, TracedStore};

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
    pub near_limit: crate::observe::metrics::settings::NearLimit,
}

impl Generation {
    fn new(
        number: u64,
        config: &Config,
        stores: &Stores,
        rls: Option<Arc<RlsConfig>>,
        clock: &ServerClock,
    ) -> Self {
        let limiter = Limiter::new(stores.deciding.clone())
            .with_clock(clock.clone())
            .with_insurance(stores.insurance.clone())
            .with_policies(config.policies.iter().cloned());
        let rls_policies = rule_policies(rls.as_deref(), config.rls.as_ref());
        Self {
            number,
            limiter,
            store: stores.handle.clone(),
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

/// Shared by every request handler.
#[derive(Debug)]
pub struct Shared {
    current: RwLock<Arc<Generation>>,
    stores: Stores,
    /// The configuration the server started with: its `listen`, `store`, `local` and `top`
    /// sections are the ones in force until a restart.
    started_with: Config,
    /// The last [`MAX_RELOADS`] configuration changes, newest last.
    reloads: std::sync::Mutex<std::collections::VecDeque<Reload>>,
    clock: ServerClock,
    observe: Observe,
    /// The slots of `POST /v1/simulate` ([`sluice_simulate::MAX_CONCURRENT`]).
    simulations: Arc<tokio::sync::Semaphore>,
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
        let observe = Observe::new(config.top, traces);
        let stores = Stores::new(store, config.local, &observe);
        let first = Generation::new(1, config, &stores, rls, &clock);
        Self {
            current: RwLock::new(Arc::new(first)),
            stores,
            started_with: config.clone(),
            reloads: std::sync::Mutex::new(std::collections::VecDeque::from([Reload {
                at_ms: clock.now_ms(),
                generation: 1,
                error: None,
                source: ReloadSource::Start,
            }])),
            clock,
            observe,
            simulations: Arc::new(tokio::sync::Semaphore::new(sluice_simulate::MAX_CONCURRENT)),
        }
    }

    /// What the server records of its decisions: metrics, counts, heavy hitters, traces.
    pub(crate) fn observe(&self) -> &Observe {
        &self.observe
    }

    /// The slots of `POST /v1/simulate`: a simulation runs holding one.
    pub fn simulations(&self) -> &Arc<tokio::sync::Semaphore> {
        &self.simulations
    }

    /// Samples the counts into the history (once a second, by the server's background task;
    /// and before the history is read, so a reading is up to date with the clock).
    pub fn sample_history(&self) {
        let snapshot = self.snapshot();
        let observe = &self.observe;
        let mut counts: std::collections::HashMap<String, crate::observe::stats::Counts> =
            observe.counts.read().into_iter().collect();
        for p in snapshot.limiter.policies() {
            counts.entry(p.name().to_owned()).or_default();
        }
        let rules = observe.rules.totals();
        let rule_names: std::collections::HashSet<String> =
            rules.iter().map(|(name, _)| name.clone()).collect();
        counts.extend(rules);
        observe.history.sample(self.clock.now_ms(), counts, |name| {
            snapshot.limiter.policy(name).is_some() || rule_names.contains(name)
        });
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
        &self.stores.handle
    }

    /// The reservation layer, when `local.enabled`.
    pub(crate) fn reserving(&self) -> Option<&Arc<Reserving<TracedStore>>> {
        self.stores.reserving.as_ref()
    }

    /// The server's clock.
    pub fn clock(&self) -> &ServerClock {
        &self.clock
    }

    /// The insurance store of `on_store_error: local` policies.
    pub fn insurance(&self) -> &Arc<MemoryStore> {
        &self.stores.insurance
    }
}
