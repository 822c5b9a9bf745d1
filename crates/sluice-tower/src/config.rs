//! What a [`RateLimitLayer`](crate::RateLimitLayer) is configured with: the policy choice and
//! the [`Config`] its services share. Apart from the layer (the builder) and the service (the
//! per-request steps), so both point at it and neither at the other.

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderName, Response, request, response};
use sluice::{Decision, Limiter, Policy};

use crate::key::KeyExtractor;

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

/// Everything a [`RateLimit`](crate::RateLimit) service needs, shared by the services of one layer.
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
