//! Prometheus metrics at `/metrics`.
//!
//! Labels are bounded: a policy name, an Envoy domain and store names (from the
//! configuration), an outcome, an operation; never the key, whose cardinality is the users',
//! and never a domain a client made up (`unknown`). The full list is in docs/server.md.
//!
//! | metric | labels |
//! |---|---|
//! | `sluice_decisions_total` | policy (or configured Envoy domain, else `unknown`), op (check/peek/refund/should_rate_limit), outcome (allowed/denied/degraded/error) |
//! | `sluice_rls_hits_total` | domain, key (a rule's statistics key, at most `grpc::MAX_STATS_KEYS`), result (within_limit/over_limit/shadow_mode) |
//! | `sluice_decision_latency_seconds` (histogram) | op: the whole decision, any store, failure mode included |
//! | `sluice_store_latency_seconds` (histogram) | store: one Redis call (recorded by `sluice-redis`) |
//! | `sluice_store_errors_total` | store, kind (`sluice::StoreErrorKind::as_str`: timeout, unavailable, oom, readonly, busy, denied, …, corrupt, rejected): failed Redis calls |
//! | `sluice_store_circuit_state` (gauge) | store: 0 closed, 1 open, 2 half-open |
//! | `sluice_store_circuit_opened_total` | store: times the shard's circuit opened |
//! | `sluice_reserve_total` | served (local/cached_denial/waited/direct), fetches, refunds: the reservation layer (`local.enabled`) |
//! | `sluice_config_reloads_total` | result (ok/error) |
//! | `sluice_xds_updates_total` | result (ack/nack): `rls.xds` responses (`crate::rls_xds`) |
//! | `sluice_xds_connected` (gauge) | 1 while the `rls.xds` stream is open |
//!
//! A store is named by its primary's URL, `sentinel:<master>` or `cluster:<first node>`.

use std::sync::OnceLock;
use std::time::Duration;

use crate::state::StoreHandle;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

/// Histogram buckets for store latency, in seconds: 100 µs to 1 s.
const LATENCY_BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
];

static HANDLE: OnceLock<Option<PrometheusHandle>> = OnceLock::new();

/// Installs the process-wide Prometheus recorder (once) and returns its handle; `None` when
/// another recorder was installed first (an embedding application's).
pub fn handle() -> Option<&'static PrometheusHandle> {
    HANDLE
        .get_or_init(|| {
            let builder = PrometheusBuilder::new();
            let builder = match builder.set_buckets(LATENCY_BUCKETS) {
                Ok(b) => b,
                Err(e) => {
                    tracing::warn!(error = %e, "metrics buckets refused; using summaries");
                    PrometheusBuilder::new()
                }
            };
            let recorder = builder.build_recorder();
            let handle = recorder.handle();
            match metrics::set_global_recorder(recorder) {
                Ok(()) => Some(handle),
                Err(e) => {
                    tracing::warn!(error = %e, "another metrics recorder is installed; /metrics is off");
                    None
                }
            }
        })
        .as_ref()
}

/// The text exposition of every metric.
pub fn render() -> Option<String> {
    handle().map(|h| {
        h.run_upkeep();
        h.render()
    })
}

/// Counts one decision.
pub fn decision(policy: &std::sync::Arc<str>, op: &'static str, outcome: &'static str) {
    // An `Arc<str>` label is a reference count, not an allocation per request.
    metrics::counter!("sluice_decisions_total", "policy" => policy.clone(), "op" => op, "outcome" => outcome)
        .increment(1);
}

/// Counts one Envoy descriptor's hits under its rule's statistics key (the reference's
/// per-rule `total_hits` split by result: `within_limit`, `over_limit`, `shadow_mode`).
pub fn rls_hits(
    domain: &std::sync::Arc<str>,
    key: &std::sync::Arc<str>,
    result: &'static str,
    hits: u64,
) {
    metrics::counter!("sluice_rls_hits_total", "domain" => domain.clone(), "key" => key.clone(), "result" => result)
        .increment(hits);
}

/// Records how long a decision took (store call and failure mode included).
pub fn decision_latency(op: &'static str, took: Duration) {
    metrics::histogram!("sluice_decision_latency_seconds", "op" => op).record(took.as_secs_f64());
}

/// Publishes the reservation layer's counters (called before rendering).
pub fn reservation(stats: sluice::ReserveStats) {
    for (what, n) in [
        ("local", stats.local),
        ("cached_denial", stats.cached_denials),
        ("waited", stats.waited),
        ("direct", stats.direct),
        ("fetch", stats.fetches),
        ("refund", stats.refunds),
    ] {
        metrics::counter!("sluice_reserve_total", "what" => what).absolute(n);
    }
}

/// Publishes each shard's circuit breaker (called before rendering).
pub fn circuits(store: &StoreHandle) {
    if let StoreHandle::Redis(sharded) = store {
        for shard in sharded.shards() {
            let name = shard.name().to_owned();
            metrics::gauge!("sluice_store_circuit_state", "store" => name.clone())
                .set(shard.state().as_gauge());
            metrics::counter!("sluice_store_circuit_opened_total", "store" => name)
                .absolute(shard.opened_total());
        }
    }
}

/// Counts a configuration reload.
pub fn reload(ok: bool) {
    let result = if ok { "ok" } else { "error" };
    metrics::counter!("sluice_config_reloads_total", "result" => result).increment(1);
}
