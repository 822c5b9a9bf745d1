//! `GET /v1/top`: the keys that are being limited, per policy and per Envoy rule, from the
//! server's bounded heavy-hitter summaries, with what each has left.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::support;

const TOKEN: &str = "top-admin-token-0123456789";
const CONFIG: &str = "admin:\n  tokens_file: tokens\ntop:\n  capacity: 8\n  window: 1m\npolicies:\n  api:\n    limits:\n      - { max: 3, per: 1h }\nrls:\n  config_dir: ratelimit-config\n";
const RLS_YAML: &str = "domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: hour, requests_per_unit: 2}\n";

async fn get(url: &str, token: Option<&str>) -> (StatusCode, Value) {
    support::answer(reqwest::Client::new().get(url), token).await
}

/// `n` Envoy requests through the `edge` rules from `address`.
async fn edge_requests(s: &support::TestServer, address: &str, n: usize) {
    let mut rls = RateLimitServiceClient::new(s.channel().await);
    for _ in 0..n {
        rls.should_rate_limit(support::rls_request(
            "edge",
            &[&[("remote_address", address)]],
            0,
        ))
        .await
        .unwrap();
    }
}

/// A server on [`CONFIG`], with its tokens file and the `edge` rules.
async fn started() -> support::TestServer {
    let files = [("tokens", TOKEN), ("ratelimit-config/edge.yaml", RLS_YAML)];
    support::TestServer::start(CONFIG, &files).await
}

#[tokio::test]
async fn the_keys_driven_over_their_limit_come_first_with_what_they_have_left() {
    let s = started().await;
    let c = reqwest::Client::new();
    let check = |key: &'static str| {
        c.post(format!("{}/v1/check", s.url))
            .json(&json!({"policy": "api", "key": key}))
            .send()
    };
    // "hot" is denied 5 times (3 admitted, then 5 refused); "warm" uses 2; "cold" 1.
    for _ in 0..8 {
        check("hot").await.unwrap();
    }
    for _ in 0..2 {
        check("warm").await.unwrap();
    }
    check("cold").await.unwrap();

    let (status, e) = get(&format!("{}/v1/top?policy=api", s.url), None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{e}");

    let (status, top) = get(
        &format!("{}/v1/top?policy=api&by=denied", s.url),
        Some(TOKEN),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{top}");
    assert_eq!(top["by"], "denied");
    assert_eq!(top["total"], 5);
    assert_eq!(top["capacity"], 8);
    let keys = top["keys"].as_array().unwrap();
    assert_eq!(keys.len(), 1, "{top}");
    assert_eq!(
        keys[0],
        json!({"key": "hot", "count": 5, "error": 0, "remaining": 0})
    );

    let (_, used) = get(
        &format!("{}/v1/top?policy=api&by=used&limit=2", s.url),
        Some(TOKEN),
    )
    .await;
    assert_eq!(
        support::columns(&used["keys"], &["key", "count", "remaining"]),
        [json!(["hot", 3, 0]), json!(["warm", 2, 1])]
    );
    assert_eq!(used["total"], 6);

    // An Envoy rule, under its statistics key; the counter key is what Envoy's descriptor
    // made it.
    edge_requests(&s, "10.0.0.9", 4).await;
    let (status, rule) = get(
        &format!("{}/v1/top?policy=edge.remote_address", s.url),
        Some(TOKEN),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{rule}");
    let keys = rule["keys"].as_array().unwrap();
    assert_eq!(keys.len(), 1, "{rule}");
    assert!(
        keys[0]["key"].as_str().unwrap().contains("10.0.0.9"),
        "{rule}"
    );
    assert_eq!(keys[0]["count"], 2);
    assert!(keys[0].get("remaining").is_none(), "{rule}");
    s.stop().await;
}

#[tokio::test]
async fn bad_top_queries_name_what_is_wrong() {
    let s = started().await;
    for (query, expected) in [
        ("", "`policy` is required"),
        (
            "policy=api&by=most",
            "`by` must be `used` or `denied`, got `most`",
        ),
        (
            "policy=api&limit=0",
            "`limit` must be a whole number from 1 to 100",
        ),
        ("policy=api&limit=101", "got `101`"),
        ("policy=api&sort=asc", "unknown query parameter `sort`"),
    ] {
        let (status, e) = get(&format!("{}/v1/top?{query}", s.url), Some(TOKEN)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{query}: {e}");
        assert_eq!(e["error"]["code"], "invalid_request");
        let message = e["error"]["message"].as_str().unwrap();
        assert!(message.contains(expected), "{query}: {message}");
    }
    let (status, e) = get(&format!("{}/v1/top?policy=nope", s.url), Some(TOKEN)).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(e["error"]["code"], "unknown_policy");
    // Before any traffic, a configured policy has an empty list, not an error.
    let (status, top) = get(&format!("{}/v1/top?policy=api", s.url), Some(TOKEN)).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(top["keys"], json!([]));
    s.stop().await;
}

#[test]
fn a_capacity_over_the_bound_is_refused() {
    let e = sluice_server::config::Config::parse("sluice.yaml", "top:\n  capacity: 10001\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("top.capacity") && e.contains("10001"), "{e}");
}

#[tokio::test]
async fn stats_count_checks_per_policy_and_rule_and_report_the_store() {
    let s = started().await;
    let c = reqwest::Client::new();
    for _ in 0..5 {
        support::check(&c, &s, "api", "k").await;
    }
    // Peeks and refunds are not checks.
    c.post(format!("{}/v1/peek", s.url))
        .json(&json!({"policy": "api", "key": "k"}))
        .send()
        .await
        .unwrap();
    edge_requests(&s, "10.0.0.7", 3).await;
    let (status, e) = get(&format!("{}/v1/stats", s.url), None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{e}");
    let (status, stats) = get(&format!("{}/v1/stats", s.url), Some(TOKEN)).await;
    assert_eq!(status, StatusCode::OK, "{stats}");
    assert_eq!(
        stats["policies"]["api"],
        json!({"allowed": 3, "denied": 2, "degraded": 0, "errors": 0})
    );
    // Envoy rules are no longer among the policies: they are under `rules`.
    assert!(
        stats["policies"].get("edge.remote_address").is_none(),
        "{stats}"
    );
    assert_eq!(stats["rules"][0]["domain"], "edge", "{stats}");
    assert_eq!(stats["rules"][0]["rule"], "remote_address", "{stats}");
    assert_eq!(
        stats["rules"][0]["counts"],
        json!({"allowed": 2, "denied": 1, "degraded": 0, "errors": 0})
    );
    assert_eq!(stats["store"]["kind"], "memory");
    assert!(stats["store"]["keys"].as_u64().unwrap() >= 1, "{stats}");
    assert_eq!(stats["config"]["generation"], 1);
    assert_eq!(stats["reservation"], Value::Null);
    s.stop().await;
}

/// An unknown path's 404 lists the API: every route the server has.
#[tokio::test]
async fn an_unknown_path_names_every_route() {
    let s = started().await;
    let (status, e) = get(&format!("{}/v2/nothing", s.url), None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(e["error"]["code"], "not_found");
    let message = e["error"]["message"].as_str().unwrap();
    for (_, path) in sluice_server::http::routes() {
        let shown = path.trim_end_matches("/app.js");
        assert!(message.contains(shown), "{path} missing from: {message}");
    }
    s.stop().await;
}
