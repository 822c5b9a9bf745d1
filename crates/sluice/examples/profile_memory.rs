//! A loop for profilers: `N` checks of one key (token bucket, one limit) through
//! `Limiter::call` with a policy handle resolved once, on the memory store, as the memory
//! benchmark's single-key case does. A second argument picks another way in: `into`,
//! `Limiter::call_into` (answered at once, no future, into a decision kept across checks);
//! `by-name`, `Limiter::check` and the lookup by name.
//!
//! ```sh
//! cargo build --release -p sluice --example profile_memory
//! valgrind --tool=callgrind target/release/examples/profile_memory 1000000
//! ```
//!
//! Instructions per decision = (total − the same run with 0) / N. The first reading of the
//! clock calibrates it against the OS's for a few milliseconds of wall time, so the fixed part
//! varies a little between runs: a large `N` keeps that out of the figure.

use std::future::Future;
use std::hint::black_box;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use sluice::{LimitSpec, Limiter, MemoryStore, Op, Policy};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let n: u64 = match std::env::args().nth(1) {
        Some(a) => a.parse()?,
        None => 1_000_000,
    };
    let mode = std::env::args().nth(2).unwrap_or_default();
    let policy = Policy::from_specs("p", vec![LimitSpec::token_bucket(1_000_000_000, 1_000)])?;
    let limiter = Limiter::new(MemoryStore::new()).with_policy(policy);
    let p = limiter.policy("p").ok_or("no policy p")?.clone();
    let key = String::from("user:1");
    let mut admitted = 0u64;
    let mut d = sluice::Decision::empty(0, 0);
    for _ in 0..n {
        if mode == "into" {
            limiter.call_into(&p, black_box(&key), Op::Check { cost: 1 }, &mut d)?;
            admitted += u64::from(black_box(&d).allowed);
            continue;
        }
        let answer = match mode.as_str() {
            "by-name" => now(limiter.check("p", black_box(&key), 1)),
            _ => now(limiter.call(&p, black_box(&key), Op::Check { cost: 1 })),
        };
        admitted += u64::from(answer.ok_or("the memory store never waits")??.allowed);
    }
    println!("{admitted} of {n} admitted");
    Ok(())
}

/// Polls a future once: `None` if it is not ready.
fn now<T>(f: impl Future<Output = T>) -> Option<T> {
    match pin!(f)
        .as_mut()
        .poll(&mut Context::from_waker(Waker::noop()))
    {
        Poll::Ready(v) => Some(v),
        Poll::Pending => None,
    }
}
