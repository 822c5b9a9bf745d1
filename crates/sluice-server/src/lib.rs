//! The Sluice server: HTTP JSON API, Envoy's rate limit gRPC API, configuration, metrics.

pub mod rls;
