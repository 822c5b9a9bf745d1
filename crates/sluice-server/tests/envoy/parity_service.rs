//! Service parity with the reference service's own tests, end to end over real gRPC.
//!
//! Each test replays a case of the reference's `test/service/ratelimit_test.go`,
//! `test/redis/fixed_cache_impl_test.go`, `test/limiter/base_limiter_test.go` or
//! `test/integration/integration_test.go` against a real Sluice server: the reference's rules
//! are written as rate limit configuration files, its requests are sent with a gRPC client,
//! and the whole answer (overall code, every descriptor status with its current limit,
//! `limit_remaining` and `duration_until_reset`, and the response headers) is compared with
//! the reference's expected answer.
//!
//! The reference's unit tests mock the counter store and its time source; here the server's
//! time is a [`ManualClock`] set to the reference's mocked instants (Unix second 1234, 2222 or
//! 1000000), so windows and `duration_until_reset` are exactly the reference's, and the
//! counters are brought to the reference's mocked values by earlier requests.
//!
//! The reference's response headers are off by default (`LIMIT_RESPONSE_HEADERS_ENABLED`);
//! Sluice's default is the IETF draft's, so tests that compare whole responses run with
//! `response_headers: off`, and the header tests choose `draft03` (the reference's headers)
//! or `ietf`.
//!
//! **Deliberate difference.** Sluice decides a request's descriptors all or nothing and counts
//! only admitted requests: when the request is refused, the charges of the other descriptors
//! are refunded, and the descriptor over its limit is not incremented. The reference
//! increments every descriptor's counter on every request (unless
//! `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT`). So, after an over-limit answer, Sluice's
//! counters are where they were: the refused request's other descriptors report the remaining
//! they had, and a later check of the over-limit descriptor reports what was left, not a
//! counter past the limit. Tests where this shows say so where they assert it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::rls_config::EXAMPLE_7;
// `simple` is the reference's `common.NewRateLimitRequest(domain, descriptors, hits)`.
use crate::support::{self, descriptor as desc, rls_request as simple};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::envoy::r#type::v3::RateLimitUnit;
use envoy_types::pb::google::protobuf::{Duration, UInt64Value};
use sluice::ManualClock;
use tonic::transport::Channel;

// ---------------------------------------------------------------------------------------------
// The server, requests and expected answers.
// ---------------------------------------------------------------------------------------------

/// The reference's mocked instants, in milliseconds.
const T_1234: u64 = 1_234_000;
const T_2222: u64 = 2_222_000;
const T_1000000: u64 = 1_000_000_000;

const OK: Code = Code::Ok;
const OVER: Code = Code::OverLimit;

/// The server settings that match the reference's defaults: no response headers.
const REFERENCE_DEFAULTS: &str = "  response_headers: off\n";

struct Rls {
    server: support::TestServer,
    client: RateLimitServiceClient<Channel>,
    clock: ManualClock,
}

impl Rls {
    /// A server whose `rls` section is `config_dir` plus `settings` (lines indented by two
    /// spaces; top-level sections such as `store:` may follow), with each `(name, text)` of
    /// `rules` in its rule directory, at `now_ms`.
    async fn start(settings: &str, rules: &[(&str, &str)], now_ms: u64) -> Self {
        let config = format!("rls:\n  config_dir: ratelimit-config\n{settings}");
        let paths: Vec<String> = rules
            .iter()
            .map(|(name, _)| format!("ratelimit-config/{name}"))
            .collect();
        let files: Vec<(&str, &str)> = paths
            .iter()
            .zip(rules)
            .map(|(path, (_, text))| (path.as_str(), *text))
            .collect();
        let clock = ManualClock::new(now_ms);
        let server = support::TestServer::start_with_clock(&config, &files, clock.clone()).await;
        let client = RateLimitServiceClient::new(server.channel().await);
        Self {
            server,
            client,
            clock,
        }
    }

    async fn ask(&mut self, request: RateLimitRequest) -> RateLimitResponse {
        match self.client.should_rate_limit(request.clone()).await {
            Ok(r) => r.into_inner(),
            Err(e) => panic!("{request:?} failed: {e}"),
        }
    }

    async fn refused(&mut self, request: RateLimitRequest) -> tonic::Status {
        match self.client.should_rate_limit(request.clone()).await {
            Ok(r) => panic!("{request:?} was answered: {:?}", r.into_inner()),
            Err(e) => e,
        }
    }

    /// Sends one single-descriptor request of cost `hits`, expecting it admitted: how the
    /// tests bring a counter to the reference's mocked value.
    async fn fill(&mut self, domain: &str, entries: &[(&str, &str)], hits: u32) {
        let r = self.ask(request(domain, vec![desc(entries)], hits)).await;
        assert_eq!(r.overall_code, OK as i32, "filling {entries:?}: {r:?}");
    }

    /// What is left for one descriptor, counting nothing (its own `hits_addend` 0).
    async fn left(&mut self, domain: &str, entries: &[(&str, &str)]) -> u32 {
        let r = self
            .ask(request(domain, vec![hits(desc(entries), 0)], 1))
            .await;
        r.statuses[0].limit_remaining
    }

    async fn stop(self) {
        self.server.stop().await;
    }
}

/// The descriptor with its own `hits_addend`.
fn hits(mut d: RateLimitDescriptor, n: u64) -> RateLimitDescriptor {
    d.hits_addend = Some(UInt64Value { value: n });
    d
}

/// The descriptor carrying its own limit (`RateLimitDescriptor.limit`).
fn carrying(mut d: RateLimitDescriptor, requests_per_unit: u32, unit: i32) -> RateLimitDescriptor {
    d.limit = Some(RateLimitOverride {
        requests_per_unit,
        unit,
    });
    d
}

fn request(
    domain: &str,
    descriptors: Vec<RateLimitDescriptor>,
    hits_addend: u32,
) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.to_owned(),
        descriptors,
        hits_addend,
    }
}

/// The status of a descriptor no rule limits: OK, no current limit, nothing remaining.
fn no_limit() -> DescriptorStatus {
    DescriptorStatus {
        code: OK as i32,
        ..DescriptorStatus::default()
    }
}

/// The status of an unlimited descriptor: OK, `limit_remaining` at its maximum.
fn unlimited() -> DescriptorStatus {
    DescriptorStatus {
        code: OK as i32,
        limit_remaining: u32::MAX,
        ..DescriptorStatus::default()
    }
}

/// The status of a limited descriptor (a limit without a name).
fn status(code: Code, rpu: u32, unit: Unit, remaining: u32, reset_secs: i64) -> DescriptorStatus {
    named(code, "", rpu, unit, remaining, reset_secs)
}

fn named(
    code: Code,
    name: &str,
    rpu: u32,
    unit: Unit,
    remaining: u32,
    reset_secs: i64,
) -> DescriptorStatus {
    DescriptorStatus {
        code: code as i32,
        current_limit: Some(RateLimit {
            name: name.to_owned(),
            requests_per_unit: rpu,
            unit: unit as i32,
        }),
        limit_remaining: remaining,
        duration_until_reset: Some(Duration {
            seconds: reset_secs,
            nanos: 0,
        }),
        ..DescriptorStatus::default()
    }
}

/// A whole response without headers.
fn response(code: Code, statuses: Vec<DescriptorStatus>) -> RateLimitResponse {
    RateLimitResponse {
        overall_code: code as i32,
        statuses,
        ..RateLimitResponse::default()
    }
}

/// The response's headers as `(name, value)` pairs.
fn headers(r: &RateLimitResponse) -> Vec<(String, String)> {
    r.response_headers_to_add
        .iter()
        .map(|h| (h.key.clone(), h.value.clone()))
        .collect()
}

fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

// ---------------------------------------------------------------------------------------------
// test/service/ratelimit_test.go
// ---------------------------------------------------------------------------------------------

/// The reference service tests' two domains: `test-domain`, where `hello` matches nothing,
/// and `different-domain`, where `foo` is limited to 10 per minute (named `key_name`, as the
/// reference's first limit) and `hello` matches nothing.
const TEST_DOMAIN: &str = "\
domain: test-domain
descriptors:
  - key: something_else
    rate_limit:
      unit: minute
      requests_per_unit: 1
";

const DIFFERENT_DOMAIN: &str = "\
domain: different-domain
descriptors:
  - key: foo
    rate_limit:
      name: key_name
      unit: minute
      requests_per_unit: 10
  - key: bar
    rate_limit:
      unit: minute
      requests_per_unit: 5
";

/// The descriptors `foo=bar` and `hello=world`.
const FOO_HELLO: &[&[(&str, &str)]] = &[&[("foo", "bar")], &[("hello", "world")]];

async fn service_server(settings: &str) -> Rls {
    Rls::start(
        settings,
        &[
            ("test.yaml", TEST_DOMAIN),
            ("different.yaml", DIFFERENT_DOMAIN),
        ],
        T_2222,
    )
    .await
}

// reference: test/service/ratelimit_test.go TestService
//
// (The reference's configuration reload in the middle of this test, and the failed reload
// that keeps the last good configuration, are exercised by grpc.rs
// editing_the_rule_files_reloads_them.)
#[tokio::test]
async fn service_unmatched_and_over_limit_descriptors() {
    let mut s = service_server(REFERENCE_DEFAULTS).await;
    let r = s
        .ask(simple("test-domain", &[&[("hello", "world")]], 1))
        .await;
    assert_eq!(r, response(OK, vec![no_limit()]));

    // foo=bar is brought to its limit; the next request is over it.
    s.fill("different-domain", &[("foo", "bar")], 10).await;
    let over = named(OVER, "key_name", 10, Unit::Minute, 0, 58);
    let r = s.ask(simple("different-domain", FOO_HELLO, 1)).await;
    assert_eq!(r, response(OVER, vec![over.clone(), no_limit()]));

    // The order of the descriptors does not matter.
    let r = s
        .ask(simple(
            "different-domain",
            &[&[("hello", "world")], &[("foo", "bar")]],
            1,
        ))
        .await;
    assert_eq!(r, response(OVER, vec![no_limit(), over]));
    s.stop().await;
}

// reference: test/service/ratelimit_test.go TestServiceGlobalShadowMode
#[tokio::test]
async fn global_shadow_mode_answers_ok_and_keeps_the_statuses() {
    let mut s = service_server("  response_headers: off\n  shadow_mode: true\n").await;
    s.fill("different-domain", &[("foo", "bar")], 10).await;
    let r = s.ask(simple("different-domain", FOO_HELLO, 1)).await;
    assert_eq!(
        r,
        response(
            OK,
            vec![named(OVER, "key_name", 10, Unit::Minute, 0, 58), no_limit()]
        )
    );

    // Sluice: the request is admitted, so the charges of its other descriptors stand (bar
    // counts 1, then 2), while the descriptor over its limit counts nothing.
    for remaining in [4, 3] {
        let r = s
            .ask(simple(
                "different-domain",
                &[&[("foo", "bar")], &[("bar", "x")]],
                1,
            ))
            .await;
        assert_eq!(
            r,
            response(
                OK,
                vec![
                    named(OVER, "key_name", 10, Unit::Minute, 0, 58),
                    status(OK, 5, Unit::Minute, remaining, 58)
                ]
            )
        );
    }

    // A limit the request carries is under the global shadow mode too. (The reference's
    // settings describe SHADOW_MODE as not applying "if a rate was provided from envoy as an
    // override", but its `shouldRateLimitWorker` turns every OVER_LIMIT into OK.)
    let carried = || {
        request(
            "different-domain",
            vec![carrying(
                desc(&[("hello", "world")]),
                1,
                RateLimitUnit::Minute as i32,
            )],
            1,
        )
    };
    s.ask(carried()).await;
    let r = s.ask(carried()).await;
    assert_eq!(r, response(OK, vec![status(OVER, 1, Unit::Minute, 0, 58)]));
    s.stop().await;
}

/// `foo` and `hello` limited to 10 per minute, each in shadow mode or not.
fn two_rules(foo_shadow: bool, hello_shadow: bool) -> String {
    format!(
        "\
domain: different-domain
descriptors:
  - key: foo
    shadow_mode: {foo_shadow}
    rate_limit:
      unit: minute
      requests_per_unit: 10
  - key: hello
    shadow_mode: {hello_shadow}
    rate_limit:
      unit: minute
      requests_per_unit: 10
"
    )
}

// reference: test/service/ratelimit_test.go TestRuleShadowMode and TestMixedRuleShadowMode
#[tokio::test]
async fn rule_shadow_mode_never_refuses() {
    // Whether `hello` is in shadow mode (`foo` is), then the overall code and hello's.
    for (hello_shadow, code) in [(true, OK), (false, OVER)] {
        let rules = two_rules(true, hello_shadow);
        let mut s = Rls::start(REFERENCE_DEFAULTS, &[("d.yaml", &rules)], T_2222).await;
        s.fill("different-domain", &[("foo", "bar")], 10).await;
        s.fill("different-domain", &[("hello", "world")], 10).await;
        let r = s.ask(simple("different-domain", FOO_HELLO, 1)).await;
        let statuses = vec![
            status(OK, 10, Unit::Minute, 0, 58),
            status(code, 10, Unit::Minute, 0, 58),
        ];
        assert_eq!(
            r,
            response(code, statuses),
            "hello shadowed: {hello_shadow}"
        );
        s.stop().await;
    }
}

// reference: test/service/ratelimit_test.go TestServiceWithDefaultRatelimitHeaders
//
// (TestServiceWithCustomRatelimitHeaders renames the three headers with LIMIT_LIMIT_HEADER,
// LIMIT_REMAINING_HEADER and LIMIT_RESET_HEADER; Sluice has no such setting: see the parity
// table.)
#[tokio::test]
async fn draft03_headers_as_the_reference_sends_them() {
    let mut s = service_server("  response_headers: draft03\n").await;
    s.fill("different-domain", &[("foo", "bar")], 10).await;
    let r = s.ask(simple("different-domain", FOO_HELLO, 1)).await;
    assert_eq!(r.overall_code, OVER as i32);
    assert_eq!(
        r.statuses,
        vec![named(OVER, "key_name", 10, Unit::Minute, 0, 58), no_limit()]
    );
    assert_eq!(
        headers(&r),
        pairs(&[
            ("RateLimit-Limit", "10"),
            ("RateLimit-Remaining", "0"),
            ("RateLimit-Reset", "58"),
        ])
    );
    s.stop().await;
}

/// The reference's choice of descriptor for its headers (`shouldRateLimitWorker`): the one
/// with the least `limit_remaining` among those with a limit, except that a descriptor over
/// its limit (not in quota mode) is always chosen, the last such one winning; none when no
/// descriptor has a limit. Headers are sent on allowed answers too.
#[tokio::test]
async fn draft03_headers_describe_the_descriptor_closest_to_its_limit() {
    let rules = "\
domain: d
descriptors:
  - key: per_minute
    rate_limit:
      unit: minute
      requests_per_unit: 10
  - key: per_hour
    rate_limit:
      unit: hour
      requests_per_unit: 5
";
    let mut s = Rls::start(
        "  response_headers: draft03\n",
        &[("d.yaml", rules)],
        T_2222,
    )
    .await;
    let both: &[&[(&str, &str)]] = &[&[("per_minute", "a")], &[("per_hour", "a")]];
    // Allowed: 9 left of 10 per minute, 4 of 5 per hour: the hourly limit is closer.
    let r = s.ask(simple("d", both, 1)).await;
    assert_eq!(r.overall_code, OK as i32);
    assert_eq!(
        headers(&r),
        pairs(&[
            ("RateLimit-Limit", "5"),
            ("RateLimit-Remaining", "4"),
            ("RateLimit-Reset", "1378"),
        ])
    );
    // Both over their limits: the last one is reported.
    s.fill("d", &[("per_minute", "a")], 9).await;
    s.fill("d", &[("per_hour", "a")], 4).await;
    let r = s.ask(simple("d", both, 1)).await;
    assert_eq!(r.overall_code, OVER as i32);
    assert_eq!(
        headers(&r),
        pairs(&[
            ("RateLimit-Limit", "5"),
            ("RateLimit-Remaining", "0"),
            ("RateLimit-Reset", "1378"),
        ])
    );
    let r = s
        .ask(simple(
            "d",
            &[&[("per_hour", "a")], &[("per_minute", "a")]],
            1,
        ))
        .await;
    assert_eq!(
        headers(&r),
        pairs(&[
            ("RateLimit-Limit", "10"),
            ("RateLimit-Remaining", "0"),
            ("RateLimit-Reset", "58"),
        ])
    );
    // No descriptor with a limit: no headers.
    let r = s.ask(simple("d", &[&[("nothing", "x")]], 1)).await;
    assert!(r.response_headers_to_add.is_empty(), "{r:?}");
    s.stop().await;
}

/// Sluice's default headers (not the reference's): the IETF draft's `RateLimit-Policy` and
/// `RateLimit`, one item per limited descriptor; `off` sends none.
#[tokio::test]
async fn ietf_headers_by_default_and_none_when_off() {
    let mut s = service_server("").await;
    let r = s.ask(simple("different-domain", FOO_HELLO, 1)).await;
    assert_eq!(r.overall_code, OK as i32);
    assert_eq!(
        headers(&r),
        pairs(&[
            ("RateLimit-Policy", "\"key_name\";q=10;w=60"),
            ("RateLimit", "\"key_name\";r=9;t=58"),
        ])
    );
    s.stop().await;

    let mut s = service_server(REFERENCE_DEFAULTS).await;
    let r = s
        .ask(simple("different-domain", &[&[("foo", "bar")]], 1))
        .await;
    assert!(r.response_headers_to_add.is_empty(), "{r:?}");
    s.stop().await;
}

// reference: test/service/ratelimit_test.go TestEmptyDomain and TestEmptyDescriptors
//
// The reference returns a plain error, which gRPC sends as UNKNOWN; Sluice says
// INVALID_ARGUMENT, with the reference's message. Envoy treats both alike (an error: its
// `failure_mode_deny` decides).
#[tokio::test]
async fn an_empty_domain_or_descriptor_list_is_an_error() {
    let mut s = service_server(REFERENCE_DEFAULTS).await;
    let e = s.refused(simple("", &[&[("hello", "world")]], 1)).await;
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert_eq!(e.message(), "rate limit domain must not be empty");
    let e = s.refused(simple("test-domain", &[], 1)).await;
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert_eq!(e.message(), "rate limit descriptor list must not be empty");
    s.stop().await;
}

// reference: test/service/ratelimit_test.go TestInitialLoadError
// ("no rate limit configuration loaded")
//
// Sluice loads its rule directory before it serves (a broken directory stops the start), so
// the one way to have no configuration is a server without an `rls` section: an error
// (FAILED_PRECONDITION), never an answer.
#[tokio::test]
async fn no_rate_limit_configuration_is_an_error() {
    let server = support::TestServer::start("{}\n", &[]).await;
    let mut client = RateLimitServiceClient::new(server.channel().await);
    let e = client
        .should_rate_limit(simple("test-domain", &[&[("hello", "world")]], 1))
        .await
        .unwrap_err();
    support::assert_status(
        &e,
        tonic::Code::FailedPrecondition,
        "no Envoy rate limit configuration",
    );
    server.stop().await;
}

// reference: test/service/ratelimit_test.go TestCacheError
//
// The reference answers the store's error as an error (gRPC UNKNOWN, "cache error"); Sluice
// answers UNAVAILABLE. Either way Envoy's `failure_mode_deny` decides. Over Redis, paused.
#[tokio::test]
async fn a_store_error_is_an_error() {
    let Some((redis, settings)) = support::with_redis(REFERENCE_DEFAULTS, "200ms") else {
        return;
    };
    let mut s = Rls::start(&settings, &[("different.yaml", DIFFERENT_DOMAIN)], T_2222).await;
    let r = s
        .ask(simple("different-domain", &[&[("foo", "bar")]], 1))
        .await;
    assert_eq!(r.statuses[0].limit_remaining, 9);
    redis.pause().unwrap();
    let e = s
        .client
        .should_rate_limit(simple("different-domain", &[&[("foo", "bar")]], 1))
        .await;
    redis.resume().unwrap();
    let e = e.unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unavailable);
    s.stop().await;
}

// reference: test/service/ratelimit_test.go TestUnlimited
#[tokio::test]
async fn unlimited_descriptors_are_ok_and_never_counted() {
    let rules = "\
domain: some-domain
descriptors:
  - key: foo
    rate_limit:
      unit: minute
      requests_per_unit: 10
  - key: baz
    rate_limit:
      unlimited: true
";
    let mut s = Rls::start(REFERENCE_DEFAULTS, &[("d.yaml", rules)], T_2222).await;
    let three: &[&[(&str, &str)]] = &[&[("foo", "bar")], &[("hello", "world")], &[("baz", "qux")]];
    let r = s.ask(simple("some-domain", three, 1)).await;
    assert_eq!(
        r,
        response(
            OK,
            vec![status(OK, 10, Unit::Minute, 9, 58), no_limit(), unlimited()]
        )
    );
    // Whatever the cost.
    let r = s
        .ask(simple("some-domain", &[&[("baz", "qux")]], 1_000_000))
        .await;
    assert_eq!(r, response(OK, vec![unlimited()]));
    s.stop().await;
}

// ---------------------------------------------------------------------------------------------
// Quota mode (test/service/ratelimit_test.go).
// ---------------------------------------------------------------------------------------------

/// `regular`: 5 per minute; `quota`: 3 per minute in quota mode; `quota1` and `quota2`: 5 and
/// 3 per minute in quota mode.
const QUOTA_DOMAIN: &str = "\
domain: quota-domain
descriptors:
  - key: regular
    rate_limit:
      unit: minute
      requests_per_unit: 5
  - key: quota
    quota_mode: true
    rate_limit:
      unit: minute
      requests_per_unit: 3
  - key: quota1
    quota_mode: true
    rate_limit:
      unit: minute
      requests_per_unit: 5
  - key: quota2
    quota_mode: true
    rate_limit:
      unit: minute
      requests_per_unit: 3
";

async fn quota_server(settings: &str) -> Rls {
    Rls::start(settings, &[("quota.yaml", QUOTA_DOMAIN)], T_2222).await
}

const REGULAR_AND_QUOTA: &[&[(&str, &str)]] = &[&[("regular", "limit")], &[("quota", "limit")]];
const QUOTA1_AND_QUOTA2: &[&[(&str, &str)]] = &[&[("quota1", "limit")], &[("quota2", "limit")]];

/// One quota-mode case of the reference's service tests, on [`QUOTA_DOMAIN`].
struct QuotaCase {
    /// The reference's test.
    name: &'static str,
    settings: &'static str,
    /// The counters brought to their limits first: `(key, hits)`, of value `limit`.
    filled: &'static [(&'static str, u32)],
    asked: &'static [&'static [(&'static str, &'static str)]],
    /// The answer: the overall code, then each descriptor's code, limit and remaining (per
    /// minute, 58 seconds to the reset).
    overall: Code,
    statuses: [(Code, u32, u32); 2],
    /// What is left afterwards of these keys, counting nothing.
    left: &'static [(&'static str, u32)],
}

const SHADOW: &str = "  response_headers: off\n  shadow_mode: true\n";

const QUOTA_CASES: &[QuotaCase] = &[
    // Sluice: the refused request's quota descriptor is refunded, so it reports its 3 (the
    // reference would have counted it).
    QuotaCase {
        name: "TestServicePerDescriptorQuotaMode",
        settings: REFERENCE_DEFAULTS,
        filled: &[("regular", 5)],
        asked: REGULAR_AND_QUOTA,
        overall: OVER,
        statuses: [(OVER, 5, 0), (OK, 3, 3)],
        left: &[],
    },
    // Sluice: the regular descriptor is refunded (5 left).
    QuotaCase {
        name: "TestServiceMixedPerDescriptorModes",
        settings: REFERENCE_DEFAULTS,
        filled: &[("quota", 3)],
        asked: REGULAR_AND_QUOTA,
        overall: OVER,
        statuses: [(OK, 5, 5), (OVER, 3, 0)],
        left: &[],
    },
    QuotaCase {
        name: "TestServiceMixedPerDescriptorModesUnderLimit",
        settings: REFERENCE_DEFAULTS,
        filled: &[],
        asked: REGULAR_AND_QUOTA,
        overall: OK,
        statuses: [(OK, 5, 4), (OK, 3, 2)],
        left: &[],
    },
    QuotaCase {
        name: "TestServiceQuotaModeOnlyAllOverTheLimit",
        settings: REFERENCE_DEFAULTS,
        filled: &[("quota1", 5), ("quota2", 3)],
        asked: QUOTA1_AND_QUOTA2,
        overall: OVER,
        statuses: [(OVER, 5, 0), (OVER, 3, 0)],
        left: &[],
    },
    // Allowed, and the descriptor over its quota keeps its OVER_LIMIT status. The request
    // was admitted: quota2's charge stands; quota1 was not counted past its limit.
    QuotaCase {
        name: "TestServiceQuotaModeOnlySomeOverTheLimit",
        settings: REFERENCE_DEFAULTS,
        filled: &[("quota1", 5)],
        asked: QUOTA1_AND_QUOTA2,
        overall: OK,
        statuses: [(OVER, 5, 0), (OK, 3, 2)],
        left: &[("quota2", 2), ("quota1", 0)],
    },
    QuotaCase {
        name: "TestServiceQuotaModeWithShadowMode",
        settings: SHADOW,
        filled: &[("quota1", 5), ("quota2", 3)],
        asked: QUOTA1_AND_QUOTA2,
        overall: OK,
        statuses: [(OVER, 5, 0), (OVER, 3, 0)],
        left: &[],
    },
    QuotaCase {
        name: "TestServiceMixedModeWithShadowMode",
        settings: SHADOW,
        filled: &[("regular", 5), ("quota", 3)],
        asked: REGULAR_AND_QUOTA,
        overall: OK,
        statuses: [(OVER, 5, 0), (OVER, 3, 0)],
        left: &[],
    },
];

// reference: test/service/ratelimit_test.go, each test of [`QUOTA_CASES`].
#[tokio::test]
async fn quota_mode_per_descriptor_and_with_global_shadow_mode() {
    for case in QUOTA_CASES {
        let mut s = quota_server(case.settings).await;
        for (key, hits) in case.filled {
            s.fill("quota-domain", &[(key, "limit")], *hits).await;
        }
        let r = s.ask(simple("quota-domain", case.asked, 1)).await;
        let statuses = case
            .statuses
            .iter()
            .map(|&(code, limit, left)| status(code, limit, Unit::Minute, left, 58))
            .collect();
        assert_eq!(r, response(case.overall, statuses), "{}", case.name);
        for (key, left) in case.left {
            let now = s.left("quota-domain", &[(key, "limit")]).await;
            assert_eq!(now, *left, "{}: {key}", case.name);
        }
        s.stop().await;
    }
}

/// `foo` 10 per minute and `hello` 5 per minute, neither in quota mode.
const GLOBAL_QUOTA_RULES: &str = "\
domain: quota-domain
descriptors:
  - key: foo
    rate_limit:
      unit: minute
      requests_per_unit: 10
  - key: hello
    rate_limit:
      unit: minute
      requests_per_unit: 5
";

// reference: test/service/ratelimit_test.go TestServiceGlobalQuotaMode
#[tokio::test]
async fn global_quota_mode() {
    let settings = "  response_headers: off\n  quota_mode: true\n";
    let mut s = Rls::start(settings, &[("q.yaml", GLOBAL_QUOTA_RULES)], T_2222).await;
    s.fill("quota-domain", &[("foo", "bar")], 10).await;
    // One of the two over: every descriptor is in quota mode, so the request passes.
    let r = s.ask(simple("quota-domain", FOO_HELLO, 1)).await;
    assert_eq!(
        r,
        response(
            OK,
            vec![
                status(OVER, 10, Unit::Minute, 0, 58),
                status(OK, 5, Unit::Minute, 4, 58)
            ]
        )
    );
    // Both over: refused (the reference's case).
    s.fill("quota-domain", &[("hello", "world")], 4).await;
    let r = s.ask(simple("quota-domain", FOO_HELLO, 1)).await;
    assert_eq!(
        r,
        response(
            OVER,
            vec![
                status(OVER, 10, Unit::Minute, 0, 58),
                status(OVER, 5, Unit::Minute, 0, 58)
            ]
        )
    );
    // Under the global quota mode, a descriptor no rule limits counts as a quota-mode
    // descriptor that passed (the reference's `shouldRateLimitWorker` counts every
    // descriptor but the unlimited ones): the request passes.
    let r = s
        .ask(simple(
            "quota-domain",
            &[&[("foo", "bar")], &[("nothing", "matches")]],
            1,
        ))
        .await;
    assert_eq!(
        r,
        response(OK, vec![status(OVER, 10, Unit::Minute, 0, 58), no_limit()])
    );
    s.stop().await;
}

// ---------------------------------------------------------------------------------------------
// The limit a request descriptor carries (test/config/config_test.go TestConfigLimitOverride,
// `GetLimit` in src/config/config_impl.go).
// ---------------------------------------------------------------------------------------------

const OVERRIDE_RULES: &str = "\
domain: test-domain
descriptors:
  - key: key2
    rate_limit:
      unit: minute
      requests_per_unit: 20
  - key: shadowed
    shadow_mode: true
    rate_limit:
      unit: minute
      requests_per_unit: 1
";

// reference: test/config/config_test.go TestConfigLimitOverride (served)
#[tokio::test]
async fn a_carried_limit_applies_and_shares_the_configured_counter() {
    let mut s = Rls::start(REFERENCE_DEFAULTS, &[("t.yaml", OVERRIDE_RULES)], T_2222).await;
    let minute = RateLimitUnit::Minute as i32;

    // Entries no rule limits: the carried limit applies.
    let entries: &[(&str, &str)] = &[("key1", "value1"), ("subkey1", "something")];
    for (code, overall, remaining) in [(OK, OK, 1), (OK, OK, 0), (OVER, OVER, 0)] {
        let r = s
            .ask(request(
                "test-domain",
                vec![carrying(desc(entries), 2, minute)],
                1,
            ))
            .await;
        assert_eq!(
            r,
            response(overall, vec![status(code, 2, Unit::Minute, remaining, 58)])
        );
    }

    // The same entries as a configured rule with the same unit: the same counter (the
    // reference's cache key is the domain, the entries and the window start, whatever the
    // limit), reported with the carried limit.
    s.fill("test-domain", &[("key2", "value2")], 3).await;
    let r = s
        .ask(request(
            "test-domain",
            vec![carrying(desc(&[("key2", "value2")]), 42, minute)],
            1,
        ))
        .await;
    assert_eq!(r, response(OK, vec![status(OK, 42, Unit::Minute, 38, 58)]));
    assert_eq!(s.left("test-domain", &[("key2", "value2")]).await, 16);

    // A carried limit is never in shadow mode, even where the configured rule is.
    let shadowed = || {
        request(
            "test-domain",
            vec![carrying(desc(&[("shadowed", "x")]), 1, minute)],
            1,
        )
    };
    let r = s.ask(shadowed()).await;
    assert_eq!(r.overall_code, OK as i32);
    let r = s.ask(shadowed()).await;
    assert_eq!(
        r,
        response(OVER, vec![status(OVER, 1, Unit::Minute, 0, 58)])
    );

    // An unknown domain: no limit, carried or not.
    let r = s
        .ask(request(
            "foo_domain",
            vec![carrying(desc(entries), 10, RateLimitUnit::Day as i32)],
            1,
        ))
        .await;
    assert_eq!(r, response(OK, vec![no_limit()]));

    // A carried limit without a unit: refused. (The reference has no answer for it: its
    // `UnitToDivider` panics, which ends the process.)
    let e = s
        .refused(request(
            "test-domain",
            vec![carrying(desc(entries), 10, RateLimitUnit::Unknown as i32)],
            1,
        ))
        .await;
    support::assert_status(
        &e,
        tonic::Code::InvalidArgument,
        "descriptors[0].limit.unit",
    );
    s.stop().await;
}

// ---------------------------------------------------------------------------------------------
// replaces (src/service/ratelimit.go constructLimitsToCheck; README example 7).
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn a_replaced_rule_is_neither_counted_nor_reported() {
    let mut s = Rls::start(REFERENCE_DEFAULTS, &[("e.yaml", EXAMPLE_7)], T_2222).await;
    let first: &[(&str, &str)] = &[("key_1", "value_1"), ("user", "bkthomps")];
    let second: &[(&str, &str)] = &[("key_2", "value_2"), ("user", "bkthomps")];
    let r = s.ask(simple("example7", &[first, second], 1)).await;
    assert_eq!(
        r,
        response(OK, vec![no_limit(), status(OK, 10, Unit::Second, 9, 1)])
    );
    // Alone, the replaced rule applies, and was not counted.
    let r = s.ask(simple("example7", &[first], 1)).await;
    assert_eq!(
        r,
        response(OK, vec![named(OK, "specific_limit", 5, Unit::Second, 4, 1)])
    );
    s.stop().await;
}

// ---------------------------------------------------------------------------------------------
// MERGE_DOMAIN_CONFIG and RUNTIME_IGNOREDOTFILES, as server settings.
// ---------------------------------------------------------------------------------------------

// reference: test/config/config_test.go TestDomainMerge (served, with `rls.merge_domains`),
// and RUNTIME_IGNOREDOTFILES (`rls.ignore_dot_files`): a Kubernetes ConfigMap's `..data`
// directory holds a file that does not load, and is skipped.
#[tokio::test]
async fn merged_domains_and_ignored_dot_files() {
    let key1 = "\
domain: test-domain
descriptors:
  - key: key1
    value: value1
    rate_limit:
      unit: minute
      requests_per_unit: 10
";
    let key2 = "\
domain: test-domain
descriptors:
  - key: key2
    value: value2
    rate_limit:
      unit: minute
      requests_per_unit: 20
";
    let settings = "  response_headers: off\n  merge_domains: true\n  ignore_dot_files: true\n";
    let mut s = Rls::start(
        settings,
        &[
            ("merge_domain_key1.yaml", key1),
            ("merge_domain_key2.yaml", key2),
            ("..2024_01_01/broken.yaml", "domain: [not valid\n"),
        ],
        T_2222,
    )
    .await;
    let r = s
        .ask(simple("test-domain", &[&[("key1", "value1")]], 1))
        .await;
    assert_eq!(r, response(OK, vec![status(OK, 10, Unit::Minute, 9, 58)]));
    let r = s
        .ask(simple("test-domain", &[&[("key2", "value2")]], 1))
        .await;
    assert_eq!(r, response(OK, vec![status(OK, 20, Unit::Minute, 19, 58)]));
    s.stop().await;
}

// ---------------------------------------------------------------------------------------------
// Counting: test/redis/fixed_cache_impl_test.go, src/utils/utilities.go GetHitsAddends.
// ---------------------------------------------------------------------------------------------

/// The rules behind the reference's cache tests: `key` 10 per second; `key2/subkey2` 10 per
/// minute (`key2` alone has no limit); `key3` 10 per hour with `subkey3` 10 per day; `key4`
/// 15 per hour, `key5` 14 per hour (in TestOverLimitWithStopCacheKeyIncrementWhenOverlimit)
/// or 20 per second (in TestNearLimit, where it is `key5b`); `key6` 8 per second; `key7` to
/// `key9` 20 per second; `key10` 10 per second.
const CACHE_RULES: &str = "\
domain: domain
descriptors:
  - key: key
    rate_limit: {unit: second, requests_per_unit: 10}
  - key: key2
    descriptors:
      - key: subkey2
        rate_limit: {unit: minute, requests_per_unit: 10}
  - key: key3
    rate_limit: {unit: hour, requests_per_unit: 10}
    descriptors:
      - key: subkey3
        rate_limit: {unit: day, requests_per_unit: 10}
  - key: key4
    rate_limit: {unit: hour, requests_per_unit: 15}
  - key: key5
    rate_limit: {unit: hour, requests_per_unit: 14}
  - key: key5b
    rate_limit: {unit: second, requests_per_unit: 20}
  - key: key6
    rate_limit: {unit: second, requests_per_unit: 8}
  - key: key7
    rate_limit: {unit: second, requests_per_unit: 20}
  - key: key8
    rate_limit: {unit: second, requests_per_unit: 20}
  - key: key9
    rate_limit: {unit: second, requests_per_unit: 20}
  - key: key10
    rate_limit: {unit: second, requests_per_unit: 10}
  - key: shadow4
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 15}
";

/// The store settings to run a counting test with: the memory store, or a fresh Redis.
async fn with_each_store<F, Fut>(test: F)
where
    F: Fn(String) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    test(REFERENCE_DEFAULTS.to_owned()).await;
    if let Some((_redis, settings)) = support::with_redis(REFERENCE_DEFAULTS, "2s") {
        test(settings).await;
    }
}

// reference: test/redis/fixed_cache_impl_test.go TestRedis (WithoutPerSecondRedis; the
// per-second Redis is a deployment choice Sluice does not have, see the parity table)
#[tokio::test]
async fn cache_counting_and_per_descriptor_hits() {
    with_each_store(|settings| async move {
        let mut s = Rls::start(&settings, &[("c.yaml", CACHE_RULES)], T_1234).await;
        // The counter holds 4: one more leaves 5.
        s.fill("domain", &[("key", "value")], 4).await;
        let r = s.ask(simple("domain", &[&[("key", "value")]], 1)).await;
        assert_eq!(r, response(OK, vec![status(OK, 10, Unit::Second, 5, 1)]));

        // A descriptor without a limit, and one at its limit: over, reset at the minute.
        s.fill(
            "domain",
            &[("key2", "value2"), ("subkey2", "subvalue2")],
            10,
        )
        .await;
        let r = s
            .ask(request(
                "domain",
                vec![
                    hits(desc(&[("key2", "value2")]), 0),
                    hits(desc(&[("key2", "value2"), ("subkey2", "subvalue2")]), 1),
                ],
                1,
            ))
            .await;
        assert_eq!(
            r,
            response(
                OVER,
                vec![no_limit(), status(OVER, 10, Unit::Minute, 0, 26)]
            )
        );

        // At 1000000: an hourly and a daily limit, both full. The hourly descriptor costs 0.
        s.clock.set(T_1000000);
        s.fill("domain", &[("key3", "value3")], 10).await;
        s.fill(
            "domain",
            &[("key3", "value3"), ("subkey3", "subvalue3")],
            10,
        )
        .await;
        let r = s
            .ask(request(
                "domain",
                vec![
                    hits(desc(&[("key3", "value3")]), 0),
                    hits(desc(&[("key3", "value3"), ("subkey3", "subvalue3")]), 1),
                ],
                1,
            ))
            .await;
        // The reference's hourly counter is at 11 (its over-limit requests were counted), so
        // its cost-0 check reports OVER_LIMIT. Sluice's counter never passes the limit: at
        // 10 of 10, a cost of 0 fits, OK with nothing left (as the reference answers at 10).
        assert_eq!(
            r,
            response(
                OVER,
                vec![
                    status(OK, 10, Unit::Hour, 0, 800),
                    status(OVER, 10, Unit::Day, 0, 36_800)
                ]
            )
        );
        s.stop().await;
    })
    .await;
}

// reference: test/redis/fixed_cache_impl_test.go TestNearLimit
//
// The reference also counts near-limit statistics here (NEAR_LIMIT_RATIO); Sluice has no such
// statistic: only the answers are compared.
#[tokio::test]
async fn near_limit_and_costs_above_one() {
    with_each_store(|settings| async move {
        let mut s = Rls::start(&settings, &[("c.yaml", CACHE_RULES)], T_1000000).await;
        let key4: &[(&str, &str)] = &[("key4", "value4")];
        s.fill("domain", key4, 10).await;
        let r = s.ask(simple("domain", &[key4], 1)).await;
        assert_eq!(r, response(OK, vec![status(OK, 15, Unit::Hour, 4, 800)]));
        s.fill("domain", key4, 1).await;
        let r = s.ask(simple("domain", &[key4], 1)).await;
        assert_eq!(r, response(OK, vec![status(OK, 15, Unit::Hour, 2, 800)]));
        s.fill("domain", key4, 2).await;
        let r = s.ask(simple("domain", &[key4], 1)).await;
        assert_eq!(
            r,
            response(OVER, vec![status(OVER, 15, Unit::Hour, 0, 800)])
        );

        // Costs above one, per second at 1234: (limit, already counted, cost, answer).
        s.clock.set(T_1234);
        let cases: [(&str, u32, u32, u32, Code, u32); 6] = [
            ("key5b", 20, 2, 3, OK, 15),
            ("key6", 8, 5, 2, OK, 1),
            ("key7", 20, 16, 3, OK, 1),
            ("key8", 20, 19, 3, OVER, 0),
            ("key9", 20, 15, 7, OVER, 0),
            ("key10", 10, 10, 3, OVER, 0),
        ];
        for (key, limit, counted, cost, code, remaining) in cases {
            let entries: &[(&str, &str)] = &[(key, "value")];
            if counted > 0 {
                s.fill("domain", entries, counted).await;
            }
            let r = s.ask(simple("domain", &[entries], cost)).await;
            assert_eq!(
                r,
                response(code, vec![status(code, limit, Unit::Second, remaining, 1)]),
                "{key}"
            );
            // Sluice: a refused cost is not counted, so what was left stays (the reference's
            // counter would now be `counted + cost`, past the limit).
            if code == OVER {
                assert_eq!(s.left("domain", entries).await, limit - counted, "{key}");
            }
        }
        s.stop().await;
    })
    .await;
}

// reference: test/redis/fixed_cache_impl_test.go TestOverLimitWithLocalCache and
// TestOverLimitWithLocalCacheShadowRule
//
// The reference's local cache (LOCAL_CACHE_SIZE_IN_BYTES) remembers keys over their limit to
// answer without asking Redis; its answers are the same as without it, which is what is
// compared here (its hit and miss statistics have no Sluice counterpart).
#[tokio::test]
async fn over_limit_again_with_and_without_shadow_mode() {
    let mut s = Rls::start(REFERENCE_DEFAULTS, &[("c.yaml", CACHE_RULES)], T_1000000).await;
    for (key, shadow) in [("key4", false), ("shadow4", true)] {
        let entries: &[(&str, &str)] = &[(key, "value4")];
        s.fill("domain", entries, 10).await;
        let mut seen = Vec::new();
        for fill in [0, 1, 2, 0] {
            if fill > 0 {
                s.fill("domain", entries, fill).await;
            }
            seen.push(s.ask(simple("domain", &[entries], 1)).await);
        }
        let over = if shadow { OK } else { OVER };
        let expected = vec![
            response(OK, vec![status(OK, 15, Unit::Hour, 4, 800)]),
            response(OK, vec![status(OK, 15, Unit::Hour, 2, 800)]),
            response(over, vec![status(over, 15, Unit::Hour, 0, 800)]),
            response(over, vec![status(over, 15, Unit::Hour, 0, 800)]),
        ];
        assert_eq!(seen, expected, "{key}");
    }
    s.stop().await;
}

// reference: test/redis/fixed_cache_impl_test.go
// TestOverLimitWithStopCacheKeyIncrementWhenOverlimitConfig
//
// With STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT, the reference stops counting the other
// descriptors of a request one of whose descriptors goes over: Sluice's all-or-nothing gives
// the same answers (and always, not as an option). The one difference: the reference still
// counts the descriptor that goes over (its counter passes the limit), Sluice does not.
#[tokio::test]
async fn the_other_descriptors_of_a_refused_request_are_not_counted() {
    with_each_store(|settings| async move {
        let mut s = Rls::start(&settings, &[("c.yaml", CACHE_RULES)], T_1000000).await;
        let key4: &[(&str, &str)] = &[("key4", "value4")];
        let key5: &[(&str, &str)] = &[("key5", "value5")];
        s.fill("domain", key4, 10).await;
        s.fill("domain", key5, 10).await;
        let both = |n: u64| request("domain", vec![hits(desc(key4), n), hits(desc(key5), n)], 1);
        let r = s.ask(both(1)).await;
        assert_eq!(
            r,
            response(
                OK,
                vec![
                    status(OK, 15, Unit::Hour, 4, 800),
                    status(OK, 14, Unit::Hour, 3, 800)
                ]
            )
        );
        let r = s.ask(both(2)).await;
        assert_eq!(
            r,
            response(
                OK,
                vec![
                    status(OK, 15, Unit::Hour, 2, 800),
                    status(OK, 14, Unit::Hour, 1, 800)
                ]
            )
        );
        let r = s.ask(both(2)).await;
        assert_eq!(
            r,
            response(
                OVER,
                vec![
                    status(OK, 15, Unit::Hour, 2, 800),
                    status(OVER, 14, Unit::Hour, 0, 800)
                ]
            )
        );
        assert_eq!(s.left("domain", key4).await, 2);
        // The reference (stop mode) counted key5 to 15 of 14; Sluice left it at 13.
        assert_eq!(s.left("domain", key5).await, 1);
        s.stop().await;
    })
    .await;
}

// reference: src/utils/utilities.go GetHitsAddends (as test/redis/fixed_cache_impl_test.go
// uses it through NewRateLimitRequestWithPerDescriptorHitsAddend)
#[tokio::test]
async fn the_cost_of_each_descriptor() {
    let mut s = Rls::start(REFERENCE_DEFAULTS, &[("c.yaml", CACHE_RULES)], T_1000000).await;
    let key4: &[(&str, &str)] = &[("key4", "a")];
    // The request's hits_addend unset (0, what Envoy sends): a cost of 1.
    let r = s.ask(simple("domain", &[key4], 0)).await;
    assert_eq!(r.statuses[0].limit_remaining, 14);
    // The request's hits_addend.
    let r = s.ask(simple("domain", &[key4], 3)).await;
    assert_eq!(r.statuses[0].limit_remaining, 11);
    // A descriptor's own hits_addend wins over the request's, 0 included (report only).
    let r = s.ask(request("domain", vec![hits(desc(key4), 2)], 5)).await;
    assert_eq!(r.statuses[0].limit_remaining, 9);
    let r = s.ask(request("domain", vec![hits(desc(key4), 0)], 5)).await;
    assert_eq!(r, response(OK, vec![status(OK, 15, Unit::Hour, 9, 800)]));
    // Each descriptor with its own cost.
    let key5: &[(&str, &str)] = &[("key5", "a")];
    let r = s
        .ask(request("domain", vec![hits(desc(key4), 4), desc(key5)], 2))
        .await;
    assert_eq!(
        (r.statuses[0].limit_remaining, r.statuses[1].limit_remaining),
        (5, 12)
    );
    s.stop().await;
}

/// `is_negative_hits` (a field of Envoy's API the reference ignores: it counts those hits
/// like any others) gives the hits back in Sluice.
#[tokio::test]
async fn negative_hits_give_back() {
    let mut s = Rls::start(REFERENCE_DEFAULTS, &[("c.yaml", CACHE_RULES)], T_1000000).await;
    let key4: &[(&str, &str)] = &[("key4", "a")];
    s.fill("domain", key4, 5).await;
    let mut back = hits(desc(key4), 3);
    back.is_negative_hits = true;
    let r = s.ask(request("domain", vec![back], 1)).await;
    assert_eq!(r, response(OK, vec![status(OK, 15, Unit::Hour, 13, 800)]));
    assert_eq!(s.left("domain", key4).await, 13);
    s.stop().await;
}

// ---------------------------------------------------------------------------------------------
// test/integration/integration_test.go
// ---------------------------------------------------------------------------------------------

/// The reference integration tests' `basic.yaml`.
const INTEGRATION_BASIC: &str = "\
domain: basic
descriptors:
  - key: key1
    rate_limit:
      unit: second
      requests_per_unit: 50
  - key: key1_local
    rate_limit:
      unit: second
      requests_per_unit: 50
  - key: one_per_minute
    rate_limit:
      unit: minute
      requests_per_unit: 1
";

/// The reference integration tests' `another.yaml`.
const INTEGRATION_ANOTHER: &str = "\
domain: another
descriptors:
  - key: key2
    rate_limit:
      unit: minute
      requests_per_unit: 20
  - key: key3
    rate_limit:
      unit: hour
      requests_per_unit: 10
  - key: key2_local
    rate_limit:
      unit: minute
      requests_per_unit: 20
  - key: key3_local
    rate_limit:
      unit: hour
      requests_per_unit: 10
  - key: key4
    rate_limit:
      unit: day
      requests_per_unit: 20
  - key: key4_local
    rate_limit:
      unit: day
      requests_per_unit: 20
";

/// A day boundary (19675 days after the epoch) plus 30 seconds, in milliseconds: 1 second
/// to the next second, 30 to the next minute, 3570 to the next hour, 86370 to the next day.
const T_INTEGRATION: u64 = (1_699_920_000 + 30) * 1_000;

/// reference: test/integration/integration_test.go testBasicBaseConfig, with `suffix` ""
/// or "_local" as the reference's `getCacheKey` (the local cache's variant uses other keys).
async fn basic_base_config(settings: &str, suffix: &str) -> Rls {
    let mut s = Rls::start(
        settings,
        &[
            ("basic.yaml", INTEGRATION_BASIC),
            ("another.yaml", INTEGRATION_ANOTHER),
        ],
        T_INTEGRATION,
    )
    .await;
    let key = |k: &str| format!("{k}{suffix}");
    let (hello, key1, key2, key3, key4) = (
        key("hello"),
        key("key1"),
        key("key2"),
        key("key3"),
        key("key4"),
    );
    let (hello, key1, key2, key3, key4) = (
        hello.as_str(),
        key1.as_str(),
        key2.as_str(),
        key3.as_str(),
        key4.as_str(),
    );

    // An unknown domain.
    let r = s.ask(simple("foo", &[&[(hello, "world")]], 1)).await;
    assert_eq!(r, response(OK, vec![no_limit()]));

    let r = s.ask(simple("basic", &[&[(key1, "foo")]], 1)).await;
    assert_eq!(r, response(OK, vec![status(OK, 50, Unit::Second, 49, 1)]));

    // 25 requests against 20 per minute.
    let value = "1234567";
    for i in 0..25u32 {
        let r = s.ask(simple("another", &[&[(key2, value)]], 1)).await;
        let (code, remaining) = if i >= 20 {
            (OVER, 0)
        } else {
            (OK, 20 - (i + 1))
        };
        assert_eq!(
            r,
            response(code, vec![status(code, 20, Unit::Minute, remaining, 30)]),
            "request {i}"
        );
    }

    // Two descriptors: 20 per minute and 10 per hour, 15 requests.
    let value = "7654321";
    for i in 0..15u32 {
        let r = s
            .ask(simple("another", &[&[(key2, value)], &[(key3, value)]], 1))
            .await;
        let (code, remaining1, remaining2) = if i >= 10 {
            // The reference (default settings) keeps counting key2 (remaining 20 - (i + 1));
            // with STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT it stays at 10, as in Sluice,
            // which counts only admitted requests.
            (OVER, 10, 0)
        } else {
            (OK, 20 - (i + 1), 10 - (i + 1))
        };
        assert_eq!(
            r,
            response(
                code,
                vec![
                    status(OK, 20, Unit::Minute, remaining1, 30),
                    status(code, 10, Unit::Hour, remaining2, 3570)
                ]
            ),
            "request {i}"
        );
    }

    // duration_until_reset counts down (the reference sleeps 2 seconds; the clock moves).
    let first = s.ask(simple("another", &[&[(key4, "durTest")]], 1)).await;
    s.clock.advance(2_000);
    let second = s.ask(simple("another", &[&[(key4, "durTest")]], 1)).await;
    assert_eq!(
        first,
        response(OK, vec![status(OK, 20, Unit::Day, 19, 86_370)])
    );
    assert_eq!(
        second,
        response(OK, vec![status(OK, 20, Unit::Day, 18, 86_368)])
    );
    s
}

// reference: test/integration/integration_test.go TestBasicConfig (WithoutPerSecondRedis,
// WithoutPerSecondRedisWithLocalCache) and TestBasicConfigMemcache, over the memory store.
#[tokio::test]
async fn integration_basic_config_in_memory() {
    for suffix in ["", "_local"] {
        basic_base_config(REFERENCE_DEFAULTS, suffix)
            .await
            .stop()
            .await;
    }
}

// reference: test/integration/integration_test.go TestBasicConfig
// (WithoutPerSecondRedisWithCachePrefix), over Redis with a key prefix.
#[tokio::test]
async fn integration_basic_config_over_redis_with_a_key_prefix() {
    let Some((redis, settings)) = support::with_redis(REFERENCE_DEFAULTS, "2s") else {
        return;
    };
    let settings = format!("{settings}  key_prefix: \"prefix:\"\n");
    let s = basic_base_config(&settings, "").await;
    // Every counter is under the prefix, and carries the reference's counter key (though not
    // the reference's whole Redis key: see the parity table).
    let keys = match redis.cmd(&["KEYS", "*"]).unwrap() {
        redis::Value::Array(keys) => keys
            .into_iter()
            .map(|k| match k {
                redis::Value::BulkString(b) => String::from_utf8(b).unwrap(),
                other => panic!("{other:?}"),
            })
            .collect::<Vec<_>>(),
        other => panic!("{other:?}"),
    };
    assert!(!keys.is_empty());
    assert!(keys.iter().all(|k| k.starts_with("prefix:")), "{keys:?}");
    assert!(
        keys.iter().any(|k| k.contains("basic_key1_foo_")),
        "{keys:?}"
    );
    s.stop().await;
}

// reference: test/integration/integration_test.go TestShareThreshold
#[tokio::test]
async fn integration_share_threshold() {
    let rules = "\
domain: share-threshold-test
descriptors:
  - key: files
    value: files/*
    share_threshold: true
    rate_limit:
      unit: hour
      requests_per_unit: 10
  - key: files_no_share
    value: files_no_share/*
    rate_limit:
      unit: hour
      requests_per_unit: 10
";
    let mut s = Rls::start(REFERENCE_DEFAULTS, &[("s.yaml", rules)], T_INTEGRATION).await;
    let domain = "share-threshold-test";
    for i in 0..10u32 {
        let r = s
            .ask(simple(domain, &[&[("files", "files/a.pdf")]], 1))
            .await;
        assert_eq!(
            r,
            response(OK, vec![status(OK, 10, Unit::Hour, 9 - i, 3570)]),
            "request {i}"
        );
    }
    // Another value under files/* shares the same, exhausted, threshold.
    let r = s
        .ask(simple(domain, &[&[("files", "files/b.csv")]], 1))
        .await;
    assert_eq!(
        r,
        response(OVER, vec![status(OVER, 10, Unit::Hour, 0, 3570)])
    );
    // Without share_threshold, each value has its own threshold.
    for i in 0..10 {
        let value = format!("files_no_share/{i}");
        let r = s
            .ask(simple(domain, &[&[("files_no_share", value.as_str())]], 1))
            .await;
        assert_eq!(r, response(OK, vec![status(OK, 10, Unit::Hour, 9, 3570)]));
    }
    s.stop().await;
}

// reference: test/integration/integration_test.go testConfigReload (the answers under
// `reload.yaml`; reloading itself is exercised by grpc.rs editing_the_rule_files_reloads_them)
#[tokio::test]
async fn integration_reload_rules() {
    let reload = "\
domain: reload
descriptors:
  - key: key1
    rate_limit:
      unit: second
      requests_per_unit: 50
  - key: block
    rate_limit:
      unit: second
      requests_per_unit: 0
  - key: one_per_minute
    rate_limit:
      unit: minute
      requests_per_unit: 1
";
    // Before the file exists, the domain is unknown: OK.
    let mut s = Rls::start(
        REFERENCE_DEFAULTS,
        &[("basic.yaml", INTEGRATION_BASIC)],
        T_INTEGRATION,
    )
    .await;
    let r = s.ask(simple("reload", &[&[("block", "foo")]], 1)).await;
    assert_eq!(r, response(OK, vec![no_limit()]));
    s.stop().await;

    let mut s = Rls::start(
        REFERENCE_DEFAULTS,
        &[("basic.yaml", INTEGRATION_BASIC), ("reload.yaml", reload)],
        T_INTEGRATION,
    )
    .await;
    let r = s.ask(simple("reload", &[&[("key1", "foo")]], 1)).await;
    assert_eq!(r, response(OK, vec![status(OK, 50, Unit::Second, 49, 1)]));
    // requests_per_unit: 0 blocks.
    let r = s.ask(simple("reload", &[&[("block", "foo")]], 1)).await;
    assert_eq!(r, response(OVER, vec![status(OVER, 0, Unit::Second, 0, 1)]));
    let r = s
        .ask(simple("reload", &[&[("one_per_minute", "foo")]], 1))
        .await;
    assert_eq!(r, response(OK, vec![status(OK, 1, Unit::Minute, 0, 30)]));
    let r = s
        .ask(simple("reload", &[&[("one_per_minute", "foo")]], 1))
        .await;
    assert_eq!(
        r,
        response(OVER, vec![status(OVER, 1, Unit::Minute, 0, 30)])
    );
    s.stop().await;
}
