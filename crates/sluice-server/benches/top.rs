//! Records per second into the top-keys summaries (`TopKeys::record`, which every admitting
//! call of the server makes) from 1 to 64 concurrent callers on both cores: a tokio runtime of
//! 2 workers, each caller a task recording keys spread uniformly over 100 000 and yielding
//! every 16 records. In the same run, the same load on one shard: the single lock every call
//! took before the summaries were sharded.
//!
//! Then one caller, records/s by `top.capacity` (64, the default, to 10 000, the largest), keys
//! uniform over 100 000 (nearly every record a key new to its summary, which takes over the
//! smallest counter) and Zipf-distributed (s = 1.1: mostly keys already held), against the
//! default capacity in the same run.
//!
//! `cargo bench -p sluice-server --bench top` (`SLUICE_BENCH_SECS`, default 3, sets the
//! seconds per point). The machine is shared: compare ratios within one run.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a bench fails loudly by design

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use sluice_server::top::TopKeys;

const CALLERS: [usize; 7] = [1, 2, 4, 8, 16, 32, 64];
const KEYS: u64 = 100_000;
const YIELD_EVERY: u64 = 16;

fn main() {
    let run_for = support::round(3.0, Duration::from_millis(50));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_time()
        .build()
        .expect("runtime");
    let sharded = TopKeys::new(64, 60_000).shards();
    println!(
        "TopKeys::record, records/s by concurrent callers (tasks on 2 worker threads, {:.1} s a point)",
        run_for.as_secs_f64()
    );
    println!("  callers   {sharded} shards (now)   1 shard (before)   now / before");
    for callers in CALLERS {
        let now = rt.block_on(measure(callers, sharded, run_for));
        let before = rt.block_on(measure(callers, 1, run_for));
        println!(
            "  {callers:>7}   {now:>16.0}   {before:>16.0}   {:>12.2}",
            now / before
        );
    }
    println!("TopKeys::record, one caller, records/s by top.capacity (8 shards)");
    println!("  capacity   uniform keys   × capacity 64   Zipf keys   × capacity 64");
    let (mut uniform_64, mut zipf_64) = (0.0, 0.0);
    for capacity in [64, 1_000, 10_000] {
        let uniform = by_capacity(capacity, &uniform_keys(), run_for);
        let zipf = by_capacity(capacity, &zipf_keys(), run_for);
        if capacity == 64 {
            (uniform_64, zipf_64) = (uniform, zipf);
        }
        println!(
            "  {capacity:>8}   {uniform:>12.0}   {:>13.2}   {zipf:>9.0}   {:>13.2}",
            uniform / uniform_64,
            zipf / zipf_64
        );
    }
}

/// The next value of a xorshift64 generator.
fn xorshift(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

/// 1 000 000 keys uniform over `KEYS`.
fn uniform_keys() -> Vec<u64> {
    let mut x = 0x2545_f491_4f6c_dd1d_u64;
    (0..1_000_000).map(|_| xorshift(&mut x) % KEYS).collect()
}

/// 1 000 000 keys over `KEYS`, the key of rank r drawn with weight 1 / r^1.1.
fn zipf_keys() -> Vec<u64> {
    let cdf: Vec<f64> = (1..=KEYS)
        .scan(0.0, |acc, r| {
            *acc += 1.0 / (r as f64).powf(1.1);
            Some(*acc)
        })
        .collect();
    let total = cdf[cdf.len() - 1];
    let mut x = 0x9e37_79b9_7f4a_7c15_u64;
    (0..1_000_000)
        .map(|_| {
            let u = (xorshift(&mut x) >> 11) as f64 / (1u64 << 53) as f64 * total;
            cdf.partition_point(|&c| c < u).min(cdf.len() - 1) as u64
        })
        .collect()
}

/// Records/s of one caller recording `stream`'s keys, over and over, for `run_for`.
fn by_capacity(capacity: usize, stream: &[u64], run_for: Duration) -> f64 {
    let top = TopKeys::new(capacity, 60_000);
    let keys: Vec<String> = (0..KEYS).map(|i| format!("user:{i}")).collect();
    // Warm: every summary full before the count.
    for &k in stream {
        top.record("api", &keys[k as usize], true, 1, 1_000);
    }
    let started = Instant::now();
    let mut done = 0u64;
    for chunk in stream.chunks(10_000).cycle() {
        for &k in chunk {
            top.record("api", &keys[k as usize], true, 1, 1_000);
        }
        done += chunk.len() as u64;
        if started.elapsed() >= run_for {
            break;
        }
    }
    done as f64 / started.elapsed().as_secs_f64()
}

async fn measure(callers: usize, shards: usize, run_for: Duration) -> f64 {
    let top = Arc::new(TopKeys::with_shards(64, 60_000, shards));
    let policy: Arc<str> = Arc::from("api");
    let keys: Arc<Vec<String>> = Arc::new((0..KEYS).map(|i| format!("user:{i}")).collect());
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let tasks: Vec<_> = (0..callers)
        .map(|c| {
            let (top, policy, keys, stop) =
                (top.clone(), policy.clone(), keys.clone(), stop.clone());
            tokio::spawn(async move {
                let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ (c as u64 + 1);
                let mut done = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    for _ in 0..YIELD_EVERY {
                        let k = xorshift(&mut x) % KEYS;
                        top.record(&policy, &keys[k as usize], true, 1, 1_000);
                        done += 1;
                    }
                    tokio::task::yield_now().await;
                }
                done
            })
        })
        .collect();
    tokio::time::sleep(run_for).await;
    stop.store(true, Ordering::Relaxed);
    let mut total = 0u64;
    for t in tasks {
        total += t.await.unwrap();
    }
    total as f64 / started.elapsed().as_secs_f64()
}
