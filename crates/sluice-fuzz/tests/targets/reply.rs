//! The decoder of the Lua function's reply (`sluice_redis`'s codec, through its `fuzzing`
//! feature), and what the server renders from a decoded decision.
//!
//! Properties: any reply tree decodes to a typed error (`StoreError::Backend`, "unexpected
//! reply …") or to a decision, never a panic; it decodes exactly when it has the documented
//! layout (an array of `2 + 4n` integers, `+ 2` for an acquire, with the counts and times
//! non-negative); a decision says what the reply said, limit by limit, and the policy's own
//! limits; the headers and the HTTP body rendered from it never panic.

use axum::http::StatusCode;
use bolero::check;
use redis::Value;
use sluice::{Algorithm, LimitSpec, Op, StoreError};
use sluice_fuzz::{Many, Tally, budget, structured};

/// Integers at the edges of what the decoder converts.
const EDGES: &[i64] = &[
    0,
    1,
    -1,
    2,
    i64::MAX,
    i64::MIN,
    1 << 53,
    (1 << 53) + 1,
    u32::MAX as i64,
    u32::MAX as i64 + 1,
    1_700_000_000_000,
    i64::MAX - 999,
];

#[derive(Debug, Clone, arbitrary::Arbitrary)]
enum Int {
    Edge(u8),
    Small(i8),
    Any(i64),
}

impl Int {
    fn value(&self) -> i64 {
        match self {
            Int::Edge(i) => EDGES[usize::from(*i) % EDGES.len()],
            Int::Small(n) => i64::from(*n),
            Int::Any(n) => *n,
        }
    }
}

/// Any reply tree Redis could send.
#[derive(Debug, arbitrary::Arbitrary)]
enum Tree {
    Nil,
    Int(Int),
    Bulk(Vec<u8>),
    Simple(String),
    Okay,
    Double(f64),
    Boolean(bool),
    Array(Many<Tree, 12>),
    Set(Many<Tree, 4>),
    Map(Many<(Tree, Tree), 4>),
}

impl Tree {
    fn value(&self) -> Value {
        match self {
            Tree::Nil => Value::Nil,
            Tree::Int(n) => Value::Int(n.value()),
            Tree::Bulk(b) => Value::BulkString(b.clone()),
            Tree::Simple(s) => Value::SimpleString(s.clone()),
            Tree::Okay => Value::Okay,
            Tree::Double(f) => Value::Double(*f),
            Tree::Boolean(b) => Value::Boolean(*b),
            Tree::Array(items) => Value::Array(items.iter().map(Tree::value).collect()),
            Tree::Set(items) => Value::Set(items.iter().map(Tree::value).collect()),
            Tree::Map(pairs) => {
                Value::Map(pairs.iter().map(|(k, v)| (k.value(), v.value())).collect())
            }
        }
    }
}

#[derive(Debug, arbitrary::Arbitrary)]
enum Shape {
    /// Any tree.
    Any(Tree),
    /// An array of the expected length (give or take `delta`), of integers, one of them maybe
    /// replaced by another tree.
    Layout {
        ints: Many<Int, 80>,
        delta: i8,
        odd: Option<(u8, Tree)>,
    },
}

#[derive(Debug, arbitrary::Arbitrary)]
enum Spec {
    Fixed { max: u8, per: u16, align: bool },
    Sliding { max: u8, buckets: u8, precision: u8 },
    Bucket { max: u8, per: u16, burst: u8 },
}

impl Spec {
    fn spec(&self) -> LimitSpec {
        match *self {
            Spec::Fixed { max, per, align } => {
                let s = LimitSpec::fixed_window(u64::from(max), u64::from(per));
                if align { s.aligned() } else { s }
            }
            Spec::Sliding {
                max,
                buckets,
                precision,
            } => {
                LimitSpec::sliding_window(u64::from(max), u64::from(buckets) * u64::from(precision))
                    .precision_ms(u64::from(precision))
            }
            Spec::Bucket { max, per, burst } => {
                LimitSpec::token_bucket(u64::from(max), u64::from(per)).burst(u64::from(burst))
            }
        }
    }
}

#[derive(Debug, arbitrary::Arbitrary)]
enum FuzzOp {
    Check(u64),
    Peek(u64),
    Refund(u64),
    Acquire(u64, u64, u64),
}

#[derive(Debug, arbitrary::Arbitrary)]
struct Input {
    specs: (Spec, Option<Spec>, Option<Spec>, Option<Spec>),
    op: FuzzOp,
    shape: Shape,
}

/// What a reply in the documented layout says, or `None` when it is not in it.
struct Said {
    allowed: bool,
    now: u64,
    limits: Vec<(bool, u64, u64, Option<u64>)>,
    taken: Option<(u64, u64)>,
}

/// An array of `ints`, mostly small non-negative values as the script sends (two of each
/// three taken modulo 2^40), one of them maybe replaced by the `odd` tree.
fn layout(ints: impl Iterator<Item = i64>, odd: &Option<(u8, Tree)>) -> Value {
    let mut items: Vec<Value> = ints
        .enumerate()
        .map(|(i, v)| Value::Int(if i % 3 == 0 { v } else { v.rem_euclid(1 << 40) }))
        .collect();
    if let Some((at, tree)) = odd
        && !items.is_empty()
    {
        let i = usize::from(*at) % items.len();
        items[i] = tree.value();
    }
    Value::Array(items)
}

fn said(reply: &Value, limits: usize, acquire: bool) -> Option<Said> {
    let Value::Array(items) = reply else {
        return None;
    };
    if items.len() != 2 + 4 * limits + 2 * usize::from(acquire) {
        return None;
    }
    let mut ints = Vec::with_capacity(items.len());
    for item in items {
        let Value::Int(n) = item else { return None };
        ints.push(*n);
    }
    let count = |n: i64| u64::try_from(n).ok();
    let mut per_limit = Vec::new();
    for f in ints[2..2 + 4 * limits].chunks_exact(4) {
        per_limit.push((f[0] == 1, count(f[1])?, count(f[2])?, count(f[3])));
    }
    let taken = if acquire {
        let n = ints.len();
        Some((count(ints[n - 2])?, count(ints[n - 1])?))
    } else {
        None
    };
    Some(Said {
        allowed: ints[0] == 1,
        now: count(ints[1])?,
        limits: per_limit,
        taken,
    })
}

/// The structured input of `bytes` and the policy of its limits, where they make a valid one.
fn input_and_policy(bytes: &[u8]) -> Option<(Input, sluice::Policy)> {
    let input = structured::<Input>(bytes)?;
    let policy = crate::policy_of(&input.specs, Spec::spec)?;
    Some((input, policy))
}

#[test]
fn decode() {
    let tally = Tally::new("reply::decode");
    check!().with_test_time(budget()).for_each(|bytes: &[u8]| {
        let Some((input, policy)) = input_and_policy(bytes) else {
            return;
        };
        let op = match input.op {
            FuzzOp::Check(cost) => Op::Check { cost },
            FuzzOp::Peek(cost) => Op::Peek { cost },
            FuzzOp::Refund(cost) => Op::Refund { cost },
            FuzzOp::Acquire(min, max, holder) => Op::Acquire { min, max, holder },
        };
        let n = policy.limits().len();
        let acquire = matches!(op, Op::Acquire { .. });
        let reply = match &input.shape {
            Shape::Any(tree) => tree.value(),
            Shape::Layout { ints, delta, odd } => {
                let expected = 2 + 4 * n + 2 * usize::from(acquire);
                let len = expected
                    .saturating_add_signed(isize::from(*delta % 3))
                    .min(64);
                let ints = (0..len).map(|i| ints.get(i % ints.len().max(1)).map_or(0, Int::value));
                layout(ints, odd)
            }
        };
        let decoded = sluice_redis::fuzzing::decode_reply(&reply, &policy, op);
        let expected = said(&reply, n, acquire);
        match (decoded, expected) {
            (Err(StoreError::Backend(m)), None) => {
                assert!(m.contains("unexpected reply from the Sluice script"), "{m}");
                tally.input(false);
            }
            (Ok(d), Some(said)) => {
                assert_eq!(d.allowed, said.allowed);
                assert_eq!(d.now_ms, said.now);
                assert_eq!(d.limits().len(), n);
                assert!(d.binding_index() < n);
                for ((status, limit), (admits, remaining, reset, retry)) in
                    d.limits().iter().zip(policy.limits()).zip(&said.limits)
                {
                    assert_eq!(
                        (status.max, status.capacity, status.per_ms, status.algorithm),
                        (
                            limit.max(),
                            limit.capacity(),
                            limit.per_ms(),
                            limit.algorithm()
                        )
                    );
                    assert_eq!(
                        (
                            status.admits,
                            status.remaining,
                            status.reset_ms,
                            status.retry_after_ms
                        ),
                        (*admits, *remaining, *reset, *retry)
                    );
                    assert!(matches!(
                        status.algorithm,
                        Algorithm::FixedWindow | Algorithm::SlidingWindow | Algorithm::TokenBucket
                    ));
                }
                let cost = match op {
                    Op::Refund { .. } => 0,
                    Op::Acquire { .. } => said.taken.map_or(0, |(taken, _)| taken),
                    other => other.cost(),
                };
                assert_eq!(d.cost, cost);
                if let Some((_, holders)) = said.taken {
                    assert_eq!(u64::from(d.holders), holders.min(u64::from(u32::MAX)));
                }
                // What the server makes of it: headers and the HTTP body.
                let _ = sluice::headers::collect(&policy, &d, sluice::headers::Sets::ALL);
                let response =
                    sluice_server::http::decision_response(StatusCode::OK, &policy, "k", &d);
                assert_ne!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
                tally.input(true);
            }
            (decoded, expected) => panic!(
                "decoded {decoded:?} but the reply is {} the layout: {reply:?}",
                if expected.is_some() { "in" } else { "not in" }
            ),
        }
    });
}

/// The lean path's reply (each limit's state as the script read it), which the core turns into
/// the decision: any reply tree, or an array of integers of any length, gives a typed error
/// ("unexpected reply …") or a decision of the policy's limits, never a panic, whatever state
/// it claims (times at the edges, a count above `max`, a fraction above `max`, buckets out of
/// order); and what the server renders from it never panics either.
#[test]
fn decode_lean() {
    let tally = Tally::new("reply::decode_lean");
    check!().with_test_time(budget()).for_each(|bytes: &[u8]| {
        let Some((input, policy)) = input_and_policy(bytes) else {
            return;
        };
        let op = match input.op {
            FuzzOp::Peek(cost) => Op::Peek { cost },
            FuzzOp::Check(cost) | FuzzOp::Refund(cost) | FuzzOp::Acquire(cost, _, _) => {
                Op::Check { cost }
            }
        };
        let reply = match &input.shape {
            Shape::Any(tree) => tree.value(),
            Shape::Layout { ints, odd, .. } => layout(ints.iter().map(Int::value), odd),
        };
        match sluice_redis::fuzzing::decode_rate_reply(&reply, &policy, op) {
            Ok(d) => {
                assert_eq!(d.limits().len(), policy.limits().len());
                assert!(d.binding_index() < d.limits().len());
                let _ = sluice::headers::collect(&policy, &d, sluice::headers::Sets::ALL);
                let response =
                    sluice_server::http::decision_response(StatusCode::OK, &policy, "k", &d);
                assert_ne!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
                tally.input(true);
            }
            Err(StoreError::Backend(m)) => {
                assert!(m.contains("unexpected reply from the Sluice script"), "{m}");
                tally.input(false);
            }
            Err(e) => panic!("{e:?} for {reply:?}"),
        }
    });
}
