//! [`RegionsConfig::validate`]: the one check of a regions store's configuration, whose
//! errors name the region or setting at fault so a configuration file can point at it.

use std::time::Duration;

use super::RegionsConfig;
use crate::config::{ClockSource, Topology, redact};

/// What makes a [`RegionsConfig`] unusable, naming the region or setting at fault; each
/// message says what to give instead.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum InvalidRegions {
    /// A region's name is not 1 to 32 lowercase letters, digits, `-` or `_` (it is a metric
    /// label and a log field, so it is kept short and plain).
    #[error(
        "`{name}` is not a region name; use 1 to 32 lowercase letters, digits, `-` or `_` \
         (e.g. eu, us-east)"
    )]
    Name {
        /// The name.
        name: String,
        /// Whether it is this region's ([`RegionsConfig::local`]) or a remote's.
        local: bool,
    },
    /// A remote region named as this one.
    #[error("`{0}` is this region (local); remotes are the other regions")]
    IsLocal(String),
    /// Two remote regions of one name.
    #[error("`{0}` names two remote regions; every region needs its own name")]
    Twice(String),
    /// No remote region.
    #[error(
        "list every other region, each with the URL of the replica of its primary that runs \
         in this region; a regions store of one region is a plain store"
    )]
    NoRemote,
    /// A remote region's replica whose URL is not a Redis URL.
    #[error("`{url}` is not a Redis URL ({reason})")]
    Url {
        /// The region.
        region: String,
        /// The URL, without credentials.
        url: String,
        /// What the Redis client said.
        reason: String,
    },
    /// A remote region's replica that is not one standalone node.
    #[error(
        "region `{0}`: the replica must be a standalone node (a `replicaof` of that region's \
         primary)"
    )]
    NotStandalone(String),
    /// A remote region read under another key prefix than this region's.
    #[error(
        "region `{region}`: key prefix `{prefix}` differs from the local `{local}`; every \
         region uses the same prefix"
    )]
    Prefix {
        /// The region.
        region: String,
        /// Its replica's prefix.
        prefix: String,
        /// This region's prefix.
        local: String,
    },
    /// A refresh under 1 ms.
    #[error("refresh must be at least 1 ms")]
    Refresh,
    /// A `max_lag` not above `refresh`.
    #[error(
        "{} is not longer than refresh ({}): a remote view is up to refresh old by design, so \
         every region would fall back all the time; give max_lag at least twice refresh",
        text(*.max_lag),
        text(*.refresh)
    )]
    MaxLag {
        /// The maximum lag.
        max_lag: Duration,
        /// The refresh.
        refresh: Duration,
    },
    /// This region's Redis keeps time itself (`clock: redis`).
    #[error(
        "a regions store needs `app` (the default): windows line up across regions and lag is \
         measured on the limiters' clocks, not on each region's Redis"
    )]
    Clock,
}

fn text(d: Duration) -> String {
    sluice::core::duration_text(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// A region's name: short and plain.
fn check_name(name: &str, local: bool) -> Result<(), InvalidRegions> {
    let plain = name
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_');
    if name.is_empty() || name.len() > 32 || !plain {
        return Err(InvalidRegions::Name {
            name: name.to_owned(),
            local,
        });
    }
    Ok(())
}

impl RegionsConfig {
    /// Checks what [`RegionsStore::connect`](super::RegionsStore::connect) needs: plain
    /// distinct names, at least one remote, each read from a standalone replica at a Redis
    /// URL under the local key prefix, a refresh from 1 ms and a `max_lag` above it, and
    /// `clock: app`.
    pub fn validate(&self) -> Result<(), InvalidRegions> {
        check_name(&self.local, true)?;
        if self.remotes.is_empty() {
            return Err(InvalidRegions::NoRemote);
        }
        for (i, remote) in self.remotes.iter().enumerate() {
            let name = &remote.name;
            check_name(name, false)?;
            if *name == self.local {
                return Err(InvalidRegions::IsLocal(name.clone()));
            }
            if self.remotes[..i].iter().any(|r| r.name == *name) {
                return Err(InvalidRegions::Twice(name.clone()));
            }
            let Topology::Standalone { primary: url, .. } = &remote.replica.topology else {
                return Err(InvalidRegions::NotStandalone(name.clone()));
            };
            redis::IntoConnectionInfo::into_connection_info(url.as_str()).map_err(|e| {
                InvalidRegions::Url {
                    region: name.clone(),
                    url: redact(url),
                    reason: e.to_string(),
                }
            })?;
            if remote.replica.key_prefix != self.primary.key_prefix {
                return Err(InvalidRegions::Prefix {
                    region: name.clone(),
                    prefix: remote.replica.key_prefix.clone(),
                    local: self.primary.key_prefix.clone(),
                });
            }
        }
        if self.refresh < Duration::from_millis(1) {
            return Err(InvalidRegions::Refresh);
        }
        if self.max_lag <= self.refresh {
            return Err(InvalidRegions::MaxLag {
                max_lag: self.max_lag,
                refresh: self.refresh,
            });
        }
        if self.primary.clock != ClockSource::App {
            return Err(InvalidRegions::Clock);
        }
        Ok(())
    }
}
