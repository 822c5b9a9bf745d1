//! Charging at the start: however many requests are in flight at once, only `max` reach the
//! inner service.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::{Handler, T0, limiter, policy, request};
use http::{Request, Response, StatusCode};
use sluice::ManualClock;
use sluice_tower::{KeyExtractor, RateLimitLayer};
use tower::{Layer, ServiceExt};

/// An inner service that holds each request for `hold` (tokio time), counting calls and the
/// most requests it had in flight at once.
fn slow_inner(
    hold: Duration,
    calls: Arc<AtomicUsize>,
    in_flight: Arc<AtomicUsize>,
    peak: Arc<AtomicUsize>,
) -> impl Handler {
    tower::service_fn(move |_req: Request<String>| {
        let (calls, in_flight, peak) = (calls.clone(), in_flight.clone(), peak.clone());
        async move {
            calls.fetch_add(1, Ordering::SeqCst);
            let now = in_flight.fetch_add(1, Ordering::SeqCst) + 1;
            peak.fetch_max(now, Ordering::SeqCst);
            tokio::time::sleep(hold).await;
            in_flight.fetch_sub(1, Ordering::SeqCst);
            Ok::<_, Infallible>(Response::new(String::new()))
        }
    })
}

#[tokio::test(start_paused = true)]
async fn a_hundred_overlapping_requests_at_max_ten_let_exactly_ten_through() {
    let (calls, in_flight, peak) = Default::default();
    let calls: Arc<AtomicUsize> = calls;
    let peak: Arc<AtomicUsize> = peak;
    let svc = RateLimitLayer::new(
        limiter(ManualClock::new(T0), []),
        policy("api", 10, 60_000),
        KeyExtractor::header("x-api-key"),
    )
    .layer(slow_inner(
        Duration::from_secs(5),
        calls.clone(),
        in_flight,
        peak.clone(),
    ));
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..100 {
        let svc = svc.clone();
        tasks.spawn(async move { svc.oneshot(request(Some("k1"))).await.unwrap().status() });
    }
    let statuses = tasks.join_all().await;
    let ok = statuses.iter().filter(|s| **s == StatusCode::OK).count();
    let denied = statuses
        .iter()
        .filter(|s| **s == StatusCode::TOO_MANY_REQUESTS)
        .count();
    assert_eq!((ok, denied), (10, 90));
    assert_eq!(calls.load(Ordering::SeqCst), 10);
    assert_eq!(
        peak.load(Ordering::SeqCst),
        10,
        "the ten admitted requests were all in the inner service at once"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_hundred_parallel_requests_on_four_threads_let_exactly_ten_through() {
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = calls.clone();
    let inner = tower::service_fn(move |_req: Request<String>| {
        counted.fetch_add(1, Ordering::SeqCst);
        async { Ok::<_, Infallible>(Response::new(String::new())) }
    });
    let svc = RateLimitLayer::new(
        limiter(ManualClock::new(T0), []),
        policy("api", 10, 60_000),
        KeyExtractor::header("x-api-key"),
    )
    .layer(inner);
    let tasks: Vec<_> = (0..100)
        .map(|_| {
            let svc = svc.clone();
            tokio::spawn(async move { svc.oneshot(request(Some("k1"))).await.unwrap().status() })
        })
        .collect();
    let mut ok = 0;
    for t in tasks {
        if t.await.unwrap() == StatusCode::OK {
            ok += 1;
        }
    }
    assert_eq!(ok, 10);
    assert_eq!(calls.load(Ordering::SeqCst), 10);
}
