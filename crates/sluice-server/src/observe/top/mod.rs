//! Heavy hitters: per policy, the keys that used the most and were denied the most over a
//! recent window, in memory bounded by configuration, not by traffic.
//!
//! Each (policy, measure) keeps a Space-Saving summary (Metwally, Agrawal, El Abbadi, 2005) of
//! at most `capacity` counters. A key already counted adds to its counter; a new key, when the
//! summary is full, takes over the smallest counter and inherits its count as its error. So
//! for a stream of total weight `N`:
//!
//! - a counter never under-counts: `count − error ≤ true count ≤ count`;
//! - `error ≤ N / capacity`, and every key whose true count exceeds `N / capacity` is held.
//!
//! "Recent" is two epochs of `window` each: the current one and the one before, summed when
//! read, so a reading covers between one and two windows. Summaries are per process: each
//! server reports what it decided. A fleet's view is the sum of its servers' answers for the
//! same key (Space-Saving summaries add up with the errors adding up too); keeping them in
//! Redis would cost a write per decision, which is what the store is sized by.
//!
//! Every admitting call records here, so there is no lock that all of them take: the summaries
//! are split into shards by a hash of the key, each behind its own lock, and a reading merges
//! them. A key always lands in the same shard, so the shards hold disjoint keys and merging is
//! putting their counters side by side: a key's counter is its shard's, whose error is at most
//! `N_shard / capacity <= N / capacity`, and a key whose true count exceeds `N / capacity`
//! exceeds its shard's bound too, so it is held. The bound is the one a single summary gives;
//! the price is memory, up to one summary of `capacity` keys per shard.

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::{Arc, Mutex, MutexGuard};

pub mod settings;
mod space_saving;

use space_saving::sort;

pub use space_saving::{Counter, SpaceSaving};

/// What a key is ranked by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Measure {
    /// Units admitted (a check's cost when allowed).
    Used,
    /// Checks denied.
    Denied,
}

impl std::str::FromStr for Measure {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "used" => Ok(Measure::Used),
            "denied" => Ok(Measure::Denied),
            other => Err(format!("`by` must be `used` or `denied`, got `{other}`")),
        }
    }
}

/// Per policy, two epochs of two summaries (used, denied).
#[derive(Debug)]
struct PolicyTop {
    epoch: u64,
    current: [SpaceSaving; 2],
    previous: [SpaceSaving; 2],
}

/// The heavy hitters of every policy, over a window, in shards by key.
#[derive(Debug)]
pub struct TopKeys {
    capacity: usize,
    window_ms: u64,
    max_policies: usize,
    hasher: foldhash::fast::RandomState,
    shards: Box<[Shard]>,
}

/// The summaries of the keys that hash to one shard, on their own cache lines so that two
/// cores recording into neighbouring shards do not fight over one line.
#[derive(Debug, Default)]
#[repr(align(128))]
struct Shard(Mutex<ByPolicy>);

/// One shard's summaries by policy (names from the configuration, at most `max_policies`).
type ByPolicy = HashMap<Arc<str>, PolicyTop, foldhash::fast::RandomState>;

impl Shard {
    fn lock(&self) -> MutexGuard<'_, ByPolicy> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The number of shards: 4 per core, a power of two, at most 16.
fn shard_count() -> usize {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    (4 * cores).next_power_of_two().min(16)
}

/// A reading: the held keys, largest first, over `[from_ms, now]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reading {
    /// The counters, largest first.
    pub keys: Vec<Counter>,
    /// The start of the period they cover.
    pub from_ms: u64,
    /// The total weight counted over that period.
    pub total: u64,
}

/// Policies tracked at most (names come from the configuration; this bounds memory even if
/// a configuration names a great many).
pub const MAX_POLICIES: usize = 4_096;

impl TopKeys {
    /// `capacity` keys per policy, measure and shard (0: nothing is kept), over epochs of
    /// `window_ms`.
    pub fn new(capacity: usize, window_ms: u64) -> Self {
        Self::with_shards(capacity, window_ms, shard_count())
    }

    /// [`TopKeys::new`] with `shards` shards (rounded up to a power of two, at least 1).
    pub fn with_shards(capacity: usize, window_ms: u64, shards: usize) -> Self {
        let n = shards.max(1).next_power_of_two();
        Self {
            capacity,
            window_ms: window_ms.max(1),
            max_policies: MAX_POLICIES,
            hasher: foldhash::fast::RandomState::default(),
            shards: (0..n).map(|_| Shard::default()).collect(),
        }
    }

    /// The number of keys kept per policy and measure (in each shard).
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// The epoch length.
    pub fn window_ms(&self) -> u64 {
        self.window_ms
    }

    /// The number of shards.
    pub fn shards(&self) -> usize {
        self.shards.len()
    }

    /// Records a decision of `policy` for `key` at `now_ms`: `used` units admitted, or one
    /// denial. Takes the lock of the key's shard only.
    pub fn record(&self, policy: &str, key: &str, allowed: bool, cost: u64, now_ms: u64) {
        if self.capacity == 0 {
            return;
        }
        let (measure, weight) = if allowed {
            (Measure::Used, cost)
        } else {
            (Measure::Denied, 1)
        };
        if weight == 0 {
            return;
        }
        let epoch = now_ms / self.window_ms;
        let mut all = self.shard_of(key).lock();
        let capacity = self.capacity;
        // A policy seen before costs two lookups; the name is allocated only the first time it
        // is seen in this shard.
        if !all.contains_key(policy) {
            if all.len() >= self.max_policies {
                return;
            }
            all.insert(
                Arc::from(policy),
                PolicyTop {
                    epoch,
                    current: [SpaceSaving::new(capacity), SpaceSaving::new(capacity)],
                    previous: [SpaceSaving::new(capacity), SpaceSaving::new(capacity)],
                },
            );
        }
        let Some(top) = all.get_mut(policy) else {
            return;
        };
        top.roll(epoch, capacity);
        top.current[measure as usize].add(key, weight);
    }

    /// The `n` heaviest keys of `policy` by `measure`, over the current and previous epochs:
    /// each shard's two epochs merged, then the shards' counters side by side (they hold
    /// disjoint keys), at most `capacity` of them.
    pub fn read(&self, policy: &str, measure: Measure, n: usize, now_ms: u64) -> Reading {
        let epoch = now_ms / self.window_ms;
        let from_ms = epoch.saturating_sub(1).saturating_mul(self.window_ms);
        let mut keys = Vec::new();
        let mut total = 0u64;
        for shard in &self.shards {
            let mut all = shard.lock();
            let Some(top) = all.get_mut(policy) else {
                continue;
            };
            top.roll(epoch, self.capacity);
            let (cur, prev) = (
                &top.current[measure as usize],
                &top.previous[measure as usize],
            );
            keys.extend(cur.merged(prev));
            total = total
                .saturating_add(cur.total())
                .saturating_add(prev.total());
        }
        sort(&mut keys);
        keys.truncate(n.min(self.capacity));
        Reading {
            keys,
            from_ms,
            total,
        }
    }

    /// Whether anything was recorded for `policy` (an Envoy rule appears once it has seen
    /// traffic).
    pub fn tracks(&self, policy: &str) -> bool {
        self.shards.iter().any(|s| s.lock().contains_key(policy))
    }

    /// Forgets every policy not in `keep` (after a reload).
    pub fn retain(&self, keep: impl Fn(&str) -> bool) {
        for shard in &self.shards {
            shard.lock().retain(|name, _| keep(name));
        }
    }

    fn shard_of(&self, key: &str) -> &Shard {
        let hash = self.hasher.hash_one(key);
        // The shard count is a power of two.
        &self.shards[(hash >> 32) as usize & (self.shards.len() - 1)]
    }
}

impl PolicyTop {
    /// Moves to `epoch`: the current epoch becomes the previous one, or both are cleared when
    /// more than one epoch has passed.
    fn roll(&mut self, epoch: u64, capacity: usize) {
        if epoch == self.epoch {
            return;
        }
        let fresh = || [SpaceSaving::new(capacity), SpaceSaving::new(capacity)];
        if epoch == self.epoch + 1 {
            self.previous = std::mem::replace(&mut self.current, fresh());
        } else if epoch > self.epoch {
            self.previous = fresh();
            self.current = fresh();
        } else {
            // A clock that went back: keep counting in the current epoch.
            return;
        }
        self.epoch = epoch;
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    use super::space_saving::tests::zipf_stream;

    #[test]
    fn the_shards_merged_keep_a_single_summarys_bound() {
        // The same Zipf stream as above, recorded over two epochs into 8 shards and read back
        // merged: every listed count is within N / capacity of the truth (N: the whole
        // reading's total, both epochs), every key heavier than that is listed, and the ten
        // heaviest come out in their true order.
        let (keys, capacity, len) = (100_000, 200, 300_000);
        let stream = zipf_stream(keys, 1.1, len, 0x5eed);
        let top = TopKeys::with_shards(capacity, 60_000, 8);
        assert_eq!(top.shards(), 8);
        let p: Arc<str> = Arc::from("api");
        let mut exact = vec![0u64; keys];
        for (i, &r) in stream.iter().enumerate() {
            exact[r] += 1;
            // The first half in one epoch, the second in the next.
            let now = if i < len / 2 { 10_000 } else { 70_000 };
            top.record(&p, &format!("k{r}"), true, 1, now);
        }
        let reading = top.read("api", Measure::Used, capacity, 70_000);
        assert_eq!(reading.total, len as u64);
        assert_eq!(reading.keys.len(), capacity);
        let bound = reading.total / capacity as u64;
        let listed: HashMap<String, Counter> = reading
            .keys
            .iter()
            .map(|c| (c.key.to_string(), c.clone()))
            .collect();
        let mut worst = 0u64;
        for c in &reading.keys {
            let truth = exact[c.key[1..].parse::<usize>().unwrap()];
            assert!(c.count >= truth, "never under-counts: {c:?} ({truth})");
            assert!(
                c.count - c.error <= truth,
                "the error covers the excess: {c:?}"
            );
            assert!(c.error <= bound, "{c:?} over the bound {bound}");
            worst = worst.max(c.count - truth);
        }
        for (rank, &truth) in exact.iter().enumerate() {
            if truth > bound {
                assert!(
                    listed.contains_key(&format!("k{rank}")),
                    "k{rank} ({truth}) not listed"
                );
            }
        }
        let top10: Vec<String> = reading.keys[..10]
            .iter()
            .map(|c| c.key.to_string())
            .collect();
        assert_eq!(top10, (0..10).map(|r| format!("k{r}")).collect::<Vec<_>>());
        // The shards hold disjoint keys: no key is listed twice.
        assert_eq!(listed.len(), reading.keys.len());
        eprintln!(
            "8 shards, two epochs: worst over-count of a listed key {worst} ({:.3} % of the \
             stream; bound {bound})",
            worst as f64 * 100.0 / len as f64
        );
    }

    #[test]
    fn memory_is_bounded_by_the_capacity_whatever_the_traffic() {
        let top = TopKeys::new(16, 1_000);
        let p: Arc<str> = Arc::from("api");
        for i in 0..100_000u64 {
            top.record(&p, &format!("k{i}"), i % 3 != 0, 1, i / 10);
        }
        for shard in top.shards.iter() {
            let all = shard.lock();
            let t = &all["api"];
            for s in t.current.iter().chain(&t.previous) {
                assert!(s.len() <= 16);
            }
        }
    }

    #[test]
    fn readings_cover_the_current_and_previous_window_and_forget_older_ones() {
        let top = TopKeys::new(8, 60_000);
        let p: Arc<str> = Arc::from("api");
        top.record(&p, "a", true, 5, 10_000);
        top.record(&p, "b", false, 1, 10_000);
        top.record(&p, "b", false, 1, 70_000);
        top.record(&p, "a", true, 2, 70_000);
        let used = top.read("api", Measure::Used, 10, 80_000);
        assert_eq!(used.keys.len(), 1);
        assert_eq!((used.keys[0].count, used.keys[0].error), (7, 0));
        assert_eq!((used.total, used.from_ms), (7, 0));
        let denied = top.read("api", Measure::Denied, 10, 80_000);
        assert_eq!(denied.keys[0].count, 2);
        // Two windows later, only what happened since counts.
        top.record(&p, "c", true, 1, 130_000);
        let used = top.read("api", Measure::Used, 10, 130_000);
        assert_eq!(
            used.keys.iter().map(|c| &*c.key).collect::<Vec<_>>(),
            ["a", "c"]
        );
        let used = top.read("api", Measure::Used, 10, 250_000);
        assert!(used.keys.is_empty());
        assert!(top.read("nope", Measure::Used, 10, 0).keys.is_empty());
    }

    #[test]
    fn measures_parse_and_name_what_is_wrong() {
        assert_eq!("used".parse::<Measure>().unwrap(), Measure::Used);
        assert_eq!("denied".parse::<Measure>().unwrap(), Measure::Denied);
        assert!("top".parse::<Measure>().unwrap_err().contains("`top`"));
    }
}
