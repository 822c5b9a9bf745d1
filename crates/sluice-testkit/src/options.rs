//! [`ServerOptions`]: how to run one `redis-server` process.

use std::ffi::OsString;

use crate::server::RedisServer;
use crate::{Error, TlsCerts};

/// How to run a server: the program, a config file, extra arguments, TLS.
///
/// The kit always passes its base arguments (port, `--bind 127.0.0.1`, no persistence,
/// diskless replication, a private `--dir` and `--logfile`); [`arg`](Self::arg)s come after
/// them, so they can override any of them except the port. Arguments that take a port of
/// their own (a TLS port, a cluster bus port) get a free one, chosen with the server's.
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
    /// Flags that each take a free port (`--tls-port`, `--cluster-port`), passed after `args`.
    pub(crate) port_flags: Vec<&'static str>,
}

impl Default for ServerOptions {
    fn default() -> Self {
        Self {
            program: "redis-server".into(),
            config: None,
            args: Vec::new(),
            port_flags: Vec::new(),
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

    /// One extra argument, e.g. `"--maxmemory"` then `"10mb"`.
    pub fn arg(mut self, arg: impl Into<OsString>) -> Self {
        self.args.push(arg.into());
        self
    }

    /// Extra arguments.
    pub fn args(mut self, args: impl IntoIterator<Item = impl Into<OsString>>) -> Self {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    /// Replicate the server on `127.0.0.1:port` (`--replicaof 127.0.0.1 <port>`).
    pub fn replica_of(self, port: u16) -> Self {
        self.args([
            "--replicaof".to_owned(),
            "127.0.0.1".to_owned(),
            port.to_string(),
        ])
    }

    /// Also serve TLS, on a port of its own ([`RedisServer::tls_port`]), with the server
    /// certificate of `certs` (requiring a client certificate signed by its CA when
    /// `auth_clients`), and replicate over TLS (`--tls-replication yes`: a replica of a TLS
    /// primary connects to its TLS port). The plain port stays, for the kit. `certs` must
    /// outlive the server.
    pub fn tls(self, certs: &TlsCerts, auth_clients: bool) -> Self {
        self.tls_files(certs.file_args(auth_clients))
    }

    /// [`tls`](Self::tls) with the certificate arguments of [`TlsCerts::file_args`].
    pub(crate) fn tls_files(self, files: impl IntoIterator<Item = String>) -> Self {
        self.port_flag("--tls-port")
            .args(files)
            .args(["--tls-replication", "yes"])
    }

    /// Passes `flag <a free port>`, the port chosen with the server's own (and kept across
    /// restarts).
    pub(crate) fn port_flag(mut self, flag: &'static str) -> Self {
        self.port_flags.push(flag);
        self
    }

    /// Starts a server on a fresh free port (retried up to
    /// [`PORT_ATTEMPTS`](crate::PORT_ATTEMPTS) times if the port is taken before the server
    /// binds it). Returns once it answers `PING`.
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
    }

    #[test]
    fn an_acl_user_is_six_arguments() {
        assert_eq!(
            acl_user("alice", "pw", "app:*"),
            ["--user", "alice", "on", ">pw", "~app:*", "+@all"]
        );
    }
}
