//! A reply of the Lua code read into a [`Decision`]: the lean path's (each limit's state as
//! the script read it, decided by the core) and the full path's (the script's own decision).
//! Pure, and held to the layout at the top of `scripts/sluice.lua` by its tests.

use redis::Value;
use sluice::core::{Algorithm, FixedWindowState, SlidingWindowState, TokenBucketState, evaluate};
use sluice::{Decision, LimitState, LimitStatus, Op, Policy, StoreError};

/// A reply that does not follow the layout, saying how.
fn bad(what: &str) -> StoreError {
    StoreError::Backend(format!("unexpected reply from the Sluice script: {what}"))
}

/// A reply of `items` whose length does not fit `op` on `policy`.
fn bad_length(items: &[Value], policy: &Policy, op: Op) -> StoreError {
    bad(&format!(
        "{} values for {} limits of a {}",
        items.len(),
        policy.limits().len(),
        op.name()
    ))
}

/// Turns a lean reply (the state of every limit as the script read it) into the decision of
/// `op`: computed by `sluice_core::evaluate`, the function the memory store runs, so every
/// reported number is the core's own. The script's `allowed` must agree with it.
pub(crate) fn decode_rate(reply: &Value, policy: &Policy, op: Op) -> Result<Decision, StoreError> {
    let Value::Array(items) = reply else {
        return Err(bad("not an array"));
    };
    let mut next = items.iter();
    let mut int = |what: &str| match next.next() {
        Some(Value::Int(n)) => u64::try_from(*n).map_err(|_| bad(&format!("{what} is {n}"))),
        Some(_) => Err(bad(&format!("{what} is not an integer"))),
        None => Err(bad_length(items, policy, op)),
    };
    let allowed = int("allowed")? == 1;
    let now = int("now")?;
    let mut states = Vec::with_capacity(policy.limits().len());
    for limit in policy.limits() {
        let state = match limit.algorithm() {
            Algorithm::SlidingWindow => {
                let k = int("the bucket count")?;
                let mut buckets = Vec::with_capacity(usize::try_from(k).unwrap_or(0).min(4_096));
                for _ in 0..k {
                    buckets.push((int("a bucket's start")?, int("a bucket's units")?));
                }
                buckets.sort_unstable();
                if buckets.is_empty() {
                    LimitState::Empty
                } else {
                    LimitState::SlidingWindow(SlidingWindowState { buckets })
                }
            }
            Algorithm::TokenBucket => match (int("tat")?, int("frac")?) {
                (0, 0) => LimitState::Empty,
                (tat_ms, tat_frac) => {
                    LimitState::TokenBucket(TokenBucketState { tat_ms, tat_frac })
                }
            },
            _ => match (int("reset")?, int("used")?) {
                (0, 0) => LimitState::Empty,
                (reset_ms, used) => LimitState::FixedWindow(FixedWindowState { reset_ms, used }),
            },
        };
        states.push(state);
    }
    if next.next().is_some() {
        return Err(bad_length(items, policy, op));
    }
    let decision = evaluate::apply(policy, &states, op, now).decision;
    if decision.allowed != allowed {
        return Err(bad(&format!(
            "the script {} what the core {}",
            if allowed { "admitted" } else { "refused" },
            if decision.allowed {
                "admits"
            } else {
                "refuses"
            }
        )));
    }
    Ok(decision)
}

/// Turns the script's reply to `op` under `policy` into a decision (the binding limit is
/// chosen here, by the same function the memory store uses).
pub(crate) fn decode(reply: &Value, policy: &Policy, op: Op) -> Result<Decision, StoreError> {
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
        return Err(bad_length(items, policy, op));
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
            capacity: limit.capacity(),
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
    use sluice::LimitSpec;

    use super::*;

    fn policy(specs: Vec<LimitSpec>) -> Policy {
        Policy::from_specs("api", specs).expect("valid policy")
    }

    #[test]
    fn a_lean_reply_is_the_state_read_and_the_core_decides() {
        let p = policy(vec![
            LimitSpec::fixed_window(10, 1_000),
            LimitSpec::sliding_window(8, 2_000).precision_ms(500),
            LimitSpec::token_bucket(4, 1_000),
        ]);
        let now = 10_000;
        // Window ends at 10 600 with 7 used; buckets 9 000 (2) and 9 500 (1), given out of
        // order; the bucket's TAT 500 ms ahead (2 tokens of 4 spent).
        let reply = ints(&[1, now, 10_600, 7, 2, 9_500, 1, 9_000, 2, 10_500, 0]);
        let d = decode_rate(&reply, &p, Op::Check { cost: 2 }).expect("valid reply");
        let states = [
            LimitState::FixedWindow(FixedWindowState {
                reset_ms: 10_600,
                used: 7,
            }),
            LimitState::SlidingWindow(SlidingWindowState {
                buckets: vec![(9_000, 2), (9_500, 1)],
            }),
            LimitState::TokenBucket(TokenBucketState {
                tat_ms: 10_500,
                tat_frac: 0,
            }),
        ];
        let core = evaluate::check(&p, &states, 2, 10_000).decision;
        assert_eq!(d, core);
        assert_eq!(
            d.limits().iter().map(|l| l.remaining).collect::<Vec<_>>(),
            [1, 3, 0]
        );
        // The script admitted what the core refuses: an error, never a wrong answer.
        let refused = decode_rate(&reply, &p, Op::Check { cost: 3 });
        assert!(
            matches!(&refused, Err(StoreError::Backend(m)) if m.contains("the script admitted what the core refuses")),
            "{refused:?}"
        );
        // Nothing stored anywhere: (0, 0), no bucket, (0, 0).
        let empty = decode_rate(&ints(&[1, now, 0, 0, 0, 0, 0]), &p, Op::Peek { cost: 1 })
            .expect("valid reply");
        assert_eq!(empty.limits()[0].remaining, 9);
        // A value short, a value too many, a negative one.
        for (reply, says) in [
            (
                ints(&[1, now, 0, 0, 0, 0]),
                "6 values for 3 limits of a peek",
            ),
            (
                ints(&[1, now, 0, 0, 0, 0, 0, 9]),
                "8 values for 3 limits of a peek",
            ),
            (ints(&[1, now, 0, -1, 0, 0, 0]), "used is -1"),
        ] {
            match decode_rate(&reply, &p, Op::Peek { cost: 1 }) {
                Err(StoreError::Backend(m)) => assert!(m.contains(says), "{m} should say {says}"),
                other => panic!("expected an error, got {other:?}"),
            }
        }
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
