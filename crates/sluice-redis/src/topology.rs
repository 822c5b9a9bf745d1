//! Which nodes a store talks to: a primary and its replicas at fixed addresses, found through
//! Sentinel (and found again after a failover), or a Redis Cluster whose client routes by
//! slot.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use redis::Client;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::cluster_read_routing::RandomReplicaStrategy;
use redis::sentinel::Sentinel;
use sluice::StoreError;

use crate::config::{ReadFrom, RedisConfig, Topology};
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
    Cluster { conn: ClusterConnection },
}

/// The nodes a direct store talks to now.
pub(crate) struct Nodes {
    pub(crate) primary: Node,
    pub(crate) replicas: Vec<Node>,
}

/// Asks the sentinels for the current primary when the one in use fails.
pub(crate) struct SentinelWatch {
    master: String,
    sentinel: tokio::sync::Mutex<Sentinel>,
    /// One lookup at a time, and not more often than every [`REDISCOVER_EVERY`].
    looking: AtomicBool,
    last_lookup: Mutex<Option<Instant>>,
}

/// The shortest time between two Sentinel lookups.
const REDISCOVER_EVERY: Duration = Duration::from_millis(100);

/// How long one Sentinel lookup may take: twice the call timeout, within these bounds. The
/// lookup checks the named primary's role, and a stalled old primary must not hold it long.
const SENTINEL_TIMEOUT_BOUNDS: (Duration, Duration) =
    (Duration::from_millis(100), Duration::from_secs(1));

/// One node and its shared, multiplexed connection.
pub(crate) struct Node {
    pub(crate) url: String,
    pub(crate) conn: ConnectionManager,
}

impl Node {
    /// Sends one command on the node's shared connection, bounded by `timeout`.
    pub(crate) async fn query(
        &self,
        cmd: &redis::Cmd,
        timeout: Duration,
    ) -> Result<redis::Value, Failure> {
        query(&mut self.conn.clone(), cmd, timeout).await
    }

    /// Loads `code` on this node.
    pub(crate) async fn load(&self, code: &Code, timeout: Duration) -> Result<(), StoreError> {
        code.load(&mut self.conn.clone(), timeout)
            .await
            .map_err(|f| match f.into_store_error(&self.url) {
                // What a TLS port does to a plaintext client: say what to change.
                StoreError::Unavailable(m)
                    if self.url.starts_with("redis://") && m.contains("reset by peer") =>
                {
                    StoreError::Unavailable(format!(
                        "{m}; if this port serves TLS, use a rediss:// URL"
                    ))
                }
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
    let shown = crate::config::redact(url);
    let client = match tls {
        Some(certs) if url.starts_with("rediss://") => Client::build_with_tls(url, certs.clone()),
        _ => Client::open(url),
    }
    .map_err(|e| StoreError::Unavailable(format!("invalid Redis URL `{shown}`: {e}")))?;
    node_from_client(shown, client, timeout)
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
    let conn = ConnectionManager::new_lazy_with_config(client, config)
        .map_err(|e| StoreError::Unavailable(format!("{url}: {e}")))?;
    Ok(Node { url, conn })
}

/// `redis://host:port` of a client's address.
fn client_url(client: &Client) -> String {
    match client.get_connection_info().addr() {
        redis::ConnectionAddr::Tcp(host, port) => format!("redis://{host}:{port}"),
        other => other.to_string(),
    }
}

/// Asks the sentinels for `master`'s primary and replicas (bounded in time).
async fn discover(
    sentinel: &mut Sentinel,
    master: &str,
    timeout: Duration,
) -> Result<Nodes, StoreError> {
    let limit = (timeout * 2).clamp(SENTINEL_TIMEOUT_BOUNDS.0, SENTINEL_TIMEOUT_BOUNDS.1);
    let primary = match tokio::time::timeout(limit, sentinel.async_master_for(master, None)).await {
        Err(_) => {
            return Err(StoreError::Unavailable(format!(
                "sentinels did not name a primary for `{master}` within {}ms",
                limit.as_millis()
            )));
        }
        Ok(Err(e)) => {
            return Err(StoreError::Unavailable(format!(
                "sentinels cannot name a primary for `{master}`: {e}"
            )));
        }
        Ok(Ok(primary)) => primary,
    };
    // Replicas are for peeks only, and one may be the stalled old primary: a lookup that
    // fails or hangs leaves none (peeks then read the primary) rather than delaying the
    // switch to the new primary.
    let replicas =
        match tokio::time::timeout(limit, sentinel.async_get_replica_clients(master, None)).await {
            Ok(Ok(replicas)) => replicas,
            _ => Vec::new(),
        };
    let primary = node_from_client(client_url(&primary), primary, timeout)?;
    let replicas = replicas
        .into_iter()
        .map(|c| node_from_client(client_url(&c), c, timeout))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Nodes { primary, replicas })
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
                if sentinels.is_empty() {
                    return Err(StoreError::Backend(
                        "sentinel: at least one sentinel URL is needed".to_owned(),
                    ));
                }
                let mut sentinel = Sentinel::build(sentinels.clone()).map_err(|e| {
                    StoreError::Backend(format!("invalid sentinel URLs {sentinels:?}: {e}"))
                })?;
                let nodes = discover(&mut sentinel, master, config.timeout).await?;
                tracing::info!(master = %master, primary = %nodes.primary.url, "sentinel named the primary");
                let backend = Backend::Direct {
                    nodes: RwLock::new(Arc::new(nodes)),
                    sentinel: Some(Box::new(SentinelWatch {
                        master: master.clone(),
                        sentinel: tokio::sync::Mutex::new(sentinel),
                        looking: AtomicBool::new(false),
                        last_lookup: Mutex::new(None),
                    })),
                };
                Ok(backend)
            }
            Topology::Cluster { nodes } => {
                let Some(first) = nodes.first() else {
                    return Err(StoreError::Backend(
                        "cluster: at least one node URL is needed".to_owned(),
                    ));
                };
                let seeds: Vec<String> = match &config.credentials {
                    Some(c) => nodes.iter().map(|u| c.apply(u)).collect(),
                    None => nodes.clone(),
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
                        nodes
                            .iter()
                            .map(|n| crate::config::redact(n))
                            .collect::<Vec<_>>()
                    ))
                })?;
                let conn = tokio::time::timeout(
                    config.timeout.max(Duration::from_secs(2)),
                    client.get_async_connection(),
                )
                .await
                .map_err(|_| StoreError::Unavailable(format!("cluster {first}: no answer")))?
                .map_err(|e| StoreError::Unavailable(format!("cluster {first}: {e}")))?;
                Ok(Backend::Cluster { conn })
            }
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
            Backend::Cluster { conn } => load_cluster(conn, code, timeout, name).await,
        }
    }
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
            let mut sentinel = watch.sentinel.lock().await;
            discover(&mut sentinel, &watch.master, timeout).await
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
