//! The core algorithms (`sluice_core::evaluate`) against a naive model.
//!
//! `crates/sluice-core/tests/properties.rs` checks bounds of one limit at a time (never more
//! than `max` in a window, a refund gives back exactly its cost). This target goes further:
//! policies of one to four limits of any algorithms, arbitrary sequences of checks, peeks,
//! refunds and acquires with costs from 0 to 2^53, and a clock that also jumps ahead and goes
//! back. After every operation the core's decision must equal the model's, limit by limit
//! (`admits`, `remaining`, `reset_ms`, `retry_after_ms`), with all-or-nothing over the
//! limits, the binding limit chosen by the documented rule, and nothing written by a denied
//! check, a peek or a cost of 0.
//!
//! The model is written from docs/algorithms.md, in other terms than the core: a sliding
//! window keeps every admitted request (not buckets) and sums those still in the window; a
//! token bucket counts tokens (scaled by `per`, so exactly) at the instant of its last
//! change and refills them linearly, instead of GCRA's theoretical arrival time.

use bolero::check;
use sluice_core::{Algorithm, Decision, Limit, LimitSpec, LimitState, MAX_AMOUNT, evaluate};
use sluice_fuzz::{Many, Tally, budget, structured};

const T0: u64 = 1_700_000_000_000;

#[derive(Debug, Clone, Copy, arbitrary::Arbitrary)]
enum Amount {
    Small(u8),
    Any(u64),
}

impl Amount {
    fn limit(self) -> u64 {
        match self {
            Amount::Small(n) => u64::from(n % 20) + 1,
            Amount::Any(n) => n % MAX_AMOUNT + 1,
        }
    }

    fn cost(self) -> u64 {
        match self {
            Amount::Small(n) => u64::from(n % 25),
            Amount::Any(n) => n % (MAX_AMOUNT + 1),
        }
    }
}

const PERS: &[u64] = &[1, 7, 100, 1_000, 60_000, 3_600_000, 86_400_000];

#[derive(Debug, Clone, Copy, arbitrary::Arbitrary)]
enum Per {
    Known(u8),
    Any(u32),
}

impl Per {
    fn ms(self) -> u64 {
        match self {
            Per::Known(i) => PERS[usize::from(i) % PERS.len()],
            Per::Any(n) => u64::from(n) + 1,
        }
    }
}

#[derive(Debug, arbitrary::Arbitrary)]
enum Spec {
    Fixed {
        max: Amount,
        per: Per,
        align: bool,
    },
    Sliding {
        max: Amount,
        precision: Per,
        buckets: u8,
    },
    Bucket {
        max: Amount,
        per: Per,
        burst: Option<Amount>,
    },
}

impl Spec {
    fn spec(&self) -> LimitSpec {
        match *self {
            Spec::Fixed { max, per, align } => {
                let s = LimitSpec::fixed_window(max.limit(), per.ms());
                if align { s.aligned() } else { s }
            }
            Spec::Sliding {
                max,
                precision,
                buckets,
            } => {
                let p = match precision {
                    Per::Known(i) => [1, 2, 5, 10, 100, 1_000][usize::from(i) % 6],
                    Per::Any(n) => u64::from(n % 10_000) + 1,
                };
                LimitSpec::sliding_window(max.limit(), p * (u64::from(buckets % 100) + 1))
                    .precision_ms(p)
            }
            Spec::Bucket { max, per, burst } => {
                let s = LimitSpec::token_bucket(max.limit(), per.ms());
                match burst {
                    Some(b) => s.burst(b.limit()),
                    None => s,
                }
            }
        }
    }
}

#[derive(Debug, arbitrary::Arbitrary)]
enum Step {
    /// A few milliseconds: lands on window and bucket edges.
    Tick(u8),
    Advance(u16),
    Jump(u32),
    Back(u16),
    Check(Amount),
    Peek(Amount),
    Refund(Amount),
    Acquire(Amount, Amount),
}

#[derive(Debug, arbitrary::Arbitrary)]
struct Scenario {
    /// One to four limits (fixed size, so that the steps get the rest of the input).
    specs: (Spec, Option<Spec>, Option<Spec>, Option<Spec>),
    steps: Many<Step, 64>,
}

// ----- the model ----------------------------------------------------------------------------

/// One limit's state, as the model keeps it.
#[derive(Debug, Clone)]
enum Model {
    /// The open (or last) window: (end, used).
    Fixed(Option<(u64, u64)>),
    /// Every admitted request still kept: (its bucket's start, cost).
    Sliding(Vec<(u64, u64)>),
    /// Tokens ×`per` at an instant: (instant, tokens·per); `None`: a full bucket.
    Bucket(Option<(u64, i128)>),
}

/// What one limit answers, and its state if the cost is recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Answer {
    admits: bool,
    remaining: u64,
    reset: u64,
    retry: Option<u64>,
}

fn div_ceil(a: i128, b: i128) -> i128 {
    (a + b - 1).div_euclid(b)
}

impl Model {
    fn new(limit: &Limit) -> Self {
        match limit.algorithm() {
            Algorithm::SlidingWindow => Model::Sliding(Vec::new()),
            Algorithm::TokenBucket => Model::Bucket(None),
            _ => Model::Fixed(None),
        }
    }

    /// The answer to `cost` at `now`, and the state after recording it (when admitted).
    fn ask(&self, l: &Limit, cost: u64, now: u64) -> (Answer, Model) {
        let (max, per) = (l.max(), l.per_ms());
        let refused = |remaining, reset, retry| Answer {
            admits: false,
            remaining,
            reset,
            retry,
        };
        let admitted = |remaining, reset| Answer {
            admits: true,
            remaining,
            reset,
            retry: Some(0),
        };
        match self {
            Model::Fixed(window) => {
                let open = window.filter(|&(end, _)| now < end);
                let used = open.map_or(0, |(_, u)| u);
                let remaining = max.saturating_sub(used);
                let idle_end = if l.align() {
                    now - now % per + per
                } else {
                    now
                };
                let reset = open.map_or(idle_end, |(end, _)| end);
                if cost > max {
                    return (refused(remaining, reset, None), self.clone());
                }
                if cost > remaining {
                    return (refused(remaining, reset, Some(reset - now)), self.clone());
                }
                let next = match (open, cost) {
                    (_, 0) => *window,
                    (Some((end, u)), _) => Some((end, u + cost)),
                    (None, _) => Some((
                        if l.align() {
                            now - now % per + per
                        } else {
                            now + per
                        },
                        cost,
                    )),
                };
                let reset = if cost == 0 {
                    reset
                } else {
                    next.map_or(reset, |(end, _)| end)
                };
                (admitted(remaining - cost, reset), Model::Fixed(next))
            }
            Model::Sliding(events) => {
                let counted = |at: u64| -> Vec<(u64, u64)> {
                    events
                        .iter()
                        .copied()
                        .filter(|&(b, _)| b + per > at)
                        .collect()
                };
                let inside = counted(now);
                let used: u128 = inside.iter().map(|&(_, c)| u128::from(c)).sum();
                let remaining = u64::try_from(u128::from(max).saturating_sub(used)).unwrap();
                let reset = inside.iter().map(|&(b, _)| b + per).min().unwrap_or(now);
                if cost > max {
                    return (refused(remaining, reset, None), self.clone());
                }
                if cost > remaining {
                    // The first instant a counted request leaves after which the cost fits.
                    let mut leaves: Vec<u64> = inside.iter().map(|&(b, _)| b + per - now).collect();
                    leaves.sort_unstable();
                    let retry = leaves.into_iter().find(|&t| {
                        let later: u128 = inside
                            .iter()
                            .filter(|&&(b, _)| b + per > now + t)
                            .map(|&(_, c)| u128::from(c))
                            .sum();
                        later + u128::from(cost) <= u128::from(max)
                    });
                    return (refused(remaining, reset, retry), self.clone());
                }
                if cost == 0 {
                    return (admitted(remaining, reset), self.clone());
                }
                let mut next = inside;
                next.push((now - now % l.precision_ms(), cost));
                let reset = next.iter().map(|&(b, _)| b + per).min().unwrap_or(now);
                (admitted(remaining - cost, reset), Model::Sliding(next))
            }
            Model::Bucket(tokens) => {
                let (m, p) = (i128::from(max), i128::from(per));
                let tau = i128::from(l.burst()) * p;
                let ts = tokens.map_or(tau, |(at, t)| {
                    (t + (i128::from(now) - i128::from(at)) * m).min(tau)
                });
                let remaining_of = |ts: i128| u64::try_from(ts.max(0) / p).unwrap();
                let reset_of =
                    |ts: i128| now + u64::try_from(div_ceil(tau - ts, m).max(0)).unwrap();
                if cost > max || cost > l.burst() {
                    return (refused(remaining_of(ts), reset_of(ts), None), self.clone());
                }
                let need = i128::from(cost) * p;
                if need > ts {
                    let wait = u64::try_from(div_ceil(need - ts, m)).unwrap();
                    return (
                        refused(remaining_of(ts), reset_of(ts), Some(wait)),
                        self.clone(),
                    );
                }
                let after = ts - need;
                let next = if cost == 0 {
                    *tokens
                } else {
                    Some((now, after))
                };
                (
                    admitted(remaining_of(after), reset_of(after)),
                    Model::Bucket(next),
                )
            }
        }
    }

    /// The state after giving `cost` back at `now`.
    fn refund(&self, l: &Limit, cost: u64, now: u64) -> Model {
        if cost == 0 {
            return self.clone();
        }
        let per = l.per_ms();
        match self {
            Model::Fixed(Some((end, used))) if now < *end && *used > 0 => {
                Model::Fixed(Some((*end, used.saturating_sub(cost))))
            }
            Model::Sliding(events) if events.iter().any(|&(b, _)| b + per > now) => {
                let mut kept: Vec<(u64, u64)> = events
                    .iter()
                    .copied()
                    .filter(|&(b, _)| b + per > now)
                    .collect();
                kept.sort_by_key(|&(b, _)| b);
                let mut left = cost;
                while left > 0 {
                    let Some(last) = kept.last_mut() else { break };
                    let take = left.min(last.1);
                    last.1 -= take;
                    left -= take;
                    if last.1 == 0 {
                        kept.pop();
                    }
                }
                Model::Sliding(kept)
            }
            Model::Bucket(Some((at, t))) => {
                let (m, p) = (i128::from(l.max()), i128::from(per));
                let tau = i128::from(l.burst()) * p;
                let ts = (t + (i128::from(now) - i128::from(*at)) * m).min(tau);
                if ts >= tau {
                    return self.clone();
                }
                Model::Bucket(Some((now, (ts + i128::from(cost) * p).min(tau))))
            }
            other => other.clone(),
        }
    }
}

/// The model's decision for a check (or peek) of `cost`: per-limit answers, whether allowed,
/// and the states after it (when allowed).
fn model_check(
    limits: &[Limit],
    models: &[Model],
    cost: u64,
    now: u64,
) -> (bool, Vec<Answer>, Vec<Model>) {
    let asked: Vec<(Answer, Model)> = limits
        .iter()
        .zip(models)
        .map(|(l, m)| m.ask(l, cost, now))
        .collect();
    let allowed = asked.iter().all(|(a, _)| a.admits);
    if allowed {
        let (answers, next) = asked.into_iter().unzip();
        return (true, answers, next);
    }
    // Nothing is recorded: limits that would have admitted report their state as it stands.
    let answers = asked
        .into_iter()
        .zip(limits.iter().zip(models))
        .map(|((a, _), (l, m))| if a.admits { m.ask(l, 0, now).0 } else { a })
        .collect();
    (false, answers, models.to_vec())
}

/// The binding limit by the documented rule: denied, the refusing limit with the longest
/// wait (never is longest), ties to the shorter `per`; allowed, the least remaining, ties to
/// the shorter `per`; further ties to the first.
fn binding(limits: &[Limit], answers: &[Answer], allowed: bool) -> usize {
    let mut best = 0;
    for i in 1..answers.len() {
        let (a, b) = (&answers[i], &answers[best]);
        let better = if allowed {
            (a.remaining, limits[i].per_ms()) < (b.remaining, limits[best].per_ms())
        } else {
            let wait = |x: &Answer| x.retry.map_or(u128::MAX, u128::from);
            let key = |x: &Answer, l: &Limit| (x.admits, std::cmp::Reverse(wait(x)), l.per_ms());
            key(a, &limits[i]) < key(b, &limits[best])
        };
        if better {
            best = i;
        }
    }
    best
}

fn agree(d: &Decision, allowed: bool, cost: u64, answers: &[Answer], limits: &[Limit], now: u64) {
    assert_eq!(d.allowed, allowed, "{d:?} vs {answers:?}");
    assert_eq!(d.cost, cost);
    assert_eq!(d.now_ms, now);
    assert_eq!(d.limits().len(), answers.len());
    for (i, (s, a)) in d.limits().iter().zip(answers).enumerate() {
        let core = Answer {
            admits: s.admits,
            remaining: s.remaining,
            reset: s.reset_ms,
            retry: s.retry_after_ms,
        };
        assert_eq!(&core, a, "limit {i} ({:?}) at {now}", limits[i]);
    }
    assert_eq!(
        d.binding_index(),
        binding(limits, answers, allowed),
        "{d:?}"
    );
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

/// Policies of one to four limits driven by arbitrary operations, the core against the model.
#[test]
fn model() {
    let tally = Tally::new("algorithms::model");
    check!().with_test_time(budget()).for_each(|bytes: &[u8]| {
        let Some(scenario) = structured::<Scenario>(bytes) else {
            return;
        };
        let Some(policy) = crate::policy_of(&scenario.specs, Spec::spec) else {
            return; // limits that make no valid policy
        };
        let limits = policy.limits();
        let mut models: Vec<Model> = limits.iter().map(Model::new).collect();
        let mut states: Vec<LimitState> = Vec::new();
        let mut now = T0;
        for step in scenario.steps.iter().take(64) {
            match *step {
                Step::Tick(ms) => now += u64::from(ms % 8),
                Step::Advance(ms) => now += u64::from(ms),
                Step::Jump(ms) => now += u64::from(ms) * 1_000,
                Step::Back(ms) => now -= u64::from(ms % 2_000),
                Step::Check(cost) | Step::Peek(cost) => {
                    let cost = cost.cost();
                    let eval = evaluate::check(&policy, &states, cost, now);
                    let (allowed, answers, next) = model_check(limits, &models, cost, now);
                    agree(&eval.decision, allowed, cost, &answers, limits, now);
                    if !allowed || cost == 0 {
                        assert!(eval.writes.is_none(), "wrote {:?}", eval.writes);
                    }
                    let peek = evaluate::peek(&policy, &states, cost, now);
                    assert_eq!(peek, eval.decision, "a peek is the check's decision");
                    if matches!(step, Step::Check(_)) {
                        apply(&mut states, eval.writes);
                        models = next;
                    }
                }
                Step::Refund(cost) => {
                    let cost = cost.cost();
                    let eval =
                        evaluate::apply(&policy, &states, evaluate::Op::Refund { cost }, now);
                    models = limits
                        .iter()
                        .zip(&models)
                        .map(|(l, m)| m.refund(l, cost, now))
                        .collect();
                    let (_, answers, _) = model_check(limits, &models, 0, now);
                    agree(&eval.decision, true, 0, &answers, limits, now);
                    apply(&mut states, eval.writes);
                }
                Step::Acquire(min, max) => {
                    let (min, max) = (min.cost(), max.cost());
                    let eval = evaluate::apply(
                        &policy,
                        &states,
                        evaluate::Op::Acquire {
                            min,
                            max,
                            holder: 0,
                        },
                        now,
                    );
                    // The most every limit admits now (each one's remaining, capped by its
                    // max), capped by `max`; when even `min` does not fit, a check of `min`.
                    let (_, idle, _) = model_check(limits, &models, 0, now);
                    let grant = idle
                        .iter()
                        .zip(limits)
                        .map(|(a, l)| a.remaining.min(l.max()))
                        .fold(max, u64::min);
                    let cost = if grant >= min && grant > 0 {
                        grant
                    } else {
                        min
                    };
                    let (allowed, answers, next) = model_check(limits, &models, cost, now);
                    agree(&eval.decision, allowed, cost, &answers, limits, now);
                    apply(&mut states, eval.writes);
                    models = next;
                }
            }
        }
        tally.input(true);
    });
}
