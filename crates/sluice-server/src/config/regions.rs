//! `store.regions`: one limit across regions (docs/regions.md). This region's own Redis
//! (`primary`, where it writes), a local replica of every other region's Redis (`remotes`,
//! read in the background), how fresh the remote views must be (`refresh`, `max_lag`) and what
//! a region does when they are not (`fallback`, `policy_fallback`).
//!
//! Read here, checked against the policies once they are read ([`check_policies`]: a token
//! bucket or a concurrency limit cannot be shared this way), and turned into the library's
//! [`sluice_redis::RegionsConfig`] when the store is connected ([`RegionsLayout::redis_config`]).

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;
use sluice_redis::regions::{DEFAULT_MAX_LAG, DEFAULT_REFRESH};
use sluice_redis::{ClockSource, Fallback, RedisConfig};

use super::{PolicyConfig, PositiveDuration, RedisLayout, SentinelConfig, ShardConfig};

/// `store.regions` as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRegions {
    local: String,
    primary: RawPrimary,
    #[serde(default)]
    remotes: BTreeMap<String, RawRemote>,
    #[serde(default)]
    refresh: Option<PositiveDuration>,
    #[serde(default)]
    max_lag: Option<PositiveDuration>,
    #[serde(default)]
    fallback: Option<Fallback>,
    #[serde(default)]
    policy_fallback: BTreeMap<String, Fallback>,
}

/// `store.regions.primary`: exactly one of `url` (with `replicas`) and `sentinel`; `cluster`
/// is read to be refused with the reason.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPrimary {
    #[serde(default)]
    url: Option<String>,
    #[serde(default)]
    replicas: Vec<String>,
    #[serde(default)]
    sentinel: Option<SentinelConfig>,
    #[serde(default)]
    cluster: Option<Vec<String>>,
}

/// `store.regions.remotes.<region>`: the local replica of that region's primary.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRemote {
    url: String,
}

/// Another region, read through the replica of its primary that runs in this region.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteLayout {
    /// The region's name (`store.regions.remotes.<name>`).
    pub name: String,
    /// The URL of the local replica of its primary.
    pub url: String,
}

/// `store.regions`, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegionsLayout {
    /// This region's name.
    pub local: String,
    /// This region's own Redis: one shard (a primary with replicas, or Sentinel).
    pub primary: Box<RedisLayout>,
    /// Every other region, by name.
    pub remotes: Vec<RemoteLayout>,
    /// The longest age of a cached remote view.
    pub refresh: Duration,
    /// Past this replication lag (or with a replica that does not answer) the fallback applies.
    pub max_lag: Duration,
    /// The fallback of every policy not in `policy_fallback`.
    pub fallback: Fallback,
    /// The fallback per policy name.
    pub policy_fallback: BTreeMap<String, Fallback>,
}

/// A region's name: it is a metric label and a log field, so it is kept short and plain.
fn check_name(path: &str, name: &str) -> Result<(), String> {
    let plain = name
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_');
    if name.is_empty() || name.len() > 32 || !plain {
        return Err(format!(
            "{path}: `{name}` is not a region name; use 1 to 32 lowercase letters, digits, `-` \
             or `_` (e.g. eu, us-east)"
        ));
    }
    Ok(())
}

/// Reads `store.regions`.
pub(super) fn regions_layout(raw: RawRegions) -> Result<RegionsLayout, String> {
    check_name("store.regions.local", &raw.local)?;
    let p = raw.primary;
    let primary = match (p.url, p.sentinel, p.cluster) {
        (Some(url), None, None) => RedisLayout::Shards(vec![ShardConfig {
            primary: url,
            replicas: p.replicas,
        }]),
        (None, Some(sentinel), None) if p.replicas.is_empty() => {
            if sentinel.nodes.is_empty() {
                return Err(
                    "store.regions.primary.sentinel.nodes: list at least one sentinel URL"
                        .to_owned(),
                );
            }
            if sentinel.master.is_empty() {
                return Err(
                    "store.regions.primary.sentinel.master: name the monitored master".to_owned(),
                );
            }
            RedisLayout::Sentinel(sentinel)
        }
        (None, None, Some(_)) => {
            return Err(
                "store.regions.primary.cluster: a region's own Redis must be one \
                        primary (url, with replicas, or sentinel): the other regions read \
                        its usage through one replica of it, which a Cluster does not have"
                    .to_owned(),
            );
        }
        (None, None, None) => {
            return Err(
                "store.regions.primary: this region's own Redis needs url (with \
                        replicas) or sentinel"
                    .to_owned(),
            );
        }
        (None, Some(_), None) => {
            return Err(
                "store.regions.primary.replicas: only with url (Sentinel finds the \
                        replicas itself)"
                    .to_owned(),
            );
        }
        _ => {
            return Err(
                "store.regions.primary: give only one of url, sentinel and cluster".to_owned(),
            );
        }
    };
    if raw.remotes.is_empty() {
        return Err(
            "store.regions.remotes: list every other region, each with the URL of \
                    the replica of its primary that runs in this region \
                    (us: {url: redis://…}); a regions store of one region is a plain store"
                .to_owned(),
        );
    }
    let mut remotes = Vec::with_capacity(raw.remotes.len());
    for (name, remote) in raw.remotes {
        let path = format!("store.regions.remotes.{name}");
        check_name(&path, &name)?;
        if name == raw.local {
            return Err(format!(
                "{path}: `{name}` is this region (store.regions.local); remotes are the \
                 other regions"
            ));
        }
        redis::IntoConnectionInfo::into_connection_info(remote.url.as_str()).map_err(|e| {
            format!(
                "{path}.url: `{}` is not a Redis URL ({e})",
                sluice_redis::redact(&remote.url)
            )
        })?;
        remotes.push(RemoteLayout {
            name,
            url: remote.url,
        });
    }
    let refresh = raw.refresh.map_or(DEFAULT_REFRESH, |d| d.0);
    let max_lag = raw.max_lag.map_or(DEFAULT_MAX_LAG, |d| d.0);
    if max_lag <= refresh {
        return Err(format!(
            "store.regions.max_lag: {} is not longer than refresh ({}): a remote view is up \
             to refresh old by design, so every region would fall back all the time; give \
             max_lag at least twice refresh",
            sluice::core::duration_text(millis(max_lag)),
            sluice::core::duration_text(millis(refresh)),
        ));
    }
    Ok(RegionsLayout {
        local: raw.local,
        primary: Box::new(primary),
        remotes,
        refresh,
        max_lag,
        fallback: raw.fallback.unwrap_or(Fallback::LocalShare),
        policy_fallback: raw.policy_fallback,
    })
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The checks that need the rest of the file: windows and lag are measured on the limiters'
/// clocks (`store.clock: app`), every policy can be shared across regions (fixed and sliding
/// windows; a token bucket or a concurrency limit is refused, naming it), and
/// `policy_fallback` names configured policies.
pub(super) fn check(
    regions: &RegionsLayout,
    clock: ClockSource,
    policies: &[PolicyConfig],
) -> Result<(), String> {
    if clock != ClockSource::App {
        return Err(
            "store.clock: a regions store needs `app` (the default): windows line up \
                    across regions and lag is measured on the limiters' clocks, not on each \
                    region's Redis"
                .to_owned(),
        );
    }
    for p in policies {
        let name = p.policy.name();
        match sluice_redis::RegionsStore::admits_policy(&p.policy) {
            Ok(()) => {}
            Err(sluice_redis::RegionsError::Unsupported {
                index, algorithm, ..
            }) => {
                return Err(format!(
                    "policies.{name}.limits[{index}]: a {algorithm} limit cannot be shared \
                     across regions (store.regions): only fixed_window and sliding_window \
                     counts add up; use one of those, or serve this policy from a store of \
                     its own"
                ));
            }
            Err(e) => return Err(format!("policies.{name}: {e}")),
        }
    }
    for name in regions.policy_fallback.keys() {
        if !policies.iter().any(|p| p.policy.name() == name) {
            return Err(format!(
                "store.regions.policy_fallback.{name}: no policy is named `{name}`; name a \
                 policy of `policies` (every other decision takes store.regions.fallback)"
            ));
        }
    }
    Ok(())
}

impl RegionsLayout {
    /// The library's configuration: the primary and every remote replica built by `settings`
    /// (the `store` settings that apply to every node: timeout, prefix, TLS, user, …), the
    /// sentinels' user when the primary is found through Sentinel.
    pub fn redis_config(
        &self,
        settings: impl Fn(RedisConfig) -> RedisConfig,
        sentinel_credentials: Option<&sluice_redis::Credentials>,
    ) -> sluice_redis::RegionsConfig {
        let primary = match &*self.primary {
            RedisLayout::Shards(shards) => {
                let shard = shards.first().cloned().unwrap_or(ShardConfig {
                    primary: String::new(),
                    replicas: Vec::new(),
                });
                settings(RedisConfig::new(shard.primary).replicas(shard.replicas))
            }
            RedisLayout::Sentinel(s) => {
                let rc = settings(RedisConfig::sentinel(s.master.clone(), s.nodes.clone()));
                match sentinel_credentials {
                    Some(c) => rc.sentinel_credentials(c.clone()),
                    None => rc,
                }
            }
            // Refused while read (no replica of a Cluster can be read by the other regions),
            // and a region's own Redis is not itself a set of regions; kept whole here.
            RedisLayout::Cluster(nodes) => settings(RedisConfig::cluster(nodes.clone())),
            RedisLayout::Regions(r) => return r.redis_config(settings, sentinel_credentials),
        };
        sluice_redis::RegionsConfig {
            local: self.local.clone(),
            primary,
            remotes: self
                .remotes
                .iter()
                .map(|r| sluice_redis::RemoteRegion {
                    name: r.name.clone(),
                    replica: settings(RedisConfig::new(r.url.clone())),
                })
                .collect(),
            refresh: self.refresh,
            max_lag: self.max_lag,
            fallback: self.fallback,
            policy_fallback: self.policy_fallback.clone(),
        }
    }

    /// What `sluice config check --explain` and the start-up log show (no credentials).
    pub fn describe(&self) -> String {
        let primary = match &*self.primary {
            RedisLayout::Shards(shards) => shards
                .iter()
                .map(|s| sluice_redis::redact(&s.primary))
                .collect::<Vec<_>>()
                .join(", "),
            RedisLayout::Sentinel(s) => format!("sentinel {}", s.master),
            RedisLayout::Cluster(nodes) => format!(
                "cluster {}",
                nodes
                    .first()
                    .map(|n| sluice_redis::redact(n))
                    .unwrap_or_default()
            ),
            RedisLayout::Regions(_) => String::new(),
        };
        let remotes: Vec<String> = self
            .remotes
            .iter()
            .map(|r| format!("{} at {}", r.name, sluice_redis::redact(&r.url)))
            .collect();
        format!(
            "redis regions: {} (primary {primary}), remotes {}; refresh {}, max_lag {}",
            self.local,
            remotes.join(", "),
            sluice::core::duration_text(millis(self.refresh)),
            sluice::core::duration_text(millis(self.max_lag)),
        )
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::super::{Config, RedisLayout, StoreConfig};
    use sluice_redis::Fallback;

    const EU: &str = "\
policies:
  api:
    limits:
      - { max: 100, per: 1m }
  login:
    limits:
      - { max: 5, per: 1m, algorithm: sliding_window, precision: 1s }
store:
  backend: redis
  regions:
    local: eu
    primary: { url: redis://redis-eu:6379, replicas: [redis://redis-eu-2:6379] }
    remotes:
      us: { url: redis://us-replica:6380 }
      ap: { url: redis://ap-replica:6381 }
    refresh: 100ms
    max_lag: 1s
    fallback: local_only
    policy_fallback: { login: closed }
";

    fn error(text: &str) -> String {
        Config::parse("sluice.yaml", text).unwrap_err().to_string()
    }

    #[test]
    fn a_regions_store_is_read_whole() {
        let c = Config::parse("sluice.yaml", EU).unwrap();
        let StoreConfig::Redis {
            layout: RedisLayout::Regions(r),
            ..
        } = &c.store
        else {
            panic!("{:?}", c.store);
        };
        assert_eq!(r.local, "eu");
        let names: Vec<&str> = r.remotes.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, ["ap", "us"]);
        assert_eq!(r.refresh.as_millis(), 100);
        assert_eq!(r.max_lag.as_millis(), 1_000);
        assert_eq!(r.fallback, Fallback::LocalOnly);
        assert_eq!(r.policy_fallback["login"], Fallback::Closed);
        let RedisLayout::Shards(primary) = &*r.primary else {
            panic!("{:?}", r.primary);
        };
        assert_eq!(primary[0].replicas, ["redis://redis-eu-2:6379"]);
        // The library's configuration: every node with the store's settings, the defaults
        // passed through.
        let rc = r.redis_config(|rc| rc.key_prefix("p:"), None);
        assert_eq!(rc.local, "eu");
        assert_eq!(rc.remotes.len(), 2);
        assert!(rc.remotes.iter().all(|r| r.replica.key_prefix == "p:"));
        assert_eq!(rc.fallback_of("login"), Fallback::Closed);
        assert_eq!(rc.fallback_of("api"), Fallback::LocalOnly);
        let shown = r.describe();
        assert!(shown.contains("eu") && shown.contains("us at redis://us-replica:6380"));
    }

    #[test]
    fn defaults_are_the_librarys() {
        let text = EU
            .replace("    refresh: 100ms\n", "")
            .replace("    max_lag: 1s\n", "")
            .replace("    fallback: local_only\n", "");
        let c = Config::parse("sluice.yaml", &text).unwrap();
        let StoreConfig::Redis {
            layout: RedisLayout::Regions(r),
            ..
        } = &c.store
        else {
            panic!("{:?}", c.store);
        };
        assert_eq!(r.refresh, sluice_redis::regions::DEFAULT_REFRESH);
        assert_eq!(r.max_lag, sluice_redis::regions::DEFAULT_MAX_LAG);
        assert_eq!(r.fallback, Fallback::LocalShare);
    }

    #[test]
    fn a_policy_that_cannot_be_shared_is_refused_naming_it_and_its_limit() {
        let text = EU.replace(
            "      - { max: 100, per: 1m }",
            "      - { max: 100, per: 1m }\n      - { max: 10, per: 1s, algorithm: token_bucket, burst: 5 }",
        );
        let e = error(&text);
        assert!(
            e.starts_with("sluice.yaml:5:9: policies.api.limits[1]: a token_bucket limit"),
            "{e}"
        );
        let text = EU.replace(
            "      - { max: 100, per: 1m }",
            "      - { max: 4, per: 30s, algorithm: concurrency }",
        );
        let e = error(&text);
        assert!(
            e.starts_with("sluice.yaml:4:9: policies.api.limits[0]: a concurrency limit"),
            "{e}"
        );
    }

    #[test]
    fn every_refusal_names_the_value_and_its_line() {
        for (from, to, at, wanted) in [
            (
                "    local: eu\n",
                "    local: EU West\n",
                "sluice.yaml:11:12: ",
                "store.regions.local: `EU West` is not a region name",
            ),
            (
                "      ap: { url: redis://ap-replica:6381 }\n",
                "      eu: { url: redis://ap-replica:6381 }\n",
                "sluice.yaml:15:",
                "store.regions.remotes.eu: `eu` is this region",
            ),
            (
                "      ap: { url: redis://ap-replica:6381 }\n",
                "      ap: { url: \"http://x\" }\n",
                "sluice.yaml:15:",
                "store.regions.remotes.ap.url: `http://x` is not a Redis URL",
            ),
            (
                "    max_lag: 1s\n",
                "    max_lag: 100ms\n",
                "sluice.yaml:17:14: ",
                "store.regions.max_lag: 100ms is not longer than refresh (100ms)",
            ),
            (
                "    fallback: local_only\n",
                "    fallback: open\n",
                "sluice.yaml:18:",
                "unknown variant `open`, expected one of `local_share`, `local_only`, `closed`",
            ),
            (
                "{ login: closed }",
                "{ logins: closed }",
                "sluice.yaml:19:",
                "store.regions.policy_fallback.logins: no policy is named `logins`",
            ),
            (
                "    primary: { url: redis://redis-eu:6379, replicas: [redis://redis-eu-2:6379] }\n",
                "    primary: { cluster: [redis://c:7000], sentinel: {master: m, nodes: [redis://s:26379]} }\n",
                "sluice.yaml:12:14: ",
                "store.regions.primary: give only one of url, sentinel and cluster",
            ),
            (
                "    primary: { url: redis://redis-eu:6379, replicas: [redis://redis-eu-2:6379] }\n",
                "    primary: { cluster: [redis://c:7000] }\n",
                "sluice.yaml:12:",
                "store.regions.primary.cluster: a region's own Redis must be one primary",
            ),
            (
                "  backend: redis\n",
                "  backend: redis\n  clock: redis\n",
                "sluice.yaml:10:10: ",
                "store.clock: a regions store needs `app`",
            ),
            (
                "  backend: redis\n",
                "  backend: redis\n  cluster: [redis://c:7000]\n",
                "sluice.yaml:",
                "store: give only one of store.shards, store.cluster, store.sentinel and store.regions",
            ),
            (
                "  backend: redis\n",
                "  backend: memory\n",
                "sluice.yaml:11:",
                "store.regions: a regions store keeps its counts in Redis; add `backend: redis`",
            ),
        ] {
            assert!(EU.contains(from), "{from}");
            let e = error(&EU.replace(from, to));
            assert!(
                e.starts_with(at) && e.contains(wanted),
                "{e}\n  wanted: {at}… {wanted}"
            );
        }
        let e = error(&EU.replace(
            "    remotes:\n      us: { url: redis://us-replica:6380 }\n      ap: { url: redis://ap-replica:6381 }\n",
            "",
        ));
        assert!(
            e.contains("store.regions.remotes: list every other region"),
            "{e}"
        );
    }
}
