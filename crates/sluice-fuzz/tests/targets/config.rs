//! The server's configuration file (`sluice_server::config::Config::parse`).
//!
//! Properties: no input panics; an error names the file given, and either a line or the
//! section and field at fault; a configuration that loads describes policies that load
//! again, identical, when written back out; the corpus's `valid_*` seeds load and its
//! `invalid_*` seeds do not.

use bolero::check;
use serde_json::{Value, json};
use sluice::{Algorithm, FailureMode};
use sluice_fuzz::{Edit, Many, Tally, YAML_WORDS, apply_edits, budget, seeds};
use sluice_server::config::{Config, ConfigError};

const FILE: &str = "fuzz.yaml";

/// The sections of the file: an error without a line starts with one of them, or says it is
/// about the whole file.
const SECTIONS: &[&str] = &[
    "listen", "policies", "rls", "rlqs", "store", "local", "admin", "the file",
];

/// Keys and values of the configuration, for edits.
const WORDS: &[&str] = &[
    "listen",
    "http",
    "grpc",
    "policies",
    "limits",
    "max",
    "per",
    "algorithm",
    "precision",
    "burst",
    "align",
    "on_store_error",
    "open",
    "closed",
    "local",
    "fixed_window",
    "sliding_window",
    "token_bucket",
    "concurrency",
    "rls",
    "config_dir",
    "xds",
    "address",
    "node_id",
    "shadow_mode",
    "quota_mode",
    "response_headers",
    "ietf",
    "draft03",
    "merge_domains",
    "ignore_dot_files",
    "rlqs",
    "reporting_interval",
    "assignment_ttl",
    "abandon_after",
    "unmatched",
    "allow_all",
    "deny_all",
    "buckets",
    "match",
    "policy",
    "key",
    "{tenant}",
    "store",
    "backend",
    "memory",
    "redis",
    "shards",
    "primary",
    "replicas",
    "cluster",
    "sentinel",
    "master",
    "nodes",
    "read_from",
    "timeout",
    "clock",
    "app",
    "key_prefix",
    "auth",
    "username",
    "password_env",
    "password_file",
    "tls",
    "ca_file",
    "enabled",
    "batch",
    "auto",
    "max_error",
    "admin",
    "tokens_env",
    "tokens_file",
    "protect_metrics",
    "1ms",
    "250ms",
    "1s",
    "5m",
    "1h",
    "1d",
    "366d",
    "367d",
    "0s",
    "10",
    "1s ",
    "18446744073709551615ms",
    "7ms",
    "127.0.0.1:8080",
    "[::1]:0",
    "localhost:80",
    "redis://127.0.0.1:6379",
    "redis://a:b@h:1",
    "rediss://h",
    "sluice:{x}",
    "{ max: 1, per: 1s }",
    "[{ max: 1, per: 1s }]",
];

fn check_outcome(text: &str, tally: &Tally) {
    match Config::parse(FILE, text) {
        Ok(config) => {
            round_trip(&config);
            tally.input(true);
        }
        Err(e) => {
            names_where(&e, text);
            tally.input(false);
        }
    }
}

/// An error names the file, and a line or the section and field at fault.
fn names_where(e: &ConfigError, text: &str) {
    assert_eq!(e.file, FILE, "{e}");
    assert!(!e.message.trim().is_empty(), "an empty message: {e:?}");
    if let Some((line, column)) = e.line {
        assert!(line >= 1 && column >= 1, "line {line} column {column}: {e}");
    } else {
        assert!(
            SECTIONS.iter().any(|s| e.message.starts_with(s)),
            "an error with neither a line nor a field: {e}\nin {text:?}"
        );
    }
}

/// The policies of a loaded configuration, written back out as a file (JSON, which YAML
/// reads), load again to the same policies.
fn round_trip(config: &Config) {
    let mut policies = serde_json::Map::new();
    for p in &config.policies {
        let limits: Vec<Value> = p
            .limits()
            .iter()
            .map(|l| {
                let mut v = json!({
                    "max": l.max(),
                    "per": format!("{}ms", l.per_ms()),
                    "algorithm": l.algorithm().as_str(),
                });
                match l.algorithm() {
                    Algorithm::SlidingWindow => {
                        v["precision"] = json!(format!("{}ms", l.precision_ms()));
                    }
                    Algorithm::TokenBucket => v["burst"] = json!(l.burst()),
                    Algorithm::FixedWindow => v["align"] = json!(l.align()),
                    _ => {}
                }
                v
            })
            .collect();
        let mode = match p.failure_mode() {
            FailureMode::Open => "open",
            FailureMode::Closed => "closed",
            _ => "local",
        };
        policies.insert(
            p.name().to_owned(),
            json!({"on_store_error": mode, "limits": limits}),
        );
    }
    let text = json!({ "policies": policies }).to_string();
    let again = match Config::parse(FILE, &text) {
        Ok(c) => c,
        Err(e) => panic!("a loaded configuration does not load again: {e}\n{text}"),
    };
    assert_eq!(again.policies.len(), config.policies.len());
    for (a, b) in config.policies.iter().zip(&again.policies) {
        assert_eq!(a.name(), b.name());
        assert_eq!(a.limits(), b.limits(), "{text}");
        assert_eq!(a.failure_mode(), b.failure_mode());
    }
    let mut names: Vec<&str> = config.policies.iter().map(|p| p.name()).collect();
    let sorted = {
        let mut n = names.clone();
        n.sort_unstable();
        n
    };
    assert_eq!(names, sorted, "policies are in name order");
    names.dedup();
    assert_eq!(names.len(), config.policies.len(), "a policy named twice");
}

/// Any bytes, as the text of a configuration file.
#[test]
fn text() {
    let tally = Tally::new("config::text");
    check!()
        .with_test_time(budget())
        .for_each(|bytes: &[u8]| check_outcome(&String::from_utf8_lossy(bytes), &tally));
}

/// One of the corpus's files, edited.
#[derive(Debug, arbitrary::Arbitrary)]
struct Edited {
    seed: u8,
    edits: Many<Edit, 8>,
}

/// Valid configurations, structurally edited: lines lost, moved, doubled, values and keys
/// replaced with words of the format and scalars YAML reads in surprising ways.
#[test]
fn edits() {
    let tally = Tally::new("config::edits");
    let seeds = seeds("config__text");
    assert!(!seeds.is_empty(), "the config corpus is missing");
    let words: Vec<&str> = WORDS.iter().chain(YAML_WORDS).copied().collect();
    check!().with_test_time(budget()).for_each(|bytes: &[u8]| {
        let Some(input) = sluice_fuzz::structured::<Edited>(bytes) else {
            return;
        };
        let (_, text) = &seeds[usize::from(input.seed) % seeds.len()];
        check_outcome(&apply_edits(text, &input.edits, &words), &tally);
    });
}

/// The corpus says which of its seeds are valid: those load, the others fail naming where.
#[test]
fn corpus_seeds_load_as_named() {
    let seeds = seeds("config__text");
    assert!(seeds.len() >= 10, "{} seeds", seeds.len());
    for (name, text) in &seeds {
        match Config::parse(FILE, text) {
            Ok(config) => {
                assert!(name.starts_with("valid_"), "{name} loads");
                round_trip(&config);
            }
            Err(e) => {
                assert!(name.starts_with("invalid_"), "{name}: {e}");
                names_where(&e, text);
            }
        }
    }
}
