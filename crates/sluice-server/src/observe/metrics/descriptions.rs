//! The `# HELP` line and unit of every metric a server exposes, and the check that every
//! metric recorded anywhere in the workspace has one.

/// Every metric this process records, by kind, with the `# HELP` line Prometheus shows (the
/// wording of docs/server.md's table, shortened).
const COUNTERS: &[(&str, &str)] = &[
    (
        "sluice_decisions_total",
        "Decisions by policy (or Envoy domain), op and outcome (allowed, denied, degraded, error).",
    ),
    (
        "sluice_rls_hits_total",
        "Hits (cost) of Envoy descriptors by domain, rule statistics key and result (within_limit, over_limit, shadow_mode).",
    ),
    (
        "sluice_store_errors_total",
        "Failed Redis calls by store and kind of error.",
    ),
    (
        "sluice_store_unreplicated_total",
        "Writes acknowledged by fewer replicas than store.wait_for_replicas asks, by store.",
    ),
    (
        "sluice_store_circuit_opened_total",
        "Times each store's circuit breaker opened.",
    ),
    (
        "sluice_reserve_total",
        "Reservation layer (local.enabled): checks served local, cached_denial, waited or direct, and its fetch and refund calls.",
    ),
    (
        "sluice_config_reloads_total",
        "Configuration reloads by result (ok, error).",
    ),
    (
        "sluice_connections_limited_total",
        "Times a listener reached listen.max_connections and stopped accepting until a connection closed.",
    ),
    (
        "sluice_connection_timeouts_total",
        "Connections closed by a listen timeout, by listener and timeout (idle, header, body, handshake).",
    ),
    (
        "sluice_rlqs_requests_total",
        "Requests reported over RLQS by rule and result (charged, lost, denied).",
    ),
    ("sluice_rlqs_actions_total", "RLQS actions sent, by action."),
    (
        "sluice_xds_updates_total",
        "Responses of the rls.xds control plane by result (ack, nack).",
    ),
    (
        "sluice_decisions_near_limit_total",
        "Admitted decisions that left a limit at least metrics.near_limit_ratio used, by policy or Envoy domain.",
    ),
];

const GAUGES: &[(&str, &str)] = &[
    (
        "sluice_store_circuit_state",
        "Circuit breaker of each store: 0 closed, 1 open, 2 half-open.",
    ),
    (
        "sluice_connections_open",
        "Connections open now, by listener.",
    ),
    (
        "sluice_xds_connected",
        "1 while the stream to the rls.xds control plane is open, else 0.",
    ),
];

/// In seconds.
const HISTOGRAMS: &[(&str, &str)] = &[
    (
        "sluice_decision_latency_seconds",
        "Time of a whole decision by op, store call and failure mode included.",
    ),
    (
        "sluice_store_latency_seconds",
        "Time of one Redis call by store.",
    ),
];

/// Written at each scrape by [`super::scrape`], which takes the help from this table.
const SCRAPED: &[(&str, &str)] = &[
    (
        "sluice_limit_max",
        "The max of each limit of each policy in force, by policy, limit (its place), per (window) and algorithm.",
    ),
    (
        "sluice_rule_limit",
        "The requests_per_unit of each Envoy rule in force, by domain, rule (key path) and unit; unlimited rules have none.",
    ),
    (
        "process_cpu_seconds_total",
        "User and system CPU time spent, in seconds.",
    ),
    (
        "process_resident_memory_bytes",
        "Resident memory size in bytes.",
    ),
    (
        "sluice_region_lag_seconds",
        "Replication lag of each other region's replica in this region (now - its last heartbeat), in seconds (store.regions).",
    ),
    (
        "sluice_region_view_age_seconds",
        "Age of the oldest cached view of each other region's usage, in seconds (store.regions).",
    ),
    (
        "sluice_region_reachable",
        "1 when the other region's replica answered its last read, else 0 (store.regions).",
    ),
    (
        "sluice_region_fallbacks_total",
        "Decisions taken in a fallback mode while a region's view was stale, per policy and mode (store.regions).",
    ),
    ("process_open_fds", "Open file descriptors."),
    (
        "process_max_fds",
        "The limit of open file descriptors (RLIMIT_NOFILE, soft).",
    ),
    (
        "process_start_time_seconds",
        "Start time of the process since the Unix epoch, in seconds.",
    ),
    ("process_threads", "Threads of the process."),
];

/// The `# HELP` text of a metric of the tables (empty for one they do not hold).
pub(crate) fn help(name: &str) -> &'static str {
    [COUNTERS, GAUGES, HISTOGRAMS, SCRAPED]
        .into_iter()
        .flatten()
        .find(|d| d.0 == name)
        .map_or("", |d| d.1)
}

/// Gives every recorded metric its `# HELP` line.
pub(super) fn describe() {
    for &(name, help) in COUNTERS {
        metrics::describe_counter!(name, help);
    }
    for &(name, help) in GAUGES {
        metrics::describe_gauge!(name, help);
    }
    for &(name, help) in HISTOGRAMS {
        metrics::describe_histogram!(name, metrics::Unit::Seconds, help);
    }
}

#[cfg(test)]
mod tests {
    use super::{COUNTERS, GAUGES, HISTOGRAMS, SCRAPED};

    /// Every metric a source file of the workspace records is described: a new metric without
    /// a `# HELP` line fails here.
    #[test]
    fn every_recorded_metric_is_described() {
        let crates = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let mut recorded = std::collections::BTreeSet::new();
        let mut dirs = vec![crates];
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(&dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    if !path.ends_with("target") && !path.ends_with("tests") {
                        dirs.push(path);
                    }
                } else if path.extension().is_some_and(|e| e == "rs") {
                    let text = std::fs::read_to_string(&path).unwrap();
                    for macro_name in ["counter!(", "gauge!(", "histogram!("] {
                        for (at, _) in text.match_indices(macro_name) {
                            let rest = text[at + macro_name.len()..].trim_start();
                            if let Some(name) = rest
                                .strip_prefix('"')
                                .and_then(|r| r.split('"').next())
                                .filter(|n| n.starts_with("sluice_"))
                            {
                                recorded.insert(name.to_owned());
                            }
                        }
                    }
                }
            }
        }
        assert!(recorded.len() >= 15, "{recorded:?}");
        let described: std::collections::BTreeSet<String> = [COUNTERS, GAUGES, HISTOGRAMS]
            .into_iter()
            .flatten()
            .map(|d| d.0.to_owned())
            .collect();
        let missing: Vec<_> = recorded.difference(&described).collect();
        assert!(
            missing.is_empty(),
            "metrics without a description: {missing:?}"
        );
        let stale: Vec<_> = described.difference(&recorded).collect();
        assert!(stale.is_empty(), "described but never recorded: {stale:?}");
        // A scraped family is written, by its name, in `scrape.rs`.
        let scrape = include_str!("../scrape.rs");
        for (name, _) in SCRAPED {
            assert!(
                scrape.contains(&format!("\"{name}\"")),
                "{name} is described as scraped but scrape.rs never writes it"
            );
        }
    }
}
