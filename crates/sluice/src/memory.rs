//! `MemoryStore`: state in this process, for a single instance, tests, and as the insurance
//! limiter when a shared store is down.
//!
//! Keys are spread over shards, each a `std::sync::Mutex` around a hash table, so unrelated
//! keys rarely contend. A std mutex (not an async one) is right here: it is held only for the
//! pure evaluation of one key, never across an `.await`, and an uncontended std mutex costs a
//! few nanoseconds.
//!
//! Memory stays bounded: every key remembers when its state stops mattering (the end of its
//! last window; a full token bucket), and each shard drops such keys when it has doubled in
//! size since its last sweep or when a second has passed since then, whichever comes first,
//! and gives the table's memory back when it has shrunk to a quarter. [`MemoryStore::sweep`]
//! sweeps every shard at once, for callers that want memory back while no traffic arrives.

use std::collections::HashMap;
use std::future::Future;
use std::hash::BuildHasher;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};

use hashbrown::HashTable;
use sluice_core::evaluate::{self, Op};
use sluice_core::{Decision, Limit, LimitState, Policy};

use crate::store::{Call, Store, StoreError};

/// How often (in the store's time) a shard in use sweeps its expired keys.
const SWEEP_INTERVAL_MS: u64 = 1_000;
/// A shard never sweeps for size below this many keys.
const MIN_SWEEP_LEN: usize = 1_024;

/// An in-process [`Store`]. Cheap to share: wrap it in an `Arc` or hand it to one `Limiter`.
pub struct MemoryStore {
    shards: Box<[Shard]>,
    hasher: foldhash::fast::RandomState,
    /// Who holds leases on which (policy, key): only acquires by a holder touch it (a few per
    /// second per hot key), so one lock is enough.
    holders: Mutex<Holders>,
}

/// A key's states, one per limit of its policy: the first inline in the entry, so a
/// one-limit policy's key is one allocation (its name) besides its slot in the table.
type States = smallvec::SmallVec<[LimitState; 1]>;

/// Per (policy, key): each holder and the instant it stops counting.
type Holders = HashMap<(Box<str>, Box<str>), Vec<(u64, u64)>>;

fn lock_holders(m: &Mutex<Holders>) -> MutexGuard<'_, Holders> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// One shard, on its own cache lines so that two cores locking neighbouring shards do not
/// fight over one line.
#[repr(align(128))]
struct Shard(Mutex<ShardInner>);

struct ShardInner {
    table: HashTable<Entry>,
    /// Sweep when the table reaches this many keys.
    sweep_at_len: usize,
    /// The store time of the last sweep.
    last_sweep_ms: u64,
}

struct Entry {
    /// A handle of the policy whose limits `states` line up with (one allocation per policy,
    /// shared by its keys).
    policy: Policy,
    key: Box<str>,
    states: States,
    /// From this instant every state means the same as none: the entry may be dropped.
    expires_at: u64,
}

impl std::fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryStore")
            .field("shards", &self.shards.len())
            .field("keys", &self.len())
            .finish()
    }
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryStore {
    /// A store with a shard count fitted to this machine (8 per core, at least 64).
    pub fn new() -> Self {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        Self::with_shards((cores * 8).max(64))
    }

    /// A store with `shards` shards (rounded up to a power of two, at least 1).
    pub fn with_shards(shards: usize) -> Self {
        let n = shards.max(1).next_power_of_two();
        let shards = (0..n)
            .map(|_| {
                Shard(Mutex::new(ShardInner {
                    table: HashTable::new(),
                    sweep_at_len: MIN_SWEEP_LEN,
                    last_sweep_ms: 0,
                }))
            })
            .collect();
        Self {
            shards,
            holders: Mutex::new(HashMap::new()),
            hasher: foldhash::fast::RandomState::default(),
        }
    }

    /// The number of keys held (including expired ones not yet swept).
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| lock(s).table.len()).sum()
    }

    /// Whether no key is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Drops every key whose state has expired at `now_ms` and gives unused table memory
    /// back. Returns how many keys were dropped.
    pub fn sweep(&self, now_ms: u64) -> usize {
        lock_holders(&self.holders).retain(|_, hs| {
            hs.retain(|&(_, until)| until > now_ms);
            !hs.is_empty()
        });
        self.shards
            .iter()
            .map(|s| lock(s).sweep(now_ms, &self.hasher))
            .sum()
    }

    /// Counts `holder` on (policy, key) until `now + the policy's shortest window` and returns
    /// how many holders count now (as the Redis store's holders set does).
    fn hold(&self, policy: &Policy, key: &str, holder: u64, now_ms: u64) -> u32 {
        let ttl = policy.shortest_per_ms();
        let mut all = lock_holders(&self.holders);
        let hs = all.entry((policy.name().into(), key.into())).or_default();
        hs.retain(|&(h, until)| until > now_ms && h != holder);
        hs.push((holder, now_ms.saturating_add(ttl)));
        u32::try_from(hs.len()).unwrap_or(u32::MAX)
    }

    /// Every (policy, key) held, expired or not: what an insurance store owes the shared
    /// store ([`crate::Limiter::charge_back`]).
    pub(crate) fn held(&self) -> Vec<(Policy, Box<str>)> {
        let mut held = Vec::new();
        for shard in &self.shards {
            let inner = lock(shard);
            held.extend(
                inner
                    .table
                    .iter()
                    .map(|e| (e.policy.clone(), e.key.clone())),
            );
        }
        held
    }

    fn locate(&self, policy: &Policy, key: &str) -> (u64, &Shard) {
        let hash = hash_of(&self.hasher, policy, key);
        // hashbrown uses the low bits for the slot and the top 7 for tags: take the middle.
        let index = (hash >> 32) as usize & (self.shards.len() - 1);
        (hash, &self.shards[index])
    }

    /// What [`Store::call`] answers, at once: the memory store never waits.
    pub fn decide(&self, policy: &Policy, key: &str, op: Op, now_ms: u64) -> Decision {
        let mut decision = Decision::empty(0, now_ms);
        self.decide_into(policy, key, op, now_ms, &mut decision);
        decision
    }

    /// Runs `op` on the key's state into `decision`: the whole of [`Store::call`], done when
    /// its future is polled.
    pub(crate) fn decide_into(
        &self,
        policy: &Policy,
        key: &str,
        op: Op,
        now: u64,
        decision: &mut Decision,
    ) {
        match op {
            Op::Forget => self.forget(policy, key, now, decision),
            _ if op.is_read_only() => self.read(policy, key, op, now, decision),
            _ => self.update(policy, key, op, now, decision),
        }
        if let Op::Acquire { holder, .. } = op
            && holder != 0
        {
            decision.holders = self.hold(policy, key, holder, now);
        }
    }

    /// Drops the key's states and holders; the decision is that of a key with no state.
    fn forget(&self, policy: &Policy, key: &str, now: u64, decision: &mut Decision) {
        let (hash, shard) = self.locate(policy, key);
        if let Ok(entry) = lock(shard).table.find_entry(hash, |e| e.is(policy, key)) {
            entry.remove();
        }
        lock_holders(&self.holders)
            .remove(&(Box::<str>::from(policy.name()), Box::<str>::from(key)));
        *decision = evaluate::apply(policy, &[], Op::Forget, now).decision;
    }

    /// Runs `op` on the key's states under its shard's lock, writing them in place.
    fn update(&self, policy: &Policy, key: &str, op: Op, now: u64, decision: &mut Decision) {
        let (hash, shard) = self.locate(policy, key);
        let mut inner = lock(shard);
        inner.maybe_sweep(now, &self.hasher);
        match inner.table.find_mut(hash, |e| e.is(policy, key)) {
            Some(entry) => {
                entry.align_to(policy);
                if evaluate::apply_in_place(policy, &mut entry.states, op, now, decision) {
                    entry.expires_at = expiry(policy, &entry.states, now);
                }
            }
            None => {
                // Exactly one state per limit (collecting would round the allocation up to
                // a power of two).
                let mut states = States::from_elem(LimitState::Empty, policy.limits().len());
                if evaluate::apply_in_place(policy, &mut states, op, now, decision) {
                    let entry = Entry {
                        policy: policy.clone(),
                        key: key.into(),
                        expires_at: expiry(policy, &states, now),
                        states,
                    };
                    inner
                        .table
                        .insert_unique(hash, entry, |e| e.hash(&self.hasher));
                }
            }
        }
    }

    /// The decision of a peek, from the key's states under its shard's lock.
    fn read(&self, policy: &Policy, key: &str, op: Op, now: u64, decision: &mut Decision) {
        let (hash, shard) = self.locate(policy, key);
        let mut inner = lock(shard);
        match inner.table.find_mut(hash, |e| e.is(policy, key)) {
            Some(entry) => {
                entry.align_to(policy);
                evaluate::apply_in_place(policy, &mut entry.states, op, now, decision);
            }
            None => {
                evaluate::apply_in_place(policy, &mut [], op, now, decision);
            }
        }
    }
}

/// The future of [`MemoryStore::call`]: it decides when polled, into the very value `poll`
/// returns, so a decision (a few hundred bytes) is not built in one place and moved to
/// another on its way out.
struct Decide<'s, 'c> {
    store: &'s MemoryStore,
    call: Option<Call<'c>>,
}

impl Future for Decide<'_, '_> {
    type Output = Result<Decision, StoreError>;

    #[inline]
    fn poll(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Self::Output> {
        // One value returned on every path, so it is built where the caller wants it.
        let call = self.call.take();
        let mut answer = Poll::Ready(Ok(Decision::empty(0, 0)));
        match (call, &mut answer) {
            (Some(call), Poll::Ready(Ok(decision))) => {
                let Call { policy, key, .. } = call;
                self.store
                    .decide_into(policy, key, call.op, call.now_ms, decision);
            }
            _ => {
                answer = Poll::Ready(Err(StoreError::Backend(
                    "a memory store call was polled after it completed".to_owned(),
                )));
            }
        }
        answer
    }
}

/// Locks a shard. A panic while a shard was locked cannot have left a half-applied update
/// (writes are applied by infallible assignments), so a poisoned lock is taken over.
fn lock(shard: &Shard) -> MutexGuard<'_, ShardInner> {
    shard
        .0
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The hash of (policy, key), from the policy's name hash.
fn hash_of(hasher: &foldhash::fast::RandomState, policy: &Policy, key: &str) -> u64 {
    hasher.hash_one((policy.name_hash(), key))
}

/// From when the key's states mean nothing (`now` if they already do).
///
/// Always inlined into the locked section that calls it: as a call it cost a one-key check
/// 7 % of its time (docs/benchmarks.md, "A decision the caller keeps").
#[inline(always)]
fn expiry(policy: &Policy, states: &[LimitState], now: u64) -> u64 {
    let at = match (policy.limits(), states) {
        ([limit], [state]) => sluice_core::expires_at(limit, state),
        _ => evaluate::expires_at(policy, states),
    };
    at.unwrap_or(now)
}

impl Entry {
    /// Whether this is the entry of `key` under `policy`: by pointer for the handle it was
    /// written with, by name for another (a reload's).
    fn is(&self, policy: &Policy, key: &str) -> bool {
        (self.policy.same_as(policy) || self.policy.name() == policy.name()) && *self.key == *key
    }

    /// Its hash in the shard's table (recomputed when the table grows or shrinks, rather than
    /// kept in every entry).
    fn hash(&self, hasher: &foldhash::fast::RandomState) -> u64 {
        hash_of(hasher, &self.policy, &self.key)
    }

    /// Lines the stored states up with `policy`'s limits. When the policy's limits changed
    /// (a configuration reload), each state follows the limit with the same state tag and
    /// limits that are new start empty.
    #[inline]
    fn align_to(&mut self, policy: &Policy) {
        if !self.policy.same_as(policy) {
            self.realign(policy);
        }
    }

    /// [`Entry::align_to`] for another handle than the one the states were written with.
    #[cold]
    fn realign(&mut self, policy: &Policy) {
        let (old, new) = (self.policy.limits(), policy.limits());
        let same_shape = Arc::ptr_eq(self.policy.limits_arc(), policy.limits_arc())
            || (old.len() == new.len()
                && old
                    .iter()
                    .zip(new)
                    .all(|(a, b)| a.state_tag() == b.state_tag()));
        if !same_shape {
            let old: Vec<(String, LimitState)> = old
                .iter()
                .map(Limit::state_tag)
                .zip(std::mem::take(&mut self.states))
                .collect();
            self.states = new
                .iter()
                .map(|l| {
                    let tag = l.state_tag();
                    old.iter()
                        .find(|(t, _)| *t == tag)
                        .map_or(LimitState::Empty, |(_, s)| s.clone())
                })
                .collect();
        }
        self.policy = policy.clone();
    }
}

impl ShardInner {
    fn maybe_sweep(&mut self, now: u64, hasher: &foldhash::fast::RandomState) {
        if self.table.len() >= self.sweep_at_len
            || now >= self.last_sweep_ms.saturating_add(SWEEP_INTERVAL_MS)
        {
            self.sweep(now, hasher);
        }
    }

    fn sweep(&mut self, now: u64, hasher: &foldhash::fast::RandomState) -> usize {
        let before = self.table.len();
        self.table.retain(|e| e.expires_at > now);
        let len = self.table.len();
        if self.table.capacity() > 4 * len.max(16) {
            self.table.shrink_to_fit(|e| e.hash(hasher));
        }
        self.sweep_at_len = (2 * len).max(MIN_SWEEP_LEN);
        self.last_sweep_ms = now;
        before - len
    }
}

impl Store for MemoryStore {
    fn call(&self, call: Call<'_>) -> impl Future<Output = Result<Decision, StoreError>> + Send {
        Decide {
            store: self,
            call: Some(call),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::StoreExt;
    use sluice_core::LimitSpec;

    const T0: u64 = 1_700_000_000_000;

    fn block<T>(f: impl Future<Output = T>) -> T {
        let mut f = std::pin::pin!(f);
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        match f.as_mut().poll(&mut cx) {
            std::task::Poll::Ready(v) => v,
            std::task::Poll::Pending => panic!("the memory store never waits"),
        }
    }

    fn policy(specs: Vec<LimitSpec>) -> Policy {
        Policy::from_specs("p", specs).expect("valid policy")
    }

    #[test]
    fn keys_and_policies_are_separate() {
        let s = MemoryStore::with_shards(4);
        let p = policy(vec![LimitSpec::fixed_window(1, 1_000)]);
        let q = Policy::from_specs("q", vec![LimitSpec::fixed_window(1, 1_000)]).expect("valid");
        assert!(block(s.check(&p, "a", 1, T0)).is_ok_and(|d| d.allowed));
        assert!(block(s.check(&p, "b", 1, T0)).is_ok_and(|d| d.allowed));
        assert!(block(s.check(&q, "a", 1, T0)).is_ok_and(|d| d.allowed));
        assert!(block(s.check(&p, "a", 1, T0)).is_ok_and(|d| !d.allowed));
        assert_eq!(s.len(), 3);
        assert!(block(s.call(Call::new(&p, "a", Op::Forget, T0))).is_ok());
        assert!(block(s.check(&p, "a", 1, T0)).is_ok_and(|d| d.allowed));
    }

    #[test]
    fn a_shard_sweeps_itself_after_a_second_of_its_time() {
        let s = MemoryStore::with_shards(1);
        let p = policy(vec![LimitSpec::fixed_window(5, 100)]);
        for i in 0..100 {
            assert!(block(s.check(&p, &format!("k{i}"), 1, T0)).is_ok());
        }
        assert_eq!(s.len(), 100);
        // Still inside a second of the last sweep: nothing dropped yet.
        assert!(block(s.check(&p, "other", 1, T0 + 500)).is_ok());
        assert_eq!(s.len(), 101);
        // A second later the next access sweeps the shard; only the new key remains.
        assert!(block(s.check(&p, "last", 1, T0 + 1_000 + SWEEP_INTERVAL_MS)).is_ok());
        assert_eq!(s.len(), 1);
    }

    #[test]
    fn a_growing_shard_sweeps_when_it_doubles() {
        let s = MemoryStore::with_shards(1);
        let p = policy(vec![LimitSpec::fixed_window(5, 10)]);
        // Each key lives 10 ms; time moves 1 ms per key, so at most ~10 are live at once.
        for i in 0..(MIN_SWEEP_LEN as u64 * 4) {
            assert!(block(s.check(&p, &format!("k{i}"), 1, T0 + i)).is_ok());
        }
        assert!(s.len() <= MIN_SWEEP_LEN, "{} keys held", s.len());
    }

    #[test]
    fn a_changed_policy_keeps_state_of_unchanged_limits() {
        let s = MemoryStore::with_shards(1);
        let old = policy(vec![LimitSpec::fixed_window(5, 1_000)]);
        assert!(block(s.check(&old, "k", 3, T0)).is_ok());
        // Same window with a higher max, plus a new limit: the count of 3 carries over.
        let new = policy(vec![
            LimitSpec::fixed_window(100, 60_000),
            LimitSpec::fixed_window(10, 1_000),
        ]);
        let d = block(s.peek(&new, "k", 0, T0 + 1)).expect("memory store");
        assert_eq!(d.limits()[0].remaining, 100);
        assert_eq!(d.limits()[1].remaining, 7);
        // A limit whose shape changed starts afresh.
        let reshaped = policy(vec![LimitSpec::fixed_window(10, 2_000)]);
        let d = block(s.peek(&reshaped, "k", 0, T0 + 2)).expect("memory store");
        assert_eq!(d.limits()[0].remaining, 10);
    }
}
