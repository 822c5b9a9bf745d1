//! A Cluster slot in migration under the script: while a slot is
//! `MIGRATING` a policy's keys are still on the source node and the call runs there. The
//! script touches only the keys it declares, so a decision past the window's end is made
//! there (not `ERR Script attempted to access a non local key`, which a single call reported
//! as a non-transient error and a batch as another kind), single, peeked and batched.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod support;

use std::time::Duration;

use sluice::{Degraded, FailureMode, LimitSpec, Limiter, Policy, StoreExt};
use sluice_redis::{RedisConfig, RedisStore};
use sluice_testkit::RedisCluster;
use support::Migration;

fn now() -> u64 {
    sluice::Clock::now_ms(&sluice::SystemClock)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_migrating_slot_decides_past_the_window_on_the_source() {
    if !sluice_testkit::require_redis() {
        return;
    }
    let cluster = tokio::task::block_in_place(RedisCluster::start).unwrap();
    let store =
        RedisStore::connect(RedisConfig::cluster(cluster.urls()).timeout(Duration::from_secs(2)))
            .await
            .unwrap();
    let p = Policy::from_specs("open", vec![LimitSpec::fixed_window(5, 1_000)])
        .unwrap()
        .with_failure_mode(FailureMode::Open);
    let limiter = Limiter::new(store.clone()).with_policy(p.clone());
    let slot = sluice_testkit::key_slot(sluice_redis::keys::stem("sluice:", &p, "a").as_bytes());

    assert!(store.check(&p, "a", 1, now()).await.unwrap().allowed);
    let migration = Migration::start(&cluster, slot);
    // Past the window's end: the window's key is still on the source (expiry + margin).
    tokio::time::sleep(Duration::from_millis(1_500)).await;

    let d = store.check(&p, "a", 1, now()).await.unwrap();
    assert!(d.allowed && d.remaining() == 4, "single check: {d:?}");
    let d = store.peek(&p, "a", 1, now()).await.unwrap();
    assert!(d.allowed, "peek: {d:?}");
    let at = now();
    for (i, d) in sluice_testkit::join_in_order((0..5).map(|_| store.check(&p, "a", 1, at)))
        .await
        .into_iter()
        .enumerate()
    {
        let d = d.unwrap_or_else(|e| panic!("batched check {i}: {e} ({:?})", e.kind()));
        assert_eq!(d.allowed, i < 4, "batched check {i}: {d:?}");
    }
    // A fail-open policy is decided, not degraded (and never an error).
    let d = limiter.check("open", "a", 1).await.unwrap();
    assert_eq!(d.degraded, None::<Degraded>, "{d:?}");
    migration.stable(&cluster);
}
