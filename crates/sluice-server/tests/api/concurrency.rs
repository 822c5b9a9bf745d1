//! `POST /v1/acquire` and `POST /v1/release` end to end (docs/api.md#leases): leases up to the
//! limit, 429 with the IETF `concurrent-requests` headers, releases, every malformed body, and
//! 64 HTTP clients on a Redis-backed server never holding more than the limit.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use reqwest::{Client, StatusCode};
use serde_json::{Value, json};

use crate::support;

use support::{header, post};

const POLICIES: &str = r#"
policies:
  jobs:
    limits:
      - { max: 3, per: 30s, algorithm: concurrency }
      - { max: 1000, per: 1h }
  rate:
    limits:
      - { max: 10, per: 1m }
"#;

async fn refused(r: reqwest::Response) -> String {
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"]["code"], "invalid_request", "{body}");
    body["error"]["message"].as_str().unwrap().to_owned()
}

#[tokio::test]
async fn leases_are_taken_up_to_the_limit_and_released() {
    let s = support::TestServer::start(POLICIES, &[]).await;
    let c = Client::new();
    let acquire = format!("{}/v1/acquire", s.url);
    let release = format!("{}/v1/release", s.url);
    let mut leases = Vec::new();
    for left in (0..3).rev() {
        let r = post(&c, &acquire, json!({"policy": "jobs", "key": "u1"})).await;
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(
            header(&r, "ratelimit-policy").unwrap(),
            "\"jobs:0\";q=3;qu=\"concurrent-requests\", \"jobs:1\";q=1000;w=3600"
        );
        assert!(
            header(&r, "ratelimit")
                .unwrap()
                .starts_with(&format!("\"jobs:0\";r={left}, ")),
            "{:?}",
            header(&r, "ratelimit")
        );
        let body: Value = r.json().await.unwrap();
        assert_eq!(body["allowed"], true);
        assert_eq!(body["limits"][0]["algorithm"], "concurrency");
        let id = body["lease"]["id"].as_str().unwrap().to_owned();
        assert_eq!(id.len(), 16, "{id}");
        assert!(body["lease"]["expires_ms"].as_u64().unwrap() > 0);
        leases.push(id);
    }
    let full = post(&c, &acquire, json!({"policy": "jobs", "key": "u1"})).await;
    assert_eq!(full.status(), StatusCode::TOO_MANY_REQUESTS);
    let wait: u64 = header(&full, "retry-after").unwrap().parse().unwrap();
    assert!(
        (29..=30).contains(&wait),
        "retry-after {wait}: the first lease lapses in 30 s"
    );
    let body: Value = full.json().await.unwrap();
    assert!(body.get("lease").is_none(), "{body}");
    // Another key has its own leases.
    let other = post(&c, &acquire, json!({"policy": "jobs", "key": "u2"})).await;
    assert_eq!(other.status(), StatusCode::OK);

    let r = post(
        &c,
        &release,
        json!({"policy": "jobs", "key": "u1", "lease": leases[1]}),
    )
    .await;
    assert_eq!(r.status(), StatusCode::OK);
    let body: Value = r.json().await.unwrap();
    assert_eq!(
        (body["released"].clone(), body["cost"].clone()),
        (json!(true), json!(1))
    );
    assert_eq!(body["limits"][0]["remaining"], 1);
    assert_eq!(
        body["limits"][1]["remaining"], 997,
        "3 counted; a release is not a refund"
    );
    // Released already: not an error, nothing freed.
    let again = post(
        &c,
        &release,
        json!({"policy": "jobs", "key": "u1", "lease": leases[1]}),
    )
    .await;
    assert_eq!(again.status(), StatusCode::OK);
    assert_eq!(again.json::<Value>().await.unwrap()["released"], false);
    let r = post(
        &c,
        &acquire,
        json!({"policy": "jobs", "key": "u1", "cost": 1}),
    )
    .await;
    assert_eq!(r.status(), StatusCode::OK, "the freed unit is taken again");
    s.stop().await;
}

/// An acquire that names a lease it holds renews it: a fresh expiry, and the rate limit of
/// the policy is not charged again. A lapsed or unknown id is taken anew, and counted.
#[tokio::test]
async fn an_acquire_naming_its_lease_renews_it_without_counting_again() {
    let clock = sluice::ManualClock::new(1_700_000_000_000);
    let s = support::TestServer::start_with_clock(POLICIES, &[], clock.clone()).await;
    let c = Client::new();
    let acquire = format!("{}/v1/acquire", s.url);
    let first: Value = post(&c, &acquire, json!({"policy": "jobs", "key": "k"}))
        .await
        .json()
        .await
        .unwrap();
    let id = first["lease"]["id"].as_str().unwrap().to_owned();
    assert_eq!(first["limits"][1]["remaining"], 999);
    for _ in 0..3 {
        clock.advance(20_000);
        let r = post(
            &c,
            &acquire,
            json!({"policy": "jobs", "key": "k", "lease": id}),
        )
        .await;
        assert_eq!(r.status(), StatusCode::OK);
        let body: Value = r.json().await.unwrap();
        assert_eq!(body["lease"]["id"], id.as_str(), "the same lease");
        assert_eq!(
            body["lease"]["expires_ms"].as_u64().unwrap(),
            sluice::Clock::now_ms(&clock) + 30_000,
            "a fresh expiry"
        );
        assert_eq!(body["limits"][0]["remaining"], 2, "held once");
        assert_eq!(body["limits"][1]["remaining"], 999, "not counted again");
    }
    // Past its expiry the same id is a new lease, and a new request.
    clock.advance(30_000);
    let again: Value = post(
        &c,
        &acquire,
        json!({"policy": "jobs", "key": "k", "lease": id}),
    )
    .await
    .json()
    .await
    .unwrap();
    assert_eq!(again["limits"][1]["remaining"], 998);
    s.stop().await;
}

#[tokio::test]
async fn bad_acquires_and_releases_are_refused_by_name() {
    let s = support::TestServer::start(POLICIES, &[]).await;
    let c = Client::new();
    let acquire = format!("{}/v1/acquire", s.url);
    let release = format!("{}/v1/release", s.url);
    let m = refused(post(&c, &acquire, json!({"policy": "rate", "key": "k"})).await).await;
    assert!(m.contains("policy `rate` has no concurrency limit"), "{m}");
    let m = refused(
        post(
            &c,
            &release,
            json!({"policy": "rate", "key": "k", "lease": "0000000000000001"}),
        )
        .await,
    )
    .await;
    assert!(m.contains("no concurrency limit"), "{m}");
    for lease in [
        json!("xyz"),
        json!(""),
        json!("0123456789abcdef0"),
        json!("+12"),
    ] {
        let m = refused(
            post(
                &c,
                &release,
                json!({"policy": "jobs", "key": "k", "lease": lease}),
            )
            .await,
        )
        .await;
        assert!(m.contains("`lease` must be the id"), "{lease}: {m}");
    }
    let m = refused(
        post(
            &c,
            &release,
            json!({"policy": "jobs", "key": "k", "lease": 7}),
        )
        .await,
    )
    .await;
    assert!(m.contains("`lease` must be a string"), "{m}");
    let m = refused(post(&c, &release, json!({"policy": "jobs", "key": "k"})).await).await;
    assert!(m.contains("`lease` is missing"), "{m}");
    let m = refused(
        post(
            &c,
            &release,
            json!({"policy": "jobs", "key": "k", "lease": "0000000000000001", "cost": 1}),
        )
        .await,
    )
    .await;
    assert!(m.contains("unknown field `cost`"), "{m}");
    for lease in [json!("xyz"), json!("0000000000000000"), json!(12)] {
        let m = refused(
            post(
                &c,
                &acquire,
                json!({"policy": "jobs", "key": "k", "lease": lease}),
            )
            .await,
        )
        .await;
        assert!(m.contains("`lease` must be"), "{lease}: {m}");
    }
    let m = refused(
        post(
            &c,
            &acquire,
            json!({"policy": "jobs", "key": "k", "ttl": 1}),
        )
        .await,
    )
    .await;
    assert!(
        m.contains("unknown field `ttl`; the fields are policy, key, cost and lease"),
        "{m}"
    );
    let r = post(&c, &acquire, json!({"policy": "nope", "key": "k"})).await;
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    // A check consults the concurrency limit without holding.
    let r = s
        .post(&c, "/v1/check", json!({"policy": "jobs", "key": "k"}))
        .await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(
        r.json::<Value>().await.unwrap()["limits"][0]["remaining"],
        3
    );
    s.stop().await;
}

/// 64 HTTP clients on a server deciding in Redis, each taking and releasing leases; an
/// independent counter (raised after a lease is granted, lowered before its release) never
/// passes the limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixty_four_http_clients_never_hold_more_than_the_limit() {
    let Some(redis) = support::redis() else {
        return;
    };
    let config = format!("{POLICIES}\n{}", support::redis_store(&redis, "2s"));
    let s = support::TestServer::start(&config, &[]).await;
    let c = Client::new();
    let holding = Arc::new(AtomicU64::new(0));
    let peak = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = (0..64)
        .map(|_| {
            let (c, url, holding, peak) = (c.clone(), s.url.clone(), holding.clone(), peak.clone());
            tokio::spawn(async move {
                let mut done = 0;
                while done < 8 {
                    let r = post(
                        &c,
                        &format!("{url}/v1/acquire"),
                        json!({"policy": "jobs", "key": "hot"}),
                    )
                    .await;
                    if r.status() == StatusCode::TOO_MANY_REQUESTS {
                        continue;
                    }
                    assert_eq!(r.status(), StatusCode::OK);
                    let body: Value = r.json().await.unwrap();
                    assert!(body.get("degraded").is_none(), "decided in Redis: {body}");
                    let now = holding.fetch_add(1, Ordering::SeqCst) + 1;
                    peak.fetch_max(now, Ordering::SeqCst);
                    tokio::task::yield_now().await;
                    holding.fetch_sub(1, Ordering::SeqCst);
                    let r = post(
                        &c,
                        &format!("{url}/v1/release"),
                        json!({"policy": "jobs", "key": "hot", "lease": body["lease"]["id"]}),
                    )
                    .await;
                    assert_eq!(r.json::<Value>().await.unwrap()["released"], true);
                    done += 1;
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let peak = peak.load(Ordering::SeqCst);
    assert!(
        (1..=3).contains(&peak),
        "{peak} leases at once; the limit is 3"
    );
    s.stop().await;
}

/// An acquire of cost 0 answered `allowed` with no lease, which a client reads as
/// "go ahead, holding a slot"; and a lease id of one digit was taken although the API speaks
/// of 16. Both are refused, naming the field.
#[tokio::test]
async fn an_acquire_of_nothing_and_a_short_lease_id_are_refused() {
    let s = support::TestServer::start(POLICIES, &[]).await;
    let c = Client::new();
    let acquire = format!("{}/v1/acquire", s.url);
    let release = format!("{}/v1/release", s.url);
    let m = refused(
        post(
            &c,
            &acquire,
            json!({"policy": "jobs", "key": "k", "cost": 0}),
        )
        .await,
    )
    .await;
    assert!(
        m.starts_with("`cost` must be at least 1 for an acquire") && m.contains("/v1/peek"),
        "{m}"
    );
    // Renewing with a cost of 0 is no way around it.
    let m = refused(
        post(
            &c,
            &acquire,
            json!({"policy": "jobs", "key": "k", "cost": 0, "lease": "9f86d081884c7d65"}),
        )
        .await,
    )
    .await;
    assert!(m.starts_with("`cost` must be at least 1"), "{m}");
    for lease in ["1", "01", "9f86d081884c7d6", "0x86d081884c7d65"] {
        for url in [&acquire, &release] {
            let m = refused(
                post(
                    &c,
                    url,
                    json!({"policy": "jobs", "key": "k", "lease": lease}),
                )
                .await,
            )
            .await;
            assert!(
                m.contains("`lease` must be the id /v1/acquire returned: exactly 16 hex digits"),
                "{lease}: {m}"
            );
        }
    }
    // Nothing was held by any of them: three leases are still there to take.
    for _ in 0..3 {
        let r = post(&c, &acquire, json!({"policy": "jobs", "key": "k"})).await;
        assert_eq!(r.status(), StatusCode::OK);
    }
    // Upper-case digits are hex digits too: the same lease as its lower-case id.
    let r = post(
        &c,
        &acquire,
        json!({"policy": "jobs", "key": "u", "lease": "9F86D081884C7D65"}),
    )
    .await;
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["lease"]["id"], "9f86d081884c7d65", "{body}");
    let r = post(
        &c,
        &release,
        json!({"policy": "jobs", "key": "u", "lease": "9f86d081884c7d65"}),
    )
    .await;
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["released"], true, "{body}");
    s.stop().await;
}
