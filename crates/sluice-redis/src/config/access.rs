//! How a store logs in and encrypts, and what it shows of a URL: [`Credentials`] (for URLs
//! that carry none), [`TlsFiles`] (certificates for `rediss://` URLs) and [`redact`].

use std::path::PathBuf;

/// The query parameters redis-rs reads as credentials: `unix://` (and `redis+unix://`,
/// `valkey+unix://`) URLs log in as `?user=` with `?pass=` (`url_to_unix_connection_info` in
/// redis-rs's `connection.rs`), where a TCP URL carries them as user information.
const CREDENTIAL_PARAMS: [&str; 2] = ["user", "pass"];

/// `url` without its credentials: the user information (`redis://user:secret@host:6379/0`
/// becomes `redis://host:6379/0`) and the `user` and `pass` query parameters
/// (`unix:///run/redis.sock?pass=secret` becomes `unix:///run/redis.sock`), however their
/// names are percent-encoded. What Sluice shows of a configured URL (shard names, metric
/// labels, logs, errors, `config check`; the OTLP endpoint and the xDS address too) goes
/// through this, so a password written in a URL never leaves it.
///
/// The rest of the text is kept as written, so a name stays the same across releases. A
/// URL that does not parse (a `#` or `?` in an unencoded password, say) loses everything
/// up to its last `@`, wherever that is.
pub fn redact(url: &str) -> String {
    let parses = url::Url::parse(url).is_ok();
    let (rest, fragment) = match url.find('#') {
        Some(i) if parses => url.split_at(i),
        _ => (url, ""),
    };
    let (base, query) = match rest.find('?') {
        Some(i) if parses => (&rest[..i], Some(&rest[i + 1..])),
        _ => (rest, None),
    };
    let mut shown = without_user_information(base, parses);
    if let Some(query) = query {
        let kept: Vec<&str> = query
            .split('&')
            .filter(|pair| {
                !url::form_urlencoded::parse(pair.as_bytes())
                    .next()
                    .is_some_and(|(name, _)| CREDENTIAL_PARAMS.contains(&name.as_ref()))
            })
            .collect();
        if !kept.is_empty() {
            shown.push('?');
            shown.push_str(&kept.join("&"));
        }
    }
    shown.push_str(fragment);
    shown
}

/// `url` without its user information: what comes between `://` and the last `@` of the
/// authority (of the whole text, when it did not parse).
fn without_user_information(url: &str, parses: bool) -> String {
    let Some(scheme_end) = url.find("://").map(|i| i + 3) else {
        return url.to_owned();
    };
    let rest = &url[scheme_end..];
    let authority_end = match rest.find('/') {
        Some(i) if parses => i,
        _ => rest.len(),
    };
    match rest[..authority_end].rfind('@') {
        Some(at) => format!("{}{}", &url[..scheme_end], &rest[at + 1..]),
        None => url.to_owned(),
    }
}

/// An ACL user and password (or, without a user, the `requirepass` password), for the nodes
/// whose URLs carry none: so the password can come from a file or an environment variable
/// instead of the URL. Its `Debug` never shows the password.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    username: Option<String>,
    password: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("username", &self.username)
            .field("password", &"<redacted>")
            .finish()
    }
}

impl Credentials {
    /// `username` (None: the default user) with `password`.
    pub fn new(username: Option<String>, password: impl Into<String>) -> Self {
        Self {
            username,
            password: password.into(),
        }
    }

    /// `url` logged in as this user, unless it already names one.
    pub(crate) fn apply(&self, url: &str) -> String {
        use percent_encoding::{NON_ALPHANUMERIC, utf8_percent_encode};
        let Some(scheme_end) = url.find("://").map(|i| i + 3) else {
            return url.to_owned();
        };
        if redact(url) != url {
            return url.to_owned();
        }
        if is_unix(url) {
            // A socket's URL carries its credentials as query parameters.
            let mut with = url::form_urlencoded::Serializer::new(String::new());
            if let Some(user) = &self.username {
                with.append_pair("user", user);
            }
            with.append_pair("pass", &self.password);
            let joint = if url.contains('?') { '&' } else { '?' };
            return format!("{url}{joint}{}", with.finish());
        }
        let user = self
            .username
            .as_deref()
            .map(|u| utf8_percent_encode(u, NON_ALPHANUMERIC).to_string())
            .unwrap_or_default();
        let password = utf8_percent_encode(&self.password, NON_ALPHANUMERIC);
        format!(
            "{}{user}:{password}@{}",
            &url[..scheme_end],
            &url[scheme_end..]
        )
    }
}

/// Whether `url` names a unix socket (redis-rs's `unix`, `redis+unix` and `valkey+unix`).
fn is_unix(url: &str) -> bool {
    url::Url::parse(url).is_ok_and(|u| u.scheme().ends_with("unix"))
}

/// Certificates for TLS towards Redis (`rediss://` URLs), as PEM files: the CA that signed
/// the servers' certificates and, when the servers require client certificates
/// (`tls-auth-clients yes`), this client's certificate and key. The server's name is the
/// URL's host.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct TlsFiles {
    /// The CA certificate(s) that signed the servers' certificates.
    pub ca_file: Option<PathBuf>,
    /// This client's certificate (with `key_file`).
    pub cert_file: Option<PathBuf>,
    /// This client's private key (with `cert_file`).
    pub key_file: Option<PathBuf>,
}

impl TlsFiles {
    /// Trusts `ca_file` for the servers' certificates.
    pub fn ca(ca_file: impl Into<PathBuf>) -> Self {
        Self {
            ca_file: Some(ca_file.into()),
            ..Self::default()
        }
    }

    /// Presents `cert_file` and `key_file` as this client's certificate.
    pub fn client(mut self, cert_file: impl Into<PathBuf>, key_file: impl Into<PathBuf>) -> Self {
        self.cert_file = Some(cert_file.into());
        self.key_file = Some(key_file.into());
        self
    }

    /// Reads the files into what the client takes; an error names the file.
    pub(crate) fn load(&self) -> Result<redis::TlsCertificates, String> {
        let read = |what: &str, path: &PathBuf| {
            std::fs::read(path)
                .map_err(|e| format!("tls.{what}: cannot read {}: {e}", path.display()))
        };
        let client_tls = match (&self.cert_file, &self.key_file) {
            (Some(cert), Some(key)) => Some(redis::ClientTlsConfig {
                client_cert: read("cert_file", cert)?,
                client_key: read("key_file", key)?,
            }),
            (None, None) => None,
            _ => return Err("tls: give both cert_file and key_file, or neither".to_owned()),
        };
        let root_cert = self
            .ca_file
            .as_ref()
            .map(|ca| read("ca_file", ca))
            .transpose()?;
        Ok(redis::TlsCertificates {
            client_tls,
            root_cert,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_go_into_urls_without_user_information_and_never_show() {
        let c = Credentials::new(Some("alice".to_owned()), "p@ss:w/rd");
        assert_eq!(
            c.apply("redis://h:6379/0"),
            "redis://alice:p%40ss%3Aw%2Frd@h:6379/0"
        );
        assert_eq!(c.apply("rediss://bob:x@h:6379"), "rediss://bob:x@h:6379");
        let default_user = Credentials::new(None, "pw");
        assert_eq!(default_user.apply("redis://h:6379"), "redis://:pw@h:6379");
        assert!(!format!("{c:?}").contains("p@ss"));
        assert_eq!(redact(&c.apply("redis://h:6379")), "redis://h:6379");
        let socket = c.apply("unix:///run/redis.sock?db=2");
        assert_eq!(
            socket,
            "unix:///run/redis.sock?db=2&user=alice&pass=p%40ss%3Aw%2Frd"
        );
        assert_eq!(redact(&socket), "unix:///run/redis.sock?db=2");
        assert_eq!(
            default_user.apply("redis+unix:///s.sock"),
            "redis+unix:///s.sock?pass=pw"
        );
    }

    #[test]
    fn every_credential_redis_reads_from_a_url_is_redacted() {
        for (url, shown) in [
            ("redis://alice:S3CRET@h:6379/0", "redis://h:6379/0"),
            (
                "rediss://:S3CRET@h:6380/#insecure",
                "rediss://h:6380/#insecure",
            ),
            (
                "unix:///run/redis.sock?pass=S3CRET",
                "unix:///run/redis.sock",
            ),
            ("unix:/run/redis.sock?pass=S3CRET", "unix:/run/redis.sock"),
            (
                "redis+unix:///run/redis.sock?db=1&user=alice&pass=S3CRET",
                "redis+unix:///run/redis.sock?db=1",
            ),
            (
                "valkey+unix:///s.sock?p%61ss=S3CRET&protocol=3",
                "valkey+unix:///s.sock?protocol=3",
            ),
            ("unix:///s.sock?db=0&pass=S3CRET#x", "unix:///s.sock?db=0#x"),
            // Unparseable: an unencoded `#` in the password.
            ("redis://:S3#CRET@h:6379", "redis://h:6379"),
            ("redis://h:6379/0?x=a@b", "redis://h:6379/0?x=a@b"),
        ] {
            assert_eq!(redact(url), shown, "{url}");
            assert!(!redact(url).contains("S3"), "{url}");
        }
    }
}
