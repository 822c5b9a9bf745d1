//! Envoy's rate limit service, the surface over the rules of `sluice_envoy_rules`: the
//! semantics of `ShouldRateLimit` ([`service`]) and its gRPC adapter ([`grpc`]).

pub(crate) mod grpc;
pub(crate) mod service;
