//! Envoy's rate limit service, v3, on the wire: `ShouldRateLimit`'s protobuf request
//! translated to a [`RlsRequest`], answered by the service ([`super::service`], where the
//! semantics are: cost, all or nothing, the overall code, shadow and quota modes), and its
//! [`RlsAnswer`] or [`RlsError`] translated back; with `grpc.health.v1` on the same port.

use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code as ProtoCode, DescriptorStatus as ProtoStatus, RateLimit, rate_limit::Unit as ProtoUnit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::Duration as ProtoDuration;
use opentelemetry_http::HeaderExtractor;
use tonic::{Request, Response, Status};

use super::service::Rls;
use crate::state::Shared;
use sluice_envoy_rules::Unit;
use sluice_envoy_rules::answer::{Code, DescriptorStatus, RlsAnswer, RlsError, RuleLimit};
use sluice_envoy_rules::request::{CarriedLimit, Descriptor, RlsRequest};

/// The most bytes of a `ShouldRateLimit` request message (an Envoy request is a few hundred);
/// a larger one is refused by the transport before it is decoded.
pub(crate) const MAX_MESSAGE: usize = 64 * 1024;

/// The gRPC service.
#[derive(Debug)]
pub(crate) struct RlsService {
    rls: Rls,
}

impl RlsService {
    /// A service over the server's shared state.
    pub(crate) fn new(shared: std::sync::Arc<Shared>) -> Self {
        Self {
            rls: Rls::new(shared),
        }
    }

    /// The tonic server for this service.
    pub(crate) fn into_server(self) -> RateLimitServiceServer<Self> {
        RateLimitServiceServer::new(self).max_decoding_message_size(MAX_MESSAGE)
    }
}

#[tonic::async_trait]
impl RateLimitService for RlsService {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        let (metadata, _, req) = request.into_parts();
        let plain = RlsRequest {
            domain: &req.domain,
            descriptors: req.descriptors.iter().map(descriptor).collect(),
            hits_addend: req.hits_addend,
        };
        let carrier = HeaderExtractor(&metadata.into_headers());
        let answer = self.rls.should_rate_limit(&plain, &carrier).await;
        answer
            .map(|a| Response::new(response(a)))
            .map_err(|e| status(&e))
    }
}

/// A protobuf descriptor as the service reads it.
fn descriptor(d: &RateLimitDescriptor) -> Descriptor<'_> {
    Descriptor {
        entries: d
            .entries
            .iter()
            .map(|e| (e.key.as_str(), e.value.as_str()))
            .collect(),
        limit: d.limit.as_ref().map(|limit| CarriedLimit {
            requests_per_unit: limit.requests_per_unit,
            unit: unit(limit.unit).ok_or(limit.unit),
        }),
        hits_addend: d.hits_addend.as_ref().map(|v| v.value),
        is_negative_hits: d.is_negative_hits,
    }
}

/// The rule unit a protobuf unit names (none for `UNKNOWN` and numbers it does not know).
fn unit(wire: i32) -> Option<Unit> {
    let wire = ProtoUnit::try_from(wire).ok()?;
    Unit::ALL
        .into_iter()
        .find(|u| u.proto_name() == wire.as_str_name())
}

/// The protobuf response of an answer.
fn response(answer: RlsAnswer) -> RateLimitResponse {
    RateLimitResponse {
        overall_code: code(answer.overall_code),
        dynamic_metadata: answer.degraded.map(degraded_metadata),
        statuses: answer.statuses.into_iter().map(descriptor_status).collect(),
        response_headers_to_add: answer
            .headers
            .into_iter()
            .map(|(key, value)| HeaderValue {
                key: key.to_owned(),
                value,
                ..HeaderValue::default()
            })
            .collect(),
        ..RateLimitResponse::default()
    }
}

/// The gRPC error of a request that got no answer: as in the reference service, a store
/// failure is `UNAVAILABLE`, so that Envoy's `failure_mode_deny` decides whether the request
/// passes.
fn status(e: &RlsError) -> Status {
    let message = e.to_string();
    match e {
        RlsError::Invalid(_) => Status::invalid_argument(message),
        RlsError::NoRules => Status::failed_precondition(message),
        RlsError::StoreRefused(_) | RlsError::StoreDown(_) => Status::unavailable(message),
    }
}

fn code(code: Code) -> i32 {
    let code = match code {
        Code::Ok => ProtoCode::Ok,
        Code::OverLimit => ProtoCode::OverLimit,
    };
    code as i32
}

fn descriptor_status(s: DescriptorStatus) -> ProtoStatus {
    ProtoStatus {
        code: code(s.code),
        current_limit: s.current_limit.map(rate_limit),
        limit_remaining: s.limit_remaining,
        duration_until_reset: s.duration_until_reset.map(duration_secs),
        ..ProtoStatus::default()
    }
}

fn rate_limit(limit: RuleLimit) -> RateLimit {
    RateLimit {
        name: limit.name,
        requests_per_unit: limit.requests_per_unit,
        unit: limit
            .unit
            .and_then(|u| ProtoUnit::from_str_name(u.proto_name()))
            .unwrap_or(ProtoUnit::Unknown) as i32,
    }
}

/// Whole seconds, as the reference answers `duration_until_reset` (`CalculateReset`); a
/// window ends on a second, so rounding up loses nothing.
fn duration_secs(secs: u64) -> ProtoDuration {
    ProtoDuration {
        seconds: i64::try_from(secs).unwrap_or(i64::MAX),
        nanos: 0,
    }
}

/// `{"degraded": "open"}` (or `"local"`) when a descriptor was decided without the store
/// (`rls.on_store_error`): Envoy emits it as the filter's dynamic metadata, for access logs.
fn degraded_metadata(how: sluice::Degraded) -> envoy_types::pb::google::protobuf::Struct {
    use envoy_types::pb::google::protobuf::{Struct, Value, value::Kind};
    Struct {
        fields: [(
            "degraded".to_owned(),
            Value {
                kind: Some(Kind::StringValue(how.as_str().to_owned())),
            },
        )]
        .into_iter()
        .collect(),
    }
}
