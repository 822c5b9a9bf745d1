//! The Sluice server: the HTTP JSON API (CONTRACT §3), configuration (§5) and the `sluice`
//! command line (§6). `main` only parses the command line; [`app::run`] is the server, which
//! tests start on port-0 listeners.

pub mod app;
pub mod bench;
pub mod cli;
pub mod config;
pub mod grpc;
pub mod http;
pub mod metrics;
pub mod rls;
pub mod state;
