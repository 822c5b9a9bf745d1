//! The rate-limit headers agree with themselves for every rate algorithm: over random
//! policies (fixed windows, sliding windows, token buckets with a `burst` below, at or above
//! `max`) and random sequences of checks, peeks, refunds, forgets and time passing, every
//! decision renders `x-ratelimit-used = x-ratelimit-limit - x-ratelimit-remaining` with
//! `0 <= remaining <= limit`, each IETF item has `r <= q` and `t <= w`, the binding item's `q`
//! is `x-ratelimit-limit`, and a fresh key reports nothing used. `PROPTEST_CASES=20000 cargo
//! test -p sluice --test headers` runs a longer search.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use proptest::prelude::*;
use sluice::core::evaluate;
use sluice::{Algorithm, Decision, Limit, LimitSpec, LimitState, Policy, headers};

const T0: u64 = 1_700_000_000_000;

#[derive(Debug, Clone)]
enum Op {
    Advance(u64),
    Check(u64),
    Peek(u64),
    Refund(u64),
    Forget,
}

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(512)
}

fn per() -> impl Strategy<Value = u64> {
    prop_oneof![
        Just(7u64),
        Just(250),
        Just(1_000),
        Just(1_500),
        Just(60_000),
        Just(3_600_000)
    ]
}

fn spec() -> impl Strategy<Value = LimitSpec> {
    prop_oneof![
        (1u64..=200, per(), any::<bool>()).prop_map(|(max, per, align)| {
            let s = LimitSpec::fixed_window(max, per);
            if align { s.aligned() } else { s }
        }),
        (1u64..=200, per()).prop_map(|(max, per)| LimitSpec::sliding_window(max, per * 60)),
        (1u64..=200, per(), 1u64..=400)
            .prop_map(|(max, per, burst)| LimitSpec::token_bucket(max, per).burst(burst)),
    ]
}

/// One to three limits that count different windows (a policy refuses two that do not).
fn policy() -> impl Strategy<Value = Policy> {
    prop::collection::vec(spec(), 1..=3)
        .prop_filter_map("two limits count the same window", |specs| {
            Policy::from_specs("p", specs).ok()
        })
}

fn ops() -> impl Strategy<Value = Vec<Op>> {
    let op = prop_oneof![
        3 => prop_oneof![0u64..=300, 0u64..=4_000_000].prop_map(Op::Advance),
        6 => prop_oneof![3 => 0u64..=5, 1 => 0u64..=450].prop_map(Op::Check),
        2 => (0u64..=450).prop_map(Op::Peek),
        1 => (0u64..=450).prop_map(Op::Refund),
        1 => Just(Op::Forget),
    ];
    prop::collection::vec(op, 1..120)
}

/// What docs/algorithms.md says a limit holds at once: a token bucket's burst, else max.
fn capacity(l: &Limit) -> u64 {
    match l.algorithm() {
        Algorithm::TokenBucket => l.burst(),
        _ => l.max(),
    }
}

fn number(headers: &[(&str, String)], name: &str) -> Result<u64, TestCaseError> {
    let (_, v) = headers
        .iter()
        .find(|(n, _)| *n == name)
        .ok_or_else(|| TestCaseError::fail(format!("no {name} in {headers:?}")))?;
    v.parse()
        .map_err(|_| TestCaseError::fail(format!("{name}: {v}")))
}

/// The integer parameters of each item of an IETF list, e.g. `"p:0";q=20;w=12` → {q: 20,
/// w: 12}, in order.
fn items(value: &str) -> Vec<Vec<(String, u64)>> {
    value
        .split(", ")
        .map(|item| {
            item.split(';')
                .skip(1)
                .filter_map(|p| {
                    let (k, v) = p.split_once('=')?;
                    Some((k.to_owned(), v.parse().ok()?))
                })
                .collect()
        })
        .collect()
}

fn param(item: &[(String, u64)], name: &str) -> Result<u64, TestCaseError> {
    item.iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| *v)
        .ok_or_else(|| TestCaseError::fail(format!("no {name} in {item:?}")))
}

/// Renders `d` and checks that its numbers agree; returns (limit, remaining, used).
fn agree(policy: &Policy, d: &Decision) -> Result<(u64, u64, u64), TestCaseError> {
    let h = headers::collect(policy, d, headers::Sets::ALL);
    let limit = number(&h, headers::X_RATELIMIT_LIMIT)?;
    let remaining = number(&h, headers::X_RATELIMIT_REMAINING)?;
    let used = number(&h, headers::X_RATELIMIT_USED)?;
    prop_assert!(remaining <= limit, "remaining {remaining} > limit {limit}");
    prop_assert_eq!(used, limit - remaining, "used = limit - remaining");
    let get = |name| h.iter().find(|(n, _)| *n == name).map(|(_, v)| v.as_str());
    let quotas = items(get(headers::RATELIMIT_POLICY).unwrap_or_default());
    let states = items(get(headers::RATELIMIT).unwrap_or_default());
    prop_assert_eq!(quotas.len(), policy.limits().len());
    prop_assert_eq!(states.len(), policy.limits().len());
    for (i, ((quota, state), limit_of)) in
        quotas.iter().zip(&states).zip(policy.limits()).enumerate()
    {
        let (q, w) = (param(quota, "q")?, param(quota, "w")?);
        let (r, t) = (param(state, "r")?, param(state, "t")?);
        prop_assert_eq!(q, capacity(limit_of), "item {}: q is the capacity", i);
        prop_assert!(r <= q, "item {i}: r {r} > q {q}");
        prop_assert!(t <= w, "item {i}: t {t} > w {w}");
        prop_assert!(w >= 1);
        if i == d.binding_index() {
            prop_assert_eq!(
                (q, r),
                (limit, remaining),
                "the binding item is GitHub's set"
            );
        }
    }
    Ok((limit, remaining, used))
}

/// A fresh key's state (a peek of cost 0): nothing used, every item whole
/// (docs/algorithms.md, "What every limit reports").
fn fresh(policy: &Policy, d: &Decision) -> Result<(), TestCaseError> {
    let (limit, remaining, used) = agree(policy, d)?;
    prop_assert_eq!(
        (used, remaining),
        (0, limit),
        "a fresh key has used nothing"
    );
    let state = headers::collect(
        policy,
        d,
        headers::Sets {
            github: false,
            retry_after: false,
            ietf: true,
        },
    )[1]
    .1
    .clone();
    for (item, l) in items(&state).iter().zip(policy.limits()) {
        prop_assert_eq!(param(item, "r")?, capacity(l));
        // Nothing to wait for, except an aligned window's end, which exists regardless.
        if !l.align() {
            prop_assert_eq!(param(item, "t")?, 0);
        }
    }
    Ok(())
}

fn apply(states: &mut Vec<LimitState>, writes: Option<evaluate::Writes>) {
    if let Some(writes) = writes {
        states.resize(writes.len(), LimitState::Empty);
        for (s, w) in states.iter_mut().zip(writes) {
            if let Some(w) = w {
                *s = w;
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases()))]

    #[test]
    fn limit_remaining_and_used_agree_for_every_rate_algorithm(
        policy in policy(),
        ops in ops(),
    ) {
        let mut states: Vec<LimitState> = Vec::new();
        let mut now = T0;
        fresh(&policy, &evaluate::peek(&policy, &states, 0, now))?;
        for op in ops {
            match op {
                Op::Advance(ms) => now += ms,
                Op::Check(cost) => {
                    let eval = evaluate::check(&policy, &states, cost, now);
                    agree(&policy, &eval.decision)?;
                    apply(&mut states, eval.writes);
                }
                Op::Peek(cost) => {
                    agree(&policy, &evaluate::peek(&policy, &states, cost, now))?;
                }
                Op::Refund(cost) => {
                    let eval = evaluate::apply(&policy, &states, evaluate::Op::Refund { cost }, now);
                    agree(&policy, &eval.decision)?;
                    apply(&mut states, eval.writes);
                }
                Op::Forget => {
                    states.clear();
                    fresh(&policy, &evaluate::peek(&policy, &states, 0, now))?;
                }
            }
        }
    }
}
