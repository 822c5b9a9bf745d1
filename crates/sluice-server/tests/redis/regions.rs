//! Three regions, each a Redis primary plus local replicas of the other two primaries, and a
//! server per region deciding on its own primary (`store.regions`, docs/regions.md): traffic
//! split across the regions above the limit is admitted within `max` plus the stated bound;
//! a region whose replica of another is gone answers in its fallback mode, and says so in
//! `/metrics` and `/v1/stats`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use reqwest::{Client, StatusCode};
use serde_json::{Value, json};
use sluice_testkit::{RedisServer, ServerOptions};
use support::TestServer;

const NAMES: [&str; 3] = ["eu", "us", "ap"];
/// `api`'s limit, per hour (an aligned window: the test groups admissions by window anyway).
const MAX: u64 = 60;

/// Three primaries, and in each region a replica of each other region's primary.
struct Regions {
    primaries: Vec<RedisServer>,
    /// `replicas[r]`: region `r`'s replicas, as (the region they replicate, the server).
    replicas: Vec<Vec<(usize, RedisServer)>>,
}

impl Regions {
    fn start() -> Self {
        let primaries: Vec<RedisServer> = (0..3).map(|_| RedisServer::start().unwrap()).collect();
        let replicas: Vec<Vec<(usize, RedisServer)>> = (0..3)
            .map(|r| {
                (0..3)
                    .filter(|&o| o != r)
                    .map(|o| {
                        let replica = ServerOptions::new()
                            .replica_of(primaries[o].port())
                            .start()
                            .unwrap();
                        (o, replica)
                    })
                    .collect()
            })
            .collect();
        let regions = Self {
            primaries,
            replicas,
        };
        sluice_testkit::wait_until(
            sluice_testkit::SYNC_TIMEOUT,
            "every replica's link to its primary to be up",
            || {
                for (_, replica) in regions.replicas.iter().flatten() {
                    let link = replica.info_field("replication", "master_link_status")?;
                    if link.as_deref() != Some("up") {
                        return Ok(false);
                    }
                }
                Ok(true)
            },
        )
        .unwrap();
        regions
    }

    /// Region `r`'s configuration: its primary, the replicas in it, `refresh`; `api` falls back
    /// to `local_share`, `guarded` to `closed`.
    fn config(&self, r: usize, refresh: &str) -> String {
        let remotes: Vec<String> = self.replicas[r]
            .iter()
            .map(|(o, replica)| format!("      {}: {{ url: {} }}", NAMES[*o], replica.url()))
            .collect();
        format!(
            "policies:
  api:
    limits:
      - {{ max: {MAX}, per: 1h }}
  guarded:
    limits:
      - {{ max: {MAX}, per: 1h }}
store:
  backend: redis
  timeout: 2s
  regions:
    local: {local}
    primary: {{ url: {primary} }}
    remotes:
{remotes}
    refresh: {refresh}
    max_lag: 1s
    fallback: local_share
    policy_fallback: {{ guarded: closed }}
",
            local = NAMES[r],
            primary = self.primaries[r].url(),
            remotes = remotes.join("\n"),
        )
    }
}

async fn check(c: &Client, s: &TestServer, policy: &str, key: &str) -> Value {
    let r = c
        .post(format!("{}/v1/check", s.url))
        .json(&json!({"policy": policy, "key": key}))
        .send()
        .await
        .unwrap();
    let status = r.status();
    let body: Value = r.json().await.unwrap();
    assert!(
        status == StatusCode::OK || status == StatusCode::TOO_MANY_REQUESTS,
        "{status} {body}"
    );
    body
}

async fn stats(c: &Client, s: &TestServer) -> Value {
    let r = c.get(format!("{}/v1/stats", s.url)).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    r.json().await.unwrap()
}

async fn metrics(c: &Client, s: &TestServer) -> String {
    let r = c.get(format!("{}/metrics", s.url)).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    r.text().await.unwrap()
}

/// The value of the sample of `family` whose labels are exactly `labels` (`region="us"`).
fn sample(text: &str, family: &str, labels: &str) -> Option<f64> {
    let prefix = format!("{family}{{{labels}}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|v| v.trim().parse().ok())
}

/// Polls `cond` on the server until it holds, for at most 10 s.
async fn until(what: &str, mut cond: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !cond().await {
        assert!(Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(sluice_testkit::POLL_INTERVAL).await;
    }
}

/// What one region's traffic saw: checks sent, admitted per window (by `reset`), how long.
struct Sent {
    checks: u64,
    admitted: BTreeMap<u64, u64>,
    took: Duration,
}

/// `checks` checks of `key`, one every `every`, from region `s`; a degraded answer is not an
/// admission (and must not happen: the store is up).
async fn traffic(c: Client, url: String, key: String, checks: u64, every: Duration) -> Sent {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let started = Instant::now();
    let mut admitted = BTreeMap::new();
    for _ in 0..checks {
        tick.tick().await;
        let body: Value = c
            .post(format!("{url}/v1/check"))
            .json(&json!({"policy": "api", "key": key}))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert!(body.get("degraded").is_none(), "{body}");
        if body["allowed"] == true {
            *admitted.entry(body["reset"].as_u64().unwrap()).or_default() += 1;
        }
    }
    Sent {
        checks,
        admitted,
        took: started.elapsed(),
    }
}

/// With `refresh`, three regions each offering ~200 checks a second of one key (600 in all,
/// ten times `max` over the run): every window admits at most `max` + (regions − 1) × the
/// highest per-region rate × (the largest lag seen + the view's age: refresh, or more if the
/// loaded machine let the background reads fall behind), and at least `max` (the regions see
/// each other's usage, they do not starve either).
async fn within_the_bound(refresh_ms: u64) {
    let regions = tokio::task::block_in_place(Regions::start);
    let refresh = format!("{refresh_ms}ms");
    let mut servers = Vec::new();
    for r in 0..3 {
        servers.push(TestServer::start(&regions.config(r, &refresh), &[]).await);
    }
    let c = Client::new();
    // Every region has read every other's heartbeat: the lag is known before traffic starts.
    for s in &servers {
        until("each region has a lag for both others", async || {
            let regions = stats(&c, s).await["regions"].clone();
            regions.as_array().unwrap().len() == 2
                && regions
                    .as_array()
                    .unwrap()
                    .iter()
                    .all(|r| r["reachable"] == true && r.get("lag_s").is_some())
        })
        .await;
    }
    let key = format!("user:{refresh_ms}");
    // The largest lag and view age any region shows while the traffic runs.
    let (stop, mut stopped) = tokio::sync::watch::channel(false);
    let urls: Vec<String> = servers.iter().map(|s| s.url.clone()).collect();
    let monitor = tokio::spawn({
        let c = c.clone();
        async move {
            let (mut lag, mut age) = (0.0_f64, 0.0_f64);
            loop {
                for url in &urls {
                    let r = c.get(format!("{url}/v1/stats")).send().await.unwrap();
                    let body: Value = r.json().await.unwrap();
                    for region in body["regions"].as_array().unwrap() {
                        lag = lag.max(region["lag_s"].as_f64().unwrap_or(0.0));
                        age = age.max(region["view_age_s"].as_f64().unwrap_or(0.0));
                    }
                }
                if *stopped.borrow_and_update() {
                    return (lag, age);
                }
                // Sampling, not waiting for a condition: at most one reading per 20 ms.
                let _ = tokio::time::timeout(Duration::from_millis(20), stopped.changed()).await;
            }
        }
    });
    let runs: Vec<_> = servers
        .iter()
        .map(|s| {
            tokio::spawn(traffic(
                c.clone(),
                s.url.clone(),
                key.clone(),
                200,
                Duration::from_millis(5),
            ))
        })
        .collect();
    let mut sent = Vec::new();
    for run in runs {
        sent.push(run.await.unwrap());
    }
    stop.send(true).unwrap();
    // Lag is measured by heartbeats written every refresh / 2, so it is never under-stated;
    // the view age is at most refresh unless the machine is too loaded for the reads.
    let (lag_s, age_s) = monitor.await.unwrap();
    for s in &servers {
        for r in stats(&c, s).await["regions"].as_array().unwrap() {
            assert_eq!(r["reachable"], true, "{r}");
            assert_eq!(r["fallback"], false, "{r}");
        }
    }
    let rate = sent
        .iter()
        .map(|s| s.checks as f64 / s.took.as_secs_f64())
        .fold(0.0, f64::max);
    let view = (refresh_ms as f64 / 1e3).max(age_s);
    let bound = 2.0 * rate * (lag_s + view);
    let mut windows: BTreeMap<u64, u64> = BTreeMap::new();
    for s in &sent {
        for (reset, n) in &s.admitted {
            *windows.entry(*reset).or_default() += n;
        }
    }
    let total: u64 = windows.values().sum();
    let offered: u64 = sent.iter().map(|s| s.checks).sum();
    eprintln!(
        "refresh {refresh_ms} ms: offered {offered}, admitted {total} in {} window(s) \
         {windows:?}, max {MAX}, rate ≤ {rate:.0}/s per region, lag ≤ {:.1} ms, view age ≤ \
         {:.1} ms, bound {bound:.1}",
        windows.len(),
        lag_s * 1e3,
        age_s * 1e3
    );
    for (reset, n) in &windows {
        assert!(
            (*n as f64) <= MAX as f64 + bound,
            "window ending {reset}: {n} admitted, over max {MAX} + bound {bound:.1}"
        );
    }
    // Over-admission is not the whole story: a region that counted the others twice, or never
    // saw its own, would admit less than max.
    assert!(
        windows.len() > 1 || total >= MAX,
        "only {total} of {MAX} admitted across the regions"
    );
    for s in servers {
        s.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_regions_admit_within_the_bound_with_a_50ms_refresh() {
    if !sluice_testkit::require_redis() {
        return;
    }
    within_the_bound(50).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_regions_admit_within_the_bound_with_a_200ms_refresh() {
    if !sluice_testkit::require_redis() {
        return;
    }
    within_the_bound(200).await;
}

/// eu's replica of us's primary dies: eu's view of us is stale, so `api` takes its
/// `local_share` (60 / 3 regions = 20 for eu) and `guarded` its `closed`; eu keeps answering
/// from its own primary (ready, no error), the metrics and `/v1/stats` say which region and
/// which fallbacks; us, whose views are whole, keeps summing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_region_whose_replica_is_gone_answers_in_its_fallback_mode() {
    if !sluice_testkit::require_redis() {
        return;
    }
    let mut regions = tokio::task::block_in_place(Regions::start);
    let mut servers = Vec::new();
    for r in 0..3 {
        servers.push(TestServer::start(&regions.config(r, "100ms"), &[]).await);
    }
    let c = Client::new();
    let eu = &servers[0];
    until("eu reads both other regions' heartbeats", async || {
        let text = metrics(&c, eu).await;
        let fresh = |region: &str| {
            let labels = format!("region=\"{region}\"");
            sample(&text, "sluice_region_reachable", &labels) == Some(1.0)
                && sample(&text, "sluice_region_lag_seconds", &labels).is_some()
        };
        fresh("us") && fresh("ap")
    })
    .await;
    until("eu counts every region (no fallback)", async || {
        stats(&c, eu).await["regions"]
            .as_array()
            .unwrap()
            .iter()
            .all(|r| r["fallback"] == false)
    })
    .await;
    let us_in_eu = regions.replicas[0]
        .iter_mut()
        .find(|(o, _)| *o == 1)
        .map(|(_, r)| r)
        .unwrap();
    tokio::task::block_in_place(|| us_in_eu.kill()).unwrap();
    until("eu sees us unreachable", async || {
        sample(
            &metrics(&c, eu).await,
            "sluice_region_reachable",
            "region=\"us\"",
        ) == Some(0.0)
    })
    .await;

    // local_share: a fresh key gets exactly max / regions in eu, not degraded.
    let mut admitted = 0;
    for _ in 0..MAX {
        let body = check(&c, eu, "api", "user:cut").await;
        assert!(body.get("degraded").is_none(), "{body}");
        if body["allowed"] == true {
            admitted += 1;
        }
    }
    assert_eq!(admitted, MAX / 3, "local_share admits max / regions");
    // closed: nothing.
    let body = check(&c, eu, "guarded", "user:cut").await;
    assert_eq!(body["allowed"], false, "{body}");
    // eu is still ready: its own primary answers.
    let r = c.get(format!("{}/readyz", eu.url)).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);

    let text = metrics(&c, eu).await;
    let api = sample(
        &text,
        "sluice_region_fallbacks_total",
        "policy=\"api\",mode=\"local_share\"",
    );
    assert!(api.is_some_and(|n| n >= MAX as f64), "{text}");
    let guarded = sample(
        &text,
        "sluice_region_fallbacks_total",
        "policy=\"guarded\",mode=\"closed\"",
    );
    assert!(guarded.is_some_and(|n| n >= 1.0), "{text}");
    assert_eq!(
        sample(&text, "sluice_region_reachable", "region=\"ap\""),
        Some(1.0)
    );
    assert!(text.contains("# HELP sluice_region_lag_seconds "), "{text}");
    assert!(
        text.contains("# HELP sluice_region_view_age_seconds "),
        "{text}"
    );
    let eu_stats = stats(&c, eu).await;
    assert_eq!(eu_stats["store"]["kind"], "regions");
    assert_eq!(eu_stats["store"]["region"], "eu");
    let seen: Vec<(String, bool, bool)> = eu_stats["regions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["name"].as_str().unwrap().to_owned(),
                r["reachable"].as_bool().unwrap(),
                r["fallback"].as_bool().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        seen,
        [
            ("ap".to_owned(), true, false),
            ("us".to_owned(), false, true)
        ],
        "{eu_stats}"
    );

    // us sees eu and ap whole: it sums them, so a key eu used up to its share has max − 20
    // left in us once us has read eu's usage.
    let us = &servers[1];
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let r = c
            .post(format!("{}/v1/peek", us.url))
            .json(&json!({"policy": "api", "key": "user:cut"}))
            .send()
            .await
            .unwrap();
        let body: Value = r.json().await.unwrap();
        // A peek answers what a check of 1 would leave.
        if body["remaining"] == MAX - MAX / 3 - 1 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "us never read eu's usage of user:cut (and only it): {body}"
        );
        tokio::time::sleep(sluice_testkit::POLL_INTERVAL).await;
    }
    let us_stats = stats(&c, us).await;
    assert!(
        us_stats["regions"]
            .as_array()
            .unwrap()
            .iter()
            .all(|r| r["reachable"] == true && r["fallback"] == false),
        "{us_stats}"
    );
    for s in servers {
        s.stop().await;
    }
}
