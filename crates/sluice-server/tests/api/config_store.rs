//! The `store` section of a configuration file: Redis layouts, TLS, credentials and
//! `WAIT`, and what each refusal names.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use std::time::Duration;

use sluice_redis::{RedisConfig, Topology};
use sluice_server::config::{Config, StoreConfig};

use crate::config::{parsed, refused};

#[test]
fn cluster_and_sentinel_layouts() {
    let c = parsed(
        "store:\n  backend: redis\n  cluster: [redis://127.0.0.1:7000, redis://127.0.0.1:7001]\n",
    );
    assert!(matches!(
        c.store,
        StoreConfig::Redis(RedisConfig { topology: Topology::Cluster { ref nodes }, .. }) if nodes.len() == 2
    ));
    let c = parsed(
        "store:\n  backend: redis\n  sentinel: {master: mymaster, nodes: [redis://127.0.0.1:26379]}\n  read_from: primary\n",
    );
    match c.store {
        StoreConfig::Redis(RedisConfig {
            topology: Topology::Sentinel { master, sentinels },
            ..
        }) => {
            assert_eq!(master, "mymaster");
            assert_eq!(sentinels, ["redis://127.0.0.1:26379"]);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn coalesce_sets_the_largest_batch_and_names_a_bad_one() {
    let redis = "store:\n  backend: redis\n  shards: [{primary: redis://127.0.0.1:6379}]\n";
    let coalesce = |c: Config| match c.store {
        StoreConfig::Redis(RedisConfig { coalesce, .. }) => coalesce,
        other => panic!("{other:?}"),
    };
    let c = parsed(redis);
    assert_eq!(coalesce(c), sluice_redis::DEFAULT_COALESCE);
    for (n, expected) in [(1, 1), (16, 16), (1_024, 1_024)] {
        let c = parsed(&format!("{redis}  coalesce: {n}\n"));
        assert_eq!(coalesce(c), expected);
    }
    for bad in ["0", "1025", "-1", "lots"] {
        let e = refused(&format!("{redis}  coalesce: {bad}\n")).to_string();
        assert!(
            e.contains("store.coalesce") || e.contains("coalesce"),
            "{bad}: {e}"
        );
    }
}

/// `store.layout` (where fixed windows opened, `v1` or `v2`) is gone with the second layout:
/// a file that still sets it is refused, naming the key and its line.
#[test]
fn store_layout_is_gone_and_a_file_that_sets_it_is_told() {
    let redis = "store:\n  backend: redis\n  shards: [{primary: redis://127.0.0.1:6379}]\n";
    assert!(Config::parse("sluice.yaml", redis).is_ok());
    for v in ["v1", "v2"] {
        let e = refused(&format!("{redis}  layout: {v}\n")).to_string();
        assert!(
            e.starts_with("sluice.yaml:4:") && e.contains("`layout`"),
            "{v}: {e}"
        );
    }
}

#[test]
fn redis_tls_files() {
    let c = parsed(
        "store:\n  backend: redis\n  shards: [{primary: rediss://r:6380}]\n  tls: {ca_file: ca.crt, cert_file: c.crt, key_file: c.key}\n",
    );
    let StoreConfig::Redis(RedisConfig { tls: Some(tls), .. }) = c.store else {
        panic!("{:?}", c.store)
    };
    assert_eq!(tls.ca_file.as_deref(), Some(std::path::Path::new("ca.crt")));
    assert_eq!(tls.key_file.as_deref(), Some(std::path::Path::new("c.key")));
    let e = refused(
        "store:\n  backend: redis\n  shards: [{primary: rediss://r:6380}]\n  tls: {ca: x}\n",
    )
    .to_string();
    assert!(e.contains("store.tls") && e.contains("ca"), "{e}");
}

#[test]
fn redis_auth_needs_one_password_source() {
    let base = "store:\n  backend: redis\n  shards: [{primary: redis://r:6379}]\n  auth:\n";
    for (auth, says) in [
        (
            "    username: u\n",
            "exactly one of password_file and password_env",
        ),
        (
            "    password_file: /nonexistent/pw\n",
            "store.auth.password_file: cannot read /nonexistent/pw",
        ),
        (
            "    password_env: SLUICE_TEST_SURELY_UNSET_VARIABLE\n",
            "SLUICE_TEST_SURELY_UNSET_VARIABLE is not set",
        ),
    ] {
        let e = refused(&format!("{base}{auth}")).to_string();
        assert!(e.contains(says), "{e}");
    }
}

#[test]
fn sentinel_auth_is_for_the_sentinels_only() {
    let dir = tempfile::tempdir().unwrap();
    let pw = dir.path().join("sentinel-pw");
    std::fs::write(&pw, "s3cret\n").unwrap();
    let pw = pw.display();
    let sentinel = format!(
        "store:\n  backend: redis\n  sentinel: {{master: m, nodes: [rediss://s1:26379]}}\n  sentinel_auth:\n    username: watcher\n    password_file: {pw}\n"
    );
    let c = parsed(&sentinel);
    let StoreConfig::Redis(RedisConfig {
        sentinel_credentials: Some(creds),
        credentials: None,
        ..
    }) = &c.store
    else {
        panic!("{:?}", c.store)
    };
    assert_eq!(
        creds,
        &sluice_redis::Credentials::new(Some("watcher".to_owned()), "s3cret")
    );
    assert!(!format!("{:?}", c.store).contains("s3cret"));
    let shards = format!(
        "store:\n  backend: redis\n  shards: [{{primary: redis://r:6379}}]\n  sentinel_auth:\n    password_file: {pw}\n"
    );
    let e = refused(&shards).to_string();
    assert!(
        e.contains("store.sentinel_auth: only for store.sentinel"),
        "{e}"
    );
    let no_source = "store:\n  backend: redis\n  sentinel: {master: m, nodes: [redis://s1:26379]}\n  sentinel_auth:\n    username: watcher\n";
    let e = refused(no_source).to_string();
    assert!(
        e.contains("store.sentinel_auth: give exactly one of password_file and password_env"),
        "{e}"
    );
}

#[test]
fn waiting_for_replicas_is_opt_in_and_must_fit_in_the_call_timeout() {
    let base = "store:\n  backend: redis\n  shards: [{primary: redis://r:6379}]\n  timeout: 50ms\n";
    let c = parsed(base);
    let StoreConfig::Redis(RedisConfig {
        wait_for_replicas, ..
    }) = c.store
    else {
        panic!("{:?}", c.store)
    };
    assert_eq!(wait_for_replicas, None);
    let c = parsed(&format!(
        "{base}  wait_for_replicas: {{timeout: 10ms, on_shortfall: fail}}\n"
    ));
    let StoreConfig::Redis(RedisConfig {
        wait_for_replicas: Some(w),
        ..
    }) = c.store
    else {
        panic!("{:?}", c.store)
    };
    assert_eq!(
        w,
        sluice_redis::WaitForReplicas::new(1, Duration::from_millis(10))
            .on_shortfall(sluice_redis::Shortfall::Fail)
    );
    for (wait, says) in [
        (
            "{replicas: 1, timeout: 50ms}",
            "store.wait_for_replicas.timeout (50ms) must be shorter than the call timeout (50ms)",
        ),
        (
            "{replicas: 0, timeout: 10ms}",
            "store.wait_for_replicas.replicas",
        ),
        ("{replicas: 1}", "timeout"),
        ("{timeout: 10ms, on_shortfall: drop}", "drop"),
    ] {
        let e = refused(&format!("{base}  wait_for_replicas: {wait}\n")).to_string();
        assert!(e.contains(says), "{wait}: {e}");
    }
}
