//! The `Limiter`: policies, a clock and a store behind one small API.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use sluice_core::evaluate::Op;
use sluice_core::{
    Algorithm, Clock, Decision, Degraded, FailureMode, MAX_AMOUNT, Policy, SystemClock,
};

use crate::memory::MemoryStore;
use crate::store::{Store, StoreError, StoreErrorKind};

/// The longest key, in bytes (docs/algorithms.md#words).
pub const MAX_KEY_LEN: usize = 512;

/// Why a limiter call failed. Being limited is not an error: it is a denied [`Decision`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// No policy of that name is configured.
    #[error("unknown policy `{0}`")]
    UnknownPolicy(String),
    /// The key is empty or longer than 512 bytes.
    #[error("key must be 1 to {MAX_KEY_LEN} bytes of UTF-8, got {0} bytes")]
    InvalidKey(usize),
    /// The cost is above 2^53.
    #[error("cost {0} is too large; at most 2^53 (9007199254740992)")]
    InvalidCost(u64),
    /// A lease was asked of a policy that has no concurrency limit.
    #[error(
        "policy `{0}` has no concurrency limit; leases are taken and released only under a \
         policy with one (algorithm: concurrency)"
    )]
    NotConcurrent(String),
    /// The store could not answer: always for errors no retry or failover can fix (corrupt
    /// state, a request the store refuses as such), and for transient ones (the store cannot
    /// answer now: [`StoreError::is_transient`]) when the policy fails closed. A server
    /// answers 503.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Decides "may this key spend this cost now?" for a set of named policies.
///
/// When the store cannot answer (a transient [`StoreError`]), each policy's
/// [`FailureMode`] decides: `open` allows (the decision is marked degraded), `closed`
/// returns [`Error::Store`], `local` decides with the limiter's insurance store, a
/// [`MemoryStore`] in this process (shared by clones; see [`Limiter::with_insurance`]).
///
/// ```
/// use sluice::{Limiter, MemoryStore, LimitSpec, Policy};
///
/// # tokio_test_block_on(async {
/// let api = Policy::from_specs("api", vec![LimitSpec::fixed_window(2, 1_000)])?;
/// let limiter = Limiter::new(MemoryStore::new()).with_policy(api);
/// assert!(limiter.check("api", "user:42", 1).await?.allowed);
/// assert!(limiter.check("api", "user:42", 1).await?.allowed);
/// let denied = limiter.check("api", "user:42", 1).await?;
/// assert!(!denied.allowed);
/// assert!(denied.retry_after_ms().is_some_and(|ms| ms <= 1_000));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # })?;
/// # fn tokio_test_block_on<F: std::future::Future>(f: F) -> F::Output {
/// #     let mut f = std::pin::pin!(f);
/// #     let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
/// #     match f.as_mut().poll(&mut cx) { std::task::Poll::Ready(v) => v, _ => unreachable!() }
/// # }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
pub struct Limiter<S, C = SystemClock> {
    store: S,
    clock: C,
    policies: Arc<HashMap<Arc<str>, Policy, foldhash::fast::RandomState>>,
    insurance: Arc<MemoryStore>,
    reported: Reported,
}

impl<S: Store> Limiter<S, SystemClock> {
    /// A limiter over `store` with the system clock and no policies yet.
    pub fn new(store: S) -> Self {
        Self {
            store,
            clock: SystemClock,
            policies: Arc::default(),
            insurance: Arc::default(),
            reported: Reported::default(),
        }
    }
}

impl<S: Store, C: Clock> Limiter<S, C> {
    /// The same limiter reading time from `clock` (a `ManualClock` in tests).
    pub fn with_clock<C2: Clock>(self, clock: C2) -> Limiter<S, C2> {
        Limiter {
            store: self.store,
            clock,
            policies: self.policies,
            insurance: self.insurance,
            reported: self.reported,
        }
    }

    /// The same limiter deciding `on_store_error: local` policies with `insurance` while the
    /// store cannot answer. Share one insurance store between the limiters of one process
    /// (a server rebuilding its limiter on a reload keeps the counts); call
    /// [`MemoryStore::sweep`] on it now and then.
    pub fn with_insurance(mut self, insurance: Arc<MemoryStore>) -> Self {
        self.insurance = insurance;
        self
    }

    /// The in-process store that decides `local` policies while the store is down.
    pub fn insurance(&self) -> &Arc<MemoryStore> {
        &self.insurance
    }

    /// Adds (or replaces) a policy.
    pub fn with_policy(mut self, policy: Policy) -> Self {
        Arc::make_mut(&mut self.policies).insert(policy.name_arc().clone(), policy);
        self
    }

    /// Adds (or replaces) several policies.
    pub fn with_policies(mut self, policies: impl IntoIterator<Item = Policy>) -> Self {
        let map = Arc::make_mut(&mut self.policies);
        for p in policies {
            map.insert(p.name_arc().clone(), p);
        }
        self
    }

    /// The policy named `name`.
    pub fn policy(&self, name: &str) -> Option<&Policy> {
        self.policies.get(name)
    }

    /// Every policy, in no particular order.
    pub fn policies(&self) -> impl Iterator<Item = &Policy> {
        self.policies.values()
    }

    /// The store.
    pub fn store(&self) -> &S {
        &self.store
    }

    /// The clock.
    pub fn clock(&self) -> &C {
        &self.clock
    }

    /// Checks `cost` units for `key` under policy `policy`, recording them if every limit
    /// admits (docs/algorithms.md#all-or-nothing). `cost = 0` records nothing and reports
    /// the state.
    pub async fn check(&self, policy: &str, key: &str, cost: u64) -> Result<Decision, Error> {
        self.check_policy(self.lookup(policy)?, key, cost).await
    }

    /// [`Limiter::check`] with a policy the caller holds (one not registered by name).
    pub async fn check_policy(
        &self,
        policy: &Policy,
        key: &str,
        cost: u64,
    ) -> Result<Decision, Error> {
        self.call(policy, key, Op::Check { cost }).await
    }

    /// The decision a check of `cost` would get now; records nothing.
    pub async fn peek(&self, policy: &str, key: &str, cost: u64) -> Result<Decision, Error> {
        self.peek_policy(self.lookup(policy)?, key, cost).await
    }

    /// [`Limiter::peek`] with a policy the caller holds.
    pub async fn peek_policy(
        &self,
        policy: &Policy,
        key: &str,
        cost: u64,
    ) -> Result<Decision, Error> {
        self.call(policy, key, Op::Peek { cost }).await
    }

    /// Gives `cost` back to the key's current windows, never below zero used.
    pub async fn refund(&self, policy: &str, key: &str, cost: u64) -> Result<Decision, Error> {
        self.refund_policy(self.lookup(policy)?, key, cost).await
    }

    /// [`Limiter::refund`] with a policy the caller holds.
    pub async fn refund_policy(
        &self,
        policy: &Policy,
        key: &str,
        cost: u64,
    ) -> Result<Decision, Error> {
        self.call(policy, key, Op::Refund { cost }).await
    }

    /// Takes a lease of `cost` units for `key` in the policy's concurrency limit, recording
    /// `cost` in its other limits too, all or nothing (docs/algorithms.md#concurrency). The
    /// lease is `Some` when the decision allows it; release it with [`Limiter::release`] when
    /// the work is done, or it lapses after the limit's `per`. `cost = 0` takes nothing.
    pub async fn acquire(
        &self,
        policy: &str,
        key: &str,
        cost: u64,
    ) -> Result<(Decision, Option<Lease>), Error> {
        self.acquire_policy(self.lookup(policy)?, key, cost).await
    }

    /// [`Limiter::acquire`] with a policy the caller holds.
    pub async fn acquire_policy(
        &self,
        policy: &Policy,
        key: &str,
        cost: u64,
    ) -> Result<(Decision, Option<Lease>), Error> {
        let id = loop {
            // 0 is kept for "no lease" by callers that store ids as numbers.
            let id = rand::random::<u64>();
            if id != 0 {
                break id;
            }
        };
        self.hold(policy, key, id, cost).await
    }

    /// Renews the lease `id` (from [`Limiter::acquire`]) for `cost` units: while it is
    /// still held, it gets a fresh expiry (the limit's `per` from now) and the new cost if the
    /// concurrency limit admits it, and the policy's other limits are not charged again (they
    /// counted the request when the lease was taken). A lease that has lapsed or was released
    /// is taken anew under the same id, like an acquire. Retrying a lost acquire with its id
    /// is therefore safe too: it never holds or counts twice.
    pub async fn renew(
        &self,
        policy: &str,
        key: &str,
        id: u64,
        cost: u64,
    ) -> Result<(Decision, Option<Lease>), Error> {
        self.renew_policy(self.lookup(policy)?, key, id, cost).await
    }

    /// [`Limiter::renew`] with a policy the caller holds.
    pub async fn renew_policy(
        &self,
        policy: &Policy,
        key: &str,
        id: u64,
        cost: u64,
    ) -> Result<(Decision, Option<Lease>), Error> {
        self.hold(policy, key, id, cost).await
    }

    async fn hold(
        &self,
        policy: &Policy,
        key: &str,
        id: u64,
        cost: u64,
    ) -> Result<(Decision, Option<Lease>), Error> {
        let ttl_ms = lease_ttl(policy)?;
        let decision = self.call(policy, key, Op::Hold { cost, lease: id }).await?;
        let lease = (decision.allowed && cost > 0).then(|| Lease {
            id,
            cost,
            expires_ms: decision.now_ms.saturating_add(ttl_ms),
        });
        Ok((decision, lease))
    }

    /// Frees the lease `id` of `key` under the policy. The decision's `cost` is the units it
    /// held: 0 when it was not held (released already, lapsed, or never taken). Other limits
    /// are left as they are: a release is not a refund.
    pub async fn release(&self, policy: &str, key: &str, id: u64) -> Result<Decision, Error> {
        self.release_policy(self.lookup(policy)?, key, id).await
    }

    /// [`Limiter::release`] with a policy the caller holds.
    pub async fn release_policy(
        &self,
        policy: &Policy,
        key: &str,
        id: u64,
    ) -> Result<Decision, Error> {
        lease_ttl(policy)?;
        self.call(policy, key, Op::Release { lease: id }).await
    }

    /// Forgets the key's state under the policy.
    pub async fn forget(&self, policy: &str, key: &str) -> Result<(), Error> {
        let policy = self.lookup(policy)?;
        validate(key, 0)?;
        Ok(self.store.forget(policy, key).await?)
    }

    /// Validates the request and runs `op` on the store now, applying the policy's failure
    /// mode if the store cannot answer.
    async fn call(&self, policy: &Policy, key: &str, op: Op) -> Result<Decision, Error> {
        validate(key, op.cost())?;
        let now = self.clock.now_ms();
        match self.store.call(policy, key, op, now).await {
            Ok(d) => Ok(d),
            Err(e) => self.failed(policy, key, op, now, e).await,
        }
    }

    /// Applies the policy's failure mode to a store error.
    async fn failed(
        &self,
        policy: &Policy,
        key: &str,
        op: Op,
        now: u64,
        error: StoreError,
    ) -> Result<Decision, Error> {
        if !error.is_transient() {
            self.reported.first(policy, &error);
            return Err(Error::Store(error));
        }
        match policy.failure_mode() {
            FailureMode::Open => Ok(Decision::fail_open(policy, op.cost(), now)),
            FailureMode::Local => {
                let decided = self.insurance.call(policy, key, op, now).await;
                Ok(decided?.degraded(Degraded::Local))
            }
            // Closed, and any mode added later: refuse to decide.
            _ => Err(Error::Store(error)),
        }
    }

    fn lookup(&self, name: &str) -> Result<&Policy, Error> {
        self.policies
            .get(name)
            .ok_or_else(|| Error::UnknownPolicy(name.to_owned()))
    }
}

/// The (policy, kind) pairs of errors no retry can fix that were logged already: each is
/// logged once (at ERROR, target `sluice::limiter`), not once per request;
/// `sluice_store_errors_total{kind}` counts every occurrence. Shared by a limiter's clones.
#[derive(Debug, Clone, Default)]
struct Reported(Arc<Mutex<HashSet<PolicyKind>>>);

/// A policy's name and an error kind.
type PolicyKind = (Arc<str>, StoreErrorKind);

/// Pairs remembered at most; past this many (only policies built per request get there)
/// every further one is logged.
const MAX_REPORTED: usize = 4_096;

impl Reported {
    /// Logs `error` of `policy` if it is the first of its kind for the policy.
    fn first(&self, policy: &Policy, error: &StoreError) {
        let kind = error.kind();
        let new = {
            let mut seen = self.0.lock().unwrap_or_else(|p| p.into_inner());
            let pair = (policy.name_arc().clone(), kind);
            if seen.contains(&pair) {
                false
            } else {
                if seen.len() < MAX_REPORTED {
                    seen.insert(pair);
                }
                true
            }
        };
        if new {
            tracing::error!(
                target: "sluice::limiter",
                policy = policy.name(),
                kind = kind.as_str(),
                error = %error,
                "the store refused a decision, and retrying will not change that: the caller \
                 gets the error whatever the policy's on_store_error (logged once per policy \
                 and kind; sluice_store_errors_total counts each)"
            );
        }
    }
}

/// A lease of a concurrency limit, taken by [`Limiter::acquire`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lease {
    /// The lease's id, to pass to [`Limiter::release`].
    pub id: u64,
    /// The units it holds.
    pub cost: u64,
    /// When it lapses unless released, in ms since the epoch (by the store's clock).
    pub expires_ms: u64,
}

/// The TTL of the policy's concurrency limit.
fn lease_ttl(policy: &Policy) -> Result<u64, Error> {
    policy
        .limits()
        .iter()
        .find(|l| l.algorithm() == Algorithm::Concurrency)
        .map(|l| l.per_ms())
        .ok_or_else(|| Error::NotConcurrent(policy.name().to_owned()))
}

fn validate(key: &str, cost: u64) -> Result<(), Error> {
    if key.is_empty() || key.len() > MAX_KEY_LEN {
        return Err(Error::InvalidKey(key.len()));
    }
    if cost > MAX_AMOUNT {
        return Err(Error::InvalidCost(cost));
    }
    Ok(())
}
