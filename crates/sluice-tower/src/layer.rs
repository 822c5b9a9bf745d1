//! [`RateLimitLayer`]: what to limit, by which key, and how to answer.

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderName, Response, StatusCode, request, response};
use sluice::{Decision, Limiter, Policy, SystemClock};
use tower_layer::Layer;

use crate::key::KeyExtractor;
use crate::service::RateLimit;

type PolicyFn = dyn Fn(&request::Parts) -> Option<Policy> + Send + Sync;
type CostFn = dyn Fn(&request::Parts) -> u64 + Send + Sync;
type RefundFn = dyn Fn(&response::Parts) -> bool + Send + Sync;
type DenyFn = dyn Fn(&Decision, &Policy) -> Response<Bytes> + Send + Sync;

/// Which policy limits a request: one for every request, or one chosen per request.
///
/// A [`Policy`] converts into a fixed choice. [`PolicyChoice::from_fn`] chooses by looking at
/// the request's head (path, method, a plan header, …); when it returns `None` the request
/// is **not limited**: it goes to the inner service unchanged, with no rate-limit headers.
/// That is the way to exempt health checks or internal callers, and to mount one layer over
/// routes with different policies.
#[derive(Clone)]
pub struct PolicyChoice(Choice);

#[derive(Clone)]
enum Choice {
    Fixed(Policy),
    PerRequest(Arc<PolicyFn>),
}

impl PolicyChoice {
    /// The same policy for every request.
    pub fn fixed(policy: Policy) -> Self {
        Self(Choice::Fixed(policy))
    }

    /// A policy chosen per request; `None` lets the request through unlimited. Cloning a
    /// `Policy` is two reference-count increments, so returning clones of policies the closure
    /// owns is cheap.
    pub fn from_fn<F>(f: F) -> Self
    where
        F: Fn(&request::Parts) -> Option<Policy> + Send + Sync + 'static,
    {
        Self(Choice::PerRequest(Arc::new(f)))
    }

    /// The policy for a request, if it is limited.
    pub fn choose(&self, parts: &request::Parts) -> Option<Cow<'_, Policy>> {
        match &self.0 {
            Choice::Fixed(policy) => Some(Cow::Borrowed(policy)),
            Choice::PerRequest(f) => f(parts).map(Cow::Owned),
        }
    }
}

impl From<Policy> for PolicyChoice {
    fn from(policy: Policy) -> Self {
        Self::fixed(policy)
    }
}

impl fmt::Debug for PolicyChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Choice::Fixed(p) => f
                .debug_tuple("PolicyChoice::Fixed")
                .field(&p.name())
                .finish(),
            Choice::PerRequest(_) => f.write_str("PolicyChoice::PerRequest"),
        }
    }
}

/// Everything a [`RateLimit`] service needs, shared by the services of one layer.
pub(crate) struct Config<S, C> {
    pub(crate) limiter: Arc<Limiter<S, C>>,
    pub(crate) policy: PolicyChoice,
    pub(crate) key: KeyExtractor,
    pub(crate) fallback_key: Option<Arc<str>>,
    pub(crate) cost: Option<Arc<CostFn>>,
    pub(crate) refund_if: Arc<RefundFn>,
    pub(crate) github_headers: bool,
    pub(crate) ietf_headers: bool,
    pub(crate) on_denied: Option<Arc<DenyFn>>,
    pub(crate) degraded_header: Option<HeaderName>,
}

impl<S, C> Clone for Config<S, C> {
    fn clone(&self) -> Self {
        Self {
            limiter: Arc::clone(&self.limiter),
            policy: self.policy.clone(),
            key: self.key.clone(),
            fallback_key: self.fallback_key.clone(),
            cost: self.cost.clone(),
            refund_if: Arc::clone(&self.refund_if),
            github_headers: self.github_headers,
            ietf_headers: self.ietf_headers,
            on_denied: self.on_denied.clone(),
            degraded_header: self.degraded_header.clone(),
        }
    }
}

impl<S, C> fmt::Debug for Config<S, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitConfig")
            .field("policy", &self.policy)
            .field("key", &self.key)
            .field("fallback_key", &self.fallback_key)
            .field("cost", &self.cost.as_ref().map(|_| "fn"))
            .field("github_headers", &self.github_headers)
            .field("ietf_headers", &self.ietf_headers)
            .field("on_denied", &self.on_denied.as_ref().map(|_| "fn"))
            .field("degraded_header", &self.degraded_header)
            .finish_non_exhaustive()
    }
}

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
