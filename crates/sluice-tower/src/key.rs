//! Who a request is: the rate-limit key, taken from the request's head.
//!
//! An extractor sees [`http::request::Parts`] (method, URI, headers, extensions), never the
//! body: a key must be known before the request is admitted, and reading the body first
//! would let an unlimited client make the server buffer it. Working on `Parts` also keeps the
//! layer's types free of the request body type, so one layer value fits any body.

use std::borrow::Cow;
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use http::HeaderName;
use http::request::Parts;

type KeyFn = dyn Fn(&Parts) -> Option<String> + Send + Sync;

/// Finds the rate-limit key of a request, or reports that it has none.
///
/// Ready-made: [`KeyExtractor::header`] (an API key, a user id set by a gateway),
/// [`KeyExtractor::peer_ip`] (the client's address), [`KeyExtractor::extension`] (an
/// authenticated user put in the request's extensions by an earlier layer), and
/// [`KeyExtractor::from_fn`] for anything else. Cloning is cheap.
///
/// A key must be 1 to 512 bytes ([`sluice::MAX_KEY_LEN`]); a request whose extractor finds
/// nothing, or a key out of that range, is handled as the layer is configured: refused with
/// 400 (the default; the problem body says what was expected) or counted under a fallback key
/// ([`RateLimitLayer::fallback_key`](crate::RateLimitLayer::fallback_key)).
#[derive(Clone)]
pub struct KeyExtractor {
    kind: Kind,
    /// What the key is, for the 400 body: "the `x-api-key` header".
    what: Cow<'static, str>,
}

#[derive(Clone)]
enum Kind {
    Header(HeaderName),
    PeerIp,
    Fn(Arc<KeyFn>),
}

impl KeyExtractor {
    /// The value of header `name` (the first one if repeated), which must be visible ASCII.
    ///
    /// # Panics
    ///
    /// If `name` is not a valid header name (letters may be of either case). Use
    /// [`KeyExtractor::header_name`] for a name known only at run time.
    pub fn header(name: &str) -> Self {
        match HeaderName::from_bytes(name.as_bytes()) {
            Ok(header) => Self::header_name(header),
            Err(_) => panic!("KeyExtractor::header: `{name}` is not a valid HTTP header name"),
        }
    }

    /// The value of header `name` (the first one if repeated), which must be visible ASCII.
    pub fn header_name(name: HeaderName) -> Self {
        Self {
            what: Cow::Owned(format!("the `{name}` header")),
            kind: Kind::Header(name),
        }
    }

    /// The client's IP address (the peer of the connection), e.g. `203.0.113.7` or `2001:db8::1`;
    /// an IPv4-mapped IPv6 address is written as IPv4.
    ///
    /// Read from the request's extensions: axum's `ConnectInfo<SocketAddr>` (serve with
    /// `into_make_service_with_connect_info::<SocketAddr>()`; needs the `axum` feature, on by
    /// default), else a plain [`SocketAddr`] or [`IpAddr`] extension (insert one in your hyper
    /// accept loop). Behind a reverse proxy the peer is the proxy: take the client address from
    /// the proxy's header with [`KeyExtractor::header`] or [`KeyExtractor::from_fn`] instead,
    /// trusting only what your proxy sets.
    pub fn peer_ip() -> Self {
        Self {
            kind: Kind::PeerIp,
            what: Cow::Borrowed(
                "the client's IP address (a `ConnectInfo<SocketAddr>`, `SocketAddr` or `IpAddr` request extension)",
            ),
        }
    }

    /// A key made from the request extension of type `T`, e.g. the user an authentication
    /// layer inserted: `KeyExtractor::extension(|user: &User| user.id.to_string())`.
    pub fn extension<T, F>(f: F) -> Self
    where
        T: Send + Sync + 'static,
        F: Fn(&T) -> String + Send + Sync + 'static,
    {
        Self {
            kind: Kind::Fn(Arc::new(move |parts: &Parts| {
                parts.extensions.get::<T>().map(&f)
            })),
            what: Cow::Owned(format!(
                "the `{}` request extension",
                short_type_name::<T>()
            )),
        }
    }

    /// Any function of the request's head; `None` means the request has no key. Name what it
    /// reads with [`KeyExtractor::described_as`] so that a refusal can say what was missing.
    pub fn from_fn<F>(f: F) -> Self
    where
        F: Fn(&Parts) -> Option<String> + Send + Sync + 'static,
    {
        Self {
            kind: Kind::Fn(Arc::new(f)),
            what: Cow::Borrowed("a rate-limit key"),
        }
    }

    /// The same extractor, described as `what` in the 400 problem body ("the request has no
    /// {what}"), e.g. `"a session cookie"`.
    pub fn described_as(mut self, what: impl Into<Cow<'static, str>>) -> Self {
        self.what = what.into();
        self
    }

    /// What this extractor reads, as a refusal names it (e.g. "the `x-api-key` header").
    pub fn description(&self) -> &str {
        &self.what
    }

    /// The key of a request, or `None` if it has none.
    pub fn extract(&self, parts: &Parts) -> Option<String> {
        match &self.kind {
            Kind::Header(name) => parts
                .headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned),
            Kind::PeerIp => peer_ip(parts).map(|ip| ip.to_string()),
            Kind::Fn(f) => f(parts),
        }
    }
}

impl fmt::Debug for KeyExtractor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyExtractor")
            .field("what", &self.what)
            .finish_non_exhaustive()
    }
}

/// The peer's address from the request's extensions, canonical (IPv4-mapped IPv6 as IPv4).
fn peer_ip(parts: &Parts) -> Option<IpAddr> {
    let ext = &parts.extensions;
    #[cfg(feature = "axum")]
    if let Some(axum::extract::ConnectInfo(addr)) =
        ext.get::<axum::extract::ConnectInfo<SocketAddr>>()
    {
        return Some(addr.ip().to_canonical());
    }
    ext.get::<SocketAddr>()
        .map(SocketAddr::ip)
        .or_else(|| ext.get::<IpAddr>().copied())
        .map(|ip| ip.to_canonical())
}

/// `my_app::User` → `User`.
fn short_type_name<T>() -> &'static str {
    let full = std::any::type_name::<T>();
    let base = full.split('<').next().unwrap_or(full);
    base.rsplit("::").next().unwrap_or(base)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn parts(build: impl FnOnce(http::request::Builder) -> http::request::Builder) -> Parts {
        build(http::Request::builder())
            .body(())
            .unwrap()
            .into_parts()
            .0
    }

    #[test]
    fn header_reads_the_first_value_and_accepts_any_case_in_the_name() {
        let key = KeyExtractor::header("X-Api-Key");
        let p = parts(|b| b.header("x-api-key", "k1").header("x-api-key", "k2"));
        assert_eq!(key.extract(&p).as_deref(), Some("k1"));
        assert_eq!(key.extract(&parts(|b| b)), None);
        assert_eq!(key.description(), "the `x-api-key` header");
    }

    #[test]
    fn header_values_that_are_not_visible_ascii_are_no_key() {
        let key = KeyExtractor::header("x-api-key");
        let p = parts(|b| b.header("x-api-key", &b"caf\xc3\xa9"[..]));
        assert_eq!(key.extract(&p), None);
    }

    #[test]
    #[should_panic(expected = "not a valid HTTP header name")]
    fn an_invalid_header_name_panics_at_construction() {
        let _ = KeyExtractor::header("x api key");
    }

    #[cfg(feature = "axum")]
    #[test]
    fn peer_ip_reads_axum_connect_info_and_unmaps_ipv4() {
        let key = KeyExtractor::peer_ip();
        let addr: SocketAddr = "[::ffff:192.0.2.1]:4000".parse().unwrap();
        let mut p = parts(|b| b);
        p.extensions.insert(axum::extract::ConnectInfo(addr));
        assert_eq!(key.extract(&p).as_deref(), Some("192.0.2.1"));
    }

    #[test]
    fn peer_ip_reads_a_socket_addr_or_ip_extension() {
        let key = KeyExtractor::peer_ip();
        let mut p = parts(|b| b);
        p.extensions
            .insert("[2001:db8::1]:80".parse::<SocketAddr>().unwrap());
        assert_eq!(key.extract(&p).as_deref(), Some("2001:db8::1"));

        let mut p = parts(|b| b);
        p.extensions
            .insert("198.51.100.9".parse::<IpAddr>().unwrap());
        assert_eq!(key.extract(&p).as_deref(), Some("198.51.100.9"));

        assert_eq!(key.extract(&parts(|b| b)), None);
    }

    #[derive(Clone)]
    struct User {
        id: u64,
    }

    #[test]
    fn extension_maps_the_typed_extension_and_names_its_type() {
        let key = KeyExtractor::extension(|u: &User| format!("user:{}", u.id));
        let mut p = parts(|b| b);
        p.extensions.insert(User { id: 42 });
        assert_eq!(key.extract(&p).as_deref(), Some("user:42"));
        assert_eq!(key.extract(&parts(|b| b)), None);
        assert_eq!(key.description(), "the `User` request extension");
    }

    #[test]
    fn from_fn_uses_the_closure_and_its_description() {
        let key = KeyExtractor::from_fn(|p: &Parts| p.uri.query().map(str::to_owned))
            .described_as("a query string");
        assert_eq!(
            key.extract(&parts(|b| b.uri("/x?abc"))).as_deref(),
            Some("abc")
        );
        assert_eq!(key.description(), "a query string");
    }
}
