//! The regions store: one limit shared by several regions, each deciding at local latency.
//!
//! Each region writes only to its own Redis (the *local* store, a [`RedisStore`] built from
//! [`RegionsConfig::primary`], coalescing and all). Every other region's Redis has a
//! read-only replica in this region ([`RemoteRegion::replica`], ordinary Redis replication);
//! the store reads each remote region's usage of a (policy, key) from that replica **in the
//! background** (a peek, `EVALSHA_RO` on the replica) and keeps it for at most
//! [`RegionsConfig::refresh`]. A decision passes the remote usage into the one local call, as
//! a policy whose every `max` is lowered by what the other regions have used (`views`,
//! `decide`), so the local script admits when local + remote + cost ≤ max, atomically, and
//! reports `remaining = max − local − remote`.
//!
//! **Windows line up.** A fixed window in a regions store is counted *aligned to the epoch*
//! (`align: true`, whatever the policy says): per-key windows opened at each region's first
//! hit would start at different instants, and their counts would not add up. A sliding
//! window's buckets are aligned already. Token buckets and concurrency limits are refused
//! ([`RegionsStore::admits_policy`]).
//!
//! **The bound.** A region's view of another lags by at most the replication lag plus the
//! view's age (≤ `refresh`): what another region admitted in that span is what this region
//! does not see. So per window the regions together admit at most
//! `max + (regions − 1) × (per-region admission rate) × (lag + refresh)`. The
//! `regions_bench` example measures it (docs/regions.md shows a run). The
//! other side: a fixed window's view counts only in the window it was read in and never more
//! than the region used there, so (asked for as much) the regions admit at least `max` per
//! window; a sliding window's view may still count buckets that left the window since it was
//! read, which costs admissions for at most the view's age, never adds any.
//!
//! **Clocks.** Windows are aligned on each region's clock and lag is measured across two
//! clocks, so regions need clocks that agree (NTP): a skew of δ shifts a region's windows by
//! δ and adds to (or hides up to δ of) the lag measured. `clock: redis` is refused.
//!
//! **What falls back.** A region whose limiters all stop writes no heartbeat, so the others
//! see its lag grow and fall back too: a heartbeat that stops is indistinguishable from
//! replication that stops. A region whose view of another is stale says so in its heartbeat,
//! and that region falls back too: a cut is seen from both sides. While any other region is
//! under the fallback, every decision of this region is (its policy's mode, on the local
//! count, with what it last knew of the others: `local_share` splits what that left, never
//! `max` afresh; docs/regions.md, "A cut mid-window").
//!
//! **Lag and fallback.** Each region writes a heartbeat (its clock, ms) into its own primary
//! every `refresh / 2` (`health`); a region reads the others' from their replicas:
//! lag = read time − heartbeat. A remote region whose replica does not answer, or lags more
//! than [`RegionsConfig::max_lag`], puts every decision under its policy's [`Fallback`] until
//! it recovers; each switch is logged once and each decision taken so is counted
//! ([`RegionsStore::fallback_counts`]).

mod decide;
mod health;
mod validate;
mod views;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sluice::{Algorithm, Call, Clock, Decision, Op, Policy, Store, StoreError, SystemClock};

use crate::config::{ReadFrom, RedisConfig, Topology};
use crate::script::ScriptMode;
use crate::store::RedisStore;
use crate::tasks::Tasks;
use health::Health;
pub use validate::InvalidRegions;
use views::Views;

/// The default [`RegionsConfig::refresh`]: a remote view is at most this old.
pub const DEFAULT_REFRESH: Duration = Duration::from_millis(250);
/// The default [`RegionsConfig::max_lag`].
pub const DEFAULT_MAX_LAG: Duration = Duration::from_secs(2);

/// What a region does while another region's view cannot be trusted (its replica does not
/// answer, or lags more than [`RegionsConfig::max_lag`]).
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Deserialize, serde::Serialize,
)]
#[serde(rename_all = "snake_case")]
pub enum Fallback {
    /// This region's own count may reach `(max − known) / regions` (rounded down), `known`
    /// being what it last saw the other regions use in the window (0 in a new one).
    LocalShare,
    /// This region counts only its own usage, as a lone region would (up to `max` here).
    LocalOnly,
    /// Every check is denied (a cost of 0 still reports the state).
    Closed,
}

impl Fallback {
    /// The snake-case name (`local_share`, `local_only`, `closed`): a metrics label.
    pub fn as_str(self) -> &'static str {
        match self {
            Fallback::LocalShare => "local_share",
            Fallback::LocalOnly => "local_only",
            Fallback::Closed => "closed",
        }
    }
}

impl std::fmt::Display for Fallback {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Another region: its name and the replica, **in this region**, of its primary.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RemoteRegion {
    /// The region's name (its own [`RegionsConfig::local`]).
    pub name: String,
    /// The local replica of that region's primary: a standalone topology whose `primary` is
    /// the replica's URL (further `replicas` are read in turn). Its key prefix must be the
    /// local one.
    pub replica: RedisConfig,
}

impl RemoteRegion {
    /// The region `name`, read from the replica `replica`.
    pub fn new(name: impl Into<String>, replica: RedisConfig) -> Self {
        Self {
            name: name.into(),
            replica,
        }
    }
}

/// A regions store's configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RegionsConfig {
    /// This region's name.
    pub local: String,
    /// This region's own Redis, any topology Sluice supports (with `clock: app`).
    pub primary: RedisConfig,
    /// Every other region, at least one.
    pub remotes: Vec<RemoteRegion>,
    /// The longest age of a cached remote view (default [`DEFAULT_REFRESH`]).
    pub refresh: Duration,
    /// Past this replication lag (or with a replica that does not answer), the fallback
    /// applies (default [`DEFAULT_MAX_LAG`]); above `refresh`.
    pub max_lag: Duration,
    /// What every policy does past `max_lag` unless `policy_fallback` names it (default
    /// [`Fallback::LocalShare`]).
    pub fallback: Fallback,
    /// The fallback of a policy, by name.
    pub policy_fallback: BTreeMap<String, Fallback>,
}

impl RegionsConfig {
    /// Region `local` writing to `primary` and reading `remotes`, with the default refresh,
    /// maximum lag and fallback.
    pub fn new(local: impl Into<String>, primary: RedisConfig, remotes: Vec<RemoteRegion>) -> Self {
        Self {
            local: local.into(),
            primary,
            remotes,
            refresh: DEFAULT_REFRESH,
            max_lag: DEFAULT_MAX_LAG,
            fallback: Fallback::LocalShare,
            policy_fallback: BTreeMap::new(),
        }
    }

    /// Sets [`RegionsConfig::refresh`].
    pub fn refresh(mut self, refresh: Duration) -> Self {
        self.refresh = refresh;
        self
    }

    /// Sets [`RegionsConfig::max_lag`].
    pub fn max_lag(mut self, max_lag: Duration) -> Self {
        self.max_lag = max_lag;
        self
    }

    /// Sets [`RegionsConfig::fallback`].
    pub fn fallback(mut self, fallback: Fallback) -> Self {
        self.fallback = fallback;
        self
    }

    /// Sets the fallback of the policy `policy`.
    pub fn policy_fallback(mut self, policy: impl Into<String>, fallback: Fallback) -> Self {
        self.policy_fallback.insert(policy.into(), fallback);
        self
    }

    /// The number of regions, this one included.
    pub fn regions(&self) -> usize {
        self.remotes.len() + 1
    }

    /// The fallback of `policy`.
    pub fn fallback_of(&self, policy: &str) -> Fallback {
        self.policy_fallback
            .get(policy)
            .copied()
            .unwrap_or(self.fallback)
    }
}

/// Why a regions store cannot be made, or cannot count a policy.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RegionsError {
    /// The configuration is invalid ([`RegionsConfig::validate`]).
    #[error("regions: {0}")]
    Config(#[from] InvalidRegions),
    /// A policy holds a limit whose counts do not add up across regions.
    #[error(
        "policy `{policy}`: limits[{index}] is a {algorithm} limit; a regions store shares only \
         fixed_window and sliding_window limits across regions (their counts add up), so use one \
         of those or keep this policy out of the regions store"
    )]
    Unsupported {
        /// The policy's name.
        policy: String,
        /// The limit's index in the policy.
        index: usize,
        /// The limit's algorithm.
        algorithm: Algorithm,
    },
    /// Two fixed windows of one `per` would count in one key once the regions store aligns
    /// them to the epoch (`{max: 10, per: 1m}` beside `{max: 100, per: 1m, align: true}`).
    #[error(
        "policy `{policy}`: limits[{first}] ({first_limit}) and limits[{second}] \
         ({second_limit}) are fixed windows of the same `per`; a regions store aligns every \
         fixed window to the epoch, so both would count the same window: merge the two limits \
         or give them different windows"
    )]
    Collide {
        /// The policy's name.
        policy: String,
        /// The index of the first limit.
        first: usize,
        /// The first limit, as `max per <duration>` (and `aligned` when it says so).
        first_limit: String,
        /// The index of the second limit.
        second: usize,
        /// The second limit, likewise.
        second_limit: String,
    },
}

/// Another region as seen from this one, for metrics and `/v1/stats`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RegionStatus {
    /// The region's name.
    pub name: String,
    /// Whether its replica answered the last read.
    pub reachable: bool,
    /// Replication lag: when its heartbeat was last read, how old it was (`None` before the
    /// first heartbeat is read).
    pub lag: Option<Duration>,
    /// The age of the oldest view of it in use: since the last completed refresh of every
    /// key (`None` before the first).
    pub view_age: Option<Duration>,
    /// Whether this region puts decisions under their fallback now.
    pub fallback_active: bool,
}

/// A [`Store`] sharing each limit across regions: see the [module docs](self).
///
/// A clone is a handle of the same store (an `Arc` inside); the background tasks that
/// refresh the views and write the heartbeat stop when the last handle is dropped.
#[derive(Clone)]
pub struct RegionsStore {
    inner: Arc<Inner>,
}

struct Inner {
    config: RegionsConfig,
    local: RedisStore,
    remotes: Vec<Remote>,
    views: Views,
    health: Health,
    clock: Arc<dyn Clock>,
    /// Decisions taken under a fallback, per (policy, mode).
    fallbacks: Mutex<BTreeMap<(String, Fallback), u64>>,
    tasks: Tasks,
}

/// One other region: its name and the store reading its replica, made once the replica first
/// answers.
struct Remote {
    name: String,
    config: RedisConfig,
    store: Mutex<Option<RedisStore>>,
}

impl Remote {
    /// The store reading the replica, connecting (and loading the scripts) if it is not made
    /// yet.
    async fn store(&self) -> Result<RedisStore, StoreError> {
        if let Some(store) = self.store.lock().unwrap_or_else(|p| p.into_inner()).clone() {
            return Ok(store);
        }
        let store = RedisStore::connect(self.config.clone()).await?;
        *self.store.lock().unwrap_or_else(|p| p.into_inner()) = Some(store.clone());
        Ok(store)
    }
}

impl std::fmt::Debug for RegionsStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegionsStore")
            .field("local", &self.inner.config.local)
            .field("store", &self.inner.local)
            .field(
                "remotes",
                &self
                    .inner
                    .remotes
                    .iter()
                    .map(|r| &r.name)
                    .collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl RegionsStore {
    /// Connects to the local primary (which must answer, as [`RedisStore::connect`]) and to
    /// every remote replica (which need not: a remote that does not answer is under its
    /// fallback until it does), writes the first heartbeat and starts the background tasks (one per other region,
    /// and this region's heartbeat).
    pub async fn connect(config: RegionsConfig) -> Result<Self, StoreError> {
        Self::connect_with_clock(config, Arc::new(SystemClock)).await
    }

    /// [`RegionsStore::connect`] with the clock the heartbeats and view ages are read from;
    /// it must be the limiter's clock (`Limiter::with_clock`).
    pub async fn connect_with_clock(
        config: RegionsConfig,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, StoreError> {
        config
            .validate()
            .map_err(|e| StoreError::Backend(RegionsError::Config(e).to_string()))?;
        let local = RedisStore::connect(config.primary.clone()).await?;
        let mut remotes = Vec::with_capacity(config.remotes.len());
        for remote in &config.remotes {
            let reader = Remote {
                name: remote.name.clone(),
                config: reader_config(&remote.replica),
                store: Mutex::new(None),
            };
            // A replica that does not answer now is connected to by its region's task.
            if let Err(e) = reader.store().await {
                if !e.is_transient() {
                    return Err(StoreError::Backend(format!(
                        "region `{}`: {e}",
                        remote.name
                    )));
                }
                tracing::warn!(region = %remote.name, error = %e, "remote replica does not answer yet");
            }
            remotes.push(reader);
        }
        let health = Health::new(&config, remotes.len());
        let inner = Arc::new(Inner {
            views: Views::new(remotes.len()),
            health,
            local,
            remotes,
            clock,
            fallbacks: Mutex::new(BTreeMap::new()),
            tasks: Tasks::default(),
            config,
        });
        health::beat(&inner).await?;
        health::check(&inner).await;
        inner.tasks.set(health::spawn(&inner));
        Ok(Self { inner })
    }

    /// Whether a regions store can count `policy`: every limit a fixed window (counted
    /// aligned to the epoch in a regions store) or a sliding window, and no two fixed windows
    /// of one `per` (aligned, they would count the same window). A token bucket or a
    /// concurrency limit is refused, naming the policy and the limit; two colliding windows,
    /// naming both.
    pub fn admits_policy(policy: &Policy) -> Result<(), RegionsError> {
        let limits = policy.limits();
        for (index, limit) in limits.iter().enumerate() {
            match limit.algorithm() {
                Algorithm::FixedWindow => {
                    let earlier = limits[..index].iter().position(|l| {
                        l.algorithm() == Algorithm::FixedWindow && l.per_ms() == limit.per_ms()
                    });
                    if let Some(first) = earlier {
                        return Err(RegionsError::Collide {
                            policy: policy.name().to_owned(),
                            first,
                            first_limit: describe(&limits[first]),
                            second: index,
                            second_limit: describe(limit),
                        });
                    }
                }
                Algorithm::SlidingWindow => {}
                algorithm => {
                    return Err(RegionsError::Unsupported {
                        policy: policy.name().to_owned(),
                        index,
                        algorithm,
                    });
                }
            }
        }
        Ok(())
    }

    /// Every other region as seen from this one.
    pub fn regions(&self) -> Vec<RegionStatus> {
        let now = self.inner.clock.now_ms();
        self.inner
            .remotes
            .iter()
            .enumerate()
            .map(|(i, r)| self.inner.health.status(i, &r.name, now))
            .collect()
    }

    /// This region's own store (for readiness checks and descriptions).
    pub fn local(&self) -> &RedisStore {
        &self.inner.local
    }

    /// This region's name.
    pub fn name(&self) -> &str {
        &self.inner.config.local
    }

    /// Decisions taken under a fallback since the store was made, per policy and mode.
    pub fn fallback_counts(&self) -> Vec<(String, Fallback, u64)> {
        self.inner
            .fallbacks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|((policy, mode), n)| (policy.clone(), *mode, *n))
            .collect()
    }
}

/// A fixed window as a refusal names it: `10 per 60000 ms`, `aligned` when it says so.
fn describe(limit: &sluice::Limit) -> String {
    let aligned = if limit.align() { ", aligned" } else { "" };
    format!("max {} per {} ms{aligned}", limit.max(), limit.per_ms())
}

/// The configuration of the store that reads a remote region's replica: peeks on the replica
/// (`EVALSHA_RO`; scripts load on a replica, a function library does not).
fn reader_config(replica: &RedisConfig) -> RedisConfig {
    let mut config = replica.clone();
    if let Topology::Standalone { primary, replicas } = &mut config.topology
        && !replicas.contains(primary)
    {
        replicas.insert(0, primary.clone());
    }
    config.read_from = ReadFrom::Replicas;
    config.script_mode = ScriptMode::EvalSha;
    config.wait_for_replicas = None;
    config.coalesce = 1;
    config
}

impl Store for RegionsStore {
    /// A check, peek, refund or acquire decided by the local primary with the other regions'
    /// usage deducted from every `max` (or under the policy's fallback).
    async fn call(&self, call: Call<'_>) -> Result<Decision, StoreError> {
        let (policy, key, op, now_ms) = (call.policy, call.key, call.op, call.now_ms);
        if op == Op::Forget {
            // This region's state only; the other regions keep theirs.
            let aligned = decide::effective_policy(policy, &[0; 4]).map_err(StoreError::Backend)?;
            let call = Call {
                policy: &aligned,
                ..call
            };
            return self.inner.local.call(call).await;
        }
        Self::admits_policy(policy).map_err(|e| StoreError::Backend(e.to_string()))?;
        if matches!(op, Op::Hold { .. } | Op::Release { .. }) {
            return Err(StoreError::Backend(format!(
                "a regions store cannot run {op:?}: it holds no concurrency limits"
            )));
        }
        let inner = &self.inner;
        let remote = inner.views.remote_use(policy, key, now_ms);
        let offsets = if inner.health.any_fallback() {
            let mode = inner.config.fallback_of(policy.name());
            *inner
                .fallbacks
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .entry((policy.name().to_owned(), mode))
                .or_insert(0) += 1;
            decide::fallback_offsets(policy, mode, inner.config.regions(), &remote)
        } else {
            remote
        };
        decide::decide(&inner.local, policy, key, op, now_ms, &offsets).await
    }
}
