//! An axum API rate limited per client IP and per user, with the counts in Redis (so every
//! instance of the API shares them).
//!
//! ```sh
//! cargo run -p sluice-tower --example axum_api    # REDIS_URL, default redis://127.0.0.1:6379
//! curl -i http://127.0.0.1:3000/                                   # per-IP limit only
//! curl -i -H 'x-user: ann' http://127.0.0.1:3000/api/items/7         # per user, then per IP
//! curl -i -H 'x-user: ann' -H 'if-none-match: "item-7"' http://127.0.0.1:3000/api/items/7
//! ```
//!
//! - `per_ip`: 30 requests per minute for every route, keyed by the peer address (served with
//!   `into_make_service_with_connect_info`). Fails open: if Redis is down, requests pass.
//! - `per_user`: 5 requests per 10 s on `/api/*`, keyed by the `x-user` header, a stand-in for
//!   the user an authentication layer would put in the request's extensions (then use
//!   `KeyExtractor::extension(|u: &User| u.id.to_string())`). A request without it gets a 400
//!   naming the header. Fails closed: if Redis is down, `/api/*` answers 503.
//! - `GET /api/items/{id}` answers `304 Not Modified` to a matching `If-None-Match`, and the
//!   layer refunds those: revalidating a cached item is free.
//!
//! `LISTEN` (default `127.0.0.1:3000`) sets the address.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::Path;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use sluice::{FailureMode, LimitSpec, Limiter, Policy};
use sluice_redis::{RedisConfig, RedisStore};
use sluice_tower::{KeyExtractor, RateLimitLayer};

async fn index() -> &'static str {
    "hello from a rate-limited API; try /api/items/7 with an x-user header\n"
}

/// An item with an ETag; a matching `If-None-Match` gets 304 (and its charge back).
async fn item(Path(id): Path<u64>, headers: HeaderMap) -> Response {
    let etag = format!("\"item-{id}\"");
    if headers
        .get(header::IF_NONE_MATCH)
        .is_some_and(|v| v.as_bytes() == etag.as_bytes())
    {
        return (StatusCode::NOT_MODIFIED, [(header::ETAG, etag)]).into_response();
    }
    (
        [
            (header::ETAG, etag),
            (header::CONTENT_TYPE, "application/json".to_owned()),
        ],
        format!("{{\"id\": {id}, \"name\": \"item {id}\"}}\n"),
    )
        .into_response()
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let redis_url =
        std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned());
    let listen = std::env::var("LISTEN").unwrap_or_else(|_| "127.0.0.1:3000".to_owned());

    let store = RedisStore::connect(RedisConfig::new(&redis_url)).await?;
    let per_ip = Policy::from_specs("per_ip", vec![LimitSpec::fixed_window(30, 60_000)])?
        .with_failure_mode(FailureMode::Open);
    let per_user = Policy::from_specs("per_user", vec![LimitSpec::fixed_window(5, 10_000)])?
        .with_failure_mode(FailureMode::Closed);
    // One limiter (one Redis connection) for both layers.
    let limiter = Arc::new(Limiter::new(store));

    let api = Router::new()
        .route("/api/items/{id}", get(item))
        // `route_layer`: only requests that match a route are counted (a 404 is free).
        .route_layer(RateLimitLayer::new(
            limiter.clone(),
            per_user,
            KeyExtractor::header("x-user"),
        ));
    let app = Router::new()
        .route("/", get(index))
        .merge(api)
        .layer(RateLimitLayer::new(
            limiter,
            per_ip,
            KeyExtractor::peer_ip(),
        ));

    let listener = tokio::net::TcpListener::bind(&listen).await?;
    println!(
        "listening on http://{} (Redis at {redis_url})",
        listener.local_addr()?
    );
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(async {
        let _ = tokio::signal::ctrl_c().await;
    })
    .await?;
    Ok(())
}
