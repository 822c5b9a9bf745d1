//! The Limiter's own contract: input validation, policy lookup, and each operation through a
//! type-erased store.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use sluice::{Decision, Error, LimitSpec, Limiter, ManualClock, MemoryStore, Policy, SharedStore};

const T0: u64 = 1_700_000_000_000;

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
    assert_eq!(l.refund("api", "", 1).await, Err(Error::InvalidKey(0)));
    assert_eq!(
        l.peek("nope", "k", 1).await,
        Err(Error::UnknownPolicy("nope".into()))
    );
    // A cost of 2^53 is valid input; it just can never pass these limits.
    let d = l.check("api", "k", 1 << 53).await.unwrap();
    assert!(!d.allowed);
    assert_eq!(d.retry_after_ms(), None);
}

#[tokio::test]
async fn check_peek_refund_forget_through_a_shared_store() {
    let (l, clock) = limiter();
    assert!(l.check("api", "user:1", 2).await.unwrap().allowed);
    let peek = l.peek("api", "user:1", 1).await.unwrap();
    assert!(peek.allowed);
    assert_eq!(peek.remaining(), 0, "a peek reports what the check would");
    assert_eq!(
        l.peek("api", "user:1", 0).await.unwrap().remaining(),
        1,
        "peek recorded nothing"
    );
    let d = l.check("api", "user:1", 2).await.unwrap();
    assert!(!d.allowed);
    assert_eq!(d.retry_after_ms(), Some(1_000));
    let d = l.refund("api", "user:1", 1).await.unwrap();
    assert_eq!(d.limits()[0].remaining, 2);
    assert_eq!(d.limits()[1].remaining, 4);
    l.forget("api", "user:1").await.unwrap();
    assert_eq!(
        l.peek("api", "user:1", 0).await.unwrap().limits()[1].remaining,
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

/// `check_now_into` decides into a decision the caller keeps: each answer is the whole of
/// `check_now`'s, whatever the decision held before (a policy of more limits, a refusal), and
/// bad input leaves it as it was.
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
    let into = Limiter::new(MemoryStore::new())
        .with_clock(clock.clone())
        .with_policy(three.clone())
        .with_policy(one.clone());
    let answered = Limiter::new(MemoryStore::new())
        .with_clock(clock.clone())
        .with_policy(three.clone())
        .with_policy(one.clone());
    let mut d = Decision::empty(0, 0);
    let mut seen = [false; 2];
    for step in 0..10u64 {
        let policy = if step % 2 == 0 { &three } else { &one };
        let cost = 1 + step % 3;
        into.check_now_into(policy, "k", cost, &mut d).unwrap();
        let whole = answered.check_now(policy, "k", cost).unwrap();
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
        into.check_now_into(&one, "", 1, &mut d),
        Err(Error::InvalidKey(0))
    );
    let too_much = (1u64 << 53) + 1;
    assert_eq!(
        into.check_now_into(&one, "k", too_much, &mut d),
        Err(Error::InvalidCost(too_much))
    );
    assert_eq!(d, kept, "a refused input leaves the decision as it was");
}

/// A limiter over the memory store answers at once (`check_now`, `peek_now`, `refund_now`)
/// exactly what its futures answer, and refuses the same bad input.
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
    let at_once = Limiter::new(MemoryStore::new())
        .with_clock(clock.clone())
        .with_policy(api.clone());
    let awaited = Limiter::new(MemoryStore::new())
        .with_clock(clock.clone())
        .with_policy(api.clone());
    for step in 0..12u64 {
        let key = if step % 3 == 0 { "a" } else { "b" };
        let now = at_once.check_now(&api, key, 1).unwrap();
        let later = awaited.check_policy(&api, key, 1).await.unwrap();
        assert_eq!(now, later, "check {step}");
        if step == 7 {
            let now = at_once.refund_now(&api, key, 2).unwrap();
            assert_eq!(now, awaited.refund_policy(&api, key, 2).await.unwrap());
        }
        let now = at_once.peek_now(&api, key, 0).unwrap();
        assert_eq!(now, awaited.peek_policy(&api, key, 0).await.unwrap());
        clock.advance(150);
    }
    assert!(!at_once.check_now(&api, "a", 9).unwrap().allowed);
    assert_eq!(at_once.check_now(&api, "", 1), Err(Error::InvalidKey(0)));
    let too_much = (1u64 << 53) + 1;
    assert_eq!(
        at_once.check_now(&api, "a", too_much),
        Err(Error::InvalidCost(too_much))
    );
}
