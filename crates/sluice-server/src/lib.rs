//! The Sluice server: the HTTP JSON API, Envoy's rate limit gRPC API and its rate limit quota
//! service ([`rlqs`]), configuration and metrics. [`app::run`] is the server, which tests
//! start on port-0 listeners; the `sluice` binary (crate `sluice-cli`) only parses the
//! command line and calls it. Only what serving needs is here: the load generator is
//! `sluice-bench`.

pub mod admin;
pub mod app;
pub mod config;
pub mod conn;
pub mod grpc;
pub mod http;
pub mod metrics;
pub mod rlqs;
pub mod rls;
pub mod rls_xds;
pub mod simulate;
pub mod state;
pub mod stats;
pub mod tls;
pub mod top;
mod unique;
