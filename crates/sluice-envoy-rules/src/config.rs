//! A loaded configuration: the rule files of a directory (or given as text) read, checked and
//! built into one descriptor tree per domain, and the lookups over it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::error::{RlsConfigError, RlsConfigWarning};
use crate::rule::{Match, Rule};
use crate::unit::Unit;
use crate::{decode, matcher, tree};

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
    pub(crate) domains: BTreeMap<String, tree::Domain>,
    pub(crate) warnings: Vec<RlsConfigWarning>,
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
            match std::fs::read_to_string(&path) {
                Ok(text) => files.push((name, text)),
                // What `read_to_string` answers for a file that is not UTF-8.
                Err(err) if err.kind() == std::io::ErrorKind::InvalidData => {
                    return Err(RlsConfigError::new(
                        &name,
                        None,
                        "the file is not UTF-8 text; every file under the configuration \
                         directory is read as a YAML configuration",
                    ));
                }
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
