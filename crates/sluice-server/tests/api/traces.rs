//! Traces over OTLP (docs/configuration.md#tracing), end to end: a collector inside the test
//! receives the spans of HTTP decisions.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use std::time::Duration;

use serde_json::json;

use crate::otlp::{Collector, Received};
use crate::support::TestServer;

const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CALLER: &str = "00f067aa0ba902b7";
/// The exporter sends a batch every 5 s; a loaded machine may take longer.
const WITHIN: Duration = Duration::from_secs(30);
/// `SPAN_KIND_SERVER` and `SPAN_KIND_CLIENT` of the OTLP protocol.
const SERVER: i32 = 2;
const CLIENT: i32 = 3;

fn config(endpoint: &str, sample_ratio: &str) -> String {
    config_over(endpoint, sample_ratio, "grpc")
}

fn config_over(endpoint: &str, sample_ratio: &str, protocol: &str) -> String {
    format!(
        "policies:\n  api:\n    limits:\n      - {{ max: 1, per: 1h }}\n\
         tracing:\n  endpoint: {endpoint}\n  sample_ratio: {sample_ratio}\n  \
         service_name: sluice-under-test\n  protocol: {protocol}\n"
    )
}

async fn check(server: &TestServer, key: &str, traceparent: Option<&str>) -> u16 {
    let mut request = reqwest::Client::new()
        .post(format!("{}/v1/check", server.url))
        .json(&json!({ "policy": "api", "key": key }));
    if let Some(tp) = traceparent {
        request = request.header("traceparent", tp);
    }
    request.send().await.unwrap().status().as_u16()
}

fn named<'a>(spans: &'a [Received], name: &str) -> Vec<&'a Received> {
    spans.iter().filter(|s| s.name() == name).collect()
}

#[tokio::test]
async fn a_check_is_a_span_under_the_callers_traceparent_and_its_store_call_a_child() {
    let collector = Collector::start().await;
    let server = TestServer::start(&config(&collector.endpoint, "1"), &[]).await;
    let traceparent = format!("00-{TRACE}-{CALLER}-01");
    assert_eq!(check(&server, "user:1", Some(&traceparent)).await, 200);
    assert_eq!(check(&server, "user:1", Some(&traceparent)).await, 429);
    // While the server runs: the batch exporter delivers them.
    let spans = collector
        .wait_for(TRACE, WITHIN, |s| {
            named(s, "sluice.http.check").len() == 2 && named(s, "sluice.store").len() == 2
        })
        .await;
    let decisions = named(&spans, "sluice.http.check");
    let mut outcomes = Vec::new();
    for d in &decisions {
        assert_eq!(d.trace_id(), TRACE);
        assert_eq!(
            d.parent_span_id(),
            CALLER,
            "the caller's span is the parent"
        );
        assert_eq!(d.span.kind, SERVER);
        assert_eq!(d.service, "sluice-under-test");
        assert_eq!(d.attr("sluice.policy").as_deref(), Some("api"));
        assert_eq!(d.attr("sluice.cost").as_deref(), Some("1"));
        outcomes.push(d.attr("sluice.outcome").unwrap());
    }
    outcomes.sort();
    assert_eq!(outcomes, ["allowed", "denied"]);
    for store in named(&spans, "sluice.store") {
        let parent = decisions
            .iter()
            .find(|d| d.span_id() == store.parent_span_id())
            .expect("a store call's parent is a decision span");
        assert_eq!(store.span.kind, CLIENT);
        assert_eq!(store.attr("sluice.shard").as_deref(), Some("memory"));
        assert_eq!(store.attr("sluice.op").as_deref(), Some("check"));
        assert_eq!(store.attr("sluice.outcome"), parent.attr("sluice.outcome"));
    }
    // A decision without a traceparent starts its own trace (sample_ratio 1 keeps it); the
    // graceful stop flushes it.
    assert_eq!(check(&server, "user:2", None).await, 200);
    server.stop().await;
    let roots: Vec<Received> = collector
        .spans()
        .into_iter()
        .filter(|s| s.name() == "sluice.http.check" && s.trace_id() != TRACE)
        .collect();
    assert_eq!(roots.len(), 1, "the last decision is exported at stop");
    assert!(roots[0].parent_span_id().is_empty(), "a root span");
}

#[tokio::test]
async fn sampling_follows_the_callers_flag_and_the_ratio_for_traces_started_here() {
    let collector = Collector::start().await;
    let server = TestServer::start(&config(&collector.endpoint, "0"), &[]).await;
    let sampled = format!("00-{TRACE}-{CALLER}-01");
    let unsampled = format!("00-{}-{CALLER}-00", "a".repeat(32));
    assert_eq!(check(&server, "a", Some(&sampled)).await, 200);
    assert_eq!(check(&server, "b", Some(&unsampled)).await, 200);
    assert_eq!(check(&server, "c", None).await, 200);
    server.stop().await;
    let spans = collector.spans();
    let traces: std::collections::BTreeSet<String> = spans.iter().map(Received::trace_id).collect();
    assert_eq!(
        traces.into_iter().collect::<Vec<_>>(),
        [TRACE],
        "only the trace its caller sampled is kept at sample_ratio 0"
    );
    assert_eq!(named(&spans, "sluice.http.check").len(), 1);
    assert_eq!(named(&spans, "sluice.store").len(), 1);
}

#[tokio::test]
async fn without_a_tracing_section_nothing_is_exported() {
    let collector = Collector::start().await;
    let traceparent = format!("00-{TRACE}-{CALLER}-01");
    let off = TestServer::start(
        "policies:\n  api:\n    limits:\n      - { max: 1, per: 1h }\n",
        &[],
    )
    .await;
    assert_eq!(check(&off, "k", Some(&traceparent)).await, 200);
    off.stop().await;
    assert_eq!(collector.exports(), 0, "tracing is off by default");
    // The same request to a server pointed at this collector is exported: the receiver works.
    let on = TestServer::start(&config(&collector.endpoint, "1"), &[]).await;
    assert_eq!(check(&on, "k", Some(&traceparent)).await, 200);
    on.stop().await;
    assert!(collector.exports() >= 1);
}

#[tokio::test]
async fn over_otlp_http_the_spans_arrive_with_their_parents() {
    let collector = Collector::start_http().await;
    let server = TestServer::start(&config_over(&collector.endpoint, "1", "http"), &[]).await;
    let traceparent = format!("00-{TRACE}-{CALLER}-01");
    assert_eq!(check(&server, "user:1", Some(&traceparent)).await, 200);
    let spans = collector
        .wait_for(TRACE, WITHIN, |s| {
            named(s, "sluice.http.check").len() == 1 && named(s, "sluice.store").len() == 1
        })
        .await;
    let decision = named(&spans, "sluice.http.check")[0];
    assert_eq!(decision.parent_span_id(), CALLER);
    assert_eq!(decision.attr("sluice.outcome").as_deref(), Some("allowed"));
    let store = named(&spans, "sluice.store")[0];
    assert_eq!(store.parent_span_id(), decision.span_id());
    assert_eq!(store.attr("sluice.shard").as_deref(), Some("memory"));
    server.stop().await;
}

#[tokio::test]
async fn a_collector_that_is_down_fails_no_decision_and_the_server_still_stops() {
    // A port nothing listens on: every export fails.
    let closed = {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        format!("http://{}", listener.local_addr().unwrap())
    };
    let server = TestServer::start(&config(&closed, "1"), &[]).await;
    let traceparent = format!("00-{TRACE}-{CALLER}-01");
    let mut statuses = Vec::new();
    for _ in 0..20 {
        statuses.push(check(&server, "user:1", Some(&traceparent)).await);
    }
    let mut expected = vec![429; 20];
    expected[0] = 200;
    assert_eq!(statuses, expected, "decided as without tracing");
    server.stop().await;
}

/// A check carrying a `traceparent` and a `tracestate`.
async fn check_traced(server: &TestServer, key: &str, traceparent: &str, tracestate: &str) {
    let status = reqwest::Client::new()
        .post(format!("{}/v1/check", server.url))
        .header("traceparent", traceparent)
        .header("tracestate", tracestate)
        .json(&json!({ "policy": "api", "key": key }))
        .send()
        .await
        .unwrap()
        .status();
    assert_eq!(status, 200);
}

/// Clients steer neither what is traced nor what the spans carry once
/// `follow_callers: false`: at `sample_ratio: 0` a sampled `traceparent` exports nothing, at
/// 1 the spans are still children of the caller's trace but without its `tracestate`. A
/// `tracestate` over 512 bytes is never carried, a short one is while callers are followed.
#[tokio::test]
async fn callers_steer_neither_sampling_nor_tracestate_unless_followed() {
    let sampled = format!("00-{TRACE}-{CALLER}-01");
    let short = "vendor=abc";
    // 30 members of 20 bytes: valid, 599 bytes.
    let long = (0..30)
        .map(|i| format!("member{i:02}=vvvvvvvvvvv"))
        .collect::<Vec<_>>()
        .join(",");
    let ignoring = |endpoint: &str, ratio: &str| {
        format!("{}  follow_callers: false\n", config(endpoint, ratio))
    };

    let collector = Collector::start().await;
    let server = TestServer::start(&ignoring(&collector.endpoint, "0"), &[]).await;
    for i in 0..20 {
        check_traced(&server, &format!("k{i}"), &sampled, &long).await;
    }
    server.stop().await;
    assert!(collector.spans().is_empty(), "{:?}", collector.spans());

    let server = TestServer::start(&ignoring(&collector.endpoint, "1"), &[]).await;
    check_traced(&server, "k", &sampled, short).await;
    server.stop().await;
    let spans = collector.spans();
    let decision = named(&spans, "sluice.http.check");
    assert_eq!(decision.len(), 1);
    assert_eq!(decision[0].trace_id(), TRACE);
    assert_eq!(decision[0].parent_span_id(), CALLER);
    assert_eq!(decision[0].span.trace_state, "");

    let collector = Collector::start().await;
    let server = TestServer::start(&config(&collector.endpoint, "0"), &[]).await;
    check_traced(&server, "short", &sampled, short).await;
    check_traced(&server, "long", &sampled, &long).await;
    server.stop().await;
    let spans = collector.spans();
    let states: Vec<&str> = named(&spans, "sluice.http.check")
        .iter()
        .map(|s| s.span.trace_state.as_str())
        .collect();
    assert_eq!(states.len(), 2);
    assert!(
        states.contains(&short) && states.contains(&""),
        "{states:?}"
    );
}
