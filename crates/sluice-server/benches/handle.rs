//! Nanoseconds per decision through the server's limiter on the memory store
//! (`Limiter<DecidingStore>`: the store handle dispatched by `match`, no boxed future), and in
//! the same run through the composition it replaced (`Limiter<SharedStore>`: one boxed future
//! per call), with `local` off and on. Each decision is a `check_policy` polled in place once
//! (the memory store answers at the first poll), so the figures are the limiter and the store
//! alone, without a runtime.
//!
//! `cargo bench -p sluice-server --bench handle` (`SLUICE_BENCH_SECS`, default 2, sets the
//! seconds per round; five rounds alternate the two, and the fastest round of each counts).
//! The machine is shared: compare the ratio within one run.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a bench fails loudly by design

use std::future::Future;
use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice::{Limiter, ManualClock, MemoryStore, Reserving, SharedStore};
use sluice_server::config::Config;
use sluice_server::state::{ServerClock, Shared, StoreHandle};

const T0: u64 = 1_700_000_000_000;
const KEYS: usize = 1_000;
const ROUNDS: usize = 5;
const CONFIG: &str = "policies:\n  api:\n    limits:\n      - { max: 1000000000000, per: 1h }\n";

fn main() {
    let smoke = !std::env::args().any(|a| a == "--bench");
    let secs: f64 = std::env::var("SLUICE_BENCH_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2.0);
    let round = if smoke {
        Duration::from_millis(20)
    } else {
        Duration::from_secs_f64(secs)
    };
    let keys: Vec<String> = (0..KEYS).map(|i| format!("user:{i}")).collect();
    println!(
        "ns per check_policy on the memory store, {KEYS} keys in turn, fastest of {ROUNDS} rounds"
    );
    println!("  local   DecidingStore (now)   SharedStore (before)   now / before");
    for local in [false, true] {
        let text = if local {
            format!("{CONFIG}local:\n  enabled: true\n")
        } else {
            CONFIG.to_owned()
        };
        let config = Config::parse("bench.yaml", &text).expect("config");
        let store = StoreHandle::Memory(Arc::new(MemoryStore::new()));
        let shared = Shared::new(&config, store, None, ServerClock::new(ManualClock::new(T0)));
        let snapshot = shared.snapshot();
        let now_limiter = &snapshot.limiter;
        let policy = now_limiter.policy("api").expect("policy").clone();
        let memory = SharedStore::new(MemoryStore::new());
        let erased = match config.local {
            Some(local) => SharedStore::new(Reserving::new(memory, local)),
            None => memory,
        };
        let before_limiter = Limiter::new(erased)
            .with_clock(ManualClock::new(T0))
            .with_policy(policy.clone());
        let (mut now, mut before) = (f64::MAX, f64::MAX);
        for _ in 0..ROUNDS {
            now = now.min(measure(round, &keys, |key| {
                now_limiter.check_policy(&policy, key, 1)
            }));
            before = before.min(measure(round, &keys, |key| {
                before_limiter.check_policy(&policy, key, 1)
            }));
        }
        println!(
            "  {:<5}   {now:>19.1}   {before:>20.1}   {:>12.2}",
            if local { "on" } else { "off" },
            now / before
        );
    }
}

/// Nanoseconds per decision of `decide` over `keys` in turn, for about `round`.
fn measure<'k, F, O>(
    round: Duration,
    keys: &'k [String],
    mut decide: impl FnMut(&'k str) -> F,
) -> f64
where
    F: Future<Output = O>,
{
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    let started = Instant::now();
    let mut done = 0u64;
    while started.elapsed() < round {
        for key in keys {
            let decision = std::pin::pin!(decide(key));
            assert!(
                black_box(decision.poll(&mut cx)).is_ready(),
                "the memory store answers at once"
            );
        }
        done += keys.len() as u64;
    }
    started.elapsed().as_nanos() as f64 / done as f64
}
