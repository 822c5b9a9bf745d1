//! One trace across Envoy and Sluice: a real Envoy with its OpenTelemetry tracer sends its
//! spans to a collector inside the test, and so does `sluice serve`; the `ShouldRateLimit`
//! call Envoy makes carries its trace context, so Sluice's decision span is a child of Envoy's
//! span of that call, in the same trace.

use std::time::Duration;

use crate::otlp::{Collector, Received};
use crate::support::{self, Client, Envoy, Sluice};

/// The example's Envoy with tracing on: every request sampled, spans to `otlp` over gRPC.
fn traced_bootstrap(listener: u16, sluice_grpc: u16, otlp: u16) -> String {
    let bootstrap = support::with_ports(
        &support::read("examples/envoy/envoy-rls.yaml"),
        &[
            (10000, listener),
            (10010, support::port()),
            (8081, sluice_grpc),
        ],
    );
    let tracing = "                stat_prefix: ingress
                tracing:
                  random_sampling: { value: 100 }
                  provider:
                    name: envoy.tracers.opentelemetry
                    typed_config:
                      \"@type\": type.googleapis.com/envoy.config.trace.v3.OpenTelemetryConfig
                      service_name: envoy
                      grpc_service:
                        envoy_grpc: { cluster_name: otlp }
                        timeout: 1s
";
    let otlp_cluster = format!(
        "  clusters:
    - name: otlp
      type: STATIC
      typed_extension_protocol_options:
        envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
          \"@type\": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
          explicit_http_config:
            http2_protocol_options: {{}}
      load_assignment:
        cluster_name: otlp
        endpoints:
          - lb_endpoints:
              - endpoint: {{ address: {{ socket_address: {{ address: 127.0.0.1, port_value: {otlp} }} }} }}
"
    );
    bootstrap
        .replacen("                stat_prefix: ingress\n", tracing, 1)
        .replacen("  clusters:\n", &otlp_cluster, 1)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoys_span_is_the_parent_of_sluices_decision_span() {
    let Some(bin) = support::envoy_bin() else {
        return;
    };
    let collector = Collector::start().await;
    let otlp: u16 = collector
        .endpoint
        .rsplit(':')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let dir = support::repo().join("examples/envoy");
    let config = format!(
        "{}tracing:\n  endpoint: {}\n  protocol: grpc\n  sample_ratio: 1\n",
        support::read("examples/envoy/sluice.yaml"),
        collector.endpoint
    );
    let (listener, envoy_bin) = (support::port(), bin.clone());
    let (sluice, _envoy) = tokio::task::spawn_blocking(move || {
        let sluice = Sluice::start_in(&dir, &config);
        let envoy = Envoy::start(&envoy_bin, &traced_bootstrap(listener, sluice.grpc, otlp));
        let answer = Client::new(listener).get("/", &[]);
        assert_eq!(answer.status, 200);
        (sluice, envoy)
    })
    .await
    .unwrap();
    // Sluice's span, once both processes have exported theirs (each every few seconds).
    let decision = "sluice.rls.should_rate_limit";
    let trace = wait_for_span(&collector, decision).await;
    let spans = collector
        .wait_for(&trace, Duration::from_secs(30), |spans| {
            spans.iter().any(|s| s.service == "envoy")
        })
        .await;
    let ours = spans.iter().find(|s| s.name() == decision).unwrap();
    let parent = spans
        .iter()
        .find(|s| s.span_id() == ours.parent_span_id())
        .unwrap_or_else(|| panic!("no span of the trace is the parent of Sluice's: {spans:#?}"));
    assert_eq!(parent.service, "envoy", "{parent:#?}");
    assert_ne!(ours.service, "envoy");
    // Envoy's own request span is in the same trace.
    assert!(
        spans.iter().filter(|s| s.service == "envoy").count() >= 2,
        "{spans:#?}"
    );
    drop(sluice);
}

/// The trace id of the first span named `name` the collector receives.
async fn wait_for_span(collector: &Collector, name: &str) -> String {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let found: Option<Received> = collector.spans().into_iter().find(|s| s.name() == name);
        if let Some(s) = found {
            return s.trace_id();
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no `{name}` span arrived: {:#?}",
            collector.spans()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
