//! `sluice simulate`: the real binary compares policies from a configuration file and inline
//! on generated traffic and on a log file, prints the table, writes a well-formed SVG chart,
//! and exits non-zero with a clear message on bad input.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod support;

use std::process::Output;

use support::{temp_file, text};

/// `sluice simulate ARGS`.
fn sluice(args: &[&str]) -> Output {
    support::sluice()
        .arg("simulate")
        .args(args)
        .output()
        .unwrap()
}

fn stdout(o: &Output) -> String {
    text(&o.stdout)
}

fn stderr(o: &Output) -> String {
    text(&o.stderr)
}

#[test]
fn a_configured_and_an_inline_policy_side_by_side_with_a_chart() {
    let (dir, config) = temp_file(
        "sluice.yaml",
        "policies:\n  api:\n    limits:\n      - { max: 100, per: 1m }\n",
    );
    let svg = dir.path().join("chart.svg");
    let o = sluice(&[
        "--config",
        config.to_str().unwrap(),
        "--policy",
        "current=api",
        "--policy",
        "candidate={limits: [{max: 60, per: 1m, algorithm: token_bucket, burst: 10}]}",
        "--pattern",
        "steady",
        "--rate",
        "2",
        "--duration",
        "60s",
        "--svg",
        svg.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    let row = |name: &str| -> Vec<String> {
        out.lines()
            .find(|l| l.starts_with(name))
            .unwrap_or_else(|| panic!("no row {name} in\n{out}"))
            .split_whitespace()
            .map(str::to_owned)
            .collect()
    };
    // name, admitted, denied, (share), first denial, retry_after percentiles, limits…
    assert_eq!(
        row("current")[..6],
        ["current", "100", "20", "(16.7%)", "50s", "5s/9s/10s/10s"]
    );
    assert_eq!(
        row("candidate")[..5],
        ["candidate", "69", "51", "(42.5%)", "9.500s"]
    );
    assert!(out.contains("120 requests over 1 key,"), "{out}");

    // The chart parses as XML: an <svg> with one panel per policy, a green bar for each of
    // the 50 seconds the fixed window admits and a red one for each of the 10 it refuses.
    let text = std::fs::read_to_string(&svg).unwrap();
    let doc = roxmltree::Document::parse(&text).unwrap();
    let root = doc.root_element();
    assert_eq!(root.tag_name().name(), "svg");
    assert_eq!(
        root.tag_name().namespace(),
        Some("http://www.w3.org/2000/svg")
    );
    let panels: Vec<_> = root
        .children()
        .filter(|n| n.has_tag_name(("http://www.w3.org/2000/svg", "g")))
        .collect();
    let names: Vec<_> = panels
        .iter()
        .map(|g| g.attribute("data-name").unwrap())
        .collect();
    assert_eq!(names, ["current", "candidate"]);
    let bars = |g: &roxmltree::Node, class: &str| {
        g.children()
            .filter(|n| n.attribute("class") == Some(class))
            .count()
    };
    assert_eq!(
        (bars(&panels[0], "admitted"), bars(&panels[0], "denied")),
        (50, 10)
    );
    // The token bucket admits in every second, and refuses from 9.5 s on.
    assert_eq!(bars(&panels[1], "admitted"), 60);
    assert_eq!(bars(&panels[1], "denied"), 51);
}

#[test]
fn a_log_file_in_nginx_format_as_json() {
    let (_dir, log) = temp_file(
        "access.log",
        concat!(
            "10.0.0.1 - - [01/Jan/2026:00:00:00 +0000] \"GET / HTTP/1.1\" 200 612 \"-\" \"curl/8.5\"\n",
            "10.0.0.2 - - [01/Jan/2026:00:00:01 +0000] \"GET / HTTP/1.1\" 200 612 \"-\" \"curl/8.5\"\n",
            "10.0.0.1 - - [01/Jan/2026:00:00:02 +0000] \"GET / HTTP/1.1\" 200 612 \"-\" \"curl/8.5\"\n",
            "10.0.0.1 - - [01/Jan/2026:00:00:03 +0000] \"GET / HTTP/1.1\" 200 612 \"-\" \"curl/8.5\"\n",
        ),
    );
    let o = sluice(&[
        "--policy",
        "p={limits: [{max: 2, per: 1m}]}",
        "--log",
        log.to_str().unwrap(),
        "--format",
        "nginx",
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(report["events"], 4);
    assert_eq!(
        report["policies"][0]["top_keys"],
        serde_json::json!([
            {"key": "10.0.0.1", "admitted": 2, "denied": 1},
            {"key": "10.0.0.2", "admitted": 1, "denied": 0},
        ])
    );
    assert_eq!(report["policies"][0]["first_denial_ms"], 3_000);
}

#[test]
fn bad_input_exits_non_zero_naming_what_is_wrong() {
    let inline = "p={limits: [{max: 2, per: 1m}]}";
    let steady = "--pattern steady --rate 1 --duration 1s";
    // `--policy` and the other arguments (split at spaces), and what the error says.
    let cases = [
        ("api", steady, "no policy named `api`"),
        (
            "p={limits: [{max: 2, per: 0s}]}",
            steady,
            "limits[0].per: `0s` is not a positive duration",
        ),
        (
            inline,
            "--pattern steady --rate 1000 --duration 2h",
            "max_events",
        ),
        (
            inline,
            "--pattern steady --rate 1 --duration 40d",
            "max_duration",
        ),
        (inline, "--pattern zigzag --duration 1s", "traffic.pattern"),
        (inline, "", "give a traffic"),
        (
            inline,
            "--log /nonexistent/access.log --format csv",
            "/nonexistent/access.log",
        ),
        ("{limits: []}", steady, "needs a name"),
    ];
    for (policy, rest, words) in cases {
        let mut args = vec!["--policy", policy];
        args.extend(rest.split_whitespace());
        let o = sluice(&args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stdout(&o));
        let e = stderr(&o);
        assert!(e.contains(words), "{args:?}: `{e}` lacks `{words}`");
    }
    // A malformed log line is skipped, counted and named by its number (it used
    // to end the run); a log of nothing but malformed lines ends it, naming them.
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("t.csv");
    let csv = || {
        sluice(&[
            "--policy",
            inline,
            "--log",
            log.to_str().unwrap(),
            "--format",
            "csv",
        ])
    };
    std::fs::write(&log, "1767225600,a\n1767225601\n").unwrap();
    let o = csv();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(out.contains("1 of 2 lines read, 1 skipped"), "{out}");
    assert!(
        out.contains("line 2: 1 fields where 2 or 3 are expected"),
        "{out}"
    );
    std::fs::write(&log, "1767225601\nnow,a\n").unwrap();
    let o = csv();
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("none of the 2 lines could be read as csv"),
        "{}",
        stderr(&o)
    );
    assert!(stderr(&o).contains("line 2: timestamp"), "{}", stderr(&o));
    // A file that starts as gzip but is not whole is refused as such.
    let gz = dir.path().join("t.csv.gz");
    std::fs::write(&gz, [0x1f, 0x8b, 8, 0, 0, 0]).unwrap();
    let o = sluice(&["--policy", inline, "--log", gz.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("not a readable gzip file"),
        "{}",
        stderr(&o)
    );
}
