//! Prometheus metrics at `/metrics`.
//!
//! Labels are bounded: a policy name, an Envoy domain and store names (from the
//! configuration), an outcome, an operation; never the key, whose cardinality is the users',
//! and never a domain a client made up (`unknown`). The full list is in docs/server.md.
//!
//! | metric | labels |
//! |---|---|
//! | `sluice_decisions_total` | policy (or configured Envoy domain, else `unknown`), op (check/peek/refund/should_rate_limit), outcome (allowed/denied/degraded/error) |
//! | `sluice_rls_hits_total` | domain, key (a rule's statistics key, at most `rls::service::MAX_STATS_KEYS`), result (within_limit/over_limit/shadow_mode) |
//! | `sluice_decision_latency_seconds` (histogram) | op: the whole decision, any store, failure mode included |
//! | `sluice_store_latency_seconds` (histogram) | store: one Redis call (recorded by `state::store`'s `TracedStore`; a call an open circuit refused counts too) |
//! | `sluice_store_errors_total` | store, kind (`sluice::StoreErrorKind::as_str`: timeout, unavailable, oom, readonly, busy, denied, …, corrupt, rejected): failed Redis calls, a call an open circuit refused too (`unavailable`) |
//! | `sluice_store_unreplicated_total` | store: writes fewer replicas acknowledged than `store.wait_for_replicas` asks (read from the store at each scrape) |
//! | `sluice_store_circuit_state` (gauge) | store: 0 closed, 1 open, 2 half-open |
//! | `sluice_store_circuit_opened_total` | store: times the shard's circuit opened |
//! | `sluice_reserve_total` | served (local/cached_denial/waited/direct), fetches, refunds: the reservation layer (`local.enabled`) |
//! | `sluice_config_reloads_total` | result (ok/error) |
//! | `sluice_connections_open` (gauge) | listener (http/grpc/admin): connections open now (recorded by `conn`) |
//! | `sluice_connections_limited_total` | listener: times it reached `listen.max_connections` (recorded by `conn`) |
//! | `sluice_connection_timeouts_total` | listener, timeout (idle/header/body/handshake) (recorded by `conn`) |
//! | `sluice_rlqs_requests_total` | rule (an `rlqs.buckets` rule's name), result (charged/lost/denied) (recorded by `rlqs`) |
//! | `sluice_rlqs_actions_total` | action (token_bucket/deny_all/allow_all/abandon/store_error) (recorded by `rlqs`) |
//! | `sluice_xds_updates_total` | result (ack/nack): `rls.xds` responses (recorded by `rls_xds`) |
//! | `sluice_xds_connected` (gauge) | 1 while the `rls.xds` stream is open (recorded by `rls_xds`) |
//! | `sluice_decisions_near_limit_total` | policy (or the Envoy domain, as `sluice_decisions_total`): admitted decisions that left a limit at least `metrics.near_limit_ratio` used |
//! | `sluice_limit_max`, `sluice_rule_limit` (gauges) | the limits in force, computed at each scrape ([`super::scrape`]) |
//! | `sluice_region_lag_seconds`, `sluice_region_view_age_seconds`, `sluice_region_reachable` (gauges) | region: the regions store's view of each other region (`store.regions`, [`super::scrape`]) |
//! | `sluice_region_fallbacks_total` | policy, mode (local_share/local_only/closed): decisions taken in a fallback mode ([`super::scrape`]) |
//! | `process_*` | the process' CPU, memory, descriptors, threads, start time (Linux; [`super::scrape`]) |
//!
//! A store is named by its primary's URL, `sentinel:<master>` or `cluster:<first node>`.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use metrics::{Counter, Histogram, SharedString};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle, PrometheusRecorder};

use crate::observe::stats::Outcome;

mod descriptions;
pub mod settings;

pub(crate) use descriptions::help;

/// Histogram buckets for decision and store latency, in seconds: 10 µs to 1 s (a decision in
/// memory takes tens of µs, one over Redis a few hundred).
const LATENCY_BUCKETS: &[f64] = &[
    0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
    0.1, 0.25, 0.5, 1.0,
];

/// One server's metrics: a Prometheus recorder of its own, never the process's global one, so
/// that two servers in one process (an embedding application's, a test binary's) each count
/// only what they did. Cheap to clone.
#[derive(Debug, Clone)]
pub(crate) struct Metrics(Arc<Recorded>);

#[derive(Debug)]
struct Recorded {
    recorder: PrometheusRecorder,
    handle: PrometheusHandle,
    /// `sluice_decisions_total` by policy name (its address), operation and outcome.
    decisions: Handles<(usize, Literal, Outcome), Name, Counter>,
    /// `sluice_rls_hits_total` by domain and statistics key (their addresses) and result.
    rls_hits: Handles<(usize, usize, Literal), (Name, Name), Counter>,
    /// `sluice_decision_latency_seconds` by operation.
    latency: Handles<Literal, (), Histogram>,
}

impl Metrics {
    /// A recorder with every metric described and nothing recorded yet.
    pub(crate) fn new() -> Self {
        let builder = match PrometheusBuilder::new().set_buckets(LATENCY_BUCKETS) {
            Ok(b) => b,
            Err(e) => {
                tracing::warn!(error = %e, "metrics buckets refused; using summaries");
                PrometheusBuilder::new()
            }
        };
        let recorder = builder.build_recorder();
        let metrics = Self(Arc::new(Recorded {
            handle: recorder.handle(),
            recorder,
            decisions: Handles::default(),
            rls_hits: Handles::default(),
            latency: Handles::default(),
        }));
        metrics.with(descriptions::describe);
        metrics
    }

    /// Runs `record` with this server's recorder as the one the `metrics` macros use.
    pub(crate) fn with<T>(&self, record: impl FnOnce() -> T) -> T {
        metrics::with_local_recorder(&self.0.recorder, record)
    }

    /// The text exposition of every metric recorded.
    pub(crate) fn render(&self) -> String {
        self.0.handle.run_upkeep();
        self.0.handle.render()
    }

    /// Counts one decision.
    pub(crate) fn decision(&self, policy: &Name, op: &'static str, outcome: Outcome) {
        let register = || {
            // An `Arc<str>` label is a reference count, not an allocation per request.
            metrics::counter!("sluice_decisions_total", "policy" => policy.clone(), "op" => op, "outcome" => outcome.as_str())
        };
        let key = (address(policy), literal(op), outcome);
        let hold = || policy.clone();
        self.cached(&self.0.decisions, key, hold, register, |c| c.increment(1));
    }

    /// Counts one Envoy descriptor's hits under its rule's statistics key (the reference's
    /// per-rule `total_hits` split by result: `within_limit`, `over_limit`, `shadow_mode`).
    pub(crate) fn rls_hits(&self, domain: &Name, key: &Name, result: &'static str, hits: u64) {
        let register = || metrics::counter!("sluice_rls_hits_total", "domain" => domain.clone(), "key" => key.clone(), "result" => result);
        let names = (address(domain), address(key), literal(result));
        let hold = || (domain.clone(), key.clone());
        self.cached(&self.0.rls_hits, names, hold, register, |c| {
            c.increment(hits);
        });
    }

    /// Counts an admitted decision that left one of its limits at least the near-limit ratio
    /// used ([`settings::NearLimit::reached`]).
    pub(crate) fn near_limit(&self, policy: &Name) {
        self.with(
            || metrics::counter!("sluice_decisions_near_limit_total", "policy" => policy.clone()),
        )
        .increment(1);
    }

    /// Records how long a decision took (store call and failure mode included).
    pub(crate) fn decision_latency(&self, op: &'static str, took: Duration) {
        let register = || metrics::histogram!("sluice_decision_latency_seconds", "op" => op);
        let record = |h: &Histogram| h.record(took.as_secs_f64());
        self.cached(&self.0.latency, literal(op), || (), register, record);
    }

    /// The series of the store named `name` (a Redis shard, a Cluster, a region's own Redis).
    pub(crate) fn store(&self, name: &str) -> StoreSeries {
        let name = SharedString::from(name.to_owned());
        let latency = self
            .with(|| metrics::histogram!("sluice_store_latency_seconds", "store" => name.clone()));
        StoreSeries {
            metrics: self.clone(),
            name,
            latency,
        }
    }

    /// The series of the listener named `listener` (`http`, `grpc`, `admin`).
    pub(crate) fn listener(&self, listener: &'static str) -> ListenerSeries {
        ListenerSeries {
            open: self.with(|| metrics::gauge!("sluice_connections_open", "listener" => listener)),
            metrics: self.clone(),
            listener,
        }
    }

    /// Publishes the reservation layer's counters (called before rendering).
    pub(crate) fn reservation(&self, stats: sluice::ReserveStats) {
        for (what, n) in [
            ("local", stats.local),
            ("cached_denial", stats.cached_denials),
            ("waited", stats.waited),
            ("direct", stats.direct),
            ("fetch", stats.fetches),
            ("refund", stats.refunds),
        ] {
            self.with(|| metrics::counter!("sluice_reserve_total", "what" => what))
                .absolute(n);
        }
    }

    /// Publishes each shard's circuit breaker (called before rendering).
    pub(crate) fn circuits(&self, sharded: &sluice_redis::ShardedStore) {
        for shard in sharded.shards() {
            let name = shard.name().to_owned();
            self.with(|| {
                metrics::gauge!("sluice_store_circuit_state", "store" => name.clone())
                    .set(shard.state().as_gauge());
                metrics::counter!("sluice_store_circuit_opened_total", "store" => name)
                    .absolute(shard.opened_total());
            });
        }
    }

    /// Publishes a Redis store's writes that fewer replicas acknowledged than
    /// `store.wait_for_replicas` asks (called before rendering; none until the first).
    pub(crate) fn unreplicated(&self, store: &sluice_redis::RedisStore) {
        let n = store.unreplicated_total();
        if n > 0 {
            let name = store.name().to_owned();
            self.with(|| metrics::counter!("sluice_store_unreplicated_total", "store" => name))
                .absolute(n);
        }
    }

    /// Counts a configuration change, applied (`ok`) or refused.
    pub(crate) fn reload(&self, ok: bool) {
        let result = if ok { "ok" } else { "error" };
        self.with(|| metrics::counter!("sluice_config_reloads_total", "result" => result))
            .increment(1);
    }

    /// Counts one RLQS action sent, by kind (`sluice_rlqs_actions_total{action}`).
    pub(crate) fn rlqs_action(&self, action: &'static str) {
        self.with(|| metrics::counter!("sluice_rlqs_actions_total", "action" => action))
            .increment(1);
    }

    /// Counts a report's requests under its RLQS rule (`sluice_rlqs_requests_total{rule,
    /// result}`): `charged` to the store, `lost` (admitted by Envoy after the store was full),
    /// `denied` by Envoy.
    pub(crate) fn rlqs_requests(&self, rule: &str, charged: u64, lost: u64, denied: u64) {
        for (result, n) in [("charged", charged), ("lost", lost), ("denied", denied)] {
            if n > 0 {
                let rule = rule.to_owned();
                self.with(|| metrics::counter!("sluice_rlqs_requests_total", "rule" => rule, "result" => result))
                    .increment(n);
            }
        }
    }

    /// Whether the stream to the `rls.xds` control plane is open (`sluice_xds_connected`).
    pub(crate) fn xds_connected(&self, open: bool) {
        self.with(|| metrics::gauge!("sluice_xds_connected"))
            .set(if open { 1.0 } else { 0.0 });
    }

    /// Counts a response of the `rls.xds` control plane, acknowledged or refused.
    pub(crate) fn xds_update(&self, ack: bool) {
        let result = if ack { "ack" } else { "nack" };
        self.with(|| metrics::counter!("sluice_xds_updates_total", "result" => result))
            .increment(1);
    }

    /// Applies `apply` to the handle `key` names in `cache`, registered (`register`) the
    /// first time beside what `hold` returns: the `Arc`s whose addresses are in `key`, kept
    /// alive so that no other name can take their address.
    fn cached<K: Hash + Eq, H, M>(
        &self,
        cache: &Handles<K, H, M>,
        key: K,
        hold: impl FnOnce() -> H,
        register: impl FnOnce() -> M,
        apply: impl FnOnce(&M),
    ) {
        if let Some((_, handle)) = cache.read().unwrap_or_else(|p| p.into_inner()).get(&key) {
            return apply(handle);
        }
        let handle = self.with(register);
        apply(&handle);
        let mut handles = cache.write().unwrap_or_else(|p| p.into_inner());
        if handles.len() >= MAX_CACHED {
            handles.clear();
        }
        handles.entry(key).or_insert_with(|| (hold(), handle));
    }
}

/// The series of one store, registered once: each call's latency, and its errors by kind.
#[derive(Debug, Clone)]
pub(crate) struct StoreSeries {
    metrics: Metrics,
    name: SharedString,
    latency: Histogram,
}

impl StoreSeries {
    /// The store's name.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// Records one call: how long it took and, when it failed, its error's kind.
    pub(crate) fn record(&self, took: Duration, error: Option<&sluice::StoreError>) {
        self.latency.record(took.as_secs_f64());
        if let Some(e) = error {
            let name = self.name.clone();
            self.metrics
                .with(|| metrics::counter!("sluice_store_errors_total", "store" => name, "kind" => e.kind().as_str()))
                .increment(1);
        }
    }
}

/// The series of one listener: its open connections' gauge, registered once, and the
/// counters of the rarer events, registered when they happen.
#[derive(Debug)]
pub(crate) struct ListenerSeries {
    metrics: Metrics,
    listener: &'static str,
    open: metrics::Gauge,
}

impl crate::conn::ListenerEvents for ListenerSeries {
    fn opened(&self, delta: f64) {
        self.open.increment(delta);
    }

    fn limited(&self) {
        let listener = self.listener;
        self.metrics
            .with(|| metrics::counter!("sluice_connections_limited_total", "listener" => listener))
            .increment(1);
    }

    fn timed_out(&self, timeout: &'static str) {
        let listener = self.listener;
        self.metrics
            .with(|| metrics::counter!("sluice_connection_timeouts_total", "listener" => listener, "timeout" => timeout))
            .increment(1);
    }
}

// ----- handles kept per server --------------------------------------------------------------
//
// Registering a handle (what `metrics::counter!` does on each call) builds the metric's key,
// hashes it and looks it up in the recorder's registry. A decision instead finds its handle
// by the addresses of its names in a map of its server and only increments it.

/// The most handles of one kind a server keeps; past it the map starts again (a reload makes
/// new `Arc`s of the policy names, so each reload can add a policy's handles again).
const MAX_CACHED: usize = 4096;

/// A literal's address and length.
type Literal = (usize, usize);

type Name = Arc<str>;

/// Handles by key, each beside the names its key holds the addresses of.
type Handles<K, H, M> = RwLock<HashMap<K, (H, M)>>;

/// A name's address: the same for clones of one `Arc`, never for two that are alive.
fn address(name: &Name) -> usize {
    Arc::as_ptr(name).cast::<u8>() as usize
}

/// A literal's address and length.
fn literal(s: &'static str) -> Literal {
    (s.as_ptr() as usize, s.len())
}

#[cfg(test)]
mod tests {
    use crate::observe::stats::Outcome;
    use std::sync::Arc;

    /// The series' value in the exposition, 0 when absent.
    fn value(text: &str, series: &str) -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
            .unwrap_or(0.0)
    }

    /// Handles kept per server count into its series: from several threads, for a policy
    /// name whose `Arc` a reload replaced, and once the map has started again; another
    /// server's metrics show none of it.
    #[test]
    fn handles_kept_per_server_count_into_its_series() {
        let m = super::Metrics::new();
        let series =
            r#"sluice_decisions_total{policy="handles-test",op="check",outcome="allowed"}"#;
        let hits = r#"sluice_rls_hits_total{domain="handles-test",key="k",result="over_limit"}"#;
        let first: Arc<str> = Arc::from("handles-test");
        let key: Arc<str> = Arc::from("k");
        for _ in 0..3 {
            m.decision(&first, "check", Outcome::Allowed);
            m.rls_hits(&first, &key, "over_limit", 2);
        }
        let (other, on_thread) = (first.clone(), m.clone());
        std::thread::spawn(move || {
            for _ in 0..4 {
                on_thread.decision(&other, "check", Outcome::Allowed);
            }
        })
        .join()
        .unwrap();
        // A reload: the same name in a new `Arc`, the old one gone.
        drop(first);
        let reloaded: Arc<str> = Arc::from("handles-test");
        m.decision(&reloaded, "check", Outcome::Allowed);
        m.decision(&reloaded, "check", Outcome::Denied);
        // The map keeps each name it holds a handle for alive, so that no other name can be
        // allocated where it is while the handle is kept.
        let held: Arc<str> = Arc::from("handles-held");
        // One literal for both threads: a handle is found by the literal's address, and the
        // compiler need not give two copies of a literal one address.
        let (check, over_limit) = ("check", "over_limit");
        let (registering, on_thread) = (held.clone(), m.clone());
        std::thread::spawn(move || {
            on_thread.decision(&registering, check, Outcome::Denied);
            on_thread.rls_hits(&registering, &registering, over_limit, 1);
        })
        .join()
        .unwrap();
        // Registered by a thread now gone: found, not held again; new series hold the name.
        let before = Arc::strong_count(&held);
        m.decision(&held, check, Outcome::Denied);
        m.rls_hits(&held, &held, over_limit, 1);
        assert_eq!(Arc::strong_count(&held), before, "found, not held twice");
        // A new series: the registry's key and the map each hold its names.
        m.decision(&held, "peek", Outcome::Denied);
        assert_eq!(
            Arc::strong_count(&held),
            before + 2,
            "decisions hold the name"
        );
        m.rls_hits(&held, &held, "within_limit", 1);
        assert_eq!(
            Arc::strong_count(&held),
            before + 6,
            "RLS hits hold both names"
        );
        // Another name where a dropped one was (the allocator is free to reuse its address).
        for name in ["handles-x1", "handles-x2", "handles-x3"] {
            m.decision(&Arc::from(name), "check", Outcome::Denied);
        }
        // A full map starts again.
        for i in 0..super::MAX_CACHED {
            m.decision(
                &Arc::from(format!("handles-test-{i}")),
                "peek",
                Outcome::Allowed,
            );
        }
        m.decision(&reloaded, "check", Outcome::Allowed);
        let text = m.render();
        assert_eq!(value(&text, series), 9.0, "{series}");
        assert_eq!(value(&text, hits), 6.0, "{hits}");
        let denied = series.replace("allowed", "denied");
        assert_eq!(value(&text, &denied), 1.0, "{denied}");
        for name in ["handles-x1", "handles-x2", "handles-x3"] {
            let series = denied.replace("handles-test", name);
            assert_eq!(value(&text, &series), 1.0, "{series}");
        }
        let other = super::Metrics::new().render();
        assert_eq!(value(&other, series), 0.0, "{other}");
    }
}
