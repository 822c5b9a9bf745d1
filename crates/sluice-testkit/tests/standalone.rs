//! A standalone `RedisServer`: start, ports, commands, kill/restart, and cleanup on drop.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use std::path::Path;
use std::time::Duration;

use redis::Value;
use sluice_testkit::{Error, RedisServer, ServerOptions, wait_until};

/// A fresh server; `None` (the test is skipped) without `redis-server`.
fn started() -> Option<RedisServer> {
    if !sluice_testkit::require_redis() {
        return None;
    }
    Some(RedisServer::start().unwrap())
}

fn proc_exists(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// Polls until the process is gone (not even a zombie).
fn assert_gone(pid: u32) {
    wait_until(
        Duration::from_secs(5),
        &format!("process {pid} to be gone"),
        || Ok(!proc_exists(pid)),
    )
    .unwrap();
}

#[test]
fn errors_can_cross_threads() {
    fn is_send_sync<T: Send + Sync + 'static>() {}
    is_send_sync::<Error>();
    is_send_sync::<RedisServer>();
}

#[test]
fn starts_and_answers() {
    let Some(server) = started() else {
        return;
    };
    assert_eq!(
        server.cmd(&["PING"]).unwrap(),
        Value::SimpleString("PONG".into())
    );
    let port = server.port();
    assert_ne!(port, 6379);
    assert_eq!(server.addr(), format!("127.0.0.1:{port}"));
    assert_eq!(server.url(), format!("redis://127.0.0.1:{port}/"));
    assert_eq!(
        server.info_field("server", "tcp_port").unwrap().as_deref(),
        Some(port.to_string().as_str())
    );
    assert_eq!(
        server.info_field("server", "process_id").unwrap(),
        server.pid().map(|p| p.to_string())
    );
    assert_eq!(server.info_field("server", "no_such_field").unwrap(), None);
    assert!(server.info("replication").unwrap().contains("role:master"));

    server.cmd(&["SET", "k", "v"]).unwrap();
    assert_eq!(
        server.cmd(&["GET", "k"]).unwrap(),
        Value::BulkString(b"v".to_vec())
    );
    // The base arguments are in effect.
    let save = server.cmd(&["CONFIG", "GET", "save"]).unwrap();
    assert_eq!(
        save,
        Value::Array(vec![
            Value::BulkString(b"save".to_vec()),
            Value::BulkString(Vec::new())
        ])
    );
    assert!(server.log_path().starts_with(server.dir()));
    assert!(server.log_tail(50).contains("Ready to accept connections"));
    assert!(matches!(server.cmd(&[]), Err(Error::InvalidArgument(_))));

    // A raw connection works too, and a server error is a typed error.
    let mut conn = server.connection().unwrap();
    let n: i64 = redis::cmd("INCR").arg("n").query(&mut conn).unwrap();
    assert_eq!(n, 1);
    let err = server.cmd(&["INCR", "k"]).unwrap_err();
    assert!(err.redis_error().is_some(), "{err}");
}

#[test]
fn two_servers_get_different_ports_and_dirs() {
    if !sluice_testkit::require_redis() {
        return;
    }
    let a = RedisServer::start().unwrap();
    let b = RedisServer::start().unwrap();
    assert_ne!(a.port(), b.port());
    assert_ne!(a.dir(), b.dir());
    a.cmd(&["SET", "only", "a"]).unwrap();
    assert_eq!(b.cmd(&["GET", "only"]).unwrap(), Value::Nil);
}

#[test]
fn many_start_in_parallel() {
    if !sluice_testkit::require_redis() {
        return;
    }
    let servers = RedisServer::start_many((0..3).map(|_| ServerOptions::new())).unwrap();
    let mut ports: Vec<u16> = servers.iter().map(RedisServer::port).collect();
    ports.sort_unstable();
    ports.dedup();
    assert_eq!(ports.len(), 3);
}

#[test]
fn drop_kills_reaps_and_cleans_up() {
    let Some(server) = started() else {
        return;
    };
    let pid = server.pid().unwrap();
    let dir = server.dir().to_owned();
    assert!(proc_exists(pid));
    drop(server);
    assert_gone(pid);
    assert!(!dir.exists(), "{} was not removed", dir.display());

    // A paused (SIGSTOPped) server is killed too.
    let server = RedisServer::start().unwrap();
    let pid = server.pid().unwrap();
    server.pause().unwrap();
    drop(server);
    assert_gone(pid);
}

#[test]
fn a_panicking_test_still_kills_its_server() {
    if !sluice_testkit::require_redis() {
        return;
    }
    let mut pid = None;
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let server = RedisServer::start().unwrap();
        pid = server.pid();
        panic!("a failing assertion (expected by this test)");
    }));
    assert!(result.is_err());
    assert_gone(pid.unwrap());
}

#[test]
fn kill_then_restart_on_the_same_port() {
    let Some(mut server) = started() else {
        return;
    };
    let port = server.port();
    let first_pid = server.pid().unwrap();
    server.cmd(&["SET", "k", "v"]).unwrap();

    server.kill().unwrap();
    assert_eq!(server.pid(), None);
    assert!(!server.is_running());
    assert_gone(first_pid);
    let err = server.cmd(&["PING"]).unwrap_err();
    assert!(matches!(err, Error::Redis { .. }), "{err}");
    assert!(err.to_string().contains("killed"), "{err}");
    assert!(matches!(server.pause(), Err(Error::NotRunning { .. })));
    server.kill().unwrap(); // idempotent

    server.restart().unwrap();
    assert_eq!(server.port(), port);
    let second_pid = server.pid().unwrap();
    assert_ne!(second_pid, first_pid);
    assert_eq!(
        server.cmd(&["PING"]).unwrap(),
        Value::SimpleString("PONG".into())
    );
    // No persistence: a restart is an empty server.
    assert_eq!(server.cmd(&["GET", "k"]).unwrap(), Value::Nil);

    // Restarting a running server kills it first.
    server.restart().unwrap();
    assert_eq!(server.port(), port);
    assert_gone(second_pid);
    assert_eq!(
        server.cmd(&["PING"]).unwrap(),
        Value::SimpleString("PONG".into())
    );
    // The log covers every run.
    assert!(
        server
            .log_tail(1_000)
            .matches("Ready to accept connections")
            .count()
            >= 3
    );
}

#[test]
fn pause_stalls_and_resume_thaws() {
    let Some(server) = started() else {
        return;
    };
    let mut conn = server
        .connection_with_timeouts(Duration::from_secs(1), Duration::from_millis(200))
        .unwrap();
    server.pause().unwrap();
    let err = redis::cmd("PING").query::<String>(&mut conn).unwrap_err();
    assert!(err.is_timeout(), "{err}");
    server.resume().unwrap();
    assert_eq!(
        server.cmd(&["PING"]).unwrap(),
        Value::SimpleString("PONG".into())
    );
}

#[test]
fn extra_args_and_config_text_apply() {
    if !sluice_testkit::require_redis() {
        return;
    }
    let server = RedisServer::start_with(&["--maxmemory", "10mb"]).unwrap();
    assert_eq!(
        server.cmd(&["CONFIG", "GET", "maxmemory"]).unwrap(),
        Value::Array(vec![
            Value::BulkString(b"maxmemory".to_vec()),
            Value::BulkString(b"10485760".to_vec())
        ])
    );

    let server = ServerOptions::new()
        .config("maxmemory-policy allkeys-lru\n")
        .start()
        .unwrap();
    assert!(server.config_file().unwrap().starts_with(server.dir()));
    assert_eq!(
        server.cmd(&["CONFIG", "GET", "maxmemory-policy"]).unwrap(),
        Value::Array(vec![
            Value::BulkString(b"maxmemory-policy".to_vec()),
            Value::BulkString(b"allkeys-lru".to_vec())
        ])
    );
}

#[test]
fn a_server_that_cannot_start_reports_why() {
    if !sluice_testkit::require_redis() {
        return;
    }
    let err = RedisServer::start_with(&["--no-such-directive", "x"]).unwrap_err();
    match &err {
        Error::ExitedEarly { log_tail, .. } => {
            assert!(log_tail.contains("Bad directive"), "{log_tail}");
        }
        other => panic!("expected ExitedEarly, got {other}"),
    }

    let err = ServerOptions::new()
        .program("sluice-no-such-program-3f9a")
        .start()
        .unwrap_err();
    assert!(matches!(err, Error::Spawn { .. }), "{err}");
}

/// `command_stats` reads INFO commandstats: calls count up by command, and `since` gives the
/// calls between two readings.
#[test]
fn command_stats_count_the_calls_of_each_command() {
    let Some(server) = started() else {
        return;
    };
    let before = server.command_stats().unwrap();
    for i in 0..5 {
        server.cmd(&["SET", &format!("k{i}"), "v"]).unwrap();
    }
    server.cmd(&["GET", "k0"]).unwrap();
    let after = server.command_stats().unwrap();
    let set = after["set"].since(before.get("set").copied().unwrap_or_default());
    assert_eq!(set.calls, 5);
    assert_eq!(server.command_calls("get").unwrap(), 1);
    assert_eq!(server.command_calls("hset").unwrap(), 0, "never called");
}
