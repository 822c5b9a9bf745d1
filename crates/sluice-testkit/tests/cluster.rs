//! `RedisCluster`: forming, routing keys, failing over a killed or paused primary, rejoining.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use redis::Value;
use sluice_testkit::{
    Error, RedisCluster, RedisServer, SLOT_COUNT, key_slot, parse_info_field, wait_until,
};

/// Generous: a failover takes ~3 s with the default 1 s node timeout.
const FAILOVER_TIMEOUT: Duration = Duration::from_secs(20);

fn bulk(s: &str) -> Value {
    Value::BulkString(s.as_bytes().to_vec())
}

fn role(node: &RedisServer) -> String {
    node.info_field("replication", "role").unwrap().unwrap()
}

/// Writes `key` on its primary and waits (`WAIT`) until a replica has it, so that a
/// failover cannot lose it.
fn set_replicated(cluster: &RedisCluster, key: &str, value: &str) {
    let primary = &cluster.nodes()[cluster.primary_for_key(key).unwrap()];
    let mut conn = primary.connection().unwrap();
    let (_, acked): (Value, i64) = redis::pipe()
        .cmd("SET")
        .arg(key)
        .arg(value)
        .cmd("WAIT")
        .arg(1)
        .arg(5000)
        .query(&mut conn)
        .unwrap();
    assert_eq!(acked, 1, "no replica acknowledged {key}");
}

/// One key per shard: `k0`, `k1`, … picked so that every primary serves one.
fn one_key_per_primary(cluster: &RedisCluster) -> Vec<(usize, String)> {
    let shards = cluster.shards().unwrap();
    let mut keys: Vec<(usize, String)> = Vec::new();
    for i in 0.. {
        let key = format!("k{i}");
        let slot = key_slot(key.as_bytes());
        let primary = shards.iter().find(|s| s.serves(slot)).unwrap().primary;
        if !keys.iter().any(|(p, _)| *p == primary) {
            keys.push((primary, key));
        }
        if keys.len() == shards.len() {
            return keys;
        }
    }
    unreachable!()
}

#[test]
fn a_cluster_can_cross_threads() {
    fn is_send_sync<T: Send + Sync + 'static>() {}
    is_send_sync::<RedisCluster>();
    is_send_sync::<sluice_testkit::SentinelGroup>();
}

#[test]
fn a_cluster_forms_and_routes_keys() {
    if !sluice_testkit::require_redis() {
        return;
    }
    let cluster = RedisCluster::start().unwrap();
    let nodes = cluster.nodes();
    assert_eq!(nodes.len(), 6);
    assert_eq!(cluster.urls().len(), 6);
    assert_eq!(cluster.urls()[0], nodes[0].url());

    // Three shards with one replica each cover every slot, and every node is in one.
    let shards = cluster.shards().unwrap();
    assert_eq!(shards.len(), 3, "{shards:?}");
    assert_eq!(
        shards.iter().map(|s| s.slot_count()).sum::<usize>(),
        usize::from(SLOT_COUNT)
    );
    let mut members: Vec<usize> = Vec::new();
    for shard in &shards {
        assert_eq!(shard.replicas.len(), 1, "{shard:?}");
        assert_eq!(cluster.replicas_of(shard.primary).unwrap(), shard.replicas);
        assert_eq!(role(&nodes[shard.primary]), "master");
        let replica = &nodes[shard.replicas[0]];
        assert_eq!(role(replica), "slave");
        assert_eq!(
            replica
                .info_field("replication", "master_port")
                .unwrap()
                .unwrap(),
            nodes[shard.primary].port().to_string()
        );
        members.push(shard.primary);
        members.extend(&shard.replicas);
    }
    members.sort_unstable();
    assert_eq!(members, [0, 1, 2, 3, 4, 5]);
    for node in nodes {
        assert_eq!(
            node.info_field("cluster", "cluster_enabled")
                .unwrap()
                .as_deref(),
            Some("1")
        );
        // The bus port is one chosen free, not port + 10000 (which may not exist).
        let Value::Array(bus) = node.cmd(&["CONFIG", "GET", "cluster-port"]).unwrap() else {
            panic!("CONFIG GET cluster-port");
        };
        assert_ne!(bus[1], Value::BulkString(b"0".to_vec()));
        // nodes.conf is in the node's own directory, which a restart keeps.
        let nodes_conf = std::fs::read_to_string(node.dir().join("nodes.conf")).unwrap();
        assert!(nodes_conf.contains("myself"), "{nodes_conf}");
    }
    let replica = shards[0].replicas[0];
    let err = cluster.replicas_of(replica).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
    assert!(cluster.primary_for_slot(SLOT_COUNT).is_err());

    // The local slot function agrees with the cluster's own, hash tags included.
    let mut keys: Vec<String> = (0..200).map(|i| format!("key:{i}")).collect();
    keys.extend(
        [
            "",
            "{",
            "}",
            "{}",
            "{}x",
            "a{b}c",
            "{user1000}.following",
            "foo{}{bar}",
            "foo{{bar}}zap",
            "foo{bar}{zap}",
            "sluice:{tenant-7}:policy",
            "ünïcödé",
        ]
        .map(str::to_owned),
    );
    let mut pipe = redis::pipe();
    for key in &keys {
        pipe.cmd("CLUSTER").arg("KEYSLOT").arg(key);
    }
    let slots: Vec<u16> = pipe.query(&mut nodes[0].connection().unwrap()).unwrap();
    for (key, slot) in keys.iter().zip(slots) {
        assert_eq!(key_slot(key.as_bytes()), slot, "slot of {key:?}");
    }

    // Keys land on the primary that serves them; a wrong node redirects.
    for (primary, key) in one_key_per_primary(&cluster) {
        assert_eq!(cluster.primary_for_key(&key).unwrap(), primary);
        assert_eq!(
            cluster.cmd_for_key(&key, &["SET", &key, "v"]).unwrap(),
            Value::Okay
        );
        assert_eq!(
            cluster.cmd_for_key(&key, &["GET", &key]).unwrap(),
            bulk("v")
        );
        assert_eq!(nodes[primary].cmd(&["GET", &key]).unwrap(), bulk("v"));
        // Any other node: another primary, or a replica (which redirects reads too unless
        // the connection asked for READONLY).
        let other = (primary + 1) % nodes.len();
        let err = nodes[other].cmd(&["GET", &key]).unwrap_err();
        assert_eq!(
            err.redis_error().and_then(|e| e.code()),
            Some("MOVED"),
            "{err}"
        );
        // So does a real cluster client, asking the wrong node first.
        let out = Command::new("redis-cli")
            .args(["-c", "-p", &nodes[other].port().to_string(), "GET", &key])
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "v");
    }

    // Dropping the cluster kills every node and removes its directory.
    let pids: Vec<u32> = nodes.iter().map(|n| n.pid().unwrap()).collect();
    let dirs: Vec<_> = nodes.iter().map(|n| n.dir().to_owned()).collect();
    drop(cluster);
    for pid in pids {
        wait_until(Duration::from_secs(5), &format!("{pid} to be gone"), || {
            Ok(!Path::new(&format!("/proc/{pid}")).exists())
        })
        .unwrap();
    }
    assert!(dirs.iter().all(|d| !d.exists()));
}

#[test]
fn a_killed_primary_fails_over_and_rejoins_as_a_replica() {
    if !sluice_testkit::require_redis() {
        return;
    }
    let mut cluster = RedisCluster::start().unwrap();
    set_replicated(&cluster, "k", "before");
    let old = cluster.primary_for_key("k").unwrap();
    let replicas = cluster.replicas_of(old).unwrap();

    cluster.node_mut(old).kill().unwrap();
    let new = cluster.wait_failover(old, FAILOVER_TIMEOUT).unwrap();
    assert_eq!([new], replicas.as_slice());
    assert_eq!(cluster.primary_for_key("k").unwrap(), new);
    assert_eq!(role(&cluster.nodes()[new]), "master");
    for node in cluster.nodes().iter().filter(|n| n.is_running()) {
        let info: String = redis::cmd("CLUSTER")
            .arg("INFO")
            .query(&mut node.connection().unwrap())
            .unwrap();
        assert_eq!(
            parse_info_field(&info, "cluster_state"),
            Some("ok"),
            "{}",
            node.addr()
        );
    }
    // The acknowledged write survived, and the new primary takes writes.
    assert_eq!(
        cluster.cmd_for_key("k", &["GET", "k"]).unwrap(),
        bulk("before")
    );
    cluster.cmd_for_key("k", &["SET", "k", "after"]).unwrap();

    // Restarted on its port with its nodes.conf, the old primary rejoins as a replica.
    let port = cluster.nodes()[old].port();
    cluster.node_mut(old).restart().unwrap();
    assert_eq!(cluster.nodes()[old].port(), port);
    let shards = cluster.wait_ok().unwrap();
    let shard = shards.iter().find(|s| s.primary == new).unwrap();
    assert_eq!(shard.replicas, [old]);
    assert_eq!(cluster.replicas_of(new).unwrap(), [old]);
    let rejoined = &cluster.nodes()[old];
    assert_eq!(role(rejoined), "slave");
    let mut conn = rejoined.connection().unwrap();
    let (_, value): (Value, Value) = redis::pipe()
        .cmd("READONLY")
        .cmd("GET")
        .arg("k")
        .query(&mut conn)
        .unwrap();
    assert_eq!(value, bulk("after"));
}

#[test]
fn a_paused_primary_is_replaced_and_resumes_as_a_replica() {
    if !sluice_testkit::require_redis() {
        return;
    }
    let cluster = RedisCluster::start().unwrap();
    let old = cluster.primary_for_slot(0).unwrap();
    let replica = cluster.replicas_of(old).unwrap()[0];

    cluster.nodes()[old].pause().unwrap();
    assert!(cluster.nodes()[old].is_paused());
    let new = cluster.wait_failover(old, FAILOVER_TIMEOUT).unwrap();
    assert_eq!(new, replica);
    assert_eq!(cluster.primary_for_slot(0).unwrap(), new);

    // Thawed, it finds its slots taken over (a newer epoch) and follows the new primary.
    cluster.nodes()[old].resume().unwrap();
    cluster.wait_ok().unwrap();
    assert_eq!(role(&cluster.nodes()[old]), "slave");
    assert_eq!(cluster.replicas_of(new).unwrap(), [old]);

    // The topology seen by `wait_ok` is the one the next failover goes by: back again.
    cluster.nodes()[new].pause().unwrap();
    assert_eq!(cluster.wait_failover(new, FAILOVER_TIMEOUT).unwrap(), old);
    cluster.nodes()[new].resume().unwrap();
    cluster.wait_ok().unwrap();
    assert_eq!(cluster.primary_for_slot(0).unwrap(), old);
}

#[test]
fn a_cluster_over_tls_forms_and_the_kit_keeps_the_plain_ports() {
    if !sluice_testkit::require_redis() {
        return;
    }
    let certs = sluice_testkit::TlsCerts::generate().unwrap();
    let cluster = sluice_testkit::ClusterOptions::new()
        .replicas_per_primary(0)
        .tls(&certs, true)
        .start()
        .unwrap();
    assert_eq!(cluster.tls_urls().len(), 3);
    for node in cluster.nodes() {
        let tls_port = node.tls_port().unwrap();
        assert_ne!(tls_port, node.port());
        assert_eq!(
            cluster.node_index(tls_port),
            cluster.node_index(node.port())
        );
        let tls_cluster = node.cmd(&["CONFIG", "GET", "tls-cluster"]).unwrap();
        assert_eq!(
            tls_cluster,
            Value::Array(vec![bulk("tls-cluster"), bulk("yes")])
        );
    }
    // The kit, on the plain ports, is told the plain ports (a TLS client is told the TLS
    // ports: the sluice-redis TLS topology tests connect through them).
    let shards = cluster.shards().unwrap();
    assert_eq!(shards.len(), 3);
    cluster.cmd_for_key("k", &["SET", "k", "v"]).unwrap();
    assert_eq!(cluster.cmd_for_key("k", &["GET", "k"]).unwrap(), bulk("v"));
}
