//! What a limiter remembers across calls, shared by its clones: the local admissions owed to
//! the store ([`Charges`]) and the errors already logged ([`Reported`]).

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use sluice_core::Policy;

use crate::store::{StoreError, StoreErrorKind};

/// What [`Limiter::charge_back`] keeps, shared by a limiter's clones: whether the insurance
/// store admitted something since everything was charged back (a decision the store makes
/// looks for a local debt of its key only then), and the keys being charged now.
#[derive(Debug, Clone, Default)]
pub(super) struct Charges(Arc<(AtomicBool, Mutex<HashSet<PolicyKey>>)>);

/// A policy's name and a key.
type PolicyKey = (Arc<str>, Box<str>);

/// A key's charge under way; dropping it lets the next one start.
pub(super) struct Charging<'a> {
    charges: &'a Charges,
    key: Option<PolicyKey>,
}

impl Drop for Charging<'_> {
    fn drop(&mut self) {
        if let Some(key) = self.key.take() {
            self.charges.charging().remove(&key);
        }
    }
}

impl Charges {
    pub(super) fn owe(&self) {
        self.0.0.store(true, Ordering::Relaxed);
    }

    pub(super) fn owed(&self) -> bool {
        self.0.0.load(Ordering::Relaxed)
    }

    pub(super) fn paid(&self) {
        self.0.0.store(false, Ordering::Relaxed);
    }

    pub(super) fn charging(&self) -> std::sync::MutexGuard<'_, HashSet<PolicyKey>> {
        self.0.1.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The right to charge `key` of `policy`, unless its charge is under way.
    pub(super) fn lock(&self, policy: &Policy, key: &str) -> Option<Charging<'_>> {
        let id: PolicyKey = (policy.name_arc().clone(), key.into());
        self.charging().insert(id.clone()).then_some(Charging {
            charges: self,
            key: Some(id),
        })
    }
}

/// The (policy, kind) pairs of errors no retry can fix that were logged already: each is
/// logged once (at ERROR, target `sluice::limiter`), not once per request;
/// `sluice_store_errors_total{kind}` counts every occurrence. Shared by a limiter's clones.
#[derive(Debug, Clone, Default)]
pub(super) struct Reported(Arc<Mutex<HashSet<PolicyKind>>>);

/// A policy's name and an error kind.
type PolicyKind = (Arc<str>, StoreErrorKind);

/// Pairs remembered at most; past this many (only policies built per request get there)
/// every further one is logged.
const MAX_REPORTED: usize = 4_096;

impl Reported {
    /// Logs `error` of `policy` if it is the first of its kind for the policy.
    pub(super) fn first(&self, policy: &Policy, error: &StoreError) {
        let kind = error.kind();
        let new = {
            let mut seen = self.0.lock().unwrap_or_else(|p| p.into_inner());
            let pair = (policy.name_arc().clone(), kind);
            if seen.contains(&pair) {
                false
            } else {
                if seen.len() < MAX_REPORTED {
                    seen.insert(pair);
                }
                true
            }
        };
        if new {
            tracing::error!(
                target: "sluice::limiter",
                policy = policy.name(),
                kind = kind.as_str(),
                error = %error,
                "the store refused a decision, and retrying will not change that: the caller \
                 gets the error whatever the policy's on_store_error (logged once per policy \
                 and kind; sluice_store_errors_total counts each)"
            );
        }
    }
}
