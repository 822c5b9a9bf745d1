//! Envoy's rate limit service, v3 (CONTRACT §4): `ShouldRateLimit` over the configured store,
//! with `grpc.health.v1` on the same port.
//!
//! The rules come from the reference service's YAML files ([`crate::rls`]); each matched rule
//! is an aligned fixed window of `requests_per_unit` per unit, counted under the reference's
//! counter key. A request's descriptors are decided all-or-nothing: every matched descriptor
//! is checked; if one that is not in shadow mode is over its limit, the charges already made
//! for the others are refunded, so only admitted requests count. (Each descriptor is its own
//! key, so this is two steps, not one atomic script: between them another request may see a
//! charge that is then refunded, which can only make it stricter, never looser.)
//! `hits_addend` is the cost; a descriptor's own `hits_addend` overrides the request's, and 0
//! reports without counting. A store failure is the gRPC error `UNAVAILABLE`, as the reference
//! answers an error, so that Envoy's `failure_mode_deny` decides.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit, rate_limit::Unit as ProtoUnit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::Duration as ProtoDuration;
use sluice::{Decision, LimitSpec, Policy};
use tonic::{Request, Response, Status};

use crate::metrics;
use crate::rls::{Match, Rule};
use crate::state::Shared;

/// The gRPC service.
#[derive(Debug)]
pub struct RlsService {
    shared: Arc<Shared>,
    /// One policy per (window, requests per unit), built on first use.
    policies: Mutex<HashMap<(u64, u32), Policy>>,
}

impl RlsService {
    /// A service over the server's shared state.
    pub fn new(shared: Arc<Shared>) -> Self {
        Self {
            shared,
            policies: Mutex::new(HashMap::new()),
        }
    }

    /// The tonic server for this service.
    pub fn into_server(self) -> RateLimitServiceServer<Self> {
        RateLimitServiceServer::new(self)
    }

    fn policy(&self, rule: &Rule) -> Option<Policy> {
        let window = rule.window_ms()?;
        let rpu = rule.requests_per_unit;
        if rpu == 0 {
            return None; // everything is over a limit of 0; nothing to count
        }
        let mut cache = self.policies.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(p) = cache.get(&(window, rpu)) {
            return Some(p.clone());
        }
        let spec = LimitSpec::fixed_window(u64::from(rpu), window).aligned();
        // Closed: a store failure reaches Envoy as an error and its `failure_mode_deny` decides.
        let policy = Policy::from_specs(format!("rls:{window}:{rpu}"), vec![spec])
            .ok()?
            .with_failure_mode(sluice::FailureMode::Closed);
        cache.insert((window, rpu), policy.clone());
        Some(policy)
    }
}

fn proto_limit(rule: &Rule) -> RateLimit {
    RateLimit {
        name: rule.name.clone().unwrap_or_default(),
        requests_per_unit: rule.requests_per_unit,
        unit: rule
            .unit
            .and_then(|u| ProtoUnit::from_str_name(u.proto_name()))
            .unwrap_or(ProtoUnit::Unknown) as i32,
    }
}

fn duration_ms(ms: u64) -> ProtoDuration {
    ProtoDuration {
        seconds: i64::try_from(ms / 1_000).unwrap_or(i64::MAX),
        nanos: i32::try_from((ms % 1_000) * 1_000_000).unwrap_or(0),
    }
}

/// One descriptor's part of the answer.
struct Part {
    status: DescriptorStatus,
    /// Over its limit and not in shadow mode: the request is over the limit.
    refuses: bool,
    /// A charge to give back if the request is refused.
    charge: Option<(Policy, String, u64)>,
}

#[tonic::async_trait]
impl RateLimitService for RlsService {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        let req = request.into_inner();
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
        let snapshot = self.shared.snapshot();
        let Some(rls) = snapshot.rls.clone() else {
            return Err(Status::failed_precondition(
                "this sluice has no Envoy rate limit configuration; set rls.config_dir",
            ));
        };
        let entries: Vec<Vec<(String, String)>> = req
            .descriptors
            .iter()
            .map(|d| {
                d.entries
                    .iter()
                    .map(|e| (e.key.clone(), e.value.clone()))
                    .collect()
            })
            .collect();
        let matches = rls.get_limits(&req.domain, &entries);
        let now = snapshot.now_ms();
        let limiter = &snapshot.limiter;
        let mut parts = Vec::with_capacity(matches.len());
        let mut failure = None;
        for (descriptor, found) in req.descriptors.iter().zip(matches) {
            let cost = descriptor
                .hits_addend
                .as_ref()
                .map_or(u64::from(req.hits_addend), |v| v.value);
            match self.decide(limiter, found, cost, now).await {
                Ok(part) => parts.push(part),
                Err(e) => {
                    failure = Some(e);
                    break;
                }
            }
        }
        let over = parts.iter().any(|p| p.refuses);
        if over || failure.is_some() {
            // All or nothing: give back what the other descriptors were charged.
            for part in &mut parts {
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
        if let Some(e) = failure {
            // As in the reference service, a store failure is a gRPC error, so that Envoy's
            // `failure_mode_deny` decides whether the request passes.
            tracing::warn!(error = %e, "store failed during ShouldRateLimit");
            return Err(Status::unavailable(format!(
                "the rate limit store cannot answer: {e}"
            )));
        }
        metrics::decision(
            &Arc::from(req.domain.as_str()),
            "should_rate_limit",
            if over { "denied" } else { "allowed" },
        );
        Ok(Response::new(RateLimitResponse {
            overall_code: if over { Code::OverLimit } else { Code::Ok } as i32,
            statuses: parts.into_iter().map(|p| p.status).collect(),
            ..RateLimitResponse::default()
        }))
    }
}

impl RlsService {
    async fn decide(
        &self,
        limiter: &sluice::Limiter<sluice::SharedStore>,
        found: Option<Match>,
        cost: u64,
        now: u64,
    ) -> Result<Part, sluice::Error> {
        let ok = |status| Part {
            status,
            refuses: false,
            charge: None,
        };
        let Some(m) = found else {
            return Ok(ok(DescriptorStatus {
                code: Code::Ok as i32,
                ..DescriptorStatus::default()
            }));
        };
        let rule = &m.rule;
        if rule.unlimited {
            return Ok(ok(DescriptorStatus {
                code: Code::Ok as i32,
                limit_remaining: u32::MAX,
                ..DescriptorStatus::default()
            }));
        }
        let window = rule.window_ms().unwrap_or(1_000);
        let until_reset = window - now % window;
        let Some(policy) = self.policy(rule) else {
            // requests_per_unit: 0 blocks everything (the reference's way to deny a client).
            return Ok(Part {
                status: DescriptorStatus {
                    code: if rule.shadow_mode {
                        Code::Ok
                    } else {
                        Code::OverLimit
                    } as i32,
                    current_limit: Some(proto_limit(rule)),
                    limit_remaining: 0,
                    duration_until_reset: Some(duration_ms(until_reset)),
                    ..DescriptorStatus::default()
                },
                refuses: !rule.shadow_mode && cost > 0,
                charge: None,
            });
        };
        let d: Decision = limiter.check_policy(&policy, &m.counter_key, cost).await?;
        let s = d.binding();
        let over = !d.allowed;
        Ok(Part {
            status: DescriptorStatus {
                code: if over && !rule.shadow_mode {
                    Code::OverLimit
                } else {
                    Code::Ok
                } as i32,
                current_limit: Some(proto_limit(rule)),
                limit_remaining: u32::try_from(s.remaining).unwrap_or(u32::MAX),
                duration_until_reset: Some(duration_ms(s.reset_ms.saturating_sub(now))),
                ..DescriptorStatus::default()
            },
            refuses: over && !rule.shadow_mode,
            charge: (d.allowed && cost > 0).then(|| (policy, m.counter_key.clone(), cost)),
        })
    }
}
