//! The token bucket as GCRA: one stored time, the theoretical arrival time.

use super::Outcome;
use crate::limit::Limit;
use crate::state::TokenBucketState;

// ----- token bucket (GCRA) ------------------------------------------------------------------
//
// Time is counted in units of 1/max ms, so one token costs exactly `per` units and the bucket's
// capacity `tau` is exactly `burst · per` units. The computation is relative to `now`: `ahead`
// is how far the TAT lies beyond now (0 when the bucket is full), bounded by `tau` plus one
// cost. That is below 2^64 for all but extreme limits, which keeps divisions on the fast 64-bit
// path; u128 holds the rest (burst · per can reach 2^88). The Lua twin has to split such
// values into limbs.

/// `a / b`, on the 64-bit path when both fit.
#[inline]
fn div(a: u128, b: u128) -> u128 {
    match (u64::try_from(a), u64::try_from(b)) {
        (Ok(a), Ok(b)) => u128::from(a / b),
        _ => a / b,
    }
}

/// `ceil(a / b)`, on the 64-bit path when both fit.
#[inline]
fn div_ceil(a: u128, b: u128) -> u128 {
    match (u64::try_from(a), u64::try_from(b)) {
        (Ok(a), Ok(b)) => u128::from(a.div_ceil(b)),
        _ => a.div_ceil(b),
    }
}

/// How far the stored TAT lies beyond `now`, in units of 1/max ms.
#[inline]
fn ahead_of(limit: &Limit, state: Option<&TokenBucketState>, now: u64) -> u128 {
    match state {
        Some(s) if s.tat_ms > now || (s.tat_ms == now && s.tat_frac > 0) => {
            u128::from(s.tat_ms - now) * u128::from(limit.max()) + u128::from(s.tat_frac)
        }
        _ => 0,
    }
}

/// The state whose TAT lies `ahead` units beyond `now`.
#[inline]
fn tat_after(limit: &Limit, now: u64, ahead: u128) -> TokenBucketState {
    let max = u128::from(limit.max());
    let whole = div(ahead, max);
    // whole < 2^53 by the limit's refill bound and frac < max <= 2^53: the casts are lossless.
    TokenBucketState {
        tat_ms: now.saturating_add(u64::try_from(whole).unwrap_or(u64::MAX)),
        tat_frac: u64::try_from(ahead - whole * max).unwrap_or(0),
    }
}

/// `token_bucket` as GCRA: `max` tokens refill evenly over `per` into a bucket of `burst`.
/// `reset` is when the bucket is full again; a refused cost's `retry_after` is when it fits.
/// A cost above `max` never fits (docs/algorithms.md#all-or-nothing), nor one above `burst`.
///
/// Always inlined: a caller then reads the outcome from registers. Returned through the stack,
/// it was written in narrow stores and read back in wide loads, which stall
/// (docs/benchmarks.md, "A decision the caller keeps").
#[inline(always)]
pub fn token_bucket(
    limit: &Limit,
    state: Option<&TokenBucketState>,
    cost: u64,
    now: u64,
) -> (Option<TokenBucketState>, Outcome) {
    let max = u128::from(limit.max());
    let per = u128::from(limit.per_ms());
    let tau = u128::from(limit.burst()) * per;
    let remaining_at =
        |ahead: u128| u64::try_from(div(tau.saturating_sub(ahead), per)).unwrap_or(u64::MAX);
    let reset_at =
        |ahead: u128| now.saturating_add(u64::try_from(div_ceil(ahead, max)).unwrap_or(u64::MAX));
    let ahead = ahead_of(limit, state, now);
    if cost > limit.max() || cost > limit.burst() {
        return (
            None,
            Outcome::refused(remaining_at(ahead), reset_at(ahead), None),
        );
    }
    let new_ahead = ahead + u128::from(cost) * per;
    if new_ahead > tau {
        // It fits after t ms, the first whole t with new_ahead - t·max <= tau.
        let wait = u64::try_from(div_ceil(new_ahead - tau, max)).unwrap_or(u64::MAX);
        return (
            None,
            Outcome::refused(remaining_at(ahead), reset_at(ahead), Some(wait)),
        );
    }
    if cost == 0 {
        return (
            None,
            Outcome::admitted(remaining_at(ahead), reset_at(ahead)),
        );
    }
    let next = tat_after(limit, now, new_ahead);
    // The bucket is full again at the new TAT, rounded up to a whole ms: reset_at(new_ahead)
    // without a second division.
    let reset = next.tat_ms.saturating_add(u64::from(next.tat_frac > 0));
    (
        Some(next),
        Outcome::admitted(remaining_at(new_ahead), reset),
    )
}

pub(super) fn token_bucket_refund(
    limit: &Limit,
    s: &TokenBucketState,
    cost: u64,
    now: u64,
) -> Option<TokenBucketState> {
    let ahead = ahead_of(limit, Some(s), now);
    if ahead == 0 {
        return None;
    }
    let back = u128::from(cost) * u128::from(limit.per_ms());
    Some(tat_after(limit, now, ahead.saturating_sub(back)))
}
