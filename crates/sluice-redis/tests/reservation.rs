//! Local token reservation over real Redis: four limiters (as four hosts, each with its own
//! connection and its own leases) on one Redis, 32 tasks each, one hot key at ten times its
//! limit. In every window the fleet admits at most `max` (leased units are recorded in Redis
//! before they are handed out) and at least `max - hosts × batch`; almost every decision is
//! served from memory.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use sluice::{Batch, LimitSpec, Limiter, ManualClock, Policy, ReserveConfig, Reserving};
use sluice_redis::{RedisConfig, RedisStore};
use sluice_testkit::RedisServer;

const T0: u64 = 1_700_000_000_000;
const HOSTS: usize = 4;
const TASKS: usize = 32;

async fn hot_key(spec: LimitSpec, batch: u64, windows_ms: u64) {
    let server = RedisServer::start().unwrap();
    let max = spec.max;
    let policy = Policy::from_specs("hot", vec![spec]).unwrap();
    let clock = ManualClock::new(T0);
    let mut limiters = Vec::new();
    for _ in 0..HOSTS {
        let store =
            RedisStore::connect(RedisConfig::new(server.url()).timeout(Duration::from_secs(5)))
                .await
                .unwrap();
        let reserving = Reserving::new(
            store,
            ReserveConfig::default().batch(Batch::Fraction(batch as f64 / max as f64)),
        );
        limiters.push(Arc::new(
            Limiter::new(reserving)
                .with_clock(clock.clone())
                .with_policy(policy.clone()),
        ));
    }
    let attempts = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for limiter in &limiters {
        for _ in 0..TASKS {
            let (limiter, attempts, stop) = (limiter.clone(), attempts.clone(), stop.clone());
            tasks.push(tokio::spawn(async move {
                let mut admitted: BTreeMap<u64, u64> = BTreeMap::new();
                while stop.load(Ordering::SeqCst) == 0 {
                    let d = limiter.check("hot", "the-key", 1).await.unwrap();
                    assert!(d.degraded.is_none());
                    attempts.fetch_add(1, Ordering::SeqCst);
                    if d.allowed {
                        *admitted.entry(d.reset_ms()).or_default() += 1;
                    }
                    // Served from memory, a check never waits: let the other tasks run.
                    tokio::task::yield_now().await;
                }
                admitted
            }))
        }
    }
    // Steps of a tenth of a window, each after `max` attempts: ten times the limit.
    let per = policy.limits()[0].per_ms();
    for step in 1..=(windows_ms / (per / 10)) {
        while attempts.load(Ordering::SeqCst) < step * max {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        clock.advance(per / 10);
    }
    stop.store(1, Ordering::SeqCst);
    let mut windows: BTreeMap<u64, u64> = BTreeMap::new();
    for t in tasks {
        for (reset, n) in t.await.unwrap() {
            *windows.entry(reset).or_default() += n;
        }
    }
    let counts: Vec<u64> = windows.values().copied().collect();
    let bound = HOSTS as u64 * batch;
    let calls = server.command_calls("fcall").unwrap();
    let decisions = attempts.load(Ordering::SeqCst);
    println!(
        "{:?} max {max}, batch {batch}: admitted per window {counts:?} (bound {bound}); \
         {calls} script calls for {decisions} decisions = {:.4} per decision",
        policy.limits()[0].algorithm(),
        calls as f64 / decisions as f64
    );
    assert!(counts.len() >= 3, "{windows:?}");
    for (i, n) in counts.iter().enumerate() {
        assert!(*n <= max, "window {i} admitted {n} > {max}: {counts:?}");
        // The last window is cut short by the end of the test.
        if i + 1 < counts.len() {
            assert!(
                *n + bound >= max,
                "window {i} admitted only {n}: {counts:?}"
            );
        }
    }
    assert!(
        (calls as f64) < decisions as f64 / 10.0,
        "{calls} script calls for {decisions} decisions"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_hosts_on_one_redis_never_over_admit_a_fixed_window() {
    if !sluice_testkit::require_redis() {
        return;
    }
    hot_key(LimitSpec::fixed_window(2_000, 1_000), 20, 6_000).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_hosts_on_one_redis_never_over_admit_an_aligned_window() {
    if !sluice_testkit::require_redis() {
        return;
    }
    hot_key(LimitSpec::fixed_window(2_000, 1_000).aligned(), 20, 6_000).await;
}

/// Redis counts the holders of a key in its holders set: each acquire by a holder adds it
/// for the policy's shortest window, anonymous acquires count nobody, an expired holder stops
/// counting, and forgetting the key drops the set.
#[tokio::test]
async fn redis_counts_the_holders_of_a_key() {
    if !sluice_testkit::require_redis() {
        return;
    }
    use sluice::{Op, Store, StoreExt};
    let server = RedisServer::start().unwrap();
    let store = RedisStore::connect(RedisConfig::new(server.url()))
        .await
        .unwrap();
    let p = Policy::from_specs(
        "api",
        vec![
            LimitSpec::fixed_window(1_000, 60_000),
            LimitSpec::fixed_window(10_000, 3_600_000),
        ],
    )
    .unwrap();
    let acquire = |holder: u64, now: u64| {
        let (store, p) = (&store, &p);
        async move {
            store
                .call(sluice::Call::new(
                    p,
                    "k",
                    Op::Acquire {
                        min: 1,
                        max: 10,
                        holder,
                    },
                    now,
                ))
                .await
                .unwrap()
        }
    };
    assert_eq!(acquire(7, T0).await.holders, 1);
    assert_eq!(acquire(7, T0 + 1).await.holders, 1, "the same holder again");
    let d = acquire(8, T0 + 2).await;
    assert_eq!((d.holders, d.cost), (2, 10));
    assert_eq!(acquire(0, T0 + 3).await.holders, 0, "anonymous");
    // Holder 7 counts until T0 + 1 + 60 s (the shortest window), holder 8 until T0 + 2 + 60 s.
    assert_eq!(acquire(9, T0 + 60_001).await.holders, 2, "7 has expired");
    let members = server.cmd(&["ZCARD", "sluice:{3:api:k}:holders"]).unwrap();
    assert_eq!(members, redis::Value::Int(2));
    store
        .call(sluice::Call::new(&p, "k", Op::Forget, T0))
        .await
        .unwrap();
    let members = server.cmd(&["EXISTS", "sluice:{3:api:k}:holders"]).unwrap();
    assert_eq!(members, redis::Value::Int(0));
    // And a layer sends its holder id: two layers on one key are two holders.
    let a = Reserving::new(store.clone(), ReserveConfig::default());
    let b = Reserving::new(store.clone(), ReserveConfig::default());
    a.check(&p, "k", 1, T0).await.unwrap();
    b.check(&p, "k", 1, T0).await.unwrap();
    assert_eq!(acquire(a.holder(), T0).await.holders, 2);
}
