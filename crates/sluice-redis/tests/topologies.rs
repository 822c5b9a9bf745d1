//! Sentinel and Cluster against real processes: decisions are exact, and a failover is
//! followed without restarting the limiter.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod support;

use std::time::{Duration, Instant};

use sluice::Limiter;
use sluice_redis::{ReadFrom, RedisConfig, RedisStore, Shard, ShardedStore};
use sluice_testkit::{RedisCluster, RedisServer, SentinelGroup};
use support::{policy, until_ok, wait_replicated};

/// [`wait_replicated`] for the Cluster node `primary` and every replica of it.
fn wait_cluster_replicated(cluster: &RedisCluster, primary: usize) {
    let replicas: Vec<&RedisServer> = cluster
        .replicas_of(primary)
        .unwrap()
        .into_iter()
        .map(|i| &cluster.nodes()[i])
        .collect();
    wait_replicated(&cluster.nodes()[primary], &replicas);
}

/// A Sentinel group, its primary's port, and a store on it through the sentinels.
async fn sentinel_store(timeout: Duration) -> (SentinelGroup, u16, RedisStore) {
    let group = tokio::task::block_in_place(SentinelGroup::start).unwrap();
    let old_port = group.current_primary_port().unwrap();
    let config = RedisConfig::sentinel(group.master_name(), group.sentinel_urls()).timeout(timeout);
    let store = RedisStore::connect(config).await.unwrap();
    (group, old_port, store)
}

/// [`wait_replicated`] for the Sentinel group's data node on `port` and every other one;
/// returns that node's index.
fn wait_sentinel_replicated(group: &SentinelGroup, port: u16) -> usize {
    let primary = group.data_node_index(port).unwrap();
    let replicas: Vec<&RedisServer> = (0..group.data_nodes().len())
        .filter(|&i| i != primary)
        .map(|i| &group.data_nodes()[i])
        .collect();
    wait_replicated(&group.data_nodes()[primary], &replicas);
    primary
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_failover_is_followed_without_a_restart() {
    if !sluice_testkit::require_redis() {
        return;
    }
    let (group, old_port, store) = sentinel_store(Duration::from_millis(200)).await;
    assert_eq!(store.name(), "sentinel:mymaster");
    assert!(store.primary_url().ends_with(&format!(":{old_port}")));
    let limiter =
        Limiter::new(ShardedStore::new(vec![store.clone()]).unwrap()).with_policy(policy(1_000));
    for i in 0..10u64 {
        let d = limiter.check("api", "k", 1).await.unwrap();
        assert_eq!(d.remaining(), 999 - i);
    }
    // Every replica has the count before the primary stalls.
    let primary = wait_sentinel_replicated(&group, old_port);

    // SIGSTOP: the primary hangs (no connection refused, only silence).
    group.data_nodes()[primary].pause().unwrap();
    let stalled = Instant::now();
    // Checks fail (closed) while Sentinel has not promoted the replica yet.
    assert!(limiter.check("api", "k", 1).await.is_err());
    let new_port =
        tokio::task::block_in_place(|| group.wait_failover(old_port, Duration::from_secs(30)))
            .unwrap();
    let promoted = stalled.elapsed();
    assert_ne!(new_port, old_port);
    let (d, took, failures) = until_ok(&limiter, "k", Duration::from_secs(10), |_| ()).await;
    println!(
        "sentinel: primary {old_port} stalled; replica {new_port} promoted after {promoted:?}; \
         checks succeeded {took:?} after that ({failures} failed checks meanwhile)"
    );
    assert!(
        store.primary_url().ends_with(&format!(":{new_port}")),
        "{}",
        store.primary_url()
    );
    // The count replicated: the next decision continues it (10 admitted before).
    assert_eq!(d.remaining(), 989);
    group.data_nodes()[primary].resume().unwrap();
    let d = limiter.check("api", "k", 1).await.unwrap();
    assert_eq!(d.remaining(), 988);
}

/// A forced `SENTINEL FAILOVER` leaves the old primary writable for ~10 s: a store that
/// waited for it to fail a call would go on deciding there, and lose it all. The store follows
/// the sentinels' `+switch-master` announcement instead: it is on the new primary without a
/// single call made in between.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forced_sentinel_failover_is_followed_from_its_announcement() {
    if !sluice_testkit::require_redis() {
        return;
    }
    let (group, old_port, store) = sentinel_store(Duration::from_millis(500)).await;
    let limiter = Limiter::new(store.clone()).with_policy(policy(1_000));
    for i in 0..10u64 {
        assert_eq!(
            limiter.check("api", "k", 1).await.unwrap().remaining(),
            999 - i
        );
    }
    let primary = wait_sentinel_replicated(&group, old_port);

    let new_port =
        tokio::task::block_in_place(|| group.force_failover(old_port, Duration::from_secs(30)))
            .unwrap();
    // No call: only the announcement can move the store (polled, with a bound).
    let deadline = Instant::now() + Duration::from_secs(5);
    while !store.primary_url().ends_with(&format!(":{new_port}")) {
        assert!(
            Instant::now() < deadline,
            "still on {} after the announcement of {new_port}",
            store.primary_url()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The old primary is still writable (Sentinel has not demoted it yet), yet decisions go
    // to the new one and continue the count.
    let role = group.data_nodes()[primary].cmd(&["ROLE"]).unwrap();
    println!("old primary's role right after the switch: {role:?}");
    assert_eq!(limiter.check("api", "k", 1).await.unwrap().remaining(), 989);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_keys_live_in_their_slot_and_a_failover_is_followed() {
    if !sluice_testkit::require_redis() {
        return;
    }
    let mut cluster = tokio::task::block_in_place(RedisCluster::start).unwrap();
    let config = RedisConfig::cluster(cluster.urls())
        .read_from(ReadFrom::Replicas)
        .timeout(Duration::from_millis(500));
    let store = RedisStore::connect(config).await.unwrap();
    let limiter = Limiter::new(store.clone()).with_policy(policy(3));

    // Every key is decided exactly, on the primary that owns its slot.
    let mut owners = std::collections::BTreeSet::new();
    for k in 0..60 {
        let key = format!("user:{k}");
        let admitted = {
            let mut n = 0;
            for _ in 0..5 {
                n += u32::from(limiter.check("api", &key, 1).await.unwrap().allowed);
            }
            n
        };
        assert_eq!(admitted, 3, "{key}");
        let redis_key = format!("sluice:{{3:api:{key}}}:fw3600000:c1000");
        let owner = cluster.primary_for_key(&redis_key).unwrap();
        owners.insert(owner);
        let exists = cluster.nodes()[owner].cmd(&["EXISTS", &redis_key]).unwrap();
        assert_eq!(exists, redis::Value::Int(1), "{key} on node {owner}");
        // A peek (FCALL_RO, possibly on a replica) agrees once replication caught up: waited
        // for, since a replica behind its primary (a loaded machine) still sees a fresh window.
        wait_cluster_replicated(&cluster, owner);
        let peek = limiter
            .call(
                limiter.policy("api").unwrap(),
                &key,
                sluice::Op::Peek { cost: 0 },
            )
            .await
            .unwrap();
        assert!(peek.remaining() <= 1, "{key}: {peek:?}");
    }
    assert_eq!(
        owners.len(),
        3,
        "keys spread over every primary: {owners:?}"
    );

    // Kill the primary of one key; its replica takes over and checks resume.
    let limiter = Limiter::new(store).with_policy(policy(1_000));
    let key = "failover-key";
    for i in 0..10u64 {
        assert_eq!(
            limiter.check("api", key, 1).await.unwrap().remaining(),
            999 - i
        );
    }
    let redis_key = format!("sluice:{{3:api:{key}}}:fw3600000:c1000");
    let primary = cluster.primary_for_key(&redis_key).unwrap();
    wait_cluster_replicated(&cluster, primary);
    cluster.node_mut(primary).kill().unwrap();
    let killed = Instant::now();
    let promoted_node =
        tokio::task::block_in_place(|| cluster.wait_failover(primary, Duration::from_secs(30)))
            .unwrap();
    let promoted = killed.elapsed();
    let (d, took, failures) = until_ok(&limiter, key, Duration::from_secs(10), |_| ()).await;
    println!(
        "cluster: node {primary} killed; node {promoted_node} promoted after {promoted:?}; \
         checks succeeded {took:?} after that ({failures} failed checks meanwhile)"
    );
    assert_eq!(d.remaining(), 989, "the count survived the failover");
}

/// Client-side shards as one configuration (`Topology::Shards`, what the server's `store.shards`
/// reads into): one store per shard through `RedisConfig::per_shard`, with the configuration's
/// other settings, keys on both; a lone `RedisStore` refuses more than one shard.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shards_as_one_configuration_connect_a_store_per_shard() {
    let a = RedisServer::start().unwrap();
    let b = RedisServer::start().unwrap();
    let config = RedisConfig::shards([Shard::new(a.url()), Shard::new(b.url())]).key_prefix("t:");
    let Err(e) = RedisStore::connect(config.clone()).await else {
        panic!("one store connected two shards");
    };
    assert!(e.to_string().contains("RedisConfig::per_shard"), "{e}");
    let mut stores = Vec::new();
    for shard in config.per_shard() {
        stores.push(RedisStore::connect(shard).await.unwrap());
    }
    let sharded = ShardedStore::new(stores).unwrap();
    assert_eq!(sharded.names(), [a.url(), b.url()]);
    let limiter = Limiter::new(sharded).with_policy(policy(1));
    for i in 0..32 {
        let key = format!("user-{i}");
        assert!(limiter.check("api", &key, 1).await.unwrap().allowed);
        assert!(!limiter.check("api", &key, 1).await.unwrap().allowed);
    }
    for node in [&a, &b] {
        let keys: i64 =
            redis::FromRedisValue::from_redis_value(node.cmd(&["DBSIZE"]).unwrap()).unwrap();
        assert!(keys > 0, "{} holds no key", node.url());
    }
    let one = RedisConfig::shards([Shard::new(a.url())]);
    let store = RedisStore::connect(one).await.unwrap();
    assert_eq!(store.name(), a.url());
}
