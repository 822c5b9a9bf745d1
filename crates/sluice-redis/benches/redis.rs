//! Decisions per second of `RedisStore::check` against one local Redis, at concurrency 1, 16
//! and 64, for both ways of loading the code (Function library, EVALSHA), and in the same run
//! `redis-benchmark` sending the very same FCALL as the physical baseline.
//!
//! Then **Redis CPU per decision** by algorithm, against the smallest script a rate limiter
//! can be (`EVALSHA` of `INCR` + `PEXPIRE`) measured the same way in the same round: a single
//! call at c = 1 (`redis-benchmark` replays the store's own command; INFO commandstats `usec`
//! per call, which includes the commands the script runs), and coalesced at c = 16 and 64
//! (Sluice's own client; Redis's whole-process CPU per decision). Then the latency at c = 1
//! with coalescing on and off.
//!
//! `cargo bench -p sluice-redis --bench redis` (`SLUICE_BENCH_SECS` sets the seconds per
//! measurement, default 5; `SLUICE_BENCH_ROUNDS` the alternating rounds, default 3;
//! `SLUICE_BENCH_ONLY=cpu` the cost tables and the latency at c = 1 alone, `=latency` the
//! latency alone). Prints markdown tables for docs/benchmarks.md.

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

/// Redis's whole-process CPU so far (`used_cpu_sys + used_cpu_user`), in µs.
fn process_cpu_us(server: &RedisServer) -> f64 {
    common::cpu_seconds(server) * 1e6
}

/// `command` sent `calls` times by `redis-benchmark -c <concurrency>` over 10 000 keys, from
/// an empty Redis: (INFO commandstats µs per script call, whole-process CPU µs per call).
fn replayed(
    server: &RedisServer,
    command: &[String],
    concurrency: usize,
    calls: u64,
) -> (f64, f64) {
    server.cmd(&["FLUSHALL"]).unwrap();
    if std::env::var("SLUICE_BENCH_WARM").as_deref() == Ok("1") {
        // Keys warm, as the issue measured: every key's window opened before the count.
        run_baseline(server, command, concurrency, calls);
    }
    server.cmd(&["CONFIG", "RESETSTAT"]).unwrap();
    let cpu = process_cpu_us(server);
    run_baseline(server, command, concurrency, calls);
    let cpu = process_cpu_us(server) - cpu;
    let (n, usec) = common::script_stats(server);
    assert!(n >= calls, "{n} script calls counted, {calls} sent");
    (usec as f64 / n as f64, cpu / n as f64)
}

/// Sluice's own client (`RedisStore::check`, `concurrency` tasks, coalescing up to `coalesce`)
/// for `secs`: (whole-process CPU µs per decision, decisions per script call, decisions/s).
async fn through_the_client(
    server: &RedisServer,
    policy: &Policy,
    concurrency: usize,
    coalesce: usize,
    secs: u64,
) -> (f64, f64, f64) {
    server.cmd(&["FLUSHALL"]).unwrap();
    // Checks at the wall clock's now (fixed for the run, within half its 600 s margin of
    // Redis's clock, so fixed windows open as counters).
    let now = wall_ms();
    let store = RedisStore::connect(
        RedisConfig::new(server.url())
            .timeout(Duration::from_secs(2))
            .expiry_margin(Duration::from_secs(600))
            .coalesce(coalesce),
    )
    .await
    .unwrap();
    server.cmd(&["CONFIG", "RESETSTAT"]).unwrap();
    let cpu = process_cpu_us(server);
    let (decisions, _, elapsed) =
        common::load_at(store, policy, concurrency, secs, KEYS, now).await;
    let cpu = process_cpu_us(server) - cpu;
    let (calls, _) = common::script_stats(server);
    (
        cpu / decisions as f64,
        decisions as f64 / calls.max(1) as f64,
        decisions as f64 / elapsed,
    )
}

/// The policies of the cost tables: one of each kind, and three fixed windows.
fn cost_cases() -> Vec<(&'static str, Policy)> {
    let big = 1_000_000_000;
    let aligned =
        Policy::from_specs("b", vec![LimitSpec::fixed_window(big, 60_000).aligned()]).unwrap();
    let three = Policy::from_specs(
        "b",
        vec![
            LimitSpec::fixed_window(big, 1_000),
            LimitSpec::fixed_window(big, 60_000),
            LimitSpec::fixed_window(big, 3_600_000),
        ],
    )
    .unwrap();
    vec![
        ("one fixed window", policy()),
        ("one fixed window, aligned (Envoy's)", aligned),
        (
            "one token bucket",
            Policy::from_specs("b", vec![LimitSpec::token_bucket(big, 60_000)]).unwrap(),
        ),
        (
            "one sliding window (60 buckets)",
            Policy::from_specs("b", vec![LimitSpec::sliding_window(big, 60_000)]).unwrap(),
        ),
        ("three fixed windows (1 s, 1 min, 1 h)", three),
    ]
}

/// The wall clock in ms: a check replayed by redis-benchmark carries one `now` for the whole
/// run, which must stay within half the expiry margin of Redis's clock for its fixed windows
/// to open as counters (hence the stores' margin of 600 s).
fn wall_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(NOW, |d| d.as_millis() as u64)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The cost tables of docs/benchmarks.md, each against the minimal script (`EVALSHA` of
/// `INCR` + `PEXPIRE`) measured the same way in the same round, `rounds` alternating rounds:
///
/// 1. a single call (c = 1, where nothing coalesces): `redis-benchmark -c 1` replays the
///    store's own command for a check (`RedisStore::check_command`), INFO commandstats µs
///    per call;
/// 2. coalesced (c = 16 and 64): Sluice through its own client, Redis's whole-process CPU
///    (`used_cpu_sys + used_cpu_user`) per decision, against `redis-benchmark -c <c>`
///    sending the minimal script; Sluice with coalescing off (`coalesce(1)`) alongside.
fn cost_tables(rt: &tokio::runtime::Runtime, server: &RedisServer, secs: u64, rounds: usize) {
    let store = rt
        .block_on(RedisStore::connect(
            RedisConfig::new(server.url()).expiry_margin(Duration::from_secs(600)),
        ))
        .unwrap();
    let sha = match server.cmd(&["SCRIPT", "LOAD", MINIMAL_SCRIPT]).unwrap() {
        redis::Value::BulkString(b) => String::from_utf8(b).unwrap(),
        other => panic!("SCRIPT LOAD answered {other:?}"),
    };
    let minimal: Vec<String> = ["EVALSHA", &sha, "1", "bench:__rand_int__"]
        .map(str::to_owned)
        .to_vec();
    let cases = cost_cases();
    let single_calls = 30_000;

    // 1. A single call at c = 1.
    let mut base = Vec::new();
    let mut us: Vec<Vec<f64>> = vec![Vec::new(); cases.len()];
    let mut ratio: Vec<Vec<f64>> = vec![Vec::new(); cases.len()];
    for _ in 0..rounds {
        let (b, _) = replayed(server, &minimal, 1, single_calls);
        base.push(b);
        for (i, (_, p)) in cases.iter().enumerate() {
            let command = store.check_command(p, "bench:__rand_int__", 1, wall_ms());
            let (u, _) = replayed(server, &command, 1, single_calls);
            us[i].push(u);
            ratio[i].push(u / b);
        }
    }
    println!();
    println!(
        "A single call, c = 1: redis-benchmark -c 1 -n {single_calls} -r {KEYS} replaying the store's command, INFO commandstats µs per call; median of {rounds} alternating rounds, ratio within each round (median):"
    );
    println!();
    println!("| check | commands | Redis µs/decision | × minimal script |");
    println!("|---|---|---:|---:|");
    println!(
        "| minimal script: EVALSHA of INCR + PEXPIRE | 3 | {:.2} | 1.00 |",
        median(base.clone())
    );
    for (i, (name, _)) in cases.iter().enumerate() {
        println!(
            "| {name} | | {:.2} | **{:.2}** |",
            median(us[i].clone()),
            median(ratio[i].clone())
        );
    }

    // `SLUICE_BENCH_ONLY=single`: this table alone.
    if std::env::var("SLUICE_BENCH_ONLY").as_deref() == Ok("single") {
        return;
    }
    // 2. Coalesced, c = 16 and 64.
    for concurrency in [16usize, 64] {
        let calls = 100_000;
        let mut base = Vec::new();
        let mut on: Vec<Vec<(f64, f64, f64)>> = vec![Vec::new(); cases.len()];
        let mut off: Vec<Vec<(f64, f64, f64)>> = vec![Vec::new(); cases.len()];
        for _ in 0..rounds {
            let (_, b) = replayed(server, &minimal, concurrency, calls);
            base.push(b);
            for (i, (_, p)) in cases.iter().enumerate() {
                let c = rt.block_on(through_the_client(server, p, concurrency, 64, secs));
                on[i].push((c.0, c.0 / b, c.1));
                let c = rt.block_on(through_the_client(server, p, concurrency, 1, secs));
                off[i].push((c.0, c.0 / b, c.2));
            }
        }
        let pick = |v: &Vec<(f64, f64, f64)>, f: fn(&(f64, f64, f64)) -> f64| {
            median(v.iter().map(f).collect())
        };
        println!();
        println!(
            "Coalesced, c = {concurrency}: Redis whole-process CPU (used_cpu_sys + used_cpu_user) per decision; the minimal script sent by redis-benchmark -c {concurrency} -n {calls} -r {KEYS}, Sluice through its own client ({concurrency} tasks, {secs} s, 10 000 keys), coalescing up to 64 and off; median of {rounds} alternating rounds, ratios within each round:"
        );
        println!();
        println!(
            "| check | coalesced: Redis CPU µs/decision | × minimal script | decisions per call | not coalesced: µs/decision | × minimal script |"
        );
        println!("|---|---:|---:|---:|---:|---:|");
        println!(
            "| minimal script (redis-benchmark) | {:.2} | 1.00 | 1 | | |",
            median(base.clone())
        );
        for (i, (name, _)) in cases.iter().enumerate() {
            println!(
                "| {name} | {:.2} | **{:.2}** | {:.1} | {:.2} | {:.2} |",
                pick(&on[i], |c| c.0),
                pick(&on[i], |c| c.1),
                pick(&on[i], |c| c.2),
                pick(&off[i], |c| c.0),
                pick(&off[i], |c| c.1),
            );
        }
    }
}

/// Latency at c = 1 through the store, coalescing on (the default) and off, alternating.
fn latency_at_one(rt: &tokio::runtime::Runtime, server: &RedisServer, secs: u64, rounds: usize) {
    println!();
    println!(
        "Latency at c = 1 through RedisStore::check (one task, one fixed window, {secs} s per run, alternating):"
    );
    println!();
    println!("| round | coalescing | decisions/s | p50 µs | p99 µs | p999 µs |");
    println!("|---:|---|---:|---:|---:|---:|");
    for round in 1..=rounds {
        for coalesce in [64usize, 1] {
            server.cmd(&["FLUSHALL"]).unwrap();
            let store = rt
                .block_on(RedisStore::connect(
                    RedisConfig::new(server.url())
                        .timeout(Duration::from_secs(2))
                        .coalesce(coalesce),
                ))
                .unwrap();
            let (n, hist, elapsed) = rt.block_on(common::load(store, &policy(), 1, secs, KEYS));
            println!(
                "| {round} | {} | {:.0} | {} | {} | {} |",
                if coalesce > 1 { "on (64)" } else { "off" },
                n as f64 / elapsed,
                hist.value_at_quantile(0.5),
                hist.value_at_quantile(0.99),
                hist.value_at_quantile(0.999),
            );
        }
    }
}

fn main() {
    let Some((secs, server, rt)) = common::start() else {
        return;
    };

    // `SLUICE_BENCH_ONLY=cpu`: the cost tables and the latency at c = 1 alone.
    let rounds = std::env::var("SLUICE_BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    // `SLUICE_BENCH_ONLY=latency`: the latency at c = 1 alone.
    if std::env::var("SLUICE_BENCH_ONLY").as_deref() == Ok("latency") {
        latency_at_one(&rt, &server, secs, rounds);
        return;
    }
    if std::env::var("SLUICE_BENCH_ONLY").as_deref() == Ok("single") {
        cost_tables(&rt, &server, secs, rounds);
        return;
    }
    if std::env::var("SLUICE_BENCH_ONLY").as_deref() == Ok("cpu") {
        cost_tables(&rt, &server, secs, rounds);
        latency_at_one(&rt, &server, secs, rounds);
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
    cost_tables(&rt, &server, secs, rounds);
    latency_at_one(&rt, &server, secs, rounds);
}
