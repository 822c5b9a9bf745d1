//! The admin routes beside the decisions: forgetting a key, the policy list, the top keys, the
//! stats the dashboard polls, the simulator and the metrics.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use sluice::{Error as LimitError, Policy};
use sluice_spec::policy_entry::FieldError;

use super::decision::{configured_names, unknown_policy};
use super::error::ApiError;
use crate::reply::json_response;
use crate::state::Shared;

// ----- the rest -----------------------------------------------------------------------------

pub(super) async fn forget(
    State(shared): State<Arc<Shared>>,
    path: Result<Path<(String, String)>, PathRejection>,
) -> Result<Response, ApiError> {
    // A percent-escape that is not UTF-8 (`%ff`): JSON like every other error, not axum's text.
    let Path((policy, key)) = path.map_err(|rejection| {
        ApiError::invalid(format!(
            "the path could not be read: {}",
            rejection.body_text()
        ))
    })?;
    let snapshot = shared.snapshot();
    let Some(configured) = snapshot.limiter.policy(&policy) else {
        return Err(unknown_policy(&policy, &snapshot));
    };
    match snapshot.limiter.forget(configured, &key).await {
        // No body, so no content type.
        Ok(()) => Ok(StatusCode::NO_CONTENT.into_response()),
        Err(LimitError::Store(e)) => Err(ApiError::StoreUnavailable(format!(
            "the store cannot answer: {e}"
        ))),
        Err(e) => Err(ApiError::invalid(e.to_string())),
    }
}

pub(super) async fn policies(State(shared): State<Arc<Shared>>) -> Response {
    let snapshot = shared.snapshot();
    let mut list: Vec<&Policy> = snapshot.limiter.policies().collect();
    list.sort_by(|a, b| a.name().cmp(b.name()));
    let policies: Vec<Value> = list
        .into_iter()
        .map(|p| {
            let limits: Vec<Value> = p
                .limits()
                .iter()
                .map(|l| {
                    let mut v = json!({
                        "max": l.max(),
                        "per_ms": l.per_ms(),
                        "algorithm": l.algorithm().as_str(),
                    });
                    match l.algorithm() {
                        sluice::Algorithm::SlidingWindow => {
                            v["precision_ms"] = json!(l.precision_ms())
                        }
                        sluice::Algorithm::TokenBucket => v["burst"] = json!(l.burst()),
                        sluice::Algorithm::FixedWindow => v["align"] = json!(l.align()),
                        _ => {}
                    }
                    v
                })
                .collect();
            json!({"name": p.name(), "on_store_error": p.failure_mode().as_str(), "limits": limits})
        })
        .collect();
    json_response(
        StatusCode::OK,
        &json!({
            "policies": policies,
            "config": {"generation": snapshot.number, "last_reload_error": shared.last_reload_error()},
        }),
    )
}

/// The most `limit` keys `GET /v1/top` answers.
pub const MAX_TOP_LIMIT: usize = 100;

/// `GET /v1/top?policy=…&by=denied|used&limit=…`: a policy's (or an Envoy rule's) heaviest
/// keys over the recent window, with what each has left now for configured policies.
pub(super) async fn top(
    State(shared): State<Arc<Shared>>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let (policy, by, limit) = top_query(query.as_deref())?;
    let snapshot = shared.snapshot();
    let configured = snapshot.limiter.policy(&policy);
    if configured.is_none()
        && !shared.observe().top.tracks(&policy)
        && !shared.observe().rules.tracks(&policy)
    {
        return Err(ApiError::UnknownTopPolicy {
            configured: configured_names(&snapshot),
            name: policy,
        });
    }
    let now = sluice::Clock::now_ms(shared.clock());
    let reading = shared.observe().top.read(&policy, by, limit, now);
    let mut keys = Vec::with_capacity(reading.keys.len());
    for c in &reading.keys {
        let mut entry = json!({"key": &*c.key, "count": c.count, "error": c.error});
        if configured.is_none()
            && let Some(entries) = shared.observe().rules.entries_of(&policy, &c.key)
        {
            entry["entries"] = json!(entries);
        }
        if let Some(p) = configured {
            // What the key has left now (a peek of 0 records nothing); null if the store
            // cannot say.
            entry["remaining"] = match snapshot
                .limiter
                .call(p, &c.key, sluice::Op::Peek { cost: 0 })
                .await
            {
                Ok(d) if d.degraded.is_none() => json!(d.remaining()),
                _ => Value::Null,
            };
        }
        keys.push(entry);
    }
    Ok(json_response(
        StatusCode::OK,
        &json!({
            "policy": policy,
            "by": match by {
                crate::observe::top::Measure::Used => "used",
                crate::observe::top::Measure::Denied => "denied",
            },
            "since_ms": reading.from_ms,
            "total": reading.total,
            "capacity": shared.observe().top.capacity(),
            "keys": keys,
        }),
    ))
}

/// `/v1/top`'s query: the policy (required), the measure and the number of keys; or why it
/// is refused (a `400`).
fn top_query(
    query: Option<&str>,
) -> Result<(String, crate::observe::top::Measure, usize), FieldError> {
    let (mut policy, mut by, mut limit) = (None, crate::observe::top::Measure::Denied, 10usize);
    for (name, value) in query_pairs(query, &["policy", "by", "limit"])? {
        match name.as_str() {
            "policy" => policy = Some(value),
            // Measure's own words name the parameter: `` `by` must be `used` or `denied` ``.
            "by" => by = value.parse().map_err(FieldError::whole)?,
            _ => limit = bounded("limit", &value, (1, MAX_TOP_LIMIT))?,
        }
    }
    let Some(policy) = policy else {
        return Err(FieldError::new(
            "policy",
            "is required: a configured policy, or an Envoy rule's statistics key (e.g. \
             `edge.remote_address`)",
        ));
    };
    Ok((policy, by, limit))
}

/// The pairs of a query string whose names are all in `known`, or why it is refused.
fn query_pairs(query: Option<&str>, known: &[&str]) -> Result<Vec<(String, String)>, FieldError> {
    let pairs: Vec<(String, String)> = serde_urlencoded::from_str(query.unwrap_or(""))
        .map_err(|e| FieldError::whole(format!("the query string is not form-encoded: {e}")))?;
    match pairs
        .iter()
        .find(|(name, _)| !known.contains(&name.as_str()))
    {
        Some((name, _)) => Err(FieldError::whole(format!(
            "unknown query parameter `{name}`; expected {}",
            known.join(", ")
        ))),
        None => Ok(pairs),
    }
}

/// The whole number `value` of the query parameter `name`, from `min` to `max`.
fn bounded(name: &str, value: &str, (min, max): (usize, usize)) -> Result<usize, FieldError> {
    match value.parse::<usize>() {
        Ok(n) if (min..=max).contains(&n) => Ok(n),
        _ => Err(FieldError::new(
            name,
            format!("must be a whole number from {min} to {max}, got `{value}`"),
        )),
    }
}

/// The most detailed keys `GET /v1/stats` lists per Envoy rule.
pub(super) const MAX_STATS_KEYS: usize = 100;

/// One whole-number query parameter `name` from `min` to `max` (`default` when absent), or
/// why it is refused (a `400`): the only parameter the route takes.
fn number_query(
    query: Option<&str>,
    name: &str,
    (min, max, default): (usize, usize, usize),
) -> Result<usize, FieldError> {
    let pairs = query_pairs(query, &[name])?;
    pairs
        .iter()
        .try_fold(default, |_, (_, value)| bounded(name, value, (min, max)))
}

/// A latency reading as `/v1/stats` shows it: `count`, and `p50_ms`, `p99_ms` when there were
/// calls.
fn quantiles(q: sluice::latency::Quantiles) -> Value {
    let mut v = json!({"count": q.count});
    if let (Some(p50), Some(p99)) = (q.p50_ms, q.p99_ms) {
        v["p50_ms"] = json!(p50);
        v["p99_ms"] = json!(p99);
    }
    v
}

/// A shard as `/v1/stats` shows it: its name, a ping, its store calls over the last minute
/// (`p50_ms`, `p99_ms` when it answered any) and its replicas, each pinged.
async fn shard_stats(name: &str, store: &sluice_redis::RedisStore) -> Value {
    let started = std::time::Instant::now();
    let mut shard = match store.ping().await {
        Ok(()) => json!({"ok": true, "latency_ms": started.elapsed().as_secs_f64() * 1e3}),
        Err(e) => json!({"ok": false, "error": e.to_string()}),
    };
    shard["name"] = json!(name);
    let q = store.call_latency();
    if let (Some(p50), Some(p99)) = (q.p50_ms, q.p99_ms) {
        shard["p50_ms"] = json!(p50);
        shard["p99_ms"] = json!(p99);
    }
    let replicas: Vec<Value> = store
        .ping_replicas()
        .await
        .into_iter()
        .map(|(addr, result)| match result {
            Ok(took) => json!({"addr": addr, "ok": true, "latency_ms": took.as_secs_f64() * 1e3}),
            Err(e) => json!({"addr": addr, "ok": false, "error": e.to_string()}),
        })
        .collect();
    shard["replicas"] = json!(replicas);
    shard
}

/// `GET /v1/stats[?keys=N]` (docs/api.md, "Statistics"): checks per configured policy and
/// per Envoy rule (at most `N` detailed keys each), the store's shards (circuit, a ping's
/// latency), reservation and reload status: what the dashboard polls.
pub(super) async fn stats(
    State(shared): State<Arc<Shared>>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let keys = number_query(query.as_deref(), "keys", (0, MAX_STATS_KEYS, 10))?;
    let now = sluice::Clock::now_ms(shared.clock());
    let snapshot = shared.snapshot();
    let mut counted = shared.observe().counts.read();
    let policies: std::collections::BTreeMap<String, crate::observe::stats::Counts> = snapshot
        .limiter
        .policies()
        .map(|p| {
            let c = counted.remove(p.name()).unwrap_or_default();
            (p.name().to_owned(), c)
        })
        .collect();
    let streams = shared.observe().streams.read();
    let buckets_total: u64 = streams.iter().map(|s| s.buckets).sum();
    let at = std::time::Instant::now();
    let [http, grpc] = shared
        .observe()
        .decision_latency
        .each_ref()
        .map(|w| quantiles(w.read(at)));
    let reservation = shared.reserving().map(|r| {
        let s = r.stats();
        json!({
            "local": s.local, "cached_denials": s.cached_denials, "fetches": s.fetches,
            "waited": s.waited, "direct": s.direct, "refunds": s.refunds,
        })
    });
    Ok(json_response(
        StatusCode::OK,
        &json!({
            "now_ms": now,
            "policies": policies,
            "rules": shared.observe().rules.read(keys),
            "latency": {
                "window_s": sluice::latency::WINDOW_S,
                "decision": {"http": http, "grpc": grpc},
            },
            "store": store_stats(shared.store()).await,
            "regions": crate::observe::regions::stats(shared.store().regions()),
            "reservation": reservation,
            "config": {"generation": snapshot.number, "last_reload_error": shared.last_reload_error()},
            "reloads": reloads(&shared),
            "rlqs": {"streams": streams, "buckets_total": buckets_total},
        }),
    ))
}

/// The reload history as `/v1/stats` shows it, newest first.
fn reloads(shared: &Shared) -> Vec<Value> {
    shared
        .reloads()
        .into_iter()
        .map(|r| {
            let mut v = json!({"at_ms": r.at_ms, "generation": r.generation, "ok": r.ok(), "source": r.source});
            if let Some(e) = r.error {
                v["error"] = json!(e);
            }
            v
        })
        .collect()
}

/// The store as `/v1/stats` shows it: the memory store's keys, or each shard's circuit, a
/// ping, its calls' latency and its replicas.
async fn store_stats(store: &crate::state::StoreHandle) -> Value {
    match store {
        crate::state::StoreHandle::Memory(m) => {
            json!({"kind": "memory", "keys": m.len(), "shards": []})
        }
        crate::state::StoreHandle::Redis(sharded) => {
            let mut shards = Vec::with_capacity(sharded.shards().len());
            for shard in sharded.shards() {
                let mut s = shard_stats(shard.name(), shard.inner()).await;
                s["circuit"] = json!(shard.state().as_str());
                s["opened_total"] = json!(shard.opened_total());
                shards.push(s);
            }
            json!({"kind": "redis", "shards": shards})
        }
        crate::state::StoreHandle::Cluster(cluster) => {
            json!({"kind": "cluster", "shards": [shard_stats(cluster.name(), cluster).await]})
        }
        crate::state::StoreHandle::Regions(regions) => {
            let local = shard_stats(regions.local().name(), regions.local()).await;
            json!({"kind": "regions", "region": regions.name(), "shards": [local]})
        }
    }
}

/// `GET /v1/stats/history[?seconds=S]` (docs/api.md, "History"): the last `S` seconds of
/// checks per second per policy and Envoy rule, sampled first so that it ends at the clock's
/// last whole second.
pub(super) async fn stats_history(
    State(shared): State<Arc<Shared>>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let seconds = number_query(
        query.as_deref(),
        "seconds",
        (
            1,
            crate::observe::history::SECONDS,
            crate::observe::history::SECONDS,
        ),
    )?;
    shared.sample_history();
    let (end_ms, series) = shared.observe().history.read(seconds);
    let series: std::collections::BTreeMap<String, crate::observe::history::Series> =
        series.into_iter().collect();
    Ok(json_response(
        StatusCode::OK,
        &json!({"end_ms": end_ms, "step_s": 1, "series": series}),
    ))
}

/// `POST /v1/simulate` (docs/simulate.md): runs a traffic through configured or inline
/// policies on a manual clock, on a blocking thread (a large simulation is a second of CPU);
/// a request the simulator refuses is a 400 naming the field or the bound.
/// An admin route: it reads configured policies' limits, and it spends CPU on request. At
/// most [`sluice_simulate::MAX_CONCURRENT`] run at once: the slot is taken before the body is
/// read (so a refused request costs no buffer) and held by the work itself until it ends,
/// even if the client leaves.
pub(super) async fn simulate(
    State(shared): State<Arc<Shared>>,
    request: axum::extract::Request,
) -> Result<Response, ApiError> {
    let Ok(slot) = shared.simulations().clone().try_acquire_owned() else {
        return Err(ApiError::Busy);
    };
    let bytes = <Bytes as axum::extract::FromRequest<()>>::from_request(request, &())
        .await
        .map_err(|rejection| {
            if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::SimulateBodyTooLarge
            } else {
                ApiError::invalid(format!("the body could not be read: {rejection}"))
            }
        })?;
    let configured: Vec<Policy> = shared.snapshot().limiter.policies().cloned().collect();
    // Reading a large log or generating a large traffic is CPU work too: all of it off the
    // runtime's threads.
    let work = move || {
        let _slot = slot;
        // Not JSON, or a key given twice: a `FieldError` without a path, worded as the other
        // routes word it.
        let value =
            sluice_spec::unique::json(&bytes).map_err(|e| FieldError::whole(e.to_string()))?;
        let bounds = sluice_simulate::Bounds::default();
        sluice_simulate::Simulation::from_request(&value, &configured, &bounds)?.run()
    };
    let report = tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| ApiError::Internal(format!("the simulation failed: {e}")))?
        .map_err(ApiError::Simulation)?;
    let body = serde_json::to_value(&report).map_err(|e| ApiError::Internal(e.to_string()))?;
    Ok(json_response(StatusCode::OK, &body))
}

pub(super) async fn metrics_text(State(shared): State<Arc<Shared>>) -> Result<Response, ApiError> {
    let metrics = &shared.observe().metrics;
    shared.store().publish(metrics);
    if let Some(reserving) = shared.reserving() {
        metrics.reservation(reserving.stats());
    }
    let mut text = metrics.render();
    let snapshot = shared.snapshot();
    crate::observe::scrape::limits(&mut text, snapshot.limiter.policies());
    if let Some(rls) = &snapshot.rls {
        crate::observe::scrape::rules(&mut text, rls);
    }
    if let Some(regions) = shared.store().regions() {
        crate::observe::scrape::regions(&mut text, regions);
    }
    crate::observe::scrape::process(&mut text);
    let mut r = (StatusCode::OK, text).into_response();
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4"),
    );
    Ok(r)
}
