//! Decisions per second on the memory store from 1 to 64 concurrent callers, on both cores:
//! a tokio multi-thread runtime of 2 workers, each caller a task looping over
//! `Limiter::call(...).await` (the path a server's request takes), yielding to the
//! scheduler every 16 decisions as a request task would between requests. Two loads: keys
//! spread uniformly over 100 000, and every caller on one hot key. The policy is a fixed window
//! of 10^9 per hour, so keys stay in the store (a token bucket that refills within a
//! millisecond would be swept and inserted again) and every decision is an admission, which
//! the bench checks.
//!
//! `cargo bench -p sluice --bench concurrent` (`SLUICE_BENCH_SECS`, default 3, sets the
//! seconds per point). The baseline is one caller in the same run: the curve must not fall as
//! callers are added. The machine is shared, so compare the ratios of one run only.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a bench fails loudly by design

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use sluice::{LimitSpec, Limiter, MemoryStore, Op, Policy};

const CALLERS: [usize; 7] = [1, 2, 4, 8, 16, 32, 64];
const KEYS: u64 = 100_000;
const YIELD_EVERY: u64 = 16;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    // `cargo test` runs benches with --test (smoke): one short point each.
    let smoke = !args.iter().any(|a| a == "--bench");
    let secs: f64 = std::env::var("SLUICE_BENCH_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3.0);
    let run_for = if smoke {
        Duration::from_millis(50)
    } else {
        Duration::from_secs_f64(secs)
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_time()
        .build()
        .expect("runtime");
    println!(
        "memory store, decisions/s by concurrent callers (tasks on 2 worker threads, {:.1} s a point)",
        run_for.as_secs_f64()
    );
    for (load, hot) in [("keys spread over 100 000", false), ("one hot key", true)] {
        let mut base = None;
        println!("  {load}:");
        for callers in CALLERS {
            let rate = rt.block_on(measure(callers, hot, run_for));
            let base = *base.get_or_insert(rate);
            println!(
                "    {callers:>3} callers  {:>11.0} decisions/s  {:>5.2} x one caller",
                rate,
                rate / base
            );
        }
    }
}

/// Decisions per second with `callers` tasks for `run_for`.
async fn measure(callers: usize, hot: bool, run_for: Duration) -> f64 {
    let policy =
        Policy::from_specs("bench", vec![LimitSpec::token_bucket(1_000_000_000, 1_000)]).unwrap();
    let limiter = Arc::new(Limiter::new(MemoryStore::new()).with_policy(policy.clone()));
    let keys: Arc<Vec<String>> = Arc::new((0..KEYS).map(|i| format!("user:{i}")).collect());
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let tasks: Vec<_> = (0..callers)
        .map(|c| {
            let (limiter, policy, keys, stop) =
                (limiter.clone(), policy.clone(), keys.clone(), stop.clone());
            tokio::spawn(async move {
                let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ (c as u64 + 1);
                let mut done = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    for _ in 0..YIELD_EVERY {
                        // xorshift64: a key per decision, different for every caller.
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        let key = if hot {
                            &keys[0]
                        } else {
                            &keys[(x % KEYS) as usize]
                        };
                        let d = limiter
                            .call(&policy, key, Op::Check { cost: 1 })
                            .await
                            .unwrap();
                        assert!(d.allowed && !d.is_degraded(), "{d:?}");
                        done += 1;
                    }
                    tokio::task::yield_now().await;
                }
                done
            })
        })
        .collect();
    tokio::time::sleep(run_for).await;
    stop.store(true, Ordering::Relaxed);
    let mut total = 0u64;
    for t in tasks {
        total += t.await.unwrap();
    }
    total as f64 / started.elapsed().as_secs_f64()
}
