//! The shared core: spawn one `redis-server` process with the kit's base arguments, wait until
//! it answers, and own it so that it is killed and reaped however the test ends.
//!
//! Everything that starts a server (standalone, replicas, cluster nodes and sentinels) goes
//! through [`spawn_ready`]. Helper programs that run to completion (`redis-cli --cluster
//! create`) go through [`run_tool`].

use std::ffi::{OsStr, OsString};
use std::fs::OpenOptions;
use std::io::{self, Read as _, Seek as _, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;

use crate::{Error, info::parse_info_field, wait_until};

/// The default deadline for a server to answer `PING`.
pub const READY_TIMEOUT: Duration = Duration::from_secs(10);
/// The server's log file inside its directory.
pub(crate) const LOG_FILE: &str = "redis.log";
/// Where the server's stderr goes (startup errors that happen before the log file is open,
/// such as a bad argument, are only written there).
pub(crate) const STDERR_FILE: &str = "stderr.log";
/// How many log lines an error carries.
pub(crate) const ERROR_LOG_LINES: usize = 20;
/// Connect, read and write timeout of one readiness probe. Short: a probe that times out is
/// simply repeated, and meanwhile the loop notices a child that exited (e.g. because another
/// process listens on the port and accepted the probe's connection).
const PROBE_TIMEOUT: Duration = Duration::from_millis(100);

/// A child process that is killed (SIGKILL) and reaped when dropped, including while a test
/// panics, so no server outlives its test and no zombie is left behind.
#[derive(Debug)]
pub(crate) struct ManagedChild {
    child: Child,
    reaped: bool,
}

impl ManagedChild {
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Its exit status if it has exited (reaping it), `None` while it runs.
    fn try_wait(&mut self) -> io::Result<Option<ExitStatus>> {
        let status = self.child.try_wait()?;
        if status.is_some() {
            self.reaped = true;
        }
        Ok(status)
    }

    /// SIGKILL, then wait for it to be gone. Idempotent.
    pub(crate) fn kill_and_wait(&mut self) -> io::Result<()> {
        if self.reaped {
            return Ok(());
        }
        // A process that already exited on its own cannot be killed; reaping it is all
        // that is left, so only `wait`'s result matters.
        let killed = self.child.kill();
        let waited = self.child.wait();
        match (killed, waited) {
            (_, Ok(_)) => {
                self.reaped = true;
                Ok(())
            }
            (Err(e), Err(_)) | (Ok(()), Err(e)) => Err(e),
        }
    }
}

impl Drop for ManagedChild {
    fn drop(&mut self) {
        // Nothing better to do with an error while dropping (possibly during a panic).
        let _ = self.kill_and_wait();
    }
}

pub(crate) fn log_path(dir: &Path) -> PathBuf {
    dir.join(LOG_FILE)
}

fn stderr_path(dir: &Path) -> PathBuf {
    dir.join(STDERR_FILE)
}

/// The kit's base arguments for a server on `port` living in `dir`.
fn base_args(port: u16, dir: &Path) -> Vec<OsString> {
    let mut args: Vec<OsString> = [
        "--port",
        &port.to_string(),
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "no",
        "--protected-mode",
        "no",
        "--daemonize",
        "no",
        "--repl-diskless-sync",
        "yes",
        "--repl-diskless-sync-delay",
        "0",
    ]
    .iter()
    .map(OsString::from)
    .collect();
    args.push("--dir".into());
    args.push(dir.as_os_str().to_owned());
    args.push("--logfile".into());
    args.push(log_path(dir).into_os_string());
    args
}

/// Starts `program` in `dir` with the config file first (Redis requires it there), the kit's
/// base arguments for `port`, then `args` (later ones win in Redis), and returns once it
/// answers `PING` with `PONG` (and is the process answering). On any failure the process is
/// killed before returning the error.
///
/// Errors: [`Error::AddrInUse`] if a port was taken (the caller may retry),
/// [`Error::ExitedEarly`] / [`Error::NotReady`] with the log tail otherwise.
pub(crate) fn spawn_ready(
    program: &OsStr,
    dir: &Path,
    config_file: Option<&Path>,
    port: u16,
    args: &[OsString],
) -> Result<ManagedChild, Error> {
    let addr = format!("127.0.0.1:{port}");
    let log = log_path(dir);
    let stderr_file = stderr_path(dir);
    // Restarts reuse the directory: only what this attempt writes counts.
    let log_start = file_len(&log);
    let stderr_start = file_len(&stderr_file);
    let stderr = OpenOptions::new()
        .create(true)
        .append(true)
        .open(&stderr_file)
        .map_err(|e| Error::io(format!("opening {}", stderr_file.display()), e))?;

    let child = Command::new(program)
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr)
        .args(config_file)
        .args(base_args(port, dir))
        .args(args)
        .spawn()
        .map_err(|source| Error::Spawn {
            program: program.to_string_lossy().into_owned(),
            source,
        })?;
    let mut child = ManagedChild {
        child,
        reaped: false,
    };

    let startup_tail = || {
        let mut tail = tail_lines(&read_from(&log, log_start), ERROR_LOG_LINES);
        let err = read_from(&stderr_file, stderr_start);
        if !err.trim().is_empty() {
            tail.push_str("\n--- stderr ---\n");
            tail.push_str(&tail_lines(&err, ERROR_LOG_LINES));
        }
        if tail.trim().is_empty() {
            tail = "(empty)".to_owned();
        }
        tail
    };

    match wait_ready(&mut child, &addr, READY_TIMEOUT)? {
        Readiness::Ready => Ok(child),
        Readiness::Exited(status) => {
            let log_tail = startup_tail();
            if log_tail.contains("Address already in use") {
                Err(Error::AddrInUse { addr, log_tail })
            } else {
                Err(Error::ExitedEarly {
                    addr,
                    status: status.to_string(),
                    log_tail,
                })
            }
        }
        Readiness::TimedOut { last_probe } => {
            // Kill it before reading the log, so the log is complete.
            drop(child);
            Err(Error::NotReady {
                addr,
                timeout: READY_TIMEOUT,
                last_probe,
                log_tail: startup_tail(),
            })
        }
    }
}

enum Readiness {
    Ready,
    Exited(ExitStatus),
    TimedOut { last_probe: String },
}

/// Polls: has the child exited? Does it answer `PING`?
fn wait_ready(child: &mut ManagedChild, addr: &str, timeout: Duration) -> Result<Readiness, Error> {
    let client = redis::Client::open(format!("redis://{addr}/"))
        .map_err(|e| Error::redis(format!("client for {addr}"), e))?;
    let pid = child.pid();
    let mut exited = None;
    let mut last_probe = String::from("none");
    let waited = wait_until(timeout, "", || {
        if let Some(status) = child
            .try_wait()
            .map_err(|e| Error::io(format!("checking on the server for {addr}"), e))?
        {
            exited = Some(status);
            return Ok(true);
        }
        match probe(&client, pid) {
            Ok(None) => Ok(true),
            Ok(Some(why)) => {
                last_probe = why;
                Ok(false)
            }
            Err(e) => {
                last_probe = e.to_string();
                Ok(false)
            }
        }
    });
    match (waited, exited) {
        (Ok(()), Some(status)) => Ok(Readiness::Exited(status)),
        (Ok(()), None) => Ok(Readiness::Ready),
        (Err(Error::Timeout { .. }), _) => Ok(Readiness::TimedOut { last_probe }),
        (Err(e), _) => Err(e),
    }
}

/// One readiness probe: `Ok(None)` when ready, `Ok(Some(why not))` or `Err` otherwise.
fn probe(client: &redis::Client, pid: u32) -> Result<Option<String>, redis::RedisError> {
    let mut conn = client.get_connection_with_timeout(PROBE_TIMEOUT)?;
    conn.set_read_timeout(Some(PROBE_TIMEOUT))?;
    conn.set_write_timeout(Some(PROBE_TIMEOUT))?;
    let pong: String = redis::cmd("PING").query(&mut conn)?;
    if pong != "PONG" {
        return Ok(Some(format!("PING answered {pong:?}")));
    }
    // The port was free when chosen, but another process could have taken it since: make
    // sure the server answering is ours (its own bind will fail and it will exit).
    let info: String = redis::cmd("INFO").arg("server").query(&mut conn)?;
    let answering = parse_info_field(&info, "process_id");
    if answering == Some(pid.to_string().as_str()) {
        Ok(None)
    } else {
        Ok(Some(format!(
            "the port is answered by another process (process_id {answering:?}, ours is {pid})"
        )))
    }
}

/// Runs `program args…` to completion with no input, for at most `timeout`, and returns what
/// it wrote to stdout and stderr (interleaved, as a terminal would show them).
///
/// Errors: [`Error::Spawn`] if it cannot be run; [`Error::ToolFailed`] if it exits with a
/// failure status or is still running at the deadline (it is then killed).
pub(crate) fn run_tool(program: &str, args: &[String], timeout: Duration) -> Result<String, Error> {
    let command_line = format!("{program} {}", args.join(" "));
    // A file rather than a pipe: nothing has to drain it while the program runs.
    let mut output =
        tempfile::tempfile().map_err(|e| Error::io(format!("capturing `{command_line}`"), e))?;
    let stdout = output
        .try_clone()
        .map_err(|e| Error::io(format!("capturing `{command_line}`"), e))?;
    let stderr = output
        .try_clone()
        .map_err(|e| Error::io(format!("capturing `{command_line}`"), e))?;
    let child = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(stderr)
        .spawn()
        .map_err(|source| Error::Spawn {
            program: program.to_owned(),
            source,
        })?;
    let mut child = ManagedChild {
        child,
        reaped: false,
    };
    let mut status = None;
    let waited = wait_until(timeout, "", || {
        status = child
            .try_wait()
            .map_err(|e| Error::io(format!("waiting for `{command_line}`"), e))?;
        Ok(status.is_some())
    });
    // Killed (if still running) before its output is read, so the output is complete.
    drop(child);
    let mut text = String::new();
    output
        .seek(SeekFrom::Start(0))
        .and_then(|_| output.read_to_string(&mut text))
        .map_err(|e| Error::io(format!("reading the output of `{command_line}`"), e))?;
    let outcome = match (waited, status) {
        (Ok(()), Some(status)) if status.success() => return Ok(text),
        (Ok(()), Some(status)) => format!("failed ({status})"),
        (Err(Error::Timeout { .. }), _) | (Ok(()), None) => {
            format!("did not finish within {timeout:?} and was killed")
        }
        (Err(e), _) => return Err(e),
    };
    Err(Error::ToolFailed {
        command: command_line,
        outcome,
        output: tail_lines(&text, ERROR_LOG_LINES * 2),
    })
}

fn file_len(path: &Path) -> u64 {
    path.metadata().map_or(0, |m| m.len())
}

/// The file's text from byte `offset` on; empty if it cannot be read.
pub(crate) fn read_from(path: &Path, offset: u64) -> String {
    match std::fs::read(path) {
        Ok(bytes) => {
            let start = usize::try_from(offset)
                .unwrap_or(usize::MAX)
                .min(bytes.len());
            String::from_utf8_lossy(&bytes[start..]).into_owned()
        }
        Err(_) => String::new(),
    }
}

/// The last `n` lines of `text`.
pub(crate) fn tail_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tail_keeps_the_last_lines() {
        assert_eq!(tail_lines("a\nb\nc\n", 2), "b\nc");
        assert_eq!(tail_lines("a\nb", 5), "a\nb");
        assert_eq!(tail_lines("", 3), "");
        assert_eq!(tail_lines("a\nb", 0), "");
    }

    #[test]
    fn read_from_skips_earlier_runs() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.log");
        std::fs::write(&path, "old run\nnew run\n").unwrap();
        assert_eq!(read_from(&path, 8), "new run\n");
        assert_eq!(read_from(&path, 999), "");
        assert_eq!(read_from(&dir.path().join("missing"), 0), "");
    }

    #[test]
    fn a_tool_s_output_and_failure_are_reported() {
        let out = run_tool(
            "sh",
            &["-c".to_owned(), "echo out; echo err >&2".to_owned()],
            Duration::from_secs(5),
        )
        .unwrap();
        assert_eq!(out, "out\nerr\n");

        let err = run_tool(
            "sh",
            &["-c".to_owned(), "echo why; exit 3".to_owned()],
            Duration::from_secs(5),
        )
        .unwrap_err();
        match err {
            Error::ToolFailed {
                command,
                outcome,
                output,
            } => {
                assert!(command.starts_with("sh -c"), "{command}");
                assert!(outcome.contains('3'), "{outcome}");
                assert_eq!(output, "why");
            }
            other => panic!("expected ToolFailed, got {other}"),
        }

        let err = run_tool(
            "sh",
            &["-c".to_owned(), "sleep 10".to_owned()],
            Duration::from_millis(50),
        )
        .unwrap_err();
        assert!(err.to_string().contains("did not finish"), "{err}");

        let err = run_tool("sluice-no-such-program-3f9a", &[], Duration::from_secs(1)).unwrap_err();
        assert!(matches!(err, Error::Spawn { .. }), "{err}");
    }

    #[test]
    fn base_args_have_no_persistence_and_log_into_the_dir() {
        let args = base_args(4242, Path::new("/tmp/x"));
        let args: Vec<String> = args
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        let joined = args.join(" ");
        assert!(joined.starts_with("--port 4242 --bind 127.0.0.1 --save  --appendonly no"));
        assert!(joined.contains("--dir /tmp/x --logfile /tmp/x/redis.log"));
        assert!(joined.contains("--repl-diskless-sync yes --repl-diskless-sync-delay 0"));
    }
}
