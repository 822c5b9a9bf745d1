//! Over-admission of the regions store against replication lag and refresh.
//!
//! Three regions on loopback (a primary each, and in each region a replica of the other two
//! behind a delaying proxy); every region checks one key at a steady 100 requests a second
//! against a limit of 100 per second (fixed window), so together they ask for 3× the limit.
//! For each refresh interval and replication delay, it prints the worst and mean global
//! admissions per whole window, the over-admission above `max`, and the stated bound
//! `(regions − 1) × rate × (lag + refresh)` with the lag and view age seen.
//!
//! ```text
//! cargo run --release -p sluice-redis --example regions_bench [seconds per cell]
//! ```
//!
//! Needs `redis-server` on `PATH`. The machine may be shared: the figures are what this run
//! saw, not a property of the hardware.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a benchmark fails loudly

#[path = "../tests/regions_support/mod.rs"]
mod regions_support;

use std::time::Duration;

use regions_support::{Settings, World, steady};
use sluice::{LimitSpec, Policy};
use sluice_redis::Fallback;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let seconds: u64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(5);
    let max = 100;
    let policy = Policy::from_specs("api", vec![LimitSpec::fixed_window(max, 1_000)]).unwrap();
    println!(
        "regions store: 3 regions, each 100 checks/s on one key, limit {max} per 1 s (fixed window), {seconds} s per row"
    );
    println!(
        "{:>8} {:>8} {:>9} {:>9} {:>8} {:>8} {:>10} {:>10} {:>12}",
        "refresh",
        "delay",
        "lag seen",
        "view age",
        "worst",
        "mean",
        "over max",
        "bound",
        "independent"
    );
    for refresh in [50u64, 100, 250] {
        let world = World::start(Settings::new(refresh, 5_000, Fallback::LocalShare)).await;
        for delay in [0u64, 100, 250, 500] {
            world.set_delay(Duration::from_millis(delay));
            // The first window after a delay change is a transition: let one pass.
            let warm = steady(
                &world,
                &policy,
                &format!("warm:{refresh}:{delay}"),
                Duration::from_millis(10),
                Duration::from_millis(1_200),
            )
            .await;
            drop(warm);
            let run = steady(
                &world,
                &policy,
                &format!("bench:{refresh}:{delay}"),
                Duration::from_millis(10),
                Duration::from_secs(seconds),
            )
            .await;
            let windows = run.whole_windows();
            let worst = windows.iter().map(|&(_, a)| a).max().unwrap_or(0);
            let mean =
                windows.iter().map(|&(_, a)| a as f64).sum::<f64>() / windows.len().max(1) as f64;
            let view_age = run.max_view_age.max(world.settings.refresh);
            let bound = 2.0 * run.rate_per_region * (run.max_lag + view_age).as_secs_f64();
            // Three regions deciding alone would each admit up to max.
            let independent = (3 * max).min((3.0 * run.rate_per_region) as u64);
            println!(
                "{:>6}ms {:>6}ms {:>7}ms {:>7}ms {:>8} {:>8.1} {:>10} {:>10.1} {:>12}",
                refresh,
                delay,
                run.max_lag.as_millis(),
                run.max_view_age.as_millis(),
                worst,
                mean,
                worst.saturating_sub(max),
                bound,
                independent,
            );
            assert_eq!(
                (run.errors, run.degraded),
                (0, 0),
                "every decision by the store"
            );
        }
    }
    println!(
        "worst/mean: global admissions per whole window; over max = worst − {max}; bound = 2 × rate × (lag seen + max(refresh, view age)); independent = what 3 regions each with its own Redis would admit"
    );
}
