//! The library's clock: the operating system's wall clock.
//!
//! The core never reads a clock ([`sluice_core::Clock`]); a [`crate::Limiter`] reads this one
//! (or the one it is given) once per call and hands `now` to the store.

use std::time::{SystemTime, UNIX_EPOCH};

use sluice_core::Clock;

/// The operating system's wall clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        // A clock set before 1970 reads as the epoch rather than failing a decision.
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn system_clock_is_after_2020() {
        assert!(SystemClock.now_ms() > 1_577_836_800_000);
    }
}
