//! The `Store` trait: where state lives, one atomic operation per call.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use sluice_core::{Decision, Policy};

/// A store failed to answer. Being rate limited is never an error: it is a [`Decision`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The store did not answer within its timeout.
    #[error("store timed out after {}ms", .0.as_millis())]
    Timeout(Duration),
    /// The store could not be reached (connection refused, reset, circuit open, …).
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// The store holds data for the key that is not a valid state (wrong type, bad field).
    #[error("store holds invalid state for `{key}`: {detail}")]
    Corrupt {
        /// The storage key at fault.
        key: String,
        /// What is wrong with it.
        detail: String,
    },
    /// Any other failure reported by the store.
    #[error("store error: {0}")]
    Backend(String),
}

impl StoreError {
    /// Whether trying again later may succeed (timeouts and unreachable stores).
    pub fn is_transient(&self) -> bool {
        matches!(self, StoreError::Timeout(_) | StoreError::Unavailable(_))
    }
}

/// Where the state of every (policy, key) lives.
///
/// Each method is **one atomic operation** over all the limits of a policy for one key: the
/// store reads the limits' states, evaluates them with [`sluice_core::evaluate`] (or a script
/// that mirrors it) at `now_ms`, and writes back what changed, with no other decision for the
/// same key interleaved. A store that keeps its own time (`clock: redis`) may ignore `now_ms`.
///
/// Implementations: [`crate::MemoryStore`] here; the Redis stores in `sluice-redis`. Wrappers
/// (the reservation layer, fault handling) implement `Store` over a `Store`. For a store chosen
/// at run time, erase the type with [`SharedStore`].
pub trait Store: Send + Sync {
    /// Checks `cost` against every limit of `policy` for `key`; records it everywhere if all
    /// admit, nowhere otherwise.
    fn check(
        &self,
        policy: &Policy,
        key: &str,
        cost: u64,
        now_ms: u64,
    ) -> impl Future<Output = Result<Decision, StoreError>> + Send;

    /// The decision a check of `cost` would get, recording nothing. May read a replica.
    fn peek(
        &self,
        policy: &Policy,
        key: &str,
        cost: u64,
        now_ms: u64,
    ) -> impl Future<Output = Result<Decision, StoreError>> + Send;

    /// Gives `cost` back to the key's current windows (never below zero used).
    fn refund(
        &self,
        policy: &Policy,
        key: &str,
        cost: u64,
        now_ms: u64,
    ) -> impl Future<Output = Result<Decision, StoreError>> + Send;

    /// Forgets every limit's state of `key` under `policy`.
    fn forget(
        &self,
        policy: &Policy,
        key: &str,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Takes as many units as every limit admits now, at least `min` and at most `max`, in
    /// one atomic operation ([`sluice_core::evaluate::acquire`]): how a process leases a batch
    /// of tokens. The decision's `cost` is the amount taken; when even `min` does not fit it
    /// is a refused check of `min`, recording nothing.
    ///
    /// The default takes exactly `min` (a plain check): correct, but never a batch. The
    /// stores of this project take the batch.
    fn acquire(
        &self,
        policy: &Policy,
        key: &str,
        min: u64,
        max: u64,
        now_ms: u64,
    ) -> impl Future<Output = Result<Decision, StoreError>> + Send {
        let _ = max;
        self.check(policy, key, min, now_ms)
    }
}

impl<S: Store + ?Sized> Store for Arc<S> {
    fn check(
        &self,
        policy: &Policy,
        key: &str,
        cost: u64,
        now_ms: u64,
    ) -> impl Future<Output = Result<Decision, StoreError>> + Send {
        (**self).check(policy, key, cost, now_ms)
    }

    fn peek(
        &self,
        policy: &Policy,
        key: &str,
        cost: u64,
        now_ms: u64,
    ) -> impl Future<Output = Result<Decision, StoreError>> + Send {
        (**self).peek(policy, key, cost, now_ms)
    }

    fn refund(
        &self,
        policy: &Policy,
        key: &str,
        cost: u64,
        now_ms: u64,
    ) -> impl Future<Output = Result<Decision, StoreError>> + Send {
        (**self).refund(policy, key, cost, now_ms)
    }

    fn forget(
        &self,
        policy: &Policy,
        key: &str,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        (**self).forget(policy, key)
    }

    fn acquire(
        &self,
        policy: &Policy,
        key: &str,
        min: u64,
        max: u64,
        now_ms: u64,
    ) -> impl Future<Output = Result<Decision, StoreError>> + Send {
        (**self).acquire(policy, key, min, max, now_ms)
    }
}

/// A boxed future, for the object-safe [`DynStore`].
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The object-safe form of [`Store`], implemented for every `Store`. Use it through
/// [`SharedStore`].
pub trait DynStore: Send + Sync {
    /// [`Store::check`], boxed.
    fn check_boxed<'a>(
        &'a self,
        policy: &'a Policy,
        key: &'a str,
        cost: u64,
        now_ms: u64,
    ) -> BoxFuture<'a, Result<Decision, StoreError>>;
    /// [`Store::peek`], boxed.
    fn peek_boxed<'a>(
        &'a self,
        policy: &'a Policy,
        key: &'a str,
        cost: u64,
        now_ms: u64,
    ) -> BoxFuture<'a, Result<Decision, StoreError>>;
    /// [`Store::refund`], boxed.
    fn refund_boxed<'a>(
        &'a self,
        policy: &'a Policy,
        key: &'a str,
        cost: u64,
        now_ms: u64,
    ) -> BoxFuture<'a, Result<Decision, StoreError>>;
    /// [`Store::forget`], boxed.
    fn forget_boxed<'a>(
        &'a self,
        policy: &'a Policy,
        key: &'a str,
    ) -> BoxFuture<'a, Result<(), StoreError>>;
    /// [`Store::acquire`], boxed.
    fn acquire_boxed<'a>(
        &'a self,
        policy: &'a Policy,
        key: &'a str,
        min: u64,
        max: u64,
        now_ms: u64,
    ) -> BoxFuture<'a, Result<Decision, StoreError>>;
}

impl<S: Store> DynStore for S {
    fn check_boxed<'a>(
        &'a self,
        policy: &'a Policy,
        key: &'a str,
        cost: u64,
        now_ms: u64,
    ) -> BoxFuture<'a, Result<Decision, StoreError>> {
        Box::pin(self.check(policy, key, cost, now_ms))
    }

    fn peek_boxed<'a>(
        &'a self,
        policy: &'a Policy,
        key: &'a str,
        cost: u64,
        now_ms: u64,
    ) -> BoxFuture<'a, Result<Decision, StoreError>> {
        Box::pin(self.peek(policy, key, cost, now_ms))
    }

    fn refund_boxed<'a>(
        &'a self,
        policy: &'a Policy,
        key: &'a str,
        cost: u64,
        now_ms: u64,
    ) -> BoxFuture<'a, Result<Decision, StoreError>> {
        Box::pin(self.refund(policy, key, cost, now_ms))
    }

    fn forget_boxed<'a>(
        &'a self,
        policy: &'a Policy,
        key: &'a str,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(self.forget(policy, key))
    }

    fn acquire_boxed<'a>(
        &'a self,
        policy: &'a Policy,
        key: &'a str,
        min: u64,
        max: u64,
        now_ms: u64,
    ) -> BoxFuture<'a, Result<Decision, StoreError>> {
        Box::pin(self.acquire(policy, key, min, max, now_ms))
    }
}

/// A store whose type is chosen at run time (from configuration), shared by reference count.
#[derive(Clone)]
pub struct SharedStore(Arc<dyn DynStore>);

impl SharedStore {
    /// Erases the type of `store`.
    pub fn new(store: impl Store + 'static) -> Self {
        Self(Arc::new(store))
    }
}

impl std::fmt::Debug for SharedStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedStore").finish_non_exhaustive()
    }
}

impl Store for SharedStore {
    async fn check(
        &self,
        policy: &Policy,
        key: &str,
        cost: u64,
        now_ms: u64,
    ) -> Result<Decision, StoreError> {
        self.0.check_boxed(policy, key, cost, now_ms).await
    }

    async fn peek(
        &self,
        policy: &Policy,
        key: &str,
        cost: u64,
        now_ms: u64,
    ) -> Result<Decision, StoreError> {
        self.0.peek_boxed(policy, key, cost, now_ms).await
    }

    async fn refund(
        &self,
        policy: &Policy,
        key: &str,
        cost: u64,
        now_ms: u64,
    ) -> Result<Decision, StoreError> {
        self.0.refund_boxed(policy, key, cost, now_ms).await
    }

    async fn forget(&self, policy: &Policy, key: &str) -> Result<(), StoreError> {
        self.0.forget_boxed(policy, key).await
    }

    async fn acquire(
        &self,
        policy: &Policy,
        key: &str,
        min: u64,
        max: u64,
        now_ms: u64,
    ) -> Result<Decision, StoreError> {
        self.0.acquire_boxed(policy, key, min, max, now_ms).await
    }
}
