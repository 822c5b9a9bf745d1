//! Which nodes a store talks to: a primary and its replicas at fixed addresses, found through
//! Sentinel (and found again after a failover), or a Redis Cluster whose client routes by
//! slot.
//!
//! Inside, each file importing only those listed after it: `sentinel` (the lookups and the
//! watch that replaces the nodes after a failover), `switches` (its `+switch-master`
//! subscriptions), `cluster` (the Cluster's connection, made anew when the slot map looks
//! stale) and `node` (one node and its connection).

mod cluster;
mod node;
mod sentinel;
mod switches;

use std::sync::Arc;
use std::time::Duration;

use sluice::StoreError;

pub(crate) use cluster::{ClusterLink, load_cluster};
pub(crate) use node::{Current, Node, Nodes};
use node::{certificates, node};
use sentinel::SentinelWatch;

use crate::config::{RedisConfig, Topology};
use crate::error::Failure;
use crate::script::{Code, ScriptMode};

/// A primary and replicas at fixed addresses, logged in as `config.credentials` where their
/// URLs name no user.
fn direct(config: &RedisConfig, primary: &str, replicas: &[String]) -> Result<Backend, StoreError> {
    let certs = certificates(config)?;
    let url = |u: &str| match &config.credentials {
        Some(c) => c.apply(u),
        None => u.to_owned(),
    };
    let nodes = Nodes {
        primary: node(&url(primary), certs.as_ref(), config.timeout)?,
        replicas: replicas
            .iter()
            .map(|u| node(&url(u), certs.as_ref(), config.timeout))
            .collect::<Result<Vec<_>, _>>()?,
    };
    Ok(Backend::Direct {
        nodes: Current::new(nodes),
        sentinel: None,
    })
}

/// The connections of a store.
pub(crate) enum Backend {
    /// A primary and replicas; with `sentinel`, they are replaced after a failover.
    Direct {
        nodes: Current,
        sentinel: Option<Arc<SentinelWatch>>,
    },
    /// A Redis Cluster: the client routes each call by its keys' slot.
    Cluster { conn: Arc<ClusterLink> },
}

impl Backend {
    /// Connects to `config`'s topology (lazily, except that Sentinel is asked for the primary
    /// and a Cluster for its slots now). `code` is what a new primary gets after a failover.
    pub(crate) async fn connect(config: &RedisConfig, code: &Code) -> Result<Backend, StoreError> {
        match &config.topology {
            Topology::Standalone { primary, replicas } => direct(config, primary, replicas),
            Topology::Shards { shards } => match shards.as_slice() {
                [shard] => direct(config, &shard.primary, &shard.replicas),
                _ => Err(StoreError::Backend(format!(
                    "one store connects one shard, and {} are configured: connect a \
                     ShardedStore of one store per RedisConfig::per_shard",
                    shards.len()
                ))),
            },
            Topology::Sentinel { master, sentinels } => {
                let (nodes, watch) =
                    SentinelWatch::connect(config, code, master, sentinels).await?;
                let backend = Backend::Direct {
                    nodes,
                    sentinel: Some(Arc::new(watch)),
                };
                Ok(backend)
            }
            Topology::Cluster { nodes } => Ok(Backend::Cluster {
                conn: Arc::new(cluster::connect(config, nodes).await?),
            }),
        }
    }

    /// The nodes in use now (`None` for a Cluster, whose client keeps its own).
    pub(crate) fn nodes(&self) -> Option<Arc<Nodes>> {
        match self {
            Backend::Direct { nodes, .. } => Some(nodes.get()),
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
                let nodes = nodes.get();
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

    /// On Sentinel: subscribes to every sentinel's failover announcements; the
    /// subscriptions' tasks, to stop with the store (none without Sentinel).
    pub(crate) async fn follow_sentinels(&self) -> Vec<tokio::task::AbortHandle> {
        match self {
            Backend::Direct {
                sentinel: Some(watch),
                ..
            } => watch.follow().await,
            _ => Vec::new(),
        }
    }

    /// On Sentinel: asks the sentinels (in the background, at most every 100 ms) whether
    /// another node is the primary now, and switches to it. Does nothing without Sentinel.
    pub(crate) fn rediscover_soon(&self) {
        if let Backend::Direct {
            sentinel: Some(watch),
            ..
        } = self
        {
            watch.rediscover_soon();
        }
    }

    /// On a Cluster: after `failure`, if it suggests that the slot map is stale, makes a new
    /// connection in the background ([`ClusterLink::reconnect_soon`]).
    pub(crate) fn reconnect_cluster_soon(&self, failure: &Failure) {
        if let Backend::Cluster { conn } = self {
            conn.reconnect_soon(failure);
        }
    }
}
