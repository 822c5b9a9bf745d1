//! `rls.xds`: where the xDS control plane is and how to reach it.

use std::path::{Path, PathBuf};

use serde::Deserialize;
use sluice_redis::TlsFiles;

use crate::tls::{check_client_files, relative_files};
use crate::url::ConfiguredUrl;
use sluice_spec::FieldError;

/// `rls.xds` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawXds {
    address: String,
    node_id: String,
    cluster: Option<String>,
    ca_file: Option<PathBuf>,
    cert_file: Option<PathBuf>,
    key_file: Option<PathBuf>,
}

impl RawXds {
    /// The certificate files as written.
    fn files(&self) -> TlsFiles {
        let mut files = TlsFiles::default();
        files.ca_file.clone_from(&self.ca_file);
        files.cert_file.clone_from(&self.cert_file);
        files.key_file.clone_from(&self.key_file);
        files
    }
}

/// The xDS control plane the Envoy rules come from (`rls.xds`), validated, its files' paths
/// resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XdsSettings {
    /// `http://host:port` or `https://host:port` (TLS, verified against `ca_file` or the
    /// system's roots).
    pub address: ConfiguredUrl,
    /// The node id sent in every request: the id the control plane keeps the snapshot under
    /// (`envoy-ratelimit` for Envoy Gateway).
    pub node_id: String,
    /// The node's cluster, when set.
    pub cluster: Option<String>,
    /// The CA the control plane's certificate is verified against (PEM; without it, the
    /// system's roots), and the client certificate and key presented to it: Envoy Gateway's
    /// xDS server requires one (mutual TLS).
    pub files: TlsFiles,
    /// Whether the address's scheme, as the URL parser reads it (in any case), is `https`.
    tls: bool,
}

impl XdsSettings {
    /// Whether the control plane is reached over TLS.
    pub fn tls(&self) -> bool {
        self.tls
    }

    /// Checks `raw` and resolves relative files against `base` (the configuration file's
    /// directory). Each error names the `rls.xds` field at fault.
    pub(crate) fn resolve(raw: RawXds, base: Option<&Path>) -> Result<Self, FieldError> {
        // Errors show the address as every other place does: without credentials.
        let shown = sluice_redis::redact(&raw.address);
        let uri: tonic::codegen::http::Uri = raw.address.parse().map_err(|e| {
            FieldError::new(
                "rls.xds.address",
                format!(
                    "{shown:?} is not a URL ({e}); expected http://host:port or https://host:port"
                ),
            )
        })?;
        let tls = match uri.scheme_str() {
            Some("http") => false,
            Some("https") => true,
            _ => {
                return Err(FieldError::new(
                    "rls.xds.address",
                    format!(
                        "{shown:?} must start with http:// or https:// (the control plane's gRPC \
                         address, e.g. https://envoy-gateway:18001)"
                    ),
                ));
            }
        };
        if uri.host().is_none_or(str::is_empty) {
            return Err(FieldError::new(
                "rls.xds.address",
                format!("{shown:?} has no host"),
            ));
        }
        if raw.node_id.trim().is_empty() {
            return Err(FieldError::new(
                "rls.xds.node_id",
                "must not be empty; the control plane keeps the rules under a node id (Envoy \
                 Gateway: envoy-ratelimit)",
            ));
        }
        let files = raw.files();
        let settings = Self {
            address: ConfiguredUrl::parse(
                &raw.address,
                "the control plane is authenticated by TLS: ca_file, cert_file and key_file",
            )
            .map_err(|e| e.within("rls.xds.address"))?,
            node_id: raw.node_id,
            cluster: raw.cluster.filter(|c| !c.is_empty()),
            files: relative_files(files, base),
            tls,
        };
        if !tls {
            let files = &settings.files;
            for (field, given) in [
                ("ca_file", files.ca_file.is_some()),
                ("cert_file", files.cert_file.is_some()),
                ("key_file", files.key_file.is_some()),
            ] {
                if given {
                    return Err(FieldError::new(
                        format!("rls.xds.{field}"),
                        format!(
                            "given, but the address {} is plain http://; use https:// to reach \
                             the control plane over TLS",
                            settings.address
                        ),
                    ));
                }
            }
        }
        check_client_files(&settings.files, "rls.xds")?;
        Ok(settings)
    }

    /// The channel's TLS settings, `None` for `http://`.
    pub(super) fn client_tls(
        &self,
    ) -> Result<Option<tonic::transport::ClientTlsConfig>, FieldError> {
        if !self.tls() {
            return Ok(None);
        }
        let read = |p: &Path, field: &str| {
            std::fs::read(p).map_err(|e| {
                FieldError::new(
                    format!("rls.xds.{field}"),
                    format!("cannot read {}: {e}", p.display()),
                )
            })
        };
        let mut config = tonic::transport::ClientTlsConfig::new();
        config = match &self.files.ca_file {
            Some(ca) => config.ca_certificate(tonic::transport::Certificate::from_pem(read(
                ca, "ca_file",
            )?)),
            None => config.with_native_roots(),
        };
        if let (Some(cert), Some(key)) = (&self.files.cert_file, &self.files.key_file) {
            config = config.identity(tonic::transport::Identity::from_pem(
                read(cert, "cert_file")?,
                read(key, "key_file")?,
            ));
        }
        Ok(Some(config))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(address: &str, node_id: &str) -> RawXds {
        RawXds {
            address: address.into(),
            node_id: node_id.into(),
            cluster: None,
            ca_file: None,
            cert_file: None,
            key_file: None,
        }
    }

    #[test]
    fn addresses_and_node_ids_are_checked() {
        let ok =
            XdsSettings::resolve(raw("http://127.0.0.1:18001", "envoy-ratelimit"), None).unwrap();
        assert!(!ok.tls());
        assert!(
            XdsSettings::resolve(raw("https://envoy-gateway:18001", "n"), None)
                .unwrap()
                .tls()
        );
        let err = XdsSettings::resolve(raw("envoy-gateway:18001", "n"), None)
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("rls.xds.address:"), "{err}");
        let err = XdsSettings::resolve(raw("grpc://envoy-gateway:18001", "n"), None)
            .unwrap_err()
            .to_string();
        assert!(err.contains("http:// or https://"), "{err}");
        let err = XdsSettings::resolve(raw("http://h:1", " "), None)
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("rls.xds.node_id:"), "{err}");
        let mut with_ca = raw("http://h:1", "n");
        with_ca.ca_file = Some("ca.pem".into());
        let err = XdsSettings::resolve(with_ca, None).unwrap_err().to_string();
        assert!(err.starts_with("rls.xds.ca_file: given, but"), "{err}");
        let mut half = raw("https://h:1", "n");
        half.cert_file = Some("/nonexistent/cert.pem".into());
        let err = XdsSettings::resolve(half, None).unwrap_err().to_string();
        assert!(
            err.starts_with("rls.xds.cert_file: given without key_file"),
            "{err}"
        );
        // The scheme in any case, as the URL parser reads it: upper case keeps TLS.
        for address in ["HTTPS://envoy-gateway:18001", "Https://envoy-gateway:18001"] {
            let settings = XdsSettings::resolve(raw(address, "n"), None).unwrap();
            assert!(settings.tls(), "{address}");
            assert!(settings.client_tls().unwrap().is_some(), "{address}");
        }
        assert!(
            !XdsSettings::resolve(raw("HTTP://h:1", "n"), None)
                .unwrap()
                .tls()
        );
        let mut missing = raw("https://h:1", "n");
        missing.cert_file = Some("/nonexistent/cert.pem".into());
        missing.key_file = Some("/nonexistent/key.pem".into());
        let err = XdsSettings::resolve(missing, None).unwrap_err().to_string();
        assert!(err.starts_with("rls.xds.cert_file: cannot read"), "{err}");
    }
}
