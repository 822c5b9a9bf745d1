//! The reservation layer over the memory store: single flight, Rockset's waiters, lease
//! lifetimes and refunds, the negative cache, honest headers, and no over-admission by several
//! "hosts" sharing one store.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use sluice::{
    Batch, Call, Decision, LimitSpec, MemoryStore, Op, Policy, ReserveConfig, Reserving, Store,
    StoreError, StoreExt,
};
use tokio::sync::Semaphore;

const T0: u64 = 1_700_000_000_000;

/// Polls a future once (it registers whatever it waits for); `None` if it is pending.
fn poll_once<F: std::future::Future>(f: std::pin::Pin<&mut F>) -> Option<F::Output> {
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    match f.poll(&mut cx) {
        std::task::Poll::Ready(v) => Some(v),
        std::task::Poll::Pending => None,
    }
}

fn policy(spec: LimitSpec) -> Policy {
    Policy::from_specs("p", vec![spec]).unwrap()
}

fn fixed(batch: f64) -> ReserveConfig {
    ReserveConfig::default().batch(Batch::Fraction(batch))
}

/// A memory store that counts calls, can hold `acquire` at a gate, and can make it slow.
#[derive(Default)]
struct Probe {
    memory: MemoryStore,
    checks: AtomicU64,
    acquires: AtomicU64,
    refunds: AtomicU64,
    in_flight: AtomicUsize,
    most_in_flight: AtomicUsize,
    gate: Option<Arc<Semaphore>>,
    slow: bool,
    /// The `max` of every acquire, in order.
    batches: std::sync::Mutex<Vec<u64>>,
}

impl Probe {
    /// What the memory store holds for `k` at `now` (a peek: counts nothing).
    async fn truth(&self, p: &Policy, k: &str, now: u64) -> Decision {
        self.memory.peek(p, k, 0, now).await.unwrap()
    }
}

impl Store for Probe {
    async fn call(&self, call: Call<'_>) -> Result<Decision, StoreError> {
        let max = match call.op {
            Op::Check { .. } => {
                self.checks.fetch_add(1, Ordering::SeqCst);
                return self.memory.call(call).await;
            }
            Op::Refund { .. } => {
                self.refunds.fetch_add(1, Ordering::SeqCst);
                return self.memory.call(call).await;
            }
            Op::Acquire { max, .. } => max,
            _ => return self.memory.call(call).await,
        };
        self.acquires.fetch_add(1, Ordering::SeqCst);
        self.batches.lock().unwrap().push(max);
        let n = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.most_in_flight.fetch_max(n, Ordering::SeqCst);
        if let Some(gate) = &self.gate {
            gate.acquire().await.unwrap().forget();
        }
        if self.slow {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let d = self.memory.call(call).await;
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
        d
    }
}

#[tokio::test]
async fn a_batch_serves_locally_and_headers_stay_honest() {
    let p = policy(LimitSpec::fixed_window(1_000, 60_000));
    let store = Reserving::new(Probe::default(), fixed(0.01)); // batch 10
    let mut remaining = Vec::new();
    for _ in 0..25 {
        let d = store.check(&p, "k", 1, T0).await.unwrap();
        assert!(d.allowed);
        remaining.push(d.remaining());
    }
    // 3 fetches of 10 for 25 checks; the rest were served from memory.
    assert_eq!(store.inner().acquires.load(Ordering::SeqCst), 3);
    assert_eq!(store.inner().checks.load(Ordering::SeqCst), 0);
    assert_eq!(store.stats().local, 22);
    // What the process reports is what the fleet can still hand out: the store's remaining
    // plus what this process holds; it never claims more than that.
    for (i, r) in remaining.iter().enumerate() {
        let used = i as u64 + 1;
        assert_eq!(*r, 1_000 - used, "check {used}");
    }
    // The store recorded whole batches: 30 units, 5 of them leased and unused.
    let truth = store.inner().truth(&p, "k", T0).await;
    assert_eq!(truth.remaining(), 970);
}

/// A token bucket whose burst is above its max counts down from the burst when served from a
/// lease too: a local decision was capped at `max`, so a fresh bucket of 1 000 said 100 left.
#[tokio::test]
async fn a_token_bucket_served_locally_counts_down_from_its_burst() {
    let p = policy(LimitSpec::token_bucket(100, 60_000).burst(1_000));
    let store = Reserving::new(Probe::default(), fixed(0.1)); // batch 10
    for used in 1..=15 {
        let d = store.check(&p, "k", 1, T0).await.unwrap();
        assert!(d.allowed);
        assert_eq!(d.binding().capacity, 1_000);
        assert_eq!(d.remaining(), 1_000 - used, "check {used}");
    }
    assert_eq!(store.stats().local, 13, "two fetches served the other 13");
}

#[tokio::test]
async fn costs_above_the_batch_and_cost_zero_go_to_the_store() {
    let p = policy(LimitSpec::fixed_window(1_000, 60_000));
    let store = Reserving::new(Probe::default(), fixed(0.01));
    assert!(store.check(&p, "k", 11, T0).await.unwrap().allowed);
    assert!(store.check(&p, "k", 0, T0).await.unwrap().allowed);
    assert_eq!(store.inner().checks.load(Ordering::SeqCst), 2);
    assert_eq!(store.inner().acquires.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn the_last_units_of_a_window_are_still_handed_out() {
    let p = policy(LimitSpec::fixed_window(25, 60_000));
    let store = Reserving::new(Probe::default(), fixed(0.4)); // batch 10
    let mut allowed = 0;
    for _ in 0..40 {
        allowed += u32::from(store.check(&p, "k", 1, T0).await.unwrap().allowed);
    }
    assert_eq!(allowed, 25, "batches of 10, 10, then the last 5");
}

/// Rockset's scenario: one caller fetches, five more arrive while the fetch is in flight and
/// reserve their places; a newcomer arriving after the fetch returned cannot take a waiter's
/// unit. With a full grant all six are served by one store call; with a partial grant the
/// places it covers are served and the others ask the store themselves (never refused
/// for a place that was granted).
#[tokio::test(flavor = "current_thread")]
async fn five_waiters_are_served_by_one_fetch() {
    for (max, expect_served) in [(1_000u64, 6usize), (3, 3)] {
        let gate = Arc::new(Semaphore::new(0));
        let probe = Probe {
            gate: Some(gate.clone()),
            ..Probe::default()
        };
        let p = policy(LimitSpec::fixed_window(max, 60_000));
        let store = Arc::new(Reserving::new(
            probe,
            ReserveConfig::default().batch(Batch::Fraction(10.0 / max as f64)),
        ));
        let spawn = |store: Arc<Reserving<Probe>>, p: Policy| {
            tokio::spawn(async move { store.check(&p, "hot", 1, T0).await.unwrap() })
        };
        // The fetcher runs in this task: polled once, it starts the fetch and blocks at the
        // gate. (A current-thread runtime: nothing else runs until this task yields.)
        let mut fetch = std::pin::pin!(store.check(&p, "hot", 1, T0));
        assert!(poll_once(fetch.as_mut()).is_none());
        assert_eq!(store.inner().acquires.load(Ordering::SeqCst), 1);
        let waiters: Vec<_> = (0..5).map(|_| spawn(store.clone(), p.clone())).collect();
        for _ in 0..3 {
            tokio::task::yield_now().await;
        }
        // Everyone waits on the one fetch; nobody went to the store.
        assert_eq!(store.inner().acquires.load(Ordering::SeqCst), 1);
        assert_eq!(store.inner().checks.load(Ordering::SeqCst), 0);
        gate.add_permits(100);
        let first = fetch.await.unwrap();
        assert!(first.allowed);
        // A newcomer, before the waiters run again: it may only use units nobody reserved.
        let newcomer = store.check(&p, "hot", 1, T0).await.unwrap();
        let mut served = 1;
        for w in waiters {
            let d = w.await.unwrap();
            served += usize::from(d.allowed);
        }
        let stats = store.stats();
        if max == 1_000 {
            assert_eq!(served, expect_served);
            assert_eq!(stats.fetches, 1);
            assert_eq!(stats.waited, 5);
            assert!(newcomer.allowed, "4 units were left in the batch of 10");
            assert_eq!(store.inner().checks.load(Ordering::SeqCst), 0);
        } else {
            // 3 units granted: the fetcher and the first two waiters. The newcomer found the
            // lease empty, fetched, and was refused by the store; the other three waiters
            // asked the store and were refused too. Nobody whose place was granted was.
            assert_eq!(served, expect_served);
            assert_eq!(stats.fetches, 2);
            assert_eq!(stats.waited, 2);
            assert!(!newcomer.allowed);
            assert_eq!(store.inner().checks.load(Ordering::SeqCst), 3);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn at_most_one_fetch_per_key_is_in_flight() {
    let p = policy(LimitSpec::fixed_window(1_000_000, 3_600_000));
    let store = Arc::new(Reserving::new(
        Probe {
            slow: true,
            ..Probe::default()
        },
        ReserveConfig::default(), // auto: batches start at 1, so fetches are frequent
    ));
    let tasks: Vec<_> = (0..32)
        .map(|_| {
            let (store, p) = (store.clone(), p.clone());
            tokio::spawn(async move {
                for _ in 0..300 {
                    assert!(store.check(&p, "hot", 1, T0).await.unwrap().allowed);
                    // A caller does other work between its checks. Without this, on this
                    // one-thread runtime a check answered at once never yields: a task could
                    // run all its checks past a full fetch while that fetch slept, and in
                    // about one run in fifty no caller ever met a fetch with room.
                    tokio::task::yield_now().await;
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let probe = store.inner();
    assert_eq!(probe.most_in_flight.load(Ordering::SeqCst), 1);
    let stats = store.stats();
    assert_eq!(
        stats.local + stats.waited + stats.fetches + stats.direct,
        32 * 300
    );
    assert!(stats.waited > 0, "no caller ever waited: {stats:?}");
    // Auto batching grew: far fewer fetches than checks.
    assert!(stats.fetches * 10 < 32 * 300, "{stats:?}");
}

#[tokio::test]
async fn a_refusal_is_cached_until_retry_after() {
    let p = policy(LimitSpec::fixed_window(5, 1_000));
    let store = Reserving::new(Probe::default(), fixed(0.2)); // batch 1
    for _ in 0..5 {
        assert!(store.check(&p, "k", 1, T0).await.unwrap().allowed);
    }
    let denied = store.check(&p, "k", 1, T0 + 100).await.unwrap();
    assert!(!denied.allowed);
    assert_eq!(denied.retry_after_ms(), Some(900));
    let calls =
        store.inner().acquires.load(Ordering::SeqCst) + store.inner().checks.load(Ordering::SeqCst);
    for t in [200, 500, 999] {
        let d = store.check(&p, "k", 1, T0 + t).await.unwrap();
        assert!(!d.allowed);
        assert_eq!(d.retry_after_ms(), Some(1_000 - t), "counts down");
        assert_eq!(d.remaining(), 0);
    }
    let after =
        store.inner().acquires.load(Ordering::SeqCst) + store.inner().checks.load(Ordering::SeqCst);
    assert_eq!(after, calls, "cached refusals do not reach the store");
    assert_eq!(store.stats().cached_denials, 3);
    // Once the window is over, the store is asked again.
    assert!(store.check(&p, "k", 1, T0 + 1_000).await.unwrap().allowed);
}

#[tokio::test]
async fn leases_end_with_their_window_or_bucket_and_early_ends_give_units_back() {
    // A sliding window's lease ends with the precision bucket it was recorded in.
    let p = policy(LimitSpec::sliding_window(1_000, 60_000).precision_ms(1_000));
    let store = Reserving::new(Probe::default(), fixed(0.01));
    store.check(&p, "k", 1, T0 + 100).await.unwrap();
    store.check(&p, "k", 1, T0 + 999).await.unwrap();
    assert_eq!(store.inner().acquires.load(Ordering::SeqCst), 1);
    store.check(&p, "k", 1, T0 + 1_000).await.unwrap();
    assert_eq!(
        store.inner().acquires.load(Ordering::SeqCst),
        2,
        "a new bucket, a new lease"
    );
    // The 8 unused units of the first lease were not given back: their bucket is gone, and
    // taking them from the newer bucket would under-count it.
    assert_eq!(store.inner().refunds.load(Ordering::SeqCst), 0);

    // A fixed window of an hour: the lease ends after max_lease (1 s) and, the window being
    // still open, its unused units go back to the store.
    let p = policy(LimitSpec::fixed_window(1_000, 3_600_000));
    let store = Reserving::new(Probe::default(), fixed(0.01));
    for _ in 0..3 {
        store.check(&p, "k", 1, T0).await.unwrap();
    }
    store.check(&p, "k", 1, T0 + 1_000).await.unwrap();
    assert_eq!(store.inner().refunds.load(Ordering::SeqCst), 1);
    let truth = store.inner().truth(&p, "k", T0 + 1_000).await;
    // 4 used + the second lease's 9 held = 13 recorded; the first lease's 7 came back.
    assert_eq!(truth.remaining(), 1_000 - 13);

    // At shutdown, release gives every lease back.
    store.release(std::slice::from_ref(&p), T0 + 1_001).await;
    let truth = store.inner().truth(&p, "k", T0 + 1_001).await;
    assert_eq!(truth.remaining(), 1_000 - 4);
    assert!(store.is_empty());
}

/// Four processes (four layers over one store) hammer one key at far above its limit: in
/// every window the fleet admits at most max, and at least max minus processes × batch.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn four_hosts_never_over_admit() {
    const MAX: u64 = 1_000;
    const BATCH: u64 = 10;
    let shared = Arc::new(Probe::default());
    let p = policy(LimitSpec::fixed_window(MAX, 1_000));
    let hosts: Vec<Arc<Reserving<Arc<Probe>>>> = (0..4)
        .map(|_| {
            Arc::new(Reserving::new(
                shared.clone(),
                fixed(BATCH as f64 / MAX as f64),
            ))
        })
        .collect();
    let clock = Arc::new(AtomicU64::new(T0));
    let attempts = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for host in &hosts {
        for _ in 0..8 {
            let (host, p, clock, attempts, stop) = (
                host.clone(),
                p.clone(),
                clock.clone(),
                attempts.clone(),
                stop.clone(),
            );
            tasks.push(tokio::spawn(async move {
                let mut admitted: BTreeMap<u64, u64> = BTreeMap::new();
                while stop.load(Ordering::SeqCst) == 0 {
                    let now = clock.load(Ordering::SeqCst);
                    let d = host.check(&p, "hot", 1, now).await.unwrap();
                    attempts.fetch_add(1, Ordering::SeqCst);
                    if d.allowed {
                        *admitted.entry(d.reset_ms()).or_default() += 1;
                    }
                    tokio::task::yield_now().await;
                }
                admitted
            }));
        }
    }
    // 10 windows of 1 s in steps of 100 ms; each step waits for MAX attempts (10x the limit
    // per window).
    for step in 1..=100u64 {
        while attempts.load(Ordering::SeqCst) < step * MAX {
            tokio::task::yield_now().await;
        }
        clock.fetch_add(100, Ordering::SeqCst);
    }
    stop.store(1, Ordering::SeqCst);
    let mut windows: BTreeMap<u64, u64> = BTreeMap::new();
    for t in tasks {
        for (reset, n) in t.await.unwrap() {
            *windows.entry(reset).or_default() += n;
        }
    }
    let counts: Vec<u64> = windows.values().copied().collect();
    assert!(counts.len() >= 6, "{windows:?}");
    for (i, n) in counts.iter().enumerate() {
        assert!(*n <= MAX, "window {i} admitted {n}: {counts:?}");
        if i + 1 < counts.len() {
            assert!(
                *n >= MAX - 4 * BATCH,
                "window {i} admitted only {n}: {counts:?}"
            );
        }
    }
}

#[tokio::test]
async fn auto_batches_grow_when_used_up_and_shrink_when_left_unused() {
    let p = policy(LimitSpec::fixed_window(100_000, 3_600_000)); // cap: 0.1 % = 100, one holder
    let store = Reserving::new(Probe::default(), ReserveConfig::default().max_error(0.001));
    for _ in 0..400 {
        assert!(store.check(&p, "k", 1, T0).await.unwrap().allowed);
    }
    let grown = store.inner().batches.lock().unwrap().clone();
    assert_eq!(
        grown[..6],
        [1, 2, 3, 5, 8, 12],
        "x1.5 per quickly used lease: {grown:?}"
    );
    assert_eq!(
        *grown.last().unwrap(),
        100,
        "capped at 0.1 % of max: {grown:?}"
    );
    // One more check, then the lease ends (max_lease, 1 s) almost all unused: half next time.
    let held_before = store.inner().batches.lock().unwrap().len();
    store.check(&p, "k", 1, T0 + 10).await.unwrap();
    store.check(&p, "k", 1, T0 + 1_010).await.unwrap();
    let batches = store.inner().batches.lock().unwrap().clone();
    assert!(batches.len() > held_before, "{batches:?}");
    assert_eq!(*batches.last().unwrap(), 50, "{batches:?}");
}

/// The error budget (1 % of max by default) is split across the processes the store has seen
/// acquire on the key: alone, a process's auto batch grows to the whole budget; once a second
/// process leases on the same key, each grows only to half, so the leases held at once stay
/// within the budget.
#[tokio::test]
async fn the_error_budget_is_split_across_the_holders_of_a_key() {
    let p = policy(LimitSpec::fixed_window(100_000, 3_600_000)); // budget: 1 % = 1 000
    let probe = Arc::new(Probe::default());
    let a = Reserving::new(probe.clone(), ReserveConfig::default());
    let b = Reserving::new(probe.clone(), ReserveConfig::default());
    assert_ne!(a.holder(), b.holder());
    // Units recorded in the store beyond those admitted: held in leases.
    async fn held(probe: &Probe, p: &Policy, admitted: u64) -> u64 {
        let remaining = probe.truth(p, "hot", T0).await.remaining();
        100_000 - remaining - admitted
    }

    for _ in 0..10_000 {
        assert!(a.check(&p, "hot", 1, T0).await.unwrap().allowed);
    }
    let alone = probe.batches.lock().unwrap().clone();
    assert_eq!(
        *alone.iter().max().unwrap(),
        1_000,
        "alone: the whole budget {alone:?}"
    );
    assert!(held(&probe, &p, 10_000).await <= 1_000);

    for _ in 0..10_000 {
        assert!(a.check(&p, "hot", 1, T0).await.unwrap().allowed);
        assert!(b.check(&p, "hot", 1, T0).await.unwrap().allowed);
    }
    let both = probe.batches.lock().unwrap()[alone.len()..].to_vec();
    // `a` learns of `b` at its first fetch of this phase (still sized for one holder; it
    // gives the excess back at once); every other fetch is at most half the budget.
    assert!(both.len() > 10, "{both:?}");
    assert!(both.iter().filter(|&&n| n > 500).count() <= 1, "{both:?}");
    assert_eq!(
        *both.iter().rev().take(5).max().unwrap(),
        500,
        "grown to the share: {both:?}"
    );
    assert!(
        probe.refunds.load(Ordering::SeqCst) >= 1,
        "the excess went back"
    );
    assert!(held(&probe, &p, 30_000).await <= 1_000);
    let d = probe
        .memory
        .call(Call::new(
            &p,
            "hot",
            Op::Acquire {
                min: 0,
                max: 0,
                holder: a.holder(),
            },
            T0,
        ))
        .await
        .unwrap();
    assert_eq!(d.holders, 2, "the store counts both");
}
