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
//! here once, for both, so both refuse the same things with the same words. Every input is
//! bounded ([`Bounds`]); a request over a bound is refused before any work, naming the bound.

use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use serde::Serialize;
use serde_json::{Map, Value};
use sluice::{Algorithm, Limiter, ManualClock, MemoryStore, Policy};

use crate::units::PositiveDuration;

pub mod logs;
pub mod render;
pub mod traffic;

pub use logs::{LogFormat, LogOptions, LogReport, TimeUnit};
pub use traffic::{Generated, KeyChoice, Pattern};

/// Where generated traffic starts: 2026-01-01T00:00:00Z, a multiple of every usual window,
/// so sliding-window buckets line up with the traffic's own seconds.
pub const GENERATED_START_MS: u64 = 1_767_225_600_000;

/// Why a simulation cannot run: the field at fault and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct SimError {
    /// The field (a path in the request: `traffic.rate`, `policies[1].limits[0].per`).
    pub field: String,
    /// What is wrong, in words a person can act on.
    pub message: String,
}

impl SimError {
    /// An error about `field`.
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            message: message.into(),
        }
    }
}

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

/// Refuses a simulation whose [`memory_estimate`] is over `bounds.max_memory`, naming it.
fn check_memory(field: &str, estimate: u64, what: String, bounds: &Bounds) -> Result<(), SimError> {
    if estimate <= bounds.max_memory {
        return Ok(());
    }
    Err(bad(
        field,
        format!(
            "{what} would hold about {} MiB, more than the {} MiB one simulation may use \
             (max_memory); lower the rate, the duration or the keys, or simulate a part of the \
             log",
            estimate.div_ceil(1 << 20),
            bounds.max_memory >> 20
        ),
    ))
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

// ----- the request --------------------------------------------------------------------------

fn bad(field: impl Into<String>, message: impl Into<String>) -> SimError {
    SimError::new(field, message)
}

fn object<'a>(
    value: &'a Value,
    field: &str,
    shape: &str,
) -> Result<&'a Map<String, Value>, SimError> {
    value
        .as_object()
        .ok_or_else(|| bad(field, format!("must be an object: {shape}")))
}

fn only(map: &Map<String, Value>, field: &str, allowed: &[&str]) -> Result<(), SimError> {
    for name in map.keys() {
        if !allowed.contains(&name.as_str()) {
            return Err(bad(
                field,
                format!(
                    "unknown field `{name}`; the fields are {}",
                    allowed.join(", ")
                ),
            ));
        }
    }
    Ok(())
}

fn string<'a>(
    map: &'a Map<String, Value>,
    field: &str,
    path: &str,
) -> Result<Option<&'a str>, SimError> {
    match map.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(_) => Err(bad(path, "must be a string")),
    }
}

fn whole(map: &Map<String, Value>, field: &str, path: &str) -> Result<Option<u64>, SimError> {
    match map.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => n
            .as_u64()
            .map(Some)
            .ok_or_else(|| bad(path, format!("must be a whole number ≥ 0, got {n}"))),
        Some(_) => Err(bad(path, "must be a whole number")),
    }
}

fn rate(
    map: &Map<String, Value>,
    field: &str,
    path: &str,
    zero_ok: bool,
) -> Result<Option<f64>, SimError> {
    match map.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => match n.as_f64() {
            Some(r) if r.is_finite() && (r > 0.0 || (zero_ok && r == 0.0)) => Ok(Some(r)),
            _ => Err(bad(
                path,
                format!("must be a positive number of requests per second, got {n}"),
            )),
        },
        Some(_) => Err(bad(path, "must be a number of requests per second")),
    }
}

fn duration(map: &Map<String, Value>, field: &str, path: &str) -> Result<Option<u64>, SimError> {
    match string(map, field, path)? {
        None => Ok(None),
        Some(s) => PositiveDuration::parse(s)
            .map(|d| Some(u64::try_from(d.0.as_millis()).unwrap_or(u64::MAX)))
            .map_err(|e| bad(path, e)),
    }
}

impl Simulation {
    /// Parses a request (docs/simulate.md#the-request). `configured` are the policies a
    /// `{"policy": "<name>"}` entry may name.
    pub fn from_request(
        request: &Value,
        configured: &[Policy],
        bounds: &Bounds,
    ) -> Result<Self, SimError> {
        let map = object(
            request,
            "body",
            "{\"policies\": [...], \"traffic\": {...}, \"bucket\": \"1s\", \"top\": 10}",
        )?;
        only(map, "body", &["policies", "traffic", "bucket", "top"])?;
        let policies = parse_policies(map.get("policies"), configured, bounds)?;
        let traffic_value = map
            .get("traffic")
            .ok_or_else(|| bad("traffic", "is missing: a pattern or a log"))?;
        let (traffic, seed) = parse_traffic(traffic_value, policies.len() as u64, bounds)?;
        let bucket_ms = match duration(map, "bucket", "bucket")? {
            Some(b) => b,
            None => default_bucket(traffic.duration_ms, bounds.max_buckets),
        };
        let buckets = traffic.duration_ms.div_ceil(bucket_ms);
        if buckets > bounds.max_buckets {
            return Err(bad(
                "bucket",
                format!(
                    "{bucket_ms} ms buckets make {buckets} buckets over {} ms, more than the \
                     maximum of {} (max_buckets); choose a wider bucket",
                    traffic.duration_ms, bounds.max_buckets
                ),
            ));
        }
        let top = match whole(map, "top", "top")? {
            None => 10,
            Some(n) if n as usize <= bounds.max_top => n as usize,
            Some(n) => {
                return Err(bad(
                    "top",
                    format!("at most {} keys per policy, got {n}", bounds.max_top),
                ));
            }
        };
        Ok(Self {
            policies,
            traffic,
            seed,
            bucket_ms,
            top,
        })
    }

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
            admitted: 0,
            denied: 0,
            admitted_cost: 0,
            never_fits: 0,
            first_denial_ms: None,
            retries: Vec::new(),
        };
        for e in &traffic.events {
            clock.set(traffic.start_ms + e.t_ms);
            let key = &traffic.keys[e.key as usize];
            let d = match now_or_never(limiter.check_policy(policy, key, e.cost)) {
                Some(Ok(d)) => d,
                Some(Err(err)) => return Err(bad("traffic", format!("key `{key}`: {err}"))),
                None => return Err(bad("simulation", "the memory store did not answer at once")),
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

/// The smallest usual width giving at most 600 buckets (and within `max_buckets`).
fn default_bucket(duration_ms: u64, max_buckets: u64) -> u64 {
    const WIDTHS: [u64; 6] = [1_000, 10_000, 60_000, 600_000, 3_600_000, 86_400_000];
    WIDTHS
        .into_iter()
        .find(|w| duration_ms.div_ceil(*w) <= 600.min(max_buckets))
        .unwrap_or_else(|| duration_ms.div_ceil(max_buckets.max(1)).max(1))
}

/// Polls a future once: the memory store's answers are ready at once.
fn now_or_never<F: Future>(future: F) -> Option<F::Output> {
    let mut future = pin!(future);
    match future
        .as_mut()
        .poll(&mut Context::from_waker(Waker::noop()))
    {
        Poll::Ready(v) => Some(v),
        Poll::Pending => None,
    }
}

/// The example a wrong `policies` is answered with.
const POLICIES_SHAPE: &str = concat!(
    "[{\"name\": \"current\", \"policy\": \"api\"}, ",
    "{\"name\": \"candidate\", \"limits\": [{\"max\": 100, \"per\": \"1m\"}]}]",
);

fn parse_policies(
    value: Option<&Value>,
    configured: &[Policy],
    bounds: &Bounds,
) -> Result<Vec<Policy>, SimError> {
    let shape = POLICIES_SHAPE;
    let Some(Value::Array(items)) = value else {
        return Err(bad(
            "policies",
            format!("must be a list of one or more policies: {shape}"),
        ));
    };
    if items.is_empty() {
        return Err(bad(
            "policies",
            format!("is empty; give at least one: {shape}"),
        ));
    }
    if items.len() > bounds.max_policies {
        return Err(bad(
            "policies",
            format!(
                "at most {} policies per simulation (max_policies), got {}",
                bounds.max_policies,
                items.len()
            ),
        ));
    }
    let mut out: Vec<Policy> = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let path = format!("policies[{i}]");
        let policy = parse_policy(item, &path, configured)?;
        if out.iter().any(|p| p.name() == policy.name()) {
            return Err(bad(
                format!("{path}.name"),
                format!(
                    "`{}` is given twice; each policy needs its own name",
                    policy.name()
                ),
            ));
        }
        out.push(policy);
    }
    Ok(out)
}

/// One `policies[i]` entry: a configured policy by name, or an inline one; never one with a
/// concurrency limit.
fn parse_policy(item: &Value, path: &str, configured: &[Policy]) -> Result<Policy, SimError> {
    let map = object(item, path, POLICIES_SHAPE)?;
    let name = string(map, "name", &format!("{path}.name"))?;
    let policy = match string(map, "policy", &format!("{path}.policy"))? {
        Some(configured_name) => {
            only(map, path, &["name", "policy"])?;
            configured_policy(path, name, configured_name, configured)?
        }
        None => {
            let Some(name) = name else {
                return Err(bad(
                    format!("{path}.name"),
                    "is missing: an inline policy needs a name",
                ));
            };
            let mut definition = map.clone();
            definition.remove("name");
            crate::policy_entry::inline_policy(name, &Value::Object(definition))
                .map_err(|e| bad(path.to_owned(), e))?
        }
    };
    if let Some((i, _)) = policy.concurrency_limit() {
        return Err(bad(
            format!("{path}.limits[{i}]"),
            "a concurrency limit cannot be simulated: the traffic has no request durations, \
             so nothing would ever be held",
        ));
    }
    Ok(policy)
}

/// The configured policy `configured_name`, under `name` if one is given.
fn configured_policy(
    path: &str,
    name: Option<&str>,
    configured_name: &str,
    configured: &[Policy],
) -> Result<Policy, SimError> {
    let Some(found) = configured.iter().find(|p| p.name() == configured_name) else {
        let mut names: Vec<&str> = configured.iter().map(Policy::name).collect();
        names.sort_unstable();
        return Err(bad(
            format!("{path}.policy"),
            format!(
                "no policy named `{configured_name}` is configured; configured: {}",
                if names.is_empty() {
                    "none".to_owned()
                } else {
                    names.join(", ")
                }
            ),
        ));
    };
    let name = name.unwrap_or(configured_name);
    Ok(Policy::new(name, found.limits().to_vec())
        .map_err(|e| bad(format!("{path}.name"), e.reason))?
        .with_failure_mode(found.failure_mode()))
}

/// A log `traffic`: its text, format and key and time options (docs/simulate.md#the-request).
fn parse_log(
    map: &Map<String, Value>,
    policies: u64,
    bounds: &Bounds,
) -> Result<Traffic, SimError> {
    only(
        map,
        "traffic",
        &[
            "log",
            "format",
            "key",
            "key_field",
            "time_field",
            "time_unit",
        ],
    )?;
    let text = string(map, "log", "traffic.log")?.unwrap_or("");
    let format = match string(map, "format", "traffic.format")? {
        Some(f) => LogFormat::parse(f).map_err(|e| bad("traffic.format", e))?,
        None => None,
    };
    let (key, key_path) = match (
        string(map, "key", "traffic.key")?,
        string(map, "key_field", "traffic.key_field")?,
    ) {
        (Some(_), Some(_)) => {
            return Err(bad(
                "traffic.key_field",
                "give `key` (one field or several: method,path,client) or its older \
                 name `key_field`, not both",
            ));
        }
        (Some(k), None) => (Some(k), "traffic.key"),
        (None, Some(k)) => (Some(k), "traffic.log.key_field"),
        (None, None) => (None, "traffic.key"),
    };
    let options = LogOptions {
        format,
        key: key.map(str::to_owned),
        key_path: key_path.to_owned(),
        time_field: string(map, "time_field", "traffic.time_field")?.map(str::to_owned),
        time_unit: match string(map, "time_unit", "traffic.time_unit")? {
            Some(u) => Some(TimeUnit::parse(u).map_err(|e| bad("traffic.time_unit", e))?),
            None => None,
        },
    };
    let traffic = logs::read(text, &options, bounds)?;
    let key_text: u64 = traffic.keys.iter().map(|k| k.len() as u64).sum();
    let events = traffic.events.len() as u64;
    let keys = traffic.keys.len() as u64;
    check_memory(
        "traffic.log",
        memory_estimate(events, keys, key_text, policies, bounds.max_buckets),
        format!(
            "{} over {}",
            render::count(events, "event", "events"),
            render::count(keys, "key", "keys")
        ),
        bounds,
    )?;
    Ok(traffic)
}

/// The example a `traffic` that is not an object is answered with.
const TRAFFIC_SHAPE: &str = concat!(
    "{\"pattern\": \"steady\", \"rate\": 10, \"duration\": \"1m\"} or ",
    "{\"format\": \"csv\", \"log\": \"…\"}",
);

fn parse_traffic(
    value: &Value,
    policies: u64,
    bounds: &Bounds,
) -> Result<(Traffic, Option<u64>), SimError> {
    let map = object(value, "traffic", TRAFFIC_SHAPE)?;
    if map.contains_key("log") {
        return Ok((parse_log(map, policies, bounds)?, None));
    }
    let pattern_name = string(map, "pattern", "traffic.pattern")?.ok_or_else(|| {
        bad(
            "traffic",
            "needs a `pattern` (steady, bursts, poisson, ramp) or a `log`",
        )
    })?;
    let common = [
        "pattern",
        "duration",
        "keys",
        "key_choice",
        "zipf_exponent",
        "seed",
        "cost",
    ];
    let (pattern, extra) = parse_pattern(map, pattern_name)?;
    let allowed: Vec<&str> = common.iter().chain(extra).copied().collect();
    only(map, "traffic", &allowed)?;
    let duration_ms = duration(map, "duration", "traffic.duration")?
        .ok_or_else(|| bad("traffic.duration", "is missing, e.g. 1m"))?;
    if duration_ms > bounds.max_duration_ms {
        return Err(bad(
            "traffic.duration",
            format!(
                "{duration_ms} ms is more than the maximum of {} ms (max_duration)",
                bounds.max_duration_ms
            ),
        ));
    }
    let keys = whole(map, "keys", "traffic.keys")?.unwrap_or(1);
    if keys == 0 || keys > bounds.max_keys as u64 {
        return Err(bad(
            "traffic.keys",
            format!(
                "must be from 1 to {} (max_keys), got {keys}",
                bounds.max_keys
            ),
        ));
    }
    let choice = parse_key_choice(map)?;
    let seed = whole(map, "seed", "traffic.seed")?.unwrap_or(0);
    let cost = whole(map, "cost", "traffic.cost")?.unwrap_or(1);
    if sluice::check_cost(cost).is_err() {
        return Err(bad("traffic.cost", "at most 2^53 (9007199254740992)"));
    }
    let generated = Generated {
        pattern,
        duration_ms,
        keys: u32::try_from(keys).unwrap_or(u32::MAX),
        choice,
        cost,
        seed,
    };
    check_generated_memory(&generated, keys, policies, bounds)?;
    Ok((generated.generate(bounds)?, Some(seed)))
}

/// A generated traffic's pattern and the fields only it takes.
fn parse_pattern(
    map: &Map<String, Value>,
    pattern_name: &str,
) -> Result<(Pattern, &'static [&'static str]), SimError> {
    let need = |v: Option<f64>, field: &str| {
        v.ok_or_else(|| {
            bad(
                format!("traffic.{field}"),
                format!("is missing for pattern {pattern_name}"),
            )
        })
    };
    Ok(match pattern_name {
        "steady" => (
            Pattern::Steady {
                rate: need(rate(map, "rate", "traffic.rate", false)?, "rate")?,
            },
            &["rate"],
        ),
        "poisson" => (
            Pattern::Poisson {
                rate: need(rate(map, "rate", "traffic.rate", false)?, "rate")?,
            },
            &["rate"],
        ),
        "bursts" => {
            let size = whole(map, "size", "traffic.size")?
                .filter(|s| *s > 0)
                .ok_or_else(|| bad("traffic.size", "must be a whole number of requests ≥ 1"))?;
            let every_ms = duration(map, "every", "traffic.every")?.ok_or_else(|| {
                bad(
                    "traffic.every",
                    "is missing: the interval between bursts, e.g. 10s",
                )
            })?;
            (Pattern::Bursts { size, every_ms }, &["size", "every"])
        }
        "ramp" => {
            let from = need(rate(map, "from", "traffic.from", true)?, "from")?;
            let to = need(rate(map, "to", "traffic.to", true)?, "to")?;
            if from == 0.0 && to == 0.0 {
                return Err(bad("traffic.to", "a ramp from 0 to 0 makes no request"));
            }
            (Pattern::Ramp { from, to }, &["from", "to"])
        }
        other => {
            return Err(bad(
                "traffic.pattern",
                format!("`{other}` is not a pattern; expected steady, bursts, poisson or ramp"),
            ));
        }
    })
}

/// `key_choice` (uniform or zipf) and zipf's `zipf_exponent`.
fn parse_key_choice(map: &Map<String, Value>) -> Result<KeyChoice, SimError> {
    Ok(
        match string(map, "key_choice", "traffic.key_choice")?.unwrap_or("uniform") {
            "uniform" => {
                if map.contains_key("zipf_exponent") {
                    return Err(bad("traffic.zipf_exponent", "only for key_choice zipf"));
                }
                KeyChoice::Uniform
            }
            "zipf" => KeyChoice::Zipf {
                exponent: match map.get("zipf_exponent") {
                    None | Some(Value::Null) => 1.0,
                    Some(Value::Number(n)) => match n.as_f64() {
                        Some(s) if s.is_finite() && s > 0.0 => s,
                        _ => {
                            return Err(bad(
                                "traffic.zipf_exponent",
                                format!("must be a positive number, got {n}"),
                            ));
                        }
                    },
                    Some(_) => {
                        return Err(bad("traffic.zipf_exponent", "must be a positive number"));
                    }
                },
            },
            other => {
                return Err(bad(
                    "traffic.key_choice",
                    format!("`{other}` is not a key choice; expected uniform or zipf"),
                ));
            }
        },
    )
}

/// Refuses a generated traffic whose estimated memory is over the bound, before making it
/// (over max_events, `generate` refuses it by that name): the keys are `key-1` … `key-N`.
fn check_generated_memory(
    generated: &Generated,
    keys: u64,
    policies: u64,
    bounds: &Bounds,
) -> Result<(), SimError> {
    let events = generated.expected_events().ceil() as u64;
    if events <= bounds.max_events as u64 {
        let key_text = keys * (4 + keys.to_string().len() as u64);
        check_memory(
            "traffic",
            memory_estimate(events, keys, key_text, policies, bounds.max_buckets),
            format!(
                "this pattern's {} over {}",
                render::count(events, "event", "events"),
                render::count(keys, "key", "keys")
            ),
            bounds,
        )?;
    }
    Ok(())
}

/// One `--policy` of the `sluice simulate` command as a request entry: `api` (a configured
/// policy), `current=api` (the same under another name), or `candidate={limits: [{max: 100,
/// per: 1m}]}` (an inline policy, in YAML flow or JSON, the shape of a `policies.<name>`
/// entry).
pub fn policy_flag(spec: &str) -> Result<Value, SimError> {
    let field = format!("--policy {spec}");
    let (name, rest) = match spec.split_once('=') {
        Some((name, rest)) if !name.contains('{') => (Some(name.trim()), rest.trim()),
        _ => (None, spec.trim()),
    };
    if rest.starts_with('{') {
        let Some(name) = name else {
            return Err(bad(
                field,
                "an inline policy needs a name: candidate={limits: [{max: 100, per: 1m}]}",
            ));
        };
        use crate::unique::Outcome;
        let mut definition =
            match crate::unique::read(serde_yaml_ng::Deserializer::from_str(rest), None) {
                Outcome::Value(v) => v,
                Outcome::Duplicate { duplicate, .. } => {
                    return Err(bad(
                        field,
                        format!("`{}` is given twice", duplicate.full_path()),
                    ));
                }
                Outcome::Probed(e) | Outcome::Other(e) => {
                    return Err(bad(field, format!("not a policy definition: {e}")));
                }
            };
        let Value::Object(map) = &mut definition else {
            return Err(bad(
                field,
                "an inline policy must be a mapping: {limits: [...]}",
            ));
        };
        map.insert("name".to_owned(), Value::String(name.to_owned()));
        return Ok(definition);
    }
    if rest.is_empty() {
        return Err(bad(field, "names no policy"));
    }
    let mut entry = Map::new();
    if let Some(name) = name {
        entry.insert("name".to_owned(), Value::String(name.to_owned()));
    }
    entry.insert("policy".to_owned(), Value::String(rest.to_owned()));
    Ok(Value::Object(entry))
}
