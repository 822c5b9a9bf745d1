//! Configuration files: what is accepted, and that every refusal names file, line and value.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use std::time::Duration;

use sluice_redis::{RedisConfig, Topology};
use sluice_server::config::{Config, ConfigError, FailureMode, StoreConfig};

/// `text` as `sluice.yaml`, which must be accepted.
pub(crate) fn parsed(text: &str) -> Config {
    Config::parse("sluice.yaml", text).unwrap()
}

/// The refusal of `text` as `sluice.yaml`.
pub(crate) fn refused(text: &str) -> ConfigError {
    Config::parse("sluice.yaml", text).unwrap_err()
}

fn error(text: &str) -> String {
    refused(text).to_string()
}

#[test]
fn a_configuration_using_every_section_is_accepted() {
    let c = parsed(
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
    );
    assert_eq!(c.http.port(), 9090);
    assert_eq!(c.policies.len(), 3);
    let uploads = c.policies.iter().find(|p| p.name() == "uploads").unwrap();
    assert_eq!(uploads.failure_mode(), FailureMode::Closed);
    assert_eq!(uploads.limits()[0].burst(), 20);
    match c.store {
        StoreConfig::Redis(RedisConfig {
            timeout,
            topology: Topology::Shards { shards },
            ..
        }) => {
            assert_eq!(timeout, Duration::from_millis(50));
            assert_eq!(shards.len(), 1);
            assert_eq!(shards[0].replicas.len(), 1);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn local_reservation_settings() {
    let c = parsed("local:\n  enabled: true\n  batch: 0.01\n");
    assert_eq!(
        c.local,
        Some(sluice::ReserveConfig::default().batch(sluice::Batch::Fraction(0.01)))
    );
    let c = parsed("local:\n  enabled: true\n");
    assert_eq!(c.local, Some(sluice::ReserveConfig::default()));
    let c = parsed("local:\n  enabled: false\n  batch: auto\n");
    assert_eq!(c.local, None);
    for (batch, says) in [
        ("2", "not a fraction"),
        ("0", "not a fraction"),
        ("lots", "got lots"),
    ] {
        let e = refused(&format!("local:\n  enabled: true\n  batch: {batch}\n")).to_string();
        assert!(e.contains("local.batch") && e.contains(says), "{e}");
    }
}

#[test]
fn local_error_budget() {
    let c = parsed("local:\n  enabled: true\n  max_error: 0.05\n");
    assert_eq!(
        c.local,
        Some(sluice::ReserveConfig::default().max_error(0.05))
    );
    let c = parsed("local:\n  enabled: true\n");
    assert_eq!(c.local.map(|l| l.max_error), Some(0.01));
    for bad in ["0", "1.5", "-0.1"] {
        let e = refused(&format!("local:\n  enabled: true\n  max_error: {bad}\n")).to_string();
        assert!(e.contains("local.max_error") && e.contains("(0, 1]"), "{e}");
    }
}

/// An empty file was a valid configuration of nothing, so an editor's truncating
/// write dropped every policy. An empty file (or one of comments only) is refused; `{}` is
/// every default, written on purpose.
#[test]
fn an_empty_file_is_refused_and_braces_mean_defaults() {
    for empty in ["", "\n\n", "# just a comment\n", "---\n", "~\n"] {
        let e = refused(empty);
        assert!(
            e.message.starts_with("the file is empty") && e.message.contains("`{}`"),
            "{empty:?}: {e}"
        );
    }
    let c = parsed("{}\n");
    assert_eq!(c.http.to_string(), "127.0.0.1:8080");
    assert_eq!(c.grpc.to_string(), "127.0.0.1:8081");
    assert_eq!(c.store, StoreConfig::Memory);
    assert!(c.policies.is_empty());
    assert_eq!(Config::demo().policies.len(), 1);
}

/// `api:` twice was "valid (1 policies)", the last one winning. A key given twice
/// anywhere in the file is an error at the second, naming the lines of both.
#[test]
fn a_key_given_twice_anywhere_is_refused_naming_both_lines() {
    let e = refused(
        "policies:\n  api:\n    limits: [{ max: 1, per: 1s }]\n  web:\n    limits: [{ max: 2, per: 1s }]\n  api:\n    limits: [{ max: 3, per: 1s }]\n",
    );
    assert_eq!(e.line, Some((6, 3)), "{e}");
    assert_eq!(
        e.message,
        "policies: `api` is given twice, at lines 2 and 6; each policy needs its own name"
    );
    for (text, at, says) in [
        (
            "policies:\n  api:\n    limits:\n      - max: 1\n        per: 1s\n        max: 2\n",
            (6, 9),
            "policies.api.limits[0]: `max` is given twice, at lines 4 and 6",
        ),
        (
            "policies:\n  api:\n    limits: [{ max: 1, per: 1s, per: 2s }]\n",
            (3, 33),
            "policies.api.limits[0]: `per` is given twice on line 3",
        ),
        (
            "store:\n  backend: redis\n  shards:\n    - primary: redis://a:1\n      primary: redis://b:1\n",
            (5, 7),
            "store.shards[0]: `primary` is given twice, at lines 4 and 5",
        ),
        (
            "policies:\n  api:\n    limits: [{ max: 1, per: 1s }]\nlocal: {}\npolicies:\n  web:\n    limits: [{ max: 1, per: 1s }]\n",
            (5, 1),
            "`policies` is given twice, at lines 1 and 5",
        ),
    ] {
        let e = refused(text);
        assert_eq!(e.line, Some(at), "{e}");
        assert!(e.message.starts_with(says), "{e}");
    }
    // The same key in two mappings is no duplicate.
    assert!(
        Config::parse(
            "sluice.yaml",
            "policies:\n  a:\n    limits: [{ max: 1, per: 1s }]\n  b:\n    limits: [{ max: 1, per: 1s }]\n"
        )
        .is_ok()
    );
}

/// Errors named Rust types (`expected u64`, `struct RawConfig`), missed the index of
/// a limit (`policies.api.limits: max: 0`), showed durations in milliseconds, and an unclosed
/// `{` was reported as "`1s other` is not a duration".
#[test]
fn errors_speak_the_files_words() {
    let e = error("policies:\n  api:\n    limits:\n      - { max: -1, per: 1s }\n");
    assert!(
        e.ends_with(
            "policies.api.limits[0].max: invalid type: integer `-1`, expected a whole number"
        ),
        "{e}"
    );
    let e = error("- a\n- b\n");
    assert_eq!(
        e,
        "sluice.yaml:1:1: invalid type: sequence, expected a mapping (key: value)"
    );
    let e = error("top:\n  capacity: lots\n");
    assert!(e.ends_with("expected a whole number"), "{e}");
    let e = error("policies:\n  api:\n    limits: 5\n");
    assert!(e.ends_with("expected a list"), "{e}");
    for e in [
        error("policies:\n  api:\n    limits:\n      - { max: 0, per: 1s }\n"),
        error("policies:\n  api:\n    limits: [{ max: 0, per: 1s }]\n"),
    ] {
        assert!(
            e.contains("policies.api.limits[0]: max: 0 is out of range"),
            "{e}"
        );
    }
    let e = error(
        "policies:\n  api:\n    limits:\n      - max: 1\n        per: 1s\n      - max: 0\n        per: 1m\n",
    );
    assert!(
        e.starts_with("sluice.yaml:6:9: policies.api.limits[1]: max: 0"),
        "{e}"
    );
    let e = error(
        "policies:\n  api:\n    limits: [{ max: 100, per: 1m, algorithm: sliding_window, precision: 7s }]\n",
    );
    assert!(
        e.contains("per (1m) must be a multiple of precision (7s)"),
        "{e}"
    );
    let e = error(
        "policies:\n  api:\n    limits: [{ max: 100, per: 2h, algorithm: sliding_window, precision: 1s }]\n",
    );
    assert!(
        e.contains(
            "1s splits per (2h) into 7200 buckets; at most 3600 are allowed, so precision must \
             be at least 2s"
        ),
        "{e}"
    );
    let e = error(
        "policies:\n  api:\n    limits:\n      - { max: 10, per: 1s\n  other:\n    limits: [{ max: 1, per: 1s }]\n",
    );
    assert_eq!(
        e,
        "sluice.yaml:5:8: a `{` opened above is never closed: expected `,` or `}` here"
    );
    let e = error("policies:\n  api:\n    limits: [{ max: 1, per: 1s }\n");
    assert!(e.contains("a `[` opened above is never closed"), "{e}");
    for e in [
        error("-\n"),
        error("listen: [1]\n"),
        error("policies:\n  api:\n    limits: [{ max: 1, per: 1s, algorithm: 5 }]\n"),
    ] {
        assert!(
            !e.contains("struct") && !e.contains("u64") && !e.contains("usize"),
            "{e}"
        );
    }
}

/// `localhost:8080` and `8080` were "invalid socket address syntax". They are still
/// refused (a listener binds an address; which interfaces to expose is stated, not guessed),
/// with what to write instead.
#[test]
fn a_port_alone_or_a_host_name_as_listen_address_gets_a_hint() {
    for (value, says) in [
        (
            "8080",
            "`8080` is a port alone; write IP:port: 127.0.0.1:8080 (this machine only) or 0.0.0.0:8080",
        ),
        (
            "':8080'",
            "`:8080` is a port alone; write IP:port: 127.0.0.1:8080",
        ),
        (
            "localhost:8080",
            "`localhost:8080` names a host; a listener binds an IP address, not a name: write 127.0.0.1:8080 (or [::1]:8080)",
        ),
        (
            "api.internal:9000",
            "write the IP address api.internal stands for, e.g. 10.0.0.5:9000",
        ),
        (
            "nonsense",
            "`nonsense` is not a socket address; write IP:port, e.g. 127.0.0.1:8080",
        ),
    ] {
        let e = error(&format!("listen:\n  grpc: {value}\n"));
        assert!(e.starts_with("sluice.yaml:2:9: listen.grpc: "), "{e}");
        assert!(e.contains(says), "{value}: {e}");
    }
    let c = parsed("listen:\n  http: '[::]:80'\n  grpc: 0.0.0.0:81\n");
    assert_eq!((c.http.port(), c.grpc.port()), (80, 81));
}

/// What a reload cannot change is named, so the watcher can warn that it applies after a
/// restart.
#[test]
fn the_sections_read_at_start_only_are_compared() {
    let base = parsed("policies:\n  a:\n    limits: [{ max: 1, per: 1s }]\n");
    let same = parsed("policies:\n  b:\n    limits: [{ max: 9, per: 1m }]\n");
    assert!(base.restart_only_changes(&same).is_empty());
    let moved = parsed(
        "listen:\n  http: 127.0.0.1:9999\nlocal:\n  enabled: true\ntop:\n  capacity: 8\nstore:\n  backend: redis\n  shards: [{primary: redis://r:1}]\n",
    );
    assert_eq!(
        base.restart_only_changes(&moved),
        ["listen", "store", "local", "top"]
    );
}

/// Each bad file: the start of its error (file and line) and what the error holds.
#[test]
fn errors_name_file_line_and_value() {
    let at = "sluice.yaml:";
    for (text, starts, holds) in [
        (
            "policies:\n  api:\n    limits:\n      - { max: 10, per: 1s }\n      - { max: 5, per: 0s }\n",
            "sluice.yaml:5:",
            &[
                "policies.api.limits[1].per",
                "`0s` is not a positive duration",
            ][..],
        ),
        (
            "policies:\n  api:\n    limits:\n      - { max: 0, per: 1s }\n",
            "sluice.yaml:4:",
            &["max"],
        ),
        (
            "policies:\n  api:\n    limits:\n      - { max: 10, per: 1s, algorithm: leaky }\n",
            at,
            &["`leaky` is not an algorithm"],
        ),
        (
            "policies:\n  api:\n    limits:\n      - { max: 10, per: 1s, precision: 300ms, algorithm: sliding_window }\n",
            at,
            &["multiple of precision"],
        ),
        (
            "policies:\n  api:\n    limit:\n      - { max: 10, per: 1s }\n",
            "sluice.yaml:3:",
            &["unknown field `limit`"],
        ),
        (
            "store:\n  backend: redis\n  shards:\n    - primary: redis://a:1\n    - primary: redis://a:1\n",
            at,
            &["store.shards[1].primary", "listed twice"],
        ),
        (
            "store:\n  backend: redis\n",
            at,
            &["needs one of store.shards"],
        ),
        (
            "store:\n  backend: redis\n  cluster: [redis://a:1]\n  shards:\n    - primary: redis://b:1\n",
            at,
            &["only one of store.shards"],
        ),
        (
            "store:\n  backend: redis\n  sentinel: {master: m, nodes: []}\n",
            at,
            &["store.sentinel.nodes"],
        ),
        (
            "store:\n  backend: redis\n  sentinel: {name: m, nodes: [redis://a:1]}\n",
            at,
            &["unknown field `name`"],
        ),
        (
            "store:\n  backend: etcd\n",
            at,
            &["store.backend: `etcd` is not a store"],
        ),
        (
            "policies:\n  api:\n    on_store_error: maybe\n    limits: [{ max: 1, per: 1s }]\n",
            at,
            &["policies.api.on_store_error"],
        ),
        ("listen:\n  http: localhost-ish\n", "sluice.yaml:2:", &[]),
        (
            "policies:\n  api:\n    limits: [{ max: 1, per: 10 }]\n",
            at,
            &["has no unit"],
        ),
        (
            "policies:\n  'a b':\n    limits: [{ max: 1, per: 1s }]\n",
            at,
            &["policies.a b"],
        ),
    ] {
        let e = error(text);
        assert!(e.starts_with(starts), "{e}");
        for part in holds {
            assert!(e.contains(part), "{part}: {e}");
        }
    }
}

/// Found by the `config::text` fuzz target: the YAML parser gives no line for a second
/// document, so the error named neither a line nor a field.
#[test]
fn a_second_document_is_refused_at_its_line() {
    let e = refused("policies:\n  api:\n    limits: [{ max: 1, per: 1s }]\n---\nstore: {}\n");
    assert_eq!(e.line, Some((4, 1)), "{e}");
    assert!(e.message.contains("more than one YAML document"), "{e}");
    let e = refused("---\nlocal: {}\n---\nstore: {}\n");
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
    let e = refused(&format!(
        "{policies}rlqs:\n  reporting_interval: 1s\n  buckets:\n    - {{ match: {{ tenant: \"*\" }}, policy: api }}\n"
    ));
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
        let e = refused(text);
        assert_eq!(e.line, Some(line), "{text}{e}");
        assert!(e.message.starts_with(&format!("{path}: ")), "{e}");
    }
}

/// `listen.header_timeout`, `body_timeout`, `idle_timeout` and `max_connections`: their
/// defaults, and what cannot work.
#[test]
fn connection_bounds_have_defaults_and_refuse_what_cannot_work() {
    let c = parsed("{}\n");
    assert_eq!(c.connections.header_timeout, Duration::from_secs(10));
    assert_eq!(c.connections.body_timeout, Duration::from_secs(30));
    assert_eq!(c.connections.idle_timeout, Duration::from_secs(60));
    assert!((64..=10_000).contains(&c.connections.max_connections));
    let c = parsed(
        "listen:\n  header_timeout: 2s\n  body_timeout: 5s\n  idle_timeout: 2m\n  max_connections: 500\n",
    );
    assert_eq!(
        (
            c.connections.header_timeout,
            c.connections.body_timeout,
            c.connections.idle_timeout,
            c.connections.max_connections
        ),
        (
            Duration::from_secs(2),
            Duration::from_secs(5),
            Duration::from_secs(120),
            500
        )
    );
    let e = error("listen:\n  max_connections: 0\n");
    assert!(
        e.contains("listen.max_connections: 0 would accept nothing"),
        "{e}"
    );
    let e = error("listen:\n  max_connections: 1000001\n");
    assert!(
        e.contains("listen.max_connections: 1000001 is more than 1000000"),
        "{e}"
    );
    let e = error("listen:\n  idle_timeout: 0s\n");
    assert!(
        e.contains("listen.idle_timeout") && e.contains("not a positive duration"),
        "{e}"
    );
    // An RLQS stream is silent between two reports: the default idle timeout makes room for
    // three, and a shorter one given is refused.
    let rlqs = "policies:\n  api:\n    limits: [{ max: 100, per: 1h }]\nrlqs:\n  reporting_interval: 1m\n  buckets: [{ policy: api }]\n";
    let c = parsed(rlqs);
    assert_eq!(c.connections.idle_timeout, Duration::from_secs(180));
    let e = error(&format!("listen:\n  idle_timeout: 1m\n{rlqs}"));
    assert!(
        e.contains("listen.idle_timeout: 1m is not longer than rlqs.reporting_interval (1m)"),
        "{e}"
    );
}
