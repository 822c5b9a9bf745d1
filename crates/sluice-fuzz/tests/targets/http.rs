//! The HTTP JSON API: the real axum router (`sluice_server::http::router`) over the memory
//! store and a manual clock, driven in process with arbitrary methods, paths, headers and
//! bodies.
//!
//! Properties, for every request: never a 5xx (the memory store always answers) and never a
//! panic; every answer is `application/json` (but `/metrics`); every 4xx but a denied check's
//! 429 is `{"error": {"code", "message"}}` with both non-empty; a check's decision body says
//! `allowed` as its status does (200 or 429); and a request that is not an admitted check, a refund or a forget
//! changes no state (every (policy, key) of a small universe peeked before and after), while
//! one that is changes at most one key.

use std::sync::{Arc, OnceLock};

use axum::Router;
use axum::body::Body;
use axum::http::{HeaderName, HeaderValue, Method, Request, StatusCode, header};
use bolero::check;
use serde_json::{Value, json};
use sluice::{Decision, ManualClock, MemoryStore};
use sluice_fuzz::{ByteEdit, Many, Tally, Word, apply_byte_edits, budget, seeds, structured};
use sluice_server::config::Config;
use sluice_server::http::MAX_BODY;
use sluice_server::state::{ServerClock, Shared, StoreHandle};
use tower::ServiceExt;

const CONFIG: &str = "
policies:
  api:
    limits:
      - { max: 3, per: 1h }
      - { max: 1000, per: 1d }
  search:
    limits:
      - { max: 30, per: 1m, algorithm: sliding_window, precision: 1s }
  uploads:
    on_store_error: closed
    limits:
      - { max: 100, per: 1m, algorithm: token_bucket, burst: 20 }
  jobs:
    limits:
      - { max: 2, per: 30s, algorithm: concurrency }
      - { max: 50, per: 1h }
";

const TOKEN: &str = "fuzz-admin-token-0123456789abcdef";
const T0: u64 = 1_700_000_000_000;

const POLICIES: &[&str] = &["api", "search", "uploads", "jobs"];
const KEYS: &[&str] = &["user:42", "k", "a/b", "ü", "%41"];

/// An admin configuration: the tokens file lives as long as the process.
fn admin_config() -> &'static str {
    static CONFIG_TEXT: OnceLock<(tempfile::TempDir, String)> = OnceLock::new();
    &CONFIG_TEXT
        .get_or_init(|| {
            let dir = tempfile::tempdir().expect("a temporary directory");
            let file = dir.path().join("tokens");
            std::fs::write(&file, format!("# fuzz\n{TOKEN}\n")).expect("the tokens file");
            let text = format!(
                "{CONFIG}admin:\n  tokens_file: {}\n  protect_metrics: true\n",
                file.display()
            );
            (dir, text)
        })
        .1
}

/// A fresh server: the router and what it shares, every (policy, key) of the universe used
/// once so that there is state to lose.
async fn app(admin: bool) -> (Router, Arc<Shared>) {
    static CONFIGS: OnceLock<[Config; 2]> = OnceLock::new();
    let configs = CONFIGS.get_or_init(|| {
        [CONFIG, admin_config()]
            .map(|text| Config::parse("fuzz.yaml", text).expect("the fuzz configuration"))
    });
    let config = &configs[usize::from(admin)];
    let store = StoreHandle::Memory(Arc::new(MemoryStore::new()));
    let clock = ServerClock::new(ManualClock::new(T0));
    let shared = Arc::new(Shared::new(config, store, None, clock));
    for policy in POLICIES {
        for key in KEYS {
            let limiter = &shared.snapshot().limiter;
            limiter.check(policy, key, 1).await.expect("memory store");
        }
    }
    (sluice_server::http::router(shared.clone()), shared)
}

async fn states(shared: &Shared) -> Vec<Decision> {
    let snapshot = shared.snapshot();
    let mut out = Vec::new();
    for policy in POLICIES {
        let policy = snapshot.limiter.policy(policy).expect("configured");
        for key in KEYS {
            out.push(
                snapshot
                    .limiter
                    .call(policy, key, sluice::Op::Peek { cost: 0 })
                    .await
                    .expect("memory store"),
            );
        }
    }
    out
}

/// Sends one request and holds the answer to the properties. Returns whether it was an
/// accepted state-changing call.
async fn send(router: &Router, shared: &Shared, request: Request<Body>) {
    let method = request.method().clone();
    let path = request.uri().path().to_owned();
    let before = states(shared).await;
    let response = router
        .clone()
        .oneshot(request)
        .await
        .expect("the router is infallible");
    let status = response.status();
    let content_type = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    let body = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .expect("an in-memory body");
    let what = format!(
        "{method} {path} -> {status}: {}",
        String::from_utf8_lossy(&body)
    );
    assert!(!status.is_server_error(), "{what}");
    let read = (method == Method::GET || method == Method::HEAD) && status == StatusCode::OK;
    // The answers that are not JSON: the metrics, and the dashboard's page and script.
    let not_json = match path.split('?').next().unwrap_or("") {
        "/metrics" if read => Some("text/plain"),
        "/ui" if read => Some("text/html"),
        "/ui/app.js" if read => Some("text/javascript"),
        _ => None,
    };
    let metrics = not_json.is_some();
    if let Some(kind) = not_json {
        assert!(content_type.starts_with(kind), "{what}");
    } else if status == StatusCode::NO_CONTENT {
        // No body, so no content type (a 204 said application/json).
        assert_eq!(content_type, "", "{what}");
        assert!(body.is_empty(), "{what}");
    } else {
        assert_eq!(content_type, "application/json", "{what}");
    }
    if method == Method::HEAD {
        // HTTP: an answer to HEAD has no body.
        assert!(body.is_empty(), "{what}");
    } else if status.is_client_error() && status != StatusCode::TOO_MANY_REQUESTS {
        let v: Value = serde_json::from_slice(&body).unwrap_or_else(|e| panic!("{e}: {what}"));
        let code = v["error"]["code"].as_str().unwrap_or("");
        let message = v["error"]["message"].as_str().unwrap_or("");
        assert!(!code.is_empty() && !message.trim().is_empty(), "{what}");
    } else if status != StatusCode::NO_CONTENT && !metrics {
        let v: Value = serde_json::from_slice(&body).unwrap_or_else(|e| panic!("{e}: {what}"));
        if let Some(allowed) = v.get("allowed") {
            assert!(v["limits"].is_array(), "{what}");
            if path == "/v1/check" || path == "/v1/acquire" {
                assert_eq!(allowed, &json!(status == StatusCode::OK), "{what}");
            }
        }
    }
    let changing = (method == Method::POST
        && matches!(
            path.as_str(),
            "/v1/check" | "/v1/refund" | "/v1/acquire" | "/v1/release"
        )
        && status == StatusCode::OK)
        || (method == Method::DELETE && status == StatusCode::NO_CONTENT);
    let after = states(shared).await;
    let changed = before.iter().zip(&after).filter(|(a, b)| a != b).count();
    if changing {
        assert!(changed <= 1, "{changed} keys changed: {what}");
    } else {
        assert_eq!(
            changed, 0,
            "a refused or read-only request changed state: {what}"
        );
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
}

/// A request written as HTTP/1.1 text: `METHOD PATH`, header lines, a blank line, the body.
/// `None` when the head is not a request `http` can represent (a server would have refused
/// it before routing).
fn parse_raw(bytes: &[u8]) -> Option<(bool, Request<Body>)> {
    let split = bytes
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|i| (i, i + 4))
        .or_else(|| {
            bytes
                .windows(2)
                .position(|w| w == b"\n\n")
                .map(|i| (i, i + 2))
        })
        .unwrap_or((bytes.len(), bytes.len()));
    let head = std::str::from_utf8(&bytes[..split.0]).ok()?;
    let body = bytes[split.1..].to_vec();
    let mut lines = head.lines();
    let mut first = lines.next()?.split(' ');
    let method = Method::from_bytes(first.next()?.as_bytes()).ok()?;
    let mut builder = Request::builder().method(method).uri(first.next()?);
    let mut admin = false;
    for line in lines {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        if name.eq_ignore_ascii_case("x-fuzz-admin") {
            // Not sent: selects the server with an `admin` section.
            admin = true;
            continue;
        }
        let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(name.trim().as_bytes()),
            HeaderValue::from_str(value.trim()),
        ) else {
            continue;
        };
        builder = builder.header(name, value);
    }
    Some((admin, builder.body(Body::from(body)).ok()?))
}

/// A seed of the corpus with byte edits: the mutational half of the raw target.
#[derive(Debug, arbitrary::Arbitrary)]
struct Mutated {
    seed: u8,
    edits: Many<ByteEdit, 6>,
}

/// Words the byte edits insert: pieces of requests.
const PIECES: &[&str] = &[
    "\r\n",
    "\r\n\r\n",
    ": ",
    " ",
    "/",
    "%",
    "%00",
    "%2F",
    "\"",
    "{",
    "}",
    "[",
    "]",
    ",",
    ":",
    "null",
    "-1",
    "1e999",
    "9007199254740993",
    "\\u0000",
    "\\ud800",
    "POST",
    "GET",
    "DELETE",
    "/v1/check",
    "/v1/keys/",
    "content-type: text/plain",
    "authorization: Bearer ",
    "x-fuzz-admin: 1",
    "\"cost\": ",
    "\"key\": ",
    "\"policy\": ",
    "\"lease\": ",
    "/v1/acquire",
    "/v1/release",
    "\u{feff}",
    "\u{ff}",
];

/// Any bytes as one HTTP request; the corpus holds real ones, for every route. Bytes that
/// do not start like a request (most random ones) are read as edits of a corpus seed, so the
/// random run on stable mutates the real requests instead of only generating noise.
#[test]
fn raw() {
    let tally = Tally::new("http::raw");
    let rt = runtime();
    let seeds = seeds("http__raw");
    assert!(!seeds.is_empty(), "the http corpus is missing");
    check!().with_test_time(budget()).for_each(|bytes: &[u8]| {
        let starts_like_a_request = bytes.first().is_some_and(u8::is_ascii_uppercase);
        let mutated;
        let bytes = if starts_like_a_request || bytes.is_empty() {
            bytes
        } else {
            let Some(m) = structured::<Mutated>(bytes) else {
                return;
            };
            let (_, seed) = &seeds[usize::from(m.seed) % seeds.len()];
            mutated = apply_byte_edits(seed.as_bytes(), &m.edits, PIECES);
            &mutated
        };
        let Some((admin, request)) = parse_raw(bytes) else {
            tally.input(false);
            return;
        };
        rt.block_on(async {
            let (router, shared) = app(admin).await;
            send(&router, &shared, request).await;
        });
        tally.input(true);
    });
}

// ----- structured requests ------------------------------------------------------------------

const METHODS: &[&str] = &[
    "GET", "POST", "DELETE", "PUT", "PATCH", "HEAD", "OPTIONS", "BREW",
];
const PATHS: &[&str] = &[
    "/v1/check",
    "/v1/peek",
    "/v1/acquire",
    "/v1/release",
    "/v1/refund",
    "/v1/policies",
    "/healthz",
    "/readyz",
    "/metrics",
    "/openapi.json",
    "/v1/top?policy=api",
    "/v1/top?policy=api&by=used&limit=3",
    "/v1/top?by=nope",
    "/v1/stats",
    "/ui",
    "/ui/app.js",
    "/v1/keys/api/user:42",
    "/v1/keys/",
    "/v1/check/",
    "/v1/check?cost=5",
    "//v1/check",
    "/",
];
/// Strings the body and path take: the universe, and the edges of each field.
const STRINGS: &[&str] = &[
    "api",
    "search",
    "uploads",
    "user:42",
    "k",
    "a/b",
    "ü",
    "%41",
    "",
    "API",
    "unknown",
    " ",
    "\u{0}",
    "policy",
    "key",
    "cost",
    "jobs",
    "lease",
    "0000000000000001",
    "ffffffffffffffff",
];
const HEADER_NAMES: &[&str] = &[
    "content-type",
    "authorization",
    "content-length",
    "accept",
    "x-forwarded-for",
    "transfer-encoding",
    "content-encoding",
];
const HEADER_VALUES: &[&str] = &[
    "application/json",
    "text/plain",
    "Bearer fuzz-admin-token-0123456789abcdef",
    "Bearer fuzz-admin-token-0123456789abcdeF",
    "Bearer ",
    "Basic Zm9vOmJhcg==",
    "0",
    "5",
    "99999999999",
    "chunked",
    "gzip",
];

/// A JSON value for a field.
#[derive(Debug, arbitrary::Arbitrary)]
enum Json {
    Word(Word),
    Int(i64),
    Unsigned(u64),
    Float(f64),
    /// 2^53 + n - 4: around the largest cost.
    NearMax(u8),
    Bool(bool),
    Null,
    Array(Vec<u8>),
    Object,
    /// A number written as text, e.g. `1e3` or `-0`.
    Number(String),
}

impl Json {
    fn render(&self) -> String {
        match self {
            Json::Word(w) => json!(w.text(STRINGS)).to_string(),
            Json::Int(n) => n.to_string(),
            Json::Unsigned(n) => n.to_string(),
            Json::Float(f) => json!(f).to_string(),
            Json::NearMax(n) => ((1u64 << 53) + u64::from(*n % 8))
                .saturating_sub(4)
                .to_string(),
            Json::Bool(b) => b.to_string(),
            Json::Null => "null".to_owned(),
            Json::Array(a) => json!(a).to_string(),
            Json::Object => "{}".to_owned(),
            Json::Number(s) => s.clone(),
        }
    }
}

#[derive(Debug, arbitrary::Arbitrary)]
enum FuzzBody {
    Fields {
        policy: Option<Json>,
        key: Option<Json>,
        cost: Option<Json>,
        extra: Option<(Word, Json)>,
        /// Repeats the key field (JSON objects with a duplicate name).
        duplicate_key: Option<Json>,
    },
    /// A long key, or a body over the limit (units of 1 KiB).
    Long(u8),
    Bytes(Vec<u8>),
    Empty,
}

impl FuzzBody {
    fn render(&self) -> Vec<u8> {
        match self {
            FuzzBody::Fields {
                policy,
                key,
                cost,
                extra,
                duplicate_key,
            } => {
                let mut fields = Vec::new();
                for (name, value) in [("policy", policy), ("key", key), ("cost", cost)] {
                    if let Some(v) = value {
                        fields.push(format!("\"{name}\": {}", v.render()));
                    }
                }
                if let Some((name, v)) = extra {
                    fields.push(format!("{}: {}", json!(name.text(STRINGS)), v.render()));
                }
                if let Some(v) = duplicate_key {
                    fields.push(format!("\"key\": {}", v.render()));
                }
                format!("{{{}}}", fields.join(", ")).into_bytes()
            }
            FuzzBody::Long(n) => {
                let len = usize::from(*n) * 1024 + 500;
                let key = "x".repeat(len.min(MAX_BODY + 1024));
                json!({"policy": "api", "key": key})
                    .to_string()
                    .into_bytes()
            }
            FuzzBody::Bytes(b) => b.clone(),
            FuzzBody::Empty => Vec::new(),
        }
    }
}

#[derive(Debug, arbitrary::Arbitrary)]
enum FuzzPath {
    Known(u8),
    Keys(Word, Word),
    Free(String),
}

#[derive(Debug, arbitrary::Arbitrary)]
struct Call {
    method: u8,
    path: FuzzPath,
    headers: Many<(u8, Word), 4>,
    body: FuzzBody,
}

#[derive(Debug, arbitrary::Arbitrary)]
struct Session {
    admin: bool,
    calls: Many<Call, 8>,
}

fn build(call: &Call) -> Option<Request<Body>> {
    let method = METHODS[usize::from(call.method) % METHODS.len()];
    let path = match &call.path {
        FuzzPath::Known(i) => PATHS[usize::from(*i) % PATHS.len()].to_owned(),
        FuzzPath::Keys(p, k) => format!("/v1/keys/{}/{}", p.text(STRINGS), k.text(STRINGS)),
        FuzzPath::Free(s) => s.clone(),
    };
    let mut builder = Request::builder().method(method).uri(path);
    for (name, value) in &call.headers {
        let name = HEADER_NAMES[usize::from(*name) % HEADER_NAMES.len()];
        if let Ok(v) = HeaderValue::from_str(value.text(HEADER_VALUES)) {
            builder = builder.header(name, v);
        }
    }
    builder.body(Body::from(call.body.render())).ok()
}

/// Sessions of requests built from the API's own vocabulary: the routes, the universe's
/// policies and keys, JSON values at the edges of each field, bodies over the limit, admin
/// tokens right and wrong.
#[test]
fn structured_sessions() {
    let tally = Tally::new("http::structured");
    let rt = runtime();
    check!().with_test_time(budget()).for_each(|bytes: &[u8]| {
        let Some(session) = structured::<Session>(bytes) else {
            return;
        };
        rt.block_on(async {
            let (router, shared) = app(session.admin).await;
            for call in session.calls.iter().take(8) {
                if let Some(request) = build(call) {
                    send(&router, &shared, request).await;
                }
            }
        });
        tally.input(true);
    });
}
