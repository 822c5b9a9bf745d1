//! Is `redis-server` installed? Skip or fail loudly when it is not.

use std::io::Write as _;
use std::path::Path;

/// The environment variable that turns "redis-server is missing" from a skip into a failure.
pub const REQUIRE_REDIS_ENV: &str = "SLUICE_REQUIRE_REDIS";

const PANIC_MESSAGE: &str = "redis-server not found and SLUICE_REQUIRE_REDIS=1: \
                             install redis-server, redis-tools, redis-sentinel";
const SKIP_MESSAGE: &str =
    "SKIPPED: redis-server not found; set SLUICE_REQUIRE_REDIS=1 to fail instead";

/// What a test should do about the presence of `redis-server`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// It is installed: run the test.
    Run,
    /// It is missing and not required: say so loudly and skip.
    Skip,
    /// It is missing but required: fail.
    Fail,
}

/// The pure verdict behind [`require_redis`].
pub(crate) fn verdict(found: bool, required: bool) -> Verdict {
    match (found, required) {
        (true, _) => Verdict::Run,
        (false, false) => Verdict::Skip,
        (false, true) => Verdict::Fail,
    }
}

/// Whether the value of [`REQUIRE_REDIS_ENV`] asks for redis to be required.
fn is_required(value: Option<&str>) -> bool {
    value.is_some_and(|v| {
        let v = v.trim();
        v == "1" || v.eq_ignore_ascii_case("true") || v.eq_ignore_ascii_case("yes")
    })
}

/// Whether an executable file named `name` is in one of the `PATH` directories.
pub(crate) fn on_path(name: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|paths| {
        std::env::split_paths(&paths).any(|dir| is_executable(&dir.join(name)))
    })
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt as _;
    path.metadata()
        .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Call first in every test or bench that needs a real Redis:
///
/// ```
/// # fn a_test() {
/// if !sluice_testkit::require_redis() {
///     return;
/// }
/// // … start servers …
/// # }
/// ```
///
/// Returns `true` when `redis-server` is on `PATH`. When it is missing:
///
/// - with `SLUICE_REQUIRE_REDIS=1` (CI), **panics**: a missing server must not turn the
///   Redis suite into a silent pass;
/// - otherwise prints one loud `SKIPPED: …` line to stderr and returns `false`, so the test
///   returns early. The line is written to the process's stderr directly, not through
///   `eprintln!`, so the test harness's output capture does not hide it.
pub fn require_redis() -> bool {
    let required = is_required(std::env::var(REQUIRE_REDIS_ENV).ok().as_deref());
    match verdict(on_path("redis-server"), required) {
        Verdict::Run => true,
        Verdict::Skip => {
            let mut stderr = std::io::stderr().lock();
            // Nothing useful to do if stderr itself is gone.
            let _ = writeln!(stderr, "{SKIP_MESSAGE}");
            false
        }
        Verdict::Fail => panic!("{PANIC_MESSAGE}"),
    }
}

/// For a Redis benchmark's `main`: the seconds to measure for (`SLUICE_BENCH_SECS`, else
/// `default`), or `None` when there is nothing to measure: no `redis-server` (as
/// [`require_redis`] decides), or the binary was started by a test runner, to list or
/// smoke-test it, rather than with `--bench`.
pub fn bench_seconds(default: u64) -> Option<u64> {
    let args: Vec<String> = std::env::args().collect();
    let listed = args.iter().any(|a| a == "--list" || a == "--test");
    if !require_redis() || listed || !args.iter().any(|a| a == "--bench") {
        return None;
    }
    let secs = std::env::var("SLUICE_BENCH_SECS").ok();
    Some(secs.and_then(|v| v.parse().ok()).unwrap_or(default))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_decision_table() {
        assert_eq!(verdict(true, false), Verdict::Run);
        assert_eq!(verdict(true, true), Verdict::Run);
        assert_eq!(verdict(false, false), Verdict::Skip);
        assert_eq!(verdict(false, true), Verdict::Fail);
    }

    #[test]
    fn what_counts_as_required() {
        for yes in ["1", "true", "TRUE", "yes", " 1 "] {
            assert!(is_required(Some(yes)), "{yes:?}");
        }
        for no in ["", "0", "false", "no", "2"] {
            assert!(!is_required(Some(no)), "{no:?}");
        }
        assert!(!is_required(None));
    }

    #[test]
    fn finds_programs_on_path() {
        assert!(on_path("sh"));
        assert!(!on_path("sluice-no-such-program-3f9a"));
    }

    #[test]
    fn the_messages_say_what_to_do() {
        assert!(PANIC_MESSAGE.contains("SLUICE_REQUIRE_REDIS=1"));
        assert!(PANIC_MESSAGE.contains("redis-server, redis-tools, redis-sentinel"));
        assert!(SKIP_MESSAGE.starts_with("SKIPPED: redis-server not found"));
    }
}
