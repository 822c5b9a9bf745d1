//! A Redis Cluster: one connection whose client routes each call by its keys' slot, made
//! anew when a failure suggests that the slot map is stale.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::cluster_read_routing::RandomReplicaStrategy;
use sluice::StoreError;

use super::node::{Throttle, certificates, with_tls_hint};
use crate::config::{ReadFrom, RedisConfig, redact};
use crate::error::Failure;
use crate::script::Code;

/// A Cluster's connection, made anew when a failure suggests that its slot map is stale.
///
/// redis-rs's cluster client asks for the slot map again after `MOVED`, `READONLY` or a lost
/// connection, but not after timeouts: a primary that stalls rather than dies (paused, its
/// host unreachable) keeps receiving the calls of its slots, which time out for good, even
/// after the Cluster has promoted its replica. A new connection asks the seeds for the slots.
pub(crate) struct ClusterLink {
    /// The store's name, for logs.
    name: String,
    client: redis::cluster::ClusterClient,
    conn: RwLock<ClusterConnection>,
    /// How long making a new connection may take.
    connect_within: Duration,
    /// One new connection at a time, and not more often than every [`RECONNECT_CLUSTER_EVERY`].
    reconnect: Throttle,
}

/// The shortest time between two new Cluster connections after failures.
const RECONNECT_CLUSTER_EVERY: Duration = Duration::from_millis(500);

impl ClusterLink {
    /// The connection in use now (a cheap clone).
    pub(crate) fn get(&self) -> ClusterConnection {
        self.conn.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// After `failure`, if it suggests that the slot map is stale (a timeout, a lost or
    /// refused connection, `READONLY`, `CLUSTERDOWN`, …), makes a new connection in the
    /// background (at most every [`RECONNECT_CLUSTER_EVERY`], one at a time), which asks the
    /// seeds for the slots; calls use it once it is made.
    pub(crate) fn reconnect_soon(self: &Arc<Self>, failure: &Failure) {
        if !failure.suggests_new_slots() || !self.reconnect.start() {
            return;
        }
        let link = self.clone();
        tokio::spawn(async move {
            let name = &link.name;
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
            link.reconnect.done();
        });
    }
}

/// Connects to a Redis Cluster through the seed `nodes` (asking for the slot map now).
pub(crate) async fn connect(
    config: &RedisConfig,
    nodes: &[String],
) -> Result<ClusterLink, StoreError> {
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
    Ok(ClusterLink {
        name: config.topology.name(),
        client,
        conn: RwLock::new(conn),
        connect_within,
        reconnect: Throttle::new(RECONNECT_CLUSTER_EVERY),
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
