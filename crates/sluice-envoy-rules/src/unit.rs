//! The time unit of the reference's rules and of a limit a request carries.

use std::fmt;

/// The time unit of a rate limit: the reference's `RateLimitResponse.RateLimit.Unit` without
/// `UNKNOWN`.
///
/// The reference aligns every window to the Unix epoch: a window starts at a multiple of the
/// unit's length (`(now / divider) * divider` in `GenerateCacheKey`), with fixed lengths —
/// a week is 7 days (windows start on Thursdays, 00:00 UTC), a month 30 days, a year 365
/// days. Sluice's `LimitSpec::fixed_window(requests_per_unit, unit.millis()).aligned()` is
/// the same window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Unit {
    /// One second.
    Second,
    /// 60 seconds.
    Minute,
    /// 3,600 seconds.
    Hour,
    /// 86,400 seconds.
    Day,
    /// 7 days.
    Week,
    /// 30 days (the reference's default; it does not follow calendar months).
    Month,
    /// 365 days.
    Year,
}

impl Unit {
    /// Every unit, shortest first.
    pub const ALL: [Unit; 7] = [
        Unit::Second,
        Unit::Minute,
        Unit::Hour,
        Unit::Day,
        Unit::Week,
        Unit::Month,
        Unit::Year,
    ];

    /// The unit's length in seconds (`UnitToDivider` in the reference).
    pub fn seconds(self) -> u64 {
        match self {
            Unit::Second => 1,
            Unit::Minute => 60,
            Unit::Hour => 60 * 60,
            Unit::Day => 24 * 60 * 60,
            Unit::Week => 7 * 24 * 60 * 60,
            Unit::Month => 30 * 24 * 60 * 60,
            Unit::Year => 365 * 24 * 60 * 60,
        }
    }

    /// The unit's length in milliseconds: the window of Sluice's aligned fixed window.
    pub fn millis(self) -> u64 {
        self.seconds() * 1000
    }

    /// The unit as written in configuration files: `second`, `minute`, ...
    pub fn as_str(self) -> &'static str {
        match self {
            Unit::Second => "second",
            Unit::Minute => "minute",
            Unit::Hour => "hour",
            Unit::Day => "day",
            Unit::Week => "week",
            Unit::Month => "month",
            Unit::Year => "year",
        }
    }

    /// The name of the unit in `rls.proto` (`SECOND`, `MINUTE`, ...).
    pub fn proto_name(self) -> &'static str {
        match self {
            Unit::Second => "SECOND",
            Unit::Minute => "MINUTE",
            Unit::Hour => "HOUR",
            Unit::Day => "DAY",
            Unit::Week => "WEEK",
            Unit::Month => "MONTH",
            Unit::Year => "YEAR",
        }
    }

    /// Reads a unit as the reference does: upper-cased, compared with the proto names, so
    /// `minute`, `Minute` and `MINUTE` are all accepted. `unknown` is not a unit.
    pub fn parse(text: &str) -> Option<Unit> {
        let upper = text.to_uppercase();
        Unit::ALL.into_iter().find(|u| u.proto_name() == upper)
    }
}

impl fmt::Display for Unit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units() {
        assert_eq!(Unit::parse("minute"), Some(Unit::Minute));
        assert_eq!(Unit::parse("SECOND"), Some(Unit::Second));
        assert_eq!(Unit::parse("Week"), Some(Unit::Week));
        assert_eq!(Unit::parse("unknown"), None);
        assert_eq!(Unit::parse("fortnight"), None);
        assert_eq!(Unit::parse(""), None);
        assert_eq!(Unit::Day.millis(), 86_400_000);
        assert_eq!(Unit::Year.seconds(), 31_536_000);
        assert_eq!(Unit::Month.to_string(), "month");
    }
}
