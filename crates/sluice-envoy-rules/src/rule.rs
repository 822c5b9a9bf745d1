//! A rule as configured, and the rule and keys that apply to one request descriptor.

use std::sync::Arc;

use crate::unit::Unit;

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
    /// match one request, that other rule is not applied ([`crate::RlsConfig::get_limits`]).
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
