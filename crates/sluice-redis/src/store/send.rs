//! One command on the wire: sent to a node (or through the Cluster's client), followed by
//! `WAIT` when configured, the code loaded once where a node lacks it, and the `WAIT`'s
//! shortfall judged.

use redis::Value;
use redis::cluster_async::ClusterConnection;
use sluice::{Call, StoreError, StoreErrorKind};

use super::RedisStore;
use crate::config::{Shortfall, WaitForReplicas};
use crate::error::Failure;
use crate::keys;
use crate::script::{Entry, ScriptMode};
use crate::topology::{self, Node, Nodes};

impl RedisStore {
    /// Sends `call` to `node` (one of `nodes`), loading the code once if it is missing.
    pub(super) async fn call_on(
        &self,
        nodes: &Nodes,
        node: &Node,
        on_replica: bool,
        call: Call<'_>,
        entry: Entry,
    ) -> Result<Value, StoreError> {
        let cmd = self.command(call, entry, on_replica);
        let what = || keys::stem(&self.inner.config.key_prefix, call.policy, call.key);
        self.send_on(
            nodes,
            node,
            on_replica,
            &cmd,
            !call.op.is_read_only(),
            &what,
        )
        .await
    }

    /// Sends `cmd` to `node` (one of `nodes`; followed by `WAIT` when configured and `writes`),
    /// loading the code once if it is missing. Errors name `what()`.
    pub(super) async fn send_on(
        &self,
        nodes: &Nodes,
        node: &Node,
        on_replica: bool,
        cmd: &redis::Cmd,
        writes: bool,
        what: &(dyn Fn() -> String + Sync),
    ) -> Result<Value, StoreError> {
        let inner = &self.inner;
        let timeout = inner.config.timeout;
        let failed = |f: Failure| {
            node.failed(&f);
            if !on_replica && f.suggests_failover() {
                self.rediscover_soon();
            }
            f.into_store_error(&what())
        };
        // Nothing ran where the node did not know the code.
        let functions = inner.code.mode() == ScriptMode::Function;
        let load = async {
            if on_replica && functions {
                // Functions replicate from the primary; the caller falls back to it.
                nodes.primary.load(&inner.code, timeout).await?;
                return Err(StoreError::refused(
                    StoreErrorKind::CodeMissing,
                    format!("{}: function library missing", node.url),
                ));
            }
            let target = if functions { &nodes.primary } else { node };
            target.load(&inner.code, timeout).await
        };
        let wait = self.wait_after(writes, on_replica);
        self.send_loading(&mut node.conn(), cmd, wait, load, failed, what)
            .await
    }

    /// [`RedisStore::call_on`] for a Cluster: the client routes by the keys' slot (`FCALL_RO`
    /// to a replica when reading from replicas) and follows MOVED/ASK.
    pub(super) async fn call_cluster(
        &self,
        conn: &ClusterConnection,
        call: Call<'_>,
        entry: Entry,
        on_replica: bool,
    ) -> Result<Value, StoreError> {
        let cmd = self.command(call, entry, on_replica);
        let what = || keys::stem(&self.inner.config.key_prefix, call.policy, call.key);
        let writes = !on_replica && !call.op.is_read_only();
        self.send_cluster(conn, &cmd, writes, &what).await
    }

    /// Sends `cmd` on a Cluster (followed by `WAIT` when configured and `writes`), loading the
    /// code everywhere once if a node lacks it. Errors name `what()`.
    pub(super) async fn send_cluster(
        &self,
        conn: &ClusterConnection,
        cmd: &redis::Cmd,
        writes: bool,
        what: &(dyn Fn() -> String + Sync),
    ) -> Result<Value, StoreError> {
        let inner = &self.inner;
        // A node restarted empty (functions replicate, but a new or flushed primary may not
        // have them): load everywhere.
        let load = topology::load_cluster(conn, &inner.code, inner.config.timeout, &inner.name);
        let failed = |f: Failure| {
            self.reconnect_cluster_soon(&f);
            f.into_store_error(&what())
        };
        let wait = self.wait_after(writes, false);
        self.send_loading(&mut conn.clone(), cmd, wait, load, failed, what)
            .await
    }

    /// Sends `cmd` on `conn` (followed by `wait`), and once more after `load` if the node did
    /// not know the code. A failure to send is worded by `failed`, a shortfall by `what()`.
    async fn send_loading<C: redis::aio::ConnectionLike>(
        &self,
        conn: &mut C,
        cmd: &redis::Cmd,
        wait: Option<&WaitForReplicas>,
        load: impl Future<Output = Result<(), StoreError>>,
        failed: impl Fn(Failure) -> StoreError,
        what: &(dyn Fn() -> String + Sync),
    ) -> Result<Value, StoreError> {
        let timeout = self.inner.config.timeout;
        let sent = match send(conn, cmd, wait, timeout).await {
            Err(f) if f.is_code_missing() => {
                load.await?;
                send(conn, cmd, wait, timeout).await
            }
            sent => sent,
        };
        self.replicated(sent.map_err(failed)?, what)
    }

    /// The `WAIT` to send behind a call, if configured and the call `writes` on a primary.
    fn wait_after(&self, writes: bool, on_replica: bool) -> Option<&WaitForReplicas> {
        let wait = self.inner.config.wait_for_replicas.as_ref()?;
        (!on_replica && writes).then_some(wait)
    }

    /// The reply of a call that was sent, once its `WAIT` (if any) is judged: fewer replicas
    /// than asked are counted ([`RedisStore::unreplicated_total`]) and, with
    /// [`Shortfall::Fail`], fail the call.
    fn replicated(
        &self,
        sent: Sent,
        what: &(dyn Fn() -> String + Sync),
    ) -> Result<Value, StoreError> {
        let (Some(wait), Some(acked)) = (self.inner.config.wait_for_replicas, sent.acked) else {
            return Ok(sent.reply);
        };
        if acked >= i64::from(wait.replicas) {
            return Ok(sent.reply);
        }
        self.inner
            .unreplicated
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // A primary that lost its replicas may have been replaced (Sentinel moves the replicas
        // to the promoted node first): ask whether another node is the primary now.
        self.rediscover_soon();
        let message = format!(
            "{}: {acked} of {} replicas acknowledged the write within {}ms (WAIT)",
            what(),
            wait.replicas,
            wait.timeout.as_millis()
        );
        match wait.on_shortfall {
            Shortfall::Fail => Err(StoreError::Unavailable(message)),
            _ => {
                tracing::debug!(store = %self.inner.name, "{message}; the decision stands");
                Ok(sent.reply)
            }
        }
    }
}

/// What a node answered to a call: its reply and, when `WAIT` followed it, how many replicas
/// acknowledged.
struct Sent {
    reply: Value,
    acked: Option<i64>,
}

/// Sends `cmd`, followed on the same connection by `WAIT` when `wait` is given (`WAIT` may
/// not run inside a script, so it is pipelined right behind the call). The reply is as Redis
/// sent it: an error inside an array (one decision of a batch) stays a value.
async fn send<C: redis::aio::ConnectionLike>(
    conn: &mut C,
    cmd: &redis::Cmd,
    wait: Option<&WaitForReplicas>,
    timeout: std::time::Duration,
) -> Result<Sent, Failure> {
    let Some(wait) = wait else {
        let reply = match tokio::time::timeout(timeout, conn.req_packed_command(cmd)).await {
            Err(_) => return Err(Failure::Timeout(timeout)),
            Ok(reply) => reply.map_err(Failure::Redis)?,
        };
        return match reply {
            Value::ServerError(e) => Err(Failure::Redis(e.into())),
            reply => Ok(Sent { reply, acked: None }),
        };
    };
    let mut pipe = redis::pipe();
    pipe.add_command(cmd.clone())
        .cmd("WAIT")
        .arg(wait.replicas)
        .arg(u64::try_from(wait.timeout.as_millis()).unwrap_or(u64::MAX));
    let replies = match tokio::time::timeout(timeout, conn.req_packed_commands(&pipe, 0, 2)).await {
        Err(_) => return Err(Failure::Timeout(timeout)),
        Ok(replies) => replies.map_err(Failure::Redis)?,
    };
    let mut replies = replies.into_iter();
    match (replies.next(), replies.next()) {
        (Some(Value::ServerError(e)), _) => Err(Failure::Redis(e.into())),
        (Some(reply), Some(Value::Int(acked))) => Ok(Sent {
            reply,
            acked: Some(acked),
        }),
        (reply, acked) => Err(Failure::Redis(redis::RedisError::from((
            redis::ErrorKind::UnexpectedReturnType,
            "unexpected reply to a call and WAIT",
            format!("{reply:?}, {acked:?}"),
        )))),
    }
}
