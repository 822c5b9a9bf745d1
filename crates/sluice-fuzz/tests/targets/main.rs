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
