//! Traces of decisions over OTLP (docs/configuration.md#tracing): one span per decision, a
//! child span per store call, the parent taken from the caller's W3C `traceparent`.
//!
//! The spans are made with the OpenTelemetry API on a tracer provider the server owns, not
//! through the process's `tracing` subscriber: `app::run` is a function tests call in one
//! process with different configurations, and a global subscriber would mix their spans. Off
//! (no `tracing` section, no `OTEL_EXPORTER_OTLP_ENDPOINT`), [`Traces`] holds nothing and a
//! request pays one `Option` test: no header is parsed, no span made.
//!
//! Export never slows a decision: spans go to a bounded queue (2048 unless
//! `OTEL_BSP_MAX_QUEUE_SIZE` says otherwise) drained by a batch processor on its own thread;
//! when the queue is full a span is dropped, and the SDK logs the first drop and the count at
//! shutdown (through `tracing`, target `opentelemetry_sdk`), as it logs a failed export once
//! per batch.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use opentelemetry::context::FutureExt as _;
use opentelemetry::propagation::{Extractor, TextMapPropagator as _};
use opentelemetry::trace::{SpanKind, Status, TraceContextExt as _, Tracer as _};
use opentelemetry::{Context, KeyValue};
use opentelemetry_otlp::{WithExportConfig as _, WithHttpConfig as _, WithTonicConfig as _};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{BatchSpanProcessor, Sampler, SdkTracer, SdkTracerProvider};

use crate::observe::Untrusted;

pub mod settings;

pub use settings::{TraceProtocol, TraceSettings};

/// How long a stopping server waits for the last spans to reach the collector.
const FLUSH_TIMEOUT: Duration = Duration::from_secs(5);
/// How long one export may take (the OTLP default).
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

/// The server's tracer, or nothing when tracing is off. Cheap to clone.
#[derive(Debug, Clone, Default)]
pub(crate) struct Traces(Option<Arc<On>>);

#[derive(Debug)]
struct On {
    provider: SdkTracerProvider,
    tracer: SdkTracer,
    propagator: TraceContextPropagator,
    /// `tracing.follow_callers`: a caller's `tracestate` is read only then.
    follow_callers: bool,
}

impl On {
    /// A span named `name`, child of `parent`.
    fn span(&self, name: &'static str, kind: SpanKind, parent: Context) -> Traced {
        let builder = self.tracer.span_builder(name).with_kind(kind);
        Traced(Some(
            parent.with_span(builder.start_with_context(&self.tracer, &parent)),
        ))
    }
}

/// The longest `tracestate` carried into the spans: what W3C Trace Context asks a vendor to
/// propagate at least. A longer one (up to 32 members, kilobytes a request) is dropped
/// whole, so a client cannot make every span it starts that much larger.
const MAX_TRACESTATE: usize = 512;

/// How a decision's trace is sampled: a span inside a decision follows its decision; a
/// decision follows its caller's `traceparent` flag when `follow_callers`, else (and when
/// there is no caller's trace) `sample_ratio` decides, drawn at random rather than read from
/// the trace id, which a caller would choose.
fn sampler(settings: &TraceSettings) -> opentelemetry_sdk::trace::ParentBasedSampler {
    let drawn = Drawn(settings.sample_ratio);
    let local = Sampler::parent_based(drawn.clone());
    if settings.follow_callers {
        local
    } else {
        local
            .with_remote_parent_sampled(drawn.clone())
            .with_remote_parent_not_sampled(drawn)
    }
}

/// Kept with probability `.0`, drawn at random; a span it keeps carries no `tracestate`.
#[derive(Debug, Clone)]
struct Drawn(f64);

impl opentelemetry_sdk::trace::ShouldSample for Drawn {
    fn should_sample(
        &self,
        _parent: Option<&Context>,
        _trace_id: opentelemetry::trace::TraceId,
        _name: &str,
        _kind: &SpanKind,
        _attributes: &[KeyValue],
        _links: &[opentelemetry::trace::Link],
    ) -> opentelemetry_sdk::trace::SamplingResult {
        use opentelemetry_sdk::trace::SamplingDecision;
        let keep = rand::random::<f64>() < self.0;
        opentelemetry_sdk::trace::SamplingResult {
            decision: if keep {
                SamplingDecision::RecordAndSample
            } else {
                SamplingDecision::Drop
            },
            attributes: Vec::new(),
            trace_state: opentelemetry::trace::TraceState::default(),
        }
    }
}

/// The caller's trace context as the propagator reads it: its `tracestate` only when callers
/// are followed and it is at most [`MAX_TRACESTATE`] bytes.
struct Bounded<'a> {
    carrier: &'a dyn Extractor,
    tracestate: bool,
}

impl Extractor for Bounded<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        let value = self.carrier.get(key)?;
        let dropped = key.eq_ignore_ascii_case("tracestate")
            && (!self.tracestate || value.len() > MAX_TRACESTATE);
        (!dropped).then_some(value)
    }

    fn keys(&self) -> Vec<&str> {
        self.carrier.keys()
    }
}

/// The exporter could not be built from the settings.
#[derive(Debug, thiserror::Error)]
#[error("tracing.endpoint: cannot export to {endpoint}: {reason}")]
pub struct TraceError {
    endpoint: crate::url::ConfiguredUrl,
    reason: String,
}

/// [`Traces::default`] is tracing off.
impl Traces {
    /// Exports to the collector of `settings`. Called inside the server's Tokio runtime (the
    /// gRPC exporter's connection lives there); connecting is lazy, so a collector that is
    /// down is no error here, its spans are dropped later.
    pub(crate) fn start(settings: &TraceSettings) -> Result<Self, TraceError> {
        let failed = |e: &dyn std::fmt::Display| TraceError {
            endpoint: settings.endpoint.clone(),
            reason: e.to_string(),
        };
        let builder = opentelemetry_otlp::SpanExporter::builder();
        let exporter = match settings.protocol {
            TraceProtocol::Grpc => {
                let mut metadata = tonic::metadata::MetadataMap::new();
                for (name, value) in &settings.headers {
                    // Checked at load (config::trace_export): lowercase ASCII names and values.
                    let (Ok(name), Ok(value)) = (
                        tonic::metadata::MetadataKey::from_bytes(name.as_bytes()),
                        value.parse(),
                    ) else {
                        return Err(failed(&format!("header {name} is not valid gRPC metadata")));
                    };
                    metadata.insert(name, value);
                }
                builder
                    .with_tonic()
                    .with_endpoint(settings.endpoint.expose())
                    .with_metadata(metadata)
                    .build()
            }
            TraceProtocol::Http => builder
                .with_http()
                .with_http_client(OnRuntime::here())
                .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
                .with_endpoint(http_endpoint(settings.endpoint.expose()))
                .with_headers(settings.headers.clone().into_iter().collect())
                .build(),
        }
        .map_err(|e| failed(&e))?;
        // The SDK's bounds (2048 spans queued, a batch every 5 s), or the `OTEL_BSP_*`
        // variables': a span that finds the queue full is dropped, never waited for.
        let batch = BatchSpanProcessor::builder(exporter).build();
        let provider = SdkTracerProvider::builder()
            .with_span_processor(batch)
            .with_sampler(sampler(settings))
            .with_resource(
                opentelemetry_sdk::Resource::builder_empty()
                    .with_service_name(settings.service_name.clone())
                    .build(),
            )
            .build();
        let tracer = opentelemetry::trace::TracerProvider::tracer(&provider, "sluice");
        Ok(Self(Some(Arc::new(On {
            provider,
            tracer,
            propagator: TraceContextPropagator::new(),
            follow_callers: settings.follow_callers,
        }))))
    }

    /// Whether spans are made.
    pub(crate) fn is_on(&self) -> bool {
        self.0.is_some()
    }

    /// A decision's span, named `name`, child of the trace context the caller sent
    /// (`traceparent`/`tracestate` read from `carrier`), or a new trace when it sent none.
    pub(crate) fn decision(&self, name: &'static str, carrier: &dyn Extractor) -> Traced {
        let Some(on) = &self.0 else {
            return Traced(None);
        };
        let parent = on.propagator.extract(&Bounded {
            carrier,
            tracestate: on.follow_callers,
        });
        on.span(name, SpanKind::Server, parent)
    }

    /// A store call's span, child of the decision the caller runs in (none outside one: the
    /// background charge-back and probes are not traced).
    pub(crate) fn store_call(&self) -> Traced {
        let Some(on) = &self.0 else {
            return Traced(None);
        };
        let parent = Context::current();
        if !parent.has_active_span() {
            return Traced(None);
        }
        on.span("sluice.store", SpanKind::Client, parent)
    }

    /// Exports what is queued and stops the exporter (a graceful stop), waiting at most
    /// [`FLUSH_TIMEOUT`] on a blocking thread so the runtime keeps serving the gRPC
    /// exporter's connection.
    pub(crate) async fn shutdown(&self) {
        let Some(on) = self.0.clone() else {
            return;
        };
        let flushed =
            tokio::task::spawn_blocking(move || on.provider.shutdown_with_timeout(FLUSH_TIMEOUT))
                .await;
        match flushed {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "traces: the last spans were not exported"),
            Err(e) => tracing::warn!(error = %e, "traces: the exporter did not stop"),
        }
    }
}

/// The OTLP/HTTP client, sending on the server's runtime: the batch processor exports from a
/// thread of its own, which has no Tokio reactor for hyper's sockets and timers.
#[derive(Debug)]
struct OnRuntime {
    client: opentelemetry_http::hyper::HyperClient,
    runtime: tokio::runtime::Handle,
}

impl OnRuntime {
    /// Called inside the server's runtime ([`Traces::start`]).
    fn here() -> Self {
        Self {
            client: opentelemetry_http::hyper::HyperClient::with_default_connector(
                EXPORT_TIMEOUT,
                None,
            ),
            runtime: tokio::runtime::Handle::current(),
        }
    }
}

#[tonic::async_trait]
impl opentelemetry_http::HttpClient for OnRuntime {
    async fn send_bytes(
        &self,
        request: axum::http::Request<axum::body::Bytes>,
    ) -> Result<axum::http::Response<axum::body::Bytes>, opentelemetry_http::HttpError> {
        let client = self.client.clone();
        self.runtime
            .spawn(async move { client.send_bytes(request).await })
            .await?
    }
}

/// `http://host:4318` is the collector; its traces are at `/v1/traces` (as the
/// specification builds the URL from `OTEL_EXPORTER_OTLP_ENDPOINT`). A URL with a path is
/// used as written.
fn http_endpoint(endpoint: &str) -> String {
    match endpoint.parse::<axum::http::Uri>() {
        Ok(uri) if uri.path() == "/" || uri.path().is_empty() => {
            format!("{}/v1/traces", endpoint.trim_end_matches('/'))
        }
        _ => endpoint.to_owned(),
    }
}

/// A span being recorded, in its context; nothing when tracing is off or no span is due.
#[derive(Debug)]
pub(crate) struct Traced(Option<Context>);

impl Traced {
    /// Runs `work` with this span as the current one, so store calls inside are its children.
    pub(crate) async fn around<F: Future>(&self, work: F) -> F::Output {
        match &self.0 {
            Some(cx) => work.with_context(cx.clone()).await,
            None => work.await,
        }
    }

    /// The context to hand to tasks spawned for this span's work.
    pub(crate) fn context(&self) -> Option<Context> {
        self.0.clone()
    }

    /// Adds attributes, made only when the span is recorded.
    pub(crate) fn set(&self, attributes: impl FnOnce() -> Vec<KeyValue>) {
        if let Some(cx) = &self.0 {
            let span = cx.span();
            if span.is_recording() {
                span.set_attributes(attributes());
            }
        }
    }

    /// Records `sluice.outcome` (an `error` also as the span's status, with `why`, which may
    /// quote what the client sent: shown as [`Untrusted`], at most 1 KiB) and ends the span.
    pub(crate) fn finish(self, outcome: &'static str, why: Option<String>) {
        let Some(cx) = self.0 else {
            return;
        };
        let span = cx.span();
        span.set_attribute(KeyValue::new("sluice.outcome", outcome));
        if let Some(why) = why {
            span.set_status(Status::error(Untrusted::up_to(&why, 1024).to_string()));
        }
        span.end();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_http_collector_url_without_a_path_gets_the_traces_path() {
        assert_eq!(
            http_endpoint("http://collector:4318"),
            "http://collector:4318/v1/traces"
        );
        assert_eq!(
            http_endpoint("http://collector:4318/"),
            "http://collector:4318/v1/traces"
        );
        assert_eq!(
            http_endpoint("http://gw:80/otlp/v1/traces"),
            "http://gw:80/otlp/v1/traces"
        );
    }

    #[test]
    fn off_makes_no_span_and_reads_no_header() {
        let traces = Traces::default();
        let headers = axum::http::HeaderMap::new();
        let span = traces.decision(
            "sluice.check",
            &opentelemetry_http::HeaderExtractor(&headers),
        );
        assert!(span.context().is_none());
        assert!(traces.store_call().context().is_none());
    }
}
