//! Failover accounting: how many decisions a failover admits above `max`, and what
//! `wait_for_replicas` (`WAIT` behind every write) costs and changes.
//!
//! Two measurements:
//!
//! - *cost*: a primary with two replicas, one store with `WAIT 1 100` and one without,
//!   alternated in rounds of 2 s (16 tasks each sharing the store's one connection, uniform over
//!   10,000 keys, every check admitted): decisions/s and latency p50/p99 of each, and their
//!   ratio within the run.
//! - *failover*: a Sentinel group (primary, 2 replicas, 3 sentinels, `down-after` 1 s) and a
//!   Cluster (3 primaries, 2 replicas each, `cluster-node-timeout` 1 s), started fresh for
//!   every run. 16 tasks check 8 keys (all on one primary) round robin through a
//!   [`RedisStore`] (call timeout 200 ms; fixed window of 1 h; `max` set from a 1 s warm-up so
//!   that the keys fill in about 2.5 s). The failover is triggered 1 s into the load, or once
//!   the keys are 40 % full if sooner, in one of three ways:
//!   - *graceful*: `SENTINEL FAILOVER <master>`, or `CLUSTER FAILOVER` on a replica;
//!   - *kill -9*: the primary is killed; Sentinel or the Cluster fails over by itself;
//!   - *kill -9, replicas 200 ms behind*: the replicas are stopped (SIGSTOP) and the primary
//!     drops their links (`CLIENT KILL TYPE replica`), 200 ms later it is killed and the
//!     replicas resume: they miss the last 200 ms of acknowledged writes.
//!
//!   Each with `WAIT` off, `WAIT 1 100` and `WAIT 2 100` (every replica), a shortfall keeping
//!   the decision. The load goes on until the store decides on the new primary (Sentinel) and
//!   every key has been denied since (its count reached `max` there), or 20 s after the
//!   trigger. Reported per run: admitted above `max` (summed over keys, `admitted - max` where
//!   positive), keys over, decisions that errored (a store error is counted as such: no
//!   fail-open, as under `on_store_error: closed`), when the store used the new primary
//!   (Sentinel: `RedisStore::primary_url`; Cluster: the cluster whole again with the old
//!   primary demoted), and the longest gap between two successful decisions after the
//!   trigger (the unavailability window).
//!
//! `cargo bench -p sluice-redis --bench failover` (about 15 minutes); `SLUICE_BENCH_ONLY=cost`,
//! `sentinel` or `cluster` runs one part; `SLUICE_FAILOVER_RUNS` (default 3) runs per cell.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a bench fails loudly by design

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use sluice::{LimitSpec, Policy, StoreExt};
use sluice_redis::{RedisConfig, RedisStore, WaitForReplicas};
use sluice_testkit::{
    ClusterOptions, RedisCluster, RedisServer, ReplicaSet, SentinelGroup, SentinelOptions,
};

use common::NOW;

const TASKS: usize = 16;
const KEYS: usize = 8;
/// The per-call timeout of every store.
const TIMEOUT: Duration = Duration::from_millis(200);
/// The load starts this long before the failover is triggered.
const BEFORE_TRIGGER: Duration = Duration::from_secs(1);
/// The load stops at the latest this long after the trigger.
const AFTER_TRIGGER: Duration = Duration::from_secs(20);
/// Successful decisions are marked per millisecond over this many milliseconds.
const HORIZON_MS: usize = 60_000;

/// `WAIT <replicas> 100` (a shortfall keeps the decision).
fn wait(replicas: u32) -> WaitForReplicas {
    WaitForReplicas::new(replicas, Duration::from_millis(100))
}

/// The modes every failover runs with: no `WAIT`, `WAIT 1` and `WAIT 2` (every replica).
const MODES: [Option<u32>; 3] = [None, Some(1), Some(2)];

fn mode_name(mode: Option<u32>) -> String {
    match mode {
        None => "off".to_owned(),
        Some(n) => format!("{n} of 2 replicas, 100ms"),
    }
}

fn policy(max: u64) -> Policy {
    Policy::from_specs("api", vec![LimitSpec::fixed_window(max, 3_600_000)]).unwrap()
}

/// The Redis key of `key` under [`policy`].
fn redis_key(key: &str) -> String {
    format!("sluice:{{3:api:{key}}}:fw3600000:c1000")
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Topo {
    Sentinel,
    Cluster,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Trigger {
    Graceful,
    Crash,
    /// The replicas stall (SIGSTOP) and the primary drops their links; [`LAG`] later the
    /// primary is killed and they resume: the replicas miss the last `LAG` of writes, as behind
    /// a slow or broken link.
    LagThenCrash,
}

/// The replication lag of [`Trigger::LagThenCrash`].
const LAG: Duration = Duration::from_millis(200);

/// Stalls the `replicas` of `nodes[primary]` and cuts them off it: what was sent so far sits
/// in their socket buffers, and what the primary acknowledges for the next [`LAG`] never
/// reaches them.
fn lag(nodes: &[RedisServer], primary: usize, replicas: &[usize]) {
    for &r in replicas {
        nodes[r].pause().unwrap();
    }
    nodes[primary]
        .cmd(&["CLIENT", "KILL", "TYPE", "replica"])
        .unwrap();
    std::thread::sleep(LAG);
}

/// Lets the stalled `replicas` go on.
fn resume(nodes: &[RedisServer], replicas: &[usize]) {
    for &r in replicas {
        nodes[r].resume().unwrap();
    }
}

impl Trigger {
    fn name(self) -> &'static str {
        match self {
            Trigger::Graceful => "graceful",
            Trigger::Crash => "kill -9",
            Trigger::LagThenCrash => "kill -9, replicas 200 ms behind",
        }
    }
}

/// What the tasks share during one failover run.
struct Shared {
    started: Instant,
    keys: Vec<String>,
    policy: Policy,
    admitted: Vec<AtomicU64>,
    errors: AtomicU64,
    decisions: AtomicU64,
    /// Whether some decision succeeded in each millisecond since `started`.
    ok_in_ms: Vec<AtomicBool>,
    /// Set once the new primary is in place.
    promoted: AtomicBool,
    /// Per key: denied since the new primary was in place (its count reached `max`).
    full_after: Vec<AtomicBool>,
    stop: AtomicBool,
}

struct RunResult {
    max: u64,
    /// Admitted units / (max × keys) when the failover was triggered.
    filled_at_trigger: f64,
    over: u64,
    keys_over: usize,
    errors: u64,
    decisions: u64,
    promoted_after: Duration,
    gap: Duration,
}

async fn task(store: RedisStore, shared: Arc<Shared>, t: usize) {
    let mut n = t;
    while !shared.stop.load(Ordering::Relaxed) {
        let i = n % KEYS;
        n += 1;
        match store.check(&shared.policy, &shared.keys[i], 1, NOW).await {
            Ok(d) => {
                shared.decisions.fetch_add(1, Ordering::Relaxed);
                let ms = shared.started.elapsed().as_millis() as usize;
                if let Some(slot) = shared.ok_in_ms.get(ms) {
                    slot.store(true, Ordering::Relaxed);
                }
                if d.allowed {
                    shared.admitted[i].fetch_add(1, Ordering::Relaxed);
                } else if shared.promoted.load(Ordering::Relaxed) {
                    shared.full_after[i].store(true, Ordering::Relaxed);
                }
            }
            Err(_) => {
                shared.errors.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
    }
}

/// Successful decisions per second per key of `store` over 1 s on fresh keys, for choosing
/// `max` (errors, e.g. timeouts of a WAIT on a loaded machine, are skipped).
async fn rate_per_key(store: &RedisStore) -> f64 {
    let policy = Arc::new(policy(1_000_000_000));
    let started = Instant::now();
    let tasks: Vec<_> = (0..TASKS)
        .map(|t| {
            let (store, policy) = (store.clone(), policy.clone());
            tokio::spawn(async move {
                let mut ok = 0u64;
                let mut n = t;
                while started.elapsed() < Duration::from_secs(1) {
                    let key = format!("warm:{}", n % KEYS);
                    n += 1;
                    ok += u64::from(store.check(&policy, &key, 1, NOW).await.is_ok());
                }
                ok
            })
        })
        .collect();
    let mut ok = 0;
    for t in tasks {
        ok += t.await.unwrap();
    }
    ok as f64 / started.elapsed().as_secs_f64() / KEYS as f64
}

/// One run: load, trigger, wait for the new primary, load until every key is full again.
async fn run(topo: Topo, trigger: Trigger, mode: Option<u32>) -> RunResult {
    let timeout = Duration::from_secs(30);
    let mut sentinel = None;
    let mut cluster = None;
    let (config, keys) = match topo {
        Topo::Sentinel => {
            let group = tokio::task::block_in_place(|| {
                SentinelGroup::start_with(SentinelOptions::new().replicas(2))
            })
            .unwrap();
            let config = RedisConfig::sentinel(group.master_name(), group.sentinel_urls());
            sentinel = Some(group);
            (
                config,
                (0..KEYS).map(|i| format!("k{i}")).collect::<Vec<_>>(),
            )
        }
        Topo::Cluster => {
            let c = tokio::task::block_in_place(|| {
                RedisCluster::start_with(ClusterOptions::new().replicas_per_primary(2))
            })
            .unwrap();
            // Every key on the primary that owns k0's slot.
            let owner = c.primary_for_key(&redis_key("k0")).unwrap();
            let keys: Vec<String> = (0..)
                .map(|i| format!("k{i}"))
                .filter(|k| c.primary_for_key(&redis_key(k)).unwrap() == owner)
                .take(KEYS)
                .collect();
            let config = RedisConfig::cluster(c.urls());
            cluster = Some(c);
            (config, keys)
        }
    };
    let mut config = config.timeout(TIMEOUT);
    if let Some(replicas) = mode {
        config = config.wait_for_replicas(wait(replicas));
    }
    let store = RedisStore::connect(config).await.unwrap();
    // Filling takes about 2.5 s at the warm-up's rate: the failover (at 1 s) hits keys that
    // are still filling.
    let max = ((rate_per_key(&store).await * 2.5) as u64).max(50);
    let shared = Arc::new(Shared {
        started: Instant::now(),
        keys,
        policy: policy(max),
        admitted: (0..KEYS).map(|_| AtomicU64::new(0)).collect(),
        errors: AtomicU64::new(0),
        decisions: AtomicU64::new(0),
        ok_in_ms: (0..HORIZON_MS).map(|_| AtomicBool::new(false)).collect(),
        promoted: AtomicBool::new(false),
        full_after: (0..KEYS).map(|_| AtomicBool::new(false)).collect(),
        stop: AtomicBool::new(false),
    });
    let tasks: Vec<_> = (0..TASKS)
        .map(|t| tokio::spawn(task(store.clone(), shared.clone(), t)))
        .collect();
    // Trigger after BEFORE_TRIGGER, or earlier once the keys are 40 % full: they must still be
    // filling when the failover comes.
    let filled = || {
        shared
            .admitted
            .iter()
            .map(|a| a.load(Ordering::Relaxed))
            .sum::<u64>() as f64
            / (max * KEYS as u64) as f64
    };
    while shared.started.elapsed() < BEFORE_TRIGGER && filled() < 0.4 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let filled_at_trigger = filled();
    let mut new_port = None;
    let triggered = Instant::now();
    let trigger_ms = shared.started.elapsed().as_millis() as usize;
    tokio::task::block_in_place(|| match (topo, trigger) {
        (Topo::Sentinel, _) => {
            let group = sentinel.as_mut().unwrap();
            let old = group.current_primary_port().unwrap();
            match trigger {
                Trigger::Graceful => {
                    group.sentinels()[0]
                        .cmd(&["SENTINEL", "FAILOVER", group.master_name()])
                        .unwrap();
                }
                Trigger::Crash => {
                    let i = group.data_node_index(old).unwrap();
                    group.data_node_mut(i).kill().unwrap();
                }
                Trigger::LagThenCrash => {
                    let i = group.data_node_index(old).unwrap();
                    let replicas: Vec<usize> =
                        (0..group.data_nodes().len()).filter(|&j| j != i).collect();
                    lag(group.data_nodes(), i, &replicas);
                    group.data_node_mut(i).kill().unwrap();
                    resume(group.data_nodes(), &replicas);
                }
            }
            let new = group.wait_failover(old, timeout).unwrap();
            new_port = Some(new);
        }
        (Topo::Cluster, _) => {
            let c = cluster.as_mut().unwrap();
            let old = c.primary_for_key(&redis_key(&shared.keys[0])).unwrap();
            match trigger {
                Trigger::Graceful => {
                    let replica = c.replicas_of(old).unwrap()[0];
                    c.nodes()[replica].cmd(&["CLUSTER", "FAILOVER"]).unwrap();
                }
                Trigger::Crash => c.node_mut(old).kill().unwrap(),
                Trigger::LagThenCrash => {
                    let replicas = c.replicas_of(old).unwrap();
                    lag(c.nodes(), old, &replicas);
                    c.node_mut(old).kill().unwrap();
                    resume(c.nodes(), &replicas);
                }
            }
            c.wait_failover(old, timeout).unwrap();
            // Graceful: the old primary is a replica of the new one once the cluster is whole;
            // from then on the client follows MOVED to the new primary.
            if c.nodes()[old].is_running() {
                sluice_testkit::wait_until(timeout, "the old primary to be a replica", || {
                    Ok(c.nodes()[old].info_field("replication", "role")?.as_deref()
                        == Some("slave"))
                })
                .unwrap();
            }
        }
    });
    // Denials count as "full again" only once the store decides on the new primary.
    if let Some(port) = new_port {
        let suffix = format!(":{port}");
        while !store.primary_url().ends_with(&suffix) && triggered.elapsed() < timeout {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
    let promoted_after = triggered.elapsed();
    shared.promoted.store(true, Ordering::Relaxed);
    while triggered.elapsed() < AFTER_TRIGGER
        && !shared.full_after.iter().all(|f| f.load(Ordering::Relaxed))
    {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    shared.stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.unwrap();
    }
    let end_ms = (shared.started.elapsed().as_millis() as usize).min(HORIZON_MS);
    // The longest run of milliseconds without a successful decision after the trigger.
    let (mut gap, mut current) = (0usize, 0usize);
    for slot in &shared.ok_in_ms[trigger_ms..end_ms] {
        if slot.load(Ordering::Relaxed) {
            current = 0;
        } else {
            current += 1;
            gap = gap.max(current);
        }
    }
    let admitted: Vec<u64> = shared
        .admitted
        .iter()
        .map(|a| a.load(Ordering::Relaxed))
        .collect();
    if !shared.full_after.iter().all(|f| f.load(Ordering::Relaxed)) {
        eprintln!(
            "  (not every key was full again within {AFTER_TRIGGER:?}: {admitted:?} of {max})"
        );
    }
    RunResult {
        max,
        filled_at_trigger,
        over: admitted.iter().map(|a| a.saturating_sub(max)).sum(),
        keys_over: admitted.iter().filter(|&&a| a > max).count(),
        errors: shared.errors.load(Ordering::Relaxed),
        decisions: shared.decisions.load(Ordering::Relaxed),
        promoted_after,
        gap: Duration::from_millis(gap as u64),
    }
}

/// `min / median / max` of `values`.
fn spread<T: Copy + Ord + std::fmt::Display>(mut values: Vec<T>) -> String {
    values.sort();
    format!(
        "{} / {} / {}",
        values[0],
        values[values.len() / 2],
        values[values.len() - 1]
    )
}

async fn failovers(topo: Topo, runs: usize) {
    let name = match topo {
        Topo::Sentinel => "Sentinel",
        Topo::Cluster => "Cluster",
    };
    println!();
    println!(
        "| {name} | WAIT | runs | max per key | filled at trigger (%) | admitted above max (sum of {KEYS} keys) | keys over | errored decisions | store on the new primary after (ms) | longest gap (ms) |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for trigger in [Trigger::Graceful, Trigger::Crash, Trigger::LagThenCrash] {
        let mut results: [Vec<RunResult>; MODES.len()] = Default::default();
        // Alternate the modes so that all see the same noise.
        for r in 0..runs {
            for (m, mode) in MODES.into_iter().enumerate() {
                let res = run(topo, trigger, mode).await;
                eprintln!(
                    "{name} {} wait={mode:?} run {r}: max {} filled at trigger {:.0} % over {} ({} keys) errors {} decisions {} promoted {:?} gap {:?}",
                    trigger.name(),
                    res.max,
                    res.filled_at_trigger * 100.0,
                    res.over,
                    res.keys_over,
                    res.errors,
                    res.decisions,
                    res.promoted_after,
                    res.gap
                );
                results[m].push(res);
            }
        }
        for (mode, results) in MODES.into_iter().zip(&results) {
            println!(
                "| {} | {} | {runs} | {} | {} | {} | {} | {} | {} | {} |",
                trigger.name(),
                mode_name(mode),
                spread(results.iter().map(|r| r.max).collect()),
                spread(
                    results
                        .iter()
                        .map(|r| (r.filled_at_trigger * 100.0).round() as u64)
                        .collect()
                ),
                spread(results.iter().map(|r| r.over).collect()),
                spread(results.iter().map(|r| r.keys_over).collect()),
                spread(results.iter().map(|r| r.errors).collect()),
                spread(
                    results
                        .iter()
                        .map(|r| r.promoted_after.as_millis())
                        .collect()
                ),
                spread(results.iter().map(|r| r.gap.as_millis()).collect()),
            );
        }
    }
}

/// Decisions/s and latency with and without `WAIT`, alternated within one run.
async fn cost() {
    const ROUNDS: usize = 4;
    const SECS: u64 = 2;
    let set = tokio::task::block_in_place(|| ReplicaSet::start(2)).unwrap();
    // A generous call timeout: this measures WAIT's cost, not when it times out.
    let timeout = Duration::from_secs(2);
    let plain = RedisStore::connect(RedisConfig::new(set.primary.url()).timeout(timeout))
        .await
        .unwrap();
    let waiting = RedisStore::connect(
        RedisConfig::new(set.primary.url())
            .timeout(timeout)
            .wait_for_replicas(wait(1)),
    )
    .await
    .unwrap();
    let unlimited = policy(1_000_000_000);
    let mut rates: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
    let mut hists = [
        Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).unwrap(),
        Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).unwrap(),
    ];
    for round in 0..ROUNDS {
        for (i, store) in [&plain, &waiting].into_iter().enumerate() {
            set.primary.cmd(&["FLUSHALL"]).unwrap();
            let (n, h, secs) = common::load(store.clone(), &unlimited, TASKS, SECS, 10_000).await;
            eprintln!(
                "cost round {round} wait={}: {:.0}/s",
                i == 1,
                n as f64 / secs
            );
            rates[i].push(n as f64 / secs);
            hists[i].add(h).unwrap();
        }
    }
    println!();
    println!(
        "| WAIT (primary + 2 replicas, {TASKS} tasks, one connection) | decisions/s (median of {ROUNDS} × {SECS} s) | p50 µs | p99 µs |"
    );
    println!("|---|---|---|---|");
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let medians = [median(&mut rates[0]), median(&mut rates[1])];
    for (i, name) in ["off", "WAIT 1 100"].into_iter().enumerate() {
        println!(
            "| {name} | {:.0} | {} | {} |",
            medians[i],
            hists[i].value_at_quantile(0.5),
            hists[i].value_at_quantile(0.99)
        );
    }
    println!(
        "\nWAIT / off: {:.2}× the decisions/s, {:.2}× the p50, {:.2}× the p99",
        medians[1] / medians[0],
        hists[1].value_at_quantile(0.5) as f64 / hists[0].value_at_quantile(0.5) as f64,
        hists[1].value_at_quantile(0.99) as f64 / hists[0].value_at_quantile(0.99) as f64
    );
}

fn main() {
    if sluice_testkit::bench_seconds(5).is_none() {
        return;
    }
    let only = std::env::var("SLUICE_BENCH_ONLY").ok();
    let runs: usize = std::env::var("SLUICE_FAILOVER_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    let rt = common::runtime();
    rt.block_on(async {
        if only.as_deref().is_none_or(|o| o == "cost") {
            cost().await;
        }
        if only.as_deref().is_none_or(|o| o == "sentinel") {
            failovers(Topo::Sentinel, runs).await;
        }
        if only.as_deref().is_none_or(|o| o == "cluster") {
            failovers(Topo::Cluster, runs).await;
        }
    });
}
