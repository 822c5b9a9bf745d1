//! Policies: a named, ordered set of validated limits applied together to one key, and what
//! a policy does when its store cannot answer.

use std::fmt;
use std::sync::Arc;

use crate::limit::{
    Algorithm, Limit, LimitError, LimitSpec, MAX_LIMITS_PER_POLICY, MAX_POLICY_NAME_LEN,
};

/// What a policy does when its store cannot answer (a timeout, an unreachable shard, an open
/// circuit). Errors that retrying cannot fix (corrupt state) are reported whatever the mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum FailureMode {
    /// Allow the request. The decision is marked [`Degraded::Open`](crate::Degraded::Open)
    /// and reports every limit whole (`remaining` = its [capacity](Limit::capacity)).
    #[default]
    Open,
    /// Refuse to decide: the caller gets a "store unavailable" error (a server answers 503).
    Closed,
    /// Decide with an in-process store (the "insurance limiter"): each process enforces the
    /// policy's limits on its own until the store answers again. The decision is marked
    /// [`Degraded::Local`](crate::Degraded::Local).
    Local,
}

impl FailureMode {
    /// The configuration name: `open`, `closed` or `local`.
    pub fn as_str(self) -> &'static str {
        match self {
            FailureMode::Open => "open",
            FailureMode::Closed => "closed",
            FailureMode::Local => "local",
        }
    }
}

impl fmt::Display for FailureMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for FailureMode {
    type Err = LimitError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "open" => Ok(FailureMode::Open),
            "closed" => Ok(FailureMode::Closed),
            "local" => Ok(FailureMode::Local),
            other => Err(LimitError::new(
                "on_store_error",
                format!("`{other}` is not a failure mode; expected open, closed or local"),
            )),
        }
    }
}

/// A named, ordered set of limits applied together to one key.
///
/// A handle: the name and limits are one shared allocation, so a clone is one reference
/// count and two handles of one policy compare by pointer ([`Policy::same_as`]). Callers
/// that decide often resolve their policy once (e.g. `Limiter::policy`) and keep the handle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    shared: Arc<Shared>,
    on_store_error: FailureMode,
}

/// What every handle of one policy shares.
#[derive(Debug, PartialEq, Eq)]
struct Shared {
    name: Arc<str>,
    limits: Arc<[Limit]>,
    fingerprint: u64,
    name_hash: u64,
}

impl Policy {
    /// Builds a policy from validated limits. The name is 1 to 128 bytes of letters, digits,
    /// `_`, `-`, `.` or `:`; there are 1 to [`MAX_LIMITS_PER_POLICY`] (4) limits.
    pub fn new(name: impl Into<String>, limits: Vec<Limit>) -> Result<Self, LimitError> {
        let name: String = name.into();
        validate_policy_name(&name)?;
        if limits.is_empty() {
            return Err(LimitError::new(
                "limits",
                "a policy needs at least one limit",
            ));
        }
        if limits.len() > MAX_LIMITS_PER_POLICY {
            return Err(LimitError::new(
                "limits",
                format!(
                    "{} limits given; a policy holds at most {MAX_LIMITS_PER_POLICY}",
                    limits.len()
                ),
            ));
        }
        for (i, a) in limits.iter().enumerate() {
            if let Some(j) = limits[..i]
                .iter()
                .position(|b| b.state_tag() == a.state_tag())
            {
                let reason = if a.algorithm() == Algorithm::Concurrency {
                    format!(
                        "limits[{j}] is already a concurrency limit; a policy holds at most one"
                    )
                } else {
                    format!("counts the same window as limits[{j}]; merge the two limits")
                };
                return Err(LimitError::new(format!("limits[{i}]"), reason));
            }
        }
        let fingerprint = fnv1a(limits.iter().flat_map(|l| {
            let mut tag = l.state_tag().into_bytes();
            tag.push(b'|');
            tag
        }));
        let name_hash = fnv1a(name.bytes());
        Ok(Self {
            shared: Arc::new(Shared {
                name: name.into(),
                limits: limits.into(),
                fingerprint,
                name_hash,
            }),
            on_store_error: FailureMode::Open,
        })
    }

    /// Builds a policy from unvalidated specs; an error names the limit, e.g. `limits[1].per`.
    pub fn from_specs(name: impl Into<String>, specs: Vec<LimitSpec>) -> Result<Self, LimitError> {
        let limits = specs
            .into_iter()
            .enumerate()
            .map(|(i, spec)| Limit::new(spec).map_err(|e| e.within(&format!("limits[{i}]"))))
            .collect::<Result<Vec<_>, _>>()?;
        Self::new(name, limits)
    }

    /// The same policy with another failure mode (default [`FailureMode::Open`]).
    pub fn with_failure_mode(mut self, mode: FailureMode) -> Self {
        self.on_store_error = mode;
        self
    }

    /// What the policy does when its store cannot answer.
    #[inline]
    pub fn failure_mode(&self) -> FailureMode {
        self.on_store_error
    }

    /// The policy's name.
    #[inline]
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// The name as a shared string (cheap to clone).
    pub fn name_arc(&self) -> &Arc<str> {
        &self.shared.name
    }

    /// A hash of the name (FNV-1a), computed once: a store that keys a table by (policy, key)
    /// hashes this rather than the name on every call.
    #[inline]
    pub fn name_hash(&self) -> u64 {
        self.shared.name_hash
    }

    /// The limits, in the policy's order.
    #[inline]
    pub fn limits(&self) -> &[Limit] {
        &self.shared.limits
    }

    /// The policy's concurrency limit and its index, if it has one: "does this policy hold a
    /// concurrency limit" is asked here and nowhere else.
    pub fn concurrency_limit(&self) -> Option<(usize, &Limit)> {
        self.limits()
            .iter()
            .enumerate()
            .find(|(_, l)| l.algorithm() == Algorithm::Concurrency)
    }

    /// The shortest window (`per`) of the policy's limits, in milliseconds. A policy has at
    /// least one limit, so there is one.
    pub fn shortest_per_ms(&self) -> u64 {
        self.limits().iter().map(Limit::per_ms).min().unwrap_or(1)
    }

    /// The limits as a shared slice: stores keep it beside a key's states to tell whether the
    /// policy changed since (a pointer comparison).
    #[inline]
    pub fn limits_arc(&self) -> &Arc<[Limit]> {
        &self.shared.limits
    }

    /// Whether `other` is a handle of this very policy (built once, then cloned): the same
    /// name and limits, told by one pointer comparison. The failure modes may differ. Two
    /// policies built apart are not the same even when equal.
    #[inline]
    pub fn same_as(&self, other: &Policy) -> bool {
        Arc::ptr_eq(&self.shared, &other.shared)
    }

    /// A hash of the limits' state tags: equal fingerprints mean stored states line up with
    /// the limits index for index.
    pub fn fingerprint(&self) -> u64 {
        self.shared.fingerprint
    }
}

fn validate_policy_name(name: &str) -> Result<(), LimitError> {
    if name.is_empty() || name.len() > MAX_POLICY_NAME_LEN {
        return Err(LimitError::new(
            "name",
            format!(
                "a policy name is 1 to {MAX_POLICY_NAME_LEN} bytes, got {}",
                name.len()
            ),
        ));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | ':')))
    {
        return Err(LimitError::new(
            "name",
            format!("`{name}` contains {c:?}; use letters, digits, `_`, `-`, `.` or `:`"),
        ));
    }
    Ok(())
}

/// FNV-1a: stable across processes and versions (unlike `DefaultHasher`).
fn fnv1a(bytes: impl IntoIterator<Item = u8>) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limit::{LimitSpec, MAX_LIMITS_PER_POLICY};

    #[test]
    fn a_policy_tells_its_concurrency_limit_and_its_shortest_window() {
        let p = Policy::from_specs(
            "p",
            vec![
                LimitSpec::fixed_window(10, 60_000),
                LimitSpec::concurrency(2, 30_000),
                LimitSpec::fixed_window(5, 1_000),
            ],
        )
        .unwrap();
        let (i, l) = p.concurrency_limit().unwrap();
        assert_eq!((i, l.max(), l.per_ms()), (1, 2, 30_000));
        assert_eq!(p.shortest_per_ms(), 1_000);
        let rate = Policy::from_specs("r", vec![LimitSpec::fixed_window(10, 60_000)]).unwrap();
        assert!(rate.concurrency_limit().is_none());
        assert_eq!(rate.shortest_per_ms(), 60_000);
    }

    #[test]
    fn policy_errors_name_the_limit() {
        let e = Policy::from_specs(
            "api",
            vec![
                LimitSpec::fixed_window(10, 1000),
                LimitSpec::fixed_window(5, 0),
            ],
        )
        .err();
        assert_eq!(
            e.map(|e| e.to_string()).as_deref(),
            Some("limits[1].per: 0ms is out of range; per must be between 1ms and 366d")
        );
        assert_eq!(
            Policy::from_specs("api", vec![]).err().map(|e| e.field),
            Some("limits".into())
        );
        assert_eq!(
            Policy::from_specs("a b", vec![LimitSpec::fixed_window(1, 1)])
                .err()
                .map(|e| e.field),
            Some("name".into())
        );
        let dup = Policy::from_specs(
            "api",
            vec![
                LimitSpec::fixed_window(10, 1000),
                LimitSpec::fixed_window(20, 1000),
            ],
        );
        assert_eq!(dup.err().map(|e| e.field), Some("limits[1]".into()));
    }

    #[test]
    fn a_policy_holds_at_most_four_limits() {
        let specs = |n: u64| {
            (1..=n)
                .map(|i| LimitSpec::fixed_window(10, i * 1_000))
                .collect()
        };
        assert!(Policy::from_specs("p", specs(MAX_LIMITS_PER_POLICY as u64)).is_ok());
        let e = Policy::from_specs("p", specs(MAX_LIMITS_PER_POLICY as u64 + 1)).err();
        assert_eq!(
            e.map(|e| e.to_string()).as_deref(),
            Some("limits: 5 limits given; a policy holds at most 4")
        );
    }

    #[test]
    fn fingerprint_follows_shape_not_max_for_windows() {
        let p = |max| Policy::from_specs("p", vec![LimitSpec::fixed_window(max, 1000)]);
        let (a, b) = (p(10), p(20));
        assert_eq!(a.map(|p| p.fingerprint()), b.map(|p| p.fingerprint()));
        let c = Policy::from_specs("p", vec![LimitSpec::fixed_window(10, 2000)]);
        assert_ne!(p(10).map(|p| p.fingerprint()), c.map(|p| p.fingerprint()));
    }
}
