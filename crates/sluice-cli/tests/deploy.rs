//! What an operator deploys beside the binary, checked against the real `sluice`:
//!
//! - the Grafana dashboard `deploy/grafana/sluice.json`: every metric that a panel's query or
//!   a template variable reads is in the `/metrics` of a real `sluice serve` on a real Redis
//!   after traffic of every kind (HTTP checks allowed and denied, peeks, refunds, Envoy's
//!   `ShouldRateLimit` sent by `sluice bench --target grpc`, a reload, a Redis that stops
//!   answering). The queries are read from the file, panel by panel, so a new panel is checked
//!   as soon as it is added; the metric names are found by a small PromQL tokenizer
//!   ([`promql::metric_names`], unit-tested below);
//! - shell completions: `sluice completions bash|zsh|fish` print scripts the shells accept
//!   and that offer the subcommands. zsh and fish are needed under `SLUICE_REQUIRE_TOOLS=1`
//!   (set by `scripts/test`, which installs them); without it a missing shell is one printed
//!   `SKIPPED` line.
//!
//! The Kubernetes manifests and the image are checked by `scripts/kube-test` and
//! `scripts/image-test`.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
mod support;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use support::{Serve, run as sluice, text};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Reading the metric names out of PromQL, as far as the dashboard needs: selectors, range
/// and subquery brackets, functions, aggregations with `by`/`without`, binary operators with
/// `on`/`ignoring`/`group_left`/`group_right`, `offset`, numbers, durations, strings and
/// Grafana's `$variables`. An identifier that is none of these is a metric name; so is the
/// value of a `__name__="…"` matcher.
mod promql {
    use std::collections::BTreeSet;

    const AGGREGATIONS: &[&str] = &[
        "sum",
        "min",
        "max",
        "avg",
        "group",
        "stddev",
        "stdvar",
        "count",
        "count_values",
        "bottomk",
        "topk",
        "quantile",
        "limitk",
        "limit_ratio",
    ];
    /// Keywords followed by a parenthesised list of label names (optional for `group_*`).
    const LABEL_LISTS: &[&str] = &[
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
    ];
    const KEYWORDS: &[&str] = &[
        "and", "or", "unless", "atan2", "offset", "bool", "inf", "nan",
    ];

    fn ident_start(c: char) -> bool {
        c.is_ascii_alphabetic() || c == '_' || c == ':'
    }

    fn ident_char(c: char) -> bool {
        c.is_ascii_alphanumeric() || c == '_' || c == ':'
    }

    struct Lexer {
        chars: Vec<char>,
        at: usize,
    }

    impl Lexer {
        fn peek(&self) -> Option<char> {
            self.chars.get(self.at).copied()
        }

        fn skip_space(&mut self) {
            while self.peek().is_some_and(char::is_whitespace) {
                self.at += 1;
            }
        }

        /// The next character that is not white space, without consuming it.
        fn next_significant(&mut self) -> Option<char> {
            self.skip_space();
            self.peek()
        }

        fn ident(&mut self) -> String {
            let start = self.at;
            while self.peek().is_some_and(ident_char) {
                self.at += 1;
            }
            self.chars[start..self.at].iter().collect()
        }

        /// A quoted string (the opening quote is next); its value.
        fn string(&mut self) -> Result<String, String> {
            let quote = self.chars[self.at];
            let start = self.at;
            self.at += 1;
            let mut value = String::new();
            while let Some(c) = self.peek() {
                self.at += 1;
                match c {
                    '\\' if quote != '`' => {
                        if let Some(escaped) = self.peek() {
                            value.push(escaped);
                            self.at += 1;
                        }
                    }
                    c if c == quote => return Ok(value),
                    c => value.push(c),
                }
            }
            Err(format!("a string opened at {start} is never closed"))
        }

        /// Skips to the `close` that ends the group opened just before (strings and nested
        /// groups of the same kind included).
        fn skip_group(&mut self, open: char, close: char) -> Result<(), String> {
            let start = self.at;
            let mut depth = 1;
            while let Some(c) = self.peek() {
                match c {
                    '"' | '\'' | '`' => {
                        self.string()?;
                        continue;
                    }
                    c if c == open => depth += 1,
                    c if c == close => {
                        depth -= 1;
                        if depth == 0 {
                            self.at += 1;
                            return Ok(());
                        }
                    }
                    _ => {}
                }
                self.at += 1;
            }
            Err(format!("`{open}` before {start} is never closed"))
        }

        /// The label matchers of a selector (the `{` is consumed): the value of a
        /// `__name__="…"` matcher, if any.
        fn matchers(&mut self) -> Result<Option<String>, String> {
            let mut name = None;
            loop {
                match self.next_significant() {
                    None => return Err("a `{` is never closed".into()),
                    Some('}') => {
                        self.at += 1;
                        return Ok(name);
                    }
                    Some(',') => self.at += 1,
                    Some(c) if ident_start(c) => {
                        let label = self.ident();
                        self.skip_space();
                        let op_start = self.at;
                        while self.peek().is_some_and(|c| matches!(c, '=' | '!' | '~')) {
                            self.at += 1;
                        }
                        let op: String = self.chars[op_start..self.at].iter().collect();
                        if self
                            .next_significant()
                            .is_none_or(|c| !matches!(c, '"' | '\'' | '`'))
                        {
                            return Err(format!("the matcher of `{label}` has no quoted value"));
                        }
                        let value = self.string()?;
                        if label == "__name__" && op == "=" {
                            name = Some(value);
                        }
                    }
                    // A selector of a quoted metric name alone: {"metric"}.
                    Some('"' | '\'' | '`') => name = Some(self.string()?),
                    Some(c) => return Err(format!("`{c}` inside a selector")),
                }
            }
        }
    }

    /// The metric names `expr` reads.
    pub(super) fn metric_names(expr: &str) -> Result<BTreeSet<String>, String> {
        let mut lx = Lexer {
            chars: expr.chars().collect(),
            at: 0,
        };
        let mut names = BTreeSet::new();
        while let Some(c) = lx.next_significant() {
            match c {
                '"' | '\'' | '`' => {
                    lx.string()?;
                }
                '#' => {
                    while lx.peek().is_some_and(|c| c != '\n') {
                        lx.at += 1;
                    }
                }
                '{' => {
                    lx.at += 1;
                    names.extend(lx.matchers()?);
                }
                '[' => {
                    lx.at += 1;
                    lx.skip_group('[', ']')?;
                }
                // Grafana's variables: $name, ${name}, $__rate_interval.
                '$' => {
                    lx.at += 1;
                    if lx.peek() == Some('{') {
                        lx.at += 1;
                        lx.skip_group('{', '}')?;
                    } else {
                        lx.ident();
                    }
                }
                // Numbers and durations: 0.99, 1e9, 0x1f, 5m, 1h30m.
                c if c.is_ascii_digit()
                    || (c == '.' && lx.chars.get(lx.at + 1).is_some_and(char::is_ascii_digit)) =>
                {
                    while lx
                        .peek()
                        .is_some_and(|c| c.is_ascii_alphanumeric() || c == '.' || c == '_')
                    {
                        lx.at += 1;
                    }
                }
                c if ident_start(c) => {
                    let word = lx.ident();
                    let lower = word.to_ascii_lowercase();
                    let next = lx.next_significant();
                    if LABEL_LISTS.contains(&lower.as_str()) {
                        if next == Some('(') {
                            lx.at += 1;
                            lx.skip_group('(', ')')?;
                        }
                    } else if KEYWORDS.contains(&lower.as_str()) || next == Some('(') {
                        // An operator, or a function or aggregation applied to what follows.
                    } else if AGGREGATIONS.contains(&lower.as_str()) {
                        // `sum by (le) (…)`: the modifier comes before the parenthesis.
                        let save = lx.at;
                        let modifier = lx.ident().to_ascii_lowercase();
                        lx.at = save;
                        if modifier != "by" && modifier != "without" {
                            names.insert(word);
                        }
                    } else {
                        names.insert(word);
                    }
                }
                _ => lx.at += 1,
            }
        }
        Ok(names)
    }

    /// A template variable's query: `label_values(SELECTOR, label)`, `metrics(regex)`,
    /// `query_result(EXPR)`, or a bare expression; the metric names it reads.
    pub(super) fn variable_metric_names(query: &str) -> Result<BTreeSet<String>, String> {
        let q = query.trim();
        if let Some(inner) = q
            .strip_prefix("label_values(")
            .and_then(|r| r.strip_suffix(')'))
        {
            // label_values(label) reads every metric; label_values(selector, label) one.
            return match inner.rsplit_once(',') {
                Some((selector, _label)) => metric_names(selector),
                None => Ok(BTreeSet::new()),
            };
        }
        if let Some(inner) = q
            .strip_prefix("query_result(")
            .and_then(|r| r.strip_suffix(')'))
        {
            return metric_names(inner);
        }
        metric_names(q)
    }
}

fn set(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|s| (*s).to_owned()).collect()
}

#[test]
fn promql_metric_names_are_found_and_nothing_else() {
    let cases: &[(&str, &[&str])] = &[
        (
            r#"sum by (outcome) (rate(sluice_decisions_total{policy=~"$policy"}[$__rate_interval]))"#,
            &["sluice_decisions_total"],
        ),
        (
            "histogram_quantile(0.99, sum by (le, op) (rate(sluice_decision_latency_seconds_bucket[5m])))",
            &["sluice_decision_latency_seconds_bucket"],
        ),
        (
            r#"100 * sum(rate(a_total{outcome="denied"}[1m])) / sum without (x, y) (rate(b_total[1m:10s])) > bool 0.5"#,
            &["a_total", "b_total"],
        ),
        (
            "a / on (job) group_left (instance) b offset 5m",
            &["a", "b"],
        ),
        ("a * ignoring(le) group_right b", &["a", "b"]),
        (r#"{__name__="up", job="x"}"#, &["up"]),
        (r#"{"quoted.metric", job="x"}"#, &["quoted.metric"]),
        // Label names and values that look like metrics or functions are not metrics.
        (
            r#"rate(m{by="sum(x) without", sum='y'}[1m]) and on() vector(1)"#,
            &["m"],
        ),
        (
            "max by (store) (sluice_store_circuit_state)",
            &["sluice_store_circuit_state"],
        ),
        ("SUM BY (le) (x) or Inf", &["x"]),
        ("topk(5, max without (i) (m))", &["m"]),
        ("1e-9 + 0x1f - .5 + clamp_min(x, 1)", &["x"]),
        ("# a comment names nothing\nup", &["up"]),
        ("sum(m) by (le)", &["m"]),
        ("${datasource_metric:raw} + v", &["v"]),
    ];
    for (expr, want) in cases {
        assert_eq!(
            promql::metric_names(expr).unwrap(),
            set(want),
            "metric names of {expr}"
        );
    }
    for bad in [r#"m{a="b"#, "rate(m[5m)", r#"m{a=b}"#] {
        assert!(promql::metric_names(bad).is_err(), "{bad} is not PromQL");
    }
    assert_eq!(
        promql::variable_metric_names("label_values(sluice_decisions_total{op=\"check\"}, policy)")
            .unwrap(),
        set(&["sluice_decisions_total"])
    );
    assert!(
        promql::variable_metric_names("label_values(policy)")
            .unwrap()
            .is_empty()
    );
}

/// A query of the dashboard: where it is, and its text.
#[derive(Debug)]
struct Query {
    at: String,
    expr: String,
    variable: bool,
}

/// Every query of a Grafana dashboard: each panel's targets (rows' nested panels too) and
/// each query variable's query. A panel that is not a row must have a query.
fn dashboard_queries(dashboard: &Value) -> Vec<Query> {
    fn walk(panels: &[Value], out: &mut Vec<Query>) {
        for p in panels {
            let title = p["title"].as_str().unwrap_or("(untitled)");
            if p["type"] == "row" {
                walk(p["panels"].as_array().map_or(&[][..], Vec::as_slice), out);
                continue;
            }
            let targets = p["targets"].as_array().map_or(&[][..], Vec::as_slice);
            assert!(!targets.is_empty(), "panel `{title}` has no query");
            for t in targets {
                let expr = t["expr"].as_str().unwrap_or_default();
                assert!(
                    !expr.trim().is_empty(),
                    "panel `{title}` has a target without expr: {t}"
                );
                out.push(Query {
                    at: format!("panel `{title}` ({})", t["refId"]),
                    expr: expr.to_owned(),
                    variable: false,
                });
            }
        }
    }
    let mut out = Vec::new();
    walk(
        dashboard["panels"]
            .as_array()
            .map_or(&[][..], Vec::as_slice),
        &mut out,
    );
    for v in dashboard["templating"]["list"]
        .as_array()
        .map_or(&[][..], Vec::as_slice)
    {
        if v["type"] != "query" {
            continue;
        }
        let query = match &v["query"] {
            Value::String(s) => s.clone(),
            q => q["query"].as_str().unwrap_or_default().to_owned(),
        };
        out.push(Query {
            at: format!("variable `{}`", v["name"].as_str().unwrap_or_default()),
            expr: query,
            variable: true,
        });
    }
    out
}

/// The names of the series of a Prometheus text exposition.
fn exposed_names(metrics: &str) -> BTreeSet<String> {
    metrics
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| l.split(['{', ' ']).next())
        .map(str::to_owned)
        .collect()
}

async fn post(client: &reqwest::Client, url: String, body: Value) -> (u16, Value) {
    let r = client.post(url).json(&body).send().await.unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap())
}

const RULES: &str = "domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: hour, requests_per_unit: 5}\n";

fn dashboard_config(redis_url: &str, extra: &str) -> String {
    format!(
        "policies:\n  api:\n    limits:\n      - {{ max: 3, per: 1m }}\n{extra}rls:\n  config_dir: rules\n\
         store:\n  backend: redis\n  shards:\n    - primary: {redis_url}\n  timeout: 200ms\n"
    )
}

/// Every metric the dashboard reads is exposed by a real server after real traffic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_of_the_grafana_dashboard_is_exposed() {
    let file = root().join("deploy/grafana/sluice.json");
    let dashboard: Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    let queries = dashboard_queries(&dashboard);
    let mut wanted: Vec<(String, String)> = Vec::new();
    for q in &queries {
        let names = if q.variable {
            promql::variable_metric_names(&q.expr)
        } else {
            promql::metric_names(&q.expr)
        }
        .unwrap_or_else(|e| panic!("{}: cannot read `{}`: {e}", q.at, q.expr));
        assert!(!names.is_empty(), "{}: `{}` reads no metric", q.at, q.expr);
        wanted.extend(names.into_iter().map(|n| (q.at.clone(), n)));
    }
    // What the dashboard is for (docs/deploying.md): these must stay on it.
    let read: BTreeSet<&str> = wanted.iter().map(|(_, n)| n.as_str()).collect();
    for must in [
        "sluice_decisions_total",
        "sluice_decision_latency_seconds_bucket",
        "sluice_store_latency_seconds_bucket",
        "sluice_store_circuit_state",
        "sluice_config_reloads_total",
        "sluice_limit_max",
        "sluice_rule_limit",
        "sluice_decisions_near_limit_total",
        "process_cpu_seconds_total",
        "process_resident_memory_bytes",
    ] {
        assert!(read.contains(must), "no panel reads {must}");
    }

    if !sluice_testkit::require_redis() {
        return;
    }
    let redis = sluice_testkit::RedisServer::start().unwrap();
    let mut server = Serve::start(
        &dashboard_config(&redis.url(), ""),
        &[("rules/edge.yaml", RULES)],
    );
    let client = reqwest::Client::new();
    server.ready(&client).await;

    // HTTP: allowed, then denied; a peek; a refund.
    for i in 0..5 {
        let (status, body) = post(
            &client,
            server.url("/v1/check"),
            serde_json::json!({"policy": "api", "key": "user:1"}),
        )
        .await;
        assert_eq!(status, if i < 3 { 200 } else { 429 }, "{body}");
    }
    let key = serde_json::json!({"policy": "api", "key": "user:1"});
    let (status, peek) = post(&client, server.url("/v1/peek"), key.clone()).await;
    assert_eq!(
        (status, &peek["allowed"]),
        (200, &Value::Bool(false)),
        "{peek}"
    );
    assert_eq!(post(&client, server.url("/v1/refund"), key).await.0, 200);

    // Envoy's ShouldRateLimit, sent by the real gRPC client of `sluice bench`: 5 within the
    // hour's limit, then over it (10 if the hour turned meanwhile).
    let grpc = format!("http://127.0.0.1:{}", server.grpc);
    let bench = sluice(&[
        "bench",
        "--target",
        "grpc",
        "--grpc",
        &grpc,
        "--domain",
        "edge",
        "--descriptor-key",
        "remote_address",
        "--keys",
        "hot",
        "--requests",
        "20",
        "--concurrency",
        "2",
        "--json",
    ]);
    assert!(bench.status.success(), "{}", text(&bench.stderr));
    let report: Value = serde_json::from_slice(&bench.stdout).unwrap();
    let allowed = report["allowed"].as_u64().unwrap();
    assert!((5..=10).contains(&allowed), "{report}");
    assert_eq!(report["denied"].as_u64(), Some(20 - allowed), "{report}");

    // A reload.
    server.rewrite(&dashboard_config(
        &redis.url(),
        "  extra:\n    limits:\n      - { max: 9, per: 1s }\n",
    ));
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let r = client.get(server.url("/v1/policies")).send().await;
        let policies: Value = r.unwrap().json().await.unwrap();
        if policies.to_string().contains("\"extra\"") {
            break;
        }
        assert!(Instant::now() < deadline, "never reloaded: {policies}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // A Redis that stops answering: the call times out (a store error), the policy fails open.
    redis.pause().unwrap();
    let (status, body) = post(
        &client,
        server.url("/v1/check"),
        serde_json::json!({"policy": "api", "key": "user:2"}),
    )
    .await;
    redis.resume().unwrap();
    assert_eq!(
        (status, &body["degraded"]),
        (200, &Value::Bool(true)),
        "{body}"
    );

    let r = client.get(server.url("/metrics")).send().await;
    let metrics = r.unwrap().text().await.unwrap();
    let exposed = exposed_names(&metrics);
    // Every metric has its `# HELP` line before its `# TYPE` line.
    let lines: Vec<&str> = metrics.lines().collect();
    for (i, line) in lines.iter().enumerate() {
        if let Some(name) = line
            .strip_prefix("# TYPE ")
            .and_then(|r| r.split(' ').next())
        {
            assert!(
                i > 0 && lines[i - 1].starts_with(&format!("# HELP {name} ")),
                "{name} has no # HELP line:\n{metrics}"
            );
        }
    }
    let missing: Vec<String> = wanted
        .iter()
        .filter(|(_, name)| !exposed.contains(name))
        .map(|(at, name)| format!("{at}: {name}"))
        .collect();
    assert!(
        missing.is_empty(),
        "metrics the dashboard reads that /metrics does not expose:\n{}\n\n/metrics:\n{metrics}",
        missing.join("\n")
    );
}

#[test]
fn exposition_names_are_read_from_series_lines() {
    let names = exposed_names(
        "# HELP a_total A.\n# TYPE a_total counter\na_total{x=\"1\"} 3\nb 1\nc_bucket{le=\"+Inf\"} 2\n\n",
    );
    assert_eq!(names, set(&["a_total", "b", "c_bucket"]));
}

// ----- completions ----------------------------------------------------------------------

const SUBCOMMANDS: &[&str] = &[
    "serve",
    "check",
    "bench",
    "simulate",
    "config",
    "completions",
];

/// A shell to run, or `None` (with a printed `SKIPPED` line) when it is not installed and
/// `SLUICE_REQUIRE_TOOLS` is not `1`.
fn shell(name: &str) -> Option<&str> {
    let found = Command::new(name)
        .args(["-c", "exit 0"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if found {
        return Some(name);
    }
    assert!(
        std::env::var("SLUICE_REQUIRE_TOOLS").as_deref() != Ok("1"),
        "{name} is not installed and SLUICE_REQUIRE_TOOLS=1 (scripts/test installs it)"
    );
    eprintln!("SKIPPED: {name} is not installed; its completion script is not run");
    None
}

fn completions(shell_name: &str) -> (tempfile::NamedTempFile, String) {
    let out = sluice(&["completions", shell_name]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let script = text(&out.stdout);
    for sub in SUBCOMMANDS {
        assert!(
            script.contains(sub),
            "the {shell_name} script never names `{sub}`"
        );
    }
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), &script).unwrap();
    (file, script)
}

fn run_shell(program: &str, args: &[&str]) -> String {
    let out = Command::new(program).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "{program} {args:?}: {}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    text(&out.stdout)
}

fn words(s: &str) -> BTreeSet<String> {
    s.split_whitespace().map(str::to_owned).collect()
}

/// bash: the script parses (`bash -n`), and its function completes `sluice ` to the
/// subcommands and `sluice config ` to `check`, as bash's programmable completion calls it.
#[test]
fn bash_completion_offers_the_subcommands() {
    let (file, _) = completions("bash");
    let path = file.path().to_str().unwrap();
    run_shell("bash", &["-n", path]);
    let complete = |line: &str| {
        let script = format!(
            r#"source "$1"
COMP_LINE="{line}"; COMP_POINT=${{#COMP_LINE}}
read -r -a COMP_WORDS <<< "$COMP_LINE"; COMP_WORDS+=("")
COMP_CWORD=$(( ${{#COMP_WORDS[@]}} - 1 ))
spec=$(complete -p sluice); fn=${{spec##*-F }}; fn=${{fn%% *}}
"$fn" sluice "" "${{COMP_WORDS[COMP_CWORD-1]}}"
printf '%s\n' "${{COMPREPLY[@]}}""#
        );
        words(&run_shell("bash", &["-c", &script, "bash", path]))
    };
    let top = complete("sluice ");
    for sub in SUBCOMMANDS {
        assert!(top.contains(*sub), "`sluice ` completes to {top:?}");
    }
    assert!(complete("sluice config ").contains("check"));
}

#[test]
fn zsh_completion_parses() {
    let (file, script) = completions("zsh");
    assert!(script.starts_with("#compdef sluice"), "{script}");
    if let Some(zsh) = shell("zsh") {
        run_shell(zsh, &["-n", file.path().to_str().unwrap()]);
    }
}

/// fish: the script loads, and `complete -C` (fish's own completion of a command line)
/// offers the subcommands.
#[test]
fn fish_completion_offers_the_subcommands() {
    let (file, _) = completions("fish");
    let Some(fish) = shell("fish") else {
        return;
    };
    let path = file.path().to_str().unwrap();
    let offered = run_shell(
        fish,
        &[
            "--no-config",
            "-c",
            &format!("source '{path}'; complete -C 'sluice '"),
        ],
    );
    let first_words: BTreeSet<String> = offered
        .lines()
        .filter_map(|l| l.split('\t').next())
        .map(str::to_owned)
        .collect();
    for sub in SUBCOMMANDS {
        assert!(
            first_words.contains(*sub),
            "`sluice ` completes to {offered}"
        );
    }
}

#[test]
fn completions_refuse_an_unknown_shell() {
    let out = sluice(&["completions", "tcsh"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("tcsh"), "{}", text(&out.stderr));
}
