//! A circuit breaker around a store: a store that keeps failing is skipped at once (no
//! timeout paid per request) and probed, one request at a time, until it answers again.
//!
//! ```text
//!            N transient failures in a row              one request passes (the probe)
//!  Closed ─────────────────────────────────▶ Open ──(after open_for)──▶ HalfOpen
//!    ▲                                        ▲                            │
//!    │            the probe fails             └────────────────────────────┤
//!    └─────────────────────────── the probe succeeds ─────────────────────┘
//! ```
//!
//! Only transient errors ([`StoreError::is_transient`]: the store cannot answer now — a
//! timeout, unreachable, out of memory, read-only, busy, refusing the credentials, …) count as
//! failures: a store that answers "corrupt state" or refuses a malformed request is up. While the circuit is open, calls fail
//! with [`StoreError::Unavailable`] without touching the store, so the policy's failure mode
//! applies immediately. Every transition is logged (`tracing`, target `sluice::breaker`) and
//! [`CircuitBreaker::state`] and [`CircuitBreaker::opened_total`] expose it for metrics.

use std::future::Future;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use sluice_core::Decision;

use crate::store::{Call, Store, StoreError};

/// When a breaker opens and how long it stays open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct BreakerConfig {
    /// Transient failures in a row that open the circuit. Default 3.
    pub failure_threshold: u32,
    /// How long an open circuit refuses calls before letting one probe through. Default
    /// 200 ms, so a store that is back is used again within a fraction of a second.
    pub open_for: Duration,
}

impl Default for BreakerConfig {
    fn default() -> Self {
        Self {
            failure_threshold: 3,
            open_for: Duration::from_millis(200),
        }
    }
}

impl BreakerConfig {
    /// Sets the failures in a row that open the circuit (at least 1).
    pub fn failure_threshold(mut self, failures: u32) -> Self {
        self.failure_threshold = failures.max(1);
        self
    }

    /// Sets how long an open circuit waits before probing.
    pub fn open_for(mut self, open_for: Duration) -> Self {
        self.open_for = open_for;
        self
    }
}

/// The state of a circuit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum BreakerState {
    /// Calls go to the store.
    Closed,
    /// Calls fail at once.
    Open,
    /// One probe is in flight; other calls fail at once.
    HalfOpen,
}

impl BreakerState {
    /// `closed`, `open` or `half_open`.
    pub fn as_str(self) -> &'static str {
        match self {
            BreakerState::Closed => "closed",
            BreakerState::Open => "open",
            BreakerState::HalfOpen => "half_open",
        }
    }

    /// 0 closed, 1 open, 2 half-open (a gauge's value).
    pub fn as_gauge(self) -> f64 {
        match self {
            BreakerState::Closed => 0.0,
            BreakerState::Open => 1.0,
            BreakerState::HalfOpen => 2.0,
        }
    }
}

#[derive(Debug)]
enum Inner {
    Closed { failures: u32 },
    Open { until: Instant, last_error: String },
    HalfOpen { last_error: String },
}

/// A [`Store`] that stops calling `S` while it keeps failing. See the [module docs](self).
#[derive(Debug)]
pub struct CircuitBreaker<S> {
    store: S,
    name: String,
    config: BreakerConfig,
    state: Mutex<Inner>,
    opened: AtomicU64,
}

/// What a call is allowed to do.
enum Permit {
    /// The circuit is closed: a normal call.
    Call,
    /// The circuit was open long enough: this call is the probe.
    Probe,
}

/// Puts an abandoned probe back (a caller dropped the future before it finished), so the next
/// call probes instead of the circuit staying half-open forever.
struct ProbeGuard<'a, S> {
    breaker: &'a CircuitBreaker<S>,
    armed: bool,
}

impl<S> Drop for ProbeGuard<'_, S> {
    fn drop(&mut self) {
        if self.armed {
            let mut state = self.breaker.lock();
            if let Inner::HalfOpen { last_error } = &*state {
                *state = Inner::Open {
                    until: Instant::now(),
                    last_error: last_error.clone(),
                };
            }
        }
    }
}

impl<S> CircuitBreaker<S> {
    /// Wraps `store`; `name` identifies it in logs and errors (e.g. a shard's primary URL).
    pub fn new(store: S, name: impl Into<String>, config: BreakerConfig) -> Self {
        Self {
            store,
            name: name.into(),
            config,
            state: Mutex::new(Inner::Closed { failures: 0 }),
            opened: AtomicU64::new(0),
        }
    }

    /// The wrapped store.
    pub fn inner(&self) -> &S {
        &self.store
    }

    /// The name given at construction.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The circuit's state now. An open circuit whose wait is over reports `Open` until a
    /// call probes.
    pub fn state(&self) -> BreakerState {
        match &*self.lock() {
            Inner::Closed { .. } => BreakerState::Closed,
            Inner::Open { .. } => BreakerState::Open,
            Inner::HalfOpen { .. } => BreakerState::HalfOpen,
        }
    }

    /// The error that opened the circuit (or kept it open), while it is not closed.
    pub fn last_error(&self) -> Option<String> {
        match &*self.lock() {
            Inner::Closed { .. } => None,
            Inner::Open { last_error, .. } | Inner::HalfOpen { last_error } => {
                Some(last_error.clone())
            }
        }
    }

    /// How many times the circuit has opened since construction.
    pub fn opened_total(&self) -> u64 {
        self.opened.load(Ordering::Relaxed)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn admit(&self) -> Result<Permit, StoreError> {
        let mut state = self.lock();
        match &*state {
            Inner::Closed { .. } => Ok(Permit::Call),
            Inner::Open { until, last_error } => {
                if Instant::now() >= *until {
                    tracing::info!(target: "sluice::breaker", store = %self.name, "circuit half-open: probing");
                    *state = Inner::HalfOpen {
                        last_error: last_error.clone(),
                    };
                    Ok(Permit::Probe)
                } else {
                    Err(self.refusal(last_error))
                }
            }
            Inner::HalfOpen { last_error } => Err(self.refusal(last_error)),
        }
    }

    fn refusal(&self, last_error: &str) -> StoreError {
        StoreError::Unavailable(format!(
            "circuit open for {} after repeated failures (last: {last_error})",
            self.name
        ))
    }

    /// Records a call's outcome.
    fn record(&self, permit: &Permit, error: Option<&StoreError>) {
        let mut state = self.lock();
        match error {
            None => {
                if !matches!(*state, Inner::Closed { .. }) {
                    tracing::info!(target: "sluice::breaker", store = %self.name, "circuit closed: the store answers again");
                }
                *state = Inner::Closed { failures: 0 };
            }
            Some(e) => {
                let open = match (&mut *state, permit) {
                    (_, Permit::Probe) => true,
                    (Inner::Closed { failures }, Permit::Call) => {
                        *failures += 1;
                        *failures >= self.config.failure_threshold
                    }
                    // Another call already opened the circuit.
                    (_, Permit::Call) => false,
                };
                if open {
                    if matches!(permit, Permit::Probe) {
                        tracing::debug!(target: "sluice::breaker", store = %self.name, error = %e, "probe failed: circuit stays open");
                    } else {
                        self.opened.fetch_add(1, Ordering::Relaxed);
                        tracing::warn!(target: "sluice::breaker", store = %self.name, error = %e, "circuit open: the store is skipped until a probe succeeds");
                    }
                    *state = Inner::Open {
                        until: Instant::now() + self.config.open_for,
                        last_error: e.to_string(),
                    };
                }
            }
        }
    }

    async fn guarded<T>(
        &self,
        call: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let permit = self.admit()?;
        let mut guard = ProbeGuard {
            breaker: self,
            armed: matches!(permit, Permit::Probe),
        };
        let result = call.await;
        guard.armed = false;
        match &result {
            Err(e) if e.is_transient() => self.record(&permit, Some(e)),
            _ => self.record(&permit, None),
        }
        result
    }
}

impl<S: Store> Store for CircuitBreaker<S> {
    async fn call(&self, call: Call<'_>) -> Result<Decision, StoreError> {
        self.guarded(self.store.call(call)).await
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::sync::atomic::AtomicBool;

    use super::*;
    use crate::{LimitSpec, MemoryStore, Policy, StoreExt};

    /// A memory store that fails (transiently) while `down` is set, counting the calls that
    /// reached it.
    #[derive(Default)]
    struct Flaky {
        down: AtomicBool,
        calls: AtomicU64,
        memory: MemoryStore,
    }

    impl Store for Flaky {
        async fn call(&self, call: Call<'_>) -> Result<Decision, StoreError> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            if self.down.load(Ordering::SeqCst) {
                return Err(StoreError::Timeout(Duration::from_millis(50)));
            }
            self.memory.call(call).await
        }
    }

    fn policy() -> Policy {
        Policy::from_specs("p", vec![LimitSpec::fixed_window(1_000, 60_000)]).unwrap()
    }

    fn block_on<F: Future>(f: F) -> F::Output {
        let mut f = std::pin::pin!(f);
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        match f.as_mut().poll(&mut cx) {
            std::task::Poll::Ready(v) => v,
            std::task::Poll::Pending => panic!("the test stores never wait"),
        }
    }

    #[test]
    fn opens_after_threshold_skips_the_store_and_closes_after_a_good_probe() {
        let config = BreakerConfig::default()
            .failure_threshold(3)
            .open_for(Duration::from_millis(30));
        let breaker = CircuitBreaker::new(Flaky::default(), "flaky", config);
        let p = policy();
        assert!(block_on(breaker.check(&p, "k", 1, 0)).is_ok());

        breaker.inner().down.store(true, Ordering::SeqCst);
        for _ in 0..3 {
            assert!(matches!(
                block_on(breaker.check(&p, "k", 1, 0)),
                Err(StoreError::Timeout(_))
            ));
        }
        assert_eq!(breaker.state(), BreakerState::Open);
        assert_eq!(breaker.opened_total(), 1);
        let calls = breaker.inner().calls.load(Ordering::SeqCst);
        // Open: refused without calling the store, with an error that says why.
        let refused = block_on(breaker.check(&p, "k", 1, 0)).unwrap_err();
        assert!(refused.is_transient());
        assert!(
            refused.to_string().contains("circuit open for flaky"),
            "{refused}"
        );
        assert_eq!(breaker.inner().calls.load(Ordering::SeqCst), calls);

        // After open_for, one probe goes through; it fails, so the circuit opens again.
        crate::test_support::wait_for(|| {
            block_on(breaker.check(&p, "k", 1, 0)).is_err()
                && breaker.inner().calls.load(Ordering::SeqCst) == calls + 1
        });
        assert_eq!(breaker.state(), BreakerState::Open);
        assert_eq!(
            breaker.opened_total(),
            1,
            "a failed probe is not a new opening"
        );

        // The store is back: the next probe closes the circuit and calls flow again.
        breaker.inner().down.store(false, Ordering::SeqCst);
        crate::test_support::wait_for(|| block_on(breaker.check(&p, "k", 1, 0)).is_ok());
        assert_eq!(breaker.state(), BreakerState::Closed);
        assert!(block_on(breaker.check(&p, "k", 1, 0)).is_ok());
    }

    #[test]
    fn non_transient_errors_and_interleaved_successes_do_not_open() {
        let breaker = CircuitBreaker::new(Flaky::default(), "flaky", BreakerConfig::default());
        let p = policy();
        for _ in 0..10 {
            breaker.inner().down.store(true, Ordering::SeqCst);
            assert!(block_on(breaker.check(&p, "k", 1, 0)).is_err());
            assert!(block_on(breaker.check(&p, "k", 1, 0)).is_err());
            breaker.inner().down.store(false, Ordering::SeqCst);
            assert!(block_on(breaker.check(&p, "k", 1, 0)).is_ok());
        }
        assert_eq!(breaker.state(), BreakerState::Closed);
        assert_eq!(breaker.opened_total(), 0);
    }

    #[test]
    fn a_dropped_probe_lets_the_next_call_probe() {
        let config = BreakerConfig::default()
            .failure_threshold(1)
            .open_for(Duration::ZERO);
        let breaker = CircuitBreaker::new(Flaky::default(), "flaky", config);
        let p = policy();
        breaker.inner().down.store(true, Ordering::SeqCst);
        assert!(block_on(breaker.check(&p, "k", 1, 0)).is_err());
        assert_eq!(breaker.state(), BreakerState::Open);
        {
            // Start a probe and abandon it before it is polled.
            let probe = breaker.guarded(std::future::pending::<Result<(), StoreError>>());
            let mut probe = std::pin::pin!(probe);
            let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
            assert!(probe.as_mut().poll(&mut cx).is_pending());
            assert_eq!(breaker.state(), BreakerState::HalfOpen);
        }
        assert_eq!(breaker.state(), BreakerState::Open);
        breaker.inner().down.store(false, Ordering::SeqCst);
        assert!(block_on(breaker.check(&p, "k", 1, 0)).is_ok());
        assert_eq!(breaker.state(), BreakerState::Closed);
    }
}
