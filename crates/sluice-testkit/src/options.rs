//! [`ServerOptions`]: how to run one `redis-server` process.

use std::ffi::OsString;
use std::time::Duration;

use crate::Error;
use crate::server::{READY_TIMEOUT, RedisServer};

/// How to run a server: the program, a config file, extra arguments, the readiness deadline.
///
/// The kit always passes its base arguments (port, `--bind 127.0.0.1`, no persistence,
/// diskless replication, a private `--dir` and `--logfile`); [`arg`](Self::arg)s come after
/// them, so they can override any of them except the port.
///
/// ```no_run
/// use sluice_testkit::ServerOptions;
/// let server = ServerOptions::new()
///     .args(["--maxmemory", "10mb"])
///     .config("maxmemory-policy allkeys-lru\n")
///     .start()?;
/// # Ok::<(), sluice_testkit::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct ServerOptions {
    pub(crate) program: OsString,
    pub(crate) config: Option<String>,
    pub(crate) args: Vec<OsString>,
    pub(crate) ready_timeout: Duration,
}

impl Default for ServerOptions {
    fn default() -> Self {
        Self {
            program: "redis-server".into(),
            config: None,
            args: Vec::new(),
            ready_timeout: READY_TIMEOUT,
        }
    }
}

impl ServerOptions {
    /// `redis-server` with only the kit's base arguments.
    pub fn new() -> Self {
        Self::default()
    }

    /// The program to run instead of `redis-server` (found on `PATH` unless a path).
    pub fn program(mut self, program: impl Into<OsString>) -> Self {
        self.program = program.into();
        self
    }

    /// Config file text, written to `redis.conf` in the server's directory and passed as the
    /// first argument (a config file is what `redis-sentinel` and `CONFIG REWRITE` need).
    pub fn config(mut self, text: impl Into<String>) -> Self {
        self.config = Some(text.into());
        self
    }

    arg_setters! {
        /// One extra argument, e.g. `"--maxmemory"` then `"10mb"`.
        arg,
        /// Extra arguments.
        args
    }

    /// Replicate the server on `127.0.0.1:port` (`--replicaof 127.0.0.1 <port>`).
    pub fn replica_of(self, port: u16) -> Self {
        self.args([
            "--replicaof".to_owned(),
            "127.0.0.1".to_owned(),
            port.to_string(),
        ])
    }

    setters! {
        /// How long to wait for the server to answer `PING` (default [`READY_TIMEOUT`]).
        ready_timeout: Duration,
    }

    /// Starts a server with these options; see [`RedisServer::start_with_options`].
    pub fn start(self) -> Result<RedisServer, Error> {
        RedisServer::start_with_options(self)
    }
}

/// The arguments that create the ACL user `name` with `password`, allowed every command on
/// the keys matching `keys` (e.g. `*`): for [`ServerOptions::args`] and the data or sentinel
/// arguments of the topologies. The default user stays open for the kit.
pub fn acl_user(name: &str, password: &str, keys: &str) -> [String; 6] {
    let (password, keys) = (format!(">{password}"), format!("~{keys}"));
    ["--user", name, "on", &password, &keys, "+@all"].map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use std::ffi::OsStr;

    use super::*;

    #[test]
    fn options_collect_args_in_order() {
        let o = ServerOptions::new()
            .arg("--a")
            .args(["1", "--b"])
            .replica_of(7);
        let args: Vec<&OsStr> = o.args.iter().map(OsString::as_os_str).collect();
        assert_eq!(args, ["--a", "1", "--b", "--replicaof", "127.0.0.1", "7"]);
        assert_eq!(o.program, "redis-server");
        assert_eq!(o.ready_timeout, READY_TIMEOUT);
    }

    #[test]
    fn an_acl_user_is_six_arguments() {
        assert_eq!(
            acl_user("alice", "pw", "app:*"),
            ["--user", "alice", "on", ">pw", "~app:*", "+@all"]
        );
    }
}
