//! Is the cluster whole? One probe per node, and the verdict over all of them.

use redis::Value;

use super::RedisCluster;
use super::slots::{SLOT_COUNT, Shard, SlotRange, parse_slots, summarize};
use crate::{Error, RedisServer, parse_info_field};

impl RedisCluster {
    /// One look at every reachable node: is the cluster whole, and if not, why not.
    pub(super) fn health(&self) -> Result<Health, Error> {
        let mut problems: Vec<String> = Vec::new();
        let (agreed, roles) = self.probe_all(&mut problems);
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
        self.check_map(&shards, roles, &ranges, &mut problems);
        if problems.is_empty() {
            Ok(Health::Whole(shards))
        } else {
            Ok(Health::NotYet(problems.join("; ")))
        }
    }

    /// Probes every reachable node, noting what is wrong with each: the slot map they agree
    /// on (with the first node that gave it), and each node's index and whether it reports
    /// role master.
    fn probe_all(&self, problems: &mut Vec<String>) -> (Option<Agreed>, Vec<(usize, bool)>) {
        let mut agreed: Option<Agreed> = None;
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
        (agreed, roles)
    }

    /// Each node has the role the slot map gives it, and every shard's primary is reachable.
    fn check_map(
        &self,
        shards: &[Shard],
        roles: Vec<(usize, bool)>,
        ranges: &[SlotRange],
        problems: &mut Vec<String>,
    ) {
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
                    summarize(ranges)
                )),
            }
        }
        for shard in shards {
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
    }
}

/// The slot map the nodes agree on, with the address of the first node that gave it.
type Agreed = (String, Vec<SlotRange>);

/// The outcome of [`RedisCluster::health`].
pub(super) enum Health {
    /// Every check passed; the agreed shards.
    Whole(Vec<Shard>),
    /// Not yet, and why.
    NotYet(String),
}

/// What one node says about itself and the cluster.
pub(super) struct Probe {
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
pub(super) fn probe(node: &RedisServer) -> Result<Probe, Error> {
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

pub(super) fn query_slots(
    node: &RedisServer,
    conn: &mut redis::Connection,
) -> Result<Vec<SlotRange>, Error> {
    let reply: Value = redis::cmd("CLUSTER")
        .arg("SLOTS")
        .query(conn)
        .map_err(|e| Error::redis(format!("`CLUSTER SLOTS` on {}", node.addr()), e))?;
    parse_slots(&reply, &node.addr())
}
