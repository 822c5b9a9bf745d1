//! `sluice serve` and `sluice config check` as an operator meets them: the real binary, real
//! files, signals and its log: an empty file is refused at start and on a reload,
//! SIGHUP reloads, a changed `listen` section is a warning, the warning of a server without an
//! `admin` section names every admin route, and a fatal start error is JSON with
//! `--log-format json`.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod support;

use std::io::Read;
use std::path::PathBuf;
use std::process::Output;
use std::time::Duration;

use support::{Served, sluice, temp_file, text};

fn stderr(o: &Output) -> String {
    text(&o.stderr)
}

/// A running `sluice serve --config sluice.yaml`, its log in a file; killed when dropped.
struct Serve {
    served: Served,
    _dir: tempfile::TempDir,
    file: PathBuf,
}

impl Serve {
    /// Writes `config` (with `{http}` and `{grpc}` replaced by free ports) and starts the
    /// server; returns once `/healthz` answers.
    fn start(config: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let http = sluice_testkit::free_port().unwrap();
        let grpc = sluice_testkit::free_port().unwrap();
        let file = dir.path().join("sluice.yaml");
        std::fs::write(
            &file,
            config
                .replace("{http}", &http.to_string())
                .replace("{grpc}", &grpc.to_string()),
        )
        .unwrap();
        let mut command = sluice();
        command.args(["serve", "--config"]).arg(&file);
        Self {
            served: Served::start(command, dir.path(), http),
            _dir: dir,
            file,
        }
    }
}

impl std::ops::Deref for Serve {
    type Target = Served;
    fn deref(&self) -> &Served {
        &self.served
    }
}

impl std::ops::DerefMut for Serve {
    fn deref_mut(&mut self) -> &mut Served {
        &mut self.served
    }
}

const CONFIG: &str = "listen:\n  http: 127.0.0.1:{http}\n  grpc: 127.0.0.1:{grpc}\npolicies:\n  api:\n    limits:\n      - { max: 100, per: 1m }\n";

/// `sluice ARGS FILE`, run to its end.
fn run_on(args: &[&str], file: &std::path::Path) -> Output {
    sluice().args(args).arg(file).output().unwrap()
}

/// Polls until the last reload error, `what`, says `words`.
fn wait_refused(s: &mut Serve, what: &str, words: &str) {
    s.wait_until(what, |s| {
        s.stats()["config"]["last_reload_error"]
            .as_str()
            .is_some_and(|e| e.contains(words))
    });
}

fn check_api(s: &Serve) -> u16 {
    s.call(
        "POST",
        "/v1/check",
        Some(r#"{"policy": "api", "key": "k"}"#),
    )
    .0
}

#[test]
fn config_check_counts_one_policy_in_words() {
    let (_dir, file) = temp_file(
        "one.yaml",
        "policies:\n  api:\n    limits: [{ max: 1, per: 1s }]\n",
    );
    let o = run_on(&["config", "check"], &file);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.ends_with(": valid (1 policy)\n"), "{out}");
}

#[test]
fn an_empty_file_stops_the_server_at_start() {
    let (_dir, file) = temp_file("empty.yaml", "# nothing yet\n");
    let o = run_on(&["serve", "--config"], &file);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("the file is empty"), "{}", stderr(&o));
    let o = run_on(&["config", "check"], &file);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("the file is empty"), "{}", stderr(&o));
}

/// A collector reading JSON lines gets the reason the server did not start as one of them.
#[test]
fn with_log_format_json_a_fatal_start_error_is_a_json_line() {
    let (_dir, file) = temp_file(
        "bad.yaml",
        "policies:\n  api:\n    limits: [{ max: 0, per: 1s }]\n",
    );
    let o = run_on(&["--log-format", "json", "serve", "--config"], &file);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let lines: Vec<serde_json::Value> = stderr(&o)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not a JSON line ({e}): {l}")))
        .collect();
    let fatal = lines
        .iter()
        .find(|l| l["level"] == "ERROR")
        .unwrap_or_else(|| panic!("no ERROR line in {lines:?}"));
    let message = fatal["fields"]["message"].as_str().unwrap();
    assert!(
        message.contains("bad.yaml:3:") && message.contains("max: 0 is out of range"),
        "{message}"
    );
}

/// The warning used to name three of the open admin routes; it names every one of the route
/// table's.
#[test]
fn without_an_admin_section_the_start_warning_names_every_admin_route() {
    let mut s = Serve::start(CONFIG);
    let line = s.logged("no admin section");
    assert!(line.contains("WARN"), "{line}");
    for (method, path) in sluice_server::http::admin_routes() {
        assert!(
            line.contains(&format!("{method} {path}")),
            "{method} {path} is missing from: {line}"
        );
    }
}

/// An editor's truncating write (and SIGHUP on an empty file) used to drop every policy: the
/// reload is refused, the last good configuration answers, and the reason is in /v1/stats and
/// the log at ERROR. SIGHUP forces a reload of an unchanged file; a changed `listen` section is
/// a warning that it applies after a restart.
#[test]
fn an_emptied_file_is_refused_and_sighup_reloads() {
    let mut s = Serve::start(CONFIG);
    assert_eq!(check_api(&s), 200);
    assert_eq!(s.stats()["config"]["generation"], 1);

    // SIGHUP with nothing changed: a reload all the same.
    s.child.hangup();
    s.wait_until("SIGHUP reloaded", |s| {
        s.stats()["config"]["generation"] == 2
    });

    // Truncated (as an editor saving in place does first), caught by the watcher and by
    // SIGHUP alike: refused.
    std::fs::File::create(&s.file).unwrap();
    s.child.hangup();
    wait_refused(&mut s, "the empty file is refused", "the file is empty");
    assert_eq!(check_api(&s), 200, "the last good policy answers");
    assert_eq!(s.stats()["config"]["generation"], 2);
    let refused = s.logged("the file is empty");
    assert!(refused.contains("ERROR"), "{refused}");

    // A file that would remove every policy: refused too.
    std::fs::write(&s.file, "{}\n").unwrap();
    wait_refused(
        &mut s,
        "the policy-less file is refused",
        "no policies where the running one has 1 (api)",
    );
    assert_eq!(check_api(&s), 200);

    // Half-written: cut in the middle of a limit.
    std::fs::write(&s.file, "policies:\n  api:\n    limits:\n      - { max: 10").unwrap();
    wait_refused(&mut s, "the half-written file is refused", "never closed");
    assert_eq!(check_api(&s), 200);

    // The rest of the write: applied, the error cleared; the moved listener is a warning.
    let http = s.http.to_string();
    let next = CONFIG
        .replace("{http}", &http)
        .replace("grpc: 127.0.0.1:{grpc}", "grpc: 127.0.0.1:1")
        + "  web:\n    limits:\n      - { max: 1, per: 1s }\n";
    std::fs::write(&s.file, next).unwrap();
    s.wait_until("the whole file applies", |s| {
        s.stats()["config"]["generation"] == 3
    });
    assert!(s.stats()["config"]["last_reload_error"].is_null());
    assert_eq!(
        s.call(
            "POST",
            "/v1/check",
            Some(r#"{"policy": "web", "key": "k"}"#)
        )
        .0,
        200
    );
    let log = s.log();
    let moved = log
        .lines()
        .find(|l| l.contains("the listen section changed"))
        .unwrap_or_else(|| panic!("no listen warning in:\n{log}"));
    assert!(
        moved.contains("WARN") && moved.contains("applies after a restart"),
        "{moved}"
    );
}

/// With the process's file descriptors exhausted, no client was answered and nothing
/// was logged. At `listen.max_connections` the listener stops accepting, says so at WARN, the
/// open connections are served, and the waiting client is answered once one closes.
#[test]
fn at_the_connection_bound_the_listener_says_so_and_new_clients_wait() {
    use std::io::Write;
    let mut s = Serve::start(&CONFIG.replace("listen:\n", "listen:\n  max_connections: 2\n"));
    let keep_alive = |stream: &mut std::net::TcpStream| -> String {
        stream
            .write_all(b"GET /healthz HTTP/1.1\r\nhost: sluice\r\n\r\n")
            .unwrap();
        let mut buf = [0u8; 1024];
        let n = stream.read(&mut buf).unwrap();
        String::from_utf8_lossy(&buf[..n]).into_owned()
    };
    let open = || {
        let stream = std::net::TcpStream::connect(("127.0.0.1", s.http)).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        stream
    };
    let mut a = open();
    // The readiness check's connections close by themselves (`connection: close`): wait
    // until `a` is answered, which proves it was accepted.
    assert!(keep_alive(&mut a).starts_with("HTTP/1.1 200"));
    let mut b = open();
    assert!(keep_alive(&mut b).starts_with("HTTP/1.1 200"));
    let mut c = open();
    c.write_all(b"GET /healthz HTTP/1.1\r\nhost: sluice\r\n\r\n")
        .unwrap();
    let line = s.logged("listener at its connection bound");
    assert!(
        line.contains("WARN")
            && line.contains("listener=\"http\"")
            && line.contains("max_connections=2"),
        "{line}"
    );
    // The open ones are served; the third is not, while they stay open.
    assert!(keep_alive(&mut a).starts_with("HTTP/1.1 200"));
    assert!(keep_alive(&mut b).starts_with("HTTP/1.1 200"));
    c.set_nonblocking(true).unwrap();
    let mut nothing = [0u8; 64];
    assert!(
        matches!(c.read(&mut nothing), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
        "the third client was answered beyond the bound"
    );
    c.set_nonblocking(false).unwrap();
    drop(b);
    let mut answer = [0u8; 1024];
    let n = c.read(&mut answer).unwrap();
    assert!(answer[..n].starts_with(b"HTTP/1.1 200"));
}

/// Without an `admin` section, an admin listener keeps the admin routes to this machine only
/// on loopback: on any other address the start warns, naming the listener.
#[test]
fn an_admin_listener_off_loopback_without_an_admin_section_is_warned_about() {
    for (ip, warned) in [("0.0.0.0", true), ("127.0.0.1", false)] {
        let admin = sluice_testkit::free_port().unwrap();
        let config = format!(
            "listen:\n  http: 127.0.0.1:{{http}}\n  grpc: 127.0.0.1:{{grpc}}\n  admin: {ip}:{admin}\npolicies:\n  api:\n    limits:\n      - {{ max: 100, per: 1m }}\n"
        );
        let mut s = Serve::start(&config);
        // The warning comes before the listeners serve.
        s.wait_until("the admin listener serves", |s| {
            s.log().contains("sluice serving the admin routes")
        });
        let log = s.log();
        let line = log.lines().find(|l| l.contains("no admin section"));
        if warned {
            let line = line.unwrap_or_else(|| panic!("no warning for {ip}:\n{log}"));
            assert!(
                line.contains("WARN")
                    && line.contains(&format!("reaches the admin listener {ip}:{admin}")),
                "{line}"
            );
        } else {
            assert!(line.is_none(), "{log}");
        }
    }
}
