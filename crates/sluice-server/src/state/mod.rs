//! What requests read: the current policies over the store, swapped whole on a reload.

use std::sync::{Arc, RwLock};

use sluice::{Clock, Limiter, MemoryStore, Reserving};

use crate::config::Config;
use crate::observe::Observe;
use crate::observe::traces::Traces;
use sluice_envoy_rules::RlsConfig;

mod apply;
mod store_handle;

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
        Self::traced(config, store, rls, clock, Traces::default())
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

#[cfg(test)]
mod tests {
    //! Heap allocations per decision through the server's limiter, counted by a global allocator
    //! of this test binary (per thread, so tests running beside it do not count).

    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::alloc::{GlobalAlloc, Layout, System};
    use std::cell::Cell;
    use std::future::Future;
    use std::sync::Arc;

    use sluice::{Limiter, ManualClock, MemoryStore, Reserving, SharedStore};

    use super::{ServerClock, Shared, StoreHandle};
    use crate::config::Config;

    struct Counting;

    thread_local! {
        static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
    }

    fn count() {
        // `try_with`: a thread being torn down has no counter left, and allocates uncounted.
        let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
    }

    // The workspace denies unsafe code; a global allocator cannot be written without it. This one
    // only forwards to `System` and counts calls, and it exists only in the unit-test binary.
    #[allow(unsafe_code)]
    unsafe impl GlobalAlloc for Counting {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            count();
            // SAFETY: forwarded unchanged to the system allocator.
            unsafe { System.alloc(layout) }
        }

        unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
            count();
            // SAFETY: forwarded unchanged to the system allocator.
            unsafe { System.alloc_zeroed(layout) }
        }

        unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
            // SAFETY: `ptr` came from this allocator, that is from `System`, with this layout.
            unsafe { System.dealloc(ptr, layout) }
        }

        unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
            count();
            // SAFETY: forwarded unchanged to the system allocator.
            unsafe { System.realloc(ptr, layout, new_size) }
        }
    }

    #[global_allocator]
    static ALLOCATOR: Counting = Counting;

    const DECISIONS: u64 = 1_000;
    const T0: u64 = 1_700_000_000_000;
    const CONFIG: &str = "policies:\n  api:\n    limits:\n      - { max: 1000000, per: 1h }\n";

    /// Allocations per decision of `decide`, run [`DECISIONS`] times on this thread after one
    /// warm-up (which creates the key's state). Each future is polled in place, once, with a
    /// waker that does nothing (a memory store answers at the first poll): a runtime's
    /// `block_on` would box a future as large as a Redis call's, and count that box.
    fn per_decision<F: Future<Output = ()>>(mut decide: impl FnMut() -> F) -> f64 {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let _in_runtime = rt.enter();
        let mut once = || {
            let decision = std::pin::pin!(decide());
            let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
            assert!(
                decision.poll(&mut cx).is_ready(),
                "a memory store answers at once"
            );
        };
        once();
        let before = ALLOCATIONS.with(Cell::get);
        for _ in 0..DECISIONS {
            once();
        }
        let after = ALLOCATIONS.with(Cell::get);
        (after - before) as f64 / DECISIONS as f64
    }

    /// One check of `policy` through `limiter`, admitted (a future for [`per_decision`]).
    macro_rules! admitted {
        ($limiter:expr, $policy:expr) => {
            async {
                let decision = $limiter.call($policy, "k", sluice::Op::Check { cost: 1 });
                assert!(decision.await.unwrap().allowed);
            }
        };
    }

    /// The server's limiter (the memory store, `local` as `config` says), and the same policy over
    /// the composition the server had before its store handle dispatched by enum: the store behind
    /// the library's type-erased [`SharedStore`] (which boxes each call's future), and with
    /// `local` the reservation layer over that, erased again.
    fn through_the_server_and_erased(config: &str) -> (f64, f64) {
        let config = Config::parse("sluice.yaml", config).unwrap();
        let store = StoreHandle::Memory(Arc::new(MemoryStore::new()));
        let shared = Shared::new(&config, store, None, ServerClock::new(ManualClock::new(T0)));
        let snapshot = shared.snapshot();
        let limiter = &snapshot.limiter;
        let policy = limiter.policy("api").unwrap().clone();
        let server = per_decision(|| admitted!(limiter, &policy));
        let memory = SharedStore::new(MemoryStore::new());
        let erased = match config.local {
            Some(local) => SharedStore::new(Reserving::new(memory, local)),
            None => memory,
        };
        let erased = Limiter::new(erased)
            .with_clock(ManualClock::new(T0))
            .with_policy(policy.clone());
        let before = per_decision(|| admitted!(erased, &policy));
        (server, before)
    }

    #[test]
    fn a_decision_through_the_store_handle_allocates_no_boxed_future() {
        let (server, erased) = through_the_server_and_erased(CONFIG);
        println!("allocations per decision: server {server}, over SharedStore {erased}");
        assert_eq!(
            server, 0.0,
            "the server's limiter over the memory store allocates"
        );
        assert_eq!(erased, 1.0, "SharedStore boxes each call's future");
    }

    #[test]
    fn with_reservation_a_decision_allocates_no_boxed_future_either() {
        let local = format!("{CONFIG}local:\n  enabled: true\n");
        let (server, erased) = through_the_server_and_erased(&local);
        println!("allocations per decision with local.enabled: server {server}, erased {erased}");
        assert!(
            server + 1.0 <= erased,
            "with reservation the server's limiter allocates {server} times per decision, the \
             type-erased composition {erased}: the handle should save at least the outer box"
        );
    }
}
