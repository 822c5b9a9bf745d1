//! [`SentinelOptions`]: how to run a [`SentinelGroup`](super::SentinelGroup).

use super::{DOWN_AFTER, FAILOVER_TIMEOUT, SentinelGroup};
use crate::Error;

/// Builder methods that each set one count: `/// doc`, then the field, for each.
macro_rules! counts {
    ($($(#[$doc:meta])* $field:ident),* $(,)?) => {
        $(
            $(#[$doc])*
            pub fn $field(mut self, $field: usize) -> Self {
                self.$field = $field;
                self
            }
        )*
    };
}

/// How to run a [`SentinelGroup`].
///
/// ```no_run
/// use sluice_testkit::{SentinelGroup, SentinelOptions};
/// let group = SentinelGroup::start_with(
///     SentinelOptions::new()
///         .replicas(2)
///         .sentinels(5)
///         .quorum(3)
///         .master_name("limits"),
/// )?;
/// # Ok::<(), sluice_testkit::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct SentinelOptions {
    pub(super) replicas: usize,
    pub(super) sentinels: usize,
    pub(super) quorum: usize,
    pub(super) master_name: String,
    pub(super) data_args: Vec<String>,
    pub(super) sentinel_args: Vec<String>,
    pub(super) tls: Option<Vec<String>>,
}

impl Default for SentinelOptions {
    fn default() -> Self {
        Self {
            replicas: 1,
            sentinels: 3,
            quorum: 2,
            master_name: "mymaster".to_owned(),
            data_args: Vec::new(),
            sentinel_args: Vec::new(),
            tls: None,
        }
    }
}

impl SentinelOptions {
    /// One replica, 3 sentinels, quorum 2, master name `mymaster`.
    pub fn new() -> Self {
        Self::default()
    }

    counts! {
        /// The number of replicas (at least 1, or there is nothing to fail over to).
        replicas,
        /// The number of sentinels (at least 1).
        sentinels,
        /// How many sentinels must agree the primary is down (1 to the number of sentinels).
        quorum,
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
        Ok(())
    }

    /// The sentinels' config file (one replica resynced with a new primary at a time).
    pub(super) fn sentinel_config(&self, primary_port: u16) -> String {
        let name = &self.master_name;
        format!(
            "sentinel monitor {name} 127.0.0.1 {primary_port} {quorum}\n\
             sentinel down-after-milliseconds {name} {down_after}\n\
             sentinel failover-timeout {name} {failover_timeout}\n\
             sentinel parallel-syncs {name} 1\n",
            quorum = self.quorum,
            down_after = DOWN_AFTER.as_millis(),
            failover_timeout = FAILOVER_TIMEOUT.as_millis(),
        )
    }
}
