//! From what Redis and the client report to a [`StoreError`]: which failures are transient
//! (the policy's failure mode applies), which mean corrupt state, which suggest a failover.

use std::time::Duration;

use redis::{ErrorKind, RedisError, ServerErrorKind, Value};
use sluice::{StoreError, StoreErrorKind};

/// Why one command failed: no answer in time, or an error from the client or the server.
pub(crate) enum Failure {
    Timeout(Duration),
    Redis(RedisError),
}

impl Failure {
    /// The store error, naming `what` (a node or a key) in the message.
    pub(crate) fn into_store_error(self, what: &str) -> StoreError {
        match self {
            Failure::Timeout(after) => StoreError::Timeout(after),
            Failure::Redis(e) => map_error(&e, what),
        }
    }

    /// Whether the client or the server reported an error that `is` says yes to (a timeout
    /// is no such error).
    fn redis_error_is(&self, is: impl FnOnce(&RedisError) -> bool) -> bool {
        matches!(self, Failure::Redis(e) if is(e))
    }

    /// Whether the node may no longer be the primary, or be gone: worth asking Sentinel.
    pub(crate) fn suggests_failover(&self) -> bool {
        matches!(self, Failure::Timeout(_))
            || self.redis_error_is(|e| {
                e.is_io_error()
                    || e.is_connection_dropped()
                    || e.is_connection_refusal()
                    || e.is_timeout()
                    || matches!(e.code(), Some("READONLY" | "MASTERDOWN" | "LOADING"))
            })
    }

    /// Whether a Cluster's slot map may be stale: what suggests a failover, and the Cluster's
    /// own `CLUSTERDOWN` or a slot without a connection.
    pub(crate) fn suggests_new_slots(&self) -> bool {
        self.suggests_failover()
            || self.redis_error_is(|e| {
                e.kind() == ErrorKind::ClusterConnectionNotFound || e.code() == Some("CLUSTERDOWN")
            })
    }

    /// Whether the node refused to log in (wrong password, a disabled or deleted ACL user).
    pub(crate) fn is_login_refused(&self) -> bool {
        self.redis_error_is(|e| {
            e.kind() == ErrorKind::AuthenticationFailed
                || matches!(e.code(), Some("WRONGPASS" | "NOAUTH"))
        })
    }

    /// Whether nothing ran because the node does not have the code (`NOSCRIPT`, or
    /// `ERR Function not found`): load it and try again.
    pub(crate) fn is_code_missing(&self) -> bool {
        self.redis_error_is(|e| {
            e.code() == Some("NOSCRIPT")
                || e.detail().is_some_and(|d| d.contains("Function not found"))
                || e.to_string().contains("Function not found")
        })
    }
}

/// Sends one command on a shared connection, bounded by `timeout`.
pub(crate) async fn query<C: redis::aio::ConnectionLike>(
    conn: &mut C,
    cmd: &redis::Cmd,
    timeout: Duration,
) -> Result<Value, Failure> {
    match tokio::time::timeout(timeout, cmd.query_async::<Value>(conn)).await {
        Err(_) => Err(Failure::Timeout(timeout)),
        Ok(result) => result.map_err(Failure::Redis),
    }
}

/// The store error for a client or server error, naming `what` (a node or a key).
///
/// Every error lands in one [`StoreErrorKind`]; only the two that no retry or failover can
/// change are not transient: corrupt state (`WRONGTYPE`, the script's `SLUICE_CORRUPT`) and a
/// request the store refuses as such (the script's `SLUICE_ARGS`, a Lua error, an error of a
/// command inside the script, `CROSSSLOT`, an unknown command). Anything else, including an
/// error Sluice does not know, means the store cannot answer now. The table is in
/// docs/redis.md ("Connections, timeouts and errors").
pub(crate) fn map_error(e: &RedisError, what: &str) -> StoreError {
    map(e, what, false)
}

/// [`map_error`] for the error a batch reports for one of its decisions: raised inside the
/// script, it is classified as the same failure of a single call is, whose text Redis ends
/// with ` script: <function>, on @user_function:<line>.` (and prefixes `ERR` to a plain Lua
/// error), where the batch's `pcall` caught the bare message.
pub(crate) fn map_batch_error(e: &RedisError, what: &str) -> StoreError {
    map(e, what, true)
}

fn map(e: &RedisError, what: &str, in_script: bool) -> StoreError {
    let text = e.to_string();
    let (inner, suffixed) = without_script_suffix(&text);
    let in_script = in_script || suffixed;
    let corrupt = match e.code() {
        Some("WRONGTYPE") => {
            Some("a key of this policy holds a value of the wrong Redis type".to_owned())
        }
        // One decision of a batch: its error is an element of the reply, code first.
        Some("SLUICE_CORRUPT") => Some(
            without_script_suffix(e.detail().unwrap_or_default())
                .0
                .to_owned(),
        ),
        // A script's `error('SLUICE_CORRUPT …')` may come as `ERR SLUICE_CORRUPT …`; a server
        // that kept the first word as the code would show `"SLUICE_CORRUPT": …`.
        _ => inner.find("SLUICE_CORRUPT").map(|at| {
            let rest = &inner[at + "SLUICE_CORRUPT".len()..];
            rest.trim_start_matches(['"', ':', ' ']).to_owned()
        }),
    };
    if let Some(detail) = corrupt {
        return StoreError::Corrupt {
            key: what.to_owned(),
            detail,
        };
    }
    match classify(e, inner, in_script) {
        StoreErrorKind::Unavailable => StoreError::Unavailable(format!("{what}: {e}")),
        StoreErrorKind::Rejected => StoreError::Backend(format!("{what}: {text}")),
        kind => StoreError::refused(kind, format!("{what}: {e}")),
    }
}

/// `text` without the place Redis appends to an error raised in a script (` script: <name>,
/// on @user_function:<line>.`), and whether it had one.
fn without_script_suffix(text: &str) -> (&str, bool) {
    if let Some(on) = text.rfind(", on @user_")
        && let Some(at) = text[..on].rfind(" script: ")
    {
        return (&text[..at], true);
    }
    (text, false)
}

/// The kind of an error that is not corrupt state; `text` without the script's suffix, and
/// whether the error was raised inside the script.
fn classify(e: &RedisError, text: &str, in_script: bool) -> StoreErrorKind {
    if e.is_timeout() {
        return StoreErrorKind::Timeout;
    }
    if e.is_io_error() || e.is_connection_dropped() || e.is_connection_refusal() {
        return StoreErrorKind::Unavailable;
    }
    // A Lua error in Sluice's code (`user_function:<line>: …`, `user_script:<line>: …`): the
    // same request fails the same way on every node. A single call's carries `ERR` first, a
    // batch's its location as the code.
    if text.contains("user_function:") || text.contains("user_script:") {
        return StoreErrorKind::Rejected;
    }
    match e.kind() {
        ErrorKind::Server(kind) => match kind {
            ServerErrorKind::BusyLoading => StoreErrorKind::Loading,
            ServerErrorKind::NoScript => StoreErrorKind::CodeMissing,
            ServerErrorKind::Moved | ServerErrorKind::Ask => StoreErrorKind::Redirected,
            ServerErrorKind::TryAgain => StoreErrorKind::TryAgain,
            ServerErrorKind::ClusterDown => StoreErrorKind::ClusterDown,
            ServerErrorKind::MasterDown => StoreErrorKind::MasterDown,
            ServerErrorKind::ReadOnly => StoreErrorKind::ReadOnly,
            ServerErrorKind::NoPerm => StoreErrorKind::Denied,
            ServerErrorKind::CrossSlot | ServerErrorKind::NotBusy | ServerErrorKind::NoSub => {
                StoreErrorKind::Rejected
            }
            ServerErrorKind::ResponseError => classify_err(text, in_script),
            _ => StoreErrorKind::Other,
        },
        ErrorKind::Extension => match e.code() {
            Some("OOM") => StoreErrorKind::OutOfMemory,
            Some("BUSY" | "UNKILLABLE") => StoreErrorKind::Busy,
            Some("WRONGPASS" | "NOAUTH") => StoreErrorKind::Denied,
            Some("SLUICE_ARGS") => StoreErrorKind::Rejected,
            _ if text.contains("SLUICE_ARGS ") => StoreErrorKind::Rejected,
            _ => StoreErrorKind::Other,
        },
        ErrorKind::AuthenticationFailed => StoreErrorKind::Denied,
        ErrorKind::ClusterConnectionNotFound
        | ErrorKind::Io
        | ErrorKind::Parse
        | ErrorKind::MasterNameNotFoundBySentinel
        | ErrorKind::NoValidReplicasFoundBySentinel => StoreErrorKind::Unavailable,
        ErrorKind::UnexpectedReturnType
        | ErrorKind::InvalidClientConfig
        | ErrorKind::Client
        | ErrorKind::EmptySentinelList
        | ErrorKind::RESP3NotSupported => StoreErrorKind::Rejected,
        _ => StoreErrorKind::Other,
    }
}

/// The kind of a generic `ERR …` reply, by its text (without the script's suffix), and
/// whether it was raised inside the script.
fn classify_err(text: &str, in_script: bool) -> StoreErrorKind {
    let lower = text.to_ascii_lowercase();
    if text.contains("SLUICE_ARGS ") {
        StoreErrorKind::Rejected
    } else if lower.contains("function not found") {
        StoreErrorKind::CodeMissing
    } else if lower.contains("max number of clients") {
        StoreErrorKind::Unavailable
    } else if lower.contains("non local key") {
        // A script touched a key its node does not serve: a slot in migration (resharding).
        // Once it is done the same call runs.
        StoreErrorKind::TryAgain
    } else if in_script
        || lower.contains("error running script")
        || lower.contains("unknown command")
        || lower.contains("wrong number of arguments")
        || lower.contains("syntax error")
    {
        // A command inside Sluice's script refused its arguments, or a command this Redis does
        // not take: the same request fails the same way on every node.
        StoreErrorKind::Rejected
    } else {
        StoreErrorKind::Other
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    /// The error a server's reply line `-<line>` is, as the client reports it.
    fn reply(line: &str) -> RedisError {
        match redis::parse_redis_value(format!("-{line}\r\n").as_bytes()) {
            Ok(Value::ServerError(e)) => RedisError::from(e),
            other => panic!("{line}: {other:?}"),
        }
    }

    fn kind(e: &RedisError) -> StoreErrorKind {
        map_error(e, "k").kind()
    }

    #[test]
    fn what_redis_says_when_it_cannot_answer_now_is_transient() {
        let cases = [
            (
                "OOM command not allowed when used memory > 'maxmemory'.",
                StoreErrorKind::OutOfMemory,
            ),
            (
                "READONLY You can't write against a read only replica.",
                StoreErrorKind::ReadOnly,
            ),
            (
                "LOADING Redis is loading the dataset in memory",
                StoreErrorKind::Loading,
            ),
            (
                "BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN \
                 NOSAVE.",
                StoreErrorKind::Busy,
            ),
            (
                "MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'.",
                StoreErrorKind::MasterDown,
            ),
            (
                "TRYAGAIN Multiple keys request during rehashing of slot",
                StoreErrorKind::TryAgain,
            ),
            (
                "CLUSTERDOWN The cluster is down",
                StoreErrorKind::ClusterDown,
            ),
            ("MOVED 3999 127.0.0.1:6381", StoreErrorKind::Redirected),
            ("ASK 3999 127.0.0.1:6381", StoreErrorKind::Redirected),
            (
                "NOPERM User alice has no permissions to run the 'fcall' command",
                StoreErrorKind::Denied,
            ),
            (
                "WRONGPASS invalid username-password pair or user is disabled.",
                StoreErrorKind::Denied,
            ),
            ("NOAUTH Authentication required.", StoreErrorKind::Denied),
            (
                "NOSCRIPT No matching script. Please use EVAL.",
                StoreErrorKind::CodeMissing,
            ),
            ("ERR Function not found", StoreErrorKind::CodeMissing),
            (
                "ERR max number of clients reached",
                StoreErrorKind::Unavailable,
            ),
            (
                "MISCONF Redis is configured to save RDB snapshots, but it's currently unable to \
                 persist to disk.",
                StoreErrorKind::Other,
            ),
            ("ERR something new", StoreErrorKind::Other),
        ];
        for (line, expected) in cases {
            let e = map_error(&reply(line), "redis://10.0.0.1:6379");
            assert_eq!(e.kind(), expected, "{line}: {e}");
            assert!(e.is_transient(), "{line}: {e}");
            assert!(e.to_string().contains("redis://10.0.0.1:6379"), "{e}");
        }
    }

    #[test]
    fn client_side_failures_to_reach_the_store_are_transient() {
        let cases = [
            RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionRefused)),
            RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionReset)),
            RedisError::from((
                ErrorKind::ClusterConnectionNotFound,
                "Unable to find connection",
            )),
            RedisError::from((
                ErrorKind::AuthenticationFailed,
                "Password authentication failed",
            )),
            RedisError::from((ErrorKind::Parse, "invalid first byte")),
        ];
        for e in &cases {
            assert!(map_error(e, "k").is_transient(), "{e}");
        }
        let timed_out = RedisError::from(std::io::Error::from(std::io::ErrorKind::TimedOut));
        assert_eq!(kind(&timed_out), StoreErrorKind::Timeout);
        assert_eq!(kind(&cases[2]), StoreErrorKind::Unavailable);
        assert_eq!(kind(&cases[3]), StoreErrorKind::Denied);
    }

    #[test]
    fn only_what_no_retry_changes_goes_to_the_caller() {
        let corrupt = [
            "WRONGTYPE Operation against a key holding the wrong kind of value",
            "ERR SLUICE_CORRUPT sluice:{3:api:k}:fw1000: used is not a number script: \
             sluice_1_check, on @user_function:73.",
            "SLUICE_CORRUPT sluice:{3:api:k}:fw1000: used is not a number",
        ];
        for line in corrupt {
            let e = map_error(&reply(line), "sluice:{3:api:k}");
            assert!(matches!(e, StoreError::Corrupt { .. }), "{line}: {e:?}");
            assert!(!e.is_transient());
        }
        let rejected = [
            "SLUICE_ARGS unknown algorithm 9",
            "ERR SLUICE_ARGS acquire needs the most units to take script: sluice_1_acquire, on \
             @user_function:637.",
            "CROSSSLOT Keys in request don't hash to the same slot",
            "ERR unknown command 'FCALL', with args beginning with: ",
            "ERR wrong number of arguments for 'fcall' command",
            "ERR user_script:1: attempt to compare nil with number script: 9f2e, on \
             @user_script:1.",
            "ERR user_function:3: attempt to perform arithmetic on local 'x' (a nil value) \
             script: sluice_1_check, on @user_function:3.",
        ];
        for line in rejected {
            let e = map_error(&reply(line), "k");
            assert_eq!(e.kind(), StoreErrorKind::Rejected, "{line}: {e}");
            assert!(!e.is_transient());
        }
        let client = RedisError::from((ErrorKind::UnexpectedReturnType, "unexpected reply"));
        assert_eq!(kind(&client), StoreErrorKind::Rejected);
    }

    /// One failure inside the script, as a single call reports it (Redis appends ` script:
    /// <function>, on @user_function:<line>.`, and prefixes `ERR` to a plain message) and as
    /// a batch reports it for one decision (the message a `pcall` caught, no suffix): the same
    /// kind either way (a single call's `non local key` was once `rejected`, the batch's
    /// `other`).
    #[test]
    fn a_failure_in_the_script_is_the_same_kind_single_or_batched() {
        let suffix = " script: sluice_1_rate, on @user_function:249.";
        let cases = [
            (
                "ERR Script attempted to access a non local key in a cluster node",
                "ERR Script attempted to access a non local key in a cluster node",
                StoreErrorKind::TryAgain,
            ),
            (
                "ERR user_function:429: too many results to unpack",
                "user_function:429: too many results to unpack",
                StoreErrorKind::Rejected,
            ),
            (
                "ERR value is not an integer or out of range",
                "ERR value is not an integer or out of range",
                StoreErrorKind::Rejected,
            ),
            (
                "WRONGTYPE Operation against a key holding the wrong kind of value",
                "WRONGTYPE Operation against a key holding the wrong kind of value",
                StoreErrorKind::Corrupt,
            ),
            (
                "SLUICE_CORRUPT sluice:{3:api:k}:fw1000:c1000: a fixed-window counter holds x",
                "SLUICE_CORRUPT sluice:{3:api:k}:fw1000:c1000: a fixed-window counter holds x",
                StoreErrorKind::Corrupt,
            ),
            (
                "OOM command not allowed when used memory > 'maxmemory'.",
                "OOM command not allowed when used memory > 'maxmemory'.",
                StoreErrorKind::OutOfMemory,
            ),
            (
                "ERR SLUICE_ARGS acquire needs the most units to take",
                "SLUICE_ARGS acquire needs the most units to take",
                StoreErrorKind::Rejected,
            ),
        ];
        for (single, batched, kind) in cases {
            let one = map_error(&reply(&format!("{single}{suffix}")), "k");
            let entry = map_batch_error(&reply(batched), "k");
            assert_eq!(one.kind(), kind, "single: {single}: {one}");
            assert_eq!(entry.kind(), kind, "batched: {batched}: {entry}");
        }
    }
}
