//! The Redis store against real Redis: exactness under concurrency, no wobbling reset, stale
//! replicas, recovery after a restart or a flushed script cache, bad data, timeouts.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod support;

use std::collections::BTreeSet;
use std::time::Duration;

use sluice::{
    Decision, LimitSpec, Limiter, ManualClock, Op, Policy, Store, StoreError, StoreExt, SystemClock,
};
use sluice_redis::{ClockSource, ReadFrom, RedisConfig, RedisStore, ScriptMode};
use sluice_testkit::RedisServer;
use support::{admitted_by_64_tasks, cut_off, replica_reads};

const T0: u64 = 1_700_000_000_000;

fn policy(name: &str, specs: Vec<LimitSpec>) -> Policy {
    Policy::from_specs(name, specs).unwrap()
}

async fn store(config: RedisConfig) -> RedisStore {
    RedisStore::connect(config).await.expect("connect to redis")
}

/// A fresh Redis and a store on it with `timeout`; `None` (the test is skipped) without
/// `redis-server`.
async fn started(timeout: Duration) -> Option<(RedisServer, RedisStore)> {
    if !sluice_testkit::require_redis() {
        return None;
    }
    let server = RedisServer::start().unwrap();
    let s = store(RedisConfig::new(server.url()).timeout(timeout)).await;
    Some((server, s))
}

// ----- exactness under concurrency ----------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_tasks_admit_exactly_max_for_each_algorithm() {
    if !sluice_testkit::require_redis() {
        return;
    }
    let server = RedisServer::start().unwrap();
    for spec in [
        LimitSpec::fixed_window(1_000, 60_000),
        LimitSpec::sliding_window(1_000, 60_000),
        LimitSpec::token_bucket(1_000, 60_000),
    ] {
        assert_eq!(
            admitted_by_64_tasks(&server, spec.clone(), T0, 5_000).await,
            (1_000, 0),
            "{spec:?}: (admitted by Redis, degraded)"
        );
    }
    // Coalescing is on (the default): the 3 × 64 × 5 000 checks took far fewer calls.
    let calls = script_calls(&server);
    println!("{} checks in {calls} script calls", 3 * 64 * 5_000);
    assert!(
        calls < 3 * 64 * 5_000 / 2,
        "{calls} script calls: little coalesced"
    );
    // 64 concurrent tasks shared the store's one multiplexed connection: besides the test
    // kit's own connection, the server saw at most a handful of clients.
    let clients: u64 = server
        .info_field("clients", "connected_clients")
        .unwrap()
        .unwrap()
        .parse()
        .unwrap();
    assert!(clients <= 4, "{clients} connections for 64 tasks");
}

// ----- no wobble ----------------------------------------------------------------------------

async fn distinct_resets(store: RedisStore) -> (usize, BTreeSet<u64>) {
    let limiter = Limiter::new(store)
        .with_clock(SystemClock)
        .with_policy(policy(
            "wobble",
            vec![LimitSpec::fixed_window(1_000_000, 3_600_000)],
        ));
    let started = std::time::Instant::now();
    let mut resets = BTreeSet::new();
    let mut checks = 0;
    let mut tick = tokio::time::interval(Duration::from_millis(2));
    while checks < 1_000 || started.elapsed() < Duration::from_millis(2_100) {
        tick.tick().await;
        let d = limiter.check("wobble", "user:1", 1).await.unwrap();
        assert!(d.allowed);
        resets.insert(d.reset_ms());
        checks += 1;
    }
    (checks, resets)
}

#[tokio::test]
async fn one_window_reports_one_reset_over_two_seconds_of_real_time() {
    if !sluice_testkit::require_redis() {
        return;
    }
    let server = RedisServer::start().unwrap();
    for clock in [ClockSource::App, ClockSource::Redis] {
        server.cmd(&["FLUSHALL"]).unwrap();
        let s = store(
            RedisConfig::new(server.url())
                .clock(clock)
                .timeout(Duration::from_secs(2)),
        )
        .await;
        let (checks, resets) = distinct_resets(s).await;
        assert!(checks >= 1_000);
        assert_eq!(
            resets.len(),
            1,
            "{clock:?}: {checks} checks saw resets {resets:?}"
        );
    }
}

// ----- stale replica ------------------------------------------------------------------------

/// The anomalies GitHub saw: "denied with remaining = max" and a reset that moves backwards
/// inside a window.
fn assert_consistent(label: &str, d: &Decision, cost: u64, last_reset: &mut [u64]) {
    for (i, s) in d.limits().iter().enumerate() {
        let full = s.max.max(s.remaining);
        assert!(
            !(!s.admits && s.remaining >= full && cost <= s.max),
            "{label}: limit {i} refused {cost} with remaining = max: {d:?}"
        );
    }
    // The fixed window (limit 0): while it has something counted, its reset only moves on.
    let fixed = &d.limits()[0];
    if fixed.remaining < fixed.max {
        assert!(
            fixed.reset_ms >= last_reset[0],
            "{label}: reset moved backwards: {d:?}"
        );
        last_reset[0] = fixed.reset_ms;
    }
}

#[tokio::test]
async fn a_stale_replica_reports_an_older_state_never_a_contradictory_one() {
    if !sluice_testkit::require_redis() {
        return;
    }
    let (set, config) = replica_reads();
    let replica = &set.replicas[0];
    let clock = ManualClock::new(T0);
    let config = config.expiry_margin(Duration::from_secs(600));
    let p = policy(
        "api",
        vec![
            LimitSpec::fixed_window(5, 1_000),
            LimitSpec::sliding_window(8, 2_000).precision_ms(100),
            LimitSpec::token_bucket(5, 1_000),
        ],
    );
    let limiter = Limiter::new(store(config).await)
        .with_clock(clock.clone())
        .with_policy(p);
    let mut last = [0u64; 1];
    let api = limiter.policy("api").unwrap().clone();

    // Window 1 fills up and reaches the replica.
    for _ in 0..5 {
        let d = limiter.check("api", "k", 1).await.unwrap();
        assert_consistent("primary, window 1", &d, 1, &mut last);
    }
    set.wait_replicated().unwrap();
    let d = limiter.call(&api, "k", Op::Peek { cost: 1 }).await.unwrap();
    assert!(!d.allowed, "the replica knows window 1 is full");
    assert_consistent("replica, window 1", &d, 1, &mut last);

    // Replication stops: the replica keeps serving its (now aging) copy.
    cut_off(replica);

    // The primary moves past window 1's end and admits into window 2, 3, ….
    for round in 0..6 {
        clock.advance(700);
        for _ in 0..3 {
            let d = limiter.check("api", "k", 1).await.unwrap();
            assert_consistent(&format!("primary, round {round}"), &d, 1, &mut last);
        }
        for cost in [1, 2, 5] {
            let d = limiter.call(&api, "k", Op::Peek { cost }).await.unwrap();
            let mut replica_last = [0u64; 1];
            assert_consistent(
                &format!("stale replica, round {round}, cost {cost}"),
                &d,
                cost,
                &mut replica_last,
            );
        }
    }
    // The replica really was stale: it still holds window 1 as it was (a hash: the manual
    // clock is years behind Redis's).
    let stale_used = replica
        .cmd(&["HGET", "sluice:{3:api:k}:fw1000:c600000", "used"])
        .unwrap();
    assert_eq!(stale_used, redis::Value::BulkString(b"5".to_vec()));

    // Replication resumes and the replica catches up.
    replica
        .cmd(&["REPLICAOF", "127.0.0.1", &set.primary.port().to_string()])
        .unwrap();
    set.wait_synced().unwrap();
    set.wait_replicated().unwrap();
    let from_primary = {
        // The same margin: a fixed window's key carries it.
        let s = store(
            RedisConfig::new(set.primary.url())
                .read_from(ReadFrom::Primary)
                .expiry_margin(Duration::from_secs(600)),
        )
        .await;
        let l = Limiter::new(s)
            .with_clock(clock.clone())
            .with_policy(limiter.policy("api").unwrap().clone());
        l.call(&api, "k", Op::Peek { cost: 1 }).await.unwrap()
    };
    assert_eq!(
        limiter.call(&api, "k", Op::Peek { cost: 1 }).await.unwrap(),
        from_primary
    );
}

// ----- recovery -----------------------------------------------------------------------------

async fn check_until_ok(limiter: &Limiter<RedisStore, ManualClock>) -> (Decision, usize) {
    let mut failures = 0;
    loop {
        match limiter.check("api", "k", 1).await {
            Ok(d) => return (d, failures),
            Err(sluice::Error::Store(e)) => {
                assert!(e.is_transient(), "a restart must look transient, got {e}");
                failures += 1;
                assert!(failures < 50, "the store did not recover: {e}");
            }
            Err(e) => panic!("{e}"),
        }
    }
}

#[tokio::test]
async fn the_store_recovers_from_a_restart_and_flushed_code() {
    if !sluice_testkit::require_redis() {
        return;
    }
    let mut server = RedisServer::start().unwrap();
    for mode in [ScriptMode::Function, ScriptMode::EvalSha] {
        server.cmd(&["FLUSHALL"]).unwrap();
        let config = RedisConfig::new(server.url())
            .script_mode(mode)
            .timeout(Duration::from_secs(2));
        // Closed: a failed call is an error here, not an allowed (open) decision.
        let api = policy("api", vec![LimitSpec::fixed_window(100, 60_000)])
            .with_failure_mode(sluice::FailureMode::Closed);
        let limiter = Limiter::new(store(config).await)
            .with_clock(ManualClock::new(T0))
            .with_policy(api);
        assert!(limiter.check("api", "k", 1).await.unwrap().allowed);

        // The code vanishes from the server: the next call reloads it and succeeds.
        server.cmd(&["FUNCTION", "FLUSH"]).unwrap();
        server.cmd(&["SCRIPT", "FLUSH"]).unwrap();
        let d = limiter
            .check("api", "k", 1)
            .await
            .expect("recovers on the next call");
        assert_eq!(d.remaining(), 98);

        // A restart loses data and code; the dropped connection is re-established.
        server.restart().unwrap();
        let (d, failures) = check_until_ok(&limiter).await;
        assert!(
            failures <= 2,
            "{mode:?}: {failures} failed calls after the restart"
        );
        assert_eq!(d.remaining(), 99, "the restarted server starts empty");
    }
}

// ----- bad data -----------------------------------------------------------------------------

#[tokio::test]
async fn bad_data_gives_a_clear_error_and_changes_nothing() {
    if !sluice_testkit::require_redis() {
        return;
    }
    let server = RedisServer::start().unwrap();
    let p = policy(
        "api",
        vec![
            LimitSpec::fixed_window(10, 60_000),
            LimitSpec::sliding_window(10, 60_000),
            LimitSpec::token_bucket(10, 60_000),
        ],
    );
    let s = store(RedisConfig::new(server.url()).timeout(Duration::from_secs(2))).await;
    let keys = sluice_redis::keys::policy_keys("sluice:", &p, "k", "1000");
    let cases: Vec<(&str, Vec<Vec<&str>>)> = vec![
        ("wrong type", vec![vec!["SET", &keys[0], "x"]]),
        (
            "non-numeric used",
            vec![vec![
                "HSET",
                &keys[0],
                "reset",
                "99999999999999",
                "used",
                "lots",
            ]],
        ),
        (
            "half a window",
            vec![vec!["HSET", &keys[0], "reset", "99999999999999"]],
        ),
        (
            "negative bucket",
            vec![vec!["HSET", &keys[1], "1700000000000", "-3"]],
        ),
        (
            "fraction above max",
            vec![vec!["HSET", &keys[2], "tat", "1700000000000", "frac", "10"]],
        ),
        ("wrong type bucket", vec![vec!["LPUSH", &keys[2], "x"]]),
    ];
    for (what, setup) in cases {
        server.cmd(&["FLUSHALL"]).unwrap();
        for cmd in &setup {
            server.cmd(cmd).unwrap();
        }
        let before: Vec<redis::Value> = keys
            .iter()
            .map(|k| server.cmd(&["DUMP", k]).unwrap())
            .collect();
        for op in 0..3 {
            let r = match op {
                0 => s.check(&p, "k", 1, T0).await,
                1 => s.peek(&p, "k", 1, T0).await,
                _ => {
                    s.call(sluice::Call::new(&p, "k", Op::Refund { cost: 1 }, T0))
                        .await
                }
            };
            match r {
                Err(StoreError::Corrupt { key, detail }) => {
                    assert!(key.contains("{3:api:k}"), "{what}: {key}");
                    assert!(!detail.is_empty());
                }
                other => panic!("{what}: expected a corrupt-state error, got {other:?}"),
            }
        }
        let after: Vec<redis::Value> = keys
            .iter()
            .map(|k| server.cmd(&["DUMP", k]).unwrap())
            .collect();
        assert_eq!(before, after, "{what}: a failed decision changed state");
    }
}

// ----- timeouts -----------------------------------------------------------------------------

/// `n` checks together on a stalled Redis, through a store with the default timeout (50 ms):
/// each times out on its own, typed and transient, and the store answers again once Redis
/// does.
async fn checks_on_a_stalled_primary_time_out(n: usize) {
    let Some((server, s)) = started(sluice_redis::DEFAULT_TIMEOUT).await else {
        return;
    };
    let p = policy("api", vec![LimitSpec::fixed_window(100, 60_000)]);
    assert!(s.check(&p, "k", 1, T0).await.is_ok());
    server.pause().unwrap();
    let paused = std::time::Instant::now();
    let decided = sluice_testkit::join_in_order((0..n).map(|_| s.check(&p, "k", 1, T0))).await;
    let waited = paused.elapsed();
    server.resume().unwrap();
    for d in decided {
        assert_eq!(d, Err(StoreError::Timeout(Duration::from_millis(50))));
        assert!(d.unwrap_err().is_transient());
    }
    assert!(waited < Duration::from_secs(1), "waited {waited:?}");
    // After the stall, the same store answers again.
    let mut tries = 0;
    while s.check(&p, "k", 0, T0).await.is_err() {
        tries += 1;
        assert!(tries < 100, "the store did not come back");
    }
}

#[tokio::test]
async fn a_stalled_primary_gives_a_typed_timeout() {
    checks_on_a_stalled_primary_time_out(1).await;
}

// ----- client-side shards -------------------------------------------------------------------

#[tokio::test]
async fn three_shards_each_key_decided_by_its_own_shard_only() {
    if !sluice_testkit::require_redis() {
        return;
    }
    let servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::start().unwrap()).collect();
    let mut shards = Vec::new();
    for s in &servers {
        shards.push(store(RedisConfig::new(s.url()).timeout(Duration::from_secs(2))).await);
    }
    let sharded = sluice_redis::ShardedStore::new(shards).unwrap();
    let p = policy("api", vec![LimitSpec::fixed_window(2, 60_000)]);
    let mut per_shard = [0usize; 3];
    for k in 0..300 {
        let key = format!("user:{k}");
        let owner = sharded.shard_for(&p, &key);
        per_shard[owner] += 1;
        let admitted = {
            let mut n = 0;
            for _ in 0..3 {
                if sharded.check(&p, &key, 1, T0).await.unwrap().allowed {
                    n += 1;
                }
            }
            n
        };
        assert_eq!(admitted, 2, "{key}");
        let redis_key = format!("sluice:{{3:api:{key}}}:fw60000:c1000");
        for (i, s) in servers.iter().enumerate() {
            let exists = s.cmd(&["EXISTS", &redis_key]).unwrap();
            let expected = redis::Value::Int(i64::from(i == owner));
            assert_eq!(exists, expected, "{key} on shard {i} (owner {owner})");
        }
    }
    assert!(
        per_shard.iter().all(|&n| n > 60),
        "uneven spread {per_shard:?}"
    );
}

// ----- coalescing -----------------------------------------------------------------------------

/// Script calls counted by the server so far (FCALL and EVALSHA, read-only forms too).
fn script_calls(server: &RedisServer) -> u64 {
    let stats = server.command_stats().unwrap();
    ["fcall", "fcall_ro", "evalsha", "evalsha_ro"]
        .iter()
        .filter_map(|c| stats.get(*c))
        .map(|c| c.calls)
        .sum()
}

/// In one batch, a key of the wrong type and a key holding a non-number fail alone, as
/// corrupt state, and write nothing; every other decision of the batch is made.
#[tokio::test]
async fn one_bad_key_in_a_batch_fails_alone() {
    let Some((server, s)) = started(Duration::from_secs(2)).await else {
        return;
    };
    let p = policy("api", vec![LimitSpec::fixed_window(10, 60_000)]);
    let key = |i: usize| {
        sluice_redis::keys::policy_keys("sluice:", &p, &format!("k{i}"), "1000")[0].clone()
    };
    server.cmd(&["SET", &key(3), "x"]).unwrap();
    server
        .cmd(&["HSET", &key(5), "reset", "99999999999999", "used", "lots"])
        .unwrap();
    let before = [3, 5].map(|i| server.cmd(&["DUMP", &key(i)]).unwrap());
    let calls = script_calls(&server);
    let keys: Vec<String> = (0..8).map(|i| format!("k{i}")).collect();
    let decided = sluice_testkit::join_in_order(keys.iter().map(|k| s.check(&p, k, 1, T0))).await;
    for (i, d) in decided.iter().enumerate() {
        match (i, d) {
            (3 | 5, Err(StoreError::Corrupt { key, detail })) => {
                assert!(key.contains(&format!("{{3:api:k{i}}}")), "{key}");
                assert!(!detail.is_empty());
            }
            (3 | 5, other) => panic!("k{i}: expected corrupt state, got {other:?}"),
            (_, Ok(d)) => assert!(d.allowed && d.remaining() == 9, "k{i}: {d:?}"),
            (_, Err(e)) => panic!("k{i} failed with its batch: {e}"),
        }
    }
    let batched = script_calls(&server) - calls;
    assert!(batched <= 2, "8 concurrent checks took {batched} calls");
    let after = [3, 5].map(|i| server.cmd(&["DUMP", &key(i)]).unwrap());
    assert_eq!(before, after, "a failed decision wrote");
}

/// A policy of one token bucket or one sliding window takes its own fast path, single and
/// batched: bad state there fails as corrupt, names the key, and writes nothing, while the
/// good keys of the same batch are decided.
#[tokio::test]
async fn bad_data_on_the_one_limit_fast_paths_fails_alone_and_changes_nothing() {
    let Some((server, s)) = started(Duration::from_secs(2)).await else {
        return;
    };
    let bucket = policy("tb", vec![LimitSpec::token_bucket(10, 60_000)]);
    let sliding = policy(
        "sw",
        vec![LimitSpec::sliding_window(10, 60_000).precision_ms(1_000)],
    );
    let cases: Vec<(&str, &Policy, Vec<&str>)> = vec![
        ("bucket: wrong type", &bucket, vec!["LPUSH", "x"]),
        (
            "bucket: tat alone",
            &bucket,
            vec!["HSET", "tat", "1700000000000"],
        ),
        ("bucket: frac alone", &bucket, vec!["HSET", "frac", "3"]),
        (
            "bucket: fraction above max",
            &bucket,
            vec!["HSET", "tat", "1700000000000", "frac", "10"],
        ),
        (
            "bucket: non-numeric tat",
            &bucket,
            vec!["HSET", "tat", "soon", "frac", "0"],
        ),
        ("sliding: wrong type", &sliding, vec!["SET", "x"]),
        (
            "sliding: negative units",
            &sliding,
            vec!["HSET", "1700000000000", "-3"],
        ),
        (
            "sliding: non-numeric units",
            &sliding,
            vec!["HSET", "1700000000000", "many"],
        ),
        (
            "sliding: non-numeric start",
            &sliding,
            vec!["HSET", "yesterday", "1"],
        ),
    ];
    for (what, p, setup) in cases {
        server.cmd(&["FLUSHALL"]).unwrap();
        let key = |i: usize| {
            sluice_redis::keys::policy_keys("sluice:", p, &format!("k{i}"), "1000")[0].clone()
        };
        let bad = key(2);
        let mut cmd = vec![setup[0], bad.as_str()];
        cmd.extend(&setup[1..]);
        server.cmd(&cmd).unwrap();
        let before = server.cmd(&["DUMP", &bad]).unwrap();
        // Alone (the single call's fast path), then with four good keys (the batch's).
        let single = s.check(p, "k2", 1, T0).await;
        let keys: Vec<String> = (0..5).map(|i| format!("k{i}")).collect();
        let calls = script_calls(&server);
        let batched =
            sluice_testkit::join_in_order(keys.iter().map(|k| s.check(p, k, 1, T0))).await;
        let made = script_calls(&server) - calls;
        assert!(made <= 2, "{what}: 5 concurrent checks took {made} calls");
        for (i, d) in std::iter::once(&single).chain(&batched).enumerate() {
            let good = i > 0 && i != 3;
            match d {
                Ok(d) if good => assert!(d.allowed && d.remaining() == 9, "{what}: {d:?}"),
                Err(StoreError::Corrupt { key, detail }) if !good => {
                    let tag = sluice_redis::keys::hash_tag(&bad);
                    assert!(key.contains(tag), "{what}: {key} is not in {tag}");
                    assert!(!detail.is_empty(), "{what}");
                }
                other => panic!("{what}: decision {i}: {other:?}"),
            }
        }
        let after = server.cmd(&["DUMP", &bad]).unwrap();
        assert_eq!(before, after, "{what}: a failed decision changed state");
    }
}

/// A stalled Redis: every queued decision times out on its own timeout, typed, and the store
/// answers again once Redis does.
#[tokio::test]
async fn queued_decisions_time_out_each_on_its_own() {
    checks_on_a_stalled_primary_time_out(16).await;
}
