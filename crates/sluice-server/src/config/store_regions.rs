//! `store.regions`: one limit across regions (docs/regions.md). This region's own Redis
//! (`primary`, where it writes), a local replica of every other region's Redis (`remotes`,
//! read in the background), how fresh the remote views must be (`refresh`, `max_lag`) and what
//! a region does when they are not (`fallback`, `policy_fallback`).
//!
//! Read here into the library's own [`RegionsConfig`] (the primary and every replica a
//! [`RedisConfig`] with the other settings of `store`: no server copy of the Redis types), and
//! checked against the policies once they are read ([`check`]: a token bucket or a
//! concurrency limit cannot be shared this way).

use std::collections::BTreeMap;

use serde::Deserialize;
use sluice_redis::regions::{DEFAULT_MAX_LAG, DEFAULT_REFRESH};
use sluice_redis::{Fallback, InvalidRegions, RedisConfig, RegionsConfig, RemoteRegion, Topology};

use sluice::Policy;

use super::{FieldError, PositiveDuration, RawSentinel};

/// `store.regions` as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRegions {
    local: String,
    primary: RawPrimary,
    #[serde(default)]
    remotes: BTreeMap<String, RawRemote>,
    refresh: Option<PositiveDuration>,
    max_lag: Option<PositiveDuration>,
    fallback: Option<Fallback>,
    #[serde(default)]
    policy_fallback: BTreeMap<String, Fallback>,
}

/// `store.regions.primary`: exactly one of `url` (with `replicas`) and `sentinel`; `cluster`
/// is read to be refused with the reason.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPrimary {
    url: Option<String>,
    #[serde(default)]
    replicas: Vec<String>,
    sentinel: Option<RawSentinel>,
    cluster: Option<Vec<String>>,
}

/// `store.regions.remotes.<region>`: the local replica of that region's primary.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRemote {
    url: String,
}

/// This region's own Redis (`store.regions.primary`): one primary with replicas (`url`), or
/// found through Sentinel; returned with the rest of the section.
pub(super) fn primary_topology(mut raw: RawRegions) -> Result<(Topology, RawRegions), FieldError> {
    let p = &mut raw.primary;
    let (at, why) = match (p.url.take(), p.sentinel.take(), p.cluster.take()) {
        (Some(url), None, None) => {
            let replicas = std::mem::take(&mut p.replicas);
            return Ok((
                Topology::Standalone {
                    primary: url,
                    replicas,
                },
                raw,
            ));
        }
        (None, Some(sentinel), None) if p.replicas.is_empty() => {
            return Ok((sentinel.topology("store.regions.primary.sentinel")?, raw));
        }
        (None, None, Some(_)) => (
            ".cluster",
            "a region's own Redis must be one primary (url, with replicas, or sentinel): the \
             other regions read its usage through one replica of it, which a Cluster does not \
             have",
        ),
        (None, None, None) => (
            "",
            "this region's own Redis needs url (with replicas) or sentinel",
        ),
        (None, Some(_), None) => (
            ".replicas",
            "only with url (Sentinel finds the replicas itself)",
        ),
        _ => ("", "give only one of url, sentinel and cluster"),
    };
    Err(FieldError::new(format!("store.regions.primary{at}"), why))
}

/// The rest of `store.regions`, over `primary` (this region's own Redis with every setting of
/// `store`): each remote region's local replica is read with the same settings, but for the
/// sentinels' user and `WAIT` (a replica is only read). Checked by the library's own
/// [`RegionsConfig::validate`], its errors put at their keys.
pub(super) fn regions_config(
    raw: RawRegions,
    primary: RedisConfig,
) -> Result<RegionsConfig, FieldError> {
    let remotes: Vec<RemoteRegion> = raw
        .remotes
        .into_iter()
        .map(|(name, remote)| {
            let mut replica = primary.clone();
            replica.topology = Topology::Standalone {
                primary: remote.url,
                replicas: Vec::new(),
            };
            replica.sentinel_credentials = None;
            replica.wait_for_replicas = None;
            RemoteRegion::new(name, replica)
        })
        .collect();
    let mut regions = RegionsConfig::new(raw.local, primary, remotes)
        .refresh(raw.refresh.map_or(DEFAULT_REFRESH, |d| d.0))
        .max_lag(raw.max_lag.map_or(DEFAULT_MAX_LAG, |d| d.0))
        .fallback(raw.fallback.unwrap_or(Fallback::LocalShare));
    regions.policy_fallback = raw.policy_fallback;
    regions.validate().map_err(|e| {
        let remote = |name: &str| format!("store.regions.remotes.{name}");
        let path = match &e {
            InvalidRegions::Name { local: true, .. } => "store.regions.local".to_owned(),
            InvalidRegions::Name { name, .. }
            | InvalidRegions::IsLocal(name)
            | InvalidRegions::Twice(name)
            | InvalidRegions::NotStandalone(name)
            | InvalidRegions::Prefix { region: name, .. } => remote(name),
            InvalidRegions::Url { region, .. } => format!("{}.url", remote(region)),
            InvalidRegions::NoRemote => "store.regions.remotes".to_owned(),
            InvalidRegions::Refresh => "store.regions.refresh".to_owned(),
            InvalidRegions::MaxLag { .. } => "store.regions.max_lag".to_owned(),
            InvalidRegions::Clock => "store.clock".to_owned(),
            _ => "store.regions".to_owned(),
        };
        FieldError::new(path, e.to_string())
    })?;
    Ok(regions)
}

/// The checks that need the rest of the file: every policy can be shared across regions
/// (fixed and sliding windows; a token bucket or a concurrency limit is refused, naming it),
/// and `policy_fallback` names configured policies.
pub(super) fn check(regions: &RegionsConfig, policies: &[Policy]) -> Result<(), FieldError> {
    for p in policies {
        let (at, message) = match sluice_redis::RegionsStore::admits_policy(p) {
            Ok(()) => continue,
            Err(sluice_redis::RegionsError::Unsupported {
                index, algorithm, ..
            }) => (
                format!(".limits[{index}]"),
                format!(
                    "a {algorithm} limit cannot be shared across regions (store.regions): only \
                     fixed_window and sliding_window counts add up; use one of those, or serve \
                     this policy from a store of its own"
                ),
            ),
            Err(e @ sluice_redis::RegionsError::Collide { second, .. }) => {
                (format!(".limits[{second}]"), e.to_string())
            }
            Err(e) => (String::new(), e.to_string()),
        };
        return Err(FieldError::new(
            format!("policies.{}{at}", p.name()),
            message,
        ));
    }
    for name in regions.policy_fallback.keys() {
        if !policies.iter().any(|p| p.name() == name) {
            return Err(FieldError::new(
                format!("store.regions.policy_fallback.{name}"),
                format!(
                    "no policy is named `{name}`; name a policy of `policies` (every other \
                     decision takes store.regions.fallback)"
                ),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::time::Duration;

    use sluice_redis::{Fallback, Topology};

    use crate::config::{Config, StoreConfig};

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
        let StoreConfig::Regions(r) = &c.store else {
            panic!("{:?}", c.store);
        };
        assert_eq!(r.local, "eu");
        let names: Vec<&str> = r.remotes.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, ["ap", "us"]);
        assert_eq!(r.refresh.as_millis(), 100);
        assert_eq!(r.max_lag.as_millis(), 1_000);
        assert_eq!(r.fallback, Fallback::LocalOnly);
        assert_eq!(r.policy_fallback["login"], Fallback::Closed);
        let Topology::Standalone { replicas, .. } = &r.primary.topology else {
            panic!("{:?}", r.primary);
        };
        assert_eq!(replicas, &["redis://redis-eu-2:6379"]);
        // Every node with the store's settings: the replicas read under the primary's prefix.
        assert!(
            r.remotes
                .iter()
                .all(|remote| remote.replica.key_prefix == r.primary.key_prefix)
        );
        assert_eq!(r.fallback_of("login"), Fallback::Closed);
        assert_eq!(r.fallback_of("api"), Fallback::LocalOnly);
        let shown = c.store.to_string();
        assert!(shown.contains("eu") && shown.contains("us at redis://us-replica:6380"));
    }

    #[test]
    fn defaults_are_the_librarys() {
        let text = EU
            .replace("    refresh: 100ms\n", "")
            .replace("    max_lag: 1s\n", "")
            .replace("    fallback: local_only\n", "");
        let c = Config::parse("sluice.yaml", &text).unwrap();
        let StoreConfig::Regions(r) = &c.store else {
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

    /// `{max: 10, per: 1m}` beside `{max: 100, per: 1m, align: true}` is valid on any store,
    /// but a regions store aligns every fixed window: both would count one window (and every
    /// decision would be a store error). Refused at load, naming the policy and both limits.
    #[test]
    fn fixed_windows_that_collide_once_aligned_are_refused_naming_both() {
        let text = EU.replace(
            "      - { max: 100, per: 1m }",
            "      - { max: 10, per: 1m }\n      - { max: 100, per: 1m, align: true }",
        );
        let e = error(&text);
        assert!(
            e.starts_with("sluice.yaml:5:9: policies.api.limits[1]: "),
            "{e}"
        );
        for part in [
            "limits[0] (max 10 per 60000 ms)",
            "limits[1] (max 100 per 60000 ms, aligned)",
        ] {
            assert!(e.contains(part), "{part}: {e}");
        }
        // On any other store the two are two keys.
        let alone = "policies:\n  api:\n    limits:\n      - { max: 10, per: 1m }\n      - { max: 100, per: 1m, align: true }\n";
        assert!(Config::parse("sluice.yaml", alone).is_ok());
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

    const FILE: &str = "policies:\n  orders:\n    limits:\n      - { max: 6000, per: 1m }\n\
        store:\n  backend: redis\n  timeout: 50ms\n  key_prefix: \"r:\"\n  coalesce: 8\n  regions:\n    \
        local: eu\n    primary: { url: redis://127.0.0.1:6379, replicas: [redis://127.0.0.1:6390] }\n    \
        remotes:\n      us: { url: redis://127.0.0.1:6380 }\n    refresh: 100ms\n    \
        policy_fallback: { orders: closed }\n";

    #[test]
    fn the_primary_and_every_replica_take_the_store_settings() {
        let config = Config::parse("sluice.yaml", FILE).unwrap();
        let StoreConfig::Regions(regions) = config.store else {
            panic!("not a regions store: {:?}", config.store);
        };
        assert_eq!(regions.local, "eu");
        assert_eq!(
            regions.primary.topology,
            Topology::Standalone {
                primary: "redis://127.0.0.1:6379".to_owned(),
                replicas: vec!["redis://127.0.0.1:6390".to_owned()],
            }
        );
        let [us] = regions.remotes.as_slice() else {
            panic!("{:?}", regions.remotes);
        };
        assert_eq!(us.name, "us");
        assert_eq!(
            us.replica.topology,
            Topology::Standalone {
                primary: "redis://127.0.0.1:6380".to_owned(),
                replicas: Vec::new(),
            }
        );
        for rc in [&regions.primary, &us.replica] {
            assert_eq!(rc.key_prefix, "r:");
            assert_eq!(rc.timeout, Duration::from_millis(50));
            assert_eq!(rc.coalesce, 8);
        }
        assert_eq!(regions.refresh, Duration::from_millis(100));
        assert_eq!(regions.max_lag, sluice_redis::regions::DEFAULT_MAX_LAG);
        assert_eq!(regions.fallback, Fallback::LocalShare);
        assert_eq!(
            regions.policy_fallback.get("orders"),
            Some(&Fallback::Closed)
        );
    }

    #[test]
    fn a_regions_store_beside_another_topology_or_on_memory_is_refused() {
        let beside = FILE.replace(
            "  regions:\n",
            "  shards: [{primary: redis://127.0.0.1:6379}]\n  regions:\n",
        );
        let e = Config::parse("sluice.yaml", &beside)
            .unwrap_err()
            .to_string();
        assert!(e.contains("give only one of store.shards"), "{e}");
        let memory = FILE.replace("  backend: redis\n", "  backend: memory\n");
        let e = Config::parse("sluice.yaml", &memory)
            .unwrap_err()
            .to_string();
        assert!(e.contains("add `backend: redis`"), "{e}");
        let cluster = FILE.replace(
            "primary: { url: redis://127.0.0.1:6379, replicas: [redis://127.0.0.1:6390] }",
            "primary: { cluster: [redis://127.0.0.1:7000] }",
        );
        let e = Config::parse("sluice.yaml", &cluster)
            .unwrap_err()
            .to_string();
        assert!(e.contains("store.regions.primary.cluster"), "{e}");
    }
}
