//! The `rlqs:` section of the configuration: which Sluice policy counts a bucket, under which
//! store key, and what Envoy is told between reports.
//!
//! A bucket (Envoy's `BucketId`, a map of strings) goes to the first rule whose `domain` (when
//! set) is the stream's and whose `match` entries it all carries: `value` must be equal, `"*"`
//! only present. The rule names a policy of `policies:` and a key template over the bucket's
//! entries (`tenant:{tenant}`); without one the key is the canonical form of the whole bucket,
//! its entries sorted by name and joined as `k=v,k=v` ([`canonical`]), so that `{a: 1, b: 2}`
//! and `{b: 2, a: 1}` are one key, as the protocol says they are one bucket. The domain is not
//! part of a key: rules with a `domain` keep domains apart.
//!
//! Everything is checked while the file is read (the policy exists, the template only names
//! matched entries, Envoy's whole-second durations), so a running server never meets a rule it
//! cannot apply.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use serde::Deserialize;

use sluice_spec::policy_entry::FieldError;
use sluice_spec::units::PositiveDuration;

/// The most entries of a bucket id.
pub const MAX_BUCKET_ENTRIES: usize = 32;
/// The most bytes of one name or value of a bucket id.
pub const MAX_ENTRY_LEN: usize = 256;

/// What a bucket no rule matches is assigned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Unmatched {
    /// `ALLOW_ALL`: no limit applies, as Envoy's rate limit service answers `OK` for a
    /// descriptor no rule matches.
    #[default]
    AllowAll,
    /// `DENY_ALL`: only configured buckets pass.
    DenyAll,
}

/// One entry of a rule's `match`.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Want {
    /// The entry must be present, any value (`"*"`).
    Present,
    /// The entry must have this value.
    Equal(String),
}

/// One piece of a key template.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Piece {
    Text(String),
    Entry(String),
}

/// A validated bucket rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BucketRule {
    /// The rule's name (`name`, else `buckets[i]`): metrics and logs use it, and a bucket
    /// whose rule changes name on a reload is abandoned.
    pub name: String,
    /// The stream's domain must be this one, when set.
    pub domain: Option<String>,
    matches: Vec<(String, Want)>,
    /// The policy (in `policies:`) that counts the bucket.
    pub policy: String,
    template: Option<Vec<Piece>>,
}

impl BucketRule {
    fn matches(&self, domain: &str, bucket: &HashMap<String, String>) -> bool {
        if self.domain.as_deref().is_some_and(|d| d != domain) {
            return false;
        }
        self.matches
            .iter()
            .all(|(k, want)| match (bucket.get(k), want) {
                (None, _) => false,
                (Some(_), Want::Present) => true,
                (Some(v), Want::Equal(x)) => v == x,
            })
    }

    /// The store key of `bucket` under this rule.
    pub fn key(&self, bucket: &HashMap<String, String>) -> String {
        let Some(pieces) = &self.template else {
            return canonical(bucket);
        };
        let mut key = String::new();
        for piece in pieces {
            match piece {
                Piece::Text(t) => key.push_str(t),
                // Validation made every named entry part of `match`, so it is present.
                Piece::Entry(name) => key.push_str(bucket.get(name).map_or("", String::as_str)),
            }
        }
        key
    }
}

/// The canonical text of a bucket id: entries sorted by name, `k=v` joined by `,`, with `\`,
/// `,` and `=` inside names and values escaped by a `\`, so that two bucket ids never share
/// a text (`{a: "1,b=2"}` is `a=1\,b\=2`, not `{a: 1, b: 2}`'s `a=1,b=2`).
pub fn canonical(bucket: &HashMap<String, String>) -> String {
    fn push_escaped(out: &mut String, text: &str) {
        for c in text.chars() {
            if matches!(c, '\\' | ',' | '=') {
                out.push('\\');
            }
            out.push(c);
        }
    }
    let sorted: BTreeMap<&str, &str> = bucket
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let mut out = String::new();
    for (i, (k, v)) in sorted.into_iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        push_escaped(&mut out, k);
        out.push('=');
        push_escaped(&mut out, v);
    }
    out
}

/// The whole, valid `rlqs:` section.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RlqsConfig {
    /// How often Envoy is expected to report until a stream shows its own cadence: each
    /// assignment is a token bucket refilling the client's share once per report.
    pub reporting_interval: Duration,
    /// How long an assignment lasts without a new one (`assignment_time_to_live`).
    pub assignment_ttl: Duration,
    /// A bucket reported with no requests for this long is abandoned.
    pub abandon_after: Duration,
    /// What buckets no rule matches get.
    pub unmatched: Unmatched,
    /// The rules, first match wins.
    pub buckets: Vec<BucketRule>,
}

/// The default `rlqs.reporting_interval`.
pub const DEFAULT_REPORTING_INTERVAL: Duration = Duration::from_secs(5);
/// The default `rlqs.abandon_after`.
pub const DEFAULT_ABANDON_AFTER: Duration = Duration::from_secs(300);

impl RlqsConfig {
    /// The first rule that matches `bucket` in `domain`.
    pub fn rule_for(&self, domain: &str, bucket: &HashMap<String, String>) -> Option<&BucketRule> {
        self.buckets.iter().find(|r| r.matches(domain, bucket))
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRule {
    name: Option<String>,
    domain: Option<String>,
    #[serde(default, rename = "match")]
    matches: BTreeMap<String, String>,
    policy: String,
    key: Option<String>,
}

/// `rlqs:` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRlqs {
    reporting_interval: Option<PositiveDuration>,
    assignment_ttl: Option<PositiveDuration>,
    abandon_after: Option<PositiveDuration>,
    #[serde(default)]
    unmatched: Unmatched,
    #[serde(default)]
    buckets: Vec<RawRule>,
}

/// `1m`, `250ms`: a duration as the configuration writes it.
fn text(d: Duration) -> String {
    sluice::core::duration_text(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Envoy reads these durations in whole seconds (`fill_interval`, `assignment_time_to_live`).
fn whole_seconds(field: &str, d: Duration) -> Result<Duration, FieldError> {
    if d.subsec_nanos() != 0 {
        return Err(FieldError::new(
            format!("rlqs.{field}"),
            format!(
                "{} is not a whole number of seconds; Envoy reads this duration in whole seconds",
                text(d)
            ),
        ));
    }
    Ok(d)
}

fn parse_template(
    field: &str,
    text: &str,
    matched: &BTreeMap<String, String>,
) -> Result<Vec<Piece>, FieldError> {
    let mut pieces = Vec::new();
    let mut rest = text;
    while let Some(open) = rest.find(['{', '}']) {
        if rest[open..].starts_with('}') {
            return Err(FieldError::new(
                field,
                format!("`}}` without `{{` in `{text}`"),
            ));
        }
        if open > 0 {
            pieces.push(Piece::Text(rest[..open].to_owned()));
        }
        let after = &rest[open + 1..];
        let Some(close) = after.find('}') else {
            return Err(FieldError::new(
                field,
                format!("`{{` is never closed in `{text}`"),
            ));
        };
        let name = &after[..close];
        if !matched.contains_key(name) {
            return Err(FieldError::new(
                field,
                format!(
                    "`{{{name}}}` is not an entry of this rule's match; a key may only use \
                     entries every matched bucket has ({})",
                    if matched.is_empty() {
                        "this rule matches none".to_owned()
                    } else {
                        matched.keys().cloned().collect::<Vec<_>>().join(", ")
                    }
                ),
            ));
        }
        pieces.push(Piece::Entry(name.to_owned()));
        rest = &after[close + 1..];
    }
    if !rest.is_empty() {
        pieces.push(Piece::Text(rest.to_owned()));
    }
    if pieces.is_empty() {
        return Err(FieldError::new(field, "must not be empty"));
    }
    Ok(pieces)
}

/// Validates `rlqs:`; `shortest_window` gives the shortest `per` (ms) of a policy of
/// `policies:`, `None` if there is no such policy. An error names the field:
/// `rlqs.buckets[1].policy: no policy named `apii` in policies`.
pub fn rlqs_rules(
    raw: RawRlqs,
    shortest_window: impl Fn(&str) -> Option<u64>,
) -> Result<RlqsConfig, FieldError> {
    let (reporting_interval, assignment_ttl, abandon_after) = intervals(&raw)?;
    let mut buckets = Vec::with_capacity(raw.buckets.len());
    for (i, r) in raw.buckets.into_iter().enumerate() {
        let rule = bucket_rule(i, r, reporting_interval, &shortest_window)?;
        if buckets.iter().any(|b: &BucketRule| b.name == rule.name) {
            return Err(FieldError::new(
                format!("rlqs.buckets[{i}].name"),
                format!("`{}` names two rules", rule.name),
            ));
        }
        buckets.push(rule);
    }
    Ok(RlqsConfig {
        reporting_interval,
        assignment_ttl,
        abandon_after,
        unmatched: raw.unmatched,
        buckets,
    })
}

/// `reporting_interval`, `assignment_ttl` and `abandon_after`, each at least the interval.
fn intervals(raw: &RawRlqs) -> Result<(Duration, Duration, Duration), FieldError> {
    let reporting_interval = whole_seconds(
        "reporting_interval",
        raw.reporting_interval
            .map_or(DEFAULT_REPORTING_INTERVAL, |d| d.0),
    )?;
    let assignment_ttl = whole_seconds(
        "assignment_ttl",
        raw.assignment_ttl
            .map_or(reporting_interval.saturating_mul(3), |d| d.0),
    )?;
    if assignment_ttl < reporting_interval {
        return Err(FieldError::new(
            "rlqs.assignment_ttl",
            format!(
                "{}s is shorter than reporting_interval {}s; an assignment would expire before \
                 the next report renews it",
                assignment_ttl.as_secs(),
                reporting_interval.as_secs()
            ),
        ));
    }
    let abandon_after = raw.abandon_after.map_or(DEFAULT_ABANDON_AFTER, |d| d.0);
    if abandon_after < reporting_interval {
        return Err(FieldError::new(
            "rlqs.abandon_after",
            format!(
                "{} is shorter than reporting_interval ({}); every bucket would be abandoned \
                 between two reports",
                text(abandon_after),
                text(reporting_interval)
            ),
        ));
    }
    Ok((reporting_interval, assignment_ttl, abandon_after))
}

/// `rlqs.buckets[i]`: its policy (with a window longer than the interval), matches, key
/// template and name.
fn bucket_rule(
    i: usize,
    r: RawRule,
    reporting_interval: Duration,
    shortest_window: impl Fn(&str) -> Option<u64>,
) -> Result<BucketRule, FieldError> {
    let at = format!("rlqs.buckets[{i}]");
    let here = |field: &str, message: String| FieldError::new(format!("{at}.{field}"), message);
    let Some(window) = shortest_window(&r.policy) else {
        return Err(here(
            "policy",
            format!("no policy named `{}` in policies", r.policy),
        ));
    };
    // The store counts a stream as a holder for the policy's shortest window after its
    // last report: a window no longer than the interval forgets Envoys between reports,
    // and periodic reports cannot enforce it anyway.
    if u128::from(window) <= reporting_interval.as_millis() {
        return Err(here(
            "policy",
            format!(
                "`{}` has a window of {}, not longer than reporting_interval {}s; reports \
                 every interval cannot enforce it (use a longer window, or Envoy's rate limit \
                 service for per-request limits)",
                r.policy,
                sluice::core::duration_text(window),
                reporting_interval.as_secs()
            ),
        ));
    }
    if r.matches.len() > MAX_BUCKET_ENTRIES {
        return Err(here(
            "match",
            format!(
                "{} entries; a bucket id has at most {MAX_BUCKET_ENTRIES}",
                r.matches.len()
            ),
        ));
    }
    if r.matches.keys().any(String::is_empty) {
        return Err(here("match", "an entry name must not be empty".to_owned()));
    }
    let template = r
        .key
        .as_deref()
        .map(|t| parse_template(&format!("{at}.key"), t, &r.matches))
        .transpose()?;
    let name = match r.name {
        Some(n) if n.is_empty() => return Err(here("name", "must not be empty".to_owned())),
        Some(n) => n,
        None => format!("buckets[{i}]"),
    };
    let matches = r
        .matches
        .into_iter()
        .map(|(k, v)| {
            let want = if v == "*" {
                Want::Present
            } else {
                Want::Equal(v)
            };
            (k, want)
        })
        .collect();
    Ok(BucketRule {
        name,
        domain: r.domain,
        matches,
        policy: r.policy,
        template,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn parse(yaml: &str) -> Result<RlqsConfig, String> {
        let raw: RawRlqs = serde_yaml_ng::from_str(yaml).map_err(|e| e.to_string())?;
        // `api`'s shortest window is 10 s.
        rlqs_rules(raw, |p| (p == "api").then_some(10_000)).map_err(|e| e.to_string())
    }

    fn bucket(entries: &[(&str, &str)]) -> HashMap<String, String> {
        entries
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn the_canonical_key_sorts_entries() {
        assert_eq!(canonical(&bucket(&[("b", "2"), ("a", "1")])), "a=1,b=2");
        assert_eq!(canonical(&bucket(&[("a", "1"), ("b", "2")])), "a=1,b=2");
        assert_eq!(canonical(&bucket(&[("a", "1,b=2")])), "a=1\\,b\\=2");
        assert_eq!(canonical(&bucket(&[("a\\", "\\")])), "a\\\\=\\\\");
    }

    #[test]
    fn first_matching_rule_wins_and_templates_expand() {
        let c = parse(
            "buckets:\n  - {name: vip, match: {tenant: acme}, policy: api, key: 'vip'}\n  - {match: {tenant: '*'}, policy: api, key: 't:{tenant}'}\n",
        )
        .unwrap();
        let acme = bucket(&[("tenant", "acme"), ("x", "y")]);
        let r = c.rule_for("envoy", &acme).unwrap();
        assert_eq!((r.name.as_str(), r.key(&acme)), ("vip", "vip".to_owned()));
        let other = bucket(&[("tenant", "bob")]);
        let r = c.rule_for("envoy", &other).unwrap();
        assert_eq!(
            (r.name.as_str(), r.key(&other)),
            ("buckets[1]", "t:bob".to_owned())
        );
        assert!(c.rule_for("envoy", &bucket(&[("user", "1")])).is_none());
    }

    #[test]
    fn a_rule_with_a_domain_matches_only_that_domain() {
        let c = parse("buckets:\n  - {domain: edge, match: {}, policy: api}\n").unwrap();
        let b = bucket(&[("a", "1")]);
        assert!(c.rule_for("edge", &b).is_some());
        assert!(c.rule_for("other", &b).is_none());
        assert_eq!(c.rule_for("edge", &b).unwrap().key(&b), "a=1");
    }

    #[test]
    fn defaults() {
        let c = parse("{}").unwrap();
        assert_eq!(c.reporting_interval, Duration::from_secs(5));
        assert_eq!(c.assignment_ttl, Duration::from_secs(15));
        assert_eq!(c.unmatched, Unmatched::AllowAll);
    }

    #[test]
    fn errors_name_the_field() {
        let cases = [
            (
                "buckets:\n  - {policy: nope}\n",
                "rlqs.buckets[0].policy: no policy named `nope`",
            ),
            (
                "buckets:\n  - {match: {a: '*'}, policy: api, key: '{b}'}\n",
                "rlqs.buckets[0].key: `{b}` is not an entry",
            ),
            (
                "buckets:\n  - {match: {a: '*'}, policy: api, key: '{a'}\n",
                "rlqs.buckets[0].key: `{` is never closed",
            ),
            (
                "buckets:\n  - {match: {a: '*'}, policy: api, key: ''}\n",
                "rlqs.buckets[0].key: must not be empty",
            ),
            (
                "reporting_interval: 1500ms\n",
                "rlqs.reporting_interval: 1500ms is not a whole number",
            ),
            (
                "reporting_interval: 5s\nassignment_ttl: 2s\n",
                "rlqs.assignment_ttl: 2s is shorter",
            ),
            ("abandon_after: 10ms\n", "rlqs.abandon_after"),
            (
                "reporting_interval: 10s\nbuckets:\n  - {policy: api}\n",
                "rlqs.buckets[0].policy: `api` has a window of 10s",
            ),
            (
                "buckets:\n  - {name: a, policy: api}\n  - {name: a, policy: api}\n",
                "rlqs.buckets[1].name: `a` names two rules",
            ),
        ];
        for (yaml, want) in cases {
            let e = parse(yaml).unwrap_err();
            assert!(e.contains(want), "{yaml}: {e}");
        }
    }
}
