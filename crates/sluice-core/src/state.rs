//! What a store keeps per (policy, key, limit). Every field has a Redis counterpart, listed on
//! each type, so the Lua scripts of the Redis store mirror these types field for field.

/// One limit's stored state for one key.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum LimitState {
    /// Nothing stored (a fresh key, or state that expired).
    #[default]
    Empty,
    /// State of a `fixed_window` limit.
    FixedWindow(FixedWindowState),
    /// State of a `sliding_window` limit.
    SlidingWindow(SlidingWindowState),
    /// State of a `token_bucket` limit.
    TokenBucket(TokenBucketState),
    /// State of a `concurrency` limit.
    Concurrency(ConcurrencyState),
}

impl LimitState {
    /// The fixed window's state, if this is one.
    #[inline]
    pub(crate) fn fixed_window(&self) -> Option<&FixedWindowState> {
        match self {
            LimitState::FixedWindow(s) => Some(s),
            _ => None,
        }
    }

    /// The sliding window's state, if this is one.
    #[inline]
    pub(crate) fn sliding_window(&self) -> Option<&SlidingWindowState> {
        match self {
            LimitState::SlidingWindow(s) => Some(s),
            _ => None,
        }
    }

    /// The token bucket's state, if this is one.
    #[inline]
    pub(crate) fn token_bucket(&self) -> Option<&TokenBucketState> {
        match self {
            LimitState::TokenBucket(s) => Some(s),
            _ => None,
        }
    }

    /// The concurrency limit's state, if this is one.
    #[inline]
    pub(crate) fn concurrency(&self) -> Option<&ConcurrencyState> {
        match self {
            LimitState::Concurrency(s) => Some(s),
            _ => None,
        }
    }
}

/// A fixed window: Redis hash fields `reset` and `used`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FixedWindowState {
    /// The end of the window (exclusive), stored when the window opened and never recomputed.
    pub reset_ms: u64,
    /// Units admitted in the window.
    pub used: u64,
}

/// A sliding window: a Redis hash with one field per non-empty bucket, `start -> count`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SlidingWindowState {
    /// `(bucket start in ms, units admitted in it)`, sorted by start, counts above zero.
    /// Bucket starts are multiples of the limit's precision since the epoch.
    pub buckets: Vec<(u64, u64)>,
}

/// A token bucket as GCRA: Redis hash fields `tat` and `frac`.
///
/// The theoretical arrival time is `tat_ms + tat_frac / max` milliseconds: one token takes
/// `per / max` ms, rarely a whole number, so the fraction is kept exactly as a numerator over
/// `max` instead of being rounded (a rounded interval drifts a limit of 3 per second to 2.99
/// or 3.01).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenBucketState {
    /// Whole milliseconds of the theoretical arrival time.
    pub tat_ms: u64,
    /// The fractional part, in units of `1/max` ms; always below `max`.
    pub tat_frac: u64,
}

/// A concurrency limit: the leases held on the key. Redis: a sorted set (member: lease id,
/// score: expiry) and a hash (lease id -> cost, and `used`, the total of the costs).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ConcurrencyState {
    /// The leases, in no particular order; ids are distinct. Leases past their expiry may
    /// still be listed: every read ignores them, and the next write drops them.
    pub leases: Vec<HeldLease>,
}

/// One lease of a concurrency limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeldLease {
    /// The lease's id, chosen by whoever took it.
    pub id: u64,
    /// When the lease lapses unless released (exclusive), in ms since the epoch.
    pub expires_ms: u64,
    /// The units it holds.
    pub cost: u64,
}
