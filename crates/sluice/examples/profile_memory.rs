//! A loop for profilers: `N` checks of one key (token bucket, one limit) through
//! `Limiter::check` on the memory store, as the memory benchmark's single-key case does.
//!
//! ```sh
//! cargo build --release -p sluice --example profile_memory
//! valgrind --tool=callgrind target/release/examples/profile_memory 200000
//! ```
//!
//! Instructions per decision = (total − the same run with 0) / N.

use std::future::Future;
use std::hint::black_box;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use sluice::{LimitSpec, Limiter, MemoryStore, Policy};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let n: u64 = match std::env::args().nth(1) {
        Some(a) => a.parse()?,
        None => 200_000,
    };
    let policy = Policy::from_specs("p", vec![LimitSpec::token_bucket(1_000_000_000, 1_000)])?;
    let limiter = Limiter::new(MemoryStore::new()).with_policy(policy);
    let key = String::from("user:1");
    let mut admitted = 0u64;
    for _ in 0..n {
        let mut f = pin!(limiter.check("p", black_box(&key), 1));
        match f.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
            Poll::Ready(d) => admitted += u64::from(d?.allowed),
            Poll::Pending => return Err("the memory store never waits".into()),
        }
    }
    println!("{admitted} of {n} admitted");
    Ok(())
}
