//! Sentinel: the sentinels are asked for the primary and its replicas when the store
//! connects, and again when the primary in use fails; their `+switch-master` announcements
//! ([`switches`](super::switches)) switch the store at once. The [`SentinelWatch`] holds what
//! that needs: the sentinels, the nodes in use (shared with the store) and the code to load
//! on a new primary.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Client, Role};
use sluice::StoreError;

use super::node::{Current, Nodes, Throttle, certificates, client, node, with_tls_hint};
use super::switches::{self, Follower};
use crate::config::{Credentials, RedisConfig, redact};
use crate::script::Code;

/// Asks the sentinels for the current primary when the one in use fails.
pub(crate) struct SentinelWatch {
    master: String,
    sentinels: tokio::sync::Mutex<Sentinels>,
    /// One lookup at a time, and not more often than every [`REDISCOVER_EVERY`].
    lookup: Throttle,
    /// The nodes in use (the store's), replaced after a failover.
    nodes: Current,
    /// Loaded on a new primary (it may have been restarted empty).
    code: Code,
    /// The store's call timeout.
    timeout: Duration,
}

/// The shortest time between two Sentinel lookups.
const REDISCOVER_EVERY: Duration = Duration::from_millis(100);

/// How long one Sentinel lookup may take: twice the call timeout, within these bounds. The
/// lookup checks the named primary's role, and a stalled old primary must not hold it long.
const SENTINEL_TIMEOUT_BOUNDS: (Duration, Duration) =
    (Duration::from_millis(100), Duration::from_secs(1));

/// How long the first Sentinel lookup may take, when the store connects: no traffic waits
/// for it yet, and it makes the first connections (TLS handshakes, logins) to the sentinels
/// and the nodes they name.
const FIRST_SENTINEL_LOOKUP: Duration = Duration::from_secs(2);

/// How long a Sentinel lookup may take after a failure, for calls that time out after
/// `timeout`.
fn lookup_limit(timeout: Duration) -> Duration {
    (timeout * 2).clamp(SENTINEL_TIMEOUT_BOUNDS.0, SENTINEL_TIMEOUT_BOUNDS.1)
}

impl SentinelWatch {
    /// Asks `urls`' sentinels for `master`'s primary and replicas (within
    /// [`FIRST_SENTINEL_LOOKUP`]): the nodes to use, and the watch that replaces them.
    pub(crate) async fn connect(
        config: &RedisConfig,
        code: &Code,
        master: &str,
        urls: &[String],
    ) -> Result<(Current, SentinelWatch), StoreError> {
        let mut sentinels = Sentinels::new(
            urls,
            certificates(config)?,
            config.sentinel_credentials.as_ref(),
            config.credentials.clone(),
            config.timeout,
        )?;
        let nodes = discover(&mut sentinels, master, FIRST_SENTINEL_LOOKUP).await?;
        tracing::info!(master = %master, primary = %nodes.primary.url, "sentinel named the primary");
        let nodes = Current::new(nodes);
        let watch = SentinelWatch {
            master: master.to_owned(),
            sentinels: tokio::sync::Mutex::new(sentinels),
            lookup: Throttle::new(REDISCOVER_EVERY),
            nodes: nodes.clone(),
            code: code.clone(),
            timeout: config.timeout,
        };
        Ok((nodes, watch))
    }

    /// Subscribes to every sentinel's failover announcements, for as long as the watch lives;
    /// the subscriptions' tasks, to stop with the store.
    pub(crate) async fn follow(self: &Arc<Self>) -> Vec<tokio::task::AbortHandle> {
        let links: Vec<(String, Client)> = {
            let sentinels = self.sentinels.lock().await;
            sentinels
                .links
                .iter()
                .map(|l| (l.url.clone(), l.client.clone()))
                .collect()
        };
        links
            .into_iter()
            .map(|(url, client)| {
                let task = tokio::spawn(switches::follow(
                    Arc::downgrade(self),
                    url,
                    client,
                    self.master.clone(),
                ));
                task.abort_handle()
            })
            .collect()
    }

    /// Asks the sentinels (in the background, at most every [`REDISCOVER_EVERY`]) whether
    /// another node is the primary now, and switches to it.
    pub(crate) fn rediscover_soon(self: &Arc<Self>) {
        if !self.lookup.start() {
            return;
        }
        let watch = self.clone();
        tokio::spawn(async move {
            watch.rediscover().await;
            watch.lookup.done();
        });
    }

    /// Switches to the primary a sentinel announced (`+switch-master`) once it says it is
    /// one. The announcement carries the new address, so no lookup can name the old primary
    /// again (after a `SENTINEL FAILOVER` it stays writable until Sentinel demotes it). Peeks
    /// read the new primary until the next lookup lists its replicas.
    async fn switch_to_announced(&self, host: &str, port: u16) {
        let (nodes, timeout) = (&self.nodes, self.timeout);
        let dialer = self.sentinels.lock().await.nodes.clone();
        let url = dialer.url(host, port);
        let shown = redact(&url);
        if nodes.get().primary.url == shown {
            return;
        }
        match tokio::time::timeout(lookup_limit(timeout), dialer.role(&url)).await {
            Ok(Ok(Role::Primary { .. })) => {}
            Ok(Ok(_)) => {
                tracing::debug!(master = %self.master, primary = %shown, "announced primary is not one yet");
                return;
            }
            Ok(Err(e)) => {
                tracing::debug!(master = %self.master, error = %e, "announced primary unreachable");
                return;
            }
            Err(_) => return,
        }
        let primary = match node(&url, dialer.certs.as_ref(), dialer.timeout) {
            Ok(n) => n,
            Err(e) => {
                tracing::warn!(master = %self.master, error = %e, "announced primary");
                return;
            }
        };
        if let Err(e) = primary.load(&self.code, timeout).await {
            tracing::warn!(master = %self.master, primary = %shown, error = %e, "could not load the code on the new primary");
        }
        let from = nodes.get().primary.url.clone();
        tracing::warn!(master = %self.master, %from, to = %shown, "sentinel announced a failover: switching primary");
        nodes.set(Nodes {
            primary,
            replicas: Vec::new(),
        });
    }

    async fn rediscover(&self) {
        let (nodes, timeout) = (&self.nodes, self.timeout);
        let found = {
            let mut sentinels = self.sentinels.lock().await;
            discover(&mut sentinels, &self.master, lookup_limit(timeout)).await
        };
        let found = match found {
            Ok(found) => found,
            Err(e) => {
                tracing::debug!(master = %self.master, error = %e, "sentinel lookup failed");
                return;
            }
        };
        let current = nodes.get();
        let same_replicas = current.replicas.len() == found.replicas.len()
            && current
                .replicas
                .iter()
                .zip(&found.replicas)
                .all(|(a, b)| a.url == b.url);
        if current.primary.url == found.primary.url && same_replicas {
            return;
        }
        if current.primary.url != found.primary.url {
            // The library replicates, but a promoted node may have been restarted empty.
            if let Err(e) = found.primary.load(&self.code, timeout).await {
                tracing::warn!(master = %self.master, primary = %found.primary.url, error = %e, "could not load the code on the new primary");
            }
            tracing::warn!(master = %self.master, from = %current.primary.url, to = %found.primary.url, "sentinel failover: switching primary");
        }
        nodes.set(found);
    }
}

impl Follower for SentinelWatch {
    async fn switch_to(&self, host: &str, port: u16) {
        self.switch_to_announced(host, port).await;
    }
}

/// The sentinels of a [`Topology::Sentinel`], and how to reach the data nodes they name.
///
/// The lookup is Sluice's own rather than the `redis` crate's `Sentinel`: that one (1.x)
/// takes no certificates for the sentinels nor for the nodes they name (`Sentinel::build`
/// has no TLS variant; `SentinelClientBuilder` takes both, but hands out one node per call,
/// never the list of replicas). Here the sentinels and the data nodes are reached with the
/// configured CA and client certificate, and each with its own credentials.
struct Sentinels {
    links: Vec<SentinelLink>,
    nodes: Arc<NodeDialer>,
}

/// One sentinel: its client, and its connection once made.
struct SentinelLink {
    /// Redacted: what errors show.
    url: String,
    client: Client,
    conn: Option<MultiplexedConnection>,
}

/// How to reach a data node a sentinel names: over TLS when the sentinels are, with the
/// configured certificates and the data nodes' credentials.
struct NodeDialer {
    scheme: &'static str,
    certs: Option<redis::TlsCertificates>,
    credentials: Option<Credentials>,
    timeout: Duration,
}

impl NodeDialer {
    /// The URL of the node at `host:port`, with the credentials.
    fn url(&self, host: &str, port: u16) -> String {
        let host = if host.contains(':') {
            format!("[{host}]")
        } else {
            host.to_owned()
        };
        let url = format!("{}://{host}:{port}", self.scheme);
        match &self.credentials {
            Some(c) => c.apply(&url),
            None => url,
        }
    }

    /// Connects to `url` and asks its `ROLE`. Errors name the node (redacted).
    async fn role(&self, url: &str) -> Result<Role, String> {
        let shown = redact(url);
        let client = client(url, self.certs.as_ref()).map_err(|e| e.to_string())?;
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.timeout.max(Duration::from_millis(500))));
        let failed = |e: redis::RedisError| with_tls_hint(&shown, format!("{shown}: {e}"));
        let mut conn = client
            .get_multiplexed_async_connection_with_config(&config)
            .await
            .map_err(failed)?;
        redis::cmd("ROLE")
            .query_async(&mut conn)
            .await
            .map_err(failed)
    }
}

impl Sentinels {
    /// The sentinels at `urls` (with `sentinel_credentials` where a URL names no user); the
    /// data nodes are reached with `credentials`, over TLS if the sentinels are.
    fn new(
        urls: &[String],
        certs: Option<redis::TlsCertificates>,
        sentinel_credentials: Option<&Credentials>,
        credentials: Option<Credentials>,
        timeout: Duration,
    ) -> Result<Self, StoreError> {
        if urls.is_empty() {
            return Err(StoreError::Backend(
                "sentinel: at least one sentinel URL is needed".to_owned(),
            ));
        }
        let tls = urls.iter().filter(|u| u.starts_with("rediss://")).count();
        if tls != 0 && tls != urls.len() {
            return Err(StoreError::Backend(format!(
                "sentinel URLs {:?}: use rediss:// for all of them or for none (the data nodes \
                 are reached over TLS when the sentinels are)",
                urls.iter().map(|u| redact(u)).collect::<Vec<_>>()
            )));
        }
        let links = urls
            .iter()
            .map(|url| {
                let url = match sentinel_credentials {
                    Some(c) => c.apply(url),
                    None => url.clone(),
                };
                Ok(SentinelLink {
                    client: client(&url, certs.as_ref())?,
                    url: redact(&url),
                    conn: None,
                })
            })
            .collect::<Result<Vec<_>, StoreError>>()?;
        let nodes = NodeDialer {
            scheme: if tls == 0 { "redis" } else { "rediss" },
            certs,
            credentials,
            timeout,
        };
        Ok(Self {
            links,
            nodes: Arc::new(nodes),
        })
    }
}

/// What one sentinel said about the primary: the node it names, checked with `ROLE`.
struct Answer {
    sentinel: usize,
    conn: Option<MultiplexedConnection>,
    primary: Result<String, String>,
}

/// Where a node a sentinel lists (`SENTINEL MASTER`, `SENTINEL REPLICAS`) is, unless the
/// sentinel flags it down.
fn up_at(info: &HashMap<String, String>) -> Option<(&str, u16)> {
    let field = |name: &str| info.get(name).map(String::as_str);
    let down = field("flags")
        .unwrap_or("")
        .split(',')
        .any(|f| matches!(f, "s_down" | "o_down" | "disconnected"));
    if down {
        return None;
    }
    Some((field("ip")?, field("port")?.parse().ok()?))
}

/// Asks one sentinel (connecting first if needed) for `master`'s address, and checks that
/// the node there is a primary. Owns what it needs: the lookups run as tasks.
async fn ask(
    sentinel: usize,
    url: String,
    client: Client,
    mut conn: Option<MultiplexedConnection>,
    master: String,
    nodes: Arc<NodeDialer>,
) -> Answer {
    let failed = |e: redis::RedisError| with_tls_hint(&url, format!("sentinel {url}: {e}"));
    let mut cmd = redis::cmd("SENTINEL");
    cmd.arg("MASTER").arg(&master);
    let reply: Result<HashMap<String, String>, String> = async {
        // A cached connection that broke (the sentinel restarted) is made again once, now.
        let cached = conn.take();
        let retry = cached.is_some();
        let mut c = match cached {
            Some(c) => c,
            None => client
                .get_multiplexed_async_connection()
                .await
                .map_err(failed)?,
        };
        let broken = |e: &redis::RedisError| e.is_io_error() || e.is_unrecoverable_error();
        let reply = match cmd.query_async(&mut c).await {
            Err(e) if retry && broken(&e) => {
                c = client
                    .get_multiplexed_async_connection()
                    .await
                    .map_err(failed)?;
                cmd.query_async(&mut c).await
            }
            other => other,
        };
        match reply {
            // A broken connection is made again next time.
            Err(e) if broken(&e) => Err(failed(e)),
            other => {
                conn = Some(c);
                other.map_err(failed)
            }
        }
    }
    .await;
    let primary = reply.and_then(|info| match up_at(&info) {
        Some((ip, port)) => Ok(nodes.url(ip, port)),
        None => Err(format!(
            "sentinel {url}: no primary for `{master}` that is up (flags `{}`)",
            info.get("flags").map_or("", String::as_str)
        )),
    });
    let primary = match primary {
        Ok(node) => match nodes.role(&node).await {
            Ok(Role::Primary { .. }) => Ok(node),
            Ok(_) => Err(format!(
                "sentinel {url} names {} as the primary, which is not one (yet)",
                redact(&node)
            )),
            Err(e) => Err(format!("primary named by sentinel {url}: {e}")),
        },
        Err(e) => Err(e),
    };
    Answer {
        sentinel,
        conn,
        primary,
    }
}

/// Asks the sentinels for `master`'s primary and replicas, within `limit` each: all
/// sentinels at once, and the first primary named that says it is one wins.
async fn discover(
    sentinels: &mut Sentinels,
    master: &str,
    limit: Duration,
) -> Result<Nodes, StoreError> {
    let mut lookups = tokio::task::JoinSet::new();
    for (i, link) in sentinels.links.iter_mut().enumerate() {
        lookups.spawn(ask(
            i,
            link.url.clone(),
            link.client.clone(),
            link.conn.take(),
            master.to_owned(),
            sentinels.nodes.clone(),
        ));
    }
    let mut problems = Vec::new();
    let deadline = tokio::time::Instant::now() + limit;
    let mut found = None;
    while found.is_none() {
        let answer = match tokio::time::timeout_at(deadline, lookups.join_next()).await {
            Ok(Some(Ok(answer))) => answer,
            Ok(Some(Err(e))) => {
                problems.push(format!("a sentinel lookup failed: {e}"));
                continue;
            }
            Ok(None) => break,
            Err(_) => {
                problems.push(format!("no answer within {}ms", limit.as_millis()));
                break;
            }
        };
        if let Some(link) = sentinels.links.get_mut(answer.sentinel) {
            link.conn = answer.conn;
        }
        match answer.primary {
            Ok(url) => found = Some((answer.sentinel, url)),
            Err(e) => problems.push(e),
        }
    }
    lookups.abort_all();
    let Some((sentinel, primary)) = found else {
        return Err(StoreError::Unavailable(format!(
            "sentinels cannot name a primary for `{master}`: {}",
            problems.join("; ")
        )));
    };
    // Replicas are for peeks only, and one may be the stalled old primary: a lookup that
    // fails or hangs leaves none (peeks then read the primary) rather than delaying the
    // switch to the new primary.
    let replicas = tokio::time::timeout_at(
        tokio::time::Instant::now() + limit,
        replicas(sentinels, sentinel, master),
    )
    .await
    .unwrap_or_default();
    let nodes = &sentinels.nodes;
    let primary = node(&primary, nodes.certs.as_ref(), nodes.timeout)?;
    let replicas = replicas
        .iter()
        .map(|url| node(url, nodes.certs.as_ref(), nodes.timeout))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Nodes { primary, replicas })
}

/// The replicas of `master` that sentinel `i` lists as up and that say they are replicas
/// (checked all at once), in its order; none if it cannot say.
async fn replicas(sentinels: &mut Sentinels, i: usize, master: &str) -> Vec<String> {
    let Some(conn) = sentinels.links.get_mut(i).and_then(|l| l.conn.as_mut()) else {
        return Vec::new();
    };
    let listed: Vec<HashMap<String, String>> = match redis::cmd("SENTINEL")
        .arg("REPLICAS")
        .arg(master)
        .query_async(conn)
        .await
    {
        Ok(listed) => listed,
        Err(_) => return Vec::new(),
    };
    let mut checks = tokio::task::JoinSet::new();
    for (n, info) in listed.iter().enumerate() {
        if let Some((ip, port)) = up_at(info) {
            let nodes = sentinels.nodes.clone();
            let url = nodes.url(ip, port);
            checks.spawn(async move {
                let role = nodes.role(&url).await;
                (n, matches!(role, Ok(Role::Replica { .. })).then_some(url))
            });
        }
    }
    let mut replicas: Vec<(usize, String)> = checks
        .join_all()
        .await
        .into_iter()
        .filter_map(|(n, url)| url.map(|u| (n, u)))
        .collect();
    replicas.sort_by_key(|(n, _)| *n);
    replicas.into_iter().map(|(_, url)| url).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dialer(scheme: &'static str, credentials: Option<Credentials>) -> NodeDialer {
        NodeDialer {
            scheme,
            certs: None,
            credentials,
            timeout: Duration::from_millis(50),
        }
    }

    #[test]
    fn a_node_a_sentinel_names_is_reached_like_the_sentinels_with_the_data_credentials() {
        let tls = dialer(
            "rediss",
            Some(Credentials::new(Some("alice".to_owned()), "pw")),
        );
        assert_eq!(tls.url("10.0.0.5", 6380), "rediss://alice:pw@10.0.0.5:6380");
        let plain = dialer("redis", None);
        assert_eq!(plain.url("10.0.0.5", 6379), "redis://10.0.0.5:6379");
        assert_eq!(plain.url("fe80::1", 6379), "redis://[fe80::1]:6379");
    }

    #[test]
    fn sentinels_are_all_tls_or_none() {
        let urls = [
            "rediss://s1:26379".to_owned(),
            "redis://s2:26379".to_owned(),
        ];
        let Err(e) = Sentinels::new(&urls, None, None, None, Duration::from_millis(50)) else {
            panic!("a mix of rediss:// and redis:// sentinels was accepted");
        };
        assert!(e.to_string().contains("for all of them or for none"), "{e}");
        let Err(e) = Sentinels::new(&[], None, None, None, Duration::from_millis(50)) else {
            panic!("no sentinel was accepted");
        };
        assert!(e.to_string().contains("at least one sentinel"), "{e}");
    }
}
