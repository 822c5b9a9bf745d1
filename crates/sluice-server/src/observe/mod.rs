//! Observation: the Prometheus metrics ([`metrics`]), the decision counts of `/v1/stats`
//! ([`stats`], and per Envoy rule [`rules`]), their last hour ([`history`]), the open RLQS
//! streams ([`streams`]), the regions store's view of the other regions ([`regions`]), the heavy-hitter summaries of `/v1/top` ([`top`]), the OTLP traces
//! of decisions ([`traces`]), and how text from outside is shown ([`untrusted`]). It imports nothing of the
//! runtime or the surfaces above it; they report into it.

pub(crate) mod history;
pub(crate) mod metrics;
pub(crate) mod regions;
pub(crate) mod rules;
pub(crate) mod scrape;
pub(crate) mod stats;
pub(crate) mod streams;
pub mod top;
pub(crate) mod traces;
pub(crate) mod untrusted;

pub(crate) use untrusted::Untrusted;
