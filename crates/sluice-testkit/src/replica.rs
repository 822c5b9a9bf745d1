//! A primary with replicas.

use std::time::Duration;

use crate::wait::with_last_seen;
use crate::{Error, RedisServer, ServerOptions, wait_until};

/// How long [`ReplicaSet::wait_synced`] and [`ReplicaSet::wait_replicated`] poll.
pub const SYNC_TIMEOUT: Duration = Duration::from_secs(10);

/// One primary and `n` replicas (`--replicaof 127.0.0.1 <primary port>`), each a
/// [`RedisServer`] of its own: kill, pause or restart any of them.
#[derive(Debug)]
pub struct ReplicaSet {
    /// The primary.
    pub primary: RedisServer,
    /// The replicas, in start order.
    pub replicas: Vec<RedisServer>,
}

impl ReplicaSet {
    /// Starts a primary and `n_replicas` replicas and returns once they are in sync
    /// ([`wait_synced`](Self::wait_synced)).
    pub fn start(n_replicas: usize) -> Result<Self, Error> {
        Self::start_with(n_replicas, &[])
    }

    /// Like [`start`](Self::start), with extra arguments for every server.
    pub fn start_with(n_replicas: usize, extra_args: &[&str]) -> Result<Self, Error> {
        Self::start_with_options(
            n_replicas,
            ServerOptions::new().args(extra_args.iter().copied()),
        )
    }

    /// Like [`start`](Self::start), every server run as `options` say; the replicas replicate
    /// from the primary's [announced port](RedisServer::announced_port).
    pub(crate) fn start_with_options(
        n_replicas: usize,
        options: ServerOptions,
    ) -> Result<Self, Error> {
        let primary = options.clone().start()?;
        let mut set = Self {
            primary,
            replicas: Vec::with_capacity(n_replicas),
        };
        // One at a time: a replica that asks for a full sync while the primary is still
        // streaming one to another replica waits for the primary's next replication cron
        // (1 s); in turn, each sync takes milliseconds.
        for _ in 0..n_replicas {
            let primary = set.primary.announced_port();
            let replica = options.clone().replica_of(primary).start()?;
            set.replicas.push(replica);
            set.wait_synced()?;
        }
        Ok(set)
    }

    /// Polls until every replica reports `master_link_status:up` and the primary reports
    /// `connected_slaves:<number of replicas>` and no snapshot child in progress
    /// (`rdb_bgsave_in_progress:0`: the full sync is over on both sides).
    pub fn wait_synced(&self) -> Result<(), Error> {
        let n = self.replicas.len();
        let mut last_seen = String::new();
        let waited = wait_until(
            SYNC_TIMEOUT,
            &format!(
                "{n} replica(s) of {} to be in sync (master_link_status:up, connected_slaves:{n}, \
                 rdb_bgsave_in_progress:0)",
                self.primary.addr()
            ),
            || {
                let mut seen = Vec::with_capacity(n + 1);
                let mut synced = true;
                for replica in &self.replicas {
                    let link = replica.info_field("replication", "master_link_status")?;
                    synced &= link.as_deref() == Some("up");
                    seen.push(format!("{}: link {link:?}", replica.addr()));
                }
                let connected = self.primary.info_field("replication", "connected_slaves")?;
                synced &= connected.as_deref().and_then(|c| c.parse::<usize>().ok()) == Some(n);
                // The primary streams the snapshot from a forked child and reaps it up to
                // ~100 ms after the transfer. Waiting for that leaves nothing half done: a
                // primary killed right after `start` leaves no orphaned child (a zombie).
                let forked = self
                    .primary
                    .info_field("persistence", "rdb_bgsave_in_progress")?;
                synced &= forked.as_deref() == Some("0");
                seen.push(format!(
                    "primary: connected_slaves {connected:?}, rdb_bgsave_in_progress {forked:?}"
                ));
                last_seen = seen.join(", ");
                Ok(synced)
            },
        );
        with_last_seen(waited, &last_seen)
    }

    /// Reads the primary's `master_repl_offset` now, then polls until every replica's
    /// `slave_repl_offset` has reached it: every write acknowledged by the primary before
    /// the call is then visible on every replica.
    ///
    /// Usually milliseconds. After a full (diskless) sync, though, Redis 7.0 starts streaming
    /// to the new replica only on that replica's first `REPLCONF ACK` received after the
    /// primary reaped its snapshot child; the replica's immediate ACK often arrives just
    /// before that, and the next one comes with its once-a-second cron. So the first
    /// `wait_replicated` after [`start`](Self::start) or a replica restart can take up to ~1 s.
    pub fn wait_replicated(&self) -> Result<(), Error> {
        let target = self.primary_offset()?;
        let mut last_seen = String::new();
        let waited = wait_until(
            SYNC_TIMEOUT,
            &format!(
                "the replicas of {} to reach replication offset {target}",
                self.primary.addr()
            ),
            || {
                let mut seen = Vec::with_capacity(self.replicas.len());
                let mut caught_up = true;
                for replica in &self.replicas {
                    let offset = replica
                        .info_field("replication", "slave_repl_offset")?
                        .and_then(|o| o.parse::<u64>().ok());
                    caught_up &= offset.is_some_and(|o| o >= target);
                    seen.push(format!("{}: {offset:?}", replica.addr()));
                }
                last_seen = seen.join(", ");
                Ok(caught_up)
            },
        );
        with_last_seen(waited, &last_seen)
    }

    fn primary_offset(&self) -> Result<u64, Error> {
        let offset = self
            .primary
            .info_field("replication", "master_repl_offset")?;
        offset
            .as_deref()
            .and_then(|o| o.parse().ok())
            .ok_or_else(|| Error::UnexpectedReply {
                context: format!("master_repl_offset of {}", self.primary.addr()),
                reply: format!("{offset:?}"),
            })
    }
}
