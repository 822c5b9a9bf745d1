//! What the Redis benches share: whether to measure, the seconds per run, the runtime, and the
//! load loop (`concurrency` tasks checking random keys, uniform over `keys`, for `secs` seconds,
//! every decision an admission).

use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use sluice::{Policy, Store, StoreExt};
use sluice_redis::{RedisConfig, RedisStore};
use sluice_testkit::RedisServer;

/// The `now` every bench check passes (the app clock, fixed: windows never close).
pub(crate) const NOW: u64 = 1_700_000_000_000;

/// What a bench measures on, unless there is nothing to measure
/// ([`sluice_testkit::bench_seconds`]): the seconds each measured run takes
/// (`SLUICE_BENCH_SECS`, 5 by default), a server and the runtime.
#[allow(dead_code)] // not every bench including this module calls it
pub(crate) fn start() -> Option<(u64, RedisServer, tokio::runtime::Runtime)> {
    let secs = sluice_testkit::bench_seconds(5)?;
    Some((secs, RedisServer::start().unwrap(), runtime()))
}

/// The runtime the benches drive their load on: two worker threads.
#[allow(dead_code)] // not every bench including this module calls it
pub(crate) fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// A store on `server`, each call bounded by 2 s.
#[allow(dead_code)] // not every bench including this module calls it
pub(crate) async fn connect(server: &RedisServer) -> RedisStore {
    RedisStore::connect(RedisConfig::new(server.url()).timeout(Duration::from_secs(2)))
        .await
        .unwrap()
}

/// Decisions made, their latency in µs, and the seconds the run took.
#[allow(dead_code)] // not every bench including this module calls it
pub(crate) async fn load<S: Store + Clone + 'static>(
    store: S,
    policy: &Policy,
    concurrency: usize,
    secs: u64,
    keys: u64,
) -> (u64, Histogram<u64>, f64) {
    load_at(store, policy, concurrency, secs, keys, NOW).await
}

/// [`load`] with every check at `now`.
#[allow(dead_code)] // not every bench including this module calls it
pub(crate) async fn load_at<S: Store + Clone + 'static>(
    store: S,
    policy: &Policy,
    concurrency: usize,
    secs: u64,
    keys: u64,
    now: u64,
) -> (u64, Histogram<u64>, f64) {
    let policy = Arc::new(policy.clone());
    let started = Instant::now();
    let deadline = started + Duration::from_secs(secs);
    let tasks: Vec<_> = (0..concurrency)
        .map(|t| {
            let (store, policy) = (store.clone(), policy.clone());
            tokio::spawn(async move {
                let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).unwrap();
                let mut rng = 0x9E37_79B9_7F4A_7C15u64 ^ (t as u64 + 1);
                let mut n = 0u64;
                let mut key = String::with_capacity(32);
                while Instant::now() < deadline {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    key.clear();
                    use std::fmt::Write;
                    write!(key, "bench:{}", rng % keys).unwrap();
                    let t0 = Instant::now();
                    let d = store.check(&policy, &key, 1, now).await.unwrap();
                    hist.record(t0.elapsed().as_micros() as u64).unwrap();
                    assert!(d.allowed);
                    n += 1;
                }
                (n, hist)
            })
        })
        .collect();
    let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).unwrap();
    let mut decisions = 0;
    for t in tasks {
        let (n, h) = t.await.unwrap();
        decisions += n;
        hist.add(h).unwrap();
    }
    (decisions, hist, started.elapsed().as_secs_f64())
}

/// (calls, µs) of the script commands (FCALL, FCALL_RO, EVALSHA) from INFO commandstats.
#[allow(dead_code)] // not every bench including this module calls it
pub(crate) fn script_stats(server: &RedisServer) -> (u64, u64) {
    let stats = server.command_stats().unwrap();
    ["fcall", "fcall_ro", "evalsha"]
        .iter()
        .filter_map(|c| stats.get(*c))
        .fold((0, 0), |a, c| (a.0 + c.calls, a.1 + c.usec))
}

/// CPU seconds (user + system) the server process has used, from INFO cpu.
#[allow(dead_code)] // not every bench including this module calls it
pub(crate) fn cpu_seconds(server: &RedisServer) -> f64 {
    ["used_cpu_user", "used_cpu_sys"]
        .iter()
        .map(|f| {
            server
                .info_field("cpu", f)
                .unwrap()
                .and_then(|v| v.parse::<f64>().ok())
                .unwrap_or(0.0)
        })
        .sum()
}
