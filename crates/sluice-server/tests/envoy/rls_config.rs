//! The Envoy rate limit service configuration: the reference service's documented examples.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs;
use std::path::Path;

use crate::parity_config::{BASIC_CONFIG, SHARE_THRESHOLD, get as limit, load, load_err};
use sluice_envoy_rules::{LoadOptions, Match, RlsConfig, RlsConfigError, Unit};

fn config(yaml: &str) -> RlsConfig {
    load("test.yaml", yaml)
}

fn error(yaml: &str) -> RlsConfigError {
    load_err(&[("cfg/api.yaml", yaml)], false)
}

fn assert_rule(m: &Match, requests_per_unit: u32, unit: Unit) {
    assert_eq!(
        (m.rule.requests_per_unit, m.rule.unit),
        (requests_per_unit, Some(unit)),
        "{m:?}"
    );
    assert!(!m.rule.unlimited);
}

// ---------------------------------------------------------------------------------------------
// The README's examples.
// ---------------------------------------------------------------------------------------------

const EXAMPLE_1: &str = "\
domain: mongo_cps
descriptors:
  - key: database
    value: users
    rate_limit:
      unit: second
      requests_per_unit: 500

  - key: database
    value: default
    rate_limit:
      unit: second
      requests_per_unit: 500
";

#[test]
fn example_1_key_and_value() {
    let config = config(EXAMPLE_1);
    assert_eq!(config.domains().collect::<Vec<_>>(), ["mongo_cps"]);
    let users = limit(&config, "mongo_cps", &[("database", "users")]);
    assert_rule(&users, 500, Unit::Second);
    assert_eq!(users.counter_key, "mongo_cps_database_users_");
    assert_eq!(users.rule.full_key, "mongo_cps.database_users");
    assert_eq!(users.rule.path, "descriptors[0]");
    assert_eq!(users.rule.line, Some(3));
    assert_eq!(users.rule.location(), "test.yaml:3: descriptors[0]");
    let default = limit(&config, "mongo_cps", &[("database", "default")]);
    assert_eq!(default.counter_key, "mongo_cps_database_default_");
    assert_eq!(default.rule.line, Some(9));
    // Neither value nor a key-only descriptor: no limit.
    assert!(
        config
            .get_limit("mongo_cps", &[("database", "orders")])
            .is_none()
    );
    // Unknown domain, or no entries at all: no limit.
    assert!(
        config
            .get_limit("other", &[("database", "users")])
            .is_none()
    );
    assert!(config.get_limit::<&str, &str>("mongo_cps", &[]).is_none());
}

const EXAMPLE_2: &str = "\
domain: messaging
descriptors:
  # Only allow 5 marketing messages a day
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit:
          unit: day
          requests_per_unit: 5

  # Only allow 100 messages a day to any unique phone number
  - key: to_number
    rate_limit:
      unit: day
      requests_per_unit: 100
";

#[test]
fn example_2_nested_descriptors_and_per_value_counters() {
    let config = config(EXAMPLE_2);
    let marketing = [("message_type", "marketing"), ("to_number", "2061111111")];
    let m = limit(&config, "messaging", &marketing);
    assert_rule(&m, 5, Unit::Day);
    assert_eq!(
        m.counter_key,
        "messaging_message_type_marketing_to_number_2061111111_"
    );
    assert_eq!(
        m.rule.full_key,
        "messaging.message_type_marketing.to_number"
    );
    assert_eq!(m.stats_key, "messaging.message_type_marketing.to_number");
    assert_eq!(m.rule.path, "descriptors[0].descriptors[0]");
    // Each number gets its own 5 a day.
    let other = limit(
        &config,
        "messaging",
        &[("message_type", "marketing"), ("to_number", "2062222222")],
    );
    assert_eq!(
        other.counter_key,
        "messaging_message_type_marketing_to_number_2062222222_"
    );
    assert!(std::sync::Arc::ptr_eq(&m.rule, &other.rule));

    // The top-level rule: 100 a day to any one number.
    let any = limit(&config, "messaging", &[("to_number", "2061111111")]);
    assert_rule(&any, 100, Unit::Day);
    assert_eq!(any.counter_key, "messaging_to_number_2061111111_");

    // The placeholder has no limit of its own.
    assert!(
        config
            .get_limit("messaging", &[("message_type", "marketing")])
            .is_none()
    );
    // Another message type does not reach the nested rule.
    assert!(
        config
            .get_limit(
                "messaging",
                &[
                    ("message_type", "transactional"),
                    ("to_number", "2061111111")
                ]
            )
            .is_none()
    );

    // One request with both descriptors: both rules apply.
    let request = [
        vec![("message_type", "marketing"), ("to_number", "2061111111")],
        vec![("to_number", "2061111111")],
    ];
    let all = config.get_limits("messaging", &request);
    assert_eq!(all.len(), 2);
    assert_eq!(all[0].as_ref().unwrap().rule.requests_per_unit, 5);
    assert_eq!(all[1].as_ref().unwrap().rule.requests_per_unit, 100);
}

const EXAMPLE_3: &str = "\
domain: edge_proxy_per_ip
descriptors:
  - key: remote_address
    rate_limit:
      unit: second
      requests_per_unit: 10

  # Black list IP
  - key: remote_address
    value: 50.0.0.5
    rate_limit:
      unit: second
      requests_per_unit: 0
";

#[test]
fn example_3_most_specific_match_and_one_counter_per_address() {
    let config = config(EXAMPLE_3);
    let a = limit(
        &config,
        "edge_proxy_per_ip",
        &[("remote_address", "50.0.0.1")],
    );
    assert_rule(&a, 10, Unit::Second);
    assert_eq!(a.counter_key, "edge_proxy_per_ip_remote_address_50.0.0.1_");
    let b = limit(
        &config,
        "edge_proxy_per_ip",
        &[("remote_address", "50.0.0.2")],
    );
    assert_eq!(b.counter_key, "edge_proxy_per_ip_remote_address_50.0.0.2_");
    assert!(std::sync::Arc::ptr_eq(&a.rule, &b.rule));
    assert_eq!(a.stats_key, "edge_proxy_per_ip.remote_address");

    // Key and value win over the key alone: the blocked address has a limit of 0.
    let blocked = limit(
        &config,
        "edge_proxy_per_ip",
        &[("remote_address", "50.0.0.5")],
    );
    assert_rule(&blocked, 0, Unit::Second);
    assert_eq!(
        blocked.rule.full_key,
        "edge_proxy_per_ip.remote_address_50.0.0.5"
    );
}

#[test]
fn example_4_the_request_must_be_as_deep_as_the_rule() {
    let shallow = config(
        "\
domain: example4
descriptors:
  - key: key
    value: value
    rate_limit:
      requests_per_unit: 300
      unit: second
",
    );
    let request = [("key", "value"), ("subkey", "subvalue")];
    assert!(shallow.get_limit("example4", &request).is_none());
    assert!(shallow.get_limit("example4", &[("key", "value")]).is_some());

    let nested = config(
        "\
domain: example4
descriptors:
  - key: key
    value: value
    descriptors:
      - key: subkey
        rate_limit:
          requests_per_unit: 300
          unit: second
",
    );
    let m = limit(&nested, "example4", &request);
    assert_rule(&m, 300, Unit::Second);
    assert_eq!(m.counter_key, "example4_key_value_subkey_subvalue_");
    assert!(nested.get_limit("example4", &[("key", "value")]).is_none());
}

#[test]
fn example_5_unlimited() {
    let config = config(
        "\
domain: internal
descriptors:
  - key: ldap
    rate_limit:
      unlimited: true

  - key: azure
    rate_limit:
      unit: minute
      requests_per_unit: 100
",
    );
    let ldap = limit(&config, "internal", &[("ldap", "anything")]);
    assert!(ldap.rule.unlimited);
    assert_eq!(ldap.rule.unit, None);
    assert_eq!(ldap.rule.window_ms(), None);
    assert_eq!(ldap.reference_cache_key("", 1234), None);
    let azure = limit(&config, "internal", &[("azure", "tenant")]);
    assert_rule(&azure, 100, Unit::Minute);
    assert_eq!(azure.rule.window_ms(), Some(60_000));
}

#[test]
fn example_6_shadow_mode() {
    let config = config(
        "\
domain: example6
descriptors:
  - key: service
    descriptors:
      - key: user
        value: user-a
        rate_limit:
          requests_per_unit: 10
          unit: second
        shadow_mode: true
      - key: user
        value: user-b
        rate_limit:
          requests_per_unit: 20
          unit: second
",
    );
    let a = limit(
        &config,
        "example6",
        &[("service", "auth-service"), ("user", "user-a")],
    );
    assert!(a.rule.shadow_mode);
    assert_rule(&a, 10, Unit::Second);
    // Counted as usual.
    assert_eq!(a.counter_key, "example6_service_auth-service_user_user-a_");
    let b = limit(
        &config,
        "example6",
        &[("service", "auth-service"), ("user", "user-b")],
    );
    assert!(!b.rule.shadow_mode);
    assert_rule(&b, 20, Unit::Second);
}

/// README example 7: a rule that replaces another by name.
pub(crate) const EXAMPLE_7: &str = "\
domain: example7
descriptors:
  - key: key_1
    value: value_1
    descriptors:
      - key: user
        value: bkthomps
        rate_limit:
          name: specific_limit
          requests_per_unit: 5
          unit: second
  - key: key_2
    value: value_2
    descriptors:
      - key: user
        value: bkthomps
        rate_limit:
          replaces:
            - name: specific_limit
          requests_per_unit: 10
          unit: second
";

#[test]
fn example_7_replaces() {
    let config = config(EXAMPLE_7);
    let first = vec![("key_1", "value_1"), ("user", "bkthomps")];
    let second = vec![("key_2", "value_2"), ("user", "bkthomps")];

    // Alone, each rule applies.
    let only_first = config.get_limits("example7", std::slice::from_ref(&first));
    assert_eq!(only_first[0].as_ref().unwrap().rule.requests_per_unit, 5);
    let only_second = config.get_limits("example7", std::slice::from_ref(&second));
    assert_eq!(only_second[0].as_ref().unwrap().rule.requests_per_unit, 10);
    assert_eq!(
        only_second[0].as_ref().unwrap().rule.replaces,
        ["specific_limit"]
    );

    // Together, the 10/s rule replaces the 5/s one, which is neither counted nor checked.
    let both = config.get_limits("example7", &[first.clone(), second.clone()]);
    assert!(both[0].is_none());
    assert_eq!(both[1].as_ref().unwrap().rule.requests_per_unit, 10);
    // In either order.
    let both = config.get_limits("example7", &[second, first.clone()]);
    assert_eq!(both[0].as_ref().unwrap().rule.requests_per_unit, 10);
    assert!(both[1].is_none());
    // get_limit alone does not apply replaces.
    assert_eq!(
        limit(&config, "example7", &first).rule.name.as_deref(),
        Some("specific_limit")
    );
}

#[test]
fn replaces_from_an_unlimited_rule_and_of_an_unlimited_rule() {
    let config = config(
        "\
domain: d
descriptors:
  - key: a
    rate_limit:
      unlimited: true
      name: free
      replaces:
        - name: paid
  - key: b
    rate_limit:
      name: paid
      unit: minute
      requests_per_unit: 1
  - key: c
    rate_limit:
      replaces:
        - name: free
      unit: minute
      requests_per_unit: 1
",
    );
    // An unlimited rule's `replaces` still apply.
    let r = config.get_limits("d", &[vec![("a", "1")], vec![("b", "1")]]);
    assert!(r[0].as_ref().unwrap().rule.unlimited);
    assert!(r[1].is_none());
    // An unlimited rule is never dropped (the reference answers it OK regardless).
    let r = config.get_limits("d", &[vec![("a", "1")], vec![("c", "1")]]);
    assert!(r[0].as_ref().unwrap().rule.unlimited);
    assert!(r[1].is_some());
}

#[test]
fn example_8_detailed_metric() {
    let config = config(
        "\
domain: example8
descriptors:
  - key: key1
    detailed_metric: true
    rate_limit:
      unit: minute
      requests_per_unit: 10
  - key: key1
    value: value1
    rate_limit:
      unit: minute
      requests_per_unit: 20
",
    );
    let a = limit(&config, "example8", &[("key1", "unspecified_value")]);
    assert!(a.rule.detailed_metric);
    assert_eq!(a.stats_key, "example8.key1_unspecified_value");
    assert_eq!(a.rule.full_key, "example8.key1");
    let b = limit(&config, "example8", &[("key1", "unspecified_value2")]);
    assert_eq!(b.stats_key, "example8.key1_unspecified_value2");
    let c = limit(&config, "example8", &[("key1", "value1")]);
    assert_rule(&c, 20, Unit::Minute);
    assert_eq!(c.stats_key, "example8.key1_value1");
    // Only metrics change: the counters are per value anyway.
    assert_eq!(a.counter_key, "example8_key1_unspecified_value_");
}

#[test]
fn example_9_wildcard() {
    let config = config(
        "\
domain: example9
descriptors:
  - key: key1
    value: value*
    rate_limit:
      unit: minute
      requests_per_unit: 20
",
    );
    let a = limit(&config, "example9", &[("key1", "value1")]);
    let b = limit(&config, "example9", &[("key1", "value2")]);
    assert_rule(&a, 20, Unit::Minute);
    assert!(std::sync::Arc::ptr_eq(&a.rule, &b.rule));
    // Each value counts apart; the metric shows the pattern.
    assert_eq!(a.counter_key, "example9_key1_value1_");
    assert_eq!(b.counter_key, "example9_key1_value2_");
    assert_eq!(a.stats_key, "example9.key1_value*");
    // A prefix match: the bare prefix matches, other values do not.
    assert!(config.get_limit("example9", &[("key1", "value")]).is_some());
    assert!(config.get_limit("example9", &[("key1", "valu")]).is_none());
    assert!(config.get_limit("example9", &[("key1", "other")]).is_none());
}

// ---------------------------------------------------------------------------------------------
// Matching rules from the reference's tests (test/config/config_test.go).
// ---------------------------------------------------------------------------------------------

#[test]
fn basic_config_lookups() {
    // The reference's basic configuration with two units in other letter cases.
    let yaml = BASIC_CONFIG.replace("unit: hour", "unit: HOUR").replace(
        "unit: day\n      requests_per_unit: 1\n",
        "unit: Day\n      requests_per_unit: 1\n",
    );
    assert!(yaml.contains("unit: HOUR") && yaml.contains("unit: Day"));
    let config = config(&yaml);
    let d = "test-domain";
    assert!(config.get_limit(d, &[("key1", "something")]).is_none());
    // A key/value with nested descriptors but no limit of its own.
    assert!(config.get_limit(d, &[("key1", "value1")]).is_none());
    // Unknown nested key.
    assert!(
        config
            .get_limit(d, &[("key2", "value2"), ("subkey", "subvalue")])
            .is_none()
    );
    // A value nested under key5 that is not configured: the limit of key5 is one level up,
    // so it does not apply.
    assert!(
        config
            .get_limit(d, &[("key5", "value5"), ("subkey5", "subvalue")])
            .is_none()
    );
    assert_rule(&limit(&config, d, &[("key5", "value5")]), 15, Unit::Day);
    assert_rule(
        &limit(&config, d, &[("key5", "value5"), ("subkey5", "subvalue5")]),
        25,
        Unit::Day,
    );

    let m = limit(&config, d, &[("key1", "value1"), ("subkey1", "something")]);
    assert_rule(&m, 5, Unit::Second);
    assert_eq!(m.rule.full_key, "test-domain.key1_value1.subkey1");
    let m = limit(&config, d, &[("key1", "value1"), ("subkey1", "subvalue1")]);
    assert_rule(&m, 10, Unit::Second);
    assert_eq!(m.rule.full_key, "test-domain.key1_value1.subkey1_subvalue1");

    assert_rule(
        &limit(&config, d, &[("key2", "something")]),
        20,
        Unit::Minute,
    );
    assert_rule(&limit(&config, d, &[("key2", "value2")]), 30, Unit::Minute);
    // The whitelisted value wins over the key-only default and has no limit.
    assert!(config.get_limit(d, &[("key2", "value3")]).is_none());
    // Units in any letter case.
    assert_rule(&limit(&config, d, &[("key3", "foo")]), 1, Unit::Hour);
    assert_rule(&limit(&config, d, &[("key4", "foo")]), 1, Unit::Day);
    // Entries left after a leaf: no limit.
    assert!(
        config
            .get_limit(d, &[("key3", "foo"), ("more", "x")])
            .is_none()
    );
}

#[test]
fn wildcards_precedence_and_shapes() {
    let config = config(
        "\
domain: test-domain
descriptors:
  - key: wild
    value: foo*
    rate_limit:
      unit: minute
      requests_per_unit: 20
  - key: wild
    value: fo*
    rate_limit:
      unit: minute
      requests_per_unit: 21
  - key: wild
    value: foo2
    rate_limit:
      unit: minute
      requests_per_unit: 22
  - key: wild
    rate_limit:
      unit: minute
      requests_per_unit: 23
  - key: noWild
    value: foo
    rate_limit:
      unit: minute
      requests_per_unit: 20
  - key: midWild
    value: bar*b
    rate_limit:
      unit: minute
      requests_per_unit: 24
  - key: multi
    value: svc*ep*rpc
    rate_limit:
      unit: minute
      requests_per_unit: 25
",
    );
    let d = "test-domain";
    // The exact value wins over every wildcard.
    assert_eq!(
        limit(&config, d, &[("wild", "foo2")])
            .rule
            .requests_per_unit,
        22
    );
    // Among wildcards, the first in the file that matches.
    assert_eq!(
        limit(&config, d, &[("wild", "foo1")])
            .rule
            .requests_per_unit,
        20
    );
    assert_eq!(
        limit(&config, d, &[("wild", "fox")]).rule.requests_per_unit,
        21
    );
    // A wildcard wins over the key-only default; the default takes the rest.
    assert_eq!(
        limit(&config, d, &[("wild", "bar")]).rule.requests_per_unit,
        23
    );
    // A value without `*` is exact.
    assert!(config.get_limit(d, &[("noWild", "foo1")]).is_none());
    // `*` in the middle, and several of them.
    assert_eq!(
        limit(&config, d, &[("midWild", "barab")])
            .rule
            .requests_per_unit,
        24
    );
    assert!(config.get_limit(d, &[("midWild", "bara")]).is_none());
    assert_eq!(
        limit(&config, d, &[("multi", "svc-a-ep-b-rpc")])
            .rule
            .requests_per_unit,
        25
    );
    assert!(config.get_limit(d, &[("multi", "svc-rpc")]).is_none());
}

#[test]
fn share_threshold_shares_one_counter_per_pattern() {
    // The reference's share_threshold.yaml.
    let config = config(SHARE_THRESHOLD);
    let d = "test-domain";
    let a = limit(&config, d, &[("files", "files/a.pdf")]);
    let b = limit(&config, d, &[("files", "files/b.csv")]);
    assert_eq!(a.counter_key, "test-domain_files_files/*_");
    assert_eq!(a.counter_key, b.counter_key);
    assert_eq!(
        a.reference_cache_key("", 1234).unwrap(),
        "test-domain_files_files/*_1200"
    );
    let n = limit(
        &config,
        d,
        &[("nested", "parent"), ("files", "nested/x.txt")],
    );
    assert_eq!(n.counter_key, "test-domain_nested_parent_files_nested/*_");
    // An explicit value wins over the shared wildcard and counts alone.
    let exact = limit(&config, d, &[("file", "test1")]);
    assert_eq!(exact.rule.requests_per_unit, 50);
    assert_eq!(exact.counter_key, "test-domain_file_test1_");
    assert_eq!(
        limit(&config, d, &[("file", "test2")]).counter_key,
        "test-domain_file_test*_"
    );
}

#[test]
fn value_to_metric_changes_only_the_statistics_key() {
    let config = config(
        "\
domain: domain
descriptors:
  - key: route
    value_to_metric: true
    descriptors:
      - key: http_method
        value_to_metric: true
        descriptors:
          - key: subject_id
            rate_limit:
              unit: minute
              requests_per_unit: 60
",
    );
    let m = limit(
        &config,
        "domain",
        &[
            ("route", "api"),
            ("http_method", "GET"),
            ("subject_id", "123"),
        ],
    );
    assert_eq!(m.stats_key, "domain.route_api.http_method_GET.subject_id");
    assert_eq!(m.rule.full_key, "domain.route.http_method.subject_id");
    assert_eq!(
        m.counter_key,
        "domain_route_api_http_method_GET_subject_id_123_"
    );
}

#[test]
fn the_reference_cache_key_ends_with_the_window_start() {
    let config = config(
        "\
domain: domain
descriptors:
  - key: key
    rate_limit:
      unit: second
      requests_per_unit: 10
  - key: hourly
    rate_limit:
      unit: hour
      requests_per_unit: 10
",
    );
    let m = limit(&config, "domain", &[("key", "value")]);
    assert_eq!(
        m.reference_cache_key("", 1234).unwrap(),
        "domain_key_value_1234"
    );
    assert_eq!(
        m.reference_cache_key("prefix:", 1234).unwrap(),
        "prefix:domain_key_value_1234"
    );
    let h = limit(&config, "domain", &[("hourly", "x")]);
    assert_eq!(
        h.reference_cache_key("", 7300).unwrap(),
        "domain_hourly_x_7200"
    );
}

#[test]
fn units_and_their_windows() {
    let mut yaml = String::from("domain: units\ndescriptors:\n");
    for unit in ["second", "minute", "hour", "day", "week", "month", "year"] {
        yaml.push_str(&format!(
            "  - key: {unit}\n    rate_limit:\n      unit: {unit}\n      requests_per_unit: 1\n"
        ));
    }
    let config = config(&yaml);
    let expected = [
        ("second", 1_000),
        ("minute", 60_000),
        ("hour", 3_600_000),
        ("day", 86_400_000),
        ("week", 604_800_000),
        ("month", 2_592_000_000),
        ("year", 31_536_000_000),
    ];
    for (unit, ms) in expected {
        let m = limit(&config, "units", &[(unit, "x")]);
        assert_eq!(m.rule.window_ms(), Some(ms), "{unit}");
        assert_eq!(m.rule.unit.unwrap().as_str(), unit);
    }
}

#[test]
fn scalars_read_as_yaml_1_1_like_the_reference() {
    let config = config(
        "\
domain: status
descriptors:
  - key: code
    value: 429
    shadow_mode: yes
    rate_limit:
      unit: minute
      requests_per_unit: 0x10
  - key: flag
    value: true
    rate_limit:
      unit: minute
      requests_per_unit: 1
",
    );
    let m = limit(&config, "status", &[("code", "429")]);
    assert!(m.rule.shadow_mode);
    assert_eq!(m.rule.requests_per_unit, 16);
    assert!(config.get_limit("status", &[("flag", "true")]).is_some());
    assert!(config.warnings().is_empty(), "{:?}", config.warnings());
}

#[test]
fn anchors_aliases_and_flow_style() {
    let config = config(
        "\
domain: d
descriptors:
  - key: a
    descriptors: &per_user
      - key: user
        rate_limit: {unit: second, requests_per_unit: 1}
  - key: b
    descriptors: *per_user
  - {key: c, value: x, rate_limit: {unit: hour, requests_per_unit: 3}}
",
    );
    let a = limit(&config, "d", &[("a", "1"), ("user", "u")]);
    let b = limit(&config, "d", &[("b", "1"), ("user", "u")]);
    assert_eq!(
        (a.rule.full_key.as_str(), a.rule.line),
        ("d.a.user", Some(5))
    );
    assert_eq!(b.rule.full_key, "d.b.user");
    let c = limit(&config, "d", &[("c", "x")]);
    assert_rule(&c, 3, Unit::Hour);
    assert_eq!(c.rule.line, Some(9));
}

#[test]
fn merging_domains_is_an_option() {
    let a = "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n      requests_per_unit: 1\n";
    let b = "domain: d\ndescriptors:\n  - key: b\n    rate_limit:\n      unit: second\n      requests_per_unit: 2\n";
    let err = RlsConfig::from_files(&[("a.yaml", a), ("b.yaml", b)]).unwrap_err();
    assert_eq!(err.file, "b.yaml");
    assert_eq!(err.line, Some(1));
    assert!(err.message.contains("already defined in a.yaml:1"), "{err}");

    let merge = LoadOptions {
        merge_domains: true,
        ..LoadOptions::default()
    };
    let config = RlsConfig::from_files_with(&[("a.yaml", a), ("b.yaml", b)], &merge).unwrap();
    assert_eq!(&*limit(&config, "d", &[("a", "1")]).rule.file, "a.yaml");
    assert_eq!(&*limit(&config, "d", &[("b", "1")]).rule.file, "b.yaml");
    // The same descriptor in both files is still a duplicate.
    let err = RlsConfig::from_files_with(&[("a.yaml", a), ("a2.yaml", a)], &merge).unwrap_err();
    assert_eq!((err.file.as_str(), err.line), ("a2.yaml", Some(3)));
    assert!(err.message.contains("already defined at a.yaml:3"), "{err}");
}

#[test]
fn warnings_for_what_the_reference_silently_ignores() {
    let config = config(
        "\
domain: d
descriptors:
  - key: a
    unit: minute
    rate_limit:
      unit: minute
      requests_per_unit: 1
  - key: b
    key: c
---
domain: ignored
",
    );
    // The misplaced `unit` is ignored; the duplicate key keeps its last value.
    assert!(config.get_limit("d", &[("a", "x")]).is_some());
    let messages: Vec<String> = config.warnings().iter().map(ToString::to_string).collect();
    assert_eq!(messages.len(), 3, "{messages:#?}");
    assert!(messages[0].starts_with("test.yaml: "), "{}", messages[0]);
    assert!(messages[0].contains("more than one YAML document"));
    assert!(messages[1].starts_with("test.yaml:4: key `unit` has no effect in descriptors[0]"));
    assert!(
        messages[2].starts_with("test.yaml:9: descriptors[1]: key `key` is written more than once")
    );
    assert_eq!(config.domains().collect::<Vec<_>>(), ["d"]);
}

// ---------------------------------------------------------------------------------------------
// Errors: each names the file, the line, the place in the file and the problem.
// ---------------------------------------------------------------------------------------------

#[test]
fn error_unknown_unit() {
    let err = error(
        "\
domain: api
descriptors:
  - key: user
    rate_limit:
      requests_per_unit: 5
      unit: fortnight
",
    );
    assert_eq!(
        err.to_string(),
        "cfg/api.yaml:6: descriptors[0].rate_limit.unit: \"fortnight\" is not a unit; \
         expected one of second, minute, hour, day, week, month, year"
    );
    assert_eq!(err.file, "cfg/api.yaml");
    assert_eq!(err.line, Some(6));
}

#[test]
fn error_missing_unit() {
    let err = error(
        "domain: api\ndescriptors:\n  - key: user\n    rate_limit:\n      requests_per_unit: 5\n",
    );
    assert_eq!(
        err.to_string(),
        "cfg/api.yaml:4: descriptors[0].rate_limit: `unit` is missing; \
         expected one of second, minute, hour, day, week, month, year"
    );
}

#[test]
fn error_unlimited_with_a_unit() {
    let err = error(
        "\
domain: api
descriptors:
  - key: user
    rate_limit:
      unlimited: true
      unit: day
      requests_per_unit: 5
",
    );
    assert_eq!(err.line, Some(6));
    assert!(
        err.message.starts_with(
            "descriptors[0].rate_limit: `unlimited: true` cannot be combined with `unit: day`"
        ),
        "{err}"
    );
}

#[test]
fn unlimited_with_requests_per_unit_loads_as_in_the_reference() {
    let config = config(
        "domain: api\ndescriptors:\n  - key: user\n    rate_limit:\n      unlimited: true\n      requests_per_unit: 5\n",
    );
    assert!(limit(&config, "api", &[("user", "u")]).rule.unlimited);
    assert_eq!(config.warnings().len(), 1);
    assert_eq!(config.warnings()[0].line, Some(6));
}

#[test]
fn error_unknown_key_with_a_suggestion() {
    let err = error(
        "\
domain: api
descriptors:
  - key: user
    ratelimit:
      unit: second
      requests_per_unit: 5
",
    );
    assert_eq!(err.line, Some(4));
    assert!(
        err.message
            .starts_with("descriptors[0]: unknown key `ratelimit`; did you mean `rate_limit`?"),
        "{err}"
    );
    let err = error(
        "domain: api\ndescriptors:\n  - key: user\n    rate_limit:\n      unit: second\n      requestsperunit: 5\n",
    );
    assert_eq!(err.line, Some(6));
    assert!(
        err.message.starts_with(
            "descriptors[0].rate_limit: unknown key `requestsperunit`; did you mean `requests_per_unit`?"
        ),
        "{err}"
    );
    // Misspelt at the top too.
    let err = error("domain: api\ndescriptor:\n  - key: user\n");
    assert_eq!(err.line, Some(2));
    assert!(err.message.contains("did you mean `descriptors`?"), "{err}");
}

#[test]
fn error_duplicate_descriptor_at_one_level() {
    let err = error(
        "\
domain: test-domain
descriptors:
  - key: key1
    value: value1
    rate_limit:
      unit: second
      requests_per_unit: 5
  - key: key1
    value: value1
",
    );
    assert_eq!(err.line, Some(8));
    assert_eq!(
        err.message,
        "descriptors[1]: duplicate descriptor: key \"key1\" with value \"value1\" (composite \
         key `key1_value1`) is already defined at cfg/api.yaml:3 (descriptors[0]) at the same \
         level"
    );
    // As in the reference, descriptors are told apart by `key_value`, so these two collide.
    let err = error("domain: d\ndescriptors:\n  - key: a_b\n  - key: a\n    value: b\n");
    assert_eq!(err.line, Some(4));
    assert!(err.message.contains("(composite key `a_b`)"), "{err}");
    // The same key at different levels, or with different values, is fine.
    config(
        "domain: d\ndescriptors:\n  - key: k\n    descriptors:\n      - key: k\n  - key: k\n    value: v\n",
    );
}

#[test]
fn error_duplicate_domain_across_files() {
    let err = RlsConfig::from_files(&[
        ("one.yaml", "domain: shared\n"),
        ("two.yaml", "# second\ndomain: shared\n"),
    ])
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        "two.yaml:2: domain: \"shared\" is already defined in one.yaml:1; each domain must be \
         defined in one file (or enable merging, the reference's MERGE_DOMAIN_CONFIG)"
    );
}

#[test]
fn error_empty_domain_and_empty_key() {
    let err = error("descriptors:\n  - key: a\n");
    assert_eq!(err.file, "cfg/api.yaml");
    assert!(err.message.starts_with("domain: missing or empty"), "{err}");
    let err = error("domain: \"\"\n");
    assert_eq!(err.line, Some(1));
    let err = error("domain: d\ndescriptors:\n  - value: v\n    rate_limit:\n      unit: second\n");
    assert_eq!(err.line, Some(3));
    assert!(
        err.message
            .starts_with("descriptors[0]: the descriptor has no `key`"),
        "{err}"
    );
}

#[test]
fn error_replaces() {
    let err = error(
        "\
domain: d
descriptors:
  - key: a
    rate_limit:
      name: mine
      unit: second
      requests_per_unit: 1
      replaces:
        - name: other
        - name: mine
",
    );
    assert_eq!(err.line, Some(10));
    assert!(
        err.message.starts_with(
            "descriptors[0].rate_limit.replaces[1]: a rate limit cannot replace itself"
        ),
        "{err}"
    );
    let err = error(
        "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n      replaces:\n        - name: \"\"\n",
    );
    assert_eq!(err.line, Some(7));
    assert!(err.message.contains("`name` is missing or empty"), "{err}");
}

#[test]
fn error_share_threshold_needs_a_wildcard() {
    let err = error(
        "domain: d\ndescriptors:\n  - key: files\n    value: exact\n    share_threshold: true\n",
    );
    assert_eq!(err.line, Some(3));
    assert!(
        err.message
            .contains("`share_threshold: true` needs a wildcard value"),
        "{err}"
    );
}

#[test]
fn error_wrong_types() {
    // A list of something other than mappings.
    let err = error("domain: d\ndescriptors:\n  - a\n");
    assert_eq!(err.line, Some(3));
    assert!(
        err.message
            .starts_with("descriptors[0]: a list item must be a mapping"),
        "{err}"
    );
    // A key that is not a string.
    let err = error("domain: d\n0.25: x\n");
    assert_eq!(err.line, Some(2));
    assert!(err.message.contains("key 0.25 is not a string"), "{err}");
    // A floating-point number, which the reference rejects even as a value.
    let err = error("domain: d\ndescriptors:\n  - key: version\n    value: 1.5\n");
    assert_eq!(err.line, Some(4));
    assert!(err.message.contains("quote it (\"1.5\")"), "{err}");
    // requests_per_unit: quoted, negative, too large, not a number.
    for (text, needle) in [
        ("\"5\"", "is quoted"),
        ("-1", "between 0 and 4294967295"),
        ("4294967296", "between 0 and 4294967295"),
        ("many", "between 0 and 4294967295"),
    ] {
        let err = error(&format!(
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n      requests_per_unit: {text}\n"
        ));
        assert_eq!(err.line, Some(6), "{text}");
        assert!(
            err.message
                .starts_with("descriptors[0].rate_limit.requests_per_unit: "),
            "{err}"
        );
        assert!(err.message.contains(needle), "{err}");
    }
    // Booleans.
    let err = error("domain: d\ndescriptors:\n  - key: a\n    shadow_mode: maybe\n");
    assert_eq!(err.line, Some(4));
    assert!(err.message.contains("expected true or false"), "{err}");
    // A mapping where a string belongs.
    let err = error("domain: d\ndescriptors:\n  - key:\n      nested: x\n");
    assert!(err.message.contains("unknown key `nested`"), "{err}");
    let err = error("domain: d\ndescriptors:\n  - key:\n      key: x\n");
    assert_eq!(err.line, Some(4));
    assert!(
        err.message
            .starts_with("descriptors[0].key: expected a string, found a mapping"),
        "{err}"
    );
    // `descriptors` that is not a list.
    let err = error("domain: d\ndescriptors:\n  key: a\n");
    assert!(
        err.message.starts_with("descriptors: expected a list"),
        "{err}"
    );
}

#[test]
fn error_invalid_yaml_and_not_a_mapping() {
    let err = error("domain: d\ndescriptors:\n  - key: [a\n");
    assert_eq!(err.file, "cfg/api.yaml");
    assert!(err.line.is_some(), "{err}");
    assert!(err.message.starts_with("this is not valid YAML: "), "{err}");
    let err = error("# Notes\n\nThese are my notes about rate limits.\n");
    assert_eq!(err.line, Some(3));
    assert!(
        err.message
            .starts_with("a configuration file must be a YAML mapping"),
        "{err}"
    );
    let err = error("- domain: d\n");
    assert!(err.message.contains("but this file is a list"), "{err}");
}

// ---------------------------------------------------------------------------------------------
// Loading a directory.
// ---------------------------------------------------------------------------------------------

fn write(dir: &Path, name: &str, text: &str) {
    let path = dir.join(name);
    if let Some(parent) = path.parent() {
        fs::create_dir_all(parent).unwrap();
    }
    fs::write(path, text).unwrap();
}

#[test]
fn loads_every_file_of_a_directory_like_the_reference() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    write(dir, "mongo.yaml", EXAMPLE_1);
    write(dir, "messaging.yml", EXAMPLE_2);
    // The reference reads every file, whatever its extension, and subdirectories too.
    write(dir, "edge.conf", EXAMPLE_3);
    write(dir, "more/example7.yaml", EXAMPLE_7);

    let config = RlsConfig::load_dir(dir).unwrap();
    assert_eq!(
        config.domains().collect::<Vec<_>>(),
        ["edge_proxy_per_ip", "example7", "messaging", "mongo_cps"]
    );
    assert!(config.warnings().is_empty(), "{:?}", config.warnings());
    let m = limit(
        &config,
        "example7",
        &[("key_1", "value_1"), ("user", "bkthomps")],
    );
    assert_eq!(
        &*m.rule.file,
        dir.join("more/example7.yaml")
            .display()
            .to_string()
            .as_str()
    );

    // A file that is not a configuration fails the load, naming it.
    write(
        dir,
        "README.md",
        "# Rate limits\n\nThe limits of our services.\n",
    );
    let err = RlsConfig::load_dir(dir).unwrap_err();
    assert_eq!(err.file, dir.join("README.md").display().to_string());
    assert_eq!(err.line, Some(3));
    assert!(
        err.message
            .contains("every file under the configuration directory"),
        "{err}"
    );
}

#[test]
fn dot_files_are_read_unless_ignored() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    write(dir, "api.yaml", EXAMPLE_1);
    // A Kubernetes ConfigMap mount keeps a copy of each file in a `..` directory: skipped
    // whatever the setting (it used to load every domain twice).
    write(dir, "..2024_01_01/api.yaml", EXAMPLE_1);
    let config = RlsConfig::load_dir(dir).unwrap();
    assert_eq!(config.domains().collect::<Vec<_>>(), ["mongo_cps"]);
    // Another dot directory is read, as the reference reads it.
    write(dir, ".old/api.yaml", EXAMPLE_1);
    let err = RlsConfig::load_dir(dir).unwrap_err();
    assert!(
        err.message.contains("\"mongo_cps\" is already defined"),
        "{err}"
    );

    let options = LoadOptions {
        ignore_dot_files: true,
        ..LoadOptions::default()
    };
    let config = RlsConfig::load_dir_with(dir, &options).unwrap();
    assert_eq!(config.domains().collect::<Vec<_>>(), ["mongo_cps"]);
}

#[test]
fn a_duplicate_domain_in_a_directory_names_the_second_file_and_line() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    write(dir, "a.yaml", EXAMPLE_1);
    write(dir, "b.yaml", &format!("# copy\n{EXAMPLE_1}"));
    let err = RlsConfig::load_dir(dir).unwrap_err();
    assert_eq!(err.file, dir.join("b.yaml").display().to_string());
    assert_eq!(err.line, Some(2));
    assert!(
        err.message.contains(&format!(
            "already defined in {}:1",
            dir.join("a.yaml").display()
        )),
        "{err}"
    );
}

#[test]
fn an_empty_or_missing_directory() {
    let tmp = tempfile::tempdir().unwrap();
    let config = RlsConfig::load_dir(tmp.path()).unwrap();
    assert!(config.is_empty());
    assert_eq!(config.warnings().len(), 1);

    let missing = tmp.path().join("nope");
    let err = RlsConfig::load_dir(&missing).unwrap_err();
    assert_eq!(err.file, missing.display().to_string());
    assert!(
        err.message
            .starts_with("cannot read the configuration directory"),
        "{err}"
    );
}

#[test]
fn the_fixture_directory_loads() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/rls");
    let config = RlsConfig::load_dir(&dir).unwrap();
    assert!(config.warnings().is_empty(), "{:?}", config.warnings());
    let m = limit(&config, "example_api", &[("remote_address", "10.0.0.1")]);
    assert_rule(&m, 100, Unit::Minute);
    let m = limit(
        &config,
        "example_api",
        &[("header_match", "admin"), ("user_id", "alice")],
    );
    assert_rule(&m, 1_000, Unit::Hour);
    assert_eq!(
        m.counter_key,
        "example_api_header_match_admin_user_id_alice_"
    );
}
