//! ns per decision of the in-memory store, with governor's keyed limiter measured in the same
//! run as the baseline. `cargo bench -p sluice --bench memory` prints criterion's figures and,
//! at the end, the ratio sluice / governor for each pair.
//!
//! Both sides are driven the same way: a pre-built set of `String` keys, cycled in order, and
//! a rate high enough that every decision is an admission (the common path).

#![allow(clippy::unwrap_used, clippy::expect_used)] // a bench fails loudly by design

use std::future::Future;
use std::hint::black_box;
use std::num::NonZeroU32;
use std::path::{Path, PathBuf};
use std::pin::pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use criterion::{BenchmarkId, Criterion};
use governor::{Quota, RateLimiter};
use sluice::{LimitSpec, Limiter, MemoryStore, Policy};

const MANY_KEYS: usize = 1_000_000;
const RATE: u32 = 1_000_000_000;

/// Polls a future that is ready at once (every memory-store future is).
fn now<T>(f: impl Future<Output = T>) -> T {
    let mut f = pin!(f);
    match f.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(v) => v,
        Poll::Pending => panic!("the memory store never waits"),
    }
}

fn keys(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("user:{i}")).collect()
}

fn sluice_limiter(specs: Vec<LimitSpec>) -> Limiter<MemoryStore> {
    Limiter::new(MemoryStore::new()).with_policy(Policy::from_specs("p", specs).unwrap())
}

fn bench_pair(c: &mut Criterion, group: &str, n_keys: usize) {
    let keys = keys(n_keys);
    let mut g = c.benchmark_group(group);
    let label = if n_keys == 1 {
        "1 key".to_string()
    } else {
        format!("{n_keys} keys")
    };

    let limiter = sluice_limiter(vec![LimitSpec::token_bucket(u64::from(RATE), 1_000)]);
    // Insert every key first, so the measured loop is the steady state.
    for k in &keys {
        now(limiter.check("p", k, 1)).unwrap();
    }
    let mut i = 0;
    g.bench_function(BenchmarkId::new("sluice", &label), |b| {
        b.iter(|| {
            i = (i + 1) % keys.len();
            let d = now(limiter.check("p", black_box(&keys[i]), 1)).unwrap();
            black_box(d.allowed)
        })
    });
    drop(limiter);

    let governor = RateLimiter::keyed(Quota::per_second(NonZeroU32::new(RATE).unwrap()));
    for k in &keys {
        let _ = governor.check_key(k);
    }
    let mut i = 0;
    g.bench_function(BenchmarkId::new("governor", &label), |b| {
        b.iter(|| {
            i = (i + 1) % keys.len();
            black_box(governor.check_key(black_box(&keys[i])).is_ok())
        })
    });
    g.finish();
}

fn bench_three_limit_sliding(c: &mut Criterion, n_keys: usize) {
    let keys = keys(n_keys);
    let mut g = c.benchmark_group("sliding_3_limits");
    let label = if n_keys == 1 {
        "1 key".to_string()
    } else {
        format!("{n_keys} keys")
    };
    let limiter = sluice_limiter(vec![
        LimitSpec::sliding_window(1 << 40, 1_000),
        LimitSpec::sliding_window(1 << 41, 60_000),
        LimitSpec::sliding_window(1 << 42, 3_600_000),
    ]);
    for k in &keys {
        now(limiter.check("p", k, 1)).unwrap();
    }
    let mut i = 0;
    g.bench_function(BenchmarkId::new("sluice", &label), |b| {
        b.iter(|| {
            i = (i + 1) % keys.len();
            black_box(
                now(limiter.check("p", black_box(&keys[i]), 1))
                    .unwrap()
                    .allowed,
            )
        })
    });
    drop(limiter);
    // The nearest governor equivalent: three keyed limiters checked in turn.
    let three: Vec<_> = (0..3)
        .map(|_| RateLimiter::keyed(Quota::per_second(NonZeroU32::new(RATE).unwrap())))
        .collect();
    for k in &keys {
        for l in &three {
            let _ = l.check_key(k);
        }
    }
    let mut i = 0;
    g.bench_function(BenchmarkId::new("governor", &label), |b| {
        b.iter(|| {
            i = (i + 1) % keys.len();
            let k = black_box(&keys[i]);
            black_box(three.iter().all(|l| l.check_key(k).is_ok()))
        })
    });
    g.finish();
}

fn criterion_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/criterion")
}

/// Reads criterion's mean estimate (ns) of one benchmark of this run.
fn mean_ns(group: &str, function: &str, label: &str) -> Option<f64> {
    let dir = criterion_dir()
        .join(group)
        .join(function)
        .join(label)
        .join("new/estimates.json");
    let text = std::fs::read_to_string(&dir).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    v["mean"]["point_estimate"].as_f64()
}

fn main() {
    let mut c = Criterion::default()
        .output_directory(&criterion_dir())
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .configure_from_args();
    bench_pair(&mut c, "token_bucket_1_limit", 1);
    bench_pair(&mut c, "token_bucket_1_limit", MANY_KEYS);
    bench_three_limit_sliding(&mut c, 1);
    bench_three_limit_sliding(&mut c, MANY_KEYS);
    c.final_summary();

    println!("\nsluice / governor (mean ns per decision, this run):");
    for group in ["token_bucket_1_limit", "sliding_3_limits"] {
        for label in ["1 key".to_string(), format!("{MANY_KEYS} keys")] {
            match (
                mean_ns(group, "sluice", &label),
                mean_ns(group, "governor", &label),
            ) {
                (Some(s), Some(g)) => println!(
                    "  {group:<22} {label:<14} sluice {s:>7.1} ns  governor {g:>7.1} ns  ratio {:.2}",
                    s / g
                ),
                _ => println!("  {group:<22} {label:<14} (not measured in this run)"),
            }
        }
    }
}
