//! `sluice bench` against each target: it stops by itself and its counts add up.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use clap::Parser;
use sluice_bench::{self as bench, BenchArgs};

#[path = "../../sluice-server/tests/support/mod.rs"]
mod common;

#[derive(Parser)]
struct Wrapper {
    #[command(flatten)]
    args: BenchArgs,
}

fn args(line: &[&str]) -> BenchArgs {
    Wrapper::parse_from(std::iter::once("bench").chain(line.iter().copied())).args
}

#[tokio::test]
async fn inproc_hot_key_admits_exactly_max() {
    let a = args(&[
        "--target",
        "inproc",
        "--requests",
        "2000",
        "--keys",
        "hot",
        "--max",
        "100",
        "--concurrency",
        "8",
    ]);
    let r = bench::run(&a).await.unwrap();
    assert_eq!(
        (r.decisions, r.allowed, r.denied, r.errors),
        (2_000, 100, 1_900, 0)
    );
    let json = r.to_json(&a);
    assert_eq!(json["decisions"], 2_000);
    assert!(
        json["latency_us"]["p99"].as_u64().unwrap() >= json["latency_us"]["p50"].as_u64().unwrap()
    );
    assert!(r.to_text(&a).contains("decisions/s"));
}

#[tokio::test]
async fn http_and_grpc_targets_against_a_running_server() {
    let s = common::TestServer::start(
        "rls:\n  config_dir: rls\npolicies:\n  demo:\n    limits: [{ max: 3, per: 1h }]\n",
        &[("rls/bench.yaml", "domain: bench\ndescriptors:\n  - key: remote_address\n    rate_limit:\n      unit: hour\n      requests_per_unit: 5\n")],
    )
    .await;
    let url = s.url.clone();
    let r = bench::run(&args(&[
        "--target",
        "http",
        "--url",
        &url,
        "--requests",
        "300",
        "--keys",
        "uniform:10",
    ]))
    .await
    .unwrap();
    assert_eq!(
        (r.decisions, r.allowed, r.errors),
        (300, 30, 0),
        "10 keys × max 3"
    );
    let grpc = s.grpc_url.clone();
    let r = bench::run(&args(&[
        "--target",
        "grpc",
        "--grpc",
        &grpc,
        "--requests",
        "200",
        "--keys",
        "uniform:4",
    ]))
    .await
    .unwrap();
    assert_eq!(
        (r.decisions, r.allowed, r.errors),
        (200, 20, 0),
        "4 addresses × 5 per hour"
    );
    s.stop().await;
}

#[tokio::test]
async fn inproc_over_redis_counts_redis_commands_per_decision() {
    if !sluice_testkit::require_redis() {
        return;
    }
    let server = sluice_testkit::RedisServer::start().unwrap();
    let url = server.url();
    let a = args(&[
        "--target",
        "inproc",
        "--redis",
        &url,
        "--requests",
        "1000",
        "--keys",
        "uniform:100000",
    ]);
    let r = bench::run(&a).await.unwrap();
    assert_eq!((r.decisions, r.allowed, r.errors), (1_000, 1_000, 0));
    // Each admitted decision runs INCRBY and PEXPIRETIME on its window's counter (the fast
    // path of one fixed window) and, opening a window, TIME (is the caller's clock within half
    // the margin of Redis's?) and SET (its end + margin as the counter's absolute expiry)
    // inside an FCALL; concurrent decisions share one FCALL (coalescing), so a
    // decision costs its commands plus its share of a call: exactly what the server counted,
    // at most 5.
    let per = r.redis_commands_per_decision.unwrap();
    let stats = server.command_stats().unwrap();
    let calls = |c: &str| stats.get(c).map_or(0, |s| s.calls);
    let (incrby, pexpiretime, time, set) = (
        calls("incrby"),
        calls("pexpiretime"),
        calls("time"),
        calls("set"),
    );
    assert_eq!((incrby, pexpiretime), (1_000, 1_000));
    assert!((1..=1_000).contains(&set), "{set} windows opened");
    assert_eq!(time, set, "a TIME per window opened");
    let fcalls = calls("fcall");
    assert!((1..=1_000).contains(&fcalls), "{fcalls} FCALLs");
    let expected = (incrby + pexpiretime + time + set + fcalls) as f64 / 1_000.0;
    assert!(
        (per - expected).abs() < 0.01 && per <= 5.0,
        "{per} Redis commands per decision, expected {expected} ({fcalls} FCALLs)"
    );
}
