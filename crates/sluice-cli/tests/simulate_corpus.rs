//! The log corpus of `scripts/gen-logs`: a realistic log of each format
//! `sluice simulate` reads, generated with its known answer, is run through the real binary,
//! named and detected, plain and gzip; the keys, times, counts and skipped lines must be the
//! generator's.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Runs `sluice simulate --json` on a log; the report.
fn simulate(policy: &str, log: &Path, flags: &[String]) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args([
            "simulate", "--json", "--top", "10", "--policy", policy, "--log",
        ])
        .arg(log)
        .args(flags)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "sluice simulate --log {} {flags:?}: {}",
        log.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// What the report says, in the shape of the generator's answer.
fn observed(r: &Value) -> Value {
    let p = &r["policies"][0];
    let log = &r["log"];
    let reasons: serde_json::Map<String, Value> = log["skip_reasons"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| (s["reason"].as_str().unwrap().to_owned(), s["lines"].clone()))
        .collect();
    let top: Vec<Value> = p["top_keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| serde_json::json!([k["key"], k["admitted"], k["denied"]]))
        .collect();
    serde_json::json!({
        "events": r["events"],
        "keys": r["keys"],
        "start_ms": r["start_ms"],
        "duration_ms": r["duration_ms"],
        "lines": log["lines"],
        "skipped": log["skipped"],
        "skip_reasons": reasons,
        "admitted": p["admitted"],
        "denied": p["denied"],
        "first_denial_ms": p["first_denial_ms"],
        "top_keys": top,
    })
}

#[test]
fn every_generated_log_is_read_with_its_known_answer() {
    let dir = tempfile::tempdir().unwrap();
    let generated = Command::new("python3")
        .arg(root().join("scripts/gen-logs"))
        .arg("--out")
        .arg(dir.path())
        .output()
        .expect("python3 runs scripts/gen-logs (scripts/test installs python3)");
    assert!(
        generated.status.success(),
        "scripts/gen-logs: {}",
        String::from_utf8_lossy(&generated.stderr)
    );
    let answers: Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("answers.json")).unwrap()).unwrap();
    let policy = answers["policy"].as_str().unwrap();
    let cases = answers["cases"].as_array().unwrap();
    assert_eq!(cases.len(), 13);
    let mut failures = Vec::new();
    for case in cases {
        let name = case["name"].as_str().unwrap();
        let file = dir.path().join(case["file"].as_str().unwrap());
        let flags: Vec<String> = case["flags"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f.as_str().unwrap().to_owned())
            .collect();
        // Named, then detected (the flags without --format), then the gzip copy.
        let detected_flags: Vec<String> = flags
            .chunks(2)
            .filter(|pair| pair[0] != "--format")
            .flatten()
            .cloned()
            .collect();
        let mut gz = file.clone().into_os_string();
        gz.push(".gz");
        for (how, log, flags, format) in [
            ("named", file.clone(), flags.clone(), None),
            (
                "detected",
                file.clone(),
                detected_flags.clone(),
                Some(&case["detected"]),
            ),
            ("gzip", PathBuf::from(gz), detected_flags, None),
        ] {
            let r = simulate(policy, &log, &flags);
            if let Some(format) = format
                && &r["log"]["format"] != format
            {
                failures.push(format!(
                    "{name} ({how}): detected {} where {format} was expected",
                    r["log"]["format"]
                ));
            }
            let got = observed(&r);
            if got != case["expect"] {
                failures.push(format!(
                    "{name} ({how}):\n  got      {got}\n  expected {}",
                    case["expect"]
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
