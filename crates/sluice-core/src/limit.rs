//! Limits and policies, validated at construction so an invalid one cannot exist.

use std::fmt;

/// The largest `max`, `burst` or `cost` accepted: 2^53, the largest integer a Redis Lua number
/// (an IEEE double) holds exactly, so every store computes the same answer.
pub const MAX_AMOUNT: u64 = 1 << 53;

/// The shortest `per`: one millisecond.
pub const MIN_PER_MS: u64 = 1;

/// The longest `per`: 366 days.
pub const MAX_PER_MS: u64 = 366 * 24 * 60 * 60 * 1000;

/// The most precision buckets one sliding window may have. Each decision sums the buckets in
/// the window, so this bounds both the work of a decision and the memory of a key.
pub const MAX_BUCKETS: u64 = 3_600;

/// The fewest buckets the default sliding precision aims for (Carlson's "per / 60").
pub const DEFAULT_BUCKETS: u64 = 60;

/// A duration as the configuration writes it: a whole number of the largest unit that divides
/// it exactly (`1s`, `90m`, `1500ms`, `366d`), so an error shows what its reader wrote.
pub fn duration_text(ms: u64) -> String {
    const UNITS: [(u64, &str); 4] = [
        (86_400_000, "d"),
        (3_600_000, "h"),
        (60_000, "m"),
        (1_000, "s"),
    ];
    UNITS
        .iter()
        .find(|(size, _)| ms != 0 && ms.is_multiple_of(*size))
        .map_or_else(
            || format!("{ms}ms"),
            |(size, unit)| format!("{}{unit}", ms / size),
        )
}

/// The longest time a token bucket may take to refill from empty (`burst · per / max`):
/// about 142 years. It keeps every instant a bucket computes below 2^53 ms.
pub const MAX_REFILL_MS: u64 = 1 << 42;

/// The most limits one policy may hold (a second, a minute, an hour and a day, say). A decision
/// carries every limit's status inline (no allocation), in an array this long, and is moved by
/// value through every layer of a call: each limit allowed costs every decision 56 bytes more
/// to copy, whatever its policy. With 4 a decision is 248 bytes, within glibc's cheapest copy
/// (docs/benchmarks.md measured 4, 8 and 16).
pub const MAX_LIMITS_PER_POLICY: usize = 4;

/// The longest policy name, in bytes.
pub const MAX_POLICY_NAME_LEN: usize = 128;

/// How a limit counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum Algorithm {
    /// A window of `per` that opens at the first admitted request (or aligned to the epoch).
    #[default]
    FixedWindow,
    /// A window of `per` that slides in steps of `precision`.
    SlidingWindow,
    /// A token bucket of `burst` tokens refilled at `max` per `per`, computed as GCRA.
    TokenBucket,
    /// At most `max` units held at once by leases (requests in flight); a lease that is not
    /// released lapses `per` after it was taken.
    Concurrency,
}

impl Algorithm {
    /// The name used in configuration files and API bodies.
    pub fn as_str(self) -> &'static str {
        match self {
            Algorithm::FixedWindow => "fixed_window",
            Algorithm::SlidingWindow => "sliding_window",
            Algorithm::TokenBucket => "token_bucket",
            Algorithm::Concurrency => "concurrency",
        }
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Algorithm {
    type Err = LimitError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "fixed_window" => Ok(Algorithm::FixedWindow),
            "sliding_window" => Ok(Algorithm::SlidingWindow),
            "token_bucket" => Ok(Algorithm::TokenBucket),
            "concurrency" => Ok(Algorithm::Concurrency),
            other => Err(LimitError::new(
                "algorithm",
                format!(
                    "`{other}` is not an algorithm; expected fixed_window, sliding_window, \
                     token_bucket or concurrency"
                ),
            )),
        }
    }
}

/// A limit or policy that cannot be built, naming the field at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct LimitError {
    /// The field at fault, as a path: `max`, `limits[1].per`, `name`.
    pub field: String,
    /// What is wrong with it, in words a person can act on.
    pub reason: String,
}

impl LimitError {
    pub(crate) fn new(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            reason: reason.into(),
        }
    }

    pub(crate) fn within(mut self, prefix: &str) -> Self {
        self.field = format!("{prefix}.{}", self.field);
        self
    }
}

/// The raw description of a limit, before validation. Options that do not apply to the
/// chosen algorithm must be left unset.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LimitSpec {
    /// Units admitted per `per`.
    pub max: u64,
    /// The window (or refill period) in milliseconds.
    pub per_ms: u64,
    /// How the limit counts.
    pub algorithm: Algorithm,
    /// `sliding_window` only: the bucket width in milliseconds (default: see [`Limit`]).
    pub precision_ms: Option<u64>,
    /// `token_bucket` only: the bucket size (default `max`).
    pub burst: Option<u64>,
    /// `fixed_window` only: align windows to multiples of `per` since the epoch.
    pub align: bool,
}

impl LimitSpec {
    /// A fixed window of `max` per `per_ms`.
    pub fn fixed_window(max: u64, per_ms: u64) -> Self {
        Self {
            max,
            per_ms,
            ..Self::default()
        }
    }

    /// A sliding window of `max` per `per_ms` with the default precision.
    pub fn sliding_window(max: u64, per_ms: u64) -> Self {
        Self {
            max,
            per_ms,
            algorithm: Algorithm::SlidingWindow,
            ..Self::default()
        }
    }

    /// At most `max` units in flight, each lease lapsing `lease_ttl_ms` after it was taken
    /// unless released before.
    pub fn concurrency(max: u64, lease_ttl_ms: u64) -> Self {
        Self {
            max,
            per_ms: lease_ttl_ms,
            algorithm: Algorithm::Concurrency,
            ..Self::default()
        }
    }

    /// A token bucket of `max` per `per_ms` with `burst = max`.
    pub fn token_bucket(max: u64, per_ms: u64) -> Self {
        Self {
            max,
            per_ms,
            algorithm: Algorithm::TokenBucket,
            ..Self::default()
        }
    }

    /// Sets the sliding window's bucket width.
    pub fn precision_ms(mut self, precision_ms: u64) -> Self {
        self.precision_ms = Some(precision_ms);
        self
    }

    /// Sets the token bucket's size.
    pub fn burst(mut self, burst: u64) -> Self {
        self.burst = Some(burst);
        self
    }

    /// Aligns a fixed window to multiples of `per` since the epoch.
    pub fn aligned(mut self) -> Self {
        self.align = true;
        self
    }

    /// Validates the spec.
    pub fn build(self) -> Result<Limit, LimitError> {
        Limit::new(self)
    }
}

/// A validated limit: `max` units per `per` counted by an algorithm.
///
/// Invariants, checked by [`Limit::new`]:
/// - `1 <= max <= 2^53`, `1 ms <= per <= 366 days`;
/// - `sliding_window`: `precision` divides `per` into at most [`MAX_BUCKETS`] buckets. The
///   default precision is `per / n` for the smallest `n >= 60` that divides `per` (Carlson's
///   `per / 60` when `per` is a multiple of 60 ms; 10 ms for `per = 1s`), or 1 ms when `per`
///   is shorter than 60 ms;
/// - `token_bucket`: `1 <= burst <= 2^53` and refilling the whole burst takes at most
///   [`MAX_REFILL_MS`];
/// - `concurrency`: `per` is how long a lease lasts when it is not released (its TTL);
/// - options of other algorithms are unset.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Limit {
    max: u64,
    per_ms: u64,
    algorithm: Algorithm,
    precision_ms: u64,
    burst: u64,
    align: bool,
}

/// Each option is set only for the algorithm it belongs to.
fn check_options_apply(
    algorithm: Algorithm,
    precision_ms: Option<u64>,
    burst: Option<u64>,
    align: bool,
) -> Result<(), LimitError> {
    if algorithm != Algorithm::SlidingWindow && precision_ms.is_some() {
        return Err(LimitError::new(
            "precision",
            format!("precision applies only to sliding_window, not {algorithm}"),
        ));
    }
    if algorithm != Algorithm::TokenBucket && burst.is_some() {
        return Err(LimitError::new(
            "burst",
            format!("burst applies only to token_bucket, not {algorithm}"),
        ));
    }
    if algorithm != Algorithm::FixedWindow && align {
        return Err(LimitError::new(
            "align",
            format!("align applies only to fixed_window, not {algorithm}"),
        ));
    }
    Ok(())
}

/// A token bucket's burst: from 1 to 2^53, refilled from empty within [`MAX_REFILL_MS`].
fn token_bucket_burst(burst: u64, max: u64, per_ms: u64) -> Result<u64, LimitError> {
    if burst == 0 || burst > MAX_AMOUNT {
        return Err(LimitError::new(
            "burst",
            format!("{burst} is out of range; burst must be between 1 and 2^53"),
        ));
    }
    let refill = u128::from(burst) * u128::from(per_ms) / u128::from(max);
    if refill > u128::from(MAX_REFILL_MS) {
        return Err(LimitError::new(
            "burst",
            format!(
                "refilling {burst} tokens at {max} per {} takes about {} days, \
                 longer than the {} days allowed (2^42 ms); lower burst or raise max",
                duration_text(per_ms),
                refill / 86_400_000,
                MAX_REFILL_MS / 86_400_000
            ),
        ));
    }
    Ok(burst)
}

impl Limit {
    /// Validates `spec` into a limit.
    pub fn new(spec: LimitSpec) -> Result<Self, LimitError> {
        let LimitSpec {
            max,
            per_ms,
            algorithm,
            precision_ms,
            burst,
            align,
        } = spec;
        if max == 0 || max > MAX_AMOUNT {
            return Err(LimitError::new(
                "max",
                format!("{max} is out of range; max must be between 1 and 2^53"),
            ));
        }
        if !(MIN_PER_MS..=MAX_PER_MS).contains(&per_ms) {
            return Err(LimitError::new(
                "per",
                format!(
                    "{} is out of range; per must be between 1ms and 366d",
                    duration_text(per_ms)
                ),
            ));
        }
        check_options_apply(algorithm, precision_ms, burst, align)?;
        let precision_ms = match algorithm {
            Algorithm::SlidingWindow => match precision_ms {
                Some(p) => validate_precision(p, per_ms)?,
                None => default_precision(per_ms)?,
            },
            _ => 0,
        };
        let burst = match algorithm {
            Algorithm::TokenBucket => token_bucket_burst(burst.unwrap_or(max), max, per_ms)?,
            _ => 0,
        };
        Ok(Self {
            max,
            per_ms,
            algorithm,
            precision_ms,
            burst,
            align,
        })
    }

    /// Units admitted per window.
    #[inline]
    pub fn max(&self) -> u64 {
        self.max
    }

    /// The window in milliseconds.
    #[inline]
    pub fn per_ms(&self) -> u64 {
        self.per_ms
    }

    /// The algorithm.
    #[inline]
    pub fn algorithm(&self) -> Algorithm {
        self.algorithm
    }

    /// The sliding window's bucket width in ms (0 for other algorithms).
    #[inline]
    pub fn precision_ms(&self) -> u64 {
        self.precision_ms
    }

    /// The number of buckets of a sliding window (0 for other algorithms).
    pub fn buckets(&self) -> u64 {
        self.per_ms.checked_div(self.precision_ms).unwrap_or(0)
    }

    /// The token bucket's size (0 for other algorithms).
    #[inline]
    pub fn burst(&self) -> u64 {
        self.burst
    }

    /// The most units this limit holds at once, what a fresh key has `remaining`: a token
    /// bucket's `burst`, otherwise `max`. It is the `limit` a decision reports
    /// ([`LimitStatus::capacity`](crate::LimitStatus::capacity), docs/algorithms.md).
    pub fn capacity(&self) -> u64 {
        match self.algorithm {
            Algorithm::TokenBucket => self.burst,
            _ => self.max,
        }
    }

    /// Whether a fixed window is aligned to the epoch.
    #[inline]
    pub fn align(&self) -> bool {
        self.align
    }

    /// A short tag naming the shape of this limit's stored state, e.g. `fw1000`,
    /// `fwa1000`, `sw60000p1000`, `tb1000m100b20`. Two limits with the same tag interpret the
    /// same stored state the same way; a store keys state by it, so changing a limit's shape
    /// in a configuration starts its counting afresh instead of misreading old state.
    /// A fixed or sliding window keeps its count when only `max` changes.
    pub fn state_tag(&self) -> String {
        match self.algorithm {
            Algorithm::FixedWindow if self.align => format!("fwa{}", self.per_ms),
            Algorithm::FixedWindow => format!("fw{}", self.per_ms),
            Algorithm::SlidingWindow => format!("sw{}p{}", self.per_ms, self.precision_ms),
            Algorithm::TokenBucket => format!("tb{}m{}b{}", self.per_ms, self.max, self.burst),
            // Each lease carries its own expiry, so changing the TTL or max keeps the leases.
            Algorithm::Concurrency => "cc".to_owned(),
        }
    }
}

fn validate_precision(precision_ms: u64, per_ms: u64) -> Result<u64, LimitError> {
    if precision_ms == 0 {
        return Err(LimitError::new(
            "precision",
            "0ms is not a positive duration",
        ));
    }
    if precision_ms > per_ms || !per_ms.is_multiple_of(precision_ms) {
        return Err(LimitError::new(
            "precision",
            format!(
                "per ({}) must be a multiple of precision ({})",
                duration_text(per_ms),
                duration_text(precision_ms)
            ),
        ));
    }
    if per_ms / precision_ms > MAX_BUCKETS {
        return Err(LimitError::new(
            "precision",
            format!(
                "{} splits per ({}) into {} buckets; at most {MAX_BUCKETS} are allowed, so \
                 precision must be at least {}",
                duration_text(precision_ms),
                duration_text(per_ms),
                per_ms / precision_ms,
                duration_text(per_ms.div_ceil(MAX_BUCKETS))
            ),
        ));
    }
    Ok(precision_ms)
}

fn default_precision(per_ms: u64) -> Result<u64, LimitError> {
    if per_ms < DEFAULT_BUCKETS {
        return Ok(1);
    }
    (DEFAULT_BUCKETS..=MAX_BUCKETS)
        .find(|&n| per_ms.is_multiple_of(n))
        .map(|n| per_ms / n)
        .ok_or_else(|| {
            LimitError::new(
                "precision",
                format!(
                    "no default precision splits per ({}) into {DEFAULT_BUCKETS} to \
                     {MAX_BUCKETS} equal buckets; set precision explicitly",
                    duration_text(per_ms)
                ),
            )
        })
}
#[cfg(test)]
mod tests {
    use super::*;

    fn err(spec: LimitSpec) -> LimitError {
        match Limit::new(spec) {
            Err(e) => e,
            Ok(l) => panic!("expected an error, built {l:?}"),
        }
    }

    #[test]
    fn zero_max_is_refused_naming_max() {
        assert_eq!(err(LimitSpec::fixed_window(0, 1000)).field, "max");
        assert_eq!(
            err(LimitSpec::fixed_window(MAX_AMOUNT + 1, 1000)).field,
            "max"
        );
        assert!(Limit::new(LimitSpec::fixed_window(MAX_AMOUNT, 1000)).is_ok());
    }

    #[test]
    fn per_out_of_range_is_refused() {
        assert_eq!(err(LimitSpec::fixed_window(1, 0)).field, "per");
        assert_eq!(err(LimitSpec::fixed_window(1, MAX_PER_MS + 1)).field, "per");
        assert!(Limit::new(LimitSpec::fixed_window(1, MAX_PER_MS)).is_ok());
        assert!(Limit::new(LimitSpec::fixed_window(1, 1)).is_ok());
    }

    #[test]
    fn sliding_precision_must_divide_per() {
        let e = err(LimitSpec::sliding_window(10, 1000).precision_ms(300));
        assert_eq!(e.field, "precision");
        assert!(e.reason.contains("multiple"), "{e}");
        assert_eq!(
            err(LimitSpec::sliding_window(10, 1000).precision_ms(0)).field,
            "precision"
        );
        assert_eq!(
            err(LimitSpec::sliding_window(10, 1000).precision_ms(2000)).field,
            "precision"
        );
        let e = err(LimitSpec::sliding_window(10, 3_600_000).precision_ms(1));
        assert!(e.reason.contains("buckets"), "{e}");
    }

    #[test]
    fn sliding_default_precision() {
        let l = |per| {
            LimitSpec::sliding_window(10, per)
                .build()
                .map(|l| l.precision_ms())
        };
        assert_eq!(l(60_000), Ok(1_000));
        assert_eq!(l(3_600_000), Ok(60_000));
        assert_eq!(l(1_000), Ok(10));
        assert_eq!(l(7), Ok(1));
        assert_eq!(l(60), Ok(1));
        // A prime number of ms longer than MAX_BUCKETS has no default.
        assert_eq!(l(7_919).map_err(|e| e.field), Err("precision".to_string()));
    }

    #[test]
    fn burst_zero_is_refused_and_options_must_match_algorithm() {
        assert_eq!(
            err(LimitSpec::token_bucket(10, 1000).burst(0)).field,
            "burst"
        );
        assert_eq!(
            err(LimitSpec::fixed_window(10, 1000).burst(5)).field,
            "burst"
        );
        assert_eq!(
            err(LimitSpec::fixed_window(10, 1000).precision_ms(5)).field,
            "precision"
        );
        assert_eq!(
            err(LimitSpec::token_bucket(10, 1000).aligned()).field,
            "align"
        );
        let e = err(LimitSpec::token_bucket(1, MAX_PER_MS).burst(MAX_AMOUNT));
        assert!(e.reason.contains("refilling"), "{e}");
        assert_eq!(
            LimitSpec::token_bucket(7, 1000).build().map(|l| l.burst()),
            Ok(7)
        );
    }
}
