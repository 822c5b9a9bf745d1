//! Local token reservation (Rockset's batching) and a negative cache: a [`Store`] over any
//! store that serves most decisions of hot keys from memory.
//!
//! Per (policy, key) the process holds a **lease**: units taken from the backing store with
//! one [`Op::Acquire`] call (at least the request's cost, at most the batch, so the last
//! units of a window are still handed out). Leased units are already recorded in the store,
//! so the fleet never admits more than `max`; the price is under-admission: units leased
//! but not used before the lease ends (at most processes × batch per window). See
//! docs/reservation.md for the bound per algorithm.
//!
//! - **Single flight.** When the lease runs dry, one caller fetches. Callers whose cost still
//!   fits in the batch being fetched reserve their place (in order) and wait for it; callers
//!   that would not fit go straight to the store. When the fetch returns, the waiters are
//!   served in order from what it granted: a waiter whose place was granted is never refused
//!   (the bug at the end of Rockset's post), and one whose place was not granted asks the
//!   store itself. No lock is held across a call to the store, and a fetch whose caller is
//!   dropped releases its waiters.
//! - **Lease lifetime.** A lease serves only while using a unit later is the same as having
//!   used it when it was taken: a fixed window until its reset, a sliding window until the
//!   end of the current precision bucket, a token bucket at most [`ReserveConfig::max_lease`]
//!   (default 1 s, also a cap for the others). Units left when a lease ends early are given
//!   back ([`Op::Refund`]) while that is still exact; [`Reserving::release`] gives every
//!   lease back at shutdown.
//! - **Batch.** [`Batch::Fraction`] of the smallest `max` of the policy, or [`Batch::Auto`]:
//!   starts at 1, grows ×1.5 when a lease is used up within half its lifetime, halves when a
//!   lease ends more than half unused, and never exceeds this process's share of the **error
//!   budget**: [`ReserveConfig::max_error`] (default 1 %) of the smallest `max`, divided by
//!   the number of processes holding leases on the key. The store counts them: every
//!   [`Op::Acquire`] carries this process's holder id, and the store answers how many
//!   distinct holders acquired on the key within the policy's shortest window
//!   ([`Decision::holders`]). Requests costing more than the share bypass the lease.
//! - **Headers.** A decision served locally reports, per limit, the store's remaining at the
//!   last fetch plus the units this process still holds: what this process can still hand
//!   out, never above the truth by more than the leased amount.
//! - **Negative cache.** A key the store refused is answered locally as refused (same
//!   decision, `retry_after` counting down) until its `retry_after`, for requests of the same
//!   cost, without touching the store.
//!
//! `peek`, `refund`, `acquire` and `forget` go to the backing store (a peek sees leased units
//! as used). Every key checked gets an entry: call [`Reserving::sweep`] now and then (the
//! server does, every second) to drop the idle ones.

use std::future::Future;
use std::hash::BuildHasher;
use std::ops::ControlFlow;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use hashbrown::HashTable;
use sluice_core::evaluate::Op;
use sluice_core::{Algorithm, Decision, Policy};

use crate::store::{Call, Store, StoreError, StoreExt};

mod check;
mod lease;

use lease::{Lease, lock, remember_denial};

/// How many units a lease takes at once.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub enum Batch {
    /// Adaptive: from 1 up to this process's share of the error budget
    /// ([`ReserveConfig::max_error`] of the policy's smallest `max`, split across the
    /// holders of the key).
    Auto,
    /// A fixed fraction of the policy's smallest `max` (at least 1 unit), e.g. `0.01`.
    Fraction(f64),
}

/// Reservation settings (`local:` in the server's configuration).
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub struct ReserveConfig {
    /// The batch size.
    pub batch: Batch,
    /// The longest a lease serves (token buckets; a cap for the other algorithms too).
    pub max_lease: Duration,
    /// The error budget of [`Batch::Auto`], as a fraction of the policy's smallest `max`: the
    /// most units the fleet's leases may hold at once on one key (units leased and not used
    /// before the window ends are not admitted: under-admission, never over-admission).
    pub max_error: f64,
}

/// The default [`ReserveConfig::max_error`]: 1 % of the smallest `max`.
pub const DEFAULT_MAX_ERROR: f64 = 0.01;

impl Default for ReserveConfig {
    fn default() -> Self {
        Self {
            batch: Batch::Auto,
            max_lease: Duration::from_secs(1),
            max_error: DEFAULT_MAX_ERROR,
        }
    }
}

impl ReserveConfig {
    /// Sets the batch.
    pub fn batch(mut self, batch: Batch) -> Self {
        self.batch = batch;
        self
    }

    /// Sets the longest lease.
    pub fn max_lease(mut self, max_lease: Duration) -> Self {
        self.max_lease = max_lease;
        self
    }

    /// Sets the error budget of [`Batch::Auto`] (a fraction of the smallest `max`, in (0, 1]).
    pub fn max_error(mut self, max_error: f64) -> Self {
        self.max_error = max_error;
        self
    }
}

/// What the layer did, since it was created.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReserveStats {
    /// Checks answered from a lease (no store call).
    pub local: u64,
    /// Checks answered from the negative cache (no store call).
    pub cached_denials: u64,
    /// `acquire` calls made to fill leases.
    pub fetches: u64,
    /// Checks that waited for another caller's fetch and were served by it.
    pub waited: u64,
    /// Checks sent to the store as they are (a cost above the batch, a place not granted,
    /// cost 0).
    pub direct: u64,
    /// Refunds of unused leased units.
    pub refunds: u64,
}

#[derive(Default)]
struct Counters {
    local: AtomicU64,
    cached_denials: AtomicU64,
    fetches: AtomicU64,
    waited: AtomicU64,
    direct: AtomicU64,
    refunds: AtomicU64,
}

/// A [`Store`] that leases units from `S` and serves decisions from them. See the
/// [module docs](self).
pub struct Reserving<S> {
    inner: S,
    config: ReserveConfig,
    /// This process's holder id (random, not 0), sent with every acquire.
    holder: u64,
    hasher: foldhash::fast::RandomState,
    shards: Box<[Mutex<HashTable<Entry>>]>,
    counters: Counters,
}

impl<S: Store> std::fmt::Debug for Reserving<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reserving")
            .field("config", &self.config)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

struct Entry {
    hash: u64,
    policy: Arc<str>,
    fingerprint: u64,
    key: Box<str>,
    lease: Arc<Mutex<Lease>>,
}

/// The smallest `max` over the policy's limits.
fn smallest_max(policy: &Policy) -> u64 {
    policy.limits().iter().map(|l| l.max()).min().unwrap_or(1)
}

impl<S: Store> Reserving<S> {
    /// Leases from `inner` as `config` says.
    pub fn new(inner: S, config: ReserveConfig) -> Self {
        let shards = (0..64).map(|_| Mutex::new(HashTable::new())).collect();
        let hasher = foldhash::fast::RandomState::default();
        Self {
            inner,
            config,
            // Random per instance (the hasher's seed is), never 0 (anonymous).
            holder: hasher.hash_one(std::process::id()) | 1,
            hasher,
            shards,
            counters: Counters::default(),
        }
    }

    /// The backing store.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    /// What the layer did so far.
    pub fn stats(&self) -> ReserveStats {
        let c = &self.counters;
        ReserveStats {
            local: c.local.load(Ordering::Relaxed),
            cached_denials: c.cached_denials.load(Ordering::Relaxed),
            fetches: c.fetches.load(Ordering::Relaxed),
            waited: c.waited.load(Ordering::Relaxed),
            direct: c.direct.load(Ordering::Relaxed),
            refunds: c.refunds.load(Ordering::Relaxed),
        }
    }

    /// This process's holder id, as the store counts it.
    pub fn holder(&self) -> u64 {
        self.holder
    }

    /// The batch limits for `policy` when `holders` processes hold leases on the key:
    /// (first batch, largest batch).
    fn batch_bounds(&self, policy: &Policy, holders: u32) -> (u64, u64) {
        let smallest = smallest_max(policy) as f64;
        match self.config.batch {
            Batch::Auto => {
                let budget = smallest * self.config.max_error;
                (1, ((budget / f64::from(holders.max(1))) as u64).max(1))
            }
            Batch::Fraction(f) => {
                let b = ((smallest * f) as u64).max(1);
                (b, b)
            }
        }
    }

    /// The lease of (policy, key), created empty if missing.
    fn lease(&self, policy: &Policy, key: &str) -> Arc<Mutex<Lease>> {
        let hash = self.hasher.hash_one((policy.name(), key));
        let shard = &self.shards[(hash >> 32) as usize & (self.shards.len() - 1)];
        let mut table = lock(shard);
        let eq = |e: &Entry| {
            e.hash == hash
                && e.fingerprint == policy.fingerprint()
                && *e.policy == *policy.name()
                && *e.key == *key
        };
        if let Some(e) = table.find(hash, eq) {
            return e.lease.clone();
        }
        let (first, _) = self.batch_bounds(policy, 1);
        let lease = Arc::new(Mutex::new(Lease {
            holders: 1,
            tokens: 0,
            granted: 0,
            started: 0,
            expires: 0,
            refundable_until: 0,
            basis: None,
            batch: first,
            fetch: None,
            denied: None,
        }));
        table.insert_unique(
            hash,
            Entry {
                hash,
                policy: policy.name_arc().clone(),
                fingerprint: policy.fingerprint(),
                key: key.into(),
                lease: lease.clone(),
            },
            |e| e.hash,
        );
        lease
    }

    /// Until when a lease taken at `now` with store decision `d` serves, and until when its
    /// unused units may be given back exactly.
    fn lifetime(&self, policy: &Policy, d: &Decision, now: u64) -> (u64, u64) {
        let cap = now
            .saturating_add(u64::try_from(self.config.max_lease.as_millis()).unwrap_or(u64::MAX));
        let mut exact_until = u64::MAX;
        for (limit, status) in policy.limits().iter().zip(d.limits()) {
            let until = match limit.algorithm() {
                // Used any time before the window closes, a unit counts in the same window.
                Algorithm::FixedWindow => status.reset_ms,
                // Within the bucket it was recorded in, a unit counts the same.
                Algorithm::SlidingWindow => {
                    let p = limit.precision_ms();
                    now - now % p + p
                }
                // A bucket's units were available when taken; the lease is bounded by time.
                _ => u64::MAX,
            };
            exact_until = exact_until.min(until);
        }
        (exact_until.min(cap), exact_until)
    }

    /// Ends the lease if it has expired; returns units to give back (if still exact).
    fn expire(&self, lease: &mut Lease, now: u64) -> u64 {
        if now < lease.expires || lease.tokens == 0 {
            if now >= lease.expires {
                lease.basis = None;
            }
            return 0;
        }
        let unused = std::mem::take(&mut lease.tokens);
        if unused * 2 > lease.granted && self.config.batch == Batch::Auto {
            lease.batch = (lease.batch / 2).max(1);
        }
        lease.basis = None;
        if now < lease.refundable_until {
            unused
        } else {
            0
        }
    }

    async fn give_back(&self, policy: &Policy, key: &str, units: u64, now: u64) {
        if units == 0 {
            return;
        }
        self.counters.refunds.fetch_add(1, Ordering::Relaxed);
        if let Err(e) = self
            .inner
            .call(Call::new(policy, key, Op::Refund { cost: units }, now))
            .await
        {
            // Not given back: under-admission until the window ends, never over-admission.
            tracing::debug!(policy = policy.name(), error = %e, units, "could not give leased units back");
        }
    }

    async fn direct(
        &self,
        lease: Option<&Mutex<Lease>>,
        policy: &Policy,
        key: &str,
        cost: u64,
        now: u64,
    ) -> Result<Decision, StoreError> {
        self.counters.direct.fetch_add(1, Ordering::Relaxed);
        let d = self.inner.check(policy, key, cost, now).await?;
        if let Some(lease) = lease {
            remember_denial(&mut lock(lease), &d, now);
        }
        Ok(d)
    }

    /// Gives back every lease's unused units (where still exact) and forgets the leases: for a
    /// graceful shutdown.
    pub async fn release(&self, policies: &[Policy], now: u64) {
        let mut back = Vec::new();
        for shard in self.shards.iter() {
            let mut table = lock(shard);
            for e in table.iter() {
                let mut lease = lock(&e.lease);
                let units = std::mem::take(&mut lease.tokens);
                if units > 0 && now < lease.refundable_until {
                    back.push((e.policy.clone(), e.fingerprint, e.key.clone(), units));
                }
            }
            table.clear();
        }
        for (name, fingerprint, key, units) in back {
            if let Some(p) = policies
                .iter()
                .find(|p| *p.name() == *name && p.fingerprint() == fingerprint)
            {
                self.give_back(p, &key, units, now).await;
            }
        }
    }

    /// Drops leases that hold nothing and whose lease and cached denial are over (bounded
    /// memory). Returns how many were dropped.
    pub fn sweep(&self, now: u64) -> usize {
        let mut dropped = 0;
        for shard in self.shards.iter() {
            let mut table = lock(shard);
            let before = table.len();
            table.retain(|e| {
                let lease = lock(&e.lease);
                lease.tokens > 0 && now < lease.expires
                    || lease.fetch.is_some()
                    || lease.denied.as_ref().is_some_and(|d| now < d.until)
            });
            dropped += before - table.len();
        }
        dropped
    }

    /// Number of (policy, key) leases held.
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| lock(s).len()).sum()
    }

    /// Whether no lease is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A call's future decides at its first poll: a check the lease serves is answered there, in
/// place (a small future, no allocation: the path nearly every check of a leased key takes);
/// anything that must wait on the store goes on in a boxed future (`Reserving::rest`).
impl<S: Store> Store for Reserving<S> {
    fn call(&self, call: Call<'_>) -> impl Future<Output = Result<Decision, StoreError>> + Send {
        LeasedCall {
            steps: Some((
                move || self.local_step(call),
                move |pending| self.rest(call, pending),
            )),
            rest: None,
        }
    }
}

/// The future of [`Reserving`]'s call: `local_step` at the first poll, then, only when it did
/// not answer, the boxed `rest`.
struct LeasedCall<L, R, F> {
    steps: Option<(L, R)>,
    rest: Option<Pin<Box<F>>>,
}

impl<L, R, F> Future for LeasedCall<L, R, F>
where
    L: FnOnce() -> ControlFlow<Decision, check::Pending> + Unpin,
    R: FnOnce(check::Pending) -> F + Unpin,
    F: Future<Output = Result<Decision, StoreError>>,
{
    type Output = Result<Decision, StoreError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        // Every field is `Unpin` (the rest is boxed), so the future may be taken apart.
        let this = Pin::into_inner(self);
        if let Some((local, rest)) = this.steps.take() {
            match local() {
                ControlFlow::Break(decided) => return Poll::Ready(Ok(decided)),
                ControlFlow::Continue(pending) => this.rest = Some(Box::pin(rest(pending))),
            }
        }
        match this.rest.as_mut() {
            Some(rest) => rest.as_mut().poll(cx),
            None => Poll::Ready(Err(StoreError::Backend(
                "a reserving call was polled after it completed".to_owned(),
            ))),
        }
    }
}
