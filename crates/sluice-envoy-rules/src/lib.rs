//! Envoy's rate limit service: its configuration files and descriptor matching.
//!
//! Sluice is meant to replace the reference rate limit service,
//! [github.com/envoyproxy/ratelimit](https://github.com/envoyproxy/ratelimit), without changes
//! on the Envoy side or in the configuration. This module reads that service's YAML files
//! unchanged ([`RlsConfig::load_dir`]) and finds, for a request descriptor, the rule the
//! reference would apply and the counter it would count in ([`RlsConfig::get_limit`]). It is
//! pure: no I/O besides reading the files, no async, no gRPC.
//!
//! # What is mirrored, and where it comes from
//!
//! The behaviour follows the reference's source (current `main`: the version with
//! `quota_mode`, `value_to_metric`, `share_threshold` and wildcards anywhere in a value):
//!
//! * **File format** (`src/config/config_impl.go`, `YamlRoot`/`YamlDescriptor`/
//!   `YamlRateLimit`, read with `gopkg.in/yaml.v2`): `domain`, `descriptors`, and per
//!   descriptor `key`, `value`, `rate_limit` (`unit`, `requests_per_unit`, `unlimited`, `name`,
//!   `replaces: [{name}]`), `shadow_mode`, `quota_mode`, `detailed_metric`,
//!   `value_to_metric`, `share_threshold` and nested `descriptors`. Scalars convert as in
//!   yaml.v2 (YAML 1.1: `yes`/`on` are booleans, a string field takes the raw text); see the
//!   `yaml` submodule.
//! * **Unknown keys** (`validateYamlKeys`): every mapping key anywhere in the file must be one
//!   of the keys above, else the file is rejected; lists may hold only mappings; numbers may
//!   not be floating-point. A known key in the wrong place is *ignored* by the reference (its
//!   YAML decoding is not strict); Sluice ignores it too and reports a [`RlsConfigWarning`].
//! * **Units** (`strings.ToUpper(unit)` looked up in `rls.proto`'s `RateLimit.Unit`, and
//!   `UnitToDivider` in `src/utils/utilities.go`): `second`, `minute`, `hour`, `day`, `week`
//!   (7 days), `month` (30 days), `year` (365 days), in any letter case. See [`Unit`].
//! * **Validation** (`loadConfig`, `loadDescriptors`), each a [`RlsConfigError`] naming the
//!   file and line: empty or missing `domain`; a domain defined in two files (unless
//!   [`LoadOptions::merge_domains`], the reference's `MERGE_DOMAIN_CONFIG`); a descriptor
//!   without `key`; two descriptors with the same key and value at one level; a rate limit
//!   whose `unit` is missing or unknown; `unlimited: true` together with a valid `unit`
//!   (`requests_per_unit` alongside `unlimited` is accepted and ignored, as in the reference);
//!   an empty `replaces` name or one equal to the rule's own `name`; `share_threshold`
//!   without `*` in the value. `requests_per_unit: 0` is valid (everything is over the limit).
//! * **Loading a directory** (`src/config/file_provider.go` with `lyft/goruntime`'s loader):
//!   every file under the directory, in subdirectories too, whatever its extension; see
//!   [`RlsConfig::load_dir`].
//! * **Matching** (`GetLimit`): see [`RlsConfig::get_limit`].
//! * **Counter key** (`GenerateCacheKey`, `src/limiter/cache_key.go`): see [`Match`].
//! * **`replaces`, `unlimited`, `shadow_mode`** (`constructLimitsToCheck` and
//!   `shouldRateLimitWorker` in `src/service/ratelimit.go`, `GetResponseDescriptorStatus` in
//!   `src/limiter/base_limiter.go`): see [`RlsConfig::get_limits`] and [`Rule`].
//!
//! * **The limit a request descriptor carries** (`descriptor.limit`, checked first in
//!   `GetLimit`): see [`RlsConfig::override_limit`].
//!
//! Not here: the service-level handling of the response codes and its gRPC adapter (the
//! server's `rls::service` and `rls::grpc`).

pub mod answer;
mod decode;
mod error;
mod matcher;
mod policies;
pub mod request;
pub mod rlqs;
mod tree;
mod unit;
pub mod xds;
mod yaml;

pub use policies::RulePolicies;
pub use policies::rule_policy;
pub use unit::Unit;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use error::{RlsConfigError, RlsConfigWarning};

/// A configured rate limit: the `rate_limit` block of one descriptor, and what surrounds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    /// The domain it belongs to (shared by every rule of the domain).
    pub domain: Arc<str>,
    /// `rate_limit.name`, the name other rules' `replaces` refer to; `None` when unset or
    /// empty.
    pub name: Option<String>,
    /// `rate_limit.unit`; `None` exactly when the rule is unlimited.
    pub unit: Option<Unit>,
    /// `rate_limit.requests_per_unit`. `0` is valid: every request is over the limit (the
    /// reference's example of blocking one address). Meaningless when `unlimited`.
    pub requests_per_unit: u32,
    /// `rate_limit.unlimited`: the descriptor is always OK and never counted; the reference
    /// answers `OK` with `limit_remaining` = `u32::MAX` and no current limit.
    pub unlimited: bool,
    /// `shadow_mode` of the descriptor: counted and reported as usual, but an over-limit
    /// result becomes `OK` — for this descriptor's status and so for the overall code (which
    /// is `OVER_LIMIT` only when a non-shadow descriptor is over). The reference also counts
    /// it in a `shadow_mode` statistic.
    pub shadow_mode: bool,
    /// `quota_mode` of the descriptor, accepted as in the reference's newest versions; how a
    /// quota-mode result is answered is the service's business, not this module's.
    pub quota_mode: bool,
    /// `detailed_metric` of the descriptor: the statistics key carries the request's values
    /// (see [`Match::stats_key`]).
    pub detailed_metric: bool,
    /// `rate_limit.replaces[].name`: when this rule and a rule with one of these names both
    /// match one request, that other rule is not applied ([`RlsConfig::get_limits`]).
    pub replaces: Vec<String>,
    /// The reference's key for this descriptor (`RateLimit.FullKey`), its default statistics
    /// key: the domain and each level's `key` or `key_value`, joined by dots, e.g.
    /// `messaging.message_type_marketing.to_number`.
    pub full_key: String,
    /// The file the rule was read from (shared by every rule of the file).
    pub file: Arc<str>,
    /// The line of the descriptor's `key:` in that file, when known.
    pub line: Option<usize>,
    /// The descriptor's YAML path in that file, e.g. `descriptors[0].descriptors[1]`.
    pub path: String,
}

impl Rule {
    /// The window length in milliseconds, `None` for an unlimited rule.
    pub fn window_ms(&self) -> Option<u64> {
        self.unit.map(Unit::millis)
    }

    /// Where the rule was written, for messages: `api.yaml:7: descriptors[0].descriptors[1]`.
    pub fn location(&self) -> String {
        match self.line {
            Some(line) => format!("{}:{line}: {}", self.file, self.path),
            None => format!("{}: {}", self.file, self.path),
        }
    }
}

/// The rule that applies to one request descriptor, and the keys the reference would use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Match {
    /// The rule.
    pub rule: Arc<Rule>,
    /// The counter this descriptor counts in: the reference's cache key without its prefix
    /// (`CACHE_KEY_PREFIX`) and without the window start that ends it. It is the domain, then
    /// every entry of the *request* as `key_value`, each followed by `_`:
    /// `edge_proxy_per_ip_remote_address_50.0.0.1_`. The request's values are used whether
    /// they matched a configured value, a wildcard or a key-only descriptor — so a key-only
    /// `remote_address` descriptor gives one counter per address — except under
    /// `share_threshold`, where the wildcard pattern (`files/*`) replaces the value so that
    /// every matching value shares one counter. Note that the key names neither the rule nor
    /// its unit: the reference's full key ends with the window start, which does.
    pub counter_key: String,
    /// The statistics key the reference would use for this request: [`Rule::full_key`],
    /// except that `detailed_metric` uses every request value
    /// (`domain.key1_value1.key2_value2`), `value_to_metric` adds the request's value at the
    /// levels that set it, and `share_threshold` shows the wildcard pattern.
    pub stats_key: String,
}

impl Match {
    /// The reference's cache key for this match at `now_unix_secs`: `prefix`, the counter key,
    /// and the start of the current window in Unix seconds. `None` for an unlimited rule,
    /// which is never counted.
    pub fn reference_cache_key(&self, prefix: &str, now_unix_secs: u64) -> Option<String> {
        let divider = self.rule.unit?.seconds();
        let start = now_unix_secs / divider * divider;
        Some(format!("{prefix}{}{start}", self.counter_key))
    }
}

/// How a configuration is loaded: the reference's settings that change it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LoadOptions {
    /// Merge the descriptors of files that define the same domain, instead of rejecting the
    /// second file (the reference's `MERGE_DOMAIN_CONFIG`, off by default). A descriptor
    /// defined in two such files is still an error.
    pub merge_domains: bool,
    /// Skip files and directories whose name starts with `.` (the reference's
    /// `RUNTIME_IGNOREDOTFILES`, off by default). Names starting with `..`, which kubelet adds
    /// to a ConfigMap mount, are skipped either way ([`is_kubelet_entry`]).
    pub ignore_dot_files: bool,
}

/// A loaded configuration: every domain of every file, ready for lookups.
#[derive(Debug, Default)]
pub struct RlsConfig {
    domains: BTreeMap<String, tree::Domain>,
    warnings: Vec<RlsConfigWarning>,
}

impl RlsConfig {
    /// Loads every configuration file under `dir`, with default [`LoadOptions`].
    ///
    /// `dir` is the directory the reference reads its files from
    /// (`RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY`, usually ending in `config`).
    /// As in the reference, *every* regular file below it is a configuration file: files in
    /// subdirectories too, whatever their extension (the reference's README speaks of
    /// `*.yaml`, but its loader, `lyft/goruntime`, reads every file), and files whose name
    /// starts with `.` unless [`LoadOptions::ignore_dot_files`] is set. So a stray `README.md`
    /// fails the load in both. Symbolic links to files are followed; a symbolic link to a
    /// directory is skipped (with a warning), as `filepath.Walk` does. Files are read in the
    /// order of their relative paths (the reference's order is not defined). A missing or
    /// unreadable `dir` is an error; an unreadable file below it is skipped with a warning,
    /// as in the reference.
    pub fn load_dir(dir: &Path) -> Result<Self, RlsConfigError> {
        Self::load_dir_with(dir, &LoadOptions::default())
    }

    /// [`RlsConfig::load_dir`] with explicit options.
    pub fn load_dir_with(dir: &Path, options: &LoadOptions) -> Result<Self, RlsConfigError> {
        let mut warnings = Vec::new();
        let mut found = Vec::new();
        collect_files(dir, Path::new(""), options, &mut found, &mut warnings).map_err(|err| {
            RlsConfigError::new(
                &dir.display().to_string(),
                None,
                format!("cannot read the configuration directory: {err}"),
            )
        })?;
        found.sort();
        let mut files = Vec::with_capacity(found.len());
        for relative in found {
            let path = dir.join(&relative);
            let name = path.display().to_string();
            match std::fs::read(&path) {
                Ok(bytes) => match String::from_utf8(bytes) {
                    Ok(text) => files.push((name, text)),
                    Err(_) => {
                        return Err(RlsConfigError::new(
                            &name,
                            None,
                            "the file is not UTF-8 text; every file under the configuration \
                             directory is read as a YAML configuration",
                        ));
                    }
                },
                Err(err) => warnings.push(RlsConfigWarning {
                    file: name,
                    line: None,
                    message: format!("skipped: cannot read the file: {err}"),
                }),
            }
        }
        if files.is_empty() {
            warnings.push(RlsConfigWarning {
                file: dir.display().to_string(),
                line: None,
                message: "no configuration files found; no descriptor will be limited".into(),
            });
        }
        Self::build(&files, options, warnings)
    }

    /// Builds a configuration from files already read: `(name, text)` pairs, the name being
    /// what errors call the file. Files are loaded in the order given.
    pub fn from_files<N: AsRef<str>, T: AsRef<str>>(
        files: &[(N, T)],
    ) -> Result<Self, RlsConfigError> {
        Self::from_files_with(files, &LoadOptions::default())
    }

    /// [`RlsConfig::from_files`] with explicit options (only `merge_domains` applies).
    pub fn from_files_with<N: AsRef<str>, T: AsRef<str>>(
        files: &[(N, T)],
        options: &LoadOptions,
    ) -> Result<Self, RlsConfigError> {
        Self::build(files, options, Vec::new())
    }

    /// Decodes every file (syntax, keys and types), then loads them in order (the checks on
    /// descriptors), as the reference does; the first error wins.
    fn build<N: AsRef<str>, T: AsRef<str>>(
        files: &[(N, T)],
        options: &LoadOptions,
        mut warnings: Vec<RlsConfigWarning>,
    ) -> Result<Self, RlsConfigError> {
        let mut decoded = Vec::with_capacity(files.len());
        for (name, text) in files {
            let root = decode::decode_file(name.as_ref(), text.as_ref(), &mut warnings)?;
            decoded.push((name.as_ref(), root));
        }
        let mut domains = BTreeMap::new();
        for (name, root) in decoded {
            tree::load_file(
                &mut domains,
                name,
                root,
                options.merge_domains,
                &mut warnings,
            )?;
        }
        Ok(Self { domains, warnings })
    }

    /// The domains, in alphabetical order.
    pub fn domains(&self) -> impl Iterator<Item = &str> {
        self.domains.keys().map(String::as_str)
    }

    /// Every rule with a `rate_limit` block, by domain, then by [`Rule::full_key`] (for the
    /// limit gauges of `/metrics`).
    pub fn rules(&self) -> Vec<&Arc<Rule>> {
        let mut rules = Vec::new();
        for domain in self.domains.values() {
            let first = rules.len();
            let mut nodes = vec![&domain.root];
            while let Some(node) = nodes.pop() {
                rules.extend(node.limit.as_ref());
                nodes.extend(node.children.values());
            }
            rules[first..].sort_by(|a: &&Arc<Rule>, b| a.full_key.cmp(&b.full_key));
        }
        rules
    }

    /// Whether no domain is configured (the reference's `IsEmptyDomains`, which its health
    /// check may use).
    pub fn is_empty(&self) -> bool {
        self.domains.is_empty()
    }

    /// What loaded but looks wrong; the server should log these.
    pub fn warnings(&self) -> &[RlsConfigWarning] {
        &self.warnings
    }

    /// The rule for one request descriptor (its ordered `(key, value)` entries), or `None`
    /// when no limit applies. As the reference's `GetLimit`:
    ///
    /// * An unknown domain, or a descriptor without entries, has no limit.
    /// * The tree is walked one entry per level. At each level the descriptor with the
    ///   entry's key *and value* is tried first; then the descriptors whose value contains
    ///   `*` (each `*` matching any run of characters, `foo*` being a prefix match), in file
    ///   order, the first that matches winning; then the descriptor with the key alone (the
    ///   default for any value). The wildcard is matched against `key_value` as a whole, as
    ///   the reference does.
    /// * A limit applies only if it is on the descriptor matched by the *last* entry. A limit
    ///   on a descriptor matched by an earlier entry does not apply (the request is deeper
    ///   than that rule), and a request with more entries than the matched branch is deep has
    ///   no limit.
    /// * An unlimited rule is returned too (callers answer OK without counting).
    pub fn get_limit<K: AsRef<str>, V: AsRef<str>>(
        &self,
        domain: &str,
        entries: &[(K, V)],
    ) -> Option<Match> {
        self.domains.get(domain)?.get_limit(domain, entries)
    }

    /// The rules for all descriptors of one request, in order, with `replaces` applied: when
    /// a matched rule's `replaces` names another matched rule's `name`, that other rule
    /// becomes `None` (it is neither counted nor checked). Unlimited rules stay (they are
    /// answered OK whatever replaces them), and their own `replaces` still take effect.
    pub fn get_limits<D, K, V>(&self, domain: &str, descriptors: &[D]) -> Vec<Option<Match>>
    where
        D: AsRef<[(K, V)]>,
        K: AsRef<str>,
        V: AsRef<str>,
    {
        let mut matches: Vec<Option<Match>> = descriptors
            .iter()
            .map(|entries| self.get_limit(domain, entries.as_ref()))
            .collect();
        matcher::apply_replaces(&mut matches);
        matches
    }
}

/// One descriptor of a request: its entries, and the limit it carries (requests per unit,
/// unit) if any.
pub type Asked<'a, K, V> = (&'a [(K, V)], Option<(u32, Unit)>);

impl RlsConfig {
    /// The rule a request descriptor's own `limit` sets (`RateLimitDescriptor.limit`, which
    /// Envoy fills from a route's `limit` override), as the reference's `GetLimit` builds it:
    /// for a configured domain only (`None` otherwise), whatever the configuration says for
    /// the entries, never in shadow or quota mode, and named by no rule, so no `replaces`
    /// removes it. It counts in the counter of the same entries (the reference's cache key is
    /// the domain, the entries and the window start whatever the limit), so an override with
    /// the unit of a configured rule shares that rule's count. Its statistics key is the
    /// reference's `descriptorKey`: `domain.key1_value1.key2` (a `_value` only when the value
    /// is not empty).
    pub fn override_limit<K: AsRef<str>, V: AsRef<str>>(
        &self,
        domain: &str,
        entries: &[(K, V)],
        requests_per_unit: u32,
        unit: Unit,
    ) -> Option<Match> {
        self.domains.get(domain)?;
        let mut full_key = String::new();
        let mut counter_key = format!("{domain}_");
        for (key, value) in entries {
            let (key, value) = (key.as_ref(), value.as_ref());
            if !full_key.is_empty() {
                full_key.push('.');
            }
            full_key.push_str(key);
            if !value.is_empty() {
                full_key.push('_');
                full_key.push_str(value);
            }
            counter_key.push_str(key);
            counter_key.push('_');
            counter_key.push_str(value);
            counter_key.push('_');
        }
        let full_key = format!("{domain}.{full_key}");
        Some(Match {
            rule: Arc::new(Rule {
                domain: Arc::from(domain),
                name: None,
                unit: Some(unit),
                requests_per_unit,
                unlimited: false,
                shadow_mode: false,
                quota_mode: false,
                detailed_metric: false,
                replaces: Vec::new(),
                full_key: full_key.clone(),
                file: Arc::from("the request"),
                line: None,
                path: "descriptor.limit".to_owned(),
            }),
            counter_key,
            stats_key: full_key,
        })
    }

    /// The rules for all descriptors of one request, each with the limit it may carry: the
    /// carried limit when there is one ([`RlsConfig::override_limit`]), else the configured
    /// rule ([`RlsConfig::get_limit`]); then `replaces` as in [`RlsConfig::get_limits`].
    pub fn resolve<K: AsRef<str>, V: AsRef<str>>(
        &self,
        domain: &str,
        descriptors: &[Asked<'_, K, V>],
    ) -> Vec<Option<Match>> {
        let mut matches: Vec<Option<Match>> = descriptors
            .iter()
            .map(|(entries, limit)| match limit {
                Some((rpu, unit)) => self.override_limit(domain, entries, *rpu, *unit),
                None => self.get_limit(domain, entries),
            })
            .collect();
        matcher::apply_replaces(&mut matches);
        matches
    }

    /// Whether `domain` is configured.
    pub fn has_domain(&self, domain: &str) -> bool {
        self.domains.contains_key(domain)
    }

    /// The configured domain named `domain`, as a shared string for metric labels: labels
    /// come from the configuration, never from what a client sends.
    pub fn domain_label(&self, domain: &str) -> Option<&Arc<str>> {
        self.domains.get(domain).map(|d| &d.label)
    }
}

/// Whether a directory entry is one of those kubelet adds to a ConfigMap or Secret mount:
/// `..data` (a symbolic link to the current version) and `..2026_11_25_10_00_00.123456789`
/// (the version itself). The files a mount shows are symbolic links at its top level
/// (`edge.yaml -> ..data/edge.yaml`), which are read; reading the versions too would read every
/// file twice. No rule file is named `..something`, so these are skipped whatever
/// `ignore_dot_files` says.
pub fn is_kubelet_entry(name: &std::ffi::OsStr) -> bool {
    name.as_encoded_bytes().starts_with(b"..")
}

/// Collects the regular files below `root.join(relative)` (relative paths), as
/// `filepath.Walk` visits them in the reference's loader.
fn collect_files(
    root: &Path,
    relative: &Path,
    options: &LoadOptions,
    found: &mut Vec<PathBuf>,
    warnings: &mut Vec<RlsConfigWarning>,
) -> std::io::Result<()> {
    let dir = root.join(relative);
    for entry in std::fs::read_dir(&dir)? {
        let entry = entry?;
        let name = entry.file_name();
        if is_kubelet_entry(&name)
            || options.ignore_dot_files && name.to_string_lossy().starts_with('.')
        {
            continue;
        }
        let child = relative.join(&name);
        let file_type = entry.file_type()?;
        if file_type.is_dir() {
            if let Err(err) = collect_files(root, &child, options, found, warnings) {
                warnings.push(RlsConfigWarning {
                    file: root.join(&child).display().to_string(),
                    line: None,
                    message: format!("skipped: cannot read the directory: {err}"),
                });
            }
        } else if file_type.is_symlink() && entry.path().is_dir() {
            warnings.push(RlsConfigWarning {
                file: root.join(&child).display().to_string(),
                line: None,
                message: "skipped: a symbolic link to a directory is not followed, as in the \
                          reference service"
                    .into(),
            });
        } else {
            found.push(child);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units() {
        assert_eq!(Unit::parse("minute"), Some(Unit::Minute));
        assert_eq!(Unit::parse("SECOND"), Some(Unit::Second));
        assert_eq!(Unit::parse("Week"), Some(Unit::Week));
        assert_eq!(Unit::parse("unknown"), None);
        assert_eq!(Unit::parse("fortnight"), None);
        assert_eq!(Unit::parse(""), None);
        assert_eq!(Unit::Day.millis(), 86_400_000);
        assert_eq!(Unit::Year.seconds(), 31_536_000);
        assert_eq!(Unit::Month.to_string(), "month");
    }
}
