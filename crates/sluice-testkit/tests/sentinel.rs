//! `SentinelGroup`: forming, and a stalled primary failed over by the sentinels.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use std::collections::HashMap;
use std::time::Duration;

use redis::Value;
use sluice_testkit::{RedisServer, SentinelGroup, SentinelOptions};

/// Generous: a failover takes ~3–5 s with the default 1 s down-after time.
const FAILOVER_TIMEOUT: Duration = Duration::from_secs(25);

fn sentinel_master(sentinel: &RedisServer, name: &str) -> HashMap<String, String> {
    let mut conn = sentinel.connection().unwrap();
    redis::cmd("SENTINEL")
        .arg("master")
        .arg(name)
        .query(&mut conn)
        .unwrap()
}

#[test]
fn a_sentinel_group_forms() {
    if !sluice_testkit::require_redis() {
        return;
    }
    let group = SentinelOptions::new()
        .master_name("limits")
        .start()
        .unwrap();
    assert_eq!(group.master_name(), "limits");
    assert_eq!(group.data_nodes().len(), 2);
    assert_eq!(group.sentinels().len(), 3);
    assert_eq!(group.sentinel_urls()[2], group.sentinels()[2].url());
    let primary = &group.data_nodes()[0];
    assert_eq!(group.current_primary_port().unwrap(), primary.port());
    assert_eq!(group.data_node_index(primary.port()), Some(0));

    for sentinel in group.sentinels() {
        assert_eq!(
            sentinel
                .info_field("server", "redis_mode")
                .unwrap()
                .as_deref(),
            Some("sentinel")
        );
        let master = sentinel_master(sentinel, "limits");
        assert_eq!(master["port"], primary.port().to_string());
        assert_eq!(master["quorum"], "2");
        assert_eq!(master["down-after-milliseconds"], "1000");
        assert_eq!(master["failover-timeout"], "3000");
        assert_eq!(master["num-slaves"], "1");
        assert_eq!(master["num-other-sentinels"], "2");
        // Sentinel rewrote its config in its own directory.
        let config = std::fs::read_to_string(sentinel.config_file().unwrap()).unwrap();
        assert!(config.contains("sentinel myid"), "{config}");
    }

    // The data nodes are an ordinary primary and replica.
    primary.cmd(&["SET", "k", "v"]).unwrap();
    let replica = &group.data_nodes()[1];
    assert_eq!(
        replica
            .info_field("replication", "master_port")
            .unwrap()
            .unwrap(),
        primary.port().to_string()
    );
}

#[test]
fn a_paused_primary_is_failed_over() {
    if !sluice_testkit::require_redis() {
        return;
    }
    let group = SentinelGroup::start().unwrap();
    let old = group.current_primary_port().unwrap();
    let replica = group.data_nodes()[1].port();

    group.data_nodes()[0].pause().unwrap();
    let new = group.wait_failover(old, FAILOVER_TIMEOUT).unwrap();
    assert_eq!(new, replica);
    assert_eq!(group.current_primary_port().unwrap(), new);
    for sentinel in group.sentinels() {
        assert_eq!(
            sentinel_master(sentinel, "mymaster")["port"],
            new.to_string()
        );
    }
    // The promoted replica takes writes.
    let promoted = &group.data_nodes()[1];
    assert_eq!(promoted.cmd(&["SET", "k", "v"]).unwrap(), Value::Okay);

    group.data_nodes()[0].resume().unwrap();
    assert_eq!(
        group.data_nodes()[0].cmd(&["PING"]).unwrap(),
        Value::SimpleString("PONG".into())
    );
}

#[test]
fn a_sentinel_group_over_tls_reports_the_tls_ports() {
    if !sluice_testkit::require_redis() {
        return;
    }
    let certs = sluice_testkit::TlsCerts::generate().unwrap();
    let group = SentinelOptions::new()
        .sentinels(2)
        .quorum(1)
        .tls(&certs, true)
        .start()
        .unwrap();
    // The primary as the sentinels report it is the initial primary's TLS port, and the
    // replica replicates from it over TLS.
    let primary = group.current_primary_port().unwrap();
    assert_eq!(Some(primary), group.data_nodes()[0].tls_port());
    assert_eq!(group.data_node_index(primary), Some(0));
    let replica = &group.data_nodes()[1];
    assert_eq!(
        replica.info_field("replication", "master_port").unwrap(),
        Some(primary.to_string())
    );
    assert_eq!(
        replica
            .info_field("replication", "master_link_status")
            .unwrap(),
        Some("up".to_owned())
    );
    // Each sentinel knows the other by its TLS port.
    let other = group.sentinels()[1].tls_port().unwrap();
    let known = sentinel_master(&group.sentinels()[0], group.master_name());
    assert_eq!(
        known.get("num-other-sentinels").map(String::as_str),
        Some("1")
    );
    let sentinels: Vec<HashMap<String, String>> = redis::cmd("SENTINEL")
        .arg("SENTINELS")
        .arg(group.master_name())
        .query(&mut group.sentinels()[0].connection().unwrap())
        .unwrap();
    assert_eq!(
        sentinels[0].get("port").map(String::as_str),
        Some(other.to_string().as_str())
    );
    assert_eq!(group.sentinel_tls_urls().len(), 2);
}
