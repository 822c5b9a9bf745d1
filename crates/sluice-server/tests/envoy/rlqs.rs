//! Envoy's rate limit quota service over real gRPC on loopback, against the real server on the
//! memory store and on Redis. [`Envoy`] behaves as Envoy's `rate_limit_quota` filter does: the
//! first request of a bucket passes under `no_assignment_behavior` and is reported at once;
//! then the bucket's assignment is enforced locally (a token bucket refilled continuously,
//! kept when a new assignment is the same, replaced full when it differs; blanket rules), the
//! usage of every bucket is reported every interval, and an assignment expires after its TTL.
//! Time is a manual clock shared by the server and the simulated Envoys.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use std::time::Duration;

use envoy_types::pb::envoy::r#type::v3::rate_limit_strategy::{BlanketRule, Strategy};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::BucketAction as Action;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_client::RateLimitQuotaServiceClient;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{
    BucketId, RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use sluice::ManualClock;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Streaming;

/// A window boundary: aligned windows of 20 s (and 1 min) start here.
const T0: u64 = 1_700_000_040_000;

type Bucket = Vec<(String, String)>;

fn bucket(entries: &[(&str, &str)]) -> Bucket {
    entries
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

fn bucket_id(b: &Bucket) -> BucketId {
    BucketId {
        bucket: b.iter().cloned().collect(),
    }
}

fn canonical(id: &BucketId) -> Vec<(String, String)> {
    let mut v: Vec<_> = id.bucket.clone().into_iter().collect();
    v.sort();
    v
}

/// One open stream: send a message, read its answer.
struct Stream {
    tx: mpsc::Sender<RateLimitQuotaUsageReports>,
    rx: Streaming<RateLimitQuotaResponse>,
}

impl Stream {
    async fn open(channel: &tonic::transport::Channel) -> Self {
        let (tx, rx) = mpsc::channel(4);
        let mut client = RateLimitQuotaServiceClient::new(channel.clone());
        let rx = client
            .stream_rate_limit_quotas(ReceiverStream::new(rx))
            .await
            .unwrap()
            .into_inner();
        Self { tx, rx }
    }

    async fn exchange(
        &mut self,
        reports: RateLimitQuotaUsageReports,
    ) -> Result<RateLimitQuotaResponse, tonic::Status> {
        self.tx.send(reports).await.unwrap();
        match self.rx.message().await {
            Ok(Some(r)) => Ok(r),
            Ok(None) => panic!("the server ended the stream without an answer"),
            Err(status) => Err(status),
        }
    }

    /// Reports `(bucket, allowed)` pairs in `domain` and returns the answer.
    async fn report(
        &mut self,
        domain: &str,
        usages: &[(&Bucket, u64)],
    ) -> Result<RateLimitQuotaResponse, tonic::Status> {
        let reports = RateLimitQuotaUsageReports {
            domain: domain.to_owned(),
            bucket_quota_usages: usages
                .iter()
                .map(|(b, allowed)| BucketQuotaUsage {
                    bucket_id: Some(bucket_id(b)),
                    num_requests_allowed: *allowed,
                    ..BucketQuotaUsage::default()
                })
                .collect(),
        };
        self.exchange(reports).await
    }
}

/// What a bucket's assignment says, simplified for assertions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Seen {
    Allow,
    Deny,
    Tokens(u32),
    Abandon,
}

fn seen(r: &RateLimitQuotaResponse) -> Vec<Seen> {
    r.bucket_action
        .iter()
        .map(|a| match a.bucket_action.as_ref().unwrap() {
            Action::AbandonAction(_) => Seen::Abandon,
            Action::QuotaAssignmentAction(q) => {
                match q.rate_limit_strategy.unwrap().strategy.unwrap() {
                    Strategy::BlanketRule(r) if r == BlanketRule::DenyAll as i32 => Seen::Deny,
                    Strategy::BlanketRule(_) => Seen::Allow,
                    Strategy::TokenBucket(tb) => Seen::Tokens(tb.max_tokens),
                    Strategy::RequestsPerTimeUnit(_) => panic!("Envoy does not support it"),
                }
            }
        })
        .collect()
}

/// A bucket's local state in the simulated Envoy.
#[derive(Debug, Clone, Copy)]
enum Local {
    /// Before the first assignment, and after one expires: allow (the filter's default).
    NoAssignment,
    Allow {
        until: u64,
    },
    Deny {
        until: u64,
    },
    Tokens {
        bucket: TokenBucket,
        until: u64,
    },
}

/// Envoy's AtomicTokenBucketImpl: `max` tokens, refilled continuously at `per_fill` every
/// `fill_s` seconds; `tokens` as of `last`.
#[derive(Debug, Clone, Copy)]
struct TokenBucket {
    max: u32,
    per_fill: u32,
    fill_s: i64,
    tokens: f64,
    last: u64,
}

impl TokenBucket {
    /// Takes a token at `now`, if there is one.
    fn take(&mut self, now: u64) -> bool {
        let rate = f64::from(self.per_fill) / self.fill_s as f64;
        self.tokens =
            (self.tokens + (now - self.last) as f64 / 1_000.0 * rate).min(f64::from(self.max));
        self.last = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

struct SimBucket {
    id: Bucket,
    allowed: u64,
    state: Local,
}

/// A simulated Envoy with the `rate_limit_quota` filter.
struct Envoy {
    domain: String,
    stream: Stream,
    clock: ManualClock,
    buckets: Vec<SimBucket>,
}

impl Envoy {
    async fn connect(
        channel: &tonic::transport::Channel,
        domain: &str,
        clock: &ManualClock,
    ) -> Self {
        Self {
            domain: domain.to_owned(),
            stream: Stream::open(channel).await,
            clock: clock.clone(),
            buckets: Vec::new(),
        }
    }

    fn now(&self) -> u64 {
        sluice::Clock::now_ms(&self.clock)
    }

    /// One request matched into `b`: whether it passes.
    async fn request(&mut self, b: &Bucket) -> bool {
        let now = self.now();
        let Some(i) = self.buckets.iter().position(|x| &x.id == b) else {
            // The first request of a bucket: no assignment yet, so it passes, and the bucket
            // is reported at once (the subscription).
            self.buckets.push(SimBucket {
                id: b.clone(),
                allowed: 1,
                state: Local::NoAssignment,
            });
            let i = self.buckets.len() - 1;
            self.send(&[i]).await;
            return true;
        };
        let bucket = &mut self.buckets[i];
        let pass = match &mut bucket.state {
            Local::NoAssignment => true,
            Local::Allow { until } | Local::Deny { until } if now >= *until => {
                bucket.state = Local::NoAssignment;
                true
            }
            Local::Tokens { until, .. } if now >= *until => {
                bucket.state = Local::NoAssignment;
                true
            }
            Local::Allow { .. } => true,
            Local::Deny { .. } => false,
            Local::Tokens { bucket, .. } => bucket.take(now),
        };
        if pass {
            bucket.allowed += 1;
        }
        pass
    }

    /// The periodic report of every bucket.
    async fn report_all(&mut self) {
        let all: Vec<usize> = (0..self.buckets.len()).collect();
        if !all.is_empty() {
            self.send(&all).await;
        }
    }

    async fn send(&mut self, which: &[usize]) {
        let reports = RateLimitQuotaUsageReports {
            domain: self.domain.clone(),
            bucket_quota_usages: which
                .iter()
                .map(|&i| BucketQuotaUsage {
                    bucket_id: Some(bucket_id(&self.buckets[i].id)),
                    num_requests_allowed: std::mem::take(&mut self.buckets[i].allowed),
                    ..BucketQuotaUsage::default()
                })
                .collect(),
        };
        let answer = self.stream.exchange(reports).await.unwrap();
        self.apply(&answer);
    }

    fn apply(&mut self, answer: &RateLimitQuotaResponse) {
        let now = self.now();
        for action in &answer.bucket_action {
            let id = canonical(action.bucket_id.as_ref().unwrap());
            let Some(i) = self.buckets.iter().position(|b| {
                let mut c = b.id.clone();
                c.sort();
                c == id
            }) else {
                continue;
            };
            match action.bucket_action.as_ref().unwrap() {
                Action::AbandonAction(_) => {
                    self.buckets.remove(i);
                }
                Action::QuotaAssignmentAction(q) => {
                    let until = now + 1_000 * q.assignment_time_to_live.unwrap().seconds as u64;
                    let old = self.buckets[i].state;
                    self.buckets[i].state = match q.rate_limit_strategy.unwrap().strategy.unwrap() {
                        Strategy::BlanketRule(r) if r == BlanketRule::DenyAll as i32 => {
                            Local::Deny { until }
                        }
                        Strategy::BlanketRule(_) => Local::Allow { until },
                        Strategy::TokenBucket(tb) => {
                            let per_fill = tb.tokens_per_fill.unwrap().value;
                            let fill_s = tb.fill_interval.unwrap().seconds;
                            match old {
                                // The same strategy: the bucket carries on, only the TTL moves.
                                Local::Tokens { bucket, .. }
                                    if (bucket.max, bucket.per_fill, bucket.fill_s)
                                        == (tb.max_tokens, per_fill, fill_s) =>
                                {
                                    Local::Tokens { bucket, until }
                                }
                                _ => Local::Tokens {
                                    bucket: TokenBucket {
                                        max: tb.max_tokens,
                                        per_fill,
                                        fill_s,
                                        tokens: f64::from(tb.max_tokens),
                                        last: now,
                                    },
                                    until,
                                },
                            }
                        }
                        Strategy::RequestsPerTimeUnit(_) => panic!("Envoy does not support it"),
                    };
                }
            }
        }
    }
}

/// A server of `config` deciding on a manual clock at [`T0`]: the server, the clock and a
/// channel to it.
async fn at_t0(config: &str) -> (support::TestServer, ManualClock, tonic::transport::Channel) {
    let clock = ManualClock::new(T0);
    let server = support::TestServer::start_with_clock(config, &[], clock.clone()).await;
    let channel = server.channel().await;
    (server, clock, channel)
}

async fn peek_used(server: &support::TestServer, policy: &str, key: &str) -> u64 {
    let body = support::json(
        reqwest::Client::new()
            .post(format!("{}/v1/peek", server.url))
            .json(&serde_json::json!({"policy": policy, "key": key, "cost": 0})),
    )
    .await;
    body["limit"].as_u64().unwrap() - body["remaining"].as_u64().unwrap()
}

/// A Redis store whose timeout a loaded 2-core machine meets when exactness is the point (a
/// charge that times out gets no action, and Envoy keeps its last assignment: at the default
/// 50 ms, 8 streams over Redis under a full test run admitted 11,528 in a window bounded at
/// 448).
fn redis_store(redis: &sluice_testkit::RedisServer) -> String {
    support::redis_store(redis, "2s")
}

// ----- the bound ---------------------------------------------------------------------------

const MAX: u64 = 400;
const WINDOW_MS: u64 = 20_000;
const INTERVAL_MS: u64 = 1_000;
const ENVOYS: u64 = 8;

const HOT: &str = "\
policies:
  hot:
    limits:
      - { max: 400, per: 20s, align: true }
rlqs:
  reporting_interval: 1s
  assignment_ttl: 3s
  buckets:
    - { name: routes, match: { route: '*' }, policy: hot, key: 'route:{route}' }
";

/// Eight Envoys hammer one bucket (each tries 200 requests a second, reporting every second at
/// staggered offsets) for three windows; each window admits at most `max + 2 × N × ceil(C / N)`,
/// with `C = ceil(max × interval / window)` (rlqs::assign), and at least `max - C - N` (the
/// fleet is not starved).
async fn eight_envoys_one_hot_bucket(store: &str, sluices: usize) {
    let clock = ManualClock::new(T0);
    let mut servers = Vec::new();
    let mut channels = Vec::new();
    for _ in 0..sluices {
        let server =
            support::TestServer::start_with_clock(&format!("{HOT}{store}"), &[], clock.clone())
                .await;
        channels.push(server.channel().await);
        servers.push(server);
    }
    // Envoy i reports to Sluice server i mod `sluices`: one fleet-wide limit in the store.
    let mut envoys = Vec::new();
    for i in 0..ENVOYS as usize {
        envoys.push(Envoy::connect(&channels[i % sluices], "edge", &clock).await);
    }
    let hot = bucket(&[("route", "/checkout")]);
    let pace = (MAX * INTERVAL_MS).div_ceil(WINDOW_MS);
    let bound = MAX + 2 * ENVOYS * pace.div_ceil(ENVOYS);
    // The interval after a reset (Envoys still hold the last window's DENY_ALL until their
    // next report) and the units floor(R / N) leaves unassigned.
    let floor = MAX - pace - ENVOYS;
    let tick = 50;
    let windows = 3;
    let mut admitted = vec![0u64; windows];
    let mut t = 0;
    while t < windows as u64 * WINDOW_MS {
        clock.set(T0 + t);
        for (i, envoy) in envoys.iter_mut().enumerate() {
            let offset = i as u64 * INTERVAL_MS / 10;
            if t > 0 && t >= offset && (t - offset).is_multiple_of(INTERVAL_MS) {
                envoy.report_all().await;
            }
            for _ in 0..10 {
                if envoy.request(&hot).await {
                    admitted[(t / WINDOW_MS) as usize] += 1;
                }
            }
        }
        t += tick;
    }
    eprintln!(
        "rlqs fleet of {ENVOYS} over {sluices} sluice server(s): admitted per {WINDOW_MS} ms window {admitted:?}; max {MAX}, bound {bound}"
    );
    for (w, &a) in admitted.iter().enumerate() {
        assert!(
            a <= bound,
            "window {w} admitted {a}, over max + 2·N·ceil(C/N) = {bound}"
        );
        assert!(a >= floor, "window {w} admitted only {a} of {MAX}");
    }
    for server in servers {
        server.stop().await;
    }
}

#[tokio::test]
async fn eight_envoys_stay_within_the_bound_in_memory() {
    eight_envoys_one_hot_bucket("", 1).await;
}

#[tokio::test]
async fn eight_envoys_stay_within_the_bound_over_redis() {
    let Some(redis) = support::redis() else {
        return;
    };
    eight_envoys_one_hot_bucket(&redis_store(&redis), 1).await;
}

/// Eight Envoys spread over three Sluice servers sharing one Redis: the same bound holds
/// fleet-wide, because every server charges the same keys and counts the same holders.
#[tokio::test]
async fn eight_envoys_over_three_sluice_servers_share_one_limit_in_redis() {
    let Some(redis) = support::redis() else {
        return;
    };
    eight_envoys_one_hot_bucket(&redis_store(&redis), 3).await;
}

/// The same fleet with every Envoy in its own task, so that reports of one tick reach the
/// server concurrently (over Redis, one charge per stream in flight at once); the order in
/// which they are charged changes nothing in the bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn eight_concurrent_streams_stay_within_the_bound_over_redis() {
    let Some(redis) = support::redis() else {
        return;
    };
    let clock = ManualClock::new(T0);
    let server = support::TestServer::start_with_clock(
        &format!("{HOT}{}", redis_store(&redis)),
        &[],
        clock.clone(),
    )
    .await;
    let channel = server.channel().await;
    let pace = (MAX * INTERVAL_MS).div_ceil(WINDOW_MS);
    let bound = MAX + 2 * ENVOYS * pace.div_ceil(ENVOYS);
    let windows = 2;
    let admitted: std::sync::Arc<Vec<std::sync::atomic::AtomicU64>> =
        std::sync::Arc::new((0..windows).map(|_| 0.into()).collect());
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(ENVOYS as usize));
    let mut tasks = Vec::new();
    for _ in 0..ENVOYS {
        let mut envoy = Envoy::connect(&channel, "edge", &clock).await;
        let (clock, barrier, admitted) = (clock.clone(), barrier.clone(), admitted.clone());
        tasks.push(tokio::spawn(async move {
            let hot = bucket(&[("route", "/checkout")]);
            let mut t = 0;
            while t < windows as u64 * WINDOW_MS {
                // One Envoy moves the shared clock while the others wait on both sides.
                if barrier.wait().await.is_leader() {
                    clock.set(T0 + t);
                }
                barrier.wait().await;
                if t > 0 && t.is_multiple_of(INTERVAL_MS) {
                    envoy.report_all().await;
                }
                for _ in 0..10 {
                    if envoy.request(&hot).await {
                        admitted[(t / WINDOW_MS) as usize]
                            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                }
                t += 50;
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let admitted: Vec<u64> = admitted
        .iter()
        .map(|a| a.load(std::sync::atomic::Ordering::Relaxed))
        .collect();
    eprintln!(
        "rlqs fleet of {ENVOYS} concurrent streams: admitted per window {admitted:?}; max {MAX}, bound {bound}"
    );
    for (w, &a) in admitted.iter().enumerate() {
        assert!(a <= bound, "window {w} admitted {a}, over {bound}");
        assert!(
            a >= MAX - pace - ENVOYS,
            "window {w} admitted only {a} of {MAX}"
        );
    }
    server.stop().await;
}

// ----- shares, reconnects, restarts ------------------------------------------------------

/// 1000 per 2 minutes reported every minute: the pace C is 500, so a share is
/// `min(floor(R / N), ceil(500 / N))`.
const SHARES: &str = "\
policies:
  big:
    limits:
      - { max: 1000, per: 2m }
rlqs:
  reporting_interval: 60s
  buckets:
    - { match: { route: '*' }, policy: big, key: 'route:{route}' }
";

#[tokio::test]
async fn a_share_shrinks_as_others_consume() {
    let (server, _, channel) = at_t0(SHARES).await;
    let b = bucket(&[("route", "a")]);
    let mut a = Stream::open(&channel).await;
    let mut other = Stream::open(&channel).await;
    let r = a.report("edge", &[(&b, 1)]).await.unwrap();
    assert_eq!(seen(&r), [Seen::Tokens(500)], "alone: the whole pace");
    let r = other.report("edge", &[(&b, 1)]).await.unwrap();
    assert_eq!(seen(&r), [Seen::Tokens(250)], "two holders split the pace");
    let r = other.report("edge", &[(&b, 800)]).await.unwrap();
    assert_eq!(
        seen(&r),
        [Seen::Tokens(99)],
        "two holders split the 198 left"
    );
    let r = a.report("edge", &[(&b, 0)]).await.unwrap();
    assert_eq!(
        seen(&r),
        [Seen::Tokens(99)],
        "a's share shrank from 500 as the other used 801"
    );
    assert_eq!(peek_used(&server, "big", "route:a").await, 802);
    // What no longer fits is charged as far as it fits.
    let r = other.report("edge", &[(&b, 300)]).await.unwrap();
    assert_eq!(seen(&r), [Seen::Deny]);
    assert_eq!(peek_used(&server, "big", "route:a").await, 1000);
    server.stop().await;
}

/// The first action's token bucket and time to live, in seconds: (tokens, fill, ttl).
fn timing(r: &RateLimitQuotaResponse) -> (u32, i64, i64) {
    let Some(Action::QuotaAssignmentAction(q)) = r.bucket_action[0].bucket_action else {
        panic!("an assignment: {r:?}");
    };
    let Some(Strategy::TokenBucket(tb)) = q.rate_limit_strategy.unwrap().strategy else {
        panic!("a token bucket");
    };
    (
        tb.max_tokens,
        tb.fill_interval.unwrap().seconds,
        q.assignment_time_to_live.unwrap().seconds,
    )
}

#[tokio::test]
async fn assignments_follow_the_cadence_the_stream_shows() {
    // Configured for a report a second; the client reports every 5 s, as Envoy 1.40 does
    // whatever its buckets' reporting_interval says.
    let config = "policies:\n  p:\n    limits:\n      - { max: 600, per: 1m }\n\
                  rlqs:\n  reporting_interval: 1s\n  buckets:\n    - { match: { route: '*' }, policy: p }\n";
    let (server, clock, channel) = at_t0(config).await;
    let (a, b) = (bucket(&[("route", "a")]), bucket(&[("route", "b")]));
    let mut s = Stream::open(&channel).await;
    // Until a bucket is reported twice, the configuration's: 10 a second, living 3 s.
    let r = s.report("edge", &[(&a, 1)]).await.unwrap();
    assert_eq!(timing(&r), (10, 1, 3));
    // A bucket created just before a periodic report says nothing of the cadence.
    clock.advance(4_900);
    let r = s.report("edge", &[(&b, 1)]).await.unwrap();
    assert_eq!(timing(&r), (10, 1, 3));
    clock.advance(100);
    let r = s.report("edge", &[(&a, 1), (&b, 1)]).await.unwrap();
    // 5 s since a's last report: 50 tokens every 5 s, living three reports.
    assert_eq!(timing(&r), (50, 5, 15));
    // The longest gap holds: the next bucket's short one does not shrink it.
    clock.advance(300);
    let r = s.report("edge", &[(&b, 0)]).await.unwrap();
    assert_eq!(timing(&r), (50, 5, 15));
    server.stop().await;
}

#[tokio::test]
async fn a_reconnected_stream_carries_on_from_the_store() {
    let (server, clock, channel) = at_t0(SHARES).await;
    let b = bucket(&[("route", "a")]);
    let mut envoy = Envoy::connect(&channel, "edge", &clock).await;
    assert!(envoy.request(&b).await);
    for _ in 0..99 {
        assert!(envoy.request(&b).await, "within the assignment of 500");
    }
    // The stream is lost (Envoy restarts it at its next report) with 99 requests unreported.
    drop(envoy);
    let mut again = Stream::open(&channel).await;
    let r = again.report("edge", &[(&b, 99)]).await.unwrap();
    // 100 counted; the lost stream still counts as a holder for the window, so two share:
    // min(900 / 2, 500 / 2).
    let used = peek_used(&server, "big", "route:a").await;
    assert_eq!((seen(&r), used), (vec![Seen::Tokens(250)], 100));
    server.stop().await;
}

#[tokio::test]
async fn a_restarted_server_keeps_the_count_in_redis() {
    let Some((_redis, config)) = support::with_redis(SHARES, "2s") else {
        return;
    };
    let clock = ManualClock::new(T0);
    let b = bucket(&[("route", "a")]);
    let first = support::TestServer::start_with_clock(&config, &[], clock.clone()).await;
    let mut stream = Stream::open(&first.channel().await).await;
    let r = stream.report("edge", &[(&b, 300)]).await.unwrap();
    assert_eq!(seen(&r), [Seen::Tokens(500)]);
    // Stopping ends the open stream, so that Envoy reconnects (here: to the next server).
    first.stop().await;
    let e = stream.rx.message().await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unavailable, "{e:?}");

    let second = support::TestServer::start_with_clock(&config, &[], clock.clone()).await;
    let mut stream = Stream::open(&second.channel().await).await;
    let r = stream.report("edge", &[(&b, 0)]).await.unwrap();
    // 300 still counted, and the first stream's holder too (it counts for the window): the
    // share is min(700 / 2, 500 / 2); a fresh count would give 500.
    assert_eq!(seen(&r), [Seen::Tokens(250)]);
    assert_eq!(peek_used(&second, "big", "route:a").await, 300);
    second.stop().await;
}

// ----- unmatched buckets, reloads, abandoning -----------------------------------------------

#[tokio::test]
async fn unmatched_buckets_reloads_and_abandoning() {
    let (server, clock, channel) = at_t0(SHARES).await;
    let routed = bucket(&[("route", "a")]);
    let stray = bucket(&[("user", "x")]);
    let mut s = Stream::open(&channel).await;
    let r = s
        .report("edge", &[(&routed, 1), (&stray, 1)])
        .await
        .unwrap();
    assert_eq!(
        seen(&r),
        [Seen::Tokens(500), Seen::Allow],
        "unmatched: allow_all by default"
    );

    // A reload: unmatched buckets are denied, and the route rule is gone.
    std::fs::write(
        &server.file,
        "policies:\n  big:\n    limits:\n      - { max: 1000, per: 2m }\nrlqs:\n  reporting_interval: 60s\n  unmatched: deny_all\n",
    )
    .unwrap();
    let http = reqwest::Client::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let body = support::json(http.get(format!("{}/v1/policies", server.url))).await;
        if body["config"]["generation"].as_u64() == Some(2) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "never reloaded: {body}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let r = s.report("", &[(&routed, 5), (&stray, 1)]).await.unwrap();
    assert_eq!(
        seen(&r),
        [Seen::Abandon, Seen::Deny],
        "its rule was removed: abandoned"
    );
    assert_eq!(
        peek_used(&server, "big", "route:a").await,
        1,
        "an abandoned report is not charged"
    );
    // Subscribed again, it is a bucket no rule matches.
    let r = s.report("", &[(&routed, 1)]).await.unwrap();
    assert_eq!(seen(&r), [Seen::Deny]);

    // Reported idle for abandon_after (default 5 min): abandoned; active first.
    clock.advance(299_000);
    let r = s.report("", &[(&stray, 0)]).await.unwrap();
    assert_eq!(seen(&r), [Seen::Deny]);
    clock.advance(1_000);
    let r = s.report("", &[(&stray, 0)]).await.unwrap();
    assert_eq!(seen(&r), [Seen::Abandon]);
    server.stop().await;
}

// ----- bad input ---------------------------------------------------------------------------

#[tokio::test]
async fn bad_input_is_invalid_argument_and_charges_nothing() {
    let (server, _, channel) = at_t0(SHARES).await;
    let good = bucket(&[("route", "a")]);
    let long = "v".repeat(300);
    type Case<'a> = (&'a str, Vec<(Bucket, u64)>, &'a str);
    let cases: Vec<Case<'_>> = vec![
        ("", vec![(good.clone(), 1)], "domain is empty"),
        (
            "edge",
            vec![(good.clone(), 1), (Vec::new(), 1)],
            "bucket_quota_usages[1].bucket_id is empty",
        ),
        (
            "edge",
            vec![(good.clone(), 1), (good.clone(), u64::MAX)],
            "num_requests_allowed",
        ),
        (
            "edge",
            vec![(bucket(&[("route", &long)]), 1)],
            "bucket_quota_usages[0].bucket_id",
        ),
    ];
    for (domain, usages, want) in cases {
        let mut s = Stream::open(&channel).await;
        let refs: Vec<(&Bucket, u64)> = usages.iter().map(|(b, n)| (b, *n)).collect();
        let e = s.report(domain, &refs).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{want}: {e:?}");
        assert!(e.message().contains(want), "{want}: {}", e.message());
    }
    // A missing bucket id.
    let mut s = Stream::open(&channel).await;
    let e = s
        .exchange(RateLimitQuotaUsageReports {
            domain: "edge".to_owned(),
            bucket_quota_usages: vec![BucketQuotaUsage::default()],
        })
        .await
        .unwrap_err();
    support::assert_status(&e, tonic::Code::InvalidArgument, "bucket_id is missing");
    // Another domain on the same stream.
    let mut s = Stream::open(&channel).await;
    s.report("edge", &[(&good, 0)]).await.unwrap();
    let e = s.report("other", &[(&good, 1)]).await.unwrap_err();
    support::assert_status(&e, tonic::Code::InvalidArgument, "domain changed");
    // Nothing of a refused message was charged, and the server still answers.
    assert_eq!(peek_used(&server, "big", "route:a").await, 0);
    let mut s = Stream::open(&channel).await;
    let r = s.report("edge", &[(&good, 2)]).await.unwrap();
    // The stream that changed its domain reported the bucket first: two holders.
    assert_eq!(seen(&r), [Seen::Tokens(250)]);
    server.stop().await;
}

#[tokio::test]
async fn without_an_rlqs_section_streams_are_refused() {
    let server = support::TestServer::start("{}\n", &[]).await;
    let mut s = Stream::open(&server.channel().await).await;
    let e = s
        .report("edge", &[(&bucket(&[("a", "b")]), 1)])
        .await
        .unwrap_err();
    support::assert_status(&e, tonic::Code::FailedPrecondition, "rlqs");
    server.stop().await;
}

/// The `rlqs` example in docs/server.md is a valid configuration, and a bad rule is refused
/// naming its field.
#[test]
fn the_documented_configuration_is_valid() {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/server.md"))
        .unwrap();
    let section = doc.split("### Configuring Sluice").nth(1).unwrap();
    let yaml = section
        .split("```yaml\n")
        .nth(1)
        .unwrap()
        .split("```")
        .next()
        .unwrap();
    let config = sluice_server::config::Config::parse("server.md", yaml).unwrap();
    let rlqs = config.rlqs.unwrap();
    assert_eq!(rlqs.buckets.len(), 2);
    assert_eq!(rlqs.reporting_interval, Duration::from_secs(5));

    let wrong = yaml.replace("policy: tenants", "policy: tenant");
    let e = sluice_server::config::Config::parse("server.md", &wrong).unwrap_err();
    assert!(
        e.to_string()
            .contains("rlqs.buckets[1].policy: no policy named `tenant`"),
        "{e}"
    );
}

/// A rule cannot name a policy with a concurrency limit: usage reports count requests that
/// already happened and hold nothing.
#[test]
fn a_rule_on_a_concurrency_policy_is_refused() {
    let yaml = "policies:\n  jobs:\n    limits:\n      - { max: 5, per: 1m, algorithm: concurrency }\n      - { max: 100, per: 1h }\nrlqs:\n  buckets:\n    - match: { name: jobs }\n      policy: jobs\n";
    let e = sluice_server::config::Config::parse("sluice.yaml", yaml).unwrap_err();
    assert!(
        e.to_string()
            .contains("rlqs.buckets[0].policy: `jobs` has a concurrency limit"),
        "{e}"
    );
}

/// A bucket listed twice in one message (its entries in another order) is one bucket: its
/// usages are summed and it gets one action.
#[tokio::test]
async fn a_bucket_twice_in_one_message_is_summed() {
    let (server, _, channel) = at_t0(SHARES).await;
    let mut s = Stream::open(&channel).await;
    let ab = bucket(&[("route", "a"), ("x", "1")]);
    let ba = bucket(&[("x", "1"), ("route", "a")]);
    let r = s.report("edge", &[(&ab, 2), (&ba, 3)]).await.unwrap();
    assert_eq!(seen(&r), [Seen::Tokens(500)]);
    assert_eq!(peek_used(&server, "big", "route:a").await, 5);
    server.stop().await;
}

/// A charge the store cannot answer gets no action (Envoy keeps its assignment until the TTL),
/// while the other buckets of the message are answered; the stream stays open and answers
/// again once the store is back.
#[tokio::test]
async fn a_stalled_redis_store_gets_no_action_and_the_stream_lives_on() {
    let Some(redis) = support::redis() else {
        return;
    };
    let config = format!("{SHARES}{}", support::redis_store(&redis, "200ms"));
    let server = support::TestServer::start_with_clock(&config, &[], ManualClock::new(T0)).await;
    let mut s = Stream::open(&server.channel().await).await;
    let routed = bucket(&[("route", "a")]);
    let stray = bucket(&[("user", "x")]);
    let r = s.report("edge", &[(&routed, 1)]).await.unwrap();
    assert_eq!(seen(&r), [Seen::Tokens(500)]);
    redis.pause().unwrap();
    let r = s.report("edge", &[(&routed, 1), (&stray, 1)]).await;
    redis.resume().unwrap();
    let r = r.unwrap();
    assert_eq!(
        seen(&r),
        [Seen::Allow],
        "only the unmatched bucket is answered"
    );
    assert_eq!(r.bucket_action[0].bucket_id, Some(bucket_id(&stray)));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let r = s.report("edge", &[(&routed, 0)]).await.unwrap();
        if seen(&r) == [Seen::Tokens(500)] {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the store never came back: {r:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    server.stop().await;
}
