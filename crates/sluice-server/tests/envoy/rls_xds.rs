//! End to end: Envoy rules from an xDS control plane (`rls.xds`), the way Envoy Gateway
//! configures its rate limit service.
//!
//! The control plane is an aggregated discovery service inside the test (tonic, envoy-types'
//! ADS service): it hands the test every stream Sluice opens, with the requests Sluice sends
//! and a sender of the responses the test chooses. The resources are the ones Envoy Gateway
//! v1.9 generates for a `BackendTrafficPolicy` with global rate limits
//! (`internal/xds/translator/ratelimit.go`): the listener's domain, a descriptor per route
//! (key and value the route's name), under it one per rule (`rule-<i>-match-<j>`: key and
//! value for a header value match, key only for a `Distinct` header). Requests come from a
//! real gRPC `ShouldRateLimit` client with the descriptors Envoy builds from EG's route
//! actions. Everything is awaited by polling or on channels, never by sleeping.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use std::pin::Pin;
use std::time::Duration;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor as EnvoyDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::Any;
use prost::Message;
use sluice_envoy_rules::xds::{
    RATE_LIMIT_CONFIG_TYPE_URL, RateLimitConfig, RateLimitDescriptor, RateLimitPolicy,
    RateLimitUnit,
};
use tokio::sync::mpsc;
use tokio_stream::wrappers::{TcpListenerStream, UnboundedReceiverStream};
use tonic::transport::Channel;
use tonic::{Request, Response, Status, Streaming};

use crate::support as common;

const DOMAIN: &str = "default/eg/http";
const ROUTE: &str = "httproute/default/backend/rule/0/match/0/www_example_com";
const NODE_ID: &str = "envoy-ratelimit";
/// The metric line of two accepted updates.
const ACKED_TWICE: &str = "sluice_xds_updates_total{result=\"ack\"} 2";
/// Long enough for a loaded 2-core machine; every wait below ends as soon as its condition
/// holds.
const PATIENCE: Duration = Duration::from_secs(20);

// ---------------------------------------------------------------------------------------
// The control plane.

/// One stream Sluice opened: what it sends, and where the test's responses go.
struct XdsStream {
    requests: mpsc::UnboundedReceiver<DiscoveryRequest>,
    responses: mpsc::UnboundedSender<Result<DiscoveryResponse, Status>>,
}

impl XdsStream {
    async fn next_request(&mut self) -> DiscoveryRequest {
        tokio::time::timeout(PATIENCE, self.requests.recv())
            .await
            .expect("no request from sluice in time")
            .expect("the stream ended without a request")
    }

    /// Sends `eg_resource(per_hour)` as `version` (nonce `nonce-VERSION`) and checks the ACK.
    async fn accept(&mut self, version: &str, per_hour: u32) {
        let nonce = format!("nonce-{version}");
        self.respond(version, &nonce, &[eg_resource(per_hour)]);
        assert_ack(&self.next_request().await, version, &nonce);
    }

    fn respond(&self, version: &str, nonce: &str, resources: &[RateLimitConfig]) {
        self.responses
            .send(Ok(DiscoveryResponse {
                version_info: version.to_owned(),
                resources: resources
                    .iter()
                    .map(|r| Any {
                        type_url: RATE_LIMIT_CONFIG_TYPE_URL.to_owned(),
                        value: r.encode_to_vec(),
                    })
                    .collect(),
                type_url: RATE_LIMIT_CONFIG_TYPE_URL.to_owned(),
                nonce: nonce.to_owned(),
                ..Default::default()
            }))
            .unwrap();
    }
}

struct Ads {
    streams: mpsc::UnboundedSender<XdsStream>,
}

type Responses =
    Pin<Box<dyn tokio_stream::Stream<Item = Result<DiscoveryResponse, Status>> + Send>>;
type DeltaResponses =
    Pin<Box<dyn tokio_stream::Stream<Item = Result<DeltaDiscoveryResponse, Status>> + Send>>;

#[tonic::async_trait]
impl AggregatedDiscoveryService for Ads {
    type StreamAggregatedResourcesStream = Responses;
    type DeltaAggregatedResourcesStream = DeltaResponses;

    async fn stream_aggregated_resources(
        &self,
        request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Responses>, Status> {
        let mut incoming = request.into_inner();
        let (requests_tx, requests) = mpsc::unbounded_channel();
        let (responses, responses_rx) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok(Some(r)) = incoming.message().await {
                if requests_tx.send(r).is_err() {
                    break;
                }
            }
        });
        let _ = self.streams.send(XdsStream {
            requests,
            responses,
        });
        Ok(Response::new(Box::pin(UnboundedReceiverStream::new(
            responses_rx,
        ))))
    }

    async fn delta_aggregated_resources(
        &self,
        _: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<DeltaResponses>, Status> {
        Err(Status::unimplemented("state of the world only"))
    }
}

/// A running control plane on a loopback port.
struct ControlPlane {
    addr: std::net::SocketAddr,
    streams: mpsc::UnboundedReceiver<XdsStream>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    done: tokio::task::JoinHandle<()>,
}

impl ControlPlane {
    async fn start(tls: Option<tonic::transport::ServerTlsConfig>) -> Self {
        Self::start_on("127.0.0.1:0".parse().unwrap(), tls).await
    }

    async fn start_on(
        addr: std::net::SocketAddr,
        tls: Option<tonic::transport::ServerTlsConfig>,
    ) -> Self {
        let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (streams_tx, streams) = mpsc::unbounded_channel();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let mut builder = tonic::transport::Server::builder();
        if let Some(tls) = tls {
            builder = builder.tls_config(tls).unwrap();
        }
        let router = builder.add_service(AggregatedDiscoveryServiceServer::new(Ads {
            streams: streams_tx,
        }));
        let done = tokio::spawn(async move {
            router
                .serve_with_incoming_shutdown(TcpListenerStream::new(listener), async move {
                    let _ = stopped.await;
                })
                .await
                .unwrap();
        });
        Self {
            addr,
            streams,
            stop: Some(stop),
            done,
        }
    }

    async fn next_stream(&mut self) -> XdsStream {
        tokio::time::timeout(PATIENCE, self.streams.recv())
            .await
            .expect("sluice opened no xDS stream in time")
            .unwrap()
    }

    /// Stops serving: every open stream ends with `UNAVAILABLE` (as when the control plane's
    /// pod goes away) and the listener closes.
    async fn stop(mut self, open: Vec<XdsStream>) {
        for s in &open {
            let _ = s
                .responses
                .send(Err(Status::unavailable("control plane going away")));
        }
        drop(open);
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        tokio::time::timeout(PATIENCE, self.done)
            .await
            .expect("the control plane did not stop")
            .unwrap();
    }
}

// ---------------------------------------------------------------------------------------
// The resources Envoy Gateway sends.

fn policy(requests_per_unit: u32, unit: i32) -> Option<RateLimitPolicy> {
    Some(RateLimitPolicy {
        requests_per_unit,
        unit,
        ..Default::default()
    })
}

/// EG's resource for one HTTPRoute whose `BackendTrafficPolicy` has two global rules: one
/// matching a header value (`x-user-id: one`, `per_hour` requests an hour), one per distinct
/// `x-user-id` (2 a minute).
fn eg_resource(per_hour: u32) -> RateLimitConfig {
    RateLimitConfig {
        name: DOMAIN.into(),
        domain: DOMAIN.into(),
        descriptors: vec![RateLimitDescriptor {
            key: ROUTE.into(),
            value: ROUTE.into(),
            descriptors: vec![
                RateLimitDescriptor {
                    key: "rule-0-match-0".into(),
                    value: "rule-0-match-0".into(),
                    rate_limit: policy(per_hour, RateLimitUnit::Hour as i32),
                    ..Default::default()
                },
                RateLimitDescriptor {
                    key: "rule-1-match-0".into(),
                    rate_limit: policy(2, RateLimitUnit::Minute as i32),
                    ..Default::default()
                },
            ],
            ..Default::default()
        }],
    }
}

/// [`eg_resource`] whose second rule has an unknown unit: a resource that does not load.
fn with_an_unknown_unit() -> RateLimitConfig {
    let mut bad = eg_resource(7);
    bad.descriptors[0].descriptors[0]
        .rate_limit
        .as_mut()
        .unwrap()
        .unit = 42;
    bad
}

// ---------------------------------------------------------------------------------------
// Sluice and its clients.

/// The server's time, fixed on the start of an hour: no window ends during a test.
const T0_MS: u64 = 1_800_000_000_000;

async fn start_sluice(config: &str) -> common::TestServer {
    common::TestServer::start_with_clock(config, &[], sluice::ManualClock::new(T0_MS)).await
}

/// A control plane, Sluice following it, and a rate limit client of Sluice.
async fn following_a_control_plane() -> (
    ControlPlane,
    common::TestServer,
    RateLimitServiceClient<Channel>,
) {
    let cp = ControlPlane::start(None).await;
    let server = start_sluice(&config(&format!("http://{}", cp.addr), "")).await;
    let client = RateLimitServiceClient::new(server.channel().await);
    (cp, server, client)
}

/// [`following_a_control_plane`], its first stream open and `eg_resource(per_hour)` ACKed as
/// version 1.
async fn serving_rules(
    per_hour: u32,
) -> (
    ControlPlane,
    common::TestServer,
    RateLimitServiceClient<Channel>,
    XdsStream,
) {
    let (mut cp, server, client) = following_a_control_plane().await;
    let mut stream = cp.next_stream().await;
    stream.next_request().await;
    stream.accept("1", per_hour).await;
    (cp, server, client, stream)
}

fn config(address: &str, extra: &str) -> String {
    format!(
        "rls:\n  xds:\n    address: {address}\n    node_id: {NODE_ID}\n    cluster: sluice-test\n{extra}"
    )
}

/// What Envoy sends for a request matching rule 0 (`header_value_match`) and rule 1
/// (`request_headers` of a distinct header), as EG's route rate limit actions build it.
fn request(rule: usize, user: &str) -> RateLimitRequest {
    let (key, value) = match rule {
        0 => ("rule-0-match-0", "rule-0-match-0"),
        _ => ("rule-1-match-0", user),
    };
    RateLimitRequest {
        domain: DOMAIN.to_owned(),
        descriptors: vec![EnvoyDescriptor {
            entries: vec![
                Entry {
                    key: ROUTE.to_owned(),
                    value: ROUTE.to_owned(),
                },
                Entry {
                    key: key.to_owned(),
                    value: value.to_owned(),
                },
            ],
            ..Default::default()
        }],
        hits_addend: 1,
    }
}

async fn ask(
    client: &mut RateLimitServiceClient<Channel>,
    rule: usize,
    user: &str,
) -> Result<RateLimitResponse, Status> {
    client
        .should_rate_limit(request(rule, user))
        .await
        .map(Response::into_inner)
}

/// The overall code of a request for `rule` (and `user`).
async fn code(client: &mut RateLimitServiceClient<Channel>, rule: usize, user: &str) -> Code {
    ask(client, rule, user).await.unwrap().overall_code()
}

/// The limit the rule-0 descriptor answers with (counts one hit).
async fn limit_of_rule_0(client: &mut RateLimitServiceClient<Channel>) -> Option<u32> {
    limit(&ask(client, 0, "").await.ok()?)
}

/// The limit the first descriptor of `r` answers with.
fn limit(r: &RateLimitResponse) -> Option<u32> {
    r.statuses[0]
        .current_limit
        .as_ref()
        .map(|l| l.requests_per_unit)
}

async fn v1_stats(server: &common::TestServer) -> serde_json::Value {
    get_json(&format!("{}/v1/stats", server.url)).await
}

async fn get_json(url: &str) -> serde_json::Value {
    reqwest::get(url).await.unwrap().json().await.unwrap()
}

async fn metrics(server: &common::TestServer) -> String {
    common::scrape(&server.url).await
}

/// Polls `/metrics` until it has, for each of `lines`, a line starting with it.
async fn wait_metric(server: &common::TestServer, lines: &[&str]) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let text = metrics(server).await;
        let Some(line) = lines
            .iter()
            .find(|line| !text.lines().any(|l| l.starts_with(**line)))
        else {
            return;
        };
        assert!(
            tokio::time::Instant::now() < deadline,
            "no `{line}` in /metrics:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn assert_ack(ack: &DiscoveryRequest, version: &str, nonce: &str) {
    assert_eq!(ack.version_info, version, "{ack:?}");
    assert_eq!(ack.response_nonce, nonce, "{ack:?}");
    assert_eq!(ack.type_url, RATE_LIMIT_CONFIG_TYPE_URL);
    assert!(
        ack.error_detail.is_none(),
        "an ACK carries no error: {ack:?}"
    );
}

// ---------------------------------------------------------------------------------------

/// The rules arrive (the node is named), are ACKed and decide; an update replaces them and is
/// ACKed with its version; `/v1/stats` counts each as a reload.
#[tokio::test]
async fn rules_arrive_are_acked_decide_and_updates_replace_them() {
    let (mut cp, server, mut client) = following_a_control_plane().await;
    let mut stream = cp.next_stream().await;
    let first = stream.next_request().await;
    let node = first
        .node
        .as_ref()
        .expect("the first request names the node");
    assert_eq!(node.id, NODE_ID);
    assert_eq!(node.cluster, "sluice-test");
    assert_eq!(first.type_url, RATE_LIMIT_CONFIG_TYPE_URL);
    assert_eq!(first.version_info, "");
    assert_eq!(first.response_nonce, "");

    // No rules yet: Envoy gets an error and its failure_mode_deny decides.
    let before = ask(&mut client, 0, "").await.unwrap_err();
    assert_eq!(before.code(), tonic::Code::FailedPrecondition, "{before:?}");
    assert!(before.message().contains("rls.xds"), "{before:?}");

    let generation = v1_stats(&server).await["config"]["generation"]
        .as_u64()
        .unwrap();
    stream.accept("1", 3).await;

    // Rule 0: 3 an hour for everyone whose request matches it.
    for _ in 0..3 {
        let r = ask(&mut client, 0, "").await.unwrap();
        assert_eq!(r.overall_code(), Code::Ok, "{r:?}");
        assert_eq!(limit(&r), Some(3));
    }
    assert_eq!(code(&mut client, 0, "").await, Code::OverLimit);
    // Rule 1: 2 a minute per distinct user.
    for user in ["alice", "bob"] {
        for _ in 0..2 {
            assert_eq!(code(&mut client, 1, user).await, Code::Ok);
        }
        assert_eq!(code(&mut client, 1, user).await, Code::OverLimit);
    }
    // An unknown domain has no rule, as with rule files.
    let mut other = request(0, "");
    other.domain = "default/eg/https".into();
    let r = client.should_rate_limit(other).await.unwrap().into_inner();
    assert_eq!(r.overall_code(), Code::Ok);

    // An update: the new limit applies, the ACK names version 2.
    stream.accept("2", 5).await;
    assert_eq!(limit_of_rule_0(&mut client).await, Some(5));

    let stats = v1_stats(&server).await;
    assert_eq!(
        stats["config"]["generation"].as_u64().unwrap(),
        generation + 2,
        "{stats}"
    );
    assert!(stats["config"]["last_reload_error"].is_null(), "{stats}");
    wait_metric(&server, &[ACKED_TWICE, "sluice_xds_connected 1"]).await;
    server.stop().await;
    cp.stop(vec![stream]).await;
}

/// A resource that does not load is NACKed — the version accepted before, the response's
/// nonce, a reason naming the resource and the fault — and the previous rules still decide.
#[tokio::test]
async fn a_bad_resource_is_nacked_with_a_reason_and_the_previous_rules_stay() {
    let (cp, server, mut client, mut stream) = serving_rules(3).await;

    // An unknown unit.
    let bad_unit = with_an_unknown_unit();
    stream.respond("2", "nonce-2", &[bad_unit]);
    let nack = stream.next_request().await;
    assert_eq!(
        nack.version_info, "1",
        "a NACK names the version still in force"
    );
    assert_eq!(nack.response_nonce, "nonce-2");
    let detail = nack.error_detail.expect("a NACK carries its reason");
    assert_eq!(detail.code, 3, "INVALID_ARGUMENT");
    assert!(
        detail.message.contains("version \"2\"")
            && detail.message.contains("xds:default/eg/http")
            && detail
                .message
                .contains("descriptors[0].descriptors[0].rate_limit.unit")
            && detail.message.contains("\"42\" is not a unit"),
        "{}",
        detail.message
    );
    assert_eq!(limit_of_rule_0(&mut client).await, Some(3));

    // Two descriptors with the same key and value at one level.
    let mut duplicate = eg_resource(7);
    let copy = duplicate.descriptors[0].descriptors[1].clone();
    duplicate.descriptors[0].descriptors.push(copy);
    stream.respond("3", "nonce-3", &[duplicate]);
    let nack = stream.next_request().await;
    assert_eq!(
        (nack.version_info.as_str(), nack.response_nonce.as_str()),
        ("1", "nonce-3")
    );
    let message = nack.error_detail.unwrap().message;
    assert!(message.contains("duplicate descriptor"), "{message}");
    // The previous rules, whole: rule 0 at 3 (one hit counted above), rule 1 still there.
    assert_eq!(limit_of_rule_0(&mut client).await, Some(3));
    assert_eq!(
        ask(&mut client, 1, "carol").await.unwrap().overall_code(),
        Code::Ok
    );

    let stats = v1_stats(&server).await;
    let error = stats["config"]["last_reload_error"].as_str().unwrap();
    assert!(
        error.starts_with("xDS: version \"3\"") && error.contains("duplicate"),
        "{error}"
    );

    // A good update after bad ones is accepted, and clears the error.
    stream.accept("4", 9).await;
    assert_eq!(limit_of_rule_0(&mut client).await, Some(9));
    let stats = v1_stats(&server).await;
    assert!(stats["config"]["last_reload_error"].is_null(), "{stats}");
    wait_metric(
        &server,
        &["sluice_xds_updates_total{result=\"nack\"} 2", ACKED_TWICE],
    )
    .await;
    server.stop().await;
    cp.stop(vec![stream]).await;
}

/// The control plane restarts: Sluice keeps deciding with the last good rules while it is
/// away, connects again (with backoff), names its node and the version it holds, and takes
/// the next update.
#[tokio::test]
async fn reconnects_after_the_control_plane_restarts_keeping_the_last_good_rules() {
    let mut cp = ControlPlane::start(None).await;
    let addr = cp.addr;
    let server = start_sluice(&config(&format!("http://{addr}"), "")).await;
    let mut client = RateLimitServiceClient::new(server.channel().await);
    let mut stream = cp.next_stream().await;
    stream.next_request().await;
    stream.accept("7", 4).await;
    wait_metric(&server, &["sluice_xds_connected 1"]).await;

    cp.stop(vec![stream]).await;
    wait_metric(&server, &["sluice_xds_connected 0"]).await;
    // Away: the last good rules decide (4 an hour, then over).
    for _ in 0..4 {
        assert_eq!(code(&mut client, 0, "").await, Code::Ok);
    }
    assert_eq!(code(&mut client, 0, "").await, Code::OverLimit);

    // Back on the same address.
    let mut cp = ControlPlane::start_on(addr, None).await;
    let mut stream = cp.next_stream().await;
    let hello = stream.next_request().await;
    assert_eq!(hello.node.as_ref().unwrap().id, NODE_ID);
    assert_eq!(
        hello.version_info, "7",
        "a reconnection names the version it holds"
    );
    assert_eq!(hello.response_nonce, "");
    assert!(hello.error_detail.is_none());
    wait_metric(&server, &["sluice_xds_connected 1"]).await;
    stream.accept("8", 6).await;
    assert_eq!(limit_of_rule_0(&mut client).await, Some(6));
    server.stop().await;
    cp.stop(vec![stream]).await;
}

/// Over mutual TLS, as Envoy Gateway's xDS server requires: the control plane's certificate is
/// verified against `ca_file`, and Sluice presents `cert_file`/`key_file`.
#[tokio::test]
async fn rules_arrive_over_mutual_tls() {
    let certs = sluice_testkit::TlsCerts::generate().unwrap();
    let (cert, key) = certs.server_files();
    let (client_cert, client_key) = certs.client_files();
    let tls = tonic::transport::ServerTlsConfig::new()
        .identity(tonic::transport::Identity::from_pem(
            std::fs::read(&cert).unwrap(),
            std::fs::read(&key).unwrap(),
        ))
        .client_ca_root(tonic::transport::Certificate::from_pem(
            std::fs::read(certs.ca_file()).unwrap(),
        ));
    let mut cp = ControlPlane::start(Some(tls)).await;
    let extra = format!(
        "    ca_file: {}\n    cert_file: {}\n    key_file: {}\n",
        certs.ca_file().display(),
        client_cert.display(),
        client_key.display()
    );
    let address = format!("https://localhost:{}", cp.addr.port());
    let config = config(&address, "").replace(
        "    cluster: sluice-test\n",
        &format!("    cluster: sluice-test\n{extra}"),
    );
    let server = start_sluice(&config).await;
    let mut client = RateLimitServiceClient::new(server.channel().await);
    let mut stream = cp.next_stream().await;
    assert_eq!(stream.next_request().await.node.unwrap().id, NODE_ID);
    stream.accept("1", 3).await;
    assert_eq!(limit_of_rule_0(&mut client).await, Some(3));
    server.stop().await;
    cp.stop(vec![stream]).await;
}

/// `rls.xds` is checked by the configuration: one source of rules, never both, and each
/// error names the field.
#[test]
fn the_configuration_takes_one_source_of_rules() {
    use sluice_server::config::Config;
    let both = "rls:\n  config_dir: rules\n  xds:\n    address: http://127.0.0.1:18001\n    node_id: envoy-ratelimit\n";
    let err = Config::parse("sluice.yaml", both).unwrap_err().to_string();
    assert!(err.contains("config_dir and xds are both given"), "{err}");
    let neither = "rls:\n  shadow_mode: true\n";
    let err = Config::parse("sluice.yaml", neither)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("needs config_dir") && err.contains("or xds"),
        "{err}"
    );
    let no_scheme =
        "rls:\n  xds:\n    address: envoy-gateway:18001\n    node_id: envoy-ratelimit\n";
    let err = Config::parse("sluice.yaml", no_scheme)
        .unwrap_err()
        .to_string();
    assert!(err.contains("rls.xds.address"), "{err}");
    let plain_with_ca = "rls:\n  xds:\n    address: http://envoy-gateway:18001\n    node_id: n\n    ca_file: /ca.crt\n";
    let err = Config::parse("sluice.yaml", plain_with_ca)
        .unwrap_err()
        .to_string();
    assert!(err.contains("rls.xds.ca_file"), "{err}");
    let missing_node = "rls:\n  xds:\n    address: http://envoy-gateway:18001\n";
    let err = Config::parse("sluice.yaml", missing_node)
        .unwrap_err()
        .to_string();
    assert!(err.contains("node_id"), "{err}");
    let ok =
        "rls:\n  xds:\n    address: http://envoy-gateway:18001\n    node_id: envoy-ratelimit\n";
    let config = Config::parse("sluice.yaml", ok).unwrap();
    let xds = config.rls.unwrap();
    let xds = xds.xds().unwrap();
    assert_eq!(xds.node_id, "envoy-ratelimit");
    assert_eq!(xds.cluster, None);
}

/// A reload of the configuration file keeps the rules the control plane sent and applies the
/// file's `rls` settings; a reload that would switch the rules to a directory is refused.
#[tokio::test]
async fn a_reload_of_the_file_keeps_the_rules_from_xds() {
    let mut cp = ControlPlane::start(None).await;
    let text = config(&format!("http://{}", cp.addr), "");
    let server = start_sluice(&text).await;
    let mut client = RateLimitServiceClient::new(server.channel().await);
    let mut stream = cp.next_stream().await;
    stream.next_request().await;
    stream.accept("1", 1).await;
    assert_eq!(code(&mut client, 0, "").await, Code::Ok);
    assert_eq!(code(&mut client, 0, "").await, Code::OverLimit);

    // The file now sets the reference's SHADOW_MODE: over the limit, answered OK.
    let stats = format!("{}/v1/stats", server.url);
    let generation = get_json(&stats).await["config"]["generation"]
        .as_u64()
        .unwrap();
    std::fs::write(&server.file, format!("{text}  shadow_mode: true\n")).unwrap();
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while get_json(&stats).await["config"]["generation"]
        .as_u64()
        .unwrap()
        == generation
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the file never reloaded"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let r = ask(&mut client, 0, "").await.unwrap();
    assert_eq!(r.overall_code(), Code::Ok, "shadow mode: {r:?}");
    assert_eq!(limit(&r), Some(1), "the rule from xDS is still in force");

    // Switching to a rules directory takes a restart.
    std::fs::create_dir_all(server.dir.path().join("rules")).unwrap();
    std::fs::write(&server.file, "rls:\n  config_dir: rules\n").unwrap();
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let s = get_json(&stats).await;
        if let Some(e) = s["config"]["last_reload_error"].as_str() {
            assert!(e.contains("restart the server to switch"), "{e}");
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no reload attempt: {s}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(limit_of_rule_0(&mut client).await, Some(1));
    server.stop().await;
    cp.stop(vec![stream]).await;
}

/// A small response that would cost a great deal of memory once converted (a 32 KiB name
/// over thousands of descriptors, each rule a copy of it) is refused before conversion:
/// NACKed, naming the field and the bound, and the rules in force stay.
#[tokio::test]
async fn a_response_past_the_bounds_is_nacked_naming_the_bound() {
    let (cp, server, mut client, mut stream) = serving_rules(3).await;

    let leaves = |n: usize| -> Vec<RateLimitDescriptor> {
        (0..n)
            .map(|i| RateLimitDescriptor {
                key: format!("k{i}"),
                rate_limit: policy(1, RateLimitUnit::Second as i32),
                ..Default::default()
            })
            .collect()
    };
    let crafted = RateLimitConfig {
        name: "n".repeat(32 << 10),
        domain: "crafted".into(),
        descriptors: leaves(2_000),
    };
    stream.respond("2", "nonce-2", &[crafted]);
    let nack = stream.next_request().await;
    assert_eq!(
        (nack.version_info.as_str(), nack.response_nonce.as_str()),
        ("1", "nonce-2")
    );
    let message = nack.error_detail.expect("a NACK").message;
    assert!(
        message.contains("resources[0]: name: 32768 bytes, more than the 1024"),
        "{message}"
    );
    let many = RateLimitConfig {
        name: "many".into(),
        domain: "many".into(),
        descriptors: leaves(10_001),
    };
    stream.respond("3", "nonce-3", &[many]);
    let message = stream
        .next_request()
        .await
        .error_detail
        .expect("a NACK")
        .message;
    assert!(
        message.contains("more than 10000 descriptors in one response"),
        "{message}"
    );
    assert_eq!(limit_of_rule_0(&mut client).await, Some(3));
    server.stop().await;
    cp.stop(vec![stream]).await;
}

/// What the server logs, for the tests that read it.
#[derive(Clone, Default)]
struct Log(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Log {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Log {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

/// A control plane that answers every stream with a refused response and closes it: each
/// reconnection waits longer than the one before (only an accepted response starts the
/// backoff over). Its versions, forged log lines with terminal escapes and a megabyte long,
/// reach the log, the NACK and `/v1/stats` escaped and clipped; so does an accepted one.
/// (A current-thread runtime: the server's tasks log through this thread's subscriber.)
#[tokio::test]
async fn a_refusing_control_plane_is_backed_off_and_its_strings_are_escaped_and_clipped() {
    let log = Log::default();
    let writer = log.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    // See `errors_no_retry_changes_are_logged_once_per_policy_and_kind` (crates/sluice):
    // a second dispatcher makes tracing ask this thread's default at every callsite.
    let _second = tracing::Dispatch::new(tracing::subscriber::NoSubscriber::default());

    let forged = "\n2026-01-01T00:00:00Z  WARN sluice: forged\u{1b}[2J";
    let mut cp = ControlPlane::start(None).await;
    let server = start_sluice(&config(&format!("http://{}", cp.addr), "")).await;
    let bad = with_an_unknown_unit();
    let huge = format!("2{forged}{}", "x".repeat(1 << 20));
    for round in 0..4 {
        let stream = cp.next_stream().await;
        let mut stream = stream;
        stream.next_request().await;
        if round == 0 {
            stream.respond(&format!("1{forged}"), "nonce-ok", &[eg_resource(3)]);
            assert!(stream.next_request().await.error_detail.is_none());
        }
        stream.respond(&huge, &format!("nonce-{round}"), std::slice::from_ref(&bad));
        let message = stream.next_request().await.error_detail.unwrap().message;
        assert!(message.len() < 2048, "{} bytes", message.len());
        assert!(
            message.contains("\\n2026-01-01T00:00:00Z") && message.contains("\\u{1b}[2J"),
            "{message}"
        );
        assert!(!message.contains(['\n', '\u{1b}']), "{message}");
        let _ = stream
            .responses
            .send(Err(Status::unavailable("closing after a refusal")));
    }
    let stats = v1_stats(&server).await;
    let error = stats["config"]["last_reload_error"].as_str().unwrap();
    assert!(error.len() < 2048 && !error.contains('\n'), "{error}");

    // Four reconnection waits logged: the fourth drawn from a ceiling that doubled three
    // times (400 to 800 ms), where a backoff started over would draw at most the first's.
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let waits = loop {
        let waits: Vec<u64> = log
            .text()
            .lines()
            .filter_map(|l| l.split("retry_in_ms=").nth(1))
            .map(|w| w.split_whitespace().next().unwrap().parse().unwrap())
            .collect();
        if waits.len() >= 4 {
            break waits;
        }
        assert!(tokio::time::Instant::now() < deadline, "{}", log.text());
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(
        waits[3] > sluice_server::rls_xds::BACKOFF_INITIAL.as_millis() as u64,
        "{waits:?}"
    );

    let text = log.text();
    assert!(text.contains("rate limit rules from xDS applied"), "{text}");
    assert!(
        !text.lines().any(|l| l.starts_with("2026-01-01")) && !text.contains('\u{1b}'),
        "a forged line or an escape reached the log:\n{text}"
    );
    assert!(text.len() < 64 << 10, "{} bytes of log", text.len());
    server.stop().await;
    drop(cp);
}
