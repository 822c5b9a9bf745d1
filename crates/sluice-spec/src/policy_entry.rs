//! The one parser of a policy entry (`{limits: [{max, per, …}], on_store_error?}`): the
//! configuration's `policies.<name>`, the simulator's inline policies and the HTTP body's
//! inline policy all read an entry here, so they mean and refuse exactly the same things.
//!
//! It also holds the one shape of "the value at this path is wrong, and why", [`FieldError`]:
//! the entry's errors, the simulator's, the HTTP body's and query's, the RLQS rules' and the
//! xDS settings' are all one, and each surface renders it its own way (`path: message` in the
//! configuration and the simulator, `` `path` message`` in a `400`).

use serde::Deserialize;
use serde::de::{self, DeserializeOwned, Deserializer};
use serde_path_to_error::Segment;
use sluice::{Algorithm, FailureMode, Limit, LimitSpec, Policy};
use std::fmt;

use crate::units::PositiveDuration;

/// A value that cannot be used: where it is (`limits[1].per`, `traffic.rate`,
/// `rlqs.buckets[0].policy`; empty for the value as a whole) and what is wrong with it, in
/// words a person can act on. Displayed `path: message` (the message alone when the path is
/// empty).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}{}{message}", .path, if .path.is_empty() { "" } else { ": " })]
pub struct FieldError {
    /// The path of the value at fault.
    pub path: String,
    /// What is wrong with it.
    pub message: String,
}

impl FieldError {
    /// An error about the value at `path`.
    pub fn new(path: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            path: path.into(),
            message: message.into(),
        }
    }

    /// An error about the value as a whole (an empty path).
    pub fn whole(message: impl Into<String>) -> Self {
        Self::new(String::new(), message)
    }

    /// The same error seen from `parent`: `limits[1]` within `policies.api` is
    /// `policies.api.limits[1]`.
    #[must_use]
    pub fn within(mut self, parent: &str) -> Self {
        self.path = match (parent.is_empty(), self.path.is_empty()) {
            (true, _) => self.path,
            (false, true) => parent.to_owned(),
            (false, false) if self.path.starts_with('[') => format!("{parent}{}", self.path),
            (false, false) => format!("{parent}.{}", self.path),
        };
        self
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLimit {
    max: u64,
    per: PositiveDuration,
    algorithm: Option<String>,
    precision: Option<PositiveDuration>,
    burst: Option<u64>,
    #[serde(default)]
    align: bool,
}

/// A limit validated as it is read, so its errors carry a line.
#[derive(Debug)]
struct ValidLimit(Limit);

impl<'de> Deserialize<'de> for ValidLimit {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        // The limit is checked inside the visit of its own mapping, so that an error carries
        // the limit's place and path (`limits[1]`), not the list's.
        struct V;
        impl<'de> de::Visitor<'de> for V {
            type Value = ValidLimit;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a limit such as { max: 100, per: 1m }")
            }
            fn visit_map<A: de::MapAccess<'de>>(self, map: A) -> Result<ValidLimit, A::Error> {
                let raw = RawLimit::deserialize(de::value::MapAccessDeserializer::new(map))?;
                ValidLimit::from_raw(raw).map_err(de::Error::custom)
            }
        }
        d.deserialize_map(V)
    }
}

impl ValidLimit {
    fn from_raw(raw: RawLimit) -> Result<Self, sluice::LimitError> {
        let algorithm = match raw.algorithm.as_deref() {
            None => Algorithm::FixedWindow,
            Some(a) => a.parse()?,
        };
        let spec = LimitSpec {
            max: raw.max,
            per_ms: raw.per.millis(),
            algorithm,
            precision_ms: raw.precision.map(PositiveDuration::millis),
            burst: raw.burst,
            align: raw.align,
        };
        Limit::new(spec).map(ValidLimit)
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawPolicy {
    on_store_error: Option<String>,
    limits: Vec<ValidLimit>,
}

/// A policy from its raw entry; an error names the path below `policies.<name>`
/// (`on_store_error`, `limits[1]`; empty for the name).
pub fn entry_policy(name: &str, raw: RawPolicy) -> Result<Policy, FieldError> {
    let on_store_error = match raw.on_store_error.as_deref() {
        None => FailureMode::Open,
        Some(mode) => mode
            .parse::<FailureMode>()
            .map_err(|e| FieldError::new("on_store_error", e.reason))?,
    };
    let limits = raw.limits.into_iter().map(|l| l.0).collect();
    let policy = Policy::new(name.to_owned(), limits).map_err(|e| {
        let path = if e.field == "name" {
            String::new()
        } else {
            e.field
        };
        FieldError::new(path, e.reason)
    })?;
    Ok(policy.with_failure_mode(on_store_error))
}

/// A policy defined inline, in the shape of a `policies.<name>` entry of the configuration
/// (`{limits: [{max, per, algorithm?, precision?, burst?, align?}], on_store_error?}`), read
/// from any self-describing value (a JSON body, a YAML flag) with the configuration's own
/// rules, so an inline policy means and refuses exactly what a configured one does. The
/// error names the path below the entry: `limits[1].per: `0s` is not a positive duration`.
pub fn inline_policy(name: &str, value: &serde_json::Value) -> Result<Policy, FieldError> {
    if !value.is_object() {
        return Err(FieldError::whole(
            "must be an object such as {\"limits\": [{\"max\": 100, \"per\": \"1m\"}]}",
        ));
    }
    entry_policy(name, from_value(value)?).map_err(|e| match e.path.is_empty() {
        true => FieldError::whole(format!("the name `{name}`: {}", e.message)),
        false => e,
    })
}

/// Reads `value` into a `T`; an error names the path of the value at fault (`limits[1].per`,
/// empty for `value` itself). An unknown field is named by the message, the error by the
/// object it is in.
pub fn from_value<T: DeserializeOwned>(value: &serde_json::Value) -> Result<T, FieldError> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let message = e.inner().to_string();
        let mut path = e.path().to_string();
        if let Some(Segment::Map { key }) = e.path().iter().next_back()
            && message.starts_with("unknown field")
        {
            path.truncate(path.len().saturating_sub(key.len() + 1));
        }
        if path == "." {
            path.clear();
        }
        FieldError::new(path, message)
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_field_error_reads_path_then_message() {
        assert_eq!(
            FieldError::new("limits[1].per", "`0s` is not a positive duration").to_string(),
            "limits[1].per: `0s` is not a positive duration"
        );
        assert_eq!(FieldError::whole("not JSON").to_string(), "not JSON");
    }

    #[test]
    fn a_field_error_within_a_parent_joins_the_paths() {
        let e = FieldError::new("limits[1]", "bad");
        assert_eq!(
            e.clone().within("policies.api").path,
            "policies.api.limits[1]"
        );
        assert_eq!(
            FieldError::new("[2]", "bad").within("items").path,
            "items[2]"
        );
        assert_eq!(
            FieldError::whole("bad").within("policies.api").path,
            "policies.api"
        );
        assert_eq!(e.clone().within(""), e);
    }

    /// The configuration reads an entry's error `within` `policies.<name>`: the path below
    /// the entry joined to the policy's, the name's own error at the policy's path.
    #[test]
    fn an_entry_error_within_its_policy_reads_as_the_configuration_writes_it() {
        let bad_mode = "{on_store_error: sometimes, limits: [{max: 1, per: 1s}]}";
        let no_limit = "{limits: []}";
        let fine = "{limits: [{max: 1, per: 1s}]}";
        for (name, yaml, path) in [
            ("api", bad_mode, "policies.api.on_store_error"),
            ("api", no_limit, "policies.api.limits"),
            ("", fine, "policies."),
            ("a b", fine, "policies.a b"),
        ] {
            let raw = serde_yaml_ng::from_str::<RawPolicy>(yaml).unwrap();
            let e = entry_policy(name, raw).unwrap_err();
            let message = e.message.clone();
            let e = e.within(&format!("policies.{name}"));
            assert_eq!(e.path, path);
            assert_eq!(e.to_string(), format!("{path}: {message}"));
        }
    }

    #[test]
    fn an_inline_policy_error_names_the_path_below_the_entry() {
        let value =
            serde_json::json!({"limits": [{"max": 1, "per": "1s"}, {"max": 1, "per": "0s"}]});
        let e = inline_policy("api", &value).unwrap_err();
        assert_eq!(e.path, "limits[1].per");
        assert!(e.message.contains("`0s` is not a positive duration"), "{e}");
        let e = inline_policy(
            "api",
            &serde_json::json!({"limits": [], "on_store_error": 1}),
        )
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "on_store_error: invalid type: integer `1`, expected a string"
        );
    }
}
