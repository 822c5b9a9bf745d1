//! The server over the other Redis layouts (Cluster, Sentinel) and the `local` failure mode
//! over a shard that dies, end to end over HTTP.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use std::time::{Duration, Instant};

use reqwest::{Client, StatusCode};
use serde_json::{Value, json};
use support::{TestServer, check};

const POLICIES: &str = r#"
policies:
  api:
    limits:
      - { max: 3, per: 1h }
  insured:
    on_store_error: local
    limits:
      - { max: 3, per: 1h }
"#;

async fn text(c: &Client, url: String) -> (StatusCode, String) {
    let r = support::send(c.get(url)).await;
    (r.status(), r.text().await.unwrap())
}

/// A server of [`POLICIES`] whose Redis store is `store` (the lines after `backend: redis`),
/// with `files` beside it, and a client.
async fn serve(store: &str, files: &[(&str, &str)]) -> (TestServer, Client) {
    let config = format!("{POLICIES}\nstore:\n  backend: redis\n{store}");
    (TestServer::start(&config, files).await, Client::new())
}

/// A real redis-server and [`serve`] over it, its one shard, with a 200 ms timeout; `None` as
/// [`support::redis`].
async fn one_shard() -> Option<(sluice_testkit::RedisServer, TestServer, Client)> {
    let redis = support::redis()?;
    let shard = format!(
        "  shards:\n    - primary: {}\n  timeout: 200ms\n",
        redis.url()
    );
    let (s, c) = serve(&shard, &[]).await;
    Some((redis, s, c))
}

/// `/metrics`, `/readyz` and `/v1/policies` answer, and show none of `secrets`.
async fn shown_nowhere(c: &Client, s: &TestServer, secrets: &[&str]) {
    for path in ["/metrics", "/readyz", "/v1/policies"] {
        let (status, text) = text(c, format!("{}{path}", s.url)).await;
        assert_eq!(status, StatusCode::OK, "{path}: {text}");
        for secret in secrets {
            assert!(!text.contains(secret), "{path} shows {secret}");
        }
    }
}

/// `/readyz` answers `status`.
async fn assert_ready(c: &Client, s: &TestServer, status: StatusCode) {
    let (got, body) = text(c, format!("{}/readyz", s.url)).await;
    assert_eq!(got, status, "{body}");
}

/// Three checks allowed, the fourth denied, none degraded.
async fn exactly_three(c: &Client, s: &TestServer, key: &str) {
    for remaining in [2, 1, 0] {
        let (status, body) = check(c, s, "api", key).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(body["remaining"], remaining, "{body}");
        assert!(body.get("degraded").is_none(), "{body}");
    }
    assert_eq!(
        check(c, s, "api", key).await.0,
        StatusCode::TOO_MANY_REQUESTS
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_over_a_redis_cluster() {
    if !sluice_testkit::require_redis() {
        return;
    }
    let cluster = tokio::task::block_in_place(sluice_testkit::RedisCluster::start).unwrap();
    let nodes: Vec<String> = cluster.urls();
    let (s, c) = serve(
        &format!("  cluster: [{}]\n  timeout: 500ms\n", nodes.join(", ")),
        &[],
    )
    .await;
    for k in 0..5 {
        exactly_three(&c, &s, &format!("user:{k}")).await;
    }
    assert_ready(&c, &s, StatusCode::OK).await;
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_over_sentinel() {
    if !sluice_testkit::require_redis() {
        return;
    }
    let group = tokio::task::block_in_place(sluice_testkit::SentinelGroup::start).unwrap();
    let (s, c) = serve(
        &format!(
            "  sentinel: {{master: {}, nodes: [{}]}}\n  timeout: 500ms\n",
            group.master_name(),
            group.sentinel_urls().join(", ")
        ),
        &[],
    )
    .await;
    exactly_three(&c, &s, "user:1").await;
    assert_ready(&c, &s, StatusCode::OK).await;
    s.stop().await;
}

/// `on_store_error: local` while the only shard is dead: still limited (by this process),
/// marked degraded; the circuit opens and shows in /metrics; after a restart the shard is
/// used again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_policy_stays_limited_while_its_shard_is_down() {
    let Some((mut redis, s, c)) = one_shard().await else {
        return;
    };
    let (status, body) = check(&c, &s, "insured", "k").await;
    assert_eq!(
        (status, body["remaining"].as_u64()),
        (StatusCode::OK, Some(2))
    );

    redis.kill().unwrap();
    let mut outcomes = Vec::new();
    for _ in 0..6 {
        let (status, body) = check(&c, &s, "insured", "k").await;
        assert_eq!(body["degraded"], true, "{body}");
        outcomes.push(status);
    }
    // The insurance store starts empty: 3 more, then denied (not unlimited).
    assert_eq!(
        outcomes,
        [
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::TOO_MANY_REQUESTS,
            StatusCode::TOO_MANY_REQUESTS,
            StatusCode::TOO_MANY_REQUESTS,
        ]
    );
    let (_, metrics) = text(&c, format!("{}/metrics", s.url)).await;
    let state = format!("sluice_store_circuit_state{{store=\"{}\"}} 1", redis.url());
    assert!(metrics.contains(&state), "{state} not in\n{metrics}");
    assert_ready(&c, &s, StatusCode::SERVICE_UNAVAILABLE).await;
    // What the dashboard shows: the shard's open circuit and its error, the checks by outcome.
    let (_, stats) = text(&c, format!("{}/v1/stats", s.url)).await;
    let stats: Value = serde_json::from_str(&stats).unwrap();
    assert_eq!(stats["store"]["kind"], "redis", "{stats}");
    let shard = &stats["store"]["shards"][0];
    assert_eq!(
        (&shard["name"], &shard["circuit"], &shard["ok"]),
        (&json!(redis.url()), &json!("open"), &json!(false)),
        "{stats}"
    );
    assert!(!shard["error"].as_str().unwrap().is_empty(), "{stats}");
    assert_eq!(
        stats["policies"]["insured"],
        json!({"allowed": 1, "denied": 0, "degraded": 6, "errors": 0})
    );

    tokio::task::block_in_place(|| redis.restart()).unwrap();
    let restarted = Instant::now();
    loop {
        let (status, body) = check(&c, &s, "insured", "k").await;
        if body.get("degraded").is_none() {
            // Redis lost its data in the crash: a fresh window.
            assert_eq!(
                (status, body["remaining"].as_u64()),
                (StatusCode::OK, Some(2))
            );
            break;
        }
        assert!(
            restarted.elapsed() < Duration::from_secs(5),
            "the shard was not used again"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let (_, metrics) = text(&c, format!("{}/metrics", s.url)).await;
    let state = format!("sluice_store_circuit_state{{store=\"{}\"}} 0", redis.url());
    assert!(metrics.contains(&state), "{state} not in\n{metrics}");
    s.stop().await;
}

/// One header rule for the server and the tower layer: a check let through because the shard
/// is dead and the policy fails open has no numbers behind it, so it carries no rate-limit
/// headers; the same check under `local` carries the insurance store's real numbers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_decision_carries_no_rate_limit_headers() {
    let Some((mut redis, s, c)) = one_shard().await else {
        return;
    };
    let post = |policy: &str| {
        c.post(format!("{}/v1/check", s.url))
            .json(&json!({"policy": policy, "key": "k"}))
            .send()
    };
    let r = post("api").await.unwrap();
    assert_eq!(r.headers()["x-ratelimit-remaining"], "2");

    redis.kill().unwrap();
    let open = post("api").await.unwrap();
    let local = post("insured").await.unwrap();
    let (open_headers, local_headers) = (open.headers().clone(), local.headers().clone());
    let open_body: Value = open.json().await.unwrap();
    s.stop().await;

    assert_eq!(open_body["degraded"], true, "{open_body}");
    for name in [
        "x-ratelimit-remaining",
        "x-ratelimit-reset",
        "ratelimit",
        "ratelimit-policy",
    ] {
        assert!(!open_headers.contains_key(name), "{name}: {open_headers:?}");
    }
    assert_eq!(local_headers["x-ratelimit-remaining"], "2");
    assert!(local_headers.contains_key("ratelimit"));
}

/// `local.enabled`: a hot key's checks are served from leases, the counters show it in
/// /metrics, and Redis sees a fraction of the calls; the window is still exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_reservation_serves_hot_keys_from_memory() {
    let hot = "policies:\n  hot:\n    limits:\n      - { max: 100, per: 1h }\nlocal:\n  enabled: true\n  batch: 0.1\n";
    let Some((redis, config)) = support::with_redis(hot, "2s") else {
        return;
    };
    let s = TestServer::start(&config, &[]).await;
    let c = Client::new();
    let mut allowed = 0;
    for _ in 0..150 {
        let (status, body) = check(&c, &s, "hot", "k").await;
        // A degraded answer (the store did not answer in time) is not an admission.
        assert!(body.get("degraded").is_none(), "{body}");
        if status == StatusCode::OK {
            allowed += 1;
            assert!(
                body["remaining"].as_u64().unwrap() <= 100 - allowed,
                "{body}"
            );
        }
    }
    assert_eq!(allowed, 100, "exactly max, in batches of 10");
    let fcalls = redis.command_calls("fcall").unwrap();
    assert!(fcalls > 0, "no FCALL at all");
    // 10 batches of 10, then one refusal that the negative cache repeats.
    assert!(fcalls <= 12, "{fcalls} script calls for 150 checks");
    let (_, metrics) = text(&c, format!("{}/metrics", s.url)).await;
    let local = metrics
        .lines()
        .find(|l| l.starts_with("sluice_reserve_total{what=\"local\"}"))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or_else(|| panic!("no local counter in\n{metrics}"));
    assert_eq!(local, 90);
    let (_, stats) = text(&c, format!("{}/v1/stats", s.url)).await;
    let stats: Value = serde_json::from_str(&stats).unwrap();
    assert_eq!(stats["reservation"]["local"], 90, "{stats}");
    let shard = &stats["store"]["shards"][0];
    assert_eq!(
        (&shard["ok"], &shard["circuit"]),
        (&json!(true), &json!("closed"))
    );
    assert!(shard["latency_ms"].as_f64().unwrap() > 0.0, "{stats}");
    s.stop().await;
}

/// `store.tls`: a `rediss://` shard with certificate files named relative to the
/// configuration file; checks go over TLS with a client certificate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_over_tls_to_redis() {
    if !sluice_testkit::require_redis() {
        return;
    }
    let certs = sluice_testkit::TlsCerts::generate().unwrap();
    let redis = sluice_testkit::ServerOptions::new()
        .tls(&certs, true)
        .start()
        .unwrap();
    let tls_port = redis.tls_port().unwrap();
    let (cert, key) = certs.client_files();
    let read = |p: std::path::PathBuf| std::fs::read_to_string(p).unwrap();
    let (ca, cert, key) = (read(certs.ca_file()), read(cert), read(key));
    let config = format!(
        "{POLICIES}\nstore:\n  backend: redis\n  shards:\n    - primary: rediss://127.0.0.1:{tls_port}\n  tls:\n    ca_file: tls/ca.crt\n    cert_file: tls/client.crt\n    key_file: tls/client.key\n"
    );
    let s = TestServer::start(
        &config,
        &[
            ("tls/ca.crt", &ca),
            ("tls/client.crt", &cert),
            ("tls/client.key", &key),
        ],
    )
    .await;
    let c = Client::new();
    for remaining in [2, 1, 0] {
        let (status, body) = check(&c, &s, "api", "k").await;
        assert_eq!(
            (status, body["remaining"].as_u64()),
            (StatusCode::OK, Some(remaining))
        );
    }
    let (status, _) = check(&c, &s, "api", "k").await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_ready(&c, &s, StatusCode::OK).await;
    s.stop().await;
}

/// `store.auth`: the ACL user's password read from a file (not the URL); checks run as
/// that user, and the password shows nowhere (metrics, readiness).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_as_an_acl_user_with_a_password_file() {
    if !sluice_testkit::require_redis() {
        return;
    }
    const PASSWORD: &str = "file-s3cret-0123456789";
    let redis = sluice_testkit::ServerOptions::new()
        .args(sluice_testkit::acl_user("sluice", PASSWORD, "*"))
        .start()
        .unwrap();
    let (s, c) = serve(&format!("  shards:\n    - primary: {}\n  auth:\n    username: sluice\n    password_file: secrets/redis\n", redis.url()), &[("secrets/redis", &format!("{PASSWORD}\n"))]).await;
    let (status, body) = check(&c, &s, "api", "k").await;
    assert_eq!(
        (status, body["remaining"].as_u64()),
        (StatusCode::OK, Some(2))
    );
    let users = redis.client_users().unwrap();
    assert!(users.iter().any(|u| u == "sluice"), "{users:?}");
    shown_nowhere(&c, &s, &[PASSWORD]).await;
    s.stop().await;
}

/// A Sentinel over TLS: sentinels and data nodes serve TLS and require client certificates,
/// the sentinels log in as their own ACL user (`store.sentinel_auth`), the data nodes as
/// another (`store.auth`), each password read from its own file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_over_a_tls_sentinel_with_separate_sentinel_auth() {
    if !sluice_testkit::require_redis() {
        return;
    }
    const DATA_PASSWORD: &str = "data-s3cret-0123456789";
    const SENTINEL_PASSWORD: &str = "sentinel-s3cret-9876543210";
    let user = |name, password| sluice_testkit::acl_user(name, password, "*");
    let certs = sluice_testkit::TlsCerts::generate().unwrap();
    let group = tokio::task::block_in_place(|| {
        sluice_testkit::SentinelOptions::new()
            .sentinels(1)
            .quorum(1)
            .tls(&certs, true)
            .data_args(user("sluice", DATA_PASSWORD))
            .sentinel_args(user("watcher", SENTINEL_PASSWORD))
            .start()
    })
    .unwrap();
    let (cert, key) = certs.client_files();
    let read = |p: std::path::PathBuf| std::fs::read_to_string(p).unwrap();
    let (ca, cert, key) = (read(certs.ca_file()), read(cert), read(key));
    let config = format!(
        "{POLICIES}\nstore:\n  backend: redis\n  sentinel:\n    master: {}\n    nodes: [{}]\n  tls:\n    ca_file: tls/ca.crt\n    cert_file: tls/client.crt\n    key_file: tls/client.key\n  auth:\n    username: sluice\n    password_file: secrets/redis\n  sentinel_auth:\n    username: watcher\n    password_file: secrets/sentinel\n",
        group.master_name(),
        group.sentinel_tls_urls().join(", ")
    );
    let s = TestServer::start(
        &config,
        &[
            ("tls/ca.crt", &ca),
            ("tls/client.crt", &cert),
            ("tls/client.key", &key),
            ("secrets/redis", &format!("{DATA_PASSWORD}\n")),
            ("secrets/sentinel", &format!("{SENTINEL_PASSWORD}\n")),
        ],
    )
    .await;
    let c = Client::new();
    exactly_three(&c, &s, "k").await;
    let primary = group
        .data_node_index(group.current_primary_port().unwrap())
        .unwrap();
    let users = group.data_nodes()[primary].client_users().unwrap();
    assert!(users.iter().any(|u| u == "sluice"), "{users:?}");
    let users = group.sentinels()[0].client_users().unwrap();
    assert!(users.iter().any(|u| u == "watcher"), "{users:?}");
    shown_nowhere(&c, &s, &[DATA_PASSWORD, SENTINEL_PASSWORD]).await;
    s.stop().await;
}

/// What the dashboard shows of a shard with replicas: its store calls' latency over the last
/// minute, and each replica answering a ping or not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stats_show_a_shards_call_latency_and_its_replicas() {
    if !sluice_testkit::require_redis() {
        return;
    }
    let mut set = tokio::task::block_in_place(|| sluice_testkit::ReplicaSet::start(2)).unwrap();
    let (s, c) = serve(
        &format!(
            "  shards:\n    - primary: {}\n      replicas: [{}, {}]\n  timeout: 1s\n",
            set.primary.url(),
            set.replicas[0].url(),
            set.replicas[1].url()
        ),
        &[],
    )
    .await;
    exactly_three(&c, &s, "k").await;
    set.replicas[1].kill().unwrap();
    let (_, stats) = text(&c, format!("{}/v1/stats", s.url)).await;
    let stats: Value = serde_json::from_str(&stats).unwrap();
    let shard = &stats["store"]["shards"][0];
    let (p50, p99) = (
        shard["p50_ms"].as_f64().unwrap(),
        shard["p99_ms"].as_f64().unwrap(),
    );
    assert!(p50 > 0.0 && p99 >= p50, "{shard}");
    let replicas = shard["replicas"].as_array().unwrap();
    assert_eq!(replicas.len(), 2, "{shard}");
    assert_eq!(
        (&replicas[0]["addr"], &replicas[0]["ok"]),
        (&json!(set.replicas[0].url()), &json!(true)),
        "{shard}"
    );
    assert!(replicas[0]["latency_ms"].as_f64().unwrap() > 0.0, "{shard}");
    assert!(replicas[0].get("lag_s").is_none(), "lag is not measured");
    assert_eq!(
        (&replicas[1]["addr"], &replicas[1]["ok"]),
        (&json!(set.replicas[1].url()), &json!(false)),
        "{shard}"
    );
    assert!(
        !replicas[1]["error"].as_str().unwrap().is_empty(),
        "{shard}"
    );
    s.stop().await;
}
