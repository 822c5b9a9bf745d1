//! The request body of the decision routes: read as bytes under the cap, validated by hand so
//! each `400` names its field (a [`FieldError`], worded by [`ApiError::Invalid`]).

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;
use serde_json::{Map, Value};
use sluice::MAX_KEY_LEN;
use sluice_spec::policy_entry::FieldError;

use super::error::ApiError;

// ----- the request body ---------------------------------------------------------------------

/// The decision route a body is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Endpoint {
    Check,
    Peek,
    Refund,
    Acquire,
    Release,
}

impl Endpoint {
    /// Its name in metrics, and the name of its span (docs/configuration.md#tracing).
    pub(super) fn names(self) -> (&'static str, &'static str) {
        match self {
            Endpoint::Check => ("check", "sluice.http.check"),
            Endpoint::Peek => ("peek", "sluice.http.peek"),
            Endpoint::Refund => ("refund", "sluice.http.refund"),
            Endpoint::Acquire => ("acquire", "sluice.http.acquire"),
            Endpoint::Release => ("release", "sluice.http.release"),
        }
    }

    /// Whether it admits requests (counted in stats and top keys; 429 when denied).
    pub(super) fn admits(self) -> bool {
        matches!(self, Endpoint::Check | Endpoint::Acquire)
    }
}

/// A validated `{"policy", "key", "cost"}` body, or `{"policy", "key", "lease"}` for a
/// release.
#[derive(Debug)]
pub(super) struct Request {
    pub(super) policy: String,
    pub(super) key: String,
    pub(super) cost: u64,
    pub(super) lease: u64,
}

/// A lease id as the API writes it: 16 lowercase hex digits.
pub(super) fn lease_text(id: u64) -> String {
    format!("{id:016x}")
}

pub(super) fn parse_request(
    body: Result<Bytes, BytesRejection>,
    op: Endpoint,
) -> Result<Request, ApiError> {
    if let Ok(bytes) = &body
        && let Some(request) = plain(bytes, op)
    {
        return Ok(request);
    }
    validated(body, op)
}

/// A check, peek or refund whose body is exactly what the API documents: a JSON object of
/// `policy` and `key` (strings, the key within its bound) and an optional `cost` (a whole
/// number up to 2^53, or null), each once, nothing else. Read in one pass, straight into the
/// fields; `None` for anything else, which [`validated`] then reads to say what is wrong. So it
/// accepts only bodies that `validated` accepts, with the same result (a test holds the two
/// together), and never words an error.
fn plain(bytes: &[u8], op: Endpoint) -> Option<Request> {
    /// The body, as serde reads it: a field given twice or an unknown field is an error.
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Plain<'a> {
        #[serde(borrow)]
        policy: std::borrow::Cow<'a, str>,
        #[serde(borrow)]
        key: std::borrow::Cow<'a, str>,
        #[serde(default)]
        cost: Option<u64>,
    }
    if !matches!(op, Endpoint::Check | Endpoint::Peek | Endpoint::Refund) {
        return None;
    }
    let body: Plain<'_> = serde_json::from_slice(bytes).ok()?;
    let cost = body.cost.unwrap_or(1);
    if sluice::check_cost(cost).is_err() || sluice::check_key(&body.key).is_err() {
        return None;
    }
    Some(Request {
        policy: body.policy.into_owned(),
        key: body.key.into_owned(),
        cost,
        lease: 0,
    })
}

/// Any body of any decision route, checked field by field so that each `400` names its field.
fn validated(body: Result<Bytes, BytesRejection>, op: Endpoint) -> Result<Request, ApiError> {
    let map = json_object(body)?;
    let policy = string(&map, "policy")?;
    let key = string(&map, "key")?;
    if sluice::check_key(&key).is_err() {
        return Err(ApiError::field(
            "key",
            format!("must be 1 to {MAX_KEY_LEN} bytes, got {} bytes", key.len()),
        ));
    }
    if op == Endpoint::Release {
        let id = lease_id(&string(&map, "lease")?)?;
        only_known_fields(&map, op)?;
        return Ok(Request {
            policy,
            key,
            cost: 0,
            lease: id,
        });
    }
    let cost = cost(&map)?;
    // A lease of nothing holds nothing: an acquire (or a renewal) that asks for 0 units would
    // answer `allowed` with no lease, which a client would read as "go ahead, holding a slot".
    if op == Endpoint::Acquire && cost == 0 {
        return Err(ApiError::field(
            "cost",
            "must be at least 1 for an acquire: it is the units the lease holds, and a lease of \
             0 holds nothing; to read the state without taking anything, use /v1/peek",
        ));
    }
    // An acquire may name a lease it holds, to renew it.
    let lease = match (op, map.get("lease")) {
        (Endpoint::Acquire, None | Some(Value::Null)) => 0,
        (Endpoint::Acquire, Some(_)) => lease_id(&string(&map, "lease")?)?,
        _ => 0,
    };
    only_known_fields(&map, op)?;
    Ok(Request {
        policy,
        key,
        cost,
        lease,
    })
}

/// The body, read whole and parsed as a JSON object (a duplicate field refused).
fn json_object(body: Result<Bytes, BytesRejection>) -> Result<Map<String, Value>, ApiError> {
    let bytes = body.map_err(|rejection| {
        if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::BodyTooLarge
        } else {
            ApiError::invalid(format!("the body could not be read: {rejection}"))
        }
    })?;
    let value = sluice_spec::unique::json(&bytes).map_err(|e| ApiError::invalid(e.to_string()))?;
    let Value::Object(map) = value else {
        return Err(ApiError::invalid(
            "the body must be a JSON object: {\"policy\": \"…\", \"key\": \"…\", \"cost\": 1}",
        ));
    };
    Ok(map)
}

fn string(map: &Map<String, Value>, field: &str) -> Result<String, FieldError> {
    match map.get(field) {
        Some(Value::String(s)) => Ok(s.clone()),
        Some(other) => Err(FieldError::new(
            field,
            format!("must be a string, got {}", type_name(other)),
        )),
        None => Err(FieldError::new(field, "is missing")),
    }
}

/// Exactly 16 hex digits, as /v1/acquire writes them: `1` and `0001` are not ids.
fn lease_id(lease: &str) -> Result<u64, FieldError> {
    (lease.len() == 16 && lease.bytes().all(|b| b.is_ascii_hexdigit()))
        .then(|| u64::from_str_radix(lease, 16).ok())
        .flatten()
        .filter(|&id| id != 0)
        .ok_or_else(|| {
            FieldError::new(
                "lease",
                format!(
                    "must be the id /v1/acquire returned: exactly 16 hex digits, not all zero \
                     (e.g. 9f86d081884c7d65), got `{}`",
                    lease.chars().take(40).collect::<String>()
                ),
            )
        })
}

/// `cost`: a whole number up to 2^53, 1 when absent.
fn cost(map: &Map<String, Value>) -> Result<u64, FieldError> {
    let bad = |message: String| FieldError::new("cost", message);
    match map.get("cost") {
        None | Some(Value::Null) => Ok(1),
        Some(Value::Number(n)) => match n.as_u64() {
            Some(c) if sluice::check_cost(c).is_ok() => Ok(c),
            Some(c) => Err(bad(format!(
                "{c} is too large; at most 2^53 (9007199254740992)"
            ))),
            None if n.as_i64().is_some() => Err(bad(format!("must not be negative, got {n}"))),
            None => Err(bad(format!("must be a whole number, got {n}"))),
        },
        Some(other) => Err(bad(format!(
            "must be a whole number, got {}",
            type_name(other)
        ))),
    }
}

/// Refuses the first field `op` does not take.
fn only_known_fields(map: &Map<String, Value>, op: Endpoint) -> Result<(), ApiError> {
    let (known, fields): (&[&str], _) = match op {
        Endpoint::Release => (
            &["policy", "key", "lease"],
            "the fields of a release are policy, key and lease",
        ),
        Endpoint::Acquire => (
            &["policy", "key", "cost", "lease"],
            "the fields are policy, key, cost and lease",
        ),
        _ => (
            &["policy", "key", "cost"],
            "the fields are policy, key and cost",
        ),
    };
    match map.keys().find(|f| !known.contains(&f.as_str())) {
        Some(field) => Err(ApiError::invalid(format!(
            "unknown field `{field}`; {fields}"
        ))),
        None => Ok(()),
    }
}

pub(super) fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use proptest::prelude::*;

    /// What `parse_request` answers, comparable: the request, or the error's words.
    fn outcome(r: Result<Request, ApiError>) -> Result<(String, String, u64, u64), String> {
        r.map(|r| (r.policy, r.key, r.cost, r.lease))
            .map_err(|e| format!("{e:?}"))
    }

    /// A JSON value of each kind a field may be given: valid and invalid strings and numbers.
    fn value() -> impl Strategy<Value = &'static str> {
        prop::sample::select(vec![
            "\"api\"",
            "\"user:42\"",
            "\"\"",
            "\"a\\u00e9\\n\"",
            "1",
            "0",
            "9007199254740992",
            "9007199254740993",
            "-1",
            "1.0",
            "1e3",
            "null",
            "true",
            "[]",
            "{}",
        ])
    }

    /// Bodies at and near the documented shape: half of them `policy` and `key` given as
    /// strings with an optional `cost`, sometimes one field more (another, or one again), in
    /// any order; the other half any fields with any values. Then whitespace or trailing text.
    fn body() -> impl Strategy<Value = String> {
        let name = prop::sample::select(vec!["policy", "key", "cost", "lease", "Cost", "extra"]);
        let string =
            prop::sample::select(vec!["\"api\"", "\"user:42\"", "\"\"", "\"a\\u00e9\\n\""]);
        let shaped = (
            string.clone(),
            string,
            prop::option::of(value()),
            prop::option::of((name.clone(), value())),
            proptest::arbitrary::any::<prop::sample::Index>(),
        )
            .prop_map(|(policy, key, cost, more, at)| {
                let mut fields = vec![("policy", policy), ("key", key)];
                fields.extend(cost.map(|c| ("cost", c)));
                fields.extend(more);
                let at = at.index(fields.len());
                fields.rotate_left(at);
                fields
            });
        let any_fields = prop::collection::vec((name, value()), 0..5);
        let fields = prop_oneof![shaped, any_fields];
        let trailer = prop::sample::select(vec!["", "", "", " ", "\n", "x", "{}"]);
        (fields, trailer).prop_map(|(fields, trailer)| {
            let inner: Vec<String> = fields
                .iter()
                .map(|(n, v)| format!("\"{n}\": {v}"))
                .collect();
            format!("{{{}}}{trailer}", inner.join(", "))
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2048))]
        /// Whatever the body, the one-pass reading and the field-by-field one agree: the fast
        /// path takes only what the checked one accepts, and gives the same request.
        #[test]
        fn the_plain_reading_agrees_with_the_checked_one(body in body()) {
            for op in [Endpoint::Check, Endpoint::Peek, Endpoint::Refund, Endpoint::Acquire] {
                let bytes = Bytes::from(body.clone());
                let checked = outcome(validated(Ok(bytes.clone()), op));
                if let Some(fast) = plain(&bytes, op) {
                    prop_assert_eq!(Ok((fast.policy, fast.key, fast.cost, fast.lease)), checked.clone());
                }
                prop_assert_eq!(outcome(parse_request(Ok(bytes), op)), checked);
            }
        }
    }

    #[test]
    fn a_plain_body_takes_the_one_pass_reading() {
        let body = br#"{"policy": "api", "key": "user:42", "cost": 3}"#;
        let r = plain(body, Endpoint::Check).unwrap();
        assert_eq!(
            (r.policy.as_str(), r.key.as_str(), r.cost),
            ("api", "user:42", 3)
        );
        assert!(plain(br#"{"policy": "api", "key": "k"}"#, Endpoint::Peek).is_some());
        // Each of these is left to the checked reading, which says what is wrong.
        for body in [
            &br#"{"policy": "api", "key": "k", "key": "k"}"#[..],
            br#"{"policy": "api", "key": "k", "extra": 1}"#,
            br#"{"policy": "api", "key": ""}"#,
            br#"{"policy": "api", "key": "k", "cost": 9007199254740993}"#,
            br#"{"policy": "api", "key": "k", "cost": 1.0}"#,
            br#"{"policy": "api", "key": "k"} x"#,
        ] {
            assert!(
                plain(body, Endpoint::Check).is_none(),
                "{}",
                String::from_utf8_lossy(body)
            );
        }
        assert!(plain(br#"{"policy": "api", "key": "k"}"#, Endpoint::Acquire).is_none());
    }
}
