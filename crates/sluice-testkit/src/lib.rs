//! Real `redis-server` processes for Sluice's tests and benches.
//!
//! The Redis store is tested against the real thing, not a mock: a [`RedisServer`] is a
//! `redis-server` child process on a free loopback port, with its own temporary directory,
//! no persistence, and a log file that failing tests quote. The topologies are built from it:
//!
//! - a [`ReplicaSet`] is a primary with replicas;
//! - a [`RedisCluster`] is a Redis Cluster (3 primaries with a replica each by default),
//!   formed by `redis-cli --cluster create` and tuned to fail over in seconds
//!   ([module docs](cluster));
//! - a [`SentinelGroup`] is a primary with replicas watched by `redis-sentinel`s (3, quorum
//!   2 by default) that fail it over ([module docs](sentinel)).
//!
//! Any of them can also serve TLS with certificates the kit generates ([`TlsCerts`]): a server
//! through [`ServerOptions::tls`], a Cluster through [`ClusterOptions::tls`] (the cluster
//! bus and replication over TLS, TLS ports announced to TLS clients), a Sentinel group through
//! [`SentinelOptions::tls`] (sentinels and data nodes, replicating and monitoring over TLS).
//! Each TLS server keeps its plain port for the kit's own checks
//! ([`RedisServer::tls_port`]).
//!
//! ```no_run
//! use sluice_testkit::{RedisServer, ReplicaSet};
//!
//! #[test]
//! fn talks_to_redis() {
//!     // Skips (loudly) when redis-server is not installed, unless SLUICE_REQUIRE_REDIS=1.
//!     if !sluice_testkit::require_redis() {
//!         return;
//!     }
//!     let server = RedisServer::start().unwrap();
//!     server.cmd(&["SET", "k", "v"]).unwrap();
//!     let client = redis::Client::open(server.url()).unwrap(); // or server.client()
//!     // … use the code under test against `server.url()` …
//!
//!     let mut set = ReplicaSet::start(2).unwrap();
//!     set.primary.cmd(&["SET", "k", "v"]).unwrap();
//!     set.wait_replicated().unwrap(); // now every replica has it
//!     set.replicas[0].pause().unwrap(); // SIGSTOP: a stalled server
//!     set.replicas[0].resume().unwrap();
//!     set.primary.restart().unwrap(); // a crash and a restart on the same port
//! } // every server is SIGKILLed, reaped and its directory removed here
//! ```
//!
//! Failing over a cluster and a Sentinel-watched primary:
//!
//! ```no_run
//! use std::time::Duration;
//! use sluice_testkit::{RedisCluster, SentinelGroup};
//!
//! # fn main() -> Result<(), sluice_testkit::Error> {
//! let mut cluster = RedisCluster::start()?; // 6 nodes, all 16384 slots served
//! let urls = cluster.urls(); // seeds for the cluster client under test
//! cluster.cmd_for_key("k", &["SET", "k", "v"])?; // routed to the key's primary
//! let old = cluster.primary_for_key("k")?;
//! cluster.node_mut(old).kill()?; // SIGKILL
//! let new = cluster.wait_failover(old, Duration::from_secs(15))?; // its replica took over
//! cluster.node_mut(old).restart()?; // same port and nodes.conf: it rejoins …
//! cluster.wait_ok()?; // … as a replica of `new`
//!
//! let group = SentinelGroup::start()?; // primary, replica, 3 sentinels (quorum 2)
//! let urls = group.sentinel_urls(); // for the Sentinel client under test
//! let old = group.current_primary_port()?;
//! group.data_nodes()[0].pause()?; // SIGSTOP the primary
//! let new = group.wait_failover(old, Duration::from_secs(20))?; // the sentinels agree
//! group.data_nodes()[0].resume()?;
//! # Ok(())
//! # }
//! ```
//!
//! # Free ports, never fixed ones
//!
//! Tests run in parallel, and so do test binaries of other crates and other checkouts on the
//! same machine. A server therefore never uses a fixed port: the kit binds `127.0.0.1:0`,
//! reads the port the system chose and releases it, then starts `redis-server` on it. If
//! another process takes the port in between, the server exits with `Address already in use`
//! and the kit tries another port (up to [`PORT_ATTEMPTS`] times). Port 6379 (a system Redis,
//! perhaps) is never touched.
//!
//! # Polling, never sleeping
//!
//! A test that sleeps "long enough" is slow on a fast machine and flaky on a loaded one.
//! Every wait in the kit polls a condition every [`POLL_INTERVAL`] (5 ms) until a deadline
//! instead: the server answers `PING`; the replicas report `master_link_status:up`; their
//! replication offset reached the primary's; every cluster node reports `cluster_state:ok`;
//! the sentinels agree on a new primary. It returns as soon as the condition holds, and
//! on a deadline fails with an error that says what it waited for and what it last saw.
//! [`wait_until`] is public so tests can wait the same way ([`until`] in async tests).
//!
//! # Killed on drop
//!
//! A server outliving its test holds a port and memory, and can answer a later test that
//! reuses its port. A [`RedisServer`] is therefore killed with SIGKILL when dropped — at the
//! end of the test, and also when the test panics, since drops run during unwinding — then
//! reaped (`wait`, so no zombie is left) before its directory is removed. SIGKILL rather
//! than `SHUTDOWN` because it cannot be ignored or delayed, also works on a paused
//! (SIGSTOPped) server, and a test-only server has nothing to save. A topology owns its
//! servers (cluster nodes, sentinels), so dropping it kills them all. A test process that is
//! itself SIGKILLed cannot run drops; its servers then outlive it.
//!
//! # Failures
//!
//! Library functions return [`Error`]; a server that exits or never answers reports the last
//! lines of its log. Tests may `unwrap()` freely.

pub mod cluster;
mod error;
mod info;
mod join;
mod options;
mod presence;
mod process;
mod proxy;
mod replica;
pub mod sentinel;
mod server;
mod tls;
mod wait;

pub use cluster::{
    CLUSTER_TIMEOUT, ClusterOptions, NODE_TIMEOUT, PRIMARIES, RedisCluster, SLOT_COUNT, Shard,
    key_slot,
};
pub use error::Error;
pub use info::parse_info_field;
pub use join::join_in_order;
pub use options::{ServerOptions, acl_user};
pub use presence::{REQUIRE_REDIS_ENV, bench_seconds, require_redis};
pub use process::READY_TIMEOUT;
pub use proxy::DelayProxy;
pub use replica::{ReplicaSet, SYNC_TIMEOUT};
pub use sentinel::{
    DOWN_AFTER, FAILOVER_TIMEOUT, SENTINEL_TIMEOUT, SentinelGroup, SentinelOptions,
};
pub use server::{
    CONNECT_TIMEOUT, CommandStats, IO_TIMEOUT, PORT_ATTEMPTS, RedisServer, free_port,
};
pub use tls::TlsCerts;
pub use wait::{POLL_INTERVAL, until, wait_until};

/// Re-exported so users need not add the same version of the client themselves.
pub use redis;
