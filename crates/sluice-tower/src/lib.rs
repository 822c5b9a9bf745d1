//! Sluice as a [tower] layer: rate limiting for axum, hyper, tonic or any service of
//! `http::Request<B>`.
//!
//! [`RateLimitLayer`] wraps an inner service in a [`RateLimit`] service, in the shape of
//! tower's own `limit::rate`. It holds a [`sluice::Limiter`] (any store: memory, Redis,
//! sharded, Cluster), a policy (fixed, or chosen per request with [`PolicyChoice::from_fn`])
//! and a [`KeyExtractor`]. Every request goes through these steps:
//!
//! 1. **Policy.** The policy for the request; a per-request choice of `None` lets the request
//!    through unlimited and untouched.
//! 2. **Key.** The extractor reads the request's head: a header, the peer IP, a typed
//!    extension (the authenticated user), or any closure. No key (or one that is not 1 to 512
//!    bytes) means `400` with a problem body naming what was expected, or, if configured,
//!    the [fallback key](RateLimitLayer::fallback_key).
//! 3. **Charge when the request starts.** `check(policy, key, cost)` with cost 1 or
//!    [a function of the request](RateLimitLayer::cost). All limits of the policy are decided
//!    all-or-nothing (docs/algorithms.md#all-or-nothing).
//!    **A policy with a concurrency limit** takes a lease instead (`acquire`), and holds it
//!    for the life of the response: it is released when the response body is dropped (sent
//!    in full, or the connection lost), or with the request's future when the inner service
//!    fails, panics or is cancelled because the client went away. A response dropped outside
//!    a tokio runtime cannot release; its lease lapses after the limit's `per`.
//! 4. **Denied:** `429 Too Many Requests`, `Retry-After` in seconds (omitted when the cost can
//!    never fit), an `application/problem+json` body of the IETF rate-limit draft's
//!    `quota-exceeded` type (see [`response`]), and the rate-limit headers; the inner service
//!    is not called. [`RateLimitLayer::on_denied`] replaces the response.
//! 5. **Allowed:** the inner service answers, and the layer adds GitHub's `X-RateLimit-*` and
//!    the IETF `RateLimit-Policy`/`RateLimit` headers (each set can be switched off).
//! 6. **Refund.** If the inner response satisfies [a predicate](RateLimitLayer::refund_if)
//!    (by default `304 Not Modified`), the cost is given back before the response is
//!    returned: conditional requests stay free, and since the charge came first, slow
//!    responses can never let a key exceed its limit. An inner service error is not refunded.
//!
//! When the store cannot answer, the policy's failure mode decides (the limiter applies it):
//! `open` lets requests through without rate-limit headers (there is no data to show),
//! `local` decides with the process's insurance store and shows its numbers, `closed` answers
//! `503` with a problem body. [`RateLimitLayer::degraded_header`] can mark such responses.
//!
//! # Response body
//!
//! The layer answers some requests itself, so the service's response body is
//! [`RateLimitBody<B>`]: the inner body or the layer's own bytes. It implements
//! `http_body::Body<Data = Bytes>`, so axum's `Router::layer` and hyper take it as is.
//!
//! # Example
//!
//! ```
//! use std::convert::Infallible;
//!
//! use http::{Request, Response, StatusCode};
//! use sluice::{LimitSpec, Limiter, MemoryStore, Policy};
//! use sluice_tower::{KeyExtractor, RateLimitLayer};
//! use tower::{Layer, ServiceExt, service_fn};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let rt = tokio::runtime::Builder::new_current_thread().build()?;
//! # rt.block_on(async {
//! let api = Policy::from_specs("api", vec![LimitSpec::fixed_window(2, 60_000)])?;
//! let limiter = Limiter::new(MemoryStore::new());
//! let layer = RateLimitLayer::new(limiter, api, KeyExtractor::header("x-api-key"));
//!
//! let handler = service_fn(|_req: Request<String>| async {
//!     Ok::<_, Infallible>(Response::new("hello".to_owned()))
//! });
//! let service = layer.layer(handler);
//!
//! let request = || Request::builder().header("x-api-key", "k1").body(String::new());
//! let first = service.clone().oneshot(request()?).await?;
//! assert_eq!(first.status(), StatusCode::OK);
//! assert_eq!(first.headers()["x-ratelimit-remaining"], "1");
//! assert_eq!(first.headers()["ratelimit-policy"], "\"api:0\";q=2;w=60");
//!
//! service.clone().oneshot(request()?).await?;
//! let third = service.clone().oneshot(request()?).await?;
//! assert_eq!(third.status(), StatusCode::TOO_MANY_REQUESTS);
//! assert_eq!(third.headers()["content-type"], "application/problem+json");
//! assert!(third.headers().contains_key("retry-after"));
//!
//! let anonymous = service.oneshot(Request::new(String::new())).await?;
//! assert_eq!(anonymous.status(), StatusCode::BAD_REQUEST); // no x-api-key header
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # })
//! # }
//! ```
//!
//! With axum, `Router::new().route(…).layer(layer)`; the crate's `axum_api` example limits
//! per user and per IP on Redis (`cargo run -p sluice-tower --example axum_api`).
//!
//! # Features
//!
//! - `axum` (default): [`KeyExtractor::peer_ip`] also reads axum's `ConnectInfo<SocketAddr>`.
//!   Without it, it reads a `SocketAddr` or `IpAddr` request extension only.
//!
//! [tower]: https://docs.rs/tower

#![warn(missing_docs)]

mod config;
mod key;
mod layer;
pub mod response;
mod service;

pub use config::PolicyChoice;
pub use key::KeyExtractor;
pub use layer::RateLimitLayer;
pub use response::{RateLimitBody, too_many_requests};
pub use service::{RateLimit, ResponseFuture};
