//! The `rls` section: Envoy rate limit service settings, as written and as applied.

use super::*;

/// Envoy rate limit service settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RlsSettings {
    /// The directory of Envoy ratelimit YAML files.
    pub config_dir: PathBuf,
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

impl RlsSettings {
    pub(super) fn from_raw(r: RawRls) -> Result<Self, String> {
        let on_store_error = match r.on_store_error.as_deref() {
            None => FailureMode::Closed,
            Some(mode) => mode
                .parse::<FailureMode>()
                .map_err(|e| format!("rls.on_store_error: {}", e.reason))?,
        };
        Ok(Self {
            config_dir: r.config_dir,
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

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRls {
    pub(super) config_dir: PathBuf,
    #[serde(default)]
    pub(super) shadow_mode: bool,
    #[serde(default)]
    pub(super) quota_mode: bool,
    #[serde(default)]
    pub(super) response_headers: ResponseHeaders,
    #[serde(default)]
    pub(super) merge_domains: bool,
    #[serde(default)]
    pub(super) ignore_dot_files: bool,
    #[serde(default)]
    pub(super) on_store_error: Option<String>,
}
