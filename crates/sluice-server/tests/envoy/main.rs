//! Envoy's surfaces end to end: the rate limit gRPC API, the quota service (RLQS), the reference's rule files and the parity suites against the reference: one test binary for the area.

#[path = "../support/mod.rs"]
mod support;

#[path = "../support/otlp.rs"]
mod otlp;

mod envoy_config;
mod grpc;
mod metrics;
mod parity_config;
mod parity_service;
mod reflection;
mod rlqs;
mod rls_config;
mod rls_xds;
mod traces;
