//! `GET /v1/stats` and `GET /v1/stats/history`: what the dashboard polls, bounded whatever the
//! keys: Envoy rules grouped with their heaviest detailed keys, the reload history, the
//! per-second history, and top keys read back into descriptor entries.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::support::{self, descriptor};

/// `top.capacity` above the 1,500 keys: the summaries are exact.
const CONFIG: &str = "top:\n  capacity: 2048\n  window: 1m\npolicies:\n  api:\n    limits:\n      - { max: 3, per: 1h }\nrls:\n  config_dir: ratelimit-config\n";
/// A detailed rule (one statistics key per address) and a plain one.
const RLS_YAML: &str = "domain: bench\ndescriptors:\n  - key: remote_address\n    detailed_metric: true\n    rate_limit: {unit: hour, requests_per_unit: 1000}\n  - key: generic_key\n    value: api\n    descriptors:\n      - key: path\n        rate_limit: {unit: hour, requests_per_unit: 1}\n";

async fn get(url: &str) -> (StatusCode, Value, usize) {
    let r = reqwest::get(url).await.unwrap();
    let status = r.status();
    let text = r.text().await.unwrap();
    (status, serde_json::from_str(&text).unwrap(), text.len())
}

/// Sends `descriptors` to the bench domain, 50 to a request.
async fn send(s: &support::TestServer, descriptors: Vec<RateLimitDescriptor>) {
    let mut rls = RateLimitServiceClient::new(s.channel().await);
    for chunk in descriptors.chunks(50) {
        rls.should_rate_limit(RateLimitRequest {
            domain: "bench".to_owned(),
            descriptors: chunk.to_vec(),
            hits_addend: 0,
        })
        .await
        .unwrap();
    }
}

fn address(i: usize) -> String {
    format!("10.0.{}.{}", i / 256, i % 256)
}

#[tokio::test]
async fn rules_are_grouped_with_their_heaviest_detailed_keys_and_bounded_in_size() {
    let s = support::TestServer::start(CONFIG, &[("ratelimit-config/bench.yaml", RLS_YAML)]).await;
    // 1,500 addresses once each, one of them 4 more times, and two paths of the plain rule
    // (the second check of /a is over its limit of 1).
    let mut descriptors: Vec<RateLimitDescriptor> = (0..1_500)
        .map(|i| descriptor(&[("remote_address", &address(i))]))
        .collect();
    for _ in 0..4 {
        descriptors.push(descriptor(&[("remote_address", "10.0.0.7")]));
    }
    send(&s, descriptors).await;
    for path in ["/a", "/a", "/b"] {
        send(
            &s,
            vec![descriptor(&[("generic_key", "api"), ("path", path)])],
        )
        .await;
    }

    let (status, stats, bytes) = get(&format!("{}/v1/stats", s.url)).await;
    assert_eq!(status, StatusCode::OK, "{stats}");
    // The response stays small whatever the keys: 1,500 detailed keys, under 16 KB.
    assert!(bytes < 16 * 1024, "{bytes} bytes");
    eprintln!("/v1/stats with 1,500 detailed keys: {bytes} bytes");
    // 34 ShouldRateLimit calls in the last minute, no HTTP decision.
    let latency = &stats["latency"];
    assert_eq!(latency["window_s"], 60);
    assert_eq!(
        latency["decision"]["http"],
        json!({"count": 0}),
        "{latency}"
    );
    let grpc = &latency["decision"]["grpc"];
    assert_eq!(grpc["count"], 34, "{latency}");
    let (p50, p99) = (
        grpc["p50_ms"].as_f64().unwrap(),
        grpc["p99_ms"].as_f64().unwrap(),
    );
    assert!(p50 > 0.0 && p99 >= p50, "{latency}");
    // The memory store has no shards, so no call latency or replicas.
    assert_eq!(stats["store"]["shards"], json!([]));
    // Not a regions store: no other region to show.
    assert_eq!(stats["regions"], json!([]), "{stats}");
    // Configured policies only, a policy with no check yet included.
    assert_eq!(
        stats["policies"],
        json!({"api": {"allowed": 0, "denied": 0, "degraded": 0, "errors": 0}})
    );
    let rules = stats["rules"].as_array().unwrap();
    assert_eq!(rules.len(), 2, "{stats}");
    let plain = &rules[0];
    assert_eq!(
        (&plain["domain"], &plain["rule"]),
        (&json!("bench"), &json!("generic_key_api.path"))
    );
    assert_eq!(
        plain["counts"],
        json!({"allowed": 2, "denied": 1, "degraded": 0, "errors": 0})
    );
    assert_eq!(plain["keys_total"], 0);
    assert_eq!(plain["keys"], json!([]));
    let detailed = &rules[1];
    assert_eq!(detailed["rule"], "remote_address");
    assert_eq!(detailed["keys_total"], 1_500);
    assert_eq!(detailed["counts"]["allowed"], 1_504);
    let keys = detailed["keys"].as_array().unwrap();
    assert_eq!(keys.len(), 10, "ten by default");
    assert_eq!(
        keys[0],
        json!({"entries": [{"key": "remote_address", "value": "10.0.0.7"}],
               "counts": {"allowed": 5, "denied": 0, "degraded": 0, "errors": 0}})
    );

    // ?keys= bounds the list: 0 lists none (the totals stay), 100 at most.
    let (_, none, _) = get(&format!("{}/v1/stats?keys=0", s.url)).await;
    assert_eq!(none["rules"][1]["keys"], json!([]));
    assert_eq!(none["rules"][1]["keys_total"], 1_500);
    let (_, most, bytes) = get(&format!("{}/v1/stats?keys=100", s.url)).await;
    assert_eq!(most["rules"][1]["keys"].as_array().unwrap().len(), 100);
    assert!(bytes < 16 * 1024, "{bytes} bytes with 100 keys");
    for bad in ["keys=101", "keys=-1", "keys=ten", "keys="] {
        let (status, e, _) = get(&format!("{}/v1/stats?{bad}", s.url)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}: {e}");
        let message = e["error"]["message"].as_str().unwrap();
        assert!(message.contains("`keys`"), "{bad}: {message}");
    }
    let (status, e, _) = get(&format!("{}/v1/stats?key=3", s.url)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{e}");
    assert!(e["error"]["message"].as_str().unwrap().contains("`key`"));

    // Top keys of the detailed rule, asked under the rule: every address, each with its
    // descriptor entries instead of the internal counter key alone.
    let (status, top, _) = get(&format!(
        "{}/v1/top?policy=bench.remote_address&by=used&limit=3",
        s.url
    ))
    .await;
    assert_eq!(status, StatusCode::OK, "{top}");
    let first = &top["keys"][0];
    assert_eq!(first["key"], "bench_remote_address_10.0.0.7_", "{top}");
    assert_eq!(
        (&first["count"], &first["error"]),
        (&json!(5), &json!(0)),
        "{top}"
    );
    assert_eq!(
        first["entries"],
        json!([{"key": "remote_address", "value": "10.0.0.7"}])
    );
    let (_, top, _) = get(&format!(
        "{}/v1/top?policy=bench.generic_key_api.path&by=denied",
        s.url
    ))
    .await;
    assert_eq!(
        top["keys"][0]["entries"],
        json!([{"key": "generic_key", "value": "api"}, {"key": "path", "value": "/a"}]),
        "{top}"
    );
    s.stop().await;
}

async fn stats(s: &support::TestServer) -> Value {
    get(&format!("{}/v1/stats", s.url)).await.1
}

/// Polls `/v1/stats` until `cond` holds.
async fn wait_for(s: &support::TestServer, what: &str, cond: impl Fn(&Value) -> bool) -> Value {
    support::poll_json(&format!("{}/v1/stats", s.url), what, cond).await
}

#[tokio::test]
async fn reloads_are_listed_newest_first_and_removed_policies_lose_their_top_keys() {
    let s = support::TestServer::start(CONFIG, &[("ratelimit-config/bench.yaml", RLS_YAML)]).await;
    let c = reqwest::Client::new();
    for _ in 0..5 {
        support::check(&c, &s, "api", "hot").await;
    }
    let (status, _, _) = get(&format!("{}/v1/top?policy=api", s.url)).await;
    assert_eq!(status, StatusCode::OK);
    let v = stats(&s).await;
    let reloads = v["reloads"].as_array().unwrap();
    assert_eq!(reloads.len(), 1, "{v}");
    assert_eq!(
        (
            &reloads[0]["source"],
            &reloads[0]["generation"],
            &reloads[0]["ok"]
        ),
        (&json!("start"), &json!(1), &json!(true))
    );

    // A good reload without `api`, then a bad one.
    std::fs::write(
        &s.file,
        "policies:\n  fresh:\n    limits: [{ max: 1, per: 1m }]\nrls:\n  config_dir: ratelimit-config\n",
    )
    .unwrap();
    wait_for(&s, "the good reload", |v| v["config"]["generation"] == 2).await;
    // The removed policy's heavy hitters went with it.
    let (status, e, _) = get(&format!("{}/v1/top?policy=api", s.url)).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{e}");
    std::fs::write(
        &s.file,
        "policies:\n  fresh:\n    limits: [{ max: 0, per: 1m }]\n",
    )
    .unwrap();
    let v = wait_for(&s, "the bad reload", |v| {
        v["reloads"].as_array().unwrap().len() == 3
    })
    .await;
    let reloads = v["reloads"].as_array().unwrap();
    assert_eq!(
        support::columns(&v["reloads"], &["source", "generation", "ok"]),
        [
            json!(["file", 2, false]),
            json!(["file", 2, true]),
            json!(["start", 1, true])
        ]
    );
    let error = reloads[0]["error"].as_str().unwrap();
    assert!(error.contains("max"), "{error}");
    assert!(reloads[1].get("error").is_none(), "{v}");
    let at: Vec<u64> = reloads
        .iter()
        .map(|r| r["at_ms"].as_u64().unwrap())
        .collect();
    assert!(at[0] >= at[1] && at[1] >= at[2], "{at:?}");
    assert_eq!(
        v["policies"],
        json!({"fresh": {"allowed": 0, "denied": 0, "degraded": 0, "errors": 0}})
    );
    s.stop().await;
}

async fn get_history(url: &str, query: &str) -> Value {
    let (status, h, _) = get(&format!("{url}/v1/stats/history{query}")).await;
    assert_eq!(status, StatusCode::OK, "{h}");
    h
}

/// The history on the server's manual clock: each second holds the checks made in it, for the
/// configured policy and for the Envoy rule (its detailed keys summed), an hour at most.
#[tokio::test]
async fn the_history_holds_each_seconds_checks_for_an_hour() {
    let start_ms = 1_800_000_000_000;
    let clock = sluice::ManualClock::new(start_ms);
    let s = support::TestServer::start_with_clock(
        CONFIG,
        &[("ratelimit-config/bench.yaml", RLS_YAML)],
        clock.clone(),
    )
    .await;
    let c = reqwest::Client::new();
    let check = || {
        c.post(format!("{}/v1/check", s.url))
            .json(&json!({"policy": "api", "key": "k"}))
            .send()
    };
    // A reading samples the counts first: this one is the starting point, at second 0.
    let history = |q: &'static str| get_history(&s.url, q);
    history("").await;
    // Second 0: 2 checks of api and 3 detailed keys.
    for _ in 0..2 {
        check().await.unwrap();
    }
    send(
        &s,
        (0..3)
            .map(|i| descriptor(&[("remote_address", &address(i))]))
            .collect(),
    )
    .await;
    clock.advance(1_000);
    history("").await;
    // Second 1: nothing. Second 2: 3 checks of api (1 admitted, 2 over its limit of 3) and
    // one key twice. (The counts go to the second before the sample that finds them; the
    // clock moves on only once they are made; and second 2 is sampled before they are made,
    // so the server's own once-a-second sample, which skips a second already sampled, cannot
    // take them at second 2 and give them to second 1.)
    clock.advance(1_000);
    history("").await;
    for _ in 0..3 {
        check().await.unwrap();
    }
    send(
        &s,
        vec![
            descriptor(&[("remote_address", "10.0.0.1")]),
            descriptor(&[("remote_address", "10.0.0.1")]),
        ],
    )
    .await;
    clock.advance(1_000);

    let (status, h, _) = get(&format!("{}/v1/stats/history?seconds=4", s.url)).await;
    assert_eq!(status, StatusCode::OK, "{h}");
    assert_eq!(h["end_ms"], start_ms + 3_000, "{h}");
    assert_eq!(h["step_s"], 1);
    assert_eq!(
        h["series"]["api"],
        json!({"allowed": [0, 2, 0, 1], "denied": [0, 0, 0, 2], "degraded": [0, 0, 0, 0]}),
        "{h}"
    );
    assert_eq!(
        h["series"]["bench/remote_address"]["allowed"],
        json!([0, 3, 0, 2]),
        "{h}"
    );
    assert_eq!(h["series"].as_object().unwrap().len(), 2, "{h}");

    // An hour by default, never more; out of range is a 400 naming `seconds`.
    let (_, h, _) = get(&format!("{}/v1/stats/history", s.url)).await;
    let allowed = h["series"]["api"]["allowed"].as_array().unwrap();
    assert_eq!(allowed.len(), 3_600);
    assert_eq!(allowed[3_600 - 3], 2);
    assert_eq!(allowed[3_600 - 1], 1);
    for bad in ["seconds=0", "seconds=3601", "seconds=x"] {
        let (status, e, _) = get(&format!("{}/v1/stats/history?{bad}", s.url)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}: {e}");
        assert!(
            e["error"]["message"]
                .as_str()
                .unwrap()
                .contains("`seconds`"),
            "{e}"
        );
    }
    // Two hours on, the old seconds are gone.
    clock.advance(7_200_000);
    let (_, h, _) = get(&format!("{}/v1/stats/history", s.url)).await;
    let api = &h["series"]["api"];
    assert!(
        api["allowed"].as_array().unwrap().iter().all(|n| n == 0),
        "{api}"
    );
    s.stop().await;
}

/// An RLQS stream is listed, with its domain, peer and buckets, while it is open, and is gone
/// once it ends.
#[tokio::test]
async fn open_rlqs_streams_are_listed_with_their_buckets() {
    use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_client::RateLimitQuotaServiceClient;
    use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
    use envoy_types::pb::envoy::service::rate_limit_quota::v3::{
        BucketId, RateLimitQuotaUsageReports,
    };
    let config = "policies:\n  tenants:\n    limits:\n      - { max: 100, per: 1m }\nrlqs:\n  buckets:\n    - match: { tenant: \"*\" }\n      policy: tenants\n      key: \"tenant:{tenant}\"\n";
    let s = support::TestServer::start(config, &[]).await;
    let v = stats(&s).await;
    assert_eq!(v["rlqs"], json!({"streams": [], "buckets_total": 0}), "{v}");

    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let mut client = RateLimitQuotaServiceClient::new(s.channel().await);
    let mut answers = client
        .stream_rate_limit_quotas(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    let usage = |tenant: &str| BucketQuotaUsage {
        bucket_id: Some(BucketId {
            bucket: [("tenant".to_owned(), tenant.to_owned())].into(),
        }),
        num_requests_allowed: 1,
        ..BucketQuotaUsage::default()
    };
    tx.send(RateLimitQuotaUsageReports {
        domain: "mesh".to_owned(),
        bucket_quota_usages: vec![usage("a"), usage("b"), usage("c")],
    })
    .await
    .unwrap();
    // The answer comes after the stream's entry is updated.
    answers.message().await.unwrap().unwrap();
    let v = stats(&s).await;
    let streams = v["rlqs"]["streams"].as_array().unwrap();
    assert_eq!(streams.len(), 1, "{v}");
    assert_eq!(
        (&streams[0]["domain"], &streams[0]["buckets"]),
        (&json!("mesh"), &json!(3)),
        "{v}"
    );
    assert!(
        streams[0]["peer"]
            .as_str()
            .unwrap()
            .starts_with("127.0.0.1:"),
        "{v}"
    );
    assert!(streams[0]["opened_ms"].as_u64().unwrap() > 0);
    assert_eq!(v["rlqs"]["buckets_total"], 3);

    // The client closes its side: the stream ends and is no longer listed.
    drop(tx);
    assert!(answers.message().await.unwrap().is_none());
    wait_for(&s, "the stream to be gone", |v| {
        v["rlqs"]["streams"] == json!([])
    })
    .await;
    s.stop().await;
}
