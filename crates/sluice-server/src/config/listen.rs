//! The `listen` section: the addresses, and what a connection may hold.

use std::fmt;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use serde::Deserialize;
use serde::de::{self, Deserializer};
use sluice_spec::FieldError;
use sluice_spec::units::PositiveDuration;

use super::{DEFAULT_GRPC, DEFAULT_HTTP};

/// A listen address as written: `IP:port`. A port alone or a host name is refused with what
/// to write instead: which interfaces to expose is a decision to state, not to guess.
pub(super) struct ListenAddr(pub(super) SocketAddr);

impl ListenAddr {
    pub(super) fn parse(text: &str) -> Result<Self, FieldError> {
        if let Ok(addr) = text.trim().parse() {
            return Ok(Self(addr));
        }
        let port = text.trim().trim_start_matches(':');
        if port.parse::<u16>().is_ok() {
            return Err(FieldError::whole(format!(
                "`{text}` is a port alone; write IP:port: 127.0.0.1:{port} (this machine only) \
                 or 0.0.0.0:{port} (every interface; [::]:{port} for IPv6 too)"
            )));
        }
        if let Some((host, port)) = text.trim().rsplit_once(':')
            && port.parse::<u16>().is_ok()
        {
            let instead = if host == "localhost" {
                format!("127.0.0.1:{port} (or [::1]:{port})")
            } else {
                format!("the IP address {host} stands for, e.g. 10.0.0.5:{port}")
            };
            return Err(FieldError::whole(format!(
                "`{text}` names a host; a listener binds an IP address, not a name: write \
                 {instead}, or 0.0.0.0:{port} for every interface"
            )));
        }
        Err(FieldError::whole(format!(
            "`{text}` is not a socket address; write IP:port, e.g. 127.0.0.1:8080, \
             0.0.0.0:8080 or [::]:8080"
        )))
    }
}

impl<'de> Deserialize<'de> for ListenAddr {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl de::Visitor<'_> for V {
            type Value = ListenAddr;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an address such as 127.0.0.1:8080")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<ListenAddr, E> {
                ListenAddr::parse(v).map_err(E::custom)
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<ListenAddr, E> {
                ListenAddr::parse(&v.to_string()).map_err(E::custom)
            }
        }
        d.deserialize_any(V)
    }
}

#[derive(Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
pub(super) struct RawListen {
    pub(super) http: Option<ListenAddr>,
    pub(super) grpc: Option<ListenAddr>,
    pub(super) admin: Option<ListenAddr>,
    pub(super) tls: Option<crate::tls::ListenTls>,
    pub(super) header_timeout: Option<PositiveDuration>,
    pub(super) body_timeout: Option<PositiveDuration>,
    pub(super) idle_timeout: Option<PositiveDuration>,
    pub(super) max_connections: Option<usize>,
}

/// The `listen` section, checked.
pub(super) struct Listen {
    pub(super) http: SocketAddr,
    pub(super) grpc: SocketAddr,
    pub(super) admin: Option<SocketAddr>,
    pub(super) tls: Option<crate::tls::ListenTls>,
    pub(super) connections: crate::conn::ConnLimits,
}

/// The addresses (the defaults where none is given, each its own port), the bounds of a
/// connection and the certificates (paths relative to `base`).
pub(super) fn listen_config(
    raw: RawListen,
    reporting_interval: Option<Duration>,
    base: Option<&Path>,
) -> Result<Listen, FieldError> {
    let connections = conn_limits(&raw, reporting_interval)?;
    let http = raw.http.map_or(DEFAULT_HTTP, |a| a.0);
    let grpc = raw.grpc.map_or(DEFAULT_GRPC, |a| a.0);
    let admin = raw.admin.as_ref().map(|a| a.0);
    check_listen(http, grpc, admin)?;
    let tls = raw.tls.map(|t| t.resolve(base)).transpose()?;
    Ok(Listen {
        http,
        grpc,
        admin,
        tls,
        connections,
    })
}

/// Each listener needs its own port (port 0 asks for a free one, so it never clashes).
pub(super) fn check_listen(
    http: SocketAddr,
    grpc: SocketAddr,
    admin_http: Option<SocketAddr>,
) -> Result<(), FieldError> {
    let clash = |a: SocketAddr, b: SocketAddr| a.port() != 0 && a == b;
    if clash(http, grpc) {
        return Err(FieldError::new(
            "listen",
            format!("http and grpc are both {http}; give each its own port"),
        ));
    }
    if let Some(admin) = admin_http
        && (clash(admin, http) || clash(admin, grpc))
    {
        return Err(FieldError::new(
            "listen.admin",
            format!(
                "{admin} is also the http or grpc address; the admin listener needs its own port"
            ),
        ));
    }
    Ok(())
}

/// `listen.header_timeout` and the other bounds of a connection. An Envoy's RLQS stream is
/// silent between two reports, so with `rlqs` the idle timeout defaults to at least three
/// reporting intervals, and one given must be longer than an interval.
pub(super) fn conn_limits(
    raw: &RawListen,
    reporting_interval: Option<Duration>,
) -> Result<crate::conn::ConnLimits, FieldError> {
    let defaults = crate::conn::ConnLimits::default();
    let text =
        |d: Duration| sluice::core::duration_text(u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    let idle_timeout = match (raw.idle_timeout, reporting_interval) {
        (None, None) => defaults.idle_timeout,
        (None, Some(interval)) => defaults.idle_timeout.max(interval.saturating_mul(3)),
        (Some(idle), Some(interval)) if idle.0 <= interval => {
            return Err(FieldError::new(
                "listen.idle_timeout",
                format!(
                    "{} is not longer than rlqs.reporting_interval ({}); an Envoy's quota \
                     stream is silent between two reports and would be closed",
                    text(idle.0),
                    text(interval)
                ),
            ));
        }
        (Some(idle), _) => idle.0,
    };
    let max_connections = match raw.max_connections {
        None => defaults.max_connections,
        Some(0) => {
            return Err(FieldError::new(
                "listen.max_connections",
                "0 would accept nothing; give at least 1",
            ));
        }
        Some(n) if n > crate::conn::MAX_CONNECTIONS => {
            return Err(FieldError::new(
                "listen.max_connections",
                format!(
                    "{n} is more than {} (each open connection holds a file descriptor and \
                     memory)",
                    crate::conn::MAX_CONNECTIONS
                ),
            ));
        }
        Some(n) => n,
    };
    Ok(crate::conn::ConnLimits {
        header_timeout: raw.header_timeout.map_or(defaults.header_timeout, |d| d.0),
        body_timeout: raw.body_timeout.map_or(defaults.body_timeout, |d| d.0),
        idle_timeout,
        max_connections,
    })
}
