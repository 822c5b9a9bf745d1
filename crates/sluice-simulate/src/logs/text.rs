//! Access log lines of fixed layouts: Nginx `combined` and `main`, Apache `common` and
//! `combined`, Envoy's default text format and Istio's. A line is split into `[…]`, `"…"` and
//! bare fields, and every field is checked against what it is named (an address, a number, a
//! time): a line of another layout is refused, never read with its fields shifted.

use std::net::IpAddr;

/// What a field must look like.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// Anything.
    Text,
    /// An IP address (v4 or v6).
    Addr,
    /// An IP address or a host name (Apache's `%h`).
    Host,
    /// An address with a port (`10.0.0.1:8080`, `[::1]:8080`), or `-`.
    AddrPort,
    /// `-`, or a list of IP addresses separated by commas (`X-Forwarded-For`).
    AddrList,
    /// A whole number, or `-`.
    Number,
    /// The request line: `GET /path HTTP/1.1`, or `-`, or empty.
    Request,
    /// `$time_local`: `10/Oct/2000:13:55:36 -0700`.
    CommonTime,
    /// RFC 3339: `2026-01-01T00:00:00.000Z`.
    Rfc3339,
}

type Fields = &'static [(&'static str, Kind)];

pub(crate) const NGINX_MAIN: Fields = &[
    ("remote_addr", Kind::Addr),
    ("-", Kind::Text),
    ("remote_user", Kind::Text),
    ("time_local", Kind::CommonTime),
    ("request", Kind::Request),
    ("status", Kind::Number),
    ("body_bytes_sent", Kind::Number),
    ("http_referer", Kind::Text),
    ("http_user_agent", Kind::Text),
    ("http_x_forwarded_for", Kind::AddrList),
];

/// nginx's `combined`: `main` without `$http_x_forwarded_for`.
pub(crate) const NGINX_COMBINED: Fields = NGINX_MAIN.split_at(9).0;

pub(crate) const APACHE_COMBINED: Fields = &[
    ("remote_host", Kind::Host),
    ("remote_logname", Kind::Text),
    ("remote_user", Kind::Text),
    ("time", Kind::CommonTime),
    ("request", Kind::Request),
    ("status", Kind::Number),
    ("bytes", Kind::Number),
    ("referer", Kind::Text),
    ("user_agent", Kind::Text),
];

/// Apache's common log format: the combined one without the referer and the user agent.
pub(crate) const APACHE_COMMON: Fields = APACHE_COMBINED.split_at(7).0;

pub(crate) const ENVOY: Fields = &[
    ("start_time", Kind::Rfc3339),
    ("request", Kind::Request),
    ("response_code", Kind::Number),
    ("response_flags", Kind::Text),
    ("bytes_received", Kind::Number),
    ("bytes_sent", Kind::Number),
    ("duration", Kind::Number),
    ("upstream_service_time", Kind::Number),
    ("x_forwarded_for", Kind::AddrList),
    ("user_agent", Kind::Text),
    ("request_id", Kind::Text),
    ("authority", Kind::Text),
    ("upstream_host", Kind::AddrPort),
];

pub(crate) const ISTIO: Fields = &[
    ("start_time", Kind::Rfc3339),
    ("request", Kind::Request),
    ("response_code", Kind::Number),
    ("response_flags", Kind::Text),
    ("response_code_details", Kind::Text),
    ("connection_termination_details", Kind::Text),
    ("upstream_transport_failure_reason", Kind::Text),
    ("bytes_received", Kind::Number),
    ("bytes_sent", Kind::Number),
    ("duration", Kind::Number),
    ("upstream_service_time", Kind::Number),
    ("x_forwarded_for", Kind::AddrList),
    ("user_agent", Kind::Text),
    ("request_id", Kind::Text),
    ("authority", Kind::Text),
    ("upstream_host", Kind::AddrPort),
    ("upstream_cluster", Kind::Text),
    ("upstream_local_address", Kind::AddrPort),
    ("downstream_local_address", Kind::AddrPort),
    ("downstream_remote_address", Kind::AddrPort),
    ("requested_server_name", Kind::Text),
    ("route_name", Kind::Text),
];

/// A line that ends inside a field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Unclosed {
    /// `[` without its `]`.
    #[error("a `[` is not closed (a truncated line?)")]
    Bracket,
    /// `"` without its closing quote.
    #[error("a quote is not closed (a truncated line?)")]
    Quote,
}

/// Splits an access log line into fields: `[…]`, `"…"` (with `\"` escapes) or a run of
/// non-blanks.
pub(crate) fn split(line: &str) -> Result<Vec<String>, Unclosed> {
    let mut fields = Vec::new();
    let mut chars = line.chars().peekable();
    while let Some(first) = chars.find(|c| !c.is_whitespace()) {
        let mut field = String::new();
        match first {
            '[' => loop {
                match chars.next().ok_or(Unclosed::Bracket)? {
                    ']' => break,
                    c => field.push(c),
                }
            },
            '"' => loop {
                match chars.next().ok_or(Unclosed::Quote)? {
                    '\\' => field.push(chars.next().ok_or(Unclosed::Quote)?),
                    '"' => break,
                    c => field.push(c),
                }
            },
            c => {
                field.push(c);
                while let Some(c) = chars.next_if(|c| !c.is_whitespace()) {
                    field.push(c);
                }
            }
        }
        fields.push(field);
    }
    Ok(fields)
}

/// Whether `value` looks like what a field of `kind` holds; the reason when not.
pub(crate) fn check(kind: Kind, value: &str) -> Result<(), &'static str> {
    let dash = value == "-" || value.is_empty();
    let ok = match kind {
        Kind::Text | Kind::CommonTime | Kind::Rfc3339 => true,
        Kind::Addr => value.parse::<IpAddr>().is_ok(),
        Kind::Host => {
            value.parse::<IpAddr>().is_ok()
                || (!dash
                    && value
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_')))
        }
        Kind::AddrPort => dash || host_of(value).is_some(),
        Kind::AddrList => dash || value.split(',').all(|a| a.trim().parse::<IpAddr>().is_ok()),
        Kind::Number => dash || value.chars().all(|c| c.is_ascii_digit()),
        Kind::Request => {
            dash || {
                let parts: Vec<&str> = value.split(' ').collect();
                parts.len() == 3
                    && !parts[0].is_empty()
                    && parts[0].chars().all(|c| c.is_ascii_uppercase())
            }
        }
    };
    if ok {
        return Ok(());
    }
    Err(match kind {
        Kind::Addr => "is not an IP address",
        Kind::Host => "is not an address or a host name",
        Kind::AddrPort => "is not an address with a port",
        Kind::AddrList => "is not a list of IP addresses",
        Kind::Number => "is not a number",
        Kind::Request => "is not a request line such as `GET /path HTTP/1.1`",
        Kind::Text | Kind::CommonTime | Kind::Rfc3339 => "is not readable",
    })
}

/// The address of `10.0.0.1:8080` or `[::1]:8080`, if the text is one.
pub(crate) fn host_of(value: &str) -> Option<IpAddr> {
    let (host, port) = value.rsplit_once(':')?;
    port.parse::<u16>().ok()?;
    host.trim_start_matches('[')
        .trim_end_matches(']')
        .parse::<IpAddr>()
        .ok()
}

/// The method, path and protocol of a request line (`None` for `-` or an empty one).
pub(crate) fn request_part(request: &str, part: usize) -> Option<&str> {
    if request == "-" || request.is_empty() {
        return None;
    }
    request
        .split(' ')
        .nth(part)
        .filter(|p| !p.is_empty() && *p != "-")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn fields_split_brackets_and_quotes() {
        let f = split(
            r#"10.0.0.1 - - [01/Jan/2026:00:00:00 +0000] "GET /a \"b\" HTTP/1.1" 200 5 "-" "curl/8""#,
        )
        .unwrap();
        assert_eq!(f.len(), 9);
        assert_eq!(f[3], "01/Jan/2026:00:00:00 +0000");
        assert_eq!(f[4], r#"GET /a "b" HTTP/1.1"#);
        assert_eq!(f[8], "curl/8");
        assert!(split(r#"10.0.0.1 - - [01/Jan/2026:00:00:00 +0000] "GET /a HT"#).is_err());
    }

    #[test]
    fn fields_are_checked_by_kind() {
        assert!(check(Kind::AddrList, "203.0.113.9, 10.0.0.1").is_ok());
        assert!(check(Kind::AddrList, "-").is_ok());
        assert!(check(Kind::AddrList, "1234").is_err());
        assert!(check(Kind::AddrPort, "[::1]:8080").is_ok());
        assert!(check(Kind::AddrPort, "via_upstream").is_err());
        assert!(check(Kind::Number, "via_upstream").is_err());
        assert!(check(Kind::Request, "").is_ok());
        assert!(check(Kind::Request, "GET /a HTTP/1.1").is_ok());
        assert!(check(Kind::Request, "\\x16\\x03").is_err());
        assert_eq!(host_of("10.0.0.1:51234"), "10.0.0.1".parse().ok());
    }
}
