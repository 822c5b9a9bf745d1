//! Sluice's Redis stores.
//!
//! [`RedisStore`] keeps the state of every (policy, key) in Redis, for a fleet of limiters that
//! must agree. Each decision is one call of a Lua function (`scripts/sluice.lua`) that mirrors
//! `sluice_core`'s algorithms field for field; a differential test runs the same operation
//! sequences through both and requires identical decisions. Key naming, and why it works on
//! Redis Cluster, is in [`keys`]. [`ShardedStore`] spreads keys over several stores.
//!
//! Inside, each module importing only those listed after it: `regions` (one limit shared
//! by several regions, each with its own Redis and replicas of the others': [`RegionsStore`]),
//! `sharded` (client-side
//! sharding over stores), `store` (the [`sluice::Store`]), `coalesce` (concurrent checks bound
//! for one Redis sent as one call), `topology` (standalone with replicas, Sentinel and its
//! `+switch-master` announcements, Cluster), `codec` (a call's arguments and reply, the wire
//! format documented in `scripts/sluice.lua`), `config` (what [`RedisConfig`] holds), `script`
//! (the Lua code and how it is loaded), `error` (Redis errors to [`sluice::StoreError`]),
//! `keys` and `tasks` (background tasks aborted with their store).
//!
//! Redis replicates asynchronously, so a failover can lose acknowledged writes and admit
//! their units again; [`WaitForReplicas`] (opt-in) sends `WAIT` behind every write to narrow
//! that, at a measured cost (docs/scaling.md, "Failover: what can be over-admitted").
//!
//! [`ReadFrom`], [`ClockSource`] and [`Shortfall`] deserialize (serde) from
//! `snake_case` names (`replicas`, `primary`; `app`, `redis`; `keep`, `fail`), for
//! configuration files.
//!
//! ```no_run
//! use sluice::{Limiter, LimitSpec, Policy};
//! use sluice_redis::{RedisConfig, RedisStore};
//!
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! let store = RedisStore::connect(
//!     RedisConfig::new("redis://127.0.0.1:6379").replicas(["redis://127.0.0.1:6380"]),
//! )
//! .await?;
//! let api = Policy::from_specs("api", vec![LimitSpec::fixed_window(5_000, 3_600_000)])?;
//! let limiter = Limiter::new(store).with_policy(api);
//! let decision = limiter.check("api", "user:42", 1).await?;
//! # Ok(()) }
//! ```

mod coalesce;
mod codec;
mod config;
mod error;
pub mod keys;
pub mod regions;
mod script;
mod sharded;
mod store;
mod tasks;
mod topology;

pub use config::{
    ClockSource, Credentials, DEFAULT_COALESCE, DEFAULT_TIMEOUT, ReadFrom, RedisConfig, Shard,
    Shortfall, TlsFiles, Topology, WaitError, WaitForReplicas, redact,
};
pub use keys::DEFAULT_PREFIX;
pub use regions::{
    Fallback, InvalidRegions, RegionStatus, RegionsConfig, RegionsError, RegionsStore, RemoteRegion,
};
pub use script::ScriptMode;
pub use sharded::{DuplicateShard, ShardedStore, rendezvous, validate_shard_names};
pub use store::RedisStore;

/// Entry points for the fuzz targets of `sluice-fuzz` (feature `fuzzing`); not part of the
/// API and not covered by semver.
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing {
    use sluice::{Decision, Op, Policy, StoreError};

    /// The decoder of the script's reply: what the store does with every reply it receives.
    pub fn decode_reply(
        reply: &redis::Value,
        policy: &Policy,
        op: Op,
    ) -> Result<Decision, StoreError> {
        crate::codec::decode(reply, policy, op)
    }

    /// The decoder of the lean path's reply (each limit's state as the script read it, turned
    /// into a decision by `sluice_core::evaluate`), for a check or a peek.
    pub fn decode_rate_reply(
        reply: &redis::Value,
        policy: &Policy,
        op: Op,
    ) -> Result<Decision, StoreError> {
        crate::codec::decode_rate(reply, policy, op)
    }
}
