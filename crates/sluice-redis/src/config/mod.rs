//! How to reach and use Redis: [`RedisConfig`] (the [`Topology`], where peeks read, the
//! clock, timeouts, keys) and its defaults. How it logs in and encrypts (credentials,
//! certificates, URLs redacted) is in `access`, and waiting for replicas after each write
//! in `wait`; neither imports anything from here.

mod access;
mod wait;

use std::time::Duration;

pub use access::{Credentials, TlsFiles, redact};
pub use wait::{Shortfall, WaitError, WaitForReplicas};

use crate::keys::DEFAULT_PREFIX;
use crate::script::ScriptMode;

/// How long one call may take by default before it fails with
/// [`StoreError::Timeout`](sluice::StoreError::Timeout): a decision is one round trip, so a
/// healthy Redis answers well within it, and a stalled one costs a request no more than this
/// before the policy's failure mode applies.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(50);

/// The most decisions one batch carries, by default ([`RedisConfig::coalesce`]).
pub const DEFAULT_COALESCE: usize = 64;

/// Keys expire this long after their state stops mattering, by default.
const DEFAULT_EXPIRY_MARGIN: Duration = Duration::from_secs(1);

/// Where peeks read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ReadFrom {
    /// Peeks go to a replica (round robin), or to the primary when none is configured or the
    /// replica cannot answer.
    #[default]
    Replicas,
    /// Everything goes to the primary.
    Primary,
}

/// Where "now" comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ClockSource {
    /// The limiter's clock, passed to the script (testable with a manual clock).
    #[default]
    App,
    /// Redis `TIME`, read inside the script: for fleets whose clocks disagree.
    Redis,
}

/// One client-side shard of [`Topology::Shards`]: a primary (decisions) and its replicas
/// (peeks). Its `Debug` shows URLs without their credentials ([`redact`]).
#[derive(Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct Shard {
    /// The primary's URL; it names the shard (rendezvous hashing scores it).
    pub primary: String,
    /// Replica URLs, for peeks.
    #[serde(default)]
    pub replicas: Vec<String>,
}

impl Shard {
    /// A shard of `primary` without replicas.
    pub fn new(primary: impl Into<String>) -> Self {
        Self {
            primary: primary.into(),
            replicas: Vec::new(),
        }
    }

    /// Sets the shard's replicas.
    pub fn replicas(mut self, urls: impl IntoIterator<Item = impl Into<String>>) -> Self {
        self.replicas = urls.into_iter().map(Into::into).collect();
        self
    }
}

impl std::fmt::Debug for Shard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let replicas: Vec<String> = self.replicas.iter().map(|u| redact(u)).collect();
        f.debug_struct("Shard")
            .field("primary", &redact(&self.primary))
            .field("replicas", &replicas)
            .finish()
    }
}

/// Which Redis deployment a store talks to. Its `Debug` shows URLs without their
/// credentials ([`redact`]).
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Topology {
    /// One primary (decisions) and its replicas (peeks), at fixed addresses.
    Standalone {
        /// The primary's URL, e.g. `redis://127.0.0.1:6379`.
        primary: String,
        /// Replica URLs, for peeks.
        replicas: Vec<String>,
    },
    /// A primary and its replicas found through Redis Sentinel; a failover is followed
    /// without a restart (the store asks the sentinels again when the primary fails).
    ///
    /// With `rediss://` sentinel URLs, the sentinels and the data nodes they name are reached
    /// over TLS (with [`RedisConfig::tls`]); `redis://`, neither. The sentinels log in as
    /// their URL's user or [`RedisConfig::sentinel_credentials`], the data nodes as
    /// [`RedisConfig::credentials`].
    Sentinel {
        /// The monitored master's name (`sentinel monitor <name> …`).
        master: String,
        /// Sentinel URLs, e.g. `redis://127.0.0.1:26379` or
        /// `rediss://user:password@sentinel-1:26379`; all `redis://` or all `rediss://`.
        sentinels: Vec<String>,
    },
    /// A Redis Cluster, reached through any of its nodes; the client follows MOVED/ASK and
    /// topology changes. Peeks read replicas when [`ReadFrom::Replicas`].
    Cluster {
        /// Seed node URLs.
        nodes: Vec<String>,
    },
    /// Client-side shards, each a primary with replicas, in configuration order: a
    /// [`ShardedStore`](crate::ShardedStore) of one [`RedisStore`](crate::RedisStore) per
    /// shard, each built from [`RedisConfig::per_shard`]. A [`RedisStore`](crate::RedisStore)
    /// connects to one shard only (as [`Topology::Standalone`]).
    Shards {
        /// The shards (at least one, [distinct primaries](crate::validate_shard_names)).
        shards: Vec<Shard>,
    },
}

impl std::fmt::Debug for Topology {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let redacted = |urls: &[String]| urls.iter().map(|u| redact(u)).collect::<Vec<_>>();
        match self {
            Topology::Standalone { primary, replicas } => f
                .debug_struct("Standalone")
                .field("primary", &redact(primary))
                .field("replicas", &redacted(replicas))
                .finish(),
            Topology::Sentinel { master, sentinels } => f
                .debug_struct("Sentinel")
                .field("master", master)
                .field("sentinels", &redacted(sentinels))
                .finish(),
            Topology::Cluster { nodes } => f
                .debug_struct("Cluster")
                .field("nodes", &redacted(nodes))
                .finish(),
            Topology::Shards { shards } => {
                f.debug_struct("Shards").field("shards", shards).finish()
            }
        }
    }
}

impl Topology {
    /// The name of a store on this topology ([`RedisStore::name`](crate::RedisStore::name)),
    /// known before connecting: the primary's URL, `sentinel:<master>` or
    /// `cluster:<first node>` (for [`Topology::Shards`], its first shard's primary: the store a
    /// [`RedisStore`](crate::RedisStore) would connect). It names a shard of a [`ShardedStore`](crate::ShardedStore), so
    /// a configuration can check shards with
    /// [`validate_shard_names`](crate::validate_shard_names) before connecting.
    ///
    /// Credentials in a URL (`redis://user:password@host`) are never part of it: names appear
    /// in metrics, logs and errors ([`redact`]).
    pub fn name(&self) -> String {
        match self {
            Topology::Standalone { primary, .. } => redact(primary),
            Topology::Sentinel { master, .. } => format!("sentinel:{master}"),
            Topology::Cluster { nodes } => {
                format!(
                    "cluster:{}",
                    redact(nodes.first().map_or("", String::as_str))
                )
            }
            Topology::Shards { shards } => {
                redact(shards.first().map_or("", |s| s.primary.as_str()))
            }
        }
    }
}

/// How to reach and use Redis: where (the [`Topology`]) and how (timeouts, clock, keys).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RedisConfig {
    /// Where the data lives.
    pub topology: Topology,
    /// Where peeks read.
    pub read_from: ReadFrom,
    /// How long one call may take before it fails with
    /// [`StoreError::Timeout`](sluice::StoreError::Timeout). Default [`DEFAULT_TIMEOUT`].
    pub timeout: Duration,
    /// Where "now" comes from.
    pub clock: ClockSource,
    /// Prepended to every key (no braces).
    pub key_prefix: String,
    /// Keys expire this long after their state stops mattering. Expiry only cleans up (the
    /// script compares stored times with now), so the margin only needs to cover clock
    /// differences between the limiter and Redis; a fixed window opens as a counter (its end
    /// its absolute expiry less the margin) only when the limiter's clock is within half of it
    /// of Redis's. It is part of a fixed window's key: changing it starts fresh fixed windows
    /// (docs/redis.md, "Keys"). Default 1 s.
    pub expiry_margin: Duration,
    /// Function library or EVALSHA.
    pub script_mode: ScriptMode,
    /// Certificates for `rediss://` URLs; without them a `rediss://` server's certificate is
    /// checked against the system's roots.
    pub tls: Option<TlsFiles>,
    /// The user every data node is logged in as, unless its URL names one (with Sentinel:
    /// the primary and replicas the sentinels name; not the sentinels themselves).
    pub credentials: Option<Credentials>,
    /// The user every sentinel is logged in as, unless its URL names one
    /// ([`Topology::Sentinel`] only). Separate from [`credentials`](Self::credentials):
    /// sentinels usually have a password of their own (`requirepass` or an ACL user on the
    /// sentinel), or none while the data nodes have one.
    pub sentinel_credentials: Option<Credentials>,
    /// Wait for replicas after each write (`WAIT`); `None` (the default): do not.
    pub wait_for_replicas: Option<WaitForReplicas>,
    /// The most concurrent checks and peeks sent to one Redis (one Cluster slot) as one call
    /// (docs/redis.md, "Coalescing"): those that arrive while the previous call is in flight
    /// go out together. 1 sends every decision alone. Default
    /// [`DEFAULT_COALESCE`].
    pub coalesce: usize,
}

impl RedisConfig {
    /// A configuration for one primary with the defaults: [`DEFAULT_TIMEOUT`], the app's
    /// clock, prefix [`DEFAULT_PREFIX`], functions.
    pub fn new(primary: impl Into<String>) -> Self {
        Self::with_topology(Topology::Standalone {
            primary: primary.into(),
            replicas: Vec::new(),
        })
    }

    /// A primary (and replicas) found through Sentinel, with the defaults.
    pub fn sentinel(
        master: impl Into<String>,
        sentinels: impl IntoIterator<Item = impl Into<String>>,
    ) -> Self {
        Self::with_topology(Topology::Sentinel {
            master: master.into(),
            sentinels: sentinels.into_iter().map(Into::into).collect(),
        })
    }

    /// A Redis Cluster reached through `nodes`, with the defaults.
    pub fn cluster(nodes: impl IntoIterator<Item = impl Into<String>>) -> Self {
        Self::with_topology(Topology::Cluster {
            nodes: nodes.into_iter().map(Into::into).collect(),
        })
    }

    /// Client-side shards, each a primary with replicas, with the defaults.
    pub fn shards(shards: impl IntoIterator<Item = Shard>) -> Self {
        Self::with_topology(Topology::Shards {
            shards: shards.into_iter().collect(),
        })
    }

    /// One configuration per store to connect: for [`Topology::Shards`], each shard as
    /// [`Topology::Standalone`] with every other setting of this one; for any other topology,
    /// this one.
    pub fn per_shard(&self) -> Vec<RedisConfig> {
        match &self.topology {
            Topology::Shards { shards } => shards
                .iter()
                .map(|shard| RedisConfig {
                    topology: Topology::Standalone {
                        primary: shard.primary.clone(),
                        replicas: shard.replicas.clone(),
                    },
                    ..self.clone()
                })
                .collect(),
            _ => vec![self.clone()],
        }
    }

    /// A configuration for `topology` with the defaults.
    pub fn with_topology(topology: Topology) -> Self {
        Self {
            topology,
            read_from: ReadFrom::default(),
            timeout: DEFAULT_TIMEOUT,
            clock: ClockSource::default(),
            key_prefix: DEFAULT_PREFIX.to_owned(),
            expiry_margin: DEFAULT_EXPIRY_MARGIN,
            script_mode: ScriptMode::default(),
            tls: None,
            credentials: None,
            sentinel_credentials: None,
            wait_for_replicas: None,
            coalesce: DEFAULT_COALESCE,
        }
    }

    /// Sets the replicas of a [`Topology::Standalone`] primary, for peeks (other topologies
    /// find their replicas themselves; there this does nothing).
    pub fn replicas(mut self, urls: impl IntoIterator<Item = impl Into<String>>) -> Self {
        if let Topology::Standalone { replicas, .. } = &mut self.topology {
            *replicas = urls.into_iter().map(Into::into).collect();
        }
        self
    }

    /// Sets the key prefix.
    pub fn key_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.key_prefix = prefix.into();
        self
    }
}

/// The setters of [`RedisConfig`] that set one field to their argument (`as Some`: an
/// optional field, to `Some` of it), each with its doc.
macro_rules! setters {
    ($($(#[doc = $doc:literal])+ $name:ident: $ty:ty $(as $some:ident)?;)+) => {
        impl RedisConfig {
            $(
                $(#[doc = $doc])+
                pub fn $name(mut self, $name: $ty) -> Self {
                    self.$name = $($some)?($name);
                    self
                }
            )+
        }
    };
}

setters! {
    /// Sets where peeks read.
    read_from: ReadFrom;
    /// Sets the per-call timeout.
    timeout: Duration;
    /// Sets the clock source.
    clock: ClockSource;
    /// Sets the expiry margin.
    expiry_margin: Duration;
    /// Sets the certificates for `rediss://` URLs (a CA, and a client certificate if the
    /// servers require one).
    tls: TlsFiles as Some;
    /// Logs in as `credentials` on every node whose URL names no user.
    credentials: Credentials as Some;
    /// Logs in as `credentials` on every sentinel whose URL names no user.
    sentinel_credentials: Credentials as Some;
    /// Waits for replicas after each write ([`WaitForReplicas`]).
    wait_for_replicas: WaitForReplicas as Some;
    /// Sets the most decisions one coalesced call carries (1: every decision alone).
    coalesce: usize;
    /// Sets how the code is loaded and called.
    script_mode: ScriptMode;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_topology_names_its_store_before_connecting() {
        let standalone = RedisConfig::new("redis://10.0.0.1:6379").replicas(["redis://r:6379"]);
        assert_eq!(standalone.topology.name(), "redis://10.0.0.1:6379");
        let sentinel = RedisConfig::sentinel("main", ["redis://s1:26379", "redis://s2:26379"]);
        assert_eq!(sentinel.topology.name(), "sentinel:main");
        let cluster = RedisConfig::cluster(["redis://c1:7000", "redis://c2:7000"]);
        assert_eq!(cluster.topology.name(), "cluster:redis://c1:7000");
    }

    #[test]
    fn shards_connect_one_standalone_store_each_with_the_same_settings() {
        let config = RedisConfig::shards([
            Shard::new("redis://a:6379").replicas(["redis://a2:6379"]),
            Shard::new("redis://alice:s3cret@b:6379"),
        ])
        .key_prefix("app:")
        .coalesce(8);
        assert_eq!(config.topology.name(), "redis://a:6379");
        let stores = config.per_shard();
        assert_eq!(stores.len(), 2);
        assert_eq!(stores[0].topology.name(), "redis://a:6379");
        assert_eq!(stores[1].topology.name(), "redis://b:6379");
        assert!(matches!(
            &stores[0].topology,
            Topology::Standalone { replicas, .. } if replicas == &["redis://a2:6379"]
        ));
        assert!(
            stores
                .iter()
                .all(|s| s.key_prefix == "app:" && s.coalesce == 8)
        );
        assert!(!format!("{config:?}").contains("s3cret"));
        let cluster = RedisConfig::cluster(["redis://c1:7000"]);
        assert_eq!(cluster.per_shard(), vec![cluster.clone()]);
    }

    #[test]
    fn names_never_carry_credentials() {
        assert_eq!(
            redact("redis://alice:s3cret@10.0.0.1:6379/2"),
            "redis://10.0.0.1:6379/2"
        );
        assert_eq!(redact("rediss://:s3cret@host:6380"), "rediss://host:6380");
        assert_eq!(redact("redis://host:6379"), "redis://host:6379");
        // An `@` after the authority is not user information.
        assert_eq!(
            redact("redis://host:6379/0?x=a@b"),
            "redis://host:6379/0?x=a@b"
        );
        assert_eq!(redact("not a url"), "not a url");
        let standalone = RedisConfig::new("redis://alice:s3cret@10.0.0.1:6379");
        assert_eq!(standalone.topology.name(), "redis://10.0.0.1:6379");
        let cluster = RedisConfig::cluster(["redis://bob:pw@c1:7000"]);
        assert_eq!(cluster.topology.name(), "cluster:redis://c1:7000");
    }

    #[test]
    fn a_configuration_s_debug_shows_no_password() {
        let shown = |config: RedisConfig| {
            let debug = format!("{config:?}");
            assert!(!debug.contains("s3cret"), "{debug}");
            debug
        };
        let debug = shown(
            RedisConfig::new("redis://alice:s3cret@p:6379").replicas(["rediss://:s3cret@r:6380"]),
        );
        assert!(debug.contains("redis://p:6379") && debug.contains("rediss://r:6380"));
        let debug = shown(
            RedisConfig::sentinel("main", ["rediss://watcher:s3cret@s1:26379"])
                .credentials(Credentials::new(Some("alice".to_owned()), "s3cret"))
                .sentinel_credentials(Credentials::new(None, "s3cret")),
        );
        assert!(debug.contains("rediss://s1:26379"), "{debug}");
        shown(RedisConfig::cluster(["rediss://bob:s3cret@c1:7000"]));
    }

    #[test]
    fn waiting_for_replicas_needs_a_replica_and_a_timeout_inside_the_call_timeout() {
        let call = Duration::from_millis(50);
        let ok = WaitForReplicas::new(1, Duration::from_millis(20));
        assert_eq!(ok.validate(call), Ok(()));
        assert_eq!(ok.on_shortfall, Shortfall::Keep);
        let none = WaitForReplicas::new(0, Duration::from_millis(20));
        assert!(
            none.validate(call)
                .unwrap_err()
                .to_string()
                .contains("wait_for_replicas.replicas")
        );
        let forever = WaitForReplicas::new(1, Duration::ZERO);
        assert!(
            forever
                .validate(call)
                .unwrap_err()
                .to_string()
                .contains("at least 1ms")
        );
        let long = WaitForReplicas::new(1, Duration::from_millis(50));
        let e = long.validate(call).unwrap_err().to_string();
        assert!(
            e.contains("(50ms) must be shorter than the call timeout (50ms)"),
            "{e}"
        );
    }

    #[test]
    fn read_from_and_clock_deserialize_from_snake_case_names() {
        use serde::Deserialize;
        use serde::de::value::{Error, StrDeserializer};

        fn parse<T: for<'de> Deserialize<'de>>(name: &str) -> Result<T, Error> {
            T::deserialize(StrDeserializer::<Error>::new(name))
        }
        assert_eq!(parse::<ReadFrom>("replicas"), Ok(ReadFrom::Replicas));
        assert_eq!(parse::<ReadFrom>("primary"), Ok(ReadFrom::Primary));
        assert_eq!(parse::<ClockSource>("app"), Ok(ClockSource::App));
        assert_eq!(parse::<ClockSource>("redis"), Ok(ClockSource::Redis));
        assert!(parse::<ClockSource>("Redis").is_err());
    }
}
