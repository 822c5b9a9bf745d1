//! Waiting by polling a condition against a deadline.

use std::thread;
use std::time::{Duration, Instant};

use crate::Error;

/// The pause between two evaluations of a polled condition.
pub const POLL_INTERVAL: Duration = Duration::from_millis(5);

/// Evaluates `cond` every [`POLL_INTERVAL`] until it returns `Ok(true)`, for at most `timeout`.
///
/// - `Ok(true)`: done, returns `Ok(())` at once (the condition is always evaluated at least
///   once, and once more after the deadline has passed, so a slow evaluation near the
///   deadline is not lost).
/// - `Ok(false)`: not yet; poll again.
/// - `Err(e)`: a hard failure; returned at once. A condition that expects transient errors
///   (a server still starting refuses connections) turns them into `Ok(false)` itself.
///
/// When the deadline passes, returns [`Error::Timeout`] naming `what`, so a failing test says
/// *what* it was waiting for, e.g. `"replica 127.0.0.1:41234 to reach offset 1200"`.
///
/// ```
/// use std::time::Duration;
/// let mut n = 0;
/// sluice_testkit::wait_until(Duration::from_secs(1), "n to reach 3", || {
///     n += 1;
///     Ok(n >= 3)
/// })?;
/// let err = sluice_testkit::wait_until(Duration::from_millis(20), "the impossible", || Ok(false))
///     .unwrap_err();
/// assert!(err.to_string().contains("the impossible"));
/// # Ok::<(), sluice_testkit::Error>(())
/// ```
pub fn wait_until(
    timeout: Duration,
    what: &str,
    mut cond: impl FnMut() -> Result<bool, Error>,
) -> Result<(), Error> {
    let deadline = Instant::now() + timeout;
    loop {
        let past_deadline = Instant::now() >= deadline;
        if cond()? {
            return Ok(());
        }
        if past_deadline {
            return Err(Error::Timeout {
                what: what.to_owned(),
                timeout,
            });
        }
        thread::sleep(POLL_INTERVAL);
    }
}

/// [`wait_until`] for async tests: awaits `cond` every [`POLL_INTERVAL`] (sleeping on the
/// Tokio timer, so the runtime's other tasks go on) until it returns `true`, for at most
/// `timeout`; past it, [`Error::Timeout`] naming `what`.
pub async fn until(
    timeout: Duration,
    what: &str,
    mut cond: impl AsyncFnMut() -> bool,
) -> Result<(), Error> {
    let deadline = Instant::now() + timeout;
    while !cond().await {
        if Instant::now() >= deadline {
            return Err(Error::Timeout {
                what: what.to_owned(),
                timeout,
            });
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
    Ok(())
}

/// Adds what the last poll saw to a timeout's description, so the failure says not only what
/// was awaited but how far it got.
pub(crate) fn with_last_seen<T>(waited: Result<T, Error>, last_seen: &str) -> Result<T, Error> {
    waited.map_err(|e| match e {
        Error::Timeout { what, timeout } => Error::Timeout {
            what: format!("{what}; last seen: {last_seen}"),
            timeout,
        },
        other => other,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn returns_once_the_condition_holds() {
        let mut calls = 0;
        wait_until(Duration::from_secs(5), "three calls", || {
            calls += 1;
            Ok(calls == 3)
        })
        .unwrap();
        assert_eq!(calls, 3);
    }

    #[test]
    fn times_out_naming_what_it_waited_for() {
        let started = Instant::now();
        let err = wait_until(Duration::from_millis(30), "the moon to turn blue", || {
            Ok(false)
        })
        .unwrap_err();
        assert!(started.elapsed() >= Duration::from_millis(30));
        assert!(matches!(err, Error::Timeout { .. }));
        assert!(err.to_string().contains("the moon to turn blue"), "{err}");
    }

    #[test]
    fn a_hard_error_stops_the_wait_at_once() {
        let mut calls = 0;
        let err = wait_until(Duration::from_secs(5), "never", || {
            calls += 1;
            Err(Error::InvalidArgument("boom".into()))
        })
        .unwrap_err();
        assert_eq!(calls, 1);
        assert!(matches!(err, Error::InvalidArgument(_)));
    }

    #[test]
    fn the_condition_is_checked_even_with_a_zero_timeout() {
        wait_until(Duration::ZERO, "already true", || Ok(true)).unwrap();
    }
}
