//! TLS on the server's own listeners (`listen.tls`): HTTP, gRPC and the admin listener answer
//! over TLS with one certificate chain and key, and with `client_ca_file` require a client
//! certificate signed by that CA (mutual TLS).
//!
//! rustls with the ring provider, as for Redis. The handshakes are made by the listeners' accept
//! loop ([`crate::conn`]), each in its own task and bounded by `listen.header_timeout`, so a
//! client that connects and says nothing holds only its own socket, never the accept loop. A
//! failed handshake is logged at debug level and dropped; the listener goes on.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde::Deserialize;

use sluice_redis::TlsFiles;
use sluice_spec::FieldError;

/// The certificate, key and optional client CA the listeners serve TLS with (`listen.tls`;
/// paths resolved once read).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListenTls {
    /// The server's certificate chain (PEM, leaf first).
    pub cert_file: PathBuf,
    /// The server's private key (PEM: PKCS#8, PKCS#1 or SEC1).
    pub key_file: PathBuf,
    /// When set, clients must present a certificate signed by one of these CAs (PEM).
    pub client_ca_file: Option<PathBuf>,
}

impl ListenTls {
    /// Resolves relative paths against `base` (the configuration file's directory) and checks
    /// that the files are there and hold what they should, so `sluice config check` finds a
    /// wrong path, not the first client.
    pub(crate) fn resolve(self, base: Option<&Path>) -> Result<Self, FieldError> {
        let at = |p: PathBuf| sluice_spec::relative_to(base, p);
        let tls = Self {
            cert_file: at(self.cert_file),
            key_file: at(self.key_file),
            client_ca_file: self.client_ca_file.map(at),
        };
        tls.rustls_config(&[])?;
        Ok(tls)
    }

    /// A rustls server configuration offering `alpn` (e.g. `h2` for gRPC); every error names
    /// the `listen.tls` field and file at fault.
    pub fn rustls_config(&self, alpn: &[&[u8]]) -> Result<Arc<rustls::ServerConfig>, FieldError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let chain = certificates(&self.cert_file, "listen.tls.cert_file")?;
        let key = PrivateKeyDer::from_pem_file(&self.key_file).map_err(|e| {
            FieldError::new(
                "listen.tls.key_file",
                format!("no private key in {}: {e}", self.key_file.display()),
            )
        })?;
        let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| FieldError::new("listen.tls", e.to_string()))?;
        let builder = match &self.client_ca_file {
            Some(file) => {
                let mut roots = rustls::RootCertStore::empty();
                for cert in certificates(file, "listen.tls.client_ca_file")? {
                    roots.add(cert).map_err(|e| {
                        FieldError::new(
                            "listen.tls.client_ca_file",
                            format!("{} holds an unusable CA: {e}", file.display()),
                        )
                    })?;
                }
                let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                    roots.into(),
                    provider,
                )
                .build()
                .map_err(|e| FieldError::new("listen.tls.client_ca_file", e.to_string()))?;
                builder.with_client_cert_verifier(verifier)
            }
            None => builder.with_no_client_auth(),
        };
        let mut config = builder.with_single_cert(chain, key).map_err(|e| {
            FieldError::new(
                "listen.tls",
                format!(
                    "the key in {} does not go with the certificate in {}: {e}",
                    self.key_file.display(),
                    self.cert_file.display()
                ),
            )
        })?;
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        Ok(Arc::new(config))
    }
}

/// Every certificate of a PEM file; none is an error naming the field at `path`.
pub(crate) fn certificates(
    file: &Path,
    path: &str,
) -> Result<Vec<CertificateDer<'static>>, FieldError> {
    let certs = CertificateDer::pem_file_iter(file)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| FieldError::new(path, format!("cannot read {}: {e}", file.display())))?;
    if certs.is_empty() {
        return Err(FieldError::new(
            path,
            format!("{} holds no PEM certificate", file.display()),
        ));
    }
    Ok(certs)
}

/// A client's certificates (`store.tls`, `rls.xds`) as the configuration means them: each
/// relative path relative to the configuration file's directory (`base`).
pub(crate) fn relative_files(mut files: TlsFiles, base: Option<&Path>) -> TlsFiles {
    for path in [
        &mut files.ca_file,
        &mut files.cert_file,
        &mut files.key_file,
    ] {
        *path = path.take().map(|p| sluice_spec::relative_to(base, p));
    }
    files
}

/// Reads a client's certificates, so that `sluice config check` finds a wrong path, not the
/// first connection: the CA holds certificates, and a client certificate comes with its key.
/// Errors name the field below `at` (`rls.xds.cert_file`).
pub(crate) fn check_client_files(files: &TlsFiles, at: &str) -> Result<(), FieldError> {
    if let Some(ca) = &files.ca_file {
        certificates(ca, &format!("{at}.ca_file"))?;
    }
    match (&files.cert_file, &files.key_file) {
        (None, None) => Ok(()),
        (Some(cert), Some(key)) => {
            certificates(cert, &format!("{at}.cert_file"))?;
            PrivateKeyDer::from_pem_file(key).map(drop).map_err(|e| {
                FieldError::new(
                    format!("{at}.key_file"),
                    format!("no private key in {}: {e}", key.display()),
                )
            })
        }
        (Some(_), None) => Err(FieldError::new(
            format!("{at}.cert_file"),
            "given without key_file; a client certificate needs its key",
        )),
        (None, Some(_)) => Err(FieldError::new(
            format!("{at}.key_file"),
            "given without cert_file; a client key needs its certificate",
        )),
    }
}
