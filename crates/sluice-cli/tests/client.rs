//! The client commands as a user runs them: the real `sluice check` and `sluice bench`
//! against a real `sluice serve` (TLS with a throw-away CA, or plaintext), or against nothing.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod support;

use std::path::Path;
use std::process::Output;

use sluice_testkit::TlsCerts;
use support::{Serve, run as sluice, text};

const RLS_YAML: &str = "domain: bench\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: hour, requests_per_unit: 5}\n";

fn code(o: &Output) -> i32 {
    o.status.code().unwrap()
}

fn stdout(o: &Output) -> String {
    text(&o.stdout)
}

fn stderr(o: &Output) -> String {
    text(&o.stderr)
}

fn tls_config(certs: &TlsCerts) -> String {
    let (cert, key) = certs.server_files();
    format!(
        "listen:\n  tls:\n    cert_file: {}\n    key_file: {}\npolicies:\n  api:\n    limits:\n      - {{ max: 2, per: 1h }}\nrls:\n  config_dir: rls\n",
        cert.display(),
        key.display()
    )
}

fn path(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// `https://…` failed with "scheme is not http"; now `--cacert` trusts the server's CA,
/// `--peek` looks without spending, `--token-file` reads a token as the server does, and a
/// server whose CA is not trusted is an error that says so (exit 2).
#[test]
fn check_reaches_a_tls_server_with_its_ca_and_peeks() {
    let certs = TlsCerts::generate().unwrap();
    let s = Serve::start(&tls_config(&certs), &[("rls/bench.yaml", RLS_YAML)]).listening();
    let url = format!("https://127.0.0.1:{}", s.http);
    let ca = certs.ca_file();
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, "# the ops token\nadm1n-t0ken-0123456789abcdef\n").unwrap();
    let run = |extra: &[&str]| {
        let mut args = vec![
            "check",
            "--url",
            &url,
            "--cacert",
            path(&ca),
            "--policy",
            "api",
            "--key",
            "k",
        ];
        args.extend_from_slice(extra);
        sluice(&args)
    };
    let body = |o: &Output| -> serde_json::Value { serde_json::from_str(&stdout(o)).unwrap() };

    let o = run(&[]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert_eq!(body(&o)["remaining"], 1);
    // A peek spends nothing, however often.
    for _ in 0..3 {
        let o = run(&["--peek", "--token-file", path(&token)]);
        assert_eq!(code(&o), 0, "{}", stderr(&o));
        assert_eq!(
            (body(&o)["allowed"].clone(), body(&o)["remaining"].clone()),
            (true.into(), 0.into())
        );
    }
    let o = run(&["--token-env", "SLUICE_TEST_UNSET_VARIABLE_22C"]);
    assert_eq!(code(&o), 2);
    assert!(
        stderr(&o).contains("SLUICE_TEST_UNSET_VARIABLE_22C"),
        "{}",
        stderr(&o)
    );
    assert_eq!(code(&run(&[])), 0, "the second unit");
    let o = run(&[]);
    assert_eq!(code(&o), 1, "denied: {}", stderr(&o));
    assert_eq!(body(&o)["allowed"], false);
    let o = run(&["--peek"]);
    assert_eq!(code(&o), 1, "a peek whose check would be denied");

    // Without the CA the server's certificate is not trusted.
    let o = sluice(&["check", "--url", &url, "--policy", "api", "--key", "k"]);
    assert_eq!(code(&o), 2);
    let e = stderr(&o);
    assert!(e.contains("certificate") && e.contains(&url), "{e}");
    // Plaintext against the TLS port is an error too, not a decision.
    let plain = format!("http://127.0.0.1:{}", s.http);
    assert_eq!(
        code(&sluice(&[
            "check", "--url", &plain, "--policy", "api", "--key", "k"
        ])),
        2
    );
}

/// `sluice bench` over HTTPS and over gRPC with TLS, trusting the server's CA.
#[test]
fn bench_reaches_a_tls_server_over_http_and_grpc() {
    let certs = TlsCerts::generate().unwrap();
    let s = Serve::start(&tls_config(&certs), &[("rls/bench.yaml", RLS_YAML)]).listening();
    let ca = certs.ca_file();
    let url = format!("https://127.0.0.1:{}", s.http);
    let grpc = format!("https://127.0.0.1:{}", s.grpc);
    for (target, allowed, why) in [
        (
            ["--url", &url, "--policy", "api", "--keys", "uniform:5"],
            10,
            "5 keys × 2",
        ),
        (
            ["--target", "grpc", "--grpc", &grpc, "--keys", "uniform:4"],
            20,
            "4 addresses × 5 per hour",
        ),
    ] {
        let mut args = vec!["bench", "--cacert", path(&ca), "--requests", "40"];
        args.extend(["--concurrency", "4", "--json"]);
        args.extend(target);
        let o = sluice(&args);
        assert_eq!(code(&o), 0, "{why}: {}", stderr(&o));
        let r: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
        assert_eq!(
            (
                r["decisions"].clone(),
                r["allowed"].clone(),
                r["errors"].clone()
            ),
            (40.into(), allowed.into(), 0.into()),
            "{why}: {r}"
        );
    }
}

fn bench_json(args: &[&str]) -> (Output, serde_json::Value) {
    let mut all = vec!["bench", "--json", "--concurrency", "2", "--requests", "20"];
    all.extend_from_slice(args);
    let o = sluice(&all);
    let report = serde_json::from_str(&stdout(&o))
        .unwrap_or_else(|e| panic!("{e}: {}\n{}", stdout(&o), stderr(&o)));
    (o, report)
}

/// The one kind of error a run met, with its count and first message.
fn only_error(report: &serde_json::Value) -> (String, u64, String) {
    let kinds = report["error_kinds"].as_array().unwrap();
    assert_eq!(kinds.len(), 1, "{report}");
    (
        kinds[0]["kind"].as_str().unwrap().to_owned(),
        kinds[0]["count"].as_u64().unwrap(),
        kinds[0]["first"].as_str().unwrap().to_owned(),
    )
}

/// With no server, an unknown policy, or gRPC against a server without `rls`, the bench said
/// "100 % errors" with no reason and exited 0. Now it says why, by kind with the first
/// message, in the JSON and the text, and exits 2.
#[test]
fn bench_says_why_every_request_failed_and_exits_non_zero() {
    let nobody = format!("http://127.0.0.1:{}", sluice_testkit::free_port().unwrap());
    let (o, r) = bench_json(&["--url", &nobody]);
    assert_eq!(code(&o), 2, "{r}");
    assert_eq!(
        (r["decisions"].clone(), r["errors"].clone()),
        (0.into(), 20.into())
    );
    let (kind, count, first) = only_error(&r);
    assert_eq!((kind.as_str(), count), ("connect", 20));
    assert!(
        first.to_lowercase().contains("connection refused"),
        "{first}"
    );
    assert!(
        stderr(&o).contains("every request failed"),
        "{}",
        stderr(&o)
    );

    let s = Serve::start(
        "listen:\npolicies:\n  api:\n    limits:\n      - { max: 5, per: 1h }\n",
        &[],
    )
    .listening();
    let url = format!("http://127.0.0.1:{}", s.http);
    let (o, r) = bench_json(&["--url", &url, "--policy", "nope"]);
    assert_eq!(code(&o), 2, "{r}");
    let (kind, count, first) = only_error(&r);
    assert_eq!((kind.as_str(), count), ("HTTP 404 unknown_policy", 20));
    assert!(first.contains("nope") && first.contains("api"), "{first}");
    // The text report names the kind and the first message too.
    let o = sluice(&[
        "bench",
        "--url",
        &url,
        "--policy",
        "nope",
        "--requests",
        "5",
    ]);
    assert_eq!(code(&o), 2);
    let text = stdout(&o);
    assert!(
        text.contains("errors 5") && text.contains("5 × HTTP 404 unknown_policy, the first: "),
        "{text}"
    );

    let grpc = format!("http://127.0.0.1:{}", s.grpc);
    let (o, r) = bench_json(&["--target", "grpc", "--grpc", &grpc]);
    assert_eq!(code(&o), 2, "{r}");
    let (kind, count, first) = only_error(&r);
    assert_eq!((kind.as_str(), count), ("gRPC FailedPrecondition", 20));
    assert!(first.contains("rls"), "{first}");

    // A run with decisions exits 0, its counts unchanged.
    let (o, r) = bench_json(&["--url", &url, "--policy", "api", "--keys", "hot"]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert_eq!(
        (
            r["allowed"].clone(),
            r["denied"].clone(),
            r["degraded"].clone(),
            r["errors"].clone()
        ),
        (5.into(), 15.into(), 0.into(), 0.into())
    );
}

/// Answers of a policy failing open while its store is down were counted as allowed; they
/// are `degraded` now, apart from the store's decisions and out of decisions/s, and a run
/// with no decision of the store's exits 2.
#[test]
fn bench_counts_degraded_answers_apart() {
    if !sluice_testkit::require_redis() {
        return;
    }
    let mut redis = sluice_testkit::RedisServer::start().unwrap();
    let s = Serve::start(
        &format!(
            "listen:\npolicies:\n  api:\n    limits:\n      - {{ max: 1000, per: 1h }}\nstore:\n  backend: redis\n  timeout: 500ms\n  shards:\n    - primary: {}\n",
            redis.url()
        ),
        &[],
    ).listening();
    let url = format!("http://127.0.0.1:{}", s.http);
    let (o, r) = bench_json(&["--url", &url, "--policy", "api"]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert_eq!(
        (
            r["decisions"].clone(),
            r["allowed"].clone(),
            r["degraded"].clone()
        ),
        (20.into(), 20.into(), 0.into())
    );
    redis.kill().unwrap();
    let (o, r) = bench_json(&["--url", &url, "--policy", "api"]);
    assert_eq!(
        (
            r["decisions"].clone(),
            r["allowed"].clone(),
            r["degraded"].clone(),
            r["errors"].clone()
        ),
        (0.into(), 0.into(), 20.into(), 0.into()),
        "{r}"
    );
    assert_eq!(r["decisions_per_second"], 0.0);
    assert_eq!(code(&o), 2);
    assert!(
        stderr(&o).contains("20 answers were degraded"),
        "{}",
        stderr(&o)
    );
    let o = sluice(&["bench", "--url", &url, "--policy", "api", "--requests", "3"]);
    assert!(stdout(&o).contains("degraded 3"), "{}", stdout(&o));
}
