//! Which nodes a store talks to: a primary and its replicas at fixed addresses, found through
//! Sentinel (and found again after a failover), or a Redis Cluster whose client routes by
//! slot.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use redis::aio::{ConnectionManager, ConnectionManagerConfig, MultiplexedConnection};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::cluster_read_routing::RandomReplicaStrategy;
use redis::{AsyncConnectionConfig, Client, Role};
use sluice::StoreError;

use crate::config::{Credentials, ReadFrom, RedisConfig, Topology, redact};
use crate::error::{Failure, query};
use crate::script::{Code, ScriptMode};
use crate::store::RedisStore;

/// The connections of a store.
pub(crate) enum Backend {
    /// A primary and replicas; with `sentinel`, they are replaced after a failover.
    Direct {
        nodes: RwLock<Arc<Nodes>>,
        sentinel: Option<Box<SentinelWatch>>,
    },
    /// A Redis Cluster: the client routes each call by its keys' slot.
    Cluster { conn: Box<ClusterLink> },
}

/// A Cluster's connection, made anew when a failure suggests that its slot map is stale.
///
/// redis-rs's cluster client asks for the slot map again after `MOVED`, `READONLY` or a lost
/// connection, but not after timeouts: a primary that stalls rather than dies (paused, its
/// host unreachable) keeps receiving the calls of its slots, which time out for good, even
/// after the Cluster has promoted its replica. A new connection asks the seeds for the slots.
pub(crate) struct ClusterLink {
    client: redis::cluster::ClusterClient,
    conn: RwLock<ClusterConnection>,
    /// How long making a new connection may take.
    connect_within: Duration,
    /// One new connection at a time, and not more often than every [`RECONNECT_CLUSTER_EVERY`].
    connecting: AtomicBool,
    last_connect: Mutex<Option<Instant>>,
}

/// The shortest time between two new Cluster connections after failures.
const RECONNECT_CLUSTER_EVERY: Duration = Duration::from_millis(500);

impl ClusterLink {
    /// The connection in use now (a cheap clone).
    pub(crate) fn get(&self) -> ClusterConnection {
        self.conn.read().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// The nodes a direct store talks to now.
pub(crate) struct Nodes {
    pub(crate) primary: Node,
    pub(crate) replicas: Vec<Node>,
}

/// Asks the sentinels for the current primary when the one in use fails.
pub(crate) struct SentinelWatch {
    master: String,
    sentinels: tokio::sync::Mutex<Sentinels>,
    /// One lookup at a time, and not more often than every [`REDISCOVER_EVERY`].
    looking: AtomicBool,
    last_lookup: Mutex<Option<Instant>>,
}

impl SentinelWatch {
    /// The monitored master's name.
    pub(crate) fn master(&self) -> &str {
        &self.master
    }

    /// A client for each sentinel (for subscriptions), with its redacted URL.
    pub(crate) async fn sentinel_clients(&self) -> Vec<(String, Client)> {
        let sentinels = self.sentinels.lock().await;
        sentinels
            .links
            .iter()
            .map(|l| (l.url.clone(), l.client.clone()))
            .collect()
    }
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

/// One node and its shared, multiplexed connection.
pub(crate) struct Node {
    pub(crate) url: String,
    client: Client,
    config: ConnectionManagerConfig,
    conn: RwLock<ConnectionManager>,
    /// When the connection was last made anew after a refused login.
    renewed: Mutex<Option<Instant>>,
}

/// The shortest time between two new connections to one node after refused logins.
const RENEW_EVERY: Duration = Duration::from_millis(250);

impl Node {
    /// The node's shared connection (a cheap clone).
    pub(crate) fn conn(&self) -> ConnectionManager {
        self.conn.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Takes note of a call that failed. A connection whose login was refused
    /// (`WRONGPASS`, a disabled ACL user) stays refused in redis-rs's `ConnectionManager`,
    /// which reconnects only after I/O errors, so the node would never answer again once the
    /// credentials work; such a connection is made anew (lazily: at the next call), at most
    /// every [`RENEW_EVERY`].
    pub(crate) fn failed(&self, failure: &Failure) {
        if !failure.is_login_refused() {
            return;
        }
        {
            let mut renewed = self.renewed.lock().unwrap_or_else(|p| p.into_inner());
            if renewed.is_some_and(|t| t.elapsed() < RENEW_EVERY) {
                return;
            }
            *renewed = Some(Instant::now());
        }
        match ConnectionManager::new_lazy_with_config(self.client.clone(), self.config.clone()) {
            Ok(conn) => {
                tracing::debug!(node = %self.url, "login refused: connecting anew at the next call");
                *self.conn.write().unwrap_or_else(|p| p.into_inner()) = conn;
            }
            Err(e) => tracing::debug!(node = %self.url, error = %e, "cannot connect anew"),
        }
    }

    /// Sends one command on the node's shared connection, bounded by `timeout`.
    pub(crate) async fn query(
        &self,
        cmd: &redis::Cmd,
        timeout: Duration,
    ) -> Result<redis::Value, Failure> {
        let result = query(&mut self.conn(), cmd, timeout).await;
        if let Err(f) = &result {
            self.failed(f);
        }
        result
    }

    /// Loads `code` on this node.
    pub(crate) async fn load(&self, code: &Code, timeout: Duration) -> Result<(), StoreError> {
        let loaded = code.load(&mut self.conn(), timeout).await;
        if let Err(f) = &loaded {
            self.failed(f);
        }
        loaded.map_err(|f| match f.into_store_error(&self.url) {
            // What a TLS port does to a plaintext client: say what to change.
            StoreError::Unavailable(m) => StoreError::Unavailable(with_tls_hint(&self.url, m)),
            e => e,
        })
    }
}

fn node(
    url: &str,
    tls: Option<&redis::TlsCertificates>,
    timeout: Duration,
) -> Result<Node, StoreError> {
    // Only the redacted URL is kept: it is what errors and logs show.
    node_from_client(redact(url), client(url, tls)?, timeout)
}

/// A client for `url`, with `tls`'s certificates if it is a `rediss://` URL.
fn client(url: &str, tls: Option<&redis::TlsCertificates>) -> Result<Client, StoreError> {
    match tls {
        Some(certs) if url.starts_with("rediss://") => Client::build_with_tls(url, certs.clone()),
        _ => Client::open(url),
    }
    .map_err(|e| StoreError::Unavailable(format!("invalid Redis URL `{}`: {e}", redact(url))))
}

/// `message` about a plaintext `url` that the server hung up on, with what a TLS port does to
/// a plaintext client spelled out.
fn with_tls_hint(url: &str, message: String) -> String {
    let lower = message.to_lowercase();
    if url.starts_with("redis://")
        && (lower.contains("reset by peer") || lower.contains("broken pipe"))
    {
        format!("{message}; if this port serves TLS, use a rediss:// URL")
    } else {
        message
    }
}

/// The certificates of `config.tls`, read now; an error names the file.
fn certificates(config: &RedisConfig) -> Result<Option<redis::TlsCertificates>, StoreError> {
    config
        .tls
        .as_ref()
        .map(|t| t.load().map_err(StoreError::Backend))
        .transpose()
}

fn node_from_client(url: String, client: Client, timeout: Duration) -> Result<Node, StoreError> {
    // Reconnect quickly: a restarted node must be usable again well within a second. The
    // circuit breaker, not the connection, is what spares a dead node its traffic.
    let config = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(timeout.max(Duration::from_millis(500))))
        .set_response_timeout(None)
        .set_number_of_retries(1)
        .set_min_delay(Duration::from_millis(10))
        .set_max_delay(Duration::from_millis(100));
    let conn = ConnectionManager::new_lazy_with_config(client.clone(), config.clone())
        .map_err(|e| StoreError::Unavailable(format!("{url}: {e}")))?;
    Ok(Node {
        url,
        client,
        config,
        conn: RwLock::new(conn),
        renewed: Mutex::new(None),
    })
}

/// The sentinels of a [`Topology::Sentinel`], and how to reach the data nodes they name.
///
/// The lookup is Sluice's own rather than the `redis` crate's `Sentinel`: that one (1.x)
/// takes no certificates for the sentinels nor for the nodes they name (`Sentinel::build`
/// has no TLS variant; `SentinelClientBuilder` takes both, but hands out one node per call,
/// never the list of replicas). Here the sentinels and the data nodes are reached with the
/// configured CA and client certificate, and each with its own credentials.
pub(crate) struct Sentinels {
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
    let reply: Result<std::collections::HashMap<String, String>, String> = async {
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
    let primary = reply.and_then(|info| {
        let field = |name: &str| info.get(name).map(String::as_str);
        let flags = field("flags").unwrap_or("");
        let down = flags
            .split(',')
            .any(|f| matches!(f, "s_down" | "o_down" | "disconnected"));
        match (
            field("ip"),
            field("port").and_then(|p| p.parse::<u16>().ok()),
        ) {
            (Some(ip), Some(port)) if !down => Ok(nodes.url(ip, port)),
            _ => Err(format!(
                "sentinel {url}: no primary for `{master}` that is up (flags `{flags}`)"
            )),
        }
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
    let listed: Vec<std::collections::HashMap<String, String>> = match redis::cmd("SENTINEL")
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
        let field = |name: &str| info.get(name).map(String::as_str);
        let up = !field("flags")
            .unwrap_or("")
            .split(',')
            .any(|f| matches!(f, "s_down" | "o_down" | "disconnected"));
        if let (true, Some(ip), Some(port)) =
            (up, field("ip"), field("port").and_then(|p| p.parse().ok()))
        {
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

impl Backend {
    /// Connects to `config`'s topology (lazily, except that Sentinel is asked for the primary
    /// and a Cluster for its slots now).
    pub(crate) async fn connect(config: &RedisConfig) -> Result<Backend, StoreError> {
        match &config.topology {
            Topology::Standalone { primary, replicas } => {
                let certs = certificates(config)?;
                let url = |u: &String| match &config.credentials {
                    Some(c) => c.apply(u),
                    None => u.clone(),
                };
                let nodes = Nodes {
                    primary: node(&url(primary), certs.as_ref(), config.timeout)?,
                    replicas: replicas
                        .iter()
                        .map(|u| node(&url(u), certs.as_ref(), config.timeout))
                        .collect::<Result<Vec<_>, _>>()?,
                };
                let backend = Backend::Direct {
                    nodes: RwLock::new(Arc::new(nodes)),
                    sentinel: None,
                };
                Ok(backend)
            }
            Topology::Sentinel { master, sentinels } => {
                let mut sentinels = Sentinels::new(
                    sentinels,
                    certificates(config)?,
                    config.sentinel_credentials.as_ref(),
                    config.credentials.clone(),
                    config.timeout,
                )?;
                let nodes = discover(&mut sentinels, master, FIRST_SENTINEL_LOOKUP).await?;
                tracing::info!(master = %master, primary = %nodes.primary.url, "sentinel named the primary");
                let backend = Backend::Direct {
                    nodes: RwLock::new(Arc::new(nodes)),
                    sentinel: Some(Box::new(SentinelWatch {
                        master: master.clone(),
                        sentinels: tokio::sync::Mutex::new(sentinels),
                        looking: AtomicBool::new(false),
                        last_lookup: Mutex::new(None),
                    })),
                };
                Ok(backend)
            }
            Topology::Cluster { nodes } => cluster(config, nodes).await,
        }
    }

    /// The nodes in use now (`None` for a Cluster, whose client keeps its own).
    pub(crate) fn nodes(&self) -> Option<Arc<Nodes>> {
        match self {
            Backend::Direct { nodes, .. } => {
                Some(nodes.read().unwrap_or_else(|p| p.into_inner()).clone())
            }
            Backend::Cluster { .. } => None,
        }
    }

    /// Loads `code` where it must be before the first call: the primary (scripts: every
    /// replica too, as far as they answer), or every primary of a Cluster. `name` names a
    /// Cluster in errors.
    pub(crate) async fn load(
        &self,
        code: &Code,
        timeout: Duration,
        name: &str,
    ) -> Result<(), StoreError> {
        match self {
            Backend::Direct { nodes, .. } => {
                let nodes = nodes.read().unwrap_or_else(|p| p.into_inner()).clone();
                nodes.primary.load(code, timeout).await?;
                if code.mode() == ScriptMode::EvalSha {
                    for replica in &nodes.replicas {
                        // A replica that is down now gets the scripts when it first answers
                        // NOSCRIPT.
                        if let Err(e) = replica.load(code, timeout).await {
                            tracing::warn!(replica = %replica.url, error = %e, "could not load scripts");
                        }
                    }
                }
                Ok(())
            }
            Backend::Cluster { conn } => load_cluster(&conn.get(), code, timeout, name).await,
        }
    }
}

/// Connects to a Redis Cluster through the seed `nodes` (asking for the slot map now).
async fn cluster(config: &RedisConfig, nodes: &[String]) -> Result<Backend, StoreError> {
    let Some(first) = nodes.first().map(|n| redact(n)) else {
        return Err(StoreError::Backend(
            "cluster: at least one node URL is needed".to_owned(),
        ));
    };
    let seeds: Vec<String> = match &config.credentials {
        Some(c) => nodes.iter().map(|u| c.apply(u)).collect(),
        None => nodes.to_vec(),
    };
    let mut builder = ClusterClientBuilder::new(seeds)
        .connection_timeout(config.timeout.max(Duration::from_millis(500)))
        .response_timeout(config.timeout)
        .retries(2)
        .min_retry_wait(5)
        .max_retry_wait(100);
    if config.read_from == ReadFrom::Replicas {
        builder = builder.read_routing_strategy(RandomReplicaStrategy);
    }
    if let Some(certs) = certificates(config)? {
        builder = builder.certs(certs);
    }
    let client = builder.build().map_err(|e| {
        StoreError::Backend(format!(
            "invalid cluster node URLs {:?}: {e}",
            nodes.iter().map(|n| redact(n)).collect::<Vec<_>>()
        ))
    })?;
    let connect_within = config.timeout.max(Duration::from_secs(2));
    let conn = tokio::time::timeout(connect_within, client.get_async_connection())
        .await
        .map_err(|_| StoreError::Unavailable(format!("cluster {first}: no answer")))?
        .map_err(|e| {
            StoreError::Unavailable(with_tls_hint(&first, format!("cluster {first}: {e}")))
        })?;
    Ok(Backend::Cluster {
        conn: Box::new(ClusterLink {
            client,
            conn: RwLock::new(conn),
            connect_within,
            connecting: AtomicBool::new(false),
            last_connect: Mutex::new(None),
        }),
    })
}

/// Loads `code` on every primary of a Cluster (scripts: on every node): the client routes
/// `FUNCTION LOAD` and `SCRIPT LOAD` there, and fails if one node fails.
pub(crate) async fn load_cluster(
    conn: &ClusterConnection,
    code: &Code,
    timeout: Duration,
    name: &str,
) -> Result<(), StoreError> {
    code.load(&mut conn.clone(), timeout)
        .await
        .map_err(|f| f.into_store_error(name))
}

impl RedisStore {
    /// Asks the sentinels (in the background, at most every [`REDISCOVER_EVERY`]) whether
    /// another node is the primary now, and switches to it. Does nothing without Sentinel.
    pub(crate) fn rediscover_soon(&self) {
        let Backend::Direct {
            sentinel: Some(watch),
            ..
        } = self.backend()
        else {
            return;
        };
        {
            let mut last = watch.last_lookup.lock().unwrap_or_else(|p| p.into_inner());
            if last.is_some_and(|t| t.elapsed() < REDISCOVER_EVERY) {
                return;
            }
            if watch.looking.swap(true, Ordering::AcqRel) {
                return;
            }
            *last = Some(Instant::now());
        }
        let store = self.clone();
        tokio::spawn(async move {
            store.rediscover().await;
            if let Backend::Direct {
                sentinel: Some(watch),
                ..
            } = store.backend()
            {
                watch.looking.store(false, Ordering::Release);
            }
        });
    }

    /// On a Cluster: after `failure`, if it suggests that the slot map is stale (a timeout, a
    /// lost or refused connection, `READONLY`, `CLUSTERDOWN`, …), makes a new connection in the
    /// background (at most every [`RECONNECT_CLUSTER_EVERY`], one at a time), which asks the
    /// seeds for the slots; calls use it once it is made.
    pub(crate) fn reconnect_cluster_soon(&self, failure: &Failure) {
        let Backend::Cluster { conn: link } = self.backend() else {
            return;
        };
        if !failure.suggests_new_slots() {
            return;
        }
        {
            let mut last = link.last_connect.lock().unwrap_or_else(|p| p.into_inner());
            if last.is_some_and(|t| t.elapsed() < RECONNECT_CLUSTER_EVERY) {
                return;
            }
            if link.connecting.swap(true, Ordering::AcqRel) {
                return;
            }
            *last = Some(Instant::now());
        }
        let store = self.clone();
        tokio::spawn(async move {
            let Backend::Cluster { conn: link } = store.backend() else {
                return;
            };
            let name = store.name();
            match tokio::time::timeout(link.connect_within, link.client.get_async_connection())
                .await
            {
                Ok(Ok(conn)) => {
                    *link.conn.write().unwrap_or_else(|p| p.into_inner()) = conn;
                    tracing::info!(cluster = %name, "connected anew after a failure: the slot map is fresh");
                }
                Ok(Err(e)) => tracing::debug!(cluster = %name, error = %e, "cannot connect anew"),
                Err(_) => tracing::debug!(cluster = %name, "cannot connect anew: no answer"),
            }
            link.connecting.store(false, Ordering::Release);
        });
    }

    /// Switches to the primary a sentinel announced (`+switch-master`) once it says it is
    /// one. The announcement carries the new address, so no lookup can name the old primary
    /// again (after a `SENTINEL FAILOVER` it stays writable until Sentinel demotes it). Peeks
    /// read the new primary until the next lookup lists its replicas.
    pub(crate) async fn switch_to_announced(&self, host: &str, port: u16) {
        let Backend::Direct {
            nodes,
            sentinel: Some(watch),
        } = self.backend()
        else {
            return;
        };
        let timeout = self.config().timeout;
        let dialer = watch.sentinels.lock().await.nodes.clone();
        let url = dialer.url(host, port);
        let shown = redact(&url);
        if nodes.read().unwrap_or_else(|p| p.into_inner()).primary.url == shown {
            return;
        }
        match tokio::time::timeout(lookup_limit(timeout), dialer.role(&url)).await {
            Ok(Ok(Role::Primary { .. })) => {}
            Ok(Ok(_)) => {
                tracing::debug!(master = %watch.master, primary = %shown, "announced primary is not one yet");
                return;
            }
            Ok(Err(e)) => {
                tracing::debug!(master = %watch.master, error = %e, "announced primary unreachable");
                return;
            }
            Err(_) => return,
        }
        let primary = match node(&url, dialer.certs.as_ref(), dialer.timeout) {
            Ok(n) => n,
            Err(e) => {
                tracing::warn!(master = %watch.master, error = %e, "announced primary");
                return;
            }
        };
        if let Err(e) = primary.load(self.code(), timeout).await {
            tracing::warn!(master = %watch.master, primary = %shown, error = %e, "could not load the code on the new primary");
        }
        let from = nodes
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .primary
            .url
            .clone();
        tracing::warn!(master = %watch.master, %from, to = %shown, "sentinel announced a failover: switching primary");
        *nodes.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(Nodes {
            primary,
            replicas: Vec::new(),
        });
    }

    async fn rediscover(&self) {
        let Backend::Direct {
            nodes,
            sentinel: Some(watch),
        } = self.backend()
        else {
            return;
        };
        let timeout = self.config().timeout;
        let found = {
            let mut sentinels = watch.sentinels.lock().await;
            discover(&mut sentinels, &watch.master, lookup_limit(timeout)).await
        };
        let found = match found {
            Ok(found) => found,
            Err(e) => {
                tracing::debug!(master = %watch.master, error = %e, "sentinel lookup failed");
                return;
            }
        };
        let current = nodes.read().unwrap_or_else(|p| p.into_inner()).clone();
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
            if let Err(e) = found.primary.load(self.code(), timeout).await {
                tracing::warn!(master = %watch.master, primary = %found.primary.url, error = %e, "could not load the code on the new primary");
            }
            tracing::warn!(master = %watch.master, from = %current.primary.url, to = %found.primary.url, "sentinel failover: switching primary");
        }
        *nodes.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(found);
    }
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
    fn a_plaintext_url_the_server_hung_up_on_gets_the_tls_hint() {
        let hinted = with_tls_hint("redis://h:6380", "h: Connection reset by peer".to_owned());
        assert!(hinted.ends_with("use a rediss:// URL"), "{hinted}");
        let hinted = with_tls_hint("redis://h:6380", "h: Broken pipe (os error 32)".to_owned());
        assert!(hinted.ends_with("use a rediss:// URL"), "{hinted}");
        let unchanged = "h: Connection reset by peer".to_owned();
        assert_eq!(
            with_tls_hint("rediss://h:6380", unchanged.clone()),
            unchanged
        );
        let refused = "h: Connection refused".to_owned();
        assert_eq!(with_tls_hint("redis://h:6380", refused.clone()), refused);
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
