//! What `/metrics` tells an operator beyond the decisions: the limits in force (changed by a
//! reload), the decisions near their limit, and the process' own figures.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use std::time::Duration;

use serde_json::json;

use crate::support::{TestServer, post, scrape};

/// The value of the sample of `name` whose labels are exactly `labels` (in any order).
fn sample(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    text.lines().find_map(|line| {
        let rest = line.strip_prefix(name)?;
        let (set, value) = match rest.strip_prefix('{') {
            Some(r) => r.split_once("} ")?,
            None => ("", rest.strip_prefix(' ')?),
        };
        let mut got: Vec<&str> = set.split(',').filter(|s| !s.is_empty()).collect();
        let mut want: Vec<String> = labels.iter().map(|(k, v)| format!("{k}=\"{v}\"")).collect();
        got.sort_unstable();
        want.sort_unstable();
        (got == want).then(|| value.trim().parse().unwrap())
    })
}

async fn check(c: &reqwest::Client, url: &str, policy: &str) -> u16 {
    post(
        c,
        &format!("{url}/v1/check"),
        json!({"policy": policy, "key": "k"}),
    )
    .await
    .status()
    .as_u16()
}

const GAUGED: &str = "\
policies:
  gauged:
    limits:
      - { max: 5, per: 10s }
      - { max: 100, per: 1h, algorithm: sliding_window }
  removed:
    limits:
      - { max: 3, per: 1m, algorithm: token_bucket }
";

/// Each limit of each policy is a gauge of its max; a reload changes it, and a policy it
/// removes has no series any more.
#[tokio::test]
async fn limit_gauges_follow_the_configuration_through_a_reload() {
    let s = TestServer::start(GAUGED, &[]).await;
    let text = scrape(&s.url).await;
    let limit = |text: &str, policy: &str, i: &str, per: &str, algorithm: &str| {
        let labels = [
            ("policy", policy),
            ("limit", i),
            ("per", per),
            ("algorithm", algorithm),
        ];
        sample(text, "sluice_limit_max", &labels)
    };
    assert_eq!(
        limit(&text, "gauged", "0", "10s", "fixed_window"),
        Some(5.0),
        "{text}"
    );
    assert_eq!(
        limit(&text, "gauged", "1", "1h", "sliding_window"),
        Some(100.0)
    );
    assert_eq!(
        limit(&text, "removed", "0", "1m", "token_bucket"),
        Some(3.0)
    );
    assert!(text.contains("# TYPE sluice_limit_max gauge"), "{text}");
    assert!(text.contains("# HELP sluice_limit_max "), "{text}");

    std::fs::write(
        &s.file,
        "policies:\n  gauged:\n    limits:\n      - { max: 7, per: 10s }\n",
    )
    .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let text = loop {
        let text = scrape(&s.url).await;
        if limit(&text, "gauged", "0", "10s", "fixed_window") == Some(7.0) {
            break text;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "never reloaded:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(
        limit(&text, "gauged", "1", "1h", "sliding_window"),
        None,
        "{text}"
    );
    assert!(!text.contains("policy=\"removed\""), "{text}");
    s.stop().await;
}

/// `sluice_decisions_near_limit_total` of `policy` in the scraped `text`.
fn near(text: &str, policy: &str) -> Option<f64> {
    sample(
        text,
        "sluice_decisions_near_limit_total",
        &[("policy", policy)],
    )
}

/// With max 10 and the default ratio (0.8), the 8th admitted decision is the first near
/// its limit; each admitted one after it counts too, a denied one does not.
#[tokio::test]
async fn near_limit_counts_from_eighty_percent_used() {
    let s = TestServer::start(
        "policies:\n  nearly:\n    limits:\n      - { max: 10, per: 1h }\n      - { max: 1000, per: 1d }\n",
        &[],
    )
    .await;
    let c = reqwest::Client::new();
    let near = |text: &str| near(text, "nearly");
    for _ in 0..7 {
        assert_eq!(check(&c, &s.url, "nearly").await, 200);
    }
    let text = scrape(&s.url).await;
    assert_eq!(near(&text), None, "{text}");
    assert_eq!(check(&c, &s.url, "nearly").await, 200);
    assert_eq!(near(&scrape(&s.url).await), Some(1.0));
    // A peek leaves the count alone.
    let peek = s
        .post(&c, "/v1/peek", json!({"policy": "nearly", "key": "k"}))
        .await;
    assert_eq!(peek.status(), 200);
    assert_eq!(check(&c, &s.url, "nearly").await, 200);
    assert_eq!(check(&c, &s.url, "nearly").await, 200);
    assert_eq!(check(&c, &s.url, "nearly").await, 429);
    let text = scrape(&s.url).await;
    assert_eq!(near(&text), Some(3.0), "{text}");
    assert!(
        text.contains("# HELP sluice_decisions_near_limit_total "),
        "{text}"
    );
    s.stop().await;
}

/// Two servers in one process each count only what they decided: traffic to one leaves the
/// other's `/metrics` without any of it.
#[tokio::test]
async fn two_servers_in_one_process_keep_their_own_metrics() {
    const CONFIG: &str = "policies:\n  own:\n    limits:\n      - { max: 2, per: 1h }\n";
    let (busy, quiet) = (
        TestServer::start(CONFIG, &[]).await,
        TestServer::start(CONFIG, &[]).await,
    );
    let c = reqwest::Client::new();
    for want in [200, 200, 429] {
        assert_eq!(check(&c, &busy.url, "own").await, want);
    }
    let decisions = |text: &str, outcome: &str| {
        let labels = [("policy", "own"), ("op", "check"), ("outcome", outcome)];
        sample(text, "sluice_decisions_total", &labels)
    };
    let text = scrape(&busy.url).await;
    assert_eq!(decisions(&text, "allowed"), Some(2.0), "{text}");
    assert_eq!(decisions(&text, "denied"), Some(1.0), "{text}");
    assert!(
        text.contains("sluice_decision_latency_seconds_count{op=\"check\"} 3"),
        "{text}"
    );
    let text = scrape(&quiet.url).await;
    assert!(!text.contains("sluice_decision"), "{text}");
    assert_eq!(check(&c, &quiet.url, "own").await, 200);
    let text = scrape(&quiet.url).await;
    assert_eq!(decisions(&text, "allowed"), Some(1.0), "{text}");
    assert_eq!(decisions(&text, "denied"), None, "{text}");
    busy.stop().await;
    quiet.stop().await;
}

/// `metrics.near_limit_ratio` sets the ratio (reloaded with the policies); a ratio outside
/// (0, 1] is refused, naming the field.
#[tokio::test]
async fn near_limit_ratio_is_configurable() {
    let s = TestServer::start(
        "metrics:\n  near_limit_ratio: 0.5\npolicies:\n  halved:\n    limits:\n      - { max: 4, per: 1h }\n",
        &[],
    )
    .await;
    let c = reqwest::Client::new();
    let near = |text: &str| near(text, "halved");
    assert_eq!(check(&c, &s.url, "halved").await, 200);
    assert_eq!(near(&scrape(&s.url).await), None);
    assert_eq!(check(&c, &s.url, "halved").await, 200);
    assert_eq!(near(&scrape(&s.url).await), Some(1.0));
    s.stop().await;

    for bad in ["0", "1.5", "-0.2", "high"] {
        let text = format!("metrics:\n  near_limit_ratio: {bad}\n");
        let e = sluice_server::config::Config::parse("bad.yaml", &text).unwrap_err();
        assert!(
            e.to_string().contains("metrics.near_limit_ratio"),
            "{bad}: {e}"
        );
    }
    let e = sluice_server::config::Config::parse("bad.yaml", "metrics:\n  near_ratio: 0.5\n")
        .unwrap_err();
    assert!(e.to_string().contains("near_ratio"), "{e}");
}

/// The process metrics under the names Prometheus' client libraries use, with plausible
/// values (Linux only: elsewhere they are absent).
#[cfg(target_os = "linux")]
#[tokio::test]
async fn process_metrics_are_present_and_plausible() {
    let s = TestServer::start("policies: {}\n", &[]).await;
    let text = scrape(&s.url).await;
    let value = |name: &str| {
        assert!(text.contains(&format!("# HELP {name} ")), "{name}:\n{text}");
        sample(&text, name, &[]).unwrap_or_else(|| panic!("{name}:\n{text}"))
    };
    let rss = value("process_resident_memory_bytes");
    assert!(rss > 1_000_000.0 && rss < 64e9, "{rss}");
    let open = value("process_open_fds");
    // The listeners and the connection of this scrape at least.
    assert!(open >= 3.0, "{open}");
    assert!(value("process_max_fds") >= open);
    assert!(value("process_cpu_seconds_total") >= 0.0);
    assert!(value("process_threads") >= 1.0);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let start = value("process_start_time_seconds");
    // This test process started the server: at most an hour ago, not in the future.
    assert!(
        start <= now + 1.0 && start > now - 3600.0,
        "{start} vs {now}"
    );
    assert!(
        text.contains("# TYPE process_cpu_seconds_total counter"),
        "{text}"
    );
    s.stop().await;
}
