//! Timestamps, to the millisecond, read by `jiff`: RFC 3339 / ISO 8601 with any offset
//! (`Z`, `+01:00`, `+0100`, `+01`), the `$time_local` of Nginx and Apache
//! (`10/Oct/2000:13:55:36 -0700`), and Unix epoch numbers in seconds, milliseconds,
//! microseconds or nanoseconds, named or told apart by their magnitude.

use std::fmt;

/// Why a log's time cannot be read; each names the text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TimeError {
    /// `time_unit` is not one of `s`, `ms`, `us`, `ns`.
    #[error("`{0}` is not a unit of Unix time; expected s, ms, us or ns")]
    Unit(String),
    /// Neither an epoch number nor an RFC 3339 time.
    #[error("`{0}` is not Unix time or RFC 3339")]
    NotATime(String),
    /// An epoch number of another magnitude than the log's first.
    #[error(
        "`{text}` looks like Unix {unit} but the log's first time was in {first}; name the \
         unit (time_unit)"
    )]
    MixedUnits {
        text: String,
        unit: TimeUnit,
        first: TimeUnit,
    },
    /// Past the largest instant a decision takes (2^53 ms).
    #[error("`{0}` is too far in the future")]
    TooLate(String),
    /// Not an RFC 3339 time.
    #[error("`{0}` is not Unix time or an RFC 3339 time such as 2026-01-01T00:00:00.250Z")]
    NotRfc3339(String),
    /// Not a `$time_local`.
    #[error("`{0}` is not a time such as 10/Oct/2000:13:55:36 -0700")]
    NotCommonLog(String),
    /// Before the Unix epoch.
    #[error("`{0}` is before 1970")]
    BeforeEpoch(String),
}

/// The unit of a Unix epoch number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeUnit {
    /// Seconds (a fraction allowed: `1767225600.250`).
    Seconds,
    /// Milliseconds.
    Millis,
    /// Microseconds.
    Micros,
    /// Nanoseconds.
    Nanos,
}

impl TimeUnit {
    /// Each unit (in the order declared: `entry` indexes it), its name, and what turns it into
    /// ms (multiply, then divide).
    const ALL: [(Self, &'static str, u64, u64); 4] = [
        (Self::Seconds, "s", 1_000, 1),
        (Self::Millis, "ms", 1, 1),
        (Self::Micros, "us", 1, 1_000),
        (Self::Nanos, "ns", 1, 1_000_000),
    ];

    /// Reads `s`, `ms`, `us` (or `µs`) or `ns`.
    pub fn parse(text: &str) -> Result<Self, TimeError> {
        let name = if text == "µs" { "us" } else { text };
        Self::ALL
            .iter()
            .find(|u| u.1 == name)
            .map(|u| u.0)
            .ok_or_else(|| TimeError::Unit(text.to_owned()))
    }

    /// The unit a whole number of this size is in: seconds below 10^11 (up to the year 5138),
    /// then milliseconds below 10^14, microseconds below 10^17, nanoseconds above.
    fn by_magnitude(whole: u64) -> Self {
        match whole {
            0..100_000_000_000 => Self::Seconds,
            100_000_000_000..100_000_000_000_000 => Self::Millis,
            100_000_000_000_000..100_000_000_000_000_000 => Self::Micros,
            _ => Self::Nanos,
        }
    }

    fn entry(self) -> (Self, &'static str, u64, u64) {
        Self::ALL[self as usize]
    }
}

impl fmt::Display for TimeUnit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.entry().1)
    }
}

/// Reads the times of one log: remembers the unit of its first epoch number, so that a number
/// of another magnitude later on is refused rather than read in another unit.
#[derive(Debug, Clone, Default)]
pub(crate) struct Clock {
    /// The unit named by the caller (`time_unit`), if any.
    pub(crate) named: Option<TimeUnit>,
    /// The unit the first epoch number was told to be in, by its magnitude.
    pub(crate) seen: Option<TimeUnit>,
}

impl Clock {
    /// A Unix epoch number or an RFC 3339 time, to ms since the epoch.
    pub(crate) fn read(&mut self, text: &str) -> Result<u64, TimeError> {
        let text = text.trim();
        if text.starts_with(|c: char| c.is_ascii_digit())
            && text.chars().all(|c| c.is_ascii_digit() || c == '.')
        {
            return self.epoch(text);
        }
        rfc3339(text)
    }

    fn epoch(&mut self, text: &str) -> Result<u64, TimeError> {
        let not = || TimeError::NotATime(text.to_owned());
        let (whole, frac) = text.split_once('.').unwrap_or((text, ""));
        if frac.contains('.') {
            return Err(not());
        }
        let whole: u64 = whole.parse().map_err(|_| not())?;
        let unit = match (self.named, self.seen) {
            (Some(unit), _) => unit,
            (None, seen) => {
                let unit = TimeUnit::by_magnitude(whole);
                match seen {
                    Some(first) if first != unit => {
                        return Err(TimeError::MixedUnits {
                            text: text.to_owned(),
                            unit,
                            first,
                        });
                    }
                    Some(_) => {}
                    None => self.seen = Some(unit),
                }
                unit
            }
        };
        let (_, _, mul, div) = unit.entry();
        let frac_ms: u64 = if unit == TimeUnit::Seconds && !frac.is_empty() {
            format!("{frac:0<3}")[..3].parse().map_err(|_| not())?
        } else {
            0
        };
        whole
            .checked_mul(mul)
            .map(|ms| ms / div)
            .and_then(|ms| ms.checked_add(frac_ms))
            .filter(|&t| t <= sluice::core::MAX_AMOUNT)
            .ok_or_else(|| TimeError::TooLate(text.to_owned()))
    }
}

/// An RFC 3339 (ISO 8601) instant with any offset: `2026-01-01T00:00:00.250Z`,
/// `2026-01-01 01:00:00+01:00`, `2026-01-01T01:00:00+0100`.
pub(crate) fn rfc3339(text: &str) -> Result<u64, TimeError> {
    let t: jiff::Timestamp = text
        .trim()
        .parse()
        .map_err(|_| TimeError::NotRfc3339(text.to_owned()))?;
    after_epoch(text, t)
}

/// Nginx's and Apache's `$time_local` / `%t`: `10/Oct/2000:13:55:36 -0700`.
pub(crate) fn common_log(text: &str) -> Result<u64, TimeError> {
    let t = jiff::fmt::strtime::parse("%d/%b/%Y:%H:%M:%S %z", text)
        .and_then(|t| t.to_timestamp())
        .map_err(|_| TimeError::NotCommonLog(text.to_owned()))?;
    after_epoch(text, t)
}

fn after_epoch(text: &str, t: jiff::Timestamp) -> Result<u64, TimeError> {
    u64::try_from(t.as_millisecond()).map_err(|_| TimeError::BeforeEpoch(text.to_owned()))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn times_read_as_written() {
        let mut c = Clock::default();
        assert_eq!(c.read("1767225600").unwrap(), 1_767_225_600_000);
        assert_eq!(c.read("1767225600.25").unwrap(), 1_767_225_600_250);
        assert_eq!(
            c.read("2026-01-01T00:00:00.250Z").unwrap(),
            1_767_225_600_250
        );
        assert_eq!(
            c.read("2026-01-01T01:00:00+01:00").unwrap(),
            1_767_225_600_000
        );
        assert_eq!(
            c.read("2026-01-01T01:00:00+0100").unwrap(),
            1_767_225_600_000
        );
        assert_eq!(
            common_log("01/Jan/2026:00:00:01 +0000").unwrap(),
            1_767_225_601_000
        );
        assert_eq!(
            common_log("10/Oct/2000:13:55:36 -0700").unwrap(),
            971_211_336_000
        );
        for bad in [
            "yesterday",
            "2026-13-01T00:00:00Z",
            "1.5.5",
            "2026-02-30T00:00:00Z",
        ] {
            assert!(c.read(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn epoch_units_are_told_by_magnitude_and_kept() {
        let mut c = Clock::default();
        assert_eq!(c.read("1767225600250").unwrap(), 1_767_225_600_250);
        // Seconds after milliseconds: refused, not read as 1970.
        let e = c.read("1767225601").unwrap_err().to_string();
        assert!(e.contains("first time was in ms"), "{e}");
        let mut c = Clock::default();
        assert_eq!(c.read("1767225600250000").unwrap(), 1_767_225_600_250);
        let mut c = Clock::default();
        assert_eq!(c.read("1767225600250000000").unwrap(), 1_767_225_600_250);
        let mut c = Clock {
            named: Some(TimeUnit::Millis),
            seen: None,
        };
        assert_eq!(c.read("1000").unwrap(), 1_000);
    }
}
