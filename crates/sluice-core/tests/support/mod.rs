//! One key of one policy, driven through the pure core like a store would: what the
//! boundary and concurrency tests share. Each binary uses part of it.

#![allow(dead_code)]

use sluice_core::evaluate::{self, Op};
use sluice_core::{Decision, LimitSpec, LimitState, Policy};

pub(crate) const T0: u64 = 1_700_000_000_000;

/// A key's policy and its states, empty until a decision writes them.
pub(crate) struct Key {
    pub(crate) policy: Policy,
    pub(crate) states: Vec<LimitState>,
}

impl Key {
    pub(crate) fn new(specs: Vec<LimitSpec>) -> Self {
        let policy = Policy::from_specs("p", specs).expect("valid policy");
        Self {
            policy,
            states: Vec::new(),
        }
    }

    pub(crate) fn one(spec: LimitSpec) -> Self {
        Self::new(vec![spec])
    }

    fn apply(&mut self, writes: Option<evaluate::Writes>) {
        if let Some(writes) = writes {
            self.states.resize(writes.len(), LimitState::Empty);
            for (s, w) in self.states.iter_mut().zip(writes) {
                if let Some(w) = w {
                    *s = w;
                }
            }
        }
    }

    pub(crate) fn check(&mut self, cost: u64, now: u64) -> Decision {
        let eval = evaluate::check(&self.policy, &self.states, cost, now);
        self.apply(eval.writes);
        eval.decision
    }

    pub(crate) fn refund(&mut self, cost: u64, now: u64) -> Decision {
        let eval = evaluate::apply(&self.policy, &self.states, Op::Refund { cost }, now);
        self.apply(eval.writes);
        eval.decision
    }

    pub(crate) fn peek(&self, cost: u64, now: u64) -> Decision {
        evaluate::peek(&self.policy, &self.states, cost, now)
    }

    /// Any operation, through [`evaluate::apply`].
    pub(crate) fn op(&mut self, op: Op, now: u64) -> Decision {
        let eval = evaluate::apply(&self.policy, &self.states, op, now);
        self.apply(eval.writes);
        eval.decision
    }

    pub(crate) fn hold(&mut self, lease: u64, cost: u64, now: u64) -> Decision {
        self.op(Op::Hold { cost, lease }, now)
    }

    pub(crate) fn release(&mut self, lease: u64, now: u64) -> Decision {
        self.op(Op::Release { lease }, now)
    }
}
