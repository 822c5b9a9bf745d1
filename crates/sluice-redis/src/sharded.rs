//! Client-side sharding (GitHub's design): N shards, each a primary with replicas, and every
//! key decided by exactly one shard.
//!
//! A key's shard is chosen by **rendezvous hashing** over its hash tag (the
//! `(prefix, policy, key)` stem of [`crate::keys`]): each shard scores the tag and the highest
//! score wins. A shard is identified by its primary's URL, not by its position, so adding a
//! shard moves only the keys that the new shard now wins (about 1/(N+1) of them) and removing
//! one moves only its own keys, wherever it stood in the list. Replacing a shard's primary by
//! another host (a new URL) moves that shard's keys: give hosts stable names. A shard found
//! through Sentinel is named `sentinel:<master>`, so a failover moves nothing.
//!
//! Each shard sits behind its own [`CircuitBreaker`]: a shard that keeps failing is skipped
//! at once (its keys get their policy's failure mode without waiting for a timeout) and
//! probed until it answers, while the other shards carry on untouched.

use std::future::Future;
use std::sync::Arc;

use sluice::breaker::{BreakerConfig, CircuitBreaker};
use sluice::{Decision, Policy, Store, StoreError};

use crate::keys;
use crate::store::RedisStore;

/// The score of `shard` for `tag`: a 64-bit mix of both, stable across processes and
/// versions (every limiter of a fleet must pick the same shard).
fn score(shard: &str, tag: &str) -> u64 {
    // FNV-1a over the shard name and the tag, then a splitmix64 finaliser for avalanche.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in shard
        .bytes()
        .chain(std::iter::once(0xff))
        .chain(tag.bytes())
    {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h ^= h >> 30;
    h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h ^= h >> 27;
    h = h.wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

/// The index in `shards` of the shard that owns `tag` (0 for an empty list).
pub fn rendezvous<S: AsRef<str>>(shards: &[S], tag: &str) -> usize {
    let mut best = (0, 0u64);
    for (i, s) in shards.iter().enumerate() {
        let sc = score(s.as_ref(), tag);
        if i == 0 || sc > best.1 {
            best = (i, sc);
        }
    }
    best.0
}

/// A [`Store`] over several [`RedisStore`] shards: each decision goes, whole, to the shard
/// that owns its key, through that shard's circuit breaker.
#[derive(Debug, Clone)]
pub struct ShardedStore {
    shards: Arc<[CircuitBreaker<RedisStore>]>,
    names: Arc<[String]>,
    prefix: String,
}

impl ShardedStore {
    /// Shards over `shards` (at least one), which must share a key prefix, each behind a
    /// circuit breaker with the default [`BreakerConfig`].
    pub fn new(shards: Vec<RedisStore>) -> Result<Self, StoreError> {
        Self::with_breaker(shards, BreakerConfig::default())
    }

    /// [`ShardedStore::new`] with another breaker configuration.
    pub fn with_breaker(
        shards: Vec<RedisStore>,
        breaker: BreakerConfig,
    ) -> Result<Self, StoreError> {
        let Some(first) = shards.first() else {
            return Err(StoreError::Backend(
                "a sharded store needs at least one shard".to_owned(),
            ));
        };
        let prefix = first.key_prefix().to_owned();
        if let Some(other) = shards.iter().find(|s| s.key_prefix() != prefix) {
            return Err(StoreError::Backend(format!(
                "every shard needs the same key prefix: `{prefix}` and `{}`",
                other.key_prefix()
            )));
        }
        let names: Vec<String> = shards.iter().map(|s| s.name().to_owned()).collect();
        if let Some((i, name)) = names
            .iter()
            .enumerate()
            .find(|(i, n)| names[..*i].contains(n))
        {
            return Err(StoreError::Backend(format!(
                "shard {i} (`{name}`) is listed twice; each shard needs its own primary"
            )));
        }
        let shards = shards
            .into_iter()
            .map(|s| {
                let name = s.name().to_owned();
                CircuitBreaker::new(s, name, breaker)
            })
            .collect();
        Ok(Self {
            shards,
            names: names.into(),
            prefix,
        })
    }

    /// The shards, in configuration order, each behind its circuit breaker
    /// ([`CircuitBreaker::inner`] is the shard's [`RedisStore`]).
    pub fn shards(&self) -> &[CircuitBreaker<RedisStore>] {
        &self.shards
    }

    /// The index of the shard that decides `key` under `policy`.
    pub fn shard_for(&self, policy: &Policy, key: &str) -> usize {
        rendezvous(&self.names, &keys::stem(&self.prefix, policy, key))
    }

    /// Runs `call` on the shard that owns the key.
    fn on_shard<'a, T, F>(
        &'a self,
        policy: &Policy,
        key: &str,
        call: impl FnOnce(&'a CircuitBreaker<RedisStore>) -> F,
    ) -> F
    where
        F: Future<Output = Result<T, StoreError>>,
    {
        call(&self.shards[self.shard_for(policy, key)])
    }
}

impl Store for ShardedStore {
    async fn check(
        &self,
        policy: &Policy,
        key: &str,
        cost: u64,
        now_ms: u64,
    ) -> Result<Decision, StoreError> {
        self.on_shard(policy, key, |s| s.check(policy, key, cost, now_ms))
            .await
    }

    async fn peek(
        &self,
        policy: &Policy,
        key: &str,
        cost: u64,
        now_ms: u64,
    ) -> Result<Decision, StoreError> {
        self.on_shard(policy, key, |s| s.peek(policy, key, cost, now_ms))
            .await
    }

    async fn refund(
        &self,
        policy: &Policy,
        key: &str,
        cost: u64,
        now_ms: u64,
    ) -> Result<Decision, StoreError> {
        self.on_shard(policy, key, |s| s.refund(policy, key, cost, now_ms))
            .await
    }

    async fn forget(&self, policy: &Policy, key: &str) -> Result<(), StoreError> {
        self.on_shard(policy, key, |s| s.forget(policy, key)).await
    }

    async fn acquire(
        &self,
        policy: &Policy,
        key: &str,
        min: u64,
        max: u64,
        now_ms: u64,
    ) -> Result<Decision, StoreError> {
        self.on_shard(policy, key, |s| s.acquire(policy, key, min, max, now_ms))
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FROZEN: [usize; 5] = [0, 2, 0, 0, 0];

    fn names(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("redis://10.0.0.{i}:6379")).collect()
    }

    #[test]
    fn adding_a_fourth_shard_moves_a_quarter_of_the_keys() {
        let (three, four) = (names(3), names(4));
        let keys = 100_000;
        let moved = (0..keys)
            .filter(|i| {
                let tag = format!("sluice:{{3:api:user:{i}}}");
                rendezvous(&three, &tag) != rendezvous(&four, &tag)
            })
            .count();
        let fraction = moved as f64 / f64::from(keys);
        assert!(
            (0.23..=0.27).contains(&fraction),
            "moved {:.2} %",
            fraction * 100.0
        );
        println!(
            "3 -> 4 shards moved {:.2} % of 100 000 keys",
            fraction * 100.0
        );
    }

    #[test]
    fn keys_spread_evenly_and_removing_a_shard_moves_only_its_keys() {
        let four = names(4);
        let mut counts = [0u32; 4];
        let mut wrongly_moved = 0;
        let without_1: Vec<String> = [0, 2, 3].iter().map(|&i| four[i].clone()).collect();
        for i in 0..40_000 {
            let tag = format!("t{i}");
            let owner = rendezvous(&four, &tag);
            counts[owner] += 1;
            let after = &without_1[rendezvous(&without_1, &tag)];
            if owner != 1 && *after != four[owner] {
                wrongly_moved += 1;
            }
        }
        assert_eq!(wrongly_moved, 0, "keys of other shards moved");
        assert!(
            counts.iter().all(|&c| (9_000..=11_000).contains(&c)),
            "{counts:?}"
        );
    }

    #[test]
    fn the_choice_is_stable_across_processes() {
        // Frozen expectations: a change of the hash would silently move every key of a fleet.
        let shards = names(3);
        let picks: Vec<usize> = ["a", "b", "user:42", "{x}", "sluice:{3:api:k}"]
            .iter()
            .map(|t| rendezvous(&shards, t))
            .collect();
        assert_eq!(picks, FROZEN);
    }
}
