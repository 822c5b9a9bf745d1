//! Properties of the algorithms over random operation sequences (advance time, check with a
//! random cost, peek, refund). Failing cases proptest finds are kept in
//! `properties.proptest-regressions` beside this file (committed) and replayed first on every
//! run. `PROPTEST_CASES=20000 cargo test -p sluice-core --test properties` runs a longer search.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use proptest::prelude::*;
use sluice_core::{Algorithm, Decision, LimitSpec, LimitState, Policy, evaluate};

const T0: u64 = 1_700_000_000_000;

#[derive(Debug, Clone)]
enum Op {
    Advance(u64),
    Check(u64),
    Peek(u64),
    Refund(u64),
}

/// 512 cases per property unless `PROPTEST_CASES` says otherwise.
fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(512)
}

fn ops(max: u64, per: u64, refunds: bool) -> impl Strategy<Value = Vec<Op>> {
    let small = (per / 8).max(1);
    let op = prop_oneof![
        3 => (0..=small).prop_map(Op::Advance),
        1 => (0..=per + per / 2).prop_map(Op::Advance),
        6 => prop_oneof![4 => 0..=max.min(3), 1 => 0..=max + 1].prop_map(Op::Check),
        1 => (0..=max + 1).prop_map(Op::Peek),
        (if refunds { 1 } else { 0 }) => (0..=max).prop_map(Op::Refund),
    ];
    prop::collection::vec(op, 1..200)
}

fn fixed_spec() -> impl Strategy<Value = LimitSpec> {
    (
        1u64..=20,
        prop_oneof![Just(1u64), Just(7), Just(100), Just(1_000), Just(60_000)],
        any::<bool>(),
    )
        .prop_map(|(max, per, align)| {
            let spec = LimitSpec::fixed_window(max, per);
            if align { spec.aligned() } else { spec }
        })
}

fn sliding_spec() -> impl Strategy<Value = LimitSpec> {
    (
        1u64..=20,
        prop_oneof![Just(1u64), Just(10), Just(100), Just(250)],
        1u64..=20,
    )
        .prop_map(|(max, p, n)| LimitSpec::sliding_window(max, p * n).precision_ms(p))
}

fn bucket_spec() -> impl Strategy<Value = LimitSpec> {
    (
        1u64..=20,
        prop_oneof![Just(7u64), Just(333), Just(1_000), Just(60_000)],
        1u64..=40,
    )
        .prop_map(|(max, per, burst)| LimitSpec::token_bucket(max, per).burst(burst))
}

/// A key driven through the core; it also asserts, on every step, the properties that hold
/// for all algorithms: a denied check or a cost of 0 writes nothing, and a refund raises
/// `remaining` by exactly the refunded cost up to the full bucket.
struct Key {
    policy: Policy,
    states: Vec<LimitState>,
    now: u64,
}

impl Key {
    fn new(spec: LimitSpec) -> Self {
        Self {
            policy: Policy::from_specs("p", vec![spec]).expect("valid"),
            states: Vec::new(),
            now: T0,
        }
    }

    fn full(&self) -> u64 {
        let l = &self.policy.limits()[0];
        if l.algorithm() == Algorithm::TokenBucket {
            l.burst()
        } else {
            l.max()
        }
    }

    fn apply(&mut self, writes: Option<evaluate::Writes>) {
        if let Some(writes) = writes {
            self.states.resize(writes.len(), LimitState::Empty);
            for (s, w) in self.states.iter_mut().zip(writes) {
                if let Some(w) = w {
                    *s = w;
                }
            }
        }
    }

    fn check(&mut self, cost: u64) -> Result<Decision, TestCaseError> {
        let eval = evaluate::check(&self.policy, &self.states, cost, self.now);
        let d = &eval.decision;
        prop_assert!(d.remaining() <= self.full());
        if !d.allowed || cost == 0 {
            prop_assert!(
                eval.writes.is_none(),
                "denied or cost-0 check wrote {:?}",
                eval.writes
            );
        }
        prop_assert_eq!(d.retry_after_ms() == Some(0), d.allowed);
        if d.allowed {
            prop_assert!(d.reset_ms() >= self.now);
        }
        self.apply(eval.writes);
        Ok(eval.decision)
    }

    fn peek(&self, cost: u64) -> Decision {
        evaluate::peek(&self.policy, &self.states, cost, self.now)
    }

    fn refund(&mut self, cost: u64) -> Result<(), TestCaseError> {
        let before = self.peek(0).remaining();
        let eval = evaluate::apply(
            &self.policy,
            &self.states,
            evaluate::Op::Refund { cost },
            self.now,
        );
        let after = eval.decision.remaining();
        self.apply(eval.writes);
        prop_assert_eq!(after, (before + cost).min(self.full()));
        prop_assert_eq!(self.peek(0).remaining(), after);
        Ok(())
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    /// Fixed window: at most `max` (net of refunds) per window; windows do not overlap; every
    /// decision inside one window reports the same reset to the millisecond; remaining is
    /// `max - used`.
    #[test]
    fn fixed_window_never_exceeds_max_and_reset_is_constant(spec in fixed_spec(), ops in ops(20, 60_000, true)) {
        let mut k = Key::new(spec.clone());
        let (max, per) = (spec.max, spec.per_ms);
        // The open window as the test sees it: (reset, net used).
        let mut window: Option<(u64, u64)> = None;
        for op in ops {
            let open = window.filter(|&(r, _)| k.now < r);
            match op {
                Op::Advance(dt) => k.now += dt,
                Op::Check(cost) | Op::Peek(cost) => {
                    let is_check = matches!(op, Op::Check(_));
                    let d = if is_check { k.check(cost)? } else { k.peek(cost) };
                    let used = open.map_or(0, |(_, u)| u);
                    if let Some((reset, _)) = open {
                        prop_assert_eq!(d.reset_ms(), reset, "reset moved inside a window");
                    }
                    prop_assert_eq!(d.allowed, cost <= max - used);
                    // A peek reports what the check would: the cost deducted when it fits.
                    let deducted = if d.allowed { cost } else { 0 };
                    prop_assert_eq!(d.remaining(), max - used - deducted);
                    if is_check && deducted > 0 {
                        match open {
                            Some((reset, u)) => window = Some((reset, u + cost)),
                            None => {
                                let reset = d.reset_ms();
                                if spec.align {
                                    prop_assert_eq!(reset % per, 0);
                                    prop_assert!(reset > k.now && reset - per <= k.now);
                                } else {
                                    prop_assert_eq!(reset, k.now + per);
                                }
                                if let Some((prev, _)) = window {
                                    prop_assert!(reset - per >= prev, "windows overlap");
                                }
                                window = Some((reset, cost));
                            }
                        }
                    }
                    if let Some((_, u)) = window { prop_assert!(u <= max); }
                }
                Op::Refund(cost) => {
                    k.refund(cost)?;
                    if let Some((r, u)) = open { window = Some((r, u.saturating_sub(cost))); }
                }
            }
        }
    }

    /// Sliding window: the admitted cost in the buckets of any span of `per` never exceeds
    /// `max`, and remaining is `max` minus exactly that sum.
    #[test]
    fn sliding_window_never_exceeds_max_in_any_span(spec in sliding_spec(), ops in ops(20, 5_000, false)) {
        let mut k = Key::new(spec.clone());
        let p = spec.precision_ms.unwrap_or(1);
        let (max, per) = (spec.max, spec.per_ms);
        let mut admitted: Vec<(u64, u64)> = Vec::new(); // (bucket start, cost)
        let in_window = |admitted: &[(u64, u64)], now: u64| -> u64 {
            admitted.iter().filter(|&&(b, _)| b + per > now).map(|&(_, c)| c).sum()
        };
        for op in ops {
            match op {
                Op::Advance(dt) => k.now += dt,
                Op::Check(cost) | Op::Peek(cost) => {
                    let used = in_window(&admitted, k.now);
                    let is_check = matches!(op, Op::Check(_));
                    let d = if is_check { k.check(cost)? } else { k.peek(cost) };
                    prop_assert_eq!(d.allowed, cost <= max - used);
                    if d.allowed && is_check && cost > 0 {
                        admitted.push((k.now - k.now % p, cost));
                    }
                    let used = in_window(&admitted, k.now);
                    prop_assert!(used <= max, "{} admitted within one span of per", used);
                    let deducted = if d.allowed && !is_check { cost } else { 0 };
                    prop_assert_eq!(d.remaining(), max - used - deducted);
                    if !d.allowed {
                        if let Some(wait) = d.retry_after_ms() {
                            // At now + wait it fits, and not a millisecond earlier.
                            let later = in_window(&admitted, k.now + wait);
                            prop_assert!(cost <= max - later);
                            let earlier = in_window(&admitted, k.now + wait - 1);
                            prop_assert!(cost > max - earlier);
                        } else {
                            prop_assert!(cost > max);
                        }
                    }
                }
                Op::Refund(_) => {}
            }
        }
    }

    /// Token bucket: over any span `t` between two admissions, at most `burst + max·t/per`
    /// is admitted; a refused cost fits exactly at `retry_after`.
    #[test]
    fn token_bucket_never_exceeds_burst_plus_rate(spec in bucket_spec(), ops in ops(20, 60_000, false)) {
        let mut k = Key::new(spec.clone());
        let (max, per) = (u128::from(spec.max), u128::from(spec.per_ms));
        let burst = u128::from(spec.burst.unwrap_or(spec.max));
        let mut admitted: Vec<(u64, u64)> = Vec::new(); // (time, cost)
        for op in ops {
            match op {
                Op::Advance(dt) => k.now += dt,
                Op::Check(cost) | Op::Peek(cost) => {
                    let is_check = matches!(op, Op::Check(_));
                    let d = if is_check { k.check(cost)? } else { k.peek(cost) };
                    if d.allowed && is_check && cost > 0 {
                        admitted.push((k.now, cost));
                        // Every span ending now.
                        let mut sum = 0u128;
                        for &(t, c) in admitted.iter().rev() {
                            sum += u128::from(c);
                            let span = u128::from(k.now - t);
                            prop_assert!(sum * per <= burst * per + max * span,
                                "{} admitted in {} ms", sum, span);
                        }
                    }
                    if !d.allowed {
                        match d.retry_after_ms() {
                            Some(wait) => {
                                prop_assert!(wait > 0);
                                let mut probe = Key { policy: k.policy.clone(), states: k.states.clone(), now: k.now + wait };
                                prop_assert!(probe.peek(cost).allowed, "does not fit at retry_after");
                                probe.now -= 1;
                                prop_assert!(!probe.peek(cost).allowed, "fits before retry_after");
                            }
                            None => prop_assert!(u128::from(cost) > max.min(burst)),
                        }
                    }
                }
                Op::Refund(_) => {}
            }
        }
    }

    /// Every algorithm: a refund gives back exactly the cost up to full, never more; denied and
    /// cost-0 checks write nothing (asserted inside `Key`).
    #[test]
    fn refunds_and_denials_keep_the_books(
        spec in prop_oneof![fixed_spec(), sliding_spec(), bucket_spec()],
        ops in ops(20, 10_000, true),
    ) {
        let mut k = Key::new(spec);
        for op in ops {
            match op {
                Op::Advance(dt) => k.now += dt,
                Op::Check(cost) => { k.check(cost)?; }
                Op::Peek(cost) => {
                    let before = k.states.clone();
                    let a = k.peek(cost);
                    prop_assert_eq!(&k.states, &before);
                    // A peek is exactly the decision a check would get.
                    let b = evaluate::check(&k.policy, &k.states, cost, k.now).decision;
                    prop_assert_eq!(a, b);
                }
                Op::Refund(cost) => k.refund(cost)?,
            }
        }
    }

    /// `acquire` takes the most that fits: for every algorithm and for policies of several
    /// limits, the amount taken is admitted and one unit more would not have been; when even
    /// `min` does not fit, it is a refused check of `min` that records nothing.
    #[test]
    fn acquire_takes_exactly_what_fits(
        specs in prop::collection::vec(prop_oneof![fixed_spec(), sliding_spec(), bucket_spec()], 1..=3),
        ops in ops(20, 10_000, true),
        batch in 1u64..=25,
    ) {
        let Ok(policy) = Policy::from_specs("p", specs) else {
            return Ok(()); // two limits counting the same window: not a valid policy
        };
        let mut states: Vec<LimitState> = Vec::new();
        let mut now = T0;
        let apply = |states: &mut Vec<LimitState>, writes: Option<evaluate::Writes>| {
            if let Some(writes) = writes {
                states.resize(writes.len(), LimitState::Empty);
                for (s, w) in states.iter_mut().zip(writes) {
                    if let Some(w) = w {
                        *s = w;
                    }
                }
            }
        };
        for op in ops {
            match op {
                Op::Advance(dt) => now += dt,
                Op::Check(min) | Op::Peek(min) => {
                    let min = min.min(batch);
                    let eval = evaluate::apply(&policy, &states, evaluate::Op::Acquire { min, max: batch, holder: 0 }, now);
                    let d = eval.decision.clone();
                    if d.allowed {
                        prop_assert!(d.cost >= min && d.cost <= batch, "took {} for [{min}, {batch}]", d.cost);
                        // Exactly the check of what it took...
                        let same = evaluate::check(&policy, &states, d.cost, now);
                        prop_assert_eq!(&same, &eval);
                        // ...and one more unit would not have fitted (unless the batch capped it).
                        if d.cost < batch {
                            let more = evaluate::check(&policy, &states, d.cost + 1, now);
                            prop_assert!(!more.decision.allowed, "{} more would fit", d.cost + 1);
                        }
                    } else {
                        prop_assert!(eval.writes.is_none());
                        prop_assert_eq!(&eval, &evaluate::check(&policy, &states, min, now));
                    }
                    apply(&mut states, eval.writes);
                }
                Op::Refund(cost) => {
                    let eval = evaluate::apply(&policy, &states, evaluate::Op::Refund { cost }, now);
                    apply(&mut states, eval.writes);
                }
            }
        }
    }

    /// A store writing states in place (`apply_in_place`, the memory store's way) decides and
    /// stores exactly what the list of writes (`apply`, the pure functions) says, for every
    /// operation, over policies of one to three limits of every algorithm.
    #[test]
    fn writing_in_place_is_writing_the_list(
        specs in prop::collection::vec(
            prop_oneof![fixed_spec(), sliding_spec(), bucket_spec(), concurrency_spec()],
            1..=3,
        ),
        ops in prop::collection::vec(any_op(), 1..200),
    ) {
        let Ok(policy) = Policy::from_specs("p", specs) else {
            return Ok(()); // two limits counting the same window: not a valid policy
        };
        let n = policy.limits().len();
        let mut listed: Vec<LimitState> = Vec::new();
        let mut in_place: Vec<LimitState> = vec![LimitState::Empty; n];
        let mut now = T0;
        for (dt, op) in ops {
            now += dt;
            let eval = evaluate::apply(&policy, &listed, op, now);
            let mut d = Decision::empty(0, 0);
            let wrote = evaluate::apply_in_place(&policy, &mut in_place, op, now, &mut d);
            prop_assert_eq!(&d, &eval.decision, "{:?} at {}", op, now);
            prop_assert_eq!(wrote, eval.writes.is_some());
            if let Some(writes) = eval.writes {
                listed.resize(n, LimitState::Empty);
                for (s, w) in listed.iter_mut().zip(writes) {
                    if let Some(w) = w {
                        *s = w;
                    }
                }
            }
            let mut padded = listed.clone();
            padded.resize(n, LimitState::Empty);
            prop_assert_eq!(&in_place, &padded, "{:?} at {}", op, now);
        }
    }
}

fn concurrency_spec() -> impl Strategy<Value = LimitSpec> {
    (1u64..=5, prop_oneof![Just(50u64), Just(1_000)])
        .prop_map(|(max, ttl)| LimitSpec::concurrency(max, ttl))
}

/// A pause and an operation of any kind (leases 1 to 3, so some are taken twice).
fn any_op() -> impl Strategy<Value = (u64, evaluate::Op)> {
    use evaluate::Op as O;
    let op = prop_oneof![
        4 => (0u64..=6).prop_map(|cost| O::Check { cost }),
        1 => (0u64..=6).prop_map(|cost| O::Peek { cost }),
        1 => (0u64..=6).prop_map(|cost| O::Refund { cost }),
        1 => (0u64..=3, 0u64..=8).prop_map(|(min, max)| O::Acquire { min, max, holder: 0 }),
        2 => (0u64..=3, 1u64..=3).prop_map(|(cost, lease)| O::Hold { cost, lease }),
        1 => (1u64..=3).prop_map(|lease| O::Release { lease }),
    ];
    (prop_oneof![3 => 0u64..=20, 1 => 0u64..=2_000], op)
}
