//! What the other regions have used of each (policy, key) seen here: read in the background
//! from their replicas (`health::run`), never on a request's path.
//!
//! A key is read first when a request first names it (the reading task is woken; until the
//! read lands the other regions count 0, or their last known usage), then again every
//! `refresh / 2` for as long as it may matter: its policy's longest window after the last
//! request that named it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use sluice::core::MAX_LIMITS_PER_POLICY;
use sluice::{Algorithm, Decision, Policy};

use super::decide::Offsets;

/// The views of every key, for every other region.
pub(super) struct Views {
    remotes: usize,
    entries: Mutex<HashMap<String, Entry>>,
    /// Told when a key is first seen, so that its first read does not wait for a tick (the
    /// watchers waiting then read at once; one busy reading reads it at its next tick).
    pub(super) wake: Arc<tokio::sync::Notify>,
}

struct Entry {
    /// The policy as configured (`max` unlowered).
    policy: Policy,
    key: String,
    /// The last request that named the key (ms).
    seen_ms: u64,
    /// The first (ms).
    first_ms: u64,
    /// One read per other region.
    reads: Vec<Option<Read>>,
}

/// One region's usage of a key, as its replica answered at `at_ms`.
#[derive(Clone, Copy)]
struct Read {
    at_ms: u64,
    used: Offsets,
}

/// A key to read: its id in the views, its policy and the key.
pub(super) struct Due {
    pub(super) id: String,
    pub(super) policy: Policy,
    pub(super) key: String,
}

impl Views {
    pub(super) fn new(remotes: usize) -> Self {
        Self {
            remotes,
            entries: Mutex::new(HashMap::new()),
            wake: Arc::new(tokio::sync::Notify::new()),
        }
    }

    /// The other regions' usage of `key` under `policy` at `now_ms`, per limit; notes the
    /// request, so that the key is (kept) read.
    pub(super) fn remote_use(&self, policy: &Policy, key: &str, now_ms: u64) -> Offsets {
        let id = id(policy, key);
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        let entry = entries.entry(id).or_insert_with(|| {
            self.wake.notify_waiters();
            Entry {
                policy: policy.clone(),
                key: key.to_owned(),
                seen_ms: now_ms,
                first_ms: now_ms,
                reads: vec![None; self.remotes],
            }
        });
        if entry.policy != *policy {
            // A reload changed the policy: what was read counted other limits.
            entry.policy = policy.clone();
            entry.reads.iter_mut().for_each(|r| *r = None);
            self.wake.notify_waiters();
        }
        entry.seen_ms = entry.seen_ms.max(now_ms);
        let mut total = [0u64; MAX_LIMITS_PER_POLICY];
        for read in entry.reads.iter().flatten() {
            for (i, limit) in policy.limits().iter().enumerate() {
                if still_counts(limit.algorithm(), limit.per_ms(), read.at_ms, now_ms) {
                    total[i] = total[i].saturating_add(read.used[i]);
                }
            }
        }
        total
    }

    /// The keys region `remote` should be read for at `now_ms`: never read, or read
    /// `every_ms` ago or more. Drops the keys no request named for their longest window and
    /// `keep_extra_ms`.
    pub(super) fn due(
        &self,
        remote: usize,
        now_ms: u64,
        every_ms: u64,
        keep_extra_ms: u64,
    ) -> Vec<Due> {
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        entries.retain(|_, e| {
            let longest = e
                .policy
                .limits()
                .iter()
                .map(|l| l.per_ms())
                .max()
                .unwrap_or(0);
            now_ms.saturating_sub(e.seen_ms) <= longest + keep_extra_ms
        });
        entries
            .iter()
            .filter(|(_, e)| {
                e.reads[remote].is_none_or(|r| now_ms.saturating_sub(r.at_ms) >= every_ms)
            })
            .map(|(id, e)| Due {
                id: id.clone(),
                policy: e.policy.clone(),
                key: e.key.clone(),
            })
            .collect()
    }

    /// Keeps what region `remote` answered at `at_ms` for `due` (unless the policy changed
    /// meanwhile, or a later read is in).
    pub(super) fn record(&self, remote: usize, due: &Due, at_ms: u64, answer: &Decision) {
        let mut used = [0u64; MAX_LIMITS_PER_POLICY];
        for (u, s) in used.iter_mut().zip(answer.limits()) {
            *u = s.capacity.saturating_sub(s.remaining);
        }
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(e) = entries.get_mut(&due.id)
            && e.policy == due.policy
            && e.reads[remote].is_none_or(|r| r.at_ms <= at_ms)
        {
            e.reads[remote] = Some(Read { at_ms, used });
        }
    }

    /// When the oldest view of region `remote` in use was read; a key not read yet counts
    /// from when it was first seen (`None` without keys).
    pub(super) fn oldest(&self, remote: usize) -> Option<u64> {
        let entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        entries
            .values()
            .map(|e| e.reads[remote].map_or(e.first_ms, |r| r.at_ms))
            .min()
    }
}

/// Whether a count read at `read_ms` still counts at `now_ms`: an aligned fixed window's only
/// in the window it was read in (a new window starts at 0 in every region); a sliding
/// window's while less than a window old (an upper bound: its oldest buckets leave).
fn still_counts(algorithm: Algorithm, per_ms: u64, read_ms: u64, now_ms: u64) -> bool {
    match algorithm {
        Algorithm::FixedWindow => read_ms / per_ms == now_ms / per_ms,
        _ => now_ms.saturating_sub(read_ms) < per_ms,
    }
}

fn id(policy: &Policy, key: &str) -> String {
    // A policy name holds no newline.
    format!("{}\n{key}", policy.name())
}

#[cfg(test)]
mod tests {
    use sluice::{LimitSpec, LimitStatus};

    use super::*;

    fn answer(p: &Policy, used: &[u64]) -> Decision {
        let statuses = p.limits().iter().zip(used).map(|(l, &u)| LimitStatus {
            max: l.max(),
            capacity: l.max(),
            per_ms: l.per_ms(),
            algorithm: l.algorithm(),
            admits: true,
            remaining: l.max() - u,
            reset_ms: 0,
            retry_after_ms: Some(0),
        });
        Decision::new(true, 0, statuses, 0)
    }

    #[test]
    fn a_fixed_window_count_lasts_its_window_and_views_add_up() {
        let p = Policy::from_specs(
            "api",
            vec![
                LimitSpec::fixed_window(10, 1_000),
                LimitSpec::sliding_window(100, 10_000),
            ],
        )
        .expect("valid");
        let views = Views::new(2);
        assert_eq!(views.remote_use(&p, "k", 5_100)[..2], [0, 0]);
        let due = views.due(0, 5_100, 100, 0);
        assert_eq!(due.len(), 1);
        views.record(0, &due[0], 5_100, &answer(&p, &[3, 30]));
        let due = views.due(1, 5_100, 100, 0);
        views.record(1, &due[0], 5_200, &answer(&p, &[4, 40]));
        assert_eq!(views.remote_use(&p, "k", 5_900)[..2], [7, 70]);
        // The next fixed window starts at 0 everywhere; the sliding count is kept.
        assert_eq!(views.remote_use(&p, "k", 6_000)[..2], [0, 70]);
        assert!(views.due(0, 6_000, 1_000, 0).is_empty());
        assert_eq!(views.due(0, 6_100, 1_000, 0).len(), 1);
        // Unseen for longer than its longest window: dropped.
        assert!(views.due(0, 16_001, 1, 0).is_empty());
    }
}
