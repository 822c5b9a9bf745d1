//! The concurrency limit: leases held until released or expired.

use super::{Outcome, Record};
use crate::limit::Limit;
use crate::state::{ConcurrencyState, HeldLease, LimitState};

/// The leases of `state` still held at `now` (expiry after `now`), leaving out `except`.
fn live_leases(
    state: Option<&ConcurrencyState>,
    now: u64,
    except: Option<u64>,
) -> impl Iterator<Item = &HeldLease> {
    state
        .into_iter()
        .flat_map(|s| s.leases.iter())
        .filter(move |l| l.expires_ms > now && Some(l.id) != except)
}

/// `concurrency`: the units held by live leases are `used`; `remaining` is `max - used`;
/// `reset` is when the last live lease lapses (`now` when none is held). A refused cost's
/// `retry_after` is when enough leases lapse for it to fit, if none is released before.
///
/// With `lease`, an admitted cost above zero is held under that id until `now + per`; a lease
/// of the same id already held is replaced (taken again: renewed, with the new cost), so its
/// own units do not count against it. Without `lease` (a check, a peek) the limit only says
/// whether `cost` could start now and records nothing, so its `remaining` is unchanged.
///
/// Returns the outcome, and the lease to hold when one is taken.
pub(super) fn concurrency_plan(
    limit: &Limit,
    state: Option<&ConcurrencyState>,
    cost: u64,
    now: u64,
    lease: Option<u64>,
) -> (Outcome, Option<HeldLease>) {
    let max = limit.max();
    let lease = lease.filter(|_| cost > 0);
    let used = live_leases(state, now, lease).fold(0u64, |a, l| a.saturating_add(l.cost));
    let remaining = max.saturating_sub(used);
    let reset = live_leases(state, now, lease)
        .map(|l| l.expires_ms)
        .max()
        .unwrap_or(now);
    if cost > max {
        return (Outcome::refused(remaining, reset, None), None);
    }
    if cost > remaining {
        // Leases lapse in order of expiry; the first instant at which what is left admits.
        let mut expiries: Vec<(u64, u64)> = live_leases(state, now, lease)
            .map(|l| (l.expires_ms, l.cost))
            .collect();
        expiries.sort_unstable();
        let mut left = used;
        for (expires_ms, c) in expiries {
            left = left.saturating_sub(c);
            if left.saturating_add(cost) <= max {
                return (
                    Outcome::refused(remaining, reset, Some(expires_ms - now)),
                    None,
                );
            }
        }
        return (Outcome::refused(remaining, reset, None), None); // unreachable: cost <= max
    }
    let Some(id) = lease else {
        return (Outcome::admitted(remaining, reset), None);
    };
    let expires_ms = now + limit.per_ms();
    (
        Outcome::admitted(remaining - cost, reset.max(expires_ms)),
        Some(HeldLease {
            id,
            expires_ms,
            cost,
        }),
    )
}

/// Whether `state` (a concurrency limit's) holds the lease `id` at `now`.
pub fn holds(state: &LimitState, id: u64, now: u64) -> bool {
    matches!(state, LimitState::Concurrency(s) if live_leases(Some(s), now, None).any(|l| l.id == id))
}

/// What freeing the lease `id` of a concurrency limit writes (nothing when the lease is not
/// held: unknown, already released or lapsed), and the units it held.
pub(crate) fn plan_release(state: &LimitState, id: u64, now: u64) -> (Record, u64) {
    let LimitState::Concurrency(s) = state else {
        return (Record::Nothing, 0);
    };
    match live_leases(Some(s), now, None).find(|l| l.id == id) {
        Some(l) => (Record::Release { now, id }, l.cost),
        None => (Record::Nothing, 0),
    }
}
