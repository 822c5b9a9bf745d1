//! Envoy's rate limit quota service (RLQS), `envoy.service.rate_limit_quota.v3`: each Envoy
//! keeps one stream open, reports per bucket how many requests it admitted, and is sent back
//! what it may admit until its next report. docs/server.md ("Envoy's rate limit quota
//! filter") says how to point Envoy at it.
//!
//! Every report is charged to the store under the policy and key of the bucket's rule
//! ([`sluice_envoy_rules::rlqs`]), so the limit is fleet-wide: any number of Envoys, reporting to any number of
//! Sluice servers over one store, share it. The charge is one [`Op::Acquire`] that takes what
//! fits and carries the stream's holder id, so the same atomic call tells how much is left and
//! how many streams share the key; [`assign`] turns that into the assignment and states the
//! bound it keeps.
//!
//! **One stream, one state.** A stream's domain (from its first report), its holder id and the
//! buckets it reported live in the task that serves it; nothing of a stream outlives it, and
//! the counts are in the store, so an Envoy that reconnects (to this server or another, or to
//! a restarted one) carries on from the store's count. The new stream is a new holder: the old
//! one still counts for the policy's shortest window, so shares are smaller for that long,
//! never larger.
//!
//! **Abandoning.** A bucket reported with no requests for `abandon_after` is abandoned (Envoy
//! forgets it and subscribes again at its next request); so is a bucket whose rule a reload
//! removed or renamed, at its next report, so that it starts over under the current rules.
//!
//! **Answers.** Every report message gets exactly one response, with one action per distinct
//! bucket of the message in order; a bucket whose charge fails (the store cannot answer) gets
//! no action, so Envoy keeps its assignment until `assignment_ttl` and then its own
//! `expired_assignment_behavior`. A malformed message ends the stream with
//! `INVALID_ARGUMENT` naming what is wrong, before anything of it is charged.

pub(crate) mod assign;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::BucketAction;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::{
    AbandonAction, BucketAction as Action, QuotaAssignmentAction,
};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_server::{
    RateLimitQuotaService, RateLimitQuotaServiceServer,
};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{
    BucketId, RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use envoy_types::pb::google::protobuf::Duration as ProtoDuration;
use sluice::core::evaluate::Op;
use sluice::{Call, Decision, Policy, Store, StoreError};
use tokio_stream::wrappers::ReceiverStream;
use tokio::sync::watch;
use tonic::{Request, Response, Status, Streaming};

use crate::observe::metrics::Metrics;
use crate::state::{Generation, Shared};
use assign::Assignment;
use sluice_envoy_rules::rlqs::{
    BucketRule, MAX_BUCKET_ENTRIES, MAX_ENTRY_LEN, RlqsConfig, Unmatched, canonical,
};

/// The most bytes of one report message.
pub(crate) const MAX_MESSAGE: usize = 1024 * 1024;
/// The most bytes of a domain.
pub(crate) const MAX_DOMAIN_LEN: usize = 256;
/// The most bucket usages in one message.
pub(crate) const MAX_USAGES: usize = 1_000;
/// The most buckets one stream may have subscribed at once.
pub(crate) const MAX_BUCKETS_PER_STREAM: usize = 10_000;

/// The gRPC service.
#[derive(Debug)]
pub(crate) struct RlqsService {
    shared: Arc<Shared>,
    stop: watch::Receiver<bool>,
}

impl RlqsService {
    /// A service over the server's shared state: every report reads the configuration
    /// current at that moment, so a reload applies from the next report on. When `stop`
    /// turns true, every open stream ends with `UNAVAILABLE` (Envoy opens a new one at its
    /// next report): streams last as long as an Envoy runs, and a graceful shutdown waits
    /// for them.
    pub(crate) fn new(shared: Arc<Shared>, stop: watch::Receiver<bool>) -> Self {
        Self { shared, stop }
    }

    /// The tonic server for this service.
    pub(crate) fn into_server(self) -> RateLimitQuotaServiceServer<Self> {
        RateLimitQuotaServiceServer::new(self).max_decoding_message_size(MAX_MESSAGE)
    }
}

#[tonic::async_trait]
impl RateLimitQuotaService for RlqsService {
    type StreamRateLimitQuotasStream = ReceiverStream<Result<RateLimitQuotaResponse, Status>>;

    async fn stream_rate_limit_quotas(
        &self,
        request: Request<Streaming<RateLimitQuotaUsageReports>>,
    ) -> Result<Response<Self::StreamRateLimitQuotasStream>, Status> {
        // The stream's trace context (`traceparent` in its metadata) is the parent of each
        // report's span; copied only when traces are on.
        let metadata = if self.shared.observe().traces.is_on() {
            request.metadata().clone().into_headers()
        } else {
            axum::http::HeaderMap::new()
        };
        let peer = request.remote_addr().map(|a| a.to_string());
        let mut inbound = request.into_inner();
        // A few answers may wait for a slow reader; beyond that the stream waits too.
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let shared = self.shared.clone();
        let mut stop = self.stop.clone();
        tokio::spawn(async move {
            let mut stream = StreamState::new(shared.observe().metrics.clone());
            // Listed in /v1/stats while the task lives.
            let listed = shared
                .observe()
                .streams
                .open(peer, sluice::Clock::now_ms(shared.clock()));
            loop {
                let reports = tokio::select! {
                    next = inbound.message() => match next {
                        Ok(Some(reports)) => reports,
                        // The client closed its side, or the stream broke: nothing to answer.
                        Ok(None) => break,
                        Err(e) => {
                            tracing::debug!(error = %e, "rate limit quota stream ended");
                            break;
                        }
                    },
                    () = stopping(&mut stop) => {
                        let shutting = "sluice is shutting down; open the stream again";
                        let _ = tx.send(Err(Status::unavailable(shutting))).await;
                        break;
                    }
                };
                let span = shared.observe().traces.decision(
                    "sluice.rlqs.report",
                    &opentelemetry_http::HeaderExtractor(&metadata),
                );
                span.set(|| {
                    let buckets = i64::try_from(reports.bucket_quota_usages.len()).unwrap_or(0);
                    vec![opentelemetry::KeyValue::new("sluice.buckets", buckets)]
                });
                let cx = span.context();
                let answer = span
                    .around(stream.handle(&shared.snapshot(), reports, cx))
                    .await;
                if let Some(domain) = &stream.domain {
                    listed.set_domain(domain);
                }
                listed.set_buckets(stream.buckets.len());
                match &answer {
                    Ok(_) => span.finish("answered", None),
                    Err(status) => span.finish("error", Some(status.message().to_owned())),
                }
                let end = answer.is_err();
                if tx.send(answer).await.is_err() || end {
                    break;
                }
            }
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

/// Completes when the server stops (or is gone: a dropped sender).
async fn stopping(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|stopping| *stopping).await;
}

/// What the server remembers of one bucket of one stream.
#[derive(Debug)]
struct Tracked {
    /// The rule it matched when last reported (`None`: no rule).
    rule: Option<String>,
    /// When it last reported requests (or was subscribed).
    active_ms: u64,
    /// When it was last reported at all.
    reported_ms: u64,
}

/// One stream: its holder id, domain, buckets and the cadence its reports arrive at.
#[derive(Debug)]
struct StreamState {
    holder: u64,
    domain: Option<String>,
    buckets: HashMap<String, Tracked>,
    /// The longest time seen between two reports of one bucket, in whole seconds (`None`
    /// until a bucket has been reported twice). Envoy reports on a timer of its own that
    /// need not be its buckets' `reporting_interval` (Envoy 1.40 reports every 5 s whatever
    /// they say), so the assignments are sized to what the stream shows, not to what the
    /// configuration expects. The longest gap, not the last: a bucket created just before a
    /// periodic report shows a short one.
    cadence_s: Option<u64>,
    /// The server's metrics, where the actions and the requests reported are counted.
    metrics: Metrics,
}

/// One bucket's usage in a message, duplicates summed.
struct Usage {
    canonical: String,
    id: BucketId,
    allowed: u64,
    denied: u64,
}

fn invalid(message: String) -> Status {
    Status::invalid_argument(message)
}

/// Checks a message's bounds and merges its usages by bucket (in first-seen order).
fn usages(reports: RateLimitQuotaUsageReports) -> Result<Vec<Usage>, Status> {
    let n = reports.bucket_quota_usages.len();
    if n > MAX_USAGES {
        return Err(invalid(format!(
            "{n} bucket_quota_usages in one message; at most {MAX_USAGES}"
        )));
    }
    let mut out: Vec<Usage> = Vec::with_capacity(n);
    let mut index: HashMap<String, usize> = HashMap::with_capacity(n);
    for (i, u) in reports.bucket_quota_usages.into_iter().enumerate() {
        let at = format!("bucket_quota_usages[{i}]");
        let Some(id) = u.bucket_id else {
            return Err(invalid(format!("{at}.bucket_id is missing")));
        };
        if id.bucket.is_empty() {
            return Err(invalid(format!(
                "{at}.bucket_id is empty; a bucket id has at least one entry"
            )));
        }
        if id.bucket.len() > MAX_BUCKET_ENTRIES {
            return Err(invalid(format!(
                "{at}.bucket_id has {} entries; at most {MAX_BUCKET_ENTRIES}",
                id.bucket.len()
            )));
        }
        for (k, v) in &id.bucket {
            if k.is_empty() || k.len() > MAX_ENTRY_LEN || v.len() > MAX_ENTRY_LEN {
                return Err(invalid(format!(
                    "{at}.bucket_id: entry names are 1 to {MAX_ENTRY_LEN} bytes and values at \
                     most {MAX_ENTRY_LEN}; got a name of {} and a value of {} bytes",
                    k.len(),
                    v.len()
                )));
            }
        }
        for (field, value) in [
            ("num_requests_allowed", u.num_requests_allowed),
            ("num_requests_denied", u.num_requests_denied),
        ] {
            if sluice::check_cost(value).is_err() {
                return Err(invalid(format!(
                    "{at}.{field} {value} is too large; at most 2^53 ({})",
                    sluice::core::MAX_AMOUNT
                )));
            }
        }
        let canonical = canonical(&id.bucket);
        match index.get(&canonical) {
            Some(&j) => {
                let seen = &mut out[j];
                seen.allowed =
                    (seen.allowed + u.num_requests_allowed).min(sluice::core::MAX_AMOUNT);
                seen.denied = (seen.denied + u.num_requests_denied).min(sluice::core::MAX_AMOUNT);
            }
            None => {
                index.insert(canonical.clone(), out.len());
                out.push(Usage {
                    canonical,
                    id,
                    allowed: u.num_requests_allowed,
                    denied: u.num_requests_denied,
                });
            }
        }
    }
    Ok(out)
}

/// What to do with one bucket of a message, decided before anything is charged.
enum Plan<'a> {
    /// Tell Envoy to forget the bucket.
    Abandon,
    /// A blanket assignment, nothing charged.
    Blanket(Assignment),
    /// Charge the usage and assign a share.
    Charge {
        rule: &'a BucketRule,
        policy: &'a Policy,
        key: String,
    },
}

impl StreamState {
    fn new(metrics: Metrics) -> Self {
        // Any nonzero id: a stream is a holder of every key it reports.
        Self {
            holder: rand::random::<u64>() | 1,
            domain: None,
            buckets: HashMap::new(),
            cadence_s: None,
            metrics,
        }
    }

    /// Learns the cadence from the buckets of a message reported before, and returns the
    /// one the message's assignments are sized to: the cadence seen, else the configured
    /// `reporting_interval`; never longer than `abandon_after` (a bucket silent that long is
    /// gone, not slow).
    fn cadence(&mut self, config: &RlqsConfig, usages: &[Usage], now: u64) -> Duration {
        let longest_gap = usages
            .iter()
            .filter_map(|u| self.buckets.get(&u.canonical))
            .map(|t| now.saturating_sub(t.reported_ms))
            .max();
        // Whole seconds, as Envoy reads durations; rounded, since a timer fires a little
        // late. A bucket reported twice within half a second (created just before a periodic
        // report) tells nothing of the cadence.
        let seen = longest_gap.map_or(0, |gap| gap.saturating_add(500) / 1_000);
        if seen > 0 {
            self.cadence_s = Some(self.cadence_s.unwrap_or(0).max(seen));
        }
        let cadence = self
            .cadence_s
            .map_or(config.reporting_interval, Duration::from_secs);
        cadence.min(config.abandon_after.max(config.reporting_interval))
    }

    /// The stream's domain after `reports`: set by the first report, unchanged after.
    fn domain(&mut self, reports: &RateLimitQuotaUsageReports) -> Result<String, Status> {
        let given = reports.domain.as_str();
        if given.len() > MAX_DOMAIN_LEN {
            return Err(invalid(format!(
                "domain is {} bytes; at most {MAX_DOMAIN_LEN}",
                given.len()
            )));
        }
        match (&self.domain, given) {
            (None, "") => Err(invalid(
                "domain is empty; the first report of a stream must name its domain".to_owned(),
            )),
            (None, d) => {
                self.domain = Some(d.to_owned());
                Ok(d.to_owned())
            }
            (Some(d), "") => Ok(d.clone()),
            (Some(d), g) if d == g => Ok(d.clone()),
            (Some(d), g) => Err(invalid(format!(
                "domain changed from `{d}` to `{g}` within one stream; open a new stream for \
                 another domain"
            ))),
        }
    }

    /// Answers one report message.
    async fn handle(
        &mut self,
        snapshot: &Generation,
        reports: RateLimitQuotaUsageReports,
        trace: Option<opentelemetry::Context>,
    ) -> Result<RateLimitQuotaResponse, Status> {
        let Some(config) = snapshot.rlqs.as_deref() else {
            return Err(Status::failed_precondition(
                "this sluice has no rate limit quota configuration; add an `rlqs:` section",
            ));
        };
        let domain = self.domain(&reports)?;
        let usages = usages(reports)?;
        let now = snapshot.now_ms();
        let cadence = self.cadence(config, &usages, now);
        let new = usages
            .iter()
            .filter(|u| !self.buckets.contains_key(&u.canonical))
            .count();
        if self.buckets.len() + new > MAX_BUCKETS_PER_STREAM {
            return Err(invalid(format!(
                "this stream would hold {} buckets; at most {MAX_BUCKETS_PER_STREAM}",
                self.buckets.len() + new
            )));
        }
        // Every key is checked before anything is charged.
        let plans = (usages.iter().enumerate())
            .map(|(i, u)| self.plan(snapshot, config, &domain, i, u, now))
            .collect::<Result<Vec<_>, _>>()?;
        let charged = self.charge(snapshot, &usages, &plans, now, trace).await;
        let bucket_action = (usages.into_iter().zip(plans).zip(charged))
            .filter_map(|((u, plan), result)| {
                let action = self.action(config, cadence, &u, plan, result)?;
                Some(BucketAction {
                    bucket_id: Some(u.id),
                    bucket_action: Some(action),
                })
            })
            .collect();
        Ok(RateLimitQuotaResponse { bucket_action })
    }

    /// Charges the planned usages, each answer at its usage's place (`None` for one not
    /// charged).
    ///
    /// The charges are independent keys: they go to the store together (pipelined on one
    /// connection, spread over shards), so a report of many buckets costs about one round
    /// trip, not one per bucket.
    async fn charge(
        &self,
        snapshot: &Generation,
        usages: &[Usage],
        plans: &[Plan<'_>],
        now: u64,
        trace: Option<opentelemetry::Context>,
    ) -> Vec<Option<Result<Decision, StoreError>>> {
        let store = snapshot.limiter.store();
        let charges = usages.iter().zip(plans).map(|(u, plan)| async move {
            let Plan::Charge { policy, key, .. } = plan else {
                return None;
            };
            let op = Op::Acquire {
                min: 0,
                max: u.allowed,
                holder: self.holder,
            };
            Some(store.call(Call::new(policy, key, op, now)).await)
        });
        let charges = futures_util::future::join_all(charges);
        match trace {
            // Each charge's store span is a child of the report's.
            Some(cx) => opentelemetry::context::FutureExt::with_context(charges, cx).await,
            None => charges.await,
        }
    }

    /// The action answered for one bucket, from its plan and its charge's result; `None`
    /// when the store could not say.
    fn action(
        &mut self,
        config: &RlqsConfig,
        cadence: Duration,
        u: &Usage,
        plan: Plan<'_>,
        result: Option<Result<Decision, StoreError>>,
    ) -> Option<Action> {
        match plan {
            Plan::Abandon => {
                self.buckets.remove(&u.canonical);
                self.metrics.rlqs_action("abandon");
                Some(Action::AbandonAction(AbandonAction {}))
            }
            Plan::Blanket(a) => Some(assign_action(&self.metrics, config, cadence, a)),
            Plan::Charge { rule, policy, .. } => match result? {
                Ok(d) => {
                    let taken = if d.allowed { d.cost } else { 0 };
                    self.metrics.rlqs_requests(
                        &rule.name,
                        taken,
                        u.allowed - taken.min(u.allowed),
                        u.denied,
                    );
                    let share = assign::share(policy, &d, duration_ms(cadence));
                    let assigned = assign::assignment(share);
                    Some(assign_action(&self.metrics, config, cadence, assigned))
                }
                Err(e) => {
                    tracing::warn!(rule = %rule.name, error = %e, "could not charge a rate limit quota report");
                    self.metrics.rlqs_action("store_error");
                    None
                }
            },
        }
    }

    /// Decides what to do with one bucket and records it as tracked (or forgets it).
    fn plan<'a>(
        &mut self,
        snapshot: &'a Generation,
        config: &'a RlqsConfig,
        domain: &str,
        i: usize,
        u: &Usage,
        now: u64,
    ) -> Result<Plan<'a>, Status> {
        let rule = config.rule_for(domain, &u.id.bucket);
        let rule_name = rule.map(|r| r.name.clone());
        let active = u.allowed > 0 || u.denied > 0;
        if let Some(seen) = self.buckets.get_mut(&u.canonical) {
            seen.reported_ms = now;
            if seen.rule != rule_name {
                // A reload removed or renamed its rule: start over under the current rules.
                self.buckets.remove(&u.canonical);
                return Ok(Plan::Abandon);
            }
            if active {
                seen.active_ms = now;
            } else if now.saturating_sub(seen.active_ms) >= duration_ms(config.abandon_after) {
                self.buckets.remove(&u.canonical);
                return Ok(Plan::Abandon);
            }
        }
        let plan = match rule {
            None => Plan::Blanket(match config.unmatched {
                Unmatched::AllowAll => Assignment::AllowAll,
                Unmatched::DenyAll => Assignment::DenyAll,
            }),
            Some(rule) => {
                let Some(policy) = snapshot.limiter.policy(&rule.policy) else {
                    // Validated at load; a configuration cannot name a policy it lacks.
                    return Err(Status::internal(format!(
                        "rule `{}` names policy `{}`, which is not configured",
                        rule.name, rule.policy
                    )));
                };
                let key = rule.key(&u.id.bucket);
                if sluice::check_key(&key).is_err() {
                    return Err(invalid(format!(
                        "bucket_quota_usages[{i}].bucket_id: its key under rule `{}` is {} \
                         bytes; a key is 1 to {}",
                        rule.name,
                        key.len(),
                        sluice::MAX_KEY_LEN
                    )));
                }
                Plan::Charge { rule, policy, key }
            }
        };
        self.buckets.entry(u.canonical.clone()).or_insert(Tracked {
            rule: rule_name,
            active_ms: now,
            reported_ms: now,
        });
        Ok(plan)
    }
}

fn duration_ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The action of an assignment for a stream reporting every `cadence`: a token bucket refilled
/// once per `cadence`, living `assignment_ttl` or three reports, whichever is longer, so that
/// a report missed or late does not let it lapse into Envoy's `no_assignment_behavior`.
fn assign_action(
    metrics: &Metrics,
    config: &RlqsConfig,
    cadence: Duration,
    a: Assignment,
) -> Action {
    metrics.rlqs_action(match a {
        Assignment::AllowAll => "allow_all",
        Assignment::DenyAll => "deny_all",
        Assignment::Tokens(_) => "token_bucket",
    });
    Action::QuotaAssignmentAction(QuotaAssignmentAction {
        assignment_time_to_live: Some(ProtoDuration {
            seconds: i64::try_from(
                config
                    .assignment_ttl
                    .max(cadence.saturating_mul(3))
                    .as_secs(),
            )
            .unwrap_or(i64::MAX),
            nanos: 0,
        }),
        rate_limit_strategy: Some(a.strategy(cadence.as_secs())),
    })
}
