//! `wait_for_replicas`: a write is followed by `WAIT` on the same connection, so an admitted
//! decision is on the replicas when it returns; a replica that does not acknowledge in time
//! leaves the decision standing or fails the call, as configured.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use std::time::Duration;

use sluice::{Degraded, Error, FailureMode, LimitSpec, Limiter, Op, Policy, StoreError};
use sluice_redis::{ReadFrom, RedisConfig, RedisStore, Shortfall, WaitForReplicas};
use sluice_testkit::{RedisCluster, RedisServer, ReplicaSet};

fn policy(max: u64, mode: FailureMode) -> Policy {
    Policy::from_specs("api", vec![LimitSpec::fixed_window(max, 3_600_000)])
        .unwrap()
        .with_failure_mode(mode)
}

/// The Redis key of `key`'s fixed window of 1 h under policy `api` (a counter: the default
/// margin of 1 s in its name).
fn redis_key(key: &str) -> String {
    format!("sluice:{{3:api:{key}}}:fw3600000:c1000")
}

/// The count of `key`'s window on `server`, read directly (0 when absent).
fn used_on(server: &RedisServer, key: &str) -> u64 {
    used(server.cmd(&["GET", &redis_key(key)]).unwrap())
}

/// [`used_on`] a Cluster replica, which answers for its primary's slots after `READONLY`.
fn used_on_cluster_replica(server: &RedisServer, key: &str) -> u64 {
    let mut conn = server.connection().unwrap();
    let ((), reply): ((), redis::Value) = redis::pipe()
        .cmd("READONLY")
        .cmd("GET")
        .arg(redis_key(key))
        .query(&mut conn)
        .unwrap();
    used(reply)
}

/// A primary with one replica (none when Redis is missing).
fn replica_set() -> Option<ReplicaSet> {
    if !sluice_testkit::require_redis() {
        return None;
    }
    Some(tokio::task::block_in_place(|| ReplicaSet::start(1)).unwrap())
}

fn used(reply: redis::Value) -> u64 {
    match reply {
        redis::Value::Nil => 0,
        redis::Value::BulkString(b) => String::from_utf8(b).unwrap().parse().unwrap(),
        other => panic!("unexpected GET reply {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admitted_decision_is_on_the_replica_when_it_returns() {
    let Some(set) = replica_set() else {
        return;
    };
    let (primary, replica) = (&set.primary, &set.replicas[0]);
    let config = RedisConfig::new(primary.url())
        .replicas([replica.url()])
        .timeout(Duration::from_secs(2))
        .wait_for_replicas(WaitForReplicas::new(1, Duration::from_secs(1)));
    let limiter = Limiter::new(RedisStore::connect(config).await.unwrap())
        .with_policy(policy(100, FailureMode::Closed));
    let waits_before = primary.command_calls("wait").unwrap();

    for i in 1..=20 {
        let d = limiter.check("api", "k", 1).await.unwrap();
        assert!(d.allowed);
        assert_eq!(d.remaining(), 100 - i);
        // No polling: WAIT answered before the decision returned, so the replica has it.
        assert_eq!(used_on(replica, "k"), i, "check {i}");
    }
    // A peek reads the replica (read_from: replicas) and sees every admitted unit.
    let api = limiter.policy("api").unwrap();
    let d = limiter.call(api, "k", Op::Peek { cost: 0 }).await.unwrap();
    assert_eq!(d.remaining(), 80);
    // One WAIT per write; the peek (FCALL_RO) sent none.
    assert_eq!(primary.command_calls("wait").unwrap() - waits_before, 20);

    // The call fails inside the pipeline when the code is gone: it is reloaded and the
    // call sent again, WAIT included.
    primary.cmd(&["FUNCTION", "FLUSH"]).unwrap();
    let d = limiter.check("api", "k", 1).await.unwrap();
    assert_eq!(d.remaining(), 79);
    assert_eq!(used_on(replica, "k"), 21);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decision_no_replica_acknowledged_stands_or_fails_as_configured() {
    let Some(set) = replica_set() else {
        return;
    };
    let (primary, replica) = (&set.primary, &set.replicas[0]);
    let store = |on_shortfall| {
        let config = RedisConfig::new(primary.url())
            .read_from(ReadFrom::Primary)
            .timeout(Duration::from_secs(2))
            .wait_for_replicas(
                WaitForReplicas::new(1, Duration::from_millis(50)).on_shortfall(on_shortfall),
            );
        RedisStore::connect(config)
    };
    let keep = Limiter::new(store(Shortfall::Keep).await.unwrap())
        .with_policy(policy(10, FailureMode::Closed));
    let fail = store(Shortfall::Fail).await.unwrap();
    let fail_closed = Limiter::new(fail.clone()).with_policy(policy(10, FailureMode::Closed));
    let fail_open = Limiter::new(fail).with_policy(policy(10, FailureMode::Open));
    let waits_before = primary.command_calls("wait").unwrap();

    // SIGSTOP: the replica cannot acknowledge anything.
    replica.pause().unwrap();

    // keep: the decision stands, undegraded.
    let d = keep.check("api", "k", 1).await.unwrap();
    assert!(d.allowed);
    assert_eq!(d.degraded, None);
    assert_eq!(d.remaining(), 9);

    // fail: the call fails as unavailable, and the policy's failure mode decides.
    match fail_closed.check("api", "k", 1).await {
        Err(Error::Store(StoreError::Unavailable(m))) => {
            assert!(
                m.contains("0 of 1 replicas acknowledged the write within 50ms"),
                "{m}"
            );
        }
        other => panic!("expected an unavailable store, got {other:?}"),
    }
    let d = fail_open.check("api", "k", 1).await.unwrap();
    assert!(d.allowed);
    assert_eq!(d.degraded, Some(Degraded::Open));

    // Every one of them went through WAIT, and the primary counted all three.
    assert_eq!(primary.command_calls("wait").unwrap() - waits_before, 3);
    let api = keep.policy("api").unwrap();
    let d = keep.call(api, "k", Op::Peek { cost: 0 }).await.unwrap();
    assert_eq!(d.remaining(), 7);
    assert_eq!(used_on(primary, "k"), 3);

    // The replica is back: once it has caught up with what it missed (polled: how long that
    // takes depends on the machine), decisions go through and the replica has the count on
    // return.
    replica.resume().unwrap();
    tokio::task::block_in_place(|| {
        sluice_testkit::wait_until(Duration::from_secs(10), "the replica to catch up", || {
            Ok(used_on(replica, "k") == 3)
        })
    })
    .unwrap();
    for (limiter, after) in [(&fail_closed, 4), (&keep, 5)] {
        let d = limiter.check("api", "k", 1).await.unwrap();
        assert!(d.allowed);
        assert_eq!(d.degraded, None);
        assert_eq!(d.remaining(), 10 - after);
        assert_eq!(used_on(replica, "k"), after);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_a_cluster_wait_goes_to_the_primary_of_the_keys_slot() {
    if !sluice_testkit::require_redis() {
        return;
    }
    let cluster = tokio::task::block_in_place(RedisCluster::start).unwrap();
    let config = RedisConfig::cluster(cluster.urls())
        .timeout(Duration::from_secs(2))
        .wait_for_replicas(WaitForReplicas::new(1, Duration::from_secs(1)));
    let limiter = Limiter::new(RedisStore::connect(config).await.unwrap())
        .with_policy(policy(5, FailureMode::Closed));
    let mut primaries = std::collections::BTreeSet::new();
    for k in 0..30 {
        let key = format!("user:{k}");
        for i in 1..=2 {
            let d = limiter.check("api", &key, 1).await.unwrap();
            assert_eq!(d.remaining(), 5 - i);
        }
        let primary = cluster.primary_for_key(&redis_key(&key)).unwrap();
        primaries.insert(primary);
        for r in cluster.replicas_of(primary).unwrap() {
            // No polling: the slot's primary answered WAIT before the decision returned.
            assert_eq!(
                used_on_cluster_replica(&cluster.nodes()[r], &key),
                2,
                "{key} on replica {r}"
            );
        }
    }
    assert_eq!(primaries.len(), 3, "keys on every primary: {primaries:?}");
}
