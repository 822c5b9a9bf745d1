//! End to end: Envoy's rate limit gRPC API on port 0, with a real gRPC client and the
//! reference service's YAML read unchanged from a directory.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use tonic::transport::Channel;

const RLS_YAML: &str = r#"
domain: edge
descriptors:
  - key: remote_address
    rate_limit:
      unit: minute
      requests_per_unit: 3
  - key: user
    descriptors:
      - key: plan
        value: free
        rate_limit:
          unit: hour
          requests_per_unit: 2
  - key: shadow
    shadow_mode: true
    rate_limit:
      unit: minute
      requests_per_unit: 1
  - key: blocked
    rate_limit:
      unit: second
      requests_per_unit: 0
  - key: trusted
    rate_limit:
      unlimited: true
"#;

mod common;

struct Server {
    inner: common::TestServer,
    client: RateLimitServiceClient<Channel>,
    channel: Channel,
    rls_file: std::path::PathBuf,
    http_url: String,
}

async fn start() -> Server {
    start_with("").await
}

async fn start_with(extra_config: &str) -> Server {
    let config = format!("rls:\n  config_dir: ratelimit-config\n{extra_config}");
    let inner =
        common::TestServer::start(&config, &[("ratelimit-config/edge.yaml", RLS_YAML)]).await;
    let channel = inner.channel().await;
    Server {
        client: RateLimitServiceClient::new(channel.clone()),
        channel,
        rls_file: inner.dir.path().join("ratelimit-config/edge.yaml"),
        http_url: inner.url.clone(),
        inner,
    }
}

impl Server {
    async fn stop(self) {
        self.inner.stop().await;
    }

    async fn ask(&mut self, descriptors: &[&[(&str, &str)]], hits: u32) -> RateLimitResponse {
        self.client
            .should_rate_limit(request("edge", descriptors, hits))
            .await
            .unwrap()
            .into_inner()
    }
}

fn request(domain: &str, descriptors: &[&[(&str, &str)]], hits: u32) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.to_owned(),
        descriptors: descriptors
            .iter()
            .map(|d| RateLimitDescriptor {
                entries: d
                    .iter()
                    .map(|(k, v)| Entry {
                        key: (*k).to_owned(),
                        value: (*v).to_owned(),
                    })
                    .collect(),
                ..RateLimitDescriptor::default()
            })
            .collect(),
        hits_addend: hits,
    }
}

#[tokio::test]
async fn one_counter_per_remote_address_with_full_statuses() {
    let mut s = start().await;
    for expected in [2u32, 1, 0] {
        let r = s.ask(&[&[("remote_address", "10.0.0.1")]], 1).await;
        assert_eq!(r.overall_code, Code::Ok as i32);
        let st = &r.statuses[0];
        assert_eq!(st.code, Code::Ok as i32);
        assert_eq!(st.limit_remaining, expected);
        let limit = st.current_limit.as_ref().unwrap();
        assert_eq!((limit.requests_per_unit, limit.unit), (3, 2 /* MINUTE */));
        let until = st.duration_until_reset.as_ref().unwrap();
        assert!(
            until.seconds <= 60 && (until.seconds > 0 || until.nanos > 0),
            "{until:?}"
        );
    }
    let r = s.ask(&[&[("remote_address", "10.0.0.1")]], 1).await;
    assert_eq!(r.overall_code, Code::OverLimit as i32);
    assert_eq!(r.statuses[0].code, Code::OverLimit as i32);
    // Another address has its own counter.
    let r = s.ask(&[&[("remote_address", "10.0.0.2")]], 1).await;
    assert_eq!(r.overall_code, Code::Ok as i32);
    assert_eq!(r.statuses[0].limit_remaining, 2);
    s.stop().await;
}

#[tokio::test]
async fn descriptors_are_all_or_nothing_and_hits_addend_is_the_cost() {
    let mut s = start().await;
    let both: &[&[(&str, &str)]] = &[
        &[("remote_address", "1.1.1.1")],
        &[("user", "u1"), ("plan", "free")],
    ];
    // hits_addend 0 reports without counting.
    let r = s.ask(both, 0).await;
    assert_eq!(
        (r.statuses[0].limit_remaining, r.statuses[1].limit_remaining),
        (3, 2)
    );
    // The free plan allows 2 per hour: a cost of 2 fits, the address counts 2 too.
    let r = s.ask(both, 2).await;
    assert_eq!(r.overall_code, Code::Ok as i32);
    assert_eq!(
        (r.statuses[0].limit_remaining, r.statuses[1].limit_remaining),
        (1, 0)
    );
    // Over the plan: the request is refused and the address is not charged.
    let r = s.ask(both, 1).await;
    assert_eq!(r.overall_code, Code::OverLimit as i32);
    assert_eq!(r.statuses[0].code, Code::Ok as i32);
    assert_eq!(r.statuses[1].code, Code::OverLimit as i32);
    let r = s.ask(&[&[("remote_address", "1.1.1.1")]], 0).await;
    assert_eq!(
        r.statuses[0].limit_remaining, 1,
        "the refused request was not counted"
    );
    // A descriptor's own hits_addend overrides the request's.
    let mut req = request("edge", &[&[("remote_address", "2.2.2.2")]], 1);
    req.descriptors[0].hits_addend =
        Some(envoy_types::pb::google::protobuf::UInt64Value { value: 3 });
    let r = s.client.should_rate_limit(req).await.unwrap().into_inner();
    assert_eq!(r.statuses[0].limit_remaining, 0);
    s.stop().await;
}

#[tokio::test]
async fn shadow_unlimited_blocked_and_unmatched_descriptors() {
    let mut s = start().await;
    s.ask(&[&[("shadow", "x")]], 1).await;
    let r = s.ask(&[&[("shadow", "x")]], 1).await;
    assert_eq!(r.overall_code, Code::Ok as i32, "shadow mode never refuses");
    assert_eq!(r.statuses[0].code, Code::Ok as i32);
    assert_eq!(r.statuses[0].limit_remaining, 0);

    let r = s.ask(&[&[("trusted", "me")]], 1_000).await;
    assert_eq!(r.overall_code, Code::Ok as i32);
    assert_eq!(r.statuses[0].limit_remaining, u32::MAX);

    let r = s.ask(&[&[("blocked", "anyone")]], 1).await;
    assert_eq!(
        r.overall_code,
        Code::OverLimit as i32,
        "requests_per_unit: 0 blocks"
    );

    let r = s.ask(&[&[("nothing", "matches")]], 1).await;
    assert_eq!(r.overall_code, Code::Ok as i32);
    assert!(r.statuses[0].current_limit.is_none());
    // A partial match (user without plan) has no limit either.
    let r = s.ask(&[&[("user", "u9")]], 1).await;
    assert!(r.statuses[0].current_limit.is_none());
    s.stop().await;
}

#[tokio::test]
async fn invalid_requests_and_health() {
    let mut s = start().await;
    let e = s
        .client
        .should_rate_limit(request("", &[&[("a", "b")]], 1))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert!(e.message().contains("domain"), "{}", e.message());
    let e = s
        .client
        .should_rate_limit(request("edge", &[], 1))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    // An unknown domain has no rules: everything is OK.
    let r = s
        .client
        .should_rate_limit(request("other", &[&[("remote_address", "x")]], 1))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.overall_code, Code::Ok as i32);

    let mut health = tonic_health::pb::health_client::HealthClient::new(s.channel.clone());
    let r = health
        .check(tonic_health::pb::HealthCheckRequest {
            service: "envoy.service.ratelimit.v3.RateLimitService".to_owned(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        r.status,
        tonic_health::pb::health_check_response::ServingStatus::Serving as i32
    );
    s.stop().await;
}

/// Editing a file of the rate limit directory reloads it; a broken edit keeps the last good
/// rules.
#[tokio::test]
async fn editing_the_rule_files_reloads_them() {
    let mut s = start().await;
    let limit_of = |r: &RateLimitResponse| {
        r.statuses[0]
            .current_limit
            .as_ref()
            .map(|l| l.requests_per_unit)
    };
    assert_eq!(
        limit_of(&s.ask(&[&[("remote_address", "r")]], 0).await),
        Some(3)
    );
    std::fs::write(
        &s.rls_file,
        RLS_YAML.replace("requests_per_unit: 3", "requests_per_unit: 7"),
    )
    .unwrap();
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    while limit_of(&s.ask(&[&[("remote_address", "r")]], 0).await) != Some(7) {
        if tokio::time::Instant::now() >= deadline {
            let url = format!("{}/v1/policies", s.http_url);
            let p: serde_json::Value = reqwest::get(url).await.unwrap().json().await.unwrap();
            panic!("the edited rule never applied: {p}");
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    // A broken file: the reload fails and the last good rules stay.
    std::fs::write(&s.rls_file, "domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit: { unit: fortnight, requests_per_unit: 1 }\n").unwrap();
    let policies = format!("{}/v1/policies", s.http_url);
    loop {
        let p: serde_json::Value = reqwest::get(&policies).await.unwrap().json().await.unwrap();
        if let Some(e) = p["config"]["last_reload_error"].as_str() {
            assert!(e.contains("edge.yaml") && e.contains("fortnight"), "{e}");
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline + std::time::Duration::from_secs(10),
            "no reload attempt"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(
        limit_of(&s.ask(&[&[("remote_address", "r")]], 0).await),
        Some(7)
    );
    s.stop().await;
}

/// Over Redis: a stalled store is a gRPC `UNAVAILABLE` (Envoy's `failure_mode_deny` decides),
/// and recovery needs no restart.
#[tokio::test]
async fn a_stalled_redis_store_is_unavailable_to_envoy() {
    if !sluice_testkit::require_redis() {
        return;
    }
    let redis = sluice_testkit::RedisServer::start().unwrap();
    let store = format!(
        "store:\n  backend: redis\n  shards:\n    - primary: {}\n  timeout: 200ms\n",
        redis.url()
    );
    let mut s = start_with(&store).await;
    let r = s.ask(&[&[("remote_address", "9.9.9.9")]], 1).await;
    assert_eq!(r.statuses[0].limit_remaining, 2);
    redis.pause().unwrap();
    let e = s
        .client
        .should_rate_limit(request("edge", &[&[("remote_address", "9.9.9.9")]], 1))
        .await;
    redis.resume().unwrap();
    let e = e.unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unavailable);
    assert!(e.message().contains("store"), "{}", e.message());
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        if let Ok(r) = s
            .client
            .should_rate_limit(request("edge", &[&[("remote_address", "8.8.8.8")]], 1))
            .await
        {
            assert_eq!(r.into_inner().overall_code, Code::Ok as i32);
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "no recovery");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    s.stop().await;
}
