//! ns per decision of the in-memory store, with governor's keyed limiter measured in the same
//! run as the baseline. `cargo bench -p sluice --bench memory` prints criterion's figures and,
//! at the end, the ratio sluice / governor for each pair.
//!
//! Both sides are driven the same way: a pre-built set of `String` keys, cycled in order, and
//! a rate high enough that every decision is an admission (the common path). Sluice is called
//! as an application holding its policy does, with a handle resolved once by `Limiter::policy`:
//! `Limiter::call_into` (the memory store answers at once, like governor, into a decision the
//! caller keeps) and `Limiter::call` (the future every store has); one more row measures
//! `Limiter::check` by name.
//!
//! The machine these run on is shared, so besides criterion's estimate the ratios are also
//! given from each benchmark's fastest sample (ns per iteration), the one least disturbed by
//! other processes.

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
use sluice::{Decision, LimitSpec, Limiter, MemoryStore, Op, Policy};

/// The limiter, the policy handle an application keeps, and the keys.
type SluiceState = (Limiter<MemoryStore>, Policy, Vec<String>);

const MANY_KEYS: usize = 1_000_000;
const RATE: u32 = 1_000_000_000;
const CHECK: Op = Op::Check { cost: 1 };

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

fn label(n_keys: usize) -> String {
    if n_keys == 1 {
        "1 key".to_string()
    } else {
        format!("{n_keys} keys")
    }
}

/// Runs `routine` over a state built on first use only (criterion calls a benchmark's closure
/// once per sample, and not at all when the benchmark is filtered out or only listed).
fn lazily<T>(setup: impl Fn() -> T) -> impl FnMut() -> std::rc::Rc<T> {
    let mut state: Option<std::rc::Rc<T>> = None;
    move || {
        state
            .get_or_insert_with(|| std::rc::Rc::new(setup()))
            .clone()
    }
}

fn sluice_setup(specs: Vec<LimitSpec>, n_keys: usize) -> SluiceState {
    let keys = keys(n_keys);
    let limiter = sluice_limiter(specs);
    let policy = limiter.policy("p").unwrap().clone();
    // Insert every key first, so the measured loop is the steady state.
    for k in &keys {
        now(limiter.call(&policy, k, CHECK)).unwrap();
    }
    (limiter, policy, keys)
}

fn governor_setup(limiters: usize, n_keys: usize) -> (Vec<Governor>, Vec<String>) {
    let keys = keys(n_keys);
    let limiters: Vec<Governor> = (0..limiters)
        .map(|_| RateLimiter::keyed(Quota::per_second(NonZeroU32::new(RATE).unwrap())))
        .collect();
    for k in &keys {
        for l in &limiters {
            let _ = l.check_key(k);
        }
    }
    (limiters, keys)
}

type Governor = governor::DefaultKeyedRateLimiter<String>;

fn bench_group(c: &mut Criterion, group: &str, specs: Vec<LimitSpec>, n_keys: usize) {
    let mut g = c.benchmark_group(group);
    let n_limits = specs.len();
    let mut sluice = lazily(move || sluice_setup(specs.clone(), n_keys));
    g.bench_function(BenchmarkId::new("sluice into", label(n_keys)), |b| {
        let state = sluice();
        let (limiter, policy, keys) = &*state;
        let mut d = Decision::empty(0, 0);
        let mut i = 0;
        b.iter(|| {
            i = (i + 1) % keys.len();
            limiter
                .call_into(policy, black_box(&keys[i]), CHECK, &mut d)
                .unwrap();
            black_box(black_box(&d).allowed)
        })
    });
    g.bench_function(BenchmarkId::new("sluice", label(n_keys)), |b| {
        let state = sluice();
        let (limiter, policy, keys) = &*state;
        let mut i = 0;
        b.iter(|| {
            i = (i + 1) % keys.len();
            black_box(
                now(limiter.call(policy, black_box(&keys[i]), CHECK))
                    .unwrap()
                    .allowed,
            )
        })
    });
    if n_keys == 1 {
        // The convenience: the policy looked up by name on every call.
        g.bench_function(BenchmarkId::new("sluice by name", label(n_keys)), |b| {
            let state = sluice();
            let (limiter, _, keys) = &*state;
            let mut i = 0;
            b.iter(|| {
                i = (i + 1) % keys.len();
                black_box(
                    now(limiter.check("p", black_box(&keys[i]), 1))
                        .unwrap()
                        .allowed,
                )
            })
        });
    }
    // Governor has one limit per limiter: a policy of n limits is n keyed limiters in turn.
    let mut gov = lazily(move || governor_setup(n_limits, n_keys));
    g.bench_function(BenchmarkId::new("governor", label(n_keys)), |b| {
        let state = gov();
        let (limiters, keys) = &*state;
        let mut i = 0;
        b.iter(|| {
            i = (i + 1) % keys.len();
            let k = black_box(&keys[i]);
            black_box(limiters.iter().all(|l| l.check_key(k).is_ok()))
        })
    });
    g.finish();
}

fn criterion_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/criterion")
}

/// Reads criterion's estimate (ns) of one benchmark's latest run: the slope, which is the
/// "time" criterion prints, or the median when there is no slope; and its fastest sample
/// (ns per iteration).
fn estimate_ns(group: &str, function: &str, label: &str) -> Option<(f64, f64)> {
    let dir = criterion_dir().join(group).join(function).join(label);
    let read = |file: &str| -> Option<serde_json::Value> {
        let text = std::fs::read_to_string(dir.join("new").join(file)).ok()?;
        serde_json::from_str(&text).ok()
    };
    let v = read("estimates.json")?;
    let estimate = v["slope"]["point_estimate"]
        .as_f64()
        .or_else(|| v["median"]["point_estimate"].as_f64())?;
    let samples = read("sample.json")?;
    let fastest = samples["times"]
        .as_array()?
        .iter()
        .zip(samples["iters"].as_array()?)
        .filter_map(|(t, n)| Some(t.as_f64()? / n.as_f64()?))
        .fold(f64::INFINITY, f64::min);
    Some((estimate, fastest))
}

fn main() {
    let mut c = Criterion::default()
        .output_directory(&criterion_dir())
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .configure_from_args();
    let bucket = || vec![LimitSpec::token_bucket(u64::from(RATE), 1_000)];
    let sliding = || {
        vec![
            LimitSpec::sliding_window(1 << 40, 1_000),
            LimitSpec::sliding_window(1 << 41, 60_000),
            LimitSpec::sliding_window(1 << 42, 3_600_000),
        ]
    };
    for n_keys in [1, MANY_KEYS] {
        bench_group(&mut c, "token_bucket_1_limit", bucket(), n_keys);
        bench_group(&mut c, "sliding_3_limits", sliding(), n_keys);
    }
    c.final_summary();

    // Only when benchmarking (`cargo bench` passes --bench), not when listed or smoke-tested.
    let args: Vec<String> = std::env::args().collect();
    if !args.iter().any(|a| a == "--bench") || args.iter().any(|a| a == "--list" || a == "--test") {
        return;
    }
    println!(
        "\nsluice / governor, ns per decision (criterion's estimate; fastest sample), latest \
         measurement of each:"
    );
    for group in ["token_bucket_1_limit", "sliding_3_limits"] {
        for (function, label) in [
            ("sluice into", "1 key".to_string()),
            ("sluice", "1 key".to_string()),
            ("sluice by name", "1 key".to_string()),
            ("sluice into", format!("{MANY_KEYS} keys")),
            ("sluice", format!("{MANY_KEYS} keys")),
        ] {
            let name = format!("{group} {label}");
            match (
                estimate_ns(group, function, &label),
                estimate_ns(group, "governor", &label),
            ) {
                (Some((s, s_min)), Some((g, g_min))) => println!(
                    "  {name:<36} {function:<15} {s:>7.1} ns / governor {g:>7.1} ns = {:.2}; \
                     fastest {s_min:>6.1} / {g_min:>6.1} = {:.2}",
                    s / g,
                    s_min / g_min
                ),
                _ => println!("  {name:<36} {function:<15} (not measured in this run)"),
            }
        }
    }
}
