//! One `redis-server` process: [`ServerOptions`] says how to run it, [`RedisServer`] owns it.

use std::collections::HashMap;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use tempfile::TempDir;

use crate::ServerOptions;
use crate::process::{self, ManagedChild};
use crate::{Error, parse_info_field, wait_until};

/// How many fresh ports a start tries before giving up (another process can take a free port
/// between the moment the kit sees it free and the moment the server binds it).
pub const PORT_ATTEMPTS: usize = 5;
/// Connect timeout of [`RedisServer::connection`].
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// Read and write timeout of [`RedisServer::connection`].
pub const IO_TIMEOUT: Duration = Duration::from_secs(5);
/// How long [`RedisServer::restart`] waits for its old port to be bindable again.
const REBIND_TIMEOUT: Duration = Duration::from_secs(5);
/// How long [`RedisServer::pause`] / [`RedisServer::resume`] wait for the process state.
const SIGNAL_TIMEOUT: Duration = Duration::from_secs(5);

/// One command's line of `INFO commandstats`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CommandStats {
    /// Calls so far.
    pub calls: u64,
    /// Server time spent in them, in µs.
    pub usec: u64,
}

impl CommandStats {
    /// The calls and time between `before` and `self`.
    pub fn since(self, before: CommandStats) -> CommandStats {
        CommandStats {
            calls: self.calls.saturating_sub(before.calls),
            usec: self.usec.saturating_sub(before.usec),
        }
    }

    /// µs per call (0 with no call).
    pub fn usec_per_call(self) -> f64 {
        self.usec as f64 / self.calls.max(1) as f64
    }
}

/// A real `redis-server` on a free loopback port, in its own temporary directory.
///
/// Dropping it kills the process (SIGKILL), reaps it and removes the directory, also when the
/// test panics. See the [crate docs](crate) for why.
#[derive(Debug)]
pub struct RedisServer {
    /// `None` while killed. Declared first: dropped before the directory.
    child: Option<ManagedChild>,
    port: u16,
    /// The ports of `options.port_flags`, in order.
    extra_ports: Vec<u16>,
    options: ServerOptions,
    config_file: Option<PathBuf>,
    dir: TempDir,
}

impl RedisServer {
    /// A standalone server with the kit's base arguments.
    pub fn start() -> Result<Self, Error> {
        Self::start_with_options(ServerOptions::new())
    }

    /// A standalone server with extra arguments, e.g. `&["--maxmemory", "10mb"]`.
    pub fn start_with(extra_args: &[&str]) -> Result<Self, Error> {
        Self::start_with_options(ServerOptions::new().args(extra_args.iter().copied()))
    }

    /// A server run as `options` say; see [`ServerOptions::start`].
    pub(crate) fn start_with_options(options: ServerOptions) -> Result<Self, Error> {
        let dir = tempfile::Builder::new()
            .prefix("sluice-redis-")
            .tempdir()
            .map_err(|e| Error::io("creating the server's temp dir", e))?;
        let config_file = match &options.config {
            Some(text) => {
                let path = dir.path().join("redis.conf");
                std::fs::write(&path, text)
                    .map_err(|e| Error::io(format!("writing {}", path.display()), e))?;
                Some(path)
            }
            None => None,
        };
        let mut server = Self {
            child: None,
            port: 0,
            extra_ports: Vec::new(),
            options,
            config_file,
            dir,
        };
        server.spawn(|server| {
            server.port = free_port()?;
            server.extra_ports = (0..server.options.port_flags.len())
                .map(|_| free_port())
                .collect::<Result<_, _>>()?;
            Ok(())
        })?;
        Ok(server)
    }

    /// Starts one server per options, in parallel; all or nothing (on an error, the ones that
    /// did start are killed).
    pub fn start_many(
        options: impl IntoIterator<Item = ServerOptions>,
    ) -> Result<Vec<Self>, Error> {
        let options: Vec<ServerOptions> = options.into_iter().collect();
        std::thread::scope(|scope| {
            let handles: Vec<_> = options
                .into_iter()
                .map(|o| scope.spawn(move || Self::start_with_options(o)))
                .collect();
            let results: Vec<Result<Self, Error>> = handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
                })
                .collect();
            results.into_iter().collect()
        })
    }

    /// Its port (kept across [`kill`](Self::kill) and [`restart`](Self::restart)).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The port it serves TLS on, if a topology started it so (the plain [`port`](Self::port)
    /// stays, for the kit).
    pub fn tls_port(&self) -> Option<u16> {
        let flag = self
            .options
            .port_flags
            .iter()
            .position(|f| *f == "--tls-port");
        flag.and_then(|i| self.extra_ports.get(i).copied())
    }

    /// `"rediss://127.0.0.1:TLS_PORT"`, if it serves TLS.
    pub fn tls_url(&self) -> Option<String> {
        self.tls_port().map(|p| format!("rediss://127.0.0.1:{p}"))
    }

    /// The port it tells others to reach it on: its TLS port if it has one (a topology that
    /// serves TLS replicates and announces over TLS), else its port.
    pub fn announced_port(&self) -> u16 {
        self.tls_port().unwrap_or(self.port)
    }

    /// Whether `port` is its port or its TLS port.
    pub fn listens_on(&self, port: u16) -> bool {
        self.port == port || self.tls_port() == Some(port)
    }

    /// `"127.0.0.1:PORT"`.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// `"redis://127.0.0.1:PORT/"`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// The process id, `None` while killed.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(ManagedChild::pid)
    }

    /// Whether the process is running (it may be paused).
    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// Whether the process is running but stopped (by [`pause`](Self::pause) or any other
    /// SIGSTOP), read live from `/proc`; `false` while killed or if `/proc` cannot be read.
    pub fn is_paused(&self) -> bool {
        self.pid()
            .is_some_and(|pid| is_stopped(pid).unwrap_or(false))
    }

    /// Whether the server can answer: running and not paused. Topologies skip the others when
    /// they poll (a paused server would stall every probe until its I/O timeout).
    pub fn is_reachable(&self) -> bool {
        self.is_running() && !self.is_paused()
    }

    /// The server's private directory (its `--dir`, log file and config file).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Its log file.
    pub fn log_path(&self) -> PathBuf {
        process::log_path(self.dir.path())
    }

    /// The config file written from [`ServerOptions::config`], if any.
    pub fn config_file(&self) -> Option<&Path> {
        self.config_file.as_deref()
    }

    /// A client for its URL (for async connections in tests).
    pub fn client(&self) -> Result<redis::Client, Error> {
        redis::Client::open(self.url())
            .map_err(|e| Error::redis(format!("client for {}", self.addr()), e))
    }

    /// A new sync connection with a [`CONNECT_TIMEOUT`] connect timeout and an [`IO_TIMEOUT`]
    /// read/write timeout, so a paused or dead server fails the test instead of hanging it.
    pub fn connection(&self) -> Result<redis::Connection, Error> {
        self.connection_with_timeouts(CONNECT_TIMEOUT, IO_TIMEOUT)
    }

    /// A new sync connection with the given connect and read/write timeouts.
    pub fn connection_with_timeouts(
        &self,
        connect: Duration,
        io: Duration,
    ) -> Result<redis::Connection, Error> {
        let context = || {
            let state = if self.is_running() {
                ""
            } else {
                " (the server is killed)"
            };
            format!("connecting to {}{state}", self.addr())
        };
        let client = self.client()?;
        let conn = client
            .get_connection_with_timeout(connect)
            .map_err(|e| Error::redis(context(), e))?;
        conn.set_read_timeout(Some(io))
            .and_then(|()| conn.set_write_timeout(Some(io)))
            .map_err(|e| Error::redis(context(), e))?;
        Ok(conn)
    }

    /// Runs one command on a new connection and returns its reply; a server error reply
    /// (e.g. `READONLY`) is an [`Error::Redis`] (see [`Error::redis_error`]).
    ///
    /// ```no_run
    /// # let server = sluice_testkit::RedisServer::start()?;
    /// server.cmd(&["SET", "k", "v"])?;
    /// assert_eq!(server.cmd(&["GET", "k"])?, redis::Value::BulkString(b"v".to_vec()));
    /// # Ok::<(), sluice_testkit::Error>(())
    /// ```
    pub fn cmd(&self, args: &[&str]) -> Result<redis::Value, Error> {
        let (name, rest) = args
            .split_first()
            .ok_or_else(|| Error::InvalidArgument("an empty command".to_owned()))?;
        let mut cmd = redis::cmd(name);
        for arg in rest {
            cmd.arg(*arg);
        }
        let mut conn = self.connection()?;
        cmd.query(&mut conn)
            .map_err(|e| Error::redis(format!("`{}` on {}", args.join(" "), self.addr()), e))
    }

    /// The users of the connected clients (`user=` of `CLIENT LIST`), e.g. to check that a
    /// store logged in as an ACL user.
    pub fn client_users(&self) -> Result<Vec<String>, Error> {
        let mut conn = self.connection()?;
        let list: String = redis::cmd("CLIENT")
            .arg("LIST")
            .query(&mut conn)
            .map_err(|e| Error::redis(format!("`CLIENT LIST` on {}", self.addr()), e))?;
        Ok(list
            .lines()
            .filter_map(|l| l.split(' ').find_map(|f| f.strip_prefix("user=")))
            .map(str::to_owned)
            .collect())
    }

    /// How many times `command` (lowercase, e.g. `fcall`) has run since start or the last
    /// `CONFIG RESETSTAT`, from `INFO commandstats` (commands run inside scripts count too).
    pub fn command_calls(&self, command: &str) -> Result<u64, Error> {
        Ok(self.command_stats()?.get(command).map_or(0, |c| c.calls))
    }

    /// Every command's calls and server time so far, by lowercase name (`fcall`, `hset`, …),
    /// from `INFO commandstats`. A script's `usec` includes the commands it ran, which are
    /// also counted under their own names.
    pub fn command_stats(&self) -> Result<HashMap<String, CommandStats>, Error> {
        Ok(self
            .info("commandstats")?
            .lines()
            .filter_map(|l| {
                let (name, rest) = l.strip_prefix("cmdstat_")?.split_once(':')?;
                let field = |f: &str| {
                    rest.split(',')
                        .find_map(|kv| kv.strip_prefix(f)?.parse::<u64>().ok())
                };
                let stats = CommandStats {
                    calls: field("calls=")?,
                    usec: field("usec=")?,
                };
                Some((name.to_owned(), stats))
            })
            .collect())
    }

    /// The text of `INFO <section>`.
    pub fn info(&self, section: &str) -> Result<String, Error> {
        let mut conn = self.connection()?;
        redis::cmd("INFO")
            .arg(section)
            .query(&mut conn)
            .map_err(|e| Error::redis(format!("`INFO {section}` on {}", self.addr()), e))
    }

    /// One field of `INFO <section>`, e.g. `info_field("replication", "role")`.
    pub fn info_field(&self, section: &str, field: &str) -> Result<Option<String>, Error> {
        let info = self.info(section)?;
        Ok(parse_info_field(&info, field).map(str::to_owned))
    }

    /// Kills the process (SIGKILL) and reaps it, as a crash would. The port, directory and
    /// options are kept for [`restart`](Self::restart). Does nothing if already killed.
    pub fn kill(&mut self) -> Result<(), Error> {
        if let Some(mut child) = self.child.take() {
            child
                .kill_and_wait()
                .map_err(|e| Error::io(format!("killing the server on {}", self.addr()), e))?;
        }
        Ok(())
    }

    /// Freezes the process (SIGSTOP): connections stay open but nothing is answered, like a
    /// stalled server. Returns once the process is stopped.
    pub fn pause(&self) -> Result<(), Error> {
        let pid = self.signal("STOP")?;
        wait_until(
            SIGNAL_TIMEOUT,
            &format!("process {pid} to be stopped"),
            || is_stopped(pid),
        )
    }

    /// Thaws a paused process (SIGCONT). Returns once the process runs again.
    pub fn resume(&self) -> Result<(), Error> {
        let pid = self.signal("CONT")?;
        wait_until(
            SIGNAL_TIMEOUT,
            &format!("process {pid} to run again"),
            || Ok(!is_stopped(pid)?),
        )
    }

    /// Kills the process if it runs, then starts it again on the **same port** with the same
    /// options and directory and waits until it answers `PING`. Waits for the old port to be
    /// bindable and retries a lost race for it a few times.
    ///
    /// The data set is not kept (there is no persistence), but the directory is: files the
    /// server wrote there survive, as on a real host. A cluster node thus keeps its
    /// `nodes.conf` (its node id and its view of the cluster) and rejoins its cluster; a
    /// sentinel keeps its rewritten config (its id, the known sentinels and replicas). The
    /// config file from [`ServerOptions::config`] is not written again.
    pub fn restart(&mut self) -> Result<(), Error> {
        self.kill()?;
        self.spawn(|server| {
            let ports = std::iter::once(server.port).chain(server.extra_ports.iter().copied());
            for port in ports {
                wait_until(
                    REBIND_TIMEOUT,
                    &format!("port {port} to be free for a restart"),
                    || Ok(port_is_free(port)),
                )?;
            }
            Ok(())
        })
    }

    /// Starts the process on its ports, after `ports` chose them (or waited for them to be
    /// free); a lost race for one of them is tried again, up to [`PORT_ATTEMPTS`] times.
    fn spawn(&mut self, ports: impl Fn(&mut Self) -> Result<(), Error>) -> Result<(), Error> {
        let mut attempt = 0;
        loop {
            attempt += 1;
            ports(self)?;
            let mut args = self.options.args.clone();
            for (flag, port) in self.options.port_flags.iter().zip(&self.extra_ports) {
                args.extend([flag.into(), port.to_string().into()]);
            }
            let (dir, config) = (self.dir.path(), self.config_file.as_deref());
            match process::spawn_ready(&self.options.program, dir, config, self.port, &args) {
                Ok(child) => {
                    self.child = Some(child);
                    return Ok(());
                }
                Err(e @ Error::AddrInUse { .. }) if attempt >= PORT_ATTEMPTS => {
                    return Err(Error::PortRetriesExhausted {
                        attempts: attempt,
                        last: Box::new(e),
                    });
                }
                Err(Error::AddrInUse { .. }) => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// The last `lines` lines of its log file (all runs since it was first started); empty if
    /// there is no log yet.
    pub fn log_tail(&self, lines: usize) -> String {
        process::tail_lines(&process::read_from(&self.log_path(), 0), lines)
    }

    /// Sends `SIG<signal>` with the `kill` command; returns the pid.
    fn signal(&self, signal: &'static str) -> Result<u32, Error> {
        let pid = self
            .pid()
            .ok_or_else(|| Error::NotRunning { addr: self.addr() })?;
        let output = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(pid.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .output()
            .map_err(|e| Error::Signal {
                signal,
                pid,
                detail: e.to_string(),
            })?;
        if output.status.success() {
            Ok(pid)
        } else {
            Err(Error::Signal {
                signal,
                pid,
                detail: format!(
                    "{}: {}",
                    output.status,
                    String::from_utf8_lossy(&output.stderr).trim()
                ),
            })
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        // Kill and reap before `dir` is removed; errors cannot be reported from a drop.
        let _ = self.kill();
    }
}

/// A loopback port that is free right now: bind port 0, read the port the system chose,
/// release it. Someone else may take it before we use it; callers retry.
pub fn free_port() -> Result<u16, Error> {
    let listener = TcpListener::bind("127.0.0.1:0")
        .map_err(|e| Error::io("binding 127.0.0.1:0 to find a free port", e))?;
    let port = listener
        .local_addr()
        .map_err(|e| Error::io("reading the free port", e))?
        .port();
    drop(listener);
    Ok(port)
}

fn port_is_free(port: u16) -> bool {
    TcpListener::bind(("127.0.0.1", port)).is_ok()
}

/// Whether the process is stopped (state `T`) according to `/proc/<pid>/stat`.
fn is_stopped(pid: u32) -> Result<bool, Error> {
    let path = format!("/proc/{pid}/stat");
    let stat =
        std::fs::read_to_string(&path).map_err(|e| Error::io(format!("reading {path}"), e))?;
    // "pid (comm) S …": the command name may contain anything, so split at the last ')'.
    let state = stat
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().next())
        .ok_or_else(|| Error::UnexpectedReply {
            context: path.clone(),
            reply: stat.clone(),
        })?;
    Ok(state == "T" || state == "t")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_ports_are_bindable() {
        let port = free_port().unwrap();
        assert_ne!(port, 0);
        assert!(port_is_free(port));
    }

    #[test]
    fn a_taken_port_is_reported_as_such() {
        if !crate::require_redis() {
            return;
        }
        let taken = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = taken.local_addr().unwrap().port();
        let dir = tempfile::tempdir().unwrap();
        let program = std::ffi::OsStr::new("redis-server");
        let err = process::spawn_ready(program, dir.path(), None, port, &[]).unwrap_err();
        match err {
            Error::AddrInUse { addr, log_tail } => {
                assert_eq!(addr, format!("127.0.0.1:{port}"));
                assert!(log_tail.contains("Address already in use"), "{log_tail}");
            }
            other => panic!("expected AddrInUse, got {other}"),
        }
    }

    #[test]
    fn this_process_is_not_stopped() {
        assert!(!is_stopped(std::process::id()).unwrap());
    }
}
