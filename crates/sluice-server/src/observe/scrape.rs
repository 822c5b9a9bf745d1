//! The metric families computed when `/metrics` is read rather than recorded as they happen
//! (the "collector" of Prometheus' client libraries): the configured limits, read from the
//! generation in force, and the process' own figures, read from `/proc`.
//!
//! A limit gauge is computed from the configuration in force at each scrape, so a policy or
//! rule that a reload removed has no series any more. Recorded through the `metrics` crate it
//! could not be removed: `metrics-exporter-prometheus` 0.18 forgets a series only after an
//! idle timeout set per kind of metric (`PrometheusBuilder::idle_timeout`), which would also
//! forget the gauges that change rarely (`sluice_connections_open`).
//!
//! The lines are written with the exporter's own formatting functions; the `# HELP` texts are
//! the ones of [`super::metrics`]' table.

use metrics_exporter_prometheus::LabelSet;
use metrics_exporter_prometheus::formatting::{
    write_help_line, write_metric_line, write_type_line,
};
use sluice::Policy;

use sluice_envoy_rules::RlsConfig;

/// A sample's labels, names and values.
type Labels = Vec<(&'static str, String)>;

/// Writes a family: its `# HELP` and `# TYPE` lines, then one line per sample; nothing if it
/// has no samples.
fn family<V: std::fmt::Display>(
    text: &mut String,
    name: &str,
    kind: &str,
    samples: impl IntoIterator<Item = (Labels, V)>,
) {
    let mut samples = samples.into_iter().peekable();
    if samples.peek().is_none() {
        return;
    }
    write_help_line(text, name, None, None, super::metrics::help(name));
    write_type_line(text, name, None, None, kind);
    for (labels, value) in samples {
        let labels = labels
            .into_iter()
            .map(|(k, v)| metrics::Label::new(k, v))
            .collect::<Vec<_>>();
        let key = metrics::Key::from_parts(name.to_owned(), labels);
        let labels = LabelSet::from_key_and_global(&key, &Default::default());
        write_metric_line(
            text,
            name,
            None,
            &labels,
            None::<(&'static str, u8)>,
            value,
            None,
        );
    }
}

/// `sluice_limit_max`: the `max` of each limit of each policy in force, labelled with the
/// policy, the limit's place in it (`limit`, from 0), its window (`per`, as the configuration
/// writes it; a concurrency limit's is its lease time) and its algorithm.
pub(crate) fn limits<'a>(text: &mut String, policies: impl Iterator<Item = &'a Policy>) {
    let mut policies: Vec<&Policy> = policies.collect();
    policies.sort_by(|a, b| a.name().cmp(b.name()));
    let samples = policies.into_iter().flat_map(|policy| {
        policy.limits().iter().enumerate().map(|(i, limit)| {
            let labels = vec![
                ("policy", policy.name().to_owned()),
                ("limit", i.to_string()),
                ("per", sluice::core::duration_text(limit.per_ms())),
                ("algorithm", limit.algorithm().as_str().to_owned()),
            ];
            (labels, limit.max())
        })
    });
    family(text, "sluice_limit_max", "gauge", samples);
}

/// `sluice_rule_limit`: the `requests_per_unit` of each Envoy rule in force, labelled with
/// its domain, its key path (the rule's statistics key, [`sluice_envoy_rules::Rule::full_key`]) and
/// its unit. Unlimited rules have no series: they have no number to graph.
pub(crate) fn rules(text: &mut String, rls: &RlsConfig) {
    let samples = rls
        .rules()
        .into_iter()
        .filter(|r| !r.unlimited)
        .filter_map(|rule| {
            let labels = vec![
                ("domain", rule.domain.to_string()),
                ("rule", rule.full_key.clone()),
                ("unit", rule.unit?.as_str().to_owned()),
            ];
            Some((labels, rule.requests_per_unit))
        });
    family(text, "sluice_rule_limit", "gauge", samples);
}

/// The regions store's view of the other regions (docs/regions.md), read from the store at
/// each scrape: `sluice_region_lag_seconds`, `sluice_region_view_age_seconds` (absent for a
/// region not read yet), `sluice_region_reachable`, and `sluice_region_fallbacks_total` per
/// policy and fallback mode. Computed per server from its own store, so several servers in one
/// process (tests) never mix their regions.
pub(crate) fn regions(text: &mut String, store: &sluice_redis::RegionsStore) {
    let regions = store.regions();
    let region = |r: &sluice_redis::RegionStatus| vec![("region", r.name.clone())];
    let lag = regions
        .iter()
        .filter_map(|r| Some((region(r), r.lag?.as_secs_f64())));
    family(text, "sluice_region_lag_seconds", "gauge", lag);
    let age = regions
        .iter()
        .filter_map(|r| Some((region(r), r.view_age?.as_secs_f64())));
    family(text, "sluice_region_view_age_seconds", "gauge", age);
    let up = regions.iter().map(|r| (region(r), u8::from(r.reachable)));
    family(text, "sluice_region_reachable", "gauge", up);
    let fallbacks = store
        .fallback_counts()
        .into_iter()
        .map(|(policy, mode, n)| {
            (
                vec![("policy", policy), ("mode", mode.as_str().to_owned())],
                n,
            )
        });
    family(text, "sluice_region_fallbacks_total", "counter", fallbacks);
}

/// The process metrics under the names every Prometheus client library uses
/// (`process_cpu_seconds_total`, `process_resident_memory_bytes`, `process_open_fds`,
/// `process_max_fds`, `process_start_time_seconds`, `process_threads`), read from `/proc`.
/// Elsewhere than on Linux they are absent; so is one whose file cannot be read.
pub(crate) fn process(text: &mut String) {
    #[cfg(target_os = "linux")]
    for (name, kind, value) in linux::read() {
        family(text, name, kind, [(Labels::new(), value)]);
    }
    #[cfg(not(target_os = "linux"))]
    let _ = text;
}

#[cfg(target_os = "linux")]
mod linux {
    /// Each process metric that could be read: name, type, value.
    pub(super) fn read() -> Vec<(&'static str, &'static str, f64)> {
        let mut out = Vec::with_capacity(6);
        let ticks = rustix::param::clock_ticks_per_second() as f64;
        if let Some(stat) = std::fs::read_to_string("/proc/self/stat")
            .ok()
            .and_then(|s| Stat::parse(&s))
        {
            let cpu = (stat.utime + stat.stime) as f64 / ticks;
            out.push(("process_cpu_seconds_total", "counter", cpu));
            if let Some(boot) = boot_time() {
                let start = boot as f64 + stat.starttime as f64 / ticks;
                out.push(("process_start_time_seconds", "gauge", start));
            }
            out.push(("process_threads", "gauge", stat.threads as f64));
            let page = rustix::param::page_size() as f64;
            out.push((
                "process_resident_memory_bytes",
                "gauge",
                stat.rss as f64 * page,
            ));
        }
        if let Ok(fds) = std::fs::read_dir("/proc/self/fd") {
            // The directory's own descriptor, open while it is read, is not counted.
            let open = fds.count().saturating_sub(1);
            out.push(("process_open_fds", "gauge", open as f64));
        }
        let max = rustix::process::getrlimit(rustix::process::Resource::Nofile).current;
        if let Some(max) = max {
            out.push(("process_max_fds", "gauge", max as f64));
        }
        out
    }

    /// The fields of `/proc/self/stat` (proc(5)) the metrics use.
    #[derive(Debug, PartialEq)]
    pub(super) struct Stat {
        /// User and system CPU time, in clock ticks.
        pub(super) utime: u64,
        pub(super) stime: u64,
        pub(super) threads: u64,
        /// When the process started, in clock ticks after boot.
        pub(super) starttime: u64,
        /// Resident pages.
        pub(super) rss: u64,
    }

    impl Stat {
        /// Reads the line; the command name (field 2) may hold spaces and parentheses, so the
        /// fields are counted from its closing parenthesis, the line's last.
        pub(super) fn parse(line: &str) -> Option<Stat> {
            let after = &line[line.rfind(')')? + 1..];
            // Field 3 (state) is the first one after the name.
            let fields: Vec<&str> = after.split_whitespace().collect();
            let field = |n: usize| fields.get(n - 3)?.parse::<u64>().ok();
            Some(Stat {
                utime: field(14)?,
                stime: field(15)?,
                threads: field(20)?,
                starttime: field(22)?,
                rss: field(24)?,
            })
        }
    }

    /// The boot time in Unix seconds (`btime` of `/proc/stat`).
    fn boot_time() -> Option<u64> {
        let stat = std::fs::read_to_string("/proc/stat").ok()?;
        stat.lines()
            .find_map(|l| l.strip_prefix("btime "))
            .and_then(|v| v.trim().parse().ok())
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::linux::Stat;

    #[test]
    fn stat_fields_are_counted_from_the_last_parenthesis() {
        let line = "4242 (a) b (c)) S 1 4242 4242 0 -1 4194560 1234 0 0 0 150 25 0 0 20 0 7 0 \
                    98765 123456789 2048 18446744073709551615 1 1 0 0 0 0 0 4096 0 0 0 0 17 1 0 0";
        assert_eq!(
            Stat::parse(line),
            Some(Stat {
                utime: 150,
                stime: 25,
                threads: 7,
                starttime: 98765,
                rss: 2048,
            })
        );
        assert_eq!(Stat::parse("4242 (no fields) S 1"), None);
        assert_eq!(Stat::parse("no parenthesis"), None);
    }
}
