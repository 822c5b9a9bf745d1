//! Configuration from flags and `SLUICE_*` variables, as an operator meets
//! it: the real binary, real files, ports that actually listen. Precedence is flag >
//! environment > file > default, shown by `sluice config check --explain` and by the port a
//! server answers on; a bad value is refused naming the flag or variable, exit 2; a reload
//! re-applies the same values; the server starts with no file at all.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;

use support::{Served, text};

/// Every variable the binary reads, cleared so that the caller's environment never leaks in.
const VARIABLES: &[&str] = &[
    "SLUICE_CONFIG",
    "SLUICE_HTTP",
    "SLUICE_GRPC",
    "SLUICE_ADMIN",
    "SLUICE_REDIS_URL",
    "SLUICE_KEY_PREFIX",
    "SLUICE_RLS_CONFIG_DIR",
    "SLUICE_LOG_FORMAT",
    "SLUICE_LOG_LEVEL",
    "RUST_LOG",
];

fn sluice(env: &[(&str, &str)]) -> Command {
    let mut c = support::sluice();
    for v in VARIABLES {
        c.env_remove(v);
    }
    c.envs(env.iter().copied());
    c
}

fn port() -> u16 {
    sluice_testkit::free_port().unwrap()
}

/// `sluice config check --explain ARGS` with `env`: the `key → (value, origin)` of each line.
fn explain(env: &[(&str, &str)], args: &[&str]) -> Vec<(String, String, String)> {
    let o = sluice(env)
        .args(["config", "check", "--explain"])
        .args(args)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o.stderr));
    text(&o.stdout)
        .lines()
        .skip(1)
        .map(|l| {
            let (key, rest) = l.split_once(' ').unwrap();
            let (value, origin) = rest.trim().rsplit_once("  (").unwrap();
            (
                key.to_owned(),
                value.to_owned(),
                origin.trim_end_matches(')').to_owned(),
            )
        })
        .collect()
}

fn line(lines: &[(String, String, String)], key: &str) -> (String, String) {
    let l = lines
        .iter()
        .find(|l| l.0 == key)
        .unwrap_or_else(|| panic!("no {key} in {lines:?}"));
    (l.1.clone(), l.2.clone())
}

/// Each `(key, value, source)` of `want` is a line of `lines`.
fn assert_lines(lines: &[(String, String, String)], want: &[(&str, &str, &str)]) {
    for &(key, value, source) in want {
        assert_eq!(
            line(lines, key),
            (value.to_owned(), source.to_owned()),
            "{key}"
        );
    }
}

fn write(dir: &Path, name: &str, body: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, body).unwrap();
    path
}

/// A new directory holding `sluice.yaml` with `body`, and the file's path.
fn sluice_yaml(body: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let file = write(dir.path(), "sluice.yaml", body);
    (dir, file)
}

#[test]
fn explain_shows_flag_over_env_over_file_over_default() {
    let (_dir, file) = sluice_yaml(
        "listen:\n  http: 127.0.0.1:7001\n  grpc: 127.0.0.1:7002\npolicies:\n  api:\n    limits:\n      - { max: 1, per: 1s }\n",
    );
    let file = file.to_str().unwrap();
    let from_file = format!("file {file}");

    // File over default.
    let l = explain(&[("SLUICE_CONFIG", file)], &[]);
    assert_lines(
        &l,
        &[
            ("config", file, "env SLUICE_CONFIG"),
            ("listen.http", "127.0.0.1:7001", &from_file),
            ("store", "memory", "default"),
            ("log.format", "human", "default"),
        ],
    );

    // Environment over file.
    let l = explain(
        &[
            ("SLUICE_HTTP", "0.0.0.0:9001"),
            ("SLUICE_LOG_FORMAT", "json"),
            ("SLUICE_LOG_LEVEL", "debug"),
        ],
        &[file],
    );
    assert_lines(
        &l,
        &[
            ("config", file, "argument"),
            ("listen.http", "0.0.0.0:9001", "env SLUICE_HTTP"),
            ("listen.grpc", "127.0.0.1:7002", &from_file),
            ("log.format", "json", "env SLUICE_LOG_FORMAT"),
            ("log.level", "debug", "env SLUICE_LOG_LEVEL"),
        ],
    );

    // Flag over environment; a Redis URL's password never shown.
    let l = explain(
        &[
            ("SLUICE_HTTP", "0.0.0.0:9001"),
            ("SLUICE_REDIS_URL", "redis://sluice:hunter2@redis:6379"),
            ("SLUICE_KEY_PREFIX", "env:"),
        ],
        &[
            "--config",
            file,
            "--http",
            "0.0.0.0:9100",
            "--key-prefix",
            "flag:",
            "--log-format",
            "json",
        ],
    );
    assert_eq!(line(&l, "config").1, "flag --config");
    assert_eq!(line(&l, "listen.admin").1, "default");
    assert_lines(
        &l,
        &[
            ("listen.http", "0.0.0.0:9100", "flag --http"),
            ("store", "redis redis://redis:6379", "env SLUICE_REDIS_URL"),
            ("store.key_prefix", "flag:", "flag --key-prefix"),
            ("log.format", "json", "flag --log-format"),
        ],
    );
    assert!(!format!("{l:?}").contains("hunter2"));
}

#[test]
fn bad_values_are_refused_naming_the_flag_or_variable_and_the_value() {
    // A variable (`NAME=value`) or flags (split at spaces), and what the error says.
    let cases = [
        (
            "SLUICE_HTTP=nonsense",
            "env SLUICE_HTTP: `nonsense` is not a socket address",
        ),
        ("--grpc 8081", "flag --grpc: `8081` is a port alone"),
        (
            "SLUICE_ADMIN=localhost:9090",
            "env SLUICE_ADMIN: `localhost:9090` names a host",
        ),
        (
            "SLUICE_LOG_FORMAT=xml",
            "env SLUICE_LOG_FORMAT: `xml` is not a log format",
        ),
        (
            "SLUICE_LOG_LEVEL=info,[[",
            "env SLUICE_LOG_LEVEL: `info,[[` is not a log filter",
        ),
        (
            "SLUICE_REDIS_URL=http://u:secret@h:1",
            "env SLUICE_REDIS_URL: `http://h:1` is not a Redis URL",
        ),
        ("SLUICE_KEY_PREFIX={x}", "env SLUICE_KEY_PREFIX: `{x}`"),
    ];
    for (setting, said) in cases {
        let (env, args): (Vec<(&str, &str)>, Vec<&str>) = match setting.split_once('=') {
            Some(variable) if !setting.starts_with("--") => (vec![variable], Vec::new()),
            _ => (Vec::new(), setting.split_whitespace().collect()),
        };
        for command in [&["config", "check"][..], &["serve"][..]] {
            let o = sluice(&env).args(command).args(&args).output().unwrap();
            let err = text(&o.stderr);
            assert_eq!(
                o.status.code(),
                Some(2),
                "{command:?} {env:?} {args:?}: {err}"
            );
            assert!(err.contains(said), "{command:?} {env:?} {args:?}: {err}");
            assert!(
                !err.contains("secret") && !err.contains("panicked"),
                "{err}"
            );
        }
    }
}

#[test]
fn a_redis_url_does_not_replace_a_cluster_named_by_the_file() {
    let (_dir, file) =
        sluice_yaml("store:\n  backend: redis\n  cluster: [redis://10.0.0.1:7000]\n");
    let o = sluice(&[("SLUICE_REDIS_URL", "redis://10.0.0.9:6379")])
        .args(["config", "check"])
        .arg(&file)
        .output()
        .unwrap();
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("env SLUICE_REDIS_URL: `redis://10.0.0.9:6379` names one Redis")
            && err.contains("names a Redis Cluster (store.cluster)"),
        "{err}"
    );
}

/// `sluice serve ARGS` with `env`, its output in files of `dir`; returns once `/healthz`
/// answers on `http`.
fn serve(dir: &Path, env: &[(&str, &str)], args: &[&str], http: u16) -> Served {
    let mut command = sluice(env);
    command.arg("serve").args(args);
    Served::start(command, dir, http)
}

/// One HTTP/1.1 request to 127.0.0.1:`port`; (status, body), or (0, "") when nothing answers.
fn call(port: u16, method: &str, path: &str, body: Option<&str>) -> (u16, String) {
    support::call(&format!("127.0.0.1:{port}"), method, path, "", body)
}

/// The decisions a successful `sluice bench --json` counts: (allowed, denied).
fn allowed_and_denied(o: &std::process::Output) -> (u64, u64) {
    assert!(o.status.success(), "{}", text(&o.stderr));
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let count = |what: &str| r[what].as_u64().unwrap();
    (count("allowed"), count("denied"))
}

fn check(port: u16, policy: &str) -> u16 {
    call(
        port,
        "POST",
        "/v1/check",
        Some(&format!(r#"{{"policy": "{policy}", "key": "k"}}"#)),
    )
    .0
}

fn listening(port: u16) -> bool {
    std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
}

#[test]
fn the_server_listens_where_the_flag_says_over_the_variable_and_the_file() {
    let (file_http, env_http, flag_http) = (port(), port(), port());
    let (file_grpc, env_grpc, env_admin) = (port(), port(), port());
    let (dir, file) = sluice_yaml(&format!(
        "listen:\n  http: 127.0.0.1:{file_http}\n  grpc: 127.0.0.1:{file_grpc}\npolicies:\n  api:\n    limits:\n      - {{ max: 100, per: 1m }}\n"
    ));
    let (env_http_addr, env_grpc_addr, env_admin_addr, flag_http_addr) = (
        format!("127.0.0.1:{env_http}"),
        format!("127.0.0.1:{env_grpc}"),
        format!("127.0.0.1:{env_admin}"),
        format!("127.0.0.1:{flag_http}"),
    );
    let s = serve(
        dir.path(),
        &[
            ("SLUICE_CONFIG", file.to_str().unwrap()),
            ("SLUICE_HTTP", &env_http_addr),
            ("SLUICE_GRPC", &env_grpc_addr),
            ("SLUICE_ADMIN", &env_admin_addr),
        ],
        &["--http", &flag_http_addr],
        flag_http,
    );
    assert_eq!(
        check(flag_http, "api"),
        200,
        "the flag's port serves the API"
    );
    assert!(
        listening(env_grpc),
        "gRPC on the variable's port, not the file's"
    );
    assert_eq!(
        call(env_admin, "GET", "/metrics", None).0,
        200,
        "the admin routes on the variable's port"
    );
    for (port, what) in [
        (env_http, "SLUICE_HTTP (under the flag)"),
        (file_http, "the file's listen.http"),
        (file_grpc, "the file's listen.grpc"),
    ] {
        assert!(!listening(port), "nothing listens on {what}: {port}");
    }
    drop(s);
}

/// A reload re-reads the file and applies the same flags and variables: the rules directory
/// of `SLUICE_RLS_CONFIG_DIR` stays in force, the listen address of `--http` is not taken for
/// a changed `listen` section, and an edit in that directory reloads too.
#[test]
fn a_reload_keeps_the_flags_and_variables() {
    let dir = tempfile::tempdir().unwrap();
    let rules = dir.path().join("rules");
    std::fs::create_dir(&rules).unwrap();
    let rule = "domain: edge\ndescriptors:\n  - key: client\n    rate_limit: {unit: minute, requests_per_unit: 3}\n";
    write(&rules, "edge.yaml", rule);
    let (file_http, http, grpc) = (port(), port(), port());
    let config = format!(
        "listen:\n  http: 127.0.0.1:{file_http}\n  grpc: 127.0.0.1:{grpc}\npolicies:\n  api:\n    limits:\n      - {{ max: 100, per: 1m }}\n"
    );
    let file = write(dir.path(), "sluice.yaml", &config);
    let mut s = serve(
        dir.path(),
        &[("SLUICE_RLS_CONFIG_DIR", rules.to_str().unwrap())],
        &[
            "--config",
            file.to_str().unwrap(),
            "--http",
            &format!("127.0.0.1:{http}"),
        ],
        http,
    );
    let decided = |descriptor: &str| {
        let o = sluice(&[])
            .args(["bench", "--target", "grpc", "--grpc"])
            .arg(format!("http://127.0.0.1:{grpc}"))
            .args([
                "--domain",
                "edge",
                "--descriptor-key",
                descriptor,
                "--keys",
                "hot",
            ])
            .args(["--requests", "5", "--concurrency", "1", "--json"])
            .output()
            .unwrap();
        allowed_and_denied(&o)
    };
    assert_eq!(decided("client"), (3, 2), "the variable's rules decide");
    assert_eq!(decided("tenant"), (5, 0), "no rule for tenant yet");

    std::fs::write(
        &file,
        config + "  web:\n    limits:\n      - { max: 1, per: 1s }\n",
    )
    .unwrap();
    s.wait_until("the edited file reloads", |s| {
        s.stats()["config"]["generation"] == 2
    });
    assert_eq!(
        check(http, "web"),
        200,
        "the new policy, on the flag's port"
    );
    assert_eq!(
        decided("client"),
        (0, 5),
        "the variable's rules after the reload, their count going on"
    );
    assert!(s.stats()["config"]["last_reload_error"].is_null());

    let tenant = "  - key: tenant\n    rate_limit: {unit: minute, requests_per_unit: 4}\n";
    write(&rules, "edge.yaml", &format!("{rule}{tenant}"));
    s.wait_until("the edited rule reloads", |s| {
        s.stats()["config"]["generation"] == 3
    });
    assert_eq!(
        decided("tenant"),
        (4, 1),
        "the rule added in the variable's directory"
    );
    let log = s.log();
    assert!(
        !log.contains("section changed"),
        "the overrides were applied again, so nothing start-only changed:\n{log}"
    );
}

#[test]
fn without_a_file_the_demo_serves_where_the_variables_say() {
    let dir = tempfile::tempdir().unwrap();
    let (http, grpc) = (port(), port());
    let s = serve(
        dir.path(),
        &[
            ("SLUICE_HTTP", &format!("127.0.0.1:{http}")),
            ("SLUICE_GRPC", &format!("127.0.0.1:{grpc}")),
        ],
        &[],
        http,
    );
    assert_eq!(check(http, "demo"), 200);
    assert!(listening(grpc));
    let out = s.stdout();
    assert!(
        out.contains("no --config given; serving the in-memory store with this demo configuration")
            && out.contains(&format!("curl -s -X POST http://127.0.0.1:{http}/v1/check")),
        "{out}"
    );
}

/// With no file, the rules directory of the variable is served alone, and watched: an edited
/// rule file reloads as under a file's `rls.config_dir`.
#[test]
fn without_a_file_a_rules_directory_is_served_alone_and_reloaded() {
    let dir = tempfile::tempdir().unwrap();
    let rules = dir.path().join("rules");
    std::fs::create_dir(&rules).unwrap();
    write(
        &rules,
        "edge.yaml",
        "domain: edge\ndescriptors:\n  - key: client\n    rate_limit: {unit: minute, requests_per_unit: 2}\n",
    );
    let (http, grpc) = (port(), port());
    let mut s = serve(
        dir.path(),
        &[
            ("SLUICE_HTTP", &format!("127.0.0.1:{http}")),
            ("SLUICE_GRPC", &format!("127.0.0.1:{grpc}")),
            ("SLUICE_RLS_CONFIG_DIR", rules.to_str().unwrap()),
        ],
        &[],
        http,
    );
    assert_eq!(check(http, "demo"), 404, "no demo policy beside the rules");
    let decided = |descriptor: &str| {
        let o = sluice(&[])
            .args(["bench", "--target", "grpc", "--grpc"])
            .arg(format!("http://127.0.0.1:{grpc}"))
            .args(["--domain", "edge", "--descriptor-key", descriptor])
            .args([
                "--keys",
                "hot",
                "--requests",
                "4",
                "--concurrency",
                "1",
                "--json",
            ])
            .output()
            .unwrap();
        allowed_and_denied(&o)
    };
    assert_eq!(decided("client"), (2, 2));
    assert_eq!(decided("tenant"), (4, 0), "no rule for tenant yet");
    write(
        &rules,
        "edge.yaml",
        "domain: edge\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: minute, requests_per_unit: 1}\n",
    );
    s.wait_until("the edited rule reloads", |s| {
        s.stats()["config"]["generation"] == 2
    });
    assert_eq!(decided("tenant"), (1, 3), "the edited rule");
    assert!(
        s.stdout().contains("serving the Envoy rules of"),
        "{}",
        s.stdout()
    );
}

/// `SLUICE_REDIS_URL` alone: the server counts in that Redis (the keys carry
/// `SLUICE_KEY_PREFIX`), with no file.
#[test]
fn without_a_file_the_redis_url_and_key_prefix_are_used() {
    if !sluice_testkit::require_redis() {
        return;
    }
    let redis = sluice_testkit::RedisServer::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (http, grpc) = (port(), port());
    let _s = serve(
        dir.path(),
        &[
            ("SLUICE_HTTP", &format!("127.0.0.1:{http}")),
            ("SLUICE_GRPC", &format!("127.0.0.1:{grpc}")),
            ("SLUICE_REDIS_URL", &redis.url()),
            ("SLUICE_KEY_PREFIX", "envtest:"),
        ],
        &[],
        http,
    );
    assert_eq!(check(http, "demo"), 200);
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("*")
        .query(&mut redis.connection().unwrap())
        .unwrap();
    assert!(
        !keys.is_empty() && keys.iter().all(|k| k.starts_with("envtest:")),
        "the variable's prefix: {keys:?}"
    );
}

#[test]
fn help_names_every_variable_and_never_shows_a_redis_password() {
    let o = sluice(&[("SLUICE_REDIS_URL", "redis://u:hunter2@h:6379")])
        .args(["serve", "--help"])
        .output()
        .unwrap();
    let help = text(&o.stdout);
    assert!(!help.contains("hunter2"), "{help}");
    for v in &VARIABLES[..7] {
        assert!(help.contains(v), "serve --help names {v}:\n{help}");
    }
    let o = sluice(&[]).args(["--help"]).output().unwrap();
    let help = text(&o.stdout);
    assert!(
        help.contains("SLUICE_LOG_LEVEL") && help.contains("SLUICE_LOG_FORMAT"),
        "{help}"
    );
}
