//! The regions store with three real regions on loopback: a primary each, and in each region a
//! replica of the other two primaries behind a delaying proxy (`regions_support`).
//!
//! - healthy replication: the global admitted count per window stays within `max` plus the
//!   stated bound, for three refresh intervals;
//! - delayed replication: over-admission stays within the bound for the lag seen; past
//!   `max_lag` each fallback mode takes over;
//! - a partitioned region keeps answering in every mode, and the counts converge after healing;
//! - a differential test of a region's decisions against a model that sums every region's count;
//! - coalescing and reservation inside a region.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod regions_support;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use regions_support::{Run, Settings, World, now_ms, steady};
use sluice::{LimitSpec, Limiter, Op, Policy, ReserveConfig, Reserving, Store, StoreExt};
use sluice_redis::{
    Fallback, RedisConfig, RegionsConfig, RegionsError, RegionsStore, RemoteRegion,
};

const DAY: u64 = 86_400_000;

fn policy(name: &str, specs: Vec<LimitSpec>) -> Policy {
    Policy::from_specs(name, specs).expect("valid policy")
}

/// Policy `name`: `max` a day in a sliding window of hourly buckets.
fn daily_sliding(name: &str, max: u64) -> Policy {
    policy(
        name,
        vec![LimitSpec::sliding_window(max, DAY).precision_ms(3_600_000)],
    )
}

/// The limit of the bounded runs: 100 a second, against 100 requests a second in each of
/// three regions.
const MAX: u64 = 100;

/// Polls (a few ms apart) until every region's view of every other region was read after
/// every primary's writes so far reached its replicas.
async fn wait_views_fresh(world: &World) {
    for p in &world.primaries {
        let acked = p
            .cmd(&["WAIT", &(world.settings.regions - 1).to_string(), "5000"])
            .expect("WAIT");
        assert_eq!(
            acked,
            sluice_testkit::redis::Value::Int(
                i64::try_from(world.settings.regions - 1).unwrap_or(0)
            ),
            "every replica acknowledged"
        );
    }
    let synced = now_ms();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let now = now_ms();
        let fresh = world.stores.iter().all(|s| {
            s.regions().iter().all(|st| {
                st.view_age.is_some_and(|a| {
                    u64::try_from(a.as_millis()).unwrap_or(u64::MAX) <= now - synced
                })
            })
        });
        if fresh {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "views never refreshed: {:?}",
            world.statuses()
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// Three regions each checking `key` every 10 ms for 4.2 s: the run and its whole windows,
/// every decision taken by the store and every window within `max` plus the stated bound.
async fn bounded_run(
    world: &World,
    p: &Policy,
    key: &str,
    max: u64,
    label: &str,
) -> (Run, Vec<(u64, u64)>) {
    let interval = Duration::from_millis(10);
    let run = steady(world, p, key, interval, Duration::from_millis(4_200)).await;
    let bound = run.bound(3, world.settings.refresh);
    let windows = run.whole_windows();
    println!(
        "{label}: rate {:.0}/s per region, lag ≤ {:?}, view age ≤ {:?}, admitted per window {windows:?}, bound {bound:.1}",
        run.rate_per_region, run.max_lag, run.max_view_age
    );
    assert_eq!(
        (run.errors, run.degraded),
        (0, 0),
        "{label}: every decision by the store"
    );
    assert!(
        windows.len() >= 2,
        "{label}: at least two whole windows: {windows:?}"
    );
    for &(w, admitted) in &windows {
        assert!(
            admitted as f64 <= max as f64 + bound,
            "{label}, window {w}: {admitted} admitted, above {max} + {bound:.1}"
        );
    }
    (run, windows)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthy_regions_admit_within_the_stated_bound_for_three_refresh_intervals() {
    if !sluice_testkit::require_redis() {
        return;
    }
    let p = policy("api", vec![LimitSpec::fixed_window(MAX, 1_000)]);
    for refresh in [50, 100, 200] {
        let world = World::start(Settings::new(refresh, 3_000, Fallback::LocalShare)).await;
        // 100 requests a second in each region: 300 a second against 100 per window.
        let label = format!("refresh {refresh} ms");
        let (_, windows) = bounded_run(&world, &p, "user:1", MAX, &label).await;
        for (w, admitted) in windows {
            // The views never count more than the other regions used, so the limit is used.
            assert!(
                admitted >= MAX,
                "window {w}: only {admitted} of {MAX} admitted"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delayed_replication_stays_within_the_bound_then_each_fallback_takes_over() {
    if !sluice_testkit::require_redis() {
        return;
    }
    let p = policy("api", vec![LimitSpec::fixed_window(MAX, 1_000)]);
    let world = World::start(Settings::new(50, 1_500, Fallback::LocalShare)).await;

    let mut over = Vec::new();
    for delay in [0, 300] {
        world.set_delay(Duration::from_millis(delay));
        let label = format!("delay {delay} ms");
        let (run, windows) = bounded_run(&world, &p, &format!("delay:{delay}"), MAX, &label).await;
        if delay > 0 {
            assert!(
                run.max_lag >= Duration::from_millis(delay),
                "the lag seen ({:?}) includes the delay",
                run.max_lag
            );
        }
        over.push(
            windows
                .iter()
                .map(|&(_, a)| a.saturating_sub(MAX))
                .max()
                .unwrap_or(0),
        );
    }
    println!(
        "worst over-admission per window: no delay {}, 300 ms {}",
        over[0], over[1]
    );

    // Past max_lag: every region falls back, each policy in its own mode.
    world.set_delay(Duration::from_millis(2_500));
    world.wait_fallback(true, Duration::from_secs(15)).await;
    let store = &world.stores[0];
    for (name, mode, expected) in [
        ("share", Fallback::LocalShare, 10),
        ("only", Fallback::LocalOnly, 30),
        ("closed", Fallback::Closed, 0),
    ] {
        let p = daily_sliding(name, 30);
        let admitted = admitted(&world, 0, &p, "lagging", 40, now_ms()).await;
        assert_eq!(
            admitted, expected,
            "{mode} admits {expected} of 30 in region 0"
        );
        let counted = store
            .fallback_counts()
            .into_iter()
            .find(|(p, m, _)| p == name && *m == mode)
            .map(|(_, _, n)| n);
        assert_eq!(counted, Some(40), "{mode}: every decision counted");
    }
    // Healed: the views are trusted again.
    world.set_delay(Duration::ZERO);
    world.wait_fallback(false, Duration::from_secs(20)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_region_keeps_answering_in_every_mode_and_counts_converge_after_healing() {
    if !sluice_testkit::require_redis() {
        return;
    }
    let world = World::start(Settings::new(50, 500, Fallback::LocalShare)).await;
    let max = 30;
    let policies: Vec<Policy> = ["share", "only", "closed"]
        .iter()
        .map(|n| daily_sliding(n, max))
        .collect();
    // Before: regions 1 and 2 use 4 units each of every policy, region 0 none.
    let mut used: HashMap<String, u64> = HashMap::new();
    for p in &policies {
        for s in &world.stores {
            s.peek(p, "k", 0, now_ms()).await.expect("peek");
        }
        for r in [1, 2] {
            let d = world.stores[r]
                .check(p, "k", 4, now_ms())
                .await
                .expect("answers");
            assert!(d.allowed);
        }
        used.insert(p.name().to_owned(), 8);
    }
    wait_views_fresh(&world).await;

    world.partition(0, true);
    world.wait_cut_off(0, Duration::from_secs(10)).await;
    // local_share: region 0's share of what regions 1 and 2 were last known to leave,
    // (30 − 8) / 3 = 7 (a fresh 30 / 3 would hand out 10 on top of their 8).
    for (p, expected) in policies.iter().zip([7, 30, 0]) {
        let started = Instant::now();
        let admitted = admitted(&world, 0, p, "k", 40, now_ms()).await;
        println!(
            "{}: 40 decisions in {:?} while partitioned",
            p.name(),
            started.elapsed()
        );
        assert_eq!(admitted, expected, "policy {} while partitioned", p.name());
        *used.entry(p.name().to_owned()).or_insert(0) += admitted;
    }

    world.partition(0, false);
    world.wait_healed().await;
    // Converged: every region sees every region's count.
    for p in &policies {
        let total = used[p.name()];
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let mut remaining = Vec::new();
            for s in &world.stores {
                remaining.push(s.peek(p, "k", 0, now_ms()).await.expect("peek").remaining());
            }
            if remaining.iter().all(|&r| r == max.saturating_sub(total)) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "policy {}: remaining {remaining:?}, expected {} everywhere",
                p.name(),
                max.saturating_sub(total)
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_replica_puts_decisions_under_the_fallback_until_it_answers() {
    if !sluice_testkit::require_redis() {
        return;
    }
    let mut world = World::start(Settings::new(50, 500, Fallback::LocalShare)).await;
    let p = daily_sliding("share", 30);
    world.stores[0]
        .peek(&p, "k", 0, now_ms())
        .await
        .expect("peek");

    // Region 0's replica of region 1 stops.
    world.links[0][1]
        .as_mut()
        .expect("a link")
        .0
        .kill()
        .expect("kill");
    world
        .wait_statuses(
            "region 0 sees region 1 unreachable",
            Duration::from_secs(10),
            |all| {
                all[0]
                    .iter()
                    .any(|s| s.name == "region-1" && !s.reachable && s.fallback_active)
            },
        )
        .await;
    let admitted = admitted(&world, 0, &p, "k", 20, now_ms()).await;
    assert_eq!(admitted, 10, "local_share: 30 / 3 regions");
    assert!(
        world.stores[0]
            .fallback_counts()
            .contains(&("share".to_owned(), Fallback::LocalShare, 20)),
        "{:?}",
        world.stores[0].fallback_counts()
    );

    // It answers again: the views are trusted and the decisions count every region.
    world.links[0][1]
        .as_mut()
        .expect("a link")
        .0
        .restart()
        .expect("restart");
    world.wait_healed().await;
    let d = world.stores[0]
        .peek(&p, "k", 0, now_ms())
        .await
        .expect("peek");
    assert_eq!(d.remaining(), 20);
}

/// Waits past the end of the day when fewer than 60 s of it are left: a test that counts one
/// day-long window must not see it end.
async fn away_from_the_day_edge() {
    let left = DAY - now_ms() % DAY;
    if left < 60_000 {
        tokio::time::sleep(Duration::from_millis(left + 100)).await;
    }
}

/// Checks `key` `n` times at cost 1 in region `r`, at `now` (+ 1 ms each): how many it
/// admitted. Every answer is decided (never degraded).
async fn admitted(world: &World, r: usize, p: &Policy, key: &str, n: u64, now: u64) -> u64 {
    let mut admitted = 0;
    for i in 0..n {
        let d = world.stores[r]
            .check(p, key, 1, now + i)
            .await
            .expect("a region answers");
        assert!(!d.is_degraded(), "decided by the local store");
        admitted += u64::from(d.allowed);
    }
    admitted
}

/// Three regions under `local_share`, healthy, and a policy of one fixed window of 30 a day
/// whose key `key` every region has read, away from the day's edge; `None` (the test is
/// skipped) without `redis-server`.
async fn healthy_share_world(key: &str) -> Option<(World, Policy)> {
    if !sluice_testkit::require_redis() {
        return None;
    }
    let world = World::start(Settings::new(50, 500, Fallback::LocalShare)).await;
    let p = policy("share", vec![LimitSpec::fixed_window(30, DAY)]);
    away_from_the_day_edge().await;
    for s in &world.stores {
        s.peek(&p, key, 0, now_ms()).await.expect("peek");
    }
    Some((world, p))
}

/// A cut that starts mid-window: region 1 has used 20 of 30 and every region
/// saw it; then region 0 is cut off both ways. Under `local_share` each region's own count may
/// reach its share of what the others were last known to leave, `(30 − known) / 3`: region 0
/// (knew 20) 3, region 1 (knew 0, but has 20 itself) none, region 2 (knew 20) 3; 26 in all,
/// not the 40 of a fresh `max / 3` each. Healed mid-window, the regions sum each other again
/// and the window ends at exactly `max`. Cut again at the next window's start (a cut at a
/// window edge) nothing known counts: 10 each, 30.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_mid_window_grants_each_region_its_share_of_what_is_left() {
    let Some((world, p)) = healthy_share_world("mid").await else {
        return;
    };
    let max = 30;
    let d = world.stores[1]
        .check(&p, "mid", 20, now_ms())
        .await
        .expect("answers");
    assert!(d.allowed, "{d:?}");
    wait_views_fresh(&world).await;
    let seen = world.stores[0]
        .peek(&p, "mid", 0, now_ms())
        .await
        .expect("peek");
    assert_eq!(seen.remaining(), 10, "region 0 saw region 1's 20");

    world.partition(0, true);
    world.wait_cut_off(0, Duration::from_secs(10)).await;
    let mut during = Vec::new();
    for r in 0..3 {
        during.push(admitted(&world, r, &p, "mid", 40, now_ms()).await);
    }
    println!("cut mid-window: admitted {during:?} after the 20 used before");
    assert_eq!(during, [3, 0, 3], "each region's share of the 10 left");
    let total: u64 = 20 + during.iter().sum::<u64>();
    assert!(total <= max, "{total} admitted in the window, above {max}");

    // Healed mid-window: every region sums every region again; the window ends at max.
    world.partition(0, false);
    world.wait_healed().await;
    let mut after = Vec::new();
    for r in 0..3 {
        wait_views_fresh(&world).await;
        after.push(admitted(&world, r, &p, "mid", 10, now_ms()).await);
    }
    println!("healed mid-window: admitted {after:?}");
    assert_eq!(
        total + after.iter().sum::<u64>(),
        max,
        "the window ends at exactly max: {after:?}"
    );

    // Cut again, and the next window begins (a cut at a window edge: the state of the
    // window after this one is written in the same keys, so it comes last): the usage known
    // from this window does not count there.
    world.partition(0, true);
    world.wait_cut_off(0, Duration::from_secs(10)).await;
    let next = (now_ms() / DAY + 1) * DAY + 1_000;
    let mut edge = Vec::new();
    for r in 0..3 {
        edge.push(admitted(&world, r, &p, "mid", 40, next + 100 * r as u64).await);
    }
    println!("cut at a window edge: admitted {edge:?}");
    assert_eq!(edge, [10, 10, 10], "max / regions each, nothing known");
}

/// Only region 0's replica of region 1 breaks: region 0 cannot see region 1, but region 1
/// still sees region 0. Region 0's heartbeat says so, and region 1 falls back too: a region
/// that kept summing a view of a region admitting its share blind would let the two admit
/// `max` + a share. Region 1 decides first (the order that over-admitted): 10, region 0 10,
/// region 2 (which sees both) what is left, 30 in all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_one_way_cut_is_seen_from_both_sides() {
    let Some((world, p)) = healthy_share_world("one-way").await else {
        return;
    };
    let max = 30;
    world.links[0][1].as_ref().expect("a link").1.cut();
    world
        .wait_statuses(
            "regions 0 and 1 each fall back on the other",
            Duration::from_secs(10),
            |all| {
                let falls = |a: usize, b: usize| {
                    all[a]
                        .iter()
                        .any(|s| s.name == regions_support::name(b) && s.fallback_active)
                };
                falls(0, 1) && falls(1, 0)
            },
        )
        .await;
    let first = admitted(&world, 1, &p, "one-way", 40, now_ms()).await;
    let second = admitted(&world, 0, &p, "one-way", 40, now_ms()).await;
    assert_eq!((first, second), (10, 10), "each its share");
    // Region 2 sees both (its links are whole, and neither says it is blind to region 2).
    let deadline = Instant::now() + Duration::from_secs(10);
    while world.stores[2]
        .peek(&p, "one-way", 0, now_ms())
        .await
        .expect("peek")
        .remaining()
        != max - 20
    {
        assert!(Instant::now() < deadline, "region 2 never read 20 used");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let third = admitted(&world, 2, &p, "one-way", 40, now_ms()).await;
    assert_eq!(first + second + third, max, "{first} + {second} + {third}");
    world.links[0][1].as_ref().expect("a link").1.heal();
    world.wait_healed().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_region_decides_as_a_model_summing_every_region_does() {
    if !sluice_testkit::require_redis() {
        return;
    }
    let world = World::start(Settings::new(20, 3_000, Fallback::Closed)).await;
    let policies = [
        policy("fixed", vec![LimitSpec::fixed_window(12, DAY)]),
        daily_sliding("sliding", 12),
        policy(
            "both",
            vec![
                LimitSpec::fixed_window(8, DAY),
                LimitSpec::sliding_window(15, DAY).precision_ms(3_600_000),
            ],
        ),
    ];
    let keys = ["a", "b"];
    // Every region sees every key once, so that its views are read.
    for s in &world.stores {
        for p in &policies {
            for k in keys {
                s.peek(p, k, 0, now_ms()).await.expect("peek");
            }
        }
    }
    let mut rng = SmallRng::seed_from_u64(0x05ee_d28a);
    // (policy, key) -> units admitted in every region together.
    let mut total: HashMap<(usize, &str), u64> = HashMap::new();
    let ops = 120;
    for step in 0..ops {
        wait_views_fresh(&world).await;
        let (r, pi, key) = (
            rng.random_range(0..3),
            rng.random_range(0..policies.len()),
            keys[rng.random_range(0..2)],
        );
        let cost = rng.random_range(0..=4u64);
        let op = if rng.random_bool(0.8) {
            Op::Check { cost }
        } else {
            Op::Peek { cost }
        };
        let p = &policies[pi];
        let used = total.get(&(pi, key)).copied().unwrap_or(0);
        let fits = p.limits().iter().all(|l| used + cost <= l.max());
        let d = world.stores[r]
            .call(sluice::Call::new(p, key, op, now_ms()))
            .await
            .expect("decides");
        assert_eq!(
            d.allowed,
            fits,
            "step {step}: {op:?} of {}/{key} in region {r}, {used} used: {d:?}",
            p.name()
        );
        for (l, s) in p.limits().iter().zip(d.limits()) {
            let left = l.max().saturating_sub(used);
            let expected = if fits { left - cost } else { left };
            assert_eq!(
                s.remaining, expected,
                "step {step}: remaining of {l:?} in {d:?}"
            );
            assert_eq!(s.max, l.max());
        }
        if fits && matches!(op, Op::Check { .. }) {
            *total.entry((pi, key)).or_insert(0) += cost;
        }
    }
    println!("{ops} decisions agreed with the model; totals {total:?}");
    assert!(
        total.values().any(|&t| t >= 8),
        "some key got near its limit: {total:?}"
    );
}

/// Every region reads `key` of `p`, then region 1 uses `cost` of it, and every region sees
/// that.
async fn region_1_uses(world: &World, p: &Policy, key: &str, cost: u64) {
    for s in &world.stores {
        s.peek(p, key, 0, now_ms()).await.expect("peek");
    }
    let d = world.stores[1]
        .check(p, key, cost, now_ms())
        .await
        .expect("check");
    assert!(d.allowed, "{d:?}");
    wait_views_fresh(world).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coalescing_and_reservation_work_inside_a_region() {
    if !sluice_testkit::require_redis() {
        return;
    }
    let world = World::start(Settings::new(20, 3_000, Fallback::Closed)).await;
    let p = policy("api", vec![LimitSpec::fixed_window(50, DAY)]);
    region_1_uses(&world, &p, "burst", 10).await;

    // 64 concurrent checks in region 0: exactly the 40 the others left, in fewer calls.
    let script_calls = || {
        world.primaries[0].command_calls("evalsha").unwrap_or(0)
            + world.primaries[0].command_calls("fcall").unwrap_or(0)
    };
    let calls_before = script_calls();
    let mut tasks = Vec::new();
    for _ in 0..64 {
        let (s, p) = (world.stores[0].clone(), p.clone());
        tasks.push(tokio::spawn(async move {
            s.check(&p, "burst", 1, now_ms()).await
        }));
    }
    let mut admitted = 0;
    for t in tasks {
        admitted += u64::from(t.await.expect("task").expect("decides").allowed);
    }
    let calls = script_calls() - calls_before;
    println!("64 concurrent checks: {admitted} admitted in {calls} script calls");
    assert_eq!(admitted, 40);
    assert!(calls < 64, "coalesced: {calls} calls for 64 decisions");
    // Used up by the other two: region 2 refuses a peek or a check of 1 and reports 0 left.
    wait_views_fresh(&world).await;
    for op in [
        Op::Peek { cost: 1 },
        Op::Check { cost: 1 },
        Op::Peek { cost: 0 },
    ] {
        let d = world.stores[2]
            .call(sluice::Call::new(&p, "burst", op, now_ms()))
            .await
            .expect("decides");
        assert_eq!(d.allowed, op.cost() == 0, "{op:?}: {d:?}");
        assert_eq!(d.remaining(), 0, "{op:?}: {d:?}");
    }

    // Reservation (`local:`) over the regions store: leases come from the region's share.
    let q = policy("leased", vec![LimitSpec::fixed_window(200, DAY)]);
    region_1_uses(&world, &q, "r", 50).await;
    let reserving = Reserving::new(
        world.stores[2].clone(),
        ReserveConfig::default().max_error(0.1),
    );
    let limiter = Limiter::new(reserving).with_policy(q.clone());
    let mut admitted = 0;
    for _ in 0..300 {
        admitted += u64::from(
            limiter
                .check("leased", "r", 1)
                .await
                .expect("decides")
                .allowed,
        );
    }
    let stats = limiter.store().stats();
    println!("reservation: {admitted} admitted, {stats:?}");
    assert!(
        admitted <= 150,
        "never past what the other region left: {admitted}"
    );
    assert!(
        admitted >= 150 - 20,
        "under-admission within the error budget: {admitted}"
    );
    assert!(stats.local > 0, "checks were served from leases: {stats:?}");
}

#[test]
fn a_token_bucket_or_a_concurrency_limit_is_refused_naming_the_policy_and_the_limit() {
    let p = policy(
        "mixed",
        vec![
            LimitSpec::fixed_window(10, 1_000),
            LimitSpec::token_bucket(5, 1_000),
        ],
    );
    let e = RegionsStore::admits_policy(&p).expect_err("a token bucket");
    assert!(
        matches!(e, RegionsError::Unsupported { index: 1, .. }),
        "{e:?}"
    );
    let text = e.to_string();
    assert!(
        text.contains("`mixed`") && text.contains("limits[1]") && text.contains("token_bucket"),
        "{text}"
    );
    let c = policy("leases", vec![LimitSpec::concurrency(4, 60_000)]);
    assert!(
        RegionsStore::admits_policy(&c)
            .expect_err("a concurrency limit")
            .to_string()
            .contains("concurrency")
    );
    let ok = policy(
        "ok",
        vec![
            LimitSpec::fixed_window(10, 1_000),
            LimitSpec::sliding_window(100, 60_000),
        ],
    );
    assert_eq!(RegionsStore::admits_policy(&ok), Ok(()));
}

/// Two fixed windows of one `per` are two keys on any store, but one once aligned to the
/// epoch: refused, naming the policy and both limits (every decision was a store error).
#[test]
fn fixed_windows_that_collide_once_aligned_are_refused_naming_both() {
    let p = policy(
        "orders",
        vec![
            LimitSpec::sliding_window(1_000, 3_600_000),
            LimitSpec::fixed_window(10, 60_000),
            LimitSpec::fixed_window(100, 60_000).aligned(),
        ],
    );
    let e = RegionsStore::admits_policy(&p).expect_err("two windows of 1 minute");
    assert!(
        matches!(
            e,
            RegionsError::Collide {
                first: 1,
                second: 2,
                ..
            }
        ),
        "{e:?}"
    );
    let text = e.to_string();
    for part in [
        "`orders`",
        "limits[1]",
        "limits[2]",
        "max 10 per 60000 ms",
        "max 100 per 60000 ms, aligned",
    ] {
        assert!(text.contains(part), "{part}: {text}");
    }
    let apart = policy(
        "apart",
        vec![
            LimitSpec::fixed_window(10, 60_000),
            LimitSpec::fixed_window(100, 3_600_000).aligned(),
            LimitSpec::sliding_window(20, 60_000),
        ],
    );
    assert_eq!(RegionsStore::admits_policy(&apart), Ok(()));
}

#[test]
fn an_invalid_regions_configuration_names_what_is_wrong() {
    let remote = |name: &str| RemoteRegion::new(name, RedisConfig::new("redis://127.0.0.1:1"));
    let base = |remotes| RegionsConfig::new("eu", RedisConfig::new("redis://127.0.0.1:2"), remotes);
    assert_eq!(base(vec![remote("us")]).validate(), Ok(()));
    let cases = [
        (base(vec![]), "list every other region"),
        (base(vec![remote("eu")]), "`eu` is this region"),
        (
            base(vec![remote("us"), remote("us")]),
            "`us` names two remote regions",
        ),
        (base(vec![remote("")]), "`` is not a region name"),
        (
            base(vec![remote("us")]).max_lag(Duration::from_millis(100)),
            "100ms is not longer than refresh (250ms)",
        ),
        (
            base(vec![RemoteRegion::new(
                "us",
                RedisConfig::cluster(["redis://127.0.0.1:3"]),
            )]),
            "region `us`: the replica must be a standalone node",
        ),
        (
            base(vec![RemoteRegion::new(
                "us",
                RedisConfig::new("redis://127.0.0.1:3").key_prefix("x:"),
            )]),
            "key prefix `x:` differs",
        ),
    ];
    for (config, expected) in cases {
        let e = config.validate().expect_err(expected).to_string();
        assert!(e.contains(expected), "{e} does not say {expected}");
    }
}
