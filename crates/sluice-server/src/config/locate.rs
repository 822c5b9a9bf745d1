//! The line of a value named by its path (`rlqs.buckets[0].policy`), for the errors of checks
//! made once the file has been read (a policy's limits together, an `rlqs` rule against the
//! policies, the `store` layout), which have no position of their own.
//!
//! serde_yaml_ng returns no positions with what it reads, but it puts one on an error raised
//! while it reads a value: the position of that value. So the text is read a second time, only
//! when there is an error to place, by a visitor that walks down the path, skipping every
//! other value unread, and fails on purpose at the value the path names.

use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

/// The error the walk raises at the value it looks for.
const FOUND: &str = "\u{0}sluice-config-locate-found";

/// The line and column of the value at `path` in `text` (`policies.api.limits[1]`,
/// `rlqs.buckets[0].policy`; a map key may itself hold dots, as a policy name may), or `None`
/// if the text has no value there.
pub(super) fn locate(text: &str, path: &str) -> Option<(usize, usize)> {
    if path.is_empty() {
        return None;
    }
    let de = serde_yaml_ng::Deserializer::from_str(text);
    match (Walk { rest: path }).deserialize(de) {
        // The message carries the path before it: `listen.http: <FOUND>`.
        Err(e) if e.to_string().contains(FOUND) => e.location().map(|l| (l.line(), l.column())),
        _ => None,
    }
}

/// Reads a value, looking for `rest` below it: the error [`FOUND`] (placed by the parser)
/// when it is there; `Ok(())`, or another error (a scalar where the path goes on), when not.
struct Walk<'p> {
    rest: &'p str,
}

impl<'de> DeserializeSeed<'de> for Walk<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Walk<'_> {
    type Value = ();

    /// A value reached with nothing left of the path is the one looked for: whatever its
    /// type, serde's default for it fails with this text, [`FOUND`].
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.rest.is_empty() {
            f.write_str(FOUND)
        } else {
            write!(f, "a value holding {}", self.rest)
        }
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        if self.rest.is_empty() {
            return Err(de::Error::custom(FOUND));
        }
        while let Some(key) = map.next_key::<serde_yaml_ng::Value>()? {
            let key = match &key {
                serde_yaml_ng::Value::String(s) => s.clone(),
                serde_yaml_ng::Value::Number(n) => n.to_string(),
                serde_yaml_ng::Value::Bool(b) => b.to_string(),
                _ => String::new(),
            };
            let below = self.rest.strip_prefix(key.as_str()).and_then(|after| {
                match after.as_bytes().first() {
                    None => Some(""),
                    Some(b'.') => Some(&after[1..]),
                    Some(b'[') => Some(after),
                    _ => None,
                }
            });
            match below {
                Some(rest) if !key.is_empty() => map.next_value_seed(Walk { rest })?,
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        if self.rest.is_empty() {
            return Err(de::Error::custom(FOUND));
        }
        let index = self
            .rest
            .strip_prefix('[')
            .and_then(|r| r.split_once(']'))
            .and_then(|(i, after)| Some((i.parse::<usize>().ok()?, after)));
        let mut i = 0;
        if let Some((wanted, after)) = index {
            let rest = after.strip_prefix('.').unwrap_or(after);
            while i < wanted {
                if seq.next_element::<IgnoredAny>()?.is_none() {
                    return Ok(());
                }
                i += 1;
            }
            if seq.next_element_seed(Walk { rest })?.is_none() {
                return Ok(());
            }
        }
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(())
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }

    fn visit_newtype_struct<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "\
listen:
  http: 127.0.0.1:8080
policies:
  api:
    limits:
      - { max: 10, per: 1s }
      - max: 5000
        per: 1h
  api.v2:
    limits: [{ max: 1, per: 1m }]
rlqs:
  buckets:
    - { match: { tenant: \"*\" }, policy: api, key: \"tenant:{tenant}\" }
";

    #[test]
    fn a_path_is_found_at_its_value() {
        assert_eq!(locate(TEXT, "listen.http"), Some((2, 9)));
        assert_eq!(locate(TEXT, "policies.api.limits[0]"), Some((6, 9)));
        assert_eq!(locate(TEXT, "policies.api.limits[1].per"), Some((8, 14)));
        assert_eq!(locate(TEXT, "rlqs.buckets[0].policy"), Some((13, 41)));
        // A key holding a dot, beside a key that is its prefix.
        assert_eq!(
            locate(TEXT, "policies.api.v2.limits[0].max"),
            Some((10, 21))
        );
        assert_eq!(locate(TEXT, "policies.api"), Some((5, 5)));
    }

    #[test]
    fn a_path_that_is_not_there_has_no_position() {
        for path in [
            "",
            "store",
            "policies.search",
            "policies.api.limits[2]",
            "listen.http.port",
            "policies.api.limits.x",
            "rlqs.buckets[x]",
        ] {
            assert_eq!(locate(TEXT, path), None, "{path}");
        }
        assert_eq!(locate("[unclosed", "listen"), None);
    }
}
