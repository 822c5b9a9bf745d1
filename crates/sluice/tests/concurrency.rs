//! Exactness under contention: many OS threads on one key admit exactly `max`.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use sluice::{LimitSpec, Limiter, ManualClock, MemoryStore, Policy};

const THREADS: usize = 8;
const CHECKS_PER_THREAD: usize = 10_000;
const MAX: u64 = 1_000;

fn admitted_by_threads(spec: LimitSpec) -> u64 {
    let policy = Policy::from_specs("hot", vec![spec]).expect("valid policy");
    // The clock stands still, so no window closes and no token refills during the run.
    let limiter = Arc::new(
        Limiter::new(MemoryStore::new())
            .with_clock(ManualClock::new(1_700_000_000_000))
            .with_policy(policy),
    );
    let admitted = Arc::new(AtomicU64::new(0));
    let threads: Vec<_> = (0..THREADS)
        .map(|_| {
            let limiter = limiter.clone();
            let admitted = admitted.clone();
            std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .build()
                    .expect("runtime");
                rt.block_on(async {
                    for _ in 0..CHECKS_PER_THREAD {
                        let d = limiter
                            .check("hot", "the-key", 1)
                            .await
                            .expect("memory store");
                        if d.allowed {
                            admitted.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                });
            })
        })
        .collect();
    for t in threads {
        t.join().expect("thread");
    }
    admitted.load(Ordering::Relaxed)
}

#[test]
fn fixed_window_admits_exactly_max_under_contention() {
    assert_eq!(
        admitted_by_threads(LimitSpec::fixed_window(MAX, 60_000)),
        MAX
    );
}

#[test]
fn sliding_window_admits_exactly_max_under_contention() {
    assert_eq!(
        admitted_by_threads(LimitSpec::sliding_window(MAX, 60_000)),
        MAX
    );
}

#[test]
fn token_bucket_admits_exactly_max_under_contention() {
    assert_eq!(
        admitted_by_threads(LimitSpec::token_bucket(MAX, 60_000)),
        MAX
    );
}
