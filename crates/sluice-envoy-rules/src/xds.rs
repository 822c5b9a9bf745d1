//! The rate limit configuration as an xDS resource: `ratelimit.config.ratelimit.v3.
//! RateLimitConfig`, what Envoy Gateway sends its rate limit service, and its conversion into
//! the same rules a configuration file gives.
//!
//! The messages mirror `api/ratelimit/config/ratelimit/v3/rls_conf.proto` of
//! github.com/envoyproxy/ratelimit (read at commit f2fb15770f7fd1c88ca6c3a1b58ee513917ace96),
//! field for field and number for number, declared with `prost` derives so that the build
//! needs no `protoc`. `RateLimitDescriptor.metadata` (field 8, a `google.protobuf.Struct`
//! the reference copies into its response's dynamic metadata) is not declared: Sluice does not
//! answer it for file rules either, and prost skips a field it does not know.
//!
//! The conversion is the reference's `ConfigXdsProtoToYaml` (`src/config/config_xds.go`): each
//! resource becomes the decoded form of one configuration file, which then goes through the
//! very loader a file goes through (`tree::load_file`), so an xDS rule and a file
//! rule are validated, matched and counted alike. A resource is named `xds:<name>` where a
//! file would be named by its path, in rules ([`crate::Rule::file`]) and in errors.

use crate::config::{LoadOptions, RlsConfig};
use crate::decode::{YamlDescriptor, YamlRateLimit, YamlRoot};
use crate::error::RlsConfigError;
use crate::unit::Unit;

/// The type URL of the resource, as sent in `DiscoveryRequest.type_url` and in each
/// `Any` of a `DiscoveryResponse`.
pub const RATE_LIMIT_CONFIG_TYPE_URL: &str =
    "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig";

/// The most bytes of one text of a resource: its name, its domain, a descriptor's key or
/// value, a rate limit's name or a name it replaces. Envoy Gateway's longest, a route's
/// descriptor (`httproute/<namespace>/<name>/rule/<i>/match/<j>/<hostname>`), stays under
/// 700 bytes with Kubernetes' longest names.
pub const MAX_TEXT: usize = 1024;
/// The deepest nesting of descriptors (Envoy Gateway nests two levels).
pub const MAX_DEPTH: usize = 8;
/// The most descriptors of one response, all resources and levels together.
pub const MAX_DESCRIPTORS: usize = 10_000;
/// The most resources of one response.
pub const MAX_RESOURCES: usize = 1_000;
/// The most bytes of the full keys of one response's descriptors together (each the domain
/// and every composite key above it, kept per rule): what the rules cost beyond the
/// response's own size.
pub const MAX_FULL_KEYS: usize = 8 << 20;

/// A resource past one of the bounds above, naming the field and the bound (never the text).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{at}: {what}")]
pub struct TooLarge {
    at: String,
    what: String,
}

/// What the resources of one response have used of the bounds, checked resource by resource
/// before any is converted.
#[derive(Debug, Default)]
pub struct Budget {
    descriptors: usize,
    full_keys: usize,
}

impl Budget {
    /// Checks `resource` against the bounds, with what the resources before it used.
    pub fn check(&mut self, resource: &RateLimitConfig) -> Result<(), TooLarge> {
        let mut at = Vec::new();
        text(&at, "name", &resource.name)?;
        text(&at, "domain", &resource.domain)?;
        self.level(&mut at, &resource.descriptors, resource.domain.len())
    }

    /// One level of descriptors under a full key of `parent_key` bytes; `at` is the place
    /// of the level's parent (indices), formatted only for an error.
    fn level(
        &mut self,
        at: &mut Vec<usize>,
        list: &[RateLimitDescriptor],
        parent_key: usize,
    ) -> Result<(), TooLarge> {
        for (i, d) in list.iter().enumerate() {
            at.push(i);
            if at.len() > MAX_DEPTH {
                return Err(too_large(
                    at,
                    "",
                    format!("nested deeper than {MAX_DEPTH} levels"),
                ));
            }
            self.descriptors += 1;
            if self.descriptors > MAX_DESCRIPTORS {
                return Err(too_large(
                    at,
                    "",
                    format!("more than {MAX_DESCRIPTORS} descriptors in one response"),
                ));
            }
            text(at, "key", &d.key)?;
            text(at, "value", &d.value)?;
            if let Some(p) = &d.rate_limit {
                text(at, "rate_limit.name", &p.name)?;
                for r in &p.replaces {
                    text(at, "rate_limit.replaces.name", &r.name)?;
                }
            }
            let full_key = parent_key + 1 + d.key.len() + d.value.len() + 1;
            self.full_keys += full_key;
            if self.full_keys > MAX_FULL_KEYS {
                return Err(too_large(
                    at,
                    "",
                    format!(
                        "the full keys of the response's descriptors come to more than \
                         {MAX_FULL_KEYS} bytes"
                    ),
                ));
            }
            self.level(at, &d.descriptors, full_key)?;
            at.pop();
        }
        Ok(())
    }
}

/// A text within [`MAX_TEXT`].
fn text(at: &[usize], field: &str, text: &str) -> Result<(), TooLarge> {
    if text.len() > MAX_TEXT {
        return Err(too_large(
            at,
            field,
            format!(
                "{} bytes, more than the {MAX_TEXT} a text may have",
                text.len()
            ),
        ));
    }
    Ok(())
}

/// `descriptors[i].descriptors[j].field` of the indices `at`.
fn too_large(at: &[usize], field: &str, what: String) -> TooLarge {
    let mut place: Vec<String> = at.iter().map(|i| format!("descriptors[{i}]")).collect();
    if !field.is_empty() {
        place.push(field.to_owned());
    }
    TooLarge {
        at: place.join("."),
        what,
    }
}

/// `RateLimitConfig`: one domain's descriptors, named.
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct RateLimitConfig {
    /// Name of the configuration, unique per resource (Envoy Gateway uses the domain).
    #[prost(string, tag = "1")]
    pub name: String,
    /// The domain.
    #[prost(string, tag = "2")]
    pub domain: String,
    /// The descriptors.
    #[prost(message, repeated, tag = "3")]
    pub descriptors: Vec<RateLimitDescriptor>,
}

/// `RateLimitDescriptor`.
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct RateLimitDescriptor {
    /// `key`.
    #[prost(string, tag = "1")]
    pub key: String,
    /// `value`, empty for a key-only descriptor.
    #[prost(string, tag = "2")]
    pub value: String,
    /// `rate_limit`.
    #[prost(message, optional, tag = "3")]
    pub rate_limit: Option<RateLimitPolicy>,
    /// Nested `descriptors`.
    #[prost(message, repeated, tag = "4")]
    pub descriptors: Vec<RateLimitDescriptor>,
    /// `shadow_mode`.
    #[prost(bool, tag = "5")]
    pub shadow_mode: bool,
    /// `detailed_metric`.
    #[prost(bool, tag = "6")]
    pub detailed_metric: bool,
    /// `quota_mode`.
    #[prost(bool, tag = "7")]
    pub quota_mode: bool,
}

/// `RateLimitPolicy`: a descriptor's `rate_limit`.
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct RateLimitPolicy {
    /// `unit`, a [`RateLimitUnit`] number.
    #[prost(enumeration = "RateLimitUnit", tag = "1")]
    pub unit: i32,
    /// `requests_per_unit`.
    #[prost(uint32, tag = "2")]
    pub requests_per_unit: u32,
    /// `unlimited`.
    #[prost(bool, tag = "3")]
    pub unlimited: bool,
    /// `name`.
    #[prost(string, tag = "4")]
    pub name: String,
    /// `replaces`.
    #[prost(message, repeated, tag = "5")]
    pub replaces: Vec<RateLimitReplace>,
}

/// `RateLimitReplace`.
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct RateLimitReplace {
    /// The name of the rate limit replaced.
    #[prost(string, tag = "1")]
    pub name: String,
}

/// `RateLimitUnit`. Note the numbering: `WEEK` came last.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, ::prost::Enumeration)]
#[repr(i32)]
pub enum RateLimitUnit {
    /// Not set.
    Unknown = 0,
    /// A second.
    Second = 1,
    /// A minute.
    Minute = 2,
    /// An hour.
    Hour = 3,
    /// A day.
    Day = 4,
    /// A week.
    Week = 7,
    /// A month.
    Month = 5,
    /// A year.
    Year = 6,
}

/// The unit as the loader reads a file's `unit:`: the proto name (`SECOND`, ...), empty when
/// unset (`UNKNOWN`, so that a missing unit is reported as missing and an unlimited rule has
/// none), and the number for one this proto does not define (reported as not a unit).
fn unit_text(unit: i32) -> String {
    let unit = match RateLimitUnit::try_from(unit) {
        Ok(RateLimitUnit::Unknown) => return String::new(),
        Ok(RateLimitUnit::Second) => Unit::Second,
        Ok(RateLimitUnit::Minute) => Unit::Minute,
        Ok(RateLimitUnit::Hour) => Unit::Hour,
        Ok(RateLimitUnit::Day) => Unit::Day,
        Ok(RateLimitUnit::Week) => Unit::Week,
        Ok(RateLimitUnit::Month) => Unit::Month,
        Ok(RateLimitUnit::Year) => Unit::Year,
        Err(_) => return unit.to_string(),
    };
    unit.proto_name().to_owned()
}

impl RlsConfig {
    /// Builds a configuration from the resources of one xDS response, as
    /// [`RlsConfig::from_files_with`] builds one from files: each resource is loaded as a file
    /// named `xds:<name>` would be (so two resources with one domain are an error unless
    /// `merge_domains`), the first error wins.
    pub fn from_xds(
        resources: &[RateLimitConfig],
        options: &LoadOptions,
    ) -> Result<Self, RlsConfigError> {
        let mut domains = std::collections::BTreeMap::new();
        let mut warnings = Vec::new();
        for resource in resources {
            let file = resource_file(resource);
            crate::tree::load_file(
                &mut domains,
                &file,
                root(resource),
                options.merge_domains,
                &mut warnings,
            )?;
        }
        Ok(Self { domains, warnings })
    }
}

/// What a resource is called in rules and errors: `xds:<name>`, or `xds:<domain>` when it
/// has no name.
pub fn resource_file(resource: &RateLimitConfig) -> String {
    let name = if resource.name.is_empty() {
        &resource.domain
    } else {
        &resource.name
    };
    format!("xds:{name}")
}

/// `ConfigXdsProtoToYaml`.
fn root(resource: &RateLimitConfig) -> YamlRoot {
    YamlRoot {
        domain: resource.domain.clone(),
        descriptors: descriptors(&resource.descriptors, ""),
        ..YamlRoot::default()
    }
}

/// `rateLimitDescriptorsPbToYaml`, with each descriptor's path as a file's decoder gives it.
fn descriptors(list: &[RateLimitDescriptor], parent: &str) -> Vec<YamlDescriptor> {
    list.iter()
        .enumerate()
        .map(|(i, d)| {
            let path = if parent.is_empty() {
                format!("descriptors[{i}]")
            } else {
                format!("{parent}.descriptors[{i}]")
            };
            YamlDescriptor {
                key: d.key.clone(),
                value: d.value.clone(),
                rate_limit: d.rate_limit.as_ref().map(policy),
                descriptors: descriptors(&d.descriptors, &path),
                shadow_mode: d.shadow_mode,
                quota_mode: d.quota_mode,
                detailed_metric: d.detailed_metric,
                path,
                // Not in the proto (`value_to_metric`, `share_threshold`): always off for
                // xDS rules, as in the reference; and no line.
                ..YamlDescriptor::default()
            }
        })
        .collect()
}

/// `rateLimitPolicyPbToYaml`.
fn policy(p: &RateLimitPolicy) -> YamlRateLimit {
    YamlRateLimit {
        requests_per_unit: p.requests_per_unit,
        unit: unit_text(p.unit),
        unlimited: p.unlimited,
        name: p.name.clone(),
        replaces: p.replaces.iter().map(|r| (r.name.clone(), None)).collect(),
        ..YamlRateLimit::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leaf(key: &str, value: &str, rpu: u32, unit: RateLimitUnit) -> RateLimitDescriptor {
        RateLimitDescriptor {
            key: key.into(),
            value: value.into(),
            rate_limit: Some(RateLimitPolicy {
                unit: unit as i32,
                requests_per_unit: rpu,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// What Envoy Gateway v1.9 generates for an HTTPRoute with one `BackendTrafficPolicy`
    /// global rule matching a header value (`rule-0-match-0`, key and value) and one with a
    /// distinct header (`rule-1-match-0`, key only): the route's descriptor, then the rules.
    fn eg_resource() -> RateLimitConfig {
        let route = "httproute/default/backend/rule/0/match/0/www_example_com";
        RateLimitConfig {
            name: "default/eg/http".into(),
            domain: "default/eg/http".into(),
            descriptors: vec![RateLimitDescriptor {
                key: route.into(),
                value: route.into(),
                descriptors: vec![
                    leaf("rule-0-match-0", "rule-0-match-0", 3, RateLimitUnit::Hour),
                    leaf("rule-1-match-0", "", 10, RateLimitUnit::Week),
                ],
                ..Default::default()
            }],
        }
    }

    const EG_FILE: &str = "\
domain: default/eg/http
descriptors:
  - key: httproute/default/backend/rule/0/match/0/www_example_com
    value: httproute/default/backend/rule/0/match/0/www_example_com
    descriptors:
      - key: rule-0-match-0
        value: rule-0-match-0
        rate_limit: { unit: HOUR, requests_per_unit: 3 }
      - key: rule-1-match-0
        rate_limit: { unit: WEEK, requests_per_unit: 10 }
";

    #[test]
    fn an_envoy_gateway_resource_gives_the_rules_its_file_gives() {
        let xds = RlsConfig::from_xds(&[eg_resource()], &LoadOptions::default()).unwrap();
        let file = RlsConfig::from_files(&[("eg.yaml", EG_FILE)]).unwrap();
        let route = "httproute/default/backend/rule/0/match/0/www_example_com";
        for entries in [
            vec![(route, route), ("rule-0-match-0", "rule-0-match-0")],
            vec![(route, route), ("rule-1-match-0", "alice")],
            vec![(route, route), ("rule-1-match-0", "bob")],
            vec![(route, route)],
            vec![("other", "x")],
        ] {
            let a = xds.get_limit("default/eg/http", &entries);
            let b = file.get_limit("default/eg/http", &entries);
            assert_eq!(a.is_some(), b.is_some(), "{entries:?}");
            if let (Some(a), Some(b)) = (a, b) {
                assert_eq!(a.counter_key, b.counter_key);
                assert_eq!(a.stats_key, b.stats_key);
                assert_eq!(a.rule.unit, b.rule.unit);
                assert_eq!(a.rule.requests_per_unit, b.rule.requests_per_unit);
                assert_eq!(a.rule.path, b.rule.path);
                assert_eq!(&*a.rule.file, "xds:default/eg/http");
            }
        }
        let week = xds
            .get_limit(
                "default/eg/http",
                &[(route, route), ("rule-1-match-0", "alice")],
            )
            .unwrap();
        assert_eq!(week.rule.unit, Some(Unit::Week));
        assert_eq!(week.rule.requests_per_unit, 10);
        assert!(xds.warnings().is_empty(), "{:?}", xds.warnings());
    }

    #[test]
    fn every_field_is_carried() {
        let resource = RateLimitConfig {
            name: "r".into(),
            domain: "d".into(),
            descriptors: vec![
                RateLimitDescriptor {
                    key: "a".into(),
                    rate_limit: Some(RateLimitPolicy {
                        unit: RateLimitUnit::Minute as i32,
                        requests_per_unit: 5,
                        name: "narrow".into(),
                        replaces: vec![RateLimitReplace {
                            name: "wide".into(),
                        }],
                        ..Default::default()
                    }),
                    shadow_mode: true,
                    detailed_metric: true,
                    quota_mode: true,
                    ..Default::default()
                },
                RateLimitDescriptor {
                    key: "free".into(),
                    rate_limit: Some(RateLimitPolicy {
                        unlimited: true,
                        ..Default::default()
                    }),
                    ..Default::default()
                },
            ],
        };
        let config = RlsConfig::from_xds(&[resource], &LoadOptions::default()).unwrap();
        let a = config.get_limit("d", &[("a", "1")]).unwrap();
        assert_eq!(a.rule.name.as_deref(), Some("narrow"));
        assert_eq!(a.rule.replaces, vec!["wide".to_owned()]);
        assert!(a.rule.shadow_mode && a.rule.detailed_metric && a.rule.quota_mode);
        assert_eq!(a.stats_key, "d.a_1");
        let free = config.get_limit("d", &[("free", "x")]).unwrap();
        assert!(free.rule.unlimited);
        assert_eq!(free.rule.unit, None);
        assert!(config.warnings().is_empty(), "{:?}", config.warnings());
    }

    #[test]
    fn a_bad_resource_is_refused_naming_it_and_the_fault() {
        // The error of the example with the unit of its nested descriptor `at` set to `unit`.
        let with_unit = |at: usize, unit| {
            let mut resource = eg_resource();
            resource.descriptors[0].descriptors[at]
                .rate_limit
                .as_mut()
                .unwrap()
                .unit = unit;
            RlsConfig::from_xds(&[resource], &LoadOptions::default()).unwrap_err()
        };
        let err = with_unit(0, 0);
        assert_eq!(err.file, "xds:default/eg/http");
        assert!(
            err.message
                .starts_with("descriptors[0].descriptors[0].rate_limit: `unit` is missing"),
            "{err}"
        );

        let err = with_unit(1, 42);
        assert!(err.message.contains("\"42\" is not a unit"), "{err}");

        let mut duplicate = eg_resource();
        let copy = duplicate.descriptors[0].descriptors[0].clone();
        duplicate.descriptors[0].descriptors.push(copy);
        let err = RlsConfig::from_xds(&[duplicate], &LoadOptions::default()).unwrap_err();
        assert!(err.message.contains("duplicate descriptor"), "{err}");

        let err = RlsConfig::from_xds(&[eg_resource(), eg_resource()], &LoadOptions::default())
            .unwrap_err();
        assert!(
            err.message
                .contains("already defined in xds:default/eg/http"),
            "{err}"
        );
        let merged = RlsConfig::from_xds(
            &[eg_resource(), {
                let mut other = eg_resource();
                other.name = "second".into();
                other.descriptors[0].key = "another-route".into();
                other.descriptors[0].value = "another-route".into();
                other
            }],
            &LoadOptions {
                merge_domains: true,
                ..Default::default()
            },
        );
        assert!(merged.is_ok(), "{merged:?}");
    }

    #[test]
    fn the_wire_format_is_the_protos() {
        use prost::Message;
        // `RateLimitConfig { name: "n", domain: "d", descriptors: [{ key: "k",
        // rate_limit: { unit: WEEK, requests_per_unit: 2 } }] }` as protoc encodes it.
        let bytes = [
            0x0a, 0x01, b'n', 0x12, 0x01, b'd', 0x1a, 0x09, 0x0a, 0x01, b'k', 0x1a, 0x04, 0x08,
            0x07, 0x10, 0x02,
        ];
        let decoded = RateLimitConfig::decode(&bytes[..]);
        let expected = RateLimitConfig {
            name: "n".into(),
            domain: "d".into(),
            descriptors: vec![RateLimitDescriptor {
                key: "k".into(),
                rate_limit: Some(RateLimitPolicy {
                    unit: RateLimitUnit::Week as i32,
                    requests_per_unit: 2,
                    ..Default::default()
                }),
                ..Default::default()
            }],
        };
        assert_eq!(expected.encode_to_vec(), bytes);
        assert_eq!(decoded.unwrap(), expected);
    }
}
