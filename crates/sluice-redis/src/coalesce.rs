//! Coalescing: the concurrent checks and peeks bound for one Redis (one node; on a Cluster,
//! one slot) go out as one call of the `batch` function, which decides each in turn.
//!
//! A decision never waits for a batch to fill. A lane (a node, or a slot) is idle or busy:
//! a decision that finds it idle is sent at once, alone, by its own task (so a lone caller pays
//! nothing for coalescing), and the lane is busy until its reply is in. Decisions that arrive
//! meanwhile queue up; when the reply is in, everything queued (at most `max` decisions) goes
//! out as one batch, and so on until the queue is empty. That is what a pipeline would have
//! sent in the same time, in one script call instead of many: the per-request work of Redis
//! (reading, parsing, the call itself, writing the reply) is paid once per batch.
//!
//! Each decision keeps its own timeout, counted from when it was asked; one that gave up while
//! queued is left out of the batch (so, unlike a timed-out single call, it never ran). A
//! decision that fails inside a batch (corrupt state, a key of the wrong type) fails alone.

use std::collections::HashMap;
use std::sync::Mutex;

use redis::cluster_routing::Slot;
use sluice::{Decision, StoreError};
use tokio::sync::oneshot;

use crate::codec::Entry;

/// What sends the batches of a lane: the store, which knows its lanes, the most decisions a
/// batch carries, and how to send one (a trait, so that this module need not know the store).
pub(crate) trait Batches: Clone + Send + Sync + 'static {
    /// The store's lanes.
    fn lanes(&self) -> &Lanes;
    /// The most decisions one batch carries (1: no coalescing).
    fn coalesce_max(&self) -> usize;
    /// Sends `batch` as one call and answers each of its decisions.
    fn send_batch(&self, batch: Vec<Pending>) -> impl Future<Output = ()> + Send;
}

/// Which Redis a decision is bound for: the store's primary (`None`), or a Cluster's slot.
pub(crate) type LaneId = Option<Slot>;

/// A decision waiting in a lane's queue, and where its answer goes.
pub(crate) struct Pending {
    pub(crate) entry: Entry,
    pub(crate) answer: oneshot::Sender<Result<Decision, StoreError>>,
}

/// The busy lanes of a store; an idle lane has no entry.
#[derive(Default)]
pub(crate) struct Lanes {
    busy: Mutex<HashMap<LaneId, Vec<Pending>>>,
}

impl std::fmt::Debug for Lanes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lanes").finish_non_exhaustive()
    }
}

/// What a decision does on entering its lane.
pub(crate) enum Turn<S: Batches> {
    /// The lane was idle: send the decision now, alone; the guard hands the lane on after.
    Lead(Leader<S>),
    /// The lane is busy: the answer comes from a batch.
    Wait(oneshot::Receiver<Result<Decision, StoreError>>),
}

impl Lanes {
    /// Enters `lane` with the decision `entry` builds (built only if it has to wait).
    pub(crate) fn enter<S: Batches>(
        &self,
        store: &S,
        lane: LaneId,
        entry: impl FnOnce() -> Entry,
    ) -> Turn<S> {
        let mut busy = self.busy.lock().unwrap_or_else(|p| p.into_inner());
        match busy.get_mut(&lane) {
            Some(queue) => {
                let (answer, rx) = oneshot::channel();
                queue.push(Pending {
                    entry: entry(),
                    answer,
                });
                Turn::Wait(rx)
            }
            None => {
                busy.insert(lane, Vec::new());
                Turn::Lead(Leader {
                    store: store.clone(),
                    lane,
                })
            }
        }
    }

    /// The next batch of `lane`: up to `max` queued decisions whose callers still wait. An
    /// empty batch makes the lane idle.
    pub(crate) fn next_batch(&self, lane: LaneId, max: usize) -> Vec<Pending> {
        let mut busy = self.busy.lock().unwrap_or_else(|p| p.into_inner());
        let Some(queue) = busy.get_mut(&lane) else {
            return Vec::new();
        };
        queue.retain(|p| !p.answer.is_closed());
        if queue.is_empty() {
            busy.remove(&lane);
            return Vec::new();
        }
        let n = queue.len().min(max);
        queue.drain(..n).collect()
    }
}

/// The decision sent alone on an idle lane. When it is done (or dropped: its caller gave up),
/// the lane is handed on: the decisions queued meanwhile go out in batches, from a task of
/// their own, until none is left.
pub(crate) struct Leader<S: Batches> {
    store: S,
    lane: LaneId,
}

impl<S: Batches> Drop for Leader<S> {
    fn drop(&mut self) {
        let first = self
            .store
            .lanes()
            .next_batch(self.lane, self.store.coalesce_max());
        if first.is_empty() {
            return;
        }
        let (store, lane) = (self.store.clone(), self.lane);
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(async move {
                    let mut batch = first;
                    while !batch.is_empty() {
                        store.send_batch(batch).await;
                        // Let the callers just answered run first (no timer: one turn of the
                        // scheduler), so those that ask again join the next batch instead of
                        // the one after it.
                        tokio::task::yield_now().await;
                        batch = store.lanes().next_batch(lane, store.coalesce_max());
                    }
                });
            }
            // No runtime (it is shutting down): the queued callers get an error, and the
            // lane is idle again.
            Err(_) => {
                drop(first);
                while !store.lanes().next_batch(lane, usize::MAX).is_empty() {}
            }
        }
    }
}
