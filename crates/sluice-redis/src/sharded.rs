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
//! Each Redis shard sits behind its own [`CircuitBreaker`]: a shard that keeps failing is
//! skipped at once (its keys get their policy's failure mode without waiting for a timeout)
//! and probed until it answers, while the other shards carry on untouched. The sharding
//! itself works over any [`Store`] ([`ShardedStore::named`]).

use std::future::Future;
use std::sync::Arc;

use sluice::breaker::{BreakerConfig, CircuitBreaker};
use sluice::{Call, Decision, Policy, Store, StoreError};

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

/// Two shards of one name: the error of [`validate_shard_names`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DuplicateShard {
    /// The position of the second shard of that name.
    pub index: usize,
    /// The repeated name.
    pub name: String,
}

impl std::fmt::Display for DuplicateShard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "shard {} (`{}`) is listed twice; each shard needs its own primary",
            self.index, self.name
        )
    }
}

impl std::error::Error for DuplicateShard {}

/// Checks that shard names (the identities rendezvous hashing scores) are distinct: two
/// shards of one name would split one shard's keys unpredictably. The error says which shard
/// repeats which name, for a configuration error.
pub fn validate_shard_names<N: AsRef<str>>(names: &[N]) -> Result<(), DuplicateShard> {
    for (i, name) in names.iter().enumerate() {
        let name = name.as_ref();
        if names[..i].iter().any(|n| n.as_ref() == name) {
            return Err(DuplicateShard {
                index: i,
                name: name.to_owned(),
            });
        }
    }
    Ok(())
}

/// A [`Store`] over several shards: each decision goes, whole, to the shard that owns its key.
///
/// A shard is any [`Store`]; by default each is a [`RedisStore`] behind its own
/// [`CircuitBreaker`] ([`ShardedStore::new`]). [`ShardedStore::named`] shards over any stores.
#[derive(Debug)]
pub struct ShardedStore<S = CircuitBreaker<RedisStore>> {
    shards: Arc<[S]>,
    names: Arc<[String]>,
    prefix: String,
}

impl<S> Clone for ShardedStore<S> {
    fn clone(&self) -> Self {
        Self {
            shards: self.shards.clone(),
            names: self.names.clone(),
            prefix: self.prefix.clone(),
        }
    }
}

impl ShardedStore {
    /// Shards over `shards` (at least one), which must share a key prefix, each behind a
    /// circuit breaker with the default [`BreakerConfig`]. A shard is named by
    /// [`RedisStore::name`].
    pub fn new(shards: Vec<RedisStore>) -> Result<Self, StoreError> {
        Self::with_breaker(shards, BreakerConfig::default())
    }

    /// [`ShardedStore::new`] with another breaker configuration.
    pub fn with_breaker(
        shards: Vec<RedisStore>,
        breaker: BreakerConfig,
    ) -> Result<Self, StoreError> {
        let prefix = shards
            .first()
            .map_or(keys::DEFAULT_PREFIX, RedisStore::key_prefix)
            .to_owned();
        if let Some(other) = shards.iter().find(|s| s.key_prefix() != prefix) {
            return Err(StoreError::Backend(format!(
                "every shard needs the same key prefix: `{prefix}` and `{}`",
                other.key_prefix()
            )));
        }
        Self::named(
            &prefix,
            shards.into_iter().map(|s| {
                let name = s.name().to_owned();
                (name.clone(), CircuitBreaker::new(s, name, breaker))
            }),
        )
    }
}

impl<S: Store> ShardedStore<S> {
    /// Shards over `(name, store)` pairs (at least one, [distinct
    /// names](validate_shard_names)). A key's shard is chosen by its name and the key's hash
    /// tag under `key_prefix`, as [`ShardedStore::new`] does for Redis shards.
    pub fn named(
        key_prefix: &str,
        shards: impl IntoIterator<Item = (String, S)>,
    ) -> Result<Self, StoreError> {
        let (names, shards): (Vec<String>, Vec<S>) = shards.into_iter().unzip();
        if shards.is_empty() {
            return Err(StoreError::Backend(
                "a sharded store needs at least one shard".to_owned(),
            ));
        }
        validate_shard_names(&names).map_err(|e| StoreError::Backend(e.to_string()))?;
        Ok(Self {
            shards: shards.into(),
            names: names.into(),
            prefix: key_prefix.to_owned(),
        })
    }

    /// The shards, in configuration order (for the default shards, each a circuit breaker
    /// whose [`CircuitBreaker::inner`] is the shard's [`RedisStore`]).
    pub fn shards(&self) -> &[S] {
        &self.shards
    }

    /// The shards' names, in configuration order.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// The index of the shard that decides `key` under `policy`.
    pub fn shard_for(&self, policy: &Policy, key: &str) -> usize {
        rendezvous(&self.names, &keys::stem(&self.prefix, policy, key))
    }

    /// The shard that decides `key` under `policy`.
    fn shard(&self, policy: &Policy, key: &str) -> &S {
        &self.shards[self.shard_for(policy, key)]
    }
}

impl<S: Store> Store for ShardedStore<S> {
    fn call(&self, call: Call<'_>) -> impl Future<Output = Result<Decision, StoreError>> + Send {
        self.shard(call.policy, call.key).call(call)
    }
}

#[cfg(test)]
mod tests {
    use sluice::{LimitSpec, MemoryStore, Op, StoreExt};

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

    fn block<T>(f: impl Future<Output = T>) -> T {
        let mut f = std::pin::pin!(f);
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        match f.as_mut().poll(&mut cx) {
            std::task::Poll::Ready(v) => v,
            std::task::Poll::Pending => panic!("the memory store never waits"),
        }
    }

    #[test]
    fn any_store_can_be_a_shard_and_a_key_is_decided_by_its_own() {
        let names = names(3);
        let sharded = ShardedStore::named(
            "app:",
            names.iter().map(|n| (n.clone(), MemoryStore::new())),
        )
        .expect("distinct names");
        assert_eq!(sharded.names(), names.as_slice());
        let p = Policy::from_specs("api", vec![LimitSpec::fixed_window(2, 60_000)]).expect("valid");

        // Placement: rendezvous over the names and the key's hash tag under the prefix.
        let mut used = [false; 3];
        for i in 0..60 {
            let key = format!("user:{i}");
            let owner = sharded.shard_for(&p, &key);
            assert_eq!(owner, rendezvous(&names, &keys::stem("app:", &p, &key)));
            used[owner] = true;
        }
        assert_eq!(used, [true; 3], "60 keys land on every shard");

        // A decision is made, and recorded, by the key's shard alone.
        let owner = sharded.shard_for(&p, "user:42");
        assert!(
            block(sharded.check(&p, "user:42", 2, 0))
                .expect("memory")
                .allowed
        );
        let held: Vec<usize> = sharded.shards().iter().map(MemoryStore::len).collect();
        let mut expected = vec![0; 3];
        expected[owner] = 1;
        assert_eq!(held, expected);
        let refused = block(sharded.check(&p, "user:42", 1, 0)).expect("memory");
        assert!(!refused.allowed, "the owner remembers the first check");
        assert_eq!(
            block(sharded.shards()[owner].peek(&p, "user:42", 0, 0))
                .expect("memory")
                .remaining(),
            0
        );
        block(sharded.call(Call::new(&p, "user:42", Op::Forget, 0))).expect("memory");
        assert!(sharded.shards()[owner].is_empty());
    }

    #[test]
    fn shards_need_distinct_names_and_at_least_one_shard() {
        assert_eq!(validate_shard_names(&names(3)), Ok(()));
        let twice = ["redis://a:6379", "redis://b:6379", "redis://a:6379"];
        let e = validate_shard_names(&twice).unwrap_err();
        assert_eq!((e.index, e.name.as_str()), (2, "redis://a:6379"));
        assert_eq!(
            e.to_string(),
            "shard 2 (`redis://a:6379`) is listed twice; each shard needs its own primary"
        );
        let pairs = twice.map(|n| (n.to_owned(), MemoryStore::new()));
        assert!(
            matches!(ShardedStore::named("p:", pairs), Err(StoreError::Backend(m)) if m.contains("listed twice"))
        );
        let none: Vec<(String, MemoryStore)> = Vec::new();
        assert!(ShardedStore::named("p:", none).is_err());
    }
}
