//! How to run a [`RedisCluster`](super::RedisCluster): [`ClusterOptions`].

use std::ffi::OsString;

use super::{NODE_TIMEOUT, PRIMARIES, RedisCluster};
use crate::{Error, ServerOptions};

/// How to run a [`RedisCluster`] of three primaries: how many replicas each, extra arguments
/// for every node, TLS.
///
/// ```no_run
/// use sluice_testkit::{ClusterOptions, RedisCluster};
/// let cluster = RedisCluster::start_with(
///     ClusterOptions::new()
///         .replicas_per_primary(2)
///         .args(["--maxmemory", "10mb"]),
/// )?;
/// # Ok::<(), sluice_testkit::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct ClusterOptions {
    pub(super) replicas_per_primary: usize,
    pub(super) args: Vec<OsString>,
    /// The certificate arguments when the nodes serve TLS.
    pub(super) tls: Option<Vec<String>>,
}

impl Default for ClusterOptions {
    fn default() -> Self {
        Self {
            replicas_per_primary: 1,
            args: Vec::new(),
            tls: None,
        }
    }
}

impl ClusterOptions {
    /// Three primaries with one replica each.
    pub fn new() -> Self {
        Self::default()
    }

    /// The number of replicas of each primary (0 for none: no failover is then possible).
    pub fn replicas_per_primary(mut self, replicas_per_primary: usize) -> Self {
        self.replicas_per_primary = replicas_per_primary;
        self
    }

    /// Extra arguments for every node, after the kit's (so they can override them).
    pub fn args(mut self, args: impl IntoIterator<Item = impl Into<OsString>>) -> Self {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    /// Every node also serves TLS, on a port of its own
    /// ([`RedisServer::tls_port`](crate::RedisServer::tls_port)), with `certs` (requiring
    /// client certificates when `auth_clients`), and the cluster runs over TLS:
    /// `--tls-cluster yes` (the cluster bus, and the ports the cluster announces to TLS
    /// clients in `CLUSTER SLOTS` and redirections) and `--tls-replication yes`. A client on
    /// the plain port is still told the plain ports (Redis does that), so the kit keeps using
    /// them; [`RedisCluster::tls_urls`] are the seeds for a TLS client. `certs` must outlive
    /// the cluster.
    pub fn tls(mut self, certs: &crate::TlsCerts, auth_clients: bool) -> Self {
        self.tls = Some(certs.file_args(auth_clients));
        self
    }

    /// Starts a cluster with these options; see [`RedisCluster::start_with`].
    pub fn start(self) -> Result<RedisCluster, Error> {
        RedisCluster::start_with(self)
    }

    pub(super) fn node_count(&self) -> usize {
        PRIMARIES * (1 + self.replicas_per_primary)
    }

    /// The options of every node (the bus port, and the TLS port, are chosen per node).
    pub(super) fn server_options(&self) -> ServerOptions {
        let node = ServerOptions::new()
            .port_flag("--cluster-port")
            .args([
                "--cluster-enabled".to_owned(),
                "yes".to_owned(),
                "--cluster-config-file".to_owned(),
                "nodes.conf".to_owned(),
                "--cluster-node-timeout".to_owned(),
                NODE_TIMEOUT.as_millis().to_string(),
                "--cluster-replica-validity-factor".to_owned(),
                "0".to_owned(),
                "--cluster-allow-replica-migration".to_owned(),
                "no".to_owned(),
                "--repl-ping-replica-period".to_owned(),
                "1".to_owned(),
            ])
            .args(self.args.iter().cloned());
        match &self.tls {
            Some(files) => node
                .tls_files(files.iter().cloned())
                .args(["--tls-cluster", "yes"]),
            None => node,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn three_primaries_with_their_replicas() {
        let options = ClusterOptions::new().replicas_per_primary(2);
        assert_eq!(options.node_count(), 9);
    }
}
