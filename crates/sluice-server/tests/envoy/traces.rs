//! Traces over OTLP (docs/configuration.md#tracing) of Envoy's calls: `ShouldRateLimit` and
//! an RLQS report carry the `traceparent` in their gRPC metadata, as Envoy sends it with its
//! tracing on; a collector inside the test receives the spans.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use std::time::Duration;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_client::RateLimitQuotaServiceClient;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{BucketId, RateLimitQuotaUsageReports};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};

use crate::otlp::{Collector, Received};
use crate::support::{self, TestServer};

const WITHIN: Duration = Duration::from_secs(30);

// A day's window: the second request comes a batch export (5 s) after the first, and it must
// fall in the same window of the real clock (with a minute, 1 run in 12 would cross one).
const RLS_YAML: &str = r#"
domain: edge
descriptors:
  - key: remote_address
    rate_limit:
      unit: day
      requests_per_unit: 1
"#;

fn with_traceparent<T>(message: T, trace: &str, parent: &str) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.metadata_mut().insert(
        "traceparent",
        format!("00-{trace}-{parent}-01").parse().unwrap(),
    );
    request
}

/// `request` asked under Envoy's span `parent` of `trace`.
async fn ask_under(
    client: &mut RateLimitServiceClient<tonic::transport::Channel>,
    request: RateLimitRequest,
    trace: &str,
    parent: &str,
) -> RateLimitResponse {
    client
        .should_rate_limit(with_traceparent(request, trace, parent))
        .await
        .unwrap()
        .into_inner()
}

fn named<'a>(spans: &'a [Received], name: &str) -> Vec<&'a Received> {
    spans.iter().filter(|s| s.name() == name).collect()
}

/// Whether `spans` hold `n` spans of each `(name, n)`.
fn counted(spans: &[Received], counts: &[(&str, usize)]) -> bool {
    counts
        .iter()
        .all(|&(name, n)| named(spans, name).len() == n)
}

/// Two Redis shards: each descriptor's store call is a span naming the shard that decided it.
#[tokio::test]
async fn should_rate_limit_is_a_span_under_envoys_traceparent_with_a_store_span_per_shard_call() {
    let (Some(a), Some(b)) = (support::redis(), support::redis()) else {
        return;
    };
    let collector = Collector::start().await;
    let config = format!(
        "rls:\n  config_dir: ratelimit-config\n\
         store:\n  backend: redis\n  timeout: 2s\n  shards:\n    - primary: {}\n    - primary: {}\n\
         tracing:\n  endpoint: {}\n  protocol: grpc\n  sample_ratio: 1\n",
        a.url(),
        b.url(),
        collector.endpoint
    );
    let server = TestServer::start(&config, &[("ratelimit-config/edge.yaml", RLS_YAML)]).await;
    let mut client = RateLimitServiceClient::new(server.channel().await);
    let (trace, envoy_span) = ("0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331");
    // The shards' names carry their random ports, so where a key goes changes from run to run:
    // with 8 keys all of them fell on one shard in 1 run of 128; with 32, once in 2^31.
    let addresses: Vec<String> = (1..=32).map(|i| format!("10.0.0.{i}")).collect();
    let request = || RateLimitRequest {
        domain: "edge".to_owned(),
        descriptors: addresses
            .iter()
            .map(|a| RateLimitDescriptor {
                entries: vec![Entry {
                    key: "remote_address".to_owned(),
                    value: a.clone(),
                }],
                ..RateLimitDescriptor::default()
            })
            .collect(),
        hits_addend: 1,
    };
    let first = ask_under(&mut client, request(), trace, envoy_span).await;
    assert_eq!(first.overall_code, Code::Ok as i32);
    let spans = collector
        .wait_for(trace, WITHIN, |s| {
            let stores = addresses.len();
            counted(
                s,
                &[
                    ("sluice.rls.should_rate_limit", 1),
                    ("sluice.store", stores),
                ],
            )
        })
        .await;
    let decision = named(&spans, "sluice.rls.should_rate_limit")[0];
    assert_eq!(
        decision.parent_span_id(),
        envoy_span,
        "Envoy's span is the parent"
    );
    assert_eq!(decision.attr("sluice.domain").as_deref(), Some("edge"));
    assert_eq!(decision.attr("sluice.outcome").as_deref(), Some("allowed"));
    let shards = [a.url(), b.url()];
    let mut used = std::collections::BTreeSet::new();
    for store in named(&spans, "sluice.store") {
        assert_eq!(store.parent_span_id(), decision.span_id());
        assert_eq!(store.attr("sluice.outcome").as_deref(), Some("allowed"));
        let shard = store.attr("sluice.shard").unwrap();
        let index: usize = store.attr("sluice.shard.index").unwrap().parse().unwrap();
        assert_eq!(shard, shards[index], "the shard's name and its place agree");
        used.insert(index);
    }
    assert_eq!(used.len(), 2, "32 keys spread over both shards");
    // Over the limit now: the decision and each store call say denied.
    let (trace2, span2) = ("1af7651916cd43dd8448eb211c80319c", "c7ad6b7169203331");
    let second = ask_under(&mut client, request(), trace2, span2).await;
    assert_eq!(second.overall_code, Code::OverLimit as i32);
    server.stop().await;
    let spans: Vec<Received> = collector
        .spans()
        .into_iter()
        .filter(|s| s.trace_id() == trace2)
        .collect();
    let decision = named(&spans, "sluice.rls.should_rate_limit")[0];
    assert_eq!(decision.attr("sluice.outcome").as_deref(), Some("denied"));
    let denied = named(&spans, "sluice.store")
        .iter()
        .filter(|s| s.attr("sluice.outcome").as_deref() == Some("denied"))
        .count();
    assert_eq!(denied, addresses.len());
}

#[tokio::test]
async fn an_rlqs_report_is_a_span_under_the_streams_traceparent() {
    let collector = Collector::start().await;
    let config = format!(
        "policies:\n  per-route:\n    limits:\n      - {{ max: 100, per: 1m }}\n\
         rlqs:\n  reporting_interval: 1s\n  buckets:\n    \
         - {{ match: {{ route: '*' }}, policy: per-route, key: 'route:{{route}}' }}\n\
         tracing:\n  endpoint: {}\n",
        collector.endpoint
    );
    let server = TestServer::start(&config, &[]).await;
    let mut client = RateLimitQuotaServiceClient::new(server.channel().await);
    let (trace, envoy_span) = ("2af7651916cd43dd8448eb211c80319c", "d7ad6b7169203331");
    let report = RateLimitQuotaUsageReports {
        domain: "edge".to_owned(),
        bucket_quota_usages: vec![BucketQuotaUsage {
            bucket_id: Some(BucketId {
                bucket: [("route".to_owned(), "/api".to_owned())].into(),
            }),
            num_requests_allowed: 3,
            ..BucketQuotaUsage::default()
        }],
    };
    let outbound = tokio_stream::iter(vec![report]);
    let mut answers = client
        .stream_rate_limit_quotas(with_traceparent(outbound, trace, envoy_span))
        .await
        .unwrap()
        .into_inner();
    answers.message().await.unwrap().expect("an answer");
    let spans = collector
        .wait_for(trace, WITHIN, |s| {
            counted(s, &[("sluice.rlqs.report", 1), ("sluice.store", 1)])
        })
        .await;
    let report = named(&spans, "sluice.rlqs.report")[0];
    assert_eq!(report.parent_span_id(), envoy_span);
    assert_eq!(report.attr("sluice.buckets").as_deref(), Some("1"));
    assert_eq!(report.attr("sluice.outcome").as_deref(), Some("answered"));
    let store = named(&spans, "sluice.store")[0];
    assert_eq!(store.parent_span_id(), report.span_id());
    assert_eq!(store.attr("sluice.op").as_deref(), Some("acquire"));
    assert_eq!(store.attr("sluice.shard").as_deref(), Some("memory"));
    assert_eq!(store.attr("sluice.outcome").as_deref(), Some("allowed"));
    drop(answers);
    server.stop().await;
}
