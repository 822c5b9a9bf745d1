//! Where bad state meets the script: a counter left without expiry, number-like
//! strings, thousands of lapsed leases. Each case is decided single and batched; a fault is
//! corrupt state (not transient, the same single or batched) while the bad key exists, and
//! never outlives it.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use std::time::Duration;

use sluice::{Decision, LimitSpec, Op, Policy, Store, StoreError, StoreErrorKind, StoreExt};
use sluice_redis::{RedisConfig, RedisStore};
use sluice_testkit::RedisServer;

fn policy(name: &str, specs: Vec<LimitSpec>) -> Policy {
    Policy::from_specs(name, specs).unwrap()
}

fn now() -> u64 {
    sluice::Clock::now_ms(&sluice::SystemClock)
}

/// A fresh Redis and a store on it; `None` (the test is skipped) without `redis-server`.
async fn started() -> Option<(RedisServer, RedisStore)> {
    if !sluice_testkit::require_redis() {
        return None;
    }
    let server = RedisServer::start().unwrap();
    let s = RedisStore::connect(RedisConfig::new(server.url()).timeout(Duration::from_secs(5)))
        .await
        .expect("connect to redis");
    Some((server, s))
}

/// The Redis key of limit `i` of `p` for `key` (a fixed window's carries the default margin
/// of 1 s in its name).
fn redis_key(p: &Policy, key: &str, i: usize) -> String {
    sluice_redis::keys::policy_keys("sluice:", p, key, "1000")[i].clone()
}

/// Policy `api` (one fixed window of 10 a minute) and the Redis key of its counter for `k2`.
fn api_k2_counter() -> (Policy, String) {
    let p = policy("api", vec![LimitSpec::fixed_window(10, 60_000)]);
    let counter = redis_key(&p, "k2", 0);
    (p, counter)
}

/// Checks of `cost` on keys `k0..k4`, together: one batch (a bad key among them fails alone).
async fn batched(s: &RedisStore, p: &Policy, cost: u64) -> Vec<Result<Decision, StoreError>> {
    let keys: Vec<String> = (0..5).map(|i| format!("k{i}")).collect();
    let at = now();
    sluice_testkit::join_in_order(keys.iter().map(|k| s.check(p, k, cost, at))).await
}

fn pexpiretime(server: &RedisServer, key: &str) -> i64 {
    match server.cmd(&["PEXPIRETIME", key]).unwrap() {
        redis::Value::Int(n) => n,
        other => panic!("PEXPIRETIME {key}: {other:?}"),
    }
}

fn assert_corrupt(what: &str, r: &Result<Decision, StoreError>) {
    match r {
        Err(e @ StoreError::Corrupt { .. }) => assert!(!e.is_transient(), "{what}"),
        other => panic!("{what}: expected corrupt state, got {other:?}"),
    }
}

// ----- a failed fast path leaves nothing behind ---------------------------------------

/// Bad state in a fixed window's key, each met by the fast path (single and batched): a
/// negative count (found after the INCRBY), a key of another type, a hash without its end.
/// The check fails as corrupt state and leaves the key as it was (no counter without expiry
/// behind it), and once the bad key is deleted the key decides again. A hash of the earlier
/// layout (`<stem>:fw<per>`, which a fast path read unprotected after its INCRBY,
/// leaving a counter without expiry that failed for ever) is no longer read at all.
#[tokio::test]
async fn a_failed_fast_path_leaves_nothing_behind() {
    let Some((server, s)) = started().await else {
        return;
    };
    let (p, counter) = api_k2_counter();
    let faults: [&[&str]; 3] = [
        &["SET", &counter, "-5"],
        &["LPUSH", &counter, "x"],
        &["HSET", &counter, "used", "3"],
    ];
    for fault in faults {
        for batch in [false, true] {
            server.cmd(&["FLUSHALL"]).unwrap();
            server.cmd(fault).unwrap();
            let before = server.cmd(&["DUMP", &counter]).unwrap();
            let what = format!("{fault:?}, batch {batch}");
            if batch {
                let decided = batched(&s, &p, 1).await;
                assert_corrupt(&what, &decided[2]);
                for (i, d) in decided.iter().enumerate().filter(|(i, _)| *i != 2) {
                    assert!(matches!(d, Ok(d) if d.allowed), "{what}: k{i}: {d:?}");
                }
            } else {
                assert_corrupt(&what, &s.check(&p, "k2", 1, now()).await);
            }
            assert_eq!(before, server.cmd(&["DUMP", &counter]).unwrap(), "{what}");
            server.cmd(&["DEL", &counter]).unwrap();
            let d = s.check(&p, "k2", 1, now()).await.unwrap();
            assert!(d.allowed && d.remaining() == 9, "{what}: {d:?}");
            assert!(pexpiretime(&server, &counter) > 0, "{what}");
        }
    }
    // The earlier layout's hash, of the wrong type: not read.
    server.cmd(&["FLUSHALL"]).unwrap();
    let old = format!("{}:fw60000", sluice_redis::keys::stem("sluice:", &p, "k2"));
    server.cmd(&["SET", &old, "garbage"]).unwrap();
    let d = s.check(&p, "k2", 1, now()).await.unwrap();
    assert!(d.allowed && d.remaining() == 9, "{d:?}");
    assert!(pexpiretime(&server, &counter) > 0);
}

// ----- a counter without expiry is re-armed --------------------------------------------

/// How a counter lost its expiry.
fn strip_expiry(server: &RedisServer, counter: &str, how: &str) {
    match how {
        "PERSIST" => {
            server.cmd(&["PERSIST", counter]).unwrap();
        }
        "RESTORE 0" => {
            let dump = match server.cmd(&["DUMP", counter]).unwrap() {
                redis::Value::BulkString(b) => b,
                other => panic!("DUMP: {other:?}"),
            };
            server.cmd(&["DEL", counter]).unwrap();
            let mut conn = server.connection().unwrap();
            redis::cmd("RESTORE")
                .arg(counter)
                .arg(0)
                .arg(dump)
                .query::<()>(&mut conn)
                .unwrap();
        }
        _ => {
            server.cmd(&["SET", counter, "3"]).unwrap();
        }
    }
    assert_eq!(pexpiretime(server, counter), -1, "{how}");
}

/// A counter whose expiry is gone (PERSIST, `RESTORE key 0`, a tool's `SET`) is a window whose
/// end cannot be known: it is re-armed (its count kept, a fresh end), never corrupt state.
/// Checks admit what is left of `max`, peeks and refunds decide, single and batched.
#[tokio::test]
async fn a_counter_without_expiry_is_rearmed_with_its_count() {
    let Some((server, s)) = started().await else {
        return;
    };
    let p = policy("api", vec![LimitSpec::fixed_window(5, 60_000)]);
    for how in ["PERSIST", "RESTORE 0", "SET"] {
        for batch in [false, true] {
            server.cmd(&["FLUSHALL"]).unwrap();
            let counter = redis_key(&p, "k2", 0);
            for _ in 0..3 {
                assert!(s.check(&p, "k2", 1, now()).await.unwrap().allowed);
            }
            strip_expiry(&server, &counter, how);
            let what = format!("{how}, batch {batch}");
            let peek = s.peek(&p, "k2", 1, now()).await.unwrap();
            assert!(peek.allowed && peek.remaining() == 1, "{what}: {peek:?}");
            let mut admitted = 0;
            for _ in 0..4 {
                let d = if batch {
                    batched(&s, &p, 1).await.swap_remove(2)
                } else {
                    s.check(&p, "k2", 1, now()).await
                };
                let d = d.unwrap_or_else(|e| panic!("{what}: {e}"));
                admitted += u64::from(d.allowed);
                assert!(d.reset_ms() <= now() + 60_000 + 1_000, "{what}: {d:?}");
            }
            assert_eq!(admitted, 2, "{what}: the count survived the lost expiry");
            assert!(pexpiretime(&server, &counter) > 0, "{what}: re-armed");
            s.call(sluice::Call::new(&p, "k2", Op::Refund { cost: 1 }, now()))
                .await
                .unwrap();
        }
    }
    // The general path (a refund) meets a counter without expiry too.
    server.cmd(&["FLUSHALL"]).unwrap();
    let counter = redis_key(&p, "k", 0);
    assert!(s.check(&p, "k", 1, now()).await.unwrap().allowed);
    server.cmd(&["PERSIST", &counter]).unwrap();
    s.call(sluice::Call::new(&p, "k", Op::Refund { cost: 1 }, now()))
        .await
        .unwrap();
    assert!(s.check(&p, "k", 1, now()).await.unwrap().allowed);
}

/// The same on a policy of several fixed windows (`fw_fast`) and of a window and a bucket
/// (`rate`, the lean path).
#[tokio::test]
async fn a_counter_without_expiry_is_rearmed_on_every_path() {
    let Some((server, s)) = started().await else {
        return;
    };
    let policies = [
        policy(
            "two",
            vec![
                LimitSpec::fixed_window(5, 60_000),
                LimitSpec::fixed_window(50, 3_600_000).aligned(),
            ],
        ),
        policy(
            "mixed",
            vec![
                LimitSpec::fixed_window(5, 60_000),
                LimitSpec::token_bucket(100, 1_000),
            ],
        ),
    ];
    for p in &policies {
        for batch in [false, true] {
            server.cmd(&["FLUSHALL"]).unwrap();
            for _ in 0..3 {
                assert!(s.check(p, "k2", 1, now()).await.unwrap().allowed);
            }
            let counter = redis_key(p, "k2", 0);
            server.cmd(&["PERSIST", &counter]).unwrap();
            let mut admitted = 0;
            for _ in 0..4 {
                let d = if batch {
                    batched(&s, p, 1).await.swap_remove(2)
                } else {
                    s.check(p, "k2", 1, now()).await
                };
                admitted += u64::from(d.unwrap_or_else(|e| panic!("{}: {e}", p.name())).allowed);
            }
            assert_eq!(admitted, 2, "{} batch {batch}", p.name());
            assert!(pexpiretime(&server, &counter) > 0, "{}: re-armed", p.name());
        }
    }
}

// ----- number-like strings --------------------------------------------------------------

/// What Lua's `tonumber` takes and Redis's `INCRBY`/`HINCRBY` refuse.
const NUMBER_LIKE: [&str; 7] = ["0x1", " 5", "5 ", "1e3", "+5", "05", "1.0"];

/// A number-like string in a fixed window's count, behind a token bucket that admits: the
/// decision is corrupt state before anything is written (the bucket's state unchanged), the
/// same single and batched; deleting the bad key ends it.
#[tokio::test]
async fn number_like_strings_are_corrupt_state_before_any_write() {
    let Some((server, s)) = started().await else {
        return;
    };
    let p = policy(
        "mix",
        vec![
            LimitSpec::token_bucket(100, 1_000),
            LimitSpec::fixed_window(10, 3_600_000),
        ],
    );
    let one = policy("one", vec![LimitSpec::fixed_window(10, 3_600_000)]);
    for bad in NUMBER_LIKE {
        for batch in [false, true] {
            for p in [&p, &one] {
                server.cmd(&["FLUSHALL"]).unwrap();
                let what = format!("{bad:?} in {}, batch {batch}", p.name());
                // Every key opened, so the bucket has state a write would change.
                assert!(s.check(p, "k2", 1, now()).await.unwrap().allowed);
                let i = p.limits().len() - 1;
                let counter = redis_key(p, "k2", i);
                server.cmd(&["SET", &counter, bad, "KEEPTTL"]).unwrap();
                let keys: Vec<String> = (0..p.limits().len())
                    .map(|j| redis_key(p, "k2", j))
                    .collect();
                let before: Vec<_> = keys
                    .iter()
                    .map(|k| server.cmd(&["DUMP", k]).unwrap())
                    .collect();
                let r = if batch {
                    batched(&s, p, 1).await.swap_remove(2)
                } else {
                    s.check(p, "k2", 1, now()).await
                };
                assert_corrupt(&what, &r);
                let after: Vec<_> = keys
                    .iter()
                    .map(|k| server.cmd(&["DUMP", k]).unwrap())
                    .collect();
                assert_eq!(before, after, "{what}: a failed decision wrote");
                server.cmd(&["DEL", &counter]).unwrap();
                assert!(s.check(p, "k2", 1, now()).await.unwrap().allowed, "{what}");
            }
        }
    }
}

/// Number-like strings in every other field the script reads (a bucket's `tat` and `frac`, a
/// sliding window's bucket, a lease's cost) are corrupt state too, on the lean and the general
/// path.
#[tokio::test]
async fn number_like_strings_in_any_field_are_corrupt_state() {
    let Some((server, s)) = started().await else {
        return;
    };
    let bucket = policy("tb", vec![LimitSpec::token_bucket(10, 60_000)]);
    let sliding = policy(
        "sw",
        vec![LimitSpec::sliding_window(10, 60_000).precision_ms(1_000)],
    );
    let leases = policy("cc", vec![LimitSpec::concurrency(10, 60_000)]);
    for bad in NUMBER_LIKE {
        let t = now();
        let bucket_key = redis_key(&bucket, "k", 0);
        let sliding_key = redis_key(&sliding, "k", 0);
        let stem = sluice_redis::keys::stem("sluice:", &leases, "k");
        let units = sluice_redis::keys::units_key(&stem);
        let leases_key = format!("{stem}:cc");
        let current = (t - t % 1_000).to_string();
        let future = (t + 30_000).to_string();
        // A lease's cost is read once it has lapsed.
        let past = (t - 1_000).to_string();
        let cases: Vec<(&Policy, Vec<Vec<&str>>)> = vec![
            (
                &bucket,
                vec![vec!["HSET", &bucket_key, "tat", bad, "frac", "0"]],
            ),
            (
                &bucket,
                vec![vec!["HSET", &bucket_key, "tat", &future, "frac", bad]],
            ),
            (&sliding, vec![vec!["HSET", &sliding_key, &current, bad]]),
            (&sliding, vec![vec!["HSET", &sliding_key, bad, "1"]]),
            (
                &leases,
                vec![
                    vec!["ZADD", &leases_key, &past, "7"],
                    vec!["HSET", &units, "7", bad, "used", "1"],
                ],
            ),
            (
                &leases,
                vec![
                    vec!["ZADD", &leases_key, &future, "7"],
                    vec!["HSET", &units, "7", "1", "used", bad],
                ],
            ),
        ];
        for (p, setup) in cases {
            server.cmd(&["FLUSHALL"]).unwrap();
            for cmd in &setup {
                server.cmd(cmd).unwrap();
            }
            let what = format!("{bad:?}: {setup:?}");
            let ops = [
                Op::Check { cost: 1 },
                Op::Peek { cost: 1 },
                Op::Refund { cost: 1 },
            ];
            for op in ops {
                let r = s.call(sluice::Call::new(p, "k", op, t)).await;
                match r {
                    Err(StoreError::Corrupt { .. }) => {}
                    // A refund of a bucket without debt, or of leases, reads nothing it doubts.
                    Ok(_) if matches!(op, Op::Refund { .. }) => {}
                    other => panic!("{what} {op:?}: {other:?}"),
                }
            }
        }
    }
}

// ----- thousands of lapsed leases ------------------------------------------------------

/// 10,000 leases lapsed between two visits: the next decision reads and drops them all (in
/// bounded chunks: Lua unpacks at most ~8,000 values at once), then decides as if the key were
/// new.
#[tokio::test]
async fn ten_thousand_lapsed_leases_are_dropped_in_one_decision() {
    const N: usize = 10_000;
    let Some((server, s)) = started().await else {
        return;
    };
    let p = policy("cc", vec![LimitSpec::concurrency(20_000, 60_000)]);
    let stem = sluice_redis::keys::stem("sluice:", &p, "k");
    let (set, units) = (format!("{stem}:cc"), sluice_redis::keys::units_key(&stem));
    let t = now();
    let lapse = (t - 1_000).to_string();
    for op in [
        Op::Peek { cost: 1 },
        Op::Hold { cost: 1, lease: 1 },
        Op::Release { lease: 2 },
    ] {
        server.cmd(&["FLUSHALL"]).unwrap();
        let ids: Vec<String> = (0..N).map(|i| format!("{}", 1_000 + i)).collect();
        let mut zadd = vec!["ZADD", set.as_str()];
        let mut hset = vec!["HSET", units.as_str()];
        for id in &ids {
            zadd.extend([lapse.as_str(), id.as_str()]);
            hset.extend([id.as_str(), "1"]);
        }
        let used = N.to_string();
        hset.extend(["used", used.as_str()]);
        server.cmd(&zadd).unwrap();
        server.cmd(&hset).unwrap();
        let d = s
            .call(sluice::Call::new(&p, "k", op, t))
            .await
            .unwrap_or_else(|e| panic!("{op:?}: {e}"));
        assert!(d.allowed, "{op:?}: {d:?}");
        if let Op::Hold { .. } = op {
            assert_eq!(d.remaining(), 20_000 - 1, "{d:?}");
            assert_eq!(server.cmd(&["ZCARD", &set]).unwrap(), redis::Value::Int(1));
        }
    }
}

/// The batch's classification of a failure is the single call's: the same fault, the same
/// kind.
#[tokio::test]
async fn the_same_fault_is_the_same_kind_single_and_batched() {
    let Some((server, s)) = started().await else {
        return;
    };
    let (p, counter) = api_k2_counter();
    for setup in [
        vec!["SET", counter.as_str(), "x"],
        vec!["LPUSH", counter.as_str(), "x"],
    ] {
        server.cmd(&["FLUSHALL"]).unwrap();
        server.cmd(&setup).unwrap();
        let single = s.check(&p, "k2", 1, now()).await.unwrap_err().kind();
        let batch = batched(&s, &p, 1).await.swap_remove(2).unwrap_err().kind();
        assert_eq!(single, batch, "{setup:?}");
        assert_eq!(single, StoreErrorKind::Corrupt, "{setup:?}");
    }
}
