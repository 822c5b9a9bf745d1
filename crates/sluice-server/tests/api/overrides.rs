//! Settings given as flags or `SLUICE_*` variables: applied onto a file's configuration,
//! each refusal naming the flag or variable and its value, and explained.

#![allow(clippy::unwrap_used)] // tests fail loudly by design

use std::path::Path;
use std::time::Duration;

use sluice_redis::Topology;
use sluice_server::config::{
    Config, ConfigSource, FailureMode, Given, NoFile, Overrides, SETTINGS, Setting, StoreConfig,
};

const FILE: &str = "listen:\n  http: 127.0.0.1:7001\npolicies:\n  api:\n    limits:\n      - { max: 1, per: 1s }\n";

fn config(text: &str) -> Config {
    Config::parse("sluice.yaml", text).unwrap()
}

fn given(pairs: &[(Setting, &str, Given)]) -> Overrides {
    let mut o = Overrides::default();
    for (setting, value, given) in pairs {
        o.set(*setting, *value, *given);
    }
    o
}

/// The shards, key prefix and timeout of `c`'s store, which must be sharded Redis.
fn sharded_redis(c: &Config) -> (&[sluice_redis::Shard], &str, Duration) {
    let StoreConfig::Redis(sluice_redis::RedisConfig {
        topology: Topology::Shards { shards },
        key_prefix,
        timeout,
        ..
    }) = &c.store
    else {
        panic!("{:?}", c.store);
    };
    (shards, key_prefix, *timeout)
}

/// The error applying `pairs` onto [`FILE`] gives.
fn applied_error(pairs: &[(Setting, &str, Given)]) -> String {
    given(pairs)
        .apply(config(FILE), "sluice.yaml")
        .unwrap_err()
        .to_string()
}

/// The error checking `pairs` alone gives.
fn check_error(pairs: &[(Setting, &str, Given)]) -> String {
    given(pairs).check().unwrap_err().to_string()
}

fn redis(text: &str) -> Config {
    config(&format!("store:\n  backend: redis\n{text}"))
}

#[test]
fn each_setting_is_its_own_row_of_the_table() {
    for (i, declared) in SETTINGS.iter().enumerate() {
        assert_eq!(declared.setting as usize, i, "{declared:?}");
        assert!(declared.env.starts_with("SLUICE_"), "{declared:?}");
    }
}

#[test]
fn a_value_replaces_the_files_and_an_absent_one_keeps_it() {
    let c = given(&[(Setting::Grpc, "0.0.0.0:9001", Given::Env)])
        .apply(config(FILE), "sluice.yaml")
        .unwrap();
    assert_eq!(
        c.http.to_string(),
        "127.0.0.1:7001",
        "the file's, not replaced"
    );
    assert_eq!(c.grpc.to_string(), "0.0.0.0:9001");
    assert_eq!(c.admin_http, None);
    let c = given(&[(Setting::Admin, "10.0.0.5:9090", Given::Flag)])
        .apply(config(FILE), "sluice.yaml")
        .unwrap();
    assert_eq!(c.admin_http.unwrap().to_string(), "10.0.0.5:9090");
}

#[test]
fn the_command_line_keeps_one_value_per_setting_the_last_set() {
    let mut o = Overrides::default();
    o.set(Setting::Http, "127.0.0.1:1", Given::Env);
    o.set(Setting::Http, "127.0.0.1:2", Given::Flag);
    assert_eq!(o.get(Setting::Http).unwrap().value, "127.0.0.1:2");
    assert_eq!(o.get(Setting::Http).unwrap().origin(), "flag --http");
}

#[test]
fn a_redis_url_turns_the_memory_store_into_one_redis_with_the_defaults() {
    let c = given(&[(Setting::RedisUrl, "redis://u:pw@10.0.0.1:6379", Given::Env)])
        .apply(config(FILE), "sluice.yaml")
        .unwrap();
    let (shards, key_prefix, timeout) = sharded_redis(&c);
    assert_eq!(shards.len(), 1);
    assert_eq!(shards[0].primary, "redis://u:pw@10.0.0.1:6379");
    assert_eq!(key_prefix, sluice_redis::DEFAULT_PREFIX);
    assert_eq!(timeout, sluice_redis::DEFAULT_TIMEOUT);
    assert_eq!(c.store.to_string(), "redis redis://10.0.0.1:6379");
}

#[test]
fn a_redis_url_replaces_a_single_primary_and_keeps_the_other_store_settings() {
    let file =
        redis("  shards: [{primary: redis://old:6379}]\n  timeout: 200ms\n  key_prefix: \"a:\"\n");
    let c = given(&[(Setting::RedisUrl, "redis://new:6379", Given::Flag)])
        .apply(file, "sluice.yaml")
        .unwrap();
    let (shards, key_prefix, timeout) = sharded_redis(&c);
    assert_eq!(shards[0].primary, "redis://new:6379");
    assert_eq!(key_prefix, "a:");
    assert_eq!(timeout, Duration::from_millis(200));
}

#[test]
fn a_redis_url_never_replaces_a_topology() {
    let topologies = [
        (
            "  shards: [{primary: redis://a:6379}, {primary: redis://b:6379}]\n",
            "2 shards (store.shards)",
        ),
        (
            "  shards: [{primary: redis://a:6379, replicas: [redis://r:6379]}]\n",
            "a primary with replicas",
        ),
        (
            "  cluster: [redis://c:7000]\n",
            "a Redis Cluster (store.cluster)",
        ),
        (
            "  sentinel: {master: m, nodes: [redis://s:26379]}\n",
            "Sentinel (store.sentinel)",
        ),
    ];
    for (store, named) in topologies {
        let e = given(&[(Setting::RedisUrl, "redis://u:secret@one:6379", Given::Env)])
            .apply(redis(store), "sluice.yaml")
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("env SLUICE_REDIS_URL: `redis://one:6379`"),
            "{e}"
        );
        assert!(e.contains(&format!("sluice.yaml names {named}")), "{e}");
        assert!(!e.contains("secret"), "the password is never shown: {e}");
    }
}

#[test]
fn a_key_prefix_sets_the_redis_stores() {
    let o = given(&[
        (Setting::RedisUrl, "redis://h:6379", Given::Env),
        (Setting::KeyPrefix, "app:", Given::Flag),
    ]);
    let c = o.apply(config(FILE), "sluice.yaml").unwrap();
    assert!(
        matches!(&c.store, StoreConfig::Redis(sluice_redis::RedisConfig { key_prefix, .. }) if key_prefix == "app:")
    );
}

/// Each refusal names the flag or variable and the value, never a password: checked alone,
/// or applied onto [`FILE`] (a prefix for its memory store, a second listener on its port).
#[test]
fn refusals_name_the_flag_or_variable_and_the_value() {
    use Given::{Env, Flag};
    for (setting, value, as_given, applied, starts, holds) in [
        (
            Setting::Http,
            "localhost:80",
            Env,
            true,
            "env SLUICE_HTTP: `localhost:80` names a host",
            &[][..],
        ),
        (
            Setting::Grpc,
            "8081",
            Flag,
            false,
            "flag --grpc: `8081` is a port alone",
            &[],
        ),
        (
            Setting::Grpc,
            "127.0.0.1:7001",
            Flag,
            true,
            "sluice.yaml with flag --grpc",
            &["http and grpc are both 127.0.0.1:7001"],
        ),
        (
            Setting::RedisUrl,
            "http://u:secret@h:1",
            Env,
            false,
            "env SLUICE_REDIS_URL: `http://h:1` is not a Redis URL",
            &[],
        ),
        (
            Setting::KeyPrefix,
            "app:",
            Env,
            true,
            "env SLUICE_KEY_PREFIX: `app:`: the store is memory",
            &[],
        ),
        (
            Setting::KeyPrefix,
            "{app}",
            Flag,
            false,
            "flag --key-prefix: `{app}`",
            &[],
        ),
    ] {
        let pairs = [(setting, value, as_given)];
        let e = if applied {
            applied_error(&pairs)
        } else {
            check_error(&pairs)
        };
        assert!(e.starts_with(starts), "{e}");
        for part in holds {
            assert!(e.contains(part), "{part}: {e}");
        }
        assert!(!e.contains("secret"), "a password is never shown: {e}");
    }
}

#[test]
fn a_rules_directory_adds_the_rls_section_replaces_a_directory_and_refuses_xds() {
    let o = given(&[(Setting::RlsConfigDir, "/rules", Given::Env)]);
    let c = o.apply(config(FILE), "sluice.yaml").unwrap();
    let rls = c.rls.unwrap();
    assert_eq!(rls.config_dir(), Some(Path::new("/rules")));
    assert_eq!(rls.on_store_error, FailureMode::Closed);

    let file = config("rls:\n  config_dir: /old\n  shadow_mode: true\n");
    let rls = o.apply(file, "sluice.yaml").unwrap().rls.unwrap();
    assert_eq!(rls.config_dir(), Some(Path::new("/rules")));
    assert!(rls.shadow_mode, "the file's other rls settings stay");

    let file = config("rls:\n  xds: {address: http://127.0.0.1:18000, node_id: n}\n");
    let e = o.apply(file, "sluice.yaml").unwrap_err().to_string();
    assert!(e.starts_with("env SLUICE_RLS_CONFIG_DIR: `/rules`"), "{e}");
    assert!(e.contains("rls.xds"), "{e}");
}

#[test]
fn without_a_file_the_demo_unless_a_rules_directory_is_given() {
    let demo = ConfigSource::default();
    assert_eq!(demo.without_file(), Some(NoFile::Demo));
    assert_eq!(demo.load().unwrap().policies.len(), 1);
    let rules = ConfigSource {
        file: None,
        overrides: given(&[(Setting::RlsConfigDir, "/rules", Given::Env)]),
    };
    assert_eq!(rules.without_file(), Some(NoFile::RulesOnly));
    let c = rules.load().unwrap();
    assert!(c.policies.is_empty());
    assert_eq!(c.rls.unwrap().config_dir(), Some(Path::new("/rules")));
}

#[test]
fn explain_says_flag_env_file_or_default_and_hides_passwords() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sluice.yaml");
    std::fs::write(&path, FILE).unwrap();
    let source = ConfigSource {
        file: Some(path.clone()),
        overrides: given(&[
            (Setting::Grpc, "127.0.0.1:7002", Given::Flag),
            (Setting::RedisUrl, "redis://:hunter2@h:6379", Given::Env),
        ]),
    };
    let c = source.load().unwrap();
    let lines: Vec<(String, String, String)> = source
        .explain(&c)
        .into_iter()
        .map(|e| (e.key, e.value, e.origin))
        .collect();
    let file = format!("file {}", path.display());
    let line = |key: &str| lines.iter().find(|l| l.0 == key).unwrap().clone();
    assert_eq!(
        line("listen.http"),
        ("listen.http".into(), "127.0.0.1:7001".into(), file.clone())
    );
    assert_eq!(line("listen.grpc").2, "flag --grpc");
    assert_eq!(line("listen.admin").2, "default");
    assert_eq!(
        line("store"),
        (
            "store".into(),
            "redis redis://h:6379".into(),
            "env SLUICE_REDIS_URL".into()
        )
    );
    assert_eq!(line("store.key_prefix").2, "default");
    assert_eq!(line("policies").2, file);
    assert!(!format!("{lines:?}").contains("hunter2"));
}
