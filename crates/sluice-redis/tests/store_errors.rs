//! Every way a real Redis refuses to decide, classified: an error the store meets
//! while it *cannot answer now* — out of memory, an ACL change, its code flushed and not
//! reloadable, busy with a script, asleep, killed, a slot migrating — is transient: each
//! policy's `on_store_error` decides (open: allowed and marked; closed: the error; local: the
//! insurance store) and the shard's circuit breaker counts it. When the fault is undone the
//! store decides again, with no restart.
//!
//! The end-to-end form (HTTP and gRPC, `/readyz`) is in
//! `crates/sluice-server/tests/redis/store_errors.rs`.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod support;

use std::time::Duration;

use sluice::{
    Degraded, Error, FailureMode, LimitSpec, Limiter, Policy, StoreError, StoreErrorKind, StoreExt,
};
use sluice_redis::{RedisConfig, RedisStore, ShardedStore};
use sluice_testkit::{RedisCluster, RedisServer};
use support::{Migration, node_id, primaries, server_with_alice};

/// What a loaded 2-core machine answers within.
const TIMEOUT: Duration = Duration::from_millis(500);
const MAX: u64 = 3;

fn policy(name: &str, mode: FailureMode) -> Policy {
    Policy::from_specs(name, vec![LimitSpec::fixed_window(MAX, 3_600_000)])
        .unwrap()
        .with_failure_mode(mode)
}

fn policies() -> Vec<Policy> {
    vec![
        policy("open", FailureMode::Open),
        policy("closed", FailureMode::Closed),
        policy("local", FailureMode::Local),
    ]
}

/// A store over one Redis, and a limiter over it behind the shard's circuit breaker.
struct Setup {
    store: RedisStore,
    sharded: ShardedStore,
    limiter: Limiter<ShardedStore>,
}

async fn setup(url: &str) -> Setup {
    let store = RedisStore::connect(RedisConfig::new(url).timeout(TIMEOUT))
        .await
        .unwrap();
    let sharded = ShardedStore::new(vec![store.clone()]).unwrap();
    let limiter = Limiter::new(sharded.clone()).with_policies(policies());
    Setup {
        store,
        sharded,
        limiter,
    }
}

/// Polls (at most 10 s) until `cond` says yes.
async fn until(what: &str, cond: impl AsyncFnMut() -> bool) {
    let waited = sluice_testkit::until(Duration::from_secs(10), what, cond).await;
    waited.unwrap();
}

impl Setup {
    /// The error the store itself answers a check with now (no breaker in between).
    async fn store_error(&self) -> StoreError {
        match self.try_store_error().await {
            Some(e) => e,
            None => panic!("the store decided"),
        }
    }

    /// [`Setup::store_error`], or `None` if the store decided.
    async fn try_store_error(&self) -> Option<StoreError> {
        let p = policy("open", FailureMode::Open);
        self.store.check(&p, "probe", 1, now()).await.err()
    }

    /// Each policy's failure mode while the store cannot answer, and the circuit opening.
    async fn each_mode_applies(&self, key: &str) {
        each_mode_applies(&self.limiter, key).await;
        assert!(
            self.sharded.shards()[0].opened_total() >= 1,
            "the breaker counted the failures and opened"
        );
    }

    /// The store itself fails with a transient error of one of `kinds`, and
    /// [`Setup::each_mode_applies`].
    async fn fails_as(&self, kinds: &[StoreErrorKind], key: &str) {
        let e = self.store_error().await;
        assert!(kinds.contains(&e.kind()), "{e}: not one of {kinds:?}");
        assert!(e.is_transient(), "{e}");
        self.each_mode_applies(key).await;
    }

    /// Once the store itself fails with `kind` (polled), [`Setup::each_mode_applies`].
    async fn each_mode_applies_when(&self, kind: StoreErrorKind, key: &str) {
        until(&format!("the store to fail with {kind:?}"), || async {
            self.try_store_error().await.map(|e| e.kind()) == Some(kind)
        })
        .await;
        self.each_mode_applies(key).await;
    }

    /// Decisions again (the breaker probes and closes), not degraded.
    async fn decides_again(&self, key: &str) {
        until("the store to decide again", || async {
            matches!(self.limiter.check("open", key, 1).await, Ok(d) if d.degraded.is_none())
        })
        .await;
    }
}

fn now() -> u64 {
    sluice::Clock::now_ms(&sluice::SystemClock)
}

/// `open` allows and marks, `closed` returns the (transient) error, `local` decides with the
/// insurance store: `MAX` admitted, then refused.
async fn each_mode_applies<S: sluice::Store>(limiter: &Limiter<S>, key: &str) {
    let open = limiter.check("open", key, 1).await.unwrap();
    assert_eq!((open.allowed, open.degraded), (true, Some(Degraded::Open)));
    match limiter.check("closed", key, 1).await {
        Err(Error::Store(e)) => assert!(e.is_transient(), "{e}"),
        other => panic!("closed: {other:?}"),
    }
    let mut admitted = 0;
    for _ in 0..MAX + 2 {
        let d = limiter.check("local", key, 1).await.unwrap();
        assert_eq!(d.degraded, Some(Degraded::Local));
        admitted += u64::from(d.allowed);
    }
    assert_eq!(admitted, MAX, "the insurance store limits");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_memory_is_transient() {
    if !sluice_testkit::require_redis() {
        return;
    }
    let server = RedisServer::start().unwrap();
    let s = setup(&server.url()).await;
    assert!(s.limiter.check("open", "k", 1).await.unwrap().allowed);
    server
        .cmd(&["CONFIG", "SET", "maxmemory-policy", "noeviction"])
        .unwrap();
    server.cmd(&["CONFIG", "SET", "maxmemory", "1"]).unwrap();

    s.fails_as(&[StoreErrorKind::OutOfMemory], "oom").await;

    server.cmd(&["CONFIG", "SET", "maxmemory", "0"]).unwrap();
    s.decides_again("k").await;
    assert_eq!(
        s.limiter.check("closed", "k", 1).await.unwrap().remaining(),
        MAX - 1
    );
}

const PASSWORD: &str = "store-errors-0123456789";

/// Redis with the ACL user alice, and a [`Setup`] on it as alice that has decided once; `None`
/// (the test is skipped) without `redis-server`.
async fn as_alice() -> Option<(RedisServer, Setup)> {
    let (server, url) = server_with_alice(PASSWORD)?;
    let s = setup(&url).await;
    assert!(s.limiter.check("closed", "k", 1).await.unwrap().allowed);
    Some((server, s))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acl_change_is_transient() {
    let Some((server, s)) = as_alice().await else {
        return;
    };

    // Alice loses the right to run scripts: NOPERM on every decision.
    server
        .cmd(&["ACL", "SETUSER", "alice", "-@scripting"])
        .unwrap();
    s.fails_as(&[StoreErrorKind::Denied], "noperm").await;
    server
        .cmd(&["ACL", "SETUSER", "alice", "+@scripting"])
        .unwrap();
    s.decides_again("k").await;

    // Alice is disabled and her connections killed: logging in again fails (WRONGPASS).
    server.cmd(&["ACL", "SETUSER", "alice", "off"]).unwrap();
    server.cmd(&["CLIENT", "KILL", "USER", "alice"]).unwrap();
    s.each_mode_applies_when(StoreErrorKind::Denied, "off")
        .await;
    server.cmd(&["ACL", "SETUSER", "alice", "on"]).unwrap();
    s.decides_again("k").await;
    assert_eq!(
        s.limiter.check("closed", "k", 1).await.unwrap().remaining(),
        MAX - 2,
        "the count survived"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flushed_library_is_reloaded_and_when_it_cannot_be_the_error_is_transient() {
    let Some((server, s)) = as_alice().await else {
        return;
    };

    // Flushed: the store loads its code again and goes on, counting where it was.
    server.cmd(&["FUNCTION", "FLUSH"]).unwrap();
    let d = s.limiter.check("closed", "k", 1).await.unwrap();
    assert_eq!((d.degraded, d.remaining()), (None, MAX - 2));

    // Flushed, and alice may no longer load functions: the code stays missing.
    server
        .cmd(&["ACL", "SETUSER", "alice", "-function"])
        .unwrap();
    server.cmd(&["FUNCTION", "FLUSH"]).unwrap();
    let kinds = [StoreErrorKind::Denied, StoreErrorKind::CodeMissing];
    s.fails_as(&kinds, "flushed").await;

    server
        .cmd(&["ACL", "SETUSER", "alice", "+function"])
        .unwrap();
    s.decides_again("k").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_script_and_a_sleeping_server_are_transient() {
    if !sluice_testkit::require_redis() {
        return;
    }
    let server = RedisServer::start_with(&["--enable-debug-command", "yes"]).unwrap();
    server
        .cmd(&["CONFIG", "SET", "busy-reply-threshold", "50"])
        .unwrap();
    let s = setup(&server.url()).await;
    assert!(s.limiter.check("open", "k", 1).await.unwrap().allowed);

    // Another client's script runs for up to 20 s (until SCRIPT KILL): BUSY.
    let in_background = |cmd: &redis::Cmd| {
        let mut conn = server
            .connection_with_timeouts(Duration::from_secs(1), Duration::from_secs(30))
            .unwrap();
        let cmd = cmd.clone();
        std::thread::spawn(move || cmd.query::<redis::Value>(&mut conn))
    };
    let script = in_background(
        redis::cmd("EVAL")
            .arg(
                "local t = redis.call('TIME')[1] \
                 while redis.call('TIME')[1] - t < 20 do end return 1",
            )
            .arg(0),
    );
    s.each_mode_applies_when(StoreErrorKind::Busy, "busy").await;
    server.cmd(&["SCRIPT", "KILL"]).unwrap();
    assert!(script.join().unwrap().is_err(), "the script was killed");
    s.decides_again("k").await;

    // DEBUG SLEEP: nothing answered until it ends; each call times out.
    let sleep = in_background(redis::cmd("DEBUG").arg("SLEEP").arg(6));
    s.each_mode_applies_when(StoreErrorKind::Timeout, "asleep")
        .await;
    sleep.join().unwrap().unwrap();
    s.decides_again("k").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_primary_is_transient() {
    if !sluice_testkit::require_redis() {
        return;
    }
    let mut server = RedisServer::start().unwrap();
    let s = setup(&server.url()).await;
    assert!(s.limiter.check("open", "k", 1).await.unwrap().allowed);
    tokio::task::block_in_place(|| server.kill().unwrap());
    let kinds = [StoreErrorKind::Unavailable, StoreErrorKind::Timeout];
    s.fails_as(&kinds, "killed").await;
    tokio::task::block_in_place(|| server.restart().unwrap());
    s.decides_again("k").await;
}

/// A slot of a Cluster in migration: with the target not importing it, a key that is not on
/// the source is sent back and forth (ASK, then MOVED) beyond the client's redirections;
/// with a real migration, a policy whose keys are half moved gets TRYAGAIN. Both are
/// transient; once the slot is stable again decisions resume.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_migrating_slot_is_transient() {
    if !sluice_testkit::require_redis() {
        return;
    }
    let cluster = tokio::task::block_in_place(RedisCluster::start).unwrap();
    let store = RedisStore::connect(RedisConfig::cluster(cluster.urls()).timeout(TIMEOUT))
        .await
        .unwrap();
    let limiter = Limiter::new(store.clone()).with_policies(policies());
    let one = policy("open", FailureMode::Open);
    let two = Policy::from_specs(
        "open",
        vec![
            LimitSpec::fixed_window(MAX, 3_600_000),
            LimitSpec::fixed_window(MAX * 10, 86_400_000),
        ],
    )
    .unwrap();
    // Every key of this test shares one slot: `{…}` tags name the policy and the key, so the
    // keys of "open", "closed" and "local" differ; use their slots one at a time.
    let stem = |policy: &str, key: &str| format!("sluice:{{{}:{policy}:{key}}}", policy.len());
    let slot_of = |policy: &str, key: &str| sluice_testkit::key_slot(stem(policy, key).as_bytes());
    let id = |i: usize| node_id(&cluster, i);
    let primaries = primaries(&cluster);

    // Already decided keys stay where they are; the keys checked below are new.
    assert!(store.check(&one, "used", 1, now()).await.unwrap().allowed);

    for name in ["open", "closed", "local"] {
        let slot = slot_of(name, "new").to_string();
        let source = cluster.primary_for_slot(slot_of(name, "new")).unwrap();
        let target = *primaries.iter().find(|&&p| p != source).unwrap();
        cluster.nodes()[source]
            .cmd(&["CLUSTER", "SETSLOT", &slot, "MIGRATING", &id(target)])
            .unwrap();
        if name == "open" {
            let e = store.check(&one, "new", 1, now()).await.unwrap_err();
            println!("ASK to a node not importing the slot: {e}");
            assert!(
                matches!(
                    e.kind(),
                    StoreErrorKind::Redirected | StoreErrorKind::Timeout
                ),
                "{e}"
            );
            assert!(e.is_transient());
        }
        let d = limiter.check(name, "new", 1).await;
        match name {
            "open" => assert_eq!(d.unwrap().degraded, Some(Degraded::Open)),
            "closed" => match d {
                Err(Error::Store(e)) => assert!(e.is_transient(), "{e}"),
                other => panic!("closed: {other:?}"),
            },
            _ => assert_eq!(d.unwrap().degraded, Some(Degraded::Local)),
        }
        cluster.nodes()[source]
            .cmd(&["CLUSTER", "SETSLOT", &slot, "STABLE"])
            .unwrap();
        let d = limiter.check(name, "new", 1).await.unwrap();
        assert_eq!((d.degraded, d.remaining()), (None, MAX - 1), "{name}");
    }

    // A real migration of the slot of "used", whose first limit's key is on the source and
    // whose second limit's key (a new limit) is not: TRYAGAIN.
    let migration = Migration::start(&cluster, slot_of("open", "used"));
    let e = store.check(&two, "used", 1, now()).await.unwrap_err();
    println!("half a policy's keys migrated: {e}");
    assert!(
        matches!(e.kind(), StoreErrorKind::TryAgain | StoreErrorKind::Timeout),
        "{e}"
    );
    let two_limiter = Limiter::new(store.clone()).with_policy(two.clone());
    let d = two_limiter.check("open", "used", 1).await.unwrap();
    assert_eq!(d.degraded, Some(Degraded::Open));
    migration.stable(&cluster);
    let d = two_limiter.check("open", "used", 1).await.unwrap();
    assert_eq!((d.degraded, d.limits()[0].remaining), (None, MAX - 2));
}

/// A window's max in the charge-back tests.
const WIDE: u64 = 100;

/// What two limiters (two processes, each with its own insurance store) admit of one key's
/// window (`WIDE` per hour, `on_store_error: local`) across an outage of the shared Redis
/// (paused, then resumed): `[by Redis before, by the insurance stores, by Redis after]`.
/// `before` checks go through the first limiter, `during` through each. After the resume each
/// limiter peeks (admitting nothing) until Redis answers it again, which charges its local
/// admissions back; then both check in turn until each is refused five times in a row.
/// Degraded answers are counted apart from Redis's.
async fn across_an_outage(server: &RedisServer, key: &str, before: u64, during: u64) -> [u64; 3] {
    let wide = Policy::from_specs("local", vec![LimitSpec::fixed_window(WIDE, 3_600_000)])
        .unwrap()
        .with_failure_mode(FailureMode::Local);
    let mut limiters = Vec::new();
    for _ in 0..2 {
        let s = setup(&server.url()).await;
        limiters.push(Limiter::new(s.sharded).with_policy(wide.clone()));
    }
    let mut admitted = [0u64; 3];
    for _ in 0..before {
        let d = limiters[0].check("local", key, 1).await.unwrap();
        assert_eq!((d.allowed, d.degraded), (true, None));
        admitted[0] += 1;
    }
    tokio::task::block_in_place(|| server.pause().unwrap());
    for limiter in &limiters {
        for _ in 0..during {
            let d = limiter.check("local", key, 1).await.unwrap();
            assert_eq!((d.allowed, d.degraded), (true, Some(Degraded::Local)));
            admitted[1] += 1;
        }
    }
    tokio::task::block_in_place(|| server.resume().unwrap());
    for limiter in &limiters {
        until("Redis to answer again", || async {
            let local = limiter.policy("local").unwrap();
            limiter
                .call(local, key, sluice::Op::Peek { cost: 0 })
                .await
                .unwrap()
                .degraded
                .is_none()
        })
        .await;
    }
    let mut refused = [0; 2];
    while refused.iter().any(|&r| r < 5) {
        for (i, limiter) in limiters.iter().enumerate() {
            let d = limiter.check("local", key, 1).await.unwrap();
            assert_eq!(d.degraded, None);
            admitted[2] += u64::from(d.allowed);
            refused[i] = if d.allowed { 0 } else { refused[i] + 1 };
        }
    }
    admitted
}

/// `on_store_error: local` charges back: what the insurance stores admitted while Redis was
/// paused is charged to Redis when it answers again, so the window admits what is left of
/// `max`, not a whole `max` more. With `u` admitted by the store before the outage and `L`
/// by the processes' insurance stores, a window admits at most `max(max, u + L)` when each
/// process's charge lands before the store's next admission of the key (docs/configuration.md,
/// `on_store_error`, states the general bound); without the charge-back it admitted
/// `max + L` (the 1.44 × max in one process).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_admissions_are_charged_back_when_the_store_returns() {
    if !sluice_testkit::require_redis() {
        return;
    }
    let server = RedisServer::start().unwrap();
    // What fits: every admission ends up counted once; the window admits exactly max.
    let [u, l, after] = across_an_outage(&server, "fits", 30, 20).await;
    println!("u {u} + L {l} fits in {WIDE}: {after} admitted after the return");
    assert_eq!((u, l), (30, 40));
    // The checks that timed out before each limiter's breaker opened (3 each) reached Redis
    // once it ran again: counted there and by the insurance stores, so the window may admit
    // up to 6 fewer than max (stricter, never looser).
    let total = u + l + after;
    assert!(
        (WIDE - 6..=WIDE).contains(&total),
        "{total} admitted, max {WIDE}"
    );

    // What does not fit: the store admits nothing more; the local admissions stand.
    let [u, l, after] = across_an_outage(&server, "over", 30, 40).await;
    println!("u {u} + L {l} over {WIDE}: {after} admitted after the return");
    assert_eq!((u, l, after), (30, 80, 0), "max(max, u + L) = u + L");
}
