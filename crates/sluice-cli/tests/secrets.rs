//! Secrets never show: the real `sluice` binary, serving with an admin token and a Redis ACL
//! user's password, at debug log level, is driven through every route (with and without the
//! token), through a Redis outage, a failed start with a wrong password and `config check`;
//! then its whole log, every response body and the metrics are searched for the secrets.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod support;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use sluice_testkit::ServerOptions;
use support::text;

const TOKEN: &str = "adm1n-T0ken-5f3a9c0e7b21d4";
const PASSWORD: &str = "redis-Pa55-8e1f0c7d2b9a";
const WRONG: &str = "wr0ng-Pa55-77c1e9a0f3b2";

fn sluice() -> Command {
    let mut c = support::sluice();
    c.env("RUST_LOG", "debug");
    c
}

/// Starts `sluice serve`, its stderr into `log`.
fn serve(config: &Path, log: &Path, env: &[(&str, &str)]) -> Child {
    let mut c = sluice();
    c.arg("serve")
        .arg("--config")
        .arg(config)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).unwrap());
    for (k, v) in env {
        c.env(k, v);
    }
    c.spawn().unwrap()
}

/// `curl`-like: method, URL, optional bearer token and JSON body; (status, body).
fn call(method: &str, url: &str, token: Option<&str>, body: Option<&str>) -> (u16, String) {
    let (host, path) = url.trim_start_matches("http://").split_once('/').unwrap();
    let auth = token
        .map(|t| format!("authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    let headers = format!("{auth}content-type: application/json\r\n");
    support::call(host, method, &format!("/{path}"), &headers, body)
}

/// `sluice config check ARGS FILE`: what it printed, stdout then stderr.
fn config_check(args: &[&str], file: &Path) -> String {
    let o = sluice()
        .args(["config", "check"])
        .args(args)
        .arg(file)
        .output()
        .unwrap();
    format!("{}{}", text(&o.stdout), text(&o.stderr))
}

fn wait_ready(url: &str, child: &mut Child) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        assert!(child.try_wait().unwrap().is_none(), "sluice serve exited");
        if std::net::TcpStream::connect(url.trim_start_matches("http://")).is_ok()
            && call("GET", &format!("{url}/readyz"), None, None).0 == 200
        {
            return;
        }
        assert!(Instant::now() < deadline, "sluice serve never became ready");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn assert_secret_free(what: &str, text: &str) {
    for secret in [TOKEN, PASSWORD, WRONG] {
        assert!(!text.contains(secret), "{what} shows a secret:\n{text}");
    }
}

#[test]
fn no_log_error_body_or_metric_shows_a_token_or_a_password() {
    if !sluice_testkit::require_redis() {
        return;
    }
    let mut redis = ServerOptions::new()
        .args(sluice_testkit::acl_user("alice", PASSWORD, "*"))
        .start()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("tokens"), format!("{TOKEN}\n")).unwrap();
    std::fs::write(dir.path().join("wrong"), format!("{WRONG}\n")).unwrap();
    let http = sluice_testkit::free_port().unwrap();
    let url = format!("http://127.0.0.1:{http}");
    let port = redis.port();
    // A configuration file `name` with `store` for its store settings.
    let write = |name: &str, store: &str| {
        let path = dir.path().join(name);
        let config = format!(
            "listen:\n  http: 127.0.0.1:{http}\n  grpc: 127.0.0.1:{}\nadmin:\n  tokens_file: tokens\n  protect_metrics: true\npolicies:\n  api:\n    limits:\n      - {{ max: 2, per: 1m }}\n    on_store_error: closed\nstore:\n  backend: redis\n{store}",
            sluice_testkit::free_port().unwrap()
        );
        std::fs::write(&path, config).unwrap();
        path
    };
    // The password in the URL.
    let good = write(
        "good.yaml",
        &format!("  shards:\n    - primary: redis://alice:{PASSWORD}@127.0.0.1:{port}\n"),
    );
    let log = dir.path().join("serve.log");
    let mut child = serve(&good, &log, &[]);
    wait_ready(&url, &mut child);

    let mut bodies = Vec::new();
    let decision = r#"{"policy": "api", "key": "user:1"}"#;
    for token in [None, Some("not-the-token-0123456789"), Some(TOKEN)] {
        let calls = [
            ("POST", "v1/check", Some(decision)),
            ("POST", "v1/peek", Some(decision)),
            ("POST", "v1/refund", Some(decision)),
            ("DELETE", "v1/keys/api/user:1", None),
            ("GET", "v1/policies", None),
            ("GET", "metrics", None),
            ("GET", "readyz", None),
            ("POST", "v1/check", Some("{\"policy\": \"nope\"")),
        ];
        for (method, path, body) in calls {
            let (status, text) = call(method, &format!("{url}/{path}"), token, body);
            assert!(status < 500, "{method} {path}: {status} {text}");
            if token == Some(TOKEN) && path == "metrics" {
                assert!(text.contains("sluice_decisions_total"), "{text}");
            }
            bodies.push(format!("{method} {path} {status} {text}"));
        }
    }
    // An outage: errors and `/readyz` name the server, redacted.
    redis.kill().unwrap();
    let (status, text) = call("POST", &format!("{url}/v1/check"), None, Some(decision));
    assert_eq!(status, 503, "{text}");
    bodies.push(text);
    let (status, text) = call("GET", &format!("{url}/readyz"), None, None);
    assert_eq!(status, 503, "{text}");
    assert!(
        text.contains(&format!("127.0.0.1:{}", redis.port())),
        "{text}"
    );
    bodies.push(text);
    let (_, metrics) = call("GET", &format!("{url}/metrics"), Some(TOKEN), None);
    child.kill().unwrap();
    child.wait().unwrap();
    redis.restart().unwrap();

    // A start refused for a wrong password (from store.auth), and `config check`.
    let bad = write(
        "bad.yaml",
        &format!(
            "  auth:\n    username: alice\n    password_file: wrong\n  shards:\n    - primary: redis://127.0.0.1:{port}\n"
        ),
    );
    let bad_log = dir.path().join("bad.log");
    let status = serve(&bad, &bad_log, &[]).wait().unwrap();
    assert!(!status.success());
    let refused = std::fs::read_to_string(&bad_log).unwrap();
    assert!(
        refused.contains(&format!("127.0.0.1:{}", redis.port())),
        "the failed start names the server: {refused}"
    );
    let checked = config_check(&[], &good);

    let logged = std::fs::read_to_string(&log).unwrap();
    // The log does name the server (so a leak would be there to see), redacted.
    assert!(
        logged.contains(&format!("redis://127.0.0.1:{}", redis.port())),
        "the log names the server: {logged}"
    );
    assert_secret_free("the serve log", &logged);
    assert_secret_free("the failed start's log", &refused);
    assert_secret_free("config check", &checked);
    assert_secret_free("the metrics", &metrics);
    for body in &bodies {
        assert_secret_free("a response", body);
    }
}

/// A unix socket's URL carries its credentials as query parameters (`?user=`, `?pass=`, in
/// any percent-encoding of their names): none of them shows in the start's log,
/// `config check --explain`, `/v1/stats`, `/metrics` (open without an `admin` section), or
/// the errors and `/readyz` of an outage.
#[test]
fn a_unix_socket_url_s_password_shows_nowhere() {
    if !sluice_testkit::require_redis() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("redis.sock");
    let mut redis = ServerOptions::new()
        .args(sluice_testkit::acl_user("alice", PASSWORD, "*"))
        .arg("--unixsocket")
        .arg(&socket)
        .args(["--unixsocketperm", "700"])
        .start()
        .unwrap();
    let socket = socket.display();
    for url in [
        format!("unix://{socket}?user=alice&pass={PASSWORD}"),
        format!("redis+unix://{socket}?p%61ss={PASSWORD}&user=alice&db=0"),
    ] {
        let http = sluice_testkit::free_port().unwrap();
        let base = format!("http://127.0.0.1:{http}");
        let config = dir.path().join("unix.yaml");
        std::fs::write(
            &config,
            format!(
                "listen:\n  http: 127.0.0.1:{http}\n  grpc: 127.0.0.1:{}\npolicies:\n  api:\n    limits:\n      - {{ max: 2, per: 1m }}\n    on_store_error: closed\nstore:\n  backend: redis\n  shards:\n    - primary: \"{url}\"\n",
                sluice_testkit::free_port().unwrap()
            ),
        )
        .unwrap();
        let log = dir.path().join("unix.log");
        let mut child = serve(&config, &log, &[]);
        wait_ready(&base, &mut child);
        let decision = r#"{"policy": "api", "key": "user:1"}"#;
        let (status, checked) = call("POST", &format!("{base}/v1/check"), None, Some(decision));
        assert_eq!(status, 200, "{url}: {checked}");
        let (_, stats) = call("GET", &format!("{base}/v1/stats"), None, None);
        let (_, metrics) = call("GET", &format!("{base}/metrics"), None, None);
        assert!(metrics.contains("sluice_store_circuit_state{"), "{metrics}");
        redis.kill().unwrap();
        let (status, refused) = call("POST", &format!("{base}/v1/check"), None, Some(decision));
        assert_eq!(status, 503, "{refused}");
        let (_, ready) = call("GET", &format!("{base}/readyz"), None, None);
        child.kill().unwrap();
        child.wait().unwrap();
        redis.restart().unwrap();
        let explained = config_check(&["--explain"], &config);
        let logged = std::fs::read_to_string(&log).unwrap();
        // Each output names the socket (so a leak would be there to see).
        for (what, text) in [
            ("the serve log", &logged),
            ("/v1/stats", &stats),
            ("/metrics", &metrics),
            ("config check --explain", &explained),
            ("/readyz in an outage", &ready),
        ] {
            assert!(
                text.contains(&socket.to_string()),
                "{what} names the socket: {text}"
            );
            assert_secret_free(what, text);
        }
        assert_secret_free("an error in an outage", &refused);
    }
}

/// The other configured URLs, the OTLP collector's and the xDS control plane's, take no
/// credentials (their clients would never send them): `config check` and `serve` refuse
/// each form, naming the field and the URL, without the password.
#[test]
fn the_collector_s_and_the_control_plane_s_urls_refuse_credentials_unshown() {
    let dir = tempfile::tempdir().unwrap();
    let config = |endpoint: &str, address: &str| {
        format!(
            "listen:\n  http: 127.0.0.1:{}\n  grpc: 127.0.0.1:{}\npolicies:\n  api:\n    limits:\n      - {{ max: 2, per: 1m }}\ntracing:\n  endpoint: \"{endpoint}\"\nrls:\n  xds:\n    address: \"{address}\"\n    node_id: sluice\n",
            sluice_testkit::free_port().unwrap(),
            sluice_testkit::free_port().unwrap()
        )
    };
    let clean = ("http://127.0.0.1:4317", "http://127.0.0.1:18001");
    for (field, endpoint, address) in [
        (
            "tracing.endpoint",
            format!("http://otel:{PASSWORD}@127.0.0.1:4317"),
            clean.1.to_owned(),
        ),
        (
            "tracing.endpoint",
            format!("https://otel:{PASSWORD}@127.0.0.1:4317"),
            clean.1.to_owned(),
        ),
        (
            "rls.xds.address",
            clean.0.to_owned(),
            format!("https://cp:{PASSWORD}@127.0.0.1:18001"),
        ),
        (
            "rls.xds.address",
            clean.0.to_owned(),
            format!("http://127.0.0.1:18001/?pass={PASSWORD}"),
        ),
        (
            "rls.xds.address",
            clean.0.to_owned(),
            format!("ftp://cp:{PASSWORD}@h:1"),
        ),
    ] {
        let file = dir.path().join("urls.yaml");
        std::fs::write(&file, config(&endpoint, &address)).unwrap();
        let checked = sluice()
            .args(["config", "check"])
            .arg(&file)
            .output()
            .unwrap();
        assert!(!checked.status.success(), "{endpoint} {address}");
        let checked = String::from_utf8_lossy(&checked.stderr).into_owned();
        assert!(checked.contains(field), "{checked}");
        assert_secret_free("config check", &checked);
        let log = dir.path().join("urls.log");
        let status = serve(&file, &log, &[]).wait().unwrap();
        assert!(!status.success(), "{endpoint} {address}");
        let refused = std::fs::read_to_string(&log).unwrap();
        assert!(
            refused.contains(field) && refused.contains("://"),
            "{refused}"
        );
        assert_secret_free("a refused start", &refused);
    }
}
