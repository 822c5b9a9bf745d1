//! Envoy rules from an xDS control plane (`rls.xds`): the reference service's
//! `CONFIG_TYPE=GRPC_XDS_SOTW`, the way Envoy Gateway configures its rate limit service.
//!
//! A state-of-the-world client of one resource type, the rate limit configuration
//! ([`sluice_envoy_rules::xds::RATE_LIMIT_CONFIG_TYPE_URL`]), over the aggregated discovery service
//! (`envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources`): what
//! the reference's `src/provider/xds_grpc_sotw_provider.go` opens through go-control-plane's
//! `sotw.ADSClient`, and what Envoy Gateway serves on port 18001
//! (`internal/globalratelimit/runner/runner.go`).
//!
//! * The first request names the node (`node.id`, `node.cluster`) and the type; it carries the
//!   version last accepted, so that a control plane reached again knows what Sluice holds.
//! * Each response holds every resource (state of the world). They are decoded and loaded as
//!   one configuration ([`sluice_envoy_rules::RlsConfig::from_xds`], the loader of the rule files).
//!   Loaded, they replace the rules in force, as a reload of the rules directory does (the
//!   generation of `/v1/stats` goes up, `sluice_config_reloads_total{result="ok"}`), and the
//!   response is ACKed: a request with its `version_info` and `response_nonce`.
//! * Refused, the response is NACKed: the version accepted before, the response's nonce, and
//!   `error_detail` (`INVALID_ARGUMENT`) whose message names the version, the resource and
//!   what is wrong. The rules in force stay whole; `/v1/stats` shows the error as
//!   `last_reload_error`, `sluice_config_reloads_total{result="error"}` counts it.
//! * When the stream fails or ends, the client connects again after an exponential backoff
//!   with jitter ([`backoff`]), and the last good rules keep deciding meanwhile. The backoff
//!   starts over only after an accepted response. Before the
//!   first accepted response there are no rules: `ShouldRateLimit` answers
//!   `FAILED_PRECONDITION`, and Envoy's `failure_mode_deny` decides (the reference answers an
//!   error too until its first configuration).
//!
//! Metrics: `sluice_xds_updates_total{result="ack|nack"}` and `sluice_xds_connected` (1 while
//! a stream to the control plane is open, else 0).

use std::sync::Arc;
use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder};
use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use envoy_types::pb::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use envoy_types::pb::google::rpc::Status as RpcStatus;
use prost::Message;

use crate::observe::Untrusted;
use crate::state::Shared;
use crate::xds_settings::XdsSettings;
use sluice_envoy_rules::xds::{
    Budget, MAX_RESOURCES, RATE_LIMIT_CONFIG_TYPE_URL, RateLimitConfig, TooLarge,
};
use sluice_envoy_rules::{LoadOptions, RlsConfig, RlsConfigError};
use sluice_spec::policy_entry::FieldError;

/// Why a stream to the control plane ended in error (logged, then connected again).
#[derive(Debug, thiserror::Error)]
enum StreamError {
    /// The settings cannot make a channel (the address, the TLS files).
    #[error(transparent)]
    Settings(#[from] FieldError),
    /// No connection, with the transport error's whole chain.
    #[error("cannot connect: {0}")]
    Connect(String),
    /// The control plane refused the stream.
    #[error("StreamAggregatedResources: {0}")]
    Open(String),
    /// The stream broke.
    #[error("the stream failed: {code:?}: {message}")]
    Failed { code: tonic::Code, message: String },
    /// The stream closed before an answer could be sent on it.
    #[error("the stream closed before the answer was sent")]
    Closed,
}

/// Why a response's rules are refused (the message of its NACK).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum XdsLoadError {
    /// The response is not of the rate limit configuration's type.
    #[error("the response is of type {0:?}; this client asked for {RATE_LIMIT_CONFIG_TYPE_URL}")]
    ResponseType(String),
    /// A resource is not of the rate limit configuration's type.
    #[error("resources[{index}]: of type {type_url:?}, expected {RATE_LIMIT_CONFIG_TYPE_URL}")]
    ResourceType {
        /// Its place in the response.
        index: usize,
        /// Its type.
        type_url: String,
    },
    /// A resource that does not decode.
    #[error("resources[{index}]: not a RateLimitConfig: {source}")]
    Decode {
        /// Its place in the response.
        index: usize,
        /// The decoder's error.
        source: prost::DecodeError,
    },
    /// More resources than [`MAX_RESOURCES`].
    #[error("{0} resources, more than the {MAX_RESOURCES} a response may hold")]
    TooManyResources(usize),
    /// A resource past a bound ([`sluice_envoy_rules::xds::Budget`]), before it is converted.
    #[error("resources[{index}]: {source}")]
    TooLarge {
        /// Its place in the response.
        index: usize,
        /// The field and the bound.
        source: TooLarge,
    },
    /// The rules, decoded, cannot be loaded.
    #[error(transparent)]
    Rules(#[from] RlsConfigError),
}

/// The first wait before connecting again.
pub const BACKOFF_INITIAL: Duration = Duration::from_millis(100);
/// The longest wait before connecting again.
pub const BACKOFF_MAX: Duration = Duration::from_secs(15);
/// How long a connection attempt may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// HTTP/2 pings on an idle stream, so that a control plane gone without a word is noticed.
const KEEPALIVE: Duration = Duration::from_secs(30);
/// The largest response taken from the control plane (tonic's default is 4 MiB): a
/// configuration of [`sluice_envoy_rules::xds::MAX_DESCRIPTORS`] descriptors of Envoy Gateway's
/// size fits with room to spare; a larger one ends the stream.
pub const MAX_RESPONSE: usize = 2 << 20;
/// The most bytes of a refusal's reason kept (it names a resource, a descriptor and a key or
/// value, each within [`sluice_envoy_rules::xds::MAX_TEXT`]).
const MAX_REASON: usize = 1024;
/// `google.rpc.Code.INVALID_ARGUMENT`, the code of a NACK's `error_detail`.
const INVALID_ARGUMENT: i32 = 3;

/// Exponential backoff with jitter: each wait is drawn from the upper half of a ceiling that
/// doubles from [`BACKOFF_INITIAL`] up to [`BACKOFF_MAX`], so that many Sluices restarted
/// with their control plane do not reconnect in step. (backon's jitter adds up to the delay
/// itself, so its delay is half the ceiling.) A new one starts over, after an accepted
/// response.
fn backoff() -> ExponentialBackoff {
    ExponentialBuilder::default()
        .with_min_delay(BACKOFF_INITIAL / 2)
        .with_max_delay(BACKOFF_MAX / 2)
        .with_factor(2.0)
        .with_jitter()
        .without_max_times()
        .build()
}

/// Follows the control plane until the task is dropped: connects, applies every response
/// that loads, and connects again after a failure.
pub async fn run(settings: XdsSettings, shared: Arc<Shared>) {
    let mut client = Client {
        node: Node {
            id: settings.node_id.clone(),
            cluster: settings.cluster.clone().unwrap_or_default(),
            ..Default::default()
        },
        settings,
        shared,
        accepted_version: String::new(),
    };
    let mut backoff = backoff();
    loop {
        let outcome = client.session(&mut backoff).await;
        client.shared.observe().metrics.xds_connected(false);
        // Without a limit of times the iterator never ends.
        let wait = backoff.next().unwrap_or(BACKOFF_MAX);
        let rules = if client.accepted_version.is_empty() {
            "no rules yet".to_owned()
        } else {
            format!(
                "keeping the rules of version \"{}\"",
                Untrusted::new(&client.accepted_version)
            )
        };
        match outcome {
            Ok(()) => tracing::warn!(
                control_plane = %client.settings.address,
                retry_in_ms = wait.as_millis() as u64,
                "the xDS control plane closed the stream; {rules}"
            ),
            Err(e) => tracing::warn!(
                control_plane = %client.settings.address,
                error = %e,
                retry_in_ms = wait.as_millis() as u64,
                "no stream to the xDS control plane; {rules}"
            ),
        }
        tokio::time::sleep(wait).await;
    }
}

/// The client's state across streams.
struct Client {
    settings: XdsSettings,
    node: Node,
    shared: Arc<Shared>,
    /// The `version_info` of the last response accepted (empty before the first).
    accepted_version: String,
}

impl Client {
    /// One stream: until it fails (`Err`) or the control plane ends it (`Ok`).
    async fn session(&mut self, backoff: &mut ExponentialBackoff) -> Result<(), StreamError> {
        let mut endpoint =
            tonic::transport::Endpoint::from_shared(self.settings.address.expose().to_owned())
                .map_err(|e| FieldError::new("rls.xds.address", e.to_string()))?
                .connect_timeout(CONNECT_TIMEOUT)
                .http2_keep_alive_interval(KEEPALIVE)
                .keep_alive_timeout(CONNECT_TIMEOUT);
        if let Some(tls) = self.settings.client_tls()? {
            endpoint = endpoint
                .tls_config(tls)
                .map_err(|e| FieldError::new("rls.xds", format!("TLS: {e}")))?;
        }
        let channel = endpoint
            .connect()
            .await
            .map_err(|e| StreamError::Connect(error_chain(&e)))?;
        let mut client =
            AggregatedDiscoveryServiceClient::new(channel).max_decoding_message_size(MAX_RESPONSE);
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        // The first request: the node, the type, the version already held.
        let _ = tx.send(self.request(self.accepted_version.clone(), String::new(), None));
        let mut responses = client
            .stream_aggregated_resources(tokio_stream::wrappers::UnboundedReceiverStream::new(rx))
            .await
            .map_err(|s| StreamError::Open(Untrusted::new(s.message()).to_string()))?
            .into_inner();
        self.shared.observe().metrics.xds_connected(true);
        tracing::info!(control_plane = %self.settings.address, node_id = %self.node.id, "xDS stream open; waiting for rate limit rules");
        loop {
            let response = match responses.message().await {
                Ok(Some(response)) => response,
                Ok(None) => return Ok(()),
                Err(status) => {
                    return Err(StreamError::Failed {
                        code: status.code(),
                        message: Untrusted::new(status.message()).to_string(),
                    });
                }
            };
            let reply = self.answer(&response);
            // Only an accepted response starts the backoff over: a control plane that sends
            // a refused one and closes would otherwise be reconnected to at once, forever.
            if reply.error_detail.is_none() {
                *backoff = self::backoff();
            }
            tx.send(reply).map_err(|_| StreamError::Closed)?;
        }
    }

    /// Applies one response and says what to send back: an ACK when its rules loaded, else a
    /// NACK naming what is wrong.
    fn answer(&mut self, response: &DiscoveryResponse) -> DiscoveryRequest {
        let snapshot = self.shared.snapshot();
        let options = snapshot
            .rls_settings
            .as_ref()
            .map(|s| LoadOptions {
                merge_domains: s.merge_domains,
                ignore_dot_files: false,
            })
            .unwrap_or_default();
        match load(response, &options) {
            Ok(rules) => {
                for w in rules.warnings() {
                    let w = w.to_string();
                    tracing::warn!(warning = %Untrusted::up_to(&w, MAX_REASON), "rate limit configuration from xDS");
                }
                let domains = rules.domains().collect::<Vec<_>>().join(", ");
                tracing::info!(
                    version = %Untrusted::new(&response.version_info),
                    domains = %Untrusted::new(&domains),
                    "rate limit rules from xDS applied"
                );
                self.shared.replace_rls(Arc::new(rules));
                self.shared.observe().metrics.xds_update(true);
                self.accepted_version = response.version_info.clone();
                self.request(response.version_info.clone(), response.nonce.clone(), None)
            }
            Err(reason) => {
                // Logged, stored (`last_reload_error`, the reload history) and sent back:
                // escaped, and bounded whatever the response holds.
                let message = format!(
                    "version \"{}\": {}",
                    Untrusted::new(&response.version_info),
                    Untrusted::up_to(&reason.to_string(), MAX_REASON)
                );
                tracing::error!(error = %message, "rate limit rules from xDS refused (NACK); keeping the last good ones");
                self.shared
                    .reload_failed(crate::state::ReloadSource::Xds, format!("xDS: {message}"));
                self.shared.observe().metrics.xds_update(false);
                self.request(
                    self.accepted_version.clone(),
                    response.nonce.clone(),
                    Some(RpcStatus {
                        code: INVALID_ARGUMENT,
                        message,
                        details: Vec::new(),
                    }),
                )
            }
        }
    }

    fn request(
        &self,
        version_info: String,
        response_nonce: String,
        error_detail: Option<RpcStatus>,
    ) -> DiscoveryRequest {
        DiscoveryRequest {
            version_info,
            node: Some(self.node.clone()),
            type_url: RATE_LIMIT_CONFIG_TYPE_URL.to_owned(),
            response_nonce,
            error_detail,
            ..Default::default()
        }
    }
}

/// Decodes and loads every resource of a response; the error names the resource and what is
/// wrong.
pub fn load(
    response: &DiscoveryResponse,
    options: &LoadOptions,
) -> Result<RlsConfig, XdsLoadError> {
    if response.type_url != RATE_LIMIT_CONFIG_TYPE_URL {
        return Err(XdsLoadError::ResponseType(response.type_url.clone()));
    }
    if response.resources.len() > MAX_RESOURCES {
        return Err(XdsLoadError::TooManyResources(response.resources.len()));
    }
    let mut resources = Vec::with_capacity(response.resources.len());
    let mut budget = Budget::default();
    for (index, any) in response.resources.iter().enumerate() {
        if any.type_url != RATE_LIMIT_CONFIG_TYPE_URL {
            return Err(XdsLoadError::ResourceType {
                index,
                type_url: any.type_url.clone(),
            });
        }
        let resource = RateLimitConfig::decode(any.value.as_slice())
            .map_err(|source| XdsLoadError::Decode { index, source })?;
        budget
            .check(&resource)
            .map_err(|source| XdsLoadError::TooLarge { index, source })?;
        resources.push(resource);
    }
    Ok(RlsConfig::from_xds(&resources, options)?)
}

/// The message of an error and of its sources: tonic's transport errors say little alone.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let more = s.to_string();
        // Some errors repeat their source's message in their own.
        if !text.ends_with(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        source = s.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_envoy_rules::xds::{RateLimitDescriptor, RateLimitPolicy, RateLimitUnit};

    #[test]
    fn backoff_doubles_with_jitter_up_to_its_ceiling() {
        let mut b = backoff();
        let mut ceiling = BACKOFF_INITIAL;
        for _ in 0..12 {
            let wait = b.next().unwrap();
            assert!(
                wait >= ceiling / 2 && wait <= ceiling,
                "{wait:?} vs {ceiling:?}"
            );
            ceiling = (ceiling * 2).min(BACKOFF_MAX);
        }
        assert_eq!(ceiling, BACKOFF_MAX);
        b = backoff();
        assert!(b.next().unwrap() <= BACKOFF_INITIAL);
    }

    #[test]
    fn a_response_of_another_type_or_an_undecodable_resource_is_refused() {
        use envoy_types::pb::google::protobuf::Any;
        let mut response = DiscoveryResponse {
            version_info: "1".into(),
            type_url: "type.googleapis.com/envoy.config.cluster.v3.Cluster".into(),
            ..Default::default()
        };
        let err = load(&response, &LoadOptions::default())
            .unwrap_err()
            .to_string();
        assert!(err.contains("envoy.config.cluster.v3.Cluster"), "{err}");
        response.type_url = RATE_LIMIT_CONFIG_TYPE_URL.into();
        response.resources = vec![Any {
            type_url: RATE_LIMIT_CONFIG_TYPE_URL.into(),
            value: vec![0xff, 0xff],
        }];
        let err = load(&response, &LoadOptions::default())
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("resources[0]: not a RateLimitConfig"),
            "{err}"
        );
        response.resources.clear();
        assert!(load(&response, &LoadOptions::default()).unwrap().is_empty());
    }

    /// A response of one resource whose descriptors are `descriptors`, named `name`.
    fn response_of(name: String, descriptors: Vec<RateLimitDescriptor>) -> DiscoveryResponse {
        use envoy_types::pb::google::protobuf::Any;
        let resource = RateLimitConfig {
            name,
            domain: "d".into(),
            descriptors,
        };
        DiscoveryResponse {
            version_info: "1".into(),
            type_url: RATE_LIMIT_CONFIG_TYPE_URL.into(),
            resources: vec![Any {
                type_url: RATE_LIMIT_CONFIG_TYPE_URL.into(),
                value: resource.encode_to_vec(),
            }],
            ..Default::default()
        }
    }

    fn leaf(key: String) -> RateLimitDescriptor {
        RateLimitDescriptor {
            key,
            rate_limit: Some(RateLimitPolicy {
                unit: RateLimitUnit::Second as i32,
                requests_per_unit: 1,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn a_response_past_a_bound_is_refused_naming_the_bound_before_conversion() {
        use sluice_envoy_rules::xds::{MAX_DEPTH, MAX_DESCRIPTORS, MAX_TEXT};
        let refused =
            |r: &DiscoveryResponse| load(r, &LoadOptions::default()).unwrap_err().to_string();
        // The crafted response: a 32 KiB name over many descriptors.
        let many: Vec<_> = (0..2_000).map(|i| leaf(format!("k{i}"))).collect();
        let err = refused(&response_of("n".repeat(32 << 10), many.clone()));
        assert_eq!(
            err,
            format!("resources[0]: name: 32768 bytes, more than the {MAX_TEXT} a text may have")
        );
        // Within the bounds, the same descriptors load.
        let ok = load(&response_of("n".into(), many), &LoadOptions::default()).unwrap();
        assert_eq!(ok.domains().count(), 1);

        let mut long_key = vec![leaf("a".into()), leaf("b".into())];
        long_key[1].descriptors.push(leaf("v".repeat(MAX_TEXT + 1)));
        assert_eq!(
            refused(&response_of("n".into(), long_key)),
            "resources[0]: descriptors[1].descriptors[0].key: 1025 bytes, more than the 1024 a \
             text may have"
        );

        let too_many: Vec<_> = (0..=MAX_DESCRIPTORS)
            .map(|i| leaf(format!("k{i}")))
            .collect();
        assert_eq!(
            refused(&response_of("n".into(), too_many)),
            format!(
                "resources[0]: descriptors[{MAX_DESCRIPTORS}]: more than {MAX_DESCRIPTORS} \
                 descriptors in one response"
            )
        );

        let mut deep = leaf("x".into());
        for _ in 0..MAX_DEPTH {
            deep = RateLimitDescriptor {
                key: "x".into(),
                descriptors: vec![deep],
                ..Default::default()
            };
        }
        let err = refused(&response_of("n".into(), vec![deep]));
        assert!(
            err.ends_with(&format!("nested deeper than {MAX_DEPTH} levels")),
            "{err}"
        );

        // Long keys within the text bound, nested, past the full keys' bound.
        let key = "k".repeat(MAX_TEXT);
        let wide: Vec<_> = (0..1_000)
            .map(|i| RateLimitDescriptor {
                key: format!("{i}{}", &key[..1000]),
                descriptors: (0..8)
                    .map(|j| leaf(format!("{j}{}", &key[..1000])))
                    .collect(),
                ..Default::default()
            })
            .collect();
        let err = refused(&response_of("n".into(), wide));
        assert!(err.contains("the full keys"), "{err}");
    }
}
