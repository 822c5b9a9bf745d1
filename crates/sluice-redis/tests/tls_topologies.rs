//! Sentinel and Cluster over TLS with ACL users, against real processes: the sentinels and
//! the data nodes they name are reached over TLS with the configured CA and client
//! certificate, each with its own credentials, also after a failover; a Cluster over TLS
//! decides keys in every slot range. And what an operator gets wrong first (a wrong CA, a
//! wrong password, a plaintext URL against a TLS port) is a clear error at connect time that
//! names the sentinel or node, and never shows a password.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod support;

use std::time::{Duration, Instant};

use sluice::{LimitSpec, Limiter, Policy, StoreExt};
use sluice_redis::{Credentials, RedisConfig, RedisStore, TlsFiles};
use sluice_testkit::{ClusterOptions, RedisServer, SentinelGroup, SentinelOptions, TlsCerts};
use support::{policy, until_ok, wait_replicated};

const DATA_PASSWORD: &str = "data-s3cret-0123456789";
const SENTINEL_PASSWORD: &str = "sentinel-s3cret-9876543210";
const WRONG_PASSWORD: &str = "wrong-s3cret-5555555555";

/// `redis-server` arguments adding the ACL user `name` (the default user stays, for the kit).
fn acl_user(name: &str, password: &str) -> Vec<String> {
    ["--user", name, "on", &format!(">{password}"), "~*", "+@all"]
        .map(str::to_owned)
        .to_vec()
}

fn alice() -> Credentials {
    Credentials::new(Some("alice".to_owned()), DATA_PASSWORD)
}

fn watcher() -> Credentials {
    Credentials::new(Some("watcher".to_owned()), SENTINEL_PASSWORD)
}

/// The CA and the client certificate (the servers require one).
fn files(certs: &TlsCerts) -> TlsFiles {
    let (cert, key) = certs.client_files();
    TlsFiles::ca(certs.ca_file()).client(cert, key)
}

/// Asserts that neither `text` shows a password.
fn assert_no_password(text: &str) {
    for password in [DATA_PASSWORD, SENTINEL_PASSWORD, WRONG_PASSWORD] {
        assert!(!text.contains(password), "shows a password: {text}");
    }
}

/// The error connecting with `config`, checked to show no password (nor its `Debug`).
/// Certificates, and a Sentinel group of `options` serving TLS with them that requires client
/// certificates, its data nodes with the ACL user alice, its sentinels with watcher; `None`
/// (the test is skipped) without `redis-server`.
fn tls_sentinel(options: SentinelOptions) -> Option<(TlsCerts, SentinelGroup)> {
    if !sluice_testkit::require_redis() {
        return None;
    }
    let certs = TlsCerts::generate().unwrap();
    let group = tokio::task::block_in_place(|| {
        options
            .tls(&certs, true)
            .data_args(acl_user("alice", DATA_PASSWORD))
            .sentinel_args(acl_user("watcher", SENTINEL_PASSWORD))
            .start()
    })
    .unwrap();
    Some((certs, group))
}

async fn refused(config: RedisConfig) -> String {
    assert_no_password(&format!("{config:?}"));
    let e = RedisStore::connect(config).await.unwrap_err();
    assert_no_password(&format!("{e:?}"));
    let e = e.to_string();
    assert_no_password(&e);
    e
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_over_tls_with_acl_users_follows_a_forced_failover() {
    let Some((certs, group)) = tls_sentinel(SentinelOptions::new()) else {
        return;
    };
    // The sentinels report the primary's TLS port.
    let old_port = group.current_primary_port().unwrap();
    let old = group.data_node_index(old_port).unwrap();
    assert_eq!(group.data_nodes()[old].tls_port(), Some(old_port));

    // The first sentinel's URL names its user; the others log in with sentinel_credentials.
    let mut sentinels = group.sentinel_tls_urls();
    sentinels[0] = sentinels[0].replace(
        "rediss://",
        &format!("rediss://watcher:{SENTINEL_PASSWORD}@"),
    );
    let config = RedisConfig::sentinel(group.master_name(), sentinels)
        .tls(files(&certs))
        .credentials(alice())
        .sentinel_credentials(watcher())
        .timeout(Duration::from_millis(200));
    assert_no_password(&format!("{config:?}"));
    let store = RedisStore::connect(config).await.unwrap();
    assert_eq!(
        store.primary_url(),
        format!("rediss://127.0.0.1:{old_port}")
    );
    assert_no_password(&format!("{store:?}"));
    let limiter = Limiter::new(store.clone()).with_policy(policy(1_000));
    for i in 0..10u64 {
        let d = limiter.check("api", "k", 1).await.unwrap();
        assert_eq!(d.remaining(), 999 - i);
    }
    // Logged in as alice on the primary, as watcher on a sentinel.
    let users = group.data_nodes()[old].client_users().unwrap();
    assert!(users.iter().any(|u| u == "alice"), "{users:?}");
    let watched = group
        .sentinels()
        .iter()
        .any(|s| s.client_users().unwrap().iter().any(|u| u == "watcher"));
    assert!(watched, "no sentinel has a client logged in as watcher");
    let replicas: Vec<&RedisServer> = (0..group.data_nodes().len())
        .filter(|&i| i != old)
        .map(|i| &group.data_nodes()[i])
        .collect();
    wait_replicated(&group.data_nodes()[old], &replicas);

    // A forced failover: a replica is promoted while the old primary still runs.
    let new_port =
        tokio::task::block_in_place(|| group.force_failover(old_port, Duration::from_secs(20)))
            .unwrap();
    let new = group.data_node_index(new_port).unwrap();
    assert_eq!(group.data_nodes()[new].tls_port(), Some(new_port));
    // Sentinel turns the old primary into a replica only some 8 s after the failover (four
    // hello periods); do now what it will do, so the old primary refuses writes (READONLY)
    // and the store asks the sentinels again.
    group.data_nodes()[old]
        .cmd(&["REPLICAOF", "127.0.0.1", &new_port.to_string()])
        .unwrap();
    let demoted = Instant::now();
    let (d, _, _) = until_ok(&limiter, "k", Duration::from_secs(10), |e| {
        assert_no_password(&e.to_string())
    })
    .await;
    println!(
        "sentinel over TLS: decisions continued on the new primary {:?} after the old one \
         refused writes",
        demoted.elapsed()
    );
    assert_eq!(
        store.primary_url(),
        format!("rediss://127.0.0.1:{new_port}"),
        "the store follows the failover over TLS"
    );
    // The count replicated: the next decision continues it, on the new primary, as alice.
    assert_eq!(d.remaining(), 989);
    let users = group.data_nodes()[new].client_users().unwrap();
    assert!(users.iter().any(|u| u == "alice"), "{users:?}");
    let d = limiter.check("api", "k", 1).await.unwrap();
    assert_eq!(d.remaining(), 988);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_tls_and_acl_mistakes_are_clear_startup_errors() {
    let Some((certs, group)) = tls_sentinel(SentinelOptions::new().sentinels(1).quorum(1)) else {
        return;
    };
    let sentinel_port = group.sentinels()[0].tls_port().unwrap();
    let sentinel = format!("rediss://127.0.0.1:{sentinel_port}");
    let primary = format!(
        "rediss://127.0.0.1:{}",
        group.current_primary_port().unwrap()
    );
    let config = |url: &str| {
        RedisConfig::sentinel(group.master_name(), [url])
            .tls(files(&certs))
            .credentials(alice())
            .sentinel_credentials(watcher())
    };
    // Everything right first.
    let store = RedisStore::connect(config(&sentinel)).await.unwrap();
    let p = Policy::from_specs("api", vec![LimitSpec::fixed_window(1, 60_000)]).unwrap();
    assert!(
        store
            .check(&p, "k", 1, 1_700_000_000_000)
            .await
            .unwrap()
            .allowed
    );

    // A CA that did not sign the sentinel's certificate.
    let other = TlsCerts::generate().unwrap();
    let e = refused(config(&sentinel).tls(files(&other))).await;
    assert!(e.contains(&format!("sentinel {sentinel}")), "{e}");
    // A wrong sentinel password.
    let e = refused(
        config(&sentinel)
            .sentinel_credentials(Credentials::new(Some("watcher".to_owned()), WRONG_PASSWORD)),
    )
    .await;
    assert!(e.contains(&format!("sentinel {sentinel}")), "{e}");
    assert!(e.to_lowercase().contains("password"), "{e}");
    // The same password in the URL instead.
    let in_url = format!("rediss://watcher:{WRONG_PASSWORD}@127.0.0.1:{sentinel_port}");
    let e = refused(config(&in_url)).await;
    assert!(e.contains(&format!("sentinel {sentinel}")), "{e}");
    // A wrong password for the data nodes: the error names the primary the sentinel named.
    let e = refused(
        config(&sentinel).credentials(Credentials::new(Some("alice".to_owned()), WRONG_PASSWORD)),
    )
    .await;
    assert!(e.contains(&primary), "names the primary: {e}");
    assert!(e.to_lowercase().contains("password"), "{e}");
    // A plaintext URL against the sentinel's TLS port.
    let plain = format!("redis://127.0.0.1:{sentinel_port}");
    let e = refused(config(&plain)).await;
    assert!(e.contains(&format!("sentinel {plain}")), "{e}");
    assert!(e.contains("use a rediss:// URL"), "{e}");
    // TLS for some sentinels only.
    let e =
        refused(RedisConfig::sentinel(group.master_name(), [&sentinel, &plain]).tls(files(&certs)))
            .await;
    assert!(e.contains("rediss:// for all of them or for none"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_over_tls_with_an_acl_user() {
    if !sluice_testkit::require_redis() {
        return;
    }
    let certs = TlsCerts::generate().unwrap();
    let cluster = tokio::task::block_in_place(|| {
        ClusterOptions::new()
            .replicas_per_primary(0)
            .tls(&certs, true)
            .args(acl_user("alice", DATA_PASSWORD))
            .start()
    })
    .unwrap();
    let seeds = cluster.tls_urls();
    let config = RedisConfig::cluster(seeds.iter().take(1))
        .tls(files(&certs))
        .credentials(alice())
        // Generous: TLS handshakes with every node on a loaded 2-core machine.
        .timeout(Duration::from_secs(2));
    let store = RedisStore::connect(config.clone()).await.unwrap();
    assert_no_password(&format!("{store:?}"));
    let p = Policy::from_specs("api", vec![LimitSpec::fixed_window(2, 60_000)]).unwrap();
    let t0 = 1_700_000_000_000;
    for i in 0..30 {
        let key = format!("user-{i}");
        assert!(store.check(&p, &key, 1, t0).await.unwrap().allowed);
        assert!(store.check(&p, &key, 1, t0).await.unwrap().allowed);
        assert!(!store.check(&p, &key, 1, t0).await.unwrap().allowed);
    }
    // The keys landed on every primary (so in several slots, reached through the TLS ports
    // the cluster announced), each connected to as alice.
    for node in cluster.nodes() {
        let keys: i64 =
            redis::FromRedisValue::from_redis_value(node.cmd(&["DBSIZE"]).unwrap()).unwrap();
        assert!(keys > 0, "{} holds no key", node.addr());
        let users = node.client_users().unwrap();
        assert!(users.iter().any(|u| u == "alice"), "{users:?}");
    }

    let seed_port = cluster.nodes()[0].tls_port().unwrap();
    let seed = format!("127.0.0.1:{seed_port}");
    let other = TlsCerts::generate().unwrap();
    let e = refused(config.clone().tls(files(&other))).await;
    assert!(e.contains(&seed), "names the node: {e}");
    let e = refused(
        config
            .clone()
            .credentials(Credentials::new(Some("alice".to_owned()), WRONG_PASSWORD)),
    )
    .await;
    assert!(e.contains(&seed), "names the node: {e}");
    let e = refused(
        RedisConfig::cluster([format!("rediss://alice:{WRONG_PASSWORD}@{seed}")])
            .tls(files(&certs)),
    )
    .await;
    assert!(e.contains(&seed), "names the node: {e}");
    let e = refused(
        RedisConfig::cluster([format!("redis://{seed}")])
            .credentials(alice())
            .timeout(Duration::from_millis(500)),
    )
    .await;
    assert!(
        e.contains(&format!("redis://{seed}")),
        "names the node: {e}"
    );
    assert!(e.contains("use a rediss:// URL"), "{e}");
}
