//! A Redis Cluster: primaries with replicas, each node a [`RedisServer`], formed by
//! `redis-cli --cluster create`.
//!
//! [`RedisCluster::start`] starts the nodes in parallel on free ports, has `redis-cli` assign
//! the slots and the replicas, then polls until the cluster is whole
//! ([`RedisCluster::wait_ok`]). Tests kill, pause or restart nodes through
//! [`RedisCluster::node_mut`] and wait for the cluster to heal with
//! [`RedisCluster::wait_failover`] and [`RedisCluster::wait_ok`].
//!
//! # Tuned for quick failovers
//!
//! Every node runs with:
//!
//! - `--cluster-node-timeout` [`NODE_TIMEOUT`] (1 s; Redis's default is 15 s): how long a
//!   node may not answer before the others flag it as failing. A failover takes about two
//!   node timeouts plus the replica's election delay (0.5–1 s), so ~3 s here. Much lower
//!   risks false failovers when the machine is busy.
//! - `--cluster-replica-validity-factor 0`: a replica may always take over, however long its
//!   link to the primary was down. With the default (10) a replica that was itself paused
//!   refuses, and the test waits forever.
//! - `--cluster-allow-replica-migration no`: replicas stay with the primary `redis-cli`
//!   gave them, so the topology changes only when the test kills or pauses something.
//! - `--repl-ping-replica-period 1` (default 10 s): `CLUSTER SLOTS` lists a replica only
//!   once its replication offset is not zero, and on a primary that has taken no write the
//!   offset moves only with these pings. Without it, a new cluster (or a node that rejoined
//!   a primary that has taken no write) looks replica-less to clients for up to 10 s.
//! - `--cluster-port <free port>`: the cluster bus port is chosen like the client port. Redis
//!   would otherwise use port + 10000, which for a port above 55535 does not even exist.
//! - `--cluster-config-file nodes.conf`: relative to the node's `--dir`, i.e. its own
//!   directory, which [`RedisServer::restart`] keeps; a restarted node therefore keeps its
//!   id and rejoins (as a replica, if its slots were taken over meanwhile).
//!
//! `cluster-require-full-coverage` stays at its default, `yes`, on purpose: while a primary
//! is down and not yet replaced, every node then reports `cluster_state:fail` and refuses
//! all commands, and `cluster_state:ok` on every node means the failover is complete. With
//! `no`, "ok" would say nothing about the lost slots. A test of partial availability can pass
//! `--cluster-require-full-coverage no` through [`ClusterOptions::args`] (later arguments win).
//!
//! # Which replica took over
//!
//! After a failover the surviving nodes no longer say whose replica the new primary was.
//! The cluster therefore remembers its topology as last seen whole — after
//! [`start`](RedisCluster::start), [`wait_ok`](RedisCluster::wait_ok) and
//! [`wait_failover`](RedisCluster::wait_failover) — and [`RedisCluster::wait_failover`] waits
//! for one of the replicas recorded there to serve all the slots recorded there. Call
//! `wait_ok` after a restart so that the restarted node counts as a replica in the next
//! failover.
//!
//! # No cluster client
//!
//! The kit does not enable the `redis` crate's `cluster` feature: features are unified across
//! the workspace, so it would change how every other crate's tests build `redis`.
//! [`key_slot`] is the slot function (CRC16 with the hash-tag rule, tested against
//! `CLUSTER KEYSLOT`), and [`RedisCluster::cmd_for_key`] sends a command to the primary of a
//! key and follows `MOVED` and `ASK` redirections, which is all a test of the kit needs.

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use redis::Value;

mod health;
use health::{Health, query_slots};
mod options;
mod slots;

pub use options::ClusterOptions;
pub use slots::{SLOT_COUNT, Shard, key_slot};
use slots::{SlotRange, overlaps};

use crate::presence::on_path;
use crate::wait::with_last_seen;
use crate::{Error, RedisServer, process, wait_until};

/// The `--cluster-node-timeout` of a [`RedisCluster`]'s nodes.
pub const NODE_TIMEOUT: Duration = Duration::from_millis(1000);
/// How many primaries a [`RedisCluster`] has (`redis-cli --cluster create` takes no fewer).
pub const PRIMARIES: usize = 3;
/// The deadline for `redis-cli` to form a cluster, and for a cluster to become whole
/// ([`RedisCluster::start`], [`RedisCluster::wait_ok`]).
pub const CLUSTER_TIMEOUT: Duration = Duration::from_secs(20);
/// How many `MOVED`/`ASK` redirections [`RedisCluster::cmd_for_key`] follows.
const MAX_REDIRECTS: usize = 5;
/// The program that forms the cluster.
const REDIS_CLI: &str = "redis-cli";

/// A Redis Cluster of real `redis-server` processes on free loopback ports.
///
/// Dropping it kills every node and removes their directories (each node is a
/// [`RedisServer`]). See the [module docs](self) for the settings and the trade-offs.
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
    /// The topology as last seen whole; see "Which replica took over" in the module docs.
    known: Mutex<Vec<Shard>>,
}

impl RedisCluster {
    /// Three primaries with one replica each; returns once the cluster is whole
    /// ([`wait_ok`](Self::wait_ok)).
    pub fn start() -> Result<Self, Error> {
        Self::start_with(ClusterOptions::new())
    }

    /// A cluster as `options` say: starts the nodes in parallel, runs
    /// `redis-cli --cluster create … --cluster-replicas N --cluster-yes`, then waits until
    /// every node reports `cluster_state:ok`, all nodes agree on who serves which of the
    /// 16384 slots and every replica's link is up.
    ///
    /// Errors: [`Error::MissingProgram`] without `redis-cli`, [`Error::ToolFailed`] if it
    /// fails, [`Error::Timeout`] (saying what was last seen) if the cluster does not form.
    pub fn start_with(options: ClusterOptions) -> Result<Self, Error> {
        if !on_path(REDIS_CLI) {
            return Err(Error::MissingProgram {
                program: REDIS_CLI.to_owned(),
                package: "redis-tools".to_owned(),
            });
        }
        let nodes = RedisServer::start_many(std::iter::repeat_n(
            options.server_options(),
            options.node_count(),
        ))?;
        let cluster = Self {
            nodes,
            known: Mutex::new(Vec::new()),
        };
        let mut args = vec!["--cluster".to_owned(), "create".to_owned()];
        args.extend(cluster.nodes.iter().map(RedisServer::addr));
        args.extend([
            "--cluster-replicas".to_owned(),
            options.replicas_per_primary.to_string(),
            "--cluster-yes".to_owned(),
        ]);
        process::run_tool(REDIS_CLI, &args, CLUSTER_TIMEOUT)?;
        cluster.wait_ok()?;
        Ok(cluster)
    }

    /// Every node, primaries and replicas, in start order (indexes are stable: a node keeps
    /// its index, port and directory across kills and restarts, whatever its role).
    pub fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }

    /// One node, to kill, pause, resume or restart it.
    ///
    /// # Panics
    ///
    /// If `index` is not below `nodes().len()`, like slice indexing.
    pub fn node_mut(&mut self, index: usize) -> &mut RedisServer {
        &mut self.nodes[index]
    }

    /// `redis://127.0.0.1:PORT/` of every node: the seed list for a cluster client.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// `rediss://127.0.0.1:TLS_PORT` of every node, when the nodes serve TLS
    /// ([`ClusterOptions::tls`]); empty otherwise.
    pub fn tls_urls(&self) -> Vec<String> {
        self.nodes.iter().filter_map(RedisServer::tls_url).collect()
    }

    /// The index of the node listening on `port` (its port or its TLS port), if it is one of
    /// this cluster's.
    pub fn node_index(&self, port: u16) -> Option<usize> {
        self.nodes.iter().position(|n| n.listens_on(port))
    }

    /// The shards as the first reachable node sees them now (`CLUSTER SLOTS`), in slot
    /// order. Does not wait for the nodes to agree; see [`wait_ok`](Self::wait_ok) for that.
    pub fn shards(&self) -> Result<Vec<Shard>, Error> {
        let mut last_error = None;
        for node in self.nodes.iter().filter(|n| n.is_reachable()) {
            let reply = node
                .connection()
                .and_then(|mut conn| query_slots(node, &mut conn));
            match reply {
                Ok(ranges) => return self.to_shards(&ranges, &node.addr()),
                Err(e) => last_error = Some(e),
            }
        }
        Err(last_error.unwrap_or_else(|| {
            Error::InvalidArgument("no node of the cluster is reachable".to_owned())
        }))
    }

    /// The index of the primary serving `slot`, asked live ([`shards`](Self::shards)).
    pub fn primary_for_slot(&self, slot: u16) -> Result<usize, Error> {
        if slot >= SLOT_COUNT {
            return Err(Error::InvalidArgument(format!(
                "slot {slot} is not below {SLOT_COUNT}"
            )));
        }
        self.shards()?
            .iter()
            .find(|s| s.serves(slot))
            .map(|s| s.primary)
            .ok_or_else(|| Error::UnexpectedReply {
                context: "CLUSTER SLOTS".to_owned(),
                reply: format!("slot {slot} is served by no node"),
            })
    }

    /// The index of the primary serving `key` (its slot is [`key_slot`]), asked live.
    pub fn primary_for_key(&self, key: &str) -> Result<usize, Error> {
        self.primary_for_slot(key_slot(key.as_bytes()))
    }

    /// The replicas of the primary `primary`, asked live ([`shards`](Self::shards)): the
    /// nodes that replicate it and are not considered failed. An error if it serves no slot.
    pub fn replicas_of(&self, primary: usize) -> Result<Vec<usize>, Error> {
        self.shards()?
            .into_iter()
            .find(|s| s.primary == primary)
            .map(|s| s.replicas)
            .ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "node {primary} ({}) is not a primary serving slots",
                    self.describe(primary)
                ))
            })
    }

    /// Runs a command about `key` where the cluster wants it: on the primary that serves
    /// the key's slot, following `MOVED` and `ASK` redirections (up to 5) like a cluster
    /// client. Errors like [`RedisServer::cmd`].
    ///
    /// ```no_run
    /// # let cluster = sluice_testkit::RedisCluster::start()?;
    /// cluster.cmd_for_key("k", &["SET", "k", "v"])?;
    /// assert_eq!(cluster.cmd_for_key("k", &["GET", "k"])?, redis::Value::BulkString(b"v".to_vec()));
    /// # Ok::<(), sluice_testkit::Error>(())
    /// ```
    pub fn cmd_for_key(&self, key: &str, args: &[&str]) -> Result<Value, Error> {
        let (name, rest) = args
            .split_first()
            .ok_or_else(|| Error::InvalidArgument("an empty command".to_owned()))?;
        let mut target = self.primary_for_key(key)?;
        let mut asking = false;
        for _ in 0..=MAX_REDIRECTS {
            let node = self.node(target)?;
            let context = || format!("`{}` on {}", args.join(" "), node.addr());
            let mut conn = node.connection()?;
            if asking {
                redis::cmd("ASKING")
                    .query::<()>(&mut conn)
                    .map_err(|e| Error::redis(format!("`ASKING` on {}", node.addr()), e))?;
            }
            let mut cmd = redis::cmd(name);
            for arg in rest {
                cmd.arg(*arg);
            }
            match cmd.query::<Value>(&mut conn) {
                Ok(value) => return Ok(value),
                Err(e) => match e.redirect_node() {
                    Some((addr, _slot)) => {
                        asking = e.code() == Some("ASK");
                        target = self.node_index_of_addr(addr).ok_or_else(|| {
                            Error::redis(
                                format!("{} (redirected outside the cluster)", context()),
                                e,
                            )
                        })?;
                    }
                    None => return Err(Error::redis(context(), e)),
                },
            }
        }
        Err(Error::UnexpectedReply {
            context: format!("`{}` for key {key:?}", args.join(" ")),
            reply: format!("more than {MAX_REDIRECTS} redirections"),
        })
    }

    /// Polls until the cluster is whole again, for at most [`CLUSTER_TIMEOUT`]: every
    /// reachable node (running and not paused; the others are skipped) reports
    /// `cluster_state:ok`, they all report the same `CLUSTER SLOTS`, every one of the 16384
    /// slots is served by a reachable primary, every reachable node is in that map with the
    /// role it reports itself, every reachable replica's link is up
    /// (`master_link_status:up`) and no node is still forking a snapshot for a replica.
    ///
    /// Returns the shards seen, and remembers them for [`wait_failover`](Self::wait_failover).
    pub fn wait_ok(&self) -> Result<Vec<Shard>, Error> {
        let mut last_seen = String::new();
        let mut shards = None;
        let waited = wait_until(CLUSTER_TIMEOUT, "the cluster to be whole", || {
            match self.health()? {
                Health::Whole(seen) => {
                    shards = Some(seen);
                    Ok(true)
                }
                Health::NotYet(why) => {
                    last_seen = why;
                    Ok(false)
                }
            }
        });
        with_last_seen(waited, &last_seen)?;
        let shards = shards.unwrap_or_default();
        self.remember(&shards);
        Ok(shards)
    }

    /// After the primary `old_primary` was killed or paused: polls until one of its replicas
    /// serves all of its slots and the cluster is whole again (as [`wait_ok`](Self::wait_ok)
    /// checks it), for at most `timeout`, and returns that replica's index.
    ///
    /// "Its slots" and "its replicas" are as the cluster was last seen whole (see the
    /// [module docs](self)); an [`Error::InvalidArgument`] if it was no primary then or had no
    /// replica.
    pub fn wait_failover(&self, old_primary: usize, timeout: Duration) -> Result<usize, Error> {
        let old = self
            .known()
            .into_iter()
            .find(|s| s.primary == old_primary)
            .ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "node {old_primary} ({}) was not a primary when the cluster was last seen whole",
                    self.describe(old_primary)
                ))
            })?;
        if old.replicas.is_empty() {
            return Err(Error::InvalidArgument(format!(
                "node {old_primary} ({}) had no replica to take over when the cluster was last \
                 seen whole",
                self.describe(old_primary)
            )));
        }
        let mut last_seen = String::new();
        let mut outcome = None;
        let waited = wait_until(
            timeout,
            &format!(
                "one of the replicas {:?} of node {old_primary} ({}) to serve its slots {:?}",
                old.replicas,
                self.describe(old_primary),
                old.slots
            ),
            || {
                let shards = match self.health()? {
                    Health::Whole(shards) => shards,
                    Health::NotYet(why) => {
                        last_seen = why;
                        return Ok(false);
                    }
                };
                let owners: Vec<usize> = shards
                    .iter()
                    .filter(|s| {
                        s.slots
                            .iter()
                            .any(|r| old.slots.iter().any(|o| overlaps(r, o)))
                    })
                    .map(|s| s.primary)
                    .collect();
                match owners.as_slice() {
                    [new] if old.replicas.contains(new) => {
                        outcome = Some((*new, shards));
                        Ok(true)
                    }
                    _ => {
                        last_seen = format!("whole, but its slots are served by nodes {owners:?}");
                        Ok(false)
                    }
                }
            },
        );
        with_last_seen(waited, &last_seen)?;
        let (new, shards) = outcome.ok_or_else(|| Error::Timeout {
            what: "a failover".to_owned(),
            timeout,
        })?;
        self.remember(&shards);
        Ok(new)
    }

    fn node(&self, index: usize) -> Result<&RedisServer, Error> {
        self.nodes.get(index).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "node {index} of a cluster of {} nodes",
                self.nodes.len()
            ))
        })
    }

    fn node_index_of_addr(&self, addr: &str) -> Option<usize> {
        let port = addr.rsplit_once(':')?.1.parse().ok()?;
        self.node_index(port)
    }

    /// "127.0.0.1:PORT" of a node, for messages.
    fn describe(&self, index: usize) -> String {
        self.nodes
            .get(index)
            .map_or_else(|| "no such node".to_owned(), RedisServer::addr)
    }

    fn known(&self) -> Vec<Shard> {
        self.known
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn remember(&self, shards: &[Shard]) {
        *self.known.lock().unwrap_or_else(PoisonError::into_inner) = shards.to_vec();
    }

    /// Groups `CLUSTER SLOTS` ranges into shards of node indexes.
    fn to_shards(&self, ranges: &[SlotRange], source: &str) -> Result<Vec<Shard>, Error> {
        let index = |port: u16| {
            self.node_index(port).ok_or_else(|| Error::UnexpectedReply {
                context: format!("CLUSTER SLOTS on {source}"),
                reply: format!("port {port} is no node of this cluster"),
            })
        };
        let mut shards: Vec<Shard> = Vec::new();
        for range in ranges {
            let primary = index(range.primary)?;
            let pos = match shards.iter().position(|s| s.primary == primary) {
                Some(pos) => pos,
                None => {
                    shards.push(Shard {
                        primary,
                        replicas: Vec::new(),
                        slots: Vec::new(),
                    });
                    shards.len() - 1
                }
            };
            let shard = &mut shards[pos];
            shard.slots.push(range.start..=range.end);
            for &port in &range.replicas {
                let replica = index(port)?;
                if !shard.replicas.contains(&replica) {
                    shard.replicas.push(replica);
                }
            }
        }
        for shard in &mut shards {
            shard.replicas.sort_unstable();
        }
        Ok(shards)
    }
}
