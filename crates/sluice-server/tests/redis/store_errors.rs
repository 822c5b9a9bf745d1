//! A real Redis that cannot answer, end to end: out of memory, an ACL change, its
//! code flushed and not reloadable, busy with a script, asleep (`DEBUG SLEEP`), killed, a
//! Cluster slot migrating. Over HTTP (`POST /v1/check`) and gRPC (`ShouldRateLimit`), each
//! failure mode does what docs/configuration.md says: `open` allows and marks the answer
//! degraded, `closed` answers `503 store_unavailable` / `UNAVAILABLE`, `local` decides with
//! the server's insurance store (limited, marked degraded). `/readyz` is not ready while the
//! store cannot decide, and ready again once it can; decisions resume without a restart.
//!
//! Each fault runs three servers over one Redis, one per `rls.on_store_error`.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use crate::support;

use std::time::{Duration, Instant};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::value::Kind;
use reqwest::{Client, StatusCode};
use serde_json::{Value, json};
use sluice::{LimitSpec, Policy};
use sluice_testkit::{RedisCluster, RedisServer, ServerOptions};
use support::TestServer;
use tonic::transport::Channel;

const MAX: u64 = 3;

const RULES: &str = "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: hour\n      requests_per_unit: 3\n";

const MODES: [&str; 3] = ["open", "closed", "local"];

/// Policies `open`, `closed` and `local` (each 3 per hour, failing as named) and the Envoy
/// rule `k` (3 per hour) failing as `rls_mode`, over `store` (YAML lines under `store:`).
fn config(store: &str, rls_mode: &str) -> String {
    format!(
        "policies:
  open:
    limits: [{{max: {MAX}, per: 1h}}]
  closed:
    on_store_error: closed
    limits: [{{max: {MAX}, per: 1h}}]
  local:
    on_store_error: local
    limits: [{{max: {MAX}, per: 1h}}]
rls:
  config_dir: rules
  on_store_error: {rls_mode}
store:
  backend: redis
  timeout: 500ms
{store}"
    )
}

fn shard(url: &str) -> String {
    format!("  shards:\n    - primary: {url}\n")
}

/// Three servers over one store, one per `rls.on_store_error`.
struct Fleet {
    servers: Vec<(&'static str, TestServer, RateLimitServiceClient<Channel>)>,
    http: Client,
}

/// A [`Fleet`] over `store` that has decided once ("warm").
async fn fleet(store: &str) -> Fleet {
    let mut servers = Vec::new();
    for mode in MODES {
        let s = TestServer::start(&config(store, mode), &[("rules/d.yaml", RULES)]).await;
        let client = RateLimitServiceClient::new(s.channel().await);
        servers.push((mode, s, client));
    }
    let fleet = Fleet {
        servers,
        http: Client::new(),
    };
    fleet.decides_again("warm").await;
    fleet
}

fn request(value: &str) -> RateLimitRequest {
    RateLimitRequest {
        domain: "d".to_owned(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "k".to_owned(),
                value: value.to_owned(),
            }],
            ..RateLimitDescriptor::default()
        }],
        hits_addend: 1,
    }
}

fn degraded(r: &RateLimitResponse) -> Option<String> {
    let field = r.dynamic_metadata.as_ref()?.fields.get("degraded")?;
    match &field.kind {
        Some(Kind::StringValue(s)) => Some(s.clone()),
        other => panic!("degraded is {other:?}"),
    }
}

/// Polls (at most 15 s) until `cond` says yes.
async fn until(what: &str, cond: impl AsyncFnMut() -> bool) {
    let waited = sluice_testkit::until(Duration::from_secs(15), what, cond).await;
    waited.unwrap();
}

impl Fleet {
    fn first(&self) -> &TestServer {
        &self.servers[0].1
    }

    async fn check(&self, policy: &str, key: &str) -> (StatusCode, Value) {
        let r = support::post(
            &self.http,
            &format!("{}/v1/check", self.first().url),
            json!({"policy": policy, "key": key}),
        )
        .await;
        (r.status(), r.json().await.unwrap())
    }

    async fn readyz(&self) -> (StatusCode, Value) {
        let r = support::send(self.http.get(format!("{}/readyz", self.first().url))).await;
        (r.status(), r.json().await.unwrap())
    }

    /// Over HTTP, policy by policy, and over gRPC, server by server: each failure mode.
    async fn each_mode_fails_as_configured(&mut self, key: &str) {
        let (status, body) = self.check("open", key).await;
        assert_eq!(status, StatusCode::OK, "open: {body}");
        assert_eq!(
            (&body["allowed"], &body["degraded"]),
            (&json!(true), &json!(true))
        );

        let (status, body) = self.check("closed", key).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "closed: {body}");
        assert_eq!(body["error"]["code"], "store_unavailable", "{body}");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(
            message.contains("cannot answer now") && message.contains("fails closed"),
            "{message}"
        );

        let mut statuses = Vec::new();
        for _ in 0..MAX + 1 {
            let (status, body) = self.check("local", key).await;
            assert_eq!(body["degraded"], true, "local: {body}");
            statuses.push(status);
        }
        assert_eq!(
            statuses,
            [
                StatusCode::OK,
                StatusCode::OK,
                StatusCode::OK,
                StatusCode::TOO_MANY_REQUESTS
            ],
            "local: limited by the insurance store"
        );

        for (mode, _, client) in &mut self.servers {
            let answer = client.should_rate_limit(request(key)).await;
            match *mode {
                "open" => {
                    let r = answer.unwrap().into_inner();
                    assert_eq!(r.overall_code, Code::Ok as i32, "gRPC open");
                    assert_eq!(degraded(&r).as_deref(), Some("open"));
                }
                "closed" => {
                    let status = answer.unwrap_err();
                    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
                    assert!(status.message().contains("cannot answer now"), "{status:?}");
                }
                _ => {
                    let mut codes = vec![answer.unwrap().into_inner()];
                    for _ in 0..MAX {
                        codes.push(
                            client
                                .should_rate_limit(request(key))
                                .await
                                .unwrap()
                                .into_inner(),
                        );
                    }
                    assert!(
                        codes
                            .iter()
                            .all(|r| degraded(r).as_deref() == Some("local"))
                    );
                    let codes: Vec<i32> = codes.iter().map(|r| r.overall_code).collect();
                    assert_eq!(
                        codes,
                        [Code::Ok, Code::Ok, Code::Ok, Code::OverLimit].map(|c| c as i32),
                        "gRPC local: limited by the insurance store"
                    );
                }
            }
        }
    }

    /// Each server fails as its mode says ([`Fleet::each_mode_fails_as_configured`]), and
    /// `/readyz` is not ready: its reason.
    async fn fails(&mut self, key: &str) -> String {
        self.each_mode_fails_as_configured(key).await;
        self.not_ready().await
    }

    /// Every server decides again ("after"), then stops.
    async fn recovers(self) {
        self.decides_again("after").await;
        self.stop().await;
    }

    /// `/readyz` answers 503 (polled: the circuit opens after a few failures); its reason.
    async fn not_ready(&self) -> String {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let (status, body) = self.readyz().await;
            if status == StatusCode::SERVICE_UNAVAILABLE {
                return body["error"]["message"].as_str().unwrap().to_owned();
            }
            assert!(Instant::now() < deadline, "/readyz stayed ready: {body}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Every server decides `key` again (not degraded), and `/readyz` is ready.
    async fn decides_again(&self, key: &str) {
        until("decisions again", || async {
            let (status, body) = self.check("open", key).await;
            status == StatusCode::OK && body.get("degraded").is_none()
        })
        .await;
        until("/readyz to say ready", || async {
            self.readyz().await.0 == StatusCode::OK
        })
        .await;
        for (mode, _, client) in &self.servers {
            // Each server's circuit closes on its own first call after its wait (a probe).
            until(&format!("gRPC decisions again ({mode})"), || async {
                let r = client.clone().should_rate_limit(request(key)).await;
                matches!(r, Ok(r) if degraded(r.get_ref()).is_none())
            })
            .await;
        }
    }

    async fn stop(self) {
        for (_, s, _) in self.servers {
            s.stop().await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_memory() {
    let Some(redis) = support::redis() else {
        return;
    };
    let mut f = fleet(&shard(&redis.url())).await;
    redis
        .cmd(&["CONFIG", "SET", "maxmemory-policy", "noeviction"])
        .unwrap();
    redis.cmd(&["CONFIG", "SET", "maxmemory", "1"]).unwrap();
    let why = f.fails("oom").await;
    assert!(
        why.contains("every shard's circuit is open") && why.contains("oom"),
        "{why}"
    );
    redis.cmd(&["CONFIG", "SET", "maxmemory", "0"]).unwrap();
    f.recovers().await;
}

/// Sends `args` to `redis` from a thread of its own, on a connection that waits up to 60 s
/// for the answer: for a command that keeps Redis busy.
fn in_a_thread(
    redis: &RedisServer,
    args: &[&str],
) -> std::thread::JoinHandle<redis::RedisResult<redis::Value>> {
    let mut conn = redis
        .connection_with_timeouts(Duration::from_secs(1), Duration::from_secs(60))
        .unwrap();
    let mut cmd = redis::cmd(args[0]);
    for arg in &args[1..] {
        cmd.arg(*arg);
    }
    std::thread::spawn(move || cmd.query::<redis::Value>(&mut conn))
}

const PASSWORD: &str = "store-errors-0123456789";

/// A redis-server with the ACL user alice, and the URL that logs in as her; `None` where Redis
/// is absent and not required.
fn server_with_alice() -> Option<(RedisServer, String)> {
    if !sluice_testkit::require_redis() {
        return None;
    }
    let server = ServerOptions::new()
        .args(sluice_testkit::acl_user("alice", PASSWORD, "sluice:*"))
        .start()
        .unwrap();
    let url = format!("redis://alice:{PASSWORD}@127.0.0.1:{}", server.port());
    Some((server, url))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acl_change() {
    let Some((redis, url)) = server_with_alice() else {
        return;
    };
    let mut f = fleet(&shard(&url)).await;
    redis.cmd(&["ACL", "SETUSER", "alice", "-@all"]).unwrap();
    f.fails("noperm").await;
    redis.cmd(&["ACL", "SETUSER", "alice", "+@all"]).unwrap();
    f.recovers().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flushed_library_that_cannot_be_reloaded() {
    let Some((redis, url)) = server_with_alice() else {
        return;
    };
    let mut f = fleet(&shard(&url)).await;
    // Reloaded at once when it can be.
    redis.cmd(&["FUNCTION", "FLUSH"]).unwrap();
    f.decides_again("reloaded").await;
    redis
        .cmd(&["ACL", "SETUSER", "alice", "-function"])
        .unwrap();
    redis.cmd(&["FUNCTION", "FLUSH"]).unwrap();
    let why = f.fails("flushed").await;
    assert!(why.contains("every shard's circuit is open"), "{why}");
    redis
        .cmd(&["ACL", "SETUSER", "alice", "+function"])
        .unwrap();
    f.recovers().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_script() {
    let Some(redis) = support::redis() else {
        return;
    };
    redis
        .cmd(&["CONFIG", "SET", "busy-reply-threshold", "50"])
        .unwrap();
    let mut f = fleet(&shard(&redis.url())).await;
    let spin =
        "local t = redis.call('TIME')[1] while redis.call('TIME')[1] - t < 50 do end return 1";
    let script = in_a_thread(&redis, &["EVAL", spin, "0"]);
    until("Redis to answer BUSY", || async {
        matches!(redis.cmd(&["PING"]), Err(e) if e.to_string().contains("BUSY"))
    })
    .await;
    f.fails("busy").await;
    redis.cmd(&["SCRIPT", "KILL"]).unwrap();
    assert!(script.join().unwrap().is_err(), "the script was killed");
    f.recovers().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sleeping_server() {
    if !sluice_testkit::require_redis() {
        return;
    }
    let redis = RedisServer::start_with(&["--enable-debug-command", "yes"]).unwrap();
    let mut f = fleet(&shard(&redis.url())).await;
    let sleep = in_a_thread(&redis, &["DEBUG", "SLEEP", "12"]);
    until("Redis to sleep", || async {
        redis
            .connection_with_timeouts(Duration::from_secs(1), Duration::from_millis(200))
            .map_or(true, |mut c| {
                redis::cmd("PING").query::<redis::Value>(&mut c).is_err()
            })
    })
    .await;
    f.fails("asleep").await;
    tokio::task::block_in_place(|| sleep.join().unwrap().unwrap());
    f.recovers().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_primary() {
    let Some(mut redis) = support::redis() else {
        return;
    };
    let mut f = fleet(&shard(&redis.url())).await;
    tokio::task::block_in_place(|| redis.kill().unwrap());
    f.fails("killed").await;
    tokio::task::block_in_place(|| redis.restart().unwrap());
    f.recovers().await;
}

/// Every key this test decides (the HTTP policies' and the Envoy rule's, as the store names
/// them) lives in a slot that is migrating to a node that does not import it: the client is
/// sent back and forth (ASK, MOVED) beyond its redirections. A Cluster has no breaker, so
/// `/readyz` (a `PING` to every primary) stays ready.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_migrating_cluster_slot() {
    if !sluice_testkit::require_redis() {
        return;
    }
    let cluster = tokio::task::block_in_place(RedisCluster::start).unwrap();
    let store = format!("  cluster: [{}]\n", cluster.urls().join(", "));
    let mut f = fleet(&store).await;

    let key = "moving";
    let prefix = sluice_redis::DEFAULT_PREFIX;
    let mut stems: Vec<String> = MODES
        .iter()
        .map(|p| {
            let policy = Policy::from_specs(*p, vec![LimitSpec::fixed_window(MAX, 3_600_000)]);
            sluice_redis::keys::stem(prefix, &policy.unwrap(), key)
        })
        .collect();
    // The Envoy rule's policy and counter key (`<domain>_<key>_<value>_`).
    let rls = Policy::from_specs("rls:3600000", vec![LimitSpec::fixed_window(MAX, 3_600_000)]);
    stems.push(sluice_redis::keys::stem(
        prefix,
        &rls.unwrap(),
        &format!("d_k_{key}_"),
    ));
    let id = |i: usize| match cluster.nodes()[i].cmd(&["CLUSTER", "MYID"]).unwrap() {
        redis::Value::BulkString(b) => String::from_utf8(b).unwrap(),
        other => panic!("{other:?}"),
    };
    let primaries: Vec<usize> = cluster
        .shards()
        .unwrap()
        .iter()
        .map(|s| s.primary)
        .collect();
    let mut migrating = Vec::new();
    for stem in &stems {
        let slot = sluice_testkit::key_slot(stem.as_bytes());
        let source = cluster.primary_for_slot(slot).unwrap();
        let target = *primaries.iter().find(|&&p| p != source).unwrap();
        cluster.nodes()[source]
            .cmd(&[
                "CLUSTER",
                "SETSLOT",
                &slot.to_string(),
                "MIGRATING",
                &id(target),
            ])
            .unwrap();
        migrating.push((source, slot));
    }
    f.each_mode_fails_as_configured(key).await;
    assert_eq!(f.readyz().await.0, StatusCode::OK);
    for (source, slot) in migrating {
        cluster.nodes()[source]
            .cmd(&["CLUSTER", "SETSLOT", &slot.to_string(), "STABLE"])
            .unwrap();
    }
    f.decides_again(key).await;
    f.stop().await;
}

/// `/readyz` is not ready while every shard's circuit is open, ready while one is closed,
/// and ready again as soon as one shard decides (the probe `/readyz` makes closes its
/// circuit: no traffic is needed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_follows_the_circuits() {
    if !sluice_testkit::require_redis() {
        return;
    }
    let (a, b) = (RedisServer::start().unwrap(), RedisServer::start().unwrap());
    let store = format!(
        "  shards:\n    - primary: {}\n    - primary: {}\n",
        a.url(),
        b.url()
    );
    let s = TestServer::start(&config(&store, "closed"), &[("rules/d.yaml", RULES)]).await;
    let http = Client::new();
    let ready = || async {
        let r = s.get(&http, "/readyz").await;
        (r.status(), r.json::<Value>().await.unwrap())
    };
    let circuits = || async {
        let r = s.get(&http, "/v1/stats").await;
        let stats: Value = r.json().await.unwrap();
        let shards = stats["store"]["shards"].as_array().unwrap().clone();
        shards
            .iter()
            .map(|s| s["circuit"].as_str().unwrap().to_owned())
            .collect::<Vec<String>>()
    };
    // Checks on keys of every shard, until `done` says so.
    let mut i = 0;
    let mut check_until = async |what: &str, done: &dyn Fn(&[String]) -> bool| {
        for _ in 0..500 {
            i += 1;
            let url = format!("{}/v1/check", s.url);
            let r = support::post(
                &http,
                &url,
                json!({"policy": "open", "key": format!("k{i}")}),
            )
            .await;
            assert_eq!(r.status(), StatusCode::OK);
            if done(&circuits().await) {
                return;
            }
        }
        panic!("{what}: circuits {:?}", circuits().await);
    };
    let oom = |r: &RedisServer, bytes: &str| {
        r.cmd(&["CONFIG", "SET", "maxmemory-policy", "noeviction"])
            .unwrap();
        r.cmd(&["CONFIG", "SET", "maxmemory", bytes]).unwrap();
    };
    assert_eq!(ready().await.0, StatusCode::OK);

    oom(&a, "1");
    check_until("shard a's circuit to open", &|c: &[String]| {
        c[0] != "closed"
    })
    .await;
    assert_eq!(circuits().await[1], "closed");
    assert_eq!(
        ready().await.0,
        StatusCode::OK,
        "one shard's circuit is closed"
    );

    oom(&b, "1");
    check_until("both circuits to open", &|c: &[String]| {
        c.iter().all(|c| c != "closed")
    })
    .await;
    let (status, body) = ready().await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    let why = body["error"]["message"].as_str().unwrap();
    assert!(why.contains("every shard's circuit is open"), "{why}");
    assert!(
        why.contains(&a.addr()) && why.contains(&b.addr()) && why.contains("oom"),
        "{why}"
    );

    // Shard b answers again: ready, with no traffic.
    oom(&b, "0");
    until("/readyz to say ready", || async {
        ready().await.0 == StatusCode::OK
    })
    .await;
    assert_eq!(circuits().await[1], "closed");
    s.stop().await;
}

/// `rls.on_store_error` takes what a policy's `on_store_error` takes, and says so.
#[test]
fn rls_on_store_error_is_a_failure_mode() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("rules")).unwrap();
    let file = dir.path().join("sluice.yaml");
    for (mode, expected) in [
        ("local", Ok(sluice::FailureMode::Local)),
        ("maybe", Err(())),
    ] {
        std::fs::write(
            &file,
            format!("rls:\n  config_dir: rules\n  on_store_error: {mode}\n"),
        )
        .unwrap();
        match (sluice_server::config::Config::load(&file), expected) {
            (Ok(c), Ok(mode)) => assert_eq!(c.rls.unwrap().on_store_error, mode),
            (Err(e), Err(())) => {
                let e = e.to_string();
                assert!(
                    e.contains("rls.on_store_error") && e.contains("open, closed or local"),
                    "{e}"
                );
            }
            (other, _) => panic!("{mode}: {:?}", other.map(|c| c.rls)),
        }
    }
    std::fs::write(&file, "rls:\n  config_dir: rules\n").unwrap();
    let c = sluice_server::config::Config::load(&file).unwrap();
    assert_eq!(
        c.rls.unwrap().on_store_error,
        sluice::FailureMode::Closed,
        "the default"
    );
}

/// `on_store_error: local` over HTTP: what one server's insurance store admitted while Redis
/// was down is charged to Redis once it answers again, even for a key that server is not
/// asked about any more (its background task does it every second): another server sharing
/// the Redis sees the window used up. (Redis is killed and restarted with its append-only
/// file: a paused one would run the checks that timed out once it resumes, counting them
/// without any charge-back.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_admissions_reach_redis_when_it_returns() {
    if !sluice_testkit::require_redis() {
        return;
    }
    let mut redis =
        RedisServer::start_with(&["--appendonly", "yes", "--appendfsync", "always"]).unwrap();
    let config = config(&shard(&redis.url()), "closed");
    let a = TestServer::start(&config, &[("rules/d.yaml", RULES)]).await;
    let b = TestServer::start(&config, &[("rules/d.yaml", RULES)]).await;
    let http = Client::new();
    let call = |s: &TestServer, op: &str| {
        let url = format!("{}/v1/{op}", s.url);
        let http = http.clone();
        // A peek of cost 0: what is left, nothing deducted.
        let cost = u64::from(op != "peek");
        async move {
            let body = json!({"policy": "local", "key": "k", "cost": cost});
            let r = support::post(&http, &url, body).await;
            r.json::<Value>().await.unwrap()
        }
    };
    let first = call(&a, "check").await;
    assert_eq!(first["remaining"], MAX - 1, "{first}");
    tokio::task::block_in_place(|| redis.kill().unwrap());
    for _ in 0..2 {
        let d = call(&a, "check").await;
        assert_eq!(
            (&d["allowed"], &d["degraded"]),
            (&json!(true), &json!(true)),
            "{d}"
        );
    }
    tokio::task::block_in_place(|| redis.restart().unwrap());
    // Only `b` is asked from now on: `a` charges its two local admissions on its own.
    let mut last = Value::Null;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        last = match call(&b, "peek").await {
            seen if seen.get("degraded").is_none() => seen,
            _ => last,
        };
        if last["remaining"] == json!(0) {
            break;
        }
        assert!(
            last["remaining"] == json!(MAX - 1) || last.is_null(),
            "the restarted Redis kept its count, then the charge came: {last}"
        );
        assert!(Instant::now() < deadline, "never charged back: {last}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let d = call(&b, "check").await;
    assert_eq!(d["allowed"], false, "{d}");
    a.stop().await;
    b.stop().await;
}
