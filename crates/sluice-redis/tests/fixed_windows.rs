//! Fixed windows as they are stored (docs/redis.md "Keys"): one key per window, a
//! counter whose absolute expiry is the window's end, or a hash in the same key when the
//! caller's clock is too far off Redis's; a stale replica's peek of a counter window that
//! closed; exactness under 64 tasks; what Cluster's MIGRATE does to a window's end.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod support;

use std::time::Duration;

use sluice::{LimitSpec, Limiter, ManualClock, Policy};
use sluice_redis::{RedisConfig, RedisStore};
use sluice_testkit::RedisServer;
use support::{admitted_by_64_tasks, cut_off, replica_reads};

fn wall_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// A replica never expires keys itself, but answers reads of a key whose absolute expiry has
/// passed by its clock as if it were gone; before that, the counter's end (PEXPIRETIME less
/// the margin) is what tells the window closed. A peek on a replica cut off from its primary,
/// holding a full window, reports it full with the end the primary wrote until that end, then
/// a fresh window: never "refused with remaining = max", never another end. The window (3 s)
/// and the margin (1.5 s) outlast the checks and the replication wait on a loaded machine (with
/// 600 ms and 300 ms, the counter had expired before it was read in 4 runs of 14).
#[tokio::test]
async fn a_stale_replica_peeks_a_closed_counter_window_as_closed() {
    if !sluice_testkit::require_redis() {
        return;
    }
    let (set, config) = replica_reads();
    // Redis's clock on both (one machine), so the window closes in real time.
    let config = config
        .clock(sluice_redis::ClockSource::Redis)
        .expiry_margin(Duration::from_millis(1_500));
    let replica = &set.replicas[0];
    let p = Policy::from_specs("api", vec![LimitSpec::fixed_window(5, 3_000)]).unwrap();
    let limiter = Limiter::new(RedisStore::connect(config).await.expect("connect")).with_policy(p);
    let mut end = 0;
    for _ in 0..5 {
        let d = limiter.check("api", "k", 1).await.unwrap();
        assert!(d.allowed, "{d:?}");
        end = d.limits()[0].reset_ms;
    }
    let counter = "sluice:{3:api:k}:fw3000:c1500";
    set.wait_replicated().unwrap();
    assert_eq!(
        replica.cmd(&["GET", counter]).unwrap(),
        redis::Value::BulkString(b"5".to_vec())
    );
    // Replication stops: the replica keeps its copy, and nothing deletes it there.
    cut_off(replica);
    let (mut full, mut fresh) = (0, 0);
    let api = limiter.policy("api").unwrap().clone();
    const PEEK: sluice::Op = sluice::Op::Peek { cost: 1 };
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    // Poll until the counter's expiry has passed by the replica's clock (it hides the key).
    while replica.cmd(&["EXISTS", counter]).unwrap() != redis::Value::Int(0) || fresh == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the window never closed"
        );
        let d = limiter.call(&api, "k", PEEK).await.unwrap();
        let s = &d.limits()[0];
        if d.now_ms < end {
            assert!(
                !d.allowed && s.remaining == 0 && s.reset_ms == end,
                "open: {d:?}"
            );
            full += 1;
        } else {
            // A fresh window: the peek's cost of 1 out of 5, from now.
            assert!(
                d.allowed && s.remaining == 4 && s.reset_ms == d.now_ms + 3_000,
                "closed: {d:?}"
            );
            fresh += 1;
        }
        tokio::task::yield_now().await;
    }
    // Logically expired, so hidden, yet still held (a replica does not delete it).
    let d = limiter.call(&api, "k", PEEK).await.unwrap();
    assert!(d.allowed && d.limits()[0].remaining == 4, "{d:?}");
    println!("{full} peeks saw the window full, {fresh} closed");
    assert!(full > 0, "no peek saw the open window");
}

/// Exactness on counters: 64 tasks check one fixed window (aligned and not) at once,
/// coalesced, through the counter's fast path; Redis admits exactly `max`, none degraded, and
/// the window lives in the counter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_tasks_admit_exactly_max_on_counters() {
    if !sluice_testkit::require_redis() {
        return;
    }
    let server = RedisServer::start().unwrap();
    let fixed = LimitSpec::fixed_window(1_000, 60_000);
    for spec in [fixed.clone(), fixed.aligned()] {
        // The manual clock stands still at Redis's time (within half the margin, so the window
        // opens in a counter).
        assert_eq!(
            admitted_by_64_tasks(&server, spec.clone(), wall_ms(), 500).await,
            (1_000, 0),
            "{spec:?}: (admitted, degraded)"
        );
        let tag = if spec.align { "fwa60000" } else { "fw60000" };
        let counter = format!("sluice:{{3:hot:the-key}}:{tag}:c3600000");
        assert_eq!(
            server.cmd(&["GET", &counter]).unwrap(),
            redis::Value::BulkString(b"1000".to_vec()),
            "{counter}"
        );
    }
}

fn key_type(server: &RedisServer, key: &str) -> String {
    match server.cmd(&["TYPE", key]).unwrap() {
        redis::Value::SimpleString(t) => t,
        other => panic!("TYPE {key}: {other:?}"),
    }
}

fn int(v: redis::Value) -> i64 {
    match v {
        redis::Value::Int(n) => n,
        redis::Value::BulkString(b) => String::from_utf8(b).unwrap().parse().unwrap(),
        other => panic!("not an integer: {other:?}"),
    }
}

/// A caller whose clock is off Redis's by half the margin or more cannot trust Redis to expire
/// a counter at its window's end + margin: it opens the window as a hash (`reset`, `used`,
/// relative expiry) in the same key, and every other caller (a fitting clock, single or
/// batched, fast path or not) counts into that hash: one window, `max` in all. Once it closes,
/// the next window a fitting caller opens is a counter again.
#[tokio::test]
async fn a_window_opened_off_redis_clock_is_a_hash_every_caller_counts_into() {
    if !sluice_testkit::require_redis() {
        return;
    }
    let server = RedisServer::start().unwrap();
    let config = RedisConfig::new(server.url()).timeout(Duration::from_secs(5));
    let p = Policy::from_specs("api", vec![LimitSpec::fixed_window(10, 60_000)]).unwrap();
    let store = RedisStore::connect(config).await.expect("connect");
    // 2 s ahead of Redis, with the default margin of 1 s.
    let ahead = wall_ms() + 2_000;
    let d = sluice::StoreExt::check(&store, &p, "k", 4, ahead)
        .await
        .unwrap();
    assert!(d.allowed && d.remaining() == 6, "{d:?}");
    let key = "sluice:{3:api:k}:fw60000:c1000";
    assert_eq!(key_type(&server, key), "hash");
    assert_eq!(
        int(server.cmd(&["HGET", key, "reset"]).unwrap()),
        i64::try_from(ahead + 60_000).unwrap()
    );
    // A caller on Redis's clock counts into it: alone (the fast path falls back), then three
    // at once (a batch).
    let d = sluice::StoreExt::check(&store, &p, "k", 3, wall_ms())
        .await
        .unwrap();
    assert!(d.allowed && d.remaining() == 3, "{d:?}");
    let at = wall_ms();
    let checks: Vec<_> = (0..3)
        .map(|_| sluice::StoreExt::check(&store, &p, "k", 1, at))
        .collect();
    let mut admitted = 0;
    for d in sluice_testkit::join_in_order(checks).await {
        admitted += u64::from(d.unwrap().allowed);
    }
    assert_eq!(admitted, 3);
    let d = sluice::StoreExt::check(&store, &p, "k", 1, wall_ms())
        .await
        .unwrap();
    assert!(
        !d.allowed && d.limits()[0].reset_ms == ahead + 60_000,
        "{d:?}"
    );
    assert_eq!(int(server.cmd(&["HGET", key, "used"]).unwrap()), 10);
    // After its end (seen from a caller whose clock is there), the next window is a counter.
    let later = ahead + 60_000 + 5;
    let ahead_still = Limiter::new(store.clone())
        .with_clock(ManualClock::new(later))
        .with_policy(p.clone());
    // That caller's clock is now a minute ahead of Redis's: its window is a hash again.
    let d = ahead_still.check("api", "k", 1).await.unwrap();
    assert!(d.allowed && d.remaining() == 9, "{d:?}");
    assert_eq!(key_type(&server, key), "hash");
    server.cmd(&["DEL", key]).unwrap();
    let fits = Limiter::new(store).with_policy(p);
    let d = fits.check("api", "k", 1).await.unwrap();
    assert!(d.allowed && d.remaining() == 9, "{d:?}");
    assert_eq!(key_type(&server, key), "string");
}

/// `MIGRATE` (what Cluster resharding runs, and what moves a key between
/// any two Redis) sends a key with its *remaining* TTL, and the target sets the expiry from
/// its own clock. A counter's end is its expiry less the margin, so after a migration it moves
/// by the offset between the two nodes' clocks plus the time the key spent in flight, once per
/// migration (docs/redis.md, "Time and expiry"): here both nodes share one clock, so it moves
/// by no more than the MIGRATE took. A hash window's end is its `reset` field, which does not
/// move at all. Counting goes on on the target.
#[tokio::test]
async fn migrate_moves_a_counter_window_end_by_the_clock_offset_and_time_in_flight() {
    if !sluice_testkit::require_redis() {
        return;
    }
    let source = RedisServer::start().unwrap();
    let target = RedisServer::start().unwrap();
    let p = Policy::from_specs("api", vec![LimitSpec::fixed_window(10, 60_000)]).unwrap();
    let on = |s: &RedisServer| RedisConfig::new(s.url()).timeout(Duration::from_secs(5));
    let from = RedisStore::connect(on(&source)).await.expect("connect");
    let to = RedisStore::connect(on(&target)).await.expect("connect");
    let key = "sluice:{3:api:k}:fw60000:c1000";
    let hash_key = "sluice:{3:api:h}:fw60000:c1000";
    let d = sluice::StoreExt::check(&from, &p, "k", 4, wall_ms())
        .await
        .unwrap();
    let end = d.limits()[0].reset_ms;
    // A hash window beside it (opened by a caller 2 s ahead of Redis).
    let h = sluice::StoreExt::check(&from, &p, "h", 4, wall_ms() + 2_000)
        .await
        .unwrap();
    let hash_end = h.limits()[0].reset_ms;
    assert_eq!(key_type(&source, key), "string");
    assert_eq!(key_type(&source, hash_key), "hash");
    let port = target.port().to_string();
    let started = std::time::Instant::now();
    for k in [key, hash_key] {
        source
            .cmd(&["MIGRATE", "127.0.0.1", &port, k, "0", "5000"])
            .unwrap();
    }
    let flight = u64::try_from(started.elapsed().as_millis()).unwrap() + 1;
    let moved = u64::try_from(int(target.cmd(&["PEXPIRETIME", key]).unwrap())).unwrap() - 1_000;
    println!("counter end {end} -> {moved} after a migration of {flight} ms");
    assert!(
        moved + 1 >= end && moved <= end + flight,
        "the end moved from {end} to {moved}, beyond the {flight} ms in flight"
    );
    assert_eq!(
        u64::try_from(int(target.cmd(&["HGET", hash_key, "reset"]).unwrap())).unwrap(),
        hash_end
    );
    let d = sluice::StoreExt::check(&to, &p, "k", 1, wall_ms())
        .await
        .unwrap();
    assert!(d.allowed && d.remaining() == 5, "{d:?}");
    let d = sluice::StoreExt::check(&to, &p, "h", 1, wall_ms())
        .await
        .unwrap();
    assert!(
        d.allowed && d.remaining() == 5 && d.limits()[0].reset_ms == hash_end,
        "{d:?}"
    );
}
