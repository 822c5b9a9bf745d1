//! The lookup of a request descriptor in a domain's tree ([`tree`](super::tree)).
//!
//! The lookup mirrors `rateLimitConfigImpl.GetLimit` in the reference's
//! `src/config/config_impl.go`, and the counter key mirrors
//! `CacheKeyGenerator.GenerateCacheKey` (`src/limiter/cache_key.go`).

use std::collections::HashSet;
use std::sync::Arc;

use crate::rule::{Match, Rule};
use crate::tree::{DescriptorNode, Domain};
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
        let mut detailed_key = String::with_capacity(domain.len() + 64);
        detailed_key.push_str(domain);
        let mut value_key = detailed_key.clone();
        let mut shared: Vec<Option<String>> = vec![None; entries.len()];
        // `key_value`, one buffer for every level.
        let mut composite = String::with_capacity(64);
        for (i, (key, value)) in entries.iter().enumerate() {
            let (key, value) = (key.as_ref(), value.as_ref());
            composite.clear();
            composite.push_str(key);
            composite.push('_');
            composite.push_str(value);
            detailed_key.push('.');
            detailed_key.push_str(&composite);
            let (next, wildcard, matched_with_value) = descend(level, key, &composite);
            if let (Some(_), Some(node)) = (wildcard, next)
                && node.share_threshold
                && let Some(pattern) = &node.wildcard_pattern
            {
                shared[i] = Some(without_key(pattern, key).to_owned());
            }
            value_key.push('.');
            value_key.push_str(key);
            if let Some(node) = next {
                let shown = match (wildcard, &shared[i]) {
                    (Some(_), Some(pattern)) => pattern.as_str(),
                    (Some(_), None) if node.value_to_metric => value,
                    (Some(w), None) => without_key(w, key),
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
            shared_stats_key(domain, entries, &shared)
        } else {
            detailed_key
        };
        Some(Match {
            rule,
            counter_key: counter_key(domain, entries, &shared),
            stats_key,
        })
    }
}

/// `pattern` without its leading `key_` (as it is, if it does not start so).
fn without_key<'a>(pattern: &'a str, key: &str) -> &'a str {
    pattern
        .strip_prefix(key)
        .and_then(|rest| rest.strip_prefix('_'))
        .unwrap_or(pattern)
}

/// One level down: the node for `key_value`, else the first wildcard descriptor that matches
/// it (and its composite key), else the node for the key alone; and whether the value
/// matched.
fn descend<'a>(
    level: &'a DescriptorNode,
    key: &str,
    composite: &str,
) -> (Option<&'a DescriptorNode>, Option<&'a str>, bool) {
    let mut next = level.children.get(composite);
    let mut wildcard: Option<&str> = None;
    if next.is_none()
        && let Some(w) = level
            .wildcards
            .iter()
            .find(|w| wildcard_match(&w.parts, composite))
    {
        next = level.children.get(&w.key);
        wildcard = Some(&w.key);
    }
    let matched_with_value = next.is_some();
    if next.is_none() {
        next = level.children.get(key);
    }
    (next, wildcard, matched_with_value)
}

/// The detailed statistics key when a wildcard shares its threshold: the pattern stands for
/// the values it matched.
fn shared_stats_key<K: AsRef<str>, V: AsRef<str>>(
    domain: &str,
    entries: &[(K, V)],
    shared: &[Option<String>],
) -> String {
    let mut key = domain.to_owned();
    for ((k, v), pattern) in entries.iter().zip(shared) {
        key.push('.');
        key.push_str(k.as_ref());
        let shown = pattern.as_deref().unwrap_or(v.as_ref());
        if !shown.is_empty() {
            key.push('_');
            key.push_str(shown);
        }
    }
    key
}

/// The counter's key: `domain_key_value_…_`, a shared wildcard's pattern for its values.
fn counter_key<K: AsRef<str>, V: AsRef<str>>(
    domain: &str,
    entries: &[(K, V)],
    shared: &[Option<String>],
) -> String {
    let mut counter_key = String::with_capacity(domain.len() + 64);
    counter_key.push_str(domain);
    counter_key.push('_');
    for ((k, v), pattern) in entries.iter().zip(shared) {
        counter_key.push_str(k.as_ref());
        counter_key.push('_');
        counter_key.push_str(pattern.as_deref().unwrap_or(v.as_ref()));
        counter_key.push('_');
    }
    counter_key
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
