//! Sluice: a distributed rate limiter. This is the library applications embed.
//!
//! A [`Limiter`] holds named [`Policy`]s (each an ordered set of limits applied together to
//! one key), a [`Clock`] and a [`Store`]. `check(policy, key, cost)` answers with a
//! [`Decision`]: allowed or denied, with `remaining`, `reset` and `retry_after` for every limit
//! and the binding one. Being limited is a value; an `Err` means the store failed.
//!
//! Every decision is one [`Limiter::call`] of a [`Policy`] handle, a key and an [`Op`] (check,
//! peek, refund, hold or release a lease): a caller resolves its policy once
//! ([`Limiter::policy`]) and keeps the handle. Over the [`MemoryStore`], which never waits,
//! [`Limiter::call_into`] decides at once into a [`Decision`] the caller keeps (the fastest
//! way in, see docs/benchmarks.md).
//! The default clock, [`SystemClock`], reads the CPU's time-stamp counter
//! between readings of the wall clock once a second.
//!
//! The algorithms (fixed window, sliding window, token bucket as GCRA) live in
//! [`sluice_core`], pure and re-exported here. Stores: [`MemoryStore`] (this process) and the
//! Redis stores of `sluice-redis`, which run the same algorithms as Lua scripts.
//!
//! ```
//! use sluice::{Decision, Limiter, LimitSpec, ManualClock, MemoryStore, Op, Policy};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let rt = tokio::runtime::Builder::new_current_thread().build()?;
//! # rt.block_on(async {
//! let clock = ManualClock::new(1_700_000_000_000);
//! let api = Policy::from_specs(
//!     "api",
//!     vec![LimitSpec::fixed_window(10, 1_000), LimitSpec::fixed_window(5_000, 3_600_000)],
//! )?;
//! let limiter = Limiter::new(MemoryStore::new()).with_clock(clock.clone()).with_policy(api);
//!
//! let d = limiter.check("api", "user:42", 1).await?;
//! assert!(d.allowed);
//! assert_eq!(d.remaining(), 9); // the 10-per-second limit binds
//! assert_eq!(d.limits()[1].remaining, 4_999);
//!
//! assert!(!limiter.check("api", "user:42", 10).await?.allowed); // all or nothing
//! clock.advance(1_000);
//! let api = limiter.policy("api").expect("added above").clone(); // keep the handle
//! assert!(limiter.call(&api, "user:42", Op::Check { cost: 10 }).await?.allowed);
//! let mut d = Decision::empty(0, 0);
//! limiter.call_into(&api, "user:42", Op::Peek { cost: 1 }, &mut d)?;
//! assert!(!d.allowed);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # })
//! # }
//! ```

pub mod breaker;
mod clock;
pub mod headers;
pub mod latency;
mod limiter;
mod memory;
pub mod reserve;
mod store;

pub use breaker::{BreakerConfig, BreakerState, CircuitBreaker};
pub use clock::SystemClock;
pub use limiter::{Error, Lease, Limiter, MAX_KEY_LEN, check_cost, check_key};
pub use memory::MemoryStore;
pub use reserve::{Batch, DEFAULT_MAX_ERROR, ReserveConfig, ReserveStats, Reserving};
pub use sluice_core::evaluate::Op;
pub use sluice_core::{
    self as core, Algorithm, Clock, Decision, Degraded, FailureMode, Limit, LimitError, LimitSpec,
    LimitState, LimitStatus, ManualClock, Policy,
};
pub use store::{
    BoxFuture, Call, DynStore, SharedStore, Store, StoreError, StoreErrorKind, StoreExt,
};

#[cfg(test)]
mod test_support {
    /// Polls `condition` every millisecond until it holds; panics after 5 s.
    pub(crate) fn wait_for(mut condition: impl FnMut() -> bool) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while !condition() {
            assert!(
                std::time::Instant::now() < deadline,
                "condition not met within 5 s"
            );
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }
}
