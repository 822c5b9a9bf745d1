//! The Limiter's own contract: input validation, policy lookup, and each operation through a
//! type-erased store.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use sluice::{
    Decision, Error, LimitSpec, Limiter, ManualClock, MemoryStore, Op, Policy, SharedStore,
};

const T0: u64 = 1_700_000_000_000;
const PEEK: Op = Op::Peek { cost: 0 };

fn limiter() -> (Limiter<SharedStore, ManualClock>, ManualClock) {
    let clock = ManualClock::new(T0);
    let api = Policy::from_specs(
        "api",
        vec![
            LimitSpec::fixed_window(3, 1_000),
            LimitSpec::sliding_window(5, 60_000),
        ],
    )
    .unwrap();
    let limiter = Limiter::new(SharedStore::new(MemoryStore::new()))
        .with_clock(clock.clone())
        .with_policy(api);
    (limiter, clock)
}

#[tokio::test]
async fn bad_input_is_a_typed_error_naming_the_problem() {
    let (l, _) = limiter();
    assert_eq!(
        l.check("nope", "k", 1).await,
        Err(Error::UnknownPolicy("nope".into()))
    );
    assert_eq!(l.check("api", "", 1).await, Err(Error::InvalidKey(0)));
    let long = "k".repeat(513);
    assert_eq!(l.check("api", &long, 1).await, Err(Error::InvalidKey(513)));
    assert!(l.check("api", &"k".repeat(512), 1).await.is_ok());
    let too_much = (1u64 << 53) + 1;
    let e = l.check("api", "k", too_much).await.unwrap_err();
    assert_eq!(e, Error::InvalidCost(too_much));
    assert!(e.to_string().contains("2^53"), "{e}");
    let api = l.policy("api").unwrap();
    assert_eq!(
        l.call(api, "", Op::Refund { cost: 1 }).await,
        Err(Error::InvalidKey(0))
    );
    assert!(l.policy("nope").is_none());
    let acquire = Op::Acquire {
        min: 1,
        max: too_much,
        holder: 0,
    };
    assert_eq!(
        l.call(api, "k", acquire).await,
        Err(Error::InvalidCost(too_much))
    );
    for op in [Op::Hold { cost: 1, lease: 7 }, Op::Release { lease: 7 }] {
        assert_eq!(
            l.call(api, "k", op).await,
            Err(Error::NotConcurrent("api".into()))
        );
    }
    // A cost of 2^53 is valid input; it just can never pass these limits.
    let d = l.check("api", "k", 1 << 53).await.unwrap();
    assert!(!d.allowed);
    assert_eq!(d.retry_after_ms(), None);
}

#[tokio::test]
async fn check_peek_refund_forget_through_a_shared_store() {
    let (l, clock) = limiter();
    let api = l.policy("api").unwrap();
    assert!(l.check("api", "user:1", 2).await.unwrap().allowed);
    let peek = l.call(api, "user:1", Op::Peek { cost: 1 }).await.unwrap();
    assert!(peek.allowed);
    assert_eq!(peek.remaining(), 0, "a peek reports what the check would");
    assert_eq!(
        l.call(api, "user:1", PEEK).await.unwrap().remaining(),
        1,
        "peek recorded nothing"
    );
    let d = l.check("api", "user:1", 2).await.unwrap();
    assert!(!d.allowed);
    assert_eq!(d.retry_after_ms(), Some(1_000));
    let d = l.call(api, "user:1", Op::Refund { cost: 1 }).await.unwrap();
    assert_eq!(d.limits()[0].remaining, 2);
    assert_eq!(d.limits()[1].remaining, 4);
    l.forget(api, "user:1").await.unwrap();
    assert_eq!(
        l.call(api, "user:1", PEEK).await.unwrap().limits()[1].remaining,
        5
    );
    // Time comes from the limiter's clock.
    assert!(l.check("api", "user:1", 3).await.unwrap().allowed);
    assert!(!l.check("api", "user:1", 1).await.unwrap().allowed);
    clock.advance(1_000);
    let d = l.check("api", "user:1", 3).await.unwrap();
    assert!(!d.allowed, "the minute's sliding window still binds");
    assert_eq!(d.limits()[0].remaining, 3);
    assert_eq!(d.binding_index(), 1);
}

#[tokio::test]
async fn policies_are_listed_and_replaceable() {
    let (l, _) = limiter();
    let l = l.with_policy(Policy::from_specs("api", vec![LimitSpec::fixed_window(1, 10)]).unwrap());
    assert_eq!(l.policies().count(), 1);
    assert_eq!(l.policy("api").map(|p| p.limits().len()), Some(1));
}

/// `call_into` decides into a decision the caller keeps: each answer is the whole of what a
/// fresh decision gets, whatever the decision held before (a policy of more limits, a
/// refusal), and bad input leaves it as it was.
#[test]
fn a_kept_decision_holds_each_check_whole() {
    let clock = ManualClock::new(T0);
    let three = Policy::from_specs(
        "three",
        vec![
            LimitSpec::fixed_window(2, 1_000),
            LimitSpec::sliding_window(10, 60_000),
            LimitSpec::token_bucket(5, 60_000),
        ],
    )
    .unwrap();
    let one = Policy::from_specs("one", vec![LimitSpec::token_bucket(3, 1_000)]).unwrap();
    let into = Limiter::new(MemoryStore::new()).with_clock(clock.clone());
    let answered = Limiter::new(MemoryStore::new()).with_clock(clock.clone());
    let mut d = Decision::empty(0, 0);
    let mut seen = [false; 2];
    for step in 0..10u64 {
        let policy = if step % 2 == 0 { &three } else { &one };
        let check = Op::Check { cost: 1 + step % 3 };
        into.call_into(policy, "k", check, &mut d).unwrap();
        let mut whole = Decision::empty(0, 0);
        answered.call_into(policy, "k", check, &mut whole).unwrap();
        assert_eq!(d, whole, "check {step}");
        assert_eq!(d.limits().len(), policy.limits().len(), "check {step}");
        seen[usize::from(d.allowed)] = true;
        clock.advance(100);
    }
    assert_eq!(
        seen, [true; 2],
        "admissions and refusals, each over the other"
    );
    let kept = d.clone();
    assert_eq!(
        into.call_into(&one, "", Op::Check { cost: 1 }, &mut d),
        Err(Error::InvalidKey(0))
    );
    let too_much = (1u64 << 53) + 1;
    assert_eq!(
        into.call_into(&one, "k", Op::Check { cost: too_much }, &mut d),
        Err(Error::InvalidCost(too_much))
    );
    assert_eq!(d, kept, "a refused input leaves the decision as it was");
}

/// A limiter over the memory store answers at once (`call_into`) exactly what its futures
/// answer, for every operation, and refuses the same bad input.
#[tokio::test]
async fn the_memory_store_answers_at_once_what_its_futures_answer() {
    let clock = ManualClock::new(T0);
    let api = Policy::from_specs(
        "api",
        vec![
            LimitSpec::fixed_window(3, 1_000),
            LimitSpec::token_bucket(5, 60_000),
        ],
    )
    .unwrap();
    let at_once = Limiter::new(MemoryStore::new()).with_clock(clock.clone());
    let awaited = Limiter::new(MemoryStore::new()).with_clock(clock.clone());
    let now = |key: &str, op: Op| {
        let mut d = Decision::empty(0, 0);
        at_once.call_into(&api, key, op, &mut d).map(|()| d)
    };
    for step in 0..12u64 {
        let key = if step % 3 == 0 { "a" } else { "b" };
        let mut ops = vec![Op::Check { cost: 1 }, PEEK];
        if step == 7 {
            ops.insert(1, Op::Refund { cost: 2 });
        }
        for op in ops {
            let later = awaited.call(&api, key, op).await;
            assert_eq!(now(key, op), later, "{op:?} at step {step}");
        }
        clock.advance(150);
    }
    assert!(!now("a", Op::Check { cost: 9 }).unwrap().allowed);
    assert_eq!(now("", Op::Check { cost: 1 }), Err(Error::InvalidKey(0)));
    let too_much = (1u64 << 53) + 1;
    assert_eq!(
        now("a", Op::Check { cost: too_much }),
        Err(Error::InvalidCost(too_much))
    );
}
