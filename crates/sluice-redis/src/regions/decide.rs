//! One decision of the regions store: the local call under a policy whose every `max` is
//! lowered by what the other regions used (the *offset*), then the answer restated against the
//! real `max`.
//!
//! Why a lowered `max` and not a new argument of the script: the script and the coalescing are
//! unchanged, and a lowered policy is a different policy to the codec (a batch sends each
//! distinct policy once, told apart by equality of name *and* limits, `max` included), so a
//! decision under a lowered `max` never shares a batch's arguments with one under another.
//! A limit's state tag does not contain `max`, so the lowered policy counts in the same keys.

use sluice::core::MAX_LIMITS_PER_POLICY;
use sluice::{
    Algorithm, Call, Decision, Limit, LimitSpec, LimitStatus, Op, Policy, Store, StoreError,
};

use super::Fallback;
use crate::store::RedisStore;

/// Units each limit of a policy may not use here (used by the other regions, or withheld by a
/// fallback), in the policy's order.
pub(super) type Offsets = [u64; MAX_LIMITS_PER_POLICY];

/// The offsets of a decision under `mode`, given what the other regions were last known to
/// have used (`known`: their last reads that still count, which within a window only
/// grow): `local_share` leaves this region's own count `(max − known) / regions` (rounded
/// down; `max / regions` when nothing is known), `local_only` the whole `max` (the local
/// count alone), `closed` nothing.
///
/// `local_share` thus never hands out a fresh share on top of a spent limit: a region that
/// saw the others use the whole window before the cut admits nothing more in it. With every
/// region under it (a cut is seen from both sides, `health`), their counts add up to at most
/// `max` plus what they had not seen when their views stopped (docs/regions.md, "A cut
/// mid-window").
pub(super) fn fallback_offsets(
    policy: &Policy,
    mode: Fallback,
    regions: usize,
    known: &Offsets,
) -> Offsets {
    let mut offsets = [0; MAX_LIMITS_PER_POLICY];
    let regions = u64::try_from(regions).unwrap_or(u64::MAX).max(1);
    for ((o, limit), &k) in offsets.iter_mut().zip(policy.limits()).zip(known) {
        *o = match mode {
            Fallback::LocalShare => limit.max() - limit.max().saturating_sub(k) / regions,
            Fallback::LocalOnly => 0,
            Fallback::Closed => limit.max(),
        };
    }
    offsets
}

/// `policy` as the regions store counts it: fixed windows aligned to the epoch (so every
/// region's window is the same), each `max` lowered by its offset (to 1 at least; a limit
/// whose offset reaches `max` is *saturated* and [`decide`] refuses any cost there itself).
pub(super) fn effective_policy(policy: &Policy, offsets: &Offsets) -> Result<Policy, String> {
    let limits = policy
        .limits()
        .iter()
        .zip(offsets)
        .map(|(limit, &offset)| {
            let max = limit.max().saturating_sub(offset).max(1);
            match limit.algorithm() {
                Algorithm::FixedWindow => {
                    Limit::new(LimitSpec::fixed_window(max, limit.per_ms()).aligned())
                }
                Algorithm::SlidingWindow => Limit::new(
                    LimitSpec::sliding_window(max, limit.per_ms())
                        .precision_ms(limit.precision_ms()),
                ),
                // Refused by `admits_policy` before any decision; kept as they are.
                _ => Ok(limit.clone()),
            }
        })
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("policy `{}`: {e}", policy.name()))?;
    Policy::new(policy.name(), limits)
        .map(|p| p.with_failure_mode(policy.failure_mode()))
        .map_err(|e| format!("policy `{}`: {e}", policy.name()))
}

/// Decides `op` on `key` in the local store with `offsets` deducted from the limits.
pub(super) async fn decide(
    local: &RedisStore,
    policy: &Policy,
    key: &str,
    op: Op,
    now_ms: u64,
    offsets: &Offsets,
) -> Result<Decision, StoreError> {
    let effective = effective_policy(policy, offsets).map_err(StoreError::Backend)?;
    let saturated = policy
        .limits()
        .iter()
        .zip(offsets)
        .any(|(l, &o)| o >= l.max());
    // A saturated limit admits no unit: a check, peek or acquire that asks for one is refused
    // here, and only the state is read (nothing may be written).
    let asked = match op {
        Op::Check { cost } | Op::Peek { cost } => cost,
        Op::Acquire { min, .. } => min,
        _ => 0,
    };
    let refused_here = saturated && asked > 0;
    let sent = match op {
        Op::Check { cost } if refused_here => Op::Peek { cost },
        Op::Acquire { min, .. } if saturated => Op::Peek { cost: min },
        op => op,
    };
    let local_decision = local.call(Call::new(&effective, key, sent, now_ms)).await?;
    Ok(restate(policy, &local_decision, offsets, refused_here))
}

/// The local decision restated against `policy`'s real limits: `max` as configured,
/// `remaining = max − local − offset`, and a saturated limit refusing.
fn restate(policy: &Policy, local: &Decision, offsets: &Offsets, refused_here: bool) -> Decision {
    let now = local.now_ms;
    let cost = local.cost;
    let statuses =
        policy
            .limits()
            .iter()
            .zip(local.limits())
            .zip(offsets)
            .map(|((limit, s), &offset)| {
                // A peek sent for a check refused here reported what would be left after the
                // cost: the state as it stands has the cost back.
                let pending = if local.allowed && refused_here {
                    cost
                } else {
                    0
                };
                let used_here = s
                    .capacity
                    .saturating_sub(s.remaining)
                    .saturating_sub(pending);
                let max = limit.max();
                let remaining = max.saturating_sub(used_here.saturating_add(offset));
                let mut status = LimitStatus {
                    max,
                    capacity: max,
                    remaining,
                    ..*s
                };
                let fits_nowhere = cost > max;
                // The other regions' part leaves when their window does: at the aligned window's
                // end, or (sliding) no sooner than the next bucket boundary.
                let theirs = retry_after(limit, now);
                if !s.admits && !fits_nowhere {
                    // Refused here: the cost fits once the local units or the other regions' leave.
                    status.retry_after_ms =
                        Some(s.retry_after_ms.map_or(theirs, |l| l.min(theirs)));
                } else if s.admits && offset >= max && cost > 0 {
                    status.admits = false;
                    status.retry_after_ms = Some(theirs);
                    status.reset_ms = status.reset_ms.max(now + theirs);
                }
                if fits_nowhere {
                    status.admits = false;
                    status.retry_after_ms = None;
                }
                status
            });
    let allowed = local.allowed && !refused_here;
    let mut decision = Decision::new(allowed, cost, statuses, now);
    decision.degraded = local.degraded;
    decision.holders = local.holders;
    decision
}

/// The wait until the other regions' usage of `limit` may have left it.
fn retry_after(limit: &Limit, now_ms: u64) -> u64 {
    match limit.algorithm() {
        Algorithm::FixedWindow => limit.per_ms() - now_ms % limit.per_ms(),
        _ => limit.precision_ms().max(1) - now_ms % limit.precision_ms().max(1),
    }
}

#[cfg(test)]
mod tests {
    use sluice::LimitSpec;

    use super::*;

    fn policy() -> Policy {
        Policy::from_specs(
            "api",
            vec![
                LimitSpec::fixed_window(10, 1_000),
                LimitSpec::sliding_window(100, 60_000),
            ],
        )
        .expect("valid")
    }

    #[test]
    fn the_effective_policy_lowers_max_aligns_fixed_windows_and_keeps_the_keys() {
        let p = policy();
        let e = effective_policy(&p, &[4, 100, 0, 0]).expect("valid");
        assert_eq!(e.name(), "api");
        assert_eq!(e.limits()[0].max(), 6);
        assert!(e.limits()[0].align());
        // Saturated: 1 at least (decide refuses there itself).
        assert_eq!(e.limits()[1].max(), 1);
        assert_eq!(e.limits()[1].state_tag(), p.limits()[1].state_tag());
        // A different policy to the codec: never one batch entry with the original.
        assert_ne!(e, effective_policy(&p, &[0; 4]).expect("valid"));
    }

    /// Without known usage: a share, all or nothing. The share is of what the others were
    /// not known to use: 10 − 4 = 6 left, 2 each of 3 regions; a spent limit leaves nothing
    /// (the offset is `max`: saturated).
    #[test]
    fn fallback_offsets_leave_a_share_of_what_is_left_all_or_nothing() {
        let p = policy();
        let (none, known, over) = ([0; 4], [4, 100, 0, 0], [12, 250, 0, 0]);
        for (mode, usage, expected) in [
            (Fallback::LocalShare, none, [7, 67]),
            (Fallback::LocalOnly, none, [0, 0]),
            (Fallback::Closed, none, [10, 100]),
            (Fallback::LocalShare, known, [8, 100]),
            (Fallback::LocalShare, over, [10, 100]),
            (Fallback::LocalOnly, known, [0, 0]),
        ] {
            let offsets = fallback_offsets(&p, mode, 3, &usage);
            assert_eq!(offsets[..2], expected, "{mode} with {usage:?}");
        }
    }
}
