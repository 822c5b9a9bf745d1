//! How to run a [`RedisCluster`](super::RedisCluster): [`ClusterOptions`].

use std::ffi::OsString;
use std::time::Duration;

use super::{CLUSTER_TIMEOUT, DEFAULT_NODE_TIMEOUT, RedisCluster};
use crate::{Error, ServerOptions};

/// How to run a [`RedisCluster`]: how many primaries and replicas, the node timeout, extra
/// arguments for every node, and how long to wait for the cluster to form.
///
/// ```no_run
/// use std::time::Duration;
/// use sluice_testkit::{ClusterOptions, RedisCluster};
/// let cluster = RedisCluster::start_with(
///     ClusterOptions::new()
///         .primaries(3)
///         .replicas_per_primary(2)
///         .node_timeout(Duration::from_millis(2000))
///         .args(["--maxmemory", "10mb"]),
/// )?;
/// # Ok::<(), sluice_testkit::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct ClusterOptions {
    pub(super) primaries: usize,
    pub(super) replicas_per_primary: usize,
    pub(super) node_timeout: Duration,
    pub(super) args: Vec<OsString>,
    pub(super) timeout: Duration,
    /// The certificate arguments when the nodes serve TLS.
    pub(super) tls: Option<Vec<String>>,
}

impl Default for ClusterOptions {
    fn default() -> Self {
        Self {
            primaries: 3,
            replicas_per_primary: 1,
            node_timeout: DEFAULT_NODE_TIMEOUT,
            args: Vec::new(),
            timeout: CLUSTER_TIMEOUT,
            tls: None,
        }
    }
}

impl ClusterOptions {
    /// Three primaries with one replica each, [`DEFAULT_NODE_TIMEOUT`], [`CLUSTER_TIMEOUT`].
    pub fn new() -> Self {
        Self::default()
    }

    setters! {
        /// The number of primaries, at least 3 (`redis-cli --cluster create` refuses fewer).
        primaries: usize,
        /// The number of replicas of each primary (0 for none: no failover is then possible).
        replicas_per_primary: usize,
        /// `--cluster-node-timeout`, in whole milliseconds (default [`DEFAULT_NODE_TIMEOUT`]).
        node_timeout: Duration,
        /// How long [`RedisCluster::start_with`] waits for `redis-cli` and then for the
        /// cluster to be whole (default [`CLUSTER_TIMEOUT`]).
        timeout: Duration,
    }

    arg_setters! {
        /// One extra argument for every node, after the kit's (so it can override them).
        arg,
        /// Extra arguments for every node.
        args
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
        self.primaries * (1 + self.replicas_per_primary)
    }

    pub(super) fn validate(&self) -> Result<(), Error> {
        if self.primaries < 3 {
            return Err(Error::InvalidArgument(format!(
                "a cluster needs at least 3 primaries, not {}",
                self.primaries
            )));
        }
        if self.node_timeout.as_millis() == 0 {
            return Err(Error::InvalidArgument(
                "the node timeout must be at least 1 ms".to_owned(),
            ));
        }
        Ok(())
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
                self.node_timeout.as_millis().to_string(),
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
    fn options_are_validated() {
        let err = ClusterOptions::new().primaries(2).validate().unwrap_err();
        assert!(err.to_string().contains("at least 3 primaries"), "{err}");
        let err = ClusterOptions::new()
            .node_timeout(Duration::ZERO)
            .validate()
            .unwrap_err();
        assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
        let options = ClusterOptions::new().replicas_per_primary(2);
        options.validate().unwrap();
        assert_eq!(options.node_count(), 9);
    }
}
