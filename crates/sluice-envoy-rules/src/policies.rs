//! The policy that counts a rule. Built for every rule of a configuration when its generation
//! is ([`RulePolicies`]), so a `ShouldRateLimit` finds its descriptor's policy without a lock
//! shared by all requests; built on demand only for a limit a request carries itself.

use std::collections::HashMap;

use sluice::{FailureMode, LimitSpec, Policy};

use crate::config::RlsConfig;

/// The policy counting a rule of `requests_per_unit` per `window`: one aligned fixed window,
/// named by the unit alone so that every rule of one unit counts a descriptor in one counter,
/// as the reference's cache key (entries and window start) does; changing
/// `requests_per_unit` on a reload keeps the count. It fails as `rls.on_store_error` says (by
/// default closed: a store failure reaches Envoy as an error and its `failure_mode_deny`
/// decides). `None` for `requests_per_unit: 0`, which no limit can hold.
pub fn rule_policy(
    window: u64,
    requests_per_unit: u32,
    on_store_error: FailureMode,
) -> Option<Policy> {
    let spec = LimitSpec::fixed_window(u64::from(requests_per_unit), window).aligned();
    Policy::from_specs(format!("rls:{window}"), vec![spec])
        .ok()
        .map(|p| p.with_failure_mode(on_store_error))
}

/// The policies of one generation's rules, by window and `requests_per_unit`: built with the
/// generation (and swapped with it on a reload), read without a lock.
#[derive(Debug, Default)]
pub struct RulePolicies(HashMap<(u64, u32), Policy, foldhash::fast::RandomState>);

impl RulePolicies {
    /// The policy of every limited rule of `rules`, failing as `on_store_error` says.
    pub fn new(rules: &RlsConfig, on_store_error: FailureMode) -> Self {
        let mut policies = HashMap::default();
        for rule in rules.rules() {
            if let (Some(window), false) = (rule.window_ms(), rule.unlimited)
                && let Some(policy) = rule_policy(window, rule.requests_per_unit, on_store_error)
            {
                policies
                    .entry((window, rule.requests_per_unit))
                    .or_insert(policy);
            }
        }
        Self(policies)
    }

    /// The policy of a rule of `requests_per_unit` per `window` failing as `on_store_error`
    /// says, when one of the generation's rules has it.
    pub fn get(
        &self,
        window: u64,
        requests_per_unit: u32,
        on_store_error: FailureMode,
    ) -> Option<&Policy> {
        self.0
            .get(&(window, requests_per_unit))
            .filter(|p| p.failure_mode() == on_store_error)
    }

    /// How many policies the rules need.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether no rule needs a policy.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_limited_rule_has_its_policy_and_a_carried_limit_does_not() {
        let rules = RlsConfig::from_files(&[(
            "api.yaml",
            "domain: api\ndescriptors:\n  - key: a\n    rate_limit: { unit: second, requests_per_unit: 5 }\n  - key: b\n    rate_limit: { unit: minute, requests_per_unit: 5 }\n  - key: c\n    rate_limit: { unit: second, requests_per_unit: 5 }\n  - key: d\n    rate_limit: { unit: hour, requests_per_unit: 0 }\n  - key: e\n    rate_limit: { unlimited: true }\n",
        )])
        .expect("rules");
        let policies = RulePolicies::new(&rules, FailureMode::Closed);
        // a and c share one policy; d (0) and e (unlimited) have none.
        assert_eq!(policies.len(), 2);
        let second = policies.get(1_000, 5, FailureMode::Closed).expect("a's");
        assert_eq!(second.name(), "rls:1000");
        assert_eq!(second.limits()[0].max(), 5);
        assert!(policies.get(60_000, 5, FailureMode::Closed).is_some());
        assert!(policies.get(3_600_000, 0, FailureMode::Closed).is_none());
        // A limit no rule has (one a request carries), or another failure mode: not here.
        assert!(policies.get(1_000, 7, FailureMode::Closed).is_none());
        assert!(policies.get(1_000, 5, FailureMode::Open).is_none());
    }
}
