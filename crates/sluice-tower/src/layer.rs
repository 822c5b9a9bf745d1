//! [`RateLimitLayer`]: what to limit, by which key, and how to answer.

use std::fmt;
use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderName, Response, StatusCode, request, response};
use sluice::{Decision, Limiter, Policy, SystemClock};
use tower_layer::Layer;

use crate::config::{Config, PolicyChoice};
use crate::key::KeyExtractor;
use crate::service::RateLimit;

/// Applies a Sluice policy to every request of the services it wraps (see the
/// [crate docs](crate) for what a request goes through).
///
/// Built with [`RateLimitLayer::new`] and refined with the builder methods; cloning is cheap,
/// and every service the layer makes shares the limiter and its configuration.
///
/// Defaults: cost 1, a request without a key is refused with 400, both header sets on, the
/// quota-exceeded problem document for denials, a refund when the inner service answers
/// `304 Not Modified`, no header marking degraded decisions.
pub struct RateLimitLayer<S, C = SystemClock> {
    config: Config<S, C>,
}

impl<S, C> Clone for RateLimitLayer<S, C> {
    fn clone(&self) -> Self {
        Self {
            config: self.config.clone(),
        }
    }
}

impl<S, C> fmt::Debug for RateLimitLayer<S, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitLayer")
            .field("config", &self.config)
            .finish()
    }
}

/// The default refund predicate: the inner service answered `304 Not Modified`.
fn not_modified(response: &response::Parts) -> bool {
    response.status == StatusCode::NOT_MODIFIED
}

impl<S, C> RateLimitLayer<S, C> {
    /// Limits requests with `limiter` under `policy` (a [`Policy`], or a
    /// [`PolicyChoice::from_fn`]), counting each request against the key `key` finds.
    ///
    /// `limiter` may be a [`Limiter`] or an `Arc` of one (keep a clone of the `Arc` to
    /// `peek`, `refund` or `forget` keys yourself). The policy need not be registered in the
    /// limiter; its failure mode applies when the store cannot answer.
    pub fn new(
        limiter: impl Into<Arc<Limiter<S, C>>>,
        policy: impl Into<PolicyChoice>,
        key: KeyExtractor,
    ) -> Self {
        Self {
            config: Config {
                limiter: limiter.into(),
                policy: policy.into(),
                key,
                fallback_key: None,
                cost: None,
                refund_if: Arc::new(not_modified),
                github_headers: true,
                ietf_headers: true,
                on_denied: None,
                degraded_header: None,
            },
        }
    }

    /// Counts requests without a usable key (none found, or not 1 to 512 bytes) under `key`
    /// instead of refusing them with 400. All such requests share that one key's quota, e.g.
    /// `"anonymous"`.
    pub fn fallback_key(mut self, key: impl Into<String>) -> Self {
        self.config.fallback_key = Some(Arc::from(key.into()));
        self
    }

    /// The cost of a request as a function of its head (default: 1), e.g. a batch size from
    /// a header. A cost of 0 records nothing and always passes; a cost above 2^53 is refused
    /// with 400.
    pub fn cost<F>(mut self, f: F) -> Self
    where
        F: Fn(&request::Parts) -> u64 + Send + Sync + 'static,
    {
        self.config.cost = Some(Arc::new(f));
        self
    }

    /// Gives the cost back when the inner service's response satisfies `predicate` (default:
    /// status `304 Not Modified`, so conditional requests stay free). The request is charged
    /// when it starts, so slow responses cannot push a key past its limit; the refund happens
    /// before the response is returned and its headers show the state after it. A request
    /// whose inner service returns an error is not refunded (it did use the service).
    /// `refund_if(|_| false)` turns refunds off.
    pub fn refund_if<F>(mut self, predicate: F) -> Self
    where
        F: Fn(&response::Parts) -> bool + Send + Sync + 'static,
    {
        self.config.refund_if = Arc::new(predicate);
        self
    }

    /// Whether responses carry GitHub's `X-RateLimit-Limit`, `-Remaining`, `-Used`, `-Reset`
    /// and `-Resource` (default: on).
    pub fn github_headers(mut self, on: bool) -> Self {
        self.config.github_headers = on;
        self
    }

    /// Whether responses carry the IETF draft's `RateLimit-Policy` and `RateLimit` (default:
    /// on).
    pub fn ietf_headers(mut self, on: bool) -> Self {
        self.config.ietf_headers = on;
        self
    }

    /// Answers denied requests with `f(decision, policy)` instead of the quota-exceeded
    /// problem document ([`too_many_requests`](crate::too_many_requests)). The layer still adds
    /// `Retry-After` and the enabled rate-limit headers, unless the response already has them.
    pub fn on_denied<F>(mut self, f: F) -> Self
    where
        F: Fn(&Decision, &Policy) -> Response<Bytes> + Send + Sync + 'static,
    {
        self.config.on_denied = Some(Arc::new(f));
        self
    }

    /// Marks responses to requests decided without the store (the policy fails `open` or
    /// `local` and the store is down) with header `name`, whose value is `open` or `local`.
    /// Off by default: clients rarely need to know, operators see it in logs and metrics.
    pub fn degraded_header(mut self, name: HeaderName) -> Self {
        self.config.degraded_header = Some(name);
        self
    }

    /// The limiter.
    pub fn limiter(&self) -> &Arc<Limiter<S, C>> {
        &self.config.limiter
    }
}

impl<T, S, C> Layer<T> for RateLimitLayer<S, C> {
    type Service = RateLimit<T, S, C>;

    fn layer(&self, inner: T) -> Self::Service {
        RateLimit::new(inner, Arc::new(self.config.clone()))
    }
}
