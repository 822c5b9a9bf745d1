//! A whole policy for one key: all-or-nothing over its limits (CONTRACT §2).
//!
//! `states[i]` is the stored state of `policy.limits()[i]`; a missing index means no state.
//! A store reads the states, calls one of these functions and writes back what
//! [`Evaluation::writes`] says, all in one atomic step.

use crate::algorithms::{self, Outcome};
use crate::decision::{Decision, LimitStatus};
use crate::limit::Policy;
use crate::state::LimitState;

/// Per-limit writes of one decision (`Some(new state)` where the state changes); inline for
/// policies of up to 4 limits, so a decision allocates nothing for them.
pub type Writes = smallvec::SmallVec<[Option<LimitState>; 4]>;

const EMPTY: LimitState = LimitState::Empty;

fn state_at(states: &[LimitState], i: usize) -> &LimitState {
    states.get(i).unwrap_or(&EMPTY)
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
pub fn check(policy: &Policy, states: &[LimitState], cost: u64, now: u64) -> Evaluation {
    let limits = policy.limits();
    let mut statuses = Vec::with_capacity(limits.len());
    let mut writes = Writes::with_capacity(limits.len());
    let mut allowed = true;
    for (i, limit) in limits.iter().enumerate() {
        let (next, outcome) = algorithms::step(limit, state_at(states, i), cost, now);
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
/// Every algorithm's `remaining` is exactly the largest cost it would admit now (CONTRACT §2),
/// so the amount is the least `remaining` over the limits, capped by `max` and by each limit's
/// `max` (a cost above it never fits).
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
