//! Keys given twice: a mapping that names a key twice is refused, wherever it is.
//!
//! serde keeps the last value of a map (a `policies` entry written twice silently replaces the
//! first, and so does a field of a JSON body), and it reports a struct's duplicate field
//! without the place of the first one. So a document is first read through [`read`], which
//! builds a [`serde_json::Value`] from any self-describing deserializer (a YAML configuration,
//! a JSON body) and stops at the first key a mapping names twice, saying where: the path of
//! the mapping (`policies`, `traffic`, `policies.api.limits[0]`) and the key.
//!
//! The error is raised while the key itself is being read, so a deserializer that knows
//! positions (serde_yaml_ng) places it at the second key; [`read`] with a [`Probe`] finds the
//! first one's place the same way. A body of the HTTP API is read this way on every request:
//! a key is checked against the keys its object already holds (no set of its own) and a path
//! is written out only for an error, so reading costs what `serde_json::from_slice` does.

use std::cell::RefCell;
use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

/// A key a mapping names twice.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Duplicate {
    /// The path of the mapping (empty for the document itself).
    pub path: String,
    /// The key, as written.
    pub key: String,
}

impl Duplicate {
    /// `key` under `path`, as the configuration's errors write it (`policies.api`).
    pub fn full_path(&self) -> String {
        if self.path.is_empty() {
            self.key.clone()
        } else {
            format!("{}.{}", self.path, self.key)
        }
    }
}

/// Where [`read`] should stop instead: at the first occurrence of `key` in the mapping at
/// `path`, to learn its position from the error.
#[derive(Debug, Clone)]
pub struct Probe(pub Duplicate);

/// What [`read`] found besides the value or the error.
#[derive(Debug, Default)]
struct Found {
    duplicate: Option<Duplicate>,
    probe: Option<Duplicate>,
    probed: bool,
}

/// What [`read`] parsed.
#[derive(Debug)]
pub enum Parsed<E> {
    /// The document, every mapping's keys unique.
    Value(Value),
    /// A mapping names a key twice; `error` is the deserializer's error raised at the second
    /// key (with its position, if the deserializer knows positions).
    Duplicate { duplicate: Duplicate, error: E },
    /// The [`Probe`]'s key was reached; `error` is raised at it.
    Probed(E),
    /// The deserializer failed for another reason (syntax, depth, a YAML tag).
    Other(E),
}

/// Reads a document into a JSON value, refusing a mapping that names a key twice; with
/// `probe`, stops at the first occurrence of the probed key instead.
pub fn read<'de, D: Deserializer<'de>>(de: D, probe: Option<Probe>) -> Parsed<D::Error> {
    let found = RefCell::new(Found {
        probe: probe.map(|p| p.0),
        ..Found::default()
    });
    let result = Walk {
        path: Path::Root,
        found: &found,
        seen: None,
    }
    .deserialize(de);
    let found = found.into_inner();
    match result {
        Ok(value) => Parsed::Value(value),
        Err(error) => match found.duplicate {
            Some(duplicate) => Parsed::Duplicate { duplicate, error },
            None if found.probed => Parsed::Probed(error),
            None => Parsed::Other(error),
        },
    }
}

/// Why a JSON body cannot be read: its message is the message of a `400`.
#[derive(Debug, thiserror::Error)]
pub enum JsonError {
    /// Not JSON, or something after the value.
    #[error("the body is not valid JSON: {0}")]
    NotJson(serde_json::Error),
    /// A key given twice (its path: `cost`, `traffic.rate`).
    #[error(
        "`{0}` is given twice; give each field once (a JSON object's last value would silently \
         win)"
    )]
    Duplicate(String),
}

/// Reads a JSON body, refusing a key given twice (`` `cost` is given twice``).
pub fn json(bytes: &[u8]) -> Result<Value, JsonError> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value = match read(&mut de, None) {
        Parsed::Value(v) => v,
        Parsed::Duplicate { duplicate, .. } => {
            return Err(JsonError::Duplicate(duplicate.full_path()));
        }
        Parsed::Probed(e) | Parsed::Other(e) => return Err(JsonError::NotJson(e)),
    };
    // Trailing characters after the value, as serde_json::from_slice refuses them.
    de.end().map_err(JsonError::NotJson)?;
    Ok(value)
}

/// Where a value is, written out only when an error needs it.
#[derive(Clone, Copy)]
enum Path<'a> {
    Root,
    Key(&'a Path<'a>, &'a str),
    Index(&'a Path<'a>, usize),
}

impl fmt::Display for Path<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Path::Root => Ok(()),
            Path::Key(Path::Root, key) => f.write_str(key),
            Path::Key(parent, key) => write!(f, "{parent}.{key}"),
            Path::Index(parent, i) => write!(f, "{parent}[{i}]"),
        }
    }
}

/// One value at `path`; with `seen`, a key of the mapping at `path`, checked against the keys
/// it holds before this one while the key is read (so a deserializer that knows positions
/// places the error at it).
struct Walk<'p, 'f, 's> {
    path: Path<'p>,
    found: &'f RefCell<Found>,
    seen: Option<&'s Map<String, Value>>,
}

impl Walk<'_, '_, '_> {
    /// The value read, or as a key: a scalar's text (`null` for null), a mapping's or a list's
    /// JSON (YAML allows them as keys; nothing in Sluice reads one), checked.
    fn done<E: de::Error>(self, value: Value) -> Result<Value, E> {
        let Some(seen) = self.seen else {
            return Ok(value);
        };
        let key = match value {
            Value::String(text) => text,
            other => other.to_string(),
        };
        let mut found = self.found.borrow_mut();
        if let Some(probe) = &found.probe
            && probe.key == key
            && probe.path == self.path.to_string()
        {
            found.probed = true;
            return Err(E::custom(format!("the first `{key}`")));
        }
        if seen.contains_key(&key) {
            let duplicate = Duplicate {
                path: self.path.to_string(),
                key,
            };
            let message = format!("`{}` is given twice", duplicate.full_path());
            found.duplicate = Some(duplicate);
            return Err(E::custom(message));
        }
        Ok(Value::String(key))
    }
}

impl<'de> DeserializeSeed<'de> for Walk<'_, '_, '_> {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, de: D) -> Result<Value, D::Error> {
        de.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Walk<'_, '_, '_> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any value")
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Value, E> {
        self.done(Value::Bool(v))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Value, E> {
        self.done(Value::from(v))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Value, E> {
        self.done(Value::from(v))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Value, E> {
        self.done(serde_json::Number::from_f64(v).map_or(Value::Null, Value::Number))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Value, E> {
        self.done(Value::String(v.to_owned()))
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<Value, E> {
        self.done(Value::String(v))
    }

    fn visit_unit<E: de::Error>(self) -> Result<Value, E> {
        self.done(Value::Null)
    }

    fn visit_none<E: de::Error>(self) -> Result<Value, E> {
        self.done(Value::Null)
    }

    fn visit_some<D: Deserializer<'de>>(self, de: D) -> Result<Value, D::Error> {
        self.deserialize(de)
    }

    fn visit_newtype_struct<D: Deserializer<'de>>(self, de: D) -> Result<Value, D::Error> {
        self.deserialize(de)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element_seed(Walk {
            path: Path::Index(&self.path, items.len()),
            found: self.found,
            seen: None,
        })? {
            items.push(item);
        }
        self.done(Value::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = Map::new();
        while let Some(key) = map.next_key_seed(Walk {
            path: self.path,
            found: self.found,
            seen: Some(&out),
        })? {
            // A key is read as a string (`done`).
            let key = key.as_str().unwrap_or_default().to_owned();
            let value = map.next_value_seed(Walk {
                path: Path::Key(&self.path, &key),
                found: self.found,
                seen: None,
            })?;
            out.insert(key, value);
        }
        self.done(Value::Object(out))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    /// [`super::json`] with its error as the `400` words it.
    fn json(bytes: &[u8]) -> Result<Value, String> {
        super::json(bytes).map_err(|e| e.to_string())
    }

    #[test]
    fn a_json_body_with_a_field_given_twice_is_refused_naming_it() {
        assert_eq!(
            json(br#"{"policy": "a", "cost": 1, "cost": 2}"#)
                .unwrap_err()
                .split(';')
                .next(),
            Some("`cost` is given twice")
        );
        let e = json(br#"{"traffic": {"rate": 1, "rate": 2}}"#).unwrap_err();
        assert!(e.starts_with("`traffic.rate` is given twice"), "{e}");
        let e = json(br#"{"policies": [{"limits": [], "name": "a", "name": "b"}]}"#).unwrap_err();
        assert!(e.starts_with("`policies[0].name` is given twice"), "{e}");
        let e = json(br#"[[{"a": {"b": 1, "b": 2}}]]"#).unwrap_err();
        assert!(e.starts_with("`[0][0].a.b` is given twice"), "{e}");
    }

    #[test]
    fn a_json_body_without_duplicates_reads_as_serde_json_reads_it() {
        let text = br#"{"a": [1, -2, 3.5, "x", null, true, {"b": {}}], "c": {"a": 1}}"#;
        assert_eq!(
            json(text).unwrap(),
            serde_json::from_slice::<Value>(text).unwrap()
        );
        // The same key in two different objects is not a duplicate.
        assert!(json(br#"{"a": {"k": 1}, "b": {"k": 1}}"#).is_ok());
        assert!(
            json(b"{} x")
                .unwrap_err()
                .starts_with("the body is not valid JSON")
        );
        assert!(
            json(b"{\"a\": ")
                .unwrap_err()
                .starts_with("the body is not valid JSON")
        );
    }

    #[test]
    fn a_yaml_key_given_twice_is_placed_at_both_occurrences() {
        let text = "policies:\n  api: 1\n  web: 2\n  api: 3\n";
        let Parsed::Duplicate { duplicate, error } =
            read(serde_yaml_ng::Deserializer::from_str(text), None)
        else {
            panic!("no duplicate found");
        };
        assert_eq!(duplicate.full_path(), "policies.api");
        let at = error.location().unwrap();
        assert_eq!((at.line(), at.column()), (4, 3));
        let Parsed::Probed(first) = read(
            serde_yaml_ng::Deserializer::from_str(text),
            Some(Probe(duplicate)),
        ) else {
            panic!("the probe was not reached");
        };
        let at = first.location().unwrap();
        assert_eq!((at.line(), at.column()), (2, 3));
    }
}
