//! What each policy's `on_store_error` does when the store cannot answer.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use sluice::{
    Call, Decision, Degraded, Error, FailureMode, LimitSpec, Limiter, ManualClock, MemoryStore, Op,
    Policy, Store, StoreError, StoreExt,
};

/// A memory store that answers with `failure` while `down` is set.
struct Switch {
    down: AtomicBool,
    failure: StoreError,
    memory: MemoryStore,
}

impl Switch {
    fn new(failure: StoreError) -> Arc<Self> {
        Arc::new(Self {
            down: AtomicBool::new(false),
            failure,
            memory: MemoryStore::new(),
        })
    }

    fn gate(&self) -> Result<(), StoreError> {
        if self.down.load(Ordering::SeqCst) {
            Err(self.failure.clone())
        } else {
            Ok(())
        }
    }
}

impl Store for Switch {
    async fn call(&self, call: Call<'_>) -> Result<Decision, StoreError> {
        self.gate()?;
        self.memory.call(call).await
    }
}

fn policy(name: &str, mode: FailureMode) -> Policy {
    Policy::from_specs(
        name,
        vec![
            LimitSpec::fixed_window(3, 1_000),
            LimitSpec::token_bucket(100, 60_000),
        ],
    )
    .unwrap()
    .with_failure_mode(mode)
}

fn limiter(store: Arc<Switch>) -> Limiter<Arc<Switch>, ManualClock> {
    Limiter::new(store)
        .with_clock(ManualClock::new(1_000_000))
        .with_policies([
            policy("open", FailureMode::Open),
            policy("closed", FailureMode::Closed),
            policy("local", FailureMode::Local),
        ])
}

#[tokio::test]
async fn open_allows_and_marks_the_decision_degraded() {
    let store = Switch::new(StoreError::Timeout(Duration::from_millis(50)));
    let limiter = limiter(store.clone());
    store.down.store(true, Ordering::SeqCst);
    for _ in 0..10 {
        let d = limiter.check("open", "k", 1).await.unwrap();
        assert!(d.allowed);
        assert_eq!(d.degraded, Some(Degraded::Open));
        assert_eq!(d.remaining(), 3, "an open decision reports the limit whole");
    }
    // Nothing was recorded anywhere: back up, the key has its whole window.
    store.down.store(false, Ordering::SeqCst);
    let d = limiter.check("open", "k", 1).await.unwrap();
    assert_eq!((d.allowed, d.degraded, d.remaining()), (true, None, 2));
}

#[tokio::test]
async fn closed_returns_the_store_error() {
    let store = Switch::new(StoreError::Unavailable("connection refused".into()));
    let limiter = limiter(store.clone());
    store.down.store(true, Ordering::SeqCst);
    let closed = limiter.policy("closed").unwrap();
    for op in [
        Op::Check { cost: 1 },
        Op::Peek { cost: 1 },
        Op::Refund { cost: 1 },
    ] {
        match limiter.call(closed, "k", op).await {
            Err(Error::Store(StoreError::Unavailable(m))) => assert!(m.contains("refused")),
            other => panic!("expected the store error, got {other:?}"),
        }
    }
}

#[tokio::test]
async fn local_still_limits_with_the_insurance_store() {
    let store = Switch::new(StoreError::Unavailable("connection refused".into()));
    let limiter = limiter(store.clone());
    store.down.store(true, Ordering::SeqCst);
    let mut allowed = 0;
    for _ in 0..10 {
        let d = limiter.check("local", "k", 1).await.unwrap();
        assert_eq!(d.degraded, Some(Degraded::Local));
        allowed += u32::from(d.allowed);
    }
    assert_eq!(
        allowed, 3,
        "the insurance store enforces max = 3 per window"
    );
    let denied = limiter.check("local", "k", 1).await.unwrap();
    assert!(!denied.allowed);
    assert!(
        denied
            .retry_after_ms()
            .is_some_and(|ms| ms > 0 && ms <= 1_000)
    );
    // Refund and peek go to the insurance store as well.
    let local = limiter.policy("local").unwrap();
    let refunded = limiter.call(local, "k", Op::Refund { cost: 1 }).await;
    assert_eq!(refunded.unwrap().remaining(), 1);
    assert_eq!(
        limiter
            .call(local, "k", Op::Peek { cost: 1 })
            .await
            .unwrap()
            .degraded,
        Some(Degraded::Local)
    );
    // The clock moves on: a new window in the insurance store as well.
    limiter.clock().advance(1_000);
    assert!(limiter.check("local", "k", 3).await.unwrap().allowed);
    // The store is back: decisions come from it again, unmarked.
    store.down.store(false, Ordering::SeqCst);
    let d = limiter.check("local", "k", 1).await.unwrap();
    assert_eq!((d.allowed, d.degraded, d.remaining()), (true, None, 2));
}

#[tokio::test]
async fn the_insurance_store_is_shared_between_limiters() {
    let store = Switch::new(StoreError::Unavailable("down".into()));
    let insurance = Arc::new(MemoryStore::new());
    let a = limiter(store.clone()).with_insurance(insurance.clone());
    let b = limiter(store.clone()).with_insurance(insurance);
    store.down.store(true, Ordering::SeqCst);
    assert!(a.check("local", "k", 2).await.unwrap().allowed);
    let d = b.check("local", "k", 2).await.unwrap();
    assert!(!d.allowed, "b sees a's use: one insurance store");
}

#[tokio::test]
async fn errors_retrying_cannot_fix_are_reported_in_every_mode() {
    let store = Switch::new(StoreError::Corrupt {
        key: "sluice:{…}:fw1000".into(),
        detail: "wrong type".into(),
    });
    let limiter = limiter(store.clone());
    store.down.store(true, Ordering::SeqCst);
    for name in ["open", "closed", "local"] {
        assert!(
            matches!(
                limiter.check(name, "k", 1).await,
                Err(Error::Store(StoreError::Corrupt { .. }))
            ),
            "{name}"
        );
    }
}

/// Every error of the store counts as one of two: the store cannot answer now (the failure
/// mode applies), or no retry changes it (the caller gets it). Kinds that Redis reports are
/// classified by `sluice-redis`; here, each class through the limiter.
#[tokio::test]
async fn every_kind_of_store_error_is_one_of_two_classes() {
    use sluice::StoreErrorKind as K;
    let transient = [
        K::Timeout,
        K::Unavailable,
        K::OutOfMemory,
        K::ReadOnly,
        K::Loading,
        K::Busy,
        K::MasterDown,
        K::TryAgain,
        K::ClusterDown,
        K::Redirected,
        K::Denied,
        K::CodeMissing,
        K::Other,
    ];
    for kind in transient {
        let store = Switch::new(StoreError::refused(kind, "redis://10.0.0.7:6379: …"));
        let limiter = limiter(store.clone());
        store.down.store(true, Ordering::SeqCst);
        let open = limiter.check("open", "k", 1).await.unwrap();
        assert_eq!(open.degraded, Some(Degraded::Open), "{kind}");
        match limiter.check("closed", "k", 1).await {
            Err(Error::Store(e)) => assert_eq!(e.kind(), kind),
            other => panic!("{kind}: {other:?}"),
        }
        let local = limiter.check("local", "k", 1).await.unwrap();
        assert_eq!(local.degraded, Some(Degraded::Local), "{kind}");
    }
    for kind in [K::Corrupt, K::Rejected] {
        let store = Switch::new(StoreError::refused(kind, "…"));
        let limiter = limiter(store.clone());
        store.down.store(true, Ordering::SeqCst);
        for name in ["open", "closed", "local"] {
            match limiter.check(name, "k", 1).await {
                Err(Error::Store(e)) => assert_eq!(e.kind(), kind, "{name}"),
                other => panic!("{kind}, {name}: {other:?}"),
            }
        }
    }
    assert_eq!(StoreError::Backend("x".into()).kind(), K::Rejected);
    assert_eq!(
        StoreError::Timeout(Duration::from_millis(50)).kind(),
        K::Timeout
    );
}

/// An error no retry changes is logged once per policy and kind, not once per request.
#[test]
fn errors_no_retry_changes_are_logged_once_per_policy_and_kind() {
    #[derive(Clone, Default)]
    struct Lines(Arc<std::sync::Mutex<Vec<u8>>>);
    impl std::io::Write for Lines {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let lines = Lines::default();
    let writer = lines.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    // While a single dispatcher is registered, tracing computes a callsite's interest from
    // the default of whichever thread first reaches it. Another test of this binary, on its
    // own thread with no subscriber, could reach the error's callsite first and cache
    // "never" for every thread: this test then saw nothing logged in about one `cargo test`
    // run in eight. A second dispatcher, alive while this runs, makes tracing ask every
    // thread's own default instead.
    let _second = tracing::Dispatch::new(tracing::subscriber::NoSubscriber::default());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let corrupt = Switch::new(StoreError::Corrupt {
        key: "sluice:{4:open:k}:fw1000".into(),
        detail: "used is not a number".into(),
    });
    let rejected = Switch::new(StoreError::Backend("SLUICE_ARGS …".into()));
    runtime.block_on(async {
        for store in [&corrupt, &rejected] {
            let limiter = limiter(store.clone());
            let clone = limiter.clone();
            store.down.store(true, Ordering::SeqCst);
            for _ in 0..10 {
                for name in ["open", "closed"] {
                    assert!(limiter.check(name, "k", 1).await.is_err());
                    assert!(clone.check(name, "other", 1).await.is_err());
                }
            }
        }
    });
    let text = String::from_utf8(lines.0.lock().unwrap().clone()).unwrap();
    let logged: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("retrying will not change that"))
        .collect();
    // 2 policies × 2 kinds (a limiter's clones share what was logged).
    assert_eq!(logged.len(), 4, "{text}");
    assert!(
        logged
            .iter()
            .any(|l| l.contains("kind=\"corrupt\"") && l.contains("policy=\"open\"")),
        "{text}"
    );
    assert!(
        logged
            .iter()
            .any(|l| l.contains("kind=\"rejected\"") && l.contains("policy=\"closed\"")),
        "{text}"
    );
}

/// `Limiter::charge_back` (what the server calls every second) charges the store with what the
/// insurance store admitted for keys no decision touched since the store returned: another
/// process sharing the store sees them counted. While the store is still down nothing is
/// lost: the debt stays for the next try.
#[tokio::test]
async fn charge_back_gives_the_store_what_was_admitted_locally() {
    let store = Switch::new(StoreError::Unavailable("down".into()));
    let a = limiter(store.clone());
    let other_process = limiter(store.clone());
    assert!(a.check("local", "k", 1).await.unwrap().allowed);
    store.down.store(true, Ordering::SeqCst);
    for _ in 0..2 {
        let d = a.check("local", "k", 1).await.unwrap();
        assert_eq!((d.allowed, d.degraded), (true, Some(Degraded::Local)));
    }
    // Still down: nothing charged, nothing lost.
    assert!(a.charge_back().await.is_err());
    assert_eq!(a.insurance().len(), 1);

    store.down.store(false, Ordering::SeqCst);
    assert_eq!(a.charge_back().await, Ok(1));
    assert!(a.insurance().is_empty(), "charged once, forgotten locally");
    assert_eq!(a.charge_back().await, Ok(0));
    // max 3 per window: 1 by the store and 2 locally, all counted by the store now.
    let d = other_process.check("local", "k", 1).await.unwrap();
    assert_eq!((d.allowed, d.degraded), (false, None), "{d:?}");
}

/// A key decided again by the store is charged right after that decision, before the next.
#[tokio::test]
async fn a_key_decided_again_is_charged_back_at_once() {
    let store = Switch::new(StoreError::Unavailable("down".into()));
    let limiter = limiter(store.clone());
    store.down.store(true, Ordering::SeqCst);
    for _ in 0..2 {
        assert!(limiter.check("local", "k", 1).await.unwrap().allowed);
    }
    store.down.store(false, Ordering::SeqCst);
    // The store's first decision (1 of 3), then the 2 local ones are charged: full.
    let d = limiter.check("local", "k", 1).await.unwrap();
    assert_eq!((d.allowed, d.degraded, d.remaining()), (true, None, 2));
    let d = limiter.check("local", "k", 1).await.unwrap();
    assert_eq!((d.allowed, d.degraded), (false, None), "{d:?}");
}

/// A key the store refuses for good (here: every acquire meets corrupt state) is not owed for
/// ever: `charge_back` drops it and goes on with the other keys.
#[tokio::test]
async fn a_charge_the_store_refuses_for_good_is_dropped() {
    struct CorruptKey {
        down: AtomicBool,
        memory: MemoryStore,
    }
    impl Store for CorruptKey {
        async fn call(&self, call: Call<'_>) -> Result<Decision, StoreError> {
            if self.down.load(Ordering::SeqCst) {
                return Err(StoreError::Unavailable("down".into()));
            }
            if call.key == "bad" && matches!(call.op, Op::Acquire { .. }) {
                return Err(StoreError::Corrupt {
                    key: "sluice:{5:local:bad}:fw1000".into(),
                    detail: "used is not a number".into(),
                });
            }
            self.memory.call(call).await
        }
    }
    let store = Arc::new(CorruptKey {
        down: AtomicBool::new(true),
        memory: MemoryStore::new(),
    });
    let limiter = Limiter::new(store.clone())
        .with_clock(ManualClock::new(1_000_000))
        .with_policy(policy("local", FailureMode::Local));
    for key in ["bad", "good"] {
        assert!(limiter.check("local", key, 1).await.unwrap().allowed);
    }
    store.down.store(false, Ordering::SeqCst);
    assert_eq!(
        limiter.charge_back().await,
        Ok(1),
        "good is charged, bad dropped"
    );
    assert!(limiter.insurance().is_empty());
    let local = policy("local", FailureMode::Local);
    let good = store.memory.peek(&local, "good", 0, 1_000_000).await;
    assert_eq!(
        good.unwrap().limits()[0].remaining,
        2,
        "the store counts good's admission"
    );
}
