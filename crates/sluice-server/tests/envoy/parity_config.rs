//! Configuration parity with the reference service's own tests.
//!
//! Every case of the reference's `test/config/config_test.go` (loading, errors, descriptor
//! matching, statistics keys) and the cache-key cases of `test/limiter/base_limiter_test.go`,
//! with the reference's inputs (its small YAML files, re-expressed here as test inputs) and
//! its expected answers, asserted against the pure API of `sluice_envoy_rules`. The README's
//! examples and a first set of matching cases live in `rls_config.rs`; this file covers the
//! rest, case by case, each test naming the reference test it mirrors.
//!
//! Where the reference asserts a rule's `FullKey` or `Stats.Key` (the reference now makes the
//! two equal, per request), Sluice's equivalent is [`Match::stats_key`]; where it asserts a
//! cache key, Sluice's is [`Match::counter_key`] / [`Match::reference_cache_key`]. Where the
//! reference expects a load to panic with a message, Sluice returns an [`RlsConfigError`]
//! naming the same file, with the line and a message of its own words; the assertions check
//! the file, the line and the substance of the message.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use sluice_envoy_rules::{LoadOptions, Match, RlsConfig, RlsConfigError, Unit};

// ---------------------------------------------------------------------------------------------
// Helpers.
// ---------------------------------------------------------------------------------------------

pub(crate) fn load(name: &str, yaml: &str) -> RlsConfig {
    match RlsConfig::from_files(&[(name, yaml)]) {
        Ok(config) => config,
        Err(err) => panic!("{err}"),
    }
}

pub(crate) fn load_err(files: &[(&str, &str)], merge_domains: bool) -> RlsConfigError {
    let options = LoadOptions {
        merge_domains,
        ..LoadOptions::default()
    };
    match RlsConfig::from_files_with(files, &options) {
        Ok(_) => panic!("loaded, but the reference rejects it: {files:?}"),
        Err(err) => err,
    }
}

pub(crate) fn get(config: &RlsConfig, domain: &str, entries: &[(&str, &str)]) -> Match {
    match config.get_limit(domain, entries) {
        Some(m) => m,
        None => panic!("no limit for {domain} {entries:?}"),
    }
}

fn none(config: &RlsConfig, domain: &str, entries: &[(&str, &str)]) {
    if let Some(m) = config.get_limit(domain, entries) {
        panic!(
            "{domain} {entries:?} should have no limit, found {}",
            m.rule.location()
        );
    }
}

/// `requests_per_unit` and unit of a match.
fn limit_of(m: &Match) -> (u32, Option<Unit>) {
    (m.rule.requests_per_unit, m.rule.unit)
}

/// The statistics key of the rule a request matches (the reference's `Stats.Key`).
fn stats(config: &RlsConfig, domain: &str, entries: &[(&str, &str)]) -> String {
    get(config, domain, entries).stats_key
}

// ---------------------------------------------------------------------------------------------
// test/config/basic_config.yaml and the tests that load it.
// ---------------------------------------------------------------------------------------------

/// The reference's `test/config/basic_config.yaml` (comments shortened): the domain is on
/// line 2, as in the reference.
pub(crate) const BASIC_CONFIG: &str = "\
# The basic configuration of the reference's tests.
domain: test-domain
descriptors:
  - key: key1
    value: value1
    descriptors:
      - key: subkey1
        rate_limit:
          unit: second
          requests_per_unit: 5

      - key: subkey1
        value: subvalue1
        rate_limit:
          unit: second
          requests_per_unit: 10

  - key: key2
    rate_limit:
      unit: minute
      requests_per_unit: 20

  - key: key2
    value: value2
    rate_limit:
      unit: minute
      requests_per_unit: 30

  # A value with neither a limit nor nested descriptors: not limited.
  - key: key2
    value: value3

  - key: key3
    rate_limit:
      unit: hour
      requests_per_unit: 1

  - key: key4
    rate_limit:
      name: key4_rate_limit
      unit: day
      requests_per_unit: 1

  - key: key5
    value: value5
    rate_limit:
      unit: day
      requests_per_unit: 15
    descriptors:
      - key: subkey5
        value: subvalue5
        rate_limit:
          unit: day
          requests_per_unit: 25

  - key: key6
    rate_limit:
      unlimited: true

  - key: key7
    detailed_metric: true
    rate_limit:
      unit: minute
      requests_per_unit: 70
";

// reference: test/config/config_test.go TestBasicConfig
#[test]
fn basic_config_every_lookup_of_the_reference() {
    let config = load("basic_config.yaml", BASIC_CONFIG);
    let d = "test-domain";
    assert!(!config.is_empty(), "IsEmptyDomains() is false");
    assert_eq!(config.domains().collect::<Vec<_>>(), [d]);

    // An unknown domain, and a descriptor without entries: no limit.
    none(&config, "foo_domain", &[]);
    none(&config, d, &[]);

    // Neither the value nor the key alone of the first level has a limit.
    none(&config, d, &[("key1", "something")]);
    none(&config, d, &[("key1", "value1")]);
    // key2 has no nested descriptors: a second entry leaves no limit.
    none(&config, d, &[("key2", "value2"), ("subkey", "subvalue")]);
    // key5/value5 has a limit of its own and one nested value; another nested value has none.
    none(&config, d, &[("key5", "value5"), ("subkey5", "subvalue")]);

    let m = get(&config, d, &[("key1", "value1"), ("subkey1", "something")]);
    assert_eq!(limit_of(&m), (5, Some(Unit::Second)));
    assert_eq!(m.stats_key, "test-domain.key1_value1.subkey1");

    let m = get(&config, d, &[("key1", "value1"), ("subkey1", "subvalue1")]);
    assert_eq!(limit_of(&m), (10, Some(Unit::Second)));
    assert_eq!(m.stats_key, "test-domain.key1_value1.subkey1_subvalue1");

    let m = get(&config, d, &[("key2", "something")]);
    assert_eq!(limit_of(&m), (20, Some(Unit::Minute)));
    assert_eq!(m.stats_key, "test-domain.key2");

    let m = get(&config, d, &[("key2", "value2")]);
    assert_eq!(limit_of(&m), (30, Some(Unit::Minute)));
    assert_eq!(m.stats_key, "test-domain.key2_value2");

    // The value without a limit wins over the key's default: not limited.
    none(&config, d, &[("key2", "value3")]);

    let m = get(&config, d, &[("key3", "foo")]);
    assert_eq!(limit_of(&m), (1, Some(Unit::Hour)));
    assert_eq!(m.rule.name, None, "no name in the configuration");
    assert_eq!(m.stats_key, "test-domain.key3");

    let m = get(&config, d, &[("key4", "foo")]);
    assert_eq!(limit_of(&m), (1, Some(Unit::Day)));
    assert_eq!(m.rule.name.as_deref(), Some("key4_rate_limit"));
    assert_eq!(m.stats_key, "test-domain.key4");

    let m = get(&config, d, &[("key6", "foo")]);
    assert!(m.rule.unlimited);
    assert_eq!(m.stats_key, "test-domain.key6");

    // detailed_metric: the statistics key carries the request's value.
    let m = get(&config, d, &[("key7", "unspecified_value")]);
    assert_eq!(limit_of(&m), (70, Some(Unit::Minute)));
    assert!(m.rule.detailed_metric);
    assert_eq!(m.stats_key, "test-domain.key7_unspecified_value");
    let m = get(&config, d, &[("key7", "another_value")]);
    assert_eq!(limit_of(&m), (70, Some(Unit::Minute)));
    assert_eq!(m.stats_key, "test-domain.key7_another_value");
}

// reference: test/config/config_test.go TestConfigLimitOverride
//
// The limit a request descriptor carries (`descriptor.limit`) is found for a configured
// domain only, replaces whatever the configuration says for the entries, and is counted and
// reported under the reference's `descriptorKey` (`domain.key1_value1.key2_value2`).
#[test]
fn a_limit_carried_by_the_request_overrides_the_configuration() {
    let config = load("basic_config.yaml", BASIC_CONFIG);
    // No matching domain: nothing, even with a limit in the request.
    assert!(
        config
            .override_limit::<&str, &str>("foo_domain", &[], 10, Unit::Day)
            .is_none()
    );

    let entries = [("key1", "value1"), ("subkey1", "something")];
    let m = config
        .override_limit("test-domain", &entries, 10, Unit::Day)
        .unwrap();
    assert_eq!(m.stats_key, "test-domain.key1_value1.subkey1_something");
    assert_eq!(limit_of(&m), (10, Some(Unit::Day)));
    assert_eq!(m.rule.name, None);
    assert!(!m.rule.shadow_mode, "an override is never in shadow mode");
    assert!(!m.rule.quota_mode);
    // Counted in the reference's cache key: the domain and the request's entries.
    assert_eq!(m.counter_key, "test-domain_key1_value1_subkey1_something_");

    // Another value of the override: the same key (its statistics continue).
    let m2 = config
        .override_limit("test-domain", &entries, 42, Unit::Hour)
        .unwrap();
    assert_eq!(m2.stats_key, m.stats_key);
    assert_eq!(m2.counter_key, m.counter_key);
    assert_eq!(limit_of(&m2), (42, Some(Unit::Hour)));

    // Another value of the entries: another key.
    let m3 = config
        .override_limit(
            "test-domain",
            &[("key1", "value1"), ("subkey1", "something_else")],
            42,
            Unit::Hour,
        )
        .unwrap();
    assert_eq!(
        m3.stats_key,
        "test-domain.key1_value1.subkey1_something_else"
    );
    assert_ne!(m3.counter_key, m.counter_key);

    // Entries the configuration does not limit at all still take the override, and an empty
    // value shows no `_` in the statistics key (the reference's `descriptorKey`).
    let m4 = config
        .override_limit(
            "test-domain",
            &[("nothing", ""), ("x", "y")],
            1,
            Unit::Second,
        )
        .unwrap();
    assert_eq!(m4.stats_key, "test-domain.nothing.x_y");
    assert_eq!(m4.counter_key, "test-domain_nothing__x_y_");
}

// ---------------------------------------------------------------------------------------------
// Merging domains (MERGE_DOMAIN_CONFIG).
// ---------------------------------------------------------------------------------------------

const MERGE_DOMAIN_KEY1: &str = "\
# Merged with the second file.
domain: test-domain
descriptors:
  # Only in this file.
  - key: key1
    value: value1
    rate_limit:
      unit: minute
      requests_per_unit: 10
";

const MERGE_DOMAIN_KEY2: &str = "\
# Merged with the first file.
domain: test-domain
descriptors:
  # Only in this file.
  - key: key2
    value: value2
    rate_limit:
      unit: minute
      requests_per_unit: 20
";

// reference: test/config/config_test.go TestDomainMerge
#[test]
fn domain_merge_of_two_files() {
    let options = LoadOptions {
        merge_domains: true,
        ..LoadOptions::default()
    };
    let config = RlsConfig::from_files_with(
        &[
            ("merge_domain_key1.yaml", MERGE_DOMAIN_KEY1),
            ("merge_domain_key2.yaml", MERGE_DOMAIN_KEY2),
        ],
        &options,
    )
    .unwrap();
    none(&config, "foo_domain", &[]);
    none(&config, "test-domain", &[]);
    let m = get(&config, "test-domain", &[("key1", "value1")]);
    assert_eq!(m.rule.requests_per_unit, 10);
    assert_eq!(&*m.rule.file, "merge_domain_key1.yaml");
    let m = get(&config, "test-domain", &[("key2", "value2")]);
    assert_eq!(m.rule.requests_per_unit, 20);
    assert_eq!(&*m.rule.file, "merge_domain_key2.yaml");

    // Without the option, the second file is an error.
    let err = load_err(
        &[
            ("merge_domain_key1.yaml", MERGE_DOMAIN_KEY1),
            ("merge_domain_key2.yaml", MERGE_DOMAIN_KEY2),
        ],
        false,
    );
    assert_eq!(
        (err.file.as_str(), err.line),
        ("merge_domain_key2.yaml", Some(2))
    );
}

// ---------------------------------------------------------------------------------------------
// Files the reference refuses to load.
// ---------------------------------------------------------------------------------------------

/// A set of files the reference refuses to load, and what Sluice's error says of them.
struct Refused {
    /// The reference's test in test/config/config_test.go, and the reference's error.
    case: &'static str,
    files: Vec<(&'static str, String)>,
    merge_domains: bool,
    /// The file and the line the error points at.
    at: (&'static str, Option<usize>),
    /// How the message begins.
    starts: &'static str,
    /// What else the message holds.
    holds: &'static [&'static str],
}

fn refused_files() -> Vec<Refused> {
    let one = |name: &'static str, yaml: &str| vec![(name, yaml.to_owned())];
    vec![
        Refused {
            case: "TestDuplicateKeyDomainMerge: merge_domain_key1.yaml: duplicate descriptor \
                   composite key 'test-domain.key1_value1'",
            files: vec![
                ("merge_domain_key1.yaml", MERGE_DOMAIN_KEY1.to_owned()),
                ("merge_domain_key1.yaml", MERGE_DOMAIN_KEY1.to_owned()),
            ],
            merge_domains: true,
            at: ("merge_domain_key1.yaml", Some(5)),
            starts: "",
            holds: &["duplicate descriptor", "`key1_value1`"],
        },
        Refused {
            case: "TestEmptyDomain: empty_domain.yaml: config file cannot have empty domain",
            files: one("empty_domain.yaml", "descriptors:\n"),
            merge_domains: false,
            at: ("empty_domain.yaml", None),
            starts: "domain: missing or empty",
            holds: &[],
        },
        Refused {
            case: "TestDuplicateDomain: duplicate_domain.yaml: duplicate domain 'test-domain' in \
                   config file",
            files: vec![
                ("basic_config.yaml", BASIC_CONFIG.to_owned()),
                (
                    "duplicate_domain.yaml",
                    "domain: test-domain\ndescriptors:\n".to_owned(),
                ),
            ],
            merge_domains: false,
            at: ("duplicate_domain.yaml", Some(1)),
            starts: "",
            holds: &["\"test-domain\" is already defined in basic_config.yaml:2"],
        },
        Refused {
            case: "TestEmptyKey: empty_key.yaml: descriptor has empty key",
            files: one(
                "empty_key.yaml",
                "domain: test-domain\ndescriptors:\n  - value: value1\n",
            ),
            merge_domains: false,
            at: ("empty_key.yaml", Some(3)),
            starts: "descriptors[0]: the descriptor has no `key`",
            holds: &[],
        },
        Refused {
            case: "TestDuplicateKey: duplicate_key.yaml: duplicate descriptor composite key \
                   'test-domain.key1_value1'",
            files: one(
                "duplicate_key.yaml",
                "\
domain: test-domain
descriptors:
  - key: key1
    value: value1

  - key: key1
    value: value1
",
            ),
            merge_domains: false,
            at: ("duplicate_key.yaml", Some(6)),
            starts: "descriptors[1]: duplicate descriptor",
            holds: &["`key1_value1`", "already defined at duplicate_key.yaml:3"],
        },
        Refused {
            case: "TestReplacesSelf: replaces_self.yaml: replaces should not contain name of \
                   same descriptor",
            files: vec![("replaces_self.yaml", replaces_yaml(" self"))],
            merge_domains: false,
            at: ("replaces_self.yaml", Some(10)),
            starts: "descriptors[0].descriptors[0].rate_limit.replaces[0]: a rate limit cannot \
                     replace itself",
            holds: &[],
        },
        Refused {
            case: "TestReplacesEmpty: replaces_empty.yaml: should not have an empty replaces entry",
            files: vec![("replaces_empty.yaml", replaces_yaml(""))],
            merge_domains: false,
            at: ("replaces_empty.yaml", Some(10)),
            starts: "",
            holds: &["`name` is missing or empty"],
        },
        Refused {
            case: "TestBadYaml: bad_yaml.yaml: error loading config file: yaml: line 2: found \
                   unexpected end of stream",
            files: one("bad_yaml.yaml", "'''\n"),
            merge_domains: false,
            at: ("bad_yaml.yaml", Some(2)),
            starts: "this is not valid YAML: ",
            holds: &[],
        },
        Refused {
            case: "TestMisspelledKey: misspelled_key.yaml: config error, unknown key 'ratelimit'",
            files: one(
                "misspelled_key.yaml",
                "\
domain: test-domain
descriptors:
  - key: key1
    value: value1
    ratelimit:
      unit: day
      requests_per_unit: 5
",
            ),
            merge_domains: false,
            at: ("misspelled_key.yaml", Some(5)),
            starts: "",
            holds: &["unknown key `ratelimit`"],
        },
        Refused {
            case: "TestMisspelledKey: misspelled_key2.yaml: config error, unknown key \
                   'requestsperunit'",
            files: one(
                "misspelled_key2.yaml",
                "\
domain: test-domain
descriptors:
  - key: key1
    value: value1
    rate_limit:
      unit: day
      requestsperunit: 5
",
            ),
            merge_domains: false,
            at: ("misspelled_key2.yaml", Some(7)),
            starts: "",
            holds: &["unknown key `requestsperunit`"],
        },
        Refused {
            case: "TestNonStringKey: non_string_key.yaml: config error, key is not of type \
                   string: 0.25",
            files: one(
                "non_string_key.yaml",
                "\
0.25: test-domain
descriptors:
  - key: key1
    value: value1
    rate_limit:
      unit: day
      requests_per_unit: 5
",
            ),
            merge_domains: false,
            at: ("non_string_key.yaml", Some(1)),
            starts: "",
            holds: &["key 0.25 is not a string"],
        },
        Refused {
            case: "TestNonMapList: non_map_list.yaml: config error, yaml file contains list of \
                   type other than map: a",
            files: one(
                "non_map_list.yaml",
                "domain: test-domain\ndescriptors:\n  - a\n  - b\n  - c\n",
            ),
            merge_domains: false,
            at: ("non_map_list.yaml", Some(3)),
            starts: "descriptors[0]: a list item must be a mapping",
            holds: &[],
        },
        Refused {
            case: "TestUnlimitedWithRateLimitUnit: unlimited_with_unit.yaml: should not specify \
                   rate limit unit when unlimited",
            files: one(
                "unlimited_with_unit.yaml",
                "\
domain: test-domain
descriptors:
  - key: foo
    rate_limit:
      unlimited: true
      unit: day
      requests_per_unit: 25
",
            ),
            merge_domains: false,
            at: ("unlimited_with_unit.yaml", Some(6)),
            starts: "",
            holds: &["`unlimited: true` cannot be combined with `unit: day`"],
        },
    ]
}

#[test]
fn errors_of_the_files_the_reference_refuses() {
    for r in refused_files() {
        let files: Vec<(&str, &str)> = r.files.iter().map(|(n, y)| (*n, y.as_str())).collect();
        let err = load_err(&files, r.merge_domains);
        let case = r.case;
        assert_eq!((err.file.as_str(), err.line), r.at, "{case}: {err}");
        assert!(err.message.starts_with(r.starts), "{case}: {err}");
        for part in r.holds {
            assert!(err.message.contains(part), "{case}: {part} not in {err}");
        }
    }
}

// reference: test/config/config_test.go TestBadLimitUnit
// ("bad_limit_unit.yaml: invalid rate limit unit 'foo'")
#[test]
fn error_an_unknown_unit() {
    let yaml = "\
domain: test-domain
descriptors:
  - key: key1
    value: value1
    rate_limit:
      unit: foo
      requests_per_unit: 5
";
    let err = load_err(&[("bad_limit_unit.yaml", yaml)], false);
    assert_eq!(
        err.to_string(),
        "bad_limit_unit.yaml:6: descriptors[0].rate_limit.unit: \"foo\" is not a unit; \
         expected one of second, minute, hour, day, week, month, year"
    );
}

/// The reference's `replaces_self.yaml` / `replaces_empty.yaml`, with `name` written as given
/// (the reference's empty case is `- name:` with nothing after it, a YAML null).
fn replaces_yaml(replaced: &str) -> String {
    format!(
        "\
domain: test-domain
descriptors:
  - key: key1
    value: value1
    descriptors:
      - key: subkey1
        rate_limit:
          name: self
          replaces:
            - name:{replaced}
          unit: second
          requests_per_unit: 5
"
    )
}

// ---------------------------------------------------------------------------------------------
// Shadow mode, wildcards, detailed metrics.
// ---------------------------------------------------------------------------------------------

// reference: test/config/config_test.go TestShadowModeConfig
#[test]
fn shadow_mode_per_descriptor() {
    let yaml = "\
domain: test-domain
descriptors:
  - key: key1
    value: value1
    descriptors:
      - key: subkey1
        rate_limit:
          unit: second
          requests_per_unit: 5
      - key: subkey1
        value: subvalue1
        rate_limit:
          unit: second
          requests_per_unit: 10
        shadow_mode: true
  - key: key2
    rate_limit:
      unit: minute
      requests_per_unit: 20
    shadow_mode: true
  - key: key2
    value: value2
    rate_limit:
      unit: minute
      requests_per_unit: 30
";
    let config = load("shadowmode_config.yaml", yaml);
    let d = "test-domain";
    // (entries, shadow_mode, requests_per_unit, unit, statistics key)
    type Case<'a> = (&'a [(&'a str, &'a str)], bool, u32, Unit, &'a str);
    let cases: [Case; 4] = [
        (
            &[("key1", "value1"), ("subkey1", "something")],
            false,
            5,
            Unit::Second,
            "test-domain.key1_value1.subkey1",
        ),
        (
            &[("key1", "value1"), ("subkey1", "subvalue1")],
            true,
            10,
            Unit::Second,
            "test-domain.key1_value1.subkey1_subvalue1",
        ),
        (
            &[("key2", "something")],
            true,
            20,
            Unit::Minute,
            "test-domain.key2",
        ),
        (
            &[("key2", "value2")],
            false,
            30,
            Unit::Minute,
            "test-domain.key2_value2",
        ),
    ];
    for (entries, shadow, rpu, unit, key) in cases {
        let m = get(&config, d, entries);
        assert_eq!(m.rule.shadow_mode, shadow, "{entries:?}");
        assert_eq!(limit_of(&m), (rpu, Some(unit)), "{entries:?}");
        assert_eq!(m.stats_key, key);
    }
}

/// The reference's `test/config/wildcard.yaml`.
const WILDCARD: &str = "\
domain: test-domain
descriptors:
  - key: wild
    value: foo*
    rate_limit:
      unit: minute
      requests_per_unit: 20
  - key: noWild
    value: foo
    rate_limit:
      unit: minute
      requests_per_unit: 20
  - key: noVal
    rate_limit:
      unit: minute
      requests_per_unit: 20
  - key: midWild
    value: bar*b
    rate_limit:
      unit: minute
      requests_per_unit: 20
  - key: multiWild
    value: foo*bar*baz
    rate_limit:
      unit: minute
      requests_per_unit: 10
  - key: nestedWild
    value: val1
    descriptors:
      - key: wild
        value: goo*
        rate_limit:
          unit: minute
          requests_per_unit: 20
";

// reference: test/config/config_test.go TestWildcardConfig
#[test]
fn wildcard_config() {
    let config = load("wildcard.yaml", WILDCARD);
    let d = "test-domain";

    // A key-only descriptor: every value gets the same rule and statistics key.
    let a = get(&config, d, &[("noVal", "foo1")]);
    let b = get(&config, d, &[("noVal", "foo2")]);
    assert!(std::sync::Arc::ptr_eq(&a.rule, &b.rule));
    assert_eq!(a.stats_key, "test-domain.noVal");
    assert_eq!(b.stats_key, a.stats_key);

    // A trailing wildcard: one rule, the pattern in the statistics key.
    let w1 = get(&config, d, &[("wild", "foo1")]);
    let w2 = get(&config, d, &[("wild", "foo2")]);
    assert!(std::sync::Arc::ptr_eq(&w1.rule, &w2.rule));
    assert_eq!(w1.stats_key, "test-domain.wild_foo*");
    assert_eq!(w2.stats_key, "test-domain.wild_foo*");
    // ... but (no share_threshold) a counter per value.
    assert_eq!(w1.counter_key, "test-domain_wild_foo1_");
    assert_eq!(w2.counter_key, "test-domain_wild_foo2_");
    let w3 = get(&config, d, &[("nestedWild", "val1"), ("wild", "goo2")]);
    assert_eq!(w3.stats_key, "test-domain.nestedWild_val1.wild_goo*");

    none(&config, d, &[("wild", "bar")]);
    // A value without `*` is matched exactly.
    none(&config, d, &[("noWild", "foo1")]);

    // A wildcard in the middle.
    let m1 = get(&config, d, &[("midWild", "barab")]);
    let m2 = get(&config, d, &[("midWild", "bar123b")]);
    assert!(std::sync::Arc::ptr_eq(&m1.rule, &m2.rule));
    assert_eq!(m1.stats_key, "test-domain.midWild_bar*b");
    // `*` matches the empty string.
    assert!(config.get_limit(d, &[("midWild", "barb")]).is_some());
    none(&config, d, &[("midWild", "bara")]);
    none(&config, d, &[("midWild", "xbarb")]);

    // Several wildcards: the fixed parts must appear in order.
    let x1 = get(&config, d, &[("multiWild", "foo123bar456baz")]);
    let x2 = get(&config, d, &[("multiWild", "foobarbaz")]);
    assert!(std::sync::Arc::ptr_eq(&x1.rule, &x2.rule));
    assert_eq!(x1.stats_key, "test-domain.multiWild_foo*bar*baz");
    assert_eq!(limit_of(&x1), (10, Some(Unit::Minute)));
    none(&config, d, &[("multiWild", "foo123baz")]);
    none(&config, d, &[("multiWild", "bar456baz")]);
}

/// The reference's `realisticExampleConfig` of TestDetailedMetric.
const DETAILED_REALISTIC: &str = "\
domain: nested
descriptors:
  - key: key_1
    detailed_metric: true
    rate_limit:
      requests_per_unit: 500
      unit: minute
  - key: key_1
    value: some-value-for-key-1
    rate_limit:
      requests_per_unit: 500
      unit: minute
  - key: key_2
    detailed_metric: true
    rate_limit:
      requests_per_unit: 5000
      unit: minute
    descriptors:
      - key: key_3
        detailed_metric: true
      - key: key_3
        value: requested-key3-value
        detailed_metric: true
        rate_limit:
          requests_per_unit: 5
          unit: minute
  - key: key_2
    value: specific-id
    detailed_metric: true
    rate_limit:
      requests_per_unit: 50000
      unit: minute
    descriptors:
      - key: key_3
        detailed_metric: true
      - key: key_3
        value: requested-key3-value
        detailed_metric: true
        rate_limit:
          requests_per_unit: 100
          unit: minute
";

/// Two key-only levels with limits, `detailed_metric` set as given on each.
fn detailed_two_levels(outer: bool, inner: bool) -> String {
    format!(
        "\
domain: nested
descriptors:
  - key: key-1
    detailed_metric: {outer}
    rate_limit:
      requests_per_unit: 100
      unit: minute
    descriptors:
      - key: key-2
        detailed_metric: {inner}
        rate_limit:
          requests_per_unit: 5
          unit: minute
"
    )
}

// reference: test/config/config_test.go TestDetailedMetric (every case of its table)
#[test]
fn detailed_metric_table() {
    // (the reference's case name, configuration, request, statistics key)
    type Case<'a> = (&'a str, String, Vec<(&'a str, &'a str)>, &'a str);
    let cases: Vec<Case> = vec![
        (
            "nested with no values but request only top-level key",
            detailed_two_levels(true, false),
            vec![("key-1", "value-1")],
            "nested.key-1_value-1",
        ),
        (
            "nested with no values but request only top-level key with no detailed metric",
            detailed_two_levels(false, false),
            vec![("key-1", "value-1")],
            "nested.key-1",
        ),
        (
            "nested with no values and request fully nested descriptors",
            detailed_two_levels(true, true),
            vec![("key-1", "value-1"), ("key-2", "value-2")],
            "nested.key-1_value-1.key-2_value-2",
        ),
        (
            "nested with no values and request fully nested descriptors with no detailed metric",
            detailed_two_levels(false, false),
            vec![("key-1", "value-1"), ("key-2", "value-2")],
            "nested.key-1.key-2",
        ),
        (
            "test nested descriptors with simple request",
            DETAILED_REALISTIC.to_owned(),
            vec![("key_1", "value-for-key-1")],
            "nested.key_1_value-for-key-1",
        ),
        (
            "test nested only second descriptor request not nested",
            DETAILED_REALISTIC.to_owned(),
            vec![("key_2", "key-2-value")],
            "nested.key_2_key-2-value",
        ),
        (
            "test nested descriptors with nested request",
            DETAILED_REALISTIC.to_owned(),
            vec![("key_2", "key-2-value"), ("key_3", "requested-key3-value")],
            "nested.key_2_key-2-value.key_3_requested-key3-value",
        ),
    ];
    for (name, yaml, entries, expected) in cases {
        let config = load("inline.yaml", &yaml);
        let m = config
            .get_limit("nested", &entries)
            .unwrap_or_else(|| panic!("{name}: no limit"));
        assert_eq!(m.stats_key, expected, "{name}");
    }
    // The realistic configuration's limits, for the record.
    let config = load("inline.yaml", DETAILED_REALISTIC);
    assert_eq!(
        get(
            &config,
            "nested",
            &[("key_2", "specific-id"), ("key_3", "requested-key3-value")]
        )
        .rule
        .requests_per_unit,
        100
    );
    // key_2/specific-id has a limit of its own and is detailed.
    let m = get(&config, "nested", &[("key_2", "specific-id")]);
    assert_eq!(m.rule.requests_per_unit, 50_000);
    assert_eq!(m.stats_key, "nested.key_2_specific-id");
    // A key_3 without a limit: nothing.
    none(&config, "nested", &[("key_2", "x"), ("key_3", "other")]);
}

// ---------------------------------------------------------------------------------------------
// value_to_metric.
// ---------------------------------------------------------------------------------------------

/// route (value_to_metric) -> http_method (value_to_metric) -> subject_id (60 per minute),
/// with `detailed_metric` on the leaf when asked: the configuration of most
/// TestValueToMetric_* tests.
fn route_method_subject(domain: &str, flags: bool, leaf_detailed: bool) -> RlsConfig {
    let yaml = format!(
        "\
domain: {domain}
descriptors:
  - key: route
    value_to_metric: {flags}
    descriptors:
      - key: http_method
        value_to_metric: {flags}
        descriptors:
          - key: subject_id
            detailed_metric: {leaf_detailed}
            rate_limit:
              requests_per_unit: 60
              unit: minute
"
    );
    load("inline.yaml", &yaml)
}

// reference: test/config/config_test.go TestValueToMetric_UsesRuntimeValuesInStats
#[test]
fn value_to_metric_uses_the_request_values() {
    let config = route_method_subject("domain", true, false);
    assert_eq!(
        stats(
            &config,
            "domain",
            &[
                ("route", "draw"),
                ("http_method", "GET"),
                ("subject_id", "123")
            ]
        ),
        "domain.route_draw.http_method_GET.subject_id"
    );
}

// reference: test/config/config_test.go TestValueToMetric_DefaultKeyIncludesValueAtThatLevel
#[test]
fn value_to_metric_on_a_key_only_level() {
    let yaml = "\
domain: d
descriptors:
  - key: k1
    value_to_metric: true
    descriptors:
      - key: k2
        rate_limit:
          requests_per_unit: 1
          unit: second
";
    let config = load("inline.yaml", yaml);
    assert_eq!(
        stats(&config, "d", &[("k1", "A"), ("k2", "foo")]),
        "d.k1_A.k2"
    );
}

// reference: test/config/config_test.go TestValueToMetric_MidLevelOnly
#[test]
fn value_to_metric_on_the_middle_level_only() {
    let yaml = "\
domain: d
descriptors:
  - key: k1
    descriptors:
      - key: k2
        value_to_metric: true
        descriptors:
          - key: k3
            rate_limit:
              requests_per_unit: 1
              unit: second
";
    let config = load("inline.yaml", yaml);
    assert_eq!(
        stats(&config, "d", &[("k1", "X"), ("k2", "Y"), ("k3", "Z")]),
        "d.k1.k2_Y.k3"
    );
}

// reference: test/config/config_test.go TestValueToMetric_NoFlag_Unchanged
#[test]
fn value_to_metric_absent_changes_nothing() {
    let yaml = "\
domain: d
descriptors:
  - key: k1
    descriptors:
      - key: k2
        rate_limit:
          requests_per_unit: 1
          unit: second
";
    let config = load("inline.yaml", yaml);
    assert_eq!(stats(&config, "d", &[("k1", "X"), ("k2", "Y")]), "d.k1.k2");
}

// reference: test/config/config_test.go TestValueToMetric_DoesNotOverrideDetailedMetric
#[test]
fn value_to_metric_yields_to_detailed_metric() {
    let config = route_method_subject("domain", true, true);
    assert_eq!(
        stats(
            &config,
            "domain",
            &[
                ("route", "draw"),
                ("http_method", "GET"),
                ("subject_id", "123")
            ]
        ),
        "domain.route_draw.http_method_GET.subject_id_123"
    );
}

// reference: test/config/config_test.go TestValueToMetric_WithConfiguredValues
#[test]
fn value_to_metric_with_configured_values() {
    let yaml = "\
domain: test-domain
descriptors:
  - key: route
    value_to_metric: true
    descriptors:
      - key: http_method
        value: GET
        value_to_metric: true
        descriptors:
          - key: subject_id
            rate_limit:
              requests_per_unit: 60
              unit: minute
      - key: http_method
        value: POST
        value_to_metric: true
        descriptors:
          - key: subject_id
            rate_limit:
              requests_per_unit: 30
              unit: minute
";
    let config = load("inline.yaml", yaml);
    let d = "test-domain";
    let m = get(
        &config,
        d,
        &[
            ("route", "api"),
            ("http_method", "GET"),
            ("subject_id", "user123"),
        ],
    );
    assert_eq!(m.rule.requests_per_unit, 60);
    assert_eq!(
        m.stats_key,
        "test-domain.route_api.http_method_GET.subject_id"
    );
    let m = get(
        &config,
        d,
        &[
            ("route", "api"),
            ("http_method", "POST"),
            ("subject_id", "user456"),
        ],
    );
    assert_eq!(m.rule.requests_per_unit, 30);
    assert_eq!(
        m.stats_key,
        "test-domain.route_api.http_method_POST.subject_id"
    );
}

// reference: test/config/config_test.go TestValueToMetric_WithWildcard
#[test]
fn value_to_metric_with_a_wildcard_shows_the_full_value() {
    let yaml = "\
domain: domain
descriptors:
  - key: user
    value_to_metric: true
    descriptors:
      - key: action
        value: read*
        value_to_metric: true
        descriptors:
          - key: resource
            rate_limit:
              requests_per_unit: 100
              unit: minute
";
    let config = load("inline.yaml", yaml);
    let m = get(
        &config,
        "domain",
        &[
            ("user", "alice"),
            ("action", "readfile"),
            ("resource", "documents"),
        ],
    );
    assert_eq!(m.rule.requests_per_unit, 100);
    assert_eq!(m.stats_key, "domain.user_alice.action_readfile.resource");
    assert_eq!(
        stats(
            &config,
            "domain",
            &[
                ("user", "bob"),
                ("action", "readdata"),
                ("resource", "database")
            ]
        ),
        "domain.user_bob.action_readdata.resource"
    );
}

// reference: test/config/config_test.go TestValueToMetric_WithEmptyValue
#[test]
fn value_to_metric_with_empty_values_adds_no_underscore() {
    let config = route_method_subject("domain", true, false);
    let cases = [
        (("", "GET"), "domain.route.http_method_GET.subject_id"),
        (("draw", ""), "domain.route_draw.http_method.subject_id"),
        (("", ""), "domain.route.http_method.subject_id"),
    ];
    for ((route, method), expected) in cases {
        let entries = [
            ("route", route),
            ("http_method", method),
            ("subject_id", "123"),
        ];
        assert_eq!(stats(&config, "domain", &entries), expected);
    }
    // The counter key keeps the empty values (the reference's GenerateCacheKey writes
    // `key_` + value + `_` whatever the value).
    let m = get(
        &config,
        "domain",
        &[("route", ""), ("http_method", ""), ("subject_id", "123")],
    );
    assert_eq!(m.counter_key, "domain_route__http_method__subject_id_123_");
}

// reference: test/config/config_test.go TestValueToMetric_FullKeyMatchesStatsKey
//
// The reference checks that `FullKey` equals `Stats.Key` in three configurations; Sluice has
// one key per request (`stats_key`), so this asserts what that key is in each.
#[test]
fn value_to_metric_statistics_keys_in_three_configurations() {
    let entries = [
        ("route", "api"),
        ("http_method", "GET"),
        ("subject_id", "user123"),
    ];
    let flags = route_method_subject("test-domain", true, false);
    assert_eq!(
        stats(&flags, "test-domain", &entries),
        "test-domain.route_api.http_method_GET.subject_id"
    );
    let no_flags = route_method_subject("test-domain-2", false, false);
    let m = get(&no_flags, "test-domain-2", &entries);
    assert_eq!(m.stats_key, "test-domain-2.route.http_method.subject_id");
    assert_eq!(m.stats_key, m.rule.full_key);
    let detailed = route_method_subject("test-domain-3", false, true);
    assert_eq!(
        stats(&detailed, "test-domain-3", &entries),
        "test-domain-3.route_api.http_method_GET.subject_id_user123"
    );
}

// ---------------------------------------------------------------------------------------------
// share_threshold.
// ---------------------------------------------------------------------------------------------

/// The reference's `test/config/share_threshold.yaml`.
pub(crate) const SHARE_THRESHOLD: &str = "\
domain: test-domain
descriptors:
  - key: files
    value: files/*
    share_threshold: true
    rate_limit:
      unit: minute
      requests_per_unit: 100
  - key: nested
    value: parent
    descriptors:
      - key: files
        value: nested/*
        share_threshold: true
        rate_limit:
          unit: minute
          requests_per_unit: 200
  - key: files
    value: top/*
    share_threshold: true
    descriptors:
      - key: files
        value: nested/*
        share_threshold: true
        rate_limit:
          unit: minute
          requests_per_unit: 300
  - key: route
    value: api/*
    share_threshold: true
    value_to_metric: true
    descriptors:
      - key: method
        rate_limit:
          unit: minute
          requests_per_unit: 60
  - key: service
    value: svc/*
    share_threshold: true
    descriptors:
      - key: endpoint
        detailed_metric: true
        rate_limit:
          unit: minute
          requests_per_unit: 80
  - key: path
    value: path/*
    share_threshold: true
    descriptors:
      - key: file
        value: file/*
        share_threshold: false
        descriptors:
          - key: type
            rate_limit:
              unit: minute
              requests_per_unit: 120
  - key: user
    value: user/*
    share_threshold: true
    descriptors:
      - key: resource
        value: res/*
        share_threshold: true
        descriptors:
          - key: action
            rate_limit:
              unit: minute
              requests_per_unit: 150
  - key: file
    value: test1
    rate_limit:
      unit: minute
      requests_per_unit: 50
  - key: file
    value: test*
    share_threshold: true
    rate_limit:
      unit: minute
      requests_per_unit: 100
  - key: midpath
    value: /api*v1
    share_threshold: true
    rate_limit:
      unit: minute
      requests_per_unit: 100
  - key: multiroute
    value: svc*ep*rpc
    share_threshold: true
    rate_limit:
      unit: minute
      requests_per_unit: 50
  - key: midroute
    value: /api*v2
    share_threshold: true
    value_to_metric: true
    rate_limit:
      unit: minute
      requests_per_unit: 80
  - key: tenant
    value: t*prod
    share_threshold: true
    descriptors:
      - key: resource
        value: res*v2
        share_threshold: true
        rate_limit:
          unit: minute
          requests_per_unit: 60
";

// reference: test/config/config_test.go TestShareThreshold (cases 1 to 8)
#[test]
fn share_threshold_config() {
    let config = load("share_threshold.yaml", SHARE_THRESHOLD);
    let d = "test-domain";

    // Case 1: every value matching files/* shares one counter and one statistics key.
    for value in ["files/a.pdf", "files/b.csv", "files/c.txt"] {
        let m = get(&config, d, &[("files", value)]);
        assert_eq!(m.rule.requests_per_unit, 100);
        assert_eq!(m.stats_key, "test-domain.files_files/*");
        assert_eq!(m.counter_key, "test-domain_files_files/*_");
    }

    // Case 2: share_threshold wins over value_to_metric and over detailed_metric.
    let m = get(&config, d, &[("route", "api/v1"), ("method", "GET")]);
    assert_eq!(m.stats_key, "test-domain.route_api/*.method");
    assert_eq!(m.counter_key, "test-domain_route_api/*_method_GET_");
    let m = get(&config, d, &[("service", "svc/user"), ("endpoint", "get")]);
    assert!(m.rule.detailed_metric);
    assert_eq!(m.stats_key, "test-domain.service_svc/*.endpoint_get");
    assert_eq!(m.counter_key, "test-domain_service_svc/*_endpoint_get_");

    // Case 3: nested wildcards.
    let m = get(
        &config,
        d,
        &[("nested", "parent"), ("files", "nested/file1.txt")],
    );
    assert_eq!(m.rule.requests_per_unit, 200);
    assert_eq!(m.stats_key, "test-domain.nested_parent.files_nested/*");
    let m = get(
        &config,
        d,
        &[("files", "top/file1.txt"), ("files", "nested/file1.txt")],
    );
    assert_eq!(m.rule.requests_per_unit, 300);
    assert_eq!(m.stats_key, "test-domain.files_top/*.files_nested/*");
    assert_eq!(m.counter_key, "test-domain_files_top/*_files_nested/*_");
    // The parent shares, the child (a wildcard without share_threshold) does not: the child
    // keeps its own value in the counter, and its pattern in the statistics key.
    let m = get(
        &config,
        d,
        &[("path", "path/foo"), ("file", "file/doc1"), ("type", "pdf")],
    );
    assert_eq!(m.rule.requests_per_unit, 120);
    assert_eq!(m.stats_key, "test-domain.path_path/*.file_file/*.type");
    assert_eq!(
        m.counter_key,
        "test-domain_path_path/*_file_file/doc1_type_pdf_"
    );
    // Both share.
    let m = get(
        &config,
        d,
        &[
            ("user", "user/alice"),
            ("resource", "res/file1"),
            ("action", "read"),
        ],
    );
    assert_eq!(m.rule.requests_per_unit, 150);
    assert_eq!(m.stats_key, "test-domain.user_user/*.resource_res/*.action");
    assert_eq!(
        m.counter_key,
        "test-domain_user_user/*_resource_res/*_action_read_"
    );

    // Case 4: an explicit value wins over the shared wildcard and counts alone.
    let m = get(&config, d, &[("file", "test1")]);
    assert_eq!(m.rule.requests_per_unit, 50);
    assert_eq!(m.stats_key, "test-domain.file_test1");
    assert_eq!(m.counter_key, "test-domain_file_test1_");
    for value in ["test2", "test23", "test123"] {
        let m = get(&config, d, &[("file", value)]);
        assert_eq!(m.rule.requests_per_unit, 100);
        assert_eq!(m.stats_key, "test-domain.file_test*");
        assert_eq!(m.counter_key, "test-domain_file_test*_");
    }

    // Case 5: a wildcard in the middle.
    for value in ["/api/v1", "/api-beta-v1", "/apiXYZv1"] {
        let m = get(&config, d, &[("midpath", value)]);
        assert_eq!(m.rule.requests_per_unit, 100);
        assert_eq!(m.stats_key, "test-domain.midpath_/api*v1");
        assert_eq!(m.counter_key, "test-domain_midpath_/api*v1_");
    }
    none(&config, d, &[("midpath", "/api/v2")]);

    // Case 6: several wildcards.
    for value in ["svcAepBrpc", "svcXXXepYYYrpc", "svceprpc"] {
        let m = get(&config, d, &[("multiroute", value)]);
        assert_eq!(m.rule.requests_per_unit, 50);
        assert_eq!(m.stats_key, "test-domain.multiroute_svc*ep*rpc");
    }
    none(&config, d, &[("multiroute", "svcABCrpc")]);

    // Case 7: share_threshold wins over value_to_metric with a middle wildcard too.
    let a = get(&config, d, &[("midroute", "/api/v2")]);
    let b = get(&config, d, &[("midroute", "/api-beta-v2")]);
    assert_eq!(a.stats_key, "test-domain.midroute_/api*v2");
    assert_eq!(b.stats_key, a.stats_key);
    assert_eq!(b.counter_key, a.counter_key);

    // Case 8: nested middle wildcards, both shared.
    let a = get(&config, d, &[("tenant", "t1prod"), ("resource", "resAv2")]);
    let b = get(
        &config,
        d,
        &[("tenant", "t99prod"), ("resource", "resBBBv2")],
    );
    assert_eq!(a.stats_key, "test-domain.tenant_t*prod.resource_res*v2");
    assert_eq!(b.stats_key, a.stats_key);
    assert_eq!(a.counter_key, "test-domain_tenant_t*prod_resource_res*v2_");
    assert_eq!(b.counter_key, a.counter_key);
}

/// One `wild` descriptor with `value`, the flags given, 20 per minute.
fn one_wildcard(value: &str, value_to_metric: bool, share_threshold: bool) -> RlsConfig {
    let yaml = format!(
        "\
domain: test-domain
descriptors:
  - key: wild
    value: \"{value}\"
    value_to_metric: {value_to_metric}
    share_threshold: {share_threshold}
    rate_limit:
      requests_per_unit: 20
      unit: minute
"
    );
    load("inline.yaml", &yaml)
}

// reference: test/config/config_test.go TestWildcardStatsBehavior (every sub-test)
#[test]
fn wildcard_statistics_keys_for_every_flag_combination() {
    let d = "test-domain";
    let foo1 = [("wild", "foo1")];
    // No flags: the pattern.
    assert_eq!(
        stats(&one_wildcard("foo*", false, false), d, &foo1),
        "test-domain.wild_foo*"
    );
    // value_to_metric: the request's value.
    assert_eq!(
        stats(&one_wildcard("foo*", true, false), d, &foo1),
        "test-domain.wild_foo1"
    );
    // share_threshold: the pattern.
    assert_eq!(
        stats(&one_wildcard("foo*", false, true), d, &foo1),
        "test-domain.wild_foo*"
    );
    // Both: share_threshold wins.
    assert_eq!(
        stats(&one_wildcard("foo*", true, true), d, &foo1),
        "test-domain.wild_foo*"
    );

    // value_to_metric on another level keeps the wildcard's pattern.
    let yaml = "\
domain: test-domain
descriptors:
  - key: wild
    value: foo*
    descriptors:
      - key: other
        value_to_metric: true
        descriptors:
          - key: limit
            rate_limit:
              requests_per_unit: 20
              unit: minute
";
    let config = load("inline.yaml", yaml);
    assert_eq!(
        stats(
            &config,
            d,
            &[("wild", "foo1"), ("other", "bar"), ("limit", "X")]
        ),
        "test-domain.wild_foo*.other_bar.limit"
    );

    // A middle and trailing wildcard behaves the same.
    let config = one_wildcard("foo*bar*", false, false);
    assert_eq!(
        stats(&config, d, &[("wild", "foo123bar456")]),
        "test-domain.wild_foo*bar*"
    );
    assert_eq!(
        stats(&config, d, &[("wild", "fooXbarY")]),
        "test-domain.wild_foo*bar*"
    );
    assert_eq!(
        stats(
            &one_wildcard("foo*bar*", true, false),
            d,
            &[("wild", "foo123bar456")]
        ),
        "test-domain.wild_foo123bar456"
    );
}

// ---------------------------------------------------------------------------------------------
// Cache keys (test/limiter/base_limiter_test.go).
// ---------------------------------------------------------------------------------------------

// reference: test/limiter/base_limiter_test.go TestGenerateCacheKeysWithShareThreshold
//
// (TestGenerateCacheKeys and TestGenerateCacheKeysPrefix, `domain_key_value_1234` and
// `prefix:domain_key_value_1234`, are asserted by rls_config.rs
// the_reference_cache_key_ends_with_the_window_start.)
#[test]
fn cache_keys_with_share_threshold() {
    let yaml = "\
domain: domain
descriptors:
  - key: files
    value: files/*
    share_threshold: true
    rate_limit:
      unit: second
      requests_per_unit: 10
  - key: parent
    descriptors:
      - key: files
        value: nested/*
        share_threshold: true
        rate_limit:
          unit: second
          requests_per_unit: 10
  - key: files
    value: top/*
    share_threshold: true
    descriptors:
      - key: files
        value: nested/*
        share_threshold: true
        rate_limit:
          unit: second
          requests_per_unit: 10
";
    let config = load("inline.yaml", yaml);
    let key = |entries: &[(&str, &str)]| {
        get(&config, "domain", entries)
            .reference_cache_key("", 1234)
            .unwrap()
    };
    // Test 1 and 2: every value under files/* gives the same key.
    for value in [
        "files/a.pdf",
        "files/b.csv",
        "files/c.txt",
        "files/d.json",
        "files/e.xml",
        "files/subdir/f.txt",
    ] {
        assert_eq!(
            key(&[("files", value)]),
            "domain_files_files/*_1234",
            "{value}"
        );
    }
    // Test 3: the first entry keeps its value, the second shares.
    for file in ["nested/file1.txt", "nested/file2.csv"] {
        assert_eq!(
            key(&[("parent", "value1"), ("files", file)]),
            "domain_parent_value1_files_nested/*_1234"
        );
    }
    // Test 4: both entries share.
    for (top, nested) in [
        ("top/file1.txt", "nested/sub1.txt"),
        ("top/file2.pdf", "nested/sub2.csv"),
    ] {
        assert_eq!(
            key(&[("files", top), ("files", nested)]),
            "domain_files_top/*_files_nested/*_1234"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// metadata.
// ---------------------------------------------------------------------------------------------

// reference: test/config/config_test.go TestMetadata
//
// The reference accepts a free-form `metadata` mapping on a descriptor (not validated, turned
// into a protobuf Struct) and returns it with the limit, for RESPONSE_DYNAMIC_METADATA. The
// file must load and match as in the reference; what the metadata says is not observable
// through Sluice's API (see the parity table: metadata is not returned).
#[test]
fn metadata_on_descriptors_loads() {
    let yaml = "\
domain: test-domain
descriptors:
  - key: key1
    value: value1
    descriptors:
      - key: subkey1
        rate_limit:
          unit: second
          requests_per_unit: 5
        metadata:
          name: service_1
      - key: subkey1
        value: subvalue1
        rate_limit:
          unit: second
          requests_per_unit: 10
  - key: key2
    rate_limit:
      unit: minute
      requests_per_unit: 20
    metadata:
      service_with_quota:
        name: service_2
";
    let config = load("metadata.yaml", yaml);
    assert!(!config.is_empty());
    none(&config, "test-domain", &[]);
    let m = get(
        &config,
        "test-domain",
        &[("key1", "value1"), ("subkey1", "something")],
    );
    assert_eq!(limit_of(&m), (5, Some(Unit::Second)));
    assert_eq!(m.stats_key, "test-domain.key1_value1.subkey1");
    let m = get(&config, "test-domain", &[("key2", "something")]);
    assert_eq!(limit_of(&m), (20, Some(Unit::Minute)));
    assert_eq!(m.stats_key, "test-domain.key2");
}
