//! Decision counts per policy, for `GET /v1/stats` and the dashboard: how many checks were
//! allowed, denied, answered degraded (the store failed and the policy's `on_store_error`
//! decided) or failed, since start. A reader turns two readings into rates. (Envoy rules are
//! counted per rule and detailed key in [`super::rules`].)
//!
//! Names come from the configuration, and at most [`MAX_NAMES`] are counted.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

/// Names counted at most.
pub(crate) const MAX_NAMES: usize = 4_096;

/// What became of a check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Outcome {
    /// Admitted.
    Allowed = 0,
    /// Refused.
    Denied = 1,
    /// Decided without the store (`on_store_error: open` or `local`).
    Degraded = 2,
    /// The store failed and the policy fails closed.
    Error = 3,
}

impl Outcome {
    /// The outcome of a decision, derived here once for the metrics and the counts: a
    /// degraded decision is degraded whatever it answered.
    pub(crate) fn of(degraded: bool, allowed: bool) -> Self {
        match (degraded, allowed) {
            (true, _) => Self::Degraded,
            (false, true) => Self::Allowed,
            (false, false) => Self::Denied,
        }
    }

    /// Its `outcome` label in the metrics.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Allowed => "allowed",
            Self::Denied => "denied",
            Self::Degraded => "degraded",
            Self::Error => "error",
        }
    }
}

/// The counts of one name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub(crate) struct Counts {
    /// Checks admitted.
    pub allowed: u64,
    /// Checks refused.
    pub denied: u64,
    /// Checks decided without the store.
    pub degraded: u64,
    /// Checks that failed.
    pub errors: u64,
}

/// The four counts of one name (or rule), one atomic per [`Outcome`].
#[derive(Debug, Default)]
pub(crate) struct Counters([AtomicU64; 4]);

impl Counters {
    pub(crate) fn add(&self, outcome: Outcome) {
        self.0[outcome as usize].fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn read(&self) -> Counts {
        let at = |o: Outcome| self.0[o as usize].load(Ordering::Relaxed);
        Counts {
            allowed: at(Outcome::Allowed),
            denied: at(Outcome::Denied),
            degraded: at(Outcome::Degraded),
            errors: at(Outcome::Error),
        }
    }
}

/// Counts per name.
#[derive(Debug, Default)]
pub(crate) struct DecisionCounts {
    by_name: RwLock<HashMap<Arc<str>, Arc<Counters>>>,
}

impl DecisionCounts {
    /// Counts one check of `name`.
    pub(crate) fn count(&self, name: &Arc<str>, outcome: Outcome) {
        let counters = {
            let read = self.by_name.read().unwrap_or_else(|p| p.into_inner());
            read.get(name).cloned()
        };
        let counters = match counters {
            Some(c) => c,
            None => {
                let mut write = self.by_name.write().unwrap_or_else(|p| p.into_inner());
                if write.len() >= MAX_NAMES && !write.contains_key(name) {
                    return;
                }
                write.entry(name.clone()).or_default().clone()
            }
        };
        counters.add(outcome);
    }

    /// Every name's counts, by name.
    pub(crate) fn read(&self) -> std::collections::BTreeMap<String, Counts> {
        let read = self.by_name.read().unwrap_or_else(|p| p.into_inner());
        read.iter()
            .map(|(name, c)| (name.to_string(), c.read()))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn counts_add_up_per_name_and_outcome() {
        let c = DecisionCounts::default();
        let (a, b): (Arc<str>, Arc<str>) = (Arc::from("a"), Arc::from("b"));
        for _ in 0..3 {
            c.count(&a, Outcome::Allowed);
        }
        c.count(&a, Outcome::Denied);
        c.count(&b, Outcome::Degraded);
        c.count(&b, Outcome::Error);
        let read = c.read();
        assert_eq!(
            read["a"],
            Counts {
                allowed: 3,
                denied: 1,
                degraded: 0,
                errors: 0
            }
        );
        assert_eq!((read["b"].degraded, read["b"].errors), (1, 1));
    }

    #[test]
    fn names_are_bounded() {
        let c = DecisionCounts::default();
        for i in 0..(MAX_NAMES + 10) {
            c.count(&Arc::from(format!("n{i}").as_str()), Outcome::Allowed);
        }
        assert_eq!(c.read().len(), MAX_NAMES);
    }
}
