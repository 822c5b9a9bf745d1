//! Many Envoy streams on Sluice's rate limit quota service: `S` streams (one per simulated
//! Envoy), each reporting `B` buckets every second for 10 s, against one Sluice server over a
//! local Redis, all in this process on this machine. Prints per `S`: the reports answered per
//! second against the reports sent, the round trip of a report (p50, p99, max), and Redis's
//! CPU per charged bucket (INFO commandstats: `usec` per `FCALL`) against a fixed-window check
//! of the same store measured in the same run (the baseline).
//!
//! `cargo bench -p sluice-server --bench rlqs` (about a minute and a half with the build;
//! `SLUICE_BENCH_SECS` sets the seconds per row, default 10). Prints a markdown table for
//! docs/server.md.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a bench fails loudly by design

use std::sync::Arc;
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_client::RateLimitQuotaServiceClient;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{BucketId, RateLimitQuotaUsageReports};
use hdrhistogram::Histogram;
use sluice::{Call, Op, Policy, Store};
use sluice_server::app::{self, Listeners};
use sluice_server::config::Config;
use sluice_testkit::{CommandStats, RedisServer};
use tokio::net::TcpListener;
use tokio::sync::{Mutex, mpsc};
use tokio_stream::wrappers::ReceiverStream;

const BUCKETS: usize = 10;

/// FCALL's calls and server time so far.
fn fcall_stats(server: &RedisServer) -> CommandStats {
    let stats = server.command_stats().unwrap();
    stats.get("fcall").copied().unwrap_or_default()
}

fn report(envoy: usize, allowed: u64) -> RateLimitQuotaUsageReports {
    RateLimitQuotaUsageReports {
        domain: "edge".to_owned(),
        bucket_quota_usages: (0..BUCKETS)
            .map(|b| BucketQuotaUsage {
                bucket_id: Some(BucketId {
                    bucket: [("tenant".to_owned(), format!("t{}", (envoy * 7 + b) % 500))].into(),
                }),
                num_requests_allowed: allowed,
                ..BucketQuotaUsage::default()
            })
            .collect(),
    }
}

/// One simulated Envoy: opens its stream, reports at `start` and then every second until
/// `end`, recording each round trip.
async fn envoy(
    channel: tonic::transport::Channel,
    id: usize,
    start: Instant,
    end: Instant,
    hist: Arc<Mutex<Histogram<u64>>>,
) -> u64 {
    let (tx, rx) = mpsc::channel(4);
    let mut client = RateLimitQuotaServiceClient::new(channel);
    let mut answers = client
        .stream_rate_limit_quotas(ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    let mut at = start;
    let mut sent = 0;
    let mut local = Histogram::<u64>::new(3).unwrap();
    while at < end {
        tokio::time::sleep_until(at.into()).await;
        let began = Instant::now();
        tx.send(report(id, 5)).await.unwrap();
        answers.message().await.unwrap().expect("an answer");
        local
            .record(u64::try_from(began.elapsed().as_micros()).unwrap_or(u64::MAX))
            .unwrap();
        sent += 1;
        at += Duration::from_secs(1);
    }
    hist.lock().await.add(&local).unwrap();
    sent
}

#[tokio::main(worker_threads = 2)]
async fn main() {
    let Some(secs) = sluice_testkit::bench_seconds(10) else {
        return;
    };
    let redis = RedisServer::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("sluice.yaml");
    std::fs::write(
        &file,
        format!(
            "policies:\n  tenants:\n    limits:\n      - {{ max: 1000000000, per: 1h }}\n\
             rlqs:\n  reporting_interval: 1s\n  buckets:\n    - {{ match: {{ tenant: '*' }}, policy: tenants, key: 'tenant:{{tenant}}' }}\n\
             store:\n  backend: redis\n  shards:\n    - primary: {}\n  timeout: 2s\n",
            redis.url()
        ),
    )
    .unwrap();
    let config = Config::load(&file).unwrap();
    let policy: Policy = config.policies[0].clone();

    let http = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let grpc = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", grpc.local_addr().unwrap());
    tokio::spawn(app::run(
        Listeners {
            http,
            grpc: Some(grpc),
            admin: None,
        },
        config,
        Some(file.clone()),
        std::future::pending::<()>(),
    ));
    let channel = loop {
        match tonic::transport::Endpoint::from_shared(url.clone())
            .unwrap()
            .connect()
            .await
        {
            Ok(c) => break c,
            Err(_) => tokio::time::sleep(Duration::from_millis(10)).await, // polling: not up yet
        }
    };
    // The baseline: the same store's check of a fixed window, in this run.
    let store = sluice_redis::RedisStore::connect(sluice_redis::RedisConfig::new(redis.url()))
        .await
        .unwrap();
    let before = fcall_stats(&redis);
    for i in 0..5_000u64 {
        let key = format!("base:{}", i % 500);
        store
            .call(Call::new(
                &policy,
                &key,
                Op::Check { cost: 5 },
                1_700_000_000_000,
            ))
            .await
            .unwrap();
    }
    let check_us = fcall_stats(&redis).since(before).usec_per_call();

    println!(
        "| streams | buckets per report | reports/s sent | reports/s answered | p50 ms | p99 ms | max ms | Redis µs per charged bucket | fixed-window check µs (baseline) |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for streams in [10usize, 100, 500, 1_000] {
        let hist = Arc::new(Mutex::new(Histogram::<u64>::new(3).unwrap()));
        let began = Instant::now() + Duration::from_millis(200);
        let end = began + Duration::from_secs(secs);
        let before = fcall_stats(&redis);
        let tasks: Vec<_> = (0..streams)
            .map(|id| {
                // Start times spread over the first second, as Envoys' are.
                let start = began + Duration::from_micros((id as u64 * 1_000_000) / streams as u64);
                tokio::spawn(envoy(channel.clone(), id, start, end, hist.clone()))
            })
            .collect();
        let mut reports = 0;
        for t in tasks {
            reports += t.await.unwrap();
        }
        let elapsed = began.elapsed().as_secs_f64();
        let charged_us = fcall_stats(&redis).since(before).usec_per_call();
        let h = hist.lock().await;
        println!(
            "| {streams} | {BUCKETS} | {} | {:.0} | {:.2} | {:.2} | {:.2} | {charged_us:.1} | {check_us:.1} |",
            streams,
            reports as f64 / elapsed,
            h.value_at_quantile(0.50) as f64 / 1000.0,
            h.value_at_quantile(0.99) as f64 / 1000.0,
            h.max() as f64 / 1000.0,
        );
    }
}
