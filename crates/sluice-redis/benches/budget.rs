//! Reservation sized by the error budget: Redis calls per decision and admission error, on
//! two hosts (two `Reserving` layers, each with its own connection) sharing one Redis, for
//! three loads, each inside one window of a fixed window of 1 h (the clock does not move, so
//! every unit leased and not handed out by the end counts as lost: the worst case of a window
//! that closes right then):
//!
//! - *under the limit*: one hot key, max 20,000, 15,000 checks (all can be admitted: what
//!   the leases still hold at the end is what a window closing then would lose);
//! - *mixed*: one hot key, max 20,000, 30,000 checks (2/3 can be admitted);
//! - *overload*: one hot key, max 20,000, 200,000 checks (10×);
//! - *Zipf*: 200,000 checks over 20,000 keys, Zipf(s = 1), max 100 per key.
//!
//! Each load runs with `max_error` 0.1 % (the old fixed cap of the auto batch) and 1 % (the
//! default). The error is `ideal - admitted` summed over keys, where the ideal is
//! `min(max, offered)`, as a fraction of the summed ideal; admitting more than `max` would be
//! reported as over-admission and never happens (leases are recorded in Redis).
//!
//! `cargo bench -p sluice-redis --bench budget` (about 30 s).

#![allow(clippy::unwrap_used, clippy::expect_used)] // a bench fails loudly by design

mod common;

use std::collections::HashMap;
use std::sync::Arc;

use common::NOW;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Zipf};
use sluice::{LimitSpec, Policy, ReserveConfig, Reserving, StoreExt};
use sluice_testkit::RedisServer;

const HOSTS: usize = 2;
const TASKS: usize = 8;

struct Load {
    name: &'static str,
    max: u64,
    checks: u64,
    /// None: one hot key; Some(n): Zipf over n keys.
    zipf_keys: Option<u64>,
}

struct Outcome {
    calls_per_decision: f64,
    admitted: u64,
    ideal: u64,
    over: u64,
    /// Units recorded in Redis beyond those admitted: leased and not handed out at the end.
    held: u64,
}

async fn run(server: &RedisServer, load: &Load, max_error: f64) -> Outcome {
    server.cmd(&["FLUSHALL"]).unwrap();
    let policy =
        Policy::from_specs("api", vec![LimitSpec::fixed_window(load.max, 3_600_000)]).unwrap();
    let mut hosts = Vec::new();
    for _ in 0..HOSTS {
        let store = common::connect(server).await;
        hosts.push(Arc::new(Reserving::new(
            store,
            ReserveConfig::default().max_error(max_error),
        )));
    }
    let before = server.command_calls("fcall").unwrap();
    let per_task = load.checks / (HOSTS * TASKS) as u64;
    let mut tasks = Vec::new();
    for (h, host) in hosts.iter().enumerate() {
        for t in 0..TASKS {
            let (host, policy) = (host.clone(), policy.clone());
            let zipf = load.zipf_keys.map(|n| Zipf::new(n as f64, 1.0).unwrap());
            tasks.push(tokio::spawn(async move {
                let mut rng = SmallRng::seed_from_u64((h * 100 + t) as u64);
                let mut seen: HashMap<u64, (u64, u64)> = HashMap::new();
                for _ in 0..per_task {
                    let k = zipf.as_ref().map_or(0, |z| z.sample(&mut rng) as u64);
                    let _ = rng.random::<u8>();
                    let d = host
                        .check(&policy, &format!("k:{k}"), 1, NOW)
                        .await
                        .unwrap();
                    let e = seen.entry(k).or_default();
                    e.0 += u64::from(d.allowed);
                    e.1 += 1;
                }
                seen
            }));
        }
    }
    let mut per_key: HashMap<u64, (u64, u64)> = HashMap::new();
    for t in tasks {
        for (k, (a, o)) in t.await.unwrap() {
            let e = per_key.entry(k).or_default();
            e.0 += a;
            e.1 += o;
        }
    }
    let calls = server.command_calls("fcall").unwrap() - before;
    let mut recorded = 0;
    for k in per_key.keys() {
        let d = hosts[0]
            .inner()
            .peek(&policy, &format!("k:{k}"), 0, NOW)
            .await
            .unwrap();
        recorded += load.max - d.remaining();
    }
    let decisions: u64 = per_key.values().map(|v| v.1).sum();
    let admitted: u64 = per_key.values().map(|v| v.0).sum();
    let ideal: u64 = per_key.values().map(|v| v.1.min(load.max)).sum();
    let over: u64 = per_key.values().map(|v| v.0.saturating_sub(load.max)).sum();
    Outcome {
        calls_per_decision: calls as f64 / decisions as f64,
        admitted,
        ideal,
        over,
        held: recorded - admitted,
    }
}

fn main() {
    let Some((_, server, rt)) = common::start() else {
        return;
    };
    let loads = [
        Load {
            name: "under the limit: 1 hot key, 15,000 checks on max 20,000",
            max: 20_000,
            checks: 15_000,
            zipf_keys: None,
        },
        Load {
            name: "mixed: 1 hot key, 30,000 checks on max 20,000",
            max: 20_000,
            checks: 30_000,
            zipf_keys: None,
        },
        Load {
            name: "overload: 1 hot key, 200,000 checks on max 20,000",
            max: 20_000,
            checks: 200_000,
            zipf_keys: None,
        },
        Load {
            name: "Zipf: 200,000 checks over 20,000 keys, max 100 each",
            max: 100,
            checks: 200_000,
            zipf_keys: Some(20_000),
        },
    ];
    println!(
        "| load | max_error | Redis calls per decision | admitted | ideal | under-admitted (% of ideal) | over-admitted | leased, unused at the end |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    for load in &loads {
        for max_error in [0.001, 0.01] {
            let o = rt.block_on(run(&server, load, max_error));
            let under = o.ideal.saturating_sub(o.admitted);
            println!(
                "| {} | {:.1} % | {:.4} | {} | {} | {} ({:.2} %) | {} | {} |",
                load.name,
                max_error * 100.0,
                o.calls_per_decision,
                o.admitted,
                o.ideal,
                under,
                under as f64 * 100.0 / o.ideal as f64,
                o.over,
                o.held,
            );
        }
    }
}
