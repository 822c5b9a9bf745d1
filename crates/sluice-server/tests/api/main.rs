//! The HTTP API, the listeners and connections, configuration, the simulator and the clock, end to end: one test binary (one link) for the area.

#[path = "../support/mod.rs"]
mod support;

#[path = "../support/otlp.rs"]
mod otlp;

mod clock;
mod concurrency;
mod config;
mod config_store;
mod connections;
mod http;
mod layer_rule;
mod listeners;
mod metrics;
mod overrides;
mod simulate;
mod simulate_logs;
mod stats;
mod top;
mod traces;
