//! The Envoy configurations in docs/server.md (RLQS) and docs/deploying.md (the rate limit
//! filter) are valid Envoy bootstraps: each is read with
//! Envoy's own message descriptors (the descriptor set envoy-types ships, `types.bin`), with
//! unknown fields refused and every `typed_config` resolved by its `@type`, as Envoy reads it.
//! No Envoy binary is needed, and a misspelt field or a wrong type URL fails here;
//! crates/sluice-cli/tests/real_clients runs the same bootstraps in a real Envoy.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use std::path::PathBuf;

use prost_reflect::{DescriptorPool, DynamicMessage};

/// The host's target tuple: `cargo metadata --offline` resolves only what this platform
/// builds, so packages of other platforms (never downloaded here) are not asked for.
fn host_tuple() -> String {
    let mut rustc = std::process::Command::new("rustc");
    let out = stdout_of(
        rustc.args(["--print", "host-tuple"]),
        "rustc --print host-tuple",
    );
    String::from_utf8(out).unwrap().trim().to_owned()
}

/// The standard output of `command` (`what`), which must succeed.
fn stdout_of(command: &mut std::process::Command, what: &str) -> Vec<u8> {
    let out = command.output().expect(what);
    assert!(
        out.status.success(),
        "{what}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// Envoy's descriptor set, from the envoy-types package cargo resolved for this workspace.
pub(crate) fn envoy_descriptors() -> DescriptorPool {
    let mut cargo = std::process::Command::new(env!("CARGO"));
    cargo
        .args(["metadata", "--format-version", "1", "--offline"])
        .args(["--filter-platform", &host_tuple()])
        .current_dir(env!("CARGO_MANIFEST_DIR"));
    let metadata: serde_json::Value =
        serde_json::from_slice(&stdout_of(&mut cargo, "cargo metadata")).unwrap();
    let manifest = metadata["packages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "envoy-types")
        .and_then(|p| p["manifest_path"].as_str())
        .expect("envoy-types among the packages");
    let path = PathBuf::from(manifest)
        .parent()
        .unwrap()
        .join("src/generated/types.bin");
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    DescriptorPool::decode(bytes.as_slice()).unwrap()
}

/// The YAML block that follows `heading` in docs/server.md.
fn yaml_after(heading: &str) -> String {
    yaml_in("server.md", heading)
}

/// The YAML block that follows `heading` in `docs/<doc>`.
fn yaml_in(doc: &str, heading: &str) -> String {
    let path = format!("{}/../../docs/{doc}", env!("CARGO_MANIFEST_DIR"));
    let doc = std::fs::read_to_string(path).unwrap();
    let section = doc.split(heading).nth(1).unwrap();
    let block = section.split("```yaml\n").nth(1).unwrap();
    block.split("```").next().unwrap().to_owned()
}

/// Reads `yaml` as an Envoy `Bootstrap`, as Envoy would.
fn bootstrap(pool: &DescriptorPool, yaml: &str) -> Result<DynamicMessage, String> {
    let value: serde_json::Value = serde_yaml_ng::from_str(yaml).map_err(|e| e.to_string())?;
    let json = serde_json::to_string(&value).unwrap();
    let desc = pool
        .get_message_by_name("envoy.config.bootstrap.v3.Bootstrap")
        .unwrap();
    let mut de = serde_json::Deserializer::from_str(&json);
    DynamicMessage::deserialize(desc, &mut de).map_err(|e| e.to_string())
}

/// `yaml` (of `docs/DOC`) read as Envoy's bootstrap and written back as JSON, which names
/// each of `expected`.
fn read_back(pool: &DescriptorPool, yaml: &str, doc: &str, expected: &[&str]) {
    let config = bootstrap(pool, yaml).unwrap_or_else(|e| panic!("docs/{doc}: {e}"));
    let text = serde_json::to_string(&config).unwrap();
    for expected in expected {
        assert!(text.contains(expected), "{expected} was not read");
    }
}

/// The check has teeth: `yaml` with any one of the `(from, to)` changes is refused.
fn refused_when_changed(pool: &DescriptorPool, yaml: &str, changes: &[(&str, &str)]) {
    for (from, to) in changes {
        assert!(yaml.contains(from), "{from}");
        let wrong = yaml.replacen(from, to, 1);
        assert!(bootstrap(pool, &wrong).is_err(), "`{to}` was accepted");
    }
}

#[test]
fn the_envoy_configuration_of_the_rlqs_section_is_a_valid_bootstrap() {
    let pool = envoy_descriptors();
    let yaml = yaml_after("### Configuring Envoy");
    // Written back as Envoy's JSON: what was read, typed configs included.
    let expected = [
        "RateLimitQuotaFilterConfig",
        "RateLimitQuotaBucketSettings",
        "rlqsServer",
        "bucketIdBuilder",
    ];
    read_back(&pool, &yaml, "server.md", &expected);
    // Envoy's reporting interval is the one Sluice's rlqs section expects.
    let sluice = yaml_after("### Configuring Sluice");
    assert!(sluice.contains("reporting_interval: 5s"), "{sluice}");
    assert_eq!(yaml.matches("reporting_interval: 5s").count(), 2, "{yaml}");

    // The check has teeth: a misspelt field, a wrong type URL or a value of the wrong kind
    // is refused.
    let changes = [
        ("reporting_interval: 5s", "reporting_intervall: 1s"),
        (
            "rate_limit_quota.v3.RateLimitQuotaFilterConfig",
            "rate_limit_quota.v3.RateLimitQuotaFilterConfiguration",
        ),
        ("blanket_rule: ALLOW_ALL", "blanket_rule: ALLOW_SOME"),
    ];
    refused_when_changed(&pool, &yaml, &changes);
}

#[test]
fn the_envoy_configuration_of_the_deploying_guide_is_a_valid_bootstrap() {
    let pool = envoy_descriptors();
    let yaml = yaml_in("deploying.md", "### Envoy\n");
    let expected = [
        "ratelimit.v3.RateLimit",
        "rateLimitService",
        "remoteAddress",
        "http2ProtocolOptions",
        "sluice-headless",
    ];
    read_back(&pool, &yaml, "deploying.md", &expected);
    // The domain is the one of the Kubernetes base's rule file.
    let rules = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../deploy/kubernetes/base/rules/edge.yaml"
    ))
    .unwrap();
    assert!(yaml.contains("domain: edge") && rules.contains("domain: edge"));
    let changes = [
        ("failure_mode_deny: false", "failure_mode_denied: false"),
        ("transport_api_version: V3", "transport_api_version: V4"),
    ];
    refused_when_changed(&pool, &yaml, &changes);
}
