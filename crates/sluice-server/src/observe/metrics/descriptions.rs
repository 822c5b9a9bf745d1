//! The `# HELP` line and unit of every metric a server exposes, and the check that every
//! metric recorded anywhere in the workspace has one.

/// Every metric this process can expose, with its unit and the `# HELP` line Prometheus
/// shows (the wording of docs/server.md's table, shortened).
const DESCRIPTIONS: &[(&str, Kind, &str)] = &[
    (
        "sluice_decisions_total",
        Kind::Counter,
        "Decisions by policy (or Envoy domain), op and outcome (allowed, denied, degraded, error).",
    ),
    (
        "sluice_rls_hits_total",
        Kind::Counter,
        "Hits (cost) of Envoy descriptors by domain, rule statistics key and result (within_limit, over_limit, shadow_mode).",
    ),
    (
        "sluice_decision_latency_seconds",
        Kind::Histogram,
        "Time of a whole decision by op, store call and failure mode included.",
    ),
    (
        "sluice_store_latency_seconds",
        Kind::Histogram,
        "Time of one Redis call by store.",
    ),
    (
        "sluice_store_errors_total",
        Kind::Counter,
        "Failed Redis calls by store and kind of error.",
    ),
    (
        "sluice_store_unreplicated_total",
        Kind::Counter,
        "Writes acknowledged by fewer replicas than store.wait_for_replicas asks, by store.",
    ),
    (
        "sluice_store_circuit_state",
        Kind::Gauge,
        "Circuit breaker of each store: 0 closed, 1 open, 2 half-open.",
    ),
    (
        "sluice_store_circuit_opened_total",
        Kind::Counter,
        "Times each store's circuit breaker opened.",
    ),
    (
        "sluice_reserve_total",
        Kind::Counter,
        "Reservation layer (local.enabled): checks served local, cached_denial, waited or direct, and its fetch and refund calls.",
    ),
    (
        "sluice_config_reloads_total",
        Kind::Counter,
        "Configuration reloads by result (ok, error).",
    ),
    (
        "sluice_connections_open",
        Kind::Gauge,
        "Connections open now, by listener.",
    ),
    (
        "sluice_connections_limited_total",
        Kind::Counter,
        "Times a listener reached listen.max_connections and stopped accepting until a connection closed.",
    ),
    (
        "sluice_connection_timeouts_total",
        Kind::Counter,
        "Connections closed by a listen timeout, by listener and timeout (idle, header, body, handshake).",
    ),
    (
        "sluice_rlqs_requests_total",
        Kind::Counter,
        "Requests reported over RLQS by rule and result (charged, lost, denied).",
    ),
    (
        "sluice_rlqs_actions_total",
        Kind::Counter,
        "RLQS actions sent, by action.",
    ),
    (
        "sluice_xds_updates_total",
        Kind::Counter,
        "Responses of the rls.xds control plane by result (ack, nack).",
    ),
    (
        "sluice_xds_connected",
        Kind::Gauge,
        "1 while the stream to the rls.xds control plane is open, else 0.",
    ),
    (
        "sluice_decisions_near_limit_total",
        Kind::Counter,
        "Admitted decisions that left a limit at least metrics.near_limit_ratio used, by policy or Envoy domain.",
    ),
    (
        "sluice_limit_max",
        Kind::Scraped,
        "The max of each limit of each policy in force, by policy, limit (its place), per (window) and algorithm.",
    ),
    (
        "sluice_rule_limit",
        Kind::Scraped,
        "The requests_per_unit of each Envoy rule in force, by domain, rule (key path) and unit; unlimited rules have none.",
    ),
    (
        "process_cpu_seconds_total",
        Kind::Scraped,
        "User and system CPU time spent, in seconds.",
    ),
    (
        "process_resident_memory_bytes",
        Kind::Scraped,
        "Resident memory size in bytes.",
    ),
    (
        "sluice_region_lag_seconds",
        Kind::Scraped,
        "Replication lag of each other region's replica in this region (now - its last heartbeat), in seconds (store.regions).",
    ),
    (
        "sluice_region_view_age_seconds",
        Kind::Scraped,
        "Age of the oldest cached view of each other region's usage, in seconds (store.regions).",
    ),
    (
        "sluice_region_reachable",
        Kind::Scraped,
        "1 when the other region's replica answered its last read, else 0 (store.regions).",
    ),
    (
        "sluice_region_fallbacks_total",
        Kind::Scraped,
        "Decisions taken in a fallback mode while a region's view was stale, per policy and mode (store.regions).",
    ),
    ("process_open_fds", Kind::Scraped, "Open file descriptors."),
    (
        "process_max_fds",
        Kind::Scraped,
        "The limit of open file descriptors (RLIMIT_NOFILE, soft).",
    ),
    (
        "process_start_time_seconds",
        Kind::Scraped,
        "Start time of the process since the Unix epoch, in seconds.",
    ),
    ("process_threads", Kind::Scraped, "Threads of the process."),
];

/// The `# HELP` text of a metric of the table (empty for one it does not hold).
pub(crate) fn help(name: &str) -> &'static str {
    DESCRIPTIONS
        .iter()
        .find(|d| d.0 == name)
        .map_or("", |d| d.2)
}

#[derive(Clone, Copy)]
enum Kind {
    Counter,
    Gauge,
    Histogram,
    /// Written at each scrape by [`super::scrape`], which takes the help from this table.
    Scraped,
}

/// Gives every metric its `# HELP` line.
pub(super) fn describe() {
    for &(name, kind, help) in DESCRIPTIONS {
        match kind {
            Kind::Counter => metrics::describe_counter!(name, help),
            Kind::Gauge => metrics::describe_gauge!(name, help),
            Kind::Histogram => {
                metrics::describe_histogram!(name, metrics::Unit::Seconds, help);
            }
            Kind::Scraped => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{DESCRIPTIONS, Kind};

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
        let described: std::collections::BTreeSet<String> = DESCRIPTIONS
            .iter()
            .filter(|d| !matches!(d.1, Kind::Scraped))
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
        for (name, _, _) in DESCRIPTIONS.iter().filter(|d| matches!(d.1, Kind::Scraped)) {
            assert!(
                scrape.contains(&format!("\"{name}\"")),
                "{name} is described as scraped but scrape.rs never writes it"
            );
        }
    }
}
