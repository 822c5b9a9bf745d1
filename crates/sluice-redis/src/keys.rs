//! How Sluice names its Redis keys: the one place that decides it.
//!
//! Every limit of a policy keeps its state for a key in its own Redis key:
//!
//! ```text
//! <prefix>{<policy length>:<policy>:<key>}:<state tag>
//! e.g.  sluice:{3:api:user:42}:fw1000:c1000   (a fixed window: the expiry margin in ms last)
//!       sluice:{3:api:user:42}:sw60000p1000
//! ```
//!
//! - The part in braces is the key's **hash tag**: Redis Cluster places every key of one
//!   (policy, key) in the same slot, so one script can read and write them atomically. The tag
//!   ends at the first `}`; a user key containing `}` shortens the tag but every limit of that
//!   key still shares it (they share everything before it), so the rule holds for any key.
//! - The policy name is length-prefixed, so `(policy "a", key "b:c")` and
//!   `(policy "a:b", key "c")` can never share state.
//! - The state tag ([`sluice::Limit::state_tag`]) names the shape of the limit (algorithm,
//!   window, precision…): a configuration change that reshapes a limit starts from fresh state
//!   instead of misreading old state, and changing only a window's `max` keeps its count.
//! - The prefix (default `sluice:`) must not contain `{` or `}`, which would move the hash tag.
//! - One more key per (policy, key), `<stem>:holders`, is written by `acquire` only: a sorted
//!   set of the processes holding a lease on the key (member: holder id, score: when it stops
//!   counting), so each can size its lease by its share of the error budget.
//! - A concurrency limit keeps its leases in two keys: its own (`<stem>:cc`, a sorted set:
//!   member lease id, score its expiry) and `<stem>:cc:units` (a hash: lease id -> cost, and
//!   `used`, the total cost of the leases in the set), so a decision reads only the leases
//!   that lapsed, never the whole set.

use sluice::{Algorithm, Limit, Policy};

/// The default key prefix.
pub const DEFAULT_PREFIX: &str = "sluice:";

/// A key prefix with a brace: braces would move the Redis Cluster hash tag.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("key_prefix `{prefix}` contains a brace; braces would move the Redis Cluster hash tag")]
pub struct PrefixError {
    /// The prefix refused.
    pub prefix: String,
}

/// Checks a key prefix: braces would change which part of the key Redis Cluster hashes.
pub fn validate_prefix(prefix: &str) -> Result<(), PrefixError> {
    if prefix.contains(['{', '}']) {
        return Err(PrefixError {
            prefix: prefix.to_owned(),
        });
    }
    Ok(())
}

/// The key of the holders set of one (policy, key), given the stem.
pub fn holders_key(stem: &str) -> String {
    format!("{stem}:holders")
}

/// The key of a concurrency limit's units hash of one (policy, key), given the stem.
pub fn units_key(stem: &str) -> String {
    format!("{stem}:cc:units")
}

/// The hash-tagged stem shared by every limit's key of one (policy, key).
pub fn stem(prefix: &str, policy: &Policy, key: &str) -> String {
    let name = policy.name();
    let mut s = String::with_capacity(prefix.len() + name.len() + key.len() + 8);
    s.push_str(prefix);
    s.push('{');
    s.push_str(&name.len().to_string());
    s.push(':');
    s.push_str(name);
    s.push(':');
    s.push_str(key);
    s.push('}');
    s
}

/// The Redis key of one limit's state, given the stem and the expiry margin in ms as the
/// script takes it: `<stem>:<state tag>`, and for a fixed window `<stem>:<state tag>:c<margin>`.
/// A fixed window is a counter whose absolute expiry is its window's end + the margin (or, for
/// a caller whose clock is off Redis's, a hash in the same key: `scripts/sluice.lua`, "fixed
/// windows"), so the margin belongs to its name (as `per` belongs to every key's): a process
/// with another margin never misreads its end.
pub fn limit_key(stem: &str, limit: &Limit, margin_ms: &str) -> String {
    if limit.algorithm() == Algorithm::FixedWindow {
        format!("{stem}:{}:c{margin_ms}", limit.state_tag())
    } else {
        format!("{stem}:{}", limit.state_tag())
    }
}

/// Every limit's key of one (policy, key), in the policy's order, for the expiry margin
/// `margin_ms` (in ms, as the script takes it).
pub fn policy_keys(prefix: &str, policy: &Policy, key: &str, margin_ms: &str) -> Vec<String> {
    let stem = stem(prefix, policy, key);
    policy
        .limits()
        .iter()
        .map(|l| limit_key(&stem, l, margin_ms))
        .collect()
}

/// The hash tag Redis Cluster would hash for `redis_key` (the whole key when it has none).
pub fn hash_tag(redis_key: &str) -> &str {
    if let Some(open) = redis_key.find('{')
        && let Some(len) = redis_key[open + 1..].find('}')
        && len > 0
    {
        return &redis_key[open + 1..open + 1 + len];
    }
    redis_key
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice::LimitSpec;

    fn policy(name: &str) -> Policy {
        Policy::from_specs(
            name,
            vec![
                LimitSpec::fixed_window(10, 1_000),
                LimitSpec::sliding_window(100, 60_000),
            ],
        )
        .expect("valid policy")
    }

    #[test]
    fn keys_of_one_policy_key_share_a_hash_tag() {
        let keys = policy_keys("sluice:", &policy("api"), "user:42", "1000");
        assert_eq!(
            keys,
            vec![
                "sluice:{3:api:user:42}:fw1000:c1000",
                "sluice:{3:api:user:42}:sw60000p1000"
            ]
        );
        assert!(keys.iter().all(|k| hash_tag(k) == "3:api:user:42"));
    }

    #[test]
    fn braces_in_user_keys_keep_one_tag_per_key() {
        for key in ["a}b", "}", "{x}", "a{b}c"] {
            let keys = policy_keys("p:", &policy("api"), key, "1000");
            let tag = hash_tag(&keys[0]);
            assert!(keys.iter().all(|k| hash_tag(k) == tag), "{key}: {keys:?}");
        }
    }

    #[test]
    fn policy_and_key_boundaries_cannot_collide() {
        let a = policy_keys("p:", &policy("a"), "b:c", "1000");
        let b = policy_keys("p:", &policy("a:b"), "c", "1000");
        assert_ne!(a, b);
    }

    #[test]
    fn prefixes_with_braces_are_refused() {
        assert!(validate_prefix("sluice:").is_ok());
        assert!(validate_prefix("a{b").is_err());
    }
}
