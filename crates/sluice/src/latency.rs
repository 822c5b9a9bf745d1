//! How long calls took over the last minute, for dashboards: a histogram of logarithmic
//! buckets per 10-second slice, six slices read together (a reading covers between 50 and 60
//! seconds). Recording is a load and an add on atomics, no lock: a slice whose 10 seconds
//! have come round again is cleared by the first call that finds it stale (a call counted
//! into it while it is being cleared may be lost: these are statistics, not accounts).
//!
//! Buckets: one per microsecond below 16 µs, then 16 per power of two, so a bucket's upper
//! bound is within 6.25 % of any value in it; up to about 2^40 µs (12 days).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The length of one slice.
pub const SLICE: Duration = Duration::from_secs(10);
/// Slices read together: the window is `SLICE * READ` (60 s), the current slice included.
pub const READ: u64 = 6;
/// The window a reading covers at most, in seconds.
pub const WINDOW_S: u64 = SLICE.as_secs() * READ;
/// Slices held: the read ones and the one being cleared next.
const SLICES: usize = READ as usize + 1;
const SUB: u64 = 16;
const BUCKETS: usize = 16 + 37 * 16;

/// A windowed latency histogram.
#[derive(Debug)]
pub struct LatencyWindow {
    base: Instant,
    slices: Box<[Slice]>,
}

#[derive(Debug)]
struct Slice {
    /// Which 10 seconds since `base` it holds (`u64::MAX`: none yet).
    epoch: AtomicU64,
    buckets: Box<[AtomicU64]>,
}

/// A reading: how many calls, and their median and 99th percentile.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Quantiles {
    /// Calls in the window.
    pub count: u64,
    /// The median, in milliseconds (the upper bound of its bucket); `None` without calls.
    pub p50_ms: Option<f64>,
    /// The 99th percentile, likewise.
    pub p99_ms: Option<f64>,
}

fn bucket(micros: u64) -> usize {
    if micros < SUB {
        return micros as usize;
    }
    let e = u64::from(63 - micros.leading_zeros());
    let sub = (micros >> (e - 4)) & (SUB - 1);
    (SUB + (e - 4) * SUB + sub).min(BUCKETS as u64 - 1) as usize
}

/// The upper bound of bucket `i`, in microseconds.
fn upper(i: usize) -> u64 {
    let i = i as u64;
    if i < SUB {
        return i + 1;
    }
    let e = (i - SUB) / SUB + 4;
    let sub = (i - SUB) % SUB;
    (SUB + sub + 1) << (e - 4)
}

impl Default for LatencyWindow {
    fn default() -> Self {
        Self::new()
    }
}

impl LatencyWindow {
    /// An empty window, its slices counted from now.
    pub fn new() -> Self {
        Self {
            base: Instant::now(),
            slices: (0..SLICES)
                .map(|_| Slice {
                    epoch: AtomicU64::new(u64::MAX),
                    buckets: (0..BUCKETS).map(|_| AtomicU64::new(0)).collect(),
                })
                .collect(),
        }
    }

    fn epoch(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.base).as_secs() / SLICE.as_secs()
    }

    /// Records a call that started at `started` and took `took`.
    pub fn record(&self, started: Instant, took: Duration) {
        let epoch = self.epoch(started);
        let slice = &self.slices[(epoch % SLICES as u64) as usize];
        let seen = slice.epoch.load(Ordering::Acquire);
        if seen != epoch {
            if seen != u64::MAX && seen > epoch {
                // A call that started long before it was recorded: its slice is gone.
                return;
            }
            if slice
                .epoch
                .compare_exchange(seen, epoch, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                for b in slice.buckets.iter() {
                    b.store(0, Ordering::Relaxed);
                }
            }
        }
        let micros = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
        slice.buckets[bucket(micros)].fetch_add(1, Ordering::Relaxed);
    }

    /// The calls of the last [`WINDOW_S`] seconds (at least 50) before `now`.
    pub fn read(&self, now: Instant) -> Quantiles {
        let epoch = self.epoch(now);
        let mut sum = vec![0u64; BUCKETS];
        for slice in self.slices.iter() {
            let e = slice.epoch.load(Ordering::Acquire);
            if e == u64::MAX || e > epoch || epoch - e >= READ {
                continue;
            }
            for (s, b) in sum.iter_mut().zip(slice.buckets.iter()) {
                *s += b.load(Ordering::Relaxed);
            }
        }
        let count: u64 = sum.iter().sum();
        let at = |q: f64| -> Option<f64> {
            if count == 0 {
                return None;
            }
            // The rank of the quantile, 1-based, rounded up.
            let rank = ((count as f64 * q).ceil() as u64).clamp(1, count);
            let mut seen = 0u64;
            for (i, n) in sum.iter().enumerate() {
                seen += n;
                if seen >= rank {
                    return Some(upper(i) as f64 / 1_000.0);
                }
            }
            None
        };
        Quantiles {
            count,
            p50_ms: at(0.5),
            p99_ms: at(0.99),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn every_bucket_bound_is_within_a_sixteenth_of_its_values() {
        for micros in (1..2_000_000u64).step_by(7).chain([u64::MAX / 4]) {
            let i = bucket(micros);
            let up = upper(i);
            assert!(up > micros || i == BUCKETS - 1, "{micros} -> {i} ({up})");
            if i < BUCKETS - 1 {
                assert!(
                    up as f64 <= micros as f64 * 1.0625 + 1.0,
                    "{micros} -> {up}"
                );
            }
            if i > 0 {
                assert!(
                    upper(i - 1) <= micros,
                    "{micros}: the bucket below holds it"
                );
            }
        }
    }

    #[test]
    fn quantiles_come_from_the_window_only() {
        let w = LatencyWindow::new();
        let t0 = w.base;
        // 98 fast calls (100 µs), 2 slow ones (50 ms).
        for _ in 0..98 {
            w.record(t0, Duration::from_micros(100));
        }
        for _ in 0..2 {
            w.record(t0, Duration::from_millis(50));
        }
        let q = w.read(t0);
        assert_eq!(q.count, 100);
        let p50 = q.p50_ms.unwrap();
        assert!((0.1..=0.1063).contains(&p50), "{p50}");
        let p99 = q.p99_ms.unwrap();
        assert!((50.0..=53.2).contains(&p99), "{p99}");
        // 55 s later the calls are still in the window; 65 s later they are not, and a new
        // call in a slice that comes round again does not count the old ones.
        assert_eq!(w.read(t0 + Duration::from_secs(55)).count, 100);
        assert_eq!(w.read(t0 + Duration::from_secs(65)).count, 0);
        w.record(t0 + Duration::from_secs(70), Duration::from_micros(5));
        let q = w.read(t0 + Duration::from_secs(70));
        assert_eq!(q.count, 1);
        assert_eq!(q.p99_ms, Some(0.006));
        assert_eq!(LatencyWindow::new().read(t0).p50_ms, None);
    }
}
