//! The one error of the HTTP API. A handler returns `Result<Response, ApiError>`; the status,
//! the code and the message of every refusal are chosen here, in one `IntoResponse` (axum's
//! `examples/error-handling`), and rendered as docs/api.md's
//! `{"error": {"code": "…", "message": "…"}}` by [`crate::reply::error`].

use std::sync::Arc;

use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};

use super::{MAX_BODY, MAX_SIMULATE_BODY, not_found_message};
use crate::reply::error;
use sluice_spec::policy_entry::FieldError;

/// Why a request gets no answer but an error.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ApiError {
    /// A body, a path or a query that cannot be used (`400 invalid_request`), worded as the
    /// API words it: `` `cost` must not be negative, got -1``, or the message alone when it is
    /// about the request as a whole.
    #[error("{}", request_words(.0))]
    Invalid(FieldError),
    /// A simulation the simulator refuses (`400 invalid_request`), worded as the simulator
    /// and `sluice simulate` word it: `traffic.rate: must be positive`.
    #[error("{0}")]
    Simulation(FieldError),
    /// A body over [`MAX_BODY`] (`413 body_too_large`).
    #[error("the body is larger than {} bytes", MAX_BODY)]
    BodyTooLarge,
    /// A simulate body over [`MAX_SIMULATE_BODY`] (`413 body_too_large`).
    #[error(
        "the body is larger than {} bytes (the simulate body cap); simulate a part of the \
         log, or run `sluice simulate` on the file",
        MAX_SIMULATE_BODY
    )]
    SimulateBodyTooLarge,
    /// No configured policy of that name (`404 unknown_policy`); `configured` sorted.
    #[error("no policy named `{name}`; configured: {}", .configured.join(", "))]
    UnknownPolicy {
        name: String,
        configured: Vec<String>,
    },
    /// `/v1/top` for a name that is neither a configured policy nor a rule it has seen
    /// (`404 unknown_policy`).
    #[error(
        "no policy or Envoy rule named `{name}` has been seen; configured policies: {}; Envoy \
         rules appear as `domain.rule` (e.g. `edge.remote_address`) once they have seen \
         traffic",
        .configured.join(", ")
    )]
    UnknownTopPolicy {
        name: String,
        configured: Vec<String>,
    },
    /// The store could not answer (`503 store_unavailable`), with what a client should do.
    #[error("{0}")]
    StoreUnavailable(String),
    /// As many simulations run as the server allows (`503 busy`, `Retry-After: 1`).
    #[error(
        "{n} simulations are running, the most this server runs at once (max_concurrent {n}); \
         retry in a moment",
        n = sluice_simulate::MAX_CONCURRENT
    )]
    Busy,
    /// A failure of the server itself (`500 internal`).
    #[error("{0}")]
    Internal(String),
    /// An admin route without one of the `admin` tokens (`401 unauthorized`, with the
    /// challenge); the route named as `DELETE /v1/keys`.
    #[error(
        "{route} is an admin route: send `Authorization: Bearer <token>` with a token from the \
         server's admin.tokens_file or admin.tokens_env"
    )]
    Unauthorized { route: Arc<str> },
    /// An admin route asked of the public listener of a server with an admin listener
    /// (`404 admin_listener`); the path as the OpenAPI document writes it.
    #[error(
        "{method} {path} is served on the admin listener only (listen.admin), not on this port"
    )]
    AdminListener { method: Method, path: String },
    /// A browser's request from another site to a route that changes state
    /// (`403 cross_site`).
    #[error(
        "{0} from a page on another site is refused (its Origin is not this server, or \
         Sec-Fetch-Site: cross-site): the routes that change state answer this server's own \
         pages and clients that send no Origin, such as curl or a back end"
    )]
    CrossSite(Method),
    /// No such path (`404 not_found`), with the list of routes.
    #[error("{}", not_found_message())]
    NotFound,
    /// A path that does not take this method (`405 method_not_allowed`).
    #[error("{0} is not allowed on this path; see /openapi.json for the methods")]
    MethodNotAllowed(Method),
}

impl ApiError {
    /// A `400` about the request as a whole.
    pub(crate) fn invalid(message: impl Into<String>) -> Self {
        Self::Invalid(FieldError::whole(message))
    }

    /// A `400` about the field at `path`.
    pub(crate) fn field(path: impl Into<String>, message: impl Into<String>) -> Self {
        Self::Invalid(FieldError::new(path, message))
    }

    /// The status and the `code` of the body (docs/api.md#errors).
    fn status_code(&self) -> (StatusCode, &'static str) {
        match self {
            Self::Invalid(_) | Self::Simulation(_) => (StatusCode::BAD_REQUEST, "invalid_request"),
            Self::BodyTooLarge | Self::SimulateBodyTooLarge => {
                (StatusCode::PAYLOAD_TOO_LARGE, "body_too_large")
            }
            Self::UnknownPolicy { .. } | Self::UnknownTopPolicy { .. } => {
                (StatusCode::NOT_FOUND, "unknown_policy")
            }
            Self::AdminListener { .. } => (StatusCode::NOT_FOUND, "admin_listener"),
            Self::NotFound => (StatusCode::NOT_FOUND, "not_found"),
            Self::StoreUnavailable(_) => (StatusCode::SERVICE_UNAVAILABLE, "store_unavailable"),
            Self::Busy => (StatusCode::SERVICE_UNAVAILABLE, "busy"),
            Self::Internal(_) => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
            Self::Unauthorized { .. } => (StatusCode::UNAUTHORIZED, "unauthorized"),
            Self::CrossSite(_) => (StatusCode::FORBIDDEN, "cross_site"),
            Self::MethodNotAllowed(_) => (StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed"),
        }
    }
}

impl From<FieldError> for ApiError {
    fn from(e: FieldError) -> Self {
        Self::Invalid(e)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, code) = self.status_code();
        let mut r = error(status, code, self.to_string());
        match self {
            Self::Busy => {
                r.headers_mut()
                    .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            }
            Self::Unauthorized { .. } => {
                r.headers_mut().insert(
                    header::WWW_AUTHENTICATE,
                    HeaderValue::from_static("Bearer realm=\"sluice-admin\""),
                );
            }
            _ => {}
        }
        r
    }
}

/// A field error as a `400` of the API words it: the field in backquotes, then what is wrong.
fn request_words(e: &FieldError) -> String {
    if e.path.is_empty() {
        e.message.clone()
    } else {
        format!("`{}` {}", e.path, e.message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_field_is_named_in_backquotes_and_a_simulation_path_before_a_colon() {
        let e = FieldError::new("cost", "must not be negative, got -1");
        assert_eq!(
            ApiError::from(e.clone()).to_string(),
            "`cost` must not be negative, got -1"
        );
        assert_eq!(
            ApiError::Simulation(e).to_string(),
            "cost: must not be negative, got -1"
        );
        assert_eq!(ApiError::invalid("not JSON").to_string(), "not JSON");
    }

    #[test]
    fn the_busy_answer_says_when_to_retry_and_the_401_challenges() {
        let r = ApiError::Busy.into_response();
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(r.headers()[header::RETRY_AFTER], "1");
        let r = ApiError::Unauthorized {
            route: "GET /v1/stats".into(),
        }
        .into_response();
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
        assert_eq!(
            r.headers()[header::WWW_AUTHENTICATE],
            "Bearer realm=\"sluice-admin\""
        );
    }
}
