//! The Space-Saving summary (Metwally, Agrawal, El Abbadi, 2005) of one stream: at most
//! `capacity` counters, the bound of [`super`]'s module doc.

use std::collections::HashMap;
use std::sync::Arc;

/// Space-Saving counters for one stream.
///
/// The counters stay in the slots they were given; `heap` orders the slots by count, smallest
/// first (a binary min-heap, `pos` each slot's place in it), so a new key finds the smallest
/// counter at once and a count that grows moves down in O(log capacity) steps, instead of a
/// scan of every counter per new key (10 000 of them at the largest `top.capacity`).
#[derive(Debug, Clone)]
pub struct SpaceSaving {
    capacity: usize,
    counters: Vec<Counter>,
    index: HashMap<Arc<str>, usize>,
    heap: Vec<u32>,
    pos: Vec<u32>,
    total: u64,
}

/// One held key: `count` over-estimates its true count by at most `error`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Counter {
    /// The key.
    pub key: Arc<str>,
    /// Its estimated count (never below the true count).
    pub count: u64,
    /// How much of `count` may belong to keys it replaced.
    pub error: u64,
}

impl SpaceSaving {
    /// An empty summary holding at most `capacity` keys.
    pub fn new(capacity: usize) -> Self {
        Self {
            capacity,
            counters: Vec::with_capacity(capacity.min(1_024)),
            index: HashMap::with_capacity(capacity.min(1_024)),
            heap: Vec::with_capacity(capacity.min(1_024)),
            pos: Vec::with_capacity(capacity.min(1_024)),
            total: 0,
        }
    }

    /// Counts `weight` for `key`.
    pub fn add(&mut self, key: &str, weight: u64) {
        if self.capacity == 0 || weight == 0 {
            return;
        }
        self.total = self.total.saturating_add(weight);
        if let Some(&i) = self.index.get(key) {
            let c = &mut self.counters[i];
            c.count = c.count.saturating_add(weight);
            self.sift_down(self.pos[i] as usize);
            return;
        }
        let key: Arc<str> = Arc::from(key);
        if self.counters.len() < self.capacity {
            let slot = self.counters.len();
            self.index.insert(key.clone(), slot);
            self.counters.push(Counter {
                key,
                count: weight,
                error: 0,
            });
            // `capacity` is at most `MAX_TOP_CAPACITY`: slots fit in a u32.
            self.pos.push(self.heap.len() as u32);
            self.heap.push(slot as u32);
            self.sift_up(self.heap.len() - 1);
            return;
        }
        // Full: the new key takes over the smallest counter, the heap's first.
        let Some(&slot) = self.heap.first() else {
            return;
        };
        let c = &mut self.counters[slot as usize];
        self.index.remove(&c.key);
        c.error = c.count;
        c.count = c.count.saturating_add(weight);
        c.key = key.clone();
        self.index.insert(key, slot as usize);
        self.sift_down(0);
    }

    /// The count of the slot at heap place `at`.
    fn count_at(&self, at: usize) -> u64 {
        self.counters[self.heap[at] as usize].count
    }

    /// Swaps heap places `a` and `b`, keeping `pos` in step.
    fn swap(&mut self, a: usize, b: usize) {
        self.heap.swap(a, b);
        self.pos[self.heap[a] as usize] = a as u32;
        self.pos[self.heap[b] as usize] = b as u32;
    }

    /// Moves the slot at heap place `at` up while its count is below its parent's.
    fn sift_up(&mut self, mut at: usize) {
        while at > 0 {
            let parent = (at - 1) / 2;
            if self.count_at(at) >= self.count_at(parent) {
                break;
            }
            self.swap(at, parent);
            at = parent;
        }
    }

    /// Moves the slot at heap place `at` down while a child's count is below its own.
    fn sift_down(&mut self, mut at: usize) {
        loop {
            let (left, right) = (2 * at + 1, 2 * at + 2);
            let mut smallest = at;
            if left < self.heap.len() && self.count_at(left) < self.count_at(smallest) {
                smallest = left;
            }
            if right < self.heap.len() && self.count_at(right) < self.count_at(smallest) {
                smallest = right;
            }
            if smallest == at {
                return;
            }
            self.swap(at, smallest);
            at = smallest;
        }
    }

    /// The smallest count held (0 while the summary is not full).
    fn floor(&self) -> u64 {
        if self.counters.len() < self.capacity {
            0
        } else {
            self.heap
                .first()
                .map_or(0, |&slot| self.counters[slot as usize].count)
        }
    }

    /// The total weight counted.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// How many keys are held (at most the capacity).
    pub fn len(&self) -> usize {
        self.counters.len()
    }

    /// Whether no key is held.
    pub fn is_empty(&self) -> bool {
        self.counters.is_empty()
    }

    /// The held counters, largest first (ties by key).
    pub fn top(&self, n: usize) -> Vec<Counter> {
        let mut all = self.counters.clone();
        sort(&mut all);
        all.truncate(n);
        all
    }

    /// Adds `other`'s counters to these (same key: counts and errors add; a key held by
    /// one side only also takes the other side's smallest count as error, since it may have
    /// been evicted there), keeping the `capacity` largest.
    pub fn merged(&self, other: &SpaceSaving) -> Vec<Counter> {
        let (floor_a, floor_b) = (self.floor(), other.floor());
        let mut out: Vec<Counter> = self
            .counters
            .iter()
            .map(|c| match other.index.get(&c.key) {
                Some(&j) => Counter {
                    key: c.key.clone(),
                    count: c.count.saturating_add(other.counters[j].count),
                    error: c.error.saturating_add(other.counters[j].error),
                },
                None => Counter {
                    key: c.key.clone(),
                    count: c.count.saturating_add(floor_b),
                    error: c.error.saturating_add(floor_b),
                },
            })
            .collect();
        out.extend(
            other
                .counters
                .iter()
                .filter(|c| !self.index.contains_key(&c.key))
                .map(|c| Counter {
                    key: c.key.clone(),
                    count: c.count.saturating_add(floor_a),
                    error: c.error.saturating_add(floor_a),
                }),
        );
        sort(&mut out);
        out.truncate(self.capacity.max(other.capacity));
        out
    }
}

/// Largest count first, ties by key.
pub(super) fn sort(counters: &mut [Counter]) {
    counters.sort_unstable_by(|a, b| b.count.cmp(&a.count).then_with(|| a.key.cmp(&b.key)));
}

#[cfg(test)]
pub(super) mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    /// A Zipf(s) sampler over `n` ranks from a uniform stream (inverse CDF), deterministic.
    pub(in crate::observe::top) fn zipf_stream(
        n: usize,
        s: f64,
        len: usize,
        seed: u64,
    ) -> Vec<usize> {
        let weights: Vec<f64> = (1..=n).map(|r| 1.0 / (r as f64).powf(s)).collect();
        let total: f64 = weights.iter().sum();
        let mut cdf = Vec::with_capacity(n);
        let mut acc = 0.0;
        for w in &weights {
            acc += w / total;
            cdf.push(acc);
        }
        let mut x = seed;
        (0..len)
            .map(|_| {
                // xorshift64*
                x ^= x >> 12;
                x ^= x << 25;
                x ^= x >> 27;
                let u = (x.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as f64 / (1u64 << 53) as f64;
                cdf.partition_point(|&c| c < u).min(n - 1)
            })
            .collect()
    }

    #[test]
    fn on_a_zipf_stream_every_heavy_key_is_held_within_the_bound() {
        let (keys, capacity, len) = (100_000, 200, 300_000);
        let stream = zipf_stream(keys, 1.1, len, 0x5eed);
        let mut exact = vec![0u64; keys];
        let mut s = SpaceSaving::new(capacity);
        for &r in &stream {
            exact[r] += 1;
            s.add(&format!("k{r}"), 1);
        }
        assert_eq!(s.total(), len as u64);
        assert_eq!(s.len(), capacity);
        let bound = len as u64 / capacity as u64;
        let held: HashMap<String, Counter> = s
            .top(capacity)
            .into_iter()
            .map(|c| (c.key.to_string(), c))
            .collect();
        let mut worst_error = 0u64;
        for (rank, &truth) in exact.iter().enumerate() {
            match held.get(&format!("k{rank}")) {
                Some(c) => {
                    assert!(c.count >= truth, "never under-counts: k{rank}");
                    assert!(
                        c.count - c.error <= truth,
                        "the error covers the excess: k{rank}"
                    );
                    assert!(c.error <= bound);
                    worst_error = worst_error.max(c.count - truth);
                }
                None => assert!(truth <= bound, "k{rank} ({truth}) is heavy but not held"),
            }
        }
        // The ten heaviest keys come out in their true order, and no held count is more
        // than N / capacity (0.5 % of the stream here) above the truth.
        let top10: Vec<String> = s.top(10).iter().map(|c| c.key.to_string()).collect();
        let truth10: Vec<String> = (0..10).map(|r| format!("k{r}")).collect();
        assert_eq!(top10, truth10);
        assert!(worst_error <= bound, "{worst_error} > {bound}");
        eprintln!(
            "zipf 1.1, {keys} keys, {len} events, capacity {capacity}: worst over-count of a \
             held key {worst_error} ({:.3} % of the stream; bound {bound})",
            worst_error as f64 * 100.0 / len as f64
        );
    }

    #[test]
    fn a_new_key_always_takes_over_a_smallest_counter() {
        // Weights and keys from xorshift: hits, misses and ties mixed; after every add the
        // heap is in order, `pos` agrees with it, and its first slot holds the smallest count.
        let mut s = SpaceSaving::new(50);
        let mut x = 0x9e37_79b9_7f4a_7c15_u64;
        for step in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let (key, weight) = (x % 400, (x >> 32) % 5);
            let smallest = s.counters.iter().map(|c| c.count).min();
            let full = s.len() == 50;
            let held = s.index.contains_key(format!("k{key}").as_str());
            s.add(&format!("k{key}"), weight);
            for (at, &slot) in s.heap.iter().enumerate() {
                assert_eq!(s.pos[slot as usize] as usize, at, "step {step}");
                if at > 0 {
                    assert!(s.count_at((at - 1) / 2) <= s.count_at(at), "step {step}");
                }
            }
            if full && !held && weight > 0 {
                // The replaced counter was a smallest one: its count is now the error.
                let c = &s.counters[s.index[format!("k{key}").as_str()]];
                assert_eq!(Some(c.error), smallest, "step {step}");
            }
            let min = s.counters.iter().map(|c| c.count).min().unwrap_or(0);
            assert_eq!(s.floor(), if s.len() == 50 { min } else { 0 });
        }
    }

    #[test]
    fn a_merge_never_under_counts() {
        let mut a = SpaceSaving::new(2);
        let mut b = SpaceSaving::new(2);
        for (k, n) in [("x", 5), ("y", 3), ("z", 1)] {
            for _ in 0..n {
                a.add(k, 1);
            }
        }
        for (k, n) in [("z", 4), ("y", 1)] {
            for _ in 0..n {
                b.add(k, 1);
            }
        }
        // True totals: x 5, y 4, z 5.
        let truth = |k: &str| match k {
            "x" => 5,
            "y" => 4,
            _ => 5,
        };
        for c in a.merged(&b) {
            assert!(c.count >= truth(&c.key), "{c:?}");
            assert!(c.count - c.error <= truth(&c.key), "{c:?}");
        }
    }

    #[test]
    fn memory_is_bounded_by_the_capacity_whatever_the_traffic() {
        let mut s = SpaceSaving::new(64);
        for i in 0..1_000_000u64 {
            s.add(&format!("distinct-key-{i}"), 1);
        }
        assert_eq!(s.len(), 64);
        assert_eq!(s.index.len(), 64);
        assert!(s.counters.capacity() <= 64);
    }
}
