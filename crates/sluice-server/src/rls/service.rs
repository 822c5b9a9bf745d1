//! Envoy's rate limit service without its wire: a [`RlsRequest`] in, charged over the
//! configured store, a [`RlsAnswer`] out (the gRPC adapter, `grpc.rs`, translates protobuf to
//! these and back). What it answers, and where it differs from the reference service, is in
//! docs/server.md ("Envoy, Istio, Envoy Gateway").
//!
//! The rules come from the reference service's YAML files ([`sluice_envoy_rules`]); each matched rule
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
//! A store failure is an error ([`RlsError::StoreDown`], [`RlsError::StoreRefused`]), as the
//! reference answers an error, so that Envoy's `failure_mode_deny` decides.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, LazyLock, Mutex, RwLock};
use std::time::Instant;

use opentelemetry::propagation::Extractor;
use sluice::{Op, Policy};

use crate::config::{ResponseHeaders, RlsSettings};
use crate::observe::stats::Outcome;
use crate::state::{Generation, ServerLimiter, Shared};
use sluice_envoy_rules::answer::{
    Code, DescriptorStatus, Part, RlsAnswer, RlsError, draft03_headers, ietf_headers, rule_limit,
    until_reset,
};
use sluice_envoy_rules::request::{Descriptor, RlsRequest};
use sluice_envoy_rules::{Match, RulePolicies, rule_policy};

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

/// The rate limit service over the server's shared state.
#[derive(Debug)]
pub(crate) struct Rls {
    shared: Arc<Shared>,
    /// One policy per (window, requests per unit, failure mode), built on first use.
    policies: Mutex<HashMap<(u64, u32, sluice::FailureMode), Policy>>,
    /// The statistics keys seen, bounded by [`MAX_STATS_KEYS`]: read-locked by every
    /// descriptor, write-locked only to add a key.
    stats_keys: RwLock<HashSet<Arc<str>, foldhash::fast::RandomState>>,
}

impl Rls {
    /// A service over the server's shared state.
    pub(crate) fn new(shared: Arc<Shared>) -> Self {
        Self {
            shared,
            policies: Mutex::new(HashMap::new()),
            stats_keys: RwLock::new(HashSet::default()),
        }
    }

    /// Answers `req` (traced as a child of the trace `carrier` names, if any), and observes
    /// it: the decision's latency, its outcome in the metrics, its span.
    pub(crate) async fn should_rate_limit(
        &self,
        req: &RlsRequest<'_>,
        carrier: &(dyn Extractor + Sync),
    ) -> Result<RlsAnswer, RlsError> {
        let started = Instant::now();
        let snapshot = self.shared.snapshot();
        // Envoy with its tracing on sends the `traceparent` in the metadata.
        let span = self
            .shared
            .observe()
            .traces
            .decision("sluice.rls.should_rate_limit", carrier);
        span.set(|| {
            let descriptors = i64::try_from(req.descriptors.len()).unwrap_or(i64::MAX);
            vec![
                // The client's domain, configured or not: clipped.
                opentelemetry::KeyValue::new(
                    "sluice.domain",
                    crate::observe::Untrusted::new(req.domain).to_string(),
                ),
                opentelemetry::KeyValue::new("sluice.descriptors", descriptors),
            ]
        });
        let label = snapshot
            .rls
            .as_ref()
            .and_then(|rls| rls.domain_label(req.domain))
            .cloned()
            .unwrap_or_else(|| UNKNOWN_DOMAIN.clone());
        let answer = span.around(self.answer(&snapshot, &label, req)).await;
        self.shared.observe().decision_took(
            "should_rate_limit",
            crate::observe::Surface::Grpc,
            started,
        );
        let outcome = match &answer {
            Ok(r) if r.overall_code == Code::OverLimit => Outcome::Denied,
            // A descriptor decided without the store shows in the dynamic metadata.
            Ok(r) if r.degraded.is_some() => Outcome::Degraded,
            Ok(_) => Outcome::Allowed,
            Err(_) => Outcome::Error,
        };
        span.finish(
            outcome.as_str(),
            answer.as_ref().err().map(ToString::to_string),
        );
        let metrics = &self.shared.observe().metrics;
        metrics.decision(&label, "should_rate_limit", outcome);
        answer
    }

    /// The policy of a rule of `requests_per_unit` per `window`: the generation's, built with
    /// its rules and read without a lock; for a limit a request carries itself (no rule has
    /// it), from a cache shared by requests, built on first use.
    fn policy(
        &self,
        rules: &RulePolicies,
        window: u64,
        requests_per_unit: u32,
        on_store_error: sluice::FailureMode,
    ) -> Option<Policy> {
        if let Some(p) = rules.get(window, requests_per_unit, on_store_error) {
            return Some(p.clone());
        }
        let mut cache = self.policies.lock().unwrap_or_else(|p| p.into_inner());
        let id = (window, requests_per_unit, on_store_error);
        if let Some(p) = cache.get(&id) {
            return Some(p.clone());
        }
        let policy = rule_policy(window, requests_per_unit, on_store_error)?;
        if cache.len() < MAX_CACHED_POLICIES {
            cache.insert(id, policy.clone());
        }
        Some(policy)
    }

    /// The statistics label for a match: its statistics key while fewer than
    /// [`MAX_STATS_KEYS`] have been seen, else `<domain>.other`.
    fn stats_label(&self, domain: &Arc<str>, m: &Match) -> Arc<str> {
        {
            let seen = self.stats_keys.read().unwrap_or_else(|p| p.into_inner());
            if let Some(k) = seen.get(m.stats_key.as_str()) {
                return k.clone();
            }
        }
        let mut seen = self.stats_keys.write().unwrap_or_else(|p| p.into_inner());
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
fn count_rule(shared: &Shared, m: &Match, descriptor: &Descriptor<'_>, outcome: Outcome) {
    let entries = || {
        descriptor
            .entries
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    };
    let counted = crate::observe::rules::Counted {
        domain: &m.rule.domain,
        full_key: &m.rule.full_key,
        detailed: m.rule.detailed_metric.then_some(m.stats_key.as_str()),
        entries: &entries,
    };
    shared.observe().rules.count(&counted, outcome);
}

/// All or nothing: gives back what the descriptors of a refused or failed request were
/// charged, and says so in their statuses.
async fn give_back(limiter: &ServerLimiter, parts: &mut [Part]) {
    for part in parts.iter_mut() {
        if let Some((policy, key, cost)) = part.charge.take() {
            if let Err(e) = limiter.call(&policy, &key, Op::Refund { cost }).await {
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

/// The error of a descriptor that failed: as in the reference service, a store failure is an
/// error, so that Envoy's `failure_mode_deny` decides whether the request passes.
fn failed(e: sluice::Error) -> RlsError {
    match e {
        sluice::Error::Store(e) => {
            if !e.is_transient() {
                // Logged once per rule's policy and kind by the limiter.
                return RlsError::StoreRefused(e);
            }
            tracing::warn!(error = %e, "store failed during ShouldRateLimit");
            RlsError::StoreDown(e)
        }
        // The bounds are checked first; this is a backstop, never a store error.
        e => RlsError::Invalid(e.to_string()),
    }
}

impl Rls {
    async fn answer(
        &self,
        snapshot: &Generation,
        label: &Arc<str>,
        req: &RlsRequest<'_>,
    ) -> Result<RlsAnswer, RlsError> {
        req.validate()?;
        let (Some(rls), Some(settings)) = (&snapshot.rls, &snapshot.rls_settings) else {
            return Err(RlsError::NoRules);
        };
        let matches = req.match_descriptors(rls)?;
        let now = snapshot.now_ms();
        let limiter = &snapshot.limiter;
        let mut parts = Vec::with_capacity(matches.len());
        let mut failure = None;
        for (descriptor, found) in req.descriptors.iter().zip(matches) {
            let cost = req.hits(descriptor);
            let part = self
                .descriptor(
                    snapshot,
                    settings,
                    found,
                    (cost, descriptor.is_negative_hits),
                    now,
                )
                .await;
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
            // `/v1/stats` counts the failed call under each rule it matched, as the metrics
            // count it under the domain (matched again: the failure path is cold).
            for (descriptor, found) in req.descriptors.iter().zip(req.match_descriptors(rls)?) {
                if let Some(m) = &found
                    && !descriptor.is_negative_hits
                {
                    count_rule(&self.shared, m, descriptor, Outcome::Error);
                }
            }
            return Err(failed(e));
        }
        self.report(snapshot, label, req, &parts, refused, now);
        let headers = match settings.response_headers {
            ResponseHeaders::Off => Vec::new(),
            ResponseHeaders::Ietf => ietf_headers(&parts),
            ResponseHeaders::Draft03 => draft03_headers(&parts),
        };
        Ok(RlsAnswer {
            overall_code: if refused { Code::OverLimit } else { Code::Ok },
            degraded: parts.iter().find_map(|p| p.degraded),
            statuses: parts.into_iter().map(|p| p.status).collect(),
            headers,
        })
    }

    /// Reports each matched descriptor of an answered request: hits by result, near-limit,
    /// the `/v1/stats` counts and the heavy hitters.
    fn report(
        &self,
        snapshot: &Generation,
        label: &Arc<str>,
        req: &RlsRequest<'_>,
        parts: &[Part],
        refused: bool,
        now: u64,
    ) {
        let observe = self.shared.observe();
        for (part, descriptor) in parts.iter().zip(&req.descriptors) {
            if let Some(m) = &part.found
                && !descriptor.is_negative_hits
            {
                let cost = req.hits(descriptor);
                let result = match (part.limited, m.rule.shadow_mode) {
                    (true, true) => "shadow_mode",
                    (true, false) => "over_limit",
                    (false, _) => "within_limit",
                };
                let rule = self.stats_label(label, m);
                observe.metrics.rls_hits(label, &rule, result, cost);
                if !part.limited
                    && !refused
                    && part.degraded.is_none()
                    && near_limit(snapshot, part)
                {
                    observe.metrics.near_limit(label);
                }
                let outcome = Outcome::of(part.degraded.is_some(), !part.limited);
                count_rule(&self.shared, m, descriptor, outcome);
                // What was spent stands only if the request passed; a refused one was refunded.
                // Heavy hitters are kept per rule (`domain.rule`), detailed keys included.
                if part.limited || !refused {
                    let by_rule = &m.rule.full_key;
                    observe
                        .top
                        .record(by_rule, &m.counter_key, !part.limited, cost, now);
                }
            }
        }
    }

    /// One descriptor's part. Charged: `OK` without a rule (or with one replaced by another) or
    /// an unlimited one, else the check of its rule's policy, coded as the rule's shadow mode
    /// says. With `is_negative_hits` (`refund`): its hits go back to its counter (never below
    /// zero used); it is always `OK` and takes no part in the overall code.
    async fn descriptor(
        &self,
        snapshot: &Generation,
        settings: &RlsSettings,
        found: Option<Match>,
        (cost, refund): (u64, bool),
        now: u64,
    ) -> Result<Part, sluice::Error> {
        let Some(m) = found else {
            // No rule (or one replaced by another): OK, and a quota-mode descriptor under the
            // global quota mode, as in the reference.
            return Ok(Part {
                quota: settings.quota_mode && !refund,
                ..Part::plain(DescriptorStatus::ok())
            });
        };
        let rule = &m.rule;
        let (Some(window), false) = (rule.window_ms(), rule.unlimited) else {
            return Ok(Part::plain(DescriptorStatus::unlimited()));
        };
        let policy = self.policy(
            &snapshot.rls_policies,
            window,
            rule.requests_per_unit,
            settings.on_store_error,
        );
        // requests_per_unit: 0 blocks everything (the reference's way to deny a client):
        // no limit of 0 can be built (no policy), and nothing is counted, so no store has an
        // instant: the server's clock tells the window's end.
        let d = match &policy {
            Some(policy) => {
                let op = if refund {
                    Op::Refund { cost }
                } else {
                    Op::Check { cost }
                };
                Some(snapshot.limiter.call(policy, &m.counter_key, op).await?)
            }
            None => None,
        };
        let limited = !refund && d.as_ref().is_none_or(|d| !d.allowed);
        // An over-limit status says 0 remaining, as the reference's does, even when a
        // smaller cost would still fit.
        let remaining = match &d {
            Some(d) if !limited => d.binding().remaining,
            _ => 0,
        };
        // The window's end as seen by the store that decided (Redis TIME under clock: redis).
        let reset_secs = until_reset(window, d.as_ref().map_or(now, |d| d.now_ms));
        let status = DescriptorStatus {
            code: if limited && !rule.shadow_mode {
                Code::OverLimit
            } else {
                Code::Ok
            },
            current_limit: Some(rule_limit(&m)),
            limit_remaining: u32::try_from(remaining).unwrap_or(u32::MAX),
            duration_until_reset: Some(reset_secs),
        };
        if refund {
            return Ok(Part::plain(status));
        }
        Ok(Part {
            status,
            charge: policy
                .filter(|_| !limited && cost > 0)
                .map(|policy| (policy, m.counter_key.clone(), cost)),
            quota: settings.quota_mode || rule.quota_mode,
            limited,
            reset_secs,
            degraded: d.and_then(|d| d.degraded),
            found: Some(m),
        })
    }
}
