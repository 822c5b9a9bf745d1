//! The descriptor tree of a domain, built from decoded files.
//!
//! Building mirrors `loadConfig` and `rateLimitDescriptor.loadDescriptors` in the reference's
//! `src/config/config_impl.go`. Each level of the tree is a map from a *composite key*: `key`
//! for a descriptor without a value, `key_value` for one with a value. Keeping that
//! representation (rather than a map of keys to values) keeps the reference's corner cases
//! too, such as `key: a_b` and `key: a, value: b` being the same descriptor. The lookup in a
//! built tree is in [`matcher`](super::matcher).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use crate::decode::{YamlDescriptor, YamlRateLimit, YamlRoot};
use crate::error::{RlsConfigError, RlsConfigWarning, located};
use crate::rule::Rule;
use crate::unit::Unit;

/// A domain: the root of its descriptor tree and where it was first defined.
#[derive(Debug)]
pub(super) struct Domain {
    pub(super) root: DescriptorNode,
    file: String,
    line: Option<usize>,
    /// The domain's name, shared, for metric labels.
    pub(super) label: Arc<str>,
}

/// One descriptor of the configuration (`rateLimitDescriptor`).
#[derive(Debug)]
pub(super) struct DescriptorNode {
    /// The nested descriptors, by composite key (looked up by every request's entries, never
    /// grown by them, so a fast hash is safe).
    pub(super) children: HashMap<String, DescriptorNode, foldhash::fast::RandomState>,
    /// The composite keys of the nested descriptors that contain `*`, in file order.
    pub(super) wildcards: Vec<Wildcard>,
    /// The limit of this descriptor, if it has a `rate_limit` block.
    pub(super) limit: Option<Arc<Rule>>,
    /// `value_to_metric: true` (only changes the metric key).
    pub(super) value_to_metric: bool,
    /// `share_threshold: true` (all values matching the wildcard share one counter).
    pub(super) share_threshold: bool,
    /// The composite key, kept when `share_threshold` is set.
    pub(super) wildcard_pattern: Option<String>,
    /// Where the descriptor was written.
    origin: Origin,
}

/// Where a descriptor was written, for messages about duplicates.
#[derive(Debug, Clone)]
struct Origin {
    file: Arc<str>,
    line: Option<usize>,
    path: String,
}

impl Origin {
    fn describe(&self) -> String {
        format!("{} ({})", located(&self.file, self.line), self.path)
    }
}

/// A composite key containing `*`, split on `*` once at load time.
#[derive(Debug)]
pub(super) struct Wildcard {
    pub(super) key: String,
    pub(super) parts: Vec<String>,
}

impl DescriptorNode {
    fn new(origin: Origin) -> Self {
        Self {
            children: HashMap::default(),
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
    // Every node and rule of the file shares these two.
    let label: Arc<str> = match domains.get(&root.domain) {
        Some(existing) => existing.label.clone(),
        None => Arc::from(root.domain.as_str()),
    };
    let mut loader = Loader {
        file: Arc::from(file),
        domain: label.clone(),
        warnings,
    };
    let prefix = format!("{}.", root.domain);
    if let Some(existing) = domains.get_mut(&root.domain) {
        if !merge_domains {
            let first = located(&existing.file, existing.line);
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
        return loader.load_level(&mut existing.root, &prefix, root.descriptors);
    }
    let mut domain = Domain {
        root: DescriptorNode::new(Origin {
            file: loader.file.clone(),
            line: root.domain_line,
            path: "domain".to_owned(),
        }),
        file: file.to_owned(),
        line: root.domain_line,
        label,
    };
    loader.load_level(&mut domain.root, &prefix, root.descriptors)?;
    domains.insert(root.domain, domain);
    Ok(())
}

struct Loader<'a> {
    file: Arc<str>,
    domain: Arc<str>,
    warnings: &'a mut Vec<RlsConfigWarning>,
}

impl Loader<'_> {
    fn error(&self, line: Option<usize>, message: String) -> RlsConfigError {
        RlsConfigError::new(&self.file, line, message)
    }

    fn warn(&mut self, line: Option<usize>, message: String) {
        self.warnings.push(RlsConfigWarning {
            file: self.file.to_string(),
            line,
            message,
        });
    }

    /// `loadDescriptors`: the checks of the reference, in its order, for each descriptor
    /// before its nested ones.
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
                file: self.file.clone(),
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
        let unit = self.unit(path, rl)?;
        self.check_replaces(path, rl)?;
        Ok(Arc::new(Rule {
            domain: self.domain.clone(),
            name: (!rl.name.is_empty()).then(|| rl.name.clone()),
            unit: if rl.unlimited { None } else { unit },
            requests_per_unit: rl.requests_per_unit,
            unlimited: rl.unlimited,
            shadow_mode: descriptor.shadow_mode,
            quota_mode: descriptor.quota_mode,
            detailed_metric: descriptor.detailed_metric,
            replaces: rl.replaces.iter().map(|(name, _)| name.clone()).collect(),
            full_key: full_key.to_owned(),
            file: self.file.clone(),
            line: descriptor.line,
            path: path.clone(),
        }))
    }

    /// The unit of a limit: none for an unlimited one (a unit given with it is refused, a
    /// stray one warned about), one of [`Unit::ALL`] otherwise.
    fn unit(&mut self, path: &str, rl: &YamlRateLimit) -> Result<Option<Unit>, RlsConfigError> {
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
        Ok(unit)
    }

    /// Each `replaces` entry names another rate limit.
    fn check_replaces(&self, path: &str, rl: &YamlRateLimit) -> Result<(), RlsConfigError> {
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
        Ok(())
    }
}
