//! Generated traffic: a pattern of arrival instants over a duration, each given a key chosen
//! uniformly or by Zipf's law from a seeded generator, so one seed always gives one traffic.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Exp, Zipf};

use super::{Bounds, Event, SimError, Traffic};

/// When requests arrive.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Pattern {
    /// `rate` requests per second, evenly spaced: request `i` at `⌊i · 1000 / rate⌋` ms.
    Steady {
        /// Requests per second.
        rate: f64,
    },
    /// `size` requests at the same instant, every `every_ms`, from 0.
    Bursts {
        /// Requests per burst.
        size: u64,
        /// The interval between bursts.
        every_ms: u64,
    },
    /// A Poisson process of mean `rate` per second (exponential gaps, seeded).
    Poisson {
        /// Mean requests per second.
        rate: f64,
    },
    /// A rate moving linearly from `from` to `to` per second over the duration; request `i`
    /// arrives when the expected count reaches `i`.
    Ramp {
        /// Requests per second at the start.
        from: f64,
        /// Requests per second at the end.
        to: f64,
    },
}

/// Which key each request is for.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum KeyChoice {
    /// Every key equally likely.
    Uniform,
    /// Key `k` (from 1) with probability proportional to `1 / k^s`.
    Zipf {
        /// The exponent `s` (> 0).
        exponent: f64,
    },
}

/// A generated traffic.
#[derive(Debug, Clone, PartialEq)]
pub struct Generated {
    /// When requests arrive.
    pub pattern: Pattern,
    /// How long the traffic lasts (events at `0 ≤ t < duration`).
    pub duration_ms: u64,
    /// How many keys (`key-1` … `key-N`).
    pub keys: u32,
    /// How keys are chosen.
    pub choice: KeyChoice,
    /// The cost of every request.
    pub cost: u64,
    /// The generator's seed.
    pub seed: u64,
}

impl Generated {
    /// The expected number of events, for refusing an oversized traffic before making it.
    pub fn expected_events(&self) -> f64 {
        let secs = self.duration_ms as f64 / 1_000.0;
        match self.pattern {
            Pattern::Steady { rate } | Pattern::Poisson { rate } => rate * secs,
            Pattern::Bursts { size, every_ms } => {
                size as f64 * self.duration_ms.div_ceil(every_ms) as f64
            }
            Pattern::Ramp { from, to } => (from + to) / 2.0 * secs,
        }
    }

    /// Makes the events, in time order.
    pub fn generate(&self, bounds: &Bounds) -> Result<Traffic, SimError> {
        let expected = self.expected_events();
        if expected > bounds.max_events as f64 {
            return Err(SimError::new(
                "traffic",
                format!(
                    "this pattern makes about {expected:.0} events over the duration, more than \
                     the maximum of {} events (max_events); lower the rate or the duration",
                    bounds.max_events
                ),
            ));
        }
        let mut rng = StdRng::seed_from_u64(self.seed);
        let times = self.times(&mut rng, expected.ceil() as usize + 1, bounds)?;
        let events = self.keyed(times, &mut rng)?;
        Ok(Traffic {
            keys: (1..=self.keys).map(|k| format!("key-{k}")).collect(),
            events,
            duration_ms: self.duration_ms,
            start_ms: super::GENERATED_START_MS,
            log: None,
        })
    }

    /// The events' times (ms from the start), in order, as the pattern places them.
    fn times(
        &self,
        rng: &mut StdRng,
        capacity: usize,
        bounds: &Bounds,
    ) -> Result<Vec<u64>, SimError> {
        let mut times = Vec::with_capacity(capacity);
        let d = self.duration_ms;
        match self.pattern {
            Pattern::Steady { rate } => {
                let n = (rate * d as f64 / 1_000.0).ceil() as u64;
                for i in 0..n {
                    let t = (i as f64 * 1_000.0 / rate).floor() as u64;
                    if t < d {
                        times.push(t);
                    }
                }
            }
            Pattern::Bursts { size, every_ms } => {
                let mut t = 0;
                while t < d {
                    times.extend(std::iter::repeat_n(t, size as usize));
                    t += every_ms;
                }
            }
            Pattern::Poisson { rate } => {
                let gap = Exp::new(rate / 1_000.0)
                    .map_err(|e| SimError::new("traffic.rate", e.to_string()))?;
                let mut t = gap.sample(rng);
                while t < d as f64 {
                    if times.len() >= bounds.max_events {
                        return Err(SimError::new(
                            "traffic",
                            format!(
                                "this Poisson draw makes more than the maximum of {} events \
                                 (max_events); lower the rate or the duration",
                                bounds.max_events
                            ),
                        ));
                    }
                    times.push(t as u64);
                    t += gap.sample(rng);
                }
            }
            Pattern::Ramp { from, to } => {
                // The expected count by time t (s) is N(t) = from·t + (to - from)·t² / (2D);
                // request i arrives at N(t) = i.
                let secs = d as f64 / 1_000.0;
                let a = (to - from) / (2.0 * secs);
                let n = ((from + to) / 2.0 * secs).ceil() as u64;
                for i in 0..n {
                    let i = i as f64;
                    let t = if a.abs() < 1e-12 {
                        i / from
                    } else {
                        (-from + (from * from + 4.0 * a * i).max(0.0).sqrt()) / (2.0 * a)
                    };
                    let t = (t * 1_000.0).floor() as u64;
                    if t < d {
                        times.push(t);
                    }
                }
            }
        }
        Ok(times)
    }

    /// An event at each time, its key drawn by the key choice.
    fn keyed(&self, times: Vec<u64>, rng: &mut StdRng) -> Result<Vec<Event>, SimError> {
        let zipf = match self.choice {
            KeyChoice::Zipf { exponent } => Some(
                Zipf::new(f64::from(self.keys), exponent)
                    .map_err(|e| SimError::new("traffic.zipf", e.to_string()))?,
            ),
            KeyChoice::Uniform => None,
        };
        let events = times
            .into_iter()
            .map(|t| {
                let key = match &zipf {
                    // Zipf draws ranks 1..=N.
                    Some(z) => (z.sample(rng) as u32).clamp(1, self.keys) - 1,
                    None => rng.random_range(0..self.keys),
                };
                Event {
                    t_ms: t,
                    key,
                    cost: self.cost,
                }
            })
            .collect();
        Ok(events)
    }
}
