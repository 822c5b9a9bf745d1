//! Envoy's rate limit service, v3: `ShouldRateLimit` over the configured store, with
//! `grpc.health.v1` on the same port. What it answers, and where it differs from the reference
//! service, is in docs/server.md ("Envoy, Istio, Envoy Gateway").
//!
//! The rules come from the reference service's YAML files ([`crate::rls`]); each matched rule
//! is an aligned fixed window of `requests_per_unit` per unit, counted under the reference's
//! counter key. A descriptor may carry its own limit (`RateLimitDescriptor.limit`), which
//! replaces the configured rule as in the reference.
//!
//! **Cost.** As the reference's `GetHitsAddends`: a descriptor's own `hits_addend` when set
//! (`0` there reports without counting), else the request's `hits_addend`, where `0` — what
//! Envoy sends when nothing sets it, i.e. every ordinary request — means 1.
//!
//! **All or nothing.** A request's descriptors are decided together: every matched descriptor
//! is checked; if the request is refused, the charges already made for the others are
//! refunded, so only admitted requests count (the reference counts every descriptor of every
//! request). Each descriptor is its own key, so this is two steps, not one atomic script:
//! between them another request may see a charge that is then refunded, which can only make
//! it stricter, never looser.
//!
//! **Overall code** (the reference's `shouldRateLimitWorker`): `OVER_LIMIT` when a descriptor
//! that is not in quota mode is over its limit, or when every quota-mode descriptor is;
//! per-rule `shadow_mode` turns a descriptor's over-limit status into `OK`; the global
//! `rls.shadow_mode` turns the overall `OVER_LIMIT` into `OK` (the request then counts: it is
//! admitted). A descriptor with `is_negative_hits` gives its hits back instead (never below
//! zero used), whatever the others answer.
//!
//! A store failure is the gRPC error `UNAVAILABLE`, as the reference answers an error, so
//! that Envoy's `failure_mode_deny` decides.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Instant;

use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit, rate_limit::Unit as ProtoUnit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::Duration as ProtoDuration;
use sluice::{LimitSpec, Policy};
use tonic::{Request, Response, Status};

use crate::config::{ResponseHeaders, RlsSettings};
use crate::observe::metrics;
use crate::observe::stats::Outcome;
use crate::rls::{Match, Unit};
use crate::state::{Generation, ServerLimiter, Shared};

/// The metric label of a domain that is not configured: labels never carry what a client
/// made up.
static UNKNOWN_DOMAIN: LazyLock<Arc<str>> = LazyLock::new(|| Arc::from("unknown"));

/// Policies built for `(window, requests per unit)` pairs are kept up to this many; beyond
/// it (only request-carried limits can get there) a policy is built per request instead.
const MAX_CACHED_POLICIES: usize = 4_096;

/// Distinct per-rule statistics keys (`sluice_rls_hits_total{key}`) kept up to this many per
/// process; later ones (only `detailed_metric`, `value_to_metric` and request-carried limits
/// make keys from request values) are counted under `<domain>.other`.
pub(crate) const MAX_STATS_KEYS: usize = 1_000;

/// The most bytes of a `ShouldRateLimit` request message (an Envoy request is a few hundred);
/// a larger one is refused by the transport before it is decoded.
pub(crate) const MAX_MESSAGE: usize = 64 * 1024;
/// The most bytes of a request's domain.
pub(crate) const MAX_DOMAIN_LEN: usize = 256;
/// The most descriptors in one request.
pub(crate) const MAX_DESCRIPTORS: usize = 64;
/// The most entries in one descriptor.
pub(crate) const MAX_ENTRIES: usize = 32;

/// The gRPC service.
#[derive(Debug)]
pub(crate) struct RlsService {
    shared: Arc<Shared>,
    /// One policy per (window, requests per unit, failure mode), built on first use.
    policies: Mutex<HashMap<(u64, u32, sluice::FailureMode), Policy>>,
    /// The statistics keys seen, bounded by [`MAX_STATS_KEYS`].
    stats_keys: Mutex<HashSet<Arc<str>>>,
}

impl RlsService {
    /// A service over the server's shared state.
    pub(crate) fn new(shared: Arc<Shared>) -> Self {
        Self {
            shared,
            policies: Mutex::new(HashMap::new()),
            stats_keys: Mutex::new(HashSet::new()),
        }
    }

    /// The tonic server for this service.
    pub(crate) fn into_server(self) -> RateLimitServiceServer<Self> {
        RateLimitServiceServer::new(self).max_decoding_message_size(MAX_MESSAGE)
    }

    /// The policy counting a rule of `requests_per_unit` per `window`: one aligned fixed
    /// window, named by the unit alone so that every rule of one unit counts a descriptor in
    /// one counter, as the reference's cache key (entries and window start) does; changing
    /// `requests_per_unit` on a reload keeps the count. It fails as `rls.on_store_error`
    /// says (by default closed: a store failure reaches Envoy as an error and its
    /// `failure_mode_deny` decides).
    fn policy(
        &self,
        window: u64,
        requests_per_unit: u32,
        on_store_error: sluice::FailureMode,
    ) -> Option<Policy> {
        let mut cache = self.policies.lock().unwrap_or_else(|p| p.into_inner());
        let id = (window, requests_per_unit, on_store_error);
        if let Some(p) = cache.get(&id) {
            return Some(p.clone());
        }
        let spec = LimitSpec::fixed_window(u64::from(requests_per_unit), window).aligned();
        let policy = Policy::from_specs(format!("rls:{window}"), vec![spec])
            .ok()?
            .with_failure_mode(on_store_error);
        if cache.len() < MAX_CACHED_POLICIES {
            cache.insert(id, policy.clone());
        }
        Some(policy)
    }

    /// The statistics label for a match: its statistics key while fewer than
    /// [`MAX_STATS_KEYS`] have been seen, else `<domain>.other`.
    fn stats_label(&self, domain: &Arc<str>, m: &Match) -> Arc<str> {
        let mut seen = self.stats_keys.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(k) = seen.get(m.stats_key.as_str()) {
            return k.clone();
        }
        if seen.len() < MAX_STATS_KEYS {
            let k: Arc<str> = Arc::from(m.stats_key.as_str());
            seen.insert(k.clone());
            return k;
        }
        Arc::from(format!("{domain}.other"))
    }
}

/// Whether an admitted descriptor left its rule's limit at least `metrics.near_limit_ratio`
/// used (an unlimited rule has no limit to be near).
fn near_limit(snapshot: &Generation, part: &Part) -> bool {
    part.status.current_limit.as_ref().is_some_and(|limit| {
        snapshot.near_limit.reached(
            u64::from(limit.requests_per_unit),
            u64::from(part.status.limit_remaining),
        )
    })
}

/// Counts one descriptor's check under its rule (and its detailed key) for `/v1/stats`; the
/// descriptor's entries are copied only the first time the rule or key is seen.
fn count_rule(shared: &Shared, m: &Match, descriptor: &RateLimitDescriptor, outcome: Outcome) {
    let entries = || {
        descriptor
            .entries
            .iter()
            .map(|e| (e.key.clone(), e.value.clone()))
            .collect()
    };
    let counted = crate::observe::rules::Counted {
        domain: &m.rule.domain,
        full_key: &m.rule.full_key,
        detailed: m.rule.detailed_metric.then_some(m.stats_key.as_str()),
        entries: &entries,
    };
    shared.rules().count(&counted, outcome);
}

/// The request's shape: a domain, at least one descriptor, and the bounds (`check_bounds`).
fn validate(req: &RateLimitRequest) -> Result<(), Status> {
    if req.domain.is_empty() {
        return Err(Status::invalid_argument(
            "rate limit domain must not be empty",
        ));
    }
    if req.descriptors.is_empty() {
        return Err(Status::invalid_argument(
            "rate limit descriptor list must not be empty",
        ));
    }
    check_bounds(req)?;
    Ok(())
}

/// The rule each descriptor matches (or none), once every counter key is known to fit: all
/// or nothing, before anything is charged.
fn match_descriptors(
    rls: &crate::rls::RlsConfig,
    req: &RateLimitRequest,
) -> Result<Vec<Option<Match>>, Status> {
    let entries: Vec<Vec<(&str, &str)>> = req
        .descriptors
        .iter()
        .map(|d| {
            d.entries
                .iter()
                .map(|e| (e.key.as_str(), e.value.as_str()))
                .collect()
        })
        .collect();
    let mut asked = Vec::with_capacity(entries.len());
    for (i, (d, e)) in req.descriptors.iter().zip(&entries).enumerate() {
        asked.push((e.as_slice(), carried_limit(i, d)?));
    }
    let matches = rls.resolve(&req.domain, &asked);
    // Every counter key fits before anything is charged: all or nothing.
    for (i, m) in matches.iter().enumerate() {
        if let Some(m) = m
            && sluice::check_key(&m.counter_key).is_err()
        {
            return Err(Status::invalid_argument(format!(
                "descriptors[{i}]: its counter key (domain and entries) is {} bytes, more \
                 than the {} a key may have; shorten the descriptor's values",
                m.counter_key.len(),
                sluice::MAX_KEY_LEN
            )));
        }
    }
    Ok(matches)
}

/// All or nothing: gives back what the descriptors of a refused or failed request were
/// charged, and says so in their statuses.
async fn give_back(limiter: &ServerLimiter, parts: &mut [Part]) {
    for part in parts.iter_mut() {
        if let Some((policy, key, cost)) = part.charge.take() {
            if let Err(e) = limiter.refund_policy(&policy, &key, cost).await {
                tracing::warn!(error = %e, "could not refund a descriptor of a refused request");
            } else {
                part.status.limit_remaining = part
                    .status
                    .limit_remaining
                    .saturating_add(u32::try_from(cost).unwrap_or(u32::MAX));
            }
        }
    }
}

/// The gRPC error of a descriptor that failed: as in the reference service, a store failure
/// is an error, so that Envoy's `failure_mode_deny` decides whether the request passes.
fn failed(e: sluice::Error) -> Status {
    match e {
        sluice::Error::Store(e) => {
            if !e.is_transient() {
                // Logged once per rule's policy and kind by the limiter.
                return Status::unavailable(format!(
                    "the rate limit store refused the decision ({e}); retrying will not \
                     change that"
                ));
            }
            tracing::warn!(error = %e, "store failed during ShouldRateLimit");
            Status::unavailable(format!("the rate limit store cannot answer now: {e}"))
        }
        // The bounds are checked first; this is a backstop, never a store error.
        e => Status::invalid_argument(e.to_string()),
    }
}

fn proto_unit(unit: Option<Unit>) -> i32 {
    unit.and_then(|u| ProtoUnit::from_str_name(u.proto_name()))
        .unwrap_or(ProtoUnit::Unknown) as i32
}

fn proto_limit(m: &Match) -> RateLimit {
    RateLimit {
        name: m.rule.name.clone().unwrap_or_default(),
        requests_per_unit: m.rule.requests_per_unit,
        unit: proto_unit(m.rule.unit),
    }
}

/// Seconds from `now_ms` to the end of its aligned `window_ms`, rounded up, as the
/// reference's `CalculateReset` counts them (the rls windows are aligned to the epoch).
fn until_reset(window_ms: u64, now_ms: u64) -> u64 {
    sluice::headers::secs_up(window_ms - now_ms % window_ms)
}

/// Whole seconds, as the reference answers `duration_until_reset` (`CalculateReset`); a
/// window ends on a second, so rounding up loses nothing.
fn duration_secs(secs: u64) -> ProtoDuration {
    ProtoDuration {
        seconds: i64::try_from(secs).unwrap_or(i64::MAX),
        nanos: 0,
    }
}

/// A request descriptor's limit, as a rule's unit: `None` when it carries none, an error
/// naming the descriptor when its unit is not one.
fn carried_limit(i: usize, d: &RateLimitDescriptor) -> Result<Option<(u32, Unit)>, Status> {
    let Some(limit) = &d.limit else {
        return Ok(None);
    };
    let unit = ProtoUnit::try_from(limit.unit).ok().and_then(|u| {
        Unit::ALL
            .into_iter()
            .find(|x| x.proto_name() == u.as_str_name())
    });
    match unit {
        Some(unit) => Ok(Some((limit.requests_per_unit, unit))),
        None => Err(Status::invalid_argument(format!(
            "descriptors[{i}].limit.unit is {}: expected one of SECOND, MINUTE, HOUR, DAY, \
             WEEK, MONTH, YEAR",
            limit.unit
        ))),
    }
}

/// The cost of one descriptor, as the reference's `GetHitsAddends`.
/// The request's bounds, each refused as `INVALID_ARGUMENT` naming the bound (docs/api.md,
/// "Bounds"), before anything is matched or charged.
fn check_bounds(req: &RateLimitRequest) -> Result<(), Status> {
    let refuse = |what: String| Err(Status::invalid_argument(what));
    if req.domain.len() > MAX_DOMAIN_LEN {
        return refuse(format!(
            "domain is {} bytes; at most {MAX_DOMAIN_LEN}",
            req.domain.len()
        ));
    }
    if req.descriptors.len() > MAX_DESCRIPTORS {
        return refuse(format!(
            "{} descriptors in one request; at most {MAX_DESCRIPTORS}",
            req.descriptors.len()
        ));
    }
    for (i, d) in req.descriptors.iter().enumerate() {
        if d.entries.len() > MAX_ENTRIES {
            return refuse(format!(
                "descriptors[{i}] has {} entries; at most {MAX_ENTRIES}",
                d.entries.len()
            ));
        }
        let cost = hits(req.hits_addend, d);
        if sluice::check_cost(cost).is_err() {
            return refuse(format!(
                "descriptors[{i}].hits_addend {cost} is too large; at most 2^53 ({})",
                sluice::core::MAX_AMOUNT
            ));
        }
    }
    Ok(())
}

fn hits(request_hits: u32, d: &RateLimitDescriptor) -> u64 {
    d.hits_addend
        .as_ref()
        .map_or(u64::from(request_hits.max(1)), |v| v.value)
}

/// One descriptor's part of the answer.
struct Part {
    status: DescriptorStatus,
    /// The rule that applied (none for unmatched, replaced and unlimited descriptors).
    found: Option<Match>,
    /// Counted as a quota-mode descriptor (the rule's `quota_mode`, or the global one).
    quota: bool,
    /// Over its limit, shadow mode or not.
    limited: bool,
    /// A charge to give back if the request is refused.
    charge: Option<(Policy, String, u64)>,
    /// Whole seconds until the descriptor's window ends.
    reset_secs: u64,
    /// Decided without the store (`rls.on_store_error: open` or `local`).
    degraded: Option<sluice::Degraded>,
}

impl Part {
    fn over(&self) -> bool {
        self.status.code == Code::OverLimit as i32
    }
}

#[tonic::async_trait]
impl RateLimitService for RlsService {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        let started = Instant::now();
        let snapshot = self.shared.snapshot();
        // Envoy with its tracing on sends the `traceparent` in the metadata.
        let span = self.shared.traces().decision(
            "sluice.rls.should_rate_limit",
            &crate::observe::traces::Metadata(request.metadata()),
        );
        let req = request.into_inner();
        span.set(|| {
            let descriptors = i64::try_from(req.descriptors.len()).unwrap_or(i64::MAX);
            vec![
                opentelemetry::KeyValue::new("sluice.domain", req.domain.clone()),
                opentelemetry::KeyValue::new("sluice.descriptors", descriptors),
            ]
        });
        let label = snapshot
            .rls
            .as_ref()
            .and_then(|rls| rls.domain_label(&req.domain))
            .cloned()
            .unwrap_or_else(|| UNKNOWN_DOMAIN.clone());
        let answer = span.around(self.answer(&snapshot, &label, req)).await;
        self.shared
            .decision_took("should_rate_limit", crate::state::Surface::Grpc, started);
        let outcome = match &answer {
            Ok(r) if r.overall_code == Code::OverLimit as i32 => Outcome::Denied,
            Ok(_) => Outcome::Allowed,
            Err(_) => Outcome::Error,
        };
        match &answer {
            // A descriptor decided without the store shows in the dynamic metadata.
            Ok(r) if outcome == Outcome::Allowed && r.dynamic_metadata.is_some() => {
                span.finish(Outcome::Degraded.as_str(), None);
            }
            Ok(_) => span.finish(outcome.as_str(), None),
            Err(status) => span.finish(outcome.as_str(), Some(status.message().to_owned())),
        }
        metrics::decision(&label, "should_rate_limit", outcome);
        answer.map(Response::new)
    }
}

impl RlsService {
    async fn answer(
        &self,
        snapshot: &Generation,
        label: &Arc<str>,
        req: RateLimitRequest,
    ) -> Result<RateLimitResponse, Status> {
        validate(&req)?;
        let (Some(rls), Some(settings)) = (&snapshot.rls, &snapshot.rls_settings) else {
            return Err(Status::failed_precondition(
                "this sluice has no Envoy rate limit configuration: set rls.config_dir or rls.xds \
                 (with rls.xds, no rules have arrived from the control plane yet)",
            ));
        };
        let matches = match_descriptors(rls, &req)?;
        let now = snapshot.now_ms();
        let limiter = &snapshot.limiter;
        let mut parts = Vec::with_capacity(matches.len());
        let mut failure = None;
        for (descriptor, found) in req.descriptors.iter().zip(matches) {
            let cost = hits(req.hits_addend, descriptor);
            let part = if descriptor.is_negative_hits {
                self.refund_descriptor(limiter, settings, found, cost, now)
                    .await
            } else {
                self.check_descriptor(limiter, settings, found, cost, now)
                    .await
            };
            match part {
                Ok(part) => parts.push(part),
                Err(e) => {
                    failure = Some(e);
                    break;
                }
            }
        }
        let failed_rate = parts.iter().filter(|p| p.over() && !p.quota).count();
        let quota_total = parts.iter().filter(|p| p.quota).count();
        let failed_quota = parts.iter().filter(|p| p.over() && p.quota).count();
        let over = failed_rate > 0 || (quota_total > 0 && quota_total == failed_quota);
        // Under the global shadow mode the request passes, so its charges stand.
        let refused = over && !settings.shadow_mode;
        if refused || failure.is_some() {
            give_back(limiter, &mut parts).await;
        }
        if let Some(e) = failure {
            return Err(failed(e));
        }
        self.report(snapshot, label, &req, &parts, refused, now);
        let response_headers_to_add = match settings.response_headers {
            ResponseHeaders::Off => Vec::new(),
            ResponseHeaders::Ietf => ietf_headers(&parts),
            ResponseHeaders::Draft03 => draft03_headers(&parts),
        };
        Ok(RateLimitResponse {
            overall_code: if over && !settings.shadow_mode {
                Code::OverLimit
            } else {
                Code::Ok
            } as i32,
            dynamic_metadata: degraded_metadata(&parts),
            statuses: parts.into_iter().map(|p| p.status).collect(),
            response_headers_to_add,
            ..RateLimitResponse::default()
        })
    }

    /// Reports each matched descriptor of an answered request: hits by result, near-limit,
    /// the `/v1/stats` counts and the heavy hitters.
    fn report(
        &self,
        snapshot: &Generation,
        label: &Arc<str>,
        req: &RateLimitRequest,
        parts: &[Part],
        refused: bool,
        now: u64,
    ) {
        for (part, descriptor) in parts.iter().zip(&req.descriptors) {
            if let Some(m) = &part.found
                && !descriptor.is_negative_hits
            {
                let cost = hits(req.hits_addend, descriptor);
                let result = match (part.limited, m.rule.shadow_mode) {
                    (true, true) => "shadow_mode",
                    (true, false) => "over_limit",
                    (false, _) => "within_limit",
                };
                let rule = self.stats_label(label, m);
                metrics::rls_hits(label, &rule, result, cost);
                if !part.limited
                    && !refused
                    && part.degraded.is_none()
                    && near_limit(snapshot, part)
                {
                    metrics::near_limit(&rule);
                }
                let outcome = Outcome::of(part.degraded.is_some(), !part.limited);
                count_rule(&self.shared, m, descriptor, outcome);
                // What was spent stands only if the request passed; a refused one was refunded.
                // Heavy hitters are kept per rule (`domain.rule`), detailed keys included.
                if part.limited || !refused {
                    let by_rule = &m.rule.full_key;
                    self.shared
                        .top()
                        .record(by_rule, &m.counter_key, !part.limited, cost, now);
                }
            }
        }
    }

    async fn check_descriptor(
        &self,
        limiter: &ServerLimiter,
        settings: &RlsSettings,
        found: Option<Match>,
        cost: u64,
        now: u64,
    ) -> Result<Part, sluice::Error> {
        let Some(m) = found else {
            // No rule (or one replaced by another): OK, and a quota-mode descriptor under the
            // global quota mode, as in the reference.
            return Ok(Part {
                status: DescriptorStatus {
                    code: Code::Ok as i32,
                    ..DescriptorStatus::default()
                },
                found: None,
                quota: settings.quota_mode,
                limited: false,
                charge: None,
                reset_secs: 0,
                degraded: None,
            });
        };
        let rule = &m.rule;
        let (Some(window), false) = (rule.window_ms(), rule.unlimited) else {
            return Ok(Part {
                status: DescriptorStatus {
                    code: Code::Ok as i32,
                    limit_remaining: u32::MAX,
                    ..DescriptorStatus::default()
                },
                found: None,
                quota: false,
                limited: false,
                charge: None,
                reset_secs: 0,
                degraded: None,
            });
        };
        let quota = settings.quota_mode || rule.quota_mode;
        let code = |over: bool| {
            if over && !rule.shadow_mode {
                Code::OverLimit
            } else {
                Code::Ok
            }
        };
        let Some(policy) = self.policy(window, rule.requests_per_unit, settings.on_store_error)
        else {
            // requests_per_unit: 0 blocks everything (the reference's way to deny a client):
            // no limit of 0 can be built, and nothing is counted, so no store has an instant:
            // the server's clock tells the window's end.
            let reset_secs = until_reset(window, now);
            return Ok(Part {
                status: DescriptorStatus {
                    code: code(true) as i32,
                    current_limit: Some(proto_limit(&m)),
                    limit_remaining: 0,
                    duration_until_reset: Some(duration_secs(reset_secs)),
                    ..DescriptorStatus::default()
                },
                found: Some(m),
                quota,
                limited: true,
                charge: None,
                reset_secs,
                degraded: None,
            });
        };
        let d = limiter.check_policy(&policy, &m.counter_key, cost).await?;
        // The window's end as seen by the store that decided (Redis TIME under clock: redis).
        let reset_secs = until_reset(window, d.now_ms);
        // An over-limit status says 0 remaining, as the reference's does, even when a
        // smaller cost would still fit.
        let remaining = if d.allowed { d.binding().remaining } else { 0 };
        Ok(Part {
            status: DescriptorStatus {
                code: code(!d.allowed) as i32,
                current_limit: Some(proto_limit(&m)),
                limit_remaining: u32::try_from(remaining).unwrap_or(u32::MAX),
                duration_until_reset: Some(duration_secs(reset_secs)),
                ..DescriptorStatus::default()
            },
            charge: (d.allowed && cost > 0).then(|| (policy, m.counter_key.clone(), cost)),
            found: Some(m),
            quota,
            limited: !d.allowed,
            reset_secs,
            degraded: d.degraded,
        })
    }

    /// A descriptor with `is_negative_hits`: its hits go back to its counter (never below
    /// zero used); it is always `OK` and takes no part in the overall code.
    async fn refund_descriptor(
        &self,
        limiter: &ServerLimiter,
        settings: &RlsSettings,
        found: Option<Match>,
        cost: u64,
        now: u64,
    ) -> Result<Part, sluice::Error> {
        let ok = |status| Part {
            status,
            found: None,
            quota: false,
            limited: false,
            charge: None,
            reset_secs: 0,
            degraded: None,
        };
        let Some(m) = found else {
            return Ok(ok(DescriptorStatus {
                code: Code::Ok as i32,
                ..DescriptorStatus::default()
            }));
        };
        let (Some(window), false) = (m.rule.window_ms(), m.rule.unlimited) else {
            return Ok(ok(DescriptorStatus {
                code: Code::Ok as i32,
                limit_remaining: u32::MAX,
                ..DescriptorStatus::default()
            }));
        };
        let policy = self.policy(window, m.rule.requests_per_unit, settings.on_store_error);
        let (remaining, reset_secs) = match policy {
            Some(policy) => {
                let d = limiter.refund_policy(&policy, &m.counter_key, cost).await?;
                (d.binding().remaining, until_reset(window, d.now_ms))
            }
            None => (0, until_reset(window, now)),
        };
        Ok(ok(DescriptorStatus {
            code: Code::Ok as i32,
            current_limit: Some(proto_limit(&m)),
            limit_remaining: u32::try_from(remaining).unwrap_or(u32::MAX),
            duration_until_reset: Some(duration_secs(reset_secs)),
            ..DescriptorStatus::default()
        }))
    }
}

/// `{"degraded": "open"}` (or `"local"`) when a descriptor was decided without the store
/// (`rls.on_store_error`): Envoy emits it as the filter's dynamic metadata, for access logs.
fn degraded_metadata(parts: &[Part]) -> Option<envoy_types::pb::google::protobuf::Struct> {
    use envoy_types::pb::google::protobuf::{Struct, Value, value::Kind};
    let how = parts.iter().find_map(|p| p.degraded)?.as_str();
    Some(Struct {
        fields: [(
            "degraded".to_owned(),
            Value {
                kind: Some(Kind::StringValue(how.to_owned())),
            },
        )]
        .into_iter()
        .collect(),
    })
}

fn header(key: &str, value: String) -> HeaderValue {
    HeaderValue {
        key: key.to_owned(),
        value,
        ..HeaderValue::default()
    }
}

/// The item name of a descriptor's limit in the IETF headers: the rule's `name`, else its
/// configured key (`domain.key_value.key`), never a value the client chose unless the
/// configuration keys on it.
fn item_name(m: &Match) -> &str {
    m.rule.name.as_deref().unwrap_or(&m.rule.full_key)
}

/// `RateLimit-Policy` and `RateLimit` with one item per limited descriptor, in request order
/// (draft-ietf-httpapi-ratelimit-headers-11: `q` quota and `w` window in seconds; `r`
/// remaining and `t` seconds until the window ends).
fn ietf_headers(parts: &[Part]) -> Vec<HeaderValue> {
    let mut policy = String::new();
    let mut state = String::new();
    for part in parts {
        let (Some(m), Some(limit)) = (&part.found, &part.status.current_limit) else {
            continue;
        };
        let name = sluice::headers::sf_string(item_name(m));
        let window = m.rule.unit.map_or(0, Unit::seconds);
        if !policy.is_empty() {
            policy.push_str(", ");
            state.push_str(", ");
        }
        policy.push_str(&format!("{name};q={};w={window}", limit.requests_per_unit));
        state.push_str(&format!(
            "{name};r={};t={}",
            part.status.limit_remaining, part.reset_secs
        ));
    }
    if policy.is_empty() {
        return Vec::new();
    }
    vec![
        header("RateLimit-Policy", policy),
        header("RateLimit", state),
    ]
}

/// The reference's draft-03 headers for the descriptor closest to its limit: the one with the
/// least `limit_remaining`, or the last descriptor over its limit that is not in quota mode.
fn draft03_headers(parts: &[Part]) -> Vec<HeaderValue> {
    let mut chosen: Option<&Part> = None;
    let mut least = u32::MAX;
    for part in parts {
        if part.status.current_limit.is_some() && part.status.limit_remaining < least {
            chosen = Some(part);
            least = part.status.limit_remaining;
        }
        if part.over() && !part.quota {
            chosen = Some(part);
            least = 0;
        }
    }
    let Some(part) = chosen else {
        return Vec::new();
    };
    let Some(limit) = &part.status.current_limit else {
        return Vec::new();
    };
    vec![
        header("RateLimit-Limit", limit.requests_per_unit.to_string()),
        header(
            "RateLimit-Remaining",
            part.status.limit_remaining.to_string(),
        ),
        header("RateLimit-Reset", part.reset_secs.to_string()),
    ]
}
