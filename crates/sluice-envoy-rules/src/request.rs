//! A `ShouldRateLimit` request as plain data, without its wire types: the domain, the
//! descriptors (entries, a carried limit, their own hits) and the request's hits; its bounds,
//! its cost per descriptor, and the rule each descriptor matches.

use crate::answer::RlsError;
use crate::config::RlsConfig;
use crate::rule::Match;
use crate::unit::Unit;

/// The most bytes of a request's domain.
pub const MAX_DOMAIN_LEN: usize = 256;
/// The most descriptors in one request.
pub const MAX_DESCRIPTORS: usize = 64;
/// The most entries in one descriptor.
pub const MAX_ENTRIES: usize = 32;

/// One `ShouldRateLimit` request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RlsRequest<'a> {
    /// The rules' domain.
    pub domain: &'a str,
    /// The descriptors, in request order.
    pub descriptors: Vec<Descriptor<'a>>,
    /// The request's `hits_addend` (`0`, what Envoy sends when nothing sets it, means 1).
    pub hits_addend: u32,
}

/// One request descriptor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Descriptor<'a> {
    /// Its entries `(key, value)`, in order.
    pub entries: Vec<(&'a str, &'a str)>,
    /// The limit it carries (`RateLimitDescriptor.limit`), replacing the configured rule.
    pub limit: Option<CarriedLimit>,
    /// Its own `hits_addend`, when set.
    pub hits_addend: Option<u64>,
    /// `is_negative_hits`: its hits go back instead of being charged.
    pub is_negative_hits: bool,
}

/// A limit a descriptor carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CarriedLimit {
    /// Its `requests_per_unit`.
    pub requests_per_unit: u32,
    /// Its unit, or the number the request gave that names none.
    pub unit: Result<Unit, i32>,
}

impl RlsRequest<'_> {
    /// The request's shape: a domain, at least one descriptor, and the bounds, each refused
    /// as invalid naming the bound (docs/api.md, "Bounds"), before anything is matched or
    /// charged.
    pub fn validate(&self) -> Result<(), RlsError> {
        let refuse = |what: String| Err(RlsError::Invalid(what));
        if self.domain.is_empty() {
            return refuse("rate limit domain must not be empty".to_owned());
        }
        if self.descriptors.is_empty() {
            return refuse("rate limit descriptor list must not be empty".to_owned());
        }
        if self.domain.len() > MAX_DOMAIN_LEN {
            return refuse(format!(
                "domain is {} bytes; at most {MAX_DOMAIN_LEN}",
                self.domain.len()
            ));
        }
        if self.descriptors.len() > MAX_DESCRIPTORS {
            return refuse(format!(
                "{} descriptors in one request; at most {MAX_DESCRIPTORS}",
                self.descriptors.len()
            ));
        }
        for (i, d) in self.descriptors.iter().enumerate() {
            if d.entries.len() > MAX_ENTRIES {
                return refuse(format!(
                    "descriptors[{i}] has {} entries; at most {MAX_ENTRIES}",
                    d.entries.len()
                ));
            }
            let cost = self.hits(d);
            if sluice::check_cost(cost).is_err() {
                return refuse(format!(
                    "descriptors[{i}].hits_addend {cost} is too large; at most 2^53 ({})",
                    sluice::core::MAX_AMOUNT
                ));
            }
        }
        Ok(())
    }

    /// The cost of one descriptor, as the reference's `GetHitsAddends`.
    pub fn hits(&self, d: &Descriptor<'_>) -> u64 {
        d.hits_addend
            .map_or(u64::from(self.hits_addend.max(1)), |v| v)
    }

    /// The rule each descriptor matches (or none), once every counter key is known to fit:
    /// all or nothing, before anything is charged.
    pub fn match_descriptors(&self, rls: &RlsConfig) -> Result<Vec<Option<Match>>, RlsError> {
        let mut asked = Vec::with_capacity(self.descriptors.len());
        for (i, d) in self.descriptors.iter().enumerate() {
            asked.push((d.entries.as_slice(), carried_limit(i, d)?));
        }
        let matches = rls.resolve(self.domain, &asked);
        // Every counter key fits before anything is charged: all or nothing.
        for (i, m) in matches.iter().enumerate() {
            if let Some(m) = m
                && sluice::check_key(&m.counter_key).is_err()
            {
                return Err(RlsError::Invalid(format!(
                    "descriptors[{i}]: its counter key (domain and entries) is {} bytes, more \
                     than the {} a key may have; shorten the descriptor's values",
                    m.counter_key.len(),
                    sluice::MAX_KEY_LEN
                )));
            }
        }
        Ok(matches)
    }
}

/// A request descriptor's limit, as a rule's unit: `None` when it carries none, an error
/// naming the descriptor when its unit is not one.
fn carried_limit(i: usize, d: &Descriptor<'_>) -> Result<Option<(u32, Unit)>, RlsError> {
    let Some(limit) = &d.limit else {
        return Ok(None);
    };
    match limit.unit {
        Ok(unit) => Ok(Some((limit.requests_per_unit, unit))),
        Err(unit) => Err(RlsError::Invalid(format!(
            "descriptors[{i}].limit.unit is {unit}: expected one of SECOND, MINUTE, HOUR, DAY, \
             WEEK, MONTH, YEAR"
        ))),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    const RULES: &str = "domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit: { unit: minute, requests_per_unit: 5 }\n";

    fn descriptor(entries: Vec<(&'static str, &'static str)>) -> Descriptor<'static> {
        Descriptor {
            entries,
            limit: None,
            hits_addend: None,
            is_negative_hits: false,
        }
    }

    fn request(descriptors: Vec<Descriptor<'static>>) -> RlsRequest<'static> {
        RlsRequest {
            domain: "edge",
            descriptors,
            hits_addend: 0,
        }
    }

    fn invalid(result: Result<impl std::fmt::Debug, RlsError>) -> String {
        match result {
            Err(RlsError::Invalid(why)) => why,
            other => panic!("expected an invalid request, got {other:?}"),
        }
    }

    #[test]
    fn a_request_hits_zero_means_one_and_a_descriptor_s_own_hits_win() {
        let mut req = request(vec![descriptor(vec![("remote_address", "1.2.3.4")])]);
        assert_eq!(req.hits(&req.descriptors[0]), 1);
        req.hits_addend = 3;
        assert_eq!(req.hits(&req.descriptors[0]), 3);
        req.descriptors[0].hits_addend = Some(0);
        assert_eq!(req.hits(&req.descriptors[0]), 0);
    }

    #[test]
    fn the_shape_and_bounds_are_refused_naming_what_is_wrong() {
        let mut req = request(Vec::new());
        assert_eq!(
            invalid(req.validate()),
            "rate limit descriptor list must not be empty"
        );
        req.domain = "";
        assert_eq!(
            invalid(req.validate()),
            "rate limit domain must not be empty"
        );
        let req = request(vec![descriptor(vec![("k", "v")]); MAX_DESCRIPTORS + 1]);
        assert_eq!(
            invalid(req.validate()),
            format!("65 descriptors in one request; at most {MAX_DESCRIPTORS}")
        );
        let mut req = request(vec![descriptor(vec![("k", "v")])]);
        req.descriptors[0].hits_addend = Some(u64::MAX);
        assert!(invalid(req.validate()).starts_with("descriptors[0].hits_addend"));
    }

    #[test]
    fn a_carried_limit_without_a_unit_is_refused_before_anything_matches() {
        let rls = RlsConfig::from_files(&[("edge.yaml", RULES)]).unwrap();
        let mut req = request(vec![
            descriptor(vec![("remote_address", "1.2.3.4")]),
            descriptor(vec![("remote_address", "1.2.3.4")]),
        ]);
        req.descriptors[1].limit = Some(CarriedLimit {
            requests_per_unit: 10,
            unit: Err(0),
        });
        assert_eq!(
            invalid(req.match_descriptors(&rls)),
            "descriptors[1].limit.unit is 0: expected one of SECOND, MINUTE, HOUR, DAY, WEEK, \
             MONTH, YEAR"
        );
        req.descriptors[1].limit = None;
        let matches = req.match_descriptors(&rls).unwrap();
        let m = matches[0].as_ref().expect("the rule matches");
        assert_eq!(m.counter_key, "edge_remote_address_1.2.3.4_");
        assert_eq!(m.rule.requests_per_unit, 5);
    }
}
