//! What one Envoy may admit until its next report: its share of what the store has left.
//!
//! After a report is charged, the store's decision says how much every limit of the policy
//! has left (`R`, the least `remaining`) and how many distinct streams have reported the key
//! within the policy's shortest window (`N`, [`sluice::Decision::holders`]). The client, which
//! reports every `T` (the stream's cadence, see `StreamState::cadence`), gets
//!
//! ```text
//! g = min(floor(R / N), ceil(C / N))     C = min over the limits of ceil(max × T / per)
//! ```
//!
//! as a token bucket of `g` tokens refilling `g` every `T`; `g = 0` is
//! `DENY_ALL`. `C` is the limit's own rate over one report, so the fleet together is paced
//! to about the limit's rate (an assignment is a rate, as the protocol's strategies are)
//! instead of spending the whole window in its first seconds, and the first Envoy to report
//! (while `N` is still 1) cannot take the window at once.
//!
//! **The bound.** For a `fixed_window` limit of `max` per window, the fleet admits at most
//! `max + 2 × N × ceil(C / N)` in any window. Reports that arrive before the store is full are
//! charged in full, and those charges never exceed `max`. What goes uncounted is what each
//! client admits in the one reporting interval that straddles the moment the store fills (or
//! the window ends): at most its bucket's `g` tokens plus one interval's refill `g`, so
//! `2g ≤ 2 × ceil(C / N)`; after that report it holds `DENY_ALL` until the window resets.
//! `N` there is the holders counted when each share was computed: while Envoys are still
//! joining, an early one's share was split among fewer (the first alone gets up to `C`), and
//! the bound is `max + 2 × Σ g` over the last shares, at most `max + 2 × N × C`. The
//! bound assumes Envoy reports every interval and applies an answer before admitting much
//! more (an answer in flight lets a client spend one round trip more of its old bucket), and
//! it leaves out what Envoy's own `no_assignment_behavior` and `expired_assignment_behavior`
//! admit: the server cannot see them until they are reported.
//!
//! What is lost: a report that no longer fits is charged only as far as it fits
//! (`Op::Acquire { min: 0, max: allowed }` takes what every limit admits); the rest happened
//! but is not in the store, so the next window starts from zero rather than paying it back.
//! `floor(R / N)` leaves up to `N - 1` units of a window unassigned, and after a reset each
//! Envoy keeps the last window's `DENY_ALL` until its next report (up to one interval).

use envoy_types::pb::envoy::r#type::v3::rate_limit_strategy::{BlanketRule, Strategy};
use envoy_types::pb::envoy::r#type::v3::{RateLimitStrategy, TokenBucket};
use envoy_types::pb::google::protobuf::{Duration as ProtoDuration, UInt32Value};
use sluice::{Decision, Policy};

/// What a client is told to do with a bucket until its next assignment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Assignment {
    /// Every request passes.
    AllowAll,
    /// No request passes.
    DenyAll,
    /// A token bucket of `tokens`, refilled by `tokens` every reporting interval.
    Tokens(u32),
}

impl Assignment {
    /// The strategy Envoy applies; `interval_secs` is the token bucket's `fill_interval`.
    pub(crate) fn strategy(self, interval_secs: u64) -> RateLimitStrategy {
        let strategy = match self {
            Assignment::AllowAll => Strategy::BlanketRule(BlanketRule::AllowAll as i32),
            Assignment::DenyAll => Strategy::BlanketRule(BlanketRule::DenyAll as i32),
            Assignment::Tokens(n) => Strategy::TokenBucket(TokenBucket {
                max_tokens: n,
                tokens_per_fill: Some(UInt32Value { value: n }),
                fill_interval: Some(ProtoDuration {
                    seconds: i64::try_from(interval_secs).unwrap_or(i64::MAX),
                    nanos: 0,
                }),
            }),
        };
        RateLimitStrategy {
            strategy: Some(strategy),
        }
    }
}

/// `C`: the policy's tightest rate over one reporting interval (at least 1), which the
/// holders of a key share.
pub(crate) fn pace_cap(policy: &Policy, interval_ms: u64) -> u64 {
    policy
        .limits()
        .iter()
        .map(|l| {
            let per = u128::from(l.per_ms().max(1));
            let units = (u128::from(l.max()) * u128::from(interval_ms)).div_ceil(per);
            u64::try_from(units).unwrap_or(u64::MAX).max(1)
        })
        .min()
        .unwrap_or(1)
}

/// The share of a client after `decision` (the charge of its report):
/// `min(floor(R / N), ceil(C / N))`.
pub(crate) fn share(policy: &Policy, decision: &Decision, interval_ms: u64) -> u64 {
    let left = decision
        .limits()
        .iter()
        .map(|l| l.remaining)
        .min()
        .unwrap_or(0);
    let holders = u64::from(decision.holders.max(1));
    (left / holders).min(pace_cap(policy, interval_ms).div_ceil(holders))
}

/// The assignment for a share.
pub(crate) fn assignment(share: u64) -> Assignment {
    match u32::try_from(share) {
        Ok(0) => Assignment::DenyAll,
        Ok(n) => Assignment::Tokens(n),
        Err(_) => Assignment::Tokens(u32::MAX),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use sluice::{LimitSpec, LimitStatus};

    use super::*;

    fn decision(policy: &Policy, remaining: &[u64], holders: u32) -> Decision {
        let limits = policy
            .limits()
            .iter()
            .zip(remaining)
            .map(|(l, r)| LimitStatus {
                max: l.max(),
                capacity: l.capacity(),
                per_ms: l.per_ms(),
                algorithm: l.algorithm(),
                admits: true,
                remaining: *r,
                reset_ms: 0,
                retry_after_ms: Some(0),
            });
        let mut d = Decision::new(true, 0, limits, 0);
        d.holders = holders;
        d
    }

    #[test]
    fn the_share_is_what_is_left_over_the_holders_capped_by_the_pace() {
        // 600 per minute, reported every second: C = 10.
        let p = Policy::from_specs("p", vec![LimitSpec::fixed_window(600, 60_000)]).unwrap();
        assert_eq!(pace_cap(&p, 1_000), 10);
        assert_eq!(share(&p, &decision(&p, &[600], 1), 1_000), 10);
        // Eight share the pace: ceil(10 / 8) = 2 each.
        assert_eq!(share(&p, &decision(&p, &[600], 8), 1_000), 2);
        assert_eq!(share(&p, &decision(&p, &[12], 8), 1_000), 1);
        assert_eq!(share(&p, &decision(&p, &[7], 8), 1_000), 0);
        // A store that counts no holders is one client.
        assert_eq!(share(&p, &decision(&p, &[3], 0), 1_000), 3);
    }

    #[test]
    fn the_tightest_limit_decides() {
        let p = Policy::from_specs(
            "p",
            vec![
                LimitSpec::fixed_window(10, 1_000),
                LimitSpec::fixed_window(100, 3_600_000),
            ],
        )
        .unwrap();
        // 10/s over 5 s is 50; 100/h over 5 s rounds up to 1.
        assert_eq!(pace_cap(&p, 5_000), 1);
        assert_eq!(share(&p, &decision(&p, &[10, 0], 1), 5_000), 0);
    }

    #[test]
    fn assignments_and_strategies() {
        assert_eq!(assignment(0), Assignment::DenyAll);
        assert_eq!(assignment(7), Assignment::Tokens(7));
        assert_eq!(assignment(u64::MAX), Assignment::Tokens(u32::MAX));
        let s = Assignment::Tokens(7).strategy(2);
        let Some(Strategy::TokenBucket(tb)) = s.strategy else {
            panic!("a token bucket: {s:?}");
        };
        assert_eq!(tb.max_tokens, 7);
        assert_eq!(tb.tokens_per_fill.unwrap().value, 7);
        assert_eq!(tb.fill_interval.unwrap().seconds, 2);
        assert_eq!(
            Assignment::DenyAll.strategy(1).strategy,
            Some(Strategy::BlanketRule(BlanketRule::DenyAll as i32))
        );
    }
}
