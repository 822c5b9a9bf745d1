//! End to end: the real server on port 0, a real HTTP client, every endpoint and error of
//! docs/api.md, the headers of a full window, reloads and a graceful shutdown.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use std::time::Duration;

use reqwest::{Client, StatusCode};
use serde_json::{Value, json};

const CONFIG: &str = r#"
policies:
  api:
    limits:
      - { max: 3, per: 1h }
      - { max: 1000, per: 1d }
  search:
    limits:
      - { max: 30, per: 1m, algorithm: sliding_window, precision: 1s }
  uploads:
    limits:
      - { max: 100, per: 1m, algorithm: token_bucket, burst: 20 }
"#;

use crate::support;

use support::{header, post};

type Server = support::TestServer;

/// The bearer token of the servers with an `admin` section.
const TOKEN: &str = "s3cr3t-0123456789abcdef";

/// A server on [`CONFIG`] with an `admin` section holding [`TOKEN`], and `extra` (more keys
/// of the section).
async fn with_admin(extra: &str) -> Server {
    let config = format!("{CONFIG}\nadmin:\n  tokens_file: secrets/admin\n{extra}");
    Server::start(&config, &[("secrets/admin", &format!("{TOKEN}\n"))]).await
}

/// The body of a request for `cost` of `key` under `policy`.
fn asking(policy: &str, key: &str, cost: u64) -> Value {
    json!({"policy": policy, "key": key, "cost": cost})
}

async fn start(config: &str) -> Server {
    Server::start(config, &[]).await
}

/// A server of [`CONFIG`], a client and the server's `/v1/check`.
async fn start_checking() -> (Server, Client, String) {
    let s = start(CONFIG).await;
    let check = format!("{}/v1/check", s.url);
    (s, Client::new(), check)
}

/// Asserts the answer's headers `(name, value)`.
fn assert_headers(r: &reqwest::Response, expected: &[(&str, &str)]) {
    for (name, value) in expected {
        assert_eq!(header(r, name).as_deref(), Some(*value), "{name}");
    }
}

async fn error_of(r: reqwest::Response, status: StatusCode) -> String {
    assert_eq!(r.status(), status);
    assert_eq!(
        header(&r, "content-type").as_deref(),
        Some("application/json")
    );
    let body: Value = r.json().await.unwrap();
    let message = body["error"]["message"].as_str().unwrap().to_owned();
    assert!(body["error"]["code"].is_string(), "{body}");
    message
}

#[tokio::test]
async fn a_full_window_counts_down_then_429_with_a_constant_reset() {
    let (s, c, url) = start_checking().await;
    let mut resets = Vec::new();
    for expected in [2, 1, 0] {
        let r = post(&c, &url, json!({"policy": "api", "key": "user:42"})).await;
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(header(&r, "x-ratelimit-limit").as_deref(), Some("3"));
        assert_eq!(
            header(&r, "x-ratelimit-remaining"),
            Some(expected.to_string())
        );
        assert_eq!(
            header(&r, "x-ratelimit-used"),
            Some((3 - expected).to_string())
        );
        assert_eq!(header(&r, "x-ratelimit-resource").as_deref(), Some("api"));
        assert!(header(&r, "retry-after").is_none());
        let policy = header(&r, "ratelimit-policy").unwrap();
        assert_eq!(policy, r#""api:0";q=3;w=3600, "api:1";q=1000;w=86400"#);
        let rl = header(&r, "ratelimit").unwrap();
        assert!(
            rl.starts_with(&format!(r#""api:0";r={expected};t="#)),
            "{rl}"
        );
        resets.push(header(&r, "x-ratelimit-reset").unwrap());
        let body: Value = r.json().await.unwrap();
        assert_eq!(body["allowed"], json!(true));
        assert_eq!(body["remaining"], json!(expected));
        assert_eq!(body["limits"][1]["remaining"], json!(997 + expected));
        assert_eq!(body["limits"][0]["algorithm"], json!("fixed_window"));
        resets.push(body["reset"].to_string());
    }
    let r = post(&c, &url, json!({"policy": "api", "key": "user:42"})).await;
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    let retry: u64 = header(&r, "retry-after").unwrap().parse().unwrap();
    assert!((3_590..=3_600).contains(&retry), "Retry-After {retry}");
    resets.push(header(&r, "x-ratelimit-reset").unwrap());
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["allowed"], json!(false));
    assert_eq!(body["retry_after"], json!(retry));
    resets.dedup();
    assert_eq!(resets.len(), 1, "the reset moved: {resets:?}");
    s.stop().await;
}

#[tokio::test]
async fn peek_refund_forget_and_policies() {
    let (s, c, check) = start_checking().await;
    post(&c, &check, asking("api", "k", 2)).await;
    let r = s.post(&c, "/v1/peek", asking("api", "k", 1)).await;
    assert_eq!(r.status(), StatusCode::OK);
    let body: Value = r.json().await.unwrap();
    assert_eq!(
        body["remaining"],
        json!(0),
        "a peek reports what the check would get"
    );
    let r = s.post(&c, "/v1/refund", asking("api", "k", 1)).await;
    assert_eq!(r.status(), StatusCode::OK);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["remaining"], json!(2));
    let r = s.delete(&c, "/v1/keys/api/k").await;
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    // No body, so no content type (it said application/json).
    assert_eq!(header(&r, "content-type"), None);
    assert_eq!(r.bytes().await.unwrap().len(), 0);
    let r = post(&c, &check, asking("api", "k", 3)).await;
    assert_eq!(r.status(), StatusCode::OK, "forgotten: a full window again");
    // Keys with slashes and spaces survive the path.
    post(&c, &check, json!({"policy": "api", "key": "a/b c"})).await;
    let r = s.delete(&c, "/v1/keys/api/a%2Fb%20c").await;
    assert_eq!(r.status(), StatusCode::NO_CONTENT);

    let r = s.get(&c, "/v1/policies").await;
    assert_eq!(r.status(), StatusCode::OK);
    let body: Value = r.json().await.unwrap();
    let names: Vec<&str> = body["policies"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["api", "search", "uploads"]);
    assert_eq!(body["policies"][2]["limits"][0]["burst"], json!(20));

    for path in ["/healthz", "/readyz"] {
        let r = support::send(c.get(format!("{}{path}", s.url))).await;
        assert_eq!(r.status(), StatusCode::OK, "{path}");
        assert_eq!(
            header(&r, "content-type").as_deref(),
            Some("application/json")
        );
    }
    s.stop().await;
}

#[tokio::test]
async fn every_error_is_json_with_the_right_status() {
    let (s, c, check) = start_checking().await;
    let send = |body: &'static str| {
        let c = c.clone();
        let url = check.clone();
        async move {
            c.post(url)
                .header("content-type", "application/json")
                .body(body)
                .send()
                .await
                .unwrap()
        }
    };
    let cases: [(&str, &str); 10] = [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "must be a JSON object"),
        (r#"{"key": "k"}"#, "`policy` is missing"),
        (r#"{"policy": "api"}"#, "`key` is missing"),
        (r#"{"policy": 7, "key": "k"}"#, "`policy` must be a string"),
        (
            r#"{"policy": "api", "key": ""}"#,
            "`key` must be 1 to 512 bytes",
        ),
        (
            r#"{"policy": "api", "key": "k", "cost": -1}"#,
            "must not be negative",
        ),
        (
            r#"{"policy": "api", "key": "k", "cost": 1.5}"#,
            "whole number",
        ),
        (
            r#"{"policy": "api", "key": "k", "cost": 9007199254740993}"#,
            "too large",
        ),
        (
            r#"{"policy": "api", "key": "k", "weight": 1}"#,
            "unknown field `weight`",
        ),
    ];
    for (body, expected) in cases {
        let message = error_of(send(body).await, StatusCode::BAD_REQUEST).await;
        assert!(message.contains(expected), "{body}: {message}");
    }
    let long_key = json!({"policy": "api", "key": "k".repeat(513)});
    let message = error_of(post(&c, &check, long_key).await, StatusCode::BAD_REQUEST).await;
    assert!(message.contains("513 bytes"), "{message}");

    let message = error_of(
        post(&c, &check, json!({"policy": "nope", "key": "k"})).await,
        StatusCode::NOT_FOUND,
    )
    .await;
    assert!(
        message.contains("no policy named `nope`") && message.contains("api, search, uploads"),
        "{message}"
    );
    let r = s.delete(&c, "/v1/keys/nope/k").await;
    error_of(r, StatusCode::NOT_FOUND).await;
    error_of(s.get(&c, "/v2/check").await, StatusCode::NOT_FOUND).await;
    error_of(
        c.get(check.clone()).send().await.unwrap(),
        StatusCode::METHOD_NOT_ALLOWED,
    )
    .await;
    error_of(
        c.post(format!("{}/healthz", s.url)).send().await.unwrap(),
        StatusCode::METHOD_NOT_ALLOWED,
    )
    .await;
    let huge = format!(r#"{{"policy": "api", "key": "{}"}}"#, "k".repeat(70 * 1024));
    let r = support::send(c.post(check.clone()).body(huge)).await;
    error_of(r, StatusCode::PAYLOAD_TOO_LARGE).await;
    // Nothing above was counted.
    let r = s.post(&c, "/v1/peek", asking("api", "k", 0)).await;
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["remaining"], json!(3));
    s.stop().await;
}

/// What docs/openapi.json cannot say in JSON Schema, held here instead (scripts/schema-test
/// leaves these cases out): a key is bounded in bytes of UTF-8, not in characters, in a body
/// and in the path of DELETE /v1/keys; and a `null` cost, which the document declares
/// nullable, is a cost of 1.
#[tokio::test]
async fn a_key_is_bounded_in_bytes_and_a_null_cost_is_one() {
    let (s, c, check) = start_checking().await;
    // 256 two-byte characters: 512 bytes, accepted; 257: within the document's
    // `maxLength: 512` (characters) but 514 bytes, refused.
    let r = post(&c, &check, json!({"policy": "api", "key": "é".repeat(256)})).await;
    assert_eq!(r.status(), StatusCode::OK);
    let message = error_of(
        post(&c, &check, json!({"policy": "api", "key": "é".repeat(257)})).await,
        StatusCode::BAD_REQUEST,
    )
    .await;
    assert!(message.contains("514 bytes"), "{message}");
    let forget = |chars: usize| {
        c.delete(format!("{}/v1/keys/api/{}", s.url, "%C3%A9".repeat(chars)))
            .send()
    };
    assert_eq!(forget(256).await.unwrap().status(), StatusCode::NO_CONTENT);
    let message = error_of(forget(257).await.unwrap(), StatusCode::BAD_REQUEST).await;
    assert!(message.contains("512"), "{message}");

    let null_cost = json!({"policy": "api", "key": "n", "cost": null});
    let (status, body) = support::answer(c.post(&check).json(&null_cost), None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["cost"], json!(1));
    assert_eq!(body["remaining"], json!(2), "{body}");
    s.stop().await;
}

/// Polls until `cond` holds on `GET /v1/policies`.
async fn wait_for(s: &Server, what: &str, cond: impl Fn(&Value) -> bool) -> Value {
    support::poll_json(&format!("{}/v1/policies", s.url), what, cond).await
}

#[tokio::test]
async fn a_reload_applies_new_policies_and_a_bad_file_keeps_the_last_good_one() {
    let s = start(CONFIG).await;
    let c = Client::new();
    std::fs::write(
        &s.file,
        "policies:\n  fresh:\n    limits: [{ max: 1, per: 1m }]\n",
    )
    .unwrap();
    let p = wait_for(&s, "the new policy", |p| {
        p["config"]["generation"] == json!(2)
    })
    .await;
    assert_eq!(p["policies"][0]["name"], json!("fresh"));
    let r = s
        .post(&c, "/v1/check", json!({"policy": "fresh", "key": "k"}))
        .await;
    assert_eq!(r.status(), StatusCode::OK);
    let r = s
        .post(&c, "/v1/check", json!({"policy": "api", "key": "k"}))
        .await;
    assert_eq!(r.status(), StatusCode::NOT_FOUND, "the old policy is gone");

    std::fs::write(
        &s.file,
        "policies:\n  fresh:\n    limits: [{ max: 0, per: 1m }]\n",
    )
    .unwrap();
    let p = wait_for(&s, "the failed reload", |p| {
        p["config"]["last_reload_error"].is_string()
    })
    .await;
    let e = p["config"]["last_reload_error"].as_str().unwrap();
    assert!(e.contains("sluice.yaml:3:") && e.contains("max"), "{e}");
    assert_eq!(p["config"]["generation"], json!(2));
    let r = s
        .post(&c, "/v1/check", json!({"policy": "fresh", "key": "k"}))
        .await;
    assert_eq!(
        r.status(),
        StatusCode::TOO_MANY_REQUESTS,
        "the last good policy still counts"
    );
    s.stop().await;
}

#[tokio::test]
async fn shutdown_drains_in_flight_requests() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let s = start(CONFIG).await;
    // A request in flight: its head and half its body have been sent.
    let body = br#"{"policy": "api", "key": "in-flight"}"#;
    let mut stream = tokio::net::TcpStream::connect(s.url.trim_start_matches("http://"))
        .await
        .unwrap();
    let head = format!(
        "POST /v1/check HTTP/1.1\r\nhost: sluice\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(&body[..10]).await.unwrap();
    // Another full round trip: by then the server has read the first request's head.
    assert!(
        Client::new()
            .get(format!("{}/healthz", s.url))
            .send()
            .await
            .is_ok()
    );

    let base = s.url.clone();
    let stop = tokio::spawn(s.stop());
    // The rest of the body arrives after the shutdown began: the request is still answered.
    stream.write_all(&body[10..]).await.unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.contains(r#""allowed":true"#), "{answer}");
    stop.await.unwrap();
    assert!(
        Client::new()
            .get(format!("{base}/healthz"))
            .send()
            .await
            .is_err(),
        "still serving after stop"
    );
}

/// The served OpenAPI document lists exactly the routes the server answers: every documented
/// (path, method) is routed, and every other method on a documented path is refused with 405.
#[tokio::test]
async fn the_openapi_document_matches_the_routes() {
    let s = start(CONFIG).await;
    let c = Client::new();
    let r = s.get(&c, "/openapi.json").await;
    assert_eq!(r.status(), StatusCode::OK);
    let doc: Value = r.json().await.unwrap();
    let on_disk: Value = serde_json::from_str(
        &std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../docs/openapi.json"
        ))
        .unwrap(),
    )
    .unwrap();
    assert_eq!(doc, on_disk, "the served document is docs/openapi.json");
    let paths = doc["paths"].as_object().unwrap();
    let mut documented = Vec::new();
    for (path, ops) in paths {
        let concrete = path.replace("{policy}", "api").replace("{key}", "some/key");
        for method in ["get", "post", "put", "delete", "patch"] {
            let m = reqwest::Method::from_bytes(method.to_uppercase().as_bytes()).unwrap();
            let r = support::send(
                c.request(m, format!("{}{concrete}", s.url))
                    .json(&json!({"policy": "api", "key": "k"})),
            )
            .await;
            if ops.get(method).is_some() {
                documented.push(format!("{} {path}", method.to_uppercase()));
                assert!(
                    r.status() != StatusCode::NOT_FOUND
                        && r.status() != StatusCode::METHOD_NOT_ALLOWED,
                    "{method} {path} is documented but answered {}",
                    r.status()
                );
            } else {
                assert_eq!(
                    r.status(),
                    StatusCode::METHOD_NOT_ALLOWED,
                    "{method} {path} is not documented"
                );
            }
        }
    }
    documented.sort();
    let mut routes: Vec<String> = sluice_server::http::routes()
        .map(|(m, p)| format!("{m} {p}"))
        .collect();
    routes.sort();
    assert_eq!(
        documented, routes,
        "docs/openapi.json and the router disagree"
    );
    s.stop().await;
}

/// 1 000 malformed requests (random bytes, wrong types, huge numbers, huge keys, unknown
/// fields, odd paths and methods): never a 5xx, never a dropped connection, and the server
/// still serves correctly afterwards.
#[tokio::test]
async fn a_thousand_malformed_requests_get_no_5xx() {
    let s = start(CONFIG).await;
    let c = Client::new();
    let mut rng = 0x2545_F491_4F6C_DD1Du64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let values = [
        json!(null),
        json!(true),
        json!(-1),
        json!(1.5),
        json!(1e300),
        json!(u64::MAX),
        json!(9007199254740993u64),
        json!("x"),
        json!(""),
        json!([]),
        json!({}),
        json!("k".repeat(600)),
        json!("ключ🔑"),
        json!({"nested": [1, 2]}),
    ];
    let fields = ["policy", "key", "cost", "weight", "", "policy "];
    let mut statuses = std::collections::BTreeMap::new();
    for i in 0..1_000u32 {
        let kind = next() % 4;
        let path = [
            "/v1/check",
            "/v1/peek",
            "/v1/refund",
            "/v1/keys/api/x",
            "/v1/%ff",
            "/v1/check/",
        ][next() as usize % 6];
        let body: Vec<u8> = match kind {
            0 => (0..(next() % 300)).map(|_| next() as u8).collect(),
            1 => {
                let mut m = serde_json::Map::new();
                for _ in 0..(next() % 4) {
                    let f = fields[next() as usize % fields.len()];
                    m.insert(f.to_owned(), values[next() as usize % values.len()].clone());
                }
                serde_json::to_vec(&Value::Object(m)).unwrap()
            }
            2 => serde_json::to_vec(&json!({"policy": "api", "key": values[next() as usize % values.len()], "cost": values[next() as usize % values.len()]})).unwrap(),
            _ => format!(r#"{{"policy": "api", "key": "k{i}", "cost": {}{}}}"#, next(), "9".repeat((next() % 40) as usize)).into_bytes(),
        };
        let method = if next() % 8 == 0 {
            reqwest::Method::PUT
        } else {
            reqwest::Method::POST
        };
        let r = c
            .request(method, format!("{}{path}", s.url))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap_or_else(|e| panic!("request {i} got no answer: {e}"));
        assert!(
            !r.status().is_server_error(),
            "request {i} to {path}: {}",
            r.status()
        );
        *statuses.entry(r.status().as_u16()).or_insert(0) += 1;
    }
    println!("statuses: {statuses:?}");
    assert!(statuses.contains_key(&400), "{statuses:?}");
    let r = s
        .post(&c, "/v1/check", json!({"policy": "api", "key": "after"}))
        .await;
    assert_eq!(r.status(), StatusCode::OK, "the server still serves");
    s.stop().await;
}

/// The same API over the Redis store (a real redis-server from the test kit): a full window,
/// the 429, readiness, and readiness failing while the primary is stalled.
#[tokio::test]
async fn the_api_over_a_redis_store() {
    let closed = CONFIG.replace("  uploads:\n", "  uploads:\n    on_store_error: closed\n");
    let Some((redis, config)) = support::with_redis(&format!("{closed}\n"), "200ms") else {
        return;
    };
    let s = start(&config).await;
    let c = Client::new();
    let url = format!("{}/v1/check", s.url);
    for expected in [2, 1, 0] {
        let r = post(&c, &url, json!({"policy": "api", "key": "user:1"})).await;
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(
            header(&r, "x-ratelimit-remaining"),
            Some(expected.to_string())
        );
    }
    let r = post(&c, &url, json!({"policy": "api", "key": "user:1"})).await;
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(header(&r, "retry-after").is_some());
    // The state lives in Redis (a counter: the margin of 1 s in its name).
    let used = redis
        .cmd(&["GET", "sluice:{3:api:user:1}:fw3600000:c1000"])
        .unwrap();
    assert_eq!(
        used,
        sluice_testkit::redis::Value::BulkString(b"3".to_vec())
    );
    let r = s.get(&c, "/readyz").await;
    assert_eq!(r.status(), StatusCode::OK);

    redis.pause().unwrap();
    let r = s.get(&c, "/readyz").await;
    let status = r.status();
    let body: Value = r.json().await.unwrap();
    // The default failure mode is open: a check is allowed and marked degraded.
    let d: Value = post(&c, &url, json!({"policy": "api", "key": "user:2"}))
        .await
        .json()
        .await
        .unwrap();
    // A policy that fails closed answers 503 instead.
    let closed = post(&c, &url, json!({"policy": "uploads", "key": "user:2"})).await;
    let closed_status = closed.status();
    let closed_message = closed.json::<Value>().await.unwrap()["error"]["message"].to_string();
    redis.resume().unwrap();
    assert_eq!(closed_status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(closed_message.contains("fails closed"), "{closed_message}");
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("shard 0"),
        "{body}"
    );
    assert_eq!(d["allowed"], json!(true));
    assert_eq!(d["degraded"], json!(true));
    s.stop().await;
}

#[tokio::test]
async fn metrics_count_decisions_by_policy_and_outcome_never_by_key() {
    let s = start(&CONFIG.replace("api:", "metered:")).await;
    let c = Client::new();
    let url = format!("{}/v1/check", s.url);
    for i in 0..5 {
        post(
            &c,
            &url,
            json!({"policy": "metered", "key": format!("secret-key-{i}")}),
        )
        .await;
        post(
            &c,
            &url,
            json!({"policy": "metered", "key": "secret-key-0"}),
        )
        .await;
    }
    let r = s.get(&c, "/metrics").await;
    assert_eq!(r.status(), StatusCode::OK);
    assert!(
        header(&r, "content-type")
            .unwrap()
            .starts_with("text/plain")
    );
    let text = r.text().await.unwrap();
    // The sample whose labels include all of `labels` (label order is the exporter's).
    let value = |labels: &[&str]| -> f64 {
        text.lines()
            .find(|l| {
                l.starts_with("sluice_decisions_total{") && labels.iter().all(|x| l.contains(x))
            })
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0)
    };
    let metered = [r#"policy="metered""#, r#"op="check""#];
    // Keys 0 (3 admitted, then denied) .. 4: 7 allowed, 3 denied.
    assert_eq!(
        value(&[metered[0], metered[1], r#"outcome="allowed""#]),
        7.0,
        "{text}"
    );
    assert_eq!(
        value(&[metered[0], metered[1], r#"outcome="denied""#]),
        3.0,
        "{text}"
    );
    assert!(
        text.contains("sluice_decision_latency_seconds_bucket"),
        "{text}"
    );
    assert!(!text.contains("secret-key"), "a key leaked into a label");
    s.stop().await;
}

/// Two client-side shards: keys spread over both, and `/readyz` names the shard that stalls.
#[tokio::test]
async fn two_redis_shards_and_readiness_per_shard() {
    let (Some(a), Some(b)) = (support::redis(), support::redis()) else {
        return;
    };
    let config = format!(
        "{CONFIG}\nstore:\n  backend: redis\n  shards:\n    - primary: {}\n    - primary: {}\n  timeout: 200ms\n",
        a.url(),
        b.url()
    );
    let s = start(&config).await;
    let c = Client::new();
    for k in 0..40 {
        let r = s
            .post(
                &c,
                "/v1/check",
                json!({"policy": "api", "key": format!("k{k}")}),
            )
            .await;
        assert_eq!(r.status(), StatusCode::OK);
    }
    let keys_on = |server: &sluice_testkit::RedisServer| match server.cmd(&["DBSIZE"]).unwrap() {
        sluice_testkit::redis::Value::Int(n) => n,
        other => panic!("{other:?}"),
    };
    let (on_a, on_b) = (keys_on(&a), keys_on(&b));
    // Each check writes the policy's two limit keys on the key's one shard.
    assert_eq!(on_a + on_b, 80);
    assert!(on_a > 10 && on_b > 10, "uneven: {on_a} / {on_b}");

    b.pause().unwrap();
    let r = s.get(&c, "/readyz").await;
    let status = r.status();
    let body: Value = r.json().await.unwrap();
    b.resume().unwrap();
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("shard 1") && message.contains(&b.url()),
        "{message}"
    );
    assert!(!message.contains("shard 0"), "{message}");
    s.stop().await;
}

/// With an `admin` section, what changes or reveals state needs a bearer token from it;
/// checks and peeks stay open. `/metrics` joins the admin routes with `protect_metrics`.
#[tokio::test]
async fn admin_routes_need_a_bearer_token() {
    let config =
        format!("{CONFIG}\nadmin:\n  tokens_file: secrets/admin\n  protect_metrics: true\n");
    let s = Server::start(&config, &[("secrets/admin", &format!("# ops\n{TOKEN}\n"))]).await;
    let c = Client::new();
    let body = json!({"policy": "api", "key": "user:1"});
    let check = post(&c, &format!("{}/v1/check", s.url), body.clone()).await;
    assert_eq!(check.status(), StatusCode::OK);
    let peek = post(&c, &format!("{}/v1/peek", s.url), body.clone()).await;
    assert_eq!(peek.status(), StatusCode::OK);

    let routes = [
        (reqwest::Method::POST, "/v1/refund"),
        (reqwest::Method::DELETE, "/v1/keys/api/user:1"),
        (reqwest::Method::GET, "/v1/policies"),
        (reqwest::Method::GET, "/metrics"),
    ];
    for (method, path) in &routes {
        for auth in [None, Some("Bearer wrong-token-0123456789"), Some(TOKEN)] {
            let mut req = c.request(method.clone(), format!("{}{path}", s.url));
            if *method == reqwest::Method::POST {
                req = req.json(&body);
            }
            if let Some(a) = auth {
                req = req.header("authorization", a);
            }
            let r = support::send(req).await;
            assert_eq!(
                r.status(),
                StatusCode::UNAUTHORIZED,
                "{method} {path} {auth:?}"
            );
            assert_eq!(
                header(&r, "www-authenticate").as_deref(),
                Some("Bearer realm=\"sluice-admin\"")
            );
            let e: Value = r.json().await.unwrap();
            assert_eq!(e["error"]["code"], "unauthorized");
            assert!(!e.to_string().contains(TOKEN));
        }
        let mut req = c
            .request(method.clone(), format!("{}{path}", s.url))
            .bearer_auth(TOKEN);
        if *method == reqwest::Method::POST {
            req = req.json(&body);
        }
        let r = support::send(req).await;
        assert!(r.status().is_success(), "{method} {path}: {}", r.status());
    }
    // The admin calls took effect (refund, then forget): the key is whole again.
    let whole = asking("api", "user:1", 0);
    let d: Value = s.post(&c, "/v1/peek", whole).await.json().await.unwrap();
    assert_eq!(d["remaining"], 3);
    s.stop().await;
}

/// RFC 9110 §11.1: an authentication scheme is case-insensitive. `Authorization: bearer
/// <token>` got a 401; every spelling of the scheme is accepted now, and a wrong scheme is not.
#[tokio::test]
async fn the_admin_scheme_is_case_insensitive() {
    let s = with_admin("").await;
    let c = Client::new();
    let policies = format!("{}/v1/policies", s.url);
    for scheme in ["Bearer", "bearer", "BEARER", "BeArEr"] {
        for value in [format!("{scheme} {TOKEN}"), format!("{scheme}   {TOKEN}")] {
            let r = support::send(c.get(&policies).header("authorization", &value)).await;
            assert_eq!(r.status(), StatusCode::OK, "{value:?}");
        }
    }
    for value in [
        format!("Basic {TOKEN}"),
        format!("Token {TOKEN}"),
        format!("Bearer{TOKEN}"),
        TOKEN.to_owned(),
    ] {
        let r = support::send(c.get(&policies).header("authorization", &value)).await;
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED, "{value:?}");
    }
    s.stop().await;
}

/// Found by the `http::raw` fuzz target: a percent-escape in the path that is not UTF-8 got
/// axum's plain-text 400 instead of a JSON error.
#[tokio::test]
async fn a_path_that_is_not_utf8_is_a_json_error() {
    let s = start(CONFIG).await;
    let c = Client::new();
    for path in ["/v1/keys/api/%ff", "/v1/keys/s%e9arch/k"] {
        let r = support::send(c.delete(format!("{}{path}", s.url))).await;
        let message = error_of(r, StatusCode::BAD_REQUEST).await;
        assert!(message.contains("UTF-8"), "{path}: {message}");
    }
    s.stop().await;
}

/// A token bucket's limit is its burst: the most a fresh key can spend at once. With
/// `100 per 1m, burst 20`, a fresh key reported limit 100, remaining 20 and used 80, and
/// `q=100` beside `r=20`. Now limit, remaining and used agree, in the headers and the body,
/// and the IETF policy is the burst over the time it takes to refill (20 per 12 s).
#[tokio::test]
async fn a_token_bucket_reports_its_burst_as_the_limit() {
    let s = start(CONFIG).await;
    let c = Client::new();
    let fresh = asking("uploads", "fresh", 0);
    let r = s.post(&c, "/v1/peek", fresh).await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_headers(
        &r,
        &[
            ("x-ratelimit-limit", "20"),
            ("x-ratelimit-remaining", "20"),
            ("x-ratelimit-used", "0"),
            ("ratelimit-policy", r#""uploads:0";q=20;w=12"#),
            ("ratelimit", r#""uploads:0";r=20;t=0"#),
        ],
    );
    let body: Value = r.json().await.unwrap();
    assert_eq!(
        (&body["limit"], &body["remaining"]),
        (&json!(20), &json!(20))
    );
    assert_eq!(
        (&body["limits"][0]["max"], &body["limits"][0]["burst"]),
        (&json!(100), &json!(20))
    );

    let r = s.post(&c, "/v1/check", asking("uploads", "fresh", 3)).await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_headers(
        &r,
        &[
            ("x-ratelimit-limit", "20"),
            ("x-ratelimit-remaining", "17"),
            ("x-ratelimit-used", "3"),
            // Three tokens come back in 1.8 s.
            ("ratelimit", r#""uploads:0";r=17;t=2"#),
        ],
    );
    s.stop().await;
}

/// A JSON body naming a field twice was read with the last value (`{"cost": 1,
/// "cost": 500}` costs 500). It is refused, naming the field, before anything is decided.
#[tokio::test]
async fn a_body_naming_a_field_twice_is_refused() {
    let s = start(CONFIG).await;
    let c = Client::new();
    for (path, body, field) in [
        (
            "/v1/check",
            r#"{"policy": "api", "key": "k", "cost": 1, "cost": 3}"#,
            "cost",
        ),
        (
            "/v1/peek",
            r#"{"policy": "api", "policy": "search", "key": "k"}"#,
            "policy",
        ),
        (
            "/v1/refund",
            r#"{"key": "k", "policy": "api", "key": "j"}"#,
            "key",
        ),
    ] {
        let r = support::send(c.post(format!("{}{path}", s.url)).body(body)).await;
        let m = error_of(r, StatusCode::BAD_REQUEST).await;
        assert!(
            m.contains(&format!("`{field}` is given twice")),
            "{path}: {m}"
        );
    }
    // Nothing was charged by the refused check.
    let r = s.post(&c, "/v1/check", asking("api", "k", 3)).await;
    assert_eq!(r.status(), StatusCode::OK);
    s.stop().await;
}

/// A reload whose file lost its `admin` section would open every admin route to anyone: it is
/// refused (like one that empties the policies), the tokens keep guarding, and the reason is
/// in `/v1/stats`.
#[tokio::test]
async fn a_reload_that_drops_the_admin_section_is_refused() {
    let s = with_admin("").await;
    let c = Client::new();
    std::fs::write(&s.file, CONFIG).unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let error = loop {
        let stats = support::json(c.get(format!("{}/v1/stats", s.url)).bearer_auth(TOKEN)).await;
        assert_eq!(stats["config"]["generation"], 1, "the reload was applied");
        if let Some(error) = stats["config"]["last_reload_error"].as_str() {
            break error.to_owned();
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the reload was neither refused nor applied: {stats}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(error.contains("no admin section"), "{error}");
    let r = s.get(&c, "/v1/policies").await;
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    s.stop().await;
}

/// `/metrics` tells the policies (`sluice_limit_max{policy=…}`): with an `admin` section it
/// needs a token by default, like `/v1/policies`; `protect_metrics: false` opens it for a
/// scraper without one.
#[tokio::test]
async fn with_an_admin_section_metrics_need_a_token_unless_opened() {
    let c = Client::new();
    for (extra, open) in [("", false), ("  protect_metrics: false\n", true)] {
        let s = with_admin(extra).await;
        let r = s.get(&c, "/metrics").await;
        let expected = if open {
            StatusCode::OK
        } else {
            StatusCode::UNAUTHORIZED
        };
        assert_eq!(r.status(), expected, "{extra:?}");
        let r = support::send(c.get(format!("{}/metrics", s.url)).bearer_auth(TOKEN)).await;
        assert_eq!(r.status(), StatusCode::OK);
        assert!(r.text().await.unwrap().contains("sluice_limit_max{"));
        s.stop().await;
    }
}

/// Without an `admin` section, a page on another site could make a visitor's browser refund
/// or forget keys (a `text/plain` POST needs no preflight). A browser's cross-site request
/// to a route that changes state is refused (`403 cross_site`): an `Origin` that is not the
/// request's own host, or `Sec-Fetch-Site: cross-site`. `curl -d` (no `Origin`, a form content
/// type), a same-origin page, and a page behind a proxy that rewrites `Host` (its browser says
/// `same-origin`) are answered.
#[tokio::test]
async fn a_cross_site_browser_request_that_changes_state_is_refused() {
    let s = start(CONFIG).await;
    let c = Client::new();
    let body = r#"{"policy": "api", "key": "victim"}"#;
    let host = s.url.trim_start_matches("http://").to_owned();
    let send = |path: &str, content_type: &str, headers: &[(&str, &str)]| {
        let mut req = c
            .post(format!("{}{path}", s.url))
            .header("content-type", content_type.to_owned())
            .body(body);
        for (name, value) in headers {
            req = req.header(*name, *value);
        }
        req.send()
    };
    for headers in [
        vec![("origin", "https://evil.example")],
        vec![("origin", "null")],
        vec![("sec-fetch-site", "cross-site")],
        vec![
            ("origin", "https://evil.example"),
            ("sec-fetch-site", "cross-site"),
        ],
    ] {
        for path in ["/v1/refund", "/v1/check"] {
            let r = send(path, "text/plain", &headers).await.unwrap();
            assert_eq!(r.status(), StatusCode::FORBIDDEN, "{path} {headers:?}");
            let e: Value = r.json().await.unwrap();
            assert_eq!(e["error"]["code"], "cross_site", "{e}");
        }
    }
    let forget = support::send(
        c.delete(format!("{}/v1/keys/api/victim", s.url))
            .header("origin", "https://evil.example"),
    )
    .await;
    assert_eq!(forget.status(), StatusCode::FORBIDDEN);

    let own = format!("http://{host}");
    for headers in [
        vec![],
        vec![("origin", own.as_str())],
        vec![("origin", own.as_str()), ("sec-fetch-site", "same-origin")],
        vec![
            ("origin", "https://sluice.example"),
            ("sec-fetch-site", "same-origin"),
        ],
    ] {
        let r = send("/v1/refund", "application/x-www-form-urlencoded", &headers)
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::OK, "{headers:?}");
    }
    // Reading is not refused: the answer does not reach another site's page without CORS.
    let r = support::send(
        c.get(format!("{}/healthz", s.url))
            .header("origin", "https://evil.example"),
    )
    .await;
    assert_eq!(r.status(), StatusCode::OK);
    s.stop().await;
}
