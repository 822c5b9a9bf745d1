//! The one parser of a policy entry (`{limits: [{max, per, …}], on_store_error?}`): the
//! configuration's `policies.<name>`, the simulator's inline policies and the HTTP body's
//! inline policy all read an entry here, so they mean and refuse exactly the same things.

use serde::Deserialize;
use serde::de::{self, Deserializer};
use sluice::{Algorithm, FailureMode, Limit, LimitSpec, Policy};
use std::fmt;

use crate::units::PositiveDuration;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLimit {
    max: u64,
    per: PositiveDuration,
    #[serde(default)]
    algorithm: Option<String>,
    #[serde(default)]
    precision: Option<PositiveDuration>,
    #[serde(default)]
    burst: Option<u64>,
    #[serde(default)]
    align: bool,
}

/// A limit validated as it is read, so its errors carry a line.
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
    fn from_raw(raw: RawLimit) -> Result<Self, String> {
        let algorithm = match raw.algorithm.as_deref() {
            None => Algorithm::FixedWindow,
            Some(a) => a.parse().map_err(|e: sluice::LimitError| e.to_string())?,
        };
        let spec = LimitSpec {
            max: raw.max,
            per_ms: raw.per.millis(),
            algorithm,
            precision_ms: raw.precision.map(PositiveDuration::millis),
            burst: raw.burst,
            align: raw.align,
        };
        Limit::new(spec).map(ValidLimit).map_err(|e| e.to_string())
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawPolicy {
    #[serde(default)]
    on_store_error: Option<String>,
    limits: Vec<ValidLimit>,
}

/// A policy from its raw entry; an error is (the path below `policies.<name>`, e.g.
/// `.on_store_error`, and the reason).
pub(crate) fn build_policy(name: &str, raw: RawPolicy) -> Result<Policy, (String, String)> {
    let on_store_error = match raw.on_store_error.as_deref() {
        None => FailureMode::Open,
        Some(mode) => mode
            .parse::<FailureMode>()
            .map_err(|e| (".on_store_error".to_owned(), e.reason))?,
    };
    let limits = raw.limits.into_iter().map(|l| l.0).collect();
    let policy = Policy::new(name.to_owned(), limits).map_err(|e| {
        let field = if e.field == "name" {
            String::new()
        } else {
            format!(".{}", e.field)
        };
        (field, e.reason)
    })?;
    Ok(policy.with_failure_mode(on_store_error))
}

/// A policy defined inline, in the shape of a `policies.<name>` entry of the configuration
/// (`{limits: [{max, per, algorithm?, precision?, burst?, align?}], on_store_error?}`), read
/// from any self-describing value (a JSON body, a YAML flag) with the configuration's own
/// rules, so an inline policy means and refuses exactly what a configured one does. The
/// error names the path below the entry: `limits[1].per: `0s` is not a positive duration`.
pub(crate) fn inline_policy(name: &str, value: &serde_json::Value) -> Result<Policy, String> {
    let serde_json::Value::Object(map) = value else {
        return Err(
            "must be an object such as {\"limits\": [{\"max\": 100, \"per\": \"1m\"}]}".to_owned(),
        );
    };
    for field in map.keys() {
        if !matches!(field.as_str(), "limits" | "on_store_error") {
            return Err(format!(
                "unknown field `{field}`; a policy has limits and on_store_error"
            ));
        }
    }
    let on_store_error = match map.get("on_store_error") {
        None | Some(serde_json::Value::Null) => None,
        Some(serde_json::Value::String(s)) => Some(s.clone()),
        Some(_) => return Err("on_store_error: must be a string: open, closed or local".to_owned()),
    };
    let Some(serde_json::Value::Array(items)) = map.get("limits") else {
        return Err(
            "limits: must be a list of limits such as [{\"max\": 100, \"per\": \"1m\"}]".to_owned(),
        );
    };
    let mut limits = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let limit = ValidLimit::deserialize(item).map_err(|e| format!("limits[{i}]: {e}"))?;
        limits.push(limit);
    }
    build_policy(
        name,
        RawPolicy {
            on_store_error,
            limits,
        },
    )
    .map_err(|(field, reason)| match field.strip_prefix('.') {
        Some(field) => format!("{field}: {reason}"),
        None => format!("the name `{name}`: {reason}"),
    })
}
