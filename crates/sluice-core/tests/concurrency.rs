//! The concurrency algorithm (docs/algorithms.md#concurrency) at its edges: leases held,
//! refused, released, renewed and lapsed, alone and with a rate limit of the same policy.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly by design

mod support;

use sluice_core::evaluate::{self, Op};
use sluice_core::{Decision, LimitSpec, LimitState, Policy};
use support::{Key, T0};

#[test]
fn at_most_max_leases_are_held_and_a_release_frees_one() {
    let mut k = Key::new(vec![LimitSpec::concurrency(3, 30_000)]);
    for id in 1..=3 {
        let d = k.hold(id, 1, T0);
        assert!(d.allowed, "lease {id}");
        assert_eq!(d.remaining(), 3 - id);
        assert_eq!(d.reset_ms(), T0 + 30_000);
    }
    let refused = k.hold(4, 1, T0 + 5);
    assert!(!refused.allowed);
    assert_eq!(refused.remaining(), 0);
    // Until the first lease lapses, if none is released before.
    assert_eq!(refused.retry_after_ms(), Some(30_000 - 5));

    let freed = k.release(2, T0 + 10);
    assert!(freed.allowed);
    assert_eq!((freed.cost, freed.remaining()), (1, 1));
    assert!(k.hold(4, 1, T0 + 11).allowed);
    // A second release of the same lease frees nothing.
    assert_eq!(k.release(2, T0 + 12).cost, 0);
    assert!(!k.hold(5, 1, T0 + 13).allowed);
}

/// The worked example of docs/algorithms.md#concurrency, row by row.
#[test]
fn the_worked_example_of_the_algorithms_doc() {
    let mut k = Key::new(vec![LimitSpec::concurrency(2, 30_000)]);
    let s = |n: u64| T0 + n * 1_000;
    let row = |d: &Decision| (d.allowed, d.remaining(), d.reset_ms(), d.retry_after_ms());
    let (a, b, c, d) = (1, 2, 3, 4);
    assert_eq!(row(&k.hold(a, 1, s(0))), (true, 1, s(30), Some(0)));
    assert_eq!(row(&k.hold(b, 1, s(5))), (true, 0, s(35), Some(0)));
    assert_eq!(row(&k.hold(c, 1, s(6))), (false, 0, s(35), Some(24_000)));
    let freed = k.release(a, s(7));
    assert_eq!(
        (freed.cost, freed.remaining(), freed.reset_ms()),
        (1, 1, s(35))
    );
    assert_eq!(row(&k.hold(c, 1, s(8))), (true, 0, s(38), Some(0)));
    assert_eq!(row(&k.hold(d, 2, s(40))), (true, 0, s(70), Some(0)));
}

#[test]
fn a_lease_that_is_never_released_lapses_after_its_ttl() {
    let mut k = Key::new(vec![LimitSpec::concurrency(1, 1_000)]);
    assert!(k.hold(1, 1, T0).allowed);
    assert!(!k.hold(2, 1, T0 + 999).allowed);
    let d = k.hold(2, 1, T0 + 1_000);
    assert!(d.allowed, "lease 1 lapsed at T0 + 1000");
    // The lapsed lease is gone: releasing it now frees nothing and keeps lease 2.
    assert_eq!(k.release(1, T0 + 1_001).cost, 0);
    assert!(!k.hold(3, 1, T0 + 1_002).allowed);
    let LimitState::Concurrency(s) = &k.states[0] else {
        panic!("state {:?}", k.states[0]);
    };
    assert_eq!(s.leases.len(), 1, "the write dropped the lapsed lease");
    assert_eq!(evaluate::expires_at(&k.policy, &k.states), Some(T0 + 2_000));
}

#[test]
fn taking_a_held_lease_again_renews_it_without_counting_it_twice() {
    let mut k = Key::new(vec![LimitSpec::concurrency(2, 1_000)]);
    assert!(k.hold(1, 1, T0).allowed);
    let renewed = k.hold(1, 2, T0 + 900);
    assert!(
        renewed.allowed,
        "lease 1's own unit does not count against it"
    );
    assert_eq!(renewed.remaining(), 0);
    assert_eq!(renewed.reset_ms(), T0 + 1_900);
    // Still held past the first expiry.
    assert!(!k.hold(2, 1, T0 + 1_500).allowed);
    assert_eq!(k.release(1, T0 + 1_600).cost, 2);
}

#[test]
fn a_renewal_is_not_counted_again_by_the_rate_limits() {
    let mut k = Key::new(vec![
        LimitSpec::concurrency(2, 1_000),
        LimitSpec::fixed_window(3, 60_000),
    ]);
    assert_eq!(k.hold(1, 1, T0).limits()[1].remaining, 2);
    for i in 1..=5 {
        let renewed = k.hold(1, 1, T0 + i * 500);
        assert!(renewed.allowed, "renewal {i}");
        assert_eq!(
            renewed.limits()[1].remaining,
            2,
            "renewal {i} was not charged"
        );
        assert_eq!(renewed.limits()[0].reset_ms, T0 + i * 500 + 1_000);
    }
    // Once it has lapsed, the same id is a new lease, and a new request.
    assert_eq!(k.hold(1, 1, T0 + 5_000).limits()[1].remaining, 1);
    // A renewal the concurrency limit refuses keeps the lease as it was.
    assert!(k.hold(2, 1, T0 + 5_001).allowed);
    let grown = k.hold(1, 2, T0 + 5_002);
    assert!(!grown.allowed);
    assert_eq!(k.release(1, T0 + 5_003).cost, 1);
}

#[test]
fn costs_are_units_and_retry_after_waits_for_enough_leases_to_lapse() {
    let mut k = Key::new(vec![LimitSpec::concurrency(10, 1_000)]);
    assert!(k.hold(1, 4, T0).allowed);
    assert!(k.hold(2, 4, T0 + 100).allowed);
    let d = k.hold(3, 6, T0 + 200);
    assert!(!d.allowed);
    assert_eq!(d.remaining(), 2);
    // Lease 1 lapsing leaves 6 free at T0 + 1000.
    assert_eq!(d.retry_after_ms(), Some(800));
    let never = k.hold(3, 11, T0 + 200);
    assert_eq!(never.retry_after_ms(), None, "a cost above max never fits");
}

#[test]
fn a_check_consults_the_limit_without_holding() {
    let mut k = Key::new(vec![LimitSpec::concurrency(1, 1_000)]);
    for _ in 0..3 {
        let d = k.op(Op::Check { cost: 1 }, T0);
        assert!(d.allowed);
        assert_eq!(d.remaining(), 1, "nothing is held");
    }
    assert!(k.hold(1, 1, T0).allowed);
    assert!(!k.op(Op::Check { cost: 1 }, T0 + 1).allowed);
    // A refund is not a release.
    k.op(Op::Refund { cost: 1 }, T0 + 2);
    assert!(!k.op(Op::Check { cost: 1 }, T0 + 3).allowed);
}

#[test]
fn a_hold_is_all_or_nothing_with_the_rate_limits_of_its_policy() {
    let mut k = Key::new(vec![
        LimitSpec::concurrency(2, 60_000),
        LimitSpec::fixed_window(3, 1_000),
    ]);
    assert!(k.hold(1, 1, T0).allowed);
    assert!(k.release(1, T0 + 1).allowed);
    assert!(k.hold(2, 1, T0 + 2).allowed);
    assert!(k.hold(3, 1, T0 + 3).allowed);
    // The concurrency limit is full: the rate limit is not charged.
    let full = k.hold(4, 1, T0 + 4);
    assert!(!full.allowed);
    assert_eq!(
        full.limits()[1].remaining,
        0,
        "3 holds counted, none refused"
    );
    assert_eq!(k.release(2, T0 + 5).cost, 1);
    assert_eq!(
        k.release(2, T0 + 5).limits()[1].remaining,
        0,
        "a release refunds nothing"
    );
    // Room for a lease, but the window is spent: the lease is not taken.
    let spent = k.hold(4, 1, T0 + 6);
    assert!(!spent.allowed);
    assert_eq!(spent.limits()[0].remaining, 1);
    assert_eq!(spent.retry_after_ms(), Some(1_000 - 6));
    assert!(k.hold(4, 1, T0 + 1_000).allowed, "a new window");
    assert_eq!(k.release(4, T0 + 1_001).cost, 1);
}

#[test]
fn a_policy_holds_at_most_one_concurrency_limit() {
    let err = Policy::from_specs(
        "p",
        vec![
            LimitSpec::concurrency(2, 1_000),
            LimitSpec::concurrency(5, 60_000),
        ],
    )
    .unwrap_err();
    assert_eq!(err.field, "limits[1]");
    assert!(err.reason.contains("at most one"), "{err}");
    let err = LimitSpec::concurrency(2, 1_000)
        .burst(3)
        .build()
        .unwrap_err();
    assert_eq!(err.field, "burst");
}

#[test]
fn hold_of_zero_reports_without_taking() {
    let mut k = Key::new(vec![LimitSpec::concurrency(1, 1_000)]);
    let d = k.hold(1, 0, T0);
    assert!(d.allowed);
    assert_eq!(d.remaining(), 1);
    assert!(k.hold(2, 1, T0).allowed);
    assert_eq!(k.release(1, T0).cost, 0);
}
