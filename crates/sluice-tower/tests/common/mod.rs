//! Helpers shared by the layer's tests: a limiter on a clock the test drives, an inner
//! service that counts its calls, and response readers.

#![allow(dead_code, unreachable_pub, clippy::unwrap_used, clippy::expect_used)]

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use http::{Request, Response, StatusCode};
use http_body_util::BodyExt;
use sluice::{Clock, Decision, LimitSpec, Limiter, MemoryStore, Op, Policy};
use sluice_tower::RateLimitBody;
use tower::ServiceExt;

/// 2023-11-14T22:13:20Z, a whole second.
pub const T0: u64 = 1_700_000_000_000;

/// Time as tokio sees it, so `tokio::time::pause` and `advance` move the limiter's clock.
#[derive(Debug, Clone)]
pub struct TokioClock {
    base_ms: u64,
    start: tokio::time::Instant,
}

impl TokioClock {
    /// Reads `base_ms` now, and moves with tokio's (paused) time.
    pub fn new(base_ms: u64) -> Self {
        Self {
            base_ms,
            start: tokio::time::Instant::now(),
        }
    }
}

impl Clock for TokioClock {
    fn now_ms(&self) -> u64 {
        self.base_ms + u64::try_from(self.start.elapsed().as_millis()).unwrap()
    }
}

/// A fixed-window policy of one limit.
pub fn policy(name: &str, max: u64, per_ms: u64) -> Policy {
    Policy::from_specs(name, vec![LimitSpec::fixed_window(max, per_ms)]).unwrap()
}

/// A memory-store limiter on `clock`, with `policies` registered (so tests can `peek`).
pub fn limiter<C: Clock>(
    clock: C,
    policies: impl IntoIterator<Item = Policy>,
) -> Arc<Limiter<MemoryStore, C>> {
    Arc::new(
        Limiter::new(MemoryStore::new())
            .with_clock(clock)
            .with_policies(policies),
    )
}

/// What `key` has now under the registered policy `name`: a peek of 0, which records nothing.
pub async fn peek<C: Clock>(limiter: &Limiter<MemoryStore, C>, name: &str, key: &str) -> Decision {
    let policy = limiter.policy(name).unwrap();
    limiter
        .call(policy, key, Op::Peek { cost: 0 })
        .await
        .unwrap()
}

/// A string-bodied service the layer can wrap and tests can clone into tasks.
pub trait Handler:
    tower::Service<Request<String>, Response = Response<String>, Error = Infallible, Future: Send>
    + Clone
    + Send
    + Sync
    + 'static
{
}

impl<S> Handler for S where
    S: tower::Service<
            Request<String>,
            Response = Response<String>,
            Error = Infallible,
            Future: Send,
        > + Clone
        + Send
        + Sync
        + 'static
{
}

/// An inner service answering `status` with body "inner", counting its calls.
#[derive(Clone, Debug, Default)]
pub struct Inner {
    pub calls: Arc<AtomicUsize>,
}

impl Inner {
    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    /// The service: answers 304 when the request has `if-none-match`, else 200.
    pub fn service(&self) -> impl Handler {
        let calls = Arc::clone(&self.calls);
        tower::service_fn(move |req: Request<String>| {
            calls.fetch_add(1, Ordering::SeqCst);
            async move {
                let mut response = Response::new("inner".to_owned());
                if req.headers().contains_key("if-none-match") {
                    *response.status_mut() = StatusCode::NOT_MODIFIED;
                }
                Ok::<_, Infallible>(response)
            }
        })
    }
}

/// A request with header `x-api-key: key` when `key` is given.
pub fn request(key: Option<&str>) -> Request<String> {
    let mut b = Request::builder().uri("/items/1");
    if let Some(key) = key {
        b = b.header("x-api-key", key);
    }
    b.body(String::new()).unwrap()
}

/// The status of each of `requests`, sent one after the other through a clone of `svc`.
pub async fn statuses<S, B>(
    svc: &S,
    requests: impl IntoIterator<Item = Request<String>>,
) -> Vec<StatusCode>
where
    S: tower::Service<Request<String>, Response = Response<B>> + Clone,
    S::Error: std::fmt::Debug,
{
    let mut out = Vec::new();
    for request in requests {
        out.push(svc.clone().oneshot(request).await.unwrap().status());
    }
    out
}

/// The value of header `name`, as text.
pub fn header<B>(response: &Response<B>, name: &str) -> Option<String> {
    response
        .headers()
        .get(name)
        .map(|v| v.to_str().unwrap().to_owned())
}

/// Every value of header `name`, as text.
pub fn headers_all<B>(response: &Response<B>, name: &str) -> Vec<String> {
    response
        .headers()
        .get_all(name)
        .iter()
        .map(|v| v.to_str().unwrap().to_owned())
        .collect()
}

/// The body as text.
pub async fn text(response: Response<RateLimitBody<String>>) -> String {
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    String::from_utf8(bytes.to_vec()).unwrap()
}

/// The body as JSON.
pub async fn json(response: Response<RateLimitBody<String>>) -> serde_json::Value {
    serde_json::from_str(&text(response).await).unwrap()
}

/// The body of a problem answer (`application/problem+json`, no rate-limit numbers), after
/// asserting the response is one with `status`.
pub async fn problem(
    response: Response<RateLimitBody<String>>,
    status: StatusCode,
) -> serde_json::Value {
    assert_eq!(response.status(), status);
    assert_eq!(
        header(&response, "content-type").as_deref(),
        Some("application/problem+json")
    );
    assert_eq!(header(&response, "x-ratelimit-limit"), None);
    json(response).await
}
