//! Certificates for TLS tests: a throw-away CA, a server certificate for `localhost` and
//! `127.0.0.1`, and a client certificate, written as PEM files into a temporary directory
//! (generated with `rcgen`; nothing leaves the machine), and the `redis-server` arguments that
//! serve TLS with them.
//!
//! ```no_run
//! use sluice_testkit::{ServerOptions, TlsCerts};
//! let certs = TlsCerts::generate()?;
//! let server = ServerOptions::new().tls(&certs, true).start()?;
//! let url = server.tls_url(); // trusting certs.ca_file(), presenting certs.client_files()
//! # Ok::<(), sluice_testkit::Error>(())
//! ```

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

use crate::Error;

/// A CA, a server and a client certificate as PEM files; the directory goes when it drops.
#[derive(Debug)]
pub struct TlsCerts {
    dir: tempfile::TempDir,
}

fn err(what: &str, e: impl std::fmt::Display) -> Error {
    Error::InvalidArgument(format!("generating test certificates: {what}: {e}"))
}

impl TlsCerts {
    /// Generates the CA, then the server's and the client's certificates signed by it.
    pub fn generate() -> Result<Self, Error> {
        let dir = tempfile::tempdir().map_err(|e| err("temporary directory", e))?;
        let ca_key = KeyPair::generate().map_err(|e| err("CA key", e))?;
        let mut ca = CertificateParams::new(Vec::<String>::new()).map_err(|e| err("CA", e))?;
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name
            .push(DnType::CommonName, "sluice test CA");
        ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let ca_cert = ca.self_signed(&ca_key).map_err(|e| err("CA", e))?;
        let issuer = Issuer::new(ca, ca_key);
        let leaf = |names: Vec<String>, purposes: Vec<ExtendedKeyUsagePurpose>, stem: &str| {
            let key = KeyPair::generate().map_err(|e| err(stem, e))?;
            let mut params = CertificateParams::new(names).map_err(|e| err(stem, e))?;
            params.distinguished_name.push(DnType::CommonName, stem);
            params.extended_key_usages = purposes;
            let cert = params.signed_by(&key, &issuer).map_err(|e| err(stem, e))?;
            write(dir.path(), &format!("{stem}.crt"), &cert.pem())?;
            write(dir.path(), &format!("{stem}.key"), &key.serialize_pem())
        };
        write(dir.path(), "ca.crt", &ca_cert.pem())?;
        leaf(
            vec!["localhost".to_owned(), "127.0.0.1".to_owned()],
            // Also a client certificate: replicas, sentinels and cluster nodes present it
            // when they connect to one another over TLS.
            vec![
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ],
            "server",
        )?;
        leaf(vec![], vec![ExtendedKeyUsagePurpose::ClientAuth], "client")?;
        Ok(Self { dir })
    }

    /// The CA certificate that signed both.
    pub fn ca_file(&self) -> PathBuf {
        self.dir.path().join("ca.crt")
    }

    /// The server's certificate (for `localhost` and `127.0.0.1`) and key: for TLS listeners
    /// other than Redis.
    pub fn server_files(&self) -> (PathBuf, PathBuf) {
        (
            self.dir.path().join("server.crt"),
            self.dir.path().join("server.key"),
        )
    }

    /// The client's certificate and key.
    pub fn client_files(&self) -> (PathBuf, PathBuf) {
        (
            self.dir.path().join("client.crt"),
            self.dir.path().join("client.key"),
        )
    }

    /// The `redis-server` arguments of the certificate files (the server's certificate is
    /// also what a server presents when it connects to another over TLS, as a replica, a
    /// sentinel or a cluster node does) and `--tls-auth-clients`.
    pub(crate) fn file_args(&self, auth_clients: bool) -> Vec<String> {
        let path = |name: &str| self.dir.path().join(name).display().to_string();
        vec![
            "--tls-cert-file".to_owned(),
            path("server.crt"),
            "--tls-key-file".to_owned(),
            path("server.key"),
            "--tls-ca-cert-file".to_owned(),
            path("ca.crt"),
            "--tls-auth-clients".to_owned(),
            if auth_clients { "yes" } else { "no" }.to_owned(),
        ]
    }
}

fn write(dir: &Path, name: &str, pem: &str) -> Result<(), Error> {
    std::fs::write(dir.join(name), pem).map_err(|e| err(name, e))
}
