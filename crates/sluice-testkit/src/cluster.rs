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
//! - `--cluster-node-timeout` [`DEFAULT_NODE_TIMEOUT`] (1 s; Redis's default is 15 s): how
//!   long a node may not answer before the others flag it as failing. A failover takes about
//!   two node timeouts plus the replica's election delay (0.5–1 s), so ~3 s here. Much lower
//!   risks false failovers when the machine is busy; [`ClusterOptions::node_timeout`] changes it.
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
//! `--cluster-require-full-coverage no` through [`ClusterOptions::arg`] (later arguments win).
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

use std::ffi::OsString;
use std::fmt::Write as _;
use std::ops::RangeInclusive;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use redis::Value;

use crate::presence::on_path;
use crate::wait::with_last_seen;
use crate::{
    Error, PORT_ATTEMPTS, RedisServer, ServerOptions, free_port, parse_info_field, process,
    wait_until,
};

/// The number of hash slots of a Redis Cluster.
pub const SLOT_COUNT: u16 = 16384;
/// The default `--cluster-node-timeout` of a [`RedisCluster`]'s nodes.
pub const DEFAULT_NODE_TIMEOUT: Duration = Duration::from_millis(1000);
/// The default deadline for a cluster to form ([`RedisCluster::start`]) or to become whole
/// again ([`RedisCluster::wait_ok`]).
pub const CLUSTER_TIMEOUT: Duration = Duration::from_secs(20);
/// How many `MOVED`/`ASK` redirections [`RedisCluster::cmd_for_key`] follows.
const MAX_REDIRECTS: usize = 5;
/// The program that forms the cluster.
const REDIS_CLI: &str = "redis-cli";

/// The slot of a key: CRC16 (XMODEM) of the key modulo [`SLOT_COUNT`], where only the part
/// between the first `{` and the next `}` is hashed if that part is not empty (the hash tag,
/// which puts related keys on one node).
///
/// ```
/// use sluice_testkit::key_slot;
/// assert_eq!(key_slot(b"123456789"), 12739);
/// assert_eq!(key_slot(b"{user1000}.following"), key_slot(b"user1000"));
/// // An empty tag does not count: the whole key is hashed.
/// assert_ne!(key_slot(b"{}.a"), key_slot(b"{}.b"));
/// ```
pub fn key_slot(key: &[u8]) -> u16 {
    crc16(hash_tag(key)) % SLOT_COUNT
}

/// The part of `key` that is hashed: the first non-empty `{…}` section, else all of it.
fn hash_tag(key: &[u8]) -> &[u8] {
    let Some(open) = key.iter().position(|&b| b == b'{') else {
        return key;
    };
    let rest = &key[open + 1..];
    match rest.iter().position(|&b| b == b'}') {
        Some(len) if len > 0 => &rest[..len],
        _ => key,
    }
}

/// CRC16-CCITT (XMODEM): polynomial 0x1021, initial value 0, as Redis Cluster uses.
fn crc16(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in bytes {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

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
    primaries: usize,
    replicas_per_primary: usize,
    node_timeout: Duration,
    args: Vec<OsString>,
    timeout: Duration,
}

impl Default for ClusterOptions {
    fn default() -> Self {
        Self {
            primaries: 3,
            replicas_per_primary: 1,
            node_timeout: DEFAULT_NODE_TIMEOUT,
            args: Vec::new(),
            timeout: CLUSTER_TIMEOUT,
        }
    }
}

impl ClusterOptions {
    /// Three primaries with one replica each, [`DEFAULT_NODE_TIMEOUT`], [`CLUSTER_TIMEOUT`].
    pub fn new() -> Self {
        Self::default()
    }

    /// The number of primaries, at least 3 (`redis-cli --cluster create` refuses fewer).
    pub fn primaries(mut self, n: usize) -> Self {
        self.primaries = n;
        self
    }

    /// The number of replicas of each primary (0 for none: no failover is then possible).
    pub fn replicas_per_primary(mut self, n: usize) -> Self {
        self.replicas_per_primary = n;
        self
    }

    /// `--cluster-node-timeout`, in whole milliseconds (default [`DEFAULT_NODE_TIMEOUT`]).
    pub fn node_timeout(mut self, timeout: Duration) -> Self {
        self.node_timeout = timeout;
        self
    }

    /// One extra argument for every node, after the kit's (so it can override them).
    pub fn arg(mut self, arg: impl Into<OsString>) -> Self {
        self.args.push(arg.into());
        self
    }

    /// Extra arguments for every node.
    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<OsString>,
    {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    /// How long [`RedisCluster::start_with`] waits for `redis-cli` and then for the cluster to
    /// be whole (default [`CLUSTER_TIMEOUT`]).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Starts a cluster with these options; see [`RedisCluster::start_with`].
    pub fn start(self) -> Result<RedisCluster, Error> {
        RedisCluster::start_with(self)
    }

    fn node_count(&self) -> usize {
        self.primaries * (1 + self.replicas_per_primary)
    }

    fn validate(&self) -> Result<(), Error> {
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

    /// The options of every node, but the bus port (chosen per node and attempt).
    fn server_options(&self) -> ServerOptions {
        ServerOptions::new()
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
            .args(self.args.iter().cloned())
    }
}

/// One primary's share of the cluster: its slots and its replicas, as indexes into
/// [`RedisCluster::nodes`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Shard {
    /// The primary.
    pub primary: usize,
    /// Its replicas that the cluster does not consider failed, in index order.
    pub replicas: Vec<usize>,
    /// The slots it serves, in order.
    pub slots: Vec<RangeInclusive<u16>>,
}

impl Shard {
    /// Whether this shard serves `slot`.
    pub fn serves(&self, slot: u16) -> bool {
        self.slots.iter().any(|range| range.contains(&slot))
    }

    /// How many slots it serves.
    pub fn slot_count(&self) -> usize {
        self.slots.iter().map(|r| r.clone().count()).sum()
    }
}

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
        options.validate()?;
        if !on_path(REDIS_CLI) {
            return Err(Error::MissingProgram {
                program: REDIS_CLI.to_owned(),
                package: "redis-tools".to_owned(),
            });
        }
        let server_options = options.server_options();
        let nodes = start_nodes(&server_options, options.node_count())?;
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
        process::run_tool(REDIS_CLI, &args, options.timeout)?;
        cluster.wait_ok_within(options.timeout)?;
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

    /// The index of the node listening on `port`, if it is one of this cluster's.
    pub fn node_index(&self, port: u16) -> Option<usize> {
        self.nodes.iter().position(|n| n.port() == port)
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
        self.wait_ok_within(CLUSTER_TIMEOUT)
    }

    /// [`wait_ok`](Self::wait_ok) with another deadline.
    pub fn wait_ok_within(&self, timeout: Duration) -> Result<Vec<Shard>, Error> {
        let mut last_seen = String::new();
        let mut shards = None;
        let waited = wait_until(timeout, "the cluster to be whole", || {
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

    /// One look at every reachable node: is the cluster whole, and if not, why not.
    fn health(&self) -> Result<Health, Error> {
        let mut problems: Vec<String> = Vec::new();
        let mut agreed: Option<(String, Vec<SlotRange>)> = None;
        // (index, reports role master)
        let mut roles: Vec<(usize, bool)> = Vec::new();
        for (i, node) in self.nodes.iter().enumerate() {
            if !node.is_reachable() {
                continue;
            }
            let addr = node.addr();
            let probe = match probe(node) {
                Ok(probe) => probe,
                Err(e) => {
                    problems.push(format!("node {i} ({addr}): {e}"));
                    continue;
                }
            };
            if probe.state.as_deref() != Some("ok") {
                problems.push(format!(
                    "node {i} ({addr}): cluster_state:{}",
                    probe.state.as_deref().unwrap_or("?")
                ));
            }
            let is_primary = probe.role.as_deref() == Some("master");
            if !is_primary && probe.link.as_deref() != Some("up") {
                problems.push(format!(
                    "node {i} ({addr}): replica with master_link_status:{}",
                    probe.link.as_deref().unwrap_or("?")
                ));
            }
            if probe.forking.as_deref() != Some("0") {
                problems.push(format!(
                    "node {i} ({addr}): rdb_bgsave_in_progress:{}",
                    probe.forking.as_deref().unwrap_or("?")
                ));
            }
            roles.push((i, is_primary));
            match &agreed {
                None => agreed = Some((addr, probe.slots)),
                Some((first, slots)) if *slots != probe.slots => problems.push(format!(
                    "the nodes disagree: {first} says [{}], {addr} says [{}]",
                    summarize(slots),
                    summarize(&probe.slots)
                )),
                Some(_) => {}
            }
        }
        let Some((source, ranges)) = agreed else {
            problems.push("no node is reachable".to_owned());
            return Ok(Health::NotYet(problems.join("; ")));
        };
        if !problems.is_empty() {
            return Ok(Health::NotYet(problems.join("; ")));
        }
        let covered: usize = ranges
            .iter()
            .map(|r| usize::from(r.end.saturating_sub(r.start)) + 1)
            .sum();
        if covered != usize::from(SLOT_COUNT) {
            return Ok(Health::NotYet(format!(
                "{covered} of {SLOT_COUNT} slots are served: [{}]",
                summarize(&ranges)
            )));
        }
        let shards = self.to_shards(&ranges, &source)?;
        for (i, is_primary) in roles {
            let in_map = shards.iter().find_map(|s| {
                if s.primary == i {
                    Some(true)
                } else if s.replicas.contains(&i) {
                    Some(false)
                } else {
                    None
                }
            });
            match in_map {
                Some(as_primary) if as_primary == is_primary => {}
                Some(as_primary) => problems.push(format!(
                    "node {i} ({}) reports role {} but the slot map has it as a {}",
                    self.describe(i),
                    if is_primary { "master" } else { "slave" },
                    if as_primary { "primary" } else { "replica" }
                )),
                None => problems.push(format!(
                    "node {i} ({}) is not in the slot map [{}]",
                    self.describe(i),
                    summarize(&ranges)
                )),
            }
        }
        for shard in &shards {
            if !self
                .nodes
                .get(shard.primary)
                .is_some_and(RedisServer::is_reachable)
            {
                problems.push(format!(
                    "slots {:?} are served by node {} ({}), which is not reachable",
                    shard.slots,
                    shard.primary,
                    self.describe(shard.primary)
                ));
            }
        }
        if problems.is_empty() {
            Ok(Health::Whole(shards))
        } else {
            Ok(Health::NotYet(problems.join("; ")))
        }
    }
}

/// The outcome of [`RedisCluster::health`].
enum Health {
    /// Every check passed; the agreed shards.
    Whole(Vec<Shard>),
    /// Not yet, and why.
    NotYet(String),
}

/// What one node says about itself and the cluster.
struct Probe {
    /// `cluster_state` of `CLUSTER INFO`.
    state: Option<String>,
    /// `CLUSTER SLOTS`.
    slots: Vec<SlotRange>,
    /// `role` of `INFO replication`: `master` or `slave`.
    role: Option<String>,
    /// `master_link_status` of `INFO replication` (replicas only).
    link: Option<String>,
    /// `rdb_bgsave_in_progress` of `INFO persistence`.
    forking: Option<String>,
}

/// One pipelined round trip: `CLUSTER INFO`, `CLUSTER SLOTS`, `INFO replication persistence`.
fn probe(node: &RedisServer) -> Result<Probe, Error> {
    let mut conn = node.connection()?;
    let (cluster_info, slots, info): (String, Value, String) = redis::pipe()
        .cmd("CLUSTER")
        .arg("INFO")
        .cmd("CLUSTER")
        .arg("SLOTS")
        .cmd("INFO")
        .arg("replication")
        .arg("persistence")
        .query(&mut conn)
        .map_err(|e| Error::redis(format!("probing {}", node.addr()), e))?;
    let field = |text: &str, name: &str| parse_info_field(text, name).map(str::to_owned);
    Ok(Probe {
        state: field(&cluster_info, "cluster_state"),
        slots: parse_slots(&slots, &node.addr())?,
        role: field(&info, "role"),
        link: field(&info, "master_link_status"),
        forking: field(&info, "rdb_bgsave_in_progress"),
    })
}

fn query_slots(node: &RedisServer, conn: &mut redis::Connection) -> Result<Vec<SlotRange>, Error> {
    let reply: Value = redis::cmd("CLUSTER")
        .arg("SLOTS")
        .query(conn)
        .map_err(|e| Error::redis(format!("`CLUSTER SLOTS` on {}", node.addr()), e))?;
    parse_slots(&reply, &node.addr())
}

/// One entry of `CLUSTER SLOTS`, by port.
#[derive(Debug, Clone, PartialEq, Eq)]
struct SlotRange {
    start: u16,
    end: u16,
    primary: u16,
    /// Sorted.
    replicas: Vec<u16>,
}

/// Parses `CLUSTER SLOTS`: `[[start, end, [ip, port, id, …], [replica…]…]…]`, sorted by slot.
fn parse_slots(reply: &Value, source: &str) -> Result<Vec<SlotRange>, Error> {
    let bad = || Error::UnexpectedReply {
        context: format!("CLUSTER SLOTS on {source}"),
        reply: format!("{reply:?}"),
    };
    let Value::Array(entries) = reply else {
        return Err(bad());
    };
    let mut ranges = Vec::with_capacity(entries.len());
    for entry in entries {
        let Value::Array(fields) = entry else {
            return Err(bad());
        };
        let [start, end, primary, replicas @ ..] = fields.as_slice() else {
            return Err(bad());
        };
        let port_of = |node: &Value| match node {
            Value::Array(node) => node.get(1).and_then(as_u16),
            _ => None,
        };
        let mut replica_ports = replicas
            .iter()
            .map(port_of)
            .collect::<Option<Vec<u16>>>()
            .ok_or_else(bad)?;
        replica_ports.sort_unstable();
        ranges.push(SlotRange {
            start: as_u16(start).ok_or_else(bad)?,
            end: as_u16(end).ok_or_else(bad)?,
            primary: port_of(primary).ok_or_else(bad)?,
            replicas: replica_ports,
        });
    }
    ranges.sort_by_key(|r| r.start);
    Ok(ranges)
}

fn as_u16(value: &Value) -> Option<u16> {
    match value {
        Value::Int(n) => u16::try_from(*n).ok(),
        Value::BulkString(bytes) => std::str::from_utf8(bytes).ok()?.parse().ok(),
        _ => None,
    }
}

/// `0-5460@30001[30004] 5461-10922@…`: a slot map in one line, for messages.
fn summarize(ranges: &[SlotRange]) -> String {
    let mut out = String::new();
    for r in ranges {
        if !out.is_empty() {
            out.push(' ');
        }
        let _ = write!(out, "{}-{}@{}{:?}", r.start, r.end, r.primary, r.replicas);
    }
    out
}

fn overlaps(a: &RangeInclusive<u16>, b: &RangeInclusive<u16>) -> bool {
    a.start() <= b.end() && b.start() <= a.end()
}

/// Starts `count` nodes in parallel; all or nothing.
fn start_nodes(options: &ServerOptions, count: usize) -> Result<Vec<RedisServer>, Error> {
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..count)
            .map(|_| scope.spawn(|| start_node(options)))
            .collect();
        let results: Vec<Result<RedisServer, Error>> = handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
            })
            .collect();
        results.into_iter().collect()
    })
}

/// One node with a free bus port, retried with another one if it was taken meanwhile.
fn start_node(options: &ServerOptions) -> Result<RedisServer, Error> {
    let mut attempt = 0;
    loop {
        attempt += 1;
        let bus_port = free_port()?;
        let started = options
            .clone()
            .args(["--cluster-port".to_owned(), bus_port.to_string()])
            .start();
        match started {
            Err(Error::AddrInUse { .. } | Error::PortRetriesExhausted { .. })
                if attempt < PORT_ATTEMPTS => {}
            other => return other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc16_matches_the_reference_check_value() {
        // The standard CRC-16/XMODEM check value, also in the Redis Cluster spec.
        assert_eq!(crc16(b"123456789"), 0x31C3);
        assert_eq!(crc16(b""), 0);
    }

    #[test]
    fn slots_of_known_keys() {
        // Values from `CLUSTER KEYSLOT` (the integration test checks many more live).
        assert_eq!(key_slot(b"foo"), 12182);
        assert_eq!(key_slot(b"bar"), 5061);
        assert_eq!(key_slot(b"hello"), 866);
        assert_eq!(key_slot(b""), 0);
    }

    #[test]
    fn the_hash_tag_rule() {
        assert_eq!(hash_tag(b"{user1000}.following"), b"user1000");
        assert_eq!(hash_tag(b"foo{bar}{zap}"), b"bar");
        assert_eq!(hash_tag(b"foo{}{bar}"), b"foo{}{bar}");
        assert_eq!(hash_tag(b"foo{{bar}}zap"), b"{bar");
        assert_eq!(hash_tag(b"foo{bar"), b"foo{bar");
        assert_eq!(hash_tag(b"}{x}"), b"x");
        assert_eq!(hash_tag(b"plain"), b"plain");
    }

    #[test]
    fn parses_cluster_slots() {
        let node = |port: i64| {
            Value::Array(vec![
                Value::BulkString(b"127.0.0.1".to_vec()),
                Value::Int(port),
                Value::BulkString(b"id".to_vec()),
                Value::Array(Vec::new()),
            ])
        };
        let reply = Value::Array(vec![
            Value::Array(vec![
                Value::Int(5461),
                Value::Int(16383),
                node(2),
                node(5),
                node(4),
            ]),
            Value::Array(vec![Value::Int(0), Value::Int(5460), node(1)]),
        ]);
        let ranges = parse_slots(&reply, "here").unwrap();
        assert_eq!(
            ranges,
            [
                SlotRange {
                    start: 0,
                    end: 5460,
                    primary: 1,
                    replicas: vec![]
                },
                SlotRange {
                    start: 5461,
                    end: 16383,
                    primary: 2,
                    replicas: vec![4, 5]
                },
            ]
        );
        assert_eq!(summarize(&ranges), "0-5460@1[] 5461-16383@2[4, 5]");
        let err = parse_slots(&Value::Int(1), "here").unwrap_err();
        assert!(matches!(err, Error::UnexpectedReply { .. }), "{err}");
    }

    #[test]
    fn shards_know_their_slots() {
        let shard = Shard {
            primary: 0,
            replicas: vec![3],
            slots: vec![0..=9, 20..=20],
        };
        assert!(shard.serves(0) && shard.serves(9) && shard.serves(20));
        assert!(!shard.serves(10) && !shard.serves(21));
        assert_eq!(shard.slot_count(), 11);
        assert!(overlaps(&(0..=5), &(5..=9)));
        assert!(!overlaps(&(0..=4), &(5..=9)));
    }

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
