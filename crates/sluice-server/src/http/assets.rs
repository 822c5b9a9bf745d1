//! What the server serves as it is: the dashboard's page and script, and the OpenAPI document.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

/// The OpenAPI document of this API (also kept in docs/openapi.json).
pub const OPENAPI: &str = include_str!("../../../../docs/openapi.json");

/// The dashboard's page and script, in the binary: the page works offline.
pub(super) const UI_PAGE: &str = include_str!("ui/index.html");
pub(super) const UI_SCRIPT: &str = include_str!("ui/app.js");

/// A static part of the dashboard, allowed to load nothing but this server's own resources.
pub(super) fn ui_asset(content_type: &'static str, body: &'static str) -> Response {
    let mut r = (StatusCode::OK, body).into_response();
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; script-src 'self'; style-src 'unsafe-inline'; \
             connect-src 'self'; img-src 'self' data:; frame-ancestors 'none'",
        ),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    r
}

/// `GET /ui`: the dashboard (docs/dashboard.md).
pub(super) async fn ui_page() -> Response {
    ui_asset("text/html; charset=utf-8", UI_PAGE)
}

/// `GET /ui/app.js`: the dashboard's script.
pub(super) async fn ui_script() -> Response {
    ui_asset("text/javascript; charset=utf-8", UI_SCRIPT)
}

pub(super) async fn openapi() -> Response {
    let mut r = (StatusCode::OK, OPENAPI).into_response();
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}
