//! Envoy's rate limit quota filter (RLQS), real Envoys against real `sluice serve`: the
//! example of examples/envoy and the bootstrap of docs/server.md hold the bound docs/server.md
//! states, and three Envoys over two Sluice servers on one Redis share one limit per window.

use std::collections::BTreeMap;

use crate::support::{self, Client, Envoy, Sluice};

/// The bound docs/server.md states for a fixed window of `max` per `per_s` seconds, `n`
/// Envoys reporting every `cadence_s` seconds: `max + 2 × N × ceil(C / N)`, with
/// `C = ceil(max × cadence / per)`.
fn bound(max: u64, per_s: u64, cadence_s: u64, n: u64) -> u64 {
    let c = (max * cadence_s).div_ceil(per_s);
    max + 2 * n * c.div_ceil(n)
}

/// Envoy 1.40 reports every 5 s, whatever its buckets' `reporting_interval`.
const ENVOY_CADENCE_S: u64 = 5;

/// One client at `rate` requests a second for `secs` on `path` through Envoy's `port`:
/// how many were admitted (anything but 429) and refused.
fn drive(port: u16, rate: f64, secs: f64, path: &str, headers: &[(&str, &str)]) -> (u64, u64) {
    let answers = support::paced(&mut Client::new(port), rate, secs, |_, c| {
        c.get(path, headers).status
    });
    assert!(
        answers.iter().all(|(_, s)| *s != 0),
        "every request answered"
    );
    let admitted = answers.iter().filter(|(_, s)| *s != 429).count() as u64;
    (admitted, answers.len() as u64 - admitted)
}

#[test]
fn the_example_holds_the_documented_bound_with_a_real_envoy() {
    let Some(envoy) = support::envoy_bin() else {
        return;
    };
    let dir = support::repo().join("examples/envoy");
    let sluice = Sluice::start_in(&dir, &support::read("examples/envoy/sluice.yaml"));
    let listener = support::port();
    let bootstrap = support::with_ports(
        &support::read("examples/envoy/envoy-rlqs.yaml"),
        &[(10001, listener), (8081, sluice.grpc)],
    );
    let _envoy = Envoy::start(&envoy, &bootstrap);
    // ~40 requests a second for 10 s against `checkout`, 30 a minute.
    let (admitted, refused) = drive(listener, 40.0, 10.0, "/checkout", &[]);
    let limit = bound(30, 60, ENVOY_CADENCE_S, 1);
    eprintln!("example: {admitted} admitted, {refused} refused; bound {limit}");
    assert!(admitted <= limit, "{admitted} admitted, bound {limit}");
    // The assignment paces rather than shuts: a share arrives every report.
    assert!(admitted >= 6, "{admitted} admitted");
    let m = sluice.metrics();
    let charged = m
        .get("sluice_rlqs_requests_total{rule=\"checkout\",result=\"charged\"}")
        .copied()
        .unwrap_or(0.0);
    assert!((1.0..=30.0).contains(&charged), "charged {charged}");
}

#[test]
fn the_docs_bootstrap_runs_in_a_real_envoy_and_holds_the_bound() {
    let Some(envoy) = support::envoy_bin() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    // docs/server.md's `rlqs:` section, under the policies of the example (30 a minute).
    let config = format!(
        "{}\n{}",
        "policies:\n  checkout:\n    limits:\n      - { max: 30, per: 1m }\n  tenants:\n    limits:\n      - { max: 100, per: 1m }\n",
        support::yaml_after("server.md", "### Configuring Sluice")
            .split_once("rlqs:")
            .map(|(_, r)| format!("rlqs:{r}"))
            .unwrap()
    );
    let sluice = Sluice::start_in(dir.path(), &config);
    let (listener, app) = (support::port(), support::upstream());
    // The docs' bootstrap with only its addresses changed.
    let bootstrap = support::docs_bootstrap("server.md", "sluice", listener, app, sluice.grpc);
    let _envoy = Envoy::start(&envoy, &bootstrap);
    let (admitted, refused) = drive(listener, 40.0, 10.0, "/checkout", &[]);
    let limit = bound(30, 60, ENVOY_CADENCE_S, 1);
    eprintln!("docs' bootstrap: {admitted} admitted, {refused} refused; bound {limit}");
    assert!(admitted <= limit, "{admitted} admitted, bound {limit}");
    assert!(admitted >= 6, "{admitted} admitted");
    // A tenant's bucket is its own.
    let (tenant, _) = drive(listener, 20.0, 1.0, "/", &[("x-tenant", "acme")]);
    assert!(tenant >= 1, "the tenant's bucket admits");
}

/// Admitted requests per aligned window, by bucket.
type Windows = BTreeMap<(String, u64), u64>;

#[test]
fn three_envoys_over_two_sluice_servers_share_one_limit_per_window_in_redis() {
    let Some(envoy) = support::envoy_bin() else {
        return;
    };
    if !sluice_testkit::require_redis() {
        return;
    }
    let redis = sluice_testkit::RedisServer::start().unwrap();
    // 20 s windows aligned to the epoch, so that every process counts the same windows.
    let (per_s, checkout_max, tenant_max) = (20, 40, 20);
    let config = format!(
        "store: {{ backend: redis, shards: [{{ primary: '{}' }}], timeout: 1s }}\n\
         policies:\n  checkout:\n    limits: [{{ max: {checkout_max}, per: {per_s}s, align: true }}]\n\
         \x20 tenants:\n    limits: [{{ max: {tenant_max}, per: {per_s}s, align: true }}]\n\
         rlqs:\n  buckets:\n    - {{ name: checkout, match: {{ route: checkout }}, policy: checkout }}\n\
         \x20   - {{ name: per-tenant, match: {{ tenant: '*' }}, policy: tenants, key: 'tenant:{{tenant}}' }}\n",
        redis.url()
    );
    let dir = tempfile::tempdir().unwrap();
    let servers = [
        Sluice::start_in(dir.path(), &config),
        Sluice::start_in(dir.path(), &config),
    ];
    let example = support::read("examples/envoy/envoy-rlqs.yaml");
    let envoys: Vec<(Envoy, u16)> = (0..3)
        .map(|i| {
            let listener = support::port();
            let bootstrap =
                support::with_ports(&example, &[(10001, listener), (8081, servers[i % 2].grpc)]);
            (Envoy::start(&envoy, &bootstrap), listener)
        })
        .collect();
    // Each Envoy: checkout at 15/s and two tenants at 5/s each, for four and a half windows
    // (three whole ones at least).
    let secs = 4.5 * per_s as f64;
    let windows = std::sync::Mutex::new(Windows::new());
    std::thread::scope(|s| {
        for (_, listener) in &envoys {
            for bucket in ["checkout", "acme", "globex"] {
                let windows = &windows;
                let listener = *listener;
                s.spawn(move || {
                    let (path, tenant, rate) = match bucket {
                        "checkout" => ("/checkout", None, 15.0),
                        t => ("/", Some(t), 5.0),
                    };
                    let headers: Vec<(&str, &str)> =
                        tenant.map(|t| ("x-tenant", t)).into_iter().collect();
                    let start = support::unix_now();
                    let answers = support::paced(&mut Client::new(listener), rate, secs, |_, c| {
                        c.get(path, &headers).status
                    });
                    let mut w = windows.lock().unwrap();
                    for (at, status) in answers {
                        assert_ne!(status, 0, "every request answered");
                        let window = ((start + at) / per_s as f64) as u64;
                        *w.entry((bucket.to_owned(), window)).or_default() +=
                            u64::from(status != 429);
                    }
                });
            }
        }
    });
    let windows = windows.into_inner().unwrap();
    let n = envoys.len() as u64;
    let first = windows.keys().map(|(_, w)| *w).min().unwrap();
    let last = windows.keys().map(|(_, w)| *w).max().unwrap();
    // What each bucket admitted in its whole windows.
    let mut paced: BTreeMap<&str, u64> = BTreeMap::new();
    for ((bucket, window), admitted) in &windows {
        let max = if bucket == "checkout" {
            checkout_max
        } else {
            tenant_max
        };
        // While the Envoys join, an early one's share was split among fewer: `max + 2 × N × C`.
        let c = (max * ENVOY_CADENCE_S).div_ceil(per_s);
        let limit = if *window == first {
            max + 2 * n * c
        } else {
            bound(max, per_s, ENVOY_CADENCE_S, n)
        };
        let whole = *window != first && *window != last;
        eprintln!(
            "{bucket} window {}: {admitted} admitted (bound {limit}){}",
            window - first,
            if whole { "" } else { ", partial" }
        );
        assert!(
            *admitted <= limit,
            "{bucket} window {window}: {admitted} > {limit}"
        );
        if whole {
            *paced.entry(bucket.as_str()).or_default() += admitted;
        }
    }
    // The share paces, it does not shut: the whole windows admit a good part of their limit,
    // less what a deny held from the window before keeps out until the next report.
    for (bucket, admitted) in paced {
        let max = if bucket == "checkout" {
            checkout_max
        } else {
            tenant_max
        };
        assert!(
            admitted >= 3 * max / 2,
            "{bucket}: {admitted} in three whole windows"
        );
    }
}

#[test]
fn envoy_reopens_its_stream_to_a_restarted_sluice_and_the_bound_holds() {
    let Some(envoy) = support::envoy_bin() else {
        return;
    };
    if !sluice_testkit::require_redis() {
        return;
    }
    let redis = sluice_testkit::RedisServer::start().unwrap();
    let dir = support::repo().join("examples/envoy");
    let config = support::read("examples/envoy/sluice.yaml")
        + &format!(
            "store: {{ backend: redis, shards: [{{ primary: '{}' }}], timeout: 1s }}\n",
            redis.url()
        );
    let mut sluice = Sluice::start_in(&dir, &config);
    let listener = support::port();
    let bootstrap = support::with_ports(
        &support::read("examples/envoy/envoy-rlqs.yaml"),
        &[(10001, listener), (8081, sluice.grpc)],
    );
    let _envoy = Envoy::start(&envoy, &bootstrap);
    // 30 a minute; the server restarts after 6 s, within the window, its count in Redis.
    let ((first, _), (second, _)) = std::thread::scope(|s| {
        let load = s.spawn(|| drive(listener, 20.0, 6.0, "/checkout", &[]));
        let first = load.join().unwrap();
        sluice.restart();
        (first, drive(listener, 20.0, 11.0, "/checkout", &[]))
    });
    let limit = bound(30, 60, ENVOY_CADENCE_S, 1);
    eprintln!("restart: {first} admitted before, {second} after; bound {limit}");
    assert!(first + second <= limit, "{first} + {second} > {limit}");
    // Envoy opened a new stream to the restarted server at its next report and was charged.
    let charged = sluice
        .metrics()
        .get("sluice_rlqs_requests_total{rule=\"checkout\",result=\"charged\"}")
        .copied()
        .unwrap_or(0.0);
    assert!(charged >= 1.0, "the restarted server charged {charged}");
}

#[test]
fn an_idle_bucket_is_abandoned_and_envoy_subscribes_it_again() {
    let Some(envoy) = support::envoy_bin() else {
        return;
    };
    let dir = support::repo().join("examples/envoy");
    // Abandoned after one report of no requests.
    let config = support::read("examples/envoy/sluice.yaml")
        .replace("abandon_after: 5m", "abandon_after: 5s");
    let sluice = Sluice::start_in(&dir, &config);
    let listener = support::port();
    let bootstrap = support::with_ports(
        &support::read("examples/envoy/envoy-rlqs.yaml"),
        &[(10001, listener), (8081, sluice.grpc)],
    );
    let _envoy = Envoy::start(&envoy, &bootstrap);
    let mut c = Client::new(listener);
    assert_eq!(c.get("/checkout", &[]).status, 200);
    let abandoned = |s: &Sluice| {
        s.metrics()
            .get("sluice_rlqs_actions_total{action=\"abandon\"}")
            .copied()
            .unwrap_or(0.0)
    };
    // Envoy reports the idle bucket every 5 s; the first report 5 s after its last
    // request is answered with an abandon.
    support::wait_for(
        std::time::Duration::from_secs(30),
        "the idle bucket is abandoned",
        || abandoned(&sluice) >= 1.0,
        String::new,
    );
    // Envoy forgot it: the next request subscribes it again (a report of its own, at once)
    // and is charged.
    let charged = |s: &Sluice| {
        s.metrics()
            .get("sluice_rlqs_requests_total{rule=\"checkout\",result=\"charged\"}")
            .copied()
            .unwrap_or(0.0)
    };
    let before = charged(&sluice);
    assert_eq!(c.get("/checkout", &[]).status, 200);
    support::wait_for(
        std::time::Duration::from_secs(10),
        "the bucket subscribed again is charged",
        || charged(&sluice) > before,
        String::new,
    );
}
