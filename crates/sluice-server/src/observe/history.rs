//! The last hour of checks per second, per name (a configured policy, or an Envoy rule as
//! `domain/rule`), for `GET /v1/stats/history`: the dashboard's chart is full on load.
//!
//! A task samples the cumulative counts once a second, off the decision path, and puts the
//! difference since the last sample in the second before the sample (a second it missed goes
//! to the second it ran in). Each name has a ring of [`SECONDS`] seconds × 3 outcomes of
//! `u32` (43,200 bytes); at most [`MAX_SERIES`] names have one (11 MB at most). A name no
//! longer given to a sample loses its ring.

use std::collections::HashMap;
use std::sync::Mutex;

use super::stats::Counts;

/// Seconds kept.
pub(crate) const SECONDS: usize = 3_600;
/// Names kept at most.
pub(crate) const MAX_SERIES: usize = 256;

/// One name's last hour: per outcome, second `s` at `s % SECONDS`.
#[derive(Debug)]
struct Ring([Box<[u32]>; 3]);

impl Ring {
    fn new() -> Self {
        let zeros = || vec![0u32; SECONDS].into_boxed_slice();
        Self([zeros(), zeros(), zeros()])
    }
}

/// The per-second counts read back: per name, allowed, denied and degraded (errors included),
/// oldest first.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub(crate) struct Series {
    /// Checks admitted per second.
    pub allowed: Vec<u32>,
    /// Checks refused per second.
    pub denied: Vec<u32>,
    /// Checks decided without the store, or failed, per second.
    pub degraded: Vec<u32>,
}

#[derive(Debug, Default)]
struct State {
    /// The second after the last one sampled (`None` before the first sample).
    end_s: Option<u64>,
    /// The cumulative counts at the last sample, of every name given.
    last: HashMap<String, Counts>,
    rings: HashMap<String, Ring>,
}

/// The history of every kept name.
#[derive(Debug, Default)]
pub(crate) struct History {
    state: Mutex<State>,
}

fn delta(now: &Counts, was: Option<&Counts>) -> [u32; 3] {
    let was = was.copied().unwrap_or_default();
    let d = |a: u64, b: u64| u32::try_from(a.saturating_sub(b)).unwrap_or(u32::MAX);
    [
        d(now.allowed, was.allowed),
        d(now.denied, was.denied),
        d(
            now.degraded.saturating_add(now.errors),
            was.degraded.saturating_add(was.errors),
        ),
    ]
}

impl History {
    /// A sample at `now_ms` of the cumulative `counts` of every name counted; the names in
    /// `keep` (the configured policies and the rules) have a history, the others lose theirs.
    pub(crate) fn sample(
        &self,
        now_ms: u64,
        counts: HashMap<String, Counts>,
        keep: impl Fn(&str) -> bool,
    ) {
        let sec = now_ms / 1_000;
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let Some(end_s) = state.end_s else {
            state.end_s = Some(sec);
            state.last = counts;
            return;
        };
        if sec <= end_s {
            // The same second (or a clock that went back): what happened since waits for
            // the next second.
            return;
        }
        // Clear the seconds from end_s to sec (all of them after an hour or more).
        let gap = usize::try_from(sec - end_s).unwrap_or(SECONDS).min(SECONDS);
        let State { last, rings, .. } = &mut *state;
        rings.retain(|name, _| keep(name));
        for ring in rings.values_mut() {
            for i in 0..gap {
                let slot = usize::try_from((end_s + i as u64) % SECONDS as u64).unwrap_or(0);
                for outcome in ring.0.iter_mut() {
                    outcome[slot] = 0;
                }
            }
        }
        let slot = usize::try_from((sec - 1) % SECONDS as u64).unwrap_or(0);
        for (name, now) in &counts {
            if !keep(name) {
                continue;
            }
            let d = delta(now, last.get(name));
            if !rings.contains_key(name.as_str()) {
                if rings.len() >= MAX_SERIES {
                    continue;
                }
                rings.insert(name.clone(), Ring::new());
            }
            if let Some(ring) = rings.get_mut(name.as_str()) {
                for (outcome, n) in ring.0.iter_mut().zip(d) {
                    outcome[slot] = outcome[slot].saturating_add(n);
                }
            }
        }
        state.last = counts;
        state.end_s = Some(sec);
    }

    /// The last `seconds` (at most [`SECONDS`]) seconds of every name, oldest first, and the
    /// end of the last one in Unix milliseconds (0 before the first sample).
    pub(crate) fn read(&self, seconds: usize) -> (u64, Vec<(String, Series)>) {
        let seconds = seconds.min(SECONDS);
        let state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let end_s = state.end_s.unwrap_or(0);
        let series = state
            .rings
            .iter()
            .map(|(name, ring)| {
                let take = |o: usize| -> Vec<u32> {
                    (0..seconds as u64)
                        .rev()
                        .map(|back| match end_s.checked_sub(back + 1) {
                            Some(s) => ring.0[o][usize::try_from(s % SECONDS as u64).unwrap_or(0)],
                            None => 0,
                        })
                        .collect()
                };
                (
                    name.clone(),
                    Series {
                        allowed: take(0),
                        denied: take(1),
                        degraded: take(2),
                    },
                )
            })
            .collect();
        (end_s.saturating_mul(1_000), series)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn counts(pairs: &[(&str, u64, u64, u64)]) -> HashMap<String, Counts> {
        pairs
            .iter()
            .map(|&(n, a, d, g)| {
                (
                    n.to_owned(),
                    Counts {
                        allowed: a,
                        denied: d,
                        degraded: g,
                        errors: 0,
                    },
                )
            })
            .collect()
    }

    fn series(h: &History, name: &str, seconds: usize) -> Series {
        h.read(seconds)
            .1
            .into_iter()
            .find(|(n, _)| n == name)
            .unwrap()
            .1
    }

    #[test]
    fn each_second_gets_what_happened_in_it_and_a_missed_second_goes_to_the_next() {
        let h = History::default();
        h.sample(10_000, counts(&[("api", 0, 0, 0)]), |_| true);
        h.sample(11_500, counts(&[("api", 3, 1, 0)]), |_| true);
        h.sample(11_900, counts(&[("api", 9, 9, 9)]), |_| true); // same second: waits
        h.sample(14_000, counts(&[("api", 10, 1, 2)]), |_| true);
        let (end, _) = h.read(5);
        assert_eq!(end, 14_000);
        let s = series(&h, "api", 5);
        // Seconds 9..14: second 10 had 3 allowed and 1 denied; 11 and 12 were missed, their
        // 7 allowed and 2 degraded went to second 13.
        assert_eq!(s.allowed, [0, 3, 0, 0, 7]);
        assert_eq!(s.denied, [0, 1, 0, 0, 0]);
        assert_eq!(s.degraded, [0, 0, 0, 0, 2]);
        assert_eq!(series(&h, "api", 10_000).allowed.len(), SECONDS);
    }

    #[test]
    fn an_hour_later_the_old_seconds_are_gone_and_names_are_bounded() {
        let h = History::default();
        h.sample(0, HashMap::new(), |_| true);
        let many: Vec<(String, u64, u64, u64)> = (0..MAX_SERIES + 5)
            .map(|i| (format!("p{i}"), 1, 0, 0))
            .collect();
        let pairs: Vec<(&str, u64, u64, u64)> = many
            .iter()
            .map(|(n, a, d, g)| (n.as_str(), *a, *d, *g))
            .collect();
        h.sample(1_000, counts(&pairs), |_| true);
        assert_eq!(h.read(10).1.len(), MAX_SERIES);
        h.sample(
            (SECONDS as u64 + 5) * 1_000,
            counts(&[("p0", 1, 0, 0)]),
            |n| n == "p0",
        );
        let (_, all) = h.read(SECONDS);
        assert_eq!(all.len(), 1, "the names not kept are dropped");
        assert!(
            all[0].1.allowed.iter().all(|&n| n == 0),
            "an hour has passed"
        );
    }
}
