//! Unit tests at the boundaries of each algorithm (docs/algorithms.md).

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod support;

use sluice_core::{Algorithm, LimitSpec, LimitState, SlidingWindowState};
use support::{Key, T0};

// ----- fixed window -------------------------------------------------------------------------

#[test]
fn fixed_window_opens_at_first_admission_and_stores_reset() {
    let mut k = Key::one(LimitSpec::fixed_window(3, 1_000));
    let d = k.check(1, T0 + 123);
    assert!(d.allowed);
    assert_eq!(
        (d.remaining(), d.reset_ms(), d.retry_after_ms()),
        (2, T0 + 1_123, Some(0))
    );
    let d = k.check(1, T0 + 900);
    assert_eq!((d.remaining(), d.reset_ms()), (1, T0 + 1_123));
}

#[test]
fn fixed_window_cost_that_fits_exactly_then_one_more() {
    let mut k = Key::one(LimitSpec::fixed_window(5, 1_000));
    let d = k.check(5, T0);
    assert!(d.allowed);
    assert_eq!(d.remaining(), 0);
    let d = k.check(1, T0 + 10);
    assert!(!d.allowed);
    assert_eq!(
        (d.remaining(), d.reset_ms(), d.retry_after_ms()),
        (0, T0 + 1_000, Some(990))
    );
}

#[test]
fn fixed_window_is_closed_exactly_at_reset() {
    let mut k = Key::one(LimitSpec::fixed_window(2, 1_000));
    k.check(2, T0);
    let d = k.check(1, T0 + 999);
    assert!(!d.allowed);
    assert_eq!(d.retry_after_ms(), Some(1));
    // now == reset: the stored window is closed even though the state still holds it.
    let d = k.check(1, T0 + 1_000);
    assert!(d.allowed);
    assert_eq!((d.remaining(), d.reset_ms()), (1, T0 + 2_000));
}

#[test]
fn cost_zero_records_nothing_and_opens_no_window() {
    let mut k = Key::one(LimitSpec::fixed_window(2, 1_000));
    let d = k.check(0, T0);
    assert!(d.allowed);
    assert_eq!((d.remaining(), d.reset_ms()), (2, T0));
    assert!(k.states.is_empty(), "cost 0 wrote {:?}", k.states);
    k.check(2, T0 + 5);
    // cost 0 on a full window is allowed and reports the state.
    let d = k.check(0, T0 + 6);
    assert!(d.allowed);
    assert_eq!(
        (d.remaining(), d.reset_ms(), d.retry_after_ms()),
        (0, T0 + 1_005, Some(0))
    );
}

#[test]
fn cost_above_max_can_never_pass() {
    for spec in [
        LimitSpec::fixed_window(10, 1_000),
        LimitSpec::sliding_window(10, 1_000),
        LimitSpec::token_bucket(10, 1_000),
        LimitSpec::token_bucket(10, 1_000).burst(50),
    ] {
        let mut k = Key::one(spec.clone());
        let d = k.check(11, T0);
        assert!(!d.allowed, "{spec:?}");
        assert_eq!(d.retry_after_ms(), None, "{spec:?}");
        let full = spec.burst.unwrap_or(10);
        assert_eq!(
            d.remaining(),
            full,
            "{spec:?}: a bucket's remaining counts up to burst"
        );
        assert!(k.states.is_empty());
    }
}

#[test]
fn aligned_fixed_window_uses_epoch_multiples() {
    let mut k = Key::one(LimitSpec::fixed_window(2, 60_000).aligned());
    let start = 28_333_333 * 60_000; // a minute boundary
    // Before anything is counted the aligned window still has an end.
    assert_eq!(k.peek(0, start + 59_000).reset_ms(), start + 60_000);
    let d = k.check(2, start + 59_000);
    assert_eq!(d.reset_ms(), start + 60_000);
    let d = k.check(1, start + 59_999);
    assert!(!d.allowed);
    assert_eq!(d.retry_after_ms(), Some(1));
    let d = k.check(1, start + 60_000);
    assert!(d.allowed);
    assert_eq!((d.remaining(), d.reset_ms()), (1, start + 120_000));
}

#[test]
fn refund_beyond_used_stops_at_zero() {
    let mut k = Key::one(LimitSpec::fixed_window(10, 1_000));
    k.check(3, T0);
    let d = k.refund(5, T0 + 1);
    assert!(d.allowed);
    assert_eq!(d.remaining(), 10);
    let d = k.check(10, T0 + 2);
    assert!(d.allowed, "a refunded window admits max again");
    // A refund after the window closed changes nothing.
    k.refund(4, T0 + 1_000);
    assert_eq!(k.peek(0, T0 + 999).remaining(), 0);
}

// ----- sliding window -----------------------------------------------------------------------

#[test]
fn sliding_window_counts_buckets_within_per_and_rolls_over() {
    // 4 per second, buckets of 250 ms.
    let mut k = Key::one(LimitSpec::sliding_window(4, 1_000).precision_ms(250));
    let b = T0; // T0 is a multiple of 250
    assert!(k.check(1, b + 10).allowed); // bucket b
    assert!(k.check(2, b + 260).allowed); // bucket b+250
    assert!(k.check(1, b + 990).allowed); // bucket b+750
    let d = k.check(1, b + 999);
    assert!(!d.allowed);
    // reset: the oldest counted bucket (b) leaves at b + 1000.
    assert_eq!(d.reset_ms(), b + 1_000);
    assert_eq!(d.retry_after_ms(), Some(1));
    // At b + 1000 bucket b leaves (start must be > now - per): one unit frees.
    let d = k.check(1, b + 1_000);
    assert!(d.allowed);
    assert_eq!((d.remaining(), d.reset_ms()), (0, b + 1_250));
    // A cost of 3 needs bucket b+250 (2 units) and b+750 (1 unit) gone: at b+1750.
    let d = k.check(3, b + 1_001);
    assert!(!d.allowed);
    assert_eq!(d.retry_after_ms(), Some(b + 1_750 - (b + 1_001)));
    let d = k.check(3, b + 1_750);
    assert!(d.allowed);
}

#[test]
fn sliding_window_drops_old_buckets_when_writing() {
    let mut k = Key::one(LimitSpec::sliding_window(10, 1_000).precision_ms(100));
    k.check(1, T0);
    k.check(1, T0 + 500);
    k.check(1, T0 + 1_200);
    assert_eq!(
        k.states,
        vec![LimitState::SlidingWindow(SlidingWindowState {
            buckets: vec![(T0 + 500, 1), (T0 + 1_200, 1)]
        })]
    );
    assert_eq!(k.peek(0, T0 + 1_200).remaining(), 8);
}

#[test]
fn sliding_window_refund_takes_newest_first() {
    let mut k = Key::one(LimitSpec::sliding_window(10, 1_000).precision_ms(100));
    k.check(2, T0);
    k.check(3, T0 + 500);
    k.refund(4, T0 + 600);
    assert_eq!(
        k.states,
        vec![LimitState::SlidingWindow(SlidingWindowState {
            buckets: vec![(T0, 1)]
        })]
    );
    k.refund(4, T0 + 600);
    assert_eq!(k.peek(0, T0 + 600).remaining(), 10);
}

#[test]
fn sliding_window_empty_reports_full_and_now() {
    let k = Key::one(LimitSpec::sliding_window(10, 60_000));
    let d = k.peek(0, T0 + 17);
    assert_eq!(
        (d.remaining(), d.reset_ms(), d.retry_after_ms()),
        (10, T0 + 17, Some(0))
    );
}

// ----- token bucket -------------------------------------------------------------------------

#[test]
fn token_bucket_burst_then_even_refill() {
    // 10 per second (one token per 100 ms), bucket of 3.
    let mut k = Key::one(LimitSpec::token_bucket(10, 1_000).burst(3));
    for i in 0..3 {
        let d = k.check(1, T0);
        assert!(d.allowed, "burst token {i}");
    }
    let d = k.check(1, T0);
    assert!(!d.allowed);
    assert_eq!(d.retry_after_ms(), Some(100));
    assert_eq!(d.reset_ms(), T0 + 300, "full again after 3 tokens' time");
    assert!(!k.check(1, T0 + 99).allowed);
    let d = k.check(1, T0 + 100);
    assert!(d.allowed);
    assert_eq!(d.remaining(), 0);
    // A cost of 2 waits for two tokens.
    let d = k.check(2, T0 + 150);
    assert_eq!(d.retry_after_ms(), Some(150));
    assert!(k.check(2, T0 + 300).allowed);
}

#[test]
fn token_bucket_fractional_interval_is_exact() {
    // 3 per second: a token every 333.33 ms. Over 30 s exactly 3 + 90 tokens pass.
    let mut k = Key::one(LimitSpec::token_bucket(3, 1_000));
    let mut admitted = 0;
    for ms in 0..=30_000 {
        if k.check(1, T0 + ms).allowed {
            admitted += 1;
        }
    }
    assert_eq!(admitted, 93);
}

#[test]
fn token_bucket_reset_is_when_full_and_retry_rounds_up() {
    let mut k = Key::one(LimitSpec::token_bucket(3, 1_000));
    let d = k.check(1, T0);
    assert_eq!((d.remaining(), d.reset_ms()), (2, T0 + 334)); // 333.33 rounded up
    k.check(2, T0);
    let d = k.check(1, T0 + 1);
    assert_eq!(d.retry_after_ms(), Some(333)); // fits at 333.33 -> 334 ms, minus 1
    let d = k.peek(0, T0 + 1_000);
    assert_eq!((d.remaining(), d.reset_ms()), (3, T0 + 1_000));
}

#[test]
fn token_bucket_refund_never_overfills() {
    let mut k = Key::one(LimitSpec::token_bucket(10, 1_000));
    k.check(4, T0);
    assert_eq!(k.refund(2, T0).remaining(), 8);
    assert_eq!(k.refund(100, T0).remaining(), 10);
    assert_eq!(k.check(10, T0).remaining(), 0);
}

#[test]
fn token_bucket_huge_rates_stay_exact() {
    // 2^53 per second with a burst of 2^53: nothing overflows, remaining is exact.
    let max = 1u64 << 53;
    let mut k = Key::one(LimitSpec::token_bucket(max, 1_000));
    let d = k.check(max - 1, T0);
    assert!(d.allowed);
    assert_eq!(d.remaining(), 1);
    let d = k.peek(0, T0 + 500);
    assert_eq!(d.remaining(), 1 + max / 2);
}

// ----- policies -----------------------------------------------------------------------------

#[test]
fn all_or_nothing_records_nothing_when_one_limit_refuses() {
    let mut k = Key::new(vec![
        LimitSpec::fixed_window(10, 1_000),
        LimitSpec::fixed_window(3, 60_000),
    ]);
    assert!(k.check(3, T0).allowed);
    let before = k.states.clone();
    let d = k.check(1, T0 + 1);
    assert!(!d.allowed);
    assert_eq!(k.states, before, "a denied check changes nothing");
    // The admitting limit reports its state without the cost; the refusing one binds.
    assert_eq!(d.limits()[0].remaining, 7);
    assert_eq!(d.limits()[0].retry_after_ms, Some(0));
    assert!(d.limits()[0].admits);
    assert_eq!(d.binding_index(), 1);
    assert_eq!(d.retry_after_ms(), Some(59_999));
}

#[test]
fn binding_when_allowed_is_least_remaining_ties_to_shorter_per() {
    let mut k = Key::new(vec![
        LimitSpec::fixed_window(100, 60_000),
        LimitSpec::fixed_window(10, 1_000),
        LimitSpec::fixed_window(5, 3_600_000),
    ]);
    let d = k.check(1, T0);
    assert_eq!(d.binding_index(), 2); // 4 remaining
    let mut k = Key::new(vec![
        LimitSpec::fixed_window(5, 60_000),
        LimitSpec::fixed_window(5, 1_000),
    ]);
    assert_eq!(k.check(1, T0).binding_index(), 1);
}

#[test]
fn binding_when_denied_is_largest_retry_after_never_fits_wins() {
    let mut k = Key::new(vec![
        LimitSpec::fixed_window(2, 1_000),
        LimitSpec::fixed_window(3, 60_000),
    ]);
    k.check(2, T0);
    let d = k.check(2, T0 + 1);
    assert_eq!(d.limits()[0].retry_after_ms, Some(999));
    assert_eq!(d.limits()[1].retry_after_ms, Some(59_999));
    assert_eq!(d.binding_index(), 1);

    let mut k = Key::new(vec![
        LimitSpec::fixed_window(10, 60_000),
        LimitSpec::token_bucket(5, 1_000),
    ]);
    assert!(k.check(5, T0).allowed);
    let d = k.check(6, T0 + 1); // the window refuses with a wait, the bucket never fits
    assert_eq!(d.limits()[0].retry_after_ms, Some(59_999));
    assert_eq!(d.binding_index(), 1);
    assert_eq!(d.retry_after_ms(), None);
    assert_eq!(d.limits()[1].algorithm, Algorithm::TokenBucket);
}
