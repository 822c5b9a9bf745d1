//! What the layer answers when the store cannot: the policy's failure mode decides.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;

use common::{Inner, T0, header, problem, request};
use http::{HeaderName, StatusCode};
use sluice::{
    Call, Decision, FailureMode, LimitSpec, Limiter, ManualClock, Policy, Store, StoreError,
};
use sluice_tower::{KeyExtractor, RateLimitLayer};
use tower::{Layer, ServiceExt};

/// A store that is always down (a transient error), or holds corrupt state.
#[derive(Debug, Clone, Copy)]
enum Failing {
    Down,
    Corrupt,
}

impl Failing {
    fn error(self) -> StoreError {
        match self {
            Failing::Down => StoreError::Unavailable("connection refused (10.0.0.7:6379)".into()),
            Failing::Corrupt => StoreError::Corrupt {
                key: "sluice:{api:k1}:0".into(),
                detail: "not a hash".into(),
            },
        }
    }
}

impl Store for Failing {
    async fn call(&self, _: Call<'_>) -> Result<Decision, StoreError> {
        Err(self.error())
    }
}

fn api(mode: FailureMode) -> Policy {
    Policy::from_specs("api", vec![LimitSpec::fixed_window(2, 60_000)])
        .unwrap()
        .with_failure_mode(mode)
}

/// The layer over a store that fails so, for `api` under `mode`, keyed by `x-api-key`.
fn layer(store: Failing, mode: FailureMode) -> RateLimitLayer<Failing, ManualClock> {
    let limiter = Arc::new(Limiter::new(store).with_clock(ManualClock::new(T0)));
    RateLimitLayer::new(limiter, api(mode), KeyExtractor::header("x-api-key"))
}

#[tokio::test]
async fn a_closed_policy_answers_503_without_leaking_the_store_error() {
    let inner = Inner::default();
    let svc = layer(Failing::Down, FailureMode::Closed).layer(inner.service());
    let r = svc.oneshot(request(Some("k1"))).await.unwrap();
    assert_eq!(
        problem(r, StatusCode::SERVICE_UNAVAILABLE).await,
        serde_json::json!({
            "type": "about:blank",
            "title": "Service Unavailable",
            "status": 503,
            "detail": "the rate limiter's store cannot answer for policy `api`; try again later",
            "policy": "api",
        })
    );
    assert_eq!(inner.calls(), 0);
}

#[tokio::test]
async fn corrupt_state_is_503_even_for_an_open_policy() {
    let inner = Inner::default();
    let svc = layer(Failing::Corrupt, FailureMode::Open).layer(inner.service());
    let r = svc.oneshot(request(Some("k1"))).await.unwrap();
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(inner.calls(), 0);
}

#[tokio::test]
async fn an_open_policy_passes_through_without_numbers_and_marks_if_asked() {
    let inner = Inner::default();
    let layer = layer(Failing::Down, FailureMode::Open);
    let plain = layer.clone().layer(inner.service());
    for _ in 0..5 {
        // Also exercises the refund path: a 304 under an open decision asks the store nothing.
        let mut req = request(Some("k1"));
        req.headers_mut()
            .insert("if-none-match", "\"x\"".parse().unwrap());
        let r = plain.clone().oneshot(req).await.unwrap();
        assert_eq!(r.status(), StatusCode::NOT_MODIFIED);
        assert!(
            r.headers().is_empty(),
            "no made-up numbers: {:?}",
            r.headers()
        );
    }
    let marked = layer
        .degraded_header(HeaderName::from_static("x-ratelimit-degraded"))
        .layer(inner.service());
    let r = marked.oneshot(request(Some("k1"))).await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(header(&r, "x-ratelimit-degraded").as_deref(), Some("open"));
    assert_eq!(header(&r, "ratelimit"), None);
    assert_eq!(inner.calls(), 6);
}

#[tokio::test]
async fn a_local_policy_limits_with_the_insurance_store_and_shows_its_numbers() {
    let inner = Inner::default();
    let svc = layer(Failing::Down, FailureMode::Local)
        .degraded_header(HeaderName::from_static("x-ratelimit-degraded"))
        .layer(inner.service());
    let mut statuses = Vec::new();
    for _ in 0..3 {
        let r = svc.clone().oneshot(request(Some("k1"))).await.unwrap();
        assert_eq!(header(&r, "x-ratelimit-degraded").as_deref(), Some("local"));
        statuses.push((r.status(), header(&r, "x-ratelimit-remaining")));
    }
    assert_eq!(
        statuses,
        [
            (StatusCode::OK, Some("1".to_owned())),
            (StatusCode::OK, Some("0".to_owned())),
            (StatusCode::TOO_MANY_REQUESTS, Some("0".to_owned())),
        ]
    );
    assert_eq!(inner.calls(), 2);
}
