//! `sluice bench`: a load generator against a running server (HTTP or gRPC) or in-process
//! (the library over the memory store or Redis). It stops by itself, after a duration or a
//! number of requests, and reports decisions/s, latency percentiles (hdrhistogram),
//! allowed/denied counts and, given a Redis URL, Redis commands per decision.
//!
//! It hides nothing: an answer the store did not decide (`degraded`: a policy failing open
//! or `local` while the store is down) is counted apart, never as allowed or denied, and
//! never in decisions/s; failed requests are counted by kind (`HTTP 404 unknown_policy`,
//! `connect`, `gRPC FailedPrecondition`) with the first message of each; and
//! [`Report::measured_nothing`] tells the command to exit non-zero.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::{Args, ValueEnum};
use hdrhistogram::Histogram;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Zipf};
use serde_json::json;

use sluice_server::config::PositiveDuration;

pub mod client;
mod driver;
mod error;

pub use client::ClientArgs;
use driver::{Answer, Driver, Failure, driver};
pub use error::Error;

/// What to load.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Target {
    /// `POST /v1/check` on a running server.
    Http,
    /// Envoy's `ShouldRateLimit` on a running server.
    Grpc,
    /// The library in this process, over the memory store or `--redis`.
    Inproc,
}

/// Which keys requests use.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Keys {
    /// One hot key.
    Hot,
    /// Uniform over N keys.
    Uniform(u64),
    /// Zipf over N keys with exponent s.
    Zipf(u64, f64),
}

impl std::str::FromStr for Keys {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let parts: Vec<&str> = s.split(':').collect();
        let n = |i: usize| -> Result<u64, String> {
            parts
                .get(i)
                .and_then(|v| v.parse().ok())
                .filter(|&n| n > 0)
                .ok_or_else(|| format!("`{s}`: expected a positive number of keys"))
        };
        match parts[0] {
            "hot" => Ok(Keys::Hot),
            "uniform" => Ok(Keys::Uniform(n(1)?)),
            "zipf" => {
                let exponent = match parts.get(2) {
                    None => 1.0,
                    Some(v) => v
                        .parse::<f64>()
                        .ok()
                        .filter(|e| *e > 0.0)
                        .ok_or_else(|| format!("`{s}`: the Zipf exponent must be positive"))?,
                };
                Ok(Keys::Zipf(n(1)?, exponent))
            }
            _ => Err(format!(
                "`{s}`: expected hot, uniform:N or zipf:N[:exponent]"
            )),
        }
    }
}

/// `sluice bench` options.
#[derive(Debug, Clone, Args)]
pub struct BenchArgs {
    /// What to load.
    #[arg(long, value_enum, default_value_t = Target::Http)]
    pub target: Target,
    /// The HTTP server (target http).
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    pub url: String,
    /// The gRPC server (target grpc).
    #[arg(long, default_value = "http://127.0.0.1:8081")]
    pub grpc: String,
    /// The policy (targets http and inproc).
    #[arg(long, default_value = "demo")]
    pub policy: String,
    /// The rate limit domain (target grpc).
    #[arg(long, default_value = "bench")]
    pub domain: String,
    /// The descriptor key; the value is the request's key (target grpc).
    #[arg(long, default_value = "remote_address")]
    pub descriptor_key: String,
    /// Requests in flight at once.
    #[arg(long, default_value_t = 16)]
    pub concurrency: usize,
    /// How long to run (ignored with --requests).
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub duration: Duration,
    /// Stop after this many requests instead.
    #[arg(long)]
    pub requests: Option<u64>,
    /// Key distribution: hot, uniform:N or zipf:N[:exponent].
    #[arg(long, default_value = "uniform:10000")]
    pub keys: Keys,
    /// The cost of each request.
    #[arg(long, default_value_t = 1)]
    pub cost: u64,
    /// A Redis URL: the store for --target inproc, and for every target the server whose INFO
    /// commandstats give Redis commands per decision.
    #[arg(long)]
    pub redis: Option<String>,
    /// Inproc policy: max.
    #[arg(long, default_value_t = 1_000_000_000)]
    pub max: u64,
    /// Inproc policy: per.
    #[arg(long, default_value = "1h", value_parser = parse_duration)]
    pub per: Duration,
    /// Inproc policy: algorithm.
    #[arg(long, default_value = "fixed_window")]
    pub algorithm: String,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
    /// How to reach the server: --cacert for https://, an admin token.
    #[command(flatten)]
    pub client: ClientArgs,
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    PositiveDuration::parse(s)
        .map(|d| d.0)
        .map_err(|e| e.to_string())
}

/// Failed requests of one kind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ErrorKind {
    /// What failed: `HTTP 404 unknown_policy`, `connect`, `gRPC FailedPrecondition`, …
    pub kind: String,
    /// How many requests failed so.
    pub count: u64,
    /// The first one's message.
    pub first: String,
}

/// What a run measured.
#[derive(Debug, Clone)]
pub struct Report {
    /// Decisions the store made (allowed + denied); degraded answers are not among them.
    pub decisions: u64,
    /// Allowed by the store.
    pub allowed: u64,
    /// Denied by the store.
    pub denied: u64,
    /// Answered without the store (`degraded`: failed open, or decided by the `local`
    /// insurance store), allowed or not.
    pub degraded: u64,
    /// Failed requests.
    pub errors: u64,
    /// The failed requests by kind, each with its first message.
    pub error_kinds: Vec<ErrorKind>,
    /// Wall time.
    pub seconds: f64,
    /// Latency percentiles in µs: p50, p99, p999, max.
    pub latency_us: [u64; 4],
    /// Redis commands per decision, when --redis was given.
    pub redis_commands_per_decision: Option<f64>,
}

impl Report {
    /// Decisions per second.
    pub fn rate(&self) -> f64 {
        self.decisions as f64 / self.seconds.max(f64::EPSILON)
    }

    /// Why the run measured nothing, if it did not: every request failed, or no answer was
    /// the store's. The command then exits non-zero.
    pub fn measured_nothing(&self) -> Option<String> {
        if self.decisions > 0 {
            return None;
        }
        Some(if self.degraded > 0 {
            format!(
                "no request was decided by the store: {} answers were degraded (the store did \
                 not answer and the policy failed open or local){}",
                self.degraded,
                if self.errors > 0 {
                    format!(", {} failed", self.errors)
                } else {
                    String::new()
                }
            )
        } else if let Some(first) = self.error_kinds.first() {
            format!(
                "every request failed ({}); the first: {}: {}",
                self.errors, first.kind, first.first
            )
        } else {
            "no request was made".to_owned()
        })
    }

    /// The report as JSON.
    pub fn to_json(&self, args: &BenchArgs) -> serde_json::Value {
        json!({
            "target": format!("{:?}", args.target).to_lowercase(),
            "concurrency": args.concurrency,
            "decisions": self.decisions,
            "allowed": self.allowed,
            "denied": self.denied,
            "degraded": self.degraded,
            "errors": self.errors,
            "error_kinds": self.error_kinds.iter().map(|k| json!({"kind": k.kind, "count": k.count, "first": k.first})).collect::<Vec<_>>(),
            "seconds": self.seconds,
            "decisions_per_second": self.rate(),
            "latency_us": {"p50": self.latency_us[0], "p99": self.latency_us[1], "p999": self.latency_us[2], "max": self.latency_us[3]},
            "redis_commands_per_decision": self.redis_commands_per_decision,
        })
    }

    /// The report for people.
    pub fn to_text(&self, args: &BenchArgs) -> String {
        let mut s = format!(
            "target {:?}, concurrency {}, {:.2} s\n  decisions/s  {:.0}\n  decisions    {} (allowed {}, denied {}), degraded {}, errors {}\n  latency µs   p50 {}  p99 {}  p999 {}  max {}\n",
            args.target,
            args.concurrency,
            self.seconds,
            self.rate(),
            self.decisions,
            self.allowed,
            self.denied,
            self.degraded,
            self.errors,
            self.latency_us[0],
            self.latency_us[1],
            self.latency_us[2],
            self.latency_us[3],
        );
        if self.degraded > 0 {
            s.push_str(&format!(
                "  degraded     {} answers the store did not decide (it did not answer; the \
                 policy failed open or local): not counted as decisions\n",
                self.degraded
            ));
        }
        for k in &self.error_kinds {
            s.push_str(&format!(
                "  error        {} × {}, the first: {}\n",
                k.count, k.kind, k.first
            ));
        }
        if let Some(c) = self.redis_commands_per_decision {
            s.push_str(&format!("  redis commands per decision  {c:.3}\n"));
        }
        s
    }
}

/// What one worker counted.
struct Tally {
    hist: Histogram<u64>,
    allowed: u64,
    denied: u64,
    degraded: u64,
    /// By kind: (count, the first message).
    errors: BTreeMap<String, (u64, String)>,
}

impl Tally {
    fn new() -> Result<Self, Error> {
        Ok(Self {
            hist: Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).map_err(Error::histogram)?,
            allowed: 0,
            denied: 0,
            degraded: 0,
            errors: BTreeMap::new(),
        })
    }

    fn count(&mut self, result: Result<Answer, Failure>) {
        match result {
            Ok(Answer::Allowed) => self.allowed += 1,
            Ok(Answer::Denied) => self.denied += 1,
            Ok(Answer::Degraded) => self.degraded += 1,
            Err(f) => self.failed(f.kind, 1, f.message),
        }
    }

    /// `n` failed requests of `kind`, the first with the message `first`.
    fn failed(&mut self, kind: String, n: u64, first: String) {
        self.errors
            .entry(kind)
            .and_modify(|(m, _)| *m += n)
            .or_insert((n, first));
    }

    /// The report of what was counted over `seconds`.
    fn report(self, seconds: f64) -> Report {
        let mut error_kinds: Vec<ErrorKind> = self
            .errors
            .into_iter()
            .map(|(kind, (count, first))| ErrorKind { kind, count, first })
            .collect();
        // The commonest first.
        error_kinds.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.kind.cmp(&b.kind)));
        Report {
            decisions: self.allowed + self.denied,
            allowed: self.allowed,
            denied: self.denied,
            degraded: self.degraded,
            errors: error_kinds.iter().map(|k| k.count).sum(),
            error_kinds,
            seconds,
            latency_us: [
                self.hist.value_at_quantile(0.50),
                self.hist.value_at_quantile(0.99),
                self.hist.value_at_quantile(0.999),
                self.hist.max(),
            ],
            redis_commands_per_decision: None,
        }
    }

    fn add(&mut self, other: Tally) -> Result<(), Error> {
        self.hist.add(other.hist).map_err(Error::histogram)?;
        self.allowed += other.allowed;
        self.denied += other.denied;
        self.degraded += other.degraded;
        for (kind, (n, first)) in other.errors {
            self.failed(kind, n, first);
        }
        Ok(())
    }
}

/// Sum of command calls (except INFO itself) from INFO commandstats.
async fn redis_calls(url: &str) -> Result<u64, Error> {
    let client = redis::Client::open(url)?;
    let mut conn = client.get_multiplexed_async_connection().await?;
    let text: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut conn)
        .await?;
    Ok(text
        .lines()
        .filter_map(|l| l.strip_prefix("cmdstat_"))
        .filter(|l| !l.starts_with("info:"))
        .filter_map(|l| {
            l.split("calls=")
                .nth(1)?
                .split(',')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum())
}

fn key_for(keys: Keys, rng: &mut SmallRng, zipf: Option<&Zipf<f64>>, out: &mut String) {
    use std::fmt::Write;
    out.clear();
    let n = match (keys, zipf) {
        (Keys::Hot, _) => 0,
        (Keys::Uniform(n), _) => rng.random_range(0..n),
        (Keys::Zipf(..), Some(z)) => z.sample(rng) as u64,
        (Keys::Zipf(n, _), None) => rng.random_range(0..n),
    };
    let _ = write!(out, "bench:{n}");
}

/// What one worker of the load needs.
struct Load {
    driver: Driver,
    /// Requests issued by all workers, against `limit`.
    issued: Arc<AtomicU64>,
    keys: Keys,
    zipf: Option<Zipf<f64>>,
    cost: u64,
    /// `--requests`; without it, the load runs until `deadline`.
    limit: Option<u64>,
    deadline: Instant,
    progress: indicatif::ProgressBar,
}

impl Load {
    /// Sends requests one after the other until the load is over, timing each.
    async fn worker(mut self, worker: usize) -> Result<Tally, Error> {
        let mut tally = Tally::new()?;
        let mut rng = SmallRng::seed_from_u64(0x5EED ^ worker as u64);
        let mut key = String::with_capacity(32);
        loop {
            match self.limit {
                Some(n) => {
                    if self.issued.fetch_add(1, Ordering::Relaxed) >= n {
                        break;
                    }
                    self.progress.inc(1);
                }
                None => {
                    if Instant::now() >= self.deadline {
                        break;
                    }
                }
            }
            key_for(self.keys, &mut rng, self.zipf.as_ref(), &mut key);
            let t = Instant::now();
            let result = self.driver.once(&key, self.cost).await;
            let us = u64::try_from(t.elapsed().as_micros()).unwrap_or(u64::MAX);
            tally.hist.record(us.max(1)).map_err(Error::histogram)?;
            tally.count(result);
        }
        Ok(tally)
    }
}

/// Runs the load and returns what it measured.
pub async fn run(args: &BenchArgs) -> Result<Report, Error> {
    if args.concurrency == 0 {
        return Err(Error::Option("--concurrency must be at least 1".into()));
    }
    let driver = driver(args).await?;
    let zipf = match args.keys {
        Keys::Zipf(n, s) => {
            Some(Zipf::new(n as f64, s).map_err(|e| Error::Option(format!("zipf: {e}")))?)
        }
        _ => None,
    };
    let before = match &args.redis {
        Some(url) => Some(redis_calls(url).await?),
        None => None,
    };
    let progress = match args.requests {
        Some(n) => indicatif::ProgressBar::new(n),
        None => indicatif::ProgressBar::new(args.duration.as_secs().max(1)),
    };
    let issued = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let deadline = started + args.duration;
    let mut tasks = tokio::task::JoinSet::new();
    for worker in 0..args.concurrency {
        let load = Load {
            driver: driver.clone(),
            issued: issued.clone(),
            keys: args.keys,
            zipf,
            cost: args.cost,
            limit: args.requests,
            deadline,
            progress: progress.clone(),
        };
        tasks.spawn(load.worker(worker));
    }
    if args.requests.is_none() {
        let progress = progress.clone();
        let total = args.duration;
        tasks.spawn(async move {
            while started.elapsed() < total {
                progress.set_position(started.elapsed().as_secs());
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Tally::new()
        });
    }
    let mut total = Tally::new()?;
    while let Some(joined) = tasks.join_next().await {
        total.add(joined??)?;
    }
    progress.finish_and_clear();
    let mut report = total.report(started.elapsed().as_secs_f64());
    if let (Some(url), Some(before)) = (&args.redis, before) {
        let after = redis_calls(url).await?;
        report.redis_commands_per_decision =
            Some((after - before) as f64 / report.decisions.max(1) as f64);
    }
    Ok(report)
}
