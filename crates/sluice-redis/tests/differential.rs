//! The Redis store decides exactly like the memory store: random operation sequences (advance
//! a manual clock; check, peek, refund, acquire (a batch), hold and release (leases of a
//! concurrency limit, from a few ids so releases find them), forget with random costs; several
//! keys; policies mixing all four algorithms, including limits near 2^53) run through both, and
//! every decision must be identical, field for field.
//!
//! CI runs at least 10 000 operations. A longer local run:
//! `SLUICE_DIFF_CASES=2000 cargo test --release -p sluice-redis --test differential`.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use sluice::{Limit, LimitSpec, Limiter, ManualClock, MemoryStore, Policy};
use sluice_redis::{RedisConfig, RedisStore, ScriptMode};
use sluice_testkit::RedisServer;

const T0: u64 = 1_700_000_000_000;

/// Now by the wall clock, in ms: where a manual clock starts when Redis must agree with it
/// (a fixed window's end is its counter's absolute expiry, and a window opens as a hash in
/// the same key instead when the caller's clock is off Redis's by half the margin or more).
fn wall_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(T0, |d| d.as_millis() as u64)
}
const MIN_OPS: usize = 10_000;

/// Where each case's manual clock starts: at Redis's time (fixed windows open as counters,
/// until a case's clock runs half the margin ahead), or years before it (every fixed window
/// opens as a hash).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Start {
    OnRedisClock,
    FarBehind,
}

impl Start {
    fn at(self, case: usize) -> u64 {
        let base = match self {
            Start::OnRedisClock => wall_ms(),
            Start::FarBehind => T0,
        };
        base + (case as u64) * 7
    }
}

#[derive(Debug, Clone)]
enum Op {
    Advance(u64),
    Check {
        policy: usize,
        key: usize,
        cost: u64,
    },
    Peek {
        policy: usize,
        key: usize,
        cost: u64,
    },
    Refund {
        policy: usize,
        key: usize,
        cost: u64,
    },
    Forget {
        policy: usize,
        key: usize,
    },
    Acquire {
        policy: usize,
        key: usize,
        min: u64,
        max: u64,
    },
    Hold {
        policy: usize,
        key: usize,
        cost: u64,
        lease: u64,
    },
    Release {
        policy: usize,
        key: usize,
        lease: u64,
    },
    /// Checks and peeks made at once (concurrently on the Redis store, so they coalesce into
    /// batches; in order on the memory store, the order a batch decides them in).
    Burst(Vec<Op>),
}

/// A limit spec: mostly small numbers (where windows fill and buckets run dry), sometimes
/// huge ones (where the Lua code must split numbers beyond 2^53).
fn limit_spec() -> impl Strategy<Value = Limit> {
    let small = (
        0..4usize,
        1u64..=12,
        prop_oneof![Just(1u64), Just(7), Just(100), Just(1_000), Just(60_000)],
        1u64..=6,
        1u64..=30,
        any::<bool>(),
    )
        .prop_map(|(alg, max, per, n, burst, align)| match alg {
            0 => {
                let s = LimitSpec::fixed_window(max, per);
                if align { s.aligned() } else { s }
            }
            1 => LimitSpec::sliding_window(max, per * n).precision_ms(per),
            2 => LimitSpec::token_bucket(max, per).burst(burst),
            _ => LimitSpec::concurrency(max, per * n),
        });
    let huge = (
        prop_oneof![Just(1u64 << 53), (1u64 << 40)..=(1u64 << 53), 1u64..=1_000],
        prop_oneof![
            Just(1u64),
            Just(333),
            Just(86_400_000),
            Just(366 * 86_400_000)
        ],
        prop_oneof![Just(1u64 << 53), (1u64 << 30)..=(1u64 << 53), 1u64..=1_000],
    )
        .prop_map(|(max, per, burst)| LimitSpec::token_bucket(max, per).burst(burst));
    prop_oneof![6 => small, 1 => huge].prop_filter_map("valid limit", |s| Limit::new(s).ok())
}

fn policies() -> impl Strategy<Value = Vec<Vec<Limit>>> {
    prop::collection::vec(prop::collection::vec(limit_spec(), 1..=3), 3)
}

fn cost_for(max: u64) -> impl Strategy<Value = u64> {
    prop_oneof![
        4 => 0..=3u64,
        2 => 0..=max.saturating_add(1),
        1 => Just(max),
        1 => Just(max.saturating_add(1)),
    ]
}

/// Mostly a few small ids, so that leases are taken again (renewed) and released; sometimes
/// ids beyond 2^53, which the Lua code must keep as strings.
fn lease_id() -> impl Strategy<Value = u64> {
    prop_oneof![4 => 1..=5u64, 1 => Just(u64::MAX), 1 => any::<u64>()]
}

fn scenario() -> impl Strategy<Value = (Vec<Vec<Limit>>, Vec<Op>)> {
    policies().prop_flat_map(|policies| {
        let biggest = policies
            .iter()
            .flat_map(|p| p.iter().map(Limit::max))
            .max()
            .unwrap_or(1);
        let target = (0..3usize, 0..3usize);
        let op = prop_oneof![
            3 => prop_oneof![0..=50u64, 0..=2_000u64, 0..=120_000u64].prop_map(Op::Advance),
            6 => (target.clone(), cost_for(biggest)).prop_map(|((policy, key), cost)| Op::Check { policy, key, cost }),
            2 => (target.clone(), cost_for(biggest)).prop_map(|((policy, key), cost)| Op::Peek { policy, key, cost }),
            2 => (target.clone(), cost_for(biggest)).prop_map(|((policy, key), cost)| Op::Refund { policy, key, cost }),
            1 => target.clone().prop_map(|(policy, key)| Op::Forget { policy, key }),
            2 => (target.clone(), cost_for(biggest), cost_for(biggest)).prop_map(|((policy, key), a, b)| Op::Acquire { policy, key, min: a.min(b).min(sluice::core::MAX_AMOUNT), max: a.max(b).min(sluice::core::MAX_AMOUNT) }),
            4 => (target.clone(), cost_for(biggest), lease_id()).prop_map(|((policy, key), cost, lease)| Op::Hold { policy, key, cost: cost.min(sluice::core::MAX_AMOUNT), lease }),
            3 => (target.clone(), lease_id()).prop_map(|((policy, key), lease)| Op::Release { policy, key, lease }),
            3 => prop::collection::vec(
                (target, cost_for(biggest), any::<bool>()).prop_map(|((policy, key), cost, peek)| {
                    if peek { Op::Peek { policy, key, cost } } else { Op::Check { policy, key, cost } }
                }),
                2..10,
            ).prop_map(Op::Burst),
        ];
        (Just(policies), prop::collection::vec(op, 50..250))
    })
}

/// A store on `n` fresh servers (one shard: a plain `RedisStore`; more: a `ShardedStore`).
/// Keys expire in real time while the manual clock barely moves, so a long margin keeps Redis
/// from dropping state the memory store still holds.
fn config(server: &RedisServer, mode: ScriptMode) -> RedisConfig {
    // Peeks go to the primary, so they coalesce with the checks around them.
    RedisConfig::new(server.url())
        .read_from(sluice_redis::ReadFrom::Primary)
        .script_mode(mode)
        .timeout(Duration::from_secs(5))
        .expiry_margin(Duration::from_secs(3_600))
}

/// What `start` starts and a runtime to drive stores on it; `None` (the test is skipped)
/// without `redis-server`.
fn started<T>(start: impl FnOnce() -> T) -> Option<(T, tokio::runtime::Runtime)> {
    if !sluice_testkit::require_redis() {
        return None;
    }
    let started = start();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    Some((started, rt))
}

fn run_differential(mode: ScriptMode, start: Start, cases: u32, min_ops: usize) {
    let Some((server, rt)) = started(|| RedisServer::start().expect("redis-server")) else {
        return;
    };
    let redis = rt
        .block_on(RedisStore::connect(config(&server, mode)))
        .expect("connect");
    let label = format!("{mode:?} {start:?}");
    let decisions = differential(&label, &rt, redis, cases, min_ops, start);
    // Bursts coalesced: fewer script calls than decisions.
    let stats = server.command_stats().unwrap();
    let calls: u64 = ["fcall", "fcall_ro", "evalsha", "evalsha_ro"]
        .iter()
        .filter_map(|c| stats.get(*c))
        .map(|c| c.calls)
        .sum();
    println!("{label}: {decisions} decisions in {calls} script calls");
    // Each encoding of a fixed window was used: on Redis's clock the counters (the fast path's
    // INCRBY, PEXPIRETIME to read their end; how many depends on how far each case's clock
    // runs ahead of Redis's: a clean CI run counted 84 INCRBY where a loaded machine counted
    // hundreds), far from it the hashes (HINCRBY into an open window).
    let used = match start {
        Start::OnRedisClock => ["incrby", "pexpiretime"],
        Start::FarBehind => ["hincrby", "hmget"],
    };
    for c in used {
        let n = stats.get(c).map_or(0, |c| c.calls);
        println!("{c}: {n}");
        assert!(n > 0, "{n} {c} calls: {start:?} did not use its encoding");
    }
    assert!(
        (calls as usize) < decisions,
        "{calls} script calls for {decisions} decisions: nothing coalesced"
    );
}

/// Runs the scenarios through the memory store and `redis`; returns the decisions asked of
/// `redis`.
/// A limiter on a fresh memory store and one on `remote`, on the one `clock`, with `policies`.
fn limiters<S: sluice::Store + Clone>(
    remote: &S,
    clock: &ManualClock,
    policies: &[Policy],
) -> (Limiter<MemoryStore, ManualClock>, Limiter<S, ManualClock>) {
    let memory = Limiter::new(MemoryStore::new())
        .with_clock(clock.clone())
        .with_policies(policies.to_vec());
    let remote = Limiter::new(remote.clone())
        .with_clock(clock.clone())
        .with_policies(policies.to_vec());
    (memory, remote)
}

fn differential<S: sluice::Store + Clone>(
    label: &str,
    rt: &tokio::runtime::Runtime,
    redis: S,
    cases: u32,
    min_ops: usize,
    start: Start,
) -> usize {
    let ops_run = AtomicUsize::new(0);
    let decisions = AtomicUsize::new(0);
    let case = AtomicUsize::new(0);

    let mut runner = TestRunner::new(Config {
        cases,
        source_file: Some(file!()),
        ..Config::default()
    });
    let result = runner.run(&scenario(), |(limits, ops)| {
        let case = case.fetch_add(1, Ordering::Relaxed);
        let clock = ManualClock::new(start.at(case));
        let policies: Vec<Policy> = limits
            .into_iter()
            .enumerate()
            .map(|(i, l)| Policy::new(format!("p{i}"), l))
            .collect::<Result<_, _>>()
            .map_err(|e| TestCaseError::reject(e.to_string()))?;
        let (memory, remote) = limiters(&redis, &clock, &policies);
        let key = |k: usize| format!("case{case}:key{k}");
        rt.block_on(async {
            for (step, op) in ops.iter().enumerate() {
                ops_run.fetch_add(1, Ordering::Relaxed);
                let (a, b) = match op {
                    Op::Advance(dt) => {
                        clock.advance(*dt);
                        continue;
                    }
                    Op::Forget { policy, key: k } => {
                        let p = &policies[*policy];
                        let a = memory.forget(p, &key(*k)).await;
                        let b = remote.forget(p, &key(*k)).await;
                        prop_assert_eq!(a, b);
                        continue;
                    }
                    Op::Burst(ops) => {
                        let mut expected = Vec::new();
                        for op in ops {
                            expected.push(apply(&memory, &policies, op, &key).await);
                        }
                        let got = sluice_testkit::join_in_order(
                            ops.iter().map(|op| apply(&remote, &policies, op, &key)),
                        )
                        .await;
                        decisions.fetch_add(ops.len(), Ordering::Relaxed);
                        prop_assert_eq!(
                            expected,
                            got,
                            "step {} {:?} at t+{}",
                            step,
                            op,
                            clock_offset(&clock)
                        );
                        continue;
                    }
                    decision => {
                        decisions.fetch_add(1, Ordering::Relaxed);
                        (
                            apply(&memory, &policies, decision, &key).await,
                            apply(&remote, &policies, decision, &key).await,
                        )
                    }
                };
                // Both stores see the same validation, so errors must match too.
                prop_assert_eq!(a, b, "step {} {:?} at t+{}", step, op, clock_offset(&clock));
            }
            Ok(())
        })
    });
    if let Err(e) = result {
        panic!("{label}: {e}");
    }
    let total = ops_run.load(Ordering::Relaxed);
    println!("{label}: {total} operations, identical decisions");
    assert!(
        total >= min_ops,
        "only {total} operations ran, fewer than {min_ops}"
    );
    decisions.load(Ordering::Relaxed)
}

/// Runs a check, peek, refund, acquire, hold or release on one limiter.
async fn apply<S: sluice::Store>(
    limiter: &Limiter<S, ManualClock>,
    policies: &[Policy],
    op: &Op,
    key: &impl Fn(usize) -> String,
) -> Result<sluice::Decision, sluice::Error> {
    use sluice::Clock;
    let (policy, k, op) = match *op {
        Op::Check {
            policy,
            key: k,
            cost,
        } => {
            return limiter.check(policies[policy].name(), &key(k), cost).await;
        }
        Op::Peek {
            policy,
            key: k,
            cost,
        } => (policy, k, sluice::Op::Peek { cost }),
        Op::Refund {
            policy,
            key: k,
            cost,
        } => (policy, k, sluice::Op::Refund { cost }),
        Op::Acquire {
            policy,
            key: k,
            min,
            max,
        } => (
            policy,
            k,
            sluice::Op::Acquire {
                min,
                max,
                holder: 0,
            },
        ),
        Op::Hold {
            policy,
            key: k,
            cost,
            lease,
        } => (policy, k, sluice::Op::Hold { cost, lease }),
        Op::Release {
            policy,
            key: k,
            lease,
        } => (policy, k, sluice::Op::Release { lease }),
        Op::Advance(_) | Op::Forget { .. } | Op::Burst(_) => {
            unreachable!("handled by the caller")
        }
    };
    let (policy, key) = (&policies[policy], key(k));
    match op {
        sluice::Op::Peek { .. } | sluice::Op::Refund { .. } => limiter.call(policy, &key, op).await,
        // Through the store, at the limiter's now: the limiter has no acquire of its own, and
        // a hold keeps the lease id chosen here (the limiter picks a random one).
        _ => limiter
            .store()
            .call(sluice::Call::new(
                policy,
                &key,
                op,
                limiter.clock().now_ms(),
            ))
            .await
            .map_err(sluice::Error::from),
    }
}

fn clock_offset(clock: &ManualClock) -> u64 {
    use sluice::Clock;
    clock.now_ms() - T0
}

fn default_cases() -> u32 {
    std::env::var("SLUICE_DIFF_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(96)
}

/// Fixed windows as counters (the single fast path, the batched one, and the general path
/// reading and refunding them), until a case's clock runs half the margin ahead of Redis's.
#[test]
fn redis_functions_decide_like_the_memory_store() {
    run_differential(
        ScriptMode::Function,
        Start::OnRedisClock,
        default_cases(),
        MIN_OPS,
    );
}

/// A caller's clock years off Redis's: every fixed window is a hash in its key, read and
/// counted into by every path (the fast paths fall back to the general one).
#[test]
fn redis_functions_off_redis_clock_decide_like_the_memory_store() {
    run_differential(
        ScriptMode::Function,
        Start::FarBehind,
        default_cases() / 2,
        MIN_OPS / 2,
    );
}

#[test]
fn three_redis_shards_decide_like_the_memory_store() {
    let Some((servers, rt)) = started(|| {
        (0..3)
            .map(|_| RedisServer::start().expect("redis-server"))
            .collect::<Vec<_>>()
    }) else {
        return;
    };
    let shards = servers
        .iter()
        .map(|s| {
            rt.block_on(RedisStore::connect(config(s, ScriptMode::Function)))
                .expect("connect")
        })
        .collect();
    let sharded = sluice_redis::ShardedStore::new(shards).expect("shards");
    differential(
        "3 shards",
        &rt,
        sharded,
        default_cases() / 4,
        MIN_OPS / 4,
        Start::OnRedisClock,
    );
}

#[test]
fn redis_evalsha_decides_like_the_memory_store() {
    run_differential(
        ScriptMode::EvalSha,
        Start::OnRedisClock,
        default_cases() / 4,
        MIN_OPS / 4,
    );
}

/// Limits at the edges of the number range, where the Lua code computes `remaining` in 16-bit
/// limbs: the same sequence through both stores, decision for decision.
#[test]
fn huge_token_buckets_decide_like_the_memory_store() {
    let Some((server, rt)) = started(|| RedisServer::start().expect("redis-server")) else {
        return;
    };
    let max = sluice::core::MAX_AMOUNT;
    let year = 366 * 86_400_000;
    let specs = [
        LimitSpec::token_bucket(max, year),
        LimitSpec::token_bucket(max, 1).burst(max),
        LimitSpec::token_bucket(max - 1, 86_400_000).burst(max / 3),
        LimitSpec::token_bucket(3, year).burst(7),
        LimitSpec::token_bucket(1 << 40, 333).burst((1 << 53) - 7),
    ];
    let config = RedisConfig::new(server.url())
        .timeout(Duration::from_secs(5))
        .expiry_margin(Duration::from_secs(3_600));
    let redis = rt.block_on(RedisStore::connect(config)).expect("connect");
    for (i, spec) in specs.into_iter().enumerate() {
        let limit = Limit::new(spec.clone()).expect("valid limit");
        let policy = Policy::new(format!("huge{i}"), vec![limit.clone()]).unwrap();
        let clock = ManualClock::new(T0);
        let (memory, remote) = limiters(&redis, &clock, std::slice::from_ref(&policy));
        let name = format!("huge{i}");
        let costs = [
            1,
            limit.max() / 2,
            limit.max(),
            3,
            limit.max() / 3 + 1,
            0,
            limit.max() - 1,
        ];
        rt.block_on(async {
            for (step, cost) in costs.iter().cycle().take(40).enumerate() {
                let a = memory.check(&name, "k", *cost).await;
                let b = remote.check(&name, "k", *cost).await;
                assert_eq!(a, b, "{spec:?} step {step} cost {cost}");
                let refund = sluice::Op::Refund { cost: cost / 5 };
                let a = memory.call(&policy, "k", refund).await;
                let b = remote.call(&policy, "k", refund).await;
                assert_eq!(a, b, "{spec:?} step {step} refund {}", cost / 5);
                clock.advance(1 + (step as u64 * 7_919_993) % 86_400_000);
            }
        });
    }
}

/// The same scenarios through a 6-node Redis Cluster (3 primaries, 3 replicas): every
/// decision's keys share a slot, the client routes it. Peeks read the primaries here, since
/// replicas lag by design and this test demands identical answers.
#[test]
fn redis_cluster_decides_like_the_memory_store() {
    let Some((cluster, rt)) =
        started(|| sluice_testkit::RedisCluster::start().expect("redis cluster"))
    else {
        return;
    };
    let config = RedisConfig::cluster(cluster.urls())
        .read_from(sluice_redis::ReadFrom::Primary)
        .timeout(Duration::from_secs(5))
        .expiry_margin(Duration::from_secs(3_600));
    let store = rt.block_on(RedisStore::connect(config)).expect("connect");
    differential(
        "cluster",
        &rt,
        store,
        default_cases() / 4,
        MIN_OPS / 4,
        Start::OnRedisClock,
    );
}
