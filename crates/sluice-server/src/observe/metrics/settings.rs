//! The `metrics` section: what `/metrics` counts beyond the decisions themselves.

use serde::Deserialize;
use sluice_spec::FieldError;

#[derive(Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct RawMetrics {
    near_limit_ratio: Option<f64>,
}

/// `metrics`: reloaded with the policies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MetricsSettings {
    /// `metrics.near_limit_ratio` (the reference's `NEAR_LIMIT_RATIO`, default 0.8).
    pub near_limit: NearLimit,
}

impl Default for MetricsSettings {
    fn default() -> Self {
        Self {
            near_limit: NearLimit::DEFAULT,
        }
    }
}

pub(crate) fn metrics_config(raw: RawMetrics) -> Result<MetricsSettings, FieldError> {
    let near_limit = match raw.near_limit_ratio {
        None => NearLimit::DEFAULT,
        Some(r) => NearLimit::new(r).ok_or_else(|| {
            FieldError::new(
                "metrics.near_limit_ratio",
                format!("{r} is not a fraction of a limit; expected a number in (0, 1], e.g. 0.8"),
            )
        })?,
    };
    Ok(MetricsSettings { near_limit })
}

/// `metrics.near_limit_ratio` as an exact fraction, so the hot path's test is one integer
/// comparison with no rounding: `used / capacity >= ratio`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NearLimit {
    /// The ratio in millionths.
    ppm: u64,
}

impl NearLimit {
    /// The reference's default (`NEAR_LIMIT_RATIO`, 0.8).
    pub const DEFAULT: NearLimit = NearLimit { ppm: 800_000 };

    /// The ratio `ratio` (in (0, 1]), kept to a millionth.
    pub fn new(ratio: f64) -> Option<NearLimit> {
        (ratio > 0.0 && ratio <= 1.0).then(|| NearLimit {
            ppm: ((ratio * 1e6).round() as u64).max(1),
        })
    }

    /// Whether `remaining` of `capacity` means the limit is at least the ratio used.
    pub fn reached(self, capacity: u64, remaining: u64) -> bool {
        let used = u128::from(capacity.saturating_sub(remaining));
        capacity > 0 && used * 1_000_000 >= u128::from(self.ppm) * u128::from(capacity)
    }
}

#[cfg(test)]
mod tests {
    use super::NearLimit;

    #[test]
    fn near_limit_is_reached_at_the_ratio_and_not_before() {
        let r = NearLimit::DEFAULT;
        // max 10: the 8th unit used is the first at 80 %.
        assert!(!r.reached(10, 3));
        assert!(r.reached(10, 2));
        assert!(r.reached(10, 0));
        assert!(!r.reached(0, 0), "a limit of 0 is never near");
        let seven = NearLimit::new(0.7).unwrap();
        assert!(!seven.reached(10, 4) && seven.reached(10, 3));
        assert!(NearLimit::new(1.0).unwrap().reached(3, 0));
        assert!(!NearLimit::new(1.0).unwrap().reached(3, 1));
        assert!(r.reached(u64::MAX, 0), "no overflow");
        assert_eq!(NearLimit::new(0.0), None);
        assert_eq!(NearLimit::new(1.5), None);
        assert_eq!(NearLimit::new(f64::NAN), None);
    }
}
