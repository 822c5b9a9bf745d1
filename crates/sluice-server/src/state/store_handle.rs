//! The store behind the limiter: which one the configuration chose ([`StoreHandle`]), kept
//! concrete for readiness checks, the stores kept across reloads ([`Stores`]), and each call
//! measured and, when traces are on, inside its span ([`TracedStore`]).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures_util::future::Either;
use sluice::breaker::{BreakerState, CircuitBreaker};
use sluice::{Call, Clock, Decision, MemoryStore, Policy, Reserving, Store, StoreError, StoreExt};
use sluice_redis::{RedisStore, RegionsStore, ShardedStore};

use super::ServerClock;
use crate::observe::Observe;
use crate::observe::metrics::{Metrics, StoreSeries};
use crate::observe::traces::Traces;

/// Why the store cannot decide (`/readyz`'s `503`), naming the shards at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreDown {
    /// These shards (index, name and error) do not answer `PING`.
    #[error("shards not answering: {}", .0.join(", "))]
    NotAnswering(Vec<String>),
    /// Every shard answers, but every shard's circuit is open (each shard with the last
    /// error that keeps it open).
    #[error("every shard's circuit is open: {}", .0.join(", "))]
    CircuitsOpen(Vec<String>),
}

/// The store behind the limiter, kept concrete for readiness checks.
#[derive(Debug, Clone)]
pub enum StoreHandle {
    /// In this process.
    Memory(Arc<MemoryStore>),
    /// Redis shards (one or more; a Sentinel-monitored primary is one shard), each behind a
    /// circuit breaker.
    Redis(ShardedStore),
    /// A Redis Cluster (its client routes around failed nodes; each call is bounded by the
    /// timeout).
    Cluster(RedisStore),
    /// One limit across regions (`store.regions`): decided on this region's own Redis, the
    /// other regions' usage read from local replicas of theirs.
    Regions(RegionsStore),
}

impl StoreHandle {
    /// The regions store, when the store is one (for its metrics and `/v1/stats`).
    pub fn regions(&self) -> Option<&RegionsStore> {
        match self {
            StoreHandle::Regions(r) => Some(r),
            _ => None,
        }
    }

    /// Publishes to `metrics` what the store counts itself: each shard's circuit breaker, and
    /// the writes fewer replicas acknowledged than asked (called before rendering them).
    pub(crate) fn publish(&self, metrics: &Metrics) {
        match self {
            StoreHandle::Memory(_) => {}
            StoreHandle::Redis(sharded) => {
                metrics.circuits(sharded);
                for shard in sharded.shards() {
                    metrics.unreplicated(shard.inner());
                }
            }
            StoreHandle::Cluster(c) => metrics.unreplicated(c),
            StoreHandle::Regions(r) => metrics.unreplicated(r.local()),
        }
    }

    /// The names of the Redis stores a call can go to, numbered as
    /// [`StoreHandle::shard_of`] numbers them (none for the memory store).
    fn redis_names(&self) -> Vec<String> {
        match self {
            StoreHandle::Memory(_) => Vec::new(),
            StoreHandle::Redis(r) => r.names().to_vec(),
            StoreHandle::Cluster(c) => vec![c.name().to_owned()],
            StoreHandle::Regions(r) => vec![r.local().name().to_owned()],
        }
    }

    /// Whether the store can decide: every store shard answers `PING`, and with Redis shards
    /// at least one shard's circuit is closed. The error names the shards that do not answer,
    /// or every shard and the error that keeps its circuit open.
    pub async fn ping(&self, clock: &ServerClock) -> Result<(), StoreDown> {
        match self {
            StoreHandle::Memory(_) => Ok(()),
            StoreHandle::Redis(sharded) => {
                let mut down = Vec::new();
                for (i, shard) in sharded.shards().iter().enumerate() {
                    if let Err(e) = shard.inner().ping().await {
                        down.push(format!("shard {i} {} ({e})", shard.name()));
                    }
                }
                if down.is_empty() {
                    any_circuit_closed(sharded, clock.now_ms()).await
                } else {
                    Err(StoreDown::NotAnswering(down))
                }
            }
            StoreHandle::Cluster(cluster) => cluster
                .ping()
                .await
                .map_err(|e| StoreDown::NotAnswering(vec![format!("{} ({e})", cluster.name())])),
            // Ready when this region's own Redis answers: the other regions are read in the
            // background, and a region cut off from them decides by its fallback.
            StoreHandle::Regions(regions) => {
                let local = regions.local();
                local
                    .ping()
                    .await
                    .map_err(|e| StoreDown::NotAnswering(vec![format!("{} ({e})", local.name())]))
            }
        }
    }

    /// Where `key` under `policy` is decided, as the store chooses it: its place in
    /// [`StoreHandle::redis_names`] (a Cluster has one name, its client picking the node by
    /// slot), and whether that place is a client-side shard's; nothing for the memory store.
    fn shard_of(&self, policy: &Policy, key: &str) -> Option<(usize, bool)> {
        match self {
            StoreHandle::Memory(_) => None,
            StoreHandle::Redis(sharded) => Some((sharded.shard_for(policy, key), true)),
            StoreHandle::Cluster(_) | StoreHandle::Regions(_) => Some((0, false)),
        }
    }
}

/// The configured store, dispatched by `match`. The memory store's future is polled in place
/// (a decision allocates nothing); a Redis store's is boxed. An enum holding every store's
/// future inline is as large as the largest (the Redis stores', about 4 KB), and the limiter
/// moves its store's future as it makes and polls it: measured (`benches/handle.rs`), moving
/// that much cost the memory store more than the box it saved, while a Redis decision pays one
/// allocation against a network round trip.
impl Store for StoreHandle {
    fn call(&self, call: Call<'_>) -> impl Future<Output = Result<Decision, StoreError>> + Send {
        match self {
            StoreHandle::Memory(m) => HandleCall::Memory {
                future: m.call(call),
            },
            StoreHandle::Redis(r) => HandleCall::Redis {
                future: Box::pin(r.call(call)),
            },
            StoreHandle::Cluster(c) => HandleCall::Cluster {
                future: Box::pin(c.call(call)),
            },
            StoreHandle::Regions(r) => HandleCall::Regions {
                future: Box::pin(r.call(call)),
            },
        }
    }
}

pin_project_lite::pin_project! {
    /// The future of [`StoreHandle`]'s call: the memory store's in place, the others boxed.
    #[project = HandleCallProj]
    enum HandleCall<M, R, C, G> {
        Memory { #[pin] future: M },
        Redis { future: Pin<Box<R>> },
        Cluster { future: Pin<Box<C>> },
        Regions { future: Pin<Box<G>> },
    }
}

impl<T, M, R, C, G> Future for HandleCall<M, R, C, G>
where
    M: Future<Output = T>,
    R: Future<Output = T>,
    C: Future<Output = T>,
    G: Future<Output = T>,
{
    type Output = T;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<T> {
        match self.project() {
            HandleCallProj::Memory { future } => future.poll(cx),
            HandleCallProj::Redis { future } => future.as_mut().poll(cx),
            HandleCallProj::Cluster { future } => future.as_mut().poll(cx),
            HandleCallProj::Regions { future } => future.as_mut().poll(cx),
        }
    }
}

/// What the limiter decides with: the store, or the reservation layer over it (kept across
/// reloads with its leases). An enum rather than a [`sluice::SharedStore`], so a decision on
/// the memory store allocates nothing on its way there, with or without leases (see
/// [`StoreHandle`]'s `Store` impl for the Redis stores).
#[derive(Debug, Clone)]
pub struct DecidingStore(Deciding);

#[derive(Debug, Clone)]
enum Deciding {
    Direct(TracedStore),
    Reserving(Arc<Reserving<TracedStore>>),
}

impl DecidingStore {
    /// Decides with `store`, through `reserving` when `local.enabled`.
    pub(super) fn new(store: TracedStore, reserving: Option<Arc<Reserving<TracedStore>>>) -> Self {
        match reserving {
            Some(r) => Self(Deciding::Reserving(r)),
            None => Self(Deciding::Direct(store)),
        }
    }
}

impl Store for DecidingStore {
    fn call(&self, call: Call<'_>) -> impl Future<Output = Result<Decision, StoreError>> + Send {
        match &self.0 {
            Deciding::Direct(s) => Either::Left(s.call(call)),
            Deciding::Reserving(r) => Either::Right(r.call(call)),
        }
    }
}

/// The stores of a server, kept across reloads: the configured one, what limiters decide
/// with, the reservation layer with its leases (`local.enabled`) and the insurance store that
/// decides `on_store_error: local` policies while the store is down.
#[derive(Debug)]
pub(super) struct Stores {
    pub(super) handle: StoreHandle,
    pub(super) deciding: DecidingStore,
    pub(super) reserving: Option<Arc<Reserving<TracedStore>>>,
    pub(super) insurance: Arc<MemoryStore>,
}

impl Stores {
    /// Decides with `handle` (through the reservation layer when `local` is given), its calls
    /// observed by `observe`.
    pub(super) fn new(
        handle: StoreHandle,
        local: Option<sluice::ReserveConfig>,
        observe: &Observe,
    ) -> Self {
        let traced = TracedStore::new(handle.clone(), observe);
        let reserving = local.map(|local| Arc::new(Reserving::new(traced.clone(), local)));
        Self {
            handle,
            deciding: DecidingStore::new(traced, reserving.clone()),
            reserving,
            insurance: Arc::new(MemoryStore::new()),
        }
    }
}

/// The store as decisions call it: each call to a Redis store measured
/// (`sluice_store_latency_seconds`, `sluice_store_errors_total`), and with traces on, a span
/// around each call (`sluice.store`, a child of the decision being made), carrying the shard
/// the store chose and what it answered; on the memory store with traces off, the store's
/// call alone.
#[derive(Debug, Clone)]
pub(crate) struct TracedStore {
    handle: StoreHandle,
    traces: Traces,
    /// The series of each Redis store, numbered as [`StoreHandle::shard_of`] numbers them.
    series: Arc<[StoreSeries]>,
}

impl TracedStore {
    /// `handle`'s calls, measured in `observe`'s metrics and traced when traces are on.
    fn new(handle: StoreHandle, observe: &Observe) -> Self {
        let names = handle.redis_names();
        let series = names.iter().map(|n| observe.metrics.store(n)).collect();
        Self {
            handle,
            traces: observe.traces.clone(),
            series,
        }
    }

    /// A store call, measured and inside its span (`sluice.store`).
    async fn observed_call(&self, call: Call<'_>) -> Result<Decision, StoreError> {
        let Call {
            policy, key, op, ..
        } = call;
        let shard = self.handle.shard_of(policy, key);
        let series = shard.and_then(|(i, _)| self.series.get(i));
        let span = self.traces.store_call();
        span.set(|| {
            let name = series.map_or("memory", StoreSeries::name);
            let mut attributes = vec![
                opentelemetry::KeyValue::new("sluice.shard", name.to_owned()),
                opentelemetry::KeyValue::new("sluice.policy", policy.name().to_owned()),
                opentelemetry::KeyValue::new("sluice.op", op.name()),
            ];
            if let Some((i, true)) = shard {
                let i = i64::try_from(i).unwrap_or(i64::MAX);
                attributes.push(opentelemetry::KeyValue::new("sluice.shard.index", i));
            }
            attributes
        });
        let started = std::time::Instant::now();
        let result = self.handle.call(call).await;
        if let Some(series) = series {
            series.record(started.elapsed(), result.as_ref().err());
        }
        match &result {
            Ok(d) if d.allowed => span.finish("allowed", None),
            Ok(_) => span.finish("denied", None),
            Err(e) => {
                span.set(|| {
                    vec![opentelemetry::KeyValue::new(
                        "error.type",
                        e.kind().as_str(),
                    )]
                });
                span.finish("error", Some(e.to_string()));
            }
        }
        result
    }
}

impl Store for TracedStore {
    fn call(&self, call: Call<'_>) -> impl Future<Output = Result<Decision, StoreError>> + Send {
        if self.traces.is_on() || !self.series.is_empty() {
            Either::Right(Box::pin(self.observed_call(call)))
        } else {
            Either::Left(self.handle.call(call))
        }
    }
}

/// The policy of readiness probes: a decision of cost 0 on its own key records nothing.
static PROBE: std::sync::LazyLock<Option<Policy>> = std::sync::LazyLock::new(|| {
    Policy::from_specs(
        "sluice:ready",
        vec![sluice::LimitSpec::fixed_window(1, 1_000)],
    )
    .ok()
});

/// `Ok` while at least one shard's circuit is closed. When none is, each shard is probed
/// first, through its breaker, as a request would be (a check of cost 0 on a key of its own,
/// which fails as decisions fail: a `PING` passes where a decision meets `OOM` or `NOPERM`):
/// a server that is not ready gets no traffic to probe with, and must still find out that
/// the store is back.
async fn any_circuit_closed(sharded: &ShardedStore, now_ms: u64) -> Result<(), StoreDown> {
    let closed = |s: &CircuitBreaker<RedisStore>| s.state() == BreakerState::Closed;
    if sharded.shards().iter().any(closed) {
        return Ok(());
    }
    if let Some(probe) = PROBE.as_ref() {
        for shard in sharded.shards().iter() {
            // The outcome shows in the circuit's state.
            let _ = shard.check(probe, "probe", 0, now_ms).await;
        }
    }
    if sharded.shards().iter().any(closed) {
        return Ok(());
    }
    let open: Vec<String> = sharded
        .shards()
        .iter()
        .enumerate()
        .map(|(i, shard)| {
            let last = shard.last_error().unwrap_or_default();
            format!("shard {i} {} (last: {last})", shard.name())
        })
        .collect();
    Err(StoreDown::CircuitsOpen(open))
}
