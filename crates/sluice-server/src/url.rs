//! [`ConfiguredUrl`]: a URL of the configuration that Sluice connects to but never shows
//! whole.

use std::fmt;

use sluice_spec::FieldError;

/// A URL from the configuration besides the store's (the OTLP collector's `tracing.endpoint`,
/// the xDS control plane's `rls.xds.address`). Its `Display` and `Debug` show it without
/// credentials, through the one function that redacts the store's URLs
/// ([`sluice_redis::redact`]), so a log line or an error that names it cannot forget to;
/// [`ConfiguredUrl::expose`] gives the text as written, to connect with.
///
/// Such a URL carries no credentials ([`ConfiguredUrl::parse`]): neither the OTLP exporter
/// nor the xDS client would send them (their clients put the host alone in `:authority`),
/// so a password there would only ever be shown. The collector takes `tracing.headers`, the
/// control plane a client certificate.
#[derive(Clone, PartialEq, Eq)]
pub struct ConfiguredUrl(String);

impl ConfiguredUrl {
    /// `url` as written.
    pub fn new(url: impl Into<String>) -> Self {
        Self(url.into())
    }

    /// `text`, refused (the error shows the URL without them) when it carries credentials;
    /// `instead` says where they go.
    pub(crate) fn parse(text: &str, instead: &str) -> Result<Self, FieldError> {
        let shown = sluice_redis::redact(text);
        if shown != text {
            return Err(FieldError::whole(format!(
                "`{shown}` carries credentials (user information, or user or pass \
                 parameters), which are never sent from this URL; remove them ({instead})"
            )));
        }
        Ok(Self::new(text))
    }

    /// The URL as written, credentials included: for connecting, never for showing.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ConfiguredUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&sluice_redis::redact(&self.0))
    }
}

impl fmt::Debug for ConfiguredUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", sluice_redis::redact(&self.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_configured_url_shows_no_credentials() {
        let url = ConfiguredUrl::new("http://otel:S3CRET@collector:4317");
        assert_eq!(url.to_string(), "http://collector:4317");
        assert_eq!(format!("{url:?}"), "\"http://collector:4317\"");
        assert_eq!(url.expose(), "http://otel:S3CRET@collector:4317");
        let err = ConfiguredUrl::parse(url.expose(), "use tracing.headers")
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("`http://collector:4317` carries"), "{err}");
        assert!(!err.contains("S3CRET"), "{err}");
        assert!(ConfiguredUrl::parse("http://c:4317/?pass=S3CRET", "").is_err());
        assert!(ConfiguredUrl::parse("http://c:4317", "").is_ok());
    }
}
