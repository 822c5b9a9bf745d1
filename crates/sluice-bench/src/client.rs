//! How `sluice check` and `sluice bench` reach a server: over `http://` or `https://` (rustls,
//! the ring provider, as the server), trusting the system's roots or only the CAs of
//! `--cacert`, with an optional admin bearer token taken from a flag, a file or an
//! environment variable, as the server takes its own (docs/configuration.md#admin).

use std::path::{Path, PathBuf};

use clap::Args;

use crate::Error;

/// The options of a client of the server (`sluice check`, `sluice bench`).
#[derive(Clone, Default, Args)]
pub struct ClientArgs {
    /// Trust only the CA certificates in this PEM file for `https://` (and a gRPC `https://`)
    /// URLs, instead of the system's roots: e.g. the CA that signed `listen.tls.cert_file`.
    #[arg(long, value_name = "FILE")]
    pub cacert: Option<PathBuf>,
    /// An admin bearer token, sent as `Authorization: Bearer <token>` with every HTTP request.
    /// A flag is visible to other users of the machine: prefer --token-file or --token-env.
    #[arg(long, value_name = "TOKEN", group = "token_source")]
    pub token: Option<String>,
    /// Read the token from this file: its first line that is neither blank nor a `#` comment
    /// (the format of the server's `admin.tokens_file`).
    #[arg(long, value_name = "FILE", group = "token_source")]
    pub token_file: Option<PathBuf>,
    /// Read the token from this environment variable (the first of comma-separated tokens,
    /// the format of the server's `admin.tokens_env`).
    #[arg(long, value_name = "VAR", group = "token_source")]
    pub token_env: Option<String>,
}

// A token must never reach a log: the Debug of the options says only whether there is one.
impl std::fmt::Debug for ClientArgs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientArgs")
            .field("cacert", &self.cacert)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("token_file", &self.token_file)
            .field("token_env", &self.token_env)
            .finish()
    }
}

impl ClientArgs {
    /// The token, from whichever of `--token`, `--token-file`, `--token-env` was given.
    pub fn token(&self) -> Result<Option<String>, Error> {
        if let Some(t) = &self.token {
            return Ok(Some(non_empty(t.trim(), "--token")?.to_owned()));
        }
        if let Some(path) = &self.token_file {
            let text = std::fs::read_to_string(path)
                .map_err(|e| Error::read(format!("--token-file {}", path.display()), e))?;
            let first = text
                .lines()
                .map(str::trim)
                .find(|l| !l.is_empty() && !l.starts_with('#'));
            return match first {
                Some(t) => Ok(Some(t.to_owned())),
                None => Err(Error::Option(format!(
                    "--token-file {}: holds no token (only blank lines and # comments)",
                    path.display()
                ))),
            };
        }
        if let Some(var) = &self.token_env {
            let value = std::env::var(var).map_err(|_| {
                Error::Option(format!("--token-env {var}: the variable is not set"))
            })?;
            let first = value.split(',').map(str::trim).find(|t| !t.is_empty());
            return match first {
                Some(t) => Ok(Some(t.to_owned())),
                None => Err(Error::Option(format!(
                    "--token-env {var}: the variable holds no token"
                ))),
            };
        }
        Ok(None)
    }

    /// The CA certificates of `--cacert`, as PEM bytes checked to hold at least one.
    fn ca_pem(&self) -> Result<Option<(Vec<u8>, &Path)>, Error> {
        let Some(path) = &self.cacert else {
            return Ok(None);
        };
        let pem = std::fs::read(path)
            .map_err(|e| Error::read(format!("--cacert {}", path.display()), e))?;
        Ok(Some((pem, path)))
    }

    /// An HTTP client for `http://` and `https://` URLs, trusting `--cacert` only when given,
    /// sending the token (if any) with every request.
    pub fn http(&self) -> Result<reqwest::Client, Error> {
        let mut builder = reqwest::Client::builder().use_rustls_tls();
        if let Some((pem, path)) = self.ca_pem()? {
            let certs = reqwest::Certificate::from_pem_bundle(&pem).map_err(|e| Error::Http {
                what: format!("--cacert {}: not PEM certificates", path.display()),
                source: e,
            })?;
            if certs.is_empty() {
                let what = format!("--cacert {}: holds no PEM certificate", path.display());
                return Err(Error::Option(what));
            }
            builder = builder.tls_built_in_root_certs(false);
            for cert in certs {
                builder = builder.add_root_certificate(cert);
            }
        }
        if let Some(token) = self.token()? {
            let mut value = reqwest::header::HeaderValue::from_str(&format!("Bearer {token}"))
                .map_err(|_| Error::Option("the token holds a character a header cannot".into()))?;
            value.set_sensitive(true);
            let mut headers = reqwest::header::HeaderMap::new();
            headers.insert(reqwest::header::AUTHORIZATION, value);
            builder = builder.default_headers(headers);
        }
        builder.build().map_err(|e| Error::Http {
            what: "cannot build the HTTP client".into(),
            source: e,
        })
    }

    /// A gRPC channel to `url` (`http://` or `https://`, trusting `--cacert` only when given).
    pub async fn grpc(&self, url: &str) -> Result<tonic::transport::Channel, Error> {
        use tonic::transport::{Certificate, ClientTlsConfig, Endpoint};
        let grpc = |what: String| move |source| Error::Grpc { what, source };
        let mut endpoint = Endpoint::from_shared(url.to_owned())
            .map_err(grpc(format!("`{url}` is not a gRPC URL")))?;
        if url.starts_with("https://") {
            let tls = match self.ca_pem()? {
                Some((pem, _)) => ClientTlsConfig::new().ca_certificate(Certificate::from_pem(pem)),
                None => ClientTlsConfig::new().with_native_roots(),
            };
            endpoint = endpoint
                .tls_config(tls)
                .map_err(grpc("cannot configure TLS for the gRPC client".into()))?;
        }
        endpoint
            .connect()
            .await
            .map_err(grpc(format!("cannot reach the gRPC server at {url}")))
    }
}

/// An error and its causes on one line (`connection refused`, `invalid peer certificate:
/// UnknownIssuer`), which reqwest's own message leaves out.
pub fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let next = s.to_string();
        if !text.contains(&next) {
            text.push_str(": ");
            text.push_str(&next);
        }
        source = s.source();
    }
    text
}

fn non_empty<'a>(t: &'a str, flag: &str) -> Result<&'a str, Error> {
    if t.is_empty() {
        return Err(Error::Option(format!("{flag}: the token is empty")));
    }
    Ok(t)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn with_file(text: &str) -> (tempfile::TempDir, ClientArgs) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        std::fs::write(&path, text).unwrap();
        let args = ClientArgs {
            token_file: Some(path),
            ..ClientArgs::default()
        };
        (dir, args)
    }

    #[test]
    fn a_token_comes_from_a_flag_a_file_or_a_variable() {
        let flag = ClientArgs {
            token: Some(" t0ken-from-flag ".into()),
            ..ClientArgs::default()
        };
        assert_eq!(flag.token().unwrap().as_deref(), Some("t0ken-from-flag"));
        let (_dir, file) = with_file("# ops\n\n  t0ken-from-file  \nsecond\n");
        assert_eq!(file.token().unwrap().as_deref(), Some("t0ken-from-file"));
        // A variable no one sets: the error names it.
        let var = format!("SLUICE_TEST_TOKEN_{}", std::process::id());
        let env = ClientArgs {
            token_env: Some(var.clone()),
            ..ClientArgs::default()
        };
        let e = env.token().unwrap_err().to_string();
        assert!(e.contains(&var) && e.contains("not set"), "{e}");
        assert_eq!(ClientArgs::default().token().unwrap(), None);
    }

    #[test]
    fn a_token_source_without_a_token_is_an_error_naming_it() {
        let (_dir, file) = with_file("# only a comment\n\n");
        let e = file.token().unwrap_err().to_string();
        assert!(e.contains("--token-file") && e.contains("no token"), "{e}");
        let missing = ClientArgs {
            token_file: Some("/nonexistent/token".into()),
            ..ClientArgs::default()
        };
        let e = format!("{:#}", missing.token().unwrap_err());
        assert!(e.contains("/nonexistent/token"), "{e}");
        let empty = ClientArgs {
            token: Some("  ".into()),
            ..ClientArgs::default()
        };
        assert!(empty.token().unwrap_err().to_string().contains("empty"));
    }

    #[test]
    fn the_debug_of_the_options_never_shows_the_token() {
        let args = ClientArgs {
            token: Some("t0ken-never-shown".into()),
            ..ClientArgs::default()
        };
        let shown = format!("{args:?}");
        assert!(!shown.contains("t0ken-never-shown"), "{shown}");
        assert!(shown.contains("redacted"), "{shown}");
    }

    #[test]
    fn a_cacert_that_is_not_a_certificate_is_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ca.crt");
        std::fs::write(&path, "not a certificate\n").unwrap();
        let args = ClientArgs {
            cacert: Some(path.clone()),
            ..ClientArgs::default()
        };
        let e = format!("{:#}", args.http().unwrap_err());
        assert!(
            e.contains("--cacert") && e.contains(path.to_str().unwrap()),
            "{e}"
        );
    }

    /// What the client sends, read off a socket: the token as a bearer credential.
    #[tokio::test]
    async fn the_token_is_sent_as_a_bearer_credential() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (_dir, args) = with_file("t0ken-0123456789abcdef\n");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/v1/check", listener.local_addr().unwrap());
        let server = tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut seen = Vec::new();
            let mut buf = [0u8; 4096];
            while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
                let n = socket.read(&mut buf).await.unwrap();
                assert!(n > 0, "the client closed early");
                seen.extend_from_slice(&buf[..n]);
            }
            socket
                .write_all(b"HTTP/1.1 204 No Content\r\nconnection: close\r\n\r\n")
                .await
                .unwrap();
            String::from_utf8(seen).unwrap()
        });
        let client = args.http().unwrap();
        let r = client.get(&url).send().await.unwrap();
        assert_eq!(r.status(), 204);
        let request = server.await.unwrap().to_ascii_lowercase();
        assert!(
            request.contains("\r\nauthorization: bearer t0ken-0123456789abcdef\r\n"),
            "{request}"
        );
    }
}
