//! What the CLI test binaries share: the `sluice` binary, its output, a `sluice serve` child
//! killed when dropped, and raw HTTP/1.1 requests.

#![allow(clippy::unwrap_used, clippy::expect_used, dead_code, unreachable_pub)]

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The `sluice` binary under test.
pub fn sluice() -> Command {
    Command::new(env!("CARGO_BIN_EXE_sluice"))
}

/// `sluice ARGS`, run to its end.
pub fn run(args: &[&str]) -> Output {
    sluice().args(args).output().unwrap()
}

/// Bytes of a child's output, as text.
pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Writes each `(relative path, text)` of `files` below `dir`.
pub fn write_files(dir: &Path, files: &[(&str, &str)]) {
    for (path, text) in files {
        let path = dir.join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }
}

/// A temporary directory holding the file `name` with `text`, and the file's path.
pub fn temp_file(name: &str, text: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join(name);
    std::fs::write(&file, text).unwrap();
    (dir, file)
}

/// A child process, killed (by its own id) and reaped when dropped.
pub struct Process(pub Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Process {
    /// `sluice serve --config FILE`, its output discarded.
    pub fn serve(file: &Path) -> Self {
        Self(
            sluice()
                .arg("serve")
                .arg("--config")
                .arg(file)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap(),
        )
    }

    /// Fails the test if the child has exited.
    pub fn assert_running(&mut self, log: &str) {
        assert!(
            self.0.try_wait().unwrap().is_none(),
            "sluice serve exited:\n{log}"
        );
    }

    /// Polls until 127.0.0.1:`port` accepts connections (30 s at most).
    pub fn wait_listening(&mut self, port: u16) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            self.assert_running("");
            assert!(Instant::now() < deadline, "sluice serve never listened");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Sends SIGHUP.
    pub fn hangup(&self) {
        let status = Command::new("kill")
            .args(["-HUP", &self.0.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
    }
}

/// One HTTP/1.1 request to `host` (`address:port`) with the extra header lines `headers`
/// (each ending in `\r\n`); (status, body), or (0, "") when nothing answers.
pub fn call(
    host: &str,
    method: &str,
    path: &str,
    headers: &str,
    body: Option<&str>,
) -> (u16, String) {
    let Ok(mut stream) = std::net::TcpStream::connect(host) else {
        return (0, String::new());
    };
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let body = body.unwrap_or("");
    let request = format!(
        "{method} {path} HTTP/1.1\r\nhost: {host}\r\nconnection: close\r\n{headers}content-length: {}\r\n\r\n{body}",
        body.len()
    );
    if std::io::Write::write_all(&mut stream, request.as_bytes()).is_err() {
        return (0, String::new());
    }
    let mut response = String::new();
    if stream.read_to_string(&mut response).is_err() || response.len() < 12 {
        return (0, String::new());
    }
    let status = response[9..12].parse().unwrap();
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (status, body)
}

/// A running `sluice serve` whose stdout and stderr are files, on HTTP port `http`.
pub struct Served {
    pub child: Process,
    pub http: u16,
    out: PathBuf,
    err: PathBuf,
}

impl Served {
    /// Spawns `command` (a `sluice serve …`) with its output in files of `dir`; returns once
    /// `/healthz` answers on `http`.
    pub fn start(mut command: Command, dir: &Path, http: u16) -> Self {
        let out = dir.join("serve.out");
        let err = dir.join("serve.err");
        let child = command
            .stdout(std::fs::File::create(&out).unwrap())
            .stderr(std::fs::File::create(&err).unwrap())
            .spawn()
            .unwrap();
        let mut s = Self {
            child: Process(child),
            http,
            out,
            err,
        };
        s.wait_until("/healthz answers", |s| {
            s.call("GET", "/healthz", None).0 == 200
        });
        s
    }

    /// What the server logged (its stderr).
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.err).unwrap_or_default()
    }

    pub fn stdout(&self) -> String {
        std::fs::read_to_string(&self.out).unwrap_or_default()
    }

    /// Polls `cond` until it holds (10 s at most).
    pub fn wait_until(&mut self, what: &str, cond: impl Fn(&Self) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !cond(self) {
            let log = self.log();
            self.child.assert_running(&log);
            assert!(
                Instant::now() < deadline,
                "timed out waiting until {what}; log:\n{log}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Polls until a line of the log contains `words`, and returns that line.
    pub fn logged(&mut self, words: &str) -> String {
        self.wait_until(&format!("`{words}` is logged"), |s| s.log().contains(words));
        let log = self.log();
        log.lines().find(|l| l.contains(words)).unwrap().to_owned()
    }

    /// One HTTP/1.1 request to the server; (status, body), or (0, "") when nothing answers.
    pub fn call(&self, method: &str, path: &str, body: Option<&str>) -> (u16, String) {
        call(&format!("127.0.0.1:{}", self.http), method, path, "", body)
    }

    pub fn stats(&self) -> serde_json::Value {
        serde_json::from_str(&self.call("GET", "/v1/stats", None).1).unwrap_or_default()
    }
}

/// `sluice serve --config sluice.yaml` on free ports, its output discarded; killed when
/// dropped.
pub struct Serve {
    pub child: Process,
    pub http: u16,
    pub grpc: u16,
    file: PathBuf,
    _dir: tempfile::TempDir,
}

impl Serve {
    /// Writes `config` (its `listen` section given the ports, added if it has none) and each
    /// `(relative path, text)` of `files` beside it, and spawns the server.
    pub fn start(config: &str, files: &[(&str, &str)]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        write_files(dir.path(), files);
        let (http, grpc) = (
            sluice_testkit::free_port().unwrap(),
            sluice_testkit::free_port().unwrap(),
        );
        let file = dir.path().join("sluice.yaml");
        std::fs::write(&file, Self::with_listen(config, http, grpc)).unwrap();
        Self {
            child: Process::serve(&file),
            http,
            grpc,
            file,
            _dir: dir,
        }
    }

    /// Returns once the HTTP port accepts connections.
    pub fn listening(mut self) -> Self {
        self.child.wait_listening(self.http);
        self
    }

    fn with_listen(config: &str, http: u16, grpc: u16) -> String {
        let rest = config.strip_prefix("listen:\n").unwrap_or(config);
        format!("listen:\n  http: 127.0.0.1:{http}\n  grpc: 127.0.0.1:{grpc}\n{rest}")
    }

    /// Rewrites the configuration file (the server reloads it by content).
    pub fn rewrite(&self, config: &str) {
        std::fs::write(&self.file, Self::with_listen(config, self.http, self.grpc)).unwrap();
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.http)
    }

    /// Polls `GET /readyz` until it answers 200.
    pub async fn ready(&mut self, client: &reqwest::Client) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            self.child.assert_running("");
            if let Ok(r) = client.get(self.url("/readyz")).send().await
                && r.status() == 200
            {
                return;
            }
            assert!(Instant::now() < deadline, "sluice serve never became ready");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}
