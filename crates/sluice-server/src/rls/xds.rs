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
//! very loader a file goes through ([`super::tree::load_file`]), so an xDS rule and a file
//! rule are validated, matched and counted alike. A resource is named `xds:<name>` where a
//! file would be named by its path, in rules ([`super::Rule::file`]) and in errors.

use super::decode::{YamlDescriptor, YamlRateLimit, YamlRoot};
use super::{LoadOptions, RlsConfig, RlsConfigError, Unit};

/// The type URL of the resource, as sent in `DiscoveryRequest.type_url` and in each
/// `Any` of a `DiscoveryResponse`.
pub const RATE_LIMIT_CONFIG_TYPE_URL: &str =
    "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig";

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
            super::tree::load_file(
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
        domain_line: None,
        descriptors: descriptors(&resource.descriptors, ""),
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
                // Not in the proto: always off for xDS rules, as in the reference.
                value_to_metric: false,
                share_threshold: false,
                path,
                line: None,
            }
        })
        .collect()
}

/// `rateLimitPolicyPbToYaml`.
fn policy(p: &RateLimitPolicy) -> YamlRateLimit {
    YamlRateLimit {
        requests_per_unit: p.requests_per_unit,
        requests_per_unit_line: None,
        unit: unit_text(p.unit),
        unit_line: None,
        unlimited: p.unlimited,
        name: p.name.clone(),
        replaces: p.replaces.iter().map(|r| (r.name.clone(), None)).collect(),
        line: None,
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
                assert_eq!(a.rule.file, "xds:default/eg/http");
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
        let mut missing_unit = eg_resource();
        missing_unit.descriptors[0].descriptors[0]
            .rate_limit
            .as_mut()
            .unwrap()
            .unit = 0;
        let err = RlsConfig::from_xds(&[missing_unit], &LoadOptions::default()).unwrap_err();
        assert_eq!(err.file, "xds:default/eg/http");
        assert!(
            err.message
                .starts_with("descriptors[0].descriptors[0].rate_limit: `unit` is missing"),
            "{err}"
        );

        let mut odd_unit = eg_resource();
        odd_unit.descriptors[0].descriptors[1]
            .rate_limit
            .as_mut()
            .unwrap()
            .unit = 42;
        let err = RlsConfig::from_xds(&[odd_unit], &LoadOptions::default()).unwrap_err();
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
