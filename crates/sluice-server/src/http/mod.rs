//! The HTTP JSON API (docs/api.md).
//!
//! Every answer is JSON (`content-type: application/json`), errors included (a `204` has no
//! body, so no content type):
//! `{"error": {"code": "…", "message": "…"}}` with a message a person can act on. Bodies are
//! read as bytes under a 64 KiB cap (refused with 413 before any parsing) and validated by hand,
//! so each 400 names the field at fault.

use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection};
use axum::extract::{DefaultBodyLimit, MatchedPath, Path, RawQuery, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, delete, get, post};
use serde_json::{Value, json};
use sluice::headers::secs_up;
use sluice::{Decision, Error as LimitError, MAX_KEY_LEN, Policy};

use crate::observe::metrics;
use crate::reply::{error, json_response};
use crate::state::Shared;

mod admin;
mod assets;
mod body;
mod decision;

pub use self::admin::MAX_TOP_LIMIT;
use self::admin::*;
pub use self::assets::OPENAPI;
use self::assets::*;
use self::body::*;
use self::decision::*;
pub use self::decision::{add_headers, decision_response};

/// The largest request body accepted.
pub const MAX_BODY: usize = 64 * 1024;

/// Every route as (method, OpenAPI path); a test holds docs/openapi.json to this list, and to
/// what the router answers.
pub const ROUTES: &[(&str, &str)] = &[
    ("POST", "/v1/check"),
    ("POST", "/v1/peek"),
    ("POST", "/v1/refund"),
    ("POST", "/v1/acquire"),
    ("POST", "/v1/release"),
    ("DELETE", "/v1/keys/{policy}/{key}"),
    ("GET", "/v1/policies"),
    ("GET", "/v1/top"),
    ("GET", "/v1/stats"),
    ("GET", "/ui"),
    ("GET", "/ui/app.js"),
    ("POST", "/v1/simulate"),
    ("GET", "/healthz"),
    ("GET", "/readyz"),
    ("GET", "/openapi.json"),
    ("GET", "/metrics"),
];

/// The admin routes: with a separate admin listener (`listen.admin`) they are served there
/// only.
pub const ADMIN_ROUTES: &[(&str, &str)] = &[
    ("POST", "/v1/refund"),
    ("GET", "/v1/top"),
    ("GET", "/v1/stats"),
    ("DELETE", "/v1/keys/{policy}/{key}"),
    ("GET", "/v1/policies"),
    ("POST", "/v1/simulate"),
    ("GET", "/metrics"),
    ("GET", "/ui"),
    ("GET", "/ui/app.js"),
];

/// The largest `POST /v1/simulate` body: room for a pasted log (some 40 000 access log
/// lines); the command `sluice simulate` reads larger files.
pub const MAX_SIMULATE_BODY: usize = 8 * 1024 * 1024;

/// Which routes a listener serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Surface {
    /// Every route: the HTTP listener when there is no admin listener, and the admin listener.
    All,
    /// What any client may call (check, peek, acquire, release, health, the OpenAPI
    /// document); the
    /// [`ADMIN_ROUTES`] answer `404 admin_listener`.
    Public,
}

/// The routes of the HTTP API.
pub fn router(shared: Arc<Shared>) -> Router {
    router_for(shared, Surface::All)
}

/// The routes `surface` serves.
pub fn router_for(shared: Arc<Shared>, surface: Surface) -> Router {
    let router = Router::new()
        .route("/v1/check", post(check))
        .route("/v1/peek", post(peek))
        .route("/v1/acquire", post(acquire))
        .route("/v1/release", post(release))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/openapi.json", get(openapi));
    let router = match surface {
        Surface::All => router
            .route("/v1/refund", post(refund))
            .route("/v1/keys/{policy}/{*key}", delete(forget))
            .route("/v1/policies", get(policies))
            .route("/v1/top", get(top))
            .route("/v1/stats", get(stats))
            .route("/ui", get(ui_page))
            .route("/ui/app.js", get(ui_script))
            .route(
                "/v1/simulate",
                post(simulate).layer(DefaultBodyLimit::max(MAX_SIMULATE_BODY)),
            )
            .route("/metrics", get(metrics_text)),
        // Every admin route answers `404 admin_listener`, whatever its method.
        Surface::Public => ADMIN_ROUTES.iter().fold(router, |r, (_, path)| {
            r.route(&axum_path(path), any(on_admin_listener))
        }),
    };
    router
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .with_state(shared)
}

/// An OpenAPI path as the router writes it: a key may hold `/`, so it is a wildcard.
fn axum_path(path: &str) -> String {
    path.replace("{key}", "{*key}")
}

/// An admin route asked of the public listener when there is an admin listener.
async fn on_admin_listener(method: Method, matched: MatchedPath) -> Response {
    error(
        StatusCode::NOT_FOUND,
        "admin_listener",
        format!(
            "{method} {} is served on the admin listener only (listen.admin), not on this port",
            matched.as_str().replace("{*key}", "{key}")
        ),
    )
}

// ----- errors -------------------------------------------------------------------------------

async fn not_found() -> Response {
    error(
        StatusCode::NOT_FOUND,
        "not_found",
        "no such path; the API is POST /v1/check, /v1/peek, /v1/acquire, /v1/release, \
         /v1/refund, /v1/simulate, DELETE \
         /v1/keys/{policy}/{key}, GET /v1/policies, /v1/top, /v1/stats, /healthz, /readyz, \
         /metrics, /openapi.json, and the dashboard at /ui",
    )
}

async fn method_not_allowed(method: Method) -> Response {
    error(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        format!("{method} is not allowed on this path; see /openapi.json for the methods"),
    )
}

/// The `401` for a request to an admin route without one of the `admin` tokens
/// (docs/security.md); `None` lets it through. Without an `admin` section every route is
/// open; `/metrics` is an admin route only with `admin.protect_metrics`.
fn admin_only(
    shared: &Shared,
    headers: &HeaderMap,
    route: &str,
    metrics: bool,
) -> Option<Response> {
    match &shared.snapshot().admin {
        Some(admin) if (!metrics || admin.protect_metrics) && !admin.allows(headers) => {
            Some(unauthorized(route))
        }
        _ => None,
    }
}

async fn healthz() -> Response {
    json_response(StatusCode::OK, &json!({"status": "ok"}))
}

async fn readyz(State(shared): State<Arc<Shared>>) -> Response {
    let snapshot = shared.snapshot();
    match snapshot.ping().await {
        Ok(()) => json_response(StatusCode::OK, &json!({"status": "ready"})),
        Err(down) => json_response(
            StatusCode::SERVICE_UNAVAILABLE,
            &json!({"status": "not ready", "error": {"code": "store_unavailable", "message": down}}),
        ),
    }
}

/// `401 unauthorized` for an admin route without a valid token, with the challenge.
pub(crate) fn unauthorized(route: &str) -> Response {
    let mut r = error(
        StatusCode::UNAUTHORIZED,
        "unauthorized",
        format!(
            "{route} is an admin route: send `Authorization: Bearer <token>` with a token from \
             the server's admin.tokens_file or admin.tokens_env"
        ),
    );
    r.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        HeaderValue::from_static("Bearer realm=\"sluice-admin\""),
    );
    r
}
