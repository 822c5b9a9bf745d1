//! How the Redis store scales: decisions/s of `ShardedStore` over 1, 2 and 3 shards (each its
//! own `redis-server`), the Redis CPU each decision costs, and the Redis memory each key
//! takes per algorithm (`MEMORY USAGE`). docs/scaling.md turns these into a fleet plan.
//!
//! `cargo bench -p sluice-redis --bench scaling` (about a minute; `SLUICE_BENCH_SECS` sets the
//! seconds per throughput run, default 5). Prints markdown tables.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a bench fails loudly by design

mod common;

use std::time::Duration;

use common::NOW;
use sluice::{LimitSpec, Policy, StoreExt};
use sluice_redis::{RedisConfig, RedisStore, ShardedStore};
use sluice_testkit::RedisServer;

const KEYS: u64 = 100_000;
const CONCURRENCY: usize = 64;

async fn connect(server: &RedisServer) -> RedisStore {
    RedisStore::connect(RedisConfig::new(server.url()).timeout(Duration::from_secs(2)))
        .await
        .unwrap()
}

struct Throughput {
    rate: f64,
    p50: u64,
    p99: u64,
    redis_us_per_decision: f64,
    redis_cpu_us_per_decision: f64,
    per_shard: Vec<u64>,
}

async fn throughput(servers: &[RedisServer], secs: u64, policy: &Policy) -> Throughput {
    let mut shards = Vec::new();
    for s in servers {
        s.cmd(&["FLUSHALL"]).unwrap();
        shards.push(connect(s).await);
    }
    let store = ShardedStore::new(shards).unwrap();
    let before: Vec<(u64, u64)> = servers.iter().map(common::script_stats).collect();
    let cpu_before: f64 = servers.iter().map(common::cpu_seconds).sum();
    let (decisions, hist, elapsed) = common::load(store, policy, CONCURRENCY, secs, KEYS).await;
    let after: Vec<(u64, u64)> = servers.iter().map(common::script_stats).collect();
    let cpu = servers.iter().map(common::cpu_seconds).sum::<f64>() - cpu_before;
    let per_shard: Vec<u64> = after.iter().zip(&before).map(|(a, b)| a.0 - b.0).collect();
    let usec: u64 = after.iter().zip(&before).map(|(a, b)| a.1 - b.1).sum();
    Throughput {
        rate: decisions as f64 / elapsed,
        p50: hist.value_at_quantile(0.5),
        p99: hist.value_at_quantile(0.99),
        redis_us_per_decision: usec as f64 / decisions as f64,
        redis_cpu_us_per_decision: cpu * 1e6 / decisions as f64,
        per_shard,
    }
}

fn used_memory(server: &RedisServer) -> i64 {
    server
        .info_field("memory", "used_memory")
        .unwrap()
        .unwrap()
        .parse()
        .unwrap()
}

/// Bytes per key of `policy`: `MEMORY USAGE` summed over the key's Redis keys (averaged over
/// a sample), and `used_memory` growth per key (which adds the keyspace's own overhead).
/// `touches` checks per key, spread `step_ms` apart (to fill a sliding window's buckets).
async fn memory_per_key(
    server: &RedisServer,
    policy: &Policy,
    keys: u64,
    touches: u64,
    step_ms: u64,
) -> (f64, f64) {
    server.cmd(&["FLUSHALL"]).unwrap();
    let store = connect(server).await;
    let baseline = used_memory(server);
    let prefix = store.key_prefix().to_owned();
    let mut futures = Vec::new();
    for k in 0..keys {
        let (store, policy) = (store.clone(), policy.clone());
        futures.push(tokio::spawn(async move {
            for t in 0..touches {
                store
                    .check(&policy, &format!("user:{k}"), 1, NOW + t * step_ms)
                    .await
                    .unwrap();
            }
        }));
        if futures.len() >= 256 {
            for f in futures.drain(..) {
                f.await.unwrap();
            }
        }
    }
    for f in futures {
        f.await.unwrap();
    }
    let grown = used_memory(server) - baseline;
    let mut sampled = 0u64;
    let sample = 200.min(keys);
    for k in 0..sample {
        for redis_key in
            sluice_redis::keys::policy_keys(&prefix, policy, &format!("user:{k}"), "1000")
        {
            match server
                .cmd(&["MEMORY", "USAGE", &redis_key, "SAMPLES", "0"])
                .unwrap()
            {
                redis::Value::Int(n) => sampled += n as u64,
                other => panic!("MEMORY USAGE {redis_key}: {other:?}"),
            }
        }
    }
    (sampled as f64 / sample as f64, grown as f64 / keys as f64)
}

fn main() {
    let Some(secs) = sluice_testkit::bench_seconds(5) else {
        return;
    };
    let servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::start().unwrap()).collect();
    let rt = common::runtime();

    println!(
        "## Throughput: 1 fixed-window limit, {KEYS} keys uniform, {CONCURRENCY} tasks, {secs} s\n"
    );
    println!(
        "| shards | decisions/s | vs 1 shard | p50 µs | p99 µs | script µs/decision | Redis CPU µs/decision | decisions per shard |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---|");
    let one_limit = Policy::from_specs(
        "bench",
        vec![LimitSpec::fixed_window(1_000_000_000, 60_000)],
    )
    .unwrap();
    let mut one = None;
    for n in 1..=3 {
        let t = rt.block_on(throughput(&servers[..n], secs, &one_limit));
        let base = *one.get_or_insert(t.rate);
        println!(
            "| {n} | {:.0} | {:.2} | {} | {} | {:.1} | {:.1} | {:?} |",
            t.rate,
            t.rate / base,
            t.p50,
            t.p99,
            t.redis_us_per_decision,
            t.redis_cpu_us_per_decision,
            t.per_shard
        );
    }

    println!("\n## Limits per policy and algorithms, 1 shard\n");
    println!(
        "| policy | decisions/s | vs 1 fixed limit | p50 µs | p99 µs | script µs/decision | Redis CPU µs/decision |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|");
    let big = 1_000_000_000;
    let policies = [
        ("1 fixed_window", vec![LimitSpec::fixed_window(big, 60_000)]),
        (
            "3 fixed_window (1s, 1m, 1h)",
            vec![
                LimitSpec::fixed_window(big, 1_000),
                LimitSpec::fixed_window(big, 60_000),
                LimitSpec::fixed_window(big, 3_600_000),
            ],
        ),
        ("1 token_bucket", vec![LimitSpec::token_bucket(big, 60_000)]),
        (
            "1 sliding_window (60 buckets, 1 in use)",
            vec![LimitSpec::sliding_window(big, 60_000)],
        ),
    ];
    let mut first = None;
    for (label, specs) in policies {
        let policy = Policy::from_specs("bench", specs).unwrap();
        let t = rt.block_on(throughput(&servers[..1], secs, &policy));
        let base = *first.get_or_insert(t.rate);
        println!(
            "| {label} | {:.0} | {:.2} | {} | {} | {:.1} | {:.1} |",
            t.rate,
            t.rate / base,
            t.p50,
            t.p99,
            t.redis_us_per_decision,
            t.redis_cpu_us_per_decision,
        );
    }

    println!("\n## Redis memory per key\n");
    println!(
        "| policy | Redis keys per key | MEMORY USAGE bytes per key | used_memory growth per key |"
    );
    println!("|---|---:|---:|---:|");
    let cases: Vec<(&str, Vec<LimitSpec>, u64, u64, u64)> = vec![
        (
            "fixed_window 100/1m",
            vec![LimitSpec::fixed_window(100, 60_000)],
            10_000,
            1,
            0,
        ),
        (
            "token_bucket 100/1m",
            vec![LimitSpec::token_bucket(100, 60_000)],
            10_000,
            1,
            0,
        ),
        (
            "sliding_window 100/1m, 1 bucket used",
            vec![LimitSpec::sliding_window(100, 60_000)],
            10_000,
            1,
            0,
        ),
        (
            "sliding_window 100/1m, all 60 buckets used",
            vec![LimitSpec::sliding_window(100, 60_000)],
            2_000,
            60,
            1_000,
        ),
        (
            "3 limits: 10/s + 120/min + 240/h fixed",
            vec![
                LimitSpec::fixed_window(10, 1_000),
                LimitSpec::fixed_window(120, 60_000),
                LimitSpec::fixed_window(240, 3_600_000),
            ],
            10_000,
            1,
            0,
        ),
    ];
    for (label, specs, keys, touches, step) in cases {
        let policy = Policy::from_specs("m", specs).unwrap();
        let (usage, grown) = rt.block_on(memory_per_key(&servers[0], &policy, keys, touches, step));
        println!(
            "| {label} | {} | {usage:.0} | {grown:.0} |",
            policy.limits().len()
        );
    }
}
