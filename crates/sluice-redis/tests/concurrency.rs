//! Concurrency limits (docs/algorithms.md#concurrency) on real Redis: many holders at once
//! never exceed `max`, a killed holder's lease lapses after its TTL, what a Redis restart
//! keeps, and each failure mode while Redis is down. The memory store runs the same contention
//! test, so both stores are held to the same count.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use sluice::{
    Clock, Decision, Degraded, Error, FailureMode, Lease, LimitSpec, Limiter, MemoryStore, Op,
    Policy, Store,
};
use sluice_redis::{RedisConfig, RedisStore};
use sluice_testkit::RedisServer;

const TASKS: usize = 64;
const CYCLES: usize = 40;
const MAX: u64 = 8;

/// The limiter's calls these tests make, by policy name.
trait ByName {
    /// A hold of a new lease: the decision and the lease, if it was admitted.
    async fn acquire(
        &self,
        name: &str,
        key: &str,
        cost: u64,
    ) -> Result<(Decision, Option<Lease>), Error>;
    async fn release(&self, name: &str, key: &str, id: u64) -> Result<Decision, Error>;
    async fn peek(&self, name: &str, key: &str, cost: u64) -> Result<Decision, Error>;
}

impl<S: Store, C: Clock + Sync> ByName for Limiter<S, C> {
    async fn acquire(
        &self,
        name: &str,
        key: &str,
        cost: u64,
    ) -> Result<(Decision, Option<Lease>), Error> {
        let id = Lease::new_id();
        let d = self
            .call(
                self.policy(name).unwrap(),
                key,
                Op::Hold { cost, lease: id },
            )
            .await?;
        let lease = Lease::of(id, &d);
        Ok((d, lease))
    }

    async fn release(&self, name: &str, key: &str, id: u64) -> Result<Decision, Error> {
        self.call(self.policy(name).unwrap(), key, Op::Release { lease: id })
            .await
    }

    async fn peek(&self, name: &str, key: &str, cost: u64) -> Result<Decision, Error> {
        self.call(self.policy(name).unwrap(), key, Op::Peek { cost })
            .await
    }
}

fn policy(ttl_ms: u64, mode: FailureMode) -> Policy {
    Policy::from_specs("jobs", vec![LimitSpec::concurrency(MAX, ttl_ms)])
        .unwrap()
        .with_failure_mode(mode)
}

/// A store timeout a loaded 2-core machine meets: the tests below count exactly, so a call
/// must not fail because the machine was busy.
const LOADED: Duration = Duration::from_millis(500);

fn config(server: &RedisServer) -> RedisConfig {
    RedisConfig::new(server.url()).timeout(LOADED)
}

/// 64 tasks each take and release a lease `CYCLES` times on one key. An independent counter,
/// raised after a lease is granted and lowered before it is released, is the number of
/// holders at any instant: it must never pass `MAX`. It must reach `MAX` too (the tasks
/// contend), and every cycle must end with its lease freed.
async fn never_more_than_max<S: Store + Clone + 'static>(store: S) {
    let limiter = Arc::new(Limiter::new(store).with_policy(policy(60_000, FailureMode::Closed)));
    let holding = Arc::new(AtomicU64::new(0));
    let peak = Arc::new(AtomicU64::new(0));
    let granted = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = (0..TASKS)
        .map(|_| {
            let (limiter, holding, peak, granted) = (
                limiter.clone(),
                holding.clone(),
                peak.clone(),
                granted.clone(),
            );
            tokio::spawn(async move {
                let mut done = 0;
                while done < CYCLES {
                    let (d, lease) = limiter.acquire("jobs", "hot", 1).await.unwrap();
                    let Some(lease) = lease else {
                        assert!(!d.allowed);
                        tokio::task::yield_now().await;
                        continue;
                    };
                    let now = holding.fetch_add(1, Ordering::SeqCst) + 1;
                    peak.fetch_max(now, Ordering::SeqCst);
                    granted.fetch_add(1, Ordering::SeqCst);
                    // Hold it across a few other tasks' turns.
                    for _ in 0..3 {
                        tokio::task::yield_now().await;
                    }
                    holding.fetch_sub(1, Ordering::SeqCst);
                    let freed = limiter.release("jobs", "hot", lease.id).await.unwrap();
                    assert_eq!(freed.cost, 1, "the lease was held until released");
                    done += 1;
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let peak = peak.load(Ordering::SeqCst);
    assert!(peak <= MAX, "{peak} holders at once, max {MAX}");
    assert_eq!(peak, MAX, "64 tasks contending should fill the limit");
    assert_eq!(granted.load(Ordering::SeqCst), (TASKS * CYCLES) as u64);
    let after = limiter.peek("jobs", "hot", 0).await.unwrap();
    assert_eq!(after.remaining(), MAX, "every lease was released");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixty_four_tasks_never_hold_more_than_max_on_redis() {
    if !sluice_testkit::require_redis() {
        return;
    }
    let server = RedisServer::start().unwrap();
    never_more_than_max(RedisStore::connect(config(&server)).await.unwrap()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixty_four_tasks_never_hold_more_than_max_on_a_redis_cluster() {
    if !sluice_testkit::require_redis() {
        return;
    }
    let cluster = sluice_testkit::RedisCluster::start().unwrap();
    let store = RedisStore::connect(RedisConfig::cluster(cluster.urls()).timeout(LOADED))
        .await
        .unwrap();
    never_more_than_max(store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixty_four_tasks_never_hold_more_than_max_in_memory() {
    never_more_than_max(Arc::new(MemoryStore::new())).await;
}

/// A holder killed before it releases (here: its task aborted while it holds the lease)
/// leaves the lease to lapse on Redis's own expiry times: refused until then, admitted after.
#[tokio::test]
async fn a_killed_holders_lease_lapses_after_its_ttl() {
    if !sluice_testkit::require_redis() {
        return;
    }
    let server = RedisServer::start().unwrap();
    let store = RedisStore::connect(config(&server)).await.unwrap();
    let limiter = Arc::new(
        Limiter::new(store)
            .with_policy(Policy::from_specs("one", vec![LimitSpec::concurrency(1, 400)]).unwrap()),
    );
    let (taken_tx, taken_rx) = tokio::sync::oneshot::channel();
    let holder = {
        let limiter = limiter.clone();
        tokio::spawn(async move {
            let (_, lease) = limiter.acquire("one", "k", 1).await.unwrap();
            taken_tx.send(lease.unwrap()).unwrap();
            std::future::pending::<()>().await; // works until killed; never releases
        })
    };
    let lease = taken_rx.await.unwrap();
    holder.abort();
    assert!(holder.await.unwrap_err().is_cancelled());

    let (refused, none) = limiter.acquire("one", "k", 1).await.unwrap();
    assert!(!refused.allowed && none.is_none());
    let wait = refused.retry_after_ms().unwrap();
    assert!(wait <= 400, "retry after {wait} ms, the TTL is 400");
    assert_eq!(refused.now_ms + wait, lease.expires_ms);
    let admitted = loop {
        let (d, l) = limiter.acquire("one", "k", 1).await.unwrap();
        if let Some(l) = l {
            break (d, l);
        }
        tokio::time::sleep(Duration::from_millis(20)).await; // polling Redis's clock
    };
    assert!(
        admitted.0.now_ms >= lease.expires_ms,
        "admitted at {} before the killed holder's lease lapsed at {}",
        admitted.0.now_ms,
        lease.expires_ms
    );
    // The lapsed lease is gone: releasing it frees nothing, the new one is held.
    assert_eq!(limiter.release("one", "k", lease.id).await.unwrap().cost, 0);
    assert_eq!(
        limiter
            .release("one", "k", admitted.1.id)
            .await
            .unwrap()
            .cost,
        1
    );
}

/// Polls until the restarted server answers through the store.
async fn until_answered(limiter: &Limiter<RedisStore>) {
    for _ in 0..500 {
        if limiter.peek("jobs", "k", 0).await.is_ok() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the restarted Redis did not answer within 5 s");
}

/// Leases live where Redis keeps its data. Without persistence a restart forgets them (the
/// limit is whole again, up to `max` over-admitted until the old holders finish); with an
/// append-only file synced on every write they survive, and releases still find them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_a_redis_restart_keeps_of_the_leases() {
    if !sluice_testkit::require_redis() {
        return;
    }
    for persistent in [false, true] {
        let args: &[&str] = if persistent {
            &["--appendonly", "yes", "--appendfsync", "always"]
        } else {
            &["--appendonly", "no", "--save", ""]
        };
        let mut server = RedisServer::start_with(args).unwrap();
        let limiter = Limiter::new(RedisStore::connect(config(&server)).await.unwrap())
            .with_policy(policy(60_000, FailureMode::Closed));
        let mut leases = Vec::new();
        for _ in 0..MAX {
            leases.push(limiter.acquire("jobs", "k", 1).await.unwrap().1.unwrap());
        }
        assert!(limiter.acquire("jobs", "k", 1).await.unwrap().1.is_none());

        tokio::task::block_in_place(|| server.restart().unwrap());
        until_answered(&limiter).await;

        let after = limiter.peek("jobs", "k", 1).await.unwrap();
        if persistent {
            assert!(!after.allowed, "the leases survived the restart");
        } else {
            assert_eq!(
                after.limits()[0].remaining,
                MAX,
                "a restart forgot the leases"
            );
        }
        // A release finds the lease (its unit freed) only where it survived.
        let released = limiter.release("jobs", "k", leases[0].id).await.unwrap();
        assert_eq!(released.cost, u64::from(persistent));
        if persistent {
            assert!(limiter.acquire("jobs", "k", 1).await.unwrap().1.is_some());
        }
    }
}

/// While Redis is down, each failure mode: `open` grants a lease nobody counts (degraded),
/// `closed` refuses to decide, `local` holds leases in the process's insurance store, which
/// enforces `max` and frees them on release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_failure_mode_while_redis_is_down() {
    if !sluice_testkit::require_redis() {
        return;
    }
    let mut server = RedisServer::start().unwrap();
    let store = RedisStore::connect(config(&server)).await.unwrap();
    let policies = [
        policy(60_000, FailureMode::Open),
        Policy::from_specs("closed", vec![LimitSpec::concurrency(MAX, 60_000)])
            .unwrap()
            .with_failure_mode(FailureMode::Closed),
        Policy::from_specs("local", vec![LimitSpec::concurrency(2, 60_000)])
            .unwrap()
            .with_failure_mode(FailureMode::Local),
    ];
    let limiter = Limiter::new(store).with_policies(policies);
    tokio::task::block_in_place(|| server.kill().unwrap());

    let (open, lease) = limiter.acquire("jobs", "k", 1).await.unwrap();
    assert!(open.allowed);
    assert_eq!(open.degraded, Some(Degraded::Open));
    assert!(lease.is_some(), "the caller may go ahead");

    match limiter.acquire("closed", "k", 1).await {
        Err(Error::Store(e)) => assert!(e.is_transient(), "{e}"),
        other => panic!("closed: {other:?}"),
    }

    let (a, first) = limiter.acquire("local", "k", 1).await.unwrap();
    assert_eq!(a.degraded, Some(Degraded::Local));
    assert!(limiter.acquire("local", "k", 1).await.unwrap().1.is_some());
    let (full, none) = limiter.acquire("local", "k", 1).await.unwrap();
    assert!(!full.allowed && none.is_none(), "local enforces max 2");
    let freed = limiter
        .release("local", "k", first.unwrap().id)
        .await
        .unwrap();
    assert_eq!((freed.cost, freed.degraded), (1, Some(Degraded::Local)));
    assert!(limiter.acquire("local", "k", 1).await.unwrap().1.is_some());
}

/// A lease is asked only of a policy with a concurrency limit.
#[tokio::test]
async fn a_policy_without_a_concurrency_limit_has_no_leases() {
    let limiter = Limiter::new(MemoryStore::new())
        .with_policy(Policy::from_specs("rate", vec![LimitSpec::fixed_window(5, 1_000)]).unwrap());
    let err = limiter.acquire("rate", "k", 1).await.unwrap_err();
    assert_eq!(err, Error::NotConcurrent("rate".to_owned()));
    assert!(err.to_string().contains("algorithm: concurrency"), "{err}");
    assert_eq!(
        limiter.release("rate", "k", 1).await.unwrap_err(),
        Error::NotConcurrent("rate".to_owned())
    );
}

/// Many leases on one key (more than the script reads per batch when it looks for the wait of
/// a refused cost), taken, renewed, released and lapsing at many instants: Redis decides every
/// step exactly as the memory store does.
#[tokio::test]
async fn many_leases_decide_like_the_memory_store() {
    if !sluice_testkit::require_redis() {
        return;
    }
    use sluice::{Clock, ManualClock, Op};
    let server = RedisServer::start().unwrap();
    let redis = RedisStore::connect(config(&server).expiry_margin(Duration::from_secs(3_600)))
        .await
        .unwrap();
    let memory = MemoryStore::new();
    let policy = Policy::from_specs(
        "wide",
        vec![
            LimitSpec::concurrency(60, 10_000),
            LimitSpec::token_bucket(1_000, 1_000),
        ],
    )
    .unwrap();
    let clock = ManualClock::new(1_700_000_000_000);
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = |n: u64| {
        seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
        (seed >> 33) % n
    };
    let mut steps = 0;
    for step in 0..3_000 {
        let op = match next(10) {
            0..=4 => Op::Hold {
                cost: [1, 1, 1, 2, 5, 30, 61][next(7) as usize],
                lease: 1 + next(80),
            },
            5..=7 => Op::Release {
                lease: 1 + next(80),
            },
            8 => Op::Check { cost: next(40) },
            _ => {
                clock.advance(next(700));
                continue;
            }
        };
        let now = clock.now_ms();
        let a = memory
            .call(sluice::Call::new(&policy, "k", op, now))
            .await
            .unwrap();
        let b = redis
            .call(sluice::Call::new(&policy, "k", op, now))
            .await
            .unwrap();
        assert_eq!(a, b, "step {step}: {op:?}");
        steps += 1;
    }
    assert!(steps > 2_500, "{steps} decisions compared");
}
