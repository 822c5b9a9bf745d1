//! Durations as the configuration writes them (`250ms`, `1s`, `5m`, `1h`, `1d`): a leaf that
//! the configuration, the RLQS rules, the simulator and the load generator all read with.

use std::fmt;
use std::time::Duration;

use serde::Deserialize;
use serde::de::{self, Deserializer};

/// Why a text is not a [`PositiveDuration`]; each names the text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    /// No unit, or one not known.
    #[error("`{0}` is not a duration; write a whole number and a unit: 250ms, 1s, 5m, 1h, 1d")]
    Unit(String),
    /// No whole number before the unit.
    #[error("`{0}` is not a duration; write e.g. 250ms, 1s, 5m, 1h, 1d")]
    Number(String),
    /// More milliseconds than a `u64` holds.
    #[error("`{0}` is too long a duration")]
    TooLong(String),
    /// Zero.
    #[error("`{0}` is not a positive duration")]
    Zero(String),
}

/// A positive duration written `250ms`, `1s`, `5m`, `1h` or `1d`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PositiveDuration(pub Duration);

impl PositiveDuration {
    /// Parses `250ms`, `1s`, `5m`, `1h`, `1d`.
    pub fn parse(text: &str) -> Result<Self, DurationError> {
        let t = text.trim();
        let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
        let (digits, unit) = t.split_at(split);
        let factor: u64 = match unit {
            "ms" => 1,
            "s" => 1_000,
            "m" => 60_000,
            "h" => 3_600_000,
            "d" => 86_400_000,
            _ => return Err(DurationError::Unit(text.to_owned())),
        };
        let n: u64 = digits
            .parse()
            .map_err(|_| DurationError::Number(text.to_owned()))?;
        let ms = n
            .checked_mul(factor)
            .ok_or_else(|| DurationError::TooLong(text.to_owned()))?;
        if ms == 0 {
            return Err(DurationError::Zero(text.to_owned()));
        }
        Ok(Self(Duration::from_millis(ms)))
    }

    pub fn millis(self) -> u64 {
        u64::try_from(self.0.as_millis()).unwrap_or(u64::MAX)
    }
}

impl<'de> Deserialize<'de> for PositiveDuration {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl de::Visitor<'_> for V {
            type Value = PositiveDuration;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a duration such as 250ms, 1s, 5m, 1h or 1d")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                PositiveDuration::parse(v).map_err(E::custom)
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
                Err(E::custom(format!(
                    "`{v}` has no unit; write e.g. {v}s or {v}ms"
                )))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
                Err(E::custom(format!("`{v}` is not a positive duration")))
            }
        }
        d.deserialize_any(V)
    }
}
