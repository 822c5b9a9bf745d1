//! What a concurrency lease costs Redis: server CPU (INFO commandstats, `usec` per `FCALL`,
//! which includes the commands the function runs) per acquire and per release, and per check
//! of a fixed window in the same run as the baseline, with 0, 10, 100 and 1 000 other leases
//! already held on the key (a lease decision reads the key's whole hash of leases).
//!
//! `cargo bench -p sluice-redis --bench leases` (about half a minute). Prints a markdown table
//! for docs/benchmarks.md.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a bench fails loudly by design

mod common;

use common::NOW;
use sluice::{Call, LimitSpec, Op, Policy, Store};
use sluice_redis::RedisStore;
use sluice_testkit::{CommandStats, RedisServer};

const CALLS: u64 = 5_000;

/// FCALL's calls and server time so far.
fn fcall_stats(server: &RedisServer) -> CommandStats {
    let stats = server.command_stats().unwrap();
    stats.get("fcall").copied().unwrap_or_default()
}

/// Runs `ops` in order through the store and returns the Redis µs per call they cost.
async fn cpu_per_call(
    server: &RedisServer,
    store: &RedisStore,
    policy: &Policy,
    ops: &[Op],
) -> f64 {
    let before = fcall_stats(server);
    for op in ops {
        store
            .call(Call::new(policy, "bench", *op, NOW))
            .await
            .unwrap();
    }
    fcall_stats(server).since(before).usec_per_call()
}

fn main() {
    if sluice_testkit::bench_seconds(5).is_none() {
        return;
    }
    let server = RedisServer::start().unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let store = rt.block_on(common::connect(&server));
    let leases =
        Policy::from_specs("leases", vec![LimitSpec::concurrency(1 << 40, 600_000)]).unwrap();
    let fixed =
        Policy::from_specs("fixed", vec![LimitSpec::fixed_window(1 << 40, 600_000)]).unwrap();

    println!(
        "| leases held on the key | acquire µs | release µs | check of a fixed window µs (baseline) | acquire / check |"
    );
    println!("|---:|---:|---:|---:|---:|");
    for held in [0u64, 10, 100, 1_000] {
        server.cmd(&["FLUSHALL"]).unwrap();
        rt.block_on(async {
            // The other holders, which every decision on the key reads past.
            for id in 0..held {
                store
                    .call(Call::new(
                        &leases,
                        "bench",
                        Op::Hold {
                            cost: 1,
                            lease: u64::MAX - id,
                        },
                        NOW,
                    ))
                    .await
                    .unwrap();
            }
            let holds: Vec<Op> = (1..=CALLS)
                .map(|lease| Op::Hold { cost: 1, lease })
                .collect();
            let releases: Vec<Op> = (1..=CALLS).map(|lease| Op::Release { lease }).collect();
            // Hold and release in turn, so the key keeps `held` (+1) leases throughout.
            let mut acquire = 0.0;
            let mut release = 0.0;
            for (h, r) in holds.chunks(1).zip(releases.chunks(1)) {
                acquire += cpu_per_call(&server, &store, &leases, h).await;
                release += cpu_per_call(&server, &store, &leases, r).await;
            }
            let checks = vec![Op::Check { cost: 1 }; CALLS as usize];
            let check = cpu_per_call(&server, &store, &fixed, &checks).await;
            let (acquire, release) = (acquire / CALLS as f64, release / CALLS as f64);
            println!(
                "| {held} | {acquire:.2} | {release:.2} | {check:.2} | {:.1}× |",
                acquire / check
            );
        });
    }
}
