//! A whole policy for one key: all-or-nothing over its limits (docs/algorithms.md#all-or-nothing).
//!
//! `states[i]` is the stored state of `policy.limits()[i]`; a missing index means no state.
//! A store reads the states, calls one of these functions (or [`apply`] with an [`Op`]) and
//! writes back what [`Evaluation::writes`] says, all in one atomic step.

use crate::algorithms::{self, Outcome};
use crate::decision::{Decision, LimitStatus};
use crate::limit::{Algorithm, Policy};
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
    /// Gives `cost` back to the current windows, never below zero used ([`refund`]).
    Refund {
        /// Units given back.
        cost: u64,
    },
    /// Takes as many units as every limit admits now, at least `min` and at most `max`
    /// ([`acquire`]): how a process leases a batch. The decision's `cost` is the amount taken.
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
    /// records `cost` in its other limits, all or nothing ([`hold`]). Taking a lease that is
    /// already held renews it.
    Hold {
        /// Units the lease holds; 0 takes nothing and reports the state.
        cost: u64,
        /// The lease's id, chosen by the caller (unique per lease, e.g. random).
        lease: u64,
    },
    /// Frees the lease `lease` of the policy's concurrency limit ([`release`]); other limits
    /// are left as they are. The decision's `cost` is the units it held (0: not held).
    Release {
        /// The lease's id.
        lease: u64,
    },
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
            Op::Release { .. } => 0,
        }
    }

    /// Whether the operation only reads (a peek): it may go to a replica and never writes.
    pub fn is_read_only(self) -> bool {
        matches!(self, Op::Peek { .. })
    }

    /// `check`, `peek`, `refund`, `acquire`, `hold` or `release`.
    pub fn name(self) -> &'static str {
        match self {
            Op::Check { .. } => "check",
            Op::Peek { .. } => "peek",
            Op::Refund { .. } => "refund",
            Op::Acquire { .. } => "acquire",
            Op::Hold { .. } => "hold",
            Op::Release { .. } => "release",
        }
    }
}

/// Runs `op` on the states of one (policy, key): the function of this module it names. A peek
/// never writes.
pub fn apply(policy: &Policy, states: &[LimitState], op: Op, now: u64) -> Evaluation {
    match op {
        Op::Check { cost } => check(policy, states, cost, now),
        Op::Peek { cost } => Evaluation {
            decision: peek(policy, states, cost, now),
            writes: None,
        },
        Op::Refund { cost } => refund(policy, states, cost, now),
        Op::Acquire { min, max, .. } => acquire(policy, states, min, max, now),
        Op::Hold { cost, lease } => hold(policy, states, cost, lease, now),
        Op::Release { lease } => release(policy, states, lease, now),
    }
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
    check_holding(policy, states, cost, now, None)
}

/// Takes the lease `lease` for `cost` units in the policy's concurrency limit and records
/// `cost` in every other limit, only if all admit: a [`check`] that also holds. A lease of the
/// same id still held is renewed instead: it is replaced (new cost, new expiry) if the
/// concurrency limit admits, and the other limits, which counted it when it was taken, are
/// neither charged nor consulted (they report their state). `cost = 0` takes nothing and
/// reports the state.
pub fn hold(policy: &Policy, states: &[LimitState], cost: u64, lease: u64, now: u64) -> Evaluation {
    check_holding(policy, states, cost, now, Some(lease))
}

fn check_holding(
    policy: &Policy,
    states: &[LimitState],
    cost: u64,
    now: u64,
    lease: Option<u64>,
) -> Evaluation {
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
    let mut statuses = Vec::with_capacity(limits.len());
    let mut writes = Writes::with_capacity(limits.len());
    let mut allowed = true;
    for (i, limit) in limits.iter().enumerate() {
        let charged = if renewing && limit.algorithm() != Algorithm::Concurrency {
            0
        } else {
            cost
        };
        let (next, outcome) =
            algorithms::step_holding(limit, state_at(states, i), charged, now, lease);
        allowed &= outcome.admits;
        statuses.push(LimitStatus::new(limit, outcome));
        writes.push(next);
    }
    if !allowed {
        // Nothing is recorded, so limits that would have admitted report their state as it
        // stands (their outcome above had the cost deducted).
        for (i, limit) in limits.iter().enumerate() {
            if statuses[i].admits && cost > 0 {
                let (_, outcome) = algorithms::step(limit, state_at(states, i), 0, now);
                statuses[i] = LimitStatus::new(limit, outcome);
            }
        }
        return Evaluation {
            decision: Decision::new(false, cost, statuses, now),
            writes: None,
        };
    }
    let changed = writes.iter().any(Option::is_some);
    Evaluation {
        decision: Decision::new(true, cost, statuses, now),
        writes: changed.then_some(writes),
    }
}

/// Takes as many units as every limit admits now, at least `min` and at most `max` (a batch
/// for a local lease): one all-or-nothing check of the largest amount that fits. When even
/// `min` does not fit, this is a (refused) check of `min` and records nothing. The decision's
/// `cost` is the amount taken.
///
/// Every algorithm's `remaining` is exactly the largest cost it would admit now
/// (docs/algorithms.md#what-every-limit-reports), so the amount is the least `remaining` over
/// the limits, capped by `max` and by each limit's `max` (a cost above it never fits).
pub fn acquire(policy: &Policy, states: &[LimitState], min: u64, max: u64, now: u64) -> Evaluation {
    let grant = grantable(policy, &peek(policy, states, 0, now), max);
    if grant >= min && grant > 0 {
        let eval = check(policy, states, grant, now);
        debug_assert!(eval.decision.allowed, "every limit's remaining admits it");
        eval
    } else {
        check(policy, states, min, now)
    }
}

/// The most a check could take now, given `state` (a decision of cost 0), capped at `max`.
pub fn grantable(policy: &Policy, state: &Decision, max: u64) -> u64 {
    state
        .limits
        .iter()
        .zip(policy.limits())
        .map(|(s, l)| s.remaining.min(l.max()))
        .fold(max, u64::min)
}

/// The decision a check of `cost` would get now, recording nothing.
pub fn peek(policy: &Policy, states: &[LimitState], cost: u64, now: u64) -> Decision {
    check(policy, states, cost, now).decision
}

/// Gives `cost` back to every limit's current window (never below zero used) and reports the
/// state after it (as a check of cost 0: always allowed).
pub fn refund(policy: &Policy, states: &[LimitState], cost: u64, now: u64) -> Evaluation {
    let limits = policy.limits();
    let mut writes = Writes::with_capacity(limits.len());
    let mut statuses = Vec::with_capacity(limits.len());
    for (i, limit) in limits.iter().enumerate() {
        let current = state_at(states, i);
        let next = algorithms::refund(limit, current, cost, now);
        let (_, outcome): (_, Outcome) =
            algorithms::step(limit, next.as_ref().unwrap_or(current), 0, now);
        statuses.push(LimitStatus::new(limit, outcome));
        writes.push(next);
    }
    let changed = writes.iter().any(Option::is_some);
    Evaluation {
        decision: Decision::new(true, 0, statuses, now),
        writes: changed.then_some(writes),
    }
}

/// Frees the lease `lease` of the policy's concurrency limit and reports the state after it
/// (as a check of cost 0: always allowed). The decision's `cost` is the units the lease held:
/// 0 when it was not held (never taken, released already, or lapsed). Other limits are left
/// as they are: a release is not a refund.
pub fn release(policy: &Policy, states: &[LimitState], lease: u64, now: u64) -> Evaluation {
    let limits = policy.limits();
    let mut writes = Writes::with_capacity(limits.len());
    let mut statuses = Vec::with_capacity(limits.len());
    let mut freed = 0;
    for (i, limit) in limits.iter().enumerate() {
        let current = state_at(states, i);
        let (next, units) = algorithms::release(current, lease, now);
        freed = freed.max(units);
        let (_, outcome) = algorithms::step(limit, next.as_ref().unwrap_or(current), 0, now);
        statuses.push(LimitStatus::new(limit, outcome));
        writes.push(next);
    }
    let changed = writes.iter().any(Option::is_some);
    Evaluation {
        decision: Decision::new(true, freed, statuses, now),
        writes: changed.then_some(writes),
    }
}

/// The first instant at which every state of the key means the same as no state: a store may
/// forget the key then. `None` if all states are empty.
pub fn expires_at(policy: &Policy, states: &[LimitState]) -> Option<u64> {
    policy
        .limits()
        .iter()
        .enumerate()
        .filter_map(|(i, limit)| algorithms::expires_at(limit, state_at(states, i)))
        .max()
}
