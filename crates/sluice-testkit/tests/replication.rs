//! `ReplicaSet`: sync, replication, read-only replicas, and a paused replica catching up.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use std::time::{Duration, Instant};

use redis::Value;
use sluice_testkit::ReplicaSet;

fn bulk(s: &str) -> Value {
    Value::BulkString(s.as_bytes().to_vec())
}

#[test]
fn replicas_follow_the_primary_and_refuse_writes() {
    if !sluice_testkit::require_redis() {
        return;
    }
    let set = ReplicaSet::start(2).unwrap();
    assert_eq!(set.replicas.len(), 2);
    assert_eq!(
        set.primary
            .info_field("replication", "connected_slaves")
            .unwrap()
            .as_deref(),
        Some("2")
    );

    set.primary.cmd(&["SET", "k", "v1"]).unwrap();
    set.wait_replicated().unwrap();
    for replica in &set.replicas {
        assert_eq!(
            replica
                .info_field("replication", "role")
                .unwrap()
                .as_deref(),
            Some("slave")
        );
        assert_eq!(replica.cmd(&["GET", "k"]).unwrap(), bulk("v1"));
        let err = replica.cmd(&["SET", "k", "nope"]).unwrap_err();
        assert_eq!(
            err.redis_error().and_then(|e| e.code()),
            Some("READONLY"),
            "{err}"
        );
    }
}

#[test]
fn a_paused_replica_stalls_then_catches_up() {
    if !sluice_testkit::require_redis() {
        return;
    }
    let set = ReplicaSet::start(1).unwrap();
    let replica = &set.replicas[0];
    set.primary.cmd(&["SET", "k", "old"]).unwrap();
    set.wait_replicated().unwrap();
    assert_eq!(replica.cmd(&["GET", "k"]).unwrap(), bulk("old"));

    let mut conn = replica
        .connection_with_timeouts(Duration::from_secs(1), Duration::from_millis(200))
        .unwrap();
    replica.pause().unwrap();
    // The primary takes writes while its replica is frozen …
    set.primary.cmd(&["SET", "k", "new"]).unwrap();
    // … and the frozen replica answers nothing.
    let started = Instant::now();
    let err = redis::cmd("GET")
        .arg("k")
        .query::<Value>(&mut conn)
        .unwrap_err();
    assert!(err.is_timeout(), "{err}");
    assert!(started.elapsed() < Duration::from_secs(2));

    replica.resume().unwrap();
    set.wait_replicated().unwrap();
    assert_eq!(replica.cmd(&["GET", "k"]).unwrap(), bulk("new"));
}

#[test]
fn a_restarted_replica_resyncs() {
    if !sluice_testkit::require_redis() {
        return;
    }
    let mut set = ReplicaSet::start(1).unwrap();
    set.primary.cmd(&["SET", "k", "v"]).unwrap();
    set.replicas[0].restart().unwrap();
    set.wait_synced().unwrap();
    set.wait_replicated().unwrap();
    assert_eq!(set.replicas[0].cmd(&["GET", "k"]).unwrap(), bulk("v"));
}
