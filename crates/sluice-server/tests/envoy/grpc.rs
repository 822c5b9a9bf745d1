//! End to end: Envoy's rate limit gRPC API on port 0, with a real gRPC client and the
//! reference service's YAML read unchanged from a directory.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit as ProtoUnit;
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

use crate::support::{self, rls_request as request};

struct Server {
    inner: support::TestServer,
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
        support::TestServer::start(&config, &[("ratelimit-config/edge.yaml", RLS_YAML)]).await;
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

    /// Asks with every descriptor's own `hits_addend` set to 0: reports, counts nothing.
    async fn peek(&mut self, descriptors: &[&[(&str, &str)]]) -> RateLimitResponse {
        let mut req = request("edge", descriptors, 1);
        for d in &mut req.descriptors {
            d.hits_addend = Some(envoy_types::pb::google::protobuf::UInt64Value { value: 0 });
        }
        self.client
            .should_rate_limit(req)
            .await
            .unwrap()
            .into_inner()
    }

    async fn ask(&mut self, descriptors: &[&[(&str, &str)]], hits: u32) -> RateLimitResponse {
        self.client
            .should_rate_limit(request("edge", descriptors, hits))
            .await
            .unwrap()
            .into_inner()
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
    // A descriptor hits_addend of 0 reports without counting.
    let r = s.peek(both).await;
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
    let r = s.peek(&[&[("remote_address", "1.1.1.1")]]).await;
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

/// What Envoy sends for an ordinary request: `hits_addend` left unset (0 on the wire), which
/// the reference service counts as 1. Over the memory store and over Redis.
async fn envoy_default_requests_count_one(extra_config: &str) {
    let mut s = start_with(extra_config).await;
    // Its `hits_addend` is the wire's 0.
    let envoy_request = || support::rls_request("edge", &[&[("remote_address", "10.1.2.3")]], 0);
    assert_eq!(envoy_request().hits_addend, 0, "the field is unset");
    // A descriptor hits_addend of 0 (the wrapper set) only reports.
    let r = s.peek(&[&[("remote_address", "10.1.2.3")]]).await;
    assert_eq!(r.statuses[0].limit_remaining, 3);
    let mut seen = Vec::new();
    for _ in 0..4 {
        let r = s
            .client
            .should_rate_limit(envoy_request())
            .await
            .unwrap()
            .into_inner();
        seen.push((
            r.overall_code,
            r.statuses[0].code,
            r.statuses[0].limit_remaining,
        ));
    }
    let (ok, over) = (Code::Ok as i32, Code::OverLimit as i32);
    assert_eq!(
        seen,
        vec![(ok, ok, 2), (ok, ok, 1), (ok, ok, 0), (over, over, 0)]
    );
    // Reporting when nothing is left: OK with nothing remaining, as in the reference.
    let r = s.peek(&[&[("remote_address", "10.1.2.3")]]).await;
    assert_eq!((r.overall_code, r.statuses[0].limit_remaining), (ok, 0));
    s.stop().await;
}

#[tokio::test]
async fn envoy_default_requests_count_one_in_memory() {
    envoy_default_requests_count_one("").await;
}

#[tokio::test]
async fn envoy_default_requests_count_one_over_redis() {
    let Some(redis) = support::redis() else {
        return;
    };
    envoy_default_requests_count_one(&support::redis_store(&redis, "2s")).await;
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
    support::assert_status(&e, tonic::Code::InvalidArgument, "domain");
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
    // Envoy's name for the service, and the name the reference service registers (for
    // probes written for it).
    for service in ["envoy.service.ratelimit.v3.RateLimitService", "ratelimit"] {
        let r = health
            .check(tonic_health::pb::HealthCheckRequest {
                service: service.to_owned(),
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(
            r.status,
            tonic_health::pb::health_check_response::ServingStatus::Serving as i32,
            "{service}"
        );
    }
    s.stop().await;
}

/// Every bound of a request is an `INVALID_ARGUMENT` that names it, before anything is
/// charged: a long value that once reached the store as an invalid key (and came back as
/// `UNAVAILABLE`, a store failure for Envoy) is refused up front.
#[tokio::test]
async fn request_bounds_are_invalid_arguments_and_charge_nothing() {
    let mut s = start().await;
    let refused = |r: Result<tonic::Response<RateLimitResponse>, tonic::Status>| {
        let e = r.unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
        e.message().to_owned()
    };
    let long = "v".repeat(600);
    // The first descriptor would be charged; the second's counter key is too long.
    let m = refused(
        s.client
            .should_rate_limit(request(
                "edge",
                &[
                    &[("remote_address", "10.9.9.9")],
                    &[("remote_address", &long)],
                ],
                1,
            ))
            .await,
    );
    assert!(m.contains("descriptors[1]") && m.contains("512"), "{m}");
    let r = s.ask(&[&[("remote_address", "10.9.9.9")]], 1).await;
    assert_eq!(r.statuses[0].limit_remaining, 2, "nothing was charged");

    let m = refused(
        s.client
            .should_rate_limit(request(&"d".repeat(257), &[&[("a", "b")]], 1))
            .await,
    );
    assert!(m.contains("domain") && m.contains("256"), "{m}");
    let many: Vec<&[(&str, &str)]> = vec![&[("remote_address", "10.0.0.1")]; 65];
    let m = refused(s.client.should_rate_limit(request("edge", &many, 1)).await);
    assert!(m.contains("65 descriptors") && m.contains("64"), "{m}");
    let entries: Vec<(&str, &str)> = vec![("k", "v"); 33];
    let m = refused(
        s.client
            .should_rate_limit(request("edge", &[entries.as_slice()], 1))
            .await,
    );
    assert!(m.contains("33 entries") && m.contains("32"), "{m}");
    let mut huge = request("edge", &[&[("remote_address", "10.9.9.9")]], 1);
    huge.descriptors[0].hits_addend =
        Some(envoy_types::pb::google::protobuf::UInt64Value { value: u64::MAX });
    let m = refused(s.client.should_rate_limit(huge).await);
    assert!(m.contains("hits_addend") && m.contains("2^53"), "{m}");
    let r = s.ask(&[&[("remote_address", "10.9.9.9")]], 1).await;
    assert_eq!(
        r.statuses[0].limit_remaining, 1,
        "only the one admitted request counted"
    );

    // A message over 64 KiB is refused by the transport, undecoded.
    let e = s
        .client
        .should_rate_limit(request(
            "edge",
            &[&[("remote_address", &"x".repeat(70_000))]],
            1,
        ))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::OutOfRange, "{e:?}");
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
        limit_of(&s.peek(&[&[("remote_address", "r")]]).await),
        Some(3)
    );
    std::fs::write(
        &s.rls_file,
        RLS_YAML.replace("requests_per_unit: 3", "requests_per_unit: 7"),
    )
    .unwrap();
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    while limit_of(&s.peek(&[&[("remote_address", "r")]]).await) != Some(7) {
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
        limit_of(&s.peek(&[&[("remote_address", "r")]]).await),
        Some(7)
    );
    s.stop().await;
}

/// Over Redis: a stalled store is a gRPC `UNAVAILABLE` (Envoy's `failure_mode_deny` decides),
/// and recovery needs no restart.
#[tokio::test]
async fn a_stalled_redis_store_is_unavailable_to_envoy() {
    let Some(redis) = support::redis() else {
        return;
    };
    let store = support::redis_store(&redis, "200ms");
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
    support::assert_status(&e, tonic::Code::Unavailable, "store");
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

const QUOTA_YAML: &str = r#"
domain: quota
descriptors:
  - key: tenant
    quota_mode: true
    rate_limit: { unit: minute, requests_per_unit: 1 }
  - key: team
    quota_mode: true
    rate_limit: { unit: minute, requests_per_unit: 2 }
  - key: path
    rate_limit: { name: per_path, unit: hour, requests_per_unit: 5 }
  - key: blocked
    rate_limit: { unit: second, requests_per_unit: 0 }
"#;

/// 2026-01-01T00:10:00Z: ten minutes into an hour, so windows end at known distances.
const TEN_PAST: u64 = 1_767_225_600_000 + 600_000;

async fn start_quota(extra_config: &str) -> (support::TestServer, RateLimitServiceClient<Channel>) {
    let config = format!("rls:\n  config_dir: ratelimit-config\n{extra_config}");
    let server = support::TestServer::start_with_clock(
        &config,
        &[("ratelimit-config/quota.yaml", QUOTA_YAML)],
        sluice::ManualClock::new(TEN_PAST),
    )
    .await;
    let client = RateLimitServiceClient::new(server.channel().await);
    (server, client)
}

async fn call(
    client: &mut RateLimitServiceClient<Channel>,
    req: RateLimitRequest,
) -> RateLimitResponse {
    client.should_rate_limit(req).await.unwrap().into_inner()
}

fn headers(r: &RateLimitResponse) -> Vec<(String, String)> {
    r.response_headers_to_add
        .iter()
        .map(|h| (h.key.clone(), h.value.clone()))
        .collect()
}

/// `quota_mode` as the reference implements it: the request is over the limit only when a
/// normal descriptor is, or when every quota-mode descriptor is.
#[tokio::test]
async fn quota_mode_refuses_only_when_every_quota_descriptor_is_over() {
    let (s, mut c) = start_quota("").await;
    let (ok, over) = (Code::Ok as i32, Code::OverLimit as i32);
    let r = call(&mut c, request("quota", &[&[("tenant", "a")]], 0)).await;
    assert_eq!((r.overall_code, r.statuses[0].limit_remaining), (ok, 0));
    // The only quota descriptor is over: over the limit.
    let r = call(&mut c, request("quota", &[&[("tenant", "a")]], 0)).await;
    assert_eq!((r.overall_code, r.statuses[0].code), (over, over));
    // One of two quota descriptors over: OK, the over one keeps its status, the other counts.
    let both: &[&[(&str, &str)]] = &[&[("tenant", "a")], &[("team", "x")]];
    let r = call(&mut c, request("quota", both, 0)).await;
    assert_eq!(r.overall_code, ok);
    assert_eq!((r.statuses[0].code, r.statuses[1].code), (over, ok));
    assert_eq!(r.statuses[1].limit_remaining, 1);
    // A normal descriptor over the limit refuses whatever the quota descriptors say.
    let with_blocked: &[&[(&str, &str)]] = &[&[("team", "y")], &[("blocked", "b")]];
    let r = call(&mut c, request("quota", with_blocked, 0)).await;
    assert_eq!(r.overall_code, over);
    s.stop().await;
}

/// The global quota mode makes every descriptor a quota descriptor; the global shadow mode
/// turns every over-limit answer into OK (statuses unchanged).
#[tokio::test]
async fn global_quota_and_shadow_modes() {
    let (s, mut c) = start_quota("  quota_mode: true\n").await;
    let r = call(
        &mut c,
        request("quota", &[&[("blocked", "b")], &[("path", "/")]], 0),
    )
    .await;
    assert_eq!(
        r.overall_code,
        Code::Ok as i32,
        "not every quota descriptor is over"
    );
    assert_eq!(r.statuses[0].code, Code::OverLimit as i32);
    s.stop().await;

    let (s, mut c) = start_quota("  shadow_mode: true\n").await;
    let r = call(&mut c, request("quota", &[&[("blocked", "b")]], 0)).await;
    assert_eq!(r.overall_code, Code::Ok as i32);
    assert_eq!(r.statuses[0].code, Code::OverLimit as i32);
    s.stop().await;
}

/// `RateLimitDescriptor.limit`: the request's own limit, for configured domains, counted in
/// the counter of its entries.
#[tokio::test]
async fn a_descriptor_may_carry_its_own_limit() {
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
    let (s, mut c) = start_quota("").await;
    let with_limit = |domain: &str, unit: i32| {
        let mut req = request(domain, &[&[("anything", "x")]], 0);
        req.descriptors[0].limit = Some(RateLimitOverride {
            requests_per_unit: 2,
            unit,
        });
        req
    };
    let minute = ProtoUnit::Minute as i32;
    let mut seen = Vec::new();
    for _ in 0..3 {
        let r = call(&mut c, with_limit("quota", minute)).await;
        let limit = r.statuses[0].current_limit.clone().unwrap();
        assert_eq!((limit.requests_per_unit, limit.unit), (2, minute));
        assert_eq!(r.statuses[0].duration_until_reset.unwrap().seconds, 60);
        seen.push((r.overall_code, r.statuses[0].limit_remaining));
    }
    let (ok, over) = (Code::Ok as i32, Code::OverLimit as i32);
    assert_eq!(seen, vec![(ok, 1), (ok, 0), (over, 0)]);
    // An unknown domain has no limits, carried or not.
    let r = call(&mut c, with_limit("elsewhere", minute)).await;
    assert_eq!(r.overall_code, ok);
    assert!(r.statuses[0].current_limit.is_none());
    // A unit that is not one is refused, naming the descriptor.
    let e = c
        .should_rate_limit(with_limit("quota", 0))
        .await
        .unwrap_err();
    support::assert_status(
        &e,
        tonic::Code::InvalidArgument,
        "descriptors[0].limit.unit",
    );
    s.stop().await;
}

/// `response_headers_to_add`: the IETF fields by default, the reference's draft-03 names on
/// request, none when off; on allowed and limited answers alike.
#[tokio::test]
async fn response_headers_for_envoy_to_add() {
    let path: &[&[(&str, &str)]] = &[&[("path", "/a")], &[("team", "t")]];
    let (s, mut c) = start_quota("").await;
    let r = call(&mut c, request("quota", path, 0)).await;
    assert_eq!(
        headers(&r),
        vec![
            (
                "RateLimit-Policy".to_owned(),
                "\"per_path\";q=5;w=3600, \"quota.team\";q=2;w=60".to_owned()
            ),
            (
                "RateLimit".to_owned(),
                "\"per_path\";r=4;t=3000, \"quota.team\";r=1;t=60".to_owned()
            ),
        ]
    );
    let r = call(&mut c, request("quota", &[&[("blocked", "b")]], 0)).await;
    assert_eq!(r.overall_code, Code::OverLimit as i32);
    assert_eq!(headers(&r)[1].1, "\"quota.blocked\";r=0;t=1");
    s.stop().await;

    let (s, mut c) = start_quota("  response_headers: draft03\n").await;
    let r = call(&mut c, request("quota", path, 0)).await;
    assert_eq!(
        headers(&r),
        vec![
            ("RateLimit-Limit".to_owned(), "2".to_owned()),
            ("RateLimit-Remaining".to_owned(), "1".to_owned()),
            ("RateLimit-Reset".to_owned(), "60".to_owned()),
        ],
        "the descriptor closest to its limit"
    );
    s.stop().await;

    let (s, mut c) = start_quota("  response_headers: off\n").await;
    let r = call(&mut c, request("quota", path, 0)).await;
    assert!(r.response_headers_to_add.is_empty());
    s.stop().await;
}

/// `is_negative_hits` gives hits back (never below zero used) and is always OK.
#[tokio::test]
async fn negative_hits_give_back() {
    let (s, mut c) = start_quota("").await;
    for _ in 0..3 {
        call(&mut c, request("quota", &[&[("path", "/n")]], 0)).await;
    }
    let mut req = request("quota", &[&[("path", "/n")]], 2);
    req.descriptors[0].is_negative_hits = true;
    let r = call(&mut c, req.clone()).await;
    assert_eq!(
        (r.overall_code, r.statuses[0].limit_remaining),
        (Code::Ok as i32, 4)
    );
    let r = call(&mut c, req).await;
    assert_eq!(r.statuses[0].limit_remaining, 5, "never below zero used");
    s.stop().await;
}

/// Metric labels come from the configuration: 1,000 made-up domains add no series, and
/// gRPC decisions are timed and their failures counted.
#[tokio::test]
async fn grpc_metrics_are_bounded_by_the_configuration() {
    let (s, mut c) = start_quota("").await;
    let metrics = || async {
        reqwest::get(format!("{}/metrics", s.url))
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    };
    for i in 0..1_000 {
        let r = call(
            &mut c,
            request(&format!("made-up-{i}"), &[&[("k", "v")]], 0),
        )
        .await;
        assert_eq!(r.overall_code, Code::Ok as i32);
    }
    call(&mut c, request("quota", &[&[("path", "/m")]], 0)).await;
    let e = c.should_rate_limit(request("quota", &[], 0)).await;
    assert!(e.is_err());
    let text = metrics().await;
    assert!(!text.contains("made-up"), "a client-made label:\n{text}");
    let series: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("sluice_decisions_total{") && l.contains("should_rate_limit"))
        .collect();
    for line in &series {
        assert!(
            ["policy=\"quota\"", "policy=\"edge\"", "policy=\"unknown\""]
                .iter()
                .any(|p| line.contains(p)),
            "{line}"
        );
    }
    assert!(series.len() <= 9, "{series:#?}");
    for (policy, outcome) in [("unknown", "allowed"), ("quota", "error")] {
        let (policy, outcome) = (
            format!("policy=\"{policy}\""),
            format!("outcome=\"{outcome}\""),
        );
        assert!(
            series
                .iter()
                .any(|l| l.contains(&policy) && l.contains(&outcome)),
            "{policy} {outcome} in {series:#?}"
        );
    }
    assert!(
        text.lines()
            .any(|l| l
                .starts_with("sluice_decision_latency_seconds_count{op=\"should_rate_limit\"}")),
        "no gRPC latency:\n{text}"
    );
    assert!(
        text.lines().any(|l| l.starts_with("sluice_rls_hits_total{")
            && l.contains("domain=\"quota\"")
            && l.contains("key=\"quota.path\"")
            && l.contains("result=\"within_limit\"")),
        "no per-rule hits:\n{text}"
    );
    s.stop().await;
}

/// A Kubernetes ConfigMap mount, laid out as kubelet writes it: each file a link at
/// the top (`edge.yaml -> ..data/edge.yaml`), `..data` a link to the current version
/// `..<timestamp>/`. Its `..` entries used to be read as rule files too (every domain twice:
/// the server did not start). They are skipped; the top-level links are followed; and
/// kubelet's atomic update (a new version, `..data` renamed over) reloads the new rules.
#[cfg(unix)]
#[tokio::test]
async fn a_configmap_mount_is_read_once_and_its_atomic_update_reloads() {
    use std::os::unix::fs::symlink;
    let mount = tempfile::tempdir().unwrap();
    let m = mount.path();
    let version = |name: &str, per_minute: u32| {
        std::fs::create_dir(m.join(name)).unwrap();
        std::fs::write(
            m.join(name).join("edge.yaml"),
            RLS_YAML.replace(
                "requests_per_unit: 3",
                &format!("requests_per_unit: {per_minute}"),
            ),
        )
        .unwrap();
    };
    version("..2026_11_25_10_00_00.123456789", 3);
    symlink("..2026_11_25_10_00_00.123456789", m.join("..data")).unwrap();
    symlink("..data/edge.yaml", m.join("edge.yaml")).unwrap();

    // The loader sees one file, without a warning about the `..` entries.
    let rls = sluice_envoy_rules::RlsConfig::load_dir(m).unwrap();
    assert_eq!(rls.domains().collect::<Vec<_>>(), ["edge"]);
    assert!(rls.warnings().is_empty(), "{:?}", rls.warnings());

    let s =
        support::TestServer::start(&format!("rls:\n  config_dir: {}\n", m.display()), &[]).await;
    let client = RateLimitServiceClient::new(s.channel().await);
    let limit = || {
        let mut req = request("edge", &[&[("remote_address", "r")]], 1);
        req.descriptors[0].hits_addend =
            Some(envoy_types::pb::google::protobuf::UInt64Value { value: 0 });
        let mut client = client.clone();
        async move {
            client
                .should_rate_limit(req)
                .await
                .unwrap()
                .into_inner()
                .statuses[0]
                .current_limit
                .as_ref()
                .map(|l| l.requests_per_unit)
        }
    };
    assert_eq!(limit().await, Some(3));

    // kubelet's update: the new version beside the old, a temporary link to it renamed over
    // `..data` (one atomic step), the old version removed.
    version("..2026_11_25_10_05_00.987654321", 7);
    symlink("..2026_11_25_10_05_00.987654321", m.join("..data_tmp")).unwrap();
    std::fs::rename(m.join("..data_tmp"), m.join("..data")).unwrap();
    std::fs::remove_dir_all(m.join("..2026_11_25_10_00_00.123456789")).unwrap();
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    while limit().await != Some(7) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the updated ConfigMap never applied"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let stats: serde_json::Value = reqwest::get(format!("{}/v1/stats", s.url))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        stats["config"]["last_reload_error"],
        serde_json::Value::Null,
        "{stats}"
    );
    s.stop().await;
}
