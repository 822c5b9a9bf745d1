//! A policy with a concurrency limit: the layer takes a lease for each request and holds it
//! for the life of the response, releasing it when the response body is dropped, when the
//! request is cancelled (the client went away), or when the handler panics.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use common::{Handler, T0, TokioClock, header, limiter, peek, request};
use http::{Request, Response, StatusCode};
use sluice::{Clock, LimitSpec, Limiter, MemoryStore, Policy};
use sluice_tower::{KeyExtractor, RateLimitLayer};
use tokio::sync::Semaphore;
use tower::{Layer, ServiceExt};

const MAX: u64 = 2;

fn jobs() -> Policy {
    Policy::from_specs("jobs", vec![LimitSpec::concurrency(MAX, 60_000)]).unwrap()
}

/// Polls the store until `key` has `remaining` leases free; panics after 5 s. (The layer
/// releases from a spawned task, so the release lands shortly after the drop.)
async fn until_free<C: Clock>(limiter: &Limiter<MemoryStore, C>, remaining: u64) {
    for _ in 0..1_000 {
        let d = peek(limiter, "jobs", "k").await;
        if d.remaining() == remaining {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let d = peek(limiter, "jobs", "k").await;
    panic!("{} free after 5 s, expected {remaining}", d.remaining());
}

/// A handler that says when it has started, then waits for a permit of `gate` (or, with
/// `panics`, panics instead of answering).
/// A handler that adds a permit to `entered` when it starts (a permit per handler: `Notify`
/// keeps only one of two notifications given before anyone waits) and waits for `gate`.
fn gated(entered: Arc<Semaphore>, gate: Arc<Semaphore>, panics: bool) -> impl Handler {
    tower::service_fn(move |_req: Request<String>| {
        let (entered, gate) = (entered.clone(), gate.clone());
        async move {
            entered.add_permits(1);
            gate.acquire().await.unwrap().forget();
            assert!(!panics, "the handler failed");
            Ok::<_, Infallible>(Response::new("done".to_owned()))
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_is_held_while_the_handler_runs_and_until_the_body_is_dropped() {
    let limiter = limiter(TokioClock::new(T0), [jobs()]);
    let (entered, gate) = (Arc::new(Semaphore::new(0)), Arc::new(Semaphore::new(0)));
    let service = RateLimitLayer::new(limiter.clone(), jobs(), KeyExtractor::header("x-api-key"))
        .layer(gated(entered.clone(), gate.clone(), false));

    let slow: Vec<_> = (0..MAX)
        .map(|_| {
            let service = service.clone();
            tokio::spawn(async move { service.oneshot(request(Some("k"))).await.unwrap() })
        })
        .collect();
    entered.acquire_many(MAX as u32).await.unwrap().forget();
    // Both leases are held by handlers still running: a third request is refused.
    let third = service.clone().oneshot(request(Some("k"))).await.unwrap();
    assert_eq!(third.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        header(&third, "ratelimit-policy").as_deref(),
        Some("\"jobs:0\";q=2;qu=\"concurrent-requests\"")
    );

    gate.add_permits(MAX as usize);
    let mut responses = Vec::new();
    for task in slow {
        let r = task.await.unwrap();
        assert_eq!(r.status(), StatusCode::OK);
        responses.push(r);
    }
    // The handlers are done, but their responses (bodies) are still alive: still held.
    assert_eq!(peek(&limiter, "jobs", "k").await.remaining(), 0);
    let refused = service.clone().oneshot(request(Some("k"))).await.unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);

    // Sending one body to the client (reading it to the end, then dropping it) frees one.
    let first = responses.pop().unwrap();
    assert_eq!(common::text(first).await, "done");
    until_free(&limiter, 1).await;
    drop(responses);
    until_free(&limiter, 2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_request_releases_its_lease() {
    let limiter = limiter(TokioClock::new(T0), [jobs()]);
    let (entered, gate) = (Arc::new(Semaphore::new(0)), Arc::new(Semaphore::new(0)));
    let service = RateLimitLayer::new(limiter.clone(), jobs(), KeyExtractor::header("x-api-key"))
        .layer(gated(entered.clone(), gate, false));
    let task = tokio::spawn(service.oneshot(request(Some("k"))));
    entered.acquire().await.unwrap().forget();
    assert_eq!(peek(&limiter, "jobs", "k").await.remaining(), 1);
    task.abort();
    assert!(task.await.unwrap_err().is_cancelled());
    until_free(&limiter, 2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_handler_releases_its_lease() {
    let limiter = limiter(TokioClock::new(T0), [jobs()]);
    let (entered, gate) = (Arc::new(Semaphore::new(0)), Arc::new(Semaphore::new(0)));
    let service = RateLimitLayer::new(limiter.clone(), jobs(), KeyExtractor::header("x-api-key"))
        .layer(gated(entered.clone(), gate.clone(), true));
    let task = tokio::spawn(service.oneshot(request(Some("k"))));
    entered.acquire().await.unwrap().forget();
    assert_eq!(peek(&limiter, "jobs", "k").await.remaining(), 1);
    gate.add_permits(1);
    assert!(task.await.unwrap_err().is_panic());
    until_free(&limiter, 2).await;
}

/// Over a real socket: axum serves the layered handler, a client sends a request and closes
/// its connection while the handler runs; hyper drops the request's future, and the lease
/// goes with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_disconnects_releases_its_lease() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let limiter = limiter(TokioClock::new(T0), [jobs()]);
    // A permit per handler entered: `Notify` would keep one of two notifications given
    // before anyone waits, and the test would wait for ever for the second.
    let entered = Arc::new(Semaphore::new(0));
    let handler = {
        let entered = entered.clone();
        move || {
            let entered = entered.clone();
            async move {
                entered.add_permits(1);
                std::future::pending::<&'static str>().await
            }
        }
    };
    let app = axum::Router::new()
        .route("/", axum::routing::get(handler))
        .layer(RateLimitLayer::new(
            limiter.clone(),
            jobs(),
            KeyExtractor::header("x-api-key"),
        ));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move { axum::serve(listener, app).await });

    let request = b"GET / HTTP/1.1\r\nhost: sluice\r\nx-api-key: k\r\n\r\n";
    let mut held = tokio::net::TcpStream::connect(addr).await.unwrap();
    held.write_all(request).await.unwrap();
    let mut gone = tokio::net::TcpStream::connect(addr).await.unwrap();
    gone.write_all(request).await.unwrap();
    entered.acquire_many(2).await.unwrap().forget();
    assert_eq!(peek(&limiter, "jobs", "k").await.remaining(), 0);

    // A third client is refused while both are connected.
    let mut third = tokio::net::TcpStream::connect(addr).await.unwrap();
    third.write_all(request).await.unwrap();
    let mut head = [0u8; 12];
    third.read_exact(&mut head).await.unwrap();
    assert_eq!(&head, b"HTTP/1.1 429");

    drop(gone);
    until_free(&limiter, 1).await;
    drop(held);
    until_free(&limiter, 2).await;
    server.abort();
}
