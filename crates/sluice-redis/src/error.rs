//! From what Redis and the client report to a [`StoreError`]: which failures are transient
//! (the policy's failure mode applies), which mean corrupt state, which suggest a failover.

use std::time::Duration;

use redis::{RedisError, Value};
use sluice::StoreError;

/// Why one command failed: no answer in time, or an error from the client or the server.
pub(crate) enum Failure {
    Timeout(Duration),
    Redis(RedisError),
}

impl Failure {
    /// The store error, naming `what` (a node or a key) in the message.
    pub(crate) fn into_store_error(self, what: &str) -> StoreError {
        match self {
            Failure::Timeout(after) => StoreError::Timeout(after),
            Failure::Redis(e) => map_error(&e, what),
        }
    }

    /// Whether the node may no longer be the primary, or be gone: worth asking Sentinel.
    pub(crate) fn suggests_failover(&self) -> bool {
        match self {
            Failure::Timeout(_) => true,
            Failure::Redis(e) => {
                e.is_io_error()
                    || e.is_connection_dropped()
                    || e.is_connection_refusal()
                    || e.is_timeout()
                    || matches!(e.code(), Some("READONLY" | "MASTERDOWN" | "LOADING"))
            }
        }
    }

    /// Whether nothing ran because the node does not have the code (`NOSCRIPT`, or
    /// `ERR Function not found`): load it and try again.
    pub(crate) fn is_code_missing(&self) -> bool {
        match self {
            Failure::Timeout(_) => false,
            Failure::Redis(e) => {
                e.code() == Some("NOSCRIPT")
                    || e.detail().is_some_and(|d| d.contains("Function not found"))
                    || e.to_string().contains("Function not found")
            }
        }
    }
}

/// Sends one command on a shared connection, bounded by `timeout`.
pub(crate) async fn query<C: redis::aio::ConnectionLike>(
    conn: &mut C,
    cmd: &redis::Cmd,
    timeout: Duration,
) -> Result<Value, Failure> {
    match tokio::time::timeout(timeout, cmd.query_async::<Value>(conn)).await {
        Err(_) => Err(Failure::Timeout(timeout)),
        Ok(result) => result.map_err(Failure::Redis),
    }
}

/// The store error for a client or server error, naming `what` (a node or a key).
pub(crate) fn map_error(e: &RedisError, what: &str) -> StoreError {
    if e.is_timeout() {
        return StoreError::Unavailable(format!("{what}: {e}"));
    }
    if e.is_io_error() || e.is_connection_dropped() || e.is_connection_refusal() {
        return StoreError::Unavailable(format!("{what}: {e}"));
    }
    let text = e.to_string();
    if e.code() == Some("WRONGTYPE") {
        return StoreError::Corrupt {
            key: what.to_owned(),
            detail: "a key of this policy holds a value of the wrong Redis type".to_owned(),
        };
    }
    // One decision of a batch: its error is an element of the reply, code first.
    if e.code() == Some("SLUICE_CORRUPT") {
        return StoreError::Corrupt {
            key: what.to_owned(),
            detail: e.detail().unwrap_or_default().to_owned(),
        };
    }
    if let Some(at) = text.find("SLUICE_CORRUPT ") {
        let detail = text[at + "SLUICE_CORRUPT ".len()..].to_owned();
        return StoreError::Corrupt {
            key: what.to_owned(),
            detail,
        };
    }
    if matches!(
        e.code(),
        Some("LOADING" | "MASTERDOWN" | "TRYAGAIN" | "CLUSTERDOWN" | "READONLY")
    ) {
        return StoreError::Unavailable(format!("{what}: {e}"));
    }
    StoreError::Backend(format!("{what}: {text}"))
}

/// The `kind` label of `sluice_store_errors_total`.
pub(crate) fn kind(e: &StoreError) -> &'static str {
    match e {
        StoreError::Timeout(_) => "timeout",
        StoreError::Unavailable(_) => "unavailable",
        StoreError::Corrupt { .. } => "corrupt",
        _ => "other",
    }
}
