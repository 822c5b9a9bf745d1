//! Failures of real Redis processes under load: a shard's primary killed and restarted while
//! 16 tasks keep checking keys on every shard, and a Cluster's primary killed or stalled again
//! and again while 8 tasks check (decisions back within seconds of every promotion).
//!
//! What must hold: keys on the live shards see no error at all; keys on the dead
//! shard get their policy's failure mode (open: allowed and marked; closed: an error; local:
//! still limited, by this process's insurance store), each answered within the timeout and a
//! small margin; once the primary is back the shard is used again within a second; and no
//! decision is impossible (every key's sequence of decisions is exactly what its counter
//! allows).

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use sluice::{Degraded, Error, FailureMode, LimitSpec, Limiter, Policy};
use sluice_redis::{RedisConfig, RedisStore, ShardedStore};
use sluice_testkit::RedisServer;

const TASKS: usize = 16;
const SHARDS: usize = 3;
/// The per-call timeout of the test's stores.
const TIMEOUT: Duration = Duration::from_millis(200);
/// What an answer about a dead shard may take beyond the timeout (scheduling on a loaded CI
/// machine; the circuit breaker makes most of them immediate).
const MARGIN: Duration = Duration::from_millis(150);
/// The local policy's max: small, so the outage shows it limiting.
const LOCAL_MAX: u64 = 10;
const BIG_MAX: u64 = 1_000_000;

const BEFORE: u8 = 0;
const DOWN: u8 = 1;
const BACK: u8 = 2;
const STOP: u8 = 3;

#[derive(Debug, Clone)]
struct Sample {
    phase: u8,
    shard: usize,
    policy: &'static str,
    key: String,
    took: Duration,
    /// `Err` carries the error text.
    outcome: Result<(bool, u64, Option<Degraded>), String>,
}

fn policies() -> Vec<Policy> {
    let p = |name: &str, max: u64, mode: FailureMode| {
        Policy::from_specs(name, vec![LimitSpec::fixed_window(max, 3_600_000)])
            .unwrap()
            .with_failure_mode(mode)
    };
    vec![
        p("open", BIG_MAX, FailureMode::Open),
        p("closed", BIG_MAX, FailureMode::Closed),
        p("local", LOCAL_MAX, FailureMode::Local),
    ]
}

fn max_of(policy: &str) -> u64 {
    if policy == "local" {
        LOCAL_MAX
    } else {
        BIG_MAX
    }
}

/// Each task's keys: for every policy, one key on every shard.
fn task_keys(sharded: &ShardedStore, task: usize) -> Vec<(&'static str, String, usize)> {
    let policies = policies();
    let mut keys = Vec::new();
    for (name, policy) in ["open", "closed", "local"].into_iter().zip(&policies) {
        let mut found = [false; SHARDS];
        for n in 0.. {
            let key = format!("t{task}:{n}");
            let shard = sharded.shard_for(policy, &key);
            if !found[shard] {
                found[shard] = true;
                keys.push((name, key, shard));
            }
            if found.iter().all(|f| *f) {
                break;
            }
        }
    }
    keys
}

/// Polls (every 5 ms) until `condition` holds; panics after `limit`.
async fn poll_until(limit: Duration, what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !condition() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn percentile(mut v: Vec<Duration>, p: f64) -> Duration {
    if v.is_empty() {
        return Duration::ZERO;
    }
    v.sort();
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v[i]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_dead_shard_fails_by_policy_while_the_others_carry_on() {
    if !sluice_testkit::require_redis() {
        return;
    }
    let mut servers: Vec<RedisServer> =
        (0..SHARDS).map(|_| RedisServer::start().unwrap()).collect();
    let mut stores = Vec::new();
    for s in &servers {
        stores.push(
            RedisStore::connect(RedisConfig::new(s.url()).timeout(TIMEOUT))
                .await
                .unwrap(),
        );
    }
    let sharded = ShardedStore::new(stores).unwrap();
    let limiter = Limiter::new(sharded.clone()).with_policies(policies());
    const DEAD: usize = 0;

    let phase = Arc::new(AtomicU8::new(BEFORE));
    let done = Arc::new(AtomicU64::new(0));
    let dead_ok_after_restart = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = (0..TASKS)
        .map(|t| {
            let keys = task_keys(&sharded, t);
            let limiter = limiter.clone();
            let phase = phase.clone();
            let done = done.clone();
            let dead_ok = dead_ok_after_restart.clone();
            tokio::spawn(async move {
                let mut samples = Vec::new();
                let mut i = 0usize;
                loop {
                    let now_phase = phase.load(Ordering::SeqCst);
                    if now_phase == STOP {
                        break;
                    }
                    let (policy, key, shard) = &keys[i % keys.len()];
                    i += 1;
                    let started = Instant::now();
                    let result = limiter.check(policy, key, 1).await;
                    let took = started.elapsed();
                    let outcome = match result {
                        Ok(d) => Ok((d.allowed, d.remaining(), d.degraded)),
                        Err(Error::Store(e)) => Err(e.to_string()),
                        Err(e) => panic!("not a store error: {e}"),
                    };
                    if now_phase == BACK && *shard == DEAD && matches!(outcome, Ok((_, _, None))) {
                        dead_ok.fetch_add(1, Ordering::SeqCst);
                    }
                    samples.push(Sample {
                        phase: now_phase,
                        shard: *shard,
                        policy,
                        key: key.clone(),
                        took,
                        outcome,
                    });
                    done.fetch_add(1, Ordering::SeqCst);
                }
                samples
            })
        })
        .collect();

    // Load on every shard, then kill shard 0's primary and keep the load on for a while.
    poll_until(Duration::from_secs(60), "2,000 decisions", || {
        done.load(Ordering::SeqCst) >= 2_000
    })
    .await;
    servers[DEAD].kill().unwrap();
    phase.store(DOWN, Ordering::SeqCst);
    let killed_at = done.load(Ordering::SeqCst);
    poll_until(
        Duration::from_secs(60),
        "4,000 decisions while down",
        || done.load(Ordering::SeqCst) >= killed_at + 4_000,
    )
    .await;

    // Restart it (empty: no persistence) on the same port; the shard must be used again soon.
    tokio::task::block_in_place(|| servers[DEAD].restart().unwrap());
    let restarted = Instant::now();
    phase.store(BACK, Ordering::SeqCst);
    poll_until(
        Duration::from_secs(10),
        "the restarted shard to answer",
        || dead_ok_after_restart.load(Ordering::SeqCst) > 0,
    )
    .await;
    let back_after = restarted.elapsed();
    let back_at = done.load(Ordering::SeqCst);
    poll_until(Duration::from_secs(60), "1,000 decisions after", || {
        done.load(Ordering::SeqCst) >= back_at + 1_000
    })
    .await;
    phase.store(STOP, Ordering::SeqCst);
    let mut samples = Vec::new();
    for t in tasks {
        samples.extend(t.await.unwrap());
    }

    // 1. Live shards: no error, no degraded decision, in any phase.
    let live_bad: Vec<&Sample> = samples
        .iter()
        .filter(|s| s.shard != DEAD && !matches!(s.outcome, Ok((_, _, None))))
        .collect();
    assert!(
        live_bad.is_empty(),
        "{} decisions on live shards failed, e.g. {:?}",
        live_bad.len(),
        live_bad.first()
    );
    let live = |phase: u8| -> Vec<Duration> {
        samples
            .iter()
            .filter(|s| s.shard != DEAD && s.phase == phase)
            .map(|s| s.took)
            .collect()
    };
    let (before, during) = (live(BEFORE), live(DOWN));
    println!(
        "live shards: before p50 {:?} p99 {:?} ({} checks); while shard {DEAD} is down p50 {:?} p99 {:?} ({} checks)",
        percentile(before.clone(), 0.5),
        percentile(before.clone(), 0.99),
        before.len(),
        percentile(during.clone(), 0.5),
        percentile(during.clone(), 0.99),
        during.len(),
    );

    // 2. The dead shard, while down: each policy's mode, each answer in time.
    let down: Vec<&Sample> = samples
        .iter()
        .filter(|s| s.shard == DEAD && s.phase == DOWN)
        .collect();
    assert!(
        down.len() > 1_000,
        "only {} checks hit the dead shard",
        down.len()
    );
    let slowest = down.iter().map(|s| s.took).max().unwrap();
    println!(
        "dead shard: {} checks answered, p50 {:?}, p99 {:?}, slowest {slowest:?} (timeout {TIMEOUT:?}); used again {back_after:?} after the restart; circuit opened {} time(s)",
        down.len(),
        percentile(down.iter().map(|s| s.took).collect(), 0.5),
        percentile(down.iter().map(|s| s.took).collect(), 0.99),
        sharded.shards()[DEAD].opened_total(),
    );
    assert!(
        slowest <= TIMEOUT + MARGIN,
        "a check on the dead shard took {slowest:?}"
    );
    for s in &down {
        match (s.policy, &s.outcome) {
            // A check that started just before the kill (or ended just after the restart)
            // was decided by Redis; the sequence check below covers it.
            (_, Ok((_, _, None))) => {}
            ("open", Ok((allowed, remaining, Some(Degraded::Open)))) => {
                assert!(*allowed);
                assert_eq!(
                    *remaining, BIG_MAX,
                    "an open decision reports the limit whole"
                );
            }
            ("closed", Err(e)) => {
                assert!(
                    e.contains("unavailable") || e.contains("timed out"),
                    "closed policy error: {e}"
                );
            }
            ("local", Ok((_, _, Some(Degraded::Local)))) => {}
            other => panic!("dead shard, {}: unexpected {other:?}", s.policy),
        }
    }
    assert!(
        sharded.shards()[DEAD].opened_total() >= 1,
        "the circuit never opened"
    );
    // Local: limited, not unlimited: each key got exactly its max from the insurance store
    // (counting every local decision: a check that started just before the kill, or ends
    // just after the restart, may be one).
    let mut local_allowed: BTreeMap<&str, u64> = BTreeMap::new();
    let mut local_checks: BTreeMap<&str, u64> = BTreeMap::new();
    for s in &samples {
        if let Ok((allowed, _, Some(Degraded::Local))) = s.outcome {
            *local_checks.entry(&s.key).or_default() += 1;
            *local_allowed.entry(&s.key).or_default() += u64::from(allowed);
        }
    }
    assert_eq!(local_allowed.len(), TASKS, "{local_checks:?}");
    for (key, allowed) in &local_allowed {
        let checks = local_checks[key];
        assert_eq!(*allowed, LOCAL_MAX.min(checks), "{key}: {checks} checks");
    }
    assert!(
        local_checks.values().any(|&c| c > LOCAL_MAX),
        "no local key was checked past its max: {local_checks:?}"
    );

    // 3. Back within a second of the restart.
    assert!(
        back_after < Duration::from_secs(1),
        "the restarted shard was used again only after {back_after:?}"
    );

    // 4. No impossible decision: for every key, the decisions Redis made count down by one
    // per admitted check (one task per key, so they are in order); the restarted shard lost
    // its data, so its keys start over once, from a fresh window. A `local` key's admissions
    // by the insurance store are charged back to Redis right after its first decision there,
    // so its count jumps by them once.
    let mut by_key: BTreeMap<(&str, &str), Vec<&Sample>> = BTreeMap::new();
    for s in &samples {
        if matches!(s.outcome, Ok((_, _, None))) {
            by_key.entry((s.policy, &s.key)).or_default().push(s);
        }
    }
    for ((policy, key), decided) in &by_key {
        let max = max_of(policy);
        let mut expected: Option<u64> = None;
        let mut restarted_once = false;
        let mut charged_back = *policy != "local";
        for s in decided {
            let Ok((allowed, remaining, _)) = s.outcome else {
                unreachable!()
            };
            let fresh = max - 1;
            match expected {
                None => assert_eq!(remaining, fresh, "{policy}/{key}: first decision"),
                Some(left) if s.shard == DEAD && s.phase >= DOWN && !restarted_once => {
                    // The first decision after the data loss, or one more from before it.
                    assert!(
                        remaining == fresh || remaining == left.saturating_sub(1),
                        "{policy}/{key}: {remaining} after {left}"
                    );
                    restarted_once = remaining == fresh;
                }
                Some(left) if restarted_once && !charged_back && s.shard == DEAD => {
                    let owed = local_allowed.get(*key).copied().unwrap_or(0);
                    let left = left.saturating_sub(owed);
                    assert_eq!(
                        allowed,
                        left > 0,
                        "{policy}/{key}: at {left} after the charge-back"
                    );
                    assert_eq!(remaining, left.saturating_sub(1), "{policy}/{key}");
                    charged_back = true;
                }
                Some(left) => {
                    assert_eq!(allowed, left > 0, "{policy}/{key}: at {left}");
                    assert_eq!(remaining, left.saturating_sub(1), "{policy}/{key}");
                }
            }
            expected = Some(remaining);
        }
    }
}

/// How soon after a promotion the store must decide again (the Cluster itself is whole by
/// then: `wait_failover` returns once every node agrees).
const BACK_WITHIN: Duration = Duration::from_secs(5);
const ROUNDS: usize = 4;

/// A Cluster primary killed (or stalled) under load, again and again: each round kills or
/// pauses the primary that serves the hot keys (the replica promoted in the last round), waits
/// for its replica to take over, and requires decisions on those keys — made by Redis, not
/// degraded — within [`BACK_WITHIN`] of the promotion; the node then rejoins as the new
/// replica. The policy fails open, so no check may fail whatever the store meets meanwhile
/// (`MOVED`, a refused connection, `CLUSTERDOWN`, no connection to the slot's node).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cluster_follows_every_failover_under_load() {
    if !sluice_testkit::require_redis() {
        return;
    }
    let mut cluster = tokio::task::block_in_place(sluice_testkit::RedisCluster::start).unwrap();
    let store = RedisStore::connect(
        RedisConfig::cluster(cluster.urls()).timeout(Duration::from_millis(500)),
    )
    .await
    .unwrap();
    let open = Policy::from_specs("open", vec![LimitSpec::fixed_window(BIG_MAX, 3_600_000)])
        .unwrap()
        .with_failure_mode(FailureMode::Open);
    let limiter = Limiter::new(store).with_policy(open.clone());
    // Hot keys, all in the slot of `hot`; cold ones spread over every slot.
    let hot_slot =
        sluice_testkit::key_slot(sluice_redis::keys::stem("sluice:", &open, "hot").as_bytes());

    let stop = Arc::new(AtomicU8::new(0));
    let decided = Arc::new(AtomicU64::new(0));
    let degraded = Arc::new(AtomicU64::new(0));
    // When a hot key was last decided by Redis, in ms since `t0`.
    let t0 = Instant::now();
    let last_hot = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = (0..8)
        .map(|t| {
            let (limiter, stop, decided, degraded, last_hot) = (
                limiter.clone(),
                stop.clone(),
                decided.clone(),
                degraded.clone(),
                last_hot.clone(),
            );
            tokio::spawn(async move {
                let mut errors = Vec::new();
                let mut i = 0u64;
                while stop.load(Ordering::SeqCst) == 0 {
                    i += 1;
                    let hot = t % 2 == 0;
                    let key = if hot {
                        "hot".to_owned()
                    } else {
                        format!("cold:{t}:{}", i % 64)
                    };
                    match limiter.check("open", &key, 1).await {
                        Ok(d) if d.degraded.is_none() => {
                            decided.fetch_add(1, Ordering::SeqCst);
                            if hot {
                                let ms = u64::try_from(t0.elapsed().as_millis()).unwrap();
                                last_hot.fetch_max(ms, Ordering::SeqCst);
                            }
                        }
                        Ok(_) => {
                            degraded.fetch_add(1, Ordering::SeqCst);
                            // Not a busy loop against a dead node.
                            tokio::time::sleep(Duration::from_millis(5)).await;
                        }
                        Err(e) => errors.push(e.to_string()),
                    }
                }
                errors
            })
        })
        .collect();

    poll_until(Duration::from_secs(30), "decisions under load", || {
        decided.load(Ordering::SeqCst) >= 500
    })
    .await;
    let mut backs = Vec::new();
    for round in 0..ROUNDS {
        let primary = cluster.primary_for_slot(hot_slot).unwrap();
        // Killed: its port refuses connections. Paused: it stalls, and calls to it time out
        // (the Cluster client alone would keep sending them there after the promotion).
        let how = if round % 2 == 0 {
            cluster.node_mut(primary).kill().unwrap();
            "killed"
        } else {
            cluster.nodes()[primary].pause().unwrap();
            "paused"
        };
        let killed = Instant::now();
        let promoted =
            tokio::task::block_in_place(|| cluster.wait_failover(primary, Duration::from_secs(30)))
                .unwrap();
        let promoted_at = Instant::now();
        let since = u64::try_from(t0.elapsed().as_millis()).unwrap();
        poll_until(
            BACK_WITHIN,
            &format!("round {round}: decisions on the hot keys after the promotion"),
            || last_hot.load(Ordering::SeqCst) > since,
        )
        .await;
        let back = promoted_at.elapsed();
        println!(
            "round {round}: node {primary} {how}, node {promoted} promoted after {:?}, \
             decisions back {back:?} after that",
            promoted_at - killed
        );
        backs.push(back);
        // The node rejoins (restarted), as the new primary's replica: the next round fails
        // that one.
        tokio::task::block_in_place(|| {
            cluster.node_mut(primary).restart().unwrap();
            cluster.wait_ok().unwrap();
        });
    }
    stop.store(1, Ordering::SeqCst);
    let mut errors = Vec::new();
    for t in tasks {
        errors.extend(t.await.unwrap());
    }
    println!(
        "{} decisions, {} degraded, back after {backs:?}",
        decided.load(Ordering::SeqCst),
        degraded.load(Ordering::SeqCst)
    );
    assert!(
        errors.is_empty(),
        "{} checks of a policy that fails open failed, e.g. {:?}",
        errors.len(),
        errors.first()
    );
}
