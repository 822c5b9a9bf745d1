//! Three (or more) regions on loopback, shared by `tests/regions.rs` and the
//! `regions_bench` example: a primary per region, and in each region a replica of every
//! other region's primary, reached through a [`DelayProxy`] (delay or cut replication), and a
//! [`RegionsStore`] per region. Policies named `share`, `only` and `closed` fall back to
//! `local_share`, `local_only` and `closed`; every other to the settings' fallback.
#![allow(dead_code, unreachable_pub)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use sluice::{Decision, Policy, StoreExt};
use sluice_redis::{
    Fallback, RedisConfig, RegionStatus, RegionsConfig, RegionsStore, RemoteRegion,
};
use sluice_testkit::{DelayProxy, RedisServer, ServerOptions, wait_until};

/// A timeout a loaded 2-core machine meets: these tests count exactly.
pub const STORE_TIMEOUT: Duration = Duration::from_secs(2);

pub fn name(r: usize) -> String {
    format!("region-{r}")
}

/// The regions' settings.
#[derive(Clone, Copy, Debug)]
pub struct Settings {
    pub regions: usize,
    pub refresh: Duration,
    pub max_lag: Duration,
    pub fallback: Fallback,
}

impl Settings {
    pub fn new(refresh_ms: u64, max_lag_ms: u64, fallback: Fallback) -> Self {
        Self {
            regions: 3,
            refresh: Duration::from_millis(refresh_ms),
            max_lag: Duration::from_millis(max_lag_ms),
            fallback,
        }
    }
}

/// The servers and stores of every region.
pub struct World {
    pub settings: Settings,
    pub primaries: Vec<RedisServer>,
    /// `links[r][s]`: in region `r`, the replica of region `s`'s primary and the proxy it
    /// replicates through (`None` where `r == s`).
    pub links: Vec<Vec<Option<(RedisServer, DelayProxy)>>>,
    pub stores: Vec<RegionsStore>,
}

impl World {
    /// Starts every region and polls until each trusts its views of the others (within 10 s).
    pub async fn start(settings: Settings) -> World {
        let n = settings.regions;
        let primaries: Vec<RedisServer> = (0..n)
            .map(|_| RedisServer::start().expect("primary starts"))
            .collect();
        let mut links = Vec::with_capacity(n);
        for r in 0..n {
            let mut row = Vec::with_capacity(n);
            for (s, primary) in primaries.iter().enumerate() {
                if r == s {
                    row.push(None);
                    continue;
                }
                let proxy = DelayProxy::start(primary.port()).expect("proxy starts");
                let replica = ServerOptions::new()
                    .replica_of(proxy.port())
                    .start()
                    .expect("replica starts");
                row.push(Some((replica, proxy)));
            }
            links.push(row);
        }
        let world = World {
            settings,
            primaries,
            links,
            stores: Vec::new(),
        };
        world.wait_links_up();
        let mut stores = Vec::with_capacity(n);
        for r in 0..n {
            stores.push(
                RegionsStore::connect(world.config(r))
                    .await
                    .expect("regions store connects"),
            );
        }
        let world = World { stores, ..world };
        world.wait_fallback(false, Duration::from_secs(10)).await;
        world
    }

    pub fn config(&self, r: usize) -> RegionsConfig {
        let remotes = (0..self.settings.regions)
            .filter(|&s| s != r)
            .map(|s| {
                let (replica, _) = self.links[r][s].as_ref().expect("a link");
                RemoteRegion::new(
                    name(s),
                    RedisConfig::new(replica.url()).timeout(STORE_TIMEOUT),
                )
            })
            .collect();
        RegionsConfig::new(
            name(r),
            RedisConfig::new(self.primaries[r].url()).timeout(STORE_TIMEOUT),
            remotes,
        )
        .refresh(self.settings.refresh)
        .max_lag(self.settings.max_lag)
        .fallback(self.settings.fallback)
        .policy_fallback("share", Fallback::LocalShare)
        .policy_fallback("only", Fallback::LocalOnly)
        .policy_fallback("closed", Fallback::Closed)
    }

    pub fn proxies(&self) -> impl Iterator<Item = &DelayProxy> {
        self.links.iter().flatten().flatten().map(|(_, p)| p)
    }

    pub fn replicas(&self) -> impl Iterator<Item = &RedisServer> {
        self.links.iter().flatten().flatten().map(|(r, _)| r)
    }

    /// Every replica's link to its primary is up.
    pub fn wait_links_up(&self) {
        for replica in self.replicas() {
            wait_until(Duration::from_secs(20), "replica link up", || {
                Ok(replica
                    .info_field("replication", "master_link_status")
                    .ok()
                    .flatten()
                    .as_deref()
                    == Some("up"))
            })
            .expect("replication link comes up");
        }
    }

    /// Sets the replication delay of every link.
    pub fn set_delay(&self, delay: Duration) {
        self.proxies().for_each(|p| p.set_delay(delay));
    }

    /// Cuts (or heals) region `r` off: its replicas of the others, and the others' replicas
    /// of it.
    pub fn partition(&self, r: usize, cut: bool) {
        for (a, row) in self.links.iter().enumerate() {
            for (b, link) in row.iter().enumerate() {
                if let Some((_, proxy)) = link
                    && (a == r || b == r)
                {
                    if cut { proxy.cut() } else { proxy.heal() }
                }
            }
        }
    }

    /// After a link heals: polls until every link is up and every view trusted again
    /// (within 20 s).
    pub async fn wait_healed(&self) {
        self.wait_links_up();
        self.wait_fallback(false, Duration::from_secs(20)).await;
    }

    /// Polls until every region's view of every other is trusted (or, with `false`, not).
    pub async fn wait_fallback(&self, active: bool, within: Duration) {
        self.wait_statuses(
            &format!("every view's fallback_active = {active}"),
            within,
            |all| all.iter().flatten().all(|st| st.fallback_active == active),
        )
        .await;
    }

    /// Polls until region `r` does not trust its views of the others, nor they theirs of it.
    pub async fn wait_cut_off(&self, r: usize, within: Duration) {
        let cut = name(r);
        self.wait_statuses(&format!("{cut} cut off"), within, |all| {
            all.iter().enumerate().all(|(a, row)| {
                row.iter()
                    .all(|st| st.fallback_active || (a != r && st.name != cut))
            })
        })
        .await;
    }

    /// Polls until `pred` holds of every region's statuses.
    pub async fn wait_statuses(
        &self,
        what: &str,
        within: Duration,
        pred: impl Fn(&[Vec<RegionStatus>]) -> bool,
    ) {
        let deadline = Instant::now() + within;
        loop {
            let all = self.statuses();
            if pred(&all) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "not within {within:?}: {what}: {all:?}"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    pub fn statuses(&self) -> Vec<Vec<RegionStatus>> {
        self.stores.iter().map(RegionsStore::regions).collect()
    }

    /// The largest lag any region sees now.
    pub fn max_lag_seen(&self) -> Duration {
        self.statuses()
            .iter()
            .flatten()
            .filter_map(|s| s.lag)
            .max()
            .unwrap_or_default()
    }
}

/// What a steady-rate run admitted.
#[derive(Debug, Default, Clone)]
pub struct Run {
    /// Admitted per window index (window start / per), over every region.
    pub admitted: BTreeMap<u64, u64>,
    /// Requests sent per region per second.
    pub rate_per_region: f64,
    /// The largest lag seen during the run.
    pub max_lag: Duration,
    /// The largest view age seen during the run.
    pub max_view_age: Duration,
    /// Fail-open (degraded) answers: not admissions.
    pub degraded: u64,
    pub errors: u64,
}

impl Run {
    /// Admitted in each window wholly inside the run (the first and the last are partial).
    pub fn whole_windows(&self) -> Vec<(u64, u64)> {
        let n = self.admitted.len();
        self.admitted
            .iter()
            .enumerate()
            .filter(|(i, _)| *i > 0 && *i + 1 < n)
            .map(|(_, (&w, &a))| (w, a))
            .collect()
    }

    /// The stated bound of over-admission per window: (regions − 1) × per-region rate ×
    /// (lag + refresh), with the lag seen, and `refresh` the views' age: the configured one,
    /// or the age seen if a loaded machine let views grow older.
    pub fn bound(&self, regions: usize, refresh: Duration) -> f64 {
        (regions as f64 - 1.0)
            * self.rate_per_region
            * (self.max_lag + refresh.max(self.max_view_age)).as_secs_f64()
    }
}

/// Every region checks `key` under `policy` every `interval` for `duration`; returns what was
/// admitted per window of `per_ms`.
pub async fn steady(
    world: &World,
    policy: &Policy,
    key: &str,
    interval: Duration,
    duration: Duration,
) -> Run {
    let per = policy.limits()[0].per_ms();
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for store in &world.stores {
        let (store, policy, key, stop) =
            (store.clone(), policy.clone(), key.to_owned(), stop.clone());
        tasks.push(tokio::spawn(async move {
            let mut ticks = tokio::time::interval(interval);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            let mut decisions: Vec<Result<Decision, String>> = Vec::new();
            let started = Instant::now();
            while !stop.load(Ordering::Relaxed) {
                ticks.tick().await;
                let now = now_ms();
                decisions.push(
                    store
                        .check(&policy, &key, 1, now)
                        .await
                        .map_err(|e| e.to_string()),
                );
            }
            (decisions, started.elapsed())
        }));
    }
    let monitor = {
        let stores = world.stores.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            let (mut lag, mut age) = (Duration::ZERO, Duration::ZERO);
            while !stop.load(Ordering::Relaxed) {
                for s in stores.iter().flat_map(RegionsStore::regions) {
                    lag = lag.max(s.lag.unwrap_or_default());
                    age = age.max(s.view_age.unwrap_or_default());
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            (lag, age)
        })
    };
    tokio::time::sleep(duration).await;
    stop.store(true, Ordering::Relaxed);
    let mut run = Run::default();
    let mut rates = Vec::new();
    for task in tasks {
        let (decisions, took) = task.await.expect("region's traffic");
        rates.push(decisions.len() as f64 / took.as_secs_f64());
        for d in decisions {
            match d {
                Ok(d) if d.is_degraded() => run.degraded += 1,
                Ok(d) => {
                    let a = run.admitted.entry(d.now_ms / per).or_insert(0);
                    *a += u64::from(d.allowed);
                }
                Err(_) => run.errors += 1,
            }
        }
    }
    let (lag, age) = monitor.await.expect("monitor");
    run.rate_per_region = rates.iter().copied().fold(0.0, f64::max);
    run.max_lag = lag;
    run.max_view_age = age;
    run
}

pub fn now_ms() -> u64 {
    u64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_millis(),
    )
    .unwrap_or(u64::MAX)
}

/// Waits (at most 10 s) until the next window of `per_ms` starts, then returns.
pub async fn align_to_window(per_ms: u64) {
    let now = now_ms();
    let next = (now / per_ms + 1) * per_ms;
    tokio::time::sleep(Duration::from_millis(next - now + 5)).await;
}
