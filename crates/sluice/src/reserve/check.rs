//! A check through the lease (the module docs of `reserve` say how): served locally, by the
//! fetch in flight, or by a fetch of its own.

use std::ops::ControlFlow;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use sluice_core::evaluate::Op;
use sluice_core::{Decision, Policy};
use tokio::sync::watch;

use super::lease::{
    FetchGuard, Fetched, InFlight, Lease, cached_denial, local_decision, lock, remember_denial,
};
use super::{Batch, Reserving};
use crate::store::{Call, Store, StoreError};

/// What a check needs after [`Reserving::local_step`] could not answer it from the lease.
pub(super) enum Pending {
    /// Not a leased check: the inner store's call.
    Inner,
    /// A check the lease cannot stand for (cost 0, or above any share): the store's.
    Direct,
    /// A check on this lease: give back the expired units, then `Next`.
    Leased(Arc<Mutex<Lease>>, Next, u64),
}

impl<S: Store> Reserving<S> {
    /// The synchronous first step of a call: a check answered from the lease or by a cached
    /// denial (`Break`), without awaiting anything; or what the call must do next, in
    /// [`Reserving::rest`].
    pub(super) fn local_step(&self, call: Call<'_>) -> ControlFlow<Decision, Pending> {
        let (policy, key, op, now) = (call.policy, call.key, call.op, call.now_ms);
        // A concurrency limit is consulted at every check (it admits what could start now):
        // no batch can stand for it, so such policies are never leased. Peeks (which see
        // leased units as used), refunds, acquires, holds, releases and forgets go to the
        // store; a forget empties the key's lease first.
        let Op::Check { cost } = op else {
            if op == Op::Forget {
                let lease = self.lease(policy, key);
                let mut l = lock(&lease);
                l.tokens = 0;
                l.basis = None;
                l.denied = None;
            }
            return ControlFlow::Continue(Pending::Inner);
        };
        if policy.concurrency_limit().is_some() {
            return ControlFlow::Continue(Pending::Inner);
        }
        // The largest share any process may get (one holder); below, this key's own share.
        if cost == 0 || cost > self.batch_bounds(policy, 1).1 {
            return ControlFlow::Continue(Pending::Direct);
        }
        let lease = self.lease(policy, key);
        let (next, give_back) = self.next_step(&lease, policy, cost, now)?;
        ControlFlow::Continue(Pending::Leased(lease, next, give_back))
    }

    /// The rest of a call that [`Reserving::local_step`] did not answer (the module docs say
    /// how a check goes on: served by the fetch in flight, or by a fetch of its own).
    pub(super) async fn rest(
        &self,
        call: Call<'_>,
        pending: Pending,
    ) -> Result<Decision, StoreError> {
        let (policy, key, op, now) = (call.policy, call.key, call.op, call.now_ms);
        let cost = op.cost();
        let (lease, next, give_back) = match pending {
            Pending::Inner => return self.inner.call(call).await,
            Pending::Direct => return self.direct(None, policy, key, cost, now).await,
            Pending::Leased(lease, next, give_back) => (lease, next, give_back),
        };
        self.give_back(policy, key, give_back, now).await;
        match next {
            Next::Direct => self.direct(Some(&lease), policy, key, cost, now).await,
            Next::Wait(rx, place) => match self.served_by_fetch(&lease, rx, place, cost, now).await
            {
                Some(answer) => answer,
                None => self.direct(Some(&lease), policy, key, cost, now).await,
            },
            Next::Fetch(size) => self.fetch(&lease, policy, key, cost, size, now).await,
        }
    }

    /// Under the lease's lock: a decision from the lease or a cached denial (`Break`), or what
    /// to do next and the expired units to give back first.
    fn next_step(
        &self,
        lease: &Mutex<Lease>,
        policy: &Policy,
        cost: u64,
        now: u64,
    ) -> ControlFlow<Decision, (Next, u64)> {
        let mut l = lock(lease);
        let give_back = self.expire(&mut l, now);
        let Lease { tokens, basis, .. } = &mut *l;
        if *tokens >= cost
            && let Some(basis) = basis
        {
            *tokens -= cost;
            let d = local_decision(basis, cost, *tokens, now);
            drop(l);
            self.counters.local.fetch_add(1, Ordering::Relaxed);
            return ControlFlow::Break(d);
        }
        if let Some(denied) = &l.denied
            && now < denied.until
            && denied.cost == cost
        {
            let d = cached_denial(denied, now);
            drop(l);
            self.counters.cached_denials.fetch_add(1, Ordering::Relaxed);
            return ControlFlow::Break(d);
        }
        // This process's share of the budget, now that the key's holders are known.
        let largest = self.batch_bounds(policy, l.holders).1;
        let next = match &mut l.fetch {
            _ if cost > largest => Next::Direct,
            Some(f) if f.costs.iter().sum::<u64>() + cost <= f.size => {
                f.costs.push(cost);
                Next::Wait(f.outcome.subscribe(), f.costs.len() - 1)
            }
            Some(_) => Next::Direct,
            None => {
                // The lease ran dry: was it used up quickly? Then take more next time.
                if self.config.batch == Batch::Auto
                    && l.granted > 0
                    && l.tokens == 0
                    && now < l.expires
                    && now.saturating_sub(l.started) * 2 < l.expires - l.started
                {
                    l.batch = (l.batch + l.batch.div_ceil(2)).min(largest);
                }
                l.batch = l.batch.min(largest);
                let size = l.batch.max(cost);
                let (tx, _) = watch::channel(None);
                l.fetch = Some(InFlight {
                    size,
                    costs: vec![cost],
                    outcome: tx,
                });
                Next::Fetch(size)
            }
        };
        ControlFlow::Continue((next, give_back))
    }

    /// Waits for the fetch in flight to end: the answer for `place` if the grant served it,
    /// or `None` when the store must be asked directly.
    async fn served_by_fetch(
        &self,
        lease: &Mutex<Lease>,
        mut rx: watch::Receiver<Option<Arc<Fetched>>>,
        place: usize,
        cost: u64,
        now: u64,
    ) -> Option<Result<Decision, StoreError>> {
        let fetched = match rx.wait_for(Option::is_some).await {
            Ok(v) => v.clone(),
            Err(_) => None,
        };
        match fetched {
            Some(f) if place < f.served => {
                let l = lock(lease);
                let basis = match &f.result {
                    Ok(d) => l.basis.as_ref().unwrap_or(d).clone(),
                    Err(e) => return Some(Err(e.clone())),
                };
                let d = local_decision(&basis, cost, l.tokens, now);
                drop(l);
                self.counters.waited.fetch_add(1, Ordering::Relaxed);
                Some(Ok(d))
            }
            Some(f) => match &f.result {
                Err(e) => Some(Err(e.clone())),
                // The same cost was refused: so is this one, by the same decision.
                Ok(d) if !d.allowed && d.cost == cost => Some(Ok(d.clone())),
                // Not covered by the grant: ask the store.
                Ok(_) => None,
            },
            None => None,
        }
    }

    /// Fetches a lease of `cost` to `size` units for this and the places that wait on it,
    /// then gives back any excess over this process's share.
    async fn fetch(
        &self,
        lease: &Mutex<Lease>,
        policy: &Policy,
        key: &str,
        cost: u64,
        size: u64,
        now: u64,
    ) -> Result<Decision, StoreError> {
        let mut guard = FetchGuard { lease, armed: true };
        self.counters.fetches.fetch_add(1, Ordering::Relaxed);
        let acquire = Op::Acquire {
            min: cost,
            max: size,
            holder: self.holder,
        };
        let result = self.inner.call(Call::new(policy, key, acquire, now)).await;
        guard.armed = false;
        let (reply, excess) = {
            let mut l = lock(lease);
            let Some(f) = l.fetch.take() else {
                // Unreachable: only the fetcher (or its guard) takes the fetch.
                return result;
            };
            let mut served = 0;
            let mut excess = 0;
            let reply = match &result {
                Ok(d) if d.allowed => {
                    let (left, places) = covered(&f.costs, d.cost);
                    served = places;
                    excess = self.take_grant(&mut l, policy, d, left, now);
                    Ok(local_decision(d, cost, left, now))
                }
                Ok(d) => {
                    remember_denial(&mut l, d, now);
                    Ok(d.clone())
                }
                Err(e) => Err(e.clone()),
            };
            let _ = f.outcome.send(Some(Arc::new(Fetched { result, served })));
            (reply, excess)
        };
        self.give_back(policy, key, excess, now).await;
        reply
    }

    /// Fills the lease from a grant of which `left` units are not spent by the places served;
    /// returns the units over this process's share, to give back at once.
    fn take_grant(&self, l: &mut Lease, policy: &Policy, d: &Decision, left: u64, now: u64) -> u64 {
        let (expires, exact) = self.lifetime(policy, d, now);
        l.tokens = left;
        l.granted = d.cost;
        l.started = now;
        l.expires = expires;
        l.refundable_until = exact;
        l.basis = Some(d.clone());
        l.denied = None;
        // A store that does not count holders answers 0: alone, as far as it knows.
        l.holders = d.holders.max(1);
        // More holders than this lease was sized for: keep only this process's share of the
        // budget and give the rest back at once.
        let share = self.batch_bounds(policy, l.holders).1;
        l.batch = l.batch.min(share);
        let excess = l.tokens.saturating_sub(share);
        l.tokens -= excess;
        excess
    }
}

/// What a check does after looking at its lease.
pub(super) enum Next {
    /// Fetch a lease of this size.
    Fetch(u64),
    /// Wait for the fetch in flight, which holds this place.
    Wait(watch::Receiver<Option<Arc<Fetched>>>, usize),
    /// Ask the store directly.
    Direct,
}

/// Serves the places in order while the grant covers them: the units left and the places
/// served.
fn covered(costs: &[u64], granted: u64) -> (u64, usize) {
    let mut left = granted;
    let mut served = 0;
    for &c in costs {
        if c > left {
            break;
        }
        left -= c;
        served += 1;
    }
    (left, served)
}
