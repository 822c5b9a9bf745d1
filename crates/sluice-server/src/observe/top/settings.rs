//! The `top` section: the heavy-hitter summaries' size and window.

use serde::Deserialize;
use sluice_spec::FieldError;

use sluice_spec::units::PositiveDuration;

#[derive(Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct RawTop {
    capacity: Option<usize>,
    window: Option<PositiveDuration>,
}

/// `top`: how many keys per policy the heavy-hitter summaries hold, over what window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TopSettings {
    /// Keys held per policy and measure (0: none).
    pub capacity: usize,
    /// The epoch length: a reading covers one to two of them.
    pub window_ms: u64,
}

/// The default `top.capacity`.
pub const DEFAULT_TOP_CAPACITY: usize = 64;
/// The largest `top.capacity`.
pub const MAX_TOP_CAPACITY: usize = 10_000;

pub(crate) fn top_config(raw: RawTop) -> Result<TopSettings, FieldError> {
    let capacity = raw.capacity.unwrap_or(DEFAULT_TOP_CAPACITY);
    if capacity > MAX_TOP_CAPACITY {
        return Err(FieldError::new(
            "top.capacity",
            format!("at most {MAX_TOP_CAPACITY} keys per policy, got {capacity}"),
        ));
    }
    Ok(TopSettings {
        capacity,
        window_ms: raw.window.map_or(60_000, PositiveDuration::millis),
    })
}
