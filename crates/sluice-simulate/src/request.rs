//! The request of a simulation (the `POST /v1/simulate` body, or what `sluice simulate` builds
//! from its flags), parsed once for both: every field checked, every bound applied before any
//! work, each refusal naming the field (docs/simulate.md#the-request).

use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};
use sluice::Policy;

use super::{
    Bounds, Generated, KeyChoice, LogFormat, LogOptions, Pattern, SimError, Simulation, TimeUnit,
    Traffic, logs, memory_estimate, render,
};
use sluice_spec::policy_entry::from_value;
use sluice_spec::units::PositiveDuration;

/// The body, as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Body {
    policies: Option<Vec<Value>>,
    traffic: Option<Value>,
    bucket: Option<PositiveDuration>,
    top: Option<u64>,
}

/// A generated `traffic`, as written (which of the pattern fields a pattern takes is checked
/// apart, by [`only`]).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTraffic {
    pattern: Option<PatternName>,
    duration: Option<PositiveDuration>,
    keys: Option<u64>,
    key_choice: Option<KeyChoiceName>,
    zipf_exponent: Option<f64>,
    seed: Option<u64>,
    cost: Option<u64>,
    rate: Option<f64>,
    size: Option<u64>,
    every: Option<PositiveDuration>,
    from: Option<f64>,
    to: Option<f64>,
}

/// A log `traffic`, as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLog {
    log: String,
    format: Option<String>,
    key: Option<String>,
    key_field: Option<String>,
    time_field: Option<String>,
    time_unit: Option<String>,
}

#[derive(Deserialize, Clone, Copy)]
#[serde(rename_all = "lowercase")]
enum PatternName {
    Steady,
    Bursts,
    Poisson,
    Ramp,
}

#[derive(Deserialize, Clone, Copy, Default)]
#[serde(rename_all = "lowercase")]
enum KeyChoiceName {
    #[default]
    Uniform,
    Zipf,
}

/// One `policies[i]` entry: a configured `policy` (under `name`), or an inline definition.
#[derive(Deserialize)]
struct Entry {
    name: Option<String>,
    policy: Option<String>,
    #[serde(flatten)]
    definition: Map<String, Value>,
}

impl Simulation {
    /// Parses a request (docs/simulate.md#the-request). `configured` are the policies a
    /// `{"policy": "<name>"}` entry may name.
    pub fn from_request(
        request: &Value,
        configured: &[Policy],
        bounds: &Bounds,
    ) -> Result<Self, SimError> {
        if !request.is_object() {
            return Err(bad(
                "body",
                "must be an object: {\"policies\": [...], \"traffic\": {...}, \"bucket\": \"1s\", \
                 \"top\": 10}",
            ));
        }
        let body: Body = read(request, "")?;
        let policies = parse_policies(body.policies, configured, bounds)?;
        let traffic_value = body
            .traffic
            .ok_or_else(|| bad("traffic", "is missing: a pattern or a log"))?;
        let (traffic, seed) = parse_traffic(&traffic_value, policies.len() as u64, bounds)?;
        let bucket_ms = match body.bucket {
            Some(b) => b.millis(),
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
        let top = body.top.unwrap_or(10);
        if top as usize > bounds.max_top {
            return Err(bad(
                "top",
                format!("at most {} keys per policy, got {top}", bounds.max_top),
            ));
        }
        Ok(Self {
            policies,
            traffic,
            seed,
            bucket_ms,
            top: top as usize,
        })
    }
}

fn bad(field: impl Into<String>, message: impl Into<String>) -> SimError {
    SimError::new(field, message)
}

/// Deserializes `value`, found at `at`; an error names the field at fault (`traffic.rate`),
/// or `body` for the body itself.
fn read<T: DeserializeOwned>(value: &Value, at: &str) -> Result<T, SimError> {
    from_value(value).map_err(|e| match (at, e.path.is_empty()) {
        ("", true) => bad("body", e.message),
        _ => e.within(at),
    })
}

/// Refuses a field of `map` (at `field`) that is not one of `allowed`.
fn only(map: &Map<String, Value>, field: &str, allowed: &[&str]) -> Result<(), SimError> {
    match map.keys().find(|name| !allowed.contains(&name.as_str())) {
        Some(name) => Err(bad(
            field,
            format!(
                "unknown field `{name}`; the fields are {}",
                allowed.join(", ")
            ),
        )),
        None => Ok(()),
    }
}

/// A rate (requests per second) that must be positive, or may be 0 when `zero_ok`.
fn rate(value: Option<f64>, path: &str, zero_ok: bool) -> Result<Option<f64>, SimError> {
    match value {
        Some(r) if !(r.is_finite() && (r > 0.0 || (zero_ok && r == 0.0))) => Err(bad(
            path,
            format!("must be a positive number of requests per second, got {r}"),
        )),
        r => Ok(r),
    }
}

/// Refuses a simulation whose [`memory_estimate`] for `(events, keys, key_text)` is over
/// `bounds.max_memory`, naming it; `what` begins the message, before the counts.
fn check_memory(
    field: &str,
    what: &str,
    (events, keys, key_text): (u64, u64, u64),
    policies: u64,
    bounds: &Bounds,
) -> Result<(), SimError> {
    let estimate = memory_estimate(events, keys, key_text, policies, bounds.max_buckets);
    if estimate <= bounds.max_memory {
        return Ok(());
    }
    Err(bad(
        field,
        format!(
            "{what}{} over {} would hold about {} MiB, more than the {} MiB one simulation may \
             use (max_memory); lower the rate, the duration or the keys, or simulate a part of \
             the log",
            render::count(events, "event", "events"),
            render::count(keys, "key", "keys"),
            estimate.div_ceil(1 << 20),
            bounds.max_memory >> 20
        ),
    ))
}

/// The smallest usual width giving at most 600 buckets (and within `max_buckets`).
fn default_bucket(duration_ms: u64, max_buckets: u64) -> u64 {
    const WIDTHS: [u64; 6] = [1_000, 10_000, 60_000, 600_000, 3_600_000, 86_400_000];
    WIDTHS
        .into_iter()
        .find(|w| duration_ms.div_ceil(*w) <= 600.min(max_buckets))
        .unwrap_or_else(|| duration_ms.div_ceil(max_buckets.max(1)).max(1))
}

/// The example a wrong `policies` is answered with.
const POLICIES_SHAPE: &str = concat!(
    "[{\"name\": \"current\", \"policy\": \"api\"}, ",
    "{\"name\": \"candidate\", \"limits\": [{\"max\": 100, \"per\": \"1m\"}]}]",
);

fn parse_policies(
    items: Option<Vec<Value>>,
    configured: &[Policy],
    bounds: &Bounds,
) -> Result<Vec<Policy>, SimError> {
    let shape = POLICIES_SHAPE;
    let Some(items) = items else {
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
    if !item.is_object() {
        return Err(bad(path, format!("must be an object: {POLICIES_SHAPE}")));
    }
    let entry: Entry = read(item, path)?;
    let policy = match (entry.policy, entry.name) {
        (Some(configured_name), name) => {
            if let Some(field) = entry.definition.keys().next() {
                return Err(bad(
                    path,
                    format!("unknown field `{field}`; the fields are name, policy"),
                ));
            }
            configured_policy(path, name.as_deref(), &configured_name, configured)?
        }
        (None, None) => {
            return Err(bad(
                format!("{path}.name"),
                "is missing: an inline policy needs a name",
            ));
        }
        (None, Some(name)) => {
            sluice_spec::policy_entry::inline_policy(&name, &Value::Object(entry.definition))
                .map_err(|e| bad(path.to_owned(), e.to_string()))?
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
fn parse_log(raw: RawLog, policies: u64, bounds: &Bounds) -> Result<Traffic, SimError> {
    let format = match raw.format {
        Some(f) => LogFormat::parse(&f).map_err(|e| bad("traffic.format", e.to_string()))?,
        None => None,
    };
    let (key, key_path) = match (raw.key, raw.key_field) {
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
    let time_unit = raw
        .time_unit
        .map(|u| TimeUnit::parse(&u).map_err(|e| bad("traffic.time_unit", e.to_string())))
        .transpose()?;
    let options = LogOptions {
        format,
        key,
        key_path: key_path.to_owned(),
        time_field: raw.time_field,
        time_unit,
    };
    let traffic = logs::read(&raw.log, &options, bounds)?;
    let key_text: u64 = traffic.keys.iter().map(|k| k.len() as u64).sum();
    let events = traffic.events.len() as u64;
    let keys = traffic.keys.len() as u64;
    check_memory(
        "traffic.log",
        "",
        (events, keys, key_text),
        policies,
        bounds,
    )?;
    Ok(traffic)
}

/// The example a `traffic` that is not an object is answered with.
const TRAFFIC_SHAPE: &str = concat!(
    "{\"pattern\": \"steady\", \"rate\": 10, \"duration\": \"1m\"} or ",
    "{\"format\": \"csv\", \"log\": \"…\"}",
);

/// The fields every generated traffic may give, besides its pattern's own.
const PATTERN_FIELDS: &[&str] = &[
    "pattern",
    "duration",
    "keys",
    "key_choice",
    "zipf_exponent",
    "seed",
    "cost",
];

fn parse_traffic(
    value: &Value,
    policies: u64,
    bounds: &Bounds,
) -> Result<(Traffic, Option<u64>), SimError> {
    let Some(map) = value.as_object() else {
        return Err(bad(
            "traffic",
            format!("must be an object: {TRAFFIC_SHAPE}"),
        ));
    };
    if map.contains_key("log") {
        return Ok((parse_log(read(value, "traffic")?, policies, bounds)?, None));
    }
    let raw: RawTraffic = read(value, "traffic")?;
    let Some(name) = raw.pattern else {
        return Err(bad(
            "traffic",
            "needs a `pattern` (steady, bursts, poisson, ramp) or a `log`",
        ));
    };
    let extra: &[&str] = match name {
        PatternName::Steady | PatternName::Poisson => &["rate"],
        PatternName::Bursts => &["size", "every"],
        PatternName::Ramp => &["from", "to"],
    };
    let allowed: Vec<&str> = PATTERN_FIELDS.iter().chain(extra).copied().collect();
    only(map, "traffic", &allowed)?;
    let pattern = parse_pattern(
        &raw,
        name,
        map.get("pattern")
            .and_then(Value::as_str)
            .unwrap_or_default(),
    )?;
    let duration_ms = raw
        .duration
        .ok_or_else(|| bad("traffic.duration", "is missing, e.g. 1m"))?
        .millis();
    if duration_ms > bounds.max_duration_ms {
        return Err(bad(
            "traffic.duration",
            format!(
                "{duration_ms} ms is more than the maximum of {} ms (max_duration)",
                bounds.max_duration_ms
            ),
        ));
    }
    let keys = raw.keys.unwrap_or(1);
    if keys == 0 || keys > bounds.max_keys as u64 {
        return Err(bad(
            "traffic.keys",
            format!(
                "must be from 1 to {} (max_keys), got {keys}",
                bounds.max_keys
            ),
        ));
    }
    let choice = key_choice(&raw)?;
    let seed = raw.seed.unwrap_or(0);
    let cost = raw.cost.unwrap_or(1);
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

/// `key_choice` (uniform or zipf) and zipf's `zipf_exponent`.
fn key_choice(raw: &RawTraffic) -> Result<KeyChoice, SimError> {
    Ok(
        match (raw.key_choice.unwrap_or_default(), raw.zipf_exponent) {
            (KeyChoiceName::Uniform, None) => KeyChoice::Uniform,
            (KeyChoiceName::Uniform, Some(_)) => {
                return Err(bad("traffic.zipf_exponent", "only for key_choice zipf"));
            }
            (KeyChoiceName::Zipf, s) if s.is_none_or(|s| s.is_finite() && s > 0.0) => {
                KeyChoice::Zipf {
                    exponent: s.unwrap_or(1.0),
                }
            }
            (KeyChoiceName::Zipf, s) => {
                return Err(bad(
                    "traffic.zipf_exponent",
                    format!("must be a positive number, got {}", s.unwrap_or_default()),
                ));
            }
        },
    )
}

/// A generated traffic's pattern, from the fields only it takes.
fn parse_pattern(raw: &RawTraffic, name: PatternName, named: &str) -> Result<Pattern, SimError> {
    let need = |v: Option<f64>, field: &str| {
        v.ok_or_else(|| {
            bad(
                format!("traffic.{field}"),
                format!("is missing for pattern {named}"),
            )
        })
    };
    Ok(match name {
        PatternName::Steady => Pattern::Steady {
            rate: need(rate(raw.rate, "traffic.rate", false)?, "rate")?,
        },
        PatternName::Poisson => Pattern::Poisson {
            rate: need(rate(raw.rate, "traffic.rate", false)?, "rate")?,
        },
        PatternName::Bursts => Pattern::Bursts {
            size: raw
                .size
                .filter(|s| *s > 0)
                .ok_or_else(|| bad("traffic.size", "must be a whole number of requests ≥ 1"))?,
            every_ms: raw
                .every
                .ok_or_else(|| {
                    bad(
                        "traffic.every",
                        "is missing: the interval between bursts, e.g. 10s",
                    )
                })?
                .millis(),
        },
        PatternName::Ramp => {
            let from = need(rate(raw.from, "traffic.from", true)?, "from")?;
            let to = need(rate(raw.to, "traffic.to", true)?, "to")?;
            if from == 0.0 && to == 0.0 {
                return Err(bad("traffic.to", "a ramp from 0 to 0 makes no request"));
            }
            Pattern::Ramp { from, to }
        }
    })
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
        let traffic = (events, keys, key_text);
        check_memory("traffic", "this pattern's ", traffic, policies, bounds)?;
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
        use sluice_spec::unique::Parsed;
        let mut definition =
            match sluice_spec::unique::read(serde_yaml_ng::Deserializer::from_str(rest), None) {
                Parsed::Value(v) => v,
                Parsed::Duplicate { duplicate, .. } => {
                    return Err(bad(
                        field,
                        format!("`{}` is given twice", duplicate.full_path()),
                    ));
                }
                Parsed::Probed(e) | Parsed::Other(e) => {
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
