//! A whole policy for one key: all-or-nothing over its limits (docs/algorithms.md#all-or-nothing).
//!
//! `states[i]` is the stored state of `policy.limits()[i]`; a missing index means no state.
//! A store reads the states, calls one of these functions (or [`apply`] with an [`Op`]) and
//! writes back what [`Evaluation::writes`] says, all in one atomic step. A store that holds
//! the states in memory calls [`apply_in_place`] instead: the same decision, with the states
//! written where they are (no list of writes, no copy of a state).
//!
//! Every operation decides each limit first, noting what it would write (a small `Record`
//! per limit), and writes only once the whole policy has been decided: all or nothing.

use crate::algorithms::{self, Record};
use crate::decision::{Decision, LimitStatus};
use crate::limit::{Algorithm, Limit, MAX_LIMITS_PER_POLICY};
use crate::policy::Policy;
use crate::state::LimitState;

/// Per-limit writes of one decision (`Some(new state)` where the state changes); inline for
/// policies of up to 4 limits, so a decision allocates nothing for them.
pub type Writes = smallvec::SmallVec<[Option<LimitState>; 4]>;

const EMPTY: LimitState = LimitState::Empty;

fn state_at(states: &[LimitState], i: usize) -> &LimitState {
    states.get(i).unwrap_or(&EMPTY)
}

/// One operation on the state of a (policy, key): what a store is asked to do, as a value.
///
/// Every store runs one `Op` per call, atomically over all the limits of the policy; wrappers
/// (reservation, circuit breaking, sharding) pass it on without looking inside unless they
/// must. New operations may be added: match with a `_` arm outside this crate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Op {
    /// Records `cost` in every limit if all admit, nowhere otherwise ([`check`]).
    Check {
        /// Units asked for; 0 records nothing and reports the state.
        cost: u64,
    },
    /// The decision a check of `cost` would get, recording nothing ([`peek`]). A store may
    /// answer it from a replica.
    Peek {
        /// Units asked about.
        cost: u64,
    },
    /// Gives `cost` back to every limit's current window (never below zero used) and reports
    /// the state after it (as a check of cost 0: always allowed).
    Refund {
        /// Units given back.
        cost: u64,
    },
    /// Takes as many units as every limit admits now, at least `min` and at most `max`: how a
    /// process leases a batch. The decision's `cost` is the amount taken.
    ///
    /// One all-or-nothing check of the largest amount that fits: every algorithm's `remaining`
    /// is exactly the largest cost it would admit now
    /// (docs/algorithms.md#what-every-limit-reports), so the amount is the least `remaining`
    /// over the limits, capped by `max` and by each limit's `max` ([`grantable`]). When even
    /// `min` does not fit, this is a (refused) check of `min` and records nothing.
    Acquire {
        /// The least worth taking; when even this does not fit, a refused check of `min`.
        min: u64,
        /// The most to take.
        max: u64,
        /// Who takes it: a process's holder id, so the store can count the distinct holders
        /// of a key ([`Decision::holders`]); 0 takes anonymously and counts nobody.
        holder: u64,
    },
    /// Takes the lease `lease` for `cost` units in the policy's concurrency limit, and
    /// records `cost` in its other limits, all or nothing: a check that also holds. Taking a
    /// lease that is already held renews it: it is replaced (new cost, new expiry) if the
    /// concurrency limit admits, and the other limits, which counted it when it was taken,
    /// are neither charged nor consulted (they report their state). `cost = 0` takes nothing
    /// and reports the state.
    Hold {
        /// Units the lease holds; 0 takes nothing and reports the state.
        cost: u64,
        /// The lease's id, chosen by the caller (unique per lease, e.g. random).
        lease: u64,
    },
    /// Frees the lease `lease` of the policy's concurrency limit and reports the state after
    /// it (as a check of cost 0: always allowed). Other limits are left as they are: a release
    /// is not a refund. The decision's `cost` is the units it held: 0 when it was not held
    /// (never taken, released already, or lapsed).
    Release {
        /// The lease's id.
        lease: u64,
    },
    /// Forgets every limit's state of the key: a store deletes them (and the key's holders,
    /// leases and reserved units with them). The decision is the state after it: a key with
    /// no state.
    Forget,
}

impl Op {
    /// The units the operation is about: the cost, or an acquire's `min`.
    pub fn cost(self) -> u64 {
        match self {
            Op::Check { cost }
            | Op::Peek { cost }
            | Op::Refund { cost }
            | Op::Hold { cost, .. } => cost,
            Op::Acquire { min, .. } => min,
            Op::Release { .. } | Op::Forget => 0,
        }
    }

    /// Whether the operation only reads (a peek): it may go to a replica and never writes.
    pub fn is_read_only(self) -> bool {
        matches!(self, Op::Peek { .. })
    }

    /// `check`, `peek`, `refund`, `acquire`, `hold`, `release` or `forget`.
    pub fn name(self) -> &'static str {
        match self {
            Op::Check { .. } => "check",
            Op::Peek { .. } => "peek",
            Op::Refund { .. } => "refund",
            Op::Acquire { .. } => "acquire",
            Op::Hold { .. } => "hold",
            Op::Release { .. } => "release",
            Op::Forget => "forget",
        }
    }
}

/// Runs `op` on the states of one (policy, key): the function of this module it names. A peek
/// never writes.
pub fn apply(policy: &Policy, states: &[LimitState], op: Op, now: u64) -> Evaluation {
    let mut records = [Record::Nothing; MAX_LIMITS_PER_POLICY];
    let mut decision = Decision::empty(0, now);
    decide(policy, states, op, now, &mut records, &mut decision);
    Evaluation {
        writes: writes(policy, states, &records),
        decision,
    }
}

/// Runs `op` on the states of one (policy, key) and writes the states that change where they
/// are: what a store holding `states` in memory does under its lock. The decision is written
/// into `decision` (whatever it held before); returns whether any state changed. A peek never
/// writes.
///
/// `states` holds one state per limit of the policy, in its order ([`LimitState::Empty`]
/// for none); limits beyond its end are decided as having no state and are not written.
#[inline]
pub fn apply_in_place(
    policy: &Policy,
    states: &mut [LimitState],
    op: Op,
    now: u64,
    decision: &mut Decision,
) -> bool {
    if let ([limit], [state], Op::Check { cost }) = (policy.limits(), &mut *states, op) {
        return check_one(limit, state, cost, now, decision);
    }
    let mut records = [Record::Nothing; MAX_LIMITS_PER_POLICY];
    decide(policy, states, op, now, &mut records, decision);
    let mut wrote = false;
    for (state, record) in states.iter_mut().zip(records) {
        wrote |= record.writes();
        record.write(state);
    }
    wrote
}

/// A decision and what to store because of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Evaluation {
    /// The decision.
    pub decision: Decision,
    /// `None` when nothing changes. Otherwise one entry per limit: `Some(new state)` for
    /// limits whose state must be written, `None` for limits left as they are.
    pub writes: Option<Writes>,
}

/// Checks `cost` against every limit; records it in all of them only if all admit.
/// `cost = 0` records nothing and reports the state.
/// A concurrency limit is consulted, not held: it admits when `cost` could start now.
pub fn check(policy: &Policy, states: &[LimitState], cost: u64, now: u64) -> Evaluation {
    apply(policy, states, Op::Check { cost }, now)
}

/// The most a check could take now, given `state` (a decision of cost 0), capped at `max`.
pub fn grantable(policy: &Policy, state: &Decision, max: u64) -> u64 {
    state
        .limits()
        .iter()
        .zip(policy.limits())
        .map(|(s, l)| s.remaining.min(l.max()))
        .fold(max, u64::min)
}

/// The decision a check of `cost` would get now, recording nothing.
pub fn peek(policy: &Policy, states: &[LimitState], cost: u64, now: u64) -> Decision {
    apply(policy, states, Op::Peek { cost }, now).decision
}

/// The first instant at which every state of the key means the same as no state: a store may
/// forget the key then. `None` if all states are empty.
#[inline]
pub fn expires_at(policy: &Policy, states: &[LimitState]) -> Option<u64> {
    if let ([limit], [state]) = (policy.limits(), states) {
        return algorithms::expires_at(limit, state);
    }
    policy
        .limits()
        .iter()
        .enumerate()
        .filter_map(|(i, limit)| algorithms::expires_at(limit, state_at(states, i)))
        .max()
}

/// What a store writes for `records`, as the list [`Evaluation::writes`] holds.
fn writes(policy: &Policy, states: &[LimitState], records: &[Record]) -> Option<Writes> {
    let n = policy.limits().len();
    records[..n].iter().any(Record::writes).then(|| {
        records[..n]
            .iter()
            .enumerate()
            .map(|(i, r)| r.written(state_at(states, i)))
            .collect()
    })
}

/// Decides `op` into `d`, noting in `records` what each limit writes (nothing for a peek or
/// a refusal).
#[inline]
fn decide(
    policy: &Policy,
    states: &[LimitState],
    op: Op,
    now: u64,
    records: &mut [Record; MAX_LIMITS_PER_POLICY],
    d: &mut Decision,
) {
    match op {
        Op::Check { cost } => check_holding(policy, states, cost, now, None, records, d),
        Op::Peek { cost } => {
            check_holding(policy, states, cost, now, None, records, d);
            *records = [Record::Nothing; MAX_LIMITS_PER_POLICY];
        }
        Op::Hold { cost, lease } => {
            check_holding(policy, states, cost, now, Some(lease), records, d);
        }
        Op::Acquire { min, max, .. } => {
            check_holding(policy, states, 0, now, None, records, d);
            let grant = grantable(policy, d, max);
            if grant >= min && grant > 0 {
                check_holding(policy, states, grant, now, None, records, d);
                debug_assert!(d.allowed, "every limit's remaining admits it");
            } else {
                check_holding(policy, states, min, now, None, records, d);
            }
        }
        Op::Refund { cost } => {
            d.reset(0, now);
            for (i, limit) in policy.limits().iter().enumerate() {
                let current = state_at(states, i);
                let record = algorithms::plan_refund(limit, current, cost, now);
                d.push(status_after(limit, current, record, now));
                records[i] = record;
            }
            d.finish(true);
        }
        Op::Release { lease } => {
            let mut freed = 0;
            d.reset(0, now);
            for (i, limit) in policy.limits().iter().enumerate() {
                let current = state_at(states, i);
                let (record, units) = algorithms::plan_release(current, lease, now);
                freed = freed.max(units);
                d.push(status_after(limit, current, record, now));
                records[i] = record;
            }
            d.cost = freed;
            d.finish(true);
        }
        Op::Forget => {
            check_holding(policy, &[], 0, now, None, records, d);
            records[..policy.limits().len()].fill(Record::Clear);
        }
    }
}

/// A check of a policy of one limit (the common case), in place: [`check_holding`] without
/// the bookkeeping that several limits need.
#[inline]
fn check_one(limit: &Limit, state: &mut LimitState, cost: u64, now: u64, d: &mut Decision) -> bool {
    // A window or a bucket is decided here, its next state stored at once. Through
    // `algorithms::plan` its outcome and `Record` went to the stack and were read back in
    // wider loads than they were written with, and the processor stalled on that
    // (docs/benchmarks.md, "A decision the caller keeps").
    let (outcome, wrote) = match limit.algorithm() {
        Algorithm::TokenBucket => {
            let (next, outcome) = algorithms::token_bucket(limit, state.token_bucket(), cost, now);
            let wrote = next.is_some();
            if let Some(next) = next {
                *state = LimitState::TokenBucket(next);
            }
            (outcome, wrote)
        }
        Algorithm::FixedWindow => {
            let (next, outcome) = algorithms::fixed_window(limit, state.fixed_window(), cost, now);
            let wrote = next.is_some();
            if let Some(next) = next {
                *state = LimitState::FixedWindow(next);
            }
            (outcome, wrote)
        }
        _ => {
            let (outcome, record) = algorithms::plan(limit, state, cost, now, None);
            let wrote = record.writes();
            record.write(state);
            (outcome, wrote)
        }
    };
    d.reset(cost, now);
    d.push(LimitStatus::new(limit, outcome));
    d.allowed = outcome.admits;
    wrote
}

/// A limit's status after `record` is written into `current` (as a check of cost 0).
fn status_after(limit: &Limit, current: &LimitState, record: Record, now: u64) -> LimitStatus {
    let next = record.written(current);
    let (outcome, _) = algorithms::plan(limit, next.as_ref().unwrap_or(current), 0, now, None);
    LimitStatus::new(limit, outcome)
}

#[inline]
fn check_holding(
    policy: &Policy,
    states: &[LimitState],
    cost: u64,
    now: u64,
    lease: Option<u64>,
    records: &mut [Record; MAX_LIMITS_PER_POLICY],
    d: &mut Decision,
) {
    let limits = policy.limits();
    // Taking again a lease that is still held renews it: the request it stands for was
    // counted when the lease was first taken, so the other limits are not charged again.
    let renewing = cost > 0
        && lease.is_some_and(|id| {
            limits.iter().enumerate().any(|(i, l)| {
                l.algorithm() == Algorithm::Concurrency
                    && algorithms::holds(state_at(states, i), id, now)
            })
        });
    d.reset(cost, now);
    let mut allowed = true;
    for ((i, limit), record) in limits.iter().enumerate().zip(records.iter_mut()) {
        let charged = if renewing && limit.algorithm() != Algorithm::Concurrency {
            0
        } else {
            cost
        };
        let (outcome, planned) = algorithms::plan(limit, state_at(states, i), charged, now, lease);
        allowed &= outcome.admits;
        d.push(LimitStatus::new(limit, outcome));
        *record = planned;
    }
    if !allowed {
        // Nothing is recorded, so limits that would have admitted report their state as it
        // stands (their outcome above had the cost deducted).
        *records = [Record::Nothing; MAX_LIMITS_PER_POLICY];
        if cost > 0 {
            for (i, (limit, status)) in limits.iter().zip(d.limits_mut()).enumerate() {
                if status.admits {
                    let (outcome, _) = algorithms::plan(limit, state_at(states, i), 0, now, None);
                    *status = LimitStatus::new(limit, outcome);
                }
            }
        }
    }
    d.finish(allowed);
}
