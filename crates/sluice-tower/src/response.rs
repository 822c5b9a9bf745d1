//! The layer's own answers (429, 503, 400) and the response body type that carries them.
//!
//! The layer answers some requests itself, so its response body must be either the inner
//! service's body or one of its own. [`RateLimitBody`] is that choice (as tower-http's
//! `RequestBodyLimit` does it): no boxing, no bound on the inner body beyond what a body
//! needs, and axum takes it as is (`Response<RateLimitBody<Body>>` is `IntoResponse`, so
//! `Router::layer` and `route_layer` accept the layer directly).
//!
//! Every answer of the layer's own is a problem document (RFC 9457,
//! `content-type: application/problem+json`). A denial uses the IETF rate-limit draft's
//! problem type `https://iana.org/assignments/http-problem-types#quota-exceeded`, with its
//! `violated-policies` member (the names of the refusing limits, as in the `RateLimit`
//! header: `"<policy>:<index>"`) and, as extension members, the binding limit's `policy`,
//! `limit` (what it holds at once, as in `X-RateLimit-Limit`: `max`, or a token bucket's
//! `burst`), `remaining`, `reset` (Unix seconds) and `retry_after` (seconds, `null` when the
//! request can never pass):
//!
//! ```json
//! {
//!   "type": "https://iana.org/assignments/http-problem-types#quota-exceeded",
//!   "title": "Quota Exceeded",
//!   "status": 429,
//!   "detail": "quota `api:0` exceeded: 10 per 1s, 0 left, this request costs 1; try again in 1 s",
//!   "violated-policies": ["api:0"],
//!   "policy": "api",
//!   "limit": 10,
//!   "remaining": 0,
//!   "reset": 1700000001,
//!   "retry_after": 1
//! }
//! ```
//!
//! A store failure under a policy that fails closed (or an error no failure mode covers, such
//! as corrupt state) is a 503 and a key the request lacks is a
//! 400, both `about:blank` problems whose `detail` says what to do. The 503 never includes
//! the store's error (it may name internal hosts); the layer logs it with `tracing`.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use serde::Serialize;
use sluice::headers::{item_name, secs_up};
use sluice::{Decision, Policy};

/// The problem type of a denial (draft-ietf-httpapi-ratelimit-headers, "Quota Exceeded").
pub const QUOTA_EXCEEDED: &str = "https://iana.org/assignments/http-problem-types#quota-exceeded";

/// The media type of every answer the layer makes itself.
pub const PROBLEM_JSON: &str = "application/problem+json";

pin_project! {
    /// The response body of [`RateLimit`](crate::RateLimit): the inner service's body, or a
    /// body the layer wrote (a problem document, or a custom denial's bytes).
    ///
    /// It is a [`http_body::Body`] with `Data = Bytes` when the inner body is one, with the
    /// inner body's error type.
    pub struct RateLimitBody<B> {
        #[pin]
        kind: Kind<B>,
        // A concurrency lease held for the life of the response: released when the body is
        // dropped (sent in full, or the connection lost).
        held: Option<Held>,
    }
}

/// Something held until the body is dropped (a lease guard, whose `Drop` releases it).
pub(crate) type Held = Box<dyn std::any::Any + Send + Sync>;

pin_project! {
    #[project = KindProj]
    enum Kind<B> {
        Inner { #[pin] body: B },
        Full { data: Option<Bytes> },
    }
}

impl<B> RateLimitBody<B> {
    /// The inner service's body, passed through.
    pub fn inner(body: B) -> Self {
        Self {
            kind: Kind::Inner { body },
            held: None,
        }
    }

    /// The same body, holding `held` until it is dropped.
    pub(crate) fn holding(mut self, held: Option<Held>) -> Self {
        self.held = held;
        self
    }

    /// A body the layer wrote.
    pub fn full(data: impl Into<Bytes>) -> Self {
        let data: Bytes = data.into();
        Self {
            kind: Kind::Full {
                data: (!data.is_empty()).then_some(data),
            },
            held: None,
        }
    }

    /// Whether the layer wrote this body (the request did not reach the inner service).
    pub fn is_from_layer(&self) -> bool {
        matches!(self.kind, Kind::Full { .. })
    }
}

impl<B> std::fmt::Debug for RateLimitBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.kind {
            Kind::Inner { .. } => f.write_str("RateLimitBody::Inner"),
            Kind::Full { data } => f
                .debug_struct("RateLimitBody::Full")
                .field("len", &data.as_ref().map_or(0, Bytes::len))
                .finish(),
        }
    }
}

impl<B> Body for RateLimitBody<B>
where
    B: Body<Data = Bytes>,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        match self.project().kind.project() {
            KindProj::Inner { body } => body.poll_frame(cx),
            KindProj::Full { data } => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Inner { body } => body.is_end_stream(),
            Kind::Full { data } => data.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Inner { body } => body.size_hint(),
            Kind::Full { data } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
        }
    }
}

/// A problem document (RFC 9457).
#[derive(Serialize)]
struct Problem<'a> {
    #[serde(rename = "type")]
    kind: &'a str,
    title: &'a str,
    status: u16,
    detail: String,
    #[serde(rename = "violated-policies", skip_serializing_if = "Option::is_none")]
    violated: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    policy: Option<&'a str>,
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    quota: Option<Quota>,
}

/// The binding limit of a denial, as extension members.
#[derive(Serialize)]
struct Quota {
    limit: u64,
    remaining: u64,
    reset: u64,
    retry_after: Option<u64>,
}

fn problem_response(status: StatusCode, problem: &Problem<'_>) -> Response<Bytes> {
    // Serializing this struct cannot fail (string keys, no maps, no floats).
    let body = serde_json::to_vec(problem).unwrap_or_default();
    let mut response = Response::new(Bytes::from(body));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
    response
}

/// A window in the configuration's own words: `250ms`, `1s`, `5m`, `1h`, `1d`.
pub(crate) fn duration(ms: u64) -> String {
    for (unit, size) in [
        ("d", 86_400_000),
        ("h", 3_600_000),
        ("m", 60_000),
        ("s", 1_000),
    ] {
        if ms >= size && ms.is_multiple_of(size) {
            return format!("{}{unit}", ms / size);
        }
    }
    format!("{ms}ms")
}

/// The default denial: `429 Too Many Requests` with the quota-exceeded problem document
/// described in [the module docs](self). The layer adds `Retry-After` and the rate-limit
/// headers to it (as to a custom denial), so this is a starting point for
/// [`RateLimitLayer::on_denied`](crate::RateLimitLayer::on_denied) too.
pub fn too_many_requests(decision: &Decision, policy: &Policy) -> Response<Bytes> {
    let b = decision.binding();
    let item = item_name(policy, decision.binding_index());
    // A token bucket's burst is part of its quota: a cost above it never fits.
    let quota = match b.algorithm {
        sluice::Algorithm::TokenBucket => {
            format!("{} per {}, burst {}", b.max, duration(b.per_ms), b.capacity)
        }
        _ => format!("{} per {}", b.max, duration(b.per_ms)),
    };
    let detail = match b.retry_after_ms {
        Some(ms) => format!(
            "quota `{item}` exceeded: {quota}, {} left, this request costs {}; try again in {} s",
            b.remaining,
            decision.cost,
            secs_up(ms).max(1)
        ),
        None => format!(
            "this request costs {}, more than quota `{item}` ({quota}) can ever allow",
            decision.cost,
        ),
    };
    let violated = decision
        .limits()
        .iter()
        .enumerate()
        .filter(|(_, s)| !s.admits)
        .map(|(i, _)| item_name(policy, i))
        .collect();
    problem_response(
        StatusCode::TOO_MANY_REQUESTS,
        &Problem {
            kind: QUOTA_EXCEEDED,
            title: "Quota Exceeded",
            status: StatusCode::TOO_MANY_REQUESTS.as_u16(),
            detail,
            violated: Some(violated),
            policy: Some(policy.name()),
            quota: Some(Quota {
                limit: b.capacity,
                remaining: b.remaining,
                reset: secs_up(b.reset_ms),
                retry_after: b.retry_after_ms.map(|ms| secs_up(ms).max(1)),
            }),
        },
    )
}

/// An `about:blank` problem of `status`, titled with its reason phrase: a 503 when the store
/// cannot answer and the policy fails closed (or the store's state is corrupt), a 400 for a
/// request refused before any limit is checked, a 500 for a limiter error this layer does
/// not know (a future error variant).
pub(crate) fn blank(status: StatusCode, detail: String, policy: Option<&str>) -> Response<Bytes> {
    problem_response(
        status,
        &Problem {
            kind: "about:blank",
            title: status.canonical_reason().unwrap_or_default(),
            status: status.as_u16(),
            detail,
            violated: None,
            policy,
            quota: None,
        },
    )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    #[test]
    fn durations_use_the_largest_whole_unit() {
        assert_eq!(duration(250), "250ms");
        assert_eq!(duration(1_000), "1s");
        assert_eq!(duration(1_500), "1500ms");
        assert_eq!(duration(90_000), "90s");
        assert_eq!(duration(120_000), "2m");
        assert_eq!(duration(3_600_000), "1h");
        assert_eq!(duration(86_400_000), "1d");
    }

    #[test]
    fn a_full_body_yields_its_bytes_once_and_knows_its_size() {
        let mut body = RateLimitBody::<String>::full("abc");
        assert!(body.is_from_layer());
        assert!(!body.is_end_stream());
        assert_eq!(body.size_hint().exact(), Some(3));
        let waker = std::task::Waker::noop();
        let mut cx = Context::from_waker(waker);
        let frame = match Pin::new(&mut body).poll_frame(&mut cx) {
            Poll::Ready(Some(Ok(frame))) => frame.into_data().unwrap(),
            _ => panic!("expected a data frame"),
        };
        assert_eq!(frame, Bytes::from_static(b"abc"));
        assert!(body.is_end_stream());
        assert!(matches!(
            Pin::new(&mut body).poll_frame(&mut cx),
            Poll::Ready(None)
        ));
        assert!(RateLimitBody::<String>::full("").is_end_stream());
    }
}
