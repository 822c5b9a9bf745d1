//! The descriptor tree of a domain and the lookup of a request descriptor in it.
//!
//! Building mirrors `loadConfig` and `rateLimitDescriptor.loadDescriptors` in the reference's
//! `src/config/config_impl.go`; the lookup mirrors `rateLimitConfigImpl.GetLimit` there, and
//! the counter key mirrors `CacheKeyGenerator.GenerateCacheKey` (`src/limiter/cache_key.go`).
//! Each level of the tree is a map from a *composite key*: `key` for a descriptor without a
//! value, `key_value` for one with a value. Keeping that representation (rather than a map of
//! keys to values) keeps the reference's corner cases too, such as `key: a_b` and
//! `key: a, value: b` being the same descriptor.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use super::config::{YamlDescriptor, YamlRoot};
use super::error::{RlsConfigError, RlsConfigWarning};
use super::{Match, Rule, Unit};

/// A domain: the root of its descriptor tree and where it was first defined.
#[derive(Debug)]
pub(super) struct Domain {
    root: DescriptorNode,
    file: String,
    line: Option<usize>,
    /// The domain's name, shared, for metric labels.
    pub(super) label: Arc<str>,
}

/// One descriptor of the configuration (`rateLimitDescriptor`).
#[derive(Debug)]
struct DescriptorNode {
    /// The nested descriptors, by composite key.
    children: HashMap<String, DescriptorNode>,
    /// The composite keys of the nested descriptors that contain `*`, in file order.
    wildcards: Vec<Wildcard>,
    /// The limit of this descriptor, if it has a `rate_limit` block.
    limit: Option<Arc<Rule>>,
    /// `value_to_metric: true` (only changes the metric key).
    value_to_metric: bool,
    /// `share_threshold: true` (all values matching the wildcard share one counter).
    share_threshold: bool,
    /// The composite key, kept when `share_threshold` is set.
    wildcard_pattern: Option<String>,
    /// Where the descriptor was written.
    origin: Origin,
}

/// Where a descriptor was written, for messages about duplicates.
#[derive(Debug, Clone)]
struct Origin {
    file: String,
    line: Option<usize>,
    path: String,
}

impl Origin {
    fn describe(&self) -> String {
        match self.line {
            Some(line) => format!("{}:{line} ({})", self.file, self.path),
            None => format!("{} ({})", self.file, self.path),
        }
    }
}

/// A composite key containing `*`, split on `*` once at load time.
#[derive(Debug)]
struct Wildcard {
    key: String,
    parts: Vec<String>,
}

impl DescriptorNode {
    fn new(origin: Origin) -> Self {
        Self {
            children: HashMap::new(),
            wildcards: Vec::new(),
            limit: None,
            value_to_metric: false,
            share_threshold: false,
            wildcard_pattern: None,
            origin,
        }
    }
}

/// Adds one decoded file to the domains (`loadConfig`).
pub(super) fn load_file(
    domains: &mut BTreeMap<String, Domain>,
    file: &str,
    root: YamlRoot,
    merge_domains: bool,
    warnings: &mut Vec<RlsConfigWarning>,
) -> Result<(), RlsConfigError> {
    if root.domain.is_empty() {
        return Err(RlsConfigError::new(
            file,
            root.domain_line,
            "domain: missing or empty; every configuration file must name its domain, as in \
             `domain: my_service`",
        ));
    }
    let loader = Loader {
        file,
        domain: &root.domain,
        warnings,
    };
    if let Some(existing) = domains.get_mut(&root.domain) {
        if !merge_domains {
            let first = match existing.line {
                Some(line) => format!("{}:{line}", existing.file),
                None => existing.file.clone(),
            };
            return Err(RlsConfigError::new(
                file,
                root.domain_line,
                format!(
                    "domain: \"{}\" is already defined in {first}; each domain must be defined \
                     in one file (or enable merging, the reference's MERGE_DOMAIN_CONFIG)",
                    root.domain
                ),
            ));
        }
        let prefix = format!("{}.", root.domain);
        return loader.load_descriptors(&mut existing.root, &prefix, root.descriptors);
    }
    let mut domain = Domain {
        root: DescriptorNode::new(Origin {
            file: file.to_owned(),
            line: root.domain_line,
            path: "domain".to_owned(),
        }),
        file: file.to_owned(),
        line: root.domain_line,
        label: Arc::from(root.domain.as_str()),
    };
    let prefix = format!("{}.", root.domain);
    loader.load_descriptors(&mut domain.root, &prefix, root.descriptors)?;
    domains.insert(root.domain, domain);
    Ok(())
}

struct Loader<'a> {
    file: &'a str,
    domain: &'a str,
    warnings: &'a mut Vec<RlsConfigWarning>,
}

impl Loader<'_> {
    fn error(&self, line: Option<usize>, message: String) -> RlsConfigError {
        RlsConfigError::new(self.file, line, message)
    }

    fn warn(&mut self, line: Option<usize>, message: String) {
        self.warnings.push(RlsConfigWarning {
            file: self.file.to_owned(),
            line,
            message,
        });
    }

    /// `loadDescriptors`: the checks of the reference, in its order, for each descriptor
    /// before its nested ones.
    fn load_descriptors(
        mut self,
        node: &mut DescriptorNode,
        parent_key: &str,
        descriptors: Vec<YamlDescriptor>,
    ) -> Result<(), RlsConfigError> {
        self.load_level(node, parent_key, descriptors)
    }

    fn load_level(
        &mut self,
        node: &mut DescriptorNode,
        parent_key: &str,
        descriptors: Vec<YamlDescriptor>,
    ) -> Result<(), RlsConfigError> {
        for descriptor in descriptors {
            let path = descriptor.path.clone();
            if descriptor.key.is_empty() {
                return Err(self.error(
                    descriptor.line,
                    format!("{path}: the descriptor has no `key` (or an empty one); every descriptor needs one"),
                ));
            }
            let composite = if descriptor.value.is_empty() {
                descriptor.key.clone()
            } else {
                format!("{}_{}", descriptor.key, descriptor.value)
            };
            let full_key = format!("{parent_key}{composite}");
            if let Some(existing) = node.children.get(&composite) {
                let what = if descriptor.value.is_empty() {
                    format!("key \"{}\" without a value", descriptor.key)
                } else {
                    format!(
                        "key \"{}\" with value \"{}\"",
                        descriptor.key, descriptor.value
                    )
                };
                return Err(self.error(
                    descriptor.line,
                    format!(
                        "{path}: duplicate descriptor: {what} (composite key `{composite}`) is \
                         already defined at {} at the same level",
                        existing.origin.describe()
                    ),
                ));
            }
            let limit = match &descriptor.rate_limit {
                Some(_) => Some(self.rule(&descriptor, &full_key)?),
                None => None,
            };
            if descriptor.share_threshold && !composite.contains('*') {
                return Err(self.error(
                    descriptor.line,
                    format!(
                        "{path}: `share_threshold: true` needs a wildcard value (one containing \
                         `*`), but this descriptor is `{composite}`"
                    ),
                ));
            }
            let mut child = DescriptorNode::new(Origin {
                file: self.file.to_owned(),
                line: descriptor.line,
                path: path.clone(),
            });
            child.limit = limit;
            child.value_to_metric = descriptor.value_to_metric;
            child.share_threshold = descriptor.share_threshold;
            if descriptor.share_threshold {
                child.wildcard_pattern = Some(composite.clone());
            }
            if composite.contains('*') {
                node.wildcards.push(Wildcard {
                    key: composite.clone(),
                    parts: composite.split('*').map(str::to_owned).collect(),
                });
            }
            self.load_level(&mut child, &format!("{full_key}."), descriptor.descriptors)?;
            node.children.insert(composite, child);
        }
        Ok(())
    }

    /// The rule of a descriptor with a `rate_limit` block, checked as the reference does.
    fn rule(
        &mut self,
        descriptor: &YamlDescriptor,
        full_key: &str,
    ) -> Result<Arc<Rule>, RlsConfigError> {
        let path = &descriptor.path;
        let Some(rl) = &descriptor.rate_limit else {
            return Err(self.error(descriptor.line, format!("{path}: no rate_limit")));
        };
        let unit = Unit::parse(&rl.unit);
        let expected = Unit::ALL.map(Unit::as_str).join(", ");
        if rl.unlimited {
            if let Some(unit) = unit {
                return Err(self.error(
                    rl.unit_line.or(rl.line),
                    format!(
                        "{path}.rate_limit: `unlimited: true` cannot be combined with \
                         `unit: {}`; an unlimited descriptor has no unit, so remove `unit` \
                         (and `requests_per_unit`)",
                        unit.as_str()
                    ),
                ));
            }
            if !rl.unit.is_empty() {
                self.warn(
                    rl.unit_line,
                    format!(
                        "{path}.rate_limit.unit: \"{}\" is ignored because the descriptor is \
                         `unlimited: true`",
                        rl.unit
                    ),
                );
            }
            if rl.requests_per_unit_line.is_some() {
                self.warn(
                    rl.requests_per_unit_line,
                    format!(
                        "{path}.rate_limit.requests_per_unit: ignored because the descriptor \
                         is `unlimited: true`"
                    ),
                );
            }
        } else if unit.is_none() {
            return Err(if rl.unit.is_empty() {
                self.error(
                    rl.line,
                    format!("{path}.rate_limit: `unit` is missing; expected one of {expected}"),
                )
            } else {
                self.error(
                    rl.unit_line.or(rl.line),
                    format!(
                        "{path}.rate_limit.unit: \"{}\" is not a unit; expected one of {expected}",
                        rl.unit
                    ),
                )
            });
        }
        for (i, (name, line)) in rl.replaces.iter().enumerate() {
            if name.is_empty() {
                return Err(self.error(
                    line.or(rl.line),
                    format!(
                        "{path}.rate_limit.replaces[{i}]: `name` is missing or empty; each entry \
                         names the rate limit this one replaces"
                    ),
                ));
            }
            if *name == rl.name {
                return Err(self.error(
                    line.or(rl.line),
                    format!(
                        "{path}.rate_limit.replaces[{i}]: a rate limit cannot replace itself \
                         (its own name is \"{name}\")"
                    ),
                ));
            }
        }
        Ok(Arc::new(Rule {
            domain: self.domain.to_owned(),
            name: (!rl.name.is_empty()).then(|| rl.name.clone()),
            unit: if rl.unlimited { None } else { unit },
            requests_per_unit: rl.requests_per_unit,
            unlimited: rl.unlimited,
            shadow_mode: descriptor.shadow_mode,
            quota_mode: descriptor.quota_mode,
            detailed_metric: descriptor.detailed_metric,
            replaces: rl.replaces.iter().map(|(name, _)| name.clone()).collect(),
            full_key: full_key.to_owned(),
            file: self.file.to_owned(),
            line: descriptor.line,
            path: path.clone(),
        }))
    }
}

/// `wildcardMatch` of the reference: each `*` matches any run of characters (possibly
/// empty); the first part must be a prefix, the last a suffix, the middle ones appear in
/// order between them.
fn wildcard_match(parts: &[String], value: &str) -> bool {
    let (Some(first), Some(last)) = (parts.first(), parts.last()) else {
        return false;
    };
    if parts.len() == 1 {
        return first == value;
    }
    if !value.starts_with(first.as_str()) || !value.ends_with(last.as_str()) {
        return false;
    }
    if value.len() < parts.iter().map(String::len).sum::<usize>() {
        return false;
    }
    let mut remaining = &value[first.len()..value.len() - last.len()];
    for part in &parts[1..parts.len() - 1] {
        match remaining.find(part.as_str()) {
            Some(at) => remaining = &remaining[at + part.len()..],
            None => return false,
        }
    }
    true
}

impl Domain {
    /// `GetLimit`: walks the tree one request entry per level. At each level the composite
    /// key `key_value` is looked up first, then the wildcard descriptors in file order (the
    /// first that matches wins), then the descriptor with the key alone. A limit applies only
    /// when it is found at the request's last entry; the walk stops early (and nothing
    /// applies) as soon as an entry matches nothing or matches a descriptor without nested
    /// descriptors while entries remain.
    pub(super) fn get_limit<K: AsRef<str>, V: AsRef<str>>(
        &self,
        domain: &str,
        entries: &[(K, V)],
    ) -> Option<Match> {
        let last = entries.len().checked_sub(1)?;
        let mut level = &self.root;
        let mut found: Option<&Arc<Rule>> = None;
        // The three metric keys of the reference, built as the walk goes.
        let mut detailed_key = domain.to_owned();
        let mut value_key = domain.to_owned();
        let mut shared: Vec<Option<String>> = vec![None; entries.len()];
        for (i, (key, value)) in entries.iter().enumerate() {
            let (key, value) = (key.as_ref(), value.as_ref());
            let composite = format!("{key}_{value}");
            detailed_key.push('.');
            detailed_key.push_str(&composite);
            let mut next = level.children.get(&composite);
            let mut wildcard: Option<&str> = None;
            if next.is_none()
                && let Some(w) = level
                    .wildcards
                    .iter()
                    .find(|w| wildcard_match(&w.parts, &composite))
            {
                next = level.children.get(&w.key);
                wildcard = Some(&w.key);
            }
            let matched_with_value = next.is_some();
            if next.is_none() {
                next = level.children.get(key);
            }
            let key_prefix = format!("{key}_");
            if let (Some(_), Some(node)) = (wildcard, next)
                && node.share_threshold
                && let Some(pattern) = &node.wildcard_pattern
            {
                shared[i] = Some(
                    pattern
                        .strip_prefix(&key_prefix)
                        .unwrap_or(pattern)
                        .to_owned(),
                );
            }
            value_key.push('.');
            value_key.push_str(key);
            if let Some(node) = next {
                let shown = match (wildcard, &shared[i]) {
                    (Some(_), Some(pattern)) => pattern.as_str(),
                    (Some(_), None) if node.value_to_metric => value,
                    (Some(w), None) => w.strip_prefix(&key_prefix).unwrap_or(w),
                    (None, _) if matched_with_value || node.value_to_metric => value,
                    (None, _) => "",
                };
                if !shown.is_empty() {
                    value_key.push('_');
                    value_key.push_str(shown);
                }
                if i == last {
                    found = node.limit.as_ref();
                }
            }
            match next {
                Some(node) if !node.children.is_empty() => level = node,
                _ => break,
            }
        }
        let rule = Arc::clone(found?);
        let any_shared = shared.iter().any(Option::is_some);
        let stats_key = if !rule.detailed_metric {
            value_key
        } else if any_shared {
            let mut key = domain.to_owned();
            for ((k, v), pattern) in entries.iter().zip(&shared) {
                key.push('.');
                key.push_str(k.as_ref());
                let shown = pattern.as_deref().unwrap_or(v.as_ref());
                if !shown.is_empty() {
                    key.push('_');
                    key.push_str(shown);
                }
            }
            key
        } else {
            detailed_key
        };
        let mut counter_key = format!("{domain}_");
        for ((k, v), pattern) in entries.iter().zip(&shared) {
            counter_key.push_str(k.as_ref());
            counter_key.push('_');
            counter_key.push_str(pattern.as_deref().unwrap_or(v.as_ref()));
            counter_key.push('_');
        }
        Some(Match {
            rule,
            counter_key,
            stats_key,
        })
    }
}

/// Applies `replaces` to the matches of one request's descriptors, as the reference's
/// `constructLimitsToCheck` (`src/service/ratelimit.go`) does: every matched rule's
/// `replaces` names are collected (unlimited rules' included), then every matched rule that
/// is not unlimited and whose `name` is among them is dropped.
pub(super) fn apply_replaces(matches: &mut [Option<Match>]) {
    let replaced: HashSet<String> = matches
        .iter()
        .flatten()
        .flat_map(|m| m.rule.replaces.iter().cloned())
        .collect();
    if replaced.is_empty() {
        return;
    }
    for slot in matches.iter_mut() {
        let drop = slot.as_ref().is_some_and(|m| {
            !m.rule.unlimited && m.rule.name.as_ref().is_some_and(|n| replaced.contains(n))
        });
        if drop {
            *slot = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(pattern: &str) -> Vec<String> {
        pattern.split('*').map(str::to_owned).collect()
    }

    #[test]
    fn wildcard_matching_mirrors_the_reference() {
        let cases = [
            ("wild_foo*", "wild_foo1", true),
            ("wild_foo*", "wild_foo", true),
            ("wild_foo*", "wild_fo", false),
            ("wild_foo*", "wild_bar", false),
            ("midWild_bar*b", "midWild_barab", true),
            ("midWild_bar*b", "midWild_bar", false),
            ("midWild_bar*b", "midWild_barb", true),
            ("m_svc*ep*rpc", "m_svc1ep2rpc", true),
            ("m_svc*ep*rpc", "m_svcrpc", false),
            ("m_a*a", "m_a", false),
            ("k_*", "k_", true),
            ("exact", "exact", true),
        ];
        for (pattern, value, want) in cases {
            assert_eq!(
                wildcard_match(&parts(pattern), value),
                want,
                "{pattern} ~ {value}"
            );
        }
    }
}
