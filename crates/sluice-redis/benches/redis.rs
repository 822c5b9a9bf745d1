//! Decisions per second of `RedisStore::check` against one local Redis, at concurrency 1, 16
//! and 64, for both ways of loading the code (Function library, EVALSHA), and in the same run
//! `redis-benchmark` sending the very same FCALL as the physical baseline.
//!
//! Then **Redis CPU per decision** by algorithm: `redis-benchmark` sends the store's own
//! `FCALL` for a policy of each kind, and, in the same run, the smallest script a rate limiter
//! can be (`EVALSHA` of `INCR` + `PEXPIRE`), and Redis's own accounting (INFO commandstats,
//! `usec` per call, which includes the commands the script runs) gives the CPU of each.
//!
//! `cargo bench -p sluice-redis --bench redis` (about a minute and a half; `SLUICE_BENCH_SECS`
//! sets the seconds per measurement, default 5). Prints markdown tables for
//! docs/benchmarks.md.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a bench fails loudly by design

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::NOW;
use hdrhistogram::Histogram;
use sluice::{LimitSpec, Policy};
use sluice_redis::{RedisConfig, RedisStore, ScriptMode};
use sluice_testkit::RedisServer;

const KEYS: u64 = 10_000;

fn policy() -> Policy {
    Policy::from_specs(
        "bench",
        vec![LimitSpec::fixed_window(1_000_000_000, 60_000)],
    )
    .unwrap()
}

struct Run {
    decisions: u64,
    secs: f64,
    hist: Histogram<u64>,
    top_level_per_decision: f64,
    all_per_decision: f64,
    server_us_per_decision: f64,
}

async fn run_sluice(server: &RedisServer, mode: ScriptMode, concurrency: usize, secs: u64) -> Run {
    let store = Arc::new(
        RedisStore::connect(
            RedisConfig::new(server.url())
                .script_mode(mode)
                .timeout(Duration::from_secs(2)),
        )
        .await
        .unwrap(),
    );
    let policy = policy();
    let before = server.command_stats().unwrap();
    let (decisions, hist, secs) = common::load(store, &policy, concurrency, secs, KEYS).await;
    let after = server.command_stats().unwrap();
    let delta = |name: &str| {
        let now = after.get(name).copied().unwrap_or_default();
        now.since(before.get(name).copied().unwrap_or_default())
    };
    let scripts = ["fcall", "evalsha", "eval"].map(delta);
    let top: u64 = scripts.iter().map(|d| d.calls).sum();
    let usec: u64 = scripts.iter().map(|d| d.usec).sum();
    let all: u64 = after
        .keys()
        .filter(|k| k.as_str() != "info")
        .map(|k| delta(k).calls)
        .sum();
    Run {
        decisions,
        secs,
        hist,
        top_level_per_decision: top as f64 / decisions as f64,
        all_per_decision: all as f64 / decisions as f64,
        server_us_per_decision: usec as f64 / top.max(1) as f64,
    }
}

/// Runs redis-benchmark with the store's own command; returns (requests/s, p50 ms, p99 ms).
fn run_baseline(
    server: &RedisServer,
    command: &[String],
    concurrency: usize,
    requests: u64,
) -> (f64, f64, f64) {
    let out = std::process::Command::new("redis-benchmark")
        .args(["-h", "127.0.0.1", "-p", &server.port().to_string()])
        .args([
            "-c",
            &concurrency.to_string(),
            "-n",
            &requests.to_string(),
            "-r",
            &KEYS.to_string(),
        ])
        .arg("--csv")
        .args(command)
        .output()
        .expect("redis-benchmark (package redis-tools)");
    let text = String::from_utf8_lossy(&out.stdout);
    // "test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms","p95_latency_ms","p99_latency_ms","max_latency_ms"
    let line = text.lines().last().unwrap_or_default().replace('"', "");
    let f: Vec<&str> = line.split(',').collect();
    let n = |i: usize| {
        f.get(f.len().saturating_sub(8 - i))
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(f64::NAN)
    };
    (n(1), n(4), n(6))
}

/// The smallest script a rate limiter can be: count, and let the key expire with its window.
const MINIMAL_SCRIPT: &str =
    "local n = redis.call('INCR', KEYS[1]) redis.call('PEXPIRE', KEYS[1], 60000) return n";

/// Redis's CPU per call of `command` (µs, INFO commandstats: the script and every command it
/// runs), sent by `redis-benchmark` at concurrency 16 over 10 000 keys.
fn redis_cpu_per_call(server: &RedisServer, command: &[String], calls: u64) -> f64 {
    server.cmd(&["FLUSHALL"]).unwrap();
    server.cmd(&["CONFIG", "RESETSTAT"]).unwrap();
    run_baseline(server, command, 16, calls);
    let stats = server.command_stats().unwrap();
    let (n, usec) = ["fcall", "evalsha"]
        .iter()
        .filter_map(|c| stats.get(*c))
        .fold((0, 0), |(n, u), c| (n + c.calls, u + c.usec));
    assert!(n >= calls, "{n} script calls counted, {calls} sent");
    usec as f64 / n as f64
}

/// The Redis CPU table: each algorithm's check against the minimal script, measured
/// alternately `rounds` times; the median of each is reported.
fn redis_cpu_table(rt: &tokio::runtime::Runtime, server: &RedisServer, calls: u64, rounds: usize) {
    let store = rt
        .block_on(RedisStore::connect(RedisConfig::new(server.url())))
        .unwrap();
    let sha = match server.cmd(&["SCRIPT", "LOAD", MINIMAL_SCRIPT]).unwrap() {
        redis::Value::BulkString(b) => String::from_utf8(b).unwrap(),
        other => panic!("SCRIPT LOAD answered {other:?}"),
    };
    let minimal: Vec<String> = ["EVALSHA", &sha, "1", "bench:__rand_int__"]
        .map(str::to_owned)
        .to_vec();
    let big = 1_000_000_000;
    let cases: Vec<(&str, Policy)> = vec![
        ("fixed_window", policy()),
        (
            "fixed_window, aligned (Envoy's)",
            Policy::from_specs("b", vec![LimitSpec::fixed_window(big, 60_000).aligned()]).unwrap(),
        ),
        (
            "token_bucket",
            Policy::from_specs("b", vec![LimitSpec::token_bucket(big, 60_000)]).unwrap(),
        ),
        (
            "sliding_window (60 buckets)",
            Policy::from_specs("b", vec![LimitSpec::sliding_window(big, 60_000)]).unwrap(),
        ),
        (
            "3 limits (1 s, 1 min, 1 h fixed)",
            Policy::from_specs(
                "b",
                vec![
                    LimitSpec::fixed_window(big, 1_000),
                    LimitSpec::fixed_window(big, 60_000),
                    LimitSpec::fixed_window(big, 3_600_000),
                ],
            )
            .unwrap(),
        ),
    ];
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let mut base = Vec::new();
    let mut each: Vec<Vec<f64>> = vec![Vec::new(); cases.len()];
    for _ in 0..rounds {
        base.push(redis_cpu_per_call(server, &minimal, calls));
        for (i, (_, p)) in cases.iter().enumerate() {
            let command = store.check_command(p, "bench:__rand_int__", 1, NOW);
            each[i].push(redis_cpu_per_call(server, &command, calls));
        }
    }
    let base = median(base);
    println!();
    println!(
        "Redis CPU per decision (INFO commandstats, median of {rounds} alternating runs of {calls} calls, redis-benchmark -c 16 -r 10000):"
    );
    println!();
    println!("| check | Redis µs/decision | × minimal script |");
    println!("|---|---:|---:|");
    println!("| minimal script (EVALSHA of INCR + PEXPIRE), the baseline | {base:.2} | 1.00 |");
    for ((name, _), v) in cases.iter().zip(each) {
        let us = median(v);
        println!("| {name} | {us:.2} | {:.2} |", us / base);
    }
}

fn main() {
    if !sluice_testkit::require_redis() {
        return;
    }
    let args: Vec<String> = std::env::args().collect();
    if args.iter().any(|a| a == "--list" || a == "--test") || !args.iter().any(|a| a == "--bench") {
        return; // listed or smoke-tested by a test runner: nothing to measure
    }
    let secs: u64 = std::env::var("SLUICE_BENCH_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5);
    let server = RedisServer::start().unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();

    // `SLUICE_BENCH_ONLY=cpu`: the Redis CPU table alone.
    if std::env::var("SLUICE_BENCH_ONLY").as_deref() == Ok("cpu") {
        redis_cpu_table(&rt, &server, 200_000, 3);
        return;
    }
    println!(
        "| concurrency | mode | decisions/s | p50 µs | p99 µs | scripts/decision | all commands/decision | server µs/decision | baseline redis-benchmark req/s | baseline p50 µs | baseline p99 µs | ratio |"
    );
    println!("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for concurrency in [1usize, 16, 64] {
        let mut baseline = None;
        for mode in [ScriptMode::Function, ScriptMode::EvalSha] {
            server.cmd(&["FLUSHALL"]).unwrap();
            let run = rt.block_on(run_sluice(&server, mode, concurrency, secs));
            let rate = run.decisions as f64 / run.secs;
            let (base_rate, base_p50, base_p99) = *baseline.get_or_insert_with(|| {
                // The same FCALL as the store sends, with the key randomised the same way.
                let store = rt
                    .block_on(RedisStore::connect(RedisConfig::new(server.url())))
                    .unwrap();
                let command = store.check_command(&policy(), "bench:__rand_int__", 1, NOW);
                server.cmd(&["FLUSHALL"]).unwrap();
                run_baseline(
                    &server,
                    &command,
                    concurrency,
                    (rate * secs as f64) as u64 + 1_000,
                )
            });
            println!(
                "| {concurrency} | {mode:?} | {rate:.0} | {} | {} | {:.2} | {:.2} | {:.1} | {base_rate:.0} | {:.0} | {:.0} | {:.2} |",
                run.hist.value_at_quantile(0.50),
                run.hist.value_at_quantile(0.99),
                run.top_level_per_decision,
                run.all_per_decision,
                run.server_us_per_decision,
                base_p50 * 1000.0,
                base_p99 * 1000.0,
                rate / base_rate,
            );
        }
    }
    redis_cpu_table(&rt, &server, 200_000, 3);
}
