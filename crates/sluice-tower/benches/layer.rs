//! The cost of the rate-limit layer (memory store) over a bare handler, measured in the same
//! run. `cargo bench -p sluice-tower --bench layer` prints criterion's figures and, at the
//! end, the overhead in ns per request and the ratio for each pair.
//!
//! - `service_fn`: a `tower::service_fn` answering an empty 200, bare and behind the layer
//!   (one hot key; 100 000 keys in turn; one key with both header sets off), plus the
//!   limiter's `check` alone, which is the part of the overhead that is the store's.
//! - `axum`: a one-route `Router`, bare and with the layer.
//!
//! Every request is built the same way on both sides (a `x-api-key` header from a pre-built
//! list) and driven with `oneshot` on a clone of the service, polled once: the memory store and
//! these handlers never wait, so no runtime is involved. Every decision is an admission (the
//! limit is far above the request count), so the layer's common path is measured: check, call,
//! render seven headers.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a bench fails loudly by design

use std::convert::Infallible;
use std::future::Future;
use std::hint::black_box;
use std::path::PathBuf;
use std::pin::pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use criterion::{BenchmarkId, Criterion};
use http::{Request, Response};
use sluice::{LimitSpec, Limiter, MemoryStore, Op, Policy};
use sluice_tower::{KeyExtractor, RateLimitLayer};
use tower::{Layer, ServiceExt};

const MANY_KEYS: usize = 100_000;

/// Polls a future that is ready at once.
fn now<T>(f: impl Future<Output = T>) -> T {
    let mut f = pin!(f);
    match f.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(v) => v,
        Poll::Pending => panic!("nothing here waits"),
    }
}

fn keys(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("user:{i}")).collect()
}

fn policy() -> Policy {
    Policy::from_specs("bench", vec![LimitSpec::fixed_window(1 << 50, 3_600_000)]).unwrap()
}

fn limiter() -> Limiter<MemoryStore> {
    Limiter::new(MemoryStore::new()).with_policy(policy())
}

fn request<B: Default>(key: &str) -> Request<B> {
    Request::builder()
        .uri("/items/1")
        .header("x-api-key", key)
        .body(B::default())
        .unwrap()
}

fn label(n_keys: usize) -> String {
    if n_keys == 1 {
        "1 key".to_owned()
    } else {
        format!("{n_keys} keys")
    }
}

fn bench_service_fn(c: &mut Criterion) {
    let handler = tower::service_fn(|_req: Request<String>| async {
        Ok::<_, Infallible>(Response::new(String::new()))
    });
    let mut g = c.benchmark_group("service_fn");
    let one = keys(1);
    g.bench_function("bare", |b| {
        b.iter(|| {
            let r = now(handler.oneshot(request(black_box(&one[0])))).unwrap();
            black_box(r.status())
        })
    });
    for n in [1, MANY_KEYS] {
        let keys = keys(n);
        let layered = RateLimitLayer::new(limiter(), policy(), KeyExtractor::header("x-api-key"))
            .layer(handler);
        // Every key once first, so the loop measures the steady state.
        for k in &keys {
            now(layered.clone().oneshot(request(k))).unwrap();
        }
        let mut i = 0;
        g.bench_function(BenchmarkId::new("layer", label(n)), |b| {
            b.iter(|| {
                i = (i + 1) % keys.len();
                let r = now(layered.clone().oneshot(request(black_box(&keys[i])))).unwrap();
                black_box(r.status())
            })
        });
    }
    // The same with both header sets off: what the headers cost.
    let quiet = RateLimitLayer::new(limiter(), policy(), KeyExtractor::header("x-api-key"))
        .github_headers(false)
        .ietf_headers(false)
        .layer(handler);
    g.bench_function(BenchmarkId::new("layer, no headers", label(1)), |b| {
        b.iter(|| {
            let r = now(quiet.clone().oneshot(request(black_box(&one[0])))).unwrap();
            black_box(r.status())
        })
    });
    let lim = limiter();
    let p = policy();
    g.bench_function(BenchmarkId::new("check only", label(1)), |b| {
        b.iter(|| {
            black_box(
                now(lim.call(&p, black_box(&one[0]), Op::Check { cost: 1 }))
                    .unwrap()
                    .allowed,
            )
        })
    });
    g.finish();
}

fn bench_axum(c: &mut Criterion) {
    let router = || axum::Router::new().route("/items/1", axum::routing::get(|| async { "ok" }));
    let bare = router();
    let layered = router().layer(RateLimitLayer::new(
        limiter(),
        policy(),
        KeyExtractor::header("x-api-key"),
    ));
    let one = keys(1);
    let mut g = c.benchmark_group("axum");
    g.bench_function("bare", |b| {
        b.iter(|| {
            let r = now(bare
                .clone()
                .oneshot(request::<axum::body::Body>(black_box(&one[0]))))
            .unwrap();
            black_box(r.status())
        })
    });
    g.bench_function(BenchmarkId::new("layer", label(1)), |b| {
        b.iter(|| {
            let r = now(layered
                .clone()
                .oneshot(request::<axum::body::Body>(black_box(&one[0]))))
            .unwrap();
            black_box(r.status())
        })
    });
    g.finish();
}

fn criterion_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target"))
        .join("criterion")
}

/// Criterion's estimate (ns) of one benchmark's latest run: the slope when there is one (the
/// "time" criterion prints), else the median.
fn estimate_ns(group: &str, function: &str, label: Option<&str>) -> Option<f64> {
    let mut dir = criterion_dir().join(group).join(function);
    if let Some(label) = label {
        dir = dir.join(label);
    }
    let text = std::fs::read_to_string(dir.join("new/estimates.json")).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    v["slope"]["point_estimate"]
        .as_f64()
        .or_else(|| v["median"]["point_estimate"].as_f64())
}

fn main() {
    let mut c = Criterion::default()
        .output_directory(&criterion_dir())
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .configure_from_args();
    bench_service_fn(&mut c);
    bench_axum(&mut c);
    c.final_summary();

    // Only when benchmarking (`cargo bench` passes --bench), not when listed or smoke-tested.
    let args: Vec<String> = std::env::args().collect();
    if !args.iter().any(|a| a == "--bench") || args.iter().any(|a| a == "--list" || a == "--test") {
        return;
    }
    println!("\nlayer overhead (ns per request, latest measurement of each):");
    let rows = [
        ("service_fn", "layer", label(1)),
        ("service_fn", "layer, no headers", label(1)),
        ("service_fn", "layer", label(MANY_KEYS)),
        ("axum", "layer", label(1)),
    ];
    for (group, function, label) in rows {
        let name = format!("{function} ({label})");
        match (
            estimate_ns(group, "bare", None),
            estimate_ns(group, function, Some(&label)),
        ) {
            (Some(bare), Some(layered)) => println!(
                "  {group:<10} {name:<30} bare {bare:>6.1} ns  with layer {layered:>7.1} ns  \
                 overhead {:>7.1} ns  ratio {:.2}",
                layered - bare,
                layered / bare
            ),
            _ => println!("  {group:<10} {name:<30} (not measured in this run)"),
        }
    }
    if let Some(check) = estimate_ns("service_fn", "check only", Some(&label(1))) {
        println!(
            "  the limiter's check alone (1 key, part of every overhead above): {check:.1} ns"
        );
    }
}
