//! The kit's one error type.

use std::io;
use std::time::Duration;

/// Everything that can go wrong while starting, driving or stopping test servers.
///
/// Messages are written for a person reading a failed test: they name the server's address
/// and, when a server died or never became ready, carry the tail of its log.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The server binary could not be executed at all (missing from `PATH`, not executable).
    #[error("failed to spawn `{program}`: {source}")]
    Spawn {
        /// The program that was run.
        program: String,
        /// The operating system's error.
        #[source]
        source: io::Error,
    },

    /// A local I/O operation (temp dir, free port, log file, …) failed.
    #[error("I/O error while {context}: {source}")]
    Io {
        /// What the kit was doing.
        context: String,
        /// The operating system's error.
        #[source]
        source: io::Error,
    },

    /// A Redis command or connection failed.
    #[error("redis error ({context}): {source}")]
    Redis {
        /// What the kit was doing, usually the command and the server's address.
        context: String,
        /// The client's error; see [`Error::redis_error`].
        #[source]
        source: redis::RedisError,
    },

    /// A polled condition did not become true before its deadline (see [`crate::wait_until`]).
    #[error("timed out after {timeout:?} waiting for {what}")]
    Timeout {
        /// The condition waited for, as the caller described it.
        what: String,
        /// How long the kit waited.
        timeout: Duration,
    },

    /// The server process exited before it answered `PING`.
    #[error("server on {addr} exited during startup ({status}); log tail:\n{log_tail}")]
    ExitedEarly {
        /// The address it was meant to listen on.
        addr: String,
        /// Its exit status.
        status: String,
        /// The last lines of its log (and anything it wrote to stderr).
        log_tail: String,
    },

    /// The server process exited because its port was taken (`bind: Address already in use`).
    /// [`crate::RedisServer::start`] retries these with another port.
    #[error("server could not listen on {addr}: address already in use")]
    AddrInUse {
        /// The address that was taken.
        addr: String,
        /// The last lines of its log.
        log_tail: String,
    },

    /// Every attempt to start a server on a fresh free port lost a race for that port.
    #[error("gave up after {attempts} attempts to find a free port; last: {last}")]
    PortRetriesExhausted {
        /// How many ports were tried.
        attempts: usize,
        /// The last attempt's error.
        last: Box<Error>,
    },

    /// The server process kept running but did not answer `PING` with `PONG` in time.
    #[error(
        "server on {addr} not ready after {timeout:?} (last probe: {last_probe}); log tail:\n{log_tail}"
    )]
    NotReady {
        /// The address probed.
        addr: String,
        /// How long the kit waited.
        timeout: Duration,
        /// The outcome of the last readiness probe.
        last_probe: String,
        /// The last lines of its log.
        log_tail: String,
    },

    /// The operation needs a running server but it was killed (see [`crate::RedisServer::kill`]).
    #[error("server on {addr} is not running")]
    NotRunning {
        /// The server's address.
        addr: String,
    },

    /// Sending a signal with the `kill` command failed.
    #[error("`kill -{signal} {pid}` failed: {detail}")]
    Signal {
        /// The signal's name (`STOP`, `CONT`).
        signal: &'static str,
        /// The target process.
        pid: u32,
        /// The exit status or error of `kill`.
        detail: String,
    },

    /// A program the kit needs besides `redis-server` is not on `PATH`.
    #[error("`{program}` not found on PATH (Debian package: {package})")]
    MissingProgram {
        /// The program, e.g. `redis-cli`.
        program: String,
        /// The Debian package that installs it.
        package: String,
    },

    /// A helper program (e.g. `redis-cli --cluster create`) failed or did not finish in time.
    #[error("`{command}` {outcome}; output:\n{output}")]
    ToolFailed {
        /// The command line that was run.
        command: String,
        /// How it ended: its exit status, or that it was killed at the deadline.
        outcome: String,
        /// The last lines it wrote to stdout and stderr.
        output: String,
    },

    /// The caller passed something the kit cannot use (e.g. an empty command).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),

    /// A server answered with a reply the kit did not expect.
    #[error("unexpected reply ({context}): {reply}")]
    UnexpectedReply {
        /// What the kit asked.
        context: String,
        /// What it got, debug-formatted.
        reply: String,
    },
}

impl Error {
    /// The Redis client error inside, if this is [`Error::Redis`]: lets a test check the server's
    /// error code, e.g. `err.redis_error().and_then(|e| e.code()) == Some("READONLY")`.
    pub fn redis_error(&self) -> Option<&redis::RedisError> {
        match self {
            Self::Redis { source, .. } => Some(source),
            _ => None,
        }
    }

    pub(crate) fn io(context: impl Into<String>, source: io::Error) -> Self {
        Self::Io {
            context: context.into(),
            source,
        }
    }

    pub(crate) fn redis(context: impl Into<String>, source: redis::RedisError) -> Self {
        Self::Redis {
            context: context.into(),
            source,
        }
    }
}
