//! Reloads: a new configuration (or new Envoy rules from xDS) becomes the next
//! [`Generation`], swapped whole under the write lock; the last [`MAX_RELOADS`] changes,
//! applied or refused, are remembered for `/v1/stats` and the dashboard.

use std::sync::Arc;

use sluice::Clock;

use super::{Generation, Shared};
use crate::config::Config;
use sluice_envoy_rules::RlsConfig;

/// Reloads remembered.
pub const MAX_RELOADS: usize = 20;

/// What changed the configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ReloadSource {
    /// The configuration the server started with.
    Start,
    /// The configuration file changed.
    File,
    /// Rules from the xDS control plane (`rls.xds`).
    Xds,
}

/// One configuration change, applied or refused.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Reload {
    /// When, in Unix milliseconds (the server's clock).
    pub at_ms: u64,
    /// The generation in force after it.
    pub generation: u64,
    /// Why it was refused; `None` when it applied.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// What changed.
    pub source: ReloadSource,
}

impl Reload {
    /// Whether it applied.
    pub fn ok(&self) -> bool {
        self.error.is_none()
    }
}

impl Shared {
    /// Applies a new configuration's policies to requests that arrive from now on (a change
    /// of the configuration file).
    pub fn apply(&self, config: &Config, rls: Option<Arc<RlsConfig>>) {
        self.swap(ReloadSource::File, |current| {
            Generation::new(current.number + 1, config, &self.stores, rls, &self.clock)
        });
    }

    /// Replaces the Envoy rules alone, keeping the policies and settings in force: an update
    /// from the xDS control plane (`rls.xds`), counted as a reload.
    pub fn replace_rls(&self, rls: Arc<RlsConfig>) {
        self.swap(ReloadSource::Xds, |current| Generation {
            number: current.number + 1,
            limiter: current.limiter.clone(),
            store: current.store.clone(),
            rls_policies: super::rule_policies(Some(&rls), current.rls_settings.as_ref()),
            rls: Some(rls),
            rls_settings: current.rls_settings.clone(),
            rlqs: current.rlqs.clone(),
            admin: current.admin.clone(),
            near_limit: current.near_limit,
        });
    }

    /// Applies a new configuration keeping the Envoy rules in force: a reload of the
    /// configuration file while the rules come from xDS.
    pub fn apply_keeping_rls(&self, config: &Config) {
        self.swap(ReloadSource::File, |current| {
            let rls = current.rls.clone();
            Generation::new(current.number + 1, config, &self.stores, rls, &self.clock)
        });
    }

    /// Builds the next generation from the current one under the write lock, so the reload
    /// watcher and the xDS client never lose each other's update and each generation's
    /// number is its predecessor's plus one. The heavy hitters and the rule counts of what
    /// the new generation no longer has are forgotten.
    fn swap(&self, source: ReloadSource, next: impl FnOnce(&Generation) -> Generation) {
        let generation = {
            let mut current = self.current.write().unwrap_or_else(|p| p.into_inner());
            *current = Arc::new(next(&current));
            current.clone()
        };
        let domains: Vec<String> = generation
            .rls
            .iter()
            .flat_map(|r| r.domains().map(str::to_owned))
            .collect();
        let in_rules = |name: &str| {
            domains.iter().any(|d| {
                name.strip_prefix(d.as_str())
                    .is_some_and(|r| r.starts_with('.'))
            })
        };
        let observe = &self.observe;
        observe
            .top
            .retain(|name| generation.limiter.policy(name).is_some() || in_rules(name));
        observe
            .rules
            .retain_domains(|domain| domains.iter().any(|d| d == domain));
        self.record_reload(source, generation.number, None);
    }

    /// Records a reload that failed (the last good configuration stays).
    pub fn reload_failed(&self, source: ReloadSource, error: String) {
        self.record_reload(source, self.snapshot().number, Some(error));
    }

    /// Remembers a change, and counts it (`sluice_config_reloads_total{result}`).
    fn record_reload(&self, source: ReloadSource, generation: u64, error: Option<String>) {
        self.observe.metrics.reload(error.is_none());
        let reload = Reload {
            at_ms: self.clock.now_ms(),
            generation,
            error,
            source,
        };
        let mut reloads = self.reloads.lock().unwrap_or_else(|p| p.into_inner());
        if reloads.len() >= MAX_RELOADS {
            reloads.pop_front();
        }
        reloads.push_back(reload);
    }

    /// The last [`MAX_RELOADS`] configuration changes, newest first.
    pub fn reloads(&self) -> Vec<Reload> {
        let reloads = self.reloads.lock().unwrap_or_else(|p| p.into_inner());
        reloads.iter().rev().cloned().collect()
    }

    /// The error of the last failed reload, cleared by a successful one.
    pub fn last_reload_error(&self) -> Option<String> {
        let reloads = self.reloads.lock().unwrap_or_else(|p| p.into_inner());
        reloads.back().and_then(|r| r.error.clone())
    }
}
