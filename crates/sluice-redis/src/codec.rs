//! The wire format of one call of the Lua code: what an [`Op`] on a (policy, key) passes as
//! `KEYS` and `ARGV`, and how the reply becomes a [`Decision`].
//!
//! The layout is documented in one place, the top of `scripts/sluice.lua`; this module
//! follows it and its tests hold it to that layout without a Redis server. Encoding is pure
//! (it only appends to a [`redis::Cmd`]); so is decoding.

use redis::Value;
use sluice::core::Algorithm;
use sluice::{Decision, LimitStatus, Op, Policy, StoreError};

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
        let mut keys = keys::policy_keys(&self.prefix, policy, key);
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
        match self.clock {
            ClockSource::App => cmd.arg(now_ms),
            ClockSource::Redis => cmd.arg("redis"),
        };
        let cost = op.cost();
        cmd.arg(cost)
            .arg(&self.margin_ms)
            .arg(policy.limits().len());
        for limit in policy.limits() {
            let alg = match limit.algorithm() {
                Algorithm::FixedWindow if limit.align() => 2,
                Algorithm::FixedWindow => 1,
                Algorithm::SlidingWindow => 3,
                Algorithm::Concurrency => 5,
                _ => 4,
            };
            let (max, per) = (u128::from(limit.max()), u128::from(limit.per_ms()));
            let tau = u128::from(limit.burst()) * per;
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
            let step = u128::from(capped) * per;
            cmd.arg(alg)
                .arg(limit.max())
                .arg(limit.per_ms())
                .arg(limit.precision_ms())
                .arg(limit.burst())
                .arg((tau / max).to_string())
                .arg((tau % max).to_string())
                .arg((step / max).to_string())
                .arg((step % max).to_string());
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

/// Turns the script's reply to `op` under `policy` into a decision (the binding limit is
/// chosen here, by the same function the memory store uses).
pub(crate) fn decode(reply: &Value, policy: &Policy, op: Op) -> Result<Decision, StoreError> {
    let bad = |what: &str| {
        StoreError::Backend(format!("unexpected reply from the Sluice script: {what}"))
    };
    let Value::Array(items) = reply else {
        return Err(bad("not an array"));
    };
    let limits = policy.limits();
    let acquire = matches!(op, Op::Acquire { .. });
    let release = matches!(op, Op::Release { .. });
    // An acquire appends the amount taken and the number of holders; a release the units
    // the lease held.
    let expected = 2 + 4 * limits.len() + 2 * usize::from(acquire) + usize::from(release);
    if items.len() != expected {
        return Err(bad(&format!(
            "{} values for {} limits of a {}",
            items.len(),
            limits.len(),
            op.name()
        )));
    }
    let int = |v: &Value, what: &str| match v {
        Value::Int(n) => Ok(*n),
        _ => Err(bad(&format!("{what} is not an integer"))),
    };
    let uint = |v: &Value, what: &str| {
        int(v, what).and_then(|n| u64::try_from(n).map_err(|_| bad(&format!("{what} is {n}"))))
    };
    // The decision's cost: what was asked; a refund reports the state (cost 0); an acquire
    // the amount it took (its last value but one); a release the units freed (its last).
    let cost = match op {
        Op::Refund { .. } => 0,
        Op::Acquire { .. } => uint(&items[expected - 2], "the amount taken")?,
        Op::Release { .. } => uint(&items[expected - 1], "the units freed")?,
        _ => op.cost(),
    };
    let allowed = int(&items[0], "allowed")? == 1;
    let now = uint(&items[1], "now")?;
    let mut statuses = Vec::with_capacity(limits.len());
    for (limit, f) in limits.iter().zip(items[2..].chunks_exact(4)) {
        statuses.push(LimitStatus {
            max: limit.max(),
            per_ms: limit.per_ms(),
            algorithm: limit.algorithm(),
            admits: int(&f[0], "admits")? == 1,
            remaining: uint(&f[1], "remaining")?,
            reset_ms: uint(&f[2], "reset")?,
            // -1: the cost never fits.
            retry_after_ms: u64::try_from(int(&f[3], "retry_after")?).ok(),
        });
    }
    let mut decision = Decision::new(allowed, cost, statuses, now);
    if acquire {
        let holders = uint(&items[expected - 1], "holders")?;
        decision.holders = u32::try_from(holders).unwrap_or(u32::MAX);
    }
    Ok(decision)
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

    /// Every argument after the command name and function, as text.
    fn encoded(codec: &Codec, policy: &Policy, op: Op) -> Vec<String> {
        let mut cmd = redis::cmd("FCALL");
        cmd.arg("f");
        codec.encode(&mut cmd, policy, "user:42", op, NOW);
        cmd.args_iter()
            .skip(2)
            .map(|a| match a {
                redis::Arg::Simple(bytes) => String::from_utf8_lossy(bytes).into_owned(),
                _ => "<not a simple argument>".to_owned(),
            })
            .collect()
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
            "sluice:{3:api:user:42}:fw1000",
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
            "sluice:{3:api:user:42}:fwa60000",
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

    fn ints(values: &[i64]) -> Value {
        Value::Array(values.iter().map(|&n| Value::Int(n)).collect())
    }

    fn two_limits() -> Policy {
        policy(vec![
            LimitSpec::fixed_window(10, 1_000),
            LimitSpec::token_bucket(100, 60_000),
        ])
    }

    #[test]
    fn an_allowed_reply_decodes_every_limit_and_the_scripts_now() {
        let p = two_limits();
        let reply = ints(&[1, 1_234, 1, 7, 2_000, 0, 1, 97, 1_900, 0]);
        let d = decode(&reply, &p, Op::Check { cost: 3 }).expect("valid reply");
        assert!(d.allowed);
        assert_eq!((d.cost, d.now_ms, d.degraded), (3, 1_234, None));
        assert_eq!(d.binding_index(), 0, "the least remaining binds");
        let l = d.limits()[1];
        assert_eq!(
            (l.max, l.per_ms, l.algorithm),
            (100, 60_000, Algorithm::TokenBucket)
        );
        assert_eq!(
            (l.admits, l.remaining, l.reset_ms, l.retry_after_ms),
            (true, 97, 1_900, Some(0))
        );
    }

    #[test]
    fn a_denied_reply_keeps_never_fits_as_no_retry() {
        let p = two_limits();
        // The first limit would wait 400 ms; the second can never fit the cost (-1).
        let reply = ints(&[0, 5_000, 0, 0, 5_400, 400, 0, 100, 5_000, -1]);
        let d = decode(&reply, &p, Op::Peek { cost: 200 }).expect("valid reply");
        assert!(!d.allowed);
        assert_eq!((d.cost, d.now_ms), (200, 5_000));
        assert_eq!(d.limits()[0].retry_after_ms, Some(400));
        assert_eq!(d.limits()[1].retry_after_ms, None);
        assert_eq!(d.binding_index(), 1, "never fitting is the longest wait");
    }

    #[test]
    fn a_refund_reports_cost_zero_and_an_acquire_the_amount_taken() {
        let p = two_limits();
        let state = [1, 9, 1, 5, 1_000, 0, 1, 95, 900, 0];
        let d = decode(&ints(&state), &p, Op::Refund { cost: 4 }).expect("valid reply");
        assert_eq!(d.cost, 0);
        let mut taken = state.to_vec();
        taken.extend([5, 3]);
        let acquire = Op::Acquire {
            min: 1,
            max: 8,
            holder: 9,
        };
        let d = decode(&ints(&taken), &p, acquire).expect("valid reply");
        assert_eq!((d.allowed, d.cost, d.holders), (true, 5, 3));
        // Without the amount and the holders, an acquire's reply is two values short.
        assert!(decode(&ints(&state), &p, acquire).is_err());
        assert!(decode(&ints(&taken[..taken.len() - 1]), &p, acquire).is_err());
    }

    #[test]
    fn malformed_replies_are_clear_errors() {
        let p = two_limits();
        let check = Op::Check { cost: 1 };
        let cases = [
            (Value::Nil, "not an array"),
            (
                ints(&[1, 0, 1, 9, 0, 0]),
                "6 values for 2 limits of a check",
            ),
            (ints(&[1, 0, 1, -9, 0, 0, 1, 9, 0, 0]), "remaining is -9"),
            (ints(&[1, -1, 1, 9, 0, 0, 1, 9, 0, 0]), "now is -1"),
            (
                Value::Array(vec![Value::Int(1), Value::Nil]),
                "2 values for 2 limits",
            ),
            (
                Value::Array(
                    [1, 0, 1, 9]
                        .map(Value::Int)
                        .into_iter()
                        .chain([Value::Nil])
                        .chain([0, 1, 9, 0, 0].map(Value::Int))
                        .collect(),
                ),
                "reset is not an integer",
            ),
        ];
        for (reply, says) in cases {
            match decode(&reply, &p, check) {
                Err(StoreError::Backend(m)) => {
                    assert!(m.contains("unexpected reply"), "{m}");
                    assert!(m.contains(says), "{m} should say {says}");
                }
                other => panic!("{reply:?}: expected an error, got {other:?}"),
            }
        }
    }
}
