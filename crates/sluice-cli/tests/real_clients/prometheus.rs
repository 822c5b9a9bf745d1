//! A real Prometheus (Debian's) scrapes a running `sluice serve` (HTTP checks, an Envoy in
//! front calling `ShouldRateLimit`, a Redis that stalls, a reload), and every query of the
//! Grafana dashboard (deploy/grafana/sluice.json) is evaluated by it, with the Policy variable
//! at All, at a policy and at an Envoy domain: each must return data, or the test names the
//! panel.

use std::path::PathBuf;
use std::time::Duration;

use crate::support::{self, Client, Proc, Sluice};

/// A Prometheus scraping `targets` every second, its storage in a temporary directory.
struct Prometheus {
    _proc: Proc,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Prometheus {
    fn start(bin: &PathBuf, targets: &[u16]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let port = support::port();
        let targets: Vec<String> = targets.iter().map(|p| format!("'127.0.0.1:{p}'")).collect();
        let config = dir.path().join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global: {{ scrape_interval: 1s, evaluation_interval: 1s }}\n\
                 scrape_configs:\n  - job_name: sluice\n    static_configs:\n      - targets: [{}]\n",
                targets.join(", ")
            ),
        )
        .unwrap();
        let mut cmd = std::process::Command::new(bin);
        cmd.arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"));
        let proc = Proc::spawn(cmd, dir.path().join("prometheus.log"));
        let log = proc.log.clone();
        support::wait_for(
            Duration::from_secs(30),
            "prometheus is ready",
            || support::get(port, "/-/ready").0 == 200,
            || std::fs::read_to_string(&log).unwrap_or_default(),
        );
        Self {
            _proc: proc,
            port,
            _dir: dir,
        }
    }

    /// Polls (at most 30 s) until `promql` has something to draw.
    fn until_drawn(&self, what: &str, promql: &str) {
        let drawn = || drawn(&self.query(promql));
        support::wait_for(Duration::from_secs(30), what, drawn, String::new);
    }

    /// An instant query's result vector (`[]` when it has no series).
    fn query(&self, promql: &str) -> Vec<serde_json::Value> {
        let encoded: String = promql
            .bytes()
            .map(|b| match b {
                b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                    (b as char).to_string()
                }
                _ => format!("%{b:02X}"),
            })
            .collect();
        let (status, body) = support::get(self.port, &format!("/api/v1/query?query={encoded}"));
        assert_eq!(status, 200, "{promql}: {body}");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        v["data"]["result"].as_array().cloned().unwrap_or_default()
    }
}

/// Every (panel title, expression) of the dashboard.
fn panels() -> Vec<(String, String)> {
    let d: serde_json::Value =
        serde_json::from_str(&support::read("deploy/grafana/sluice.json")).unwrap();
    d["panels"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| {
            let title = p["title"].as_str().unwrap_or_default().to_owned();
            p["targets"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .into_iter()
                .filter_map(move |t| Some((title.clone(), t["expr"].as_str()?.to_owned())))
        })
        .collect()
}

/// Whether a result holds at least one number a panel would draw.
fn drawn(result: &[serde_json::Value]) -> bool {
    result.iter().any(|s| {
        s["value"][1]
            .as_str()
            .and_then(|v| v.parse::<f64>().ok())
            .is_some_and(f64::is_finite)
    })
}

#[test]
fn every_grafana_panel_returns_data_from_a_real_prometheus() {
    let Some(envoy_bin) = support::envoy_bin() else {
        return;
    };
    let Some(prometheus_bin) = support::tool("prometheus", &[]) else {
        return;
    };
    if !sluice_testkit::require_redis() {
        return;
    }
    let redis = sluice_testkit::RedisServer::start().unwrap();
    // Envoy's rule: 5 an hour per address, so that its requests run near the limit (from the
    // 4th) whichever second the test starts.
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("ratelimit-config")).unwrap();
    std::fs::write(
        dir.path().join("ratelimit-config/edge.yaml"),
        "domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit: { unit: hour, requests_per_unit: 5 }\n",
    )
    .unwrap();
    let config = support::read("examples/envoy/sluice.yaml").replacen(
        "policies:\n",
        "policies:\n  api:\n    limits:\n      - { max: 50, per: 1h }\n",
        1,
    ) + &format!(
        "store: {{ backend: redis, shards: [{{ primary: '{}' }}], timeout: 100ms }}\n",
        redis.url()
    );
    let sluice = Sluice::start_in(dir.path(), &config);
    let (_envoy, listener) = support::example_rls_envoy(&envoy_bin, sluice.grpc, false);
    let prometheus = Prometheus::start(&prometheus_bin, &[sluice.http]);
    // Prometheus has scraped Sluice before the traffic starts: a counter's first increase is
    // seen only against an earlier sample.
    prometheus.until_drawn("prometheus scraped sluice", "up{job=\"sluice\"} == 1");

    // One round a second for 14 s, so that Prometheus sees every counter rise (a series born
    // between two scrapes shows no increase): an HTTP check of a new key that leaves it 90 %
    // used (allowed, near its limit), the same check again (denied), and a request through
    // Envoy (allowed, near the limit from the 4th, then 429). Rounds
    // 3 and 4 meet a stalled store: timeouts, answered degraded (api fails open) or failing
    // (Envoy's rules fail closed), and the circuit opens. Then a reload.
    let mut http = Client::new(sluice.http);
    let mut edge = Client::new(listener);
    let mut round = 0;
    support::paced(&mut http, 1.0, 14.0, |_, http| {
        round += 1;
        match round {
            3 => redis.pause().unwrap(),
            5 => {
                redis.resume().unwrap();
                sluice.reload();
            }
            _ => {}
        }
        let check = format!(r#"{{"policy": "api", "key": "k{round}", "cost": 45}}"#);
        http.post("/v1/check", &check);
        http.post("/v1/check", &check);
        edge.get("/", &[]).status
    });
    prometheus.until_drawn(
        "prometheus scraped the reload",
        "sluice_config_reloads_total",
    );

    let mut empty = Vec::new();
    for policy in [".*", "api", "edge"] {
        for (title, expr) in panels() {
            let q = expr
                .replace("$policy", policy)
                // What Grafana uses over an hour's view with a 1 s scrape; it reaches back over
                // all the test's traffic.
                .replace("$__rate_interval", "1m")
                .replace("$__range", "1m");
            let result = prometheus.query(&q);
            if !drawn(&result) {
                empty.push(format!("{title} (policy {policy}): {q} = {result:?}"));
            }
        }
    }
    assert!(
        empty.is_empty(),
        "panels with no data:\n{}",
        empty.join("\n")
    );
}
