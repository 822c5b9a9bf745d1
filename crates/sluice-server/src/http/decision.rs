//! The decision routes (check, peek, acquire, release, refund): parse the body, ask the
//! limiter, observe, render the decision body and headers.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodRouter, post};
use sluice::headers::secs_up;
use sluice::{Decision, Error as LimitError, Policy};

use super::body::{Endpoint, lease_text, parse_request};
use super::error::ApiError;
use crate::observe::stats::Outcome;
use crate::state::Shared;

// ----- decisions ----------------------------------------------------------------------------

/// The route of one decision endpoint: `POST` a body, answered by [`answer`].
pub(super) fn decide(op: Endpoint) -> MethodRouter<Arc<Shared>> {
    post(
        move |State(s): State<Arc<Shared>>,
              TraceHeaders(headers): TraceHeaders,
              body: Result<Bytes, BytesRejection>| async move {
            answer(&s, op, &headers, body).await
        },
    )
}

/// The caller's trace context (`traceparent`, `tracestate`), copied from the request only when
/// traces are on: off, a decision clones no header.
pub(super) struct TraceHeaders(HeaderMap);

impl axum::extract::FromRequestParts<Arc<Shared>> for TraceHeaders {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        shared: &Arc<Shared>,
    ) -> Result<Self, Self::Rejection> {
        let mut headers = HeaderMap::new();
        if shared.observe().traces.is_on() {
            for name in ["traceparent", "tracestate"] {
                if let Some(value) = parts.headers.get(name) {
                    headers.insert(HeaderName::from_static(name), value.clone());
                }
            }
        }
        Ok(Self(headers))
    }
}

/// The `404` for `name`, listing the configured policies.
pub(super) fn unknown_policy(name: &str, snapshot: &crate::state::Generation) -> ApiError {
    ApiError::UnknownPolicy {
        name: name.to_owned(),
        configured: configured_names(snapshot),
    }
}

/// The configured policies' names, sorted.
pub(super) fn configured_names(snapshot: &crate::state::Generation) -> Vec<String> {
    let mut names: Vec<String> = snapshot
        .limiter
        .policies()
        .map(|p| p.name().to_owned())
        .collect();
    names.sort_unstable();
    names
}

/// Check, peek, refund, acquire or release: reads the body, asks the limiter, answers the
/// decision. With traces on, the decision is a span, child of the `traceparent` in `headers`.
pub(super) async fn answer(
    shared: &Shared,
    op: Endpoint,
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let req = parse_request(body, op)?;
    let snapshot = shared.snapshot();
    let limiter = &snapshot.limiter;
    let Some(policy) = limiter.policy(&req.policy) else {
        return Err(unknown_policy(&req.policy, &snapshot));
    };
    let (op_name, span_name) = op.names();
    let span = (shared.observe().traces)
        .decision(span_name, &opentelemetry_http::HeaderExtractor(headers));
    span.set(|| {
        vec![
            opentelemetry::KeyValue::new("sluice.policy", policy.name().to_owned()),
            opentelemetry::KeyValue::new(
                "sluice.cost",
                i64::try_from(req.cost).unwrap_or(i64::MAX),
            ),
        ]
    });
    let started = std::time::Instant::now();
    let (result, lease) = span.around(ask(limiter, policy, op, &req)).await;
    let observe = shared.observe();
    observe.decision_took(op_name, crate::observe::Surface::Http, started);
    match result {
        Ok(d) => {
            let outcome = Outcome::of(d.degraded.is_some(), d.allowed);
            span.finish(outcome.as_str(), None);
            admitted(shared, &snapshot, policy, op, &req, &d, outcome);
            let status = if op.admits() && !d.allowed {
                StatusCode::TOO_MANY_REQUESTS
            } else {
                StatusCode::OK
            };
            let released = op == Endpoint::Release;
            Ok(decision_response_with(
                status,
                policy,
                &req.key,
                &d,
                (lease, released),
            ))
        }
        Err(LimitError::Store(e)) => {
            span.finish(Outcome::Error.as_str(), Some(e.to_string()));
            observe
                .metrics
                .decision(policy.name_arc(), op_name, Outcome::Error);
            if op.admits() {
                observe.counts.count(policy.name_arc(), Outcome::Error);
            }
            Err(ApiError::StoreUnavailable(store_failure(
                policy, &req.key, &e,
            )))
        }
        Err(e) => {
            span.finish("invalid", Some(e.to_string()));
            Err(ApiError::invalid(e.to_string()))
        }
    }
}

/// Asks the limiter what `op` asks, as one [`sluice::Op`], with the lease `/v1/acquire` took,
/// if any: an acquire holds the lease it renews, or a new one.
async fn ask(
    limiter: &crate::state::ServerLimiter,
    policy: &Policy,
    op: Endpoint,
    req: &super::body::Request,
) -> (Result<Decision, LimitError>, Option<sluice::Lease>) {
    let (cost, mut lease) = (req.cost, req.lease);
    if op == Endpoint::Acquire && lease == 0 {
        lease = sluice::Lease::new_id();
    }
    let call = match op {
        Endpoint::Check => sluice::Op::Check { cost },
        Endpoint::Peek => sluice::Op::Peek { cost },
        Endpoint::Refund => sluice::Op::Refund { cost },
        Endpoint::Acquire => sluice::Op::Hold { cost, lease },
        Endpoint::Release => sluice::Op::Release { lease },
    };
    let result = limiter.call(policy, &req.key, call).await;
    let held = match (&result, op) {
        (Ok(d), Endpoint::Acquire) => sluice::Lease::of(lease, d),
        _ => None,
    };
    (result, held)
}

/// Reports an answered decision: its metric, the near-limit count, and for the routes that
/// admit, the `/v1/stats` counts and the heavy hitters.
fn admitted(
    shared: &Shared,
    snapshot: &crate::state::Generation,
    policy: &Policy,
    op: Endpoint,
    req: &super::body::Request,
    d: &Decision,
    outcome: Outcome,
) {
    let observe = shared.observe();
    observe
        .metrics
        .decision(policy.name_arc(), op.names().0, outcome);
    if !op.admits() {
        return;
    }
    if outcome == Outcome::Allowed && near_limit(snapshot, d) {
        observe.metrics.near_limit(policy.name_arc());
    }
    observe.counts.count(policy.name_arc(), outcome);
    // On the server's clock, as readings are (a decision's own instant may be Redis's).
    observe.top.record(
        policy.name_arc(),
        &req.key,
        d.allowed,
        req.cost,
        snapshot.now_ms(),
    );
}

/// Whether a decision left one of its limits at least `metrics.near_limit_ratio` used.
fn near_limit(snapshot: &crate::state::Generation, d: &Decision) -> bool {
    d.limits()
        .iter()
        .any(|s| snapshot.near_limit.reached(s.capacity, s.remaining))
}

/// What a `503 store_unavailable` says: the store cannot answer now and the policy fails
/// closed, or the store refused the decision in a way no retry changes (whatever the mode).
pub(super) fn store_failure(policy: &Policy, key: &str, e: &sluice::StoreError) -> String {
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
pub(super) struct DecisionBody<'a> {
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
pub(super) struct LeaseBody {
    id: String,
    expires_ms: u64,
}

/// One limit in a decision body.
#[derive(serde::Serialize)]
pub(super) struct LimitBody {
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
    decision_response_with(status, policy, key, d, (None, false))
}

/// [`decision_response`] with what an answer adds: the lease an `/v1/acquire` took, and for
/// `/v1/release`, `released` (from the decision's cost, the units freed).
pub(super) fn decision_response_with(
    status: StatusCode,
    policy: &Policy,
    key: &str,
    d: &Decision,
    (lease, released): (Option<sluice::Lease>, bool),
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
        lease: lease.map(|l| LeaseBody {
            id: lease_text(l.id),
            expires_ms: l.expires_ms,
        }),
        released: released.then_some(d.cost > 0),
    };
    // A one-limit decision body is about 270 bytes: written without growing the buffer.
    let mut response = (status, axum::Json(body)).into_response();
    add_headers(response.headers_mut(), policy, d);
    response
}

/// GitHub's `X-RateLimit-*`, `Retry-After`, and the IETF draft's `RateLimit-Policy` and
/// `RateLimit` (Structured Fields: one item per limit), rendered by [`sluice::headers`] under
/// its rules (times from the decision's own instant; none for a decision that failed open).
/// Each value is copied once, from the renderer's buffer into the header map.
pub fn add_headers(headers: &mut HeaderMap, policy: &Policy, d: &Decision) {
    headers.reserve(8);
    sluice::headers::render(policy, d, sluice::headers::Sets::ALL, |field, value| {
        if let Ok(v) = HeaderValue::from_str(value) {
            headers.insert(HeaderName::from_static(field.name()), v);
        }
    });
}
