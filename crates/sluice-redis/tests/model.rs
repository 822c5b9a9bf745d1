//! A randomized model test of the Redis store where the world hits it: the real scripts on a real Redis (standalone, and a 6-node Cluster), decisions
//! single and coalesced into batches, every rate algorithm and mixed policies, interleaved
//! with faults drawn at random, and invariants checked after every step.
//!
//! Faults: `SET` garbage and number-like strings, a key of the wrong type, half a window
//! (`HSET` of one field), `PERSIST`, `DEL` of one limit's key (what an eviction does) or of a
//! whole (policy, key), `RESTORE` with a TTL, `PEXPIRE 1`, `FLUSHALL`, `FUNCTION FLUSH`; on the
//! Cluster, a slot migrated to another primary mid-window (`MIGRATE` of its keys, as
//! resharding does); and, for a whole case, two clients whose clocks disagree within half the
//! expiry margin. A case's clock starts at Redis's time (fixed windows open as counters) or
//! years before it (they open as hashes).
//!
//! Invariants, after every step:
//! - a (policy, key) no fault has touched since it was last reset decides exactly as the
//!   memory store (the core's model) does, field for field;
//! - never more than `max` admitted per window per key while the store answers: a fixed
//!   window's admissions grouped by the end it reported (a window re-armed after `PERSIST`
//!   continues the group it had), a token bucket's within `burst` plus its rate since the
//!   key's state was last reset, a sliding window's within any span of `per − 2·precision`;
//! - the store answers every decision unless a key holds garbage, and then the error is
//!   corrupt state (not transient: a fail-open policy is not failed open on it), the same kind
//!   single and batched; once the bad key is gone (`DELETE /v1/keys`, `forget`) the key
//!   decides again: a fault never becomes a permanent error. No error is ever transient here
//!   (the Redis is healthy), so a fail-open policy never degrades and never answers 5xx for
//!   any other fault.
//!
//! Seeded: a failure prints the seed and how to replay it. `scripts/test` runs
//! `SLUICE_MODEL_CASES` cases on a standalone Redis (default 100) and
//! `SLUICE_MODEL_CLUSTER_CASES` on a Cluster (default 24), about twenty seconds; a longer
//! search:
//! `SLUICE_MODEL_CASES=2000 cargo test --release -p sluice-redis --test model -- --nocapture`
//! (`SLUICE_MODEL_SEED` fixes the first case's seed; `SLUICE_MODEL_LOG` how many of the last
//! steps a failure prints, default 12).

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use sluice::{
    Algorithm, Decision, Limit, LimitSpec, MemoryStore, Op, Policy, Store, StoreError,
    StoreErrorKind, StoreExt,
};
use sluice_redis::{RedisConfig, RedisStore};
use sluice_testkit::{RedisCluster, RedisServer};

/// Every store's expiry margin: long, since a case's manual clock barely moves while Redis's
/// runs, and a window must not expire in real time under a model that still holds it open.
const MARGIN_MS: u64 = 3_600_000;
/// A clock years behind Redis's (windows open as hashes).
const T0: u64 = 1_700_000_000_000;
const KEYS: usize = 3;

fn wall_ms() -> u64 {
    sluice::Clock::now_ms(&sluice::SystemClock)
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

/// What the cases found, printed at the end.
#[derive(Default, Debug)]
struct Stats {
    cases: u64,
    steps: u64,
    single: u64,
    batched: u64,
    compared: u64,
    admitted_units: u64,
    faults: BTreeMap<&'static str, u64>,
    corrupt_seen: u64,
    repaired: u64,
    hash_cases: u64,
    skew_cases: u64,
}

/// One limit's admissions, for the "never more than max" invariants.
#[derive(Default, Clone)]
struct Track {
    /// Fixed window: the end the current group reported, and its units.
    reset: Option<u64>,
    used: u64,
    /// Fixed window: a `PERSIST` since the last admission (the re-armed window goes on
    /// counting the units it kept).
    merge: bool,
    /// Token bucket: when the state was last reset, and the units admitted since.
    since: Option<u64>,
    /// Sliding window: admissions (now, units) since the state was last reset.
    log: Vec<(u64, u64)>,
}

struct Case<'a> {
    rng: SmallRng,
    seed: u64,
    store: &'a RedisStore,
    redis: &'a Redis,
    memory: MemoryStore,
    policies: Vec<Policy>,
    now: u64,
    /// Two clients whose clocks are this far apart (0: one clock).
    skew: u64,
    /// (policy, key) pairs whose state no longer matches the memory store's.
    dirty: HashSet<(usize, usize)>,
    /// (policy, key) pairs holding garbage right now.
    garbage: HashSet<(usize, usize)>,
    tracks: HashMap<(usize, usize, usize), Track>,
    log: Vec<String>,
    stats: &'a mut Stats,
}

type Outcome = Result<(), String>;

macro_rules! ensure {
    ($case:expr, $cond:expr, $($arg:tt)*) => {
        if !$cond {
            return Err($case.fail(format!($($arg)*)));
        }
    };
}

fn random_policy(rng: &mut SmallRng, name: String) -> Policy {
    loop {
        let n = rng.random_range(1..=3);
        let mut limits = Vec::new();
        for _ in 0..n {
            let spec = match rng.random_range(0..3) {
                0 => {
                    let per = [1_000, 5_000, 60_000][rng.random_range(0..3)];
                    let spec = LimitSpec::fixed_window(rng.random_range(1..=8), per);
                    if rng.random_bool(0.3) {
                        spec.aligned()
                    } else {
                        spec
                    }
                }
                1 => {
                    let per = [2_000, 10_000][rng.random_range(0..2)];
                    let parts = [4, 10][rng.random_range(0..2)];
                    LimitSpec::sliding_window(rng.random_range(1..=10), per)
                        .precision_ms(per / parts)
                }
                _ => LimitSpec::token_bucket(
                    rng.random_range(1..=6),
                    [1_000, 4_000][rng.random_range(0..2)],
                )
                .burst(rng.random_range(1..=8)),
            };
            if let Ok(limit) = Limit::new(spec) {
                limits.push(limit);
            }
        }
        if let Ok(p) = Policy::new(name.clone(), limits) {
            return p;
        }
    }
}

fn key(k: usize) -> String {
    format!("k{k}")
}

impl Case<'_> {
    fn fail(&self, what: String) -> String {
        let tail: Vec<&String> = self
            .log
            .iter()
            .rev()
            .take(env_u64("SLUICE_MODEL_LOG").unwrap_or(12) as usize)
            .collect();
        format!(
            "seed {}: {what}\nlast steps, newest first:\n  {}",
            self.seed,
            tail.iter()
                .map(|s| s.as_str())
                .collect::<Vec<_>>()
                .join("\n  ")
        )
    }

    /// The Redis keys of (policy, key).
    fn redis_keys(&self, p: usize, k: usize) -> Vec<String> {
        sluice_redis::keys::policy_keys(
            "sluice:",
            &self.policies[p],
            &key(k),
            &MARGIN_MS.to_string(),
        )
    }

    /// The `now` a decision is made at: the one clock, or (with a skew) one of two clocks.
    fn client_now(&mut self) -> u64 {
        if self.skew > 0 && self.rng.random_bool(0.5) {
            self.now + self.skew
        } else {
            self.now
        }
    }

    /// Resets what the invariants know of (p, k): its state starts afresh.
    fn reset_tracks(&mut self, p: usize, k: usize, at: u64) {
        for i in 0..self.policies[p].limits().len() {
            self.tracks.insert(
                (p, k, i),
                Track {
                    since: Some(at),
                    ..Track::default()
                },
            );
        }
    }

    /// Forgets (p, k) in both stores: in sync again.
    async fn forget(&mut self, p: usize, k: usize) -> Outcome {
        let policy = self.policies[p].clone();
        let r = self
            .store
            .call(sluice::Call::new(&policy, &key(k), Op::Forget, self.now))
            .await;
        ensure!(self, r.is_ok(), "forget {}/{k}: {r:?}", policy.name());
        self.memory
            .call(sluice::Call::new(&policy, &key(k), Op::Forget, self.now))
            .await
            .unwrap();
        self.dirty.remove(&(p, k));
        self.garbage.remove(&(p, k));
        let at = self.now;
        self.reset_tracks(p, k, at);
        Ok(())
    }

    /// Checks one decision's outcome against the model and the invariants.
    fn judge(
        &mut self,
        p: usize,
        k: usize,
        op: Op,
        now: u64,
        got: &Result<Decision, StoreError>,
        expected: &Result<Decision, StoreError>,
    ) -> Outcome {
        let name = self.policies[p].name().to_owned();
        let what = format!("{op:?} of {name}/k{k} at {now}");
        if self.garbage.contains(&(p, k)) {
            match got {
                Err(e) => {
                    ensure!(
                        self,
                        e.kind() == StoreErrorKind::Corrupt,
                        "{what}: garbage answered {e:?}, not corrupt state"
                    );
                    self.stats.corrupt_seen += 1;
                }
                Ok(d) => {
                    return Err(self.fail(format!("{what}: a key holding garbage decided {d:?}")));
                }
            }
            return Ok(());
        }
        let d = match got {
            Ok(d) => d,
            Err(e) => {
                return Err(self.fail(format!(
                    "{what}: the store failed ({:?}, transient {}): {e}",
                    e.kind(),
                    e.is_transient()
                )));
            }
        };
        if !self.dirty.contains(&(p, k)) && self.skew == 0 {
            ensure!(
                self,
                got == expected,
                "{what}: redis {got:?}\n  memory {expected:?}"
            );
            self.stats.compared += 1;
        }
        self.invariants(p, k, op, now, d)
    }

    /// "Never more than max": per fixed window (by reported end), per token bucket (burst +
    /// rate since reset), per sliding window (any span of per − 2·precision).
    fn invariants(&mut self, p: usize, k: usize, op: Op, now: u64, d: &Decision) -> Outcome {
        let policy = self.policies[p].clone();
        let (admitted, refunded) = match op {
            Op::Check { cost } if d.allowed && cost > 0 => (cost, 0),
            Op::Refund { cost } => (0, cost),
            _ => (0, 0),
        };
        if admitted == 0 && refunded == 0 {
            return Ok(());
        }
        self.stats.admitted_units += admitted;
        let skew = self.skew;
        for (i, limit) in policy.limits().iter().enumerate() {
            let mut t = self.tracks.get(&(p, k, i)).cloned().unwrap_or_default();
            let status = &d.limits()[i];
            match limit.algorithm() {
                Algorithm::FixedWindow => {
                    if refunded > 0 {
                        if t.reset.is_some_and(|r| now < r) {
                            t.used = t.used.saturating_sub(refunded);
                        }
                    } else {
                        let r = status.reset_ms;
                        if t.reset == Some(r) || (t.merge && t.reset.is_some_and(|old| now < old)) {
                            t.used += admitted;
                        } else {
                            t.used = admitted;
                        }
                        t.reset = Some(r);
                        t.merge = false;
                        if t.used > limit.max() {
                            let msg = format!(
                                "{} admitted in one window of {limit:?} of {}/k{k} (ending {r}), above max",
                                t.used,
                                policy.name()
                            );
                            return Err(self.fail(msg));
                        }
                    }
                }
                Algorithm::TokenBucket => {
                    let since = *t.since.get_or_insert(now.saturating_sub(skew));
                    if refunded > 0 {
                        t.used = t.used.saturating_sub(refunded);
                    } else {
                        t.used += admitted;
                        let elapsed = u128::from(now.saturating_sub(since) + 2 * skew);
                        let per = u128::from(limit.per_ms());
                        let bound = u128::from(limit.burst()) * per
                            + elapsed * u128::from(limit.max())
                            + per;
                        if u128::from(t.used) * per > bound {
                            let msg = format!(
                                "{} admitted by {limit:?} of {}/k{k} in {elapsed} ms, above burst + rate",
                                t.used,
                                policy.name()
                            );
                            return Err(self.fail(msg));
                        }
                    }
                }
                _ => {
                    let span = limit.per_ms().saturating_sub(2 * limit.precision_ms());
                    if refunded > 0 {
                        let mut left = refunded;
                        while left > 0 {
                            let Some(last) = t.log.last_mut() else { break };
                            let take = left.min(last.1);
                            last.1 -= take;
                            left -= take;
                            if last.1 == 0 {
                                t.log.pop();
                            }
                        }
                    } else if skew == 0 && span > 0 {
                        t.log.push((now, admitted));
                        let recent: u64 = t
                            .log
                            .iter()
                            .filter(|(at, _)| now - at < span)
                            .map(|(_, n)| n)
                            .sum();
                        if recent > limit.max() {
                            let msg = format!(
                                "{recent} admitted by {limit:?} of {}/k{k} within {span} ms, above max",
                                policy.name()
                            );
                            return Err(self.fail(msg));
                        }
                    }
                }
            }
            self.tracks.insert((p, k, i), t);
        }
        Ok(())
    }

    /// One decision alone, through both stores.
    async fn single(&mut self) -> Outcome {
        let p = self.rng.random_range(0..self.policies.len());
        let k = self.rng.random_range(0..KEYS);
        let cost = [0, 1, 1, 1, 2, 3][self.rng.random_range(0..6)];
        let op = match self.rng.random_range(0..10) {
            0..=6 => Op::Check { cost },
            7 | 8 => Op::Peek { cost },
            _ => Op::Refund { cost },
        };
        let now = self.client_now();
        let policy = self.policies[p].clone();
        let got = self
            .store
            .call(sluice::Call::new(&policy, &key(k), op, now))
            .await;
        let expected = self
            .memory
            .call(sluice::Call::new(&policy, &key(k), op, now))
            .await;
        self.log.push(format!(
            "single {op:?} {}/k{k} at {now}: {got:?}",
            policy.name()
        ));
        self.stats.single += 1;
        self.judge(p, k, op, now, &got, &expected)
    }

    /// Several checks and peeks at once (they coalesce into a batch), decided by the memory
    /// store in the same order.
    async fn batch(&mut self) -> Outcome {
        let n = self.rng.random_range(2..=6);
        let mut picks = Vec::new();
        for _ in 0..n {
            let p = self.rng.random_range(0..self.policies.len());
            let k = self.rng.random_range(0..KEYS);
            let cost = [0, 1, 1, 2][self.rng.random_range(0..4)];
            let op = if self.rng.random_bool(0.8) {
                Op::Check { cost }
            } else {
                Op::Peek { cost }
            };
            picks.push((p, k, op, self.client_now()));
        }
        self.decide_together(picks).await
    }

    async fn decide_together(&mut self, picks: Vec<(usize, usize, Op, u64)>) -> Outcome {
        let policies = self.policies.clone();
        let keys: Vec<String> = picks.iter().map(|&(_, k, _, _)| key(k)).collect();
        let got =
            sluice_testkit::join_in_order(picks.iter().zip(&keys).map(|(&(p, _, op, now), k)| {
                self.store.call(sluice::Call::new(&policies[p], k, op, now))
            }))
            .await;
        let mut expected = Vec::new();
        for (&(p, _, op, now), k) in picks.iter().zip(&keys) {
            expected.push(
                self.memory
                    .call(sluice::Call::new(&policies[p], k, op, now))
                    .await,
            );
        }
        self.stats.batched += picks.len() as u64;
        for ((&(p, k, op, now), g), e) in picks.iter().zip(&got).zip(&expected) {
            self.log.push(format!(
                "batched {op:?} {}/k{k} at {now}: {g:?}",
                policies[p].name()
            ));
            self.judge(p, k, op, now, g, e)?;
        }
        Ok(())
    }

    fn advance(&mut self) {
        let dt = [1, 7, 50, 300, 1_000, 2_500, 5_000, 60_000][self.rng.random_range(0..8)];
        self.now += dt;
        self.log.push(format!("advance {dt} ms to {}", self.now));
    }

    /// A command about the key `args[1]`, on the node that holds it.
    fn cmd(&self, args: &[&str]) -> Result<redis::Value, String> {
        self.redis.cmd(args)
    }

    /// A fault drawn at random, then what it must lead to.
    async fn fault(&mut self) -> Outcome {
        let p = self.rng.random_range(0..self.policies.len());
        let k = self.rng.random_range(0..KEYS);
        let keys = self.redis_keys(p, k);
        let i = self.rng.random_range(0..keys.len());
        let target = keys[i].clone();
        let kind = [
            "garbage",
            "number-like",
            "wrong type",
            "half a window",
            "persist",
            "del one",
            "del all",
            "restore ttl",
            "expire soon",
            "flushall",
            "function flush",
            "migrate slot",
        ][self.rng.random_range(0..self.redis.faults())];
        *self.stats.faults.entry(kind).or_default() += 1;
        self.log.push(format!("fault {kind} on {target}"));
        let exists = self.cmd(&["EXISTS", &target])? == redis::Value::Int(1);
        match kind {
            "garbage" | "number-like" | "wrong type" | "half a window" => {
                self.cmd(&["DEL", &target])?;
                let bad =
                    ["0x1", " 5", "1e3", "05", "1.0", "-3", "+4"][self.rng.random_range(0..7)];
                let algorithm = self.policies[p].limits()[i].algorithm();
                match kind {
                    "garbage" => self.cmd(&["SET", &target, "garbage"])?,
                    "number-like" if algorithm == Algorithm::FixedWindow => {
                        self.cmd(&["SET", &target, bad, "PX", "600000"])?
                    }
                    "number-like" if algorithm == Algorithm::TokenBucket => {
                        self.cmd(&["HSET", &target, "tat", bad, "frac", "0"])?
                    }
                    "number-like" => {
                        let start = (self.now - self.now % 1_000).to_string();
                        self.cmd(&["HSET", &target, &start, bad])?
                    }
                    "wrong type" => self.cmd(&["LPUSH", &target, "x"])?,
                    _ => match algorithm {
                        Algorithm::FixedWindow => self.cmd(&["HSET", &target, "used", "1"])?,
                        Algorithm::TokenBucket => self.cmd(&["HSET", &target, "frac", "0"])?,
                        _ => self.cmd(&["HSET", &target, "yesterday", "1"])?,
                    },
                };
                self.garbage.insert((p, k));
                self.dirty.insert((p, k));
                // The same fault, alone and in a batch beside a clean decision: corrupt state,
                // the same kind, and nothing written (the keys of (p, k) as they were).
                let policy = self.policies[p].clone();
                let now = self.client_now();
                let dump = |case: &Self| -> Result<Vec<redis::Value>, String> {
                    keys.iter().map(|key| case.cmd(&["DUMP", key])).collect()
                };
                let before = dump(self)?;
                let alone = self.store.check(&policy, &key(k), 1, now).await;
                self.judge(p, k, Op::Check { cost: 1 }, now, &alone, &alone.clone())?;
                let other = (k + 1) % KEYS;
                self.decide_together(vec![
                    (p, k, Op::Check { cost: 1 }, now),
                    (p, other, Op::Peek { cost: 1 }, now),
                    (p, k, Op::Peek { cost: 0 }, now),
                ])
                .await?;
                let after = dump(self)?;
                ensure!(
                    self,
                    before == after,
                    "a decision that failed on {target} ({kind}) wrote: {before:?} -> {after:?}"
                );
                // Repaired as an operator would (`DELETE /v1/keys/…`): the key decides again.
                self.forget(p, k).await?;
                self.stats.repaired += 1;
                let d = self.store.check(&policy, &key(k), 1, now).await;
                let m = self.memory.check(&policy, &key(k), 1, now).await;
                self.log.push(format!("after repair: {d:?}"));
                self.judge(p, k, Op::Check { cost: 1 }, now, &d, &m)?;
            }
            "persist" => {
                if exists {
                    self.cmd(&["PERSIST", &target])?;
                    self.dirty.insert((p, k));
                    if self.skew == 0 {
                        if let Some(t) = self.tracks.get_mut(&(p, k, i)) {
                            t.merge = true;
                        }
                    } else {
                        // Re-armed on the clock of whichever client meets it first: to a
                        // client whose clock is ahead, the window may end that much earlier
                        // (docs/redis.md, "Keys"), so its count starts afresh for the model.
                        let at = self.now;
                        self.tracks.insert(
                            (p, k, i),
                            Track {
                                since: Some(at),
                                ..Track::default()
                            },
                        );
                    }
                }
            }
            "del one" | "expire soon" | "restore ttl" => {
                if exists {
                    match kind {
                        "del one" => {
                            self.cmd(&["DEL", &target])?;
                        }
                        "expire soon" => {
                            // Gone before the next step, so that the invariants restart
                            // where the state did.
                            self.cmd(&["PEXPIRE", &target, "1"])?;
                            while self.cmd(&["EXISTS", &target])? == redis::Value::Int(1) {
                                std::thread::sleep(Duration::from_millis(1));
                            }
                        }
                        _ => {
                            let ttl = self.rng.random_range(1..=7_200_000u64).to_string();
                            let dump = match self.cmd(&["DUMP", &target])? {
                                redis::Value::BulkString(b) => b,
                                // Expired since (an earlier `PEXPIRE 1`): nothing to restore.
                                redis::Value::Nil => return Ok(()),
                                other => return Err(self.fail(format!("DUMP: {other:?}"))),
                            };
                            self.redis
                                .restore(&target, &ttl, &dump)
                                .map_err(|e| self.fail(format!("RESTORE: {e}")))?;
                        }
                    }
                    self.dirty.insert((p, k));
                    self.tracks.remove(&(p, k, i));
                    let at = self.now;
                    self.tracks.entry((p, k, i)).or_default().since = Some(at);
                }
            }
            "del all" => self.forget(p, k).await?,
            "migrate slot" => {
                // Resharding mid-window: the slot of (p, k) moves to another primary with
                // every key in it (MIGRATE: their counters' ends move by the time in flight).
                let stem = sluice_redis::keys::stem("sluice:", &self.policies[p], &key(k));
                let slot = sluice_testkit::key_slot(stem.as_bytes());
                self.redis
                    .migrate(slot)
                    .map_err(|e| self.fail(format!("migrating slot {slot}: {e}")))?;
                for p in 0..self.policies.len() {
                    for k in 0..KEYS {
                        let stem = sluice_redis::keys::stem("sluice:", &self.policies[p], &key(k));
                        if sluice_testkit::key_slot(stem.as_bytes()) == slot {
                            self.dirty.insert((p, k));
                            let at = self.now;
                            self.reset_tracks(p, k, at);
                        }
                    }
                }
            }
            "flushall" => {
                self.redis.everywhere(&["FLUSHALL"])?;
                for p in 0..self.policies.len() {
                    for k in 0..KEYS {
                        self.memory
                            .call(sluice::Call::new(
                                &self.policies[p],
                                &key(k),
                                Op::Forget,
                                self.now,
                            ))
                            .await
                            .unwrap();
                        self.dirty.remove(&(p, k));
                        let at = self.now;
                        self.reset_tracks(p, k, at);
                    }
                }
                self.garbage.clear();
            }
            _ => {
                // The store loads its code again and retries: nothing fails.
                self.redis.everywhere(&["FUNCTION", "FLUSH"])?;
            }
        }
        Ok(())
    }

    async fn run(&mut self, steps: usize) -> Outcome {
        for _ in 0..steps {
            self.stats.steps += 1;
            match self.rng.random_range(0..100) {
                0..=44 => self.single().await?,
                45..=59 => self.batch().await?,
                60..=79 => self.advance(),
                _ => self.fault().await?,
            }
        }
        Ok(())
    }
}

/// Where the faults go: the one server, or the Cluster node that serves the key.
enum Redis {
    One(RedisServer),
    Cluster(RedisCluster),
}

impl Redis {
    /// A store's configuration for this Redis (reads on the primary, the model's margin).
    fn config(&self) -> RedisConfig {
        match self {
            Redis::One(s) => RedisConfig::new(s.url()),
            Redis::Cluster(c) => RedisConfig::cluster(c.urls()),
        }
        .read_from(sluice_redis::ReadFrom::Primary)
        .timeout(Duration::from_secs(5))
        .expiry_margin(Duration::from_millis(MARGIN_MS))
    }

    /// How many kinds of fault apply (a slot migration needs a Cluster).
    fn faults(&self) -> usize {
        match self {
            Redis::One(_) => 11,
            Redis::Cluster(_) => 12,
        }
    }

    fn cmd(&self, args: &[&str]) -> Result<redis::Value, String> {
        match self {
            Redis::One(s) => s.cmd(args),
            Redis::Cluster(c) => c.cmd_for_key(args[1], args),
        }
        .map_err(|e| format!("{args:?}: {e}"))
    }

    /// Runs `args` on every primary.
    fn everywhere(&self, args: &[&str]) -> Result<(), String> {
        match self {
            Redis::One(s) => s.cmd(args).map(drop).map_err(|e| format!("{args:?}: {e}")),
            Redis::Cluster(c) => {
                for shard in c.shards().map_err(|e| e.to_string())? {
                    c.nodes()[shard.primary]
                        .cmd(args)
                        .map_err(|e| format!("{args:?}: {e}"))?;
                }
                Ok(())
            }
        }
    }

    /// `RESTORE key ttl dump REPLACE` where the key lives.
    fn restore(&self, key: &str, ttl: &str, dump: &[u8]) -> Result<(), String> {
        let nodes: Vec<&RedisServer> = match self {
            Redis::One(s) => vec![s],
            Redis::Cluster(c) => c.nodes().iter().collect(),
        };
        let mut last = String::new();
        for node in nodes {
            let mut conn = node.connection().map_err(|e| e.to_string())?;
            match redis::cmd("RESTORE")
                .arg(key)
                .arg(ttl)
                .arg(dump)
                .arg("REPLACE")
                .query::<()>(&mut conn)
            {
                Ok(()) => return Ok(()),
                Err(e) if e.redirect_node().is_some() || e.code() == Some("READONLY") => {
                    last = e.to_string();
                }
                Err(e) => return Err(e.to_string()),
            }
        }
        Err(last)
    }

    /// Moves `slot` to another primary, keys and all, as resharding does.
    fn migrate(&self, slot: u16) -> Result<(), String> {
        let Redis::Cluster(c) = self else {
            return Ok(());
        };
        let e = |e: sluice_testkit::Error| e.to_string();
        let shards = c.shards().map_err(e)?;
        let source = shards
            .iter()
            .find(|s| s.serves(slot))
            .ok_or("no owner")?
            .primary;
        let target = shards
            .iter()
            .map(|s| s.primary)
            .find(|&p| p != source)
            .ok_or("one primary")?;
        let id = |i: usize| -> Result<String, String> {
            match c.nodes()[i].cmd(&["CLUSTER", "MYID"]).map_err(e)? {
                redis::Value::BulkString(b) => Ok(String::from_utf8_lossy(&b).into_owned()),
                other => Err(format!("MYID: {other:?}")),
            }
        };
        let (from, to) = (id(source)?, id(target)?);
        let slot = slot.to_string();
        let (src, dst) = (&c.nodes()[source], &c.nodes()[target]);
        dst.cmd(&["CLUSTER", "SETSLOT", &slot, "IMPORTING", &from])
            .map_err(e)?;
        src.cmd(&["CLUSTER", "SETSLOT", &slot, "MIGRATING", &to])
            .map_err(e)?;
        let port = dst.port().to_string();
        loop {
            let keys = match src
                .cmd(&["CLUSTER", "GETKEYSINSLOT", &slot, "100"])
                .map_err(e)?
            {
                redis::Value::Array(keys) => keys,
                other => return Err(format!("GETKEYSINSLOT: {other:?}")),
            };
            if keys.is_empty() {
                break;
            }
            for k in keys {
                let redis::Value::BulkString(k) = k else {
                    return Err(format!("a key: {k:?}"));
                };
                let k = String::from_utf8_lossy(&k).into_owned();
                src.cmd(&["MIGRATE", "127.0.0.1", &port, &k, "0", "5000"])
                    .map_err(e)?;
            }
        }
        for node in [target, source].into_iter().chain(
            shards
                .iter()
                .map(|s| s.primary)
                .filter(|&p| p != source && p != target),
        ) {
            c.nodes()[node]
                .cmd(&["CLUSTER", "SETSLOT", &slot, "NODE", &to])
                .map_err(e)?;
        }
        c.wait_ok().map_err(e)?;
        Ok(())
    }
}

/// Prints the seed of the case in flight if it panics (an `unwrap` inside the harness).
struct SeedOnPanic(u64);

impl Drop for SeedOnPanic {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "model case with seed {} panicked: replay with SLUICE_MODEL_SEED={} SLUICE_MODEL_CASES=1",
                self.0, self.0
            );
        }
    }
}

/// Starts `redis` (unless Redis is missing) and runs the cases the env variable `cases_var`
/// asks for (`default_cases` without it) through a store on it, from seed `SLUICE_MODEL_SEED`
/// (the wall clock without it).
fn run_cases(label: &str, cases_var: &str, default_cases: u64, redis: fn() -> Redis) {
    if !sluice_testkit::require_redis() {
        return;
    }
    let cases = env_u64(cases_var).unwrap_or(default_cases);
    let redis = &redis();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let store = &rt
        .block_on(RedisStore::connect(redis.config()))
        .expect("connect");
    let first = env_u64("SLUICE_MODEL_SEED").unwrap_or_else(|| wall_ms() ^ 0x5eed_0040);
    let mut stats = Stats::default();
    let started = std::time::Instant::now();
    println!("model ({label}): {cases} cases from seed {first}");
    for n in 0..cases {
        let seed = first.wrapping_add(n);
        let _guard = SeedOnPanic(seed);
        redis.everywhere(&["FLUSHALL"]).unwrap();
        let mut rng = SmallRng::seed_from_u64(seed);
        let policies: Vec<Policy> = (0..3)
            .map(|i| random_policy(&mut rng, format!("c{n}p{i}")))
            .collect();
        let far = rng.random_bool(0.3);
        let skew = if rng.random_bool(0.2) {
            rng.random_range(1..MARGIN_MS / 2)
        } else {
            0
        };
        stats.hash_cases += u64::from(far);
        stats.skew_cases += u64::from(skew > 0);
        let steps = rng.random_range(60..=160);
        let now = if far { T0 } else { wall_ms() };
        let mut case = Case {
            rng,
            seed,
            store,
            redis,
            memory: MemoryStore::new(),
            policies,
            now,
            skew,
            dirty: HashSet::new(),
            garbage: HashSet::new(),
            tracks: HashMap::new(),
            log: Vec::new(),
            stats: &mut stats,
        };
        let result = rt.block_on(case.run(steps));
        if let Err(e) = result {
            panic!(
                "model ({label}) case {n} failed: {e}\nreplay with SLUICE_MODEL_SEED={seed} {cases_var}=1"
            );
        }
        stats.cases += 1;
    }
    println!(
        "model ({label}): {} cases ({} on hashes, {} with two clocks) in {:?}: {stats:?}",
        stats.cases,
        stats.hash_cases,
        stats.skew_cases,
        started.elapsed()
    );
    assert!(stats.compared > 0 && stats.corrupt_seen > 0 && stats.repaired > 0);
}

/// Standalone Redis: `SLUICE_MODEL_CASES` cases (default 100).
#[test]
fn the_store_keeps_its_invariants_under_random_faults() {
    run_cases("standalone", "SLUICE_MODEL_CASES", 100, || {
        Redis::One(RedisServer::start().expect("redis-server"))
    });
}

/// A Redis Cluster (3 primaries, 3 replicas), with slot migrations among the faults:
/// `SLUICE_MODEL_CLUSTER_CASES` cases (default 24).
#[test]
fn the_cluster_keeps_its_invariants_under_random_faults() {
    run_cases("cluster", "SLUICE_MODEL_CLUSTER_CASES", 24, || {
        Redis::Cluster(RedisCluster::start().expect("redis cluster"))
    });
}
