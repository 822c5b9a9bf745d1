//! Redis Sentinel: a primary with replicas, watched by sentinels that fail it over.
//!
//! A [`SentinelGroup`] is a [`ReplicaSet`] (the data nodes: index 0 is the initial primary)
//! plus sentinel processes, each a [`RedisServer`] run as `redis-server <config> --sentinel`:
//! the same binary as `redis-sentinel` (which Debian ships as a link to it), so sentinels need
//! nothing installed beyond `redis-server`. Each sentinel's config file lives in its own
//! directory, where Sentinel rewrites it (its id, the other sentinels and replicas it found,
//! the epochs); [`RedisServer::restart`] keeps it, like a real sentinel's disk.
//!
//! # Tuned for quick failovers
//!
//! - `sentinel down-after-milliseconds` [`DOWN_AFTER`] (1 s; Redis's default is 30 s):
//!   how long the primary may not answer before a sentinel considers it down.
//! - `sentinel failover-timeout` [`FAILOVER_TIMEOUT`] (3 s; default 3 minutes): also
//!   how long a sentinel waits before retrying a failover whose election failed (twice this).
//!
//! A failover after the primary stalls then takes ~3–5 s: the down-after time, the sentinels
//! agreeing it is down (quorum) and electing a leader (a random delay of up to 1 s each),
//! the promotion of the best replica, and the other sentinels hearing of it through the
//! hello messages they publish every 2 s. Some Sentinel periods are fixed and not shortened
//! here: sentinels find each other through those 2-second hello messages, so
//! [`SentinelGroup::start`] takes ~2–3 s; and a resumed or restarted old primary is turned
//! into a replica no sooner than 8 s (four hello periods) after it reappears — ~20 s measured
//! after a pause, since a sentinel also waits before reconnecting a link it dropped. A test
//! that needs the old primary back as a replica calls [`SentinelGroup::wait_ready`], which
//! waits for that; budget for it. (Redis 7's `SENTINEL DEBUG` can shorten these periods; the
//! kit does not use it, so timings stay those of a production Sentinel.)
//!
//! # Quorum and majority
//!
//! The quorum is how many sentinels must agree the primary is down; a failover also needs a
//! leader elected by a majority of all sentinels. With 3 sentinels and quorum 2 (the
//! defaults) one sentinel may be paused or killed and failovers still happen.

use std::collections::HashMap;
use std::time::Duration;

use crate::wait::with_last_seen;
use crate::{Error, RedisServer, ReplicaSet, ServerOptions, wait_until};

mod options;

pub use options::SentinelOptions;

/// The `sentinel down-after-milliseconds` of a [`SentinelGroup`].
pub const DOWN_AFTER: Duration = Duration::from_millis(1000);
/// The `sentinel failover-timeout` of a [`SentinelGroup`].
pub const FAILOVER_TIMEOUT: Duration = Duration::from_millis(3000);
/// The deadline for the sentinels to know each other and the replicas
/// ([`SentinelGroup::start`], [`SentinelGroup::wait_ready`]).
pub const SENTINEL_TIMEOUT: Duration = Duration::from_secs(20);

/// A primary with replicas and the sentinels that watch them, all on free loopback ports.
///
/// Dropping it kills every process and removes their directories. See the
/// [module docs](self) for the settings and timings.
#[derive(Debug)]
pub struct SentinelGroup {
    /// The data nodes: the initial primary, then its replicas.
    data: Vec<RedisServer>,
    sentinels: Vec<RedisServer>,
    master_name: String,
}

impl SentinelGroup {
    /// One primary, one replica and three sentinels (quorum 2) monitoring `mymaster`;
    /// returns once they are ready ([`wait_ready`](Self::wait_ready)).
    pub fn start() -> Result<Self, Error> {
        Self::start_with(SentinelOptions::new())
    }

    /// A group as `options` say: starts the data nodes (a [`ReplicaSet`], in sync), then the
    /// sentinels in parallel, then polls until every sentinel knows the primary, the
    /// replicas and the other sentinels, so that a failover can happen.
    pub fn start_with(options: SentinelOptions) -> Result<Self, Error> {
        options.validate()?;
        let tls = |server: ServerOptions| match &options.tls {
            Some(files) => server.tls_files(files.iter().cloned()),
            None => server,
        };
        let data_options = tls(ServerOptions::new().args(options.data_args.iter().cloned()));
        let ReplicaSet { primary, replicas } =
            ReplicaSet::start_with_options(options.replicas, data_options)?;
        let sentinel_options = ServerOptions::new()
            .config(options.sentinel_config(primary.announced_port()))
            .arg("--sentinel")
            .args(options.sentinel_args.iter().cloned());
        let sentinels = RedisServer::start_many(std::iter::repeat_n(
            tls(sentinel_options),
            options.sentinels,
        ))?;
        let mut data = Vec::with_capacity(1 + replicas.len());
        data.push(primary);
        data.extend(replicas);
        let group = Self {
            data,
            sentinels,
            master_name: options.master_name,
        };
        group.wait_ready()?;
        Ok(group)
    }

    /// The name the primary is monitored under.
    pub fn master_name(&self) -> &str {
        &self.master_name
    }

    /// The data nodes: index 0 is the **initial** primary, then its replicas. Roles change
    /// with failovers; ask [`current_primary_port`](Self::current_primary_port).
    pub fn data_nodes(&self) -> &[RedisServer] {
        &self.data
    }

    /// One data node, to kill, pause, resume or restart it.
    ///
    /// # Panics
    ///
    /// If `index` is not below `data_nodes().len()`, like slice indexing.
    pub fn data_node_mut(&mut self, index: usize) -> &mut RedisServer {
        &mut self.data[index]
    }

    /// The index of the data node listening on `port` (its port or its TLS port), if it is
    /// one of this group's.
    pub fn data_node_index(&self, port: u16) -> Option<usize> {
        self.data.iter().position(|n| n.listens_on(port))
    }

    /// The sentinels.
    pub fn sentinels(&self) -> &[RedisServer] {
        &self.sentinels
    }

    /// `redis://127.0.0.1:PORT/` of every sentinel, for a Sentinel-aware client.
    pub fn sentinel_urls(&self) -> Vec<String> {
        self.sentinels.iter().map(RedisServer::url).collect()
    }

    /// `rediss://127.0.0.1:TLS_PORT` of every sentinel, when the group serves TLS
    /// ([`SentinelOptions::tls`]); empty otherwise.
    pub fn sentinel_tls_urls(&self) -> Vec<String> {
        self.sentinels
            .iter()
            .filter_map(RedisServer::tls_url)
            .collect()
    }

    /// The primary's port, as the first reachable sentinel that answers reports it
    /// (`SENTINEL get-master-addr-by-name`): its TLS port when the group serves TLS.
    pub fn current_primary_port(&self) -> Result<u16, Error> {
        let (ports, problems) = self.reported_primaries();
        ports
            .first()
            .copied()
            .ok_or_else(|| Error::UnexpectedReply {
                context: format!("the primary of {:?}", self.master_name),
                reply: problems.join("; "),
            })
    }

    /// Polls until every reachable sentinel (running and not paused) reports the same
    /// primary, which is one of the data nodes; knows every other reachable sentinel; and
    /// knows every other reachable data node as a replica that it is connected to and whose
    /// link to the primary is up. For at most [`SENTINEL_TIMEOUT`].
    pub fn wait_ready(&self) -> Result<(), Error> {
        let mut last_seen = String::new();
        let waited = wait_until(
            SENTINEL_TIMEOUT,
            &format!(
                "the sentinels of {:?} to know the primary, the replicas and each other",
                self.master_name
            ),
            || {
                let problems = self.readiness_problems();
                let ready = problems.is_empty();
                last_seen = problems.join("; ");
                Ok(ready)
            },
        );
        with_last_seen(waited, &last_seen)
    }

    /// Forces a failover away from the primary on `from_port` (`SENTINEL FAILOVER`: the old
    /// primary goes on running) and [waits for it](Self::wait_failover). Returns the new
    /// primary's port.
    pub fn force_failover(&self, from_port: u16, timeout: Duration) -> Result<u16, Error> {
        self.sentinels[0].cmd(&["SENTINEL", "FAILOVER", &self.master_name])?;
        self.wait_failover(from_port, timeout)
    }

    /// After the primary on `from_port` was paused or killed: polls until every reachable
    /// sentinel reports the same primary on another port and that data node reports its role
    /// as a master, for at most `timeout`. Returns the new primary's port.
    pub fn wait_failover(&self, from_port: u16, timeout: Duration) -> Result<u16, Error> {
        let mut last_seen = String::new();
        let mut new_port = None;
        let waited = wait_until(
            timeout,
            &format!(
                "the sentinels of {:?} to fail over from 127.0.0.1:{from_port}",
                self.master_name
            ),
            || {
                let (ports, problems) = self.reported_primaries();
                let port = match ports.as_slice() {
                    [port] if problems.is_empty() => *port,
                    _ => {
                        last_seen =
                            format!("primaries reported: {ports:?}; {}", problems.join("; "));
                        return Ok(false);
                    }
                };
                if port == from_port {
                    last_seen = format!("every sentinel still reports port {port}");
                    return Ok(false);
                }
                let Some(node) = self.data_node_index(port).and_then(|i| self.data.get(i)) else {
                    return Err(Error::UnexpectedReply {
                        context: format!("SENTINEL get-master-addr-by-name {}", self.master_name),
                        reply: format!("port {port}, which is no data node of this group"),
                    });
                };
                match node.info_field("replication", "role") {
                    Ok(Some(role)) if role == "master" => {
                        new_port = Some(port);
                        Ok(true)
                    }
                    Ok(role) => {
                        last_seen =
                            format!("the sentinels report port {port}, whose role is {role:?}");
                        Ok(false)
                    }
                    Err(e) => {
                        last_seen = format!("the sentinels report port {port}: {e}");
                        Ok(false)
                    }
                }
            },
        );
        with_last_seen(waited, &last_seen)?;
        new_port.ok_or_else(|| Error::Timeout {
            what: "a failover".to_owned(),
            timeout,
        })
    }

    /// The distinct primary ports the reachable sentinels report, and the sentinels that
    /// could not say.
    fn reported_primaries(&self) -> (Vec<u16>, Vec<String>) {
        let mut ports = Vec::new();
        let mut problems = Vec::new();
        for sentinel in self.sentinels.iter().filter(|s| s.is_reachable()) {
            match self.master_addr(sentinel) {
                Ok(port) => {
                    if !ports.contains(&port) {
                        ports.push(port);
                    }
                }
                Err(e) => problems.push(format!("sentinel {}: {e}", sentinel.addr())),
            }
        }
        if ports.is_empty() && problems.is_empty() {
            problems.push("no sentinel is reachable".to_owned());
        }
        (ports, problems)
    }

    /// What keeps the group from being ready; empty when it is.
    fn readiness_problems(&self) -> Vec<String> {
        let (ports, mut problems) = self.reported_primaries();
        let primary = match ports.as_slice() {
            [port] => *port,
            _ => {
                problems.push(format!("the sentinels report primaries {ports:?}"));
                return problems;
            }
        };
        if self.data_node_index(primary).is_none() {
            problems.push(format!(
                "the reported primary port {primary} is no data node"
            ));
            return problems;
        }
        if !problems.is_empty() {
            return problems;
        }
        for sentinel in self.sentinels.iter().filter(|s| s.is_reachable()) {
            let addr = sentinel.addr();
            let entries = self
                .sentinel_entries(sentinel, "sentinels")
                .and_then(|others| Ok((others, self.sentinel_entries(sentinel, "replicas")?)));
            let (others, replicas) = match entries {
                Ok(entries) => entries,
                Err(e) => {
                    problems.push(format!("sentinel {addr}: {e}"));
                    continue;
                }
            };
            for other in self.sentinels.iter().filter(|s| s.is_reachable()) {
                if other.port() != sentinel.port()
                    && !is_healthy(&others, other.announced_port(), None)
                {
                    problems.push(format!(
                        "sentinel {addr} does not know sentinel {} yet",
                        other.addr()
                    ));
                }
            }
            for node in self.data.iter().filter(|n| n.is_reachable()) {
                if !node.listens_on(primary)
                    && !is_healthy(&replicas, node.announced_port(), Some("ok"))
                {
                    problems.push(format!(
                        "sentinel {addr} does not see {} as a linked replica yet",
                        node.addr()
                    ));
                }
            }
        }
        problems
    }

    /// `SENTINEL get-master-addr-by-name` on one sentinel: the port (the host is always
    /// 127.0.0.1 here).
    fn master_addr(&self, sentinel: &RedisServer) -> Result<u16, Error> {
        let context = || {
            format!(
                "`SENTINEL get-master-addr-by-name {}` on {}",
                self.master_name,
                sentinel.addr()
            )
        };
        let mut conn = sentinel.connection()?;
        let reply: Option<(String, String)> = redis::cmd("SENTINEL")
            .arg("get-master-addr-by-name")
            .arg(&self.master_name)
            .query(&mut conn)
            .map_err(|e| Error::redis(context(), e))?;
        reply
            .and_then(|(_host, port)| port.parse().ok())
            .ok_or_else(|| Error::UnexpectedReply {
                context: context(),
                reply: "no address".to_owned(),
            })
    }

    /// `SENTINEL <what> <name>` (`replicas` or `sentinels`): one field map per instance.
    fn sentinel_entries(
        &self,
        sentinel: &RedisServer,
        what: &str,
    ) -> Result<Vec<HashMap<String, String>>, Error> {
        let mut conn = sentinel.connection()?;
        redis::cmd("SENTINEL")
            .arg(what)
            .arg(&self.master_name)
            .query(&mut conn)
            .map_err(|e| {
                Error::redis(
                    format!(
                        "`SENTINEL {what} {}` on {}",
                        self.master_name,
                        sentinel.addr()
                    ),
                    e,
                )
            })
    }
}

/// Whether `entries` (of `SENTINEL replicas`/`sentinels`) list `port` as neither down nor
/// disconnected, with `master-link-status` equal to `link` if given.
fn is_healthy(entries: &[HashMap<String, String>], port: u16, link: Option<&str>) -> bool {
    let port = port.to_string();
    entries.iter().any(|entry| {
        let field = |name: &str| entry.get(name).map(String::as_str);
        let flags = field("flags").unwrap_or("");
        field("port") == Some(port.as_str())
            && !flags
                .split(',')
                .any(|f| matches!(f, "s_down" | "o_down" | "disconnected"))
            && link.is_none_or(|link| field("master-link-status") == Some(link))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_are_validated() {
        SentinelOptions::new().validate().unwrap();
        for (options, why) in [
            (SentinelOptions::new().replicas(0), "at least one replica"),
            (SentinelOptions::new().sentinels(0), "at least one sentinel"),
            (SentinelOptions::new().quorum(4), "quorum 4"),
            (SentinelOptions::new().quorum(0), "quorum 0"),
            (SentinelOptions::new().master_name("a b"), "master name"),
            (SentinelOptions::new().master_name(""), "master name"),
        ] {
            let err = options.validate().unwrap_err();
            assert!(err.to_string().contains(why), "{err} should say {why}");
        }
    }

    #[test]
    fn the_sentinel_config() {
        let config = SentinelOptions::new()
            .master_name("limits")
            .quorum(1)
            .sentinel_config(4242);
        assert_eq!(
            config,
            "sentinel monitor limits 127.0.0.1 4242 1\n\
             sentinel down-after-milliseconds limits 1000\n\
             sentinel failover-timeout limits 3000\n\
             sentinel parallel-syncs limits 1\n"
        );
    }

    #[test]
    fn healthy_entries() {
        let entry = |port: &str, flags: &str, link: &str| {
            HashMap::from([
                ("port".to_owned(), port.to_owned()),
                ("flags".to_owned(), flags.to_owned()),
                ("master-link-status".to_owned(), link.to_owned()),
            ])
        };
        let entries = [
            entry("1", "slave", "ok"),
            entry("2", "slave,s_down,disconnected", "err"),
            entry("3", "slave", "err"),
            entry("4", "sentinel", ""),
        ];
        assert!(is_healthy(&entries, 1, Some("ok")));
        assert!(!is_healthy(&entries, 2, None));
        assert!(!is_healthy(&entries, 3, Some("ok")));
        assert!(is_healthy(&entries, 3, None));
        assert!(is_healthy(&entries, 4, None));
        assert!(!is_healthy(&entries, 5, None));
    }
}
