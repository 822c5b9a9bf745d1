//! The JSON body every HTTP answer has, errors included: `{"error": {"code", "message"}}`
//! with `content-type: application/json`. A leaf, so the connection loop (a 408) and the API
//! answer in the same shape.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

pub(crate) fn json_response(status: StatusCode, body: &Value) -> Response {
    (status, axum::Json(body)).into_response()
}

/// An error answer.
pub(crate) fn error(status: StatusCode, code: &str, message: impl Into<String>) -> Response {
    json_response(
        status,
        &json!({"error": {"code": code, "message": message.into()}}),
    )
}
