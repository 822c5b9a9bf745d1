//! The policy playground: simulations through the real limiter on a manual clock give the
//! results the algorithms imply (docs/algorithms.md), reproducibly; logs are read into the
//! expected per-key counts; `POST /v1/simulate` answers them over HTTP, refuses every bound
//! and malformed input with a 400 naming it, and is an admin route.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use reqwest::StatusCode;
use serde_json::{Value, json};
use sluice_simulate::{Bounds, Report, SimError, Simulation};

use crate::support;

fn simulate(request: Value) -> Result<Report, SimError> {
    Simulation::from_request(&request, &[], &Bounds::default())?.run()
}

fn steady(rate: f64, duration: &str) -> Value {
    json!({"pattern": "steady", "rate": rate, "duration": duration})
}

#[test]
fn a_fixed_window_admits_its_max_then_denies_until_the_window_closes() {
    let r = simulate(json!({
        "policies": [{"name": "fixed", "limits": [{"max": 100, "per": "1m"}]}],
        "traffic": steady(2.0, "60s"),
    }))
    .unwrap();
    assert_eq!((r.events, r.keys, r.bucket_ms), (120, 1, 1_000));
    let p = &r.policies[0];
    assert_eq!((p.admitted, p.denied), (100, 20));
    assert_eq!(p.first_denial_ms, Some(50_000));
    assert_eq!(p.limits, vec!["100/1m fixed_window"]);
    // Denied at 50.0 s … 59.5 s, each told to wait for the window's end at 60 s:
    // 10 000, 9 500, … 500 ms.
    let ra = p.retry_after_ms.unwrap();
    assert_eq!(
        (ra.p50, ra.p90, ra.p99, ra.max),
        (5_000, 9_000, 10_000, 10_000)
    );
    assert_eq!(p.buckets.len(), 60);
    for b in &p.buckets {
        let expected = if b.start_ms < 50_000 { (2, 0) } else { (0, 2) };
        assert_eq!((b.admitted, b.denied), expected, "{b:?}");
    }
    assert_eq!(p.top_keys.len(), 1);
    assert_eq!(
        (
            p.top_keys[0].key.as_str(),
            p.top_keys[0].admitted,
            p.top_keys[0].denied
        ),
        ("key-1", 100, 20)
    );
}

#[test]
fn a_token_bucket_spends_its_burst_then_admits_its_refill_rate() {
    // 60 per minute (a token a second) with a burst of 10, under 2 requests a second: the
    // bucket drains by one token a second from 10, so requests 0…18 (up to 9 s) pass, the
    // one at 9.5 s is refused, and from then on exactly one a second passes (at 10 s, 11 s,
    // … 59 s): 19 + 50 admitted.
    let r = simulate(json!({
        "policies": [{"name": "bucket", "limits": [
            {"max": 60, "per": "1m", "algorithm": "token_bucket", "burst": 10}]}],
        "traffic": steady(2.0, "60s"),
    }))
    .unwrap();
    let p = &r.policies[0];
    assert_eq!((p.admitted, p.denied), (69, 51));
    assert_eq!(p.first_denial_ms, Some(9_500));
    // Every refusal is half a second before the next token.
    let ra = p.retry_after_ms.unwrap();
    assert_eq!((ra.p50, ra.max), (500, 500));

    // Bursts of 20 every 10 s: each burst finds a full bucket of 10.
    let r = simulate(json!({
        "policies": [{"name": "bucket", "limits": [
            {"max": 60, "per": "1m", "algorithm": "token_bucket", "burst": 10}]}],
        "traffic": {"pattern": "bursts", "size": 20, "every": "10s", "duration": "60s"},
    }))
    .unwrap();
    let p = &r.policies[0];
    assert_eq!((p.admitted, p.denied), (60, 60));
    assert_eq!(p.first_denial_ms, Some(0));
    let ra = p.retry_after_ms.unwrap();
    assert_eq!((ra.p50, ra.max), (1_000, 1_000));
}

/// A log at instants of its own (ms after 2026-01-01T00:00:00Z): `(offset_ms, cost)` for one
/// key.
fn log_at(requests: &[(u64, u64)]) -> String {
    requests
        .iter()
        .map(|(t, cost)| format!("{}.{:03},k,{cost}\n", 1_767_225_600 + t / 1_000, t % 1_000))
        .collect()
}

#[test]
fn the_worked_examples_of_the_algorithms_doc_side_by_side() {
    // docs/algorithms.md, sliding_window: `max: 4, per: 1s, precision: 250ms`; the refusals at
    // 999 and 1 001 wait 1 and 749 ms. The same traffic under a fixed window of 4 per second
    // (opened at 10, closing at 1 010) refuses 999, 1 000 and 1 001, waiting 11, 10 and 9 ms.
    let log = log_at(&[
        (10, 1),
        (260, 2),
        (990, 1),
        (999, 1),
        (1_000, 1),
        (1_001, 3),
    ]);
    let r = simulate(json!({
        "policies": [
            {"name": "current", "limits": [{"max": 4, "per": "1s"}]},
            {"name": "candidate", "limits": [
                {"max": 4, "per": "1s", "algorithm": "sliding_window", "precision": "250ms"}]},
        ],
        "traffic": {"format": "csv", "log": log},
        "bucket": "1s",
    }))
    .unwrap();
    assert_eq!(r.start_ms, 1_767_225_600_010);
    let (current, candidate) = (&r.policies[0], &r.policies[1]);
    assert_eq!(current.name, "current");
    assert_eq!((current.admitted, current.denied), (3, 3));
    assert_eq!(current.admitted_cost, 4);
    assert_eq!(current.first_denial_ms, Some(989));
    let ra = current.retry_after_ms.unwrap();
    assert_eq!((ra.p50, ra.p90, ra.max), (10, 11, 11));
    assert_eq!((candidate.admitted, candidate.denied), (4, 2));
    assert_eq!(candidate.admitted_cost, 5);
    let ra = candidate.retry_after_ms.unwrap();
    assert_eq!((ra.p50, ra.p90, ra.p99, ra.max), (1, 749, 749, 749));
    assert_eq!(
        candidate.limits,
        vec!["4/1s sliding_window precision 250ms"]
    );

    // token_bucket: `max: 10, per: 1s, burst: 3`; the refusals at 0 and 150 wait 100 and 150.
    let log = log_at(&[(0, 1), (0, 1), (0, 1), (0, 1), (100, 1), (150, 2)]);
    let r = simulate(json!({
        "policies": [{"name": "bucket", "limits": [
            {"max": 10, "per": "1s", "algorithm": "token_bucket", "burst": 3}]}],
        "traffic": {"format": "csv", "log": log},
    }))
    .unwrap();
    let p = &r.policies[0];
    assert_eq!((p.admitted, p.denied), (4, 2));
    let ra = p.retry_after_ms.unwrap();
    assert_eq!((ra.p50, ra.max), (100, 150));
    assert_eq!(p.limits, vec!["10/1s token_bucket burst 3"]);
}

#[test]
fn over_two_minutes_of_steady_traffic_a_fixed_window_refuses_the_end_of_each_window() {
    let r = simulate(json!({
        "policies": [{"name": "current", "limits": [{"max": 100, "per": "1m"}]}],
        "traffic": steady(2.0, "2m"),
        "bucket": "10s",
    }))
    .unwrap();
    let p = &r.policies[0];
    assert_eq!((p.admitted, p.denied), (200, 40));
    let denied: Vec<u64> = p.buckets.iter().map(|b| b.denied).collect();
    assert_eq!(denied, [0, 0, 0, 0, 0, 20, 0, 0, 0, 0, 0, 20]);
}

#[test]
fn one_seed_gives_one_result_and_another_seed_another() {
    let request = |seed: u64| {
        json!({
            "policies": [{"name": "p", "limits": [{"max": 20, "per": "10s"}]}],
            "traffic": {"pattern": "poisson", "rate": 40, "duration": "30s", "keys": 50,
                        "key_choice": "zipf", "zipf_exponent": 1.2, "seed": seed},
            "top": 5,
        })
    };
    let a = simulate(request(7)).unwrap();
    let b = simulate(request(7)).unwrap();
    assert_eq!(a, b);
    assert_eq!(a.seed, Some(7));
    let c = simulate(request(8)).unwrap();
    assert_ne!(a, c);
    // About 40/s × 30 s; Zipf puts the most traffic, and so the most denials, on key-1.
    assert!((900..1_500).contains(&a.events), "{}", a.events);
    assert_eq!(a.policies[0].top_keys[0].key, "key-1");
    assert_eq!(a.policies[0].top_keys.len(), 5);
    let p = &a.policies[0];
    let total: u64 = p.buckets.iter().map(|b| b.admitted + b.denied).sum();
    assert_eq!(total, a.events);
}

#[test]
fn a_ramp_makes_the_expected_count_and_grows() {
    let r = simulate(json!({
        "policies": [{"name": "p", "limits": [{"max": 1000, "per": "1m"}]}],
        "traffic": {"pattern": "ramp", "from": 0, "to": 10, "duration": "10s"},
    }))
    .unwrap();
    // The mean rate is 5/s over 10 s.
    assert_eq!(r.events, 50);
    let per_second: Vec<u64> = r.policies[0].buckets.iter().map(|b| b.admitted).collect();
    assert_eq!(per_second.iter().sum::<u64>(), 50);
    assert!(per_second[9] > per_second[0], "{per_second:?}");
}

#[test]
fn a_csv_log_gives_per_key_counts() {
    let log = "timestamp,key,cost\n\
               1767225600,alice,1\n\
               1767225600.5,\"bob, jr\",1\n\
               1767225601,alice\n\
               1767225602.25,alice,1\n\
               1767225661,alice,1\n\
               1767225603,alice,5\n";
    let r = simulate(json!({
        "policies": [{"name": "p", "limits": [{"max": 2, "per": "1m"}]}],
        "traffic": {"format": "csv", "log": log},
    }))
    .unwrap();
    assert_eq!((r.events, r.keys), (6, 2));
    assert_eq!(r.start_ms, 1_767_225_600_000);
    assert_eq!(r.duration_ms, 61_001);
    let p = &r.policies[0];
    let keys: Vec<(&str, u64, u64)> = p
        .top_keys
        .iter()
        .map(|k| (k.key.as_str(), k.admitted, k.denied))
        .collect();
    // alice: 0 s and 1 s pass, 2.25 s is refused, 3 s (cost 5 > max) never fits, 61 s opens
    // a new window.
    assert_eq!(keys, vec![("alice", 3, 2), ("bob, jr", 1, 0)]);
    assert_eq!(p.first_denial_ms, Some(2_250));
    assert_eq!(p.never_fits, 1);
    assert_eq!(p.admitted_cost, 4);
}

#[test]
fn json_lines_read_seconds_and_rfc3339() {
    let log = r#"{"timestamp": "2026-01-01T00:00:00.000Z", "key": "a"}
{"timestamp": 1767225600.1, "key": "a", "cost": 2}
{"timestamp": "2026-01-01T01:00:00.200+01:00", "key": "a"}
"#;
    let r = simulate(json!({
        "policies": [{"name": "p", "limits": [{"max": 3, "per": "1s"}]}],
        "traffic": {"format": "jsonl", "log": log},
    }))
    .unwrap();
    let p = &r.policies[0];
    assert_eq!((p.admitted, p.denied), (2, 1));
    assert_eq!(p.first_denial_ms, Some(200));
}

const NGINX: &str = r#"10.0.0.1 - - [01/Jan/2026:00:00:00 +0000] "GET / HTTP/1.1" 200 612 "-" "curl/8.5"
10.0.0.2 - alice [01/Jan/2026:00:00:01 +0000] "GET /a HTTP/1.1" 200 10 "https://example.com/" "Mozilla/5.0 (X11)"
10.0.0.1 - - [01/Jan/2026:00:00:02 +0000] "POST /b HTTP/1.1" 201 0 "-" "curl/8.5"
10.0.0.1 - - [01/Jan/2026:01:00:03 +0100] "GET /c HTTP/1.1" 200 0 "-" "curl/8.5"
"#;

#[test]
fn an_nginx_combined_log_is_keyed_by_client_address_or_a_chosen_field() {
    let request = |key_field: Option<&str>| {
        let mut traffic = json!({"format": "nginx", "log": NGINX});
        if let Some(f) = key_field {
            traffic["key_field"] = json!(f);
        }
        json!({
            "policies": [{"name": "p", "limits": [{"max": 2, "per": "1h"}]}],
            "traffic": traffic,
        })
    };
    let r = simulate(request(None)).unwrap();
    // The last line is 00:00:03 UTC, written in +01:00.
    assert_eq!(r.duration_ms, 3_001);
    let keys: Vec<(&str, u64, u64)> = r.policies[0]
        .top_keys
        .iter()
        .map(|k| (k.key.as_str(), k.admitted, k.denied))
        .collect();
    assert_eq!(keys, vec![("10.0.0.1", 2, 1), ("10.0.0.2", 1, 0)]);

    let r = simulate(request(Some("http_user_agent"))).unwrap();
    let keys: Vec<(&str, u64, u64)> = r.policies[0]
        .top_keys
        .iter()
        .map(|k| (k.key.as_str(), k.admitted, k.denied))
        .collect();
    assert_eq!(keys, vec![("curl/8.5", 2, 1), ("Mozilla/5.0 (X11)", 1, 0)]);

    let e = simulate(request(Some("cookie"))).unwrap_err();
    assert_eq!(e.path, "traffic.log.key_field");
    assert!(e.message.contains("remote_addr"), "{e}");
}

#[test]
fn an_envoy_log_is_keyed_by_the_first_forwarded_address() {
    let log = r#"[2026-01-01T00:00:00.000Z] "GET /a HTTP/1.1" 200 - 0 10 2 1 "203.0.113.9, 10.1.1.1" "curl/8" "id-1" "api.example.com" "10.2.0.5:8080"
[2026-01-01T00:00:00.400Z] "GET /b HTTP/1.1" 200 - 0 10 2 1 "203.0.113.9" "curl/8" "id-2" "api.example.com" "10.2.0.5:8080"
[2026-01-01T00:00:00.900Z] "GET /c HTTP/2" 429 RL 0 0 1 - "198.51.100.4" "curl/8" "id-3" "api.example.com" "-"
"#;
    let r = simulate(json!({
        "policies": [{"name": "p", "limits": [{"max": 1, "per": "1s"}]}],
        "traffic": {"format": "envoy", "log": log},
    }))
    .unwrap();
    let keys: Vec<(&str, u64, u64)> = r.policies[0]
        .top_keys
        .iter()
        .map(|k| (k.key.as_str(), k.admitted, k.denied))
        .collect();
    assert_eq!(keys, vec![("203.0.113.9", 1, 1), ("198.51.100.4", 1, 0)]);
    assert_eq!(r.policies[0].first_denial_ms, Some(400));
}

/// Requests the simulator refuses: (request, the field named, words the message holds).
fn bad_requests() -> Vec<(Value, &'static str, &'static str)> {
    let policy = json!([{"name": "p", "limits": [{"max": 10, "per": "1s"}]}]);
    let cases: Vec<(Value, &'static str, &'static str)> = vec![
        (
            json!({"policies": [{"name": "jobs", "limits": [{"max": 10, "per": "1m"}, {"max": 2, "per": "30s", "algorithm": "concurrency"}]}], "traffic": steady(1.0, "1s")}),
            "policies[0].limits[1]",
            "a concurrency limit cannot be simulated",
        ),
        (
            json!({"policies": policy, "traffic": steady(1000.0, "2h")}),
            "traffic",
            "max_events",
        ),
        (
            json!({"policies": policy, "traffic": steady(1.0, "32d")}),
            "traffic.duration",
            "max_duration",
        ),
        (
            json!({"policies": policy, "traffic": {"pattern": "steady", "rate": 1, "duration": "1s", "keys": 100_001}}),
            "traffic.keys",
            "max_keys",
        ),
        (
            json!({"policies": (0..9).map(|i| json!({"name": format!("p{i}"), "limits": [{"max": 1, "per": "1s"}]})).collect::<Vec<_>>(), "traffic": steady(1.0, "1s")}),
            "policies",
            "max_policies",
        ),
        (
            json!({"policies": policy, "traffic": steady(1.0, "1h"), "bucket": "100ms"}),
            "bucket",
            "max_buckets",
        ),
        (
            json!({"policies": policy, "traffic": steady(1.0, "1s"), "top": 101}),
            "top",
            "at most 100",
        ),
        (
            json!({"policies": policy, "traffic": {"pattern": "square", "duration": "1s"}}),
            "traffic.pattern",
            "steady",
        ),
        (
            json!({"policies": policy, "traffic": {"pattern": "steady", "duration": "1s"}}),
            "traffic.rate",
            "missing",
        ),
        (
            json!({"policies": policy, "traffic": {"pattern": "steady", "rate": -1, "duration": "1s"}}),
            "traffic.rate",
            "positive",
        ),
        (
            json!({"policies": policy, "traffic": {"pattern": "steady", "rate": 1, "duration": "0s"}}),
            "traffic.duration",
            "positive",
        ),
        (
            json!({"policies": policy, "traffic": {"pattern": "steady", "rate": 1, "duration": "1s", "burst": 3}}),
            "traffic",
            "unknown field `burst`",
        ),
        (
            json!({"policies": policy, "traffic": {"pattern": "bursts", "size": 0, "every": "1s", "duration": "1s"}}),
            "traffic.size",
            "≥ 1",
        ),
        (
            json!({"policies": policy, "traffic": {"pattern": "steady", "rate": 1, "duration": "1s", "key_choice": "zipf", "zipf_exponent": 0}}),
            "traffic.zipf_exponent",
            "positive",
        ),
        (
            json!({"policies": policy, "traffic": {"format": "csv", "log": "1767225600,a,-3\n"}}),
            "traffic.log",
            "line 1: cost",
        ),
        (
            json!({"policies": policy, "traffic": {"format": "nginx", "log": "10.0.0.1 - - [nope] \"GET /\" 200 1 \"-\" \"-\"\n"}}),
            "traffic.log",
            "line 1: time_local",
        ),
        (
            json!({"policies": policy, "traffic": {"format": "jsonl", "log": "{\"key\": \"a\"}\n"}}),
            "traffic.log",
            "timestamp: is missing",
        ),
        (
            json!({"policies": policy, "traffic": {"format": "csv", "log": ""}}),
            "traffic.log",
            "no request",
        ),
        (
            json!({"policies": policy, "traffic": {"format": "apache", "log": "x"}}),
            "traffic.format",
            "nginx, nginx_main, apache_common, apache_combined, envoy, istio, envoy_json, jsonl, csv",
        ),
        (
            json!({"policies": policy, "traffic": {"format": "csv", "log": "1,a\n3000000001,a\n"}}),
            "traffic.log",
            "max_duration",
        ),
        (
            json!({"policies": [], "traffic": steady(1.0, "1s")}),
            "policies",
            "at least one",
        ),
        (json!({"traffic": steady(1.0, "1s")}), "policies", "list"),
        (json!({"policies": policy}), "traffic", "missing"),
        (
            json!({"policies": policy, "traffic": steady(1.0, "1s"), "speed": 2}),
            "body",
            "unknown field `speed`",
        ),
        (json!([1, 2]), "body", "object"),
        (
            json!({"policies": [{"limits": [{"max": 1, "per": "1s"}]}], "traffic": steady(1.0, "1s")}),
            "policies[0].name",
            "missing",
        ),
        (
            json!({"policies": [{"name": "p", "limits": [{"max": 1, "per": "0s"}]}], "traffic": steady(1.0, "1s")}),
            "policies[0]",
            "limits[0].per: `0s` is not a positive duration",
        ),
        (
            json!({"policies": [{"name": "p", "limits": [{"max": 1, "per": "1s", "algorithm": "leaky"}]}], "traffic": steady(1.0, "1s")}),
            "policies[0]",
            "limits[0]",
        ),
        (
            json!({"policies": [{"name": "p", "limits": []}], "traffic": steady(1.0, "1s")}),
            "policies[0]",
            "limits",
        ),
        (
            json!({"policies": [{"name": "p", "policy": "unconfigured"}], "traffic": steady(1.0, "1s")}),
            "policies[0].policy",
            "no policy named `unconfigured`",
        ),
        (
            json!({"policies": [{"name": "p", "limits": [{"max": 1, "per": "1s"}]}, {"name": "p", "limits": [{"max": 2, "per": "1s"}]}], "traffic": steady(1.0, "1s")}),
            "policies[1].name",
            "twice",
        ),
        (
            json!({"policies": [{"name": "bad name!", "limits": [{"max": 1, "per": "1s"}]}], "traffic": steady(1.0, "1s")}),
            "policies[0]",
            "name",
        ),
    ];
    cases
}

/// Every bound and malformed input: refused before running, naming the field or the bound.
#[test]
fn every_bound_and_malformed_input_is_refused_naming_it() {
    let policy = json!([{"name": "p", "limits": [{"max": 10, "per": "1s"}]}]);
    for (request, field, words) in bad_requests() {
        let e = simulate(request.clone()).expect_err(&request.to_string());
        assert_eq!(e.path, field, "{request}: {e}");
        assert!(
            e.to_string().contains(words),
            "{request}: `{e}` lacks `{words}`"
        );
    }
    // Small bounds hold for logs as well as patterns.
    let tight = Bounds {
        max_events: 2,
        max_keys: 1,
        ..Bounds::default()
    };
    let log = |text: &str| json!({"policies": policy, "traffic": {"format": "csv", "log": text}});
    let e = Simulation::from_request(&log("1,a\n2,a\n3,a\n"), &[], &tight).unwrap_err();
    assert!(e.message.contains("max_events"), "{e}");
    let e = Simulation::from_request(&log("1,a\n2,b\n"), &[], &tight).unwrap_err();
    assert!(e.message.contains("max_keys"), "{e}");
    let e = Simulation::from_request(
        &json!({"policies": policy, "traffic": {"pattern": "poisson", "rate": 1000, "duration": "1s"}}),
        &[],
        &Bounds {
            max_events: 10,
            ..Bounds::default()
        },
    )
    .unwrap_err();
    assert!(e.message.contains("max_events"), "{e}");
}

// ----- over HTTP ------------------------------------------------------------------------------

const CONFIG: &str = "policies:\n  api:\n    limits:\n      - { max: 100, per: 1m }\n";

async fn post(url: &str, body: &Value, token: Option<&str>) -> (StatusCode, Value) {
    let request = reqwest::Client::new()
        .post(format!("{url}/v1/simulate"))
        .json(body);
    support::answer(request, token).await
}

#[tokio::test]
async fn the_route_compares_a_configured_policy_with_an_inline_candidate() {
    let s = support::TestServer::start(CONFIG, &[]).await;
    let (status, body) = post(
        &s.url,
        &json!({
            "policies": [
                {"name": "current", "policy": "api"},
                {"name": "candidate", "limits": [{"max": 120, "per": "1m"}]},
            ],
            "traffic": steady(2.0, "60s"),
            "bucket": "10s",
            "top": 3,
        }),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["events"], 120);
    assert_eq!(body["bucket_ms"], 10_000);
    assert_eq!(body["seed"], 0);
    let current = &body["policies"][0];
    assert_eq!(current["name"], "current");
    assert_eq!(current["limits"], json!(["100/1m fixed_window"]));
    assert_eq!(
        (current["admitted"].as_u64(), current["denied"].as_u64()),
        (Some(100), Some(20))
    );
    assert_eq!(current["first_denial_ms"], 50_000);
    assert_eq!(
        current["retry_after_ms"],
        json!({"p50": 5_000, "p90": 9_000, "p99": 10_000, "max": 10_000})
    );
    assert_eq!(
        current["buckets"][5],
        json!({"start_ms": 50_000, "admitted": 0, "denied": 20})
    );
    assert_eq!(
        current["top_keys"],
        json!([{"key": "key-1", "admitted": 100, "denied": 20}])
    );
    let candidate = &body["policies"][1];
    assert_eq!(
        (candidate["admitted"].as_u64(), candidate["denied"].as_u64()),
        (Some(120), Some(0))
    );
    assert_eq!(candidate["first_denial_ms"], Value::Null);
    assert_eq!(candidate["retry_after_ms"], Value::Null);

    // A simulation touches no live state: the configured policy's key is untouched.
    let c = reqwest::Client::new();
    let (_, peeked) = support::answer(
        c.post(format!("{}/v1/peek", s.url))
            .json(&json!({"policy": "api", "key": "key-1"})),
        None,
    )
    .await;
    assert_eq!(peeked["remaining"], 99);
    s.stop().await;
}

#[tokio::test]
async fn bad_requests_are_400s_naming_the_field_and_the_body_cap_is_8_mib() {
    let s = support::TestServer::start(CONFIG, &[]).await;
    for (request, field, words) in bad_requests() {
        let (status, e) = post(&s.url, &request, None).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{request}: {e}");
        assert_eq!(e["error"]["code"], "invalid_request");
        let message = e["error"]["message"].as_str().unwrap();
        assert!(
            message.starts_with(&format!("{field}: ")) && message.contains(words),
            "{request}: `{message}` lacks `{field}` or `{words}`"
        );
    }
    let (status, e) = post(
        &s.url,
        &json!({"policies": [{"policy": "api"}], "traffic": steady(1000.0, "2h")}),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{e}");
    assert_eq!(e["error"]["code"], "invalid_request");
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("max_events"),
        "{e}"
    );

    let (status, e) = post(
        &s.url,
        &json!({"policies": [{"policy": "nope"}], "traffic": steady(1.0, "1s")}),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{e}");
    let message = e["error"]["message"].as_str().unwrap();
    assert!(
        message.starts_with("policies[0].policy: no policy named `nope`"),
        "{e}"
    );
    assert!(message.contains("configured: api"), "{e}");

    let r = reqwest::Client::new()
        .post(format!("{}/v1/simulate", s.url))
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    let e: Value = r.json().await.unwrap();
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("not valid JSON"),
        "{e}"
    );

    // A pasted log larger than the 64 KiB cap of the other routes is read…
    let line = "1767225600,some-client-key-padding-the-line-out,1\n";
    let log = line.repeat(200 * 1024 / line.len());
    let (status, body) = post(
        &s.url,
        &json!({"policies": [{"policy": "api"}], "traffic": {"format": "csv", "log": log}}),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["policies"][0]["admitted"], 100);
    // … and one over 8 MiB is refused before parsing.
    let big = "x".repeat(8 * 1024 * 1024 + 1);
    let simulate = reqwest::Client::new().post(format!("{}/v1/simulate", s.url));
    let (status, e) = support::answer(simulate.body(big), None).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(e["error"]["code"], "body_too_large");
    s.stop().await;
}

const TOKEN: &str = "simulate-admin-token-0123456789";

#[tokio::test]
async fn with_an_admin_section_the_route_needs_a_token_and_lives_on_the_admin_listener() {
    let config = format!("admin:\n  tokens_file: tokens\n{CONFIG}");
    let s = support::TestServer::start(&config, &[("tokens", TOKEN)]).await;
    let body = json!({"policies": [{"policy": "api"}], "traffic": steady(1.0, "1s")});
    let (status, e) = post(&s.url, &body, None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{e}");
    let (status, r) = post(&s.url, &body, Some(TOKEN)).await;
    assert_eq!(status, StatusCode::OK, "{r}");
    assert_eq!(r["policies"][0]["admitted"], 1);
    s.stop().await;

    let config = format!("listen:\n  admin: 127.0.0.1:0\nadmin:\n  tokens_file: tokens\n{CONFIG}");
    let s = support::TestServer::start(&config, &[("tokens", TOKEN)]).await;
    let (status, e) = post(&s.url, &body, Some(TOKEN)).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{e}");
    assert_eq!(e["error"]["code"], "admin_listener");
    let admin = s.admin_url.clone().unwrap();
    let (status, r) = post(&admin, &body, Some(TOKEN)).await;
    assert_eq!(status, StatusCode::OK, "{r}");
    s.stop().await;
}

// ----- what the route may cost ------------------------------------------------------------

/// A simulation's memory is reckoned before any work, and one over `max_memory` is refused
/// naming it: a pattern at both the events and the keys bounds, or a log of long keys.
#[tokio::test]
async fn a_simulation_over_the_memory_bound_is_refused_naming_it() {
    let corner = json!({
        "policies": [{"policy": "api"}],
        "traffic": {"pattern": "steady", "rate": 1000, "duration": "1000s", "keys": 100_000},
    });
    // The library refuses it before generating a single event…
    let started = std::time::Instant::now();
    let configured = sluice_server::config::Config::parse("sluice.yaml", CONFIG)
        .unwrap()
        .policies;
    // (Not `unwrap_err`: an accepted simulation's Debug is a million events long.)
    let Err(e) = Simulation::from_request(&corner, &configured, &Bounds::default()) else {
        panic!("a simulation over max_memory was accepted");
    };
    assert_eq!(e.path, "traffic");
    assert!(
        e.message.starts_with(
            "this pattern's 1000000 events over 100000 keys would hold about 65 MiB, more than \
             the 64 MiB one simulation may use (max_memory)"
        ),
        "{e}"
    );
    assert!(started.elapsed() < std::time::Duration::from_secs(5));
    // … and so does the route, with a 400 naming the bound.
    let s = support::TestServer::start(CONFIG, &[]).await;
    let (status, e) = post(&s.url, &corner, None).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{e}");
    let message = e["error"]["message"].as_str().unwrap();
    assert!(
        message.starts_with("traffic: this pattern's") && message.contains("(max_memory)"),
        "{e}"
    );
    // Fewer keys fit.
    let fits = Simulation::from_request(
        &json!({"policies": [{"policy": "api"}], "traffic": {"pattern": "steady", "rate": 1000, "duration": "1000s", "keys": 1000}}),
        &configured,
        &Bounds::default(),
    );
    assert!(fits.is_ok(), "{:?}", fits.err());
    s.stop().await;
    // A log is reckoned once read, on its real keys.
    let long = "k".repeat(500);
    let text: String = (0..20)
        .map(|i| format!("{},{long}{i}\n", 1_767_225_600 + i))
        .collect();
    let e = Simulation::from_request(
        &json!({"policies": [{"name": "p", "limits": [{"max": 1, "per": "1s"}]}], "traffic": {"format": "csv", "log": text}}),
        &[],
        &Bounds {
            max_memory: 32 << 10,
            ..Bounds::default()
        },
    )
    .unwrap_err();
    assert_eq!(e.path, "traffic.log");
    assert!(
        e.message
            .starts_with("20 events over 20 keys would hold about")
            && e.message.contains("max_memory"),
        "{e}"
    );
}

/// At most `MAX_CONCURRENT` simulations at once: two clients hold the slots (their bodies
/// still arriving), a third is refused `503 busy` with `Retry-After`, and once the two are
/// answered a new one runs.
#[tokio::test]
async fn more_simulations_at_once_than_allowed_are_refused_busy() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    assert_eq!(sluice_simulate::MAX_CONCURRENT, 2);
    let s = support::TestServer::start(CONFIG, &[]).await;
    let body = json!({"policies": [{"policy": "api"}], "traffic": steady(2.0, "60s")}).to_string();
    let addr = s.url.trim_start_matches("http://").to_owned();
    let mut holders = Vec::new();
    for _ in 0..2 {
        let mut c = tokio::net::TcpStream::connect(&addr).await.unwrap();
        c.write_all(
            format!(
                "POST /v1/simulate HTTP/1.1\r\nhost: sluice\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{}",
                body.len(),
                &body[..10]
            )
            .as_bytes(),
        )
        .await
        .unwrap();
        holders.push(c);
    }
    // Poll until both hold a slot: then a third is refused.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let refusal = loop {
        let r = support::send(
            reqwest::Client::new()
                .post(format!("{}/v1/simulate", s.url))
                .body(body.clone()),
        )
        .await;
        if r.status() == StatusCode::SERVICE_UNAVAILABLE {
            break r;
        }
        assert_eq!(r.status(), StatusCode::OK);
        assert!(std::time::Instant::now() < deadline, "never refused");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    assert_eq!(
        support::header(&refusal, "retry-after").as_deref(),
        Some("1")
    );
    let e: Value = refusal.json().await.unwrap();
    assert_eq!(e["error"]["code"], "busy", "{e}");
    assert!(
        e["error"]["message"].as_str().unwrap().contains(
            "2 simulations are running, the most this server runs at once (max_concurrent 2)"
        ),
        "{e}"
    );
    // The two finish their bodies and are answered.
    for mut c in holders {
        c.write_all(&body.as_bytes()[10..]).await.unwrap();
        let mut answer = String::new();
        c.read_to_string(&mut answer).await.unwrap();
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    }
    let (status, r) = post(
        &s.url,
        &json!({"policies": [{"policy": "api"}], "traffic": steady(2.0, "60s")}),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{r}");
    s.stop().await;
}

/// A body naming a field twice is refused naming it (the last value used to win),
/// in the body itself and in an inline policy of the command.
#[tokio::test]
async fn a_field_given_twice_is_refused_naming_it() {
    let s = support::TestServer::start(CONFIG, &[]).await;
    let r = reqwest::Client::new()
        .post(format!("{}/v1/simulate", s.url))
        .body(r#"{"policies": [{"policy": "api"}], "traffic": {"pattern": "steady", "rate": 1, "rate": 2, "duration": "1m"}}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    let e: Value = r.json().await.unwrap();
    let message = e["error"]["message"].as_str().unwrap();
    assert!(message.starts_with("`traffic.rate` is given twice"), "{e}");
    s.stop().await;
    let e = sluice_simulate::policy_flag("p={limits: [{max: 1, per: 1s, max: 2}]}").unwrap_err();
    assert_eq!(e.message, "`limits[0].max` is given twice", "{e}");
}
