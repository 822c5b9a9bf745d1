//! Decisions: being limited is a value, not an error.

use crate::limit::{Algorithm, Limit, Policy};

/// How a decision was made when the store could not answer (see
/// [`FailureMode`](crate::FailureMode)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Degraded {
    /// Allowed without a decision (`on_store_error: open`); every limit is reported whole.
    Open,
    /// Decided by this process's insurance store (`on_store_error: local`).
    Local,
}

impl Degraded {
    /// `open` or `local`.
    pub fn as_str(self) -> &'static str {
        match self {
            Degraded::Open => "open",
            Degraded::Local => "local",
        }
    }
}

/// One limit's part in a decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LimitStatus {
    /// The limit's `max`.
    pub max: u64,
    /// The most units the limit holds at once ([`Limit::capacity`]: a token bucket's `burst`,
    /// else `max`): the `limit` that `remaining` counts down from.
    pub capacity: u64,
    /// The limit's window in ms.
    pub per_ms: u64,
    /// The limit's algorithm.
    pub algorithm: Algorithm,
    /// Whether this limit admitted the cost (it may still be denied by another limit).
    pub admits: bool,
    /// Units still available after the decision; never negative.
    pub remaining: u64,
    /// When this limit is whole again, in ms since the epoch.
    pub reset_ms: u64,
    /// 0 when this limit admits; otherwise ms until the cost fits, `None` if it never can.
    pub retry_after_ms: Option<u64>,
}

impl LimitStatus {
    /// Builds the status of `limit` from an algorithm's outcome.
    pub fn new(limit: &Limit, outcome: crate::Outcome) -> Self {
        Self {
            max: limit.max(),
            capacity: limit.capacity(),
            per_ms: limit.per_ms(),
            algorithm: limit.algorithm(),
            admits: outcome.admits,
            remaining: outcome.remaining,
            reset_ms: outcome.reset_ms,
            retry_after_ms: outcome.retry_after_ms,
        }
    }

    /// Units counted against the limit (`capacity - remaining`, never negative), for
    /// `X-RateLimit-Used`.
    pub fn used(&self) -> u64 {
        self.capacity.saturating_sub(self.remaining)
    }
}

/// The answer to "may this key spend this cost now?", with every limit's state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// Whether the cost was admitted (and recorded in every limit).
    pub allowed: bool,
    /// The cost asked for.
    pub cost: u64,
    /// Index into `limits` of the binding limit, which headers and top-level fields describe.
    pub binding: usize,
    /// Every limit's status, in the policy's order.
    pub limits: Vec<LimitStatus>,
    /// `None` when the store decided; otherwise how the decision was made without it.
    pub degraded: Option<Degraded>,
    /// The instant (ms since the epoch) it was decided at: the store's "now" (Redis `TIME`
    /// under `clock: redis`). Everything rendered from the decision — headers, durations
    /// until reset — derives from it, never from a second reading of a clock.
    pub now_ms: u64,
    /// For an acquire by a holder ([`Op::Acquire`](crate::evaluate::Op::Acquire) with a
    /// non-zero `holder`): how many distinct holders have acquired on this key within the
    /// policy's shortest window, this one included. 0 otherwise.
    pub holders: u32,
}

impl Decision {
    /// Assembles a decision, choosing the binding limit (docs/algorithms.md#the-binding-limit):
    /// when denied, the refusing limit with the largest `retry_after` (never-fits counts as the
    /// largest); when allowed, the limit with the least `remaining`. Ties go to the shorter
    /// `per`, then to the earlier limit.
    pub fn new(allowed: bool, cost: u64, limits: Vec<LimitStatus>, now_ms: u64) -> Self {
        let binding = if allowed {
            position_min_by_key(&limits, |s| (s.remaining, s.per_ms))
        } else {
            // Largest retry_after first: order by (retry descending, per ascending).
            position_min_by_key(&limits, |s| {
                (
                    s.admits,
                    std::cmp::Reverse(s.retry_after_ms.map_or(u128::MAX, u128::from)),
                    s.per_ms,
                )
            })
        };
        Self {
            allowed,
            cost,
            binding,
            limits,
            degraded: None,
            now_ms,
            holders: 0,
        }
    }

    /// The decision of a policy that fails open while its store cannot answer: allowed, with
    /// every limit reported whole (`remaining = capacity`, `reset = now`), marked
    /// [`Degraded::Open`].
    pub fn fail_open(policy: &Policy, cost: u64, now_ms: u64) -> Self {
        let limits = policy
            .limits()
            .iter()
            .map(|l| LimitStatus {
                max: l.max(),
                capacity: l.capacity(),
                per_ms: l.per_ms(),
                algorithm: l.algorithm(),
                admits: true,
                remaining: l.capacity(),
                reset_ms: now_ms,
                retry_after_ms: Some(0),
            })
            .collect();
        Self {
            degraded: Some(Degraded::Open),
            ..Self::new(true, cost, limits, now_ms)
        }
    }

    /// The same decision marked as made without the store.
    pub fn degraded(mut self, how: Degraded) -> Self {
        self.degraded = Some(how);
        self
    }

    /// Whether the store did not make this decision.
    pub fn is_degraded(&self) -> bool {
        self.degraded.is_some()
    }

    /// The binding limit.
    pub fn binding(&self) -> &LimitStatus {
        &self.limits[self.binding]
    }

    /// The binding limit's remaining.
    pub fn remaining(&self) -> u64 {
        self.binding().remaining
    }

    /// The binding limit's reset in ms.
    pub fn reset_ms(&self) -> u64 {
        self.binding().reset_ms
    }

    /// The binding limit's retry_after in ms (`Some(0)` when allowed, `None` if it can never
    /// pass).
    pub fn retry_after_ms(&self) -> Option<u64> {
        self.binding().retry_after_ms
    }
}

/// The index of the first element with the least key (0 for an empty slice).
fn position_min_by_key<T, K: Ord>(items: &[T], key: impl Fn(&T) -> K) -> usize {
    let mut best = 0;
    for (i, item) in items.iter().enumerate().skip(1) {
        if key(item) < key(&items[best]) {
            best = i;
        }
    }
    best
}
