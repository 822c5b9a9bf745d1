//! Decisions: being limited is a value, not an error.

use std::fmt;

use crate::limit::{Algorithm, Limit, MAX_LIMITS_PER_POLICY};
use crate::policy::Policy;

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
    /// The filler of a decision's unused places (no limit).
    const NONE: LimitStatus = LimitStatus {
        max: 0,
        capacity: 0,
        per_ms: 0,
        algorithm: Algorithm::FixedWindow,
        admits: false,
        remaining: 0,
        reset_ms: 0,
        retry_after_ms: None,
    };

    /// Builds the status of `limit` from an algorithm's outcome.
    #[inline]
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
    #[inline]
    pub fn used(&self) -> u64 {
        self.capacity.saturating_sub(self.remaining)
    }
}

/// The answer to "may this key spend this cost now?", with every limit's state.
///
/// The statuses are held inline, one per limit of the policy in the policy's order (at most
/// [`MAX_LIMITS_PER_POLICY`]), so deciding allocates nothing; read them with
/// [`Decision::limits`]. The array is as long as the largest policy, so a `Decision` is a few
/// hundred bytes: pass it by reference where you can.
#[derive(Clone)]
pub struct Decision {
    /// Whether the cost was admitted (and recorded in every limit).
    pub allowed: bool,
    /// The cost asked for.
    pub cost: u64,
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
    /// Index into `statuses` of the binding limit.
    binding: u8,
    /// How many of `statuses` are the policy's.
    len: u8,
    statuses: [LimitStatus; MAX_LIMITS_PER_POLICY],
}

impl PartialEq for Decision {
    fn eq(&self, other: &Self) -> bool {
        self.allowed == other.allowed
            && self.cost == other.cost
            && self.degraded == other.degraded
            && self.now_ms == other.now_ms
            && self.holders == other.holders
            && self.binding == other.binding
            && self.limits() == other.limits()
    }
}

impl Eq for Decision {}

impl fmt::Debug for Decision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Decision")
            .field("allowed", &self.allowed)
            .field("cost", &self.cost)
            .field("binding", &self.binding)
            .field("limits", &self.limits())
            .field("degraded", &self.degraded)
            .field("now_ms", &self.now_ms)
            .field("holders", &self.holders)
            .finish()
    }
}

impl Decision {
    /// Assembles a decision from every limit's status, in the policy's order, choosing the
    /// binding limit (docs/algorithms.md#the-binding-limit): when denied, the refusing limit
    /// with the largest `retry_after` (never-fits counts as the largest); when allowed, the
    /// limit with the least `remaining`. Ties go to the shorter `per`, then to the earlier
    /// limit.
    ///
    /// A policy has at most [`MAX_LIMITS_PER_POLICY`] limits; statuses beyond that many are
    /// not kept.
    pub fn new(
        allowed: bool,
        cost: u64,
        limits: impl IntoIterator<Item = LimitStatus>,
        now_ms: u64,
    ) -> Self {
        let mut d = Self::empty(cost, now_ms);
        for status in limits.into_iter().take(MAX_LIMITS_PER_POLICY) {
            d.push(status);
        }
        d.finish(allowed);
        d
    }

    /// A decision of no limit yet, for [`evaluate::apply_in_place`](crate::evaluate::apply_in_place)
    /// to decide into, or for a caller to keep and decide into again and again (the `sluice`
    /// crate's `Limiter::call_into`): each decision overwrites the whole of the last.
    #[inline]
    pub fn empty(cost: u64, now_ms: u64) -> Self {
        Self {
            allowed: false,
            cost,
            degraded: None,
            now_ms,
            holders: 0,
            binding: 0,
            len: 0,
            statuses: [LimitStatus::NONE; MAX_LIMITS_PER_POLICY],
        }
    }

    /// Empties the decision for a new one of `cost` at `now_ms` (the statuses are overwritten
    /// by the next pushes).
    #[inline]
    pub(crate) fn reset(&mut self, cost: u64, now_ms: u64) {
        self.allowed = false;
        self.cost = cost;
        self.degraded = None;
        self.now_ms = now_ms;
        self.holders = 0;
        self.binding = 0;
        self.len = 0;
    }

    /// Appends the next limit's status; the caller never pushes more than a policy's limits.
    #[inline]
    pub(crate) fn push(&mut self, status: LimitStatus) {
        if let Some(slot) = self.statuses.get_mut(usize::from(self.len)) {
            *slot = status;
            self.len += 1;
        }
    }

    /// The statuses, mutably (to restate a refused decision's admitting limits).
    #[inline]
    pub(crate) fn limits_mut(&mut self) -> &mut [LimitStatus] {
        &mut self.statuses[..usize::from(self.len)]
    }

    /// Sets the outcome and chooses the binding limit.
    #[inline]
    pub(crate) fn finish(&mut self, allowed: bool) {
        self.allowed = allowed;
        let limits = self.limits();
        let binding = if allowed {
            position_min_by_key(limits, |s| (s.remaining, s.per_ms))
        } else {
            // Largest retry_after first: order by (retry descending, per ascending).
            position_min_by_key(limits, |s| {
                (
                    s.admits,
                    std::cmp::Reverse(s.retry_after_ms.map_or(u128::MAX, u128::from)),
                    s.per_ms,
                )
            })
        };
        // At most MAX_LIMITS_PER_POLICY (16) statuses: the index fits.
        self.binding = u8::try_from(binding).unwrap_or(0);
    }

    /// The decision of a policy that fails open while its store cannot answer: allowed, with
    /// every limit reported whole (`remaining = capacity`, `reset = now`), marked
    /// [`Degraded::Open`].
    pub fn fail_open(policy: &Policy, cost: u64, now_ms: u64) -> Self {
        let limits = policy.limits().iter().map(|l| LimitStatus {
            max: l.max(),
            capacity: l.capacity(),
            per_ms: l.per_ms(),
            algorithm: l.algorithm(),
            admits: true,
            remaining: l.capacity(),
            reset_ms: now_ms,
            retry_after_ms: Some(0),
        });
        Self::new(true, cost, limits, now_ms).degraded(Degraded::Open)
    }

    /// The same decision marked as made without the store.
    pub fn degraded(mut self, how: Degraded) -> Self {
        self.degraded = Some(how);
        self
    }

    /// Whether the store did not make this decision.
    #[inline]
    pub fn is_degraded(&self) -> bool {
        self.degraded.is_some()
    }

    /// Every limit's status, in the policy's order.
    #[inline]
    pub fn limits(&self) -> &[LimitStatus] {
        &self.statuses[..usize::from(self.len)]
    }

    /// The index (into [`Decision::limits`]) of the binding limit, which headers and
    /// top-level fields describe.
    #[inline]
    pub fn binding_index(&self) -> usize {
        usize::from(self.binding)
    }

    /// The binding limit.
    #[inline]
    pub fn binding(&self) -> &LimitStatus {
        &self.statuses[usize::from(self.binding)]
    }

    /// The binding limit's remaining.
    #[inline]
    pub fn remaining(&self) -> u64 {
        self.binding().remaining
    }

    /// The binding limit's reset in ms.
    #[inline]
    pub fn reset_ms(&self) -> u64 {
        self.binding().reset_ms
    }

    /// The binding limit's retry_after in ms (`Some(0)` when allowed, `None` if it can never
    /// pass).
    #[inline]
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
