//! What the in-memory benches share.

use std::time::Duration;

/// How long one measured round lasts: `smoke` when the binary was not started with `--bench`
/// (a test runner smoke-testing it), else `SLUICE_BENCH_SECS` seconds, `default_secs` without it.
pub(crate) fn round(default_secs: f64, smoke: Duration) -> Duration {
    if !std::env::args().any(|a| a == "--bench") {
        return smoke;
    }
    let secs: f64 = std::env::var("SLUICE_BENCH_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default_secs);
    Duration::from_secs_f64(secs)
}
