//! The pure core of Sluice: limits, policies, the four algorithms and decisions.
//!
//! Nothing here performs I/O, spawns a task or reads a clock: every function is given `now`
//! (milliseconds since the Unix epoch) and the stored state, and returns the decision and the
//! state to store. That makes the algorithms testable by time travel, and lets the Redis
//! store's Lua scripts mirror them function for function (a differential test holds the two
//! identical).
//!
//! ```
//! use sluice_core::{evaluate, LimitSpec, LimitState, Policy};
//!
//! // 2 per second and 3 per minute, as one policy.
//! let policy = Policy::from_specs(
//!     "api",
//!     vec![LimitSpec::fixed_window(2, 1_000), LimitSpec::fixed_window(3, 60_000)],
//! )?;
//! let mut states: Vec<LimitState> = vec![LimitState::Empty; 2];
//! let mut now = 1_700_000_000_000;
//! let mut admitted = 0;
//! for _ in 0..10 {
//!     let eval = evaluate::check(&policy, &states, 1, now);
//!     if let Some(writes) = eval.writes {
//!         for (state, write) in states.iter_mut().zip(writes) {
//!             if let Some(w) = write { *state = w; }
//!         }
//!     }
//!     admitted += u32::from(eval.decision.allowed);
//!     now += 400;
//! }
//! assert_eq!(admitted, 3); // the minute limit binds
//! # Ok::<(), sluice_core::LimitError>(())
//! ```

mod algorithms;
mod clock;
mod decision;
pub mod evaluate;
mod limit;
mod policy;
mod state;

pub use algorithms::{
    Outcome, expires_at, fixed_window, fixed_window_end, holds, sliding_window_floor, token_bucket,
};
pub use clock::{Clock, ManualClock};
pub use decision::{Decision, Degraded, LimitStatus};
pub use evaluate::{Evaluation, Writes};
pub use limit::{
    Algorithm, DEFAULT_BUCKETS, Limit, LimitError, LimitSpec, MAX_AMOUNT, MAX_BUCKETS,
    MAX_LIMITS_PER_POLICY, MAX_PER_MS, MAX_POLICY_NAME_LEN, MAX_REFILL_MS, MIN_PER_MS,
    duration_text,
};
pub use policy::{FailureMode, Policy};
pub use state::{
    ConcurrencyState, FixedWindowState, HeldLease, LimitState, SlidingWindowState, TokenBucketState,
};
