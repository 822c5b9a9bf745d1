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

use crate::metrics;
use crate::state::Shared;

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

/// The OpenAPI document of this API (also kept in docs/openapi.json).
pub const OPENAPI: &str = include_str!("../../../docs/openapi.json");

// ----- errors -------------------------------------------------------------------------------

fn json_response(status: StatusCode, body: &Value) -> Response {
    let mut r = (status, body.to_string()).into_response();
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

/// An error answer.
pub fn error(status: StatusCode, code: &str, message: impl Into<String>) -> Response {
    json_response(
        status,
        &json!({"error": {"code": code, "message": message.into()}}),
    )
}

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

// ----- the request body ---------------------------------------------------------------------

/// A validated `{"policy", "key", "cost"}` body, or `{"policy", "key", "lease"}` for a
/// release.
#[derive(Debug)]
struct Request {
    policy: String,
    key: String,
    cost: u64,
    lease: u64,
}

/// A lease id as the API writes it: 16 lowercase hex digits.
fn lease_text(id: u64) -> String {
    format!("{id:016x}")
}

/// A refused request, turned into a JSON error answer.
#[derive(Debug)]
struct Refusal {
    status: StatusCode,
    code: &'static str,
    message: String,
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        error(self.status, self.code, self.message)
    }
}

fn parse_request(body: Result<Bytes, BytesRejection>, op: Endpoint) -> Result<Request, Refusal> {
    let bad = |message: String| Refusal {
        status: StatusCode::BAD_REQUEST,
        code: "invalid_request",
        message,
    };
    let bytes = body.map_err(|rejection| {
        if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            Refusal {
                status: StatusCode::PAYLOAD_TOO_LARGE,
                code: "body_too_large",
                message: format!("the body is larger than {MAX_BODY} bytes"),
            }
        } else {
            bad(format!("the body could not be read: {rejection}"))
        }
    })?;
    let value = crate::unique::json(&bytes).map_err(bad)?;
    let Value::Object(map) = value else {
        return Err(bad(
            "the body must be a JSON object: {\"policy\": \"…\", \"key\": \"…\", \"cost\": 1}"
                .to_owned(),
        ));
    };
    let string = |field: &str| match map.get(field) {
        Some(Value::String(s)) => Ok(s.clone()),
        Some(other) => Err(bad(format!(
            "`{field}` must be a string, got {}",
            type_name(other)
        ))),
        None => Err(bad(format!("`{field}` is missing"))),
    };
    let policy = string("policy")?;
    let key = string("key")?;
    if key.is_empty() || key.len() > MAX_KEY_LEN {
        return Err(bad(format!(
            "`key` must be 1 to {MAX_KEY_LEN} bytes, got {} bytes",
            key.len()
        )));
    }
    // Exactly 16 hex digits, as /v1/acquire writes them: `1` and `0001` are not ids.
    let lease_id = |lease: &str| {
        (lease.len() == 16 && lease.bytes().all(|b| b.is_ascii_hexdigit()))
            .then(|| u64::from_str_radix(lease, 16).ok())
            .flatten()
            .filter(|&id| id != 0)
            .ok_or_else(|| {
                bad(format!(
                    "`lease` must be the id /v1/acquire returned: exactly 16 hex digits, not all \
                     zero (e.g. 9f86d081884c7d65), got `{}`",
                    lease.chars().take(40).collect::<String>()
                ))
            })
    };
    if op == Endpoint::Release {
        let id = lease_id(&string("lease")?)?;
        if let Some(field) = map
            .keys()
            .find(|f| !matches!(f.as_str(), "policy" | "key" | "lease"))
        {
            return Err(bad(format!(
                "unknown field `{field}`; the fields of a release are policy, key and lease"
            )));
        }
        return Ok(Request {
            policy,
            key,
            cost: 0,
            lease: id,
        });
    }
    let cost = match map.get("cost") {
        None | Some(Value::Null) => 1,
        Some(Value::Number(n)) => match n.as_u64() {
            Some(c) if c <= sluice::core::MAX_AMOUNT => c,
            Some(c) => {
                return Err(bad(format!(
                    "`cost` {c} is too large; at most 2^53 (9007199254740992)"
                )));
            }
            None if n.as_i64().is_some() => {
                return Err(bad(format!("`cost` must not be negative, got {n}")));
            }
            None => return Err(bad(format!("`cost` must be a whole number, got {n}"))),
        },
        Some(other) => {
            return Err(bad(format!(
                "`cost` must be a whole number, got {}",
                type_name(other)
            )));
        }
    };
    // A lease of nothing holds nothing: an acquire (or a renewal) that asks for 0 units would
    // answer `allowed` with no lease, which a client would read as "go ahead, holding a slot".
    if op == Endpoint::Acquire && cost == 0 {
        return Err(bad(
            "`cost` must be at least 1 for an acquire: it is the units the lease holds, and a \
             lease of 0 holds nothing; to read the state without taking anything, use /v1/peek"
                .to_owned(),
        ));
    }
    // An acquire may name a lease it holds, to renew it.
    let lease = match (op, map.get("lease")) {
        (Endpoint::Acquire, None | Some(Value::Null)) => 0,
        (Endpoint::Acquire, Some(_)) => lease_id(&string("lease")?)?,
        _ => 0,
    };
    for field in map.keys() {
        let known = match op {
            Endpoint::Acquire => matches!(field.as_str(), "policy" | "key" | "cost" | "lease"),
            _ => matches!(field.as_str(), "policy" | "key" | "cost"),
        };
        if !known {
            let fields = match op {
                Endpoint::Acquire => "policy, key, cost and lease",
                _ => "policy, key and cost",
            };
            return Err(bad(format!(
                "unknown field `{field}`; the fields are {fields}"
            )));
        }
    }
    Ok(Request {
        policy,
        key,
        cost,
        lease,
    })
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

// ----- decisions ----------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Endpoint {
    Check,
    Peek,
    Refund,
    Acquire,
    Release,
}

impl Endpoint {
    fn name(self) -> &'static str {
        match self {
            Endpoint::Check => "check",
            Endpoint::Peek => "peek",
            Endpoint::Refund => "refund",
            Endpoint::Acquire => "acquire",
            Endpoint::Release => "release",
        }
    }

    /// Whether it admits requests (counted in stats and top keys; 429 when denied).
    fn admits(self) -> bool {
        matches!(self, Endpoint::Check | Endpoint::Acquire)
    }
}

async fn check(State(s): State<Arc<Shared>>, body: Result<Bytes, BytesRejection>) -> Response {
    answer(&s, Endpoint::Check, body).await
}

async fn peek(State(s): State<Arc<Shared>>, body: Result<Bytes, BytesRejection>) -> Response {
    answer(&s, Endpoint::Peek, body).await
}

async fn acquire(State(s): State<Arc<Shared>>, body: Result<Bytes, BytesRejection>) -> Response {
    answer(&s, Endpoint::Acquire, body).await
}

async fn release(State(s): State<Arc<Shared>>, body: Result<Bytes, BytesRejection>) -> Response {
    answer(&s, Endpoint::Release, body).await
}

async fn refund(
    State(s): State<Arc<Shared>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    if let Some(refused) = admin_only(&s, &headers, "POST /v1/refund", false) {
        return refused;
    }
    answer(&s, Endpoint::Refund, body).await
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
            Some(crate::admin::unauthorized(route))
        }
        _ => None,
    }
}

fn unknown_policy(name: &str, snapshot: &crate::state::Snapshot) -> Response {
    let mut names: Vec<&str> = snapshot.limiter.policies().map(Policy::name).collect();
    names.sort_unstable();
    error(
        StatusCode::NOT_FOUND,
        "unknown_policy",
        format!("no policy named `{name}`; configured: {}", names.join(", ")),
    )
}

/// Check, peek, refund, acquire or release: reads the body, asks the limiter, answers the
/// decision.
async fn answer(shared: &Shared, op: Endpoint, body: Result<Bytes, BytesRejection>) -> Response {
    let req = match parse_request(body, op) {
        Ok(r) => r,
        Err(refusal) => return refusal.into_response(),
    };
    let snapshot = shared.snapshot();
    let limiter = &snapshot.limiter;
    let Some(policy) = limiter.policy(&req.policy) else {
        return unknown_policy(&req.policy, &snapshot);
    };
    let started = std::time::Instant::now();
    let mut lease = None;
    let result = match op {
        Endpoint::Check => limiter.check_policy(policy, &req.key, req.cost).await,
        Endpoint::Peek => limiter.peek_policy(policy, &req.key, req.cost).await,
        Endpoint::Refund => limiter.refund_policy(policy, &req.key, req.cost).await,
        Endpoint::Acquire if req.lease != 0 => limiter
            .renew_policy(policy, &req.key, req.lease, req.cost)
            .await
            .map(|(d, l)| {
                lease = l;
                d
            }),
        Endpoint::Acquire => limiter
            .acquire_policy(policy, &req.key, req.cost)
            .await
            .map(|(d, l)| {
                lease = l;
                d
            }),
        Endpoint::Release => limiter.release_policy(policy, &req.key, req.lease).await,
    };
    let op_name = op.name();
    metrics::decision_latency(op_name, started.elapsed());
    match result {
        Ok(d) => {
            let outcome = match (d.degraded, d.allowed) {
                (Some(_), _) => "degraded",
                (None, true) => "allowed",
                (None, false) => "denied",
            };
            metrics::decision(policy.name_arc(), op_name, outcome);
            if op.admits() {
                let counted = match (d.degraded, d.allowed) {
                    (Some(_), _) => crate::stats::Outcome::Degraded,
                    (None, true) => crate::stats::Outcome::Allowed,
                    (None, false) => crate::stats::Outcome::Denied,
                };
                shared.counts().count(policy.name_arc(), counted);
                // On the server's clock, as readings are (a decision's own instant may be
                // Redis's).
                shared.top().record(
                    policy.name_arc(),
                    &req.key,
                    d.allowed,
                    req.cost,
                    snapshot.now_ms(),
                );
            }
            let status = if op.admits() && !d.allowed {
                StatusCode::TOO_MANY_REQUESTS
            } else {
                StatusCode::OK
            };
            let extra = match op {
                Endpoint::Acquire => Extra::Lease(lease),
                Endpoint::Release => Extra::Released,
                _ => Extra::None,
            };
            decision_response_with(status, policy, &req.key, &d, extra)
        }
        Err(LimitError::Store(e)) => {
            metrics::decision(policy.name_arc(), op_name, "error");
            if op.admits() {
                shared
                    .counts()
                    .count(policy.name_arc(), crate::stats::Outcome::Error);
            }
            error(
                StatusCode::SERVICE_UNAVAILABLE,
                "store_unavailable",
                store_failure(policy, &req.key, &e),
            )
        }
        Err(e) => error(StatusCode::BAD_REQUEST, "invalid_request", e.to_string()),
    }
}

/// What a `503 store_unavailable` says: the store cannot answer now and the policy fails
/// closed, or the store refused the decision in a way no retry changes (whatever the mode).
fn store_failure(policy: &Policy, key: &str, e: &sluice::StoreError) -> String {
    if e.is_transient() {
        return format!(
            "the store cannot answer now ({e}) and policy `{}` fails {}; retry later",
            policy.name(),
            policy.failure_mode()
        );
    }
    let fix = match e {
        sluice::StoreError::Corrupt { .. } => format!(
            "; DELETE /v1/keys/{}/{key} clears the key's state",
            policy.name()
        ),
        _ => String::new(),
    };
    format!(
        "the store refused this decision ({e}); retrying will not change that, whatever policy \
         `{}`'s on_store_error{fix}",
        policy.name()
    )
}

/// The decision body (docs/api.md#the-decision-body), in the documented field order.
#[derive(serde::Serialize)]
struct DecisionBody<'a> {
    allowed: bool,
    policy: &'a str,
    key: &'a str,
    cost: u64,
    limit: u64,
    remaining: u64,
    reset: u64,
    retry_after: Option<u64>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    degraded: bool,
    limits: Vec<LimitBody>,
    /// `/v1/acquire` when allowed: the lease taken.
    #[serde(skip_serializing_if = "Option::is_none")]
    lease: Option<LeaseBody>,
    /// `/v1/release`: whether the lease was held (and is now freed).
    #[serde(skip_serializing_if = "Option::is_none")]
    released: Option<bool>,
}

/// The lease in an `/v1/acquire` answer.
#[derive(serde::Serialize)]
struct LeaseBody {
    id: String,
    expires_ms: u64,
}

/// What an answer adds to the decision body.
enum Extra {
    None,
    /// `/v1/acquire`: the lease, when one was taken.
    Lease(Option<sluice::Lease>),
    /// `/v1/release`: `released`, from the decision's cost (the units freed).
    Released,
}

/// One limit in a decision body.
#[derive(serde::Serialize)]
struct LimitBody {
    max: u64,
    /// A token bucket's `burst` (its capacity, what `limit` reports); absent otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    burst: Option<u64>,
    per_ms: u64,
    algorithm: &'static str,
    remaining: u64,
    reset_ms: u64,
    retry_after_ms: Option<u64>,
}

/// The decision body and headers (docs/api.md#the-decision-body, docs/api.md#headers).
pub fn decision_response(status: StatusCode, policy: &Policy, key: &str, d: &Decision) -> Response {
    decision_response_with(status, policy, key, d, Extra::None)
}

fn decision_response_with(
    status: StatusCode,
    policy: &Policy,
    key: &str,
    d: &Decision,
    extra: Extra,
) -> Response {
    let b = d.binding();
    let body = DecisionBody {
        allowed: d.allowed,
        policy: policy.name(),
        key,
        cost: d.cost,
        limit: b.capacity,
        remaining: b.remaining,
        reset: secs_up(b.reset_ms),
        retry_after: b.retry_after_ms.map(secs_up),
        degraded: d.is_degraded(),
        limits: d
            .limits()
            .iter()
            .map(|s| LimitBody {
                max: s.max,
                burst: (s.algorithm == sluice::Algorithm::TokenBucket).then_some(s.capacity),
                per_ms: s.per_ms,
                algorithm: s.algorithm.as_str(),
                remaining: s.remaining,
                reset_ms: s.reset_ms,
                retry_after_ms: s.retry_after_ms,
            })
            .collect(),
        lease: match extra {
            Extra::Lease(Some(l)) => Some(LeaseBody {
                id: lease_text(l.id),
                expires_ms: l.expires_ms,
            }),
            _ => None,
        },
        released: matches!(extra, Extra::Released).then_some(d.cost > 0),
    };
    let mut response = match serde_json::to_vec(&body) {
        Ok(bytes) => (status, bytes).into_response(),
        Err(e) => return error(StatusCode::INTERNAL_SERVER_ERROR, "internal", e.to_string()),
    };
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    add_headers(response.headers_mut(), policy, d);
    response
}

fn set(headers: &mut HeaderMap, name: &'static str, value: String) {
    if let Ok(v) = HeaderValue::from_str(&value) {
        headers.insert(HeaderName::from_static(name), v);
    }
}

/// GitHub's `X-RateLimit-*`, `Retry-After`, and the IETF draft's `RateLimit-Policy` and
/// `RateLimit` (Structured Fields: one item per limit), rendered by [`sluice::headers`] under
/// its rules (times from the decision's own instant; none for a decision that failed open).
pub fn add_headers(headers: &mut HeaderMap, policy: &Policy, d: &Decision) {
    for (name, value) in sluice::headers::all(policy, d) {
        set(headers, name, value);
    }
}

// ----- the rest -----------------------------------------------------------------------------

async fn forget(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    path: Result<Path<(String, String)>, PathRejection>,
) -> Response {
    if let Some(refused) = admin_only(&shared, &headers, "DELETE /v1/keys", false) {
        return refused;
    }
    // A percent-escape that is not UTF-8 (`%ff`): JSON like every other error, not axum's text.
    let (policy, key) = match path {
        Ok(Path(pair)) => pair,
        Err(rejection) => {
            return error(
                StatusCode::BAD_REQUEST,
                "invalid_request",
                format!("the path could not be read: {}", rejection.body_text()),
            );
        }
    };
    let snapshot = shared.snapshot();
    if snapshot.limiter.policy(&policy).is_none() {
        return unknown_policy(&policy, &snapshot);
    }
    match snapshot.limiter.forget(&policy, &key).await {
        // No body, so no content type.
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        Err(LimitError::Store(e)) => error(
            StatusCode::SERVICE_UNAVAILABLE,
            "store_unavailable",
            format!("the store cannot answer: {e}"),
        ),
        Err(e) => error(StatusCode::BAD_REQUEST, "invalid_request", e.to_string()),
    }
}

async fn policies(State(shared): State<Arc<Shared>>, headers: HeaderMap) -> Response {
    if let Some(refused) = admin_only(&shared, &headers, "GET /v1/policies", false) {
        return refused;
    }
    let snapshot = shared.snapshot();
    let mut list: Vec<&Policy> = snapshot.limiter.policies().collect();
    list.sort_by(|a, b| a.name().cmp(b.name()));
    let policies: Vec<Value> = list
        .into_iter()
        .map(|p| {
            let limits: Vec<Value> = p
                .limits()
                .iter()
                .map(|l| {
                    let mut v = json!({
                        "max": l.max(),
                        "per_ms": l.per_ms(),
                        "algorithm": l.algorithm().as_str(),
                    });
                    match l.algorithm() {
                        sluice::Algorithm::SlidingWindow => {
                            v["precision_ms"] = json!(l.precision_ms())
                        }
                        sluice::Algorithm::TokenBucket => v["burst"] = json!(l.burst()),
                        sluice::Algorithm::FixedWindow => v["align"] = json!(l.align()),
                        _ => {}
                    }
                    v
                })
                .collect();
            json!({"name": p.name(), "on_store_error": p.failure_mode().as_str(), "limits": limits})
        })
        .collect();
    let status = shared.reload_status();
    json_response(
        StatusCode::OK,
        &json!({
            "policies": policies,
            "config": {"generation": status.generation, "last_reload_error": status.last_error},
        }),
    )
}

/// The most `limit` keys `GET /v1/top` answers.
pub const MAX_TOP_LIMIT: usize = 100;

/// `GET /v1/top?policy=…&by=denied|used&limit=…`: a policy's (or an Envoy rule's) heaviest
/// keys over the recent window, with what each has left now for configured policies.
async fn top(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
) -> Response {
    if let Some(refused) = admin_only(&shared, &headers, "GET /v1/top", false) {
        return refused;
    }
    let bad = |message: String| error(StatusCode::BAD_REQUEST, "invalid_request", message);
    let pairs: Vec<(String, String)> =
        match serde_urlencoded::from_str(query.as_deref().unwrap_or("")) {
            Ok(p) => p,
            Err(e) => return bad(format!("the query string is not form-encoded: {e}")),
        };
    let (mut policy, mut by, mut limit) = (None, crate::top::Measure::Denied, 10usize);
    for (name, value) in pairs {
        match name.as_str() {
            "policy" => policy = Some(value),
            "by" => match value.parse() {
                Ok(m) => by = m,
                Err(e) => return bad(e),
            },
            "limit" => match value.parse::<usize>() {
                Ok(n) if (1..=MAX_TOP_LIMIT).contains(&n) => limit = n,
                _ => {
                    return bad(format!(
                        "`limit` must be a whole number from 1 to {MAX_TOP_LIMIT}, got `{value}`"
                    ));
                }
            },
            other => {
                return bad(format!(
                    "unknown query parameter `{other}`; expected policy, by, limit"
                ));
            }
        }
    }
    let Some(policy) = policy else {
        return bad(
            "`policy` is required: a configured policy, or an Envoy rule's statistics key \
                    (e.g. `edge.remote_address`)"
                .to_owned(),
        );
    };
    let snapshot = shared.snapshot();
    let configured = snapshot.limiter.policy(&policy);
    if configured.is_none() && !shared.top().tracks(&policy) {
        return error(
            StatusCode::NOT_FOUND,
            "unknown_policy",
            format!(
                "no policy or Envoy rule named `{policy}` has been seen; configured policies: \
                 {}; Envoy rules appear under their statistics key once they have seen traffic",
                {
                    let mut names: Vec<&str> =
                        snapshot.limiter.policies().map(Policy::name).collect();
                    names.sort_unstable();
                    names.join(", ")
                }
            ),
        );
    }
    let now = sluice::Clock::now_ms(shared.clock());
    let reading = shared.top().read(&policy, by, limit, now);
    let mut keys = Vec::with_capacity(reading.keys.len());
    for c in &reading.keys {
        let mut entry = json!({"key": &*c.key, "count": c.count, "error": c.error});
        if let Some(p) = configured {
            // What the key has left now (a peek of 0 records nothing); null if the store
            // cannot say.
            entry["remaining"] = match snapshot.limiter.peek_policy(p, &c.key, 0).await {
                Ok(d) if d.degraded.is_none() => json!(d.remaining()),
                _ => Value::Null,
            };
        }
        keys.push(entry);
    }
    json_response(
        StatusCode::OK,
        &json!({
            "policy": policy,
            "by": match by {
                crate::top::Measure::Used => "used",
                crate::top::Measure::Denied => "denied",
            },
            "since_ms": reading.from_ms,
            "total": reading.total,
            "capacity": shared.top().capacity(),
            "keys": keys,
        }),
    )
}

/// `GET /v1/stats`: checks per policy and outcome since start, the store's shards (circuit,
/// a ping's latency), reservation and reload status: what the dashboard polls.
async fn stats(State(shared): State<Arc<Shared>>, headers: HeaderMap) -> Response {
    if let Some(refused) = admin_only(&shared, &headers, "GET /v1/stats", false) {
        return refused;
    }
    let now = sluice::Clock::now_ms(shared.clock());
    let policies = shared.counts().read();
    let ping = |started: std::time::Instant, result: Result<(), sluice::StoreError>| match result {
        Ok(()) => json!({"ok": true, "latency_ms": started.elapsed().as_secs_f64() * 1e3}),
        Err(e) => json!({"ok": false, "error": e.to_string()}),
    };
    let store = match shared.store() {
        crate::state::StoreHandle::Memory(m) => {
            json!({"kind": "memory", "keys": m.len(), "shards": []})
        }
        crate::state::StoreHandle::Redis(sharded) => {
            let mut shards = Vec::with_capacity(sharded.shards().len());
            for shard in sharded.shards() {
                let started = std::time::Instant::now();
                let mut s = ping(started, shard.inner().ping().await);
                s["name"] = json!(shard.name());
                s["circuit"] = json!(shard.state().as_str());
                s["opened_total"] = json!(shard.opened_total());
                shards.push(s);
            }
            json!({"kind": "redis", "shards": shards})
        }
        crate::state::StoreHandle::Cluster(cluster) => {
            let started = std::time::Instant::now();
            let mut s = ping(started, cluster.ping().await);
            s["name"] = json!(cluster.name());
            json!({"kind": "cluster", "shards": [s]})
        }
    };
    let reservation = shared.reserving().map(|r| {
        let s = r.stats();
        json!({
            "local": s.local, "cached_denials": s.cached_denials, "fetches": s.fetches,
            "waited": s.waited, "direct": s.direct, "refunds": s.refunds,
        })
    });
    let status = shared.reload_status();
    json_response(
        StatusCode::OK,
        &json!({
            "now_ms": now,
            "policies": policies,
            "store": store,
            "reservation": reservation,
            "config": {"generation": status.generation, "last_reload_error": status.last_error},
        }),
    )
}

/// The dashboard's page and script, in the binary: the page works offline.
const UI_PAGE: &str = include_str!("ui/index.html");
const UI_SCRIPT: &str = include_str!("ui/app.js");

/// A static part of the dashboard, allowed to load nothing but this server's own resources.
fn ui_asset(content_type: &'static str, body: &'static str) -> Response {
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
async fn ui_page() -> Response {
    ui_asset("text/html; charset=utf-8", UI_PAGE)
}

/// `GET /ui/app.js`: the dashboard's script.
async fn ui_script() -> Response {
    ui_asset("text/javascript; charset=utf-8", UI_SCRIPT)
}

/// `POST /v1/simulate` (docs/simulate.md): runs a traffic through configured or inline
/// policies on a manual clock, on a blocking thread (a large simulation is a second of CPU);
/// a request the simulator refuses is a 400 naming the field or the bound.
/// An admin route: it reads configured policies' limits, and it spends CPU on request. At
/// most [`crate::simulate::MAX_CONCURRENT`] run at once: the slot is taken before the body is
/// read (so a refused request costs no buffer) and held by the work itself until it ends,
/// even if the client leaves.
async fn simulate(State(shared): State<Arc<Shared>>, request: axum::extract::Request) -> Response {
    if let Some(refused) = admin_only(&shared, request.headers(), "POST /v1/simulate", false) {
        return refused;
    }
    let Ok(slot) = shared.simulations().clone().try_acquire_owned() else {
        let mut r = error(
            StatusCode::SERVICE_UNAVAILABLE,
            "busy",
            format!(
                "{n} simulations are running, the most this server runs at once \
                 (max_concurrent {n}); retry in a moment",
                n = crate::simulate::MAX_CONCURRENT
            ),
        );
        r.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        return r;
    };
    let bad = |message: String| error(StatusCode::BAD_REQUEST, "invalid_request", message);
    let bytes = match <Bytes as axum::extract::FromRequest<()>>::from_request(request, &()).await {
        Ok(b) => b,
        Err(rejection) => {
            if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
                return error(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "body_too_large",
                    format!(
                        "the body is larger than {MAX_SIMULATE_BODY} bytes (the simulate body \
                         cap); simulate a part of the log, or run `sluice simulate` on the file"
                    ),
                );
            }
            return bad(format!("the body could not be read: {rejection}"));
        }
    };
    let configured: Vec<Policy> = shared.snapshot().limiter.policies().cloned().collect();
    // Reading a large log or generating a large traffic is CPU work too: all of it off the
    // runtime's threads.
    let work = move || {
        let _slot = slot;
        let value =
            crate::unique::json(&bytes).map_err(|e| crate::simulate::SimError::new("", e))?;
        let bounds = crate::simulate::Bounds::default();
        crate::simulate::Simulation::from_request(&value, &configured, &bounds)?.run()
    };
    match tokio::task::spawn_blocking(work).await {
        Ok(Ok(report)) => match serde_json::to_value(&report) {
            Ok(body) => json_response(StatusCode::OK, &body),
            Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, "internal", e.to_string()),
        },
        // Not JSON, or a key given twice: the message as the other routes word it.
        Ok(Err(e)) if e.field.is_empty() => bad(e.message),
        Ok(Err(e)) => bad(e.to_string()),
        Err(e) => error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            format!("the simulation failed: {e}"),
        ),
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

async fn metrics_text(State(shared): State<Arc<Shared>>, headers: HeaderMap) -> Response {
    if let Some(refused) = admin_only(&shared, &headers, "GET /metrics", true) {
        return refused;
    }
    metrics::circuits(shared.store());
    if let Some(reserving) = shared.reserving() {
        metrics::reservation(reserving.stats());
    }
    match metrics::render() {
        Some(text) => {
            let mut r = (StatusCode::OK, text).into_response();
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/plain; version=0.0.4"),
            );
            r
        }
        None => error(
            StatusCode::SERVICE_UNAVAILABLE,
            "metrics_unavailable",
            "another metrics recorder is installed in this process",
        ),
    }
}

async fn openapi() -> Response {
    let mut r = (StatusCode::OK, OPENAPI).into_response();
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}
