//! The `rls` section: Envoy rate limit service settings, as written and as applied.

use std::path::{Path, PathBuf};

use serde::Deserialize;
use sluice::FailureMode;
use sluice_spec::FieldError;

/// Envoy rate limit service settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RlsSettings {
    /// Where the rules come from: a directory of rule files or an xDS control plane.
    pub source: RulesSource,
    /// Every over-limit answer becomes `OK` (statuses unchanged): the reference's global
    /// `SHADOW_MODE`.
    pub shadow_mode: bool,
    /// Every descriptor is in quota mode: the reference's `GLOBAL_QUOTA_MODE`.
    pub quota_mode: bool,
    /// The headers Sluice asks Envoy to add to the client's response.
    pub response_headers: ResponseHeaders,
    /// Merge files that define the same domain: the reference's `MERGE_DOMAIN_CONFIG`.
    pub merge_domains: bool,
    /// Skip files and directories whose name starts with `.`: the reference's
    /// `RUNTIME_IGNOREDOTFILES` (for Kubernetes ConfigMap mounts).
    pub ignore_dot_files: bool,
    /// What a rule does when the store cannot answer: `closed` (the default: `UNAVAILABLE`,
    /// and Envoy's `failure_mode_deny` decides), `open` or `local`, as a policy's
    /// `on_store_error`.
    pub on_store_error: FailureMode,
}

/// Where the Envoy rules come from: one source, never both.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RulesSource {
    /// `rls.config_dir`: the directory of the reference's YAML files, reloaded when they change.
    Dir(PathBuf),
    /// `rls.xds`: an xDS control plane, as Envoy Gateway configures its rate limit service.
    Xds(crate::xds_settings::XdsSettings),
}

impl RlsSettings {
    /// The rules directory, when the rules come from files.
    pub fn config_dir(&self) -> Option<&Path> {
        match &self.source {
            RulesSource::Dir(dir) => Some(dir),
            RulesSource::Xds(_) => None,
        }
    }

    /// The control plane, when the rules come from xDS.
    pub fn xds(&self) -> Option<&crate::xds_settings::XdsSettings> {
        match &self.source {
            RulesSource::Xds(xds) => Some(xds),
            RulesSource::Dir(_) => None,
        }
    }

    /// Rules from `dir`, every other setting at its default (an `rls` section naming only
    /// `config_dir`).
    pub(super) fn from_dir(dir: PathBuf) -> Self {
        Self {
            source: RulesSource::Dir(dir),
            shadow_mode: false,
            quota_mode: false,
            response_headers: ResponseHeaders::default(),
            merge_domains: false,
            ignore_dot_files: false,
            on_store_error: FailureMode::Closed,
        }
    }

    pub(super) fn from_raw(r: RawRls, base: Option<&Path>) -> Result<Self, FieldError> {
        let source = match (r.config_dir, r.xds) {
            (Some(dir), None) => RulesSource::Dir(sluice_spec::relative_to(base, dir)),
            (None, Some(xds)) => {
                RulesSource::Xds(crate::xds_settings::XdsSettings::resolve(xds, base)?)
            }
            (Some(_), Some(_)) => {
                return Err(FieldError::new(
                    "rls",
                    "config_dir and xds are both given; the Envoy rules come from one source, a \
                     directory of rule files (config_dir) or an xDS control plane (xds)",
                ));
            }
            (None, None) => {
                return Err(FieldError::new(
                    "rls",
                    "needs config_dir (a directory of rule files) or xds (an xDS control plane \
                     such as Envoy Gateway's)",
                ));
            }
        };
        let on_store_error = match r.on_store_error.as_deref() {
            None => FailureMode::Closed,
            Some(mode) => mode
                .parse::<FailureMode>()
                .map_err(|e| FieldError::new("rls.on_store_error", e.reason))?,
        };
        Ok(Self {
            source,
            shadow_mode: r.shadow_mode,
            quota_mode: r.quota_mode,
            response_headers: r.response_headers,
            merge_domains: r.merge_domains,
            ignore_dot_files: r.ignore_dot_files,
            on_store_error,
        })
    }
}

/// Which rate-limit headers `ShouldRateLimit` answers in `response_headers_to_add`, for Envoy
/// to add to the client's response (allowed or limited).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ResponseHeaders {
    /// None.
    Off,
    /// `RateLimit-Policy` and `RateLimit` (draft-ietf-httpapi-ratelimit-headers-11): one item
    /// per limited descriptor.
    #[default]
    Ietf,
    /// `RateLimit-Limit`, `RateLimit-Remaining` and `RateLimit-Reset` (draft 03) for the
    /// descriptor closest to its limit: what the reference sends with
    /// `LIMIT_RESPONSE_HEADERS_ENABLED`.
    Draft03,
}

#[derive(Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
pub(super) struct RawRls {
    config_dir: Option<PathBuf>,
    xds: Option<crate::xds_settings::RawXds>,
    shadow_mode: bool,
    quota_mode: bool,
    response_headers: ResponseHeaders,
    merge_domains: bool,
    ignore_dot_files: bool,
    on_store_error: Option<String>,
}
