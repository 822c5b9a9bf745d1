//! The wire format of one call of the Lua code: what an [`Op`] on a (policy, key) passes as
//! `KEYS` and `ARGV`, and how the reply becomes a [`Decision`].
//!
//! The layout is documented in one place, the top of `scripts/sluice.lua`; this module
//! follows it and its tests hold it to that layout without a Redis server. Encoding is pure
//! (it only appends to a [`redis::Cmd`]); so is decoding, in `decode` (which imports nothing
//! from here).

mod decode;

pub(crate) use decode::{decode, decode_rate};

use sluice::core::Algorithm;
use sluice::{Limit, Op, Policy};

use crate::config::{ClockSource, RedisConfig};
use crate::keys;

/// Encodes calls for one store (its key prefix, expiry margin and clock) and decodes replies.
#[derive(Debug, Clone)]
pub(crate) struct Codec {
    prefix: String,
    /// The expiry margin in ms, as the script takes it.
    margin_ms: String,
    clock: ClockSource,
}

impl Codec {
    pub(crate) fn new(config: &RedisConfig) -> Self {
        Self {
            prefix: config.key_prefix.clone(),
            margin_ms: config.expiry_margin.as_millis().to_string(),
            clock: config.clock,
        }
    }

    /// Appends `numkeys KEYS… ARGV…` of `op` on `key` under `policy` at `now_ms` to `cmd`
    /// (which holds `FCALL <function>` or `EVALSHA <sha>`).
    pub(crate) fn encode(
        &self,
        cmd: &mut redis::Cmd,
        policy: &Policy,
        key: &str,
        op: Op,
        now_ms: u64,
    ) {
        let mut keys = self.rate_keys(policy, key);
        if let Op::Acquire { .. } = op {
            keys.push(keys::holders_key(&keys::stem(&self.prefix, policy, key)));
        }
        if policy
            .limits()
            .iter()
            .any(|l| l.algorithm() == Algorithm::Concurrency)
        {
            keys.push(keys::units_key(&keys::stem(&self.prefix, policy, key)));
        }
        cmd.arg(keys.len()).arg(&keys);
        self.now(cmd, now_ms);
        let cost = op.cost();
        cmd.arg(cost)
            .arg(&self.margin_ms)
            .arg(policy.limits().len());
        for limit in policy.limits() {
            // The bucket's step. A check uses it only for costs it may admit (cost <= max;
            // larger ones are refused first). A refund of `burst` or more empties the bucket
            // whatever the cost, so capping it there keeps the step below 2^53 ms for Lua.
            // An acquire passes the step of one unit; the script scales it to the amount it
            // takes (at most max).
            let capped = match op {
                Op::Refund { .. } => cost.min(limit.burst()),
                Op::Acquire { .. } => 1,
                _ => cost.min(limit.max()),
            };
            cmd.arg(code(limit))
                .arg(limit.max())
                .arg(limit.per_ms())
                .arg(limit.precision_ms())
                .arg(limit.burst())
                .arg(&ms_and_frac(limit.burst(), limit))
                .arg(&ms_and_frac(capped, limit));
        }
        if let Op::Acquire { max, holder, .. } = op {
            // A holder counts for the policy's shortest window after its last acquire.
            let ttl = policy
                .limits()
                .iter()
                .map(|l| l.per_ms())
                .min()
                .unwrap_or(1);
            cmd.arg(max).arg(holder.to_string()).arg(ttl);
        }
        if let Op::Hold { lease, .. } | Op::Release { lease } = op {
            cmd.arg(lease.to_string());
        }
    }
}

/// Whether `op` on `policy` takes the lean path (`rate`, `rate_ro`, a batch): a check or a
/// peek of a policy without a concurrency limit.
pub(crate) fn is_rate(policy: &Policy, op: Op) -> bool {
    matches!(op, Op::Check { .. } | Op::Peek { .. })
        && policy
            .limits()
            .iter()
            .all(|l| l.algorithm() != Algorithm::Concurrency)
}

/// One decision of a batch: what the caller asked, owned (it waits in a queue).
#[derive(Debug, Clone)]
pub(crate) struct Entry {
    pub(crate) policy: Policy,
    pub(crate) key: String,
    pub(crate) op: Op,
    pub(crate) now_ms: u64,
}

impl Codec {
    /// Appends the lean call of a rate check or peek (the layout at the top of the
    /// `rate` section of `scripts/sluice.lua`): `numkeys KEYS… now cost margin` and each
    /// limit's values, a bucket's step being that of `cost`.
    pub(crate) fn encode_rate(
        &self,
        cmd: &mut redis::Cmd,
        policy: &Policy,
        key: &str,
        cost: u64,
        now_ms: u64,
    ) {
        let keys = self.rate_keys(policy, key);
        cmd.arg(keys.len()).arg(&keys);
        self.now(cmd, now_ms);
        cmd.arg(cost).arg(&self.margin_ms);
        for limit in policy.limits() {
            rate_limit(cmd, limit, cost.min(limit.max()));
        }
    }

    /// Appends a batch of lean decisions (the `batch` section of `scripts/sluice.lua`): every
    /// entry's keys, then the margin, the clock, each distinct policy once (a bucket's step
    /// of one unit), and per entry its operation, policy, now and cost. Every entry must be
    /// [`is_rate`].
    pub(crate) fn encode_batch(&self, cmd: &mut redis::Cmd, entries: &[Entry]) {
        let mut policies: Vec<&Policy> = Vec::new();
        let mut index = Vec::with_capacity(entries.len());
        let mut nkeys = 0;
        for e in entries {
            nkeys += e.policy.limits().len();
            let i = match policies.iter().position(|p| **p == e.policy) {
                Some(i) => i,
                None => {
                    policies.push(&e.policy);
                    policies.len() - 1
                }
            };
            index.push(i + 1);
        }
        cmd.arg(nkeys);
        for e in entries {
            cmd.arg(self.rate_keys(&e.policy, &e.key));
        }
        cmd.arg(&self.margin_ms).arg(match self.clock {
            ClockSource::App => "app",
            ClockSource::Redis => "redis",
        });
        cmd.arg(policies.len());
        for p in &policies {
            cmd.arg(p.limits().len());
            for limit in p.limits() {
                rate_limit(cmd, limit, 1);
            }
        }
        for (e, i) in entries.iter().zip(index) {
            let op = if matches!(e.op, Op::Peek { .. }) {
                2
            } else {
                1
            };
            cmd.arg(op).arg(i).arg(e.now_ms).arg(e.op.cost());
        }
    }

    /// Every limit's key on the lean path (as on the general one).
    fn rate_keys(&self, policy: &Policy, key: &str) -> Vec<String> {
        keys::policy_keys(&self.prefix, policy, key, &self.margin_ms)
    }

    fn now(&self, cmd: &mut redis::Cmd, now_ms: u64) {
        match self.clock {
            ClockSource::App => cmd.arg(now_ms),
            ClockSource::Redis => cmd.arg("redis"),
        };
    }
}

/// One limit's values on the lean layout; a bucket's step is that of `units`.
fn rate_limit(cmd: &mut redis::Cmd, limit: &Limit, units: u64) {
    cmd.arg(code(limit)).arg(limit.max()).arg(limit.per_ms());
    match limit.algorithm() {
        Algorithm::SlidingWindow => {
            cmd.arg(limit.precision_ms());
        }
        Algorithm::TokenBucket => {
            cmd.arg(limit.burst())
                .arg(&ms_and_frac(limit.burst(), limit))
                .arg(&ms_and_frac(units, limit));
        }
        _ => {}
    }
}

/// A limit's algorithm as the script numbers it: 1 fixed window, 2 aligned, 3 sliding
/// window, 4 token bucket, 5 concurrency.
fn code(limit: &Limit) -> u8 {
    match limit.algorithm() {
        Algorithm::FixedWindow if limit.align() => 2,
        Algorithm::FixedWindow => 1,
        Algorithm::SlidingWindow => 3,
        Algorithm::Concurrency => 5,
        _ => 4,
    }
}

/// `units·per/max` of a bucket (its tau for `burst` units, its step for a cost) as whole ms
/// and a numerator over max, computed exactly in 128 bits: Lua numbers are exact only up to
/// 2^53.
fn ms_and_frac(units: u64, limit: &Limit) -> [String; 2] {
    let (max, t) = (
        u128::from(limit.max()),
        u128::from(units) * u128::from(limit.per_ms()),
    );
    [(t / max).to_string(), (t % max).to_string()]
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use sluice::LimitSpec;

    use super::*;

    const NOW: u64 = 1_700_000_000_000;

    fn codec(clock: ClockSource) -> Codec {
        Codec::new(
            &RedisConfig::new("redis://unused")
                .clock(clock)
                .expiry_margin(Duration::from_millis(1_500)),
        )
    }

    fn policy(specs: Vec<LimitSpec>) -> Policy {
        Policy::from_specs("api", specs).expect("valid policy")
    }

    /// Every argument of `cmd` after the command name and function, as text.
    fn args_of(cmd: &redis::Cmd) -> Vec<String> {
        cmd.args_iter()
            .skip(2)
            .map(|a| match a {
                redis::Arg::Simple(bytes) => String::from_utf8_lossy(bytes).into_owned(),
                _ => "<not a simple argument>".to_owned(),
            })
            .collect()
    }

    /// The arguments `codec` encodes for `op` on `user:42`, as text.
    fn encoded(codec: &Codec, policy: &Policy, op: Op) -> Vec<String> {
        let mut cmd = redis::cmd("FCALL");
        cmd.arg("f");
        codec.encode(&mut cmd, policy, "user:42", op, NOW);
        args_of(&cmd)
    }

    #[test]
    fn a_check_passes_keys_then_now_cost_margin_n_and_nine_values_per_limit() {
        let p = policy(vec![
            LimitSpec::fixed_window(10, 1_000),
            LimitSpec::sliding_window(100, 60_000),
        ]);
        let args = encoded(&codec(ClockSource::App), &p, Op::Check { cost: 3 });
        let expected = [
            // numkeys, KEYS: one per limit, in the policy's order, sharing a hash tag.
            "2",
            "sluice:{3:api:user:42}:fw1000:c1500",
            "sluice:{3:api:user:42}:sw60000p1000",
            // ARGV[1..4]: now, cost, expiry margin, n.
            "1700000000000",
            "3",
            "1500",
            "2",
            // Limit 1: fixed window; precision and burst 0, tau 0, step 3*1000/10.
            "1",
            "10",
            "1000",
            "0",
            "0",
            "0",
            "0",
            "300",
            "0",
            // Limit 2: sliding window, precision per/60.
            "3",
            "100",
            "60000",
            "1000",
            "0",
            "0",
            "0",
            "1800",
            "0",
        ];
        assert_eq!(args, expected);
    }

    #[test]
    fn a_refund_under_redis_time_caps_the_step_at_the_burst() {
        let p = policy(vec![
            LimitSpec::fixed_window(5, 60_000).aligned(),
            LimitSpec::token_bucket(3, 1_000).burst(5),
        ]);
        let args = encoded(&codec(ClockSource::Redis), &p, Op::Refund { cost: 40 });
        let expected = [
            "2",
            "sluice:{3:api:user:42}:fwa60000:c1500",
            "sluice:{3:api:user:42}:tb1000m3b5",
            "redis",
            "40",
            "1500",
            "2",
            // Aligned fixed window; step capped at burst 0.
            "2",
            "5",
            "60000",
            "0",
            "0",
            "0",
            "0",
            "0",
            "0",
            // Token bucket: tau = 5*1000/3 = 1666 + 2/3; step = min(40, 5)*1000/3, the same.
            "4",
            "3",
            "1000",
            "0",
            "5",
            "1666",
            "2",
            "1666",
            "2",
        ];
        assert_eq!(args, expected);
    }

    #[test]
    fn an_acquire_passes_min_as_cost_the_step_of_one_unit_max_and_the_holder_last() {
        let p = policy(vec![LimitSpec::token_bucket(3, 1_000).burst(5)]);
        let args = encoded(
            &codec(ClockSource::App),
            &p,
            Op::Acquire {
                min: 2,
                max: 50,
                holder: 77,
            },
        );
        let expected = [
            "2",
            "sluice:{3:api:user:42}:tb1000m3b5",
            // The holders set, in the same hash tag.
            "sluice:{3:api:user:42}:holders",
            "1700000000000",
            "2",
            "1500",
            "1",
            "4",
            "3",
            "1000",
            "0",
            "5",
            "1666",
            "2",
            // One unit: 1000/3 = 333 + 1/3.
            "333",
            "1",
            // ARGV[5 + 9n]: the most to take; then the holder and how long it counts (the
            // shortest window).
            "50",
            "77",
            "1000",
        ];
        assert_eq!(args, expected);
    }

    #[test]
    fn a_rate_check_passes_only_what_each_algorithm_needs() {
        let p = policy(vec![
            LimitSpec::fixed_window(10, 1_000).aligned(),
            LimitSpec::sliding_window(100, 60_000),
            LimitSpec::token_bucket(3, 1_000).burst(5),
        ]);
        let mut cmd = redis::cmd("FCALL");
        cmd.arg("f");
        codec(ClockSource::App).encode_rate(&mut cmd, &p, "user:42", 2, NOW);
        let expected = [
            "3",
            "sluice:{3:api:user:42}:fwa1000:c1500",
            "sluice:{3:api:user:42}:sw60000p1000",
            "sluice:{3:api:user:42}:tb1000m3b5",
            // now, cost, margin
            "1700000000000",
            "2",
            "1500",
            // aligned fixed window: 2, max, per
            "2",
            "10",
            "1000",
            // sliding window: 3, max, per, precision
            "3",
            "100",
            "60000",
            "1000",
            // token bucket: 4, max, per, burst, tau = 5000/3, step of the cost = 2000/3
            "4",
            "3",
            "1000",
            "5",
            "1666",
            "2",
            "666",
            "2",
        ];
        assert_eq!(args_of(&cmd), expected);
    }

    #[test]
    fn a_batch_sends_each_policy_once_and_four_values_per_decision() {
        let a = policy(vec![LimitSpec::token_bucket(3, 1_000)]);
        let b = Policy::from_specs("b", vec![LimitSpec::fixed_window(5, 60_000)]).unwrap();
        let entry = |p: &Policy, key: &str, op, now_ms| Entry {
            policy: p.clone(),
            key: key.to_owned(),
            op,
            now_ms,
        };
        let entries = [
            entry(&a, "x", Op::Check { cost: 2 }, NOW),
            entry(&b, "y", Op::Peek { cost: 1 }, NOW + 1),
            entry(&a, "z", Op::Check { cost: 1 }, NOW + 2),
        ];
        let mut cmd = redis::cmd("FCALL");
        cmd.arg("f");
        codec(ClockSource::Redis).encode_batch(&mut cmd, &entries);
        let expected = [
            "3",
            "sluice:{3:api:x}:tb1000m3b3",
            "sluice:{1:b:y}:fw60000:c1500",
            "sluice:{3:api:z}:tb1000m3b3",
            "1500",
            "redis",
            // two policies, each once; a bucket's step is that of one unit (1000/3)
            "2",
            "1",
            "4",
            "3",
            "1000",
            "3",
            "1000",
            "0",
            "333",
            "1",
            "1",
            "1",
            "5",
            "60000",
            // op (1 check, 2 peek), policy, now, cost
            "1",
            "1",
            "1700000000000",
            "2",
            "2",
            "2",
            "1700000000001",
            "1",
            "1",
            "1",
            "1700000000002",
            "1",
        ];
        assert_eq!(args_of(&cmd), expected);
    }
}
