//! One node of a primary-and-replicas store: its client and shared connection, made anew
//! after a refused login; and the nodes in use now, which Sentinel may replace whole.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use redis::Client;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use sluice::StoreError;

use crate::config::{RedisConfig, redact};
use crate::error::{Failure, query};
use crate::script::Code;

/// The nodes a direct store talks to now.
pub(crate) struct Nodes {
    pub(crate) primary: Node,
    pub(crate) replicas: Vec<Node>,
}

/// The nodes in use now (shared by the store and its Sentinel watch), replaced whole when
/// Sentinel names others.
#[derive(Clone)]
pub(crate) struct Current(Arc<RwLock<Arc<Nodes>>>);

impl Current {
    pub(crate) fn new(nodes: Nodes) -> Self {
        Self(Arc::new(RwLock::new(Arc::new(nodes))))
    }

    /// The nodes in use now (a cheap clone).
    pub(crate) fn get(&self) -> Arc<Nodes> {
        self.0.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Uses `nodes` from now on.
    pub(crate) fn set(&self, nodes: Nodes) {
        *self.0.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(nodes);
    }
}

/// One node and its shared, multiplexed connection.
pub(crate) struct Node {
    pub(crate) url: String,
    client: Client,
    config: ConnectionManagerConfig,
    conn: RwLock<ConnectionManager>,
    /// Making the connection anew after a refused login.
    renew: Throttle,
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
        if !failure.is_login_refused() || !self.renew.start() {
            return;
        }
        match ConnectionManager::new_lazy_with_config(self.client.clone(), self.config.clone()) {
            Ok(conn) => {
                tracing::debug!(node = %self.url, "login refused: connecting anew at the next call");
                *self.conn.write().unwrap_or_else(|p| p.into_inner()) = conn;
            }
            Err(e) => tracing::debug!(node = %self.url, error = %e, "cannot connect anew"),
        }
        self.renew.done();
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

pub(crate) fn node(
    url: &str,
    tls: Option<&redis::TlsCertificates>,
    timeout: Duration,
) -> Result<Node, StoreError> {
    let client = client(url, tls)?;
    // Only the redacted URL is kept: it is what errors and logs show.
    let url = redact(url);
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
        renew: Throttle::new(RENEW_EVERY),
    })
}

/// Work started at most every so often, and one at a time.
pub(super) struct Throttle {
    every: Duration,
    running: AtomicBool,
    last: Mutex<Option<Instant>>,
}

impl Throttle {
    pub(super) fn new(every: Duration) -> Self {
        Throttle {
            every,
            running: AtomicBool::new(false),
            last: Mutex::new(None),
        }
    }

    /// Whether the work may start now: it does not run, and last started at least `every`
    /// ago. If so, it runs until [`Throttle::done`].
    pub(super) fn start(&self) -> bool {
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        if last.is_some_and(|t| t.elapsed() < self.every)
            || self.running.swap(true, Ordering::AcqRel)
        {
            return false;
        }
        *last = Some(Instant::now());
        true
    }

    pub(super) fn done(&self) {
        self.running.store(false, Ordering::Release);
    }
}

/// A client for `url`, with `tls`'s certificates if it is a `rediss://` URL.
pub(crate) fn client(
    url: &str,
    tls: Option<&redis::TlsCertificates>,
) -> Result<Client, StoreError> {
    match tls {
        Some(certs) if url.starts_with("rediss://") => Client::build_with_tls(url, certs.clone()),
        _ => Client::open(url),
    }
    .map_err(|e| StoreError::Unavailable(format!("invalid Redis URL `{}`: {e}", redact(url))))
}

/// `message` about a plaintext `url` that the server hung up on, with what a TLS port does to
/// a plaintext client spelled out.
pub(crate) fn with_tls_hint(url: &str, message: String) -> String {
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
pub(crate) fn certificates(
    config: &RedisConfig,
) -> Result<Option<redis::TlsCertificates>, StoreError> {
    config
        .tls
        .as_ref()
        .map(|t| t.load().map_err(StoreError::Backend))
        .transpose()
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
