//! The `Store` trait: where state lives, one atomic operation per call.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use sluice_core::evaluate::Op;
use sluice_core::{Decision, Policy};

/// A store failed to answer. Being rate limited is never an error: it is a [`Decision`].
///
/// Every error has one [`StoreErrorKind`] ([`StoreError::kind`]), and the kind alone says what
/// happens to the request ([`StoreError::is_transient`]): the store *cannot answer now*
/// (the policy's failure mode applies and a circuit breaker counts it), or the error is one
/// no retry or failover can change (corrupt state, a request the store refuses as such: an
/// error to the caller).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The store did not answer within its timeout.
    #[error("store timed out after {}ms", .0.as_millis())]
    Timeout(Duration),
    /// The store could not be reached (connection refused, reset, circuit open, …).
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// The store answered that it cannot serve now, for the reason `kind` names (out of
    /// memory, read-only after a failover, loading its data, busy with a script, refusing
    /// the credentials, …).
    #[error("store cannot answer now ({kind}): {message}")]
    Refused {
        /// Why; its [`StoreErrorKind::is_transient`] decides what the caller does.
        kind: StoreErrorKind,
        /// What the store said, naming the node or the key.
        message: String,
    },
    /// The store holds data for the key that is not a valid state (wrong type, bad field).
    // The key holds what a client sent: escaped, so a line feed in it cannot write a log
    // line of its own.
    #[error("store holds invalid state for `{}`: {detail}", .key.escape_debug())]
    Corrupt {
        /// The storage key at fault.
        key: String,
        /// What is wrong with it.
        detail: String,
    },
    /// The store refused the request itself, as any node would at any time, or its reply does
    /// not decode: a bug in the request or in Sluice (or a configuration the store cannot
    /// run), which no retry changes.
    #[error("store error: {0}")]
    Backend(String),
}

impl StoreError {
    /// A [`StoreError::Refused`] of `kind`.
    pub fn refused(kind: StoreErrorKind, message: impl Into<String>) -> Self {
        StoreError::Refused {
            kind,
            message: message.into(),
        }
    }

    /// What kind of failure this is: the metrics label, and through
    /// [`StoreErrorKind::is_transient`] what the caller does with it.
    pub fn kind(&self) -> StoreErrorKind {
        match self {
            StoreError::Timeout(_) => StoreErrorKind::Timeout,
            StoreError::Unavailable(_) => StoreErrorKind::Unavailable,
            StoreError::Refused { kind, .. } => *kind,
            StoreError::Corrupt { .. } => StoreErrorKind::Corrupt,
            StoreError::Backend(_) => StoreErrorKind::Rejected,
        }
    }

    /// Whether the store cannot answer *now* (trying again later, or after a failover, may
    /// succeed): the policy's `on_store_error` applies and a circuit breaker counts it.
    /// `false` for errors no retry changes, which go to the caller whatever the mode.
    pub fn is_transient(&self) -> bool {
        self.kind().is_transient()
    }
}

/// What kind of failure a [`StoreError`] is. The label of `sluice_store_errors_total{kind}`
/// ([`StoreErrorKind::as_str`]); [`StoreErrorKind::is_transient`] is the one classification every
/// layer uses (the limiter's failure modes, the circuit breaker, the server's answers).
///
/// Transient (the store cannot answer now): everything but [`StoreErrorKind::Corrupt`] and
/// [`StoreErrorKind::Rejected`]. Docs: docs/redis.md, "Connections, timeouts and errors".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum StoreErrorKind {
    /// No answer within the timeout.
    Timeout,
    /// Not reachable: connection refused, reset or dropped, no connection to a Cluster node,
    /// a circuit breaker skipping the store.
    Unavailable,
    /// `OOM`: the store is out of memory (`maxmemory` with `noeviction`).
    OutOfMemory,
    /// `READONLY`: the node is a replica now (a failover happened).
    ReadOnly,
    /// `LOADING`: the node is loading its data set.
    Loading,
    /// `BUSY`: the node is running a long script or function.
    Busy,
    /// `MASTERDOWN`: a replica lost its primary.
    MasterDown,
    /// `TRYAGAIN`: a Cluster slot is being migrated.
    TryAgain,
    /// `CLUSTERDOWN`: the Cluster cannot serve the slot.
    ClusterDown,
    /// `MOVED`/`ASK` beyond the redirections the client follows (resharding, failover).
    Redirected,
    /// `NOPERM`, `WRONGPASS`, `NOAUTH`, a failed login: the store refuses the credentials
    /// or their permissions (an ACL change).
    Denied,
    /// `NOSCRIPT` / function not found, and loading the code again did not help.
    CodeMissing,
    /// An error the store reported that Sluice does not know: treated as transient, since
    /// nothing says a retry or a failover cannot change it.
    Other,
    /// The key's stored state is not a valid state. Not transient.
    Corrupt,
    /// The store refused the request as such (bad arguments, a script error, a command the
    /// store does not have), or answered what Sluice's own code cannot read: a bug, which no
    /// retry or failover changes. Not transient.
    Rejected,
}

impl StoreErrorKind {
    /// Whether the store cannot answer now (the policy's failure mode applies, breakers count
    /// it), rather than an error no retry or failover changes.
    pub fn is_transient(self) -> bool {
        !matches!(self, StoreErrorKind::Corrupt | StoreErrorKind::Rejected)
    }

    /// The snake-case name: the `kind` label of `sluice_store_errors_total`.
    pub fn as_str(self) -> &'static str {
        match self {
            StoreErrorKind::Timeout => "timeout",
            StoreErrorKind::Unavailable => "unavailable",
            StoreErrorKind::OutOfMemory => "oom",
            StoreErrorKind::ReadOnly => "readonly",
            StoreErrorKind::Loading => "loading",
            StoreErrorKind::Busy => "busy",
            StoreErrorKind::MasterDown => "masterdown",
            StoreErrorKind::TryAgain => "tryagain",
            StoreErrorKind::ClusterDown => "clusterdown",
            StoreErrorKind::Redirected => "redirected",
            StoreErrorKind::Denied => "denied",
            StoreErrorKind::CodeMissing => "code_missing",
            StoreErrorKind::Other => "other",
            StoreErrorKind::Corrupt => "corrupt",
            StoreErrorKind::Rejected => "rejected",
        }
    }
}

impl std::fmt::Display for StoreErrorKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where the state of every (policy, key) lives.
///
/// [`Store::call`] runs **one atomic operation** ([`Op`]) over all the limits of a policy for
/// one key: the store reads the limits' states, evaluates them with
/// [`sluice_core::evaluate::apply`] (or a script that mirrors it) at `now_ms`, and writes back
/// what changed, with no other decision for the same key interleaved. A store that keeps its
/// own time (`clock: redis`) may ignore `now_ms`.
///
/// The request is one value ([`Call`]), so a wrapper (the reservation layer, the circuit
/// breaker, sharding) writes one `call` and passes the request on unchanged, whatever its
/// operation, including ones added later; it looks inside only at the operations it changes.
/// Callers write `store.call(Call::new(policy, key, op, now))`, or use the one-line helpers
/// of [`StoreExt`] (`store.check(policy, key, cost, now)`).
///
/// Implementations: [`crate::MemoryStore`] here; the Redis stores in `sluice-redis`. For a
/// store chosen at run time, erase the type with [`SharedStore`] (one boxed future per call),
/// or write an enum of the stores whose `call` matches and awaits the chosen one's (no
/// allocation: the server's store handle does this).
pub trait Store: Send + Sync {
    /// Runs `call.op` on `call.key`'s state under `call.policy`, atomically, at `call.now_ms`.
    fn call(&self, call: Call<'_>) -> impl Future<Output = Result<Decision, StoreError>> + Send;
}

/// One request to a [`Store`]: the operation, the policy and key it applies to, and the time
/// it happens at. A small value of references, passed (and passed on) by copy.
#[derive(Debug, Clone, Copy)]
pub struct Call<'a> {
    /// The policy whose limits the operation runs over.
    pub policy: &'a Policy,
    /// The key whose state it reads and writes.
    pub key: &'a str,
    /// What to do.
    pub op: Op,
    /// Now, in milliseconds since the Unix epoch (a store keeping its own time may ignore it).
    pub now_ms: u64,
}

impl<'a> Call<'a> {
    /// `op` on `key` under `policy` at `now_ms`.
    pub fn new(policy: &'a Policy, key: &'a str, op: Op, now_ms: u64) -> Self {
        Self {
            policy,
            key,
            op,
            now_ms,
        }
    }
}

/// The two most common calls by name, for every [`Store`]: each is [`Store::call`] with that
/// operation, nothing more (a store cannot override them). Every other operation is a
/// [`Store::call`] of its [`Op`].
pub trait StoreExt: Store {
    /// [`Op::Check`]: records `cost` in every limit if all admit, nowhere otherwise.
    fn check<'a>(
        &'a self,
        policy: &'a Policy,
        key: &'a str,
        cost: u64,
        now_ms: u64,
    ) -> impl Future<Output = Result<Decision, StoreError>> + Send {
        self.call(Call::new(policy, key, Op::Check { cost }, now_ms))
    }

    /// [`Op::Peek`]: the decision a check of `cost` would get, recording nothing.
    fn peek<'a>(
        &'a self,
        policy: &'a Policy,
        key: &'a str,
        cost: u64,
        now_ms: u64,
    ) -> impl Future<Output = Result<Decision, StoreError>> + Send {
        self.call(Call::new(policy, key, Op::Peek { cost }, now_ms))
    }
}

impl<S: Store + ?Sized> StoreExt for S {}

impl<S: Store + ?Sized> Store for Arc<S> {
    fn call(&self, call: Call<'_>) -> impl Future<Output = Result<Decision, StoreError>> + Send {
        (**self).call(call)
    }
}

/// A boxed future, for the object-safe [`DynStore`].
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The object-safe form of [`Store`], implemented for every `Store`. Use it through
/// [`SharedStore`].
pub trait DynStore: Send + Sync {
    /// [`Store::call`], boxed.
    fn call_boxed<'a>(&'a self, call: Call<'a>) -> BoxFuture<'a, Result<Decision, StoreError>>;
}

impl<S: Store> DynStore for S {
    fn call_boxed<'a>(&'a self, call: Call<'a>) -> BoxFuture<'a, Result<Decision, StoreError>> {
        Box::pin(self.call(call))
    }
}

/// A store whose type is chosen at run time (from configuration), shared by reference count.
///
/// Each call allocates its future on the heap ([`DynStore`]); where the set of stores is
/// known, an enum that dispatches to them (see [`Store`]) decides without that allocation.
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
    async fn call(&self, call: Call<'_>) -> Result<Decision, StoreError> {
        self.0.call_boxed(call).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_corrupt_key_is_shown_escaped() {
        let e = StoreError::Corrupt {
            key: "sluice:{k\n2026-01-01T00:00:00Z  WARN forged\u{1b}[2J}".into(),
            detail: "WRONGTYPE".into(),
        };
        assert_eq!(
            e.to_string(),
            "store holds invalid state for `sluice:{k\\n2026-01-01T00:00:00Z  WARN \
             forged\\u{1b}[2J}`: WRONGTYPE"
        );
    }
}
