//! The request body of the decision routes: read as bytes under the cap, validated by hand so
//! each `400` names its field (a [`FieldError`], worded by [`ApiError::Invalid`]).

use super::*;
use crate::policy_entry::FieldError;
use serde_json::Map;

// ----- the request body ---------------------------------------------------------------------

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
        if let Some(field) = map
            .keys()
            .find(|f| !matches!(f.as_str(), "policy" | "key" | "lease"))
        {
            return Err(ApiError::invalid(format!(
                "unknown field `{field}`; the fields of a release are policy, key and lease"
            )));
        }
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
    let value = crate::unique::json(&bytes).map_err(|e| ApiError::invalid(e.to_string()))?;
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
            Some(c) if c <= sluice::core::MAX_AMOUNT => Ok(c),
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
    for field in map.keys() {
        let known = match op {
            Endpoint::Acquire => matches!(field.as_str(), "policy" | "key" | "cost" | "lease"),
            _ => matches!(field.as_str(), "policy" | "key" | "cost"),
        };
        if !known {
            let fields = match op {
                Endpoint::Acquire => "policy, key, cost and lease",
                _ => "policy, key and cost",
            };
            return Err(ApiError::invalid(format!(
                "unknown field `{field}`; the fields are {fields}"
            )));
        }
    }
    Ok(())
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
