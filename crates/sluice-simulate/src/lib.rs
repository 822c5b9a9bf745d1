//! The policy playground: runs a traffic through one or more policies on a manual clock and
//! says what each would have admitted and denied (docs/simulate.md).
//!
//! Every decision is the real one: a [`sluice::Limiter`] over a fresh [`sluice::MemoryStore`]
//! per policy, with a [`sluice::ManualClock`] set to each request's instant, so a simulation
//! means exactly what serving means, only faster than real time. The memory store answers
//! synchronously, so a simulation is plain CPU work: the HTTP route runs it on a blocking
//! thread, the `sluice simulate` command in its own.
//!
//! A request (`POST /v1/simulate` body, or what the command builds from its flags) is parsed
//! once, for both (`request.rs`), so both refuse the same things with the same words. Every
//! input is bounded ([`Bounds`]); a request over a bound is refused before any work, naming
//! the bound.
//!
//! Inside: this file holds the simulation's types and runs it; `request.rs` parses a request,
//! `traffic.rs` generates a pattern's traffic, `logs/` reads a log, `render.rs` draws the
//! answer. They use the types defined here.

use futures_util::FutureExt;
use serde::Serialize;
use sluice::{Algorithm, Limiter, ManualClock, MemoryStore, Policy};

pub mod logs;
pub mod render;
mod request;
pub mod traffic;

pub use logs::{LogFormat, LogOptions, LogReport, TimeUnit};
pub use request::policy_flag;
pub use traffic::{Generated, KeyChoice, Pattern};

/// Where generated traffic starts: 2026-01-01T00:00:00Z, a multiple of every usual window,
/// so sliding-window buckets line up with the traffic's own seconds.
pub const GENERATED_START_MS: u64 = 1_767_225_600_000;

/// Why a simulation cannot run: the field at fault (a path in the request: `traffic.rate`,
/// `policies[1].limits[0].per`) and what is wrong with it, the crate's one [`FieldError`].
pub type SimError = FieldError;

pub use sluice_spec::policy_entry::FieldError;

/// The bounds of one simulation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    /// Requests simulated (`max_events`).
    pub max_events: usize,
    /// The span of the traffic (`max_duration`).
    pub max_duration_ms: u64,
    /// Distinct keys (`max_keys`).
    pub max_keys: usize,
    /// Policies compared (`max_policies`).
    pub max_policies: usize,
    /// Time buckets per policy in the answer (`max_buckets`).
    pub max_buckets: u64,
    /// Keys listed per policy (`top`).
    pub max_top: usize,
    /// The memory one simulation may hold, in bytes, as [`memory_estimate`] reckons it before
    /// the work (`max_memory`).
    pub max_memory: u64,
}

impl Default for Bounds {
    fn default() -> Self {
        Self {
            max_events: 1_000_000,
            max_duration_ms: 31 * 86_400_000,
            max_keys: 100_000,
            max_policies: 8,
            max_buckets: 10_000,
            max_top: 100,
            max_memory: 64 << 20,
        }
    }
}

/// How many simulations a server runs at once (`POST /v1/simulate`); beyond, a request is
/// refused with `503 busy` before its body is read. Each is CPU work on a blocking thread and
/// holds up to [`Bounds::max_memory`]: together they bound what the route can cost.
pub const MAX_CONCURRENT: usize = 2;

/// Bytes one event costs at the peak: the event (24) and, while a traffic is made, the list
/// it is made from (a log's lines, a pattern's instants) and the growth of both.
const EVENT_BYTES: u64 = 48;
/// Bytes one distinct key costs besides its text: its place in the traffic's key list, in a
/// log's index of keys, and its entry and state in the memory store a policy runs on.
const KEY_BYTES: u64 = 160;

/// What a simulation holds at its peak, in bytes: its events, its keys (each written three
/// times: the traffic's list, a log's index, the store), and one count per bucket and policy
/// in the answer. The policies run one after the other, so one store is alive at a time.
/// Reckoned on the generous side: 1 000 000 events over 85 000 keys reckon 63 MiB, and
/// measured about 50 MiB above the server's own (docs/simulate.md#bounds).
pub fn memory_estimate(events: u64, keys: u64, key_text: u64, policies: u64, buckets: u64) -> u64 {
    events
        .saturating_mul(EVENT_BYTES)
        .saturating_add(keys.saturating_mul(KEY_BYTES))
        .saturating_add(key_text.saturating_mul(3))
        .saturating_add(policies.saturating_mul(buckets).saturating_mul(24))
}

/// One event of a traffic: a request of `cost` for key `key` at `t_ms` after the start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Event {
    /// Ms since the traffic's start.
    pub t_ms: u64,
    /// Index into [`Traffic::keys`].
    pub key: u32,
    /// The request's cost.
    pub cost: u64,
}

/// A traffic: events in time order over named keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Traffic {
    /// The keys, by index.
    pub keys: Vec<String>,
    /// The events, in time order.
    pub events: Vec<Event>,
    /// The span: every event is at `0 ≤ t_ms < duration_ms`.
    pub duration_ms: u64,
    /// The instant (ms since the epoch) of `t_ms = 0`: a log's first line, or
    /// [`GENERATED_START_MS`].
    pub start_ms: u64,
    /// How a log was read (its format, key and skipped lines); `None` for a pattern.
    pub log: Option<LogReport>,
}

/// A parsed, bounded simulation, ready to run.
#[derive(Debug, Clone)]
pub struct Simulation {
    /// The policies compared, in the request's order; each name is the policy's own.
    pub policies: Vec<Policy>,
    /// The traffic.
    pub traffic: Traffic,
    /// The seed of a generated traffic.
    pub seed: Option<u64>,
    /// The width of a time bucket in the answer.
    pub bucket_ms: u64,
    /// How many keys each policy lists (by denials).
    pub top: usize,
}

/// What one policy did with the traffic.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PolicyReport {
    /// The name given in the request.
    pub name: String,
    /// The limits, as `max/per algorithm` (e.g. `100/1m fixed_window`).
    pub limits: Vec<String>,
    /// Requests admitted.
    pub admitted: u64,
    /// Requests denied.
    pub denied: u64,
    /// Units (costs) admitted.
    pub admitted_cost: u64,
    /// Ms after the start of the first denial; `None` if none was denied.
    pub first_denial_ms: Option<u64>,
    /// The distribution of `retry_after` over the denials whose cost can ever fit.
    pub retry_after_ms: Option<Percentiles>,
    /// Denials whose cost can never fit (`retry_after: null`: a cost above `max` or `burst`).
    pub never_fits: u64,
    /// Admitted and denied per time bucket, from the start.
    pub buckets: Vec<Bucket>,
    /// The keys with the most denials (then the most admitted), at most `top`.
    pub top_keys: Vec<KeyCount>,
}

/// Nearest-rank percentiles, in ms.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Percentiles {
    /// The median.
    pub p50: u64,
    /// The 90th percentile.
    pub p90: u64,
    /// The 99th percentile.
    pub p99: u64,
    /// The largest.
    pub max: u64,
}

/// One time bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Bucket {
    /// Ms after the start.
    pub start_ms: u64,
    /// Requests admitted in it.
    pub admitted: u64,
    /// Requests denied in it.
    pub denied: u64,
}

/// One key's totals under a policy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct KeyCount {
    /// The key.
    pub key: String,
    /// Requests admitted.
    pub admitted: u64,
    /// Requests denied.
    pub denied: u64,
}

/// The answer of a simulation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Report {
    /// Requests in the traffic.
    pub events: u64,
    /// Distinct keys in the traffic.
    pub keys: u64,
    /// The instant (ms since the epoch) the traffic starts at.
    pub start_ms: u64,
    /// The traffic's span.
    pub duration_ms: u64,
    /// The bucket width.
    pub bucket_ms: u64,
    /// The seed of a generated traffic.
    pub seed: Option<u64>,
    /// How a log was read: its format, key, and the lines skipped by reason.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub log: Option<LogReport>,
    /// Each policy, in the request's order.
    pub policies: Vec<PolicyReport>,
}

impl Simulation {
    /// Runs every policy over the traffic.
    pub fn run(&self) -> Result<Report, SimError> {
        let policies = self
            .policies
            .iter()
            .map(|p| self.run_one(p))
            .collect::<Result<_, _>>()?;
        Ok(Report {
            events: self.traffic.events.len() as u64,
            keys: self.traffic.keys.len() as u64,
            start_ms: self.traffic.start_ms,
            duration_ms: self.traffic.duration_ms,
            bucket_ms: self.bucket_ms,
            seed: self.seed,
            log: self.traffic.log.clone(),
            policies,
        })
    }

    fn run_one(&self, policy: &Policy) -> Result<PolicyReport, SimError> {
        let tally = self.replay(policy)?;
        Ok(PolicyReport {
            name: policy.name().to_owned(),
            limits: policy.limits().iter().map(describe).collect(),
            admitted: tally.admitted,
            denied: tally.denied,
            admitted_cost: tally.admitted_cost,
            first_denial_ms: tally.first_denial_ms,
            retry_after_ms: percentiles(tally.retries),
            never_fits: tally.never_fits,
            top_keys: self.top_keys(&tally.per_key),
            buckets: tally.buckets,
        })
    }

    /// Checks every event against `policy` on a fresh memory store, counting the answers.
    fn replay(&self, policy: &Policy) -> Result<Tally, SimError> {
        let traffic = &self.traffic;
        let clock = ManualClock::new(traffic.start_ms);
        let limiter = Limiter::new(MemoryStore::with_shards(16)).with_clock(clock.clone());
        let n_buckets = traffic.duration_ms.div_ceil(self.bucket_ms) as usize;
        let mut tally = Tally {
            buckets: (0..n_buckets)
                .map(|i| Bucket {
                    start_ms: i as u64 * self.bucket_ms,
                    admitted: 0,
                    denied: 0,
                })
                .collect(),
            per_key: vec![(0u64, 0u64); traffic.keys.len()],
            ..Tally::default()
        };
        for e in &traffic.events {
            clock.set(traffic.start_ms + e.t_ms);
            let key = &traffic.keys[e.key as usize];
            // The memory store's answers are ready at once: polled once.
            let d = match limiter
                .call(policy, key, sluice::Op::Check { cost: e.cost })
                .now_or_never()
            {
                Some(Ok(d)) => d,
                Some(Err(err)) => {
                    return Err(SimError::new("traffic", format!("key `{key}`: {err}")));
                }
                None => {
                    return Err(SimError::new(
                        "simulation",
                        "the memory store did not answer at once",
                    ));
                }
            };
            tally.count(e, (e.t_ms / self.bucket_ms) as usize, &d);
        }
        Ok(tally)
    }

    /// The `top` keys with the most denials (then admissions, then by name).
    fn top_keys(&self, per_key: &[(u64, u64)]) -> Vec<KeyCount> {
        let keys = &self.traffic.keys;
        let mut order: Vec<usize> = (0..per_key.len())
            .filter(|&k| per_key[k] != (0, 0))
            .collect();
        order.sort_by(|&a, &b| {
            per_key[b]
                .1
                .cmp(&per_key[a].1)
                .then(per_key[b].0.cmp(&per_key[a].0))
                .then(keys[a].cmp(&keys[b]))
        });
        order
            .into_iter()
            .take(self.top)
            .map(|k| KeyCount {
                key: keys[k].clone(),
                admitted: per_key[k].0,
                denied: per_key[k].1,
            })
            .collect()
    }
}

/// What one policy's replay counted.
#[derive(Default)]
struct Tally {
    buckets: Vec<Bucket>,
    /// (admitted, denied) per key index.
    per_key: Vec<(u64, u64)>,
    admitted: u64,
    denied: u64,
    admitted_cost: u64,
    never_fits: u64,
    first_denial_ms: Option<u64>,
    retries: Vec<u64>,
}

impl Tally {
    fn count(&mut self, e: &Event, bucket: usize, d: &sluice::Decision) {
        let bucket = &mut self.buckets[bucket];
        let counts = &mut self.per_key[e.key as usize];
        if d.allowed {
            self.admitted += 1;
            self.admitted_cost += e.cost;
            bucket.admitted += 1;
            counts.0 += 1;
        } else {
            self.denied += 1;
            bucket.denied += 1;
            counts.1 += 1;
            self.first_denial_ms.get_or_insert(e.t_ms);
            match d.retry_after_ms() {
                Some(ms) => self.retries.push(ms),
                None => self.never_fits += 1,
            }
        }
    }
}

/// The retry-after percentiles, nearest rank; `None` without denials that can fit.
fn percentiles(mut retries: Vec<u64>) -> Option<Percentiles> {
    retries.sort_unstable();
    (!retries.is_empty()).then(|| {
        let rank = |p: f64| retries[((p * retries.len() as f64).ceil() as usize).max(1) - 1];
        Percentiles {
            p50: rank(0.50),
            p90: rank(0.90),
            p99: rank(0.99),
            max: retries[retries.len() - 1],
        }
    })
}

/// `100/1m fixed_window`.
fn describe(limit: &sluice::Limit) -> String {
    let mut s = format!(
        "{}/{} {}",
        limit.max(),
        render::human_ms(limit.per_ms()),
        limit.algorithm().as_str()
    );
    match limit.algorithm() {
        Algorithm::TokenBucket if limit.burst() != limit.max() => {
            s.push_str(&format!(" burst {}", limit.burst()));
        }
        Algorithm::SlidingWindow => {
            s.push_str(&format!(
                " precision {}",
                render::human_ms(limit.precision_ms())
            ));
        }
        Algorithm::FixedWindow if limit.align() => s.push_str(" aligned"),
        _ => {}
    }
    s
}
