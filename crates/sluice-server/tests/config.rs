//! Configuration files: what is accepted, and that every refusal names file, line and value.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use std::time::Duration;

use sluice_server::config::{Config, FailureMode, RedisLayout, StoreConfig};

fn error(text: &str) -> String {
    Config::parse("sluice.yaml", text).unwrap_err().to_string()
}

#[test]
fn a_configuration_using_every_section_is_accepted() {
    let c = Config::parse(
        "sluice.yaml",
        r#"
listen:
  http: 127.0.0.1:9090
  grpc: 127.0.0.1:9091
policies:
  api:
    limits:
      - { max: 10, per: 1s }
      - { max: 5000, per: 1h }
  search:
    limits:
      - { max: 30, per: 1m, algorithm: sliding_window, precision: 1s }
  uploads:
    on_store_error: closed
    limits:
      - { max: 100, per: 1m, algorithm: token_bucket, burst: 20 }
rls:
  config_dir: ./ratelimit-config
store:
  backend: redis
  shards:
    - primary: redis://127.0.0.1:6379
      replicas: [redis://127.0.0.1:6380]
  read_from: replicas
  timeout: 50ms
  clock: app
  key_prefix: "sluice:"
local:
  enabled: false
  batch: auto
"#,
    )
    .unwrap();
    assert_eq!(c.http.port(), 9090);
    assert_eq!(c.policies.len(), 3);
    let uploads = c
        .policies
        .iter()
        .find(|p| p.policy.name() == "uploads")
        .unwrap();
    assert_eq!(uploads.on_store_error(), FailureMode::Closed);
    assert_eq!(uploads.policy.limits()[0].burst(), 20);
    match c.store {
        StoreConfig::Redis {
            timeout,
            layout: RedisLayout::Shards(shards),
            ..
        } => {
            assert_eq!(timeout, Duration::from_millis(50));
            assert_eq!(shards.len(), 1);
            assert_eq!(shards[0].replicas.len(), 1);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn local_reservation_settings() {
    let c = Config::parse("sluice.yaml", "local:\n  enabled: true\n  batch: 0.01\n").unwrap();
    assert_eq!(
        c.local,
        Some(sluice::ReserveConfig::default().batch(sluice::Batch::Fraction(0.01)))
    );
    let c = Config::parse("sluice.yaml", "local:\n  enabled: true\n").unwrap();
    assert_eq!(c.local, Some(sluice::ReserveConfig::default()));
    let c = Config::parse("sluice.yaml", "local:\n  enabled: false\n  batch: auto\n").unwrap();
    assert_eq!(c.local, None);
    for (batch, says) in [
        ("2", "not a fraction"),
        ("0", "not a fraction"),
        ("lots", "got lots"),
    ] {
        let e = Config::parse(
            "sluice.yaml",
            &format!("local:\n  enabled: true\n  batch: {batch}\n"),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("local.batch") && e.contains(says), "{e}");
    }
}

#[test]
fn local_error_budget() {
    let c = Config::parse(
        "sluice.yaml",
        "local:\n  enabled: true\n  max_error: 0.05\n",
    )
    .unwrap();
    assert_eq!(
        c.local,
        Some(sluice::ReserveConfig::default().max_error(0.05))
    );
    let c = Config::parse("sluice.yaml", "local:\n  enabled: true\n").unwrap();
    assert_eq!(c.local.map(|l| l.max_error), Some(0.01));
    for bad in ["0", "1.5", "-0.1"] {
        let e = Config::parse(
            "sluice.yaml",
            &format!("local:\n  enabled: true\n  max_error: {bad}\n"),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("local.max_error") && e.contains("(0, 1]"), "{e}");
    }
}

#[test]
fn cluster_and_sentinel_layouts() {
    let c = Config::parse(
        "sluice.yaml",
        "store:\n  backend: redis\n  cluster: [redis://127.0.0.1:7000, redis://127.0.0.1:7001]\n",
    )
    .unwrap();
    assert!(matches!(
        c.store,
        StoreConfig::Redis { layout: RedisLayout::Cluster(ref nodes), .. } if nodes.len() == 2
    ));
    let c = Config::parse(
        "sluice.yaml",
        "store:\n  backend: redis\n  sentinel: {master: mymaster, nodes: [redis://127.0.0.1:26379]}\n  read_from: primary\n",
    )
    .unwrap();
    match c.store {
        StoreConfig::Redis {
            layout: RedisLayout::Sentinel(s),
            ..
        } => {
            assert_eq!(s.master, "mymaster");
            assert_eq!(s.nodes, ["redis://127.0.0.1:26379"]);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn coalesce_sets_the_largest_batch_and_names_a_bad_one() {
    let redis = "store:\n  backend: redis\n  shards: [{primary: redis://127.0.0.1:6379}]\n";
    let coalesce = |c: Config| match c.store {
        StoreConfig::Redis { coalesce, .. } => coalesce,
        other => panic!("{other:?}"),
    };
    let c = Config::parse("sluice.yaml", redis).unwrap();
    assert_eq!(coalesce(c), sluice_redis::DEFAULT_COALESCE);
    for (n, expected) in [(1, 1), (16, 16), (1_024, 1_024)] {
        let c = Config::parse("sluice.yaml", &format!("{redis}  coalesce: {n}\n")).unwrap();
        assert_eq!(coalesce(c), expected);
    }
    for bad in ["0", "1025", "-1", "lots"] {
        let e = Config::parse("sluice.yaml", &format!("{redis}  coalesce: {bad}\n"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("store.coalesce") || e.contains("coalesce"),
            "{bad}: {e}"
        );
    }
}

#[test]
fn an_empty_file_means_defaults() {
    let c = Config::parse("sluice.yaml", "").unwrap();
    assert_eq!(c.http.to_string(), "127.0.0.1:8080");
    assert_eq!(c.grpc.to_string(), "127.0.0.1:8081");
    assert_eq!(c.store, StoreConfig::Memory);
    assert!(c.policies.is_empty());
    assert_eq!(Config::demo().policies.len(), 1);
}

#[test]
fn errors_name_file_line_and_value() {
    let e = error(
        "policies:\n  api:\n    limits:\n      - { max: 10, per: 1s }\n      - { max: 5, per: 0s }\n",
    );
    assert!(e.starts_with("sluice.yaml:5:"), "{e}");
    assert!(e.contains("policies.api.limits[1].per"), "{e}");
    assert!(e.contains("`0s` is not a positive duration"), "{e}");

    let e = error("policies:\n  api:\n    limits:\n      - { max: 0, per: 1s }\n");
    assert!(e.starts_with("sluice.yaml:4:"), "{e}");
    assert!(e.contains("max"), "{e}");

    let e =
        error("policies:\n  api:\n    limits:\n      - { max: 10, per: 1s, algorithm: leaky }\n");
    assert!(e.contains("`leaky` is not an algorithm"), "{e}");

    let e = error(
        "policies:\n  api:\n    limits:\n      - { max: 10, per: 1s, precision: 300ms, algorithm: sliding_window }\n",
    );
    assert!(e.contains("multiple of precision"), "{e}");

    let e = error("policies:\n  api:\n    limit:\n      - { max: 10, per: 1s }\n");
    assert!(e.contains("unknown field `limit`"), "{e}");
    assert!(e.starts_with("sluice.yaml:3:"), "{e}");

    let e = error(
        "store:\n  backend: redis\n  shards:\n    - primary: redis://a:1\n    - primary: redis://a:1\n",
    );
    assert!(
        e.contains("store.shards[1].primary") && e.contains("listed twice"),
        "{e}"
    );

    let e = error("store:\n  backend: redis\n");
    assert!(e.contains("needs one of store.shards"), "{e}");

    let e = error(
        "store:\n  backend: redis\n  cluster: [redis://a:1]\n  shards:\n    - primary: redis://b:1\n",
    );
    assert!(e.contains("only one of store.shards"), "{e}");

    let e = error("store:\n  backend: redis\n  sentinel: {master: m, nodes: []}\n");
    assert!(e.contains("store.sentinel.nodes"), "{e}");

    let e = error("store:\n  backend: redis\n  sentinel: {name: m, nodes: [redis://a:1]}\n");
    assert!(e.contains("unknown field `name`"), "{e}");

    let e = error("store:\n  backend: etcd\n");
    assert!(e.contains("store.backend: `etcd` is not a store"), "{e}");

    let e =
        error("policies:\n  api:\n    on_store_error: maybe\n    limits: [{ max: 1, per: 1s }]\n");
    assert!(e.contains("policies.api.on_store_error"), "{e}");

    let e = error("listen:\n  http: localhost-ish\n");
    assert!(e.starts_with("sluice.yaml:2:"), "{e}");

    let e = error("policies:\n  api:\n    limits: [{ max: 1, per: 10 }]\n");
    assert!(e.contains("has no unit"), "{e}");

    let e = error("policies:\n  'a b':\n    limits: [{ max: 1, per: 1s }]\n");
    assert!(e.contains("policies.a b"), "{e}");
}

#[test]
fn redis_tls_files() {
    let c = Config::parse(
        "sluice.yaml",
        "store:\n  backend: redis\n  shards: [{primary: rediss://r:6380}]\n  tls: {ca_file: ca.crt, cert_file: c.crt, key_file: c.key}\n",
    )
    .unwrap();
    let StoreConfig::Redis { tls: Some(tls), .. } = c.store else {
        panic!("{:?}", c.store)
    };
    assert_eq!(tls.ca_file.as_deref(), Some(std::path::Path::new("ca.crt")));
    assert_eq!(tls.key_file.as_deref(), Some(std::path::Path::new("c.key")));
    let e = Config::parse(
        "sluice.yaml",
        "store:\n  backend: redis\n  shards: [{primary: rediss://r:6380}]\n  tls: {ca: x}\n",
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("store.tls") && e.contains("ca"), "{e}");
}

#[test]
fn redis_auth_needs_one_password_source() {
    let base = "store:\n  backend: redis\n  shards: [{primary: redis://r:6379}]\n  auth:\n";
    for (auth, says) in [
        (
            "    username: u\n",
            "exactly one of password_file and password_env",
        ),
        (
            "    password_file: /nonexistent/pw\n",
            "store.auth.password_file: cannot read /nonexistent/pw",
        ),
        (
            "    password_env: SLUICE_TEST_SURELY_UNSET_VARIABLE\n",
            "SLUICE_TEST_SURELY_UNSET_VARIABLE is not set",
        ),
    ] {
        let e = Config::parse("sluice.yaml", &format!("{base}{auth}"))
            .unwrap_err()
            .to_string();
        assert!(e.contains(says), "{e}");
    }
}

#[test]
fn sentinel_auth_is_for_the_sentinels_only() {
    let dir = tempfile::tempdir().unwrap();
    let pw = dir.path().join("sentinel-pw");
    std::fs::write(&pw, "s3cret\n").unwrap();
    let pw = pw.display();
    let sentinel = format!(
        "store:\n  backend: redis\n  sentinel: {{master: m, nodes: [rediss://s1:26379]}}\n  sentinel_auth:\n    username: watcher\n    password_file: {pw}\n"
    );
    let c = Config::parse("sluice.yaml", &sentinel).unwrap();
    let StoreConfig::Redis {
        sentinel_credentials: Some(creds),
        credentials: None,
        ..
    } = &c.store
    else {
        panic!("{:?}", c.store)
    };
    assert_eq!(
        creds,
        &sluice_redis::Credentials::new(Some("watcher".to_owned()), "s3cret")
    );
    assert!(!format!("{:?}", c.store).contains("s3cret"));
    let shards = format!(
        "store:\n  backend: redis\n  shards: [{{primary: redis://r:6379}}]\n  sentinel_auth:\n    password_file: {pw}\n"
    );
    let e = Config::parse("sluice.yaml", &shards)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("store.sentinel_auth: only for store.sentinel"),
        "{e}"
    );
    let no_source = "store:\n  backend: redis\n  sentinel: {master: m, nodes: [redis://s1:26379]}\n  sentinel_auth:\n    username: watcher\n";
    let e = Config::parse("sluice.yaml", no_source)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("store.sentinel_auth: give exactly one of password_file and password_env"),
        "{e}"
    );
}

#[test]
fn waiting_for_replicas_is_opt_in_and_must_fit_in_the_call_timeout() {
    let base = "store:\n  backend: redis\n  shards: [{primary: redis://r:6379}]\n  timeout: 50ms\n";
    let c = Config::parse("sluice.yaml", base).unwrap();
    let StoreConfig::Redis {
        wait_for_replicas, ..
    } = c.store
    else {
        panic!("{:?}", c.store)
    };
    assert_eq!(wait_for_replicas, None);
    let c = Config::parse(
        "sluice.yaml",
        &format!("{base}  wait_for_replicas: {{timeout: 10ms, on_shortfall: fail}}\n"),
    )
    .unwrap();
    let StoreConfig::Redis {
        wait_for_replicas: Some(w),
        ..
    } = c.store
    else {
        panic!("{:?}", c.store)
    };
    assert_eq!(
        w,
        sluice_redis::WaitForReplicas::new(1, Duration::from_millis(10))
            .on_shortfall(sluice_redis::Shortfall::Fail)
    );
    for (wait, says) in [
        (
            "{replicas: 1, timeout: 50ms}",
            "store.wait_for_replicas.timeout (50ms) must be shorter than the call timeout (50ms)",
        ),
        (
            "{replicas: 0, timeout: 10ms}",
            "store.wait_for_replicas.replicas",
        ),
        ("{replicas: 1}", "timeout"),
        ("{timeout: 10ms, on_shortfall: drop}", "drop"),
    ] {
        let e = Config::parse(
            "sluice.yaml",
            &format!("{base}  wait_for_replicas: {wait}\n"),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains(says), "{wait}: {e}");
    }
}

/// Found by the `config::text` fuzz target: the YAML parser gives no line for a second
/// document, so the error named neither a line nor a field.
#[test]
fn a_second_document_is_refused_at_its_line() {
    let e = Config::parse(
        "sluice.yaml",
        "policies:\n  api:\n    limits: [{ max: 1, per: 1s }]\n---\nstore: {}\n",
    )
    .unwrap_err();
    assert_eq!(e.line, Some((4, 1)), "{e}");
    assert!(e.message.contains("more than one YAML document"), "{e}");
    let e = Config::parse("sluice.yaml", "---\nlocal: {}\n---\nstore: {}\n").unwrap_err();
    assert_eq!(e.line, Some((3, 1)), "{e}");
    // A second document the parser finds without a `---` line: the error says it is about
    // the whole file.
    let e = error("&-,");
    assert!(
        e.starts_with("sluice.yaml: the file holds more than one"),
        "{e}"
    );
}

/// Checks made once a section was read (an `rlqs` rule against the policies, a policy's
/// limits together, its failure mode, the store's layout) named no line: docs/configuration.md's
/// whole-file example was refused with `rlqs.buckets[0].policy … not longer than
/// reporting_interval` and nothing to find it by. They carry the line of the value now.
#[test]
fn errors_of_checks_over_a_section_carry_the_line_of_the_value() {
    let policies = "policies:\n  api:\n    limits:\n      - { max: 10, per: 1s }\n";
    let e = Config::parse(
        "sluice.yaml",
        &format!(
            "{policies}rlqs:\n  reporting_interval: 1s\n  buckets:\n    - {{ match: {{ tenant: \"*\" }}, policy: api }}\n"
        ),
    )
    .unwrap_err();
    assert_eq!(e.line, Some((8, 41)), "{e}");
    assert!(
        e.to_string()
            .starts_with("sluice.yaml:8:41: rlqs.buckets[0].policy: `api` has a window"),
        "{e}"
    );
    let cases = [
        (
            "policies:\n  api:\n    on_store_error: maybe\n    limits: [{ max: 1, per: 1s }]\n",
            (3, 21),
            "policies.api.on_store_error",
        ),
        (
            "policies:\n  api:\n    limits:\n      - { max: 1, per: 1s }\n      - { max: 2, per: 1s }\n",
            (5, 9),
            "policies.api.limits[1]",
        ),
        (
            "listen:\n  http: 127.0.0.1:8080\n  grpc: 127.0.0.1:8080\n",
            (2, 3),
            "listen",
        ),
        (
            "store:\n  backend: redis\n  shards:\n    - primary: redis://a:6379\n    - primary: redis://a:6379\n",
            (5, 16),
            "store.shards[1].primary",
        ),
    ];
    for (text, line, path) in cases {
        let e = Config::parse("sluice.yaml", text).unwrap_err();
        assert_eq!(e.line, Some(line), "{text}{e}");
        assert!(e.message.starts_with(&format!("{path}: ")), "{e}");
    }
}
