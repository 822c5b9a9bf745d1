//! One way of asking for a decision ([`Driver`]: HTTP, gRPC, or the library in-process) and
//! what each answer was.

use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use serde_json::json;
use sluice::{LimitSpec, Limiter, MemoryStore, Policy, SharedStore};
use sluice_redis::{RedisConfig, RedisStore};

use crate::{BenchArgs, Target, client};

/// One way of asking for a decision.
#[derive(Clone)]
pub(crate) enum Driver {
    Http(reqwest::Client, String, String),
    Grpc(
        RateLimitServiceClient<tonic::transport::Channel>,
        String,
        String,
    ),
    Inproc(Arc<Limiter<SharedStore>>, Policy),
}

/// One answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Answer {
    Allowed,
    Denied,
    /// Not the store's decision (`"degraded": true`).
    Degraded,
}

impl Answer {
    fn of(allowed: bool, degraded: bool) -> Self {
        match (degraded, allowed) {
            (true, _) => Answer::Degraded,
            (false, true) => Answer::Allowed,
            (false, false) => Answer::Denied,
        }
    }
}

/// A failed request: its kind (what the report groups by) and what it said.
#[derive(Debug)]
pub(crate) struct Failure {
    pub(crate) kind: String,
    pub(crate) message: String,
}

impl Failure {
    fn new(kind: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            kind: kind.into(),
            message: message.into(),
        }
    }

    fn http(e: &reqwest::Error) -> Self {
        let kind = if e.is_connect() {
            "connect"
        } else if e.is_timeout() {
            "timeout"
        } else if e.is_decode() || e.is_body() {
            "reading the answer"
        } else {
            "request"
        };
        Self::new(kind, client::error_chain(e))
    }
}

/// The fields of a decision body the bench reads (the rest is skipped unread).
#[derive(serde::Deserialize)]
struct Body {
    allowed: bool,
    #[serde(default)]
    degraded: bool,
}

/// An error body, `{"error": {"code", "message"}}`.
#[derive(serde::Deserialize)]
struct ErrorBody {
    error: ErrorDetail,
}

#[derive(serde::Deserialize)]
struct ErrorDetail {
    code: String,
    message: String,
}

impl Driver {
    /// One request: the answer, or why there was none.
    pub(crate) async fn once(&mut self, key: &str, cost: u64) -> Result<Answer, Failure> {
        match self {
            Driver::Http(client, url, policy) => {
                let r = client
                    .post(url.as_str())
                    .json(&json!({"policy": policy, "key": key, "cost": cost}))
                    .send()
                    .await
                    .map_err(|e| Failure::http(&e))?;
                let status = r.status().as_u16();
                let bytes = r.bytes().await.map_err(|e| Failure::http(&e))?;
                match status {
                    200 | 429 => {
                        let body: Body = serde_json::from_slice(&bytes).map_err(|e| {
                            Failure::new(format!("HTTP {status} not a decision"), e.to_string())
                        })?;
                        Ok(Answer::of(body.allowed, body.degraded))
                    }
                    other => Err(match serde_json::from_slice::<ErrorBody>(&bytes) {
                        Ok(b) => {
                            Failure::new(format!("HTTP {other} {}", b.error.code), b.error.message)
                        }
                        Err(_) => Failure::new(
                            format!("HTTP {other}"),
                            String::from_utf8_lossy(&bytes).into_owned(),
                        ),
                    }),
                }
            }
            Driver::Grpc(client, domain, descriptor_key) => {
                let request = RateLimitRequest {
                    domain: domain.clone(),
                    descriptors: vec![RateLimitDescriptor {
                        entries: vec![Entry {
                            key: descriptor_key.clone(),
                            value: key.to_owned(),
                        }],
                        ..RateLimitDescriptor::default()
                    }],
                    // As Envoy sends it: unset (0, which means 1) unless the cost is larger.
                    hits_addend: if cost == 1 {
                        0
                    } else {
                        u32::try_from(cost).unwrap_or(u32::MAX)
                    },
                };
                let r = client
                    .should_rate_limit(request)
                    .await
                    .map_err(|s| Failure::new(format!("gRPC {:?}", s.code()), s.message()))?
                    .into_inner();
                // Envoy's rules fail closed (UNAVAILABLE): a gRPC answer is always decided.
                Ok(Answer::of(r.overall_code == Code::Ok as i32, false))
            }
            Driver::Inproc(limiter, policy) => {
                let d = limiter
                    .call(policy, key, sluice::Op::Check { cost })
                    .await
                    .map_err(|e| {
                        let kind = match &e {
                            sluice::Error::Store(_) => "store",
                            sluice::Error::UnknownPolicy(_) => "unknown policy",
                            sluice::Error::InvalidKey(_) => "invalid key",
                            sluice::Error::InvalidCost(_) => "invalid cost",
                            _ => "limiter",
                        };
                        Failure::new(kind, e.to_string())
                    })?;
                Ok(Answer::of(d.allowed, d.is_degraded()))
            }
        }
    }
}

pub(crate) async fn driver(args: &BenchArgs) -> Result<Driver, crate::Error> {
    Ok(match args.target {
        Target::Http => Driver::Http(
            args.client.http()?,
            format!("{}/v1/check", args.url.trim_end_matches('/')),
            args.policy.clone(),
        ),
        Target::Grpc => Driver::Grpc(
            RateLimitServiceClient::new(args.client.grpc(&args.grpc).await?),
            args.domain.clone(),
            args.descriptor_key.clone(),
        ),
        Target::Inproc => {
            let per_ms = u64::try_from(args.per.as_millis()).unwrap_or(u64::MAX);
            let spec = LimitSpec {
                max: args.max,
                per_ms,
                algorithm: args.algorithm.parse()?,
                ..LimitSpec::default()
            };
            let policy = Policy::from_specs(args.policy.clone(), vec![spec])?;
            let store = match &args.redis {
                Some(url) => SharedStore::new(
                    RedisStore::connect(
                        RedisConfig::new(url.clone()).timeout(Duration::from_secs(2)),
                    )
                    .await?,
                ),
                None => SharedStore::new(MemoryStore::new()),
            };
            Driver::Inproc(
                Arc::new(Limiter::new(store).with_policy(policy.clone())),
                policy,
            )
        }
    })
}
