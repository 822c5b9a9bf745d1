//! One clock: under `store.clock: redis` every number the server answers with (headers, the
//! decision body, gRPC's `duration_until_reset` and `response_headers_to_add`) is counted from
//! the instant the decision was made at (Redis `TIME`), even when the server's own clock is a
//! day and a half-minute off.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use crate::support;

use std::time::{SystemTime, UNIX_EPOCH};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use serde_json::{Value, json};

/// A day and 30 s behind: far enough that any number read from it is visibly wrong, and half
/// a minute off so that even an aligned minute window ends at another second.
const SKEW_MS: u64 = 86_400_000 + 30_000;

/// The Redis server runs on this machine, so its `TIME` is this machine's clock.
fn wall_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

fn skewed_clock() -> sluice::ManualClock {
    sluice::ManualClock::new(wall_ms() - SKEW_MS)
}

fn redis_store(redis: &sluice_testkit::RedisServer) -> String {
    format!(
        "store:\n  backend: redis\n  clock: redis\n  shards:\n    - primary: {}\n",
        redis.url()
    )
}

fn header(r: &reqwest::Response, name: &str) -> String {
    r.headers()[name].to_str().unwrap().to_owned()
}

#[tokio::test]
async fn http_headers_follow_the_store_clock_not_the_servers() {
    let Some(redis) = support::redis() else {
        return;
    };
    let config = format!(
        "policies:\n  api:\n    limits:\n      - {{ max: 5, per: 1h }}\n{}",
        redis_store(&redis)
    );
    let s = support::TestServer::start_with_clock(&config, &[], skewed_clock()).await;
    let before = wall_ms();
    let r = reqwest::Client::new()
        .post(format!("{}/v1/check", s.url))
        .json(&json!({"policy": "api", "key": "k"}))
        .send()
        .await
        .unwrap();
    let after = wall_ms();
    let (reset, state) = (header(&r, "x-ratelimit-reset"), header(&r, "ratelimit"));
    let body: Value = r.json().await.unwrap();
    s.stop().await;

    // The window opened at Redis's now, so it ends an hour after the wall clock.
    let reset_ms = body["limits"][0]["reset_ms"].as_u64().unwrap();
    assert!(
        (before + 3_600_000..=after + 3_600_000).contains(&reset_ms),
        "{body}"
    );
    assert_eq!(reset, body["reset"].to_string());
    // `t` counts from the decision's instant: the whole hour, not an hour and a day.
    assert_eq!(state, "\"api:0\";r=4;t=3600");
}

#[tokio::test]
async fn grpc_reset_follows_the_store_clock_not_the_servers() {
    let Some(redis) = support::redis() else {
        return;
    };
    let rules = "domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit:\n      unit: minute\n      requests_per_unit: 3\n";
    let config = format!(
        "rls:\n  config_dir: ratelimit-config\n{}",
        redis_store(&redis)
    );
    let clock = skewed_clock();
    let s = support::TestServer::start_with_clock(
        &config,
        &[("ratelimit-config/edge.yaml", rules)],
        clock.clone(),
    )
    .await;
    let mut client = RateLimitServiceClient::new(s.channel().await);
    let request = RateLimitRequest {
        domain: "edge".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "remote_address".into(),
                value: "10.0.0.1".into(),
            }],
            ..RateLimitDescriptor::default()
        }],
        ..RateLimitRequest::default()
    };
    let before = wall_ms();
    let r = client
        .should_rate_limit(request)
        .await
        .unwrap()
        .into_inner();
    let after = wall_ms();
    s.stop().await;

    // Seconds to the end of the minute as Redis saw it (the call lies between the two reads).
    let until = |ms: u64| 60 - (ms % 60_000) / 1_000;
    let expected = [until(before), until(after)];
    let got = r.statuses[0].duration_until_reset.unwrap().seconds as u64;
    assert!(expected.contains(&got), "{got} not in {expected:?}");
    // What the server's own clock would have said is 30 s off, so it cannot pass by chance.
    use sluice::Clock as _;
    assert!(!expected.contains(&until(clock.now_ms())));
    let state = r
        .response_headers_to_add
        .iter()
        .find(|h| h.key == "RateLimit")
        .map(|h| h.value.clone())
        .unwrap();
    assert!(state.ends_with(&format!(";r=2;t={got}")), "{state}");
}
