//! The library's clock: the operating system's wall clock, read at the price of a CPU counter.
//!
//! The core never reads a clock ([`sluice_core::Clock`]); a [`crate::Limiter`] reads this one
//! (or the one it is given) once per call and hands `now` to the store.
//!
//! Asking the OS for the wall clock (`clock_gettime`) costs about 110 instructions, a third of
//! what the rest of a memory-store decision costs. So [`SystemClock`] asks it once a second
//! and, in between, adds what a monotonic counter has measured since: the CPU's time-stamp
//! counter read through `quanta` (what governor reads), or the OS's monotonic clock where the
//! counter is not reliable. It agrees with the wall clock to within the counter's drift over a
//! second (microseconds); when the wall clock is stepped (someone sets the time) it follows
//! within a second. Like the wall clock it may go back, by such a step or by a millisecond when
//! it re-reads the wall clock; the algorithms take `now` as given and allow for that.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use sluice_core::Clock;

/// How often the wall clock is read again, in ns of the counter.
const ANCHOR_EVERY_NS: u64 = 1_000_000_000;

/// The operating system's wall clock, read through a CPU counter between readings of it once
/// a second (see [the module docs](self)). Every `SystemClock` of a process shares one
/// reading; the first use calibrates the counter (a few milliseconds at most).
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    #[inline]
    fn now_ms(&self) -> u64 {
        static ANCHOR: OnceLock<Anchor> = OnceLock::new();
        let anchor = ANCHOR.get_or_init(Anchor::new);
        anchor.read(anchor.elapsed_ns(), wall_ns) / 1_000_000
    }
}

/// The wall clock as last read, against the counter.
struct Anchor {
    counter: quanta::Clock,
    /// The counter's raw reading when the anchor was made: time is counted from it.
    origin: u64,
    /// The wall clock minus the counter's time since `origin`, in ns (wrapping).
    offset_ns: AtomicU64,
    /// The counter's time since `origin` from which the wall clock is read again.
    next_ns: AtomicU64,
}

impl Anchor {
    fn new() -> Self {
        let counter = quanta::Clock::new();
        let origin = counter.raw();
        Self::at(counter, origin)
    }

    fn at(counter: quanta::Clock, origin: u64) -> Self {
        Self {
            counter,
            origin,
            offset_ns: AtomicU64::new(0),
            // Read the wall clock on the first reading.
            next_ns: AtomicU64::new(0),
        }
    }

    /// The counter's time since the anchor was made, in ns.
    #[inline]
    fn elapsed_ns(&self) -> u64 {
        self.counter.delta_as_nanos(self.origin, self.counter.raw())
    }

    /// The wall clock in ns since the epoch, `elapsed` ns of the counter after the anchor was
    /// made; `wall` reads the real one when it is due. The two stores need no ordering: a
    /// reader that sees one of them new and the other old is off by the drift of a second.
    #[inline]
    fn read(&self, elapsed: u64, wall: impl FnOnce() -> u64) -> u64 {
        if elapsed >= self.next_ns.load(Ordering::Relaxed) {
            return self.reanchor(elapsed, wall());
        }
        elapsed.wrapping_add(self.offset_ns.load(Ordering::Relaxed))
    }

    #[cold]
    fn reanchor(&self, elapsed: u64, wall: u64) -> u64 {
        self.offset_ns
            .store(wall.wrapping_sub(elapsed), Ordering::Relaxed);
        self.next_ns
            .store(elapsed.saturating_add(ANCHOR_EVERY_NS), Ordering::Relaxed);
        wall
    }
}

/// The OS's wall clock in ns since the epoch; a clock set before 1970 reads as the epoch
/// rather than failing a decision.
fn wall_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wall_ms() -> u64 {
        wall_ns() / 1_000_000
    }

    #[test]
    fn system_clock_reads_the_wall_clock() {
        // Bracketed by two readings of the OS's clock, give or take the millisecond the two
        // may round apart.
        for _ in 0..10_000 {
            let before = wall_ms();
            let ours = SystemClock.now_ms();
            let after = wall_ms();
            assert!(
                before.saturating_sub(1) <= ours && ours <= after + 1,
                "{before} <= {ours} <= {after}"
            );
        }
        assert!(SystemClock.now_ms() > 1_577_836_800_000);
    }

    #[test]
    fn the_wall_clock_is_read_again_every_second_of_the_counter() {
        let (counter, _mock) = quanta::Clock::mock();
        let anchor = Anchor::at(counter, 0);
        let s = 1_000_000_000;
        let never = || -> u64 { panic!("the wall clock was read before it was due") };
        assert_eq!(anchor.read(0, || 1_000 * s), 1_000 * s);
        // In between, the counter's time since the reading is added to it.
        assert_eq!(anchor.read(s / 2, never), 1_000 * s + s / 2);
        assert_eq!(anchor.read(s - 1, never), 1_000 * s + s - 1);
        // A second later it is read again: a step of the wall clock (here +1 000 s) is
        // followed from then on.
        assert_eq!(anchor.read(s, || 2_001 * s), 2_001 * s);
        assert_eq!(anchor.read(s + s / 4, never), 2_001 * s + s / 4);
        // A wall clock stepped back is followed too.
        assert_eq!(anchor.read(2 * s, || 500 * s), 500 * s);
        assert_eq!(anchor.read(2 * s + 7, never), 500 * s + 7);
    }
}
