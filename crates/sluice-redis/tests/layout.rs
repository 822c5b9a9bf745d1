//! Fixed windows as counters (layout v2): the rolling upgrade that reaches them, and a stale
//! replica's peek of a counter window that closed.
//!
//! The deploy from the previous release (main at bd2e1de: fixed windows as hashes, the lean
//! `rate` call) to fixed windows as counters (layout v2), as docs/redis.md "Rolling upgrades"
//! prescribes: first this release on layout v1 beside the previous one, then v1 and v2 side by
//! side, then v2 alone. Every process decides on the same keys, interleaved, while windows open
//! and close, and every decision must be the one a single memory store makes for the whole
//! sequence: no count is lost or doubled in either direction, and windows the previous release
//! opened are read, counted into and refunded by v2.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use std::future::Future;
use std::time::Duration;

use sluice::{Algorithm, Clock, Decision, LimitSpec, Limiter, ManualClock, Policy};
use sluice_redis::{Layout, RedisConfig, RedisStore};
use sluice_testkit::{RedisServer, ReplicaSet};

const PREVIOUS: &str = include_str!("fixtures/sluice-bd2e1de.lua");
const PREVIOUS_LIBRARY: &str = "sluice_bd2e1de";
/// Every process's expiry margin (the previous release's is an argument, like ours). Long, so
/// that the manual clock, which runs ahead of Redis's during the test, stays within half of it
/// and v2 opens its windows in counters.
const MARGIN_MS: u64 = 3_600_000;

fn wall_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// Loads the previous release's lean check under its own library name, as it loaded it.
fn load_previous(server: &RedisServer) {
    let source = format!(
        "#!lua name={PREVIOUS_LIBRARY}\n{}\nredis.register_function{{function_name = \
         '{PREVIOUS_LIBRARY}_rate', callback = function(keys, args) return run('rate', keys, \
         args) end}}\n",
        PREVIOUS.replace("__LIB__", PREVIOUS_LIBRARY)
    );
    server
        .cmd(&["FUNCTION", "LOAD", "REPLACE", &source])
        .unwrap();
}

/// A check as the previous release sent it (its codec, frozen here): its keys, now, cost,
/// margin, then per limit its algorithm's values. Returns whether it admitted.
fn previous_check(server: &RedisServer, p: &Policy, key: &str, cost: u64, now: u64) -> bool {
    let keys = sluice_redis::keys::policy_keys("sluice:", p, key);
    let mut args = vec![
        "FCALL".to_owned(),
        format!("{PREVIOUS_LIBRARY}_rate"),
        keys.len().to_string(),
    ];
    args.extend(keys);
    args.extend([now, cost, MARGIN_MS].map(|n| n.to_string()));
    for l in p.limits() {
        let values: Vec<u128> = match l.algorithm() {
            Algorithm::FixedWindow => vec![
                if l.align() { 2 } else { 1 },
                l.max().into(),
                l.per_ms().into(),
            ],
            Algorithm::SlidingWindow => {
                vec![
                    3,
                    l.max().into(),
                    l.per_ms().into(),
                    l.precision_ms().into(),
                ]
            }
            _ => {
                let (max, per) = (u128::from(l.max()), u128::from(l.per_ms()));
                let tau = u128::from(l.burst()) * per;
                let step = u128::from(cost.min(l.max())) * per;
                vec![
                    4,
                    max,
                    per,
                    l.burst().into(),
                    tau / max,
                    tau % max,
                    step / max,
                    step % max,
                ]
            }
        };
        args.extend(values.into_iter().map(|n| n.to_string()));
    }
    let argv: Vec<&str> = args.iter().map(String::as_str).collect();
    match server.cmd(&argv).unwrap() {
        redis::Value::Array(items) => items[0] == redis::Value::Int(1),
        other => panic!("previous release replied {other:?}"),
    }
}

async fn limiter(
    server: &RedisServer,
    layout: Layout,
    clock: &ManualClock,
    p: &[Policy],
) -> Limiter<RedisStore, ManualClock> {
    let config = RedisConfig::new(server.url())
        .timeout(Duration::from_secs(5))
        .expiry_margin(Duration::from_millis(MARGIN_MS))
        .layout(layout);
    Limiter::new(RedisStore::connect(config).await.expect("connect"))
        .with_clock(clock.clone())
        .with_policies(p.to_vec())
}

/// Runs `futures` at once, polled in order (so they coalesce into one batch, in order).
async fn all<F: Future>(fs: Vec<F>) -> Vec<F::Output> {
    let mut fs: Vec<_> = fs.into_iter().map(Box::pin).collect();
    let mut out: Vec<Option<F::Output>> = fs.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (f, o) in fs.iter_mut().zip(out.iter_mut()) {
            if o.is_none() {
                match f.as_mut().poll(cx) {
                    std::task::Poll::Ready(v) => *o = Some(v),
                    std::task::Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(())
        }
    })
    .await;
    out.into_iter().map(|o| o.unwrap()).collect()
}

#[tokio::test]
async fn previous_release_v1_and_v2_interleaved_lose_no_count() {
    if !sluice_testkit::require_redis() {
        return;
    }
    let server = RedisServer::start().unwrap();
    load_previous(&server);
    let clock = ManualClock::new(wall_ms());
    let policies: Vec<Policy> = [
        ("fw", vec![LimitSpec::fixed_window(7, 1_000)]),
        ("fwa", vec![LimitSpec::fixed_window(5, 700).aligned()]),
        ("fwlong", vec![LimitSpec::fixed_window(40, 20_000)]),
        (
            "sw",
            vec![LimitSpec::sliding_window(9, 2_000).precision_ms(250)],
        ),
        ("tb", vec![LimitSpec::token_bucket(4, 1_000).burst(6)]),
        (
            "three",
            vec![
                LimitSpec::fixed_window(6, 1_000),
                LimitSpec::fixed_window(12, 5_000).aligned(),
                LimitSpec::fixed_window(30, 20_000),
            ],
        ),
        (
            "mix",
            vec![
                LimitSpec::fixed_window(6, 1_000),
                LimitSpec::sliding_window(10, 3_000).precision_ms(500),
                LimitSpec::token_bucket(5, 2_000),
            ],
        ),
    ]
    .into_iter()
    .map(|(n, s)| Policy::from_specs(n, s).unwrap())
    .collect();
    let v1 = limiter(&server, Layout::V1, &clock, &policies).await;
    let v2 = limiter(&server, Layout::V2, &clock, &policies).await;
    let memory = Limiter::new(sluice::MemoryStore::new())
        .with_clock(clock.clone())
        .with_policies(policies.clone());
    let mut seed: u64 = 0x2545_f491_4f6c_dd1d;
    let mut next = |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };
    // Decisions per phase and process: [previous, v1, v2].
    let mut count = [[0u32; 3]; 3];
    for step in 0..4_500 {
        // Phase 0: previous + v1; phase 1: v1 + v2; phase 2: v2 alone.
        let phase = step / 1_500;
        let p = &policies[next(policies.len() as u64) as usize];
        let key = format!("k{}", next(2));
        let cost = [0, 1, 1, 1, 2, 3][next(6) as usize];
        let who = match (phase, next(2)) {
            (0, 0) => 0,
            (0, _) | (1, 0) => 1,
            _ => 2,
        };
        // The previous release only sends checks here; its share of the rest goes to v1.
        let new = if who == 2 { &v2 } else { &v1 };
        let what = format!("step {step}, process {who}, {p:?} {key} cost {cost}");
        match next(12) {
            0..=5 if who == 0 => {
                let expected = memory.check(p.name(), &key, cost).await.unwrap();
                let got = previous_check(&server, p, &key, cost, clock.now_ms());
                assert_eq!(got, expected.allowed, "{what}");
            }
            0..=5 => {
                let expected = memory.check(p.name(), &key, cost).await.unwrap();
                let got = new.check(p.name(), &key, cost).await.unwrap();
                assert_eq!(got, expected, "{what}");
            }
            6 | 7 => {
                // Three at once through one process: they coalesce (the previous release's
                // share goes to v1).
                let mut expected = Vec::new();
                for _ in 0..3 {
                    expected.push(memory.check(p.name(), &key, cost).await.unwrap());
                }
                let got = all((0..3).map(|_| new.check(p.name(), &key, cost)).collect()).await;
                let got: Vec<Decision> = got.into_iter().map(Result::unwrap).collect();
                assert_eq!(got, expected, "{what}, batched");
            }
            8 => {
                let expected = memory.peek(p.name(), &key, cost).await.unwrap();
                let got = new.peek(p.name(), &key, cost).await.unwrap();
                assert_eq!(got, expected, "{what}, peek");
            }
            9 => {
                let expected = memory.refund(p.name(), &key, cost).await.unwrap();
                let got = new.refund(p.name(), &key, cost).await.unwrap();
                assert_eq!(got, expected, "{what}, refund");
            }
            _ => {
                clock.advance(next(600));
            }
        }
        count[phase][who] += 1;
    }
    println!("decisions per phase, by [previous, v1, v2]: {count:?}");
    assert!(count[0][0] > 500 && count[0][1] > 500, "{count:?}");
    assert!(count[1][1] > 500 && count[1][2] > 500, "{count:?}");
    // Both layouts were written: hashes (previous release, v1) and counters (v2).
    let stats = server.command_stats().unwrap();
    for c in ["hincrby", "incrby", "pexpiretime"] {
        let n = stats.get(c).map_or(0, |c| c.calls);
        assert!(n > 100, "{n} {c} calls");
    }
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
    let set = ReplicaSet::start(1).unwrap();
    let replica = &set.replicas[0];
    // Redis's clock on both (one machine), so the window closes in real time.
    let config = RedisConfig::new(set.primary.url())
        .replicas([replica.url()])
        .read_from(sluice_redis::ReadFrom::Replicas)
        .clock(sluice_redis::ClockSource::Redis)
        .layout(Layout::V2)
        .timeout(Duration::from_secs(2))
        .expiry_margin(Duration::from_millis(1_500));
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
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead_port = dead.local_addr().unwrap().port().to_string();
    drop(dead);
    replica
        .cmd(&["REPLICAOF", "127.0.0.1", &dead_port])
        .unwrap();
    let (mut full, mut fresh) = (0, 0);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    // Poll until the counter's expiry has passed by the replica's clock (it hides the key).
    while replica.cmd(&["EXISTS", counter]).unwrap() != redis::Value::Int(0) || fresh == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the window never closed"
        );
        let d = limiter.peek("api", "k", 1).await.unwrap();
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
    let d = limiter.peek("api", "k", 1).await.unwrap();
    assert!(d.allowed && d.limits()[0].remaining == 4, "{d:?}");
    println!("{full} peeks saw the window full, {fresh} closed");
    assert!(full > 0, "no peek saw the open window");
}

/// Exactness on layout v2: 64 tasks check one fixed window (aligned and not) at once,
/// coalesced, through the counter's fast path; Redis admits exactly `max`, none degraded, and
/// the window lives in the counter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_tasks_admit_exactly_max_on_counters() {
    if !sluice_testkit::require_redis() {
        return;
    }
    let server = RedisServer::start().unwrap();
    for spec in [
        LimitSpec::fixed_window(1_000, 60_000),
        LimitSpec::fixed_window(1_000, 60_000).aligned(),
    ] {
        server.cmd(&["FLUSHALL"]).unwrap();
        // The manual clock stands still at Redis's time (within half the margin, so the window
        // opens in a counter); the long margin keeps it from expiring in real time.
        let config = RedisConfig::new(server.url())
            .timeout(Duration::from_secs(5))
            .expiry_margin(Duration::from_secs(3_600))
            .layout(Layout::V2);
        let p = Policy::from_specs("hot", vec![spec.clone()]).unwrap();
        let limiter = std::sync::Arc::new(
            Limiter::new(RedisStore::connect(config).await.expect("connect"))
                .with_clock(ManualClock::new(wall_ms()))
                .with_policy(p),
        );
        let tasks: Vec<_> = (0..64)
            .map(|_| {
                let limiter = limiter.clone();
                tokio::spawn(async move {
                    let (mut admitted, mut degraded) = (0u64, 0u64);
                    for _ in 0..500 {
                        let d = limiter.check("hot", "the-key", 1).await.unwrap();
                        if d.degraded.is_some() {
                            degraded += 1;
                        } else if d.allowed {
                            admitted += 1;
                        }
                    }
                    (admitted, degraded)
                })
            })
            .collect();
        let mut total = (0, 0);
        for t in tasks {
            let (a, d) = t.await.unwrap();
            total = (total.0 + a, total.1 + d);
        }
        assert_eq!(total, (1_000, 0), "{spec:?}: (admitted, degraded)");
        let tag = if spec.align { "fwa60000" } else { "fw60000" };
        let counter = format!("sluice:{{3:hot:the-key}}:{tag}:c3600000");
        assert_eq!(
            server.cmd(&["GET", &counter]).unwrap(),
            redis::Value::BulkString(b"1000".to_vec()),
            "{counter}"
        );
    }
}
