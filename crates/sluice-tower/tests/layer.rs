//! The layer end to end through `tower::ServiceExt::oneshot`: headers, denials, refunds,
//! keys, policy choice, costs and stacking.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::{
    Inner, T0, TokioClock, header, headers_all, json, limiter, peek, policy, problem, request,
    statuses, text,
};
use http::{HeaderName, Request, Response, StatusCode};
use sluice::{LimitSpec, ManualClock, MemoryStore, Policy};
use sluice_tower::{KeyExtractor, PolicyChoice, RateLimitLayer};
use tower::{Layer, ServiceExt};

#[tokio::test]
async fn allowed_responses_carry_both_header_sets() {
    let clock = ManualClock::new(T0);
    let api = policy("api", 10, 1_000);
    let inner = Inner::default();
    let svc = RateLimitLayer::new(
        limiter(clock, [api.clone()]),
        api,
        KeyExtractor::header("x-api-key"),
    )
    .layer(inner.service());

    let r = svc.clone().oneshot(request(Some("k1"))).await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(header(&r, "x-ratelimit-limit").as_deref(), Some("10"));
    assert_eq!(header(&r, "x-ratelimit-remaining").as_deref(), Some("9"));
    assert_eq!(header(&r, "x-ratelimit-used").as_deref(), Some("1"));
    assert_eq!(
        header(&r, "x-ratelimit-reset").as_deref(),
        Some("1700000001")
    );
    assert_eq!(header(&r, "x-ratelimit-resource").as_deref(), Some("api"));
    assert_eq!(
        header(&r, "ratelimit-policy").as_deref(),
        Some("\"api:0\";q=10;w=1")
    );
    assert_eq!(
        header(&r, "ratelimit").as_deref(),
        Some("\"api:0\";r=9;t=1")
    );
    assert_eq!(header(&r, "retry-after"), None);
    assert_eq!(text(r).await, "inner");

    let r = svc.oneshot(request(Some("k1"))).await.unwrap();
    assert_eq!(header(&r, "x-ratelimit-used").as_deref(), Some("2"));
    assert_eq!(inner.calls(), 2);
}

#[tokio::test]
async fn denied_requests_get_429_problem_body_retry_after_and_headers() {
    let clock = ManualClock::new(T0);
    let api = Policy::from_specs(
        "api",
        vec![
            LimitSpec::fixed_window(2, 10_000),
            LimitSpec::fixed_window(100, 3_600_000),
        ],
    )
    .unwrap();
    let inner = Inner::default();
    let svc = RateLimitLayer::new(
        limiter(clock.clone(), []),
        api,
        KeyExtractor::header("x-api-key"),
    )
    .layer(inner.service());
    for _ in 0..2 {
        let r = svc.clone().oneshot(request(Some("k1"))).await.unwrap();
        assert_eq!(r.status(), StatusCode::OK);
    }
    clock.advance(2_500);

    let r = svc.clone().oneshot(request(Some("k1"))).await.unwrap();
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        inner.calls(),
        2,
        "a denied request never reaches the inner service"
    );
    assert_eq!(
        header(&r, "content-type").as_deref(),
        Some("application/problem+json")
    );
    // The 10 s window opened at T0; 7.5 s are left.
    assert_eq!(header(&r, "retry-after").as_deref(), Some("8"));
    assert_eq!(header(&r, "x-ratelimit-remaining").as_deref(), Some("0"));
    assert_eq!(header(&r, "x-ratelimit-used").as_deref(), Some("2"));
    assert_eq!(
        header(&r, "x-ratelimit-reset").as_deref(),
        Some("1700000010")
    );
    assert_eq!(
        header(&r, "ratelimit").as_deref(),
        Some("\"api:0\";r=0;t=8, \"api:1\";r=98;t=3598")
    );
    let body = json(r).await;
    assert_eq!(
        body,
        serde_json::json!({
            "type": "https://iana.org/assignments/http-problem-types#quota-exceeded",
            "title": "Quota Exceeded",
            "status": 429,
            "detail": "quota `api:0` exceeded: 2 per 10s, 0 left, this request costs 1; try again in 8 s",
            "violated-policies": ["api:0"],
            "policy": "api",
            "limit": 2,
            "remaining": 0,
            "reset": 1_700_000_010_u64,
            "retry_after": 8,
        })
    );
}

/// The layer for `policy` over a fresh limiter at `T0`, keyed by `x-api-key`.
fn by_key(policy: impl Into<PolicyChoice>) -> RateLimitLayer<MemoryStore, ManualClock> {
    RateLimitLayer::new(
        limiter(ManualClock::new(T0), []),
        policy,
        KeyExtractor::header("x-api-key"),
    )
}

/// [`by_key`], each request costing its `x-cost` header (1 without one).
fn costed(policy: Policy) -> RateLimitLayer<MemoryStore, ManualClock> {
    by_key(policy).cost(|parts| {
        parts
            .headers
            .get("x-cost")
            .and_then(|v| v.to_str().ok()?.parse().ok())
            .unwrap_or(1)
    })
}

#[tokio::test]
async fn a_cost_that_can_never_pass_has_no_retry_after() {
    let api = policy("api", 5, 1_000);
    let svc = costed(api).layer(Inner::default().service());
    let mut req = request(Some("k1"));
    req.headers_mut().insert("x-cost", "6".parse().unwrap());
    let r = svc.oneshot(req).await.unwrap();
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&r, "retry-after"), None);
    let body = json(r).await;
    assert_eq!(body["retry_after"], serde_json::Value::Null);
    assert_eq!(
        body["detail"],
        "this request costs 6, more than quota `api:0` (5 per 1s) can ever allow"
    );
}

/// A token bucket's limit is its burst, in the headers and in the denial's body alike: with
/// `100 per 1m, burst 20`, the limit was reported as 100 with 20 remaining, and a cost of 30
/// (below max, above the burst) was said to be "more than 100 per 1m can ever allow".
#[tokio::test]
async fn a_token_bucket_reports_its_burst_as_the_limit() {
    let uploads = Policy::from_specs(
        "uploads",
        vec![LimitSpec::token_bucket(100, 60_000).burst(20)],
    )
    .unwrap();
    let svc = costed(uploads).layer(Inner::default().service());
    let with_cost = |cost: &str| {
        let mut req = request(Some("k1"));
        req.headers_mut().insert("x-cost", cost.parse().unwrap());
        req
    };
    let r = svc.clone().oneshot(with_cost("15")).await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(header(&r, "x-ratelimit-limit").as_deref(), Some("20"));
    assert_eq!(header(&r, "x-ratelimit-remaining").as_deref(), Some("5"));
    assert_eq!(header(&r, "x-ratelimit-used").as_deref(), Some("15"));
    assert_eq!(
        header(&r, "ratelimit-policy").as_deref(),
        Some("\"uploads:0\";q=20;w=12")
    );
    let r = svc.clone().oneshot(with_cost("6")).await.unwrap();
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    let body = json(r).await;
    assert_eq!(
        (&body["limit"], &body["remaining"]),
        (&20.into(), &5.into())
    );
    assert_eq!(
        body["detail"],
        "quota `uploads:0` exceeded: 100 per 1m, burst 20, 5 left, this request costs 6; \
         try again in 1 s"
    );
    let r = svc.oneshot(with_cost("30")).await.unwrap();
    assert_eq!(
        json(r).await["detail"],
        "this request costs 30, more than quota `uploads:0` (100 per 1m, burst 20) can ever allow"
    );
}

#[tokio::test(start_paused = true)]
async fn a_denied_key_passes_again_once_retry_after_has_elapsed() {
    let api = policy("api", 1, 60_000);
    let inner = Inner::default();
    let svc = RateLimitLayer::new(
        limiter(TokioClock::new(T0), []),
        api,
        KeyExtractor::header("x-api-key"),
    )
    .layer(inner.service());
    assert_eq!(
        svc.clone()
            .oneshot(request(Some("k1")))
            .await
            .unwrap()
            .status(),
        StatusCode::OK
    );
    tokio::time::advance(Duration::from_millis(20_250)).await;
    let r = svc.clone().oneshot(request(Some("k1"))).await.unwrap();
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    let wait: u64 = header(&r, "retry-after").unwrap().parse().unwrap();
    assert_eq!(wait, 40, "39.75 s left, rounded up");

    tokio::time::advance(Duration::from_secs(wait - 1)).await;
    let r = svc.clone().oneshot(request(Some("k1"))).await.unwrap();
    assert_eq!(
        r.status(),
        StatusCode::TOO_MANY_REQUESTS,
        "one second early"
    );
    tokio::time::advance(Duration::from_secs(1)).await;
    let r = svc.oneshot(request(Some("k1"))).await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(inner.calls(), 2);
}

#[tokio::test]
async fn not_modified_responses_are_refunded() {
    let api = policy("api", 3, 60_000);
    let limiter = limiter(ManualClock::new(T0), [api.clone()]);
    let inner = Inner::default();
    let svc = RateLimitLayer::new(limiter.clone(), api, KeyExtractor::header("x-api-key"))
        .layer(inner.service());

    let r = svc.clone().oneshot(request(Some("k1"))).await.unwrap();
    assert_eq!(header(&r, "x-ratelimit-used").as_deref(), Some("1"));

    // Ten conditional requests, all answered 304: each is charged, then refunded.
    for _ in 0..10 {
        let mut req = request(Some("k1"));
        req.headers_mut()
            .insert("if-none-match", "\"v1\"".parse().unwrap());
        let r = svc.clone().oneshot(req).await.unwrap();
        assert_eq!(r.status(), StatusCode::NOT_MODIFIED);
        assert_eq!(header(&r, "x-ratelimit-used").as_deref(), Some("1"));
        assert_eq!(header(&r, "x-ratelimit-remaining").as_deref(), Some("2"));
    }
    assert_eq!(inner.calls(), 11);
    let d = peek(&limiter, "api", "k1").await;
    assert_eq!(d.binding().used(), 1, "only the 200 is counted");

    let r = svc.oneshot(request(Some("k1"))).await.unwrap();
    assert_eq!(header(&r, "x-ratelimit-used").as_deref(), Some("2"));
}

#[tokio::test]
async fn the_refund_predicate_is_configurable_and_errors_are_not_refunded() {
    let api = policy("api", 5, 60_000);
    let limiter = limiter(ManualClock::new(T0), [api.clone()]);
    // The inner service fails on /fail, answers 500 on /500 and 304 otherwise.
    let inner = tower::service_fn(|req: Request<String>| async move {
        match req.uri().path() {
            "/fail" => Err("inner failure"),
            "/500" => Ok(Response::builder()
                .status(StatusCode::INTERNAL_SERVER_ERROR)
                .body(String::new())
                .unwrap()),
            _ => Ok(Response::builder()
                .status(StatusCode::NOT_MODIFIED)
                .body(String::new())
                .unwrap()),
        }
    });
    let svc = RateLimitLayer::new(limiter.clone(), api, KeyExtractor::header("x-api-key"))
        .refund_if(|res| res.status.is_server_error())
        .layer(inner);
    let req = |path: &str| {
        Request::builder()
            .uri(path)
            .header("x-api-key", "k1")
            .body(String::new())
            .unwrap()
    };
    let used = || async { peek(&limiter, "api", "k1").await.binding().used() };

    let r = svc.clone().oneshot(req("/500")).await.unwrap();
    assert_eq!(r.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(used().await, 0, "5xx refunded by the custom predicate");

    let r = svc.clone().oneshot(req("/304")).await.unwrap();
    assert_eq!(r.status(), StatusCode::NOT_MODIFIED);
    assert_eq!(used().await, 1, "304 no longer refunded");

    let e = svc.oneshot(req("/fail")).await.unwrap_err();
    assert_eq!(e, "inner failure");
    assert_eq!(used().await, 2, "an inner error keeps the charge");
}

#[tokio::test]
async fn a_missing_key_is_refused_with_400_naming_the_header() {
    let api = policy("api", 5, 60_000);
    let inner = Inner::default();
    let svc = by_key(api).layer(inner.service());

    let r = svc.clone().oneshot(request(None)).await.unwrap();
    assert_eq!(
        problem(r, StatusCode::BAD_REQUEST).await,
        serde_json::json!({
            "type": "about:blank",
            "title": "Bad Request",
            "status": 400,
            "detail": "this endpoint is rate limited by the `x-api-key` header, and the request has none",
        })
    );

    let long = "k".repeat(513);
    let r = svc.oneshot(request(Some(&long))).await.unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    assert_eq!(
        json(r).await["detail"],
        "this endpoint is rate limited by the `x-api-key` header, which must be 1 to 512 bytes; got 513 bytes"
    );
    assert_eq!(inner.calls(), 0);
}

#[tokio::test]
async fn a_missing_key_can_fall_back_to_a_shared_key() {
    let api = policy("api", 2, 60_000);
    let limiter = limiter(ManualClock::new(T0), [api.clone()]);
    let inner = Inner::default();
    let svc = RateLimitLayer::new(limiter.clone(), api, KeyExtractor::header("x-api-key"))
        .fallback_key("anonymous")
        .layer(inner.service());

    let statuses = statuses(
        &svc,
        [
            request(None),
            request(None),
            request(None),
            request(Some("k1")),
        ],
    )
    .await;
    assert_eq!(
        statuses,
        [
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::TOO_MANY_REQUESTS,
            StatusCode::OK
        ],
        "keyless requests share `anonymous`; a keyed one has its own quota"
    );
    let d = peek(&limiter, "api", "anonymous").await;
    assert_eq!(d.binding().used(), 2);
    assert_eq!(inner.calls(), 3);
}

#[tokio::test]
async fn peer_ip_and_extension_extractors_key_by_client_and_user() {
    #[derive(Clone)]
    struct User(&'static str);

    let api = policy("api", 1, 60_000);
    let by_ip = RateLimitLayer::new(
        limiter(ManualClock::new(T0), []),
        api.clone(),
        KeyExtractor::peer_ip(),
    )
    .layer(Inner::default().service());
    let from = |ip: &str| {
        let mut r = request(None);
        // What a hyper accept loop inserts; axum's `ConnectInfo` is read too (unit-tested in
        // key.rs, it needs the `axum` feature).
        let addr: std::net::SocketAddr = format!("{ip}:5000").parse().unwrap();
        r.extensions_mut().insert(addr);
        r
    };
    let ip_statuses = statuses(
        &by_ip,
        [from("192.0.2.1"), from("192.0.2.2"), from("192.0.2.1")],
    )
    .await;
    assert_eq!(
        ip_statuses,
        [
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::TOO_MANY_REQUESTS
        ]
    );

    let by_user = RateLimitLayer::new(
        limiter(ManualClock::new(T0), []),
        api,
        KeyExtractor::extension(|u: &User| format!("user:{}", u.0)),
    )
    .layer(Inner::default().service());
    let as_user = |name: &'static str| {
        let mut r = request(None);
        r.extensions_mut().insert(User(name));
        r
    };
    let user_statuses = statuses(&by_user, [as_user("ann"), as_user("bob"), as_user("ann")]).await;
    assert_eq!(
        user_statuses,
        [
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::TOO_MANY_REQUESTS
        ]
    );
    let r = by_user.oneshot(request(None)).await.unwrap();
    assert_eq!(
        json(r).await["detail"],
        "this endpoint is rate limited by the `User` request extension, and the request has none"
    );
}

#[tokio::test]
async fn a_policy_chosen_per_request_and_none_passes_unlimited() {
    let search = policy("search", 1, 60_000);
    let api = policy("api", 2, 60_000);
    let (s, a) = (search.clone(), api.clone());
    let choice = PolicyChoice::from_fn(move |parts| match parts.uri.path() {
        "/healthz" => None,
        p if p.starts_with("/search") => Some(s.clone()),
        _ => Some(a.clone()),
    });
    let inner = Inner::default();
    let svc = by_key(choice).layer(inner.service());
    let get = |path: &str, key: Option<&str>| {
        let mut b = Request::builder().uri(path);
        if let Some(k) = key {
            b = b.header("x-api-key", k);
        }
        b.body(String::new()).unwrap()
    };

    for _ in 0..5 {
        // No key needed, nothing counted, no headers.
        let r = svc.clone().oneshot(get("/healthz", None)).await.unwrap();
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(header(&r, "x-ratelimit-limit"), None);
        assert_eq!(header(&r, "ratelimit"), None);
    }
    let r = svc
        .clone()
        .oneshot(get("/search?q=a", Some("k1")))
        .await
        .unwrap();
    assert_eq!(
        header(&r, "x-ratelimit-resource").as_deref(),
        Some("search")
    );
    let r = svc
        .clone()
        .oneshot(get("/search?q=b", Some("k1")))
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    let r = svc.oneshot(get("/items", Some("k1"))).await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(header(&r, "x-ratelimit-resource").as_deref(), Some("api"));
    assert_eq!(header(&r, "x-ratelimit-remaining").as_deref(), Some("1"));
    assert_eq!(inner.calls(), 7);
}

#[tokio::test]
async fn header_sets_can_be_switched_off() {
    let api = policy("api", 1, 60_000);
    let lim = limiter(ManualClock::new(T0), []);
    let ietf_only =
        RateLimitLayer::new(lim.clone(), api.clone(), KeyExtractor::header("x-api-key"))
            .github_headers(false)
            .layer(Inner::default().service());
    let r = ietf_only.clone().oneshot(request(Some("a"))).await.unwrap();
    assert_eq!(header(&r, "x-ratelimit-limit"), None);
    assert_eq!(
        header(&r, "ratelimit").as_deref(),
        Some("\"api:0\";r=0;t=60")
    );
    let r = ietf_only.oneshot(request(Some("a"))).await.unwrap();
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        header(&r, "retry-after").as_deref(),
        Some("60"),
        "Retry-After is not part of a set"
    );
    assert_eq!(header(&r, "x-ratelimit-remaining"), None);

    let none = RateLimitLayer::new(lim, api, KeyExtractor::header("x-api-key"))
        .github_headers(false)
        .ietf_headers(false)
        .layer(Inner::default().service());
    let r = none.oneshot(request(Some("b"))).await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let names: Vec<&HeaderName> = r.headers().keys().collect();
    assert!(names.is_empty(), "no headers expected, got {names:?}");
}

#[tokio::test]
async fn a_custom_denial_response_still_gets_the_rate_limit_headers() {
    let api = policy("api", 1, 60_000);
    let svc = by_key(api)
        .on_denied(|d, p| {
            Response::builder()
                .status(StatusCode::TOO_MANY_REQUESTS)
                .header("content-type", "text/plain")
                .header("retry-after", "3600")
                .body(Bytes::from(format!(
                    "slow down: {} allows {} per minute",
                    p.name(),
                    d.binding().max
                )))
                .unwrap()
        })
        .layer(Inner::default().service());
    svc.clone().oneshot(request(Some("k1"))).await.unwrap();
    let r = svc.oneshot(request(Some("k1"))).await.unwrap();
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&r, "content-type").as_deref(), Some("text/plain"));
    assert_eq!(
        header(&r, "retry-after").as_deref(),
        Some("3600"),
        "the closure's own value wins"
    );
    assert_eq!(header(&r, "x-ratelimit-remaining").as_deref(), Some("0"));
    assert_eq!(
        header(&r, "ratelimit").as_deref(),
        Some("\"api:0\";r=0;t=60")
    );
    assert_eq!(text(r).await, "slow down: api allows 1 per minute");
}

#[tokio::test]
async fn stacked_layers_show_the_tightest_github_set_and_every_ietf_item() {
    let per_ip = policy("per_ip", 100, 60_000);
    let per_user = policy("per_user", 3, 60_000);
    let lim = limiter(ManualClock::new(T0), []);
    let inner = Inner::default();
    // The user layer inside, the IP layer outside (as `ServiceBuilder` or axum's `.layer`
    // order it).
    let user_layer = RateLimitLayer::new(lim.clone(), per_user, KeyExtractor::header("x-api-key"));
    let ip_layer = RateLimitLayer::new(lim, per_ip, KeyExtractor::peer_ip());
    let svc = ip_layer.layer(user_layer.layer(inner.service()));
    let req = || {
        let mut r = request(Some("k1"));
        r.extensions_mut()
            .insert("192.0.2.1:1234".parse::<std::net::SocketAddr>().unwrap());
        r
    };

    let r = svc.clone().oneshot(req()).await.unwrap();
    assert_eq!(
        header(&r, "x-ratelimit-resource").as_deref(),
        Some("per_user")
    );
    assert_eq!(header(&r, "x-ratelimit-remaining").as_deref(), Some("2"));
    assert_eq!(
        headers_all(&r, "ratelimit"),
        ["\"per_user:0\";r=2;t=60", "\"per_ip:0\";r=99;t=60"]
    );
    assert_eq!(
        headers_all(&r, "ratelimit-policy"),
        ["\"per_user:0\";q=3;w=60", "\"per_ip:0\";q=100;w=60"]
    );
    for _ in 0..2 {
        svc.clone().oneshot(req()).await.unwrap();
    }
    // The user is out; the IP layer passed the request in (and counted it).
    let r = svc.oneshot(req()).await.unwrap();
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        header(&r, "x-ratelimit-resource").as_deref(),
        Some("per_user")
    );
    assert_eq!(
        headers_all(&r, "ratelimit"),
        ["\"per_user:0\";r=0;t=60", "\"per_ip:0\";r=96;t=60"]
    );
    assert_eq!(inner.calls(), 3);
}

#[tokio::test]
async fn the_layer_serves_an_axum_router() {
    let api = policy("api", 1, 60_000);
    let app = axum::Router::new()
        .route("/", axum::routing::get(|| async { "hello" }))
        .layer(by_key(api));
    let req = || {
        Request::builder()
            .uri("/")
            .header("x-api-key", "k1")
            .body(axum::body::Body::empty())
            .unwrap()
    };
    let r = app.clone().oneshot(req()).await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(header(&r, "x-ratelimit-remaining").as_deref(), Some("0"));
    let r = app.oneshot(req()).await.unwrap();
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        header(&r, "content-type").as_deref(),
        Some("application/problem+json")
    );
}
