//! [`RateLimit`]: the service a [`RateLimitLayer`](crate::RateLimitLayer) wraps around another.

use std::borrow::Cow;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{HeaderMap, HeaderName, HeaderValue, Request, Response, StatusCode};
use sluice::headers::{self, Field, Sets};
use sluice::{
    Clock, Decision, Degraded, Error, Lease, Limiter, MAX_KEY_LEN, Op, Policy, Store, SystemClock,
};
use tower_service::Service;

use crate::config::Config;
use crate::response::{self, RateLimitBody};

/// Rate limits the requests of an inner HTTP service: checks each request's key against a
/// Sluice policy before calling the inner service, and answers 429 itself when the policy
/// refuses. Made by [`RateLimitLayer`](crate::RateLimitLayer).
pub struct RateLimit<T, S, C = SystemClock> {
    inner: T,
    config: Arc<Config<S, C>>,
}

impl<T, S, C> RateLimit<T, S, C> {
    pub(crate) fn new(inner: T, config: Arc<Config<S, C>>) -> Self {
        Self { inner, config }
    }

    /// The inner service.
    pub fn get_ref(&self) -> &T {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut T {
        &mut self.inner
    }

    /// The inner service, consuming this one.
    pub fn into_inner(self) -> T {
        self.inner
    }
}

impl<T: Clone, S, C> Clone for RateLimit<T, S, C> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            config: Arc::clone(&self.config),
        }
    }
}

impl<T: fmt::Debug, S, C> fmt::Debug for RateLimit<T, S, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimit")
            .field("inner", &self.inner)
            .field("config", &self.config)
            .finish()
    }
}

impl<T, S, C, ReqBody, ResBody> Service<Request<ReqBody>> for RateLimit<T, S, C>
where
    T: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    T::Future: Send,
    T::Error: 'static,
    S: Store + 'static,
    C: Clock,
    ReqBody: Send + 'static,
    ResBody: Send + 'static,
{
    type Response = Response<RateLimitBody<ResBody>>;
    type Error = T::Error;
    type Future = ResponseFuture<ResBody, T::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        // `self.inner` is the instance `poll_ready` made ready: take it for this request and
        // leave a fresh clone behind for the next `poll_ready`.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        Box::pin(handle(Arc::clone(&self.config), inner, request))
    }
}

/// The future of a [`RateLimit`] call.
///
/// Boxed: it awaits the store's future, whose type cannot be named (the `Store` trait returns
/// `impl Future`). One allocation per request, measured by the crate's `layer` bench.
pub type ResponseFuture<B, E> =
    Pin<Box<dyn Future<Output = Result<Response<RateLimitBody<B>>, E>> + Send>>;

/// One request, start to end.
async fn handle<T, S, C, ReqBody, ResBody>(
    config: Arc<Config<S, C>>,
    mut inner: T,
    request: Request<ReqBody>,
) -> Result<Response<RateLimitBody<ResBody>>, T::Error>
where
    T: Service<Request<ReqBody>, Response = Response<ResBody>>,
    S: Store + 'static,
    C: Clock,
{
    let (parts, body) = request.into_parts();
    let Some(policy) = config.policy.choose(&parts) else {
        let response = inner.call(Request::from_parts(parts, body)).await?;
        return Ok(response.map(RateLimitBody::inner));
    };
    let policy: &Policy = &policy;

    let key: Cow<'_, str> = match config.key.extract(&parts) {
        Some(key) if sluice::check_key(&key).is_ok() => Cow::Owned(key),
        found => match &config.fallback_key {
            Some(fallback) => Cow::Borrowed(&**fallback),
            None => {
                let detail = missing_key(config.key.description(), found.as_deref());
                return Ok(own(response::blank(StatusCode::BAD_REQUEST, detail, None)));
            }
        },
    };
    let cost = config.cost.as_ref().map_or(1, |f| f(&parts));

    let (decision, guard) = match decide(&config, policy, &key, cost).await {
        Ok(d) => d,
        Err(Error::Store(e)) => {
            tracing::warn!(policy = policy.name(), error = %e, "rate limit store failed; answering 503");
            return Ok(own(response::blank(
                StatusCode::SERVICE_UNAVAILABLE,
                format!(
                    "the rate limiter's store cannot answer for policy `{}`; try again later",
                    policy.name()
                ),
                Some(policy.name()),
            )));
        }
        Err(e @ (Error::InvalidKey(_) | Error::InvalidCost(_))) => {
            return Ok(own(response::blank(
                StatusCode::BAD_REQUEST,
                e.to_string(),
                None,
            )));
        }
        Err(e) => {
            return Ok(own(response::blank(
                StatusCode::INTERNAL_SERVER_ERROR,
                e.to_string(),
                None,
            )));
        }
    };

    if !decision.allowed {
        let mut response = match &config.on_denied {
            Some(f) => f(&decision, policy),
            None => response::too_many_requests(&decision, policy),
        };
        decorate(&config, response.headers_mut(), policy, &decision);
        return Ok(response.map(RateLimitBody::full));
    }

    // From here the lease (if any) is released when `guard` is dropped: with this future if
    // the inner service fails, panics or is cancelled (the client went away), otherwise with
    // the response body.
    let response = inner.call(Request::from_parts(parts, body)).await?;
    let (mut head, body) = response.into_parts();
    let shown = refund_if_asked(&config, &head, policy, &key, cost, decision).await;
    decorate(&config, &mut head.headers, policy, &shown);
    let held = guard.map(|g| Box::new(g) as response::Held);
    Ok(Response::from_parts(
        head,
        RateLimitBody::inner(body).holding(held),
    ))
}

/// The decision: a check, or for a policy with a concurrency limit an acquire whose lease is
/// held (by the guard) until the response is over.
async fn decide<S, C>(
    config: &Arc<Config<S, C>>,
    policy: &Policy,
    key: &str,
    cost: u64,
) -> Result<(Decision, Option<LeaseGuard<S, C>>), Error>
where
    S: Store + 'static,
    C: Clock,
{
    let lease = policy.concurrency_limit().map(|_| Lease::new_id());
    let op = match lease {
        Some(lease) => Op::Hold { cost, lease },
        None => Op::Check { cost },
    };
    let d = config.limiter.call(policy, key, op).await?;
    let guard = lease
        .and_then(|id| Lease::of(id, &d))
        .map(|lease| LeaseGuard {
            limiter: Arc::clone(&config.limiter),
            policy: policy.clone(),
            key: key.to_owned(),
            id: lease.id,
        });
    Ok((d, guard))
}

/// Gives the cost back when `refund_if` asks for it; the decision to show after.
async fn refund_if_asked<S, C>(
    config: &Config<S, C>,
    head: &http::response::Parts,
    policy: &Policy,
    key: &str,
    cost: u64,
    decision: Decision,
) -> Decision
where
    S: Store + 'static,
    C: Clock,
{
    let mut shown = decision;
    // Nothing was recorded for a cost of 0 or for a request let through without the store.
    if cost > 0 && shown.degraded != Some(Degraded::Open) && (config.refund_if)(head) {
        match config.limiter.call(policy, key, Op::Refund { cost }).await {
            // Show the state after the refund, unless only the refund was decided without
            // the store (its numbers would describe another store).
            Ok(after) if after.degraded == shown.degraded => shown = after,
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(policy = policy.name(), error = %e, "rate limit refund failed; the request stays counted");
            }
        }
    }
    shown
}

/// A lease of a concurrency limit, released when dropped. The release is a store call, so
/// `Drop` spawns it on the current tokio runtime; without one (the response dropped outside
/// any runtime) the lease lapses after the limit's TTL instead, with a warning.
struct LeaseGuard<S: Store + 'static, C: Clock> {
    limiter: Arc<Limiter<S, C>>,
    policy: Policy,
    key: String,
    id: u64,
}

impl<S: Store + 'static, C: Clock> Drop for LeaseGuard<S, C> {
    fn drop(&mut self) {
        let (limiter, policy, key, id) = (
            Arc::clone(&self.limiter),
            self.policy.clone(),
            std::mem::take(&mut self.key),
            self.id,
        );
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(async move {
                    if let Err(e) = limiter.call(&policy, &key, Op::Release { lease: id }).await {
                        tracing::warn!(policy = policy.name(), error = %e, "releasing a concurrency lease failed; it lapses after its TTL");
                    }
                });
            }
            Err(_) => {
                tracing::warn!(
                    policy = policy.name(),
                    "a response holding a concurrency lease was dropped outside a tokio runtime; the lease lapses after its TTL"
                );
            }
        }
    }
}

/// A response the layer wrote, in the service's body type.
fn own<B>(response: Response<bytes::Bytes>) -> Response<RateLimitBody<B>> {
    response.map(RateLimitBody::full)
}

/// The 400 detail for a request without a usable key.
fn missing_key(what: &str, found: Option<&str>) -> String {
    match found {
        None => format!("this endpoint is rate limited by {what}, and the request has none"),
        Some(key) => format!(
            "this endpoint is rate limited by {what}, which must be 1 to {MAX_KEY_LEN} bytes; got {} bytes",
            key.len()
        ),
    }
}

/// The header names `sluice::headers` renders, built at compile time, indexed by
/// `Field as usize`.
static NAMES: [HeaderName; 8] = [
    HeaderName::from_static(Field::Limit.name()),
    HeaderName::from_static(Field::Remaining.name()),
    HeaderName::from_static(Field::Used.name()),
    HeaderName::from_static(Field::Reset.name()),
    HeaderName::from_static(Field::Resource.name()),
    HeaderName::from_static(Field::RetryAfter.name()),
    HeaderName::from_static(Field::RateLimitPolicy.name()),
    HeaderName::from_static(Field::RateLimit.name()),
];

fn name_of(field: Field) -> &'static HeaderName {
    &NAMES[field as usize]
}

/// Adds the enabled rate-limit headers, `Retry-After` on a denial, and the degraded marker.
///
/// Layers may be stacked (per IP outside, per user inside): the IETF fields are lists, so
/// each layer appends its items; GitHub's set can describe one limit only, so a layer replaces
/// a set already present only when its own `remaining` is lower (the set then describes the
/// tightest limit of all the layers, as it describes the binding limit of one policy). A
/// `Retry-After` already present (set by a custom denial) is kept.
fn decorate<S, C>(config: &Config<S, C>, headers: &mut HeaderMap, policy: &Policy, d: &Decision) {
    if let (Some(name), Some(how)) = (&config.degraded_header, d.degraded) {
        headers.insert(name.clone(), HeaderValue::from_static(how.as_str()));
    }
    let tighter = || {
        headers
            .get(name_of(Field::Remaining))
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok())
            .is_none_or(|present| d.remaining() < present)
    };
    let sets = Sets {
        github: config.github_headers && tighter(),
        retry_after: !headers.contains_key(name_of(Field::RetryAfter)),
        ietf: config.ietf_headers,
    };
    headers.reserve(8);
    headers::render(policy, d, sets, |field, value| {
        // Rendered values are visible ASCII; a failure cannot happen and would only drop
        // the header.
        let Ok(value) = HeaderValue::from_str(value) else {
            return;
        };
        let name = name_of(field).clone();
        match field {
            // Structured Field lists: field lines combine.
            Field::RateLimitPolicy | Field::RateLimit => {
                headers.append(name, value);
            }
            _ => {
                headers.insert(name, value);
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_name_table_is_indexed_by_field() {
        for field in Field::ALL {
            assert_eq!(name_of(field).as_str(), field.name());
        }
    }
}
