//! An OpenTelemetry collector inside the test: an OTLP trace receiver (gRPC, or HTTP with
//! protobuf bodies at `/v1/traces`) on a free loopback port that keeps every span it is sent. Its own module (not in `support`, which other
//! crates' tests include too): only this crate has `opentelemetry-proto`.

#![allow(clippy::unwrap_used, clippy::expect_used, dead_code, unreachable_pub)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use tokio::sync::Notify;

/// One span as received, with the `service.name` of its resource.
#[derive(Debug, Clone)]
pub struct Received {
    pub service: String,
    pub span: opentelemetry_proto::tonic::trace::v1::Span,
}

impl Received {
    pub fn name(&self) -> &str {
        &self.span.name
    }

    /// A string, integer or boolean attribute, as text.
    pub fn attr(&self, key: &str) -> Option<String> {
        let kv = self.span.attributes.iter().find(|kv| kv.key == key)?;
        match kv.value.as_ref()?.value.as_ref()? {
            Value::StringValue(s) => Some(s.clone()),
            Value::IntValue(i) => Some(i.to_string()),
            Value::BoolValue(b) => Some(b.to_string()),
            other => Some(format!("{other:?}")),
        }
    }

    pub fn trace_id(&self) -> String {
        hex(&self.span.trace_id)
    }

    pub fn span_id(&self) -> String {
        hex(&self.span.span_id)
    }

    pub fn parent_span_id(&self) -> String {
        hex(&self.span.parent_span_id)
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[derive(Default)]
struct Inbox {
    spans: Mutex<Vec<Received>>,
    exports: Mutex<usize>,
    arrived: Notify,
}

#[derive(Clone)]
struct Receiver(Arc<Inbox>);

impl Receiver {
    fn keep(&self, request: ExportTraceServiceRequest) {
        let mut got = Vec::new();
        for resource in request.resource_spans {
            let service = resource
                .resource
                .iter()
                .flat_map(|r| &r.attributes)
                .find(|kv| kv.key == "service.name")
                .and_then(|kv| match kv.value.as_ref()?.value.as_ref()? {
                    Value::StringValue(s) => Some(s.clone()),
                    _ => None,
                })
                .unwrap_or_default();
            for scope in resource.scope_spans {
                for span in scope.spans {
                    got.push(Received {
                        service: service.clone(),
                        span,
                    });
                }
            }
        }
        self.0.spans.lock().unwrap().extend(got);
        *self.0.exports.lock().unwrap() += 1;
        self.0.arrived.notify_waiters();
    }
}

#[tonic::async_trait]
impl TraceService for Receiver {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        self.keep(request.into_inner());
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

/// OTLP/HTTP: `POST /v1/traces` with an `application/x-protobuf` body.
async fn http_export(
    axum::extract::State(receiver): axum::extract::State<Receiver>,
    headers: axum::http::HeaderMap,
    body: axum::body::Bytes,
) -> (axum::http::StatusCode, Vec<u8>) {
    assert_eq!(
        headers.get("content-type").unwrap(),
        "application/x-protobuf"
    );
    let request = <ExportTraceServiceRequest as prost::Message>::decode(body).unwrap();
    receiver.keep(request);
    let answer = prost::Message::encode_to_vec(&ExportTraceServiceResponse::default());
    (axum::http::StatusCode::OK, answer)
}

/// The receiver, serving until dropped.
pub struct Collector {
    /// `http://127.0.0.1:<port>`.
    pub endpoint: String,
    inbox: Arc<Inbox>,
    task: tokio::task::JoinHandle<()>,
}

impl Collector {
    pub async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        let inbox = Arc::new(Inbox::default());
        let service = TraceServiceServer::new(Receiver(inbox.clone()));
        let task = tokio::spawn(async move {
            let incoming = tonic::transport::server::TcpIncoming::from(listener);
            let _ = tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(incoming)
                .await;
        });
        Self {
            endpoint,
            inbox,
            task,
        }
    }

    /// The receiver over OTLP/HTTP: `endpoint` is the base URL (the exporter adds
    /// `/v1/traces`).
    pub async fn start_http() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        let inbox = Arc::new(Inbox::default());
        let app = axum::Router::new()
            .route("/v1/traces", axum::routing::post(http_export))
            .with_state(Receiver(inbox.clone()));
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Self {
            endpoint,
            inbox,
            task,
        }
    }

    /// Every span received so far.
    pub fn spans(&self) -> Vec<Received> {
        self.inbox.spans.lock().unwrap().clone()
    }

    /// How many export requests arrived.
    pub fn exports(&self) -> usize {
        *self.inbox.exports.lock().unwrap()
    }

    /// The spans of `trace_id`, once `done` holds of them: waits on each arrival (the
    /// exporter sends a batch every few seconds), failing after `within`.
    pub async fn wait_for(
        &self,
        trace_id: &str,
        within: Duration,
        done: impl Fn(&[Received]) -> bool,
    ) -> Vec<Received> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let arrived = self.inbox.arrived.notified();
            let spans: Vec<Received> = self
                .spans()
                .into_iter()
                .filter(|s| s.trace_id() == trace_id)
                .collect();
            if done(&spans) {
                return spans;
            }
            if tokio::time::timeout_at(deadline, arrived).await.is_err() {
                panic!(
                    "the spans of trace {trace_id} did not arrive within {within:?}; got {:#?}",
                    spans
                        .iter()
                        .map(|s| (s.name().to_owned(), s.span.attributes.clone()))
                        .collect::<Vec<_>>()
                );
            }
        }
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        self.task.abort();
    }
}
