//! What `/metrics` says of the Envoy rules: each rule's limit (changed by a reload of the
//! rule files) and the descriptors that leave a rule near its limit.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use std::time::Duration;

use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;

use crate::support::{self, scrape};

const RULES: &str = "
domain: gauges
descriptors:
  - key: remote_address
    rate_limit: { unit: hour, requests_per_unit: 10 }
  - key: user
    descriptors:
      - key: plan
        value: free
        rate_limit: { unit: day, requests_per_unit: 2 }
  - key: trusted
    rate_limit: { unlimited: true }
";

/// 2023-11-14 22:13:20 UTC: well inside an hour, so the hour's window does not turn.
const NOW_MS: u64 = 1_700_000_000_000;

/// The value of the sample `series` (name and labels exactly as the exporter writes them).
fn value(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

fn ask(entries: &[(&str, &str)]) -> RateLimitRequest {
    support::rls_request("gauges", &[entries], 0)
}

/// Each limited rule is a gauge of its `requests_per_unit` by domain, key path and unit;
/// an unlimited rule has none; a reload of the rule files changes and removes them.
#[tokio::test]
async fn rule_gauges_follow_the_rule_files() {
    let s = support::TestServer::start(
        "rls:\n  config_dir: rules\n",
        &[("rules/gauges.yaml", RULES)],
    )
    .await;
    let text = scrape(&s.url).await;
    let per_ip = r#"sluice_rule_limit{domain="gauges",rule="gauges.remote_address",unit="hour"}"#;
    let free = r#"sluice_rule_limit{domain="gauges",rule="gauges.user.plan_free",unit="day"}"#;
    assert_eq!(value(&text, per_ip), Some(10.0), "{text}");
    assert_eq!(value(&text, free), Some(2.0), "{text}");
    assert!(
        !text.contains("gauges.trusted"),
        "an unlimited rule has no gauge:\n{text}"
    );

    let rules = s.dir.path().join("rules/gauges.yaml");
    std::fs::write(
        &rules,
        "domain: gauges\ndescriptors:\n  - key: remote_address\n    rate_limit: { unit: minute, requests_per_unit: 20 }\n",
    )
    .unwrap();
    let per_ip_now =
        r#"sluice_rule_limit{domain="gauges",rule="gauges.remote_address",unit="minute"}"#;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let text = loop {
        let text = scrape(&s.url).await;
        if value(&text, per_ip_now) == Some(20.0) {
            break text;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "never reloaded:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(value(&text, per_ip), None, "{text}");
    assert_eq!(value(&text, free), None, "{text}");
    s.stop().await;
}

/// With 10 per hour, the 8th hit within the limit is the first near it (80 %); hits over
/// the limit and hits of unlimited rules are not counted.
#[tokio::test]
async fn near_limit_counts_envoy_hits_from_eighty_percent() {
    let s = support::TestServer::start_with_clock(
        "rls:\n  config_dir: rules\n",
        &[("rules/gauges.yaml", RULES)],
        sluice::ManualClock::new(NOW_MS),
    )
    .await;
    let mut c = RateLimitServiceClient::new(s.channel().await);
    let near = r#"sluice_decisions_near_limit_total{policy="gauges"}"#;
    let mut call = async |entries: &[(&str, &str)]| {
        c.should_rate_limit(ask(entries))
            .await
            .unwrap()
            .into_inner()
            .overall_code
    };
    for _ in 0..7 {
        assert_eq!(
            call(&[("remote_address", "10.0.0.1")]).await,
            Code::Ok as i32
        );
        assert_eq!(call(&[("trusted", "yes")]).await, Code::Ok as i32);
    }
    let text = scrape(&s.url).await;
    assert_eq!(value(&text, near), None, "{text}");
    assert!(!text.contains("gauges.trusted\"} "), "{text}");
    assert_eq!(
        call(&[("remote_address", "10.0.0.1")]).await,
        Code::Ok as i32
    );
    assert_eq!(value(&scrape(&s.url).await, near), Some(1.0));
    assert_eq!(
        call(&[("remote_address", "10.0.0.1")]).await,
        Code::Ok as i32
    );
    assert_eq!(
        call(&[("remote_address", "10.0.0.1")]).await,
        Code::Ok as i32
    );
    assert_eq!(
        call(&[("remote_address", "10.0.0.1")]).await,
        Code::OverLimit as i32
    );
    let text = scrape(&s.url).await;
    assert_eq!(value(&text, near), Some(3.0), "{text}");
    s.stop().await;
}
