//! The background tasks of a regions store: this region's heartbeat, the other regions'
//! heartbeats (their replication lag), the views' refresh, and the switch to and from the
//! fallback.
//!
//! Every `refresh / 4` one task writes this region's heartbeat if the last is `refresh / 2`
//! old (`SET <prefix>{sluice-regions}:heartbeat:<region> <now ms>` on the local primary,
//! kept for a minute past `max_lag`, followed by one line per region whose view this region
//! does not trust) and decides the fallbacks again; and a task per other region reads that
//! region's heartbeat from its replica (lag = read time − heartbeat: replication lag plus up
//! to `refresh / 2` of heartbeat age) and every key whose view is `refresh / 2` old, at once
//! when a key is first seen. A view is thus at most about `3/4 refresh` plus a read old.
//!
//! A region is under the fallback while its replica does not answer, its lag exceeds
//! `max_lag`, or its heartbeat was last read more than `max_lag` ago (a read that hangs); a
//! region never read is under it too. So is a region whose heartbeat says it does not trust
//! its view of *this* one: a cut is seen from both sides, even when only one direction of
//! replication broke, so that no region keeps admitting up to `max` on a view of a region
//! that admits its share blind (docs/regions.md, "A cut mid-window").

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use sluice::{Store, StoreError};

use super::views::Due;
use super::{Inner, RegionStatus, RegionsConfig, decide};

/// How many reads of one region's replica are in flight at once.
const READS_IN_FLIGHT: usize = 32;

/// What this region knows of the others' health.
pub(super) struct Health {
    max_lag_ms: u64,
    regions: Vec<RegionHealth>,
    /// Whether any region is under the fallback now.
    any: AtomicBool,
}

#[derive(Default)]
struct RegionHealth {
    /// Whether this region's view of it is not trusted (unreachable, lagging, never read).
    stale: AtomicBool,
    /// Whether its last heartbeat said it does not trust its view of this region.
    blind: AtomicBool,
    reachable: AtomicBool,
    /// The last heartbeat read (ms; 0: none yet).
    heartbeat_ms: AtomicU64,
    /// When it was read (ms; 0: never).
    read_ms: AtomicU64,
    /// The read time of the oldest view in use (ms; 0: none).
    oldest_view_ms: AtomicU64,
    fallback: AtomicBool,
}

impl Health {
    pub(super) fn new(config: &RegionsConfig, remotes: usize) -> Self {
        let regions = (0..remotes)
            .map(|_| RegionHealth {
                // Until its heartbeat is read, a region is under the fallback.
                stale: AtomicBool::new(true),
                fallback: AtomicBool::new(true),
                ..RegionHealth::default()
            })
            .collect();
        Self {
            max_lag_ms: millis(config.max_lag),
            regions,
            any: AtomicBool::new(true),
        }
    }

    /// Whether decisions are under their fallback now (some region is).
    pub(super) fn any_fallback(&self) -> bool {
        self.any.load(Ordering::Relaxed)
    }

    pub(super) fn status(&self, i: usize, name: &str, now_ms: u64) -> RegionStatus {
        let r = &self.regions[i];
        let heartbeat = r.heartbeat_ms.load(Ordering::Relaxed);
        let read = r.read_ms.load(Ordering::Relaxed);
        let oldest = r.oldest_view_ms.load(Ordering::Relaxed);
        RegionStatus {
            name: name.to_owned(),
            reachable: r.reachable.load(Ordering::Relaxed),
            lag: (heartbeat > 0).then(|| Duration::from_millis(read.saturating_sub(heartbeat))),
            view_age: (oldest > 0).then(|| Duration::from_millis(now_ms.saturating_sub(oldest))),
            fallback_active: r.fallback.load(Ordering::Relaxed),
        }
    }

    /// Decides whether each region is under the fallback at `now_ms`, logging each switch.
    fn evaluate(&self, names: impl Iterator<Item = String>, now_ms: u64) {
        let mut any = false;
        for (r, name) in self.regions.iter().zip(names) {
            let heartbeat = r.heartbeat_ms.load(Ordering::Relaxed);
            let read = r.read_ms.load(Ordering::Relaxed);
            let reachable = r.reachable.load(Ordering::Relaxed);
            let lag = read.saturating_sub(heartbeat);
            let stale = now_ms.saturating_sub(read);
            let untrusted =
                !reachable || heartbeat == 0 || lag > self.max_lag_ms || stale > self.max_lag_ms;
            r.stale.store(untrusted, Ordering::Relaxed);
            let blind = r.blind.load(Ordering::Relaxed);
            let active = untrusted || blind;
            if r.fallback.swap(active, Ordering::Relaxed) != active {
                if untrusted {
                    tracing::warn!(region = %name, reachable, lag_ms = lag, "region's view is not trusted: decisions fall back");
                } else if active {
                    tracing::warn!(region = %name, "region does not trust its view of this one: decisions fall back");
                } else {
                    tracing::info!(region = %name, lag_ms = lag, "region's view is trusted again: decisions count every region");
                }
            }
            any |= active;
        }
        self.any.store(any, Ordering::Relaxed);
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The key of `region`'s heartbeat.
pub(super) fn heartbeat_key(prefix: &str, region: &str) -> String {
    format!("{prefix}{{sluice-regions}}:heartbeat:{region}")
}

/// Writes this region's heartbeat into its primary: its clock, then a line per region whose
/// view it does not trust.
pub(super) async fn beat(inner: &Inner) -> Result<(), StoreError> {
    let config = &inner.config;
    let mut value = inner.clock.now_ms().to_string();
    for (health, remote) in inner.health.regions.iter().zip(&inner.remotes) {
        if health.stale.load(Ordering::Relaxed) {
            value.push('\n');
            value.push_str(&remote.name);
        }
    }
    let mut set = redis::cmd("SET");
    set.arg(heartbeat_key(&config.primary.key_prefix, &config.local))
        .arg(value)
        .arg("PX")
        .arg(millis(config.max_lag).saturating_add(60_000));
    inner.local.query_primary(&set).await.map(drop)
}

/// Reads every other region's heartbeat from its replica (all at once) and decides the
/// fallbacks.
pub(super) async fn check(inner: &Inner) {
    join_all((0..inner.remotes.len()).map(|r| check_one(inner, r))).await;
    inner.health.evaluate(names(inner), inner.clock.now_ms());
}

fn names(inner: &Inner) -> impl Iterator<Item = String> + '_ {
    inner.remotes.iter().map(|r| r.name.clone())
}

/// Reads region `r`'s heartbeat from its replica.
async fn check_one(inner: &Inner, r: usize) {
    let (health, remote) = (&inner.health.regions[r], &inner.remotes[r]);
    let key = heartbeat_key(&inner.config.primary.key_prefix, &remote.name);
    let read = async {
        let store = remote.store().await?;
        store.query_primary(redis::cmd("GET").arg(&key)).await
    };
    let now = inner.clock.now_ms();
    match read.await {
        Ok(value) => {
            health.reachable.store(true, Ordering::Relaxed);
            let text = redis::from_redis_value::<Option<String>>(value)
                .ok()
                .flatten();
            if let Some((beat, blind)) = text.as_deref().and_then(parse_beat) {
                health.heartbeat_ms.fetch_max(beat, Ordering::Relaxed);
                health.read_ms.store(now, Ordering::Relaxed);
                let blind = blind.into_iter().any(|name| name == inner.config.local);
                health.blind.store(blind, Ordering::Relaxed);
            }
        }
        Err(e) => {
            tracing::debug!(region = %remote.name, error = %e, "heartbeat not read");
            health.reachable.store(false, Ordering::Relaxed);
        }
    }
}

/// A heartbeat's clock and the regions it does not trust, or `None` if it is not one.
fn parse_beat(text: &str) -> Option<(u64, Vec<&str>)> {
    let mut lines = text.split('\n');
    let beat = lines.next()?.parse().ok()?;
    Some((beat, lines.collect()))
}

/// Reads region `r`'s usage of every key due.
async fn refresh(inner: &Inner, r: usize) {
    let refresh_ms = millis(inner.config.refresh);
    let now = inner.clock.now_ms();
    let due = inner.views.due(r, now, refresh_ms / 2, refresh_ms);
    let health = &inner.health.regions[r];
    if !due.is_empty() {
        let store = match inner.remotes[r].store().await {
            Ok(store) => store,
            Err(e) => {
                tracing::debug!(region = %inner.remotes[r].name, error = %e, "replica not connected");
                health.reachable.store(false, Ordering::Relaxed);
                return;
            }
        };
        let mut reads = tokio::task::JoinSet::new();
        let permits = Arc::new(tokio::sync::Semaphore::new(READS_IN_FLIGHT));
        for due in due {
            let (store, permits) = (store.clone(), permits.clone());
            reads.spawn(async move {
                let _permit = permits.acquire_owned().await;
                let answer = read(&store, &due, now).await;
                (due, answer)
            });
        }
        while let Some(joined) = reads.join_next().await {
            match joined {
                Ok((due, Ok(answer))) => inner.views.record(r, &due, now, &answer),
                Ok((_, Err(e))) if e.is_transient() => {
                    tracing::debug!(region = %inner.remotes[r].name, error = %e, "view not read");
                    health.reachable.store(false, Ordering::Relaxed);
                }
                Ok((due, Err(e))) => {
                    tracing::warn!(region = %inner.remotes[r].name, key = %due.key, error = %e, "view cannot be read")
                }
                Err(e) => tracing::warn!(error = %e, "a read of a view failed"),
            }
        }
    }
    health
        .oldest_view_ms
        .store(inner.views.oldest(r).unwrap_or(0), Ordering::Relaxed);
}

/// Region's usage of `due`'s key at `now_ms`: a peek of cost 0 on its replica, under the
/// policy as the regions store counts it (fixed windows aligned).
async fn read(
    store: &crate::RedisStore,
    due: &Due,
    now_ms: u64,
) -> Result<sluice::Decision, StoreError> {
    let policy = decide::effective_policy(&due.policy, &[0; sluice::core::MAX_LIMITS_PER_POLICY])
        .map_err(StoreError::Backend)?;
    store
        .call(sluice::Call::new(
            &policy,
            &due.key,
            sluice::Op::Peek { cost: 0 },
            now_ms,
        ))
        .await
}

/// The tasks of a store: [`run`], and a [`watch`] per other region (so that a replica that
/// hangs delays only its own region's reads).
pub(super) fn spawn(inner: &Arc<Inner>) -> Vec<tokio::task::AbortHandle> {
    let mut tasks = vec![tokio::spawn(run(Arc::downgrade(inner))).abort_handle()];
    for r in 0..inner.remotes.len() {
        tasks.push(tokio::spawn(watch(Arc::downgrade(inner), r)).abort_handle());
    }
    tasks
}

/// Every `refresh / 4`: this region's heartbeat when the last is `refresh / 2` old, and the
/// fallbacks decided again (a region whose reads hang falls back once its last heartbeat
/// read is `max_lag` old). Ends when the store is dropped.
async fn run(inner: Weak<Inner>) {
    let Some(tick) = inner.upgrade().map(|i| i.config.refresh / 4) else {
        return;
    };
    let mut ticks = tokio::time::interval(tick.max(Duration::from_millis(1)));
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut beaten = 0u64;
    loop {
        ticks.tick().await;
        let Some(inner) = inner.upgrade() else { return };
        let now = inner.clock.now_ms();
        if now.saturating_sub(beaten) >= millis(inner.config.refresh) / 2 {
            match beat(&inner).await {
                Ok(()) => beaten = now,
                Err(e) => {
                    tracing::warn!(region = %inner.config.local, error = %e, "heartbeat not written");
                }
            }
        }
        inner.health.evaluate(names(&inner), inner.clock.now_ms());
    }
}

/// Every `refresh / 4`, or when a key is first seen: region `r`'s heartbeat and the views
/// due. Ends when the store is dropped.
async fn watch(inner: Weak<Inner>, r: usize) {
    let Some((tick, wake)) = inner
        .upgrade()
        .map(|i| (i.config.refresh / 4, i.views.wake.clone()))
    else {
        return;
    };
    let mut ticks = tokio::time::interval(tick.max(Duration::from_millis(1)));
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticks.tick() => {}
            () = wake.notified() => {}
        }
        let Some(inner) = inner.upgrade() else { return };
        tokio::join!(check_one(&inner, r), refresh(&inner, r));
        inner.health.evaluate(names(&inner), inner.clock.now_ms());
    }
}

/// Runs `futures` together.
async fn join_all<F: std::future::Future<Output = ()>>(futures: impl Iterator<Item = F>) {
    let mut futures: Vec<_> = futures.map(Box::pin).collect();
    std::future::poll_fn(|cx| {
        futures.retain_mut(|f| f.as_mut().poll(cx).is_pending());
        if futures.is_empty() {
            std::task::Poll::Ready(())
        } else {
            std::task::Poll::Pending
        }
    })
    .await;
}

#[cfg(test)]
mod tests {
    use super::parse_beat;

    #[test]
    fn a_heartbeat_is_a_clock_then_the_regions_not_trusted() {
        assert_eq!(
            parse_beat("1700000000000"),
            Some((1_700_000_000_000, vec![]))
        );
        assert_eq!(
            parse_beat("1700000000000\nus\nap"),
            Some((1_700_000_000_000, vec!["us", "ap"]))
        );
        assert_eq!(parse_beat("soon"), None);
    }
}
