//! The baseline for the HTTP benchmark: a bare axum handler that parses the same JSON body and
//! answers a fixed decision-sized JSON, with no rate limiting at all.
//!
//! `cargo run --release -p sluice-server --example bare_axum -- 127.0.0.1:8090`

use axum::Router;
use axum::body::Bytes;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::post;

async fn check(body: Bytes) -> impl IntoResponse {
    let parsed: Result<serde_json::Value, _> = serde_json::from_slice(&body);
    let key = parsed
        .ok()
        .and_then(|v| v["key"].as_str().map(str::to_owned))
        .unwrap_or_default();
    (
        [(header::CONTENT_TYPE, "application/json")],
        serde_json::json!({"allowed": true, "policy": "bench", "key": key, "cost": 1, "limit": 1, "remaining": 1, "reset": 0, "retry_after": 0, "limits": []})
            .to_string(),
    )
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let addr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:8090".to_owned());
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    axum::serve(listener, Router::new().route("/v1/check", post(check))).await?;
    Ok(())
}
