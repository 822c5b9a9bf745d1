//! The request of a simulation (the `POST /v1/simulate` body, or what `sluice simulate` builds
//! from its flags), parsed once for both: every field checked, every bound applied before any
//! work, each refusal naming the field (docs/simulate.md#the-request).

use serde_json::{Map, Value};
use sluice::Policy;

use super::{
    Bounds, Generated, KeyChoice, LogFormat, LogOptions, Pattern, SimError, Simulation, TimeUnit,
    Traffic, logs, memory_estimate, render,
};
use sluice_spec::units::PositiveDuration;

/// Parses a request (docs/simulate.md#the-request). `configured` are the policies a
/// `{"policy": "<name>"}` entry may name.
pub(super) fn parse(
    request: &Value,
    configured: &[Policy],
    bounds: &Bounds,
) -> Result<Simulation, SimError> {
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
    Ok(Simulation {
        policies,
        traffic,
        seed,
        bucket_ms,
        top,
    })
}

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
            .map_err(|e| bad(path, e.to_string())),
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
            sluice_spec::policy_entry::inline_policy(name, &Value::Object(definition))
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
        Some(f) => LogFormat::parse(f).map_err(|e| bad("traffic.format", e.to_string()))?,
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
            Some(u) => {
                Some(TimeUnit::parse(u).map_err(|e| bad("traffic.time_unit", e.to_string()))?)
            }
            None => None,
        },
    };
    let traffic = logs::read(text, &options, bounds)?;
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
