//! A `ShouldRateLimit` answer as plain data, without its wire types: the overall code, one
//! status per descriptor, the rate-limit headers (IETF or the reference's draft-03) and
//! whether a descriptor was decided without the store; or the error that answers instead.

use std::fmt::Write as _;

use sluice::Policy;

use crate::rule::Match;
use crate::unit::Unit;

/// A descriptor's or a request's code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    /// Within the limit (or not limited, or in shadow mode).
    Ok,
    /// Over the limit.
    OverLimit,
}

/// The rule's limit, as a status reports it (`current_limit`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleLimit {
    /// The rule's `name` (empty without one).
    pub name: String,
    /// Its `requests_per_unit`.
    pub requests_per_unit: u32,
    /// Its unit (`None`: unknown).
    pub unit: Option<Unit>,
}

/// One descriptor's status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DescriptorStatus {
    /// Its code.
    pub code: Code,
    /// The limit that applied, when one did.
    pub current_limit: Option<RuleLimit>,
    /// What is left of it.
    pub limit_remaining: u32,
    /// Whole seconds until its window ends, when a limit applied.
    pub duration_until_reset: Option<u64>,
}

impl DescriptorStatus {
    /// `OK`, with nothing to report (no rule, or a replaced one).
    pub fn ok() -> Self {
        Self {
            code: Code::Ok,
            current_limit: None,
            limit_remaining: 0,
            duration_until_reset: None,
        }
    }

    /// `OK` without a limit (an `unlimited` rule, or one without a unit).
    pub fn unlimited() -> Self {
        Self {
            limit_remaining: u32::MAX,
            ..Self::ok()
        }
    }
}

/// The answer to a request that was decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RlsAnswer {
    /// The overall code.
    pub overall_code: Code,
    /// One status per descriptor, in request order.
    pub statuses: Vec<DescriptorStatus>,
    /// The rate-limit headers for Envoy to add to the response (`rls.response_headers`).
    pub headers: Vec<(&'static str, String)>,
    /// How a descriptor was decided without the store (`rls.on_store_error`), if one was.
    pub degraded: Option<sluice::Degraded>,
}

/// Why a request got no answer: each is an error of its own kind for Envoy.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RlsError {
    /// The request is malformed or out of bounds (`INVALID_ARGUMENT`).
    #[error("{0}")]
    Invalid(String),
    /// The server has no rules to answer with (`FAILED_PRECONDITION`).
    #[error(
        "this sluice has no Envoy rate limit configuration: set rls.config_dir or rls.xds \
         (with rls.xds, no rules have arrived from the control plane yet)"
    )]
    NoRules,
    /// The store refused the decision as such (`UNAVAILABLE`, as the reference answers a
    /// store error, so that Envoy's `failure_mode_deny` decides).
    #[error("the rate limit store refused the decision ({0}); retrying will not change that")]
    StoreRefused(sluice::StoreError),
    /// The store cannot answer now (`UNAVAILABLE`).
    #[error("the rate limit store cannot answer now: {0}")]
    StoreDown(sluice::StoreError),
}

/// One descriptor's part of the answer, as it is decided.
#[derive(Debug)]
pub struct Part {
    pub status: DescriptorStatus,
    /// The rule that applied (none for unmatched, replaced and unlimited descriptors).
    pub found: Option<Match>,
    /// Counted as a quota-mode descriptor (the rule's `quota_mode`, or the global one).
    pub quota: bool,
    /// Over its limit, shadow mode or not.
    pub limited: bool,
    /// A charge to give back if the request is refused.
    pub charge: Option<(Policy, String, u64)>,
    /// Whole seconds until the descriptor's window ends.
    pub reset_secs: u64,
    /// Decided without the store (`rls.on_store_error: open` or `local`).
    pub degraded: Option<sluice::Degraded>,
}

impl Part {
    /// A part that takes no part in the overall code, with `status`.
    pub fn plain(status: DescriptorStatus) -> Self {
        Self {
            status,
            found: None,
            quota: false,
            limited: false,
            charge: None,
            reset_secs: 0,
            degraded: None,
        }
    }

    pub fn over(&self) -> bool {
        self.status.code == Code::OverLimit
    }
}

/// The limit a status reports for the rule of `m`.
pub fn rule_limit(m: &Match) -> RuleLimit {
    RuleLimit {
        name: m.rule.name.clone().unwrap_or_default(),
        requests_per_unit: m.rule.requests_per_unit,
        unit: m.rule.unit,
    }
}

/// Seconds from `now_ms` to the end of its aligned `window_ms`, rounded up, as the
/// reference's `CalculateReset` counts them (the rls windows are aligned to the epoch).
pub fn until_reset(window_ms: u64, now_ms: u64) -> u64 {
    sluice::headers::secs_up(window_ms - now_ms % window_ms)
}

/// The item name of a descriptor's limit in the IETF headers: the rule's `name`, else its
/// configured key (`domain.key_value.key`), never a value the client chose unless the
/// configuration keys on it.
fn item_name(m: &Match) -> &str {
    m.rule.name.as_deref().unwrap_or(&m.rule.full_key)
}

/// `RateLimit-Policy` and `RateLimit` with one item per limited descriptor, in request order
/// (draft-ietf-httpapi-ratelimit-headers-11: `q` quota and `w` window in seconds; `r`
/// remaining and `t` seconds until the window ends).
pub fn ietf_headers(parts: &[Part]) -> Vec<(&'static str, String)> {
    let mut policy = String::new();
    let mut state = String::new();
    for part in parts {
        let (Some(m), Some(limit)) = (&part.found, &part.status.current_limit) else {
            continue;
        };
        let name = sluice::headers::sf_string(item_name(m));
        let window = m.rule.unit.map_or(0, Unit::seconds);
        if !policy.is_empty() {
            policy.push_str(", ");
            state.push_str(", ");
        }
        // Writing into a String cannot fail.
        let _ = write!(policy, "{name};q={};w={window}", limit.requests_per_unit);
        let _ = write!(
            state,
            "{name};r={};t={}",
            part.status.limit_remaining, part.reset_secs
        );
    }
    if policy.is_empty() {
        return Vec::new();
    }
    vec![("RateLimit-Policy", policy), ("RateLimit", state)]
}

/// The reference's draft-03 headers for the descriptor closest to its limit: the one with the
/// least `limit_remaining`, or the last descriptor over its limit that is not in quota mode.
pub fn draft03_headers(parts: &[Part]) -> Vec<(&'static str, String)> {
    let mut chosen: Option<&Part> = None;
    let mut least = u32::MAX;
    for part in parts {
        if part.status.current_limit.is_some() && part.status.limit_remaining < least {
            chosen = Some(part);
            least = part.status.limit_remaining;
        }
        if part.over() && !part.quota {
            chosen = Some(part);
            least = 0;
        }
    }
    let Some((part, Some(limit))) = chosen.map(|p| (p, &p.status.current_limit)) else {
        return Vec::new();
    };
    vec![
        ("RateLimit-Limit", limit.requests_per_unit.to_string()),
        (
            "RateLimit-Remaining",
            part.status.limit_remaining.to_string(),
        ),
        ("RateLimit-Reset", part.reset_secs.to_string()),
    ]
}
