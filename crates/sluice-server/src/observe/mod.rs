//! Observation: the Prometheus metrics ([`metrics`]), the decision counts of `/v1/stats`
//! ([`stats`], and per Envoy rule [`rules`]), their last hour ([`history`]), the open RLQS
//! streams ([`streams`]), the regions store's view of the other regions ([`regions`]), the heavy-hitter summaries of `/v1/top` ([`top`]), the OTLP traces
//! of decisions ([`traces`]), and how text from outside is shown ([`untrusted`]). It imports nothing of the
//! runtime or the surfaces above it; they report into it.
//!
//! A server owns one [`Observe`], made with its state: nothing here is global to the process,
//! so two servers in one process (an embedding application's, a test binary's) never count
//! into each other's figures.

pub(crate) mod history;
pub mod metrics;
pub(crate) mod regions;
pub(crate) mod rules;
pub(crate) mod scrape;
pub(crate) mod stats;
pub(crate) mod streams;
pub mod top;
pub mod traces;
pub(crate) mod untrusted;

pub(crate) use untrusted::Untrusted;

use sluice::latency::LatencyWindow;

/// Where a decision was asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Surface {
    /// The HTTP API.
    Http = 0,
    /// The gRPC rate limit service (`ShouldRateLimit`).
    Grpc = 1,
}

/// Everything one server records of what it decides.
#[derive(Debug)]
pub(crate) struct Observe {
    /// What `/metrics` shows.
    pub(crate) metrics: metrics::Metrics,
    /// Checks per policy and outcome since start.
    pub(crate) counts: stats::DecisionCounts,
    /// Checks per Envoy rule and detailed key since start.
    pub(crate) rules: rules::RuleCounts,
    /// The last hour of checks per second, per policy and rule.
    pub(crate) history: history::History,
    /// The heavy hitters per policy and per Envoy rule (`top`); sized at start.
    pub(crate) top: top::TopKeys,
    /// How long decisions took over the last minute, per [`Surface`].
    pub(crate) decision_latency: [LatencyWindow; 2],
    /// The open RLQS streams.
    pub(crate) streams: streams::Streams,
    /// Decisions as spans over OTLP (`tracing`); off by default.
    pub(crate) traces: traces::Traces,
}

impl Observe {
    /// Nothing observed yet, heavy hitters kept as `top` says, spans made by `traces`.
    pub(crate) fn new(top: top::settings::TopSettings, traces: traces::Traces) -> Self {
        Self {
            metrics: metrics::Metrics::new(),
            counts: stats::DecisionCounts::default(),
            rules: rules::RuleCounts::default(),
            history: history::History::default(),
            top: top::TopKeys::new(top.capacity, top.window_ms),
            decision_latency: Default::default(),
            streams: streams::Streams::default(),
            traces,
        }
    }

    /// Records how long a decision that started at `started` took, in the metrics
    /// (`sluice_decision_latency_seconds{op}`) and in the last minute of its surface.
    pub(crate) fn decision_took(
        &self,
        op: &'static str,
        surface: Surface,
        started: std::time::Instant,
    ) {
        let took = started.elapsed();
        self.metrics.decision_latency(op, took);
        self.decision_latency[surface as usize].record(started, took);
    }
}
