//! Every fuzz target of Sluice, in one test binary (one link of the server instead of one per
//! target). Each `#[test]` replays its committed corpus, then runs random inputs for
//! `sluice_fuzz::budget()`; see the crate documentation for what each target holds and
//! docs/security.md#fuzzing for the long runs.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a fuzz target fails loudly by design

mod algorithms;

mod config;
mod http;
mod reply;
mod rls;

/// One to four limit shapes (a fixed-size tuple, so that the rest of a fuzz input goes to
/// what follows) as a policy named `p`; `None` when the limits make no valid policy (e.g. two
/// limits counting one window).
pub(crate) fn policy_of<S>(
    specs: &(S, Option<S>, Option<S>, Option<S>),
    spec: impl Fn(&S) -> sluice::LimitSpec,
) -> Option<sluice::Policy> {
    let (a, b, c, d) = specs;
    let specs = [Some(a), b.as_ref(), c.as_ref(), d.as_ref()]
        .into_iter()
        .flatten()
        .map(spec)
        .collect();
    sluice::Policy::from_specs("p", specs).ok()
}
