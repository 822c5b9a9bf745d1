//! The real server on port-0 listeners, for the end-to-end tests.

#![allow(clippy::unwrap_used, clippy::expect_used, dead_code, unreachable_pub)]

use std::path::PathBuf;
use std::time::Duration;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use sluice_server::app::{self, Listeners};
use sluice_server::config::Config;
use sluice_server::state::ServerClock;
use tokio::net::TcpListener;
use tokio::sync::oneshot;

/// A running `sluice serve`, configured from files in its own temporary directory.
pub struct TestServer {
    /// `http://127.0.0.1:<port>`.
    pub url: String,
    /// `http://127.0.0.1:<port>` of the gRPC API.
    pub grpc_url: String,
    /// `http://127.0.0.1:<port>` of the admin listener, when the configuration has
    /// `listen.admin` (its address is replaced by a free port).
    pub admin_url: Option<String>,
    /// The configuration file (watched: writing it reloads).
    pub file: PathBuf,
    /// The directory holding it and any extra files.
    pub dir: tempfile::TempDir,
    stop: Option<oneshot::Sender<()>>,
    done: tokio::task::JoinHandle<Result<(), app::ServeError>>,
}

impl TestServer {
    /// Writes `config` to `sluice.yaml` and each `(relative path, text)` beside it, starts the
    /// server on free ports and returns once both APIs answer (polled, never slept on).
    pub async fn start(config: &str, files: &[(&str, &str)]) -> Self {
        Self::start_on(config, files, ServerClock::system()).await
    }

    /// [`TestServer::start`] with the server deciding on `clock` (its clones share the time,
    /// so the test moves the server's time with the clone it keeps).
    pub async fn start_with_clock(
        config: &str,
        files: &[(&str, &str)],
        clock: sluice::ManualClock,
    ) -> Self {
        Self::start_on(config, files, ServerClock::new(clock)).await
    }

    async fn start_on(config: &str, files: &[(&str, &str)], clock: ServerClock) -> Self {
        Self::start_full(config, files, clock, reqwest::Client::new()).await
    }

    /// [`TestServer::start`] for a configuration with `listen.tls`: URLs are `https://`, and
    /// `client` (trusting the test CA, presenting a certificate if the server asks for one)
    /// is what polls for readiness.
    pub async fn start_tls(config: &str, files: &[(&str, &str)], client: reqwest::Client) -> Self {
        Self::start_full(config, files, ServerClock::system(), client).await
    }

    async fn start_full(
        config: &str,
        files: &[(&str, &str)],
        clock: ServerClock,
        client: reqwest::Client,
    ) -> Self {
        let dir = tempfile::tempdir().unwrap();
        for (path, text) in files {
            let path = dir.path().join(path);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        }
        let file = dir.path().join("sluice.yaml");
        std::fs::write(&file, config).unwrap();
        let settings = Config::load(&file).unwrap();
        let http = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let grpc = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let admin = match settings.admin_http {
            Some(_) => Some(TcpListener::bind("127.0.0.1:0").await.unwrap()),
            None => None,
        };
        let scheme = if settings.tls.is_some() {
            "https"
        } else {
            "http"
        };
        let url = format!("{scheme}://{}", http.local_addr().unwrap());
        let grpc_url = format!("{scheme}://{}", grpc.local_addr().unwrap());
        let admin_url = admin
            .as_ref()
            .map(|a| format!("{scheme}://{}", a.local_addr().unwrap()));
        let (stop, stopped) = oneshot::channel::<()>();
        let done = tokio::spawn(app::run_with_clock(
            Listeners {
                http,
                grpc: Some(grpc),
                admin,
            },
            settings,
            Some(file.clone()),
            async move {
                let _ = stopped.await;
            },
            clock,
        ));
        let server = Self {
            url,
            grpc_url,
            admin_url,
            file,
            dir,
            stop: Some(stop),
            done,
        };
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while client
            .get(format!("{}/healthz", server.url))
            .send()
            .await
            .is_err()
        {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the server never answered"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        server
    }

    /// A gRPC channel to the server (it is already listening).
    pub async fn channel(&self) -> tonic::transport::Channel {
        tonic::transport::Endpoint::from_shared(self.grpc_url.clone())
            .unwrap()
            .connect()
            .await
            .unwrap()
    }

    /// `GET {url}{path}` with `c`.
    pub async fn get(&self, c: &reqwest::Client, path: &str) -> reqwest::Response {
        c.get(format!("{}{path}", self.url)).send().await.unwrap()
    }

    /// `DELETE {url}{path}` with `c`.
    pub async fn delete(&self, c: &reqwest::Client, path: &str) -> reqwest::Response {
        c.delete(format!("{}{path}", self.url))
            .send()
            .await
            .unwrap()
    }

    /// `POST {url}{path}` of the JSON `body` with `c`.
    pub async fn post(
        &self,
        c: &reqwest::Client,
        path: &str,
        body: serde_json::Value,
    ) -> reqwest::Response {
        post(c, &format!("{}{path}", self.url), body).await
    }

    /// Stops the server (gracefully) and waits for it.
    pub async fn stop(mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        self.done.await.unwrap().unwrap();
    }
}

/// POSTs `body` as JSON to `url`.
pub async fn post(c: &reqwest::Client, url: &str, body: serde_json::Value) -> reqwest::Response {
    c.post(url).json(&body).send().await.unwrap()
}

/// The value of header `name`, as text.
pub fn header(r: &reqwest::Response, name: &str) -> Option<String> {
    r.headers()
        .get(name)
        .map(|v| v.to_str().unwrap().to_owned())
}

/// The text of the server's `GET {url}/metrics`.
pub async fn scrape(url: &str) -> String {
    reqwest::get(format!("{url}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

/// An Envoy rate limit descriptor of `(key, value)` entries.
pub fn descriptor(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(k, v)| Entry {
                key: (*k).to_owned(),
                value: (*v).to_owned(),
            })
            .collect(),
        ..RateLimitDescriptor::default()
    }
}

/// A rate limit request to `domain` of one descriptor per list of entries, of cost `hits`.
pub fn rls_request(domain: &str, descriptors: &[&[(&str, &str)]], hits: u32) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.to_owned(),
        descriptors: descriptors.iter().map(|d| descriptor(d)).collect(),
        hits_addend: hits,
    }
}

/// Sends `request`: its answer.
pub async fn send(request: reqwest::RequestBuilder) -> reqwest::Response {
    request.send().await.unwrap()
}

/// Sends `request` and reads its answer as JSON.
pub async fn json(request: reqwest::RequestBuilder) -> serde_json::Value {
    request.send().await.unwrap().json().await.unwrap()
}

/// Polls `GET url` until `cond` holds on its JSON body (10 s at the most; the server checks
/// its file every 500 ms): the body that met it.
pub async fn poll_json(
    url: &str,
    what: &str,
    cond: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let client = reqwest::Client::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let v = json(client.get(url)).await;
        if cond(&v) {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}: {v}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Sends `request`, with `token` as its bearer token where there is one: the status and the
/// JSON body.
pub async fn answer(
    request: reqwest::RequestBuilder,
    token: Option<&str>,
) -> (reqwest::StatusCode, serde_json::Value) {
    let request = match token {
        Some(token) => request.bearer_auth(token),
        None => request,
    };
    let r = request.send().await.unwrap();
    (r.status(), r.json().await.unwrap())
}

/// `POST /v1/check` of `key` under `policy`: the status and the body.
pub async fn check(
    c: &reqwest::Client,
    s: &TestServer,
    policy: &str,
    key: &str,
) -> (reqwest::StatusCode, serde_json::Value) {
    let r = c
        .post(format!("{}/v1/check", s.url))
        .json(&serde_json::json!({"policy": policy, "key": key}))
        .send()
        .await
        .unwrap();
    (r.status(), r.json().await.unwrap())
}

/// A real redis-server for one test, or `None` where Redis is absent and not required (the
/// test then returns without running).
pub fn redis() -> Option<sluice_testkit::RedisServer> {
    sluice_testkit::require_redis().then(|| sluice_testkit::RedisServer::start().unwrap())
}

/// A real redis-server for one test and `config` followed by the `store:` section that
/// decides on it ([`redis_store`]), or `None` as [`redis`].
pub fn with_redis(config: &str, timeout: &str) -> Option<(sluice_testkit::RedisServer, String)> {
    let redis = redis()?;
    let config = format!("{config}{}", redis_store(&redis, timeout));
    Some((redis, config))
}

/// Asserts that the gRPC error `e` has `code` and a message that contains `part`.
pub fn assert_status(e: &tonic::Status, code: tonic::Code, part: &str) {
    assert_eq!(e.code(), code, "{e:?}");
    assert!(e.message().contains(part), "{}", e.message());
}

/// The `store:` section of a configuration deciding on the one shard `redis`, with
/// `timeout` for each store call.
pub fn redis_store(redis: &sluice_testkit::RedisServer, timeout: &str) -> String {
    format!(
        "store:\n  backend: redis\n  shards:\n    - primary: {}\n  timeout: {timeout}\n",
        redis.url()
    )
}

/// Each item of the JSON array `items` as an array of its fields `names`, in that order (a
/// missing field is null), for comparing a listing's rows at once.
pub fn columns(items: &serde_json::Value, names: &[&str]) -> Vec<serde_json::Value> {
    items
        .as_array()
        .unwrap()
        .iter()
        .map(|item| names.iter().map(|name| item[*name].clone()).collect())
        .collect()
}
