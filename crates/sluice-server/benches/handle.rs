//! Nanoseconds per decision through the server's limiter on the memory store
//! (`Limiter<DecidingStore>`: the store handle dispatched by `match`), and in the same run
//! through the composition it replaced (`Limiter<SharedStore>` over the bare store: one boxed
//! future per call), with `local` off and on. Two more sides locate any difference: the
//! server's `StoreHandle` boxed in a `SharedStore`, and called directly, both on the server's
//! clock (`ServerClock`), as `DecidingStore` is; the "before" side keeps its own clock.
//! Each decision is a `Limiter::call` (a check) polled in place once (the memory store answers at the
//! first poll), so the figures are the limiter and the store alone, without a runtime. The
//! size of each side's future is printed too: the limiter moves its store's future as it makes
//! and polls it, so a large one costs time.
//!
//! `cargo bench -p sluice-server --bench handle` (`SLUICE_BENCH_SECS`, default 2, sets the
//! seconds per round; five rounds alternate the sides, and the fastest round of each counts).
//! The machine is shared: compare the ratios within one run.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a bench fails loudly by design

mod support;

use std::future::Future;
use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice::{Limiter, ManualClock, MemoryStore, Op, Reserving, SharedStore};
use sluice_server::config::Config;
use sluice_server::state::{ServerClock, Shared, StoreHandle};

const T0: u64 = 1_700_000_000_000;
const KEYS: usize = 1_000;
const ROUNDS: usize = 5;
const CHECK: Op = Op::Check { cost: 1 };
/// One side of the comparison: ns per decision over the keys.
type Side<'a> = dyn Fn(&[String]) -> f64 + 'a;

const CONFIG: &str = "policies:\n  api:\n    limits:\n      - { max: 1000000000000, per: 1h }\n";

fn main() {
    let round = support::round(2.0, Duration::from_millis(20));
    let keys: Vec<String> = (0..KEYS).map(|i| format!("user:{i}")).collect();
    println!("ns per check on the memory store, {KEYS} keys in turn, fastest of {ROUNDS} rounds");
    for local in [false, true] {
        let text = if local {
            format!("{CONFIG}local:\n  enabled: true\n")
        } else {
            CONFIG.to_owned()
        };
        let config = Config::parse("bench.yaml", &text).expect("config");
        let store = StoreHandle::Memory(Arc::new(MemoryStore::new()));
        let shared = Shared::new(
            &config,
            store.clone(),
            None,
            ServerClock::new(ManualClock::new(T0)),
        );
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
        // The server's store handle, boxed and direct, on the server's clock as `DecidingStore`
        // is (both without `local`: with it on, they show what the reservation layer costs).
        let clock = || ServerClock::new(ManualClock::new(T0));
        let boxed_handle = Limiter::new(SharedStore::new(store.clone()))
            .with_clock(clock())
            .with_policy(policy.clone());
        let bare_handle = Limiter::new(store.clone())
            .with_clock(clock())
            .with_policy(policy.clone());
        let sides: [(&str, &Side); 4] = [
            ("DecidingStore (now)", &|keys| {
                measure(round, keys, |key| now_limiter.call(&policy, key, CHECK))
            }),
            ("SharedStore (before)", &|keys| {
                measure(round, keys, |key| before_limiter.call(&policy, key, CHECK))
            }),
            ("SharedStore<StoreHandle>", &|keys| {
                measure(round, keys, |key| boxed_handle.call(&policy, key, CHECK))
            }),
            ("StoreHandle", &|keys| {
                measure(round, keys, |key| bare_handle.call(&policy, key, CHECK))
            }),
        ];
        println!(
            "  future bytes: now {}, before {}, SharedStore<StoreHandle> {}, StoreHandle {}",
            std::mem::size_of_val(&now_limiter.call(&policy, "k", CHECK)),
            std::mem::size_of_val(&before_limiter.call(&policy, "k", CHECK)),
            std::mem::size_of_val(&boxed_handle.call(&policy, "k", CHECK)),
            std::mem::size_of_val(&bare_handle.call(&policy, "k", CHECK)),
        );
        let mut best = [f64::MAX; 4];
        for _ in 0..ROUNDS {
            for (i, (_, side)) in sides.iter().enumerate() {
                best[i] = best[i].min(side(&keys));
            }
        }
        let label = if local { "on" } else { "off" };
        for (i, (name, _)) in sides.iter().enumerate() {
            println!(
                "  {label:<5}   {name:<26} {:>8.1} ns   {:>5.2} x before",
                best[i],
                best[i] / best[1]
            );
        }
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
