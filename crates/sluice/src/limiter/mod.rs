//! The `Limiter`: policies, a clock and a store behind one small API.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;

use sluice_core::evaluate::Op;
use sluice_core::{Algorithm, Clock, Decision, Degraded, FailureMode, MAX_AMOUNT, Policy};

use crate::clock::SystemClock;

use crate::memory::MemoryStore;
use crate::store::{Call, Store, StoreError};

mod deciding;
mod ledger;

use deciding::Deciding;
use ledger::{Charges, Reported};

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
    charges: Charges,
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
            charges: Charges::default(),
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
            charges: self.charges,
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

    /// Runs `op` for `key` under `policy`: the one decision entry. Every operation is a
    /// value ([`Op`]), as in the [`Store`] beneath: a check records `cost` if every limit
    /// admits (docs/algorithms.md#all-or-nothing; `cost = 0` records nothing and reports the
    /// state), a peek records nothing, a refund gives `cost` back, a hold takes or renews a
    /// lease of the policy's concurrency limit (read it with [`Lease::of`]) and a release
    /// frees one (docs/algorithms.md#concurrency).
    ///
    /// The key and amounts are validated and the clock read when the future is first polled;
    /// a store that cannot answer gets the policy's failure mode.
    pub fn call<'a>(
        &'a self,
        policy: &'a Policy,
        key: &'a str,
        op: Op,
    ) -> impl Future<Output = Result<Decision, Error>> + 'a {
        // The call's own future, not an `async` layer around it: a decision is a few hundred
        // bytes, and each layer would move it once more.
        Deciding::new(self, policy, key, op, move |now| {
            self.store.call(Call::new(policy, key, op, now))
        })
    }

    /// A check of `cost` units for `key` under the policy named `policy`: [`Limiter::call`]
    /// with [`Op::Check`], the policy found by name.
    pub async fn check(&self, policy: &str, key: &str, cost: u64) -> Result<Decision, Error> {
        let policy = self
            .policies
            .get(policy)
            .ok_or_else(|| Error::UnknownPolicy(policy.to_owned()))?;
        self.call(policy, key, Op::Check { cost }).await
    }

    /// Forgets the key's state under the policy.
    pub async fn forget(&self, policy: &Policy, key: &str) -> Result<(), Error> {
        check_key(key)?;
        let now = self.clock.now_ms();
        Ok(self
            .store
            .call(Call::new(policy, key, Op::Forget, now))
            .await
            .map(drop)?)
    }

    /// Charges the shared store with what the insurance store admitted while the store could
    /// not answer (`on_store_error: local`), key by key, and forgets it locally: afterwards
    /// the store counts those admissions, so the window they fall in admits what is left of
    /// `max` and not a whole `max` again. Returns how many keys were charged; stops at the
    /// first key the store cannot answer for now (they stay owed; one it refuses for good is
    /// dropped, and logged). Call it now and then (the server
    /// does every second); a key this limiter decides again is charged right after that
    /// decision anyway.
    ///
    /// A key is charged with one [`Op::Acquire`] of the most any of its policy's limits counts
    /// locally in its current window (a window that ended owes nothing), taken as far as every
    /// limit admits: a store that already counts `max` is not pushed past it. A policy of one
    /// limit is charged exactly; with several, each limit is charged the same amount (the
    /// store's one operation covers the whole policy), so a short window that rolled over
    /// meanwhile may be charged more than it owes (stricter, for that window) and a long one
    /// less when a shorter one is full. Keys whose policy holds a concurrency limit are left
    /// alone (their leases live in the insurance store until released or lapsed). The bound
    /// this gives is in docs/configuration.md, "`on_store_error`".
    pub async fn charge_back(&self) -> Result<usize, StoreError> {
        let now = self.clock.now_ms();
        let mut charged = 0;
        for (policy, key) in self.insurance.held() {
            match self.charge_key(&policy, &key, now).await {
                Ok(true) => charged += 1,
                Ok(false) => {}
                // The store cannot answer now: the others wait for the next call.
                Err(e) if e.is_transient() => return Err(e),
                Err(e) => {
                    tracing::warn!(target: "sluice::limiter", policy = policy.name(), error = %e, "a local admission cannot be charged back; dropped")
                }
            }
        }
        if self.insurance.is_empty() {
            self.charges.paid();
        }
        Ok(charged)
    }

    /// Charges `key`'s local admissions under `policy` to the store (see
    /// [`Limiter::charge_back`]); `false` if there were none.
    async fn charge_key(&self, policy: &Policy, key: &str, now: u64) -> Result<bool, StoreError> {
        if policy.concurrency_limit().is_some() {
            return Ok(false);
        }
        if self.owed_locally(policy, key, now) == 0 {
            return Ok(false);
        }
        // One charge of a key at a time (two would charge the same admissions twice), from
        // what the insurance store counts once it is ours.
        let Some(_charging) = self.charges.lock(policy, key) else {
            return Ok(false);
        };
        let owed = self.owed_locally(policy, key, now);
        if owed == 0 {
            return Ok(false);
        }
        let take = Op::Acquire {
            min: 0,
            max: owed,
            holder: 0,
        };
        let forget = Call::new(policy, key, Op::Forget, now);
        if let Err(e) = self.store.call(Call::new(policy, key, take, now)).await {
            if !e.is_transient() {
                // The store will never take it (corrupt state of the key, …): not owed.
                self.insurance.call(forget).await?;
            }
            return Err(e);
        }
        self.insurance.call(forget).await?;
        Ok(true)
    }

    /// What the insurance store admitted for `key` that its windows still count: the most
    /// any limit counts (a window that ended owes nothing). Read, not taken: while the store
    /// is down a failed charge must leave the insurance store deciding with all of it.
    fn owed_locally(&self, policy: &Policy, key: &str, now: u64) -> u64 {
        let mut owed = 0;
        for (limit, status) in policy.limits().iter().zip(
            self.insurance
                .decide(policy, key, Op::Peek { cost: 0 }, now)
                .limits(),
        ) {
            owed = owed.max(limit.capacity().saturating_sub(status.remaining));
        }
        owed
    }

    /// After a decision the store made of a `local` policy's key: charges what this process
    /// admitted of the key on its own while the store could not answer, before this process's
    /// next decision of the key. A charge that fails is tried again later.
    async fn charge_after(&self, policy: &Policy, key: &str, now: u64) {
        if let Err(e) = self.charge_key(policy, key, now).await {
            tracing::debug!(target: "sluice::limiter", policy = policy.name(), error = %e, "charge-back failed; it is tried again later");
        }
    }

    /// Applies the policy's failure mode to a store error. The insurance store is in memory
    /// and never waits, so this decides at once.
    fn failed(
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
                let decided = self.insurance.decide(policy, key, op, now);
                if decided.allowed && decided.cost > 0 {
                    self.charges.owe();
                }
                Ok(decided.degraded(Degraded::Local))
            }
            // Closed, and any mode added later: refuse to decide.
            _ => Err(Error::Store(error)),
        }
    }
}

/// A lease of a concurrency limit, taken by an [`Op::Hold`] through [`Limiter::call`].
///
/// ```
/// use sluice::{Lease, LimitSpec, Limiter, MemoryStore, Op, Policy};
///
/// # let mut f = std::pin::pin!(async {
/// let jobs = Policy::from_specs("jobs", vec![LimitSpec::concurrency(2, 60_000)])?;
/// let limiter = Limiter::new(MemoryStore::new());
/// let id = Lease::new_id();
/// let d = limiter.call(&jobs, "tenant:7", Op::Hold { cost: 1, lease: id }).await?;
/// let lease = Lease::of(id, &d).expect("admitted");
/// assert_eq!(lease.cost, 1);
/// assert_eq!(limiter.call(&jobs, "tenant:7", Op::Release { lease: id }).await?.cost, 1);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # });
/// # let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
/// # let std::task::Poll::Ready(r) = f.as_mut().poll(&mut cx) else { unreachable!() };
/// # r?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lease {
    /// The lease's id, to release it with ([`Op::Release`]) or renew it ([`Op::Hold`] again).
    pub id: u64,
    /// The units it holds.
    pub cost: u64,
    /// When it lapses unless released, in ms since the epoch (by the store's clock).
    pub expires_ms: u64,
}

impl Lease {
    /// A fresh lease id: random, never 0 (kept for "no lease" by callers that store ids as
    /// numbers).
    pub fn new_id() -> u64 {
        loop {
            let id = rand::random::<u64>();
            if id != 0 {
                return id;
            }
        }
    }

    /// The lease `id` an [`Op::Hold`] decided as `decision` holds: `Some` when it was
    /// admitted for a cost above 0. It lapses the concurrency limit's `per` after the
    /// decision unless released; renewing it (the same id, held again) gives it a fresh
    /// expiry, and so does taking it anew after it lapsed, never holding or counting twice.
    pub fn of(id: u64, decision: &Decision) -> Option<Lease> {
        let ttl_ms = decision
            .limits()
            .iter()
            .find(|s| s.algorithm == Algorithm::Concurrency)?
            .per_ms;
        (decision.allowed && decision.cost > 0).then(|| Lease {
            id,
            cost: decision.cost,
            expires_ms: decision.now_ms.saturating_add(ttl_ms),
        })
    }
}

/// Validates a call: the key, every amount of `op`, and a lease only under a policy with a
/// concurrency limit.
fn validate(policy: &Policy, key: &str, op: Op) -> Result<(), Error> {
    check_key(key)?;
    check_cost(op.cost())?;
    if let Op::Acquire { max, .. } = op {
        check_cost(max)?;
    }
    if matches!(op, Op::Hold { .. } | Op::Release { .. }) && policy.concurrency_limit().is_none() {
        return Err(Error::NotConcurrent(policy.name().to_owned()));
    }
    Ok(())
}
/// The key bound: 1 to [`MAX_KEY_LEN`] bytes. The one definition of it: the limiter, the
/// server's surfaces and the tower layer all ask this, each saying it in its own words.
pub fn check_key(key: &str) -> Result<(), Error> {
    if key.is_empty() || key.len() > MAX_KEY_LEN {
        return Err(Error::InvalidKey(key.len()));
    }
    Ok(())
}

/// The cost bound: at most 2^53 ([`MAX_AMOUNT`]), the largest integer every store (Lua's
/// doubles included) holds exactly. The one definition of it, as [`check_key`] is of the key's.
pub fn check_cost(cost: u64) -> Result<(), Error> {
    if cost > MAX_AMOUNT {
        return Err(Error::InvalidCost(cost));
    }
    Ok(())
}

/// A limiter over the memory store can answer at once: the store never waits, so this skips
/// the future. Through a future, a decision (a few hundred bytes) is moved once per layer, which
/// costs more than the decision itself (docs/benchmarks.md).
impl<C: Clock> Limiter<MemoryStore, C> {
    /// [`Limiter::call`], answered at once into a decision the caller keeps: a loop deciding
    /// many calls reuses one `Decision` (a few hundred bytes) instead of having each answer
    /// built and copied out. On `Ok`, `decision` holds this call's whole decision, nothing of
    /// the one it held before; on `Err` (a bad key or cost) it is left as it was. The store's
    /// failure mode never applies: the memory store always answers.
    ///
    /// ```
    /// use sluice::{Decision, LimitSpec, Limiter, MemoryStore, Op, Policy};
    ///
    /// let api = Policy::from_specs("api", vec![LimitSpec::fixed_window(2, 60_000)])?;
    /// let limiter = Limiter::new(MemoryStore::new());
    /// let mut d = Decision::empty(0, 0);
    /// let check = Op::Check { cost: 1 };
    /// let admitted = (0..3)
    ///     .filter(|_| limiter.call_into(&api, "user:42", check, &mut d).is_ok() && d.allowed)
    ///     .count();
    /// assert_eq!(admitted, 2);
    /// assert_eq!(d.limits()[0].remaining, 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn call_into(
        &self,
        policy: &Policy,
        key: &str,
        op: Op,
        decision: &mut Decision,
    ) -> Result<(), Error> {
        validate(policy, key, op)?;
        let now = self.clock.now_ms();
        self.store.decide_into(policy, key, op, now, decision);
        Ok(())
    }
}
