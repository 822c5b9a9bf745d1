//! The admin surface: what changes or reveals state (refund, forgetting a key, the policy
//! list, and `/metrics` unless opened) answers only to a bearer token from the `admin` section.
//!
//! Tokens come from a file (one per line; blank lines and `#` comments ignored) or from an
//! environment variable (comma-separated), never from the configuration text itself, so the
//! file that holds the policies can be shared without the secrets. They are compared in
//! constant time ([`subtle`]), never logged, and the `Debug` of [`AdminConfig`] shows only
//! how many there are. The threat model is in docs/security.md.

use std::path::{Path, PathBuf};

use axum::http::HeaderMap;
use serde::Deserialize;
use sluice_spec::FieldError;
use subtle::ConstantTimeEq;

/// The shortest token accepted: 16 bytes, e.g. `openssl rand -hex 16` gives 32.
pub const MIN_TOKEN_LEN: usize = 16;

/// `admin:` as written.
#[derive(Debug, Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct RawAdmin {
    tokens_file: Option<PathBuf>,
    tokens_env: Option<String>,
    protect_metrics: Option<bool>,
}

/// Who may use the admin routes.
#[derive(Clone, PartialEq, Eq)]
pub struct AdminConfig {
    tokens: Vec<String>,
    /// `/metrics` needs a token too (`admin.protect_metrics`, on unless set to `false`: the
    /// metrics name every policy and its limits, which `/v1/policies` keeps to tokens).
    pub protect_metrics: bool,
}

impl std::fmt::Debug for AdminConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdminConfig")
            .field("tokens", &format_args!("<{} redacted>", self.tokens.len()))
            .field("protect_metrics", &self.protect_metrics)
            .finish()
    }
}

impl AdminConfig {
    /// Reads the tokens `raw` points at; a relative `tokens_file` is relative to `base`.
    pub(crate) fn resolve(raw: RawAdmin, base: Option<&Path>) -> Result<Self, FieldError> {
        let secret = super::Secret {
            at: "admin",
            file: ("tokens_file", raw.tokens_file.clone()),
            env: ("tokens_env", raw.tokens_env.clone()),
            neither: "give exactly one of tokens_file (one token per line) and tokens_env (the \
                      name of a variable holding comma-separated tokens)",
        };
        let text = secret.read(base)?;
        let separator = if raw.tokens_env.is_some() { ',' } else { '\n' };
        let tokens: Vec<String> = text
            .split(separator)
            .map(str::trim)
            .filter(|t| !t.is_empty() && !t.starts_with('#'))
            .map(str::to_owned)
            .collect();
        if tokens.is_empty() {
            return Err(FieldError::new("admin", "the token source holds no token"));
        }
        if let Some(i) = tokens.iter().position(|t| t.len() < MIN_TOKEN_LEN) {
            // Which one, never what it is.
            return Err(FieldError::new(
                "admin",
                format!(
                    "token {} is {} bytes; at least {MIN_TOKEN_LEN} (e.g. `openssl rand -hex 16`)",
                    i + 1,
                    tokens[i].len()
                ),
            ));
        }
        Ok(Self {
            tokens,
            protect_metrics: raw.protect_metrics.unwrap_or(true),
        })
    }

    /// Whether `headers` carry `Authorization: Bearer <one of the tokens>`, the scheme in any
    /// case (RFC 9110 §11.1: `bearer`, `BEARER`), read by the `headers` crate's typed
    /// `Authorization<Bearer>`. Every token is compared, in constant time, whatever matches
    /// first.
    pub fn allows(&self, headers: &HeaderMap) -> bool {
        use headers::HeaderMapExt as _;
        use headers::authorization::{Authorization, Bearer};
        let Some(credentials) = headers.typed_get::<Authorization<Bearer>>() else {
            return false;
        };
        let presented = credentials.token().trim().as_bytes();
        self.tokens
            .iter()
            .fold(subtle::Choice::from(0), |any, t| {
                any | t.as_bytes().ct_eq(presented)
            })
            .into()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use axum::http::{HeaderValue, header};

    fn config(tokens: &[&str]) -> AdminConfig {
        AdminConfig {
            tokens: tokens.iter().map(|t| (*t).to_owned()).collect(),
            protect_metrics: false,
        }
    }

    fn bearer(value: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::AUTHORIZATION, HeaderValue::from_str(value).unwrap());
        h
    }

    #[test]
    fn only_a_listed_bearer_token_is_allowed() {
        let c = config(&["0123456789abcdef", "fedcba9876543210"]);
        assert!(c.allows(&bearer("Bearer 0123456789abcdef")));
        assert!(c.allows(&bearer("Bearer fedcba9876543210")));
        assert!(!c.allows(&bearer("Bearer 0123456789abcde")));
        assert!(!c.allows(&bearer("Bearer 0123456789abcdef0")));
        assert!(!c.allows(&bearer("Basic 0123456789abcdef")));
        assert!(!c.allows(&bearer("0123456789abcdef")));
        assert!(!c.allows(&HeaderMap::new()));
    }

    /// RFC 9110 §11.1: the scheme is case-insensitive; `bearer <token>` got a 401.
    #[test]
    fn the_scheme_is_case_insensitive_and_spaces_around_the_token_are_not_part_of_it() {
        let c = config(&["0123456789abcdef"]);
        for ok in [
            "Bearer 0123456789abcdef",
            "bearer 0123456789abcdef",
            "BEARER 0123456789abcdef",
            "bEaReR 0123456789abcdef",
            "Bearer    0123456789abcdef",
            "Bearer 0123456789abcdef   ",
        ] {
            assert!(c.allows(&bearer(ok)), "{ok:?}");
        }
        for refused in [
            "Basic 0123456789abcdef",
            "Token 0123456789abcdef",
            "Bearer0123456789abcdef",
            "Bearers 0123456789abcdef",
            "Bearer",
            "Bearer ",
            "bearer 0123456789abcde",
            "bearer 0123456789ABCDEF",
        ] {
            assert!(!c.allows(&bearer(refused)), "{refused:?}");
        }
    }

    #[test]
    fn debug_never_shows_a_token() {
        let shown = format!("{:?}", config(&["0123456789abcdef"]));
        assert!(!shown.contains("0123456789abcdef"), "{shown}");
        assert!(shown.contains("<1 redacted>"), "{shown}");
    }

    #[test]
    fn tokens_come_from_a_file_and_short_ones_are_refused_without_being_shown() {
        let dir = std::env::temp_dir().join(format!("sluice-admin-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("tokens"),
            "# ops\n0123456789abcdef\n\nshort-secret\n",
        )
        .unwrap();
        let raw = || RawAdmin {
            tokens_file: Some(PathBuf::from("tokens")),
            tokens_env: None,
            protect_metrics: None,
        };
        let e = AdminConfig::resolve(raw(), Some(&dir))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("token 2 is 12 bytes") && !e.contains("short-secret"),
            "{e}"
        );
        std::fs::write(dir.join("tokens"), "0123456789abcdef\n").unwrap();
        let c = AdminConfig::resolve(raw(), Some(&dir)).unwrap();
        assert!(c.protect_metrics && c.allows(&bearer("Bearer 0123456789abcdef")));
        let neither = RawAdmin::default();
        assert!(
            AdminConfig::resolve(neither, None)
                .unwrap_err()
                .to_string()
                .contains("exactly one")
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
