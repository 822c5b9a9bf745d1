//! The HTTP JSON API (docs/api.md).
//!
//! Every answer is JSON (`content-type: application/json`), errors included (a `204` has no
//! body, so no content type):
//! `{"error": {"code": "…", "message": "…"}}` with a message a person can act on. Bodies are
//! read as bytes under a 64 KiB cap (refused with 413 before any parsing) and validated by hand,
//! so each 400 names the field at fault. Every refusal is an [`ApiError`] (`error.rs`): a
//! handler returns `Result<Response, ApiError>`, and the status, code and message are chosen in
//! its one `IntoResponse`.

use std::sync::Arc;

use axum::Router;
use axum::extract::{DefaultBodyLimit, MatchedPath, State};
use axum::http::{Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodRouter, any, delete, get, post};
use serde_json::json;

use crate::reply::json_response;
use crate::state::Shared;

mod admin_routes;
mod assets;
mod body;
mod decision;
mod error;

pub use self::admin_routes::MAX_TOP_LIMIT;
use self::admin_routes::*;
pub use self::assets::OPENAPI;
use self::assets::*;
use self::body::Endpoint;
use self::decision::*;
pub use self::decision::{add_headers, decision_response};
pub(crate) use self::error::ApiError;

/// The largest request body accepted.
pub const MAX_BODY: usize = 64 * 1024;

/// Who may call a route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Access {
    /// Any client, on any listener.
    Public,
    /// The dashboard's page and script: on the admin listener only (when there is one), with
    /// no token (the page asks for one before it calls an admin route).
    Dashboard,
    /// On the admin listener only, and with a token from the `admin` section if there is one.
    Admin,
    /// `/metrics`: on the admin listener only; a token unless `admin.protect_metrics: false`.
    Metrics,
}

/// One route: its method, its OpenAPI path, who may call it and what answers it.
struct Route {
    method: &'static str,
    path: &'static str,
    access: Access,
    handler: fn() -> MethodRouter<Arc<Shared>>,
}

const fn route(
    method: &'static str,
    path: &'static str,
    access: Access,
    handler: fn() -> MethodRouter<Arc<Shared>>,
) -> Route {
    Route {
        method,
        path,
        access,
        handler,
    }
}

/// THE route table: the router, the admin guard, [`routes`], [`admin_routes`] (what the
/// public listener answers `404 admin_listener` for) and the `404`'s list of routes are all
/// derived from it. A test holds docs/openapi.json to it, and to what the router answers.
const TABLE: [Route; 17] = [
    route("POST", "/v1/check", Access::Public, || {
        decide(Endpoint::Check)
    }),
    route("POST", "/v1/peek", Access::Public, || {
        decide(Endpoint::Peek)
    }),
    route("POST", "/v1/acquire", Access::Public, || {
        decide(Endpoint::Acquire)
    }),
    route("POST", "/v1/release", Access::Public, || {
        decide(Endpoint::Release)
    }),
    route("POST", "/v1/refund", Access::Admin, || {
        decide(Endpoint::Refund)
    }),
    route("POST", "/v1/simulate", Access::Admin, || {
        post(simulate).layer(DefaultBodyLimit::max(MAX_SIMULATE_BODY))
    }),
    route("DELETE", "/v1/keys/{policy}/{key}", Access::Admin, || {
        delete(forget)
    }),
    route("GET", "/v1/policies", Access::Admin, || get(policies)),
    route("GET", "/v1/top", Access::Admin, || get(top)),
    route("GET", "/v1/stats", Access::Admin, || get(stats)),
    route("GET", "/v1/stats/history", Access::Admin, || {
        get(stats_history)
    }),
    route("GET", "/healthz", Access::Public, || get(healthz)),
    route("GET", "/readyz", Access::Public, || get(readyz)),
    route("GET", "/metrics", Access::Metrics, || get(metrics_text)),
    route("GET", "/openapi.json", Access::Public, || get(openapi)),
    route("GET", "/ui", Access::Dashboard, || get(ui_page)),
    route("GET", "/ui/app.js", Access::Dashboard, || get(ui_script)),
];

/// Every route as (method, OpenAPI path), from [`TABLE`].
pub fn routes() -> impl Iterator<Item = (&'static str, &'static str)> {
    TABLE.iter().map(|r| (r.method, r.path))
}

/// The admin routes, from [`TABLE`]: with a separate admin listener (`listen.admin`) they are
/// served there only.
pub fn admin_routes() -> impl Iterator<Item = (&'static str, &'static str)> {
    (TABLE.iter())
        .filter(|r| r.access != Access::Public)
        .map(|r| (r.method, r.path))
}

/// The largest `POST /v1/simulate` body: room for a pasted log (some 40 000 access log
/// lines); the command `sluice simulate` reads larger files.
pub const MAX_SIMULATE_BODY: usize = 8 * 1024 * 1024;

/// Which routes a listener serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Routes {
    /// Every route: the HTTP listener when there is no admin listener, and the admin listener.
    All,
    /// What any client may call (check, peek, acquire, release, health, the OpenAPI
    /// document); the
    /// [`admin_routes`] answer `404 admin_listener`.
    Public,
}

/// The routes of the HTTP API.
pub fn router(shared: Arc<Shared>) -> Router {
    router_for(shared, Routes::All)
}

/// The routes `routes` names, from [`TABLE`]: an admin route behind the admin guard (a
/// `route_layer`, so a wrong method is still a `405` and an unknown path a `404`), or, on the
/// public listener of a server with an admin listener, answering `404 admin_listener`.
pub fn router_for(shared: Arc<Shared>, routes: Routes) -> Router {
    let router = TABLE.iter().fold(Router::new(), |router, r| {
        let path = axum_path(r.path);
        match (routes, r.access) {
            (_, Access::Public) | (Routes::All, Access::Dashboard) => {
                router.route(&path, (r.handler)())
            }
            (Routes::All, access) => {
                let guard = Guard {
                    shared: Arc::clone(&shared),
                    route: route_name(r).into(),
                    metrics: access == Access::Metrics,
                };
                let layer = axum::middleware::from_fn_with_state(guard, admin_guard);
                router.route(&path, (r.handler)().route_layer(layer))
            }
            // Every admin route answers `404 admin_listener`, whatever its method.
            (Routes::Public, _) => router.route(&path, any(on_admin_listener)),
        }
    });
    router
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .layer(axum::middleware::from_fn(same_site_guard))
        .with_state(shared)
}

/// The `403 cross_site` for a browser's request from another site to a route that changes
/// state (every method but `GET`, `HEAD` and `OPTIONS`): a body is read whatever its content
/// type, so a page elsewhere could send a `text/plain` POST, which needs no preflight, with
/// its visitor's network position (and, without an `admin` section, no token in the way).
/// The browser's own `Sec-Fetch-Site` decides when it sends one (`cross-site` is refused;
/// `same-origin` passes even behind a proxy that rewrites `Host`); otherwise an `Origin` must
/// name the request's own host. A client that sends neither, `curl` or a back end, is
/// answered.
async fn same_site_guard(
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let changes_state = !matches!(
        *request.method(),
        Method::GET | Method::HEAD | Method::OPTIONS
    );
    if changes_state && cross_site(&request) {
        return ApiError::CrossSite(request.method().clone()).into_response();
    }
    next.run(request).await
}

/// Whether a browser sent `request` from another site.
fn cross_site(request: &axum::extract::Request) -> bool {
    let headers = request.headers();
    if let Some(site) = headers.get("sec-fetch-site") {
        return site.as_bytes().eq_ignore_ascii_case(b"cross-site");
    }
    let Some(origin) = headers.get(header::ORIGIN) else {
        return false;
    };
    // HTTP/1.1 names the host in `Host`, HTTP/2 in the URI's authority.
    let host = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .or_else(|| request.uri().authority().map(|a| a.as_str()));
    let origin_host = origin
        .to_str()
        .ok()
        .and_then(|o| o.parse::<axum::http::Uri>().ok())
        .and_then(|o| o.authority().cloned());
    match (origin_host, host) {
        (Some(origin), Some(host)) => !origin.as_str().eq_ignore_ascii_case(host),
        // `Origin: null` (a sandboxed frame, a file), or no host to compare with.
        _ => true,
    }
}

/// How a `401` names a route: its method and its path up to the first parameter
/// (`DELETE /v1/keys`).
fn route_name(r: &Route) -> String {
    let path = r.path.split("/{").next().unwrap_or(r.path);
    format!("{} {path}", r.method)
}

/// What the admin guard of one route needs.
#[derive(Clone)]
struct Guard {
    shared: Arc<Shared>,
    route: Arc<str>,
    metrics: bool,
}

/// The `401` for a request to an admin route without one of the `admin` tokens
/// (docs/security.md); otherwise the route answers. Without an `admin` section every route is
/// open; `/metrics` is guarded unless `admin.protect_metrics: false`.
async fn admin_guard(
    State(guard): State<Guard>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    match &guard.shared.snapshot().admin {
        Some(admin)
            if (!guard.metrics || admin.protect_metrics) && !admin.allows(request.headers()) =>
        {
            ApiError::Unauthorized { route: guard.route }.into_response()
        }
        _ => next.run(request).await,
    }
}

/// An OpenAPI path as the router writes it: a key may hold `/`, so it is a wildcard.
fn axum_path(path: &str) -> String {
    path.replace("{key}", "{*key}")
}

/// An admin route asked of the public listener when there is an admin listener.
async fn on_admin_listener(method: Method, matched: MatchedPath) -> ApiError {
    ApiError::AdminListener {
        method,
        path: matched.as_str().replace("{*key}", "{key}"),
    }
}

// ----- errors -------------------------------------------------------------------------------

async fn not_found() -> ApiError {
    ApiError::NotFound
}

/// The `404`'s list of routes, from [`TABLE`]: each method once before its paths, and the
/// dashboard's assets as the dashboard.
fn not_found_message() -> String {
    let mut text = String::from("no such path; the API is");
    let mut method = "";
    for r in TABLE.iter().filter(|r| r.access != Access::Dashboard) {
        text.push_str(if method.is_empty() { " " } else { ", " });
        if r.method != method {
            method = r.method;
            text.push_str(method);
            text.push(' ');
        }
        text.push_str(r.path);
    }
    if let Some(ui) = TABLE.iter().find(|r| r.access == Access::Dashboard) {
        text.push_str(", and the dashboard at ");
        text.push_str(ui.path);
    }
    text
}

async fn method_not_allowed(method: Method) -> ApiError {
    ApiError::MethodNotAllowed(method)
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
            &json!({"status": "not ready", "error": {"code": "store_unavailable", "message": down.to_string()}}),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The derived list reads as the list written by hand before the table did.
    #[test]
    fn the_404_lists_the_routes_as_before() {
        assert_eq!(
            not_found_message(),
            "no such path; the API is POST /v1/check, /v1/peek, /v1/acquire, /v1/release, \
             /v1/refund, /v1/simulate, DELETE \
             /v1/keys/{policy}/{key}, GET /v1/policies, /v1/top, /v1/stats, /v1/stats/history, \
             /healthz, /readyz, /metrics, /openapi.json, and the dashboard at /ui"
        );
    }

    #[test]
    fn a_401_names_the_route_up_to_its_first_parameter() {
        let names: Vec<String> = TABLE
            .iter()
            .filter(|r| matches!(r.access, Access::Admin | Access::Metrics))
            .map(route_name)
            .collect();
        assert_eq!(
            names,
            [
                "POST /v1/refund",
                "POST /v1/simulate",
                "DELETE /v1/keys",
                "GET /v1/policies",
                "GET /v1/top",
                "GET /v1/stats",
                "GET /v1/stats/history",
                "GET /metrics"
            ]
        );
    }
}
