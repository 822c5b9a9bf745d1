//! Decision counts per Envoy rule, for `GET /v1/stats`: each rule once, under its domain and
//! its statistics key without `detailed_metric` (the reference's `FullKey`), with its detailed
//! keys (`detailed_metric: true`) counted beside it, each with its descriptor entries.
//!
//! Memory is bounded whatever the traffic: at most [`MAX_RULES`] rules (only request-carried
//! limits make rules from request values) and [`MAX_DETAILED_KEYS`] detailed keys in all;
//! past that a new key's checks count in its rule only, and the rule says it is capped.
//!
//! On the decision path a count takes the registry's read lock (one lookup) and adds to two
//! counters; the write lock is taken only the first time a rule or key is seen. This replaces
//! the per-name counts ([`super::stats::DecisionCounts`]) for Envoy rules: no lock is added.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use super::stats::{Counters, Counts, Outcome};

/// Rules counted at most.
pub(crate) const MAX_RULES: usize = 4_096;
/// Detailed keys counted at most, all rules together.
pub(crate) const MAX_DETAILED_KEYS: usize = 10_000;

/// One rule: where it is, the descriptor keys it matches, and its checks.
#[derive(Debug)]
struct Group {
    domain: Arc<str>,
    /// The statistics key without the domain.
    rule: Arc<str>,
    /// The descriptor keys, one per level (to read counter keys back into entries).
    keys: Box<[String]>,
    counts: Counters,
    detailed: AtomicU64,
    capped: AtomicBool,
}

/// One detailed key of a rule.
#[derive(Debug)]
struct Detailed {
    group: Arc<Group>,
    entries: Box<[Entry]>,
    counts: Counters,
}

#[derive(Debug, Default)]
struct Registry {
    /// By the rule's full key (`domain.rule`).
    rules: HashMap<Arc<str>, Arc<Group>>,
    /// By the detailed statistics key.
    detailed: HashMap<Arc<str>, Arc<Detailed>>,
}

/// What one rule reads as.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub(crate) struct RuleReading {
    /// The domain.
    pub domain: String,
    /// The statistics key without the domain.
    pub rule: String,
    /// Every check of the rule, detailed keys included.
    pub counts: Counts,
    /// Detailed keys counted.
    pub keys_total: u64,
    /// Whether a detailed key was refused for want of room.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub keys_capped: bool,
    /// The heaviest detailed keys by checks.
    pub keys: Vec<KeyReading>,
}

/// What one detailed key reads as.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub(crate) struct KeyReading {
    /// The descriptor's entries.
    pub entries: Vec<Entry>,
    /// Its checks.
    pub counts: Counts,
}

/// A descriptor entry.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
pub(crate) struct Entry {
    /// The entry's key.
    pub key: String,
    /// Its value.
    pub value: String,
}

fn total(c: &Counts) -> u64 {
    c.allowed
        .saturating_add(c.denied)
        .saturating_add(c.degraded)
        .saturating_add(c.errors)
}

/// Checks per Envoy rule and detailed key.
#[derive(Debug, Default)]
pub(crate) struct RuleCounts {
    registry: RwLock<Registry>,
}

/// What a count needs to know of a match.
pub(crate) struct Counted<'a> {
    /// The rule's domain.
    pub domain: &'a str,
    /// The rule's full key (`domain.rule`).
    pub full_key: &'a str,
    /// The detailed statistics key, when the rule has `detailed_metric`.
    pub detailed: Option<&'a str>,
    /// The request descriptor's entries, made only the first time a rule or key is seen (no
    /// allocation on the decision path otherwise).
    pub entries: &'a dyn Fn() -> Vec<(String, String)>,
}

impl RuleCounts {
    /// Counts one check of a rule (and of its detailed key).
    pub(crate) fn count(&self, m: &Counted<'_>, outcome: Outcome) {
        {
            let read = self.registry.read().unwrap_or_else(|p| p.into_inner());
            match m.detailed {
                Some(label) => {
                    if let Some(d) = read.detailed.get(label) {
                        d.group.counts.add(outcome);
                        d.counts.add(outcome);
                        return;
                    }
                }
                None => {
                    if let Some(g) = read.rules.get(m.full_key) {
                        g.counts.add(outcome);
                        return;
                    }
                }
            }
        }
        let mut write = self.registry.write().unwrap_or_else(|p| p.into_inner());
        let group = match write.rules.get(m.full_key) {
            Some(g) => g.clone(),
            None if write.rules.len() >= MAX_RULES => return,
            None => {
                let rule = m
                    .full_key
                    .strip_prefix(m.domain)
                    .and_then(|r| r.strip_prefix('.'))
                    .unwrap_or(m.full_key);
                let g = Arc::new(Group {
                    domain: Arc::from(m.domain),
                    rule: Arc::from(rule),
                    keys: (m.entries)().into_iter().map(|(k, _)| k).collect(),
                    counts: Counters::default(),
                    detailed: AtomicU64::new(0),
                    capped: AtomicBool::new(false),
                });
                write.rules.insert(Arc::from(m.full_key), g.clone());
                g
            }
        };
        group.counts.add(outcome);
        let Some(label) = m.detailed else {
            return;
        };
        if let Some(d) = write.detailed.get(label) {
            d.counts.add(outcome);
            return;
        }
        if write.detailed.len() >= MAX_DETAILED_KEYS {
            group.capped.store(true, Ordering::Relaxed);
            return;
        }
        let d = Arc::new(Detailed {
            group: group.clone(),
            entries: (m.entries)()
                .into_iter()
                .map(|(key, value)| Entry { key, value })
                .collect(),
            counts: Counters::default(),
        });
        d.counts.add(outcome);
        group.detailed.fetch_add(1, Ordering::Relaxed);
        write.detailed.insert(Arc::from(label), d);
    }

    /// Every rule, by domain and rule, with at most `keys` detailed keys each (the heaviest
    /// by checks; ties by entries).
    pub(crate) fn read(&self, keys: usize) -> Vec<RuleReading> {
        let read = self.registry.read().unwrap_or_else(|p| p.into_inner());
        let mut by_rule: HashMap<*const Group, Vec<KeyReading>> = HashMap::new();
        if keys > 0 {
            for d in read.detailed.values() {
                by_rule
                    .entry(Arc::as_ptr(&d.group))
                    .or_default()
                    .push(KeyReading {
                        entries: d.entries.to_vec(),
                        counts: d.counts.read(),
                    });
            }
        }
        let mut out: Vec<RuleReading> = read
            .rules
            .values()
            .map(|g| {
                let mut listed = by_rule.remove(&Arc::as_ptr(g)).unwrap_or_default();
                listed.sort_by(|a, b| {
                    total(&b.counts)
                        .cmp(&total(&a.counts))
                        .then_with(|| a.entries.cmp(&b.entries))
                });
                listed.truncate(keys);
                RuleReading {
                    domain: g.domain.to_string(),
                    rule: g.rule.to_string(),
                    counts: g.counts.read(),
                    keys_total: g.detailed.load(Ordering::Relaxed),
                    keys_capped: g.capped.load(Ordering::Relaxed),
                    keys: listed,
                }
            })
            .collect();
        out.sort_by(|a, b| (&a.domain, &a.rule).cmp(&(&b.domain, &b.rule)));
        out
    }

    /// Every rule's counts, by `domain/rule` (for the history).
    pub(crate) fn totals(&self) -> Vec<(String, Counts)> {
        let read = self.registry.read().unwrap_or_else(|p| p.into_inner());
        read.rules
            .values()
            .map(|g| (format!("{}/{}", g.domain, g.rule), g.counts.read()))
            .collect()
    }

    /// The descriptor entries a counter key of the rule `full_key` was made of
    /// (`domain_k1_v1_k2_v2_`), read back with the rule's keys; `None` for a rule not seen or
    /// a key that does not read. A value that holds `_<next key>_` is split at its first
    /// occurrence.
    pub(crate) fn entries_of(&self, full_key: &str, counter_key: &str) -> Option<Vec<Entry>> {
        let group = {
            let read = self.registry.read().unwrap_or_else(|p| p.into_inner());
            read.rules.get(full_key)?.clone()
        };
        let mut rest = counter_key
            .strip_prefix(&*group.domain)?
            .strip_prefix('_')?;
        let mut entries = Vec::with_capacity(group.keys.len());
        for (i, key) in group.keys.iter().enumerate() {
            rest = rest.strip_prefix(key.as_str())?.strip_prefix('_')?;
            let end = match group.keys.get(i + 1) {
                Some(next) => rest.find(&format!("_{next}_"))?,
                None => rest.strip_suffix('_')?.len(),
            };
            entries.push(Entry {
                key: key.clone(),
                value: rest[..end].to_owned(),
            });
            rest = &rest[end + 1..];
        }
        rest.is_empty().then_some(entries)
    }

    /// Whether the rule `full_key` has been seen.
    pub(crate) fn tracks(&self, full_key: &str) -> bool {
        let read = self.registry.read().unwrap_or_else(|p| p.into_inner());
        read.rules.contains_key(full_key)
    }

    /// Forgets the rules (and their keys) of every domain not in `keep` (after a reload).
    pub(crate) fn retain_domains(&self, keep: impl Fn(&str) -> bool) {
        let mut write = self.registry.write().unwrap_or_else(|p| p.into_inner());
        write.rules.retain(|_, g| keep(&g.domain));
        write.detailed.retain(|_, d| keep(&d.group.domain));
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn owned(entries: &[(&str, &str)]) -> Vec<(String, String)> {
        entries
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn counted<'a>(
        full_key: &'a str,
        detailed: Option<&'a str>,
        entries: &'a dyn Fn() -> Vec<(String, String)>,
    ) -> Counted<'a> {
        Counted {
            domain: "edge",
            full_key,
            detailed,
            entries,
        }
    }

    #[test]
    fn detailed_keys_count_in_their_rule_and_are_listed_heaviest_first() {
        let r = RuleCounts::default();
        for i in 0..5u32 {
            let value = format!("10.0.0.{i}");
            let label = format!("edge.remote_address_{value}");
            let entries = || owned(&[("remote_address", value.as_str())]);
            for _ in 0..=i {
                r.count(
                    &counted("edge.remote_address", Some(&label), &entries),
                    Outcome::Allowed,
                );
            }
        }
        r.count(
            &counted("edge.path", None, &|| owned(&[("path", "/a")])),
            Outcome::Denied,
        );
        let read = r.read(2);
        assert_eq!(read.len(), 2);
        assert_eq!((read[0].rule.as_str(), read[0].keys_total), ("path", 0));
        assert_eq!(read[0].counts.denied, 1);
        let rule = &read[1];
        assert_eq!((rule.rule.as_str(), rule.keys_total), ("remote_address", 5));
        assert_eq!(rule.counts.allowed, 15);
        assert_eq!(rule.keys.len(), 2);
        assert_eq!(rule.keys[0].entries[0].value, "10.0.0.4");
        assert_eq!(rule.keys[0].counts.allowed, 5);
        assert_eq!(rule.keys[1].entries[0].value, "10.0.0.3");
        assert!(r.read(0)[1].keys.is_empty());
    }

    #[test]
    fn detailed_keys_are_bounded_and_the_rule_says_so() {
        let r = RuleCounts::default();
        for i in 0..(MAX_DETAILED_KEYS + 10) {
            let value = i.to_string();
            let label = format!("edge.k_{value}");
            r.count(
                &counted("edge.k", Some(&label), &|| owned(&[("k", value.as_str())])),
                Outcome::Allowed,
            );
        }
        let read = r.read(100);
        assert_eq!(read[0].keys_total, MAX_DETAILED_KEYS as u64);
        assert!(read[0].keys_capped);
        assert_eq!(read[0].counts.allowed, MAX_DETAILED_KEYS as u64 + 10);
        assert_eq!(read[0].keys.len(), 100);
    }

    #[test]
    fn counter_keys_read_back_into_entries() {
        let r = RuleCounts::default();
        let entries = || owned(&[("generic_key", "a_b"), ("path", "/x_y")]);
        r.count(
            &counted("edge.generic_key_a_b.path", None, &entries),
            Outcome::Allowed,
        );
        let e = r
            .entries_of(
                "edge.generic_key_a_b.path",
                "edge_generic_key_a_b_path_/x_y_",
            )
            .unwrap();
        assert_eq!(
            e.iter()
                .map(|e| (e.key.as_str(), e.value.as_str()))
                .collect::<Vec<_>>(),
            [("generic_key", "a_b"), ("path", "/x_y")]
        );
        assert!(
            r.entries_of("edge.generic_key_a_b.path", "other_")
                .is_none()
        );
        assert!(r.entries_of("edge.nope", "edge_").is_none());
    }

    #[test]
    fn a_reload_forgets_the_rules_of_removed_domains() {
        let r = RuleCounts::default();
        r.count(
            &counted("edge.k", Some("edge.k_1"), &|| owned(&[("k", "1")])),
            Outcome::Allowed,
        );
        r.retain_domains(|d| d == "other");
        assert!(r.read(10).is_empty());
        assert!(!r.tracks("edge.k"));
    }
}
