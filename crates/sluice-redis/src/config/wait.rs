//! Waiting for replicas after each write ([`WaitForReplicas`]): how many, how long, and what
//! a shortfall does.

use std::time::Duration;

/// Waiting for replicas after each write: the store sends `WAIT <replicas> <timeout>` right
/// behind every call that may write (checks, refunds, acquires; not peeks), on the same
/// connection, so an admitted decision has reached `replicas` replicas before it is returned.
///
/// It narrows, and does not close, what a failover can lose: Redis replication stays
/// asynchronous (a replica may acknowledge a write and still not be the one promoted, and
/// Sentinel or Cluster may promote a replica that lags), so this is not strong consistency.
/// See docs/scaling.md ("Failover: what can be over-admitted") for the measured effect and cost:
/// `WAIT` blocks the node's shared connection until the replicas answer, so every decision on
/// that node waits for a replication round trip in turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct WaitForReplicas {
    /// How many replicas must acknowledge the write (at least 1).
    pub replicas: u32,
    /// How long to wait for them (at least 1 ms, and shorter than the call timeout).
    pub timeout: Duration,
    /// What a decision is when fewer replicas acknowledged it in time.
    pub on_shortfall: Shortfall,
}

impl WaitForReplicas {
    /// Waits for `replicas` replicas for at most `timeout`; a shortfall keeps the decision.
    pub fn new(replicas: u32, timeout: Duration) -> Self {
        Self {
            replicas,
            timeout,
            on_shortfall: Shortfall::default(),
        }
    }

    /// Sets what a shortfall does.
    pub fn on_shortfall(mut self, on_shortfall: Shortfall) -> Self {
        self.on_shortfall = on_shortfall;
        self
    }

    /// Checks the values against the call timeout `call_timeout`; the error names the field.
    pub fn validate(&self, call_timeout: Duration) -> Result<(), WaitError> {
        if self.replicas == 0 {
            return Err(WaitError::NoReplica);
        }
        if self.timeout < Duration::from_millis(1) {
            // `WAIT n 0` would block forever.
            return Err(WaitError::NoTimeout);
        }
        if self.timeout >= call_timeout {
            return Err(WaitError::NotShorterThanTheCall {
                timeout_ms: self.timeout.as_millis(),
                call_timeout_ms: call_timeout.as_millis(),
            });
        }
        Ok(())
    }
}

/// A [`WaitForReplicas`] that cannot work, naming its field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WaitError {
    /// `replicas: 0`.
    #[error("wait_for_replicas.replicas: wait for at least 1 replica")]
    NoReplica,
    /// A timeout under 1 ms (`WAIT n 0` would block forever).
    #[error("wait_for_replicas.timeout: give at least 1ms")]
    NoTimeout,
    /// A timeout the call's own timeout would cut short.
    #[error(
        "wait_for_replicas.timeout ({timeout_ms}ms) must be shorter than the call timeout \
         ({call_timeout_ms}ms): the call would time out before WAIT answers"
    )]
    NotShorterThanTheCall {
        /// The WAIT timeout, ms.
        timeout_ms: u128,
        /// The call timeout, ms.
        call_timeout_ms: u128,
    },
}

/// What a decision is when fewer replicas than [`WaitForReplicas::replicas`] acknowledged
/// its write within [`WaitForReplicas::timeout`]. Either way the primary has recorded it and
/// replicates it when it can; [`crate::RedisStore::unreplicated_total`] counts shortfalls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Shortfall {
    /// The decision stands: a lagging or stopped replica slows decisions down to the `WAIT`
    /// timeout but does not fail them.
    #[default]
    Keep,
    /// The call fails with [`StoreError::Unavailable`](sluice::StoreError::Unavailable), so
    /// the policy's failure mode decides (closed: an error; open: allowed, marked degraded).
    /// The primary has counted the cost already, so a retry counts it again.
    Fail,
}
