//! The rate-limit response headers of a decision, as `(name, value)` pairs.
//!
//! One rendering ([`render`]) shared by the server (docs/api.md#headers) and the tower layer,
//! so both speak the same headers to the byte. Pure functions, no HTTP types: names are
//! lowercase `&'static str` (valid for any HTTP library's `from_static`), values are visible ASCII.
//!
//! - GitHub's set ([`Sets::github`]): `x-ratelimit-limit`, `-remaining`, `-used`, `-reset` (Unix
//!   seconds, rounded up) and `-resource` (the policy name), for the binding limit. The limit
//!   is the most the limit holds at once ([`LimitStatus::capacity`]: `max`, or a token
//!   bucket's `burst`), so `used = limit - remaining` and a fresh key has used 0.
//! - `retry-after` ([`Sets::retry_after`]): in whole seconds (at least 1) on a denied decision that can
//!   ever pass; none when allowed, and none when the cost can never fit.
//! - The IETF draft's set ([`Sets::ietf`], draft-ietf-httpapi-ratelimit-headers): `ratelimit-policy`
//!   and `ratelimit`, Structured Field lists with one item per limit of the policy, named
//!   `"<policy>:<index>"` (see [`item_name`]): `q` (the quota) and `w` (its window, seconds)
//!   in the policy, `r` (remaining, at most `q`) and `t` (seconds until the limit is whole
//!   again, at most `w`) in the state. A window's quota is `max` per `per`; a token bucket's is
//!   its `burst` per the time it takes to refill (`burst · per / max`), the same rate, and the
//!   most a client can spend at once ([`quota_window_ms`]).
//!   A concurrency limit is the draft's third quota unit: `qu="concurrent-requests"` and no
//!   `w` in the policy, no `t` in the state (its units come back when leases are released,
//!   which no clock predicts).
//!
//! ```
//! use sluice::{Decision, LimitSpec, Policy, headers};
//! # use sluice::core::evaluate;
//!
//! let api = Policy::from_specs("api", vec![LimitSpec::fixed_window(10, 1_000)])?;
//! let d: Decision = evaluate::check(&api, &[], 1, 1_700_000_000_000).decision;
//! let all = headers::collect(&api, &d, headers::Sets::ALL);
//! assert_eq!(all[1], ("x-ratelimit-remaining", "9".to_owned()));
//! assert_eq!(all[5], ("ratelimit-policy", "\"api:0\";q=10;w=1".to_owned()));
//! assert_eq!(all[6], ("ratelimit", "\"api:0\";r=9;t=1".to_owned()));
//! # Ok::<(), sluice::LimitError>(())
//! ```

use std::fmt::Write as _;

use sluice_core::{Algorithm, Decision, Degraded, LimitStatus, Policy};

/// One header: a lowercase name and its value.
pub type Header = (&'static str, String);

/// `x-ratelimit-limit`: the binding limit's capacity (`max`, or a token bucket's `burst`).
pub const X_RATELIMIT_LIMIT: &str = "x-ratelimit-limit";
/// `x-ratelimit-remaining`: the binding limit's `remaining`.
pub const X_RATELIMIT_REMAINING: &str = "x-ratelimit-remaining";
/// `x-ratelimit-used`: the binding limit's `capacity - remaining`.
pub const X_RATELIMIT_USED: &str = "x-ratelimit-used";
/// `x-ratelimit-reset`: when the binding limit is whole again, Unix seconds rounded up.
pub const X_RATELIMIT_RESET: &str = "x-ratelimit-reset";
/// `x-ratelimit-resource`: the policy's name.
pub const X_RATELIMIT_RESOURCE: &str = "x-ratelimit-resource";
/// `retry-after`: seconds until a denied cost fits.
pub const RETRY_AFTER: &str = "retry-after";
/// `ratelimit-policy`: the IETF draft's description of every limit.
pub const RATELIMIT_POLICY: &str = "ratelimit-policy";
/// `ratelimit`: the IETF draft's current state of every limit.
pub const RATELIMIT: &str = "ratelimit";

/// Milliseconds to whole seconds, rounded up (a client waiting that long is never early).
pub fn secs_up(ms: u64) -> u64 {
    ms.div_ceil(1_000)
}

/// One of the headers a decision renders to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Field {
    /// `x-ratelimit-limit`.
    Limit,
    /// `x-ratelimit-remaining`.
    Remaining,
    /// `x-ratelimit-used`.
    Used,
    /// `x-ratelimit-reset`.
    Reset,
    /// `x-ratelimit-resource`.
    Resource,
    /// `retry-after`.
    RetryAfter,
    /// `ratelimit-policy`.
    RateLimitPolicy,
    /// `ratelimit`.
    RateLimit,
}

impl Field {
    /// Every field, in rendering order (`Field::ALL[f as usize] == f`).
    pub const ALL: [Field; 8] = [
        Field::Limit,
        Field::Remaining,
        Field::Used,
        Field::Reset,
        Field::Resource,
        Field::RetryAfter,
        Field::RateLimitPolicy,
        Field::RateLimit,
    ];

    /// The header's name, lowercase.
    pub const fn name(self) -> &'static str {
        match self {
            Field::Limit => X_RATELIMIT_LIMIT,
            Field::Remaining => X_RATELIMIT_REMAINING,
            Field::Used => X_RATELIMIT_USED,
            Field::Reset => X_RATELIMIT_RESET,
            Field::Resource => X_RATELIMIT_RESOURCE,
            Field::RetryAfter => RETRY_AFTER,
            Field::RateLimitPolicy => RATELIMIT_POLICY,
            Field::RateLimit => RATELIMIT,
        }
    }
}

/// Which headers [`render`] writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sets {
    /// GitHub's five `x-ratelimit-*` fields.
    pub github: bool,
    /// `retry-after` (only ever written for a denied decision that can pass).
    pub retry_after: bool,
    /// The IETF draft's `ratelimit-policy` and `ratelimit`.
    pub ietf: bool,
}

impl Sets {
    /// Every header, as the server sends them.
    pub const ALL: Sets = Sets {
        github: true,
        retry_after: true,
        ietf: true,
    };
}

/// Writes the headers of `sets` for decision `d` under `policy`, calling `emit(field, value)`
/// for each in [`Field::ALL`] order. Values are rendered into one reused buffer, so a caller
/// that copies them into its own header type allocates nothing else; [`collect`] is this
/// function collecting `String`s.
///
/// Two rules hold for every caller:
///
/// - **One clock.** Every relative number (the IETF `t`) is counted from the instant the
///   decision was made at ([`Decision::now_ms`]: the store's clock, Redis `TIME` under
///   `clock: redis`), never from the caller's clock, so the headers agree with the decision
///   however far the two clocks drift apart.
/// - **No made-up numbers.** A decision let through without any data
///   ([`Degraded::Open`]: the store could not answer and the policy fails open) renders
///   nothing: its numbers (every limit whole) would only mislead a client pacing itself by
///   them. A decision of the local insurance store ([`Degraded::Local`]) renders its own
///   numbers, which are real.
pub fn render(policy: &Policy, d: &Decision, sets: Sets, mut emit: impl FnMut(Field, &str)) {
    if d.degraded == Some(Degraded::Open) {
        return;
    }
    let now_ms = d.now_ms;
    let mut buf = String::with_capacity(64);
    // Writing to a String cannot fail.
    let mut field = |f: Field, write: &dyn Fn(&mut String)| {
        buf.clear();
        write(&mut buf);
        emit(f, &buf);
    };
    if sets.github {
        let b = d.binding();
        field(Field::Limit, &|o| {
            let _ = write!(o, "{}", b.capacity);
        });
        field(Field::Remaining, &|o| {
            let _ = write!(o, "{}", b.remaining);
        });
        field(Field::Used, &|o| {
            let _ = write!(o, "{}", b.used());
        });
        field(Field::Reset, &|o| {
            let _ = write!(o, "{}", secs_up(b.reset_ms));
        });
        field(Field::Resource, &|o| o.push_str(policy.name()));
    }
    if sets.retry_after
        && !d.allowed
        && let Some(ms) = d.retry_after_ms()
    {
        field(Field::RetryAfter, &|o| {
            let _ = write!(o, "{}", secs_up(ms).max(1));
        });
    }
    if sets.ietf {
        field(Field::RateLimitPolicy, &|o| {
            for (i, s) in d.limits().iter().enumerate() {
                if i > 0 {
                    o.push_str(", ");
                }
                push_item_name(o, policy, i);
                if s.algorithm == Algorithm::Concurrency {
                    let _ = write!(o, ";q={};qu=\"concurrent-requests\"", s.max);
                } else {
                    let w = secs_up(quota_window_ms(s)).max(1);
                    let _ = write!(o, ";q={};w={w}", s.capacity);
                }
            }
        });
        field(Field::RateLimit, &|o| {
            for (i, s) in d.limits().iter().enumerate() {
                if i > 0 {
                    o.push_str(", ");
                }
                push_item_name(o, policy, i);
                let _ = write!(o, ";r={}", s.remaining);
                if s.algorithm != Algorithm::Concurrency {
                    let t = secs_up(s.reset_ms.saturating_sub(now_ms));
                    let _ = write!(o, ";t={t}");
                }
            }
        });
    }
}

/// The window of a limit's IETF quota (`w`, before rounding up to whole seconds): `per` for
/// a window; for a token bucket, the time it takes to refill its whole `burst`
/// (`burst · per / max`, rounded up), so that `q = burst` per `w` is the bucket's own rate.
/// Its state's `t` (time until the bucket is full) is never longer.
pub fn quota_window_ms(s: &LimitStatus) -> u64 {
    match s.algorithm {
        Algorithm::TokenBucket if s.max > 0 => {
            let refill =
                (u128::from(s.capacity) * u128::from(s.per_ms)).div_ceil(u128::from(s.max));
            u64::try_from(refill).unwrap_or(u64::MAX)
        }
        _ => s.per_ms,
    }
}

/// [`render`] into `(name, value)` pairs: with [`Sets::ALL`], every header as the server
/// sends them (GitHub's `X-RateLimit-*` set for the binding limit, then `Retry-After` if any,
/// then the IETF draft's `RateLimit-Policy` and `RateLimit` fields, one list item per limit
/// in the policy's order).
pub fn collect(policy: &Policy, d: &Decision, sets: Sets) -> Vec<Header> {
    let mut out = Vec::with_capacity(8);
    render(policy, d, sets, |f, v| out.push((f.name(), v.to_owned())));
    out
}

/// Appends `sf_string(item_name(policy, index))` to `out`.
fn push_item_name(out: &mut String, policy: &Policy, index: usize) {
    out.push('"');
    push_sf_escaped(out, policy.name());
    // Writing to a String cannot fail.
    let _ = write!(out, ":{index}\"");
}

/// Appends `s` with `"` and `\` escaped, as inside a Structured Field String.
fn push_sf_escaped(out: &mut String, s: &str) {
    for c in s.chars() {
        if c == '"' || c == '\\' {
            out.push('\\');
        }
        out.push(c);
    }
}

/// The name of limit `index` of `policy` in the IETF fields, `"<policy>:<index>"` (unquoted),
/// e.g. `api:0`. A problem body's `violated-policies` uses the same names.
pub fn item_name(policy: &Policy, index: usize) -> String {
    format!("{}:{index}", policy.name())
}

/// A Structured Field String (RFC 9651 §3.3.3): quoted, with `"` and `\` escaped.
pub fn sf_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    push_sf_escaped(&mut out, s);
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use sluice_core::{LimitSpec, LimitState, evaluate};

    const NOW: u64 = 1_700_000_000_000;

    fn github(policy: &Policy, d: &Decision) -> Vec<Header> {
        let sets = Sets {
            github: true,
            retry_after: false,
            ietf: false,
        };
        collect(policy, d, sets)
    }

    fn retry_after(d: &Decision) -> Option<Header> {
        let sets = Sets {
            github: false,
            retry_after: true,
            ietf: false,
        };
        let policy = Policy::from_specs("any", vec![LimitSpec::fixed_window(1, 1_000)]).unwrap();
        collect(&policy, d, sets).pop()
    }

    fn all(policy: &Policy, d: &Decision) -> Vec<Header> {
        collect(policy, d, Sets::ALL)
    }

    fn ietf(policy: &Policy, d: &Decision) -> Vec<Header> {
        let sets = Sets {
            github: false,
            retry_after: false,
            ietf: true,
        };
        collect(policy, d, sets)
    }

    fn two_limits() -> Policy {
        Policy::from_specs(
            "api",
            vec![
                LimitSpec::fixed_window(2, 1_000),
                LimitSpec::fixed_window(100, 3_600_000),
            ],
        )
        .unwrap()
    }

    /// Checks `cost` `times` times at `NOW` and returns the last decision.
    fn run(policy: &Policy, cost: u64, times: usize) -> Decision {
        let mut states = vec![LimitState::Empty; policy.limits().len()];
        let mut last = None;
        for _ in 0..times {
            let eval = evaluate::check(policy, &states, cost, NOW);
            if let Some(writes) = eval.writes {
                for (state, write) in states.iter_mut().zip(writes) {
                    if let Some(w) = write {
                        *state = w;
                    }
                }
            }
            last = Some(eval.decision);
        }
        last.unwrap()
    }

    #[test]
    fn allowed_decision_renders_every_set_without_retry_after() {
        let p = two_limits();
        let d = run(&p, 1, 1);
        assert_eq!(
            all(&p, &d),
            vec![
                ("x-ratelimit-limit", "2".to_owned()),
                ("x-ratelimit-remaining", "1".to_owned()),
                ("x-ratelimit-used", "1".to_owned()),
                ("x-ratelimit-reset", "1700000001".to_owned()),
                ("x-ratelimit-resource", "api".to_owned()),
                (
                    "ratelimit-policy",
                    "\"api:0\";q=2;w=1, \"api:1\";q=100;w=3600".to_owned()
                ),
                (
                    "ratelimit",
                    "\"api:0\";r=1;t=1, \"api:1\";r=99;t=3600".to_owned()
                ),
            ]
        );
    }

    #[test]
    fn denied_decision_carries_retry_after_in_whole_seconds() {
        let p = two_limits();
        let d = run(&p, 1, 3);
        assert!(!d.allowed);
        assert_eq!(retry_after(&d), Some(("retry-after", "1".to_owned())));
        let mut later = d.clone();
        later.now_ms = NOW + 400;
        let h = all(&p, &later);
        assert_eq!(h[5], ("retry-after", "1".to_owned()));
        assert_eq!(h[1], ("x-ratelimit-remaining", "0".to_owned()));
        assert_eq!(h[2], ("x-ratelimit-used", "2".to_owned()));
        // 600 ms left in the window round up to 1 s; the hour limit has 3 599.6 s left.
        assert_eq!(
            h[7],
            (
                "ratelimit",
                "\"api:0\";r=0;t=1, \"api:1\";r=98;t=3600".to_owned()
            )
        );
    }

    #[test]
    fn a_cost_that_can_never_fit_has_no_retry_after() {
        let p = two_limits();
        let d = run(&p, 3, 1);
        assert!(!d.allowed);
        assert_eq!(d.retry_after_ms(), None);
        assert_eq!(retry_after(&d), None);
        assert_eq!(all(&p, &d).len(), 7);
    }

    #[test]
    fn sub_second_windows_advertise_one_second() {
        let p = Policy::from_specs("burst", vec![LimitSpec::fixed_window(5, 250)]).unwrap();
        let d = run(&p, 1, 1);
        assert_eq!(ietf(&p, &d)[0].1, "\"burst:0\";q=5;w=1");
        assert_eq!(ietf(&p, &d)[1].1, "\"burst:0\";r=4;t=1");
    }

    #[test]
    fn structured_field_strings_escape_quotes_and_backslashes() {
        assert_eq!(sf_string("a\"b\\c"), "\"a\\\"b\\\\c\"");
        assert_eq!(sf_string("api:0"), "\"api:0\"");
    }

    #[test]
    fn items_are_named_policy_colon_index_as_sf_strings() {
        let p = two_limits();
        let d = run(&p, 1, 1);
        let fields = ietf(&p, &d);
        let (quota, state) = (&fields[0].1, &fields[1].1);
        for (i, item) in quota.split(", ").enumerate() {
            assert!(item.starts_with(&format!("{};", sf_string(&item_name(&p, i)))));
        }
        assert!(state.starts_with("\"api:0\";"));
        assert_eq!(item_name(&p, 1), "api:1");
    }

    #[test]
    fn render_emits_the_chosen_sets_in_field_order() {
        let p = two_limits();
        let d = run(&p, 1, 3);
        let mut seen = Vec::new();
        let sets = Sets {
            github: false,
            retry_after: true,
            ietf: true,
        };
        render(&p, &d, sets, |f, v| seen.push((f, v.to_owned())));
        assert_eq!(
            seen.iter().map(|(f, _)| *f).collect::<Vec<_>>(),
            [Field::RetryAfter, Field::RateLimitPolicy, Field::RateLimit]
        );
        let mut every = Vec::new();
        render(&p, &d, Sets::ALL, |f, v| {
            every.push((f.name(), v.to_owned()))
        });
        assert_eq!(every, all(&p, &d));
        for (i, f) in Field::ALL.iter().enumerate() {
            assert_eq!(Field::ALL[*f as usize], *f);
            assert_eq!(f.name(), every[i].0);
        }
    }

    #[test]
    fn times_count_from_the_decisions_own_instant() {
        let p = two_limits();
        let d = run(&p, 1, 1);
        // The same decision, read 10 s later by a caller whose clock is ahead: `t` still
        // counts from when it was decided.
        let mut later = d.clone();
        later.now_ms = NOW + 10_000;
        assert_eq!(
            ietf(&p, &d)[1].1,
            "\"api:0\";r=1;t=1, \"api:1\";r=99;t=3600"
        );
        assert_eq!(
            ietf(&p, &later)[1].1,
            "\"api:0\";r=1;t=0, \"api:1\";r=99;t=3590"
        );
    }

    #[test]
    fn an_open_decision_renders_nothing_and_a_local_one_its_numbers() {
        let p = two_limits();
        let open = Decision::fail_open(&p, 1, NOW);
        assert_eq!(open.degraded, Some(Degraded::Open));
        assert!(all(&p, &open).is_empty());
        let mut seen = 0;
        render(&p, &open, Sets::ALL, |_, _| seen += 1);
        assert_eq!(seen, 0);
        let local = run(&p, 1, 1).degraded(Degraded::Local);
        assert_eq!(
            all(&p, &local)[1],
            ("x-ratelimit-remaining", "1".to_owned())
        );
    }

    #[test]
    fn a_concurrency_limit_is_the_drafts_concurrent_requests_unit() {
        let p = Policy::from_specs(
            "jobs",
            vec![
                LimitSpec::concurrency(4, 30_000),
                LimitSpec::fixed_window(100, 60_000),
            ],
        )
        .unwrap();
        let d = evaluate::apply(&p, &[], evaluate::Op::Hold { cost: 1, lease: 7 }, NOW).decision;
        assert_eq!(
            ietf(&p, &d),
            vec![
                (
                    "ratelimit-policy",
                    "\"jobs:0\";q=4;qu=\"concurrent-requests\", \"jobs:1\";q=100;w=60".to_owned()
                ),
                (
                    "ratelimit",
                    "\"jobs:0\";r=3, \"jobs:1\";r=99;t=60".to_owned()
                ),
            ]
        );
    }

    #[test]
    fn a_token_bucket_reports_its_burst_over_its_refill_time() {
        // 100 per minute, burst 20: a token every 600 ms, the bucket full again in 12 s.
        let p = Policy::from_specs(
            "uploads",
            vec![LimitSpec::token_bucket(100, 60_000).burst(20)],
        )
        .unwrap();
        let fresh = evaluate::peek(&p, &[], 0, NOW);
        assert_eq!(
            all(&p, &fresh),
            vec![
                ("x-ratelimit-limit", "20".to_owned()),
                ("x-ratelimit-remaining", "20".to_owned()),
                ("x-ratelimit-used", "0".to_owned()),
                ("x-ratelimit-reset", (NOW / 1_000).to_string()),
                ("x-ratelimit-resource", "uploads".to_owned()),
                ("ratelimit-policy", "\"uploads:0\";q=20;w=12".to_owned()),
                ("ratelimit", "\"uploads:0\";r=20;t=0".to_owned()),
            ]
        );
        let d = run(&p, 5, 1);
        assert_eq!(
            github(&p, &d)[1..3],
            [
                ("x-ratelimit-remaining", "15".to_owned()),
                ("x-ratelimit-used", "5".to_owned()),
            ]
        );
        assert_eq!(ietf(&p, &d)[1].1, "\"uploads:0\";r=15;t=3");
        // A burst above max: 3 per second, burst 10, refilled in 3.33 s.
        let p = Policy::from_specs("b", vec![LimitSpec::token_bucket(3, 1_000).burst(10)]).unwrap();
        let d = run(&p, 1, 1);
        assert_eq!(github(&p, &d)[0], ("x-ratelimit-limit", "10".to_owned()));
        assert_eq!(ietf(&p, &d)[0].1, "\"b:0\";q=10;w=4");
        assert_eq!(ietf(&p, &d)[1].1, "\"b:0\";r=9;t=1");
    }

    #[test]
    fn seconds_round_up() {
        assert_eq!(secs_up(0), 0);
        assert_eq!(secs_up(1), 1);
        assert_eq!(secs_up(1_000), 1);
        assert_eq!(secs_up(1_001), 2);
    }
}
