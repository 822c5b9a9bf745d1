//! [`SentinelOptions`]: how to run a [`SentinelGroup`](super::SentinelGroup).

use std::time::Duration;

use super::{DEFAULT_DOWN_AFTER, DEFAULT_FAILOVER_TIMEOUT, SENTINEL_TIMEOUT, SentinelGroup};
use crate::Error;

/// How to run a [`SentinelGroup`].
///
/// ```no_run
/// use std::time::Duration;
/// use sluice_testkit::{SentinelGroup, SentinelOptions};
/// let group = SentinelGroup::start_with(
///     SentinelOptions::new()
///         .replicas(2)
///         .sentinels(5)
///         .quorum(3)
///         .master_name("limits")
///         .down_after(Duration::from_millis(2000)),
/// )?;
/// # Ok::<(), sluice_testkit::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct SentinelOptions {
    pub(super) replicas: usize,
    pub(super) sentinels: usize,
    pub(super) quorum: usize,
    pub(super) master_name: String,
    pub(super) down_after: Duration,
    pub(super) failover_timeout: Duration,
    pub(super) parallel_syncs: usize,
    pub(super) data_args: Vec<String>,
    pub(super) sentinel_args: Vec<String>,
    pub(super) tls: Option<Vec<String>>,
    pub(super) timeout: Duration,
}

impl Default for SentinelOptions {
    fn default() -> Self {
        Self {
            replicas: 1,
            sentinels: 3,
            quorum: 2,
            master_name: "mymaster".to_owned(),
            down_after: DEFAULT_DOWN_AFTER,
            failover_timeout: DEFAULT_FAILOVER_TIMEOUT,
            parallel_syncs: 1,
            data_args: Vec::new(),
            sentinel_args: Vec::new(),
            tls: None,
            timeout: SENTINEL_TIMEOUT,
        }
    }
}

impl SentinelOptions {
    /// One replica, 3 sentinels, quorum 2, master name `mymaster`, [`DEFAULT_DOWN_AFTER`],
    /// [`DEFAULT_FAILOVER_TIMEOUT`], one replica resynced at a time, [`SENTINEL_TIMEOUT`].
    pub fn new() -> Self {
        Self::default()
    }

    setters! {
        /// The number of replicas (at least 1, or there is nothing to fail over to).
        replicas: usize,
        /// The number of sentinels (at least 1).
        sentinels: usize,
        /// How many sentinels must agree the primary is down (1 to the number of sentinels).
        quorum: usize,
        /// `sentinel down-after-milliseconds`, in whole milliseconds.
        down_after: Duration,
        /// `sentinel failover-timeout`, in whole milliseconds.
        failover_timeout: Duration,
        /// `sentinel parallel-syncs`: how many replicas resync with a new primary at once.
        parallel_syncs: usize,
        /// How long [`SentinelGroup::start_with`] waits for the sentinels to be ready (default
        /// [`SENTINEL_TIMEOUT`]).
        timeout: Duration,
    }

    /// The name the sentinels monitor the primary under (default `mymaster`).
    pub fn master_name(mut self, name: impl Into<String>) -> Self {
        self.master_name = name.into();
        self
    }

    /// Extra arguments for every data node (not the sentinels), as
    /// [`ReplicaSet::start_with`] takes them.
    pub fn data_args(mut self, args: impl IntoIterator<Item = impl Into<String>>) -> Self {
        self.data_args.extend(args.into_iter().map(Into::into));
        self
    }

    /// Extra arguments for every sentinel, e.g. an ACL user ([`acl_user`](crate::acl_user);
    /// the default user stays open for the kit and for the sentinels among themselves).
    pub fn sentinel_args(mut self, args: impl IntoIterator<Item = impl Into<String>>) -> Self {
        self.sentinel_args.extend(args.into_iter().map(Into::into));
        self
    }

    /// Data nodes and sentinels also serve TLS, each on a port of its own
    /// ([`RedisServer::tls_port`]), with `certs` (requiring client certificates when
    /// `auth_clients`), and talk to one another over TLS (`--tls-replication yes`): replicas
    /// replicate from the primary's TLS port, sentinels monitor the data nodes and greet
    /// each other there, so the addresses the sentinels report are the TLS ports
    /// ([`RedisServer::announced_port`]). The kit keeps using the plain ports. `certs` must
    /// outlive the group.
    pub fn tls(mut self, certs: &crate::TlsCerts, auth_clients: bool) -> Self {
        self.tls = Some(certs.file_args(auth_clients));
        self
    }

    /// Starts a group with these options; see [`SentinelGroup::start_with`].
    pub fn start(self) -> Result<SentinelGroup, Error> {
        SentinelGroup::start_with(self)
    }

    pub(super) fn validate(&self) -> Result<(), Error> {
        let invalid = |why: String| Err(Error::InvalidArgument(why));
        if self.replicas == 0 {
            return invalid("a sentinel group needs at least one replica".to_owned());
        }
        if self.sentinels == 0 {
            return invalid("a sentinel group needs at least one sentinel".to_owned());
        }
        if self.quorum == 0 || self.quorum > self.sentinels {
            return invalid(format!(
                "quorum {} is not between 1 and the number of sentinels ({})",
                self.quorum, self.sentinels
            ));
        }
        if self.master_name.is_empty()
            || !self
                .master_name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.:".contains(c))
        {
            return invalid(format!(
                "master name {:?}: use letters, digits and -_.: only",
                self.master_name
            ));
        }
        if self.down_after.as_millis() == 0 || self.failover_timeout.as_millis() == 0 {
            return invalid("down-after and failover-timeout must be at least 1 ms".to_owned());
        }
        if self.parallel_syncs == 0 {
            return invalid("parallel-syncs must be at least 1".to_owned());
        }
        Ok(())
    }

    /// The sentinels' config file.
    pub(super) fn sentinel_config(&self, primary_port: u16) -> String {
        let name = &self.master_name;
        format!(
            "sentinel monitor {name} 127.0.0.1 {primary_port} {quorum}\n\
             sentinel down-after-milliseconds {name} {down_after}\n\
             sentinel failover-timeout {name} {failover_timeout}\n\
             sentinel parallel-syncs {name} {parallel_syncs}\n",
            quorum = self.quorum,
            down_after = self.down_after.as_millis(),
            failover_timeout = self.failover_timeout.as_millis(),
            parallel_syncs = self.parallel_syncs,
        )
    }
}
