//! The four algorithms of docs/algorithms.md as pure functions of `(limit, state, cost, now)`.
//!
//! Each returns the state to store (`Some` only when something must be written: the cost was
//! admitted and is above zero) and the [`Outcome`] this limit reports. All-or-nothing over a
//! policy is assembled from these in [`crate::evaluate`]. Each function has a Lua twin in the
//! Redis store that a differential test holds identical.
//!
//! What every limit reports:
//! - `remaining`: units that could still be admitted now, after this decision; never negative.
//! - `reset_ms`: when the limit is whole again (`remaining` back to its full value). A fixed
//!   window reports its stored end; with nothing counted, `now` (aligned windows: the end of
//!   the current aligned window, which exists whether or not anything was counted).
//! - `retry_after_ms`: 0 when the limit admits; when it refuses, the wait until this cost
//!   would fit, or `None` when it never can (`cost > max`).

use crate::limit::{Algorithm, Limit};
use crate::state::{
    ConcurrencyState, FixedWindowState, HeldLease, LimitState, SlidingWindowState, TokenBucketState,
};

mod concurrency;
mod token_bucket;

use concurrency::concurrency_plan;
pub use concurrency::holds;
pub(crate) use concurrency::plan_release;
pub use token_bucket::token_bucket;
use token_bucket::token_bucket_refund;

/// What one limit says about one cost at one instant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outcome {
    /// Whether this limit alone would admit the cost.
    pub admits: bool,
    /// Units still available after the decision (the cost deducted when it admits).
    pub remaining: u64,
    /// When the limit is whole again, in ms since the epoch.
    pub reset_ms: u64,
    /// 0 when it admits; otherwise the ms until the cost would fit, `None` if it never can.
    pub retry_after_ms: Option<u64>,
}

impl Outcome {
    #[inline]
    fn refused(remaining: u64, reset_ms: u64, retry_after_ms: Option<u64>) -> Self {
        Self {
            admits: false,
            remaining,
            reset_ms,
            retry_after_ms,
        }
    }

    #[inline]
    fn admitted(remaining: u64, reset_ms: u64) -> Self {
        Self {
            admits: true,
            remaining,
            reset_ms,
            retry_after_ms: Some(0),
        }
    }
}

/// What one limit writes when a decision records: worked out by [`plan`] (or
/// [`plan_refund`], `plan_release`) from the stored state, written by [`Record::write`].
/// Small and `Copy`, so a store can decide every limit of a policy before writing any, and
/// then write each state in place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Record {
    /// Nothing changes.
    Nothing,
    /// Store this fixed window.
    FixedWindow(FixedWindowState),
    /// Store this token bucket.
    TokenBucket(TokenBucketState),
    /// Drop the buckets that started before `floor`, then add `cost` to the bucket starting
    /// at `start`.
    SlidingAdd { floor: u64, start: u64, cost: u64 },
    /// Drop the buckets that started before `floor`, then take `cost` from the newest
    /// buckets first, never below zero.
    SlidingTake { floor: u64, cost: u64 },
    /// Drop the leases lapsed at `now` and any lease of the same id, then hold `lease`.
    Hold { now: u64, lease: HeldLease },
    /// Drop the leases lapsed at `now` and the lease `id`.
    Release { now: u64, id: u64 },
    /// Drop the state.
    Clear,
}

impl Record {
    /// Whether it changes the state.
    #[inline]
    pub(crate) fn writes(&self) -> bool {
        !matches!(self, Record::Nothing)
    }

    /// Writes it into `state`, in place. A state of another algorithm's shape is replaced.
    #[inline]
    pub(crate) fn write(self, state: &mut LimitState) {
        match self {
            Record::Nothing => {}
            Record::Clear => *state = LimitState::Empty,
            Record::FixedWindow(s) => *state = LimitState::FixedWindow(s),
            Record::TokenBucket(s) => *state = LimitState::TokenBucket(s),
            Record::SlidingAdd { floor, start, cost } => {
                with_buckets(state, floor, |buckets| {
                    match buckets.binary_search_by_key(&start, |&(s, _)| s) {
                        Ok(i) => buckets[i].1 += cost,
                        Err(i) => buckets.insert(i, (start, cost)),
                    }
                });
            }
            Record::SlidingTake { floor, cost } => with_buckets(state, floor, |buckets| {
                let mut left = cost;
                while left > 0 {
                    let Some(last) = buckets.last_mut() else {
                        break;
                    };
                    let take = left.min(last.1);
                    last.1 -= take;
                    left -= take;
                    if last.1 == 0 {
                        buckets.pop();
                    }
                }
            }),
            Record::Hold { now, lease } => {
                with_live_leases(state, now, lease.id, |leases| leases.push(lease));
            }
            Record::Release { now, id } => with_live_leases(state, now, id, |_| {}),
        }
    }

    /// The state after writing it into a copy of `state`, or `None` when nothing changes.
    pub(crate) fn written(self, state: &LimitState) -> Option<LimitState> {
        self.writes().then(|| {
            let mut next = state.clone();
            self.write(&mut next);
            next
        })
    }
}

/// Runs `f` on the buckets of a sliding window's state (made one if it is not), those that
/// started before `floor` dropped first.
fn with_buckets(state: &mut LimitState, floor: u64, f: impl FnOnce(&mut Vec<(u64, u64)>)) {
    match state {
        LimitState::SlidingWindow(s) => {
            let first = s.buckets.partition_point(|&(start, _)| start < floor);
            s.buckets.drain(..first);
            f(&mut s.buckets);
        }
        other => {
            // A new window holds one bucket: no more room than that until it needs it (a
            // store keeps one per key).
            let mut s = SlidingWindowState {
                buckets: Vec::with_capacity(1),
            };
            f(&mut s.buckets);
            *other = LimitState::SlidingWindow(s);
        }
    }
}

/// Runs `f` on the leases of a concurrency limit's state (made one if it is not), those
/// lapsed at `now` and the lease `except` dropped first.
fn with_live_leases(
    state: &mut LimitState,
    now: u64,
    except: u64,
    f: impl FnOnce(&mut Vec<HeldLease>),
) {
    match state {
        LimitState::Concurrency(s) => {
            s.leases.retain(|l| l.expires_ms > now && l.id != except);
            f(&mut s.leases);
        }
        other => {
            let mut s = ConcurrencyState::default();
            f(&mut s.leases);
            *other = LimitState::Concurrency(s);
        }
    }
}

/// Decides `cost` for one limit of any algorithm, as [`step_holding`] does, and says what
/// to write rather than building the next state.
#[inline]
pub(crate) fn plan(
    limit: &Limit,
    state: &LimitState,
    cost: u64,
    now: u64,
    lease: Option<u64>,
) -> (Outcome, Record) {
    match limit.algorithm() {
        Algorithm::FixedWindow => {
            let (next, out) = fixed_window(limit, state.fixed_window(), cost, now);
            (out, next.map_or(Record::Nothing, Record::FixedWindow))
        }
        Algorithm::SlidingWindow => sliding_window_plan(limit, state.sliding_window(), cost, now),
        Algorithm::TokenBucket => {
            let (next, out) = token_bucket(limit, state.token_bucket(), cost, now);
            (out, next.map_or(Record::Nothing, Record::TokenBucket))
        }
        Algorithm::Concurrency => {
            let (out, held) = concurrency_plan(limit, state.concurrency(), cost, now, lease);
            let record = held.map_or(Record::Nothing, |lease| Record::Hold { now, lease });
            (out, record)
        }
    }
}

/// What giving `cost` back to one limit's current window (never below zero used) writes.
pub(crate) fn plan_refund(limit: &Limit, state: &LimitState, cost: u64, now: u64) -> Record {
    if cost == 0 {
        return Record::Nothing;
    }
    let record = match (limit.algorithm(), state) {
        (Algorithm::FixedWindow, LimitState::FixedWindow(s)) => {
            fixed_window_refund(s, cost, now).map(Record::FixedWindow)
        }
        (Algorithm::SlidingWindow, LimitState::SlidingWindow(s)) => {
            sliding_window_refund(limit, s, cost, now)
        }
        (Algorithm::TokenBucket, LimitState::TokenBucket(s)) => {
            token_bucket_refund(limit, s, cost, now).map(Record::TokenBucket)
        }
        _ => None,
    };
    record.unwrap_or(Record::Nothing)
}

/// The first instant at which `state` means the same as no state at all: a store may delete
/// it then. `None` for an empty state.
#[inline]
pub fn expires_at(limit: &Limit, state: &LimitState) -> Option<u64> {
    match state {
        LimitState::Empty => None,
        LimitState::FixedWindow(s) => Some(s.reset_ms),
        LimitState::SlidingWindow(s) => s
            .buckets
            .last()
            .map(|&(start, _)| start.saturating_add(limit.per_ms())),
        LimitState::TokenBucket(s) => Some(s.tat_ms + u64::from(s.tat_frac > 0)),
        LimitState::Concurrency(s) => s.leases.iter().map(|l| l.expires_ms).max(),
    }
}

// ----- fixed window -------------------------------------------------------------------------

/// The end of the window that a request admitted at `now` opens.
pub fn fixed_window_end(limit: &Limit, now: u64) -> u64 {
    if limit.align() {
        (now / limit.per_ms()) * limit.per_ms() + limit.per_ms()
    } else {
        now + limit.per_ms()
    }
}

/// `fixed_window`: a window opens at the first admitted request and lasts `per`; its end is
/// stored then and read back. The window is closed once `now >= reset`, whatever the store
/// still holds.
#[inline]
pub fn fixed_window(
    limit: &Limit,
    state: Option<&FixedWindowState>,
    cost: u64,
    now: u64,
) -> (Option<FixedWindowState>, Outcome) {
    let max = limit.max();
    let open = state.filter(|s| now < s.reset_ms);
    let used = open.map_or(0, |s| s.used);
    let remaining = max.saturating_sub(used);
    let idle_reset = if limit.align() {
        fixed_window_end(limit, now)
    } else {
        now
    };
    let reset = open.map_or(idle_reset, |s| s.reset_ms);
    if cost > max {
        return (None, Outcome::refused(remaining, reset, None));
    }
    if cost > remaining {
        // `used > 0`, so the window is open and `reset > now`.
        return (None, Outcome::refused(remaining, reset, Some(reset - now)));
    }
    if cost == 0 {
        return (None, Outcome::admitted(remaining, reset));
    }
    let next = match open {
        Some(s) => FixedWindowState {
            reset_ms: s.reset_ms,
            used: s.used + cost,
        },
        None => FixedWindowState {
            reset_ms: fixed_window_end(limit, now),
            used: cost,
        },
    };
    (
        Some(next),
        Outcome::admitted(remaining - cost, next.reset_ms),
    )
}

fn fixed_window_refund(s: &FixedWindowState, cost: u64, now: u64) -> Option<FixedWindowState> {
    (now < s.reset_ms && s.used > 0).then(|| FixedWindowState {
        reset_ms: s.reset_ms,
        used: s.used.saturating_sub(cost),
    })
}

// ----- sliding window -----------------------------------------------------------------------

/// The start of the oldest bucket still inside the window at `now`. Buckets starting at or
/// after it are counted: their start lies in `(now - per, now]`. Buckets "from the future"
/// (written by a process whose clock runs ahead) are counted too: over-counting is the safe
/// side.
pub fn sliding_window_floor(limit: &Limit, now: u64) -> u64 {
    let p = limit.precision_ms();
    let current = now - now % p;
    (current + p).saturating_sub(limit.per_ms())
}

/// `sliding_window`: `per` split into buckets of `precision`; `used` is the sum of the counted
/// buckets. `reset` is when the oldest counted bucket leaves the window; a refused cost's
/// `retry_after` is when enough buckets have left for it to fit.
fn sliding_window_plan(
    limit: &Limit,
    state: Option<&SlidingWindowState>,
    cost: u64,
    now: u64,
) -> (Outcome, Record) {
    let max = limit.max();
    let per = limit.per_ms();
    let floor = sliding_window_floor(limit, now);
    let counted: &[(u64, u64)] = state.map_or(&[], |s| {
        let first = s.buckets.partition_point(|&(start, _)| start < floor);
        &s.buckets[first..]
    });
    let used = counted
        .iter()
        .fold(0u64, |acc, &(_, n)| acc.saturating_add(n));
    let remaining = max.saturating_sub(used);
    let reset = counted.first().map_or(now, |&(start, _)| start + per);
    if cost > max {
        return (Outcome::refused(remaining, reset, None), Record::Nothing);
    }
    if cost > remaining {
        // Walk the buckets oldest first until enough has left the window for the cost to fit.
        let mut left = used;
        let mut wait = None;
        for &(start, n) in counted {
            left -= n;
            if cost <= max.saturating_sub(left) {
                wait = Some(start + per - now);
                break;
            }
        }
        return (Outcome::refused(remaining, reset, wait), Record::Nothing);
    }
    if cost == 0 {
        return (Outcome::admitted(remaining, reset), Record::Nothing);
    }
    let start = now - now % limit.precision_ms();
    // The oldest counted bucket, or the new one if there is none before it.
    let oldest = counted.first().map_or(start, |&(s, _)| s.min(start));
    (
        Outcome::admitted(remaining - cost, oldest + per),
        Record::SlidingAdd { floor, start, cost },
    )
}

/// Gives `cost` back, taking it from the newest counted buckets first (a refund undoes recent
/// work), never below zero. Buckets that left the window are dropped.
fn sliding_window_refund(
    limit: &Limit,
    s: &SlidingWindowState,
    cost: u64,
    now: u64,
) -> Option<Record> {
    let floor = sliding_window_floor(limit, now);
    let first = s.buckets.partition_point(|&(start, _)| start < floor);
    (first < s.buckets.len()).then_some(Record::SlidingTake { floor, cost })
}
