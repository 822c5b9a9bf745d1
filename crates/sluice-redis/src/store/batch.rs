//! The store's side of coalescing ([`crate::coalesce`]): a rate check (or a peek on the
//! primary) enters its lane, and a lane's queued decisions go out as one call of the `batch`
//! function.

use redis::Value;
use sluice::{Decision, Op, Policy, StoreError};

use super::RedisStore;
use crate::coalesce::{Batches, LaneId, Lanes, Pending, Turn};
use crate::codec;
use crate::error;
use crate::keys;
use crate::script::Entry;
use crate::topology::Backend;

impl RedisStore {
    /// Decides a rate check (or a peek on the primary) through its lane: alone at once if the
    /// lane is idle, else in the next batch, waiting at most the call timeout.
    pub(super) async fn coalesced(
        &self,
        policy: &Policy,
        key: &str,
        op: Op,
        now_ms: u64,
    ) -> Result<Decision, StoreError> {
        let lane: LaneId = match &self.inner.backend {
            Backend::Direct { .. } => None,
            Backend::Cluster { .. } => Some(redis::cluster_routing::Slot::for_key(keys::stem(
                &self.inner.config.key_prefix,
                policy,
                key,
            ))),
        };
        let entry = || codec::Entry {
            policy: policy.clone(),
            key: key.to_owned(),
            op,
            now_ms,
        };
        match self.inner.lanes.enter(self, lane, entry) {
            Turn::Lead(leader) => {
                let decided = self.single(policy, key, op, now_ms).await;
                drop(leader);
                decided
            }
            Turn::Wait(answer) => {
                let timeout = self.inner.config.timeout;
                match tokio::time::timeout(timeout, answer).await {
                    Err(_) => Err(StoreError::Timeout(timeout)),
                    Ok(Ok(decided)) => decided,
                    Ok(Err(_)) => Err(StoreError::Unavailable(
                        "the batch carrying this decision was dropped".to_owned(),
                    )),
                }
            }
        }
    }
}

impl Batches for RedisStore {
    fn lanes(&self) -> &Lanes {
        &self.inner.lanes
    }

    /// The most decisions one batch carries (1: no coalescing).
    fn coalesce_max(&self) -> usize {
        self.inner.config.coalesce.max(1)
    }

    /// Sends `batch` (rate checks and peeks of one lane) as one call of the `batch` function
    /// to the primary (on a Cluster, the slot's primary) and answers each decision: with its
    /// own decision or error, or every one with the call's error.
    async fn send_batch(&self, batch: Vec<Pending>) {
        let entries: Vec<codec::Entry> = batch.iter().map(|p| p.entry.clone()).collect();
        let mut cmd = self.inner.code.invocation(Entry::Batch, false);
        self.inner.codec.encode_batch(&mut cmd, &entries);
        let writes = entries.iter().any(|e| !e.op.is_read_only());
        let what = || format!("a batch of {} decisions", entries.len());
        let reply = match &self.inner.backend {
            Backend::Cluster { conn } => self.send_cluster(&conn.get(), &cmd, writes, &what).await,
            Backend::Direct { nodes, .. } => {
                let nodes = nodes.get();
                self.send_on(&nodes, &nodes.primary, false, &cmd, writes, &what)
                    .await
            }
        };
        let items = match reply {
            Ok(Value::Array(items)) if items.len() == batch.len() => items,
            Ok(other) => {
                let e = StoreError::Backend(format!(
                    "unexpected reply from the Sluice script to {}: {other:?}",
                    what()
                ));
                for p in batch {
                    let _ = p.answer.send(Err(e.clone()));
                }
                return;
            }
            Err(e) => {
                for p in batch {
                    let _ = p.answer.send(Err(e.clone()));
                }
                return;
            }
        };
        for (p, item) in batch.into_iter().zip(items) {
            let e = &p.entry;
            let decided = match item {
                Value::ServerError(failed) => Err(error::map_batch_error(
                    &redis::RedisError::from(failed),
                    &keys::stem(&self.inner.config.key_prefix, &e.policy, &e.key),
                )),
                item => codec::decode_rate(&item, &e.policy, e.op),
            };
            let _ = p.answer.send(decided);
        }
    }
}
