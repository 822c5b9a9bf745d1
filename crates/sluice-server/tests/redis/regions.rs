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

/// Waits until each of `replicas` has its link to its primary up.
fn links_up(replicas: &[&RedisServer]) {
    sluice_testkit::wait_until(
        sluice_testkit::SYNC_TIMEOUT,
        "every replica's link to its primary to be up",
        || {
            for replica in replicas {
                let link = replica.info_field("replication", "master_link_status")?;
                if link.as_deref() != Some("up") {
                    return Ok(false);
                }
            }
            Ok(true)
        },
    )
    .unwrap();
}

/// The `store:` section of region `local` on its `primary`, with `remotes` (the lines under
/// `remotes:`) read every `refresh`, falling back to `local_share`.
fn regions_store(local: &str, primary: &RedisServer, remotes: &str, refresh: &str) -> String {
    format!(
        "store:
  backend: redis
  timeout: 2s
  regions:
    local: {local}
    primary: {{ url: {} }}
    remotes:
{remotes}
    refresh: {refresh}
    max_lag: 1s
    fallback: local_share
",
        primary.url()
    )
}

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
        links_up(
            &replicas
                .iter()
                .flatten()
                .map(|(_, r)| r)
                .collect::<Vec<_>>(),
        );
        Self {
            primaries,
            replicas,
        }
    }

    /// Region `r`'s configuration: its primary, the replicas in it, `refresh`; `api` falls back
    /// to `local_share`, `guarded` to `closed`.
    fn config(&self, r: usize, refresh: &str) -> String {
        let remotes: Vec<String> = self.replicas[r]
            .iter()
            .map(|(o, replica)| format!("      {}: {{ url: {} }}", NAMES[*o], replica.url()))
            .collect();
        let store = regions_store(NAMES[r], &self.primaries[r], &remotes.join("\n"), refresh);
        format!(
            "policies:
  api:
    limits:
      - {{ max: {MAX}, per: 1h }}
  guarded:
    limits:
      - {{ max: {MAX}, per: 1h }}
{store}    policy_fallback: {{ guarded: closed }}
"
        )
    }
}

async fn check(c: &Client, s: &TestServer, policy: &str, key: &str) -> Value {
    let (status, body) = support::check(c, s, policy, key).await;
    assert!(
        status == StatusCode::OK || status == StatusCode::TOO_MANY_REQUESTS,
        "{status} {body}"
    );
    body
}

/// The `regions` of `/v1/stats`: what this server knows of each region.
/// Polls until `cond` holds of the regions `s` reports.
async fn until_regions(c: &Client, s: &TestServer, what: &str, cond: impl Fn(&[Value]) -> bool) {
    until(what, async || {
        let stats = stats(c, s).await;
        cond(stats["regions"].as_array().unwrap())
    })
    .await;
}

async fn stats(c: &Client, s: &TestServer) -> Value {
    let r = s.get(c, "/v1/stats").await;
    assert_eq!(r.status(), StatusCode::OK);
    r.json().await.unwrap()
}

async fn metrics(c: &Client, s: &TestServer) -> String {
    let r = s.get(c, "/metrics").await;
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
async fn until(what: &str, cond: impl AsyncFnMut() -> bool) {
    let waited = sluice_testkit::until(Duration::from_secs(10), what, cond).await;
    waited.unwrap();
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
        let body = support::json(
            c.post(format!("{url}/v1/check"))
                .json(&json!({"policy": "api", "key": key})),
        )
        .await;
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
/// which fallbacks; us falls back on eu too (eu says it cannot see us); ap, whose views are
/// whole and whom both see, keeps summing.
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
    let r = eu.get(&c, "/readyz").await;
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
    assert_eq!(
        support::columns(&eu_stats["regions"], &["name", "reachable", "fallback"]),
        [json!(["ap", true, false]), json!(["us", false, true])],
        "{eu_stats}"
    );

    // eu's heartbeat says it does not trust its view of us: us falls back on eu too (a cut
    // is seen from both sides), though its replica of eu answers.
    let us = &servers[1];
    until("us falls back on eu", async || {
        stats(&c, us).await["regions"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["name"] == "eu" && r["reachable"] == true && r["fallback"] == true)
    })
    .await;
    // ap sees eu and us whole and neither is blind to it: it sums them, so a key eu used up
    // to its share has max − 20 left in ap once ap has read eu's usage.
    let ap = &servers[2];
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let r = c
            .post(format!("{}/v1/peek", ap.url))
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
            "ap never read eu's usage of user:cut (and only it): {body}"
        );
        tokio::time::sleep(sluice_testkit::POLL_INTERVAL).await;
    }
    let ap_stats = stats(&c, ap).await;
    assert!(
        ap_stats["regions"]
            .as_array()
            .unwrap()
            .iter()
            .all(|r| r["reachable"] == true && r["fallback"] == false),
        "{ap_stats}"
    );
    for s in servers {
        s.stop().await;
    }
}

/// Two regions, `us` and `eu`, each a primary and a replica of the other's, as `Regions`
/// does for three.
struct TwoRegions {
    primaries: [RedisServer; 2],
    /// `replicas[r]`: in region `r`, the replica of the other region's primary.
    replicas: [RedisServer; 2],
}

impl TwoRegions {
    const NAMES: [&str; 2] = ["us", "eu"];

    fn start() -> Self {
        let primaries = [RedisServer::start().unwrap(), RedisServer::start().unwrap()];
        let replicas = [1, 0].map(|o| {
            ServerOptions::new()
                .replica_of(primaries[o].port())
                .start()
                .unwrap()
        });
        links_up(&[&replicas[0], &replicas[1]]);
        Self {
            primaries,
            replicas,
        }
    }

    /// Region `r`'s configuration with `policies` (YAML under `policies:`).
    fn config(&self, r: usize, policies: &str) -> String {
        let remote = format!(
            "      {}: {{ url: {} }}",
            Self::NAMES[1 - r],
            self.replicas[r].url()
        );
        let store = regions_store(Self::NAMES[r], &self.primaries[r], &remote, "100ms");
        format!("policies:\n{policies}\n{store}")
    }
}

/// The policy of the reproductions below: 100 per hour.
const ORDERS: &str = "  orders:\n    limits:\n      - { max: 100, per: 1h }";

async fn post_status(c: &Client, url: &str, path: &str, body: Value) -> (StatusCode, Value) {
    let r = c
        .post(format!("{url}{path}"))
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = r.status();
    (status, r.json().await.unwrap())
}

/// Through two `sluice serve`: `us` admits all 100 of the hour, `eu` sees
/// it and answers 429; then eu's replica of us dies. Past `max_lag` eu is under
/// `local_share`, and its share is of what it last knew to be left, 0: it admitted 50 more
/// (150 of 100 in one window) when the fallback forgot the usage it had seen. us, told by
/// eu's heartbeat that eu cannot see it, falls back too and admits nothing more either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_region_cut_off_mid_window_hands_out_no_fresh_share_on_a_spent_limit() {
    if !sluice_testkit::require_redis() {
        return;
    }
    // The test counts one hour-long window: not across its end.
    let now = sluice::Clock::now_ms(&sluice::SystemClock);
    let left = 3_600_000 - now % 3_600_000;
    if left < 60_000 {
        tokio::time::sleep(Duration::from_millis(left + 100)).await;
    }
    let mut regions = tokio::task::block_in_place(TwoRegions::start);
    let us = TestServer::start(&regions.config(0, ORDERS), &[]).await;
    let eu = TestServer::start(&regions.config(1, ORDERS), &[]).await;
    let c = Client::new();
    for s in [&us, &eu] {
        until_regions(&c, s, "each region trusts the other", |regions| {
            regions
                .iter()
                .all(|r| r["reachable"] == true && r["fallback"] == false)
        })
        .await;
    }
    let order = |cost: u64| json!({"policy": "orders", "key": "shop", "cost": cost});
    // eu names the key first, so that its view of us is read from then on.
    let (status, _) = post_status(&c, &eu.url, "/v1/peek", order(0)).await;
    assert_eq!(status, StatusCode::OK);
    let mut used = 0;
    for _ in 0..100 {
        let (status, body) = post_status(&c, &us.url, "/v1/check", order(1)).await;
        assert!(body.get("degraded").is_none(), "{body}");
        used += u64::from(status == StatusCode::OK);
    }
    assert_eq!(used, 100, "us admits the whole hour");
    until("eu sees us's 100", async || {
        let (_, body) = post_status(&c, &eu.url, "/v1/peek", order(0)).await;
        body["remaining"] == 0
    })
    .await;
    let (status, _) = post_status(&c, &eu.url, "/v1/check", order(1)).await;
    assert_eq!(
        status,
        StatusCode::TOO_MANY_REQUESTS,
        "eu refuses: the hour is spent"
    );

    tokio::task::block_in_place(|| regions.replicas[1].kill()).unwrap();
    for (name, s, other) in [("eu", &eu, "us"), ("us", &us, "eu")] {
        until_regions(&c, s, "the region falls back on the other", |regions| {
            regions
                .iter()
                .any(|r| r["name"] == other && r["fallback"] == true)
        })
        .await;
        let mut admitted = 0;
        for _ in 0..60 {
            let (status, body) = post_status(&c, &s.url, "/v1/check", order(1)).await;
            assert!(
                status == StatusCode::OK || status == StatusCode::TOO_MANY_REQUESTS,
                "{status} {body}"
            );
            assert!(body.get("degraded").is_none(), "{body}");
            admitted += u64::from(status == StatusCode::OK);
        }
        assert_eq!(
            admitted, 0,
            "{name} admitted {admitted} on a spent hour while cut"
        );
    }
    let text = metrics(&c, &eu).await;
    assert!(
        sample(
            &text,
            "sluice_region_fallbacks_total",
            "policy=\"orders\",mode=\"local_share\""
        )
        .is_some_and(|n| n >= 60.0),
        "{text}"
    );
    us.stop().await;
    eu.stop().await;
}

/// `{max: 10, per: 1m}` beside `{max: 100, per: 1m, align: true}` is valid
/// on any store, but a regions store aligns every fixed window, both would count one window,
/// and both `sluice serve` answered every check `503 store_unavailable`. Now neither region's
/// configuration loads: the refusal names the policy and both limits, and the line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_that_collide_once_aligned_are_refused_when_each_region_loads() {
    if !sluice_testkit::require_redis() {
        return;
    }
    let regions = tokio::task::block_in_place(TwoRegions::start);
    let policy = "  api:\n    limits:\n      - { max: 10, per: 1m }\n      - { max: 100, per: 1m, align: true }";
    for r in 0..2 {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("sluice.yaml");
        std::fs::write(&file, regions.config(r, policy)).unwrap();
        let e = sluice_server::config::Config::load(&file)
            .unwrap_err()
            .to_string();
        for part in [
            "sluice.yaml:5:9: policies.api.limits[1]: ",
            "limits[0] (max 10 per 60000 ms)",
            "limits[1] (max 100 per 60000 ms, aligned)",
        ] {
            assert!(e.contains(part), "{part}: {e}");
        }
    }
    // The same policy on one region's Redis alone is two windows, and serves.
    let alone = format!(
        "policies:\n{policy}\nstore:\n  backend: redis\n  shards:\n    - primary: {}\n",
        regions.primaries[0].url()
    );
    let s = TestServer::start(&alone, &[]).await;
    let c = Client::new();
    let (status, body) = post_status(
        &c,
        &s.url,
        "/v1/check",
        json!({"policy": "api", "key": "k"}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    s.stop().await;
}
