//! One (policy, key)'s lease, the fetch in flight for it, and its cached refusal: the state
//! [`Reserving`](super::Reserving) keeps per key, and the decisions it serves from them.

use std::sync::{Arc, Mutex, MutexGuard};

use sluice_core::{Decision, LimitStatus};
use tokio::sync::watch;

use crate::store::StoreError;

/// One (policy, key)'s lease.
pub(super) struct Lease {
    /// How many processes held leases on the key at the last fetch (at least 1).
    pub(super) holders: u32,
    /// Units held and not yet handed out.
    pub(super) tokens: u64,
    /// Units taken by the current lease (for the batch's adaptation).
    pub(super) granted: u64,
    /// When the current lease was taken.
    pub(super) started: u64,
    /// The lease serves while `now < expires`.
    pub(super) expires: u64,
    /// Giving unused units back is exact only while `now < refundable_until`.
    pub(super) refundable_until: u64,
    /// The store's decision when the lease was taken (after the grant).
    pub(super) basis: Option<Decision>,
    /// The next fetch's size.
    pub(super) batch: u64,
    /// The fetch in flight, if any.
    pub(super) fetch: Option<InFlight>,
    /// The negative cache.
    pub(super) denied: Option<Denial>,
}

pub(super) struct InFlight {
    /// The most the fetch may grant.
    pub(super) size: u64,
    /// The costs of the fetcher (first) and the waiters, in order.
    pub(super) costs: Vec<u64>,
    pub(super) outcome: watch::Sender<Option<Arc<Fetched>>>,
}

/// What a fetch brought: the store's answer, and how many of the reserved places (in order)
/// it covers.
pub(super) struct Fetched {
    pub(super) result: Result<Decision, StoreError>,
    pub(super) served: usize,
}

pub(super) struct Denial {
    pub(super) cost: u64,
    pub(super) at: u64,
    pub(super) until: u64,
    pub(super) decision: Decision,
}

pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A locally served decision: allowed, each limit reporting the store's remaining at the
/// last fetch plus what this process still holds.
pub(super) fn local_decision(basis: &Decision, cost: u64, held: u64, now: u64) -> Decision {
    let limits = basis.limits().iter().map(|s| LimitStatus {
        admits: true,
        remaining: s.remaining.saturating_add(held).min(s.capacity),
        retry_after_ms: Some(0),
        ..*s
    });
    Decision::new(true, cost, limits, now)
}

/// A cached refusal as of `now`: the same decision, its waits shortened by the time passed.
pub(super) fn cached_denial(d: &Denial, now: u64) -> Decision {
    let passed = now.saturating_sub(d.at);
    let limits = d.decision.limits().iter().map(|s| LimitStatus {
        retry_after_ms: s.retry_after_ms.map(|r| {
            if s.admits {
                r
            } else {
                r.saturating_sub(passed).max(1)
            }
        }),
        ..*s
    });
    Decision::new(false, d.cost, limits, now)
}

/// Caches a refusal that can pass later.
pub(super) fn remember_denial(lease: &mut Lease, d: &Decision, now: u64) {
    if d.allowed {
        lease.denied = None;
    } else if let Some(wait) = d.retry_after_ms().filter(|&w| w > 0) {
        lease.denied = Some(Denial {
            cost: d.cost,
            at: now,
            until: now.saturating_add(wait),
            decision: d.clone(),
        });
    }
}

/// Publishes an abandoned fetch (its caller was dropped) so waiters ask the store themselves.
pub(super) struct FetchGuard<'a> {
    pub(super) lease: &'a Mutex<Lease>,
    pub(super) armed: bool,
}

impl Drop for FetchGuard<'_> {
    fn drop(&mut self) {
        if self.armed {
            let mut lease = lock(self.lease);
            if let Some(f) = lease.fetch.take() {
                let _ = f.outcome.send(Some(Arc::new(Fetched {
                    result: Err(StoreError::Unavailable(
                        "the fetch of a lease was abandoned".to_owned(),
                    )),
                    served: 0,
                })));
            }
        }
    }
}
