//! What several test binaries share: a closed policy, waiting for replication, polling
//! checks until the store answers again (topologies, plain and over TLS); 64 tasks on one hot
//! key (counters and hashes); reads from a replica (counters, the store); a server with an ACL user (ACL, store errors); a Cluster's
//! node ids and primaries, and a slot migrating between them (resharding, store errors). Each binary uses part of it.

#![allow(dead_code)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice::{Error, FailureMode, LimitSpec, Limiter, ManualClock, Policy, Store, StoreError};
use sluice_redis::{RedisConfig, RedisStore};
use sluice_testkit::{RedisCluster, RedisServer, ReplicaSet, ServerOptions};

/// One fixed window of `max` an hour, closed: a store failure is an error, so the test sees
/// exactly when Redis answers again.
pub(crate) fn policy(max: u64) -> Policy {
    Policy::from_specs("api", vec![LimitSpec::fixed_window(max, 3_600_000)])
        .unwrap()
        .with_failure_mode(FailureMode::Closed)
}

/// Polls until every replica's replication offset reached the primary's (the writes so far
/// are on the replicas). `WAIT` cannot do it here: it waits for its own connection's writes,
/// and the store wrote through another one.
pub(crate) fn wait_replicated(primary: &RedisServer, replicas: &[&RedisServer]) {
    let offset = |s: &RedisServer, field: &str| -> u64 {
        s.info_field("replication", field)
            .unwrap()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    let target = offset(primary, "master_repl_offset");
    assert!(target > 0, "the primary has written nothing");
    sluice_testkit::wait_until(Duration::from_secs(10), "replicas to catch up", || {
        Ok(replicas
            .iter()
            .all(|r| offset(r, "slave_repl_offset") >= target))
    })
    .unwrap();
}

/// Polls `check` every 5 ms until it succeeds, each failure transient and passed to
/// `failed`; returns its result, how long it took and how many checks failed meanwhile.
pub(crate) async fn until_ok<S: Store>(
    limiter: &Limiter<S>,
    key: &str,
    limit: Duration,
    failed: impl Fn(&StoreError),
) -> (sluice::Decision, Duration, u32) {
    let started = Instant::now();
    let mut failures = 0;
    loop {
        match limiter.check("api", key, 1).await {
            Ok(d) => return (d, started.elapsed(), failures),
            Err(Error::Store(e)) => {
                assert!(e.is_transient(), "{e}");
                failed(&e);
                failures += 1;
            }
            Err(e) => panic!("{e}"),
        }
        assert!(
            started.elapsed() < limit,
            "checks did not succeed within {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// What Redis (flushed first) admitted of 64 tasks' `checks` checks each of one key under
/// `spec`, at the manual instant `at_ms`, and how many answers were degraded (the policy fails open: a check
/// the store could not answer in time is allowed without counting, so it is counted apart,
/// never as an admission).
pub(crate) async fn admitted_by_64_tasks(
    server: &RedisServer,
    spec: LimitSpec,
    at_ms: u64,
    checks: usize,
) -> (u64, u64) {
    server.cmd(&["FLUSHALL"]).unwrap();
    // The manual clock stands still while Redis's runs: a long margin keeps the key from
    // expiring in real time under a window the frozen clock still holds open (on a loaded
    // machine a run can outlast the 60 s window's expiry).
    let config = RedisConfig::new(server.url())
        .timeout(Duration::from_secs(5))
        .expiry_margin(Duration::from_secs(3_600));
    let p = Policy::from_specs("hot", vec![spec]).unwrap();
    let store = RedisStore::connect(config).await.expect("connect to redis");
    let limiter = Arc::new(
        Limiter::new(store)
            .with_clock(ManualClock::new(at_ms))
            .with_policy(p),
    );
    let tasks: Vec<_> = (0..64)
        .map(|_| {
            let limiter = limiter.clone();
            tokio::spawn(async move {
                let (mut admitted, mut degraded) = (0u64, 0u64);
                for _ in 0..checks {
                    let d = limiter.check("hot", "the-key", 1).await.unwrap();
                    if d.degraded.is_some() {
                        degraded += 1;
                    } else if d.allowed {
                        admitted += 1;
                    }
                }
                (admitted, degraded)
            })
        })
        .collect();
    let mut total = (0, 0);
    for t in tasks {
        let (admitted, degraded) = t.await.unwrap();
        total = (total.0 + admitted, total.1 + degraded);
    }
    total
}

/// A primary with one replica, and a configuration reading from the replica.
pub(crate) fn replica_reads() -> (ReplicaSet, RedisConfig) {
    let set = ReplicaSet::start(1).unwrap();
    let config = RedisConfig::new(set.primary.url())
        .replicas([set.replicas[0].url()])
        .read_from(sluice_redis::ReadFrom::Replicas)
        .timeout(Duration::from_secs(2));
    (set, config)
}

/// Stops `replica`'s replication: it follows a port nothing listens on, and keeps its copy.
pub(crate) fn cut_off(replica: &RedisServer) {
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead_port = dead.local_addr().unwrap().port().to_string();
    drop(dead);
    replica
        .cmd(&["REPLICAOF", "127.0.0.1", &dead_port])
        .unwrap();
}

/// A server where `alice` (password `password`) may do what Sluice does, on its keys only
/// (the default user stays for the kit's readiness PING), and alice's URL; `None` (the test is
/// skipped) without `redis-server`.
pub(crate) fn server_with_alice(password: &str) -> Option<(RedisServer, String)> {
    if !sluice_testkit::require_redis() {
        return None;
    }
    let server = ServerOptions::new()
        .args([
            "--user",
            "alice",
            "on",
            &format!(">{password}"),
            "~sluice:*",
            "+@all",
        ])
        .start()
        .unwrap();
    let url = format!("redis://alice:{password}@127.0.0.1:{}", server.port());
    Some((server, url))
}

/// The Cluster node id (`CLUSTER MYID`) of node `i`.
pub(crate) fn node_id(cluster: &RedisCluster, i: usize) -> String {
    match cluster.nodes()[i].cmd(&["CLUSTER", "MYID"]).unwrap() {
        redis::Value::BulkString(b) => String::from_utf8(b).unwrap(),
        other => panic!("{other:?}"),
    }
}

/// The Cluster's primaries, as node indices.
pub(crate) fn primaries(cluster: &RedisCluster) -> Vec<usize> {
    cluster
        .shards()
        .unwrap()
        .iter()
        .map(|s| s.primary)
        .collect()
}

/// A slot being moved, as a resharding does: IMPORTING on the target, MIGRATING on the
/// source, until [`Migration::stable`] ends it.
pub(crate) struct Migration {
    slot: String,
    source: usize,
    target: usize,
}

impl Migration {
    /// Starts moving `slot` from its primary to another primary.
    pub(crate) fn start(cluster: &RedisCluster, slot: u16) -> Self {
        let source = cluster.primary_for_slot(slot).unwrap();
        let target = *primaries(cluster).iter().find(|&&n| n != source).unwrap();
        let slot = slot.to_string();
        cluster.nodes()[target]
            .cmd(&[
                "CLUSTER",
                "SETSLOT",
                &slot,
                "IMPORTING",
                &node_id(cluster, source),
            ])
            .unwrap();
        cluster.nodes()[source]
            .cmd(&[
                "CLUSTER",
                "SETSLOT",
                &slot,
                "MIGRATING",
                &node_id(cluster, target),
            ])
            .unwrap();
        Self {
            slot,
            source,
            target,
        }
    }

    /// Ends the migration: the slot is stable again on both nodes, where it was.
    pub(crate) fn stable(&self, cluster: &RedisCluster) {
        for node in [self.source, self.target] {
            cluster.nodes()[node]
                .cmd(&["CLUSTER", "SETSLOT", &self.slot, "STABLE"])
                .unwrap();
        }
    }
}
