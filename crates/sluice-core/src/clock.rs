//! Time as the algorithms see it: integer milliseconds since the Unix epoch.
//!
//! The algorithms in this crate never read a clock; they are handed `now`. Whoever drives them
//! (the `Limiter` of the `sluice` crate) owns a [`Clock`], so tests can time-travel with a
//! [`ManualClock`] and a fleet can agree on time by asking Redis instead. The clock that reads
//! the operating system's is the `sluice` crate's (`sluice::SystemClock`).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// A source of "now" in milliseconds since the Unix epoch.
pub trait Clock: Send + Sync + 'static {
    /// The current time in milliseconds since the Unix epoch.
    fn now_ms(&self) -> u64;
}

/// A clock that only moves when told to. Clones share the same time, so a test can hand one
/// clone to a `Limiter` and advance another.
#[derive(Debug, Clone, Default)]
pub struct ManualClock {
    now: Arc<AtomicU64>,
}

impl ManualClock {
    /// A clock reading `now_ms`.
    pub fn new(now_ms: u64) -> Self {
        Self {
            now: Arc::new(AtomicU64::new(now_ms)),
        }
    }

    /// Sets the time (it may go backwards; tests of clock skew need that).
    pub fn set(&self, now_ms: u64) {
        self.now.store(now_ms, Ordering::SeqCst);
    }

    /// Moves the time forward by `ms` and returns the new time.
    pub fn advance(&self, ms: u64) -> u64 {
        self.now.fetch_add(ms, Ordering::SeqCst).saturating_add(ms)
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> u64 {
        self.now.load(Ordering::SeqCst)
    }
}

impl<C: Clock + ?Sized> Clock for Arc<C> {
    fn now_ms(&self) -> u64 {
        (**self).now_ms()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_clones_share_time() {
        let a = ManualClock::new(1_000);
        let b = a.clone();
        assert_eq!(b.advance(250), 1_250);
        assert_eq!(a.now_ms(), 1_250);
        a.set(5);
        assert_eq!(b.now_ms(), 5);
    }
}
