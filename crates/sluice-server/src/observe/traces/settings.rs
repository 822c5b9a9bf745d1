//! The `tracing` section: where decision traces go over OTLP, and how many are kept
//! (docs/configuration.md#tracing). The standard `OTEL_*` variables override the file.
//!
//! Five variables are read here rather than left to the OpenTelemetry SDK (0.33), which reads
//! them otherwise than the documentation promises: its exporter prefers an endpoint given in
//! code to `OTEL_EXPORTER_OTLP_ENDPOINT` (here the variable overrides the file, and alone
//! turns tracing on), picks the transport from `OTEL_EXPORTER_OTLP_PROTOCOL` only in a builder
//! that cannot take the server's HTTP client, and ignores a bad value with a warning (here a
//! load error names it); it reads `OTEL_TRACES_SAMPLER_ARG` only for its own samplers, never
//! for the random, caller-aware one of [`super`]; it finds `OTEL_SERVICE_NAME` only in a
//! resource whose name a file's `service_name` would override; and it has no
//! `OTEL_SDK_DISABLED`. What the exporter does read as documented (`OTEL_EXPORTER_OTLP_HEADERS`,
//! `OTEL_EXPORTER_OTLP_TIMEOUT`, the `OTEL_BSP_*` bounds) is left to it.

use std::collections::BTreeMap;

use serde::Deserialize;
use sluice_spec::FieldError;

use crate::url::ConfiguredUrl;

/// `tracing`, as written.
#[derive(Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct RawTracing {
    endpoint: Option<String>,
    protocol: Option<String>,
    sample_ratio: Option<f64>,
    service_name: Option<String>,
    headers: BTreeMap<String, String>,
    follow_callers: Option<bool>,
}

/// How spans travel to the collector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TraceProtocol {
    /// OTLP over gRPC (the collector's port 4317).
    Grpc,
    /// OTLP over HTTP with protobuf bodies (the collector's port 4318, path `/v1/traces`).
    Http,
}

/// Traces over OTLP (`tracing`): on when an endpoint is set, in the file or in
/// `OTEL_EXPORTER_OTLP_ENDPOINT`.
#[derive(Debug, Clone, PartialEq)]
pub struct TraceSettings {
    /// The collector: `http://host:port` (for `http`, `/v1/traces` is appended when the URL
    /// has no path).
    pub endpoint: ConfiguredUrl,
    /// gRPC or HTTP/protobuf.
    pub protocol: TraceProtocol,
    /// The share of traces started here that are kept, in [0, 1]; a request that carries a
    /// `traceparent` follows its caller's choice (parent-based sampling).
    pub sample_ratio: f64,
    /// The `service.name` of the spans.
    pub service_name: String,
    /// Sent with every export (gRPC metadata or HTTP headers), e.g. a collector's token.
    pub headers: BTreeMap<String, String>,
    /// Whether a caller's `traceparent` flag decides sampling and its `tracestate` is carried
    /// into the spans (`tracing.follow_callers`, default `true`); `false`: `sample_ratio`
    /// alone decides every trace and no `tracestate` is kept, the caller's trace still the
    /// parent.
    pub follow_callers: bool,
}

/// The default `tracing.service_name`.
pub const DEFAULT_SERVICE_NAME: &str = "sluice";

/// The variables read, each overriding its key of the file.
const ENDPOINT_VAR: &str = "OTEL_EXPORTER_OTLP_ENDPOINT";
const PROTOCOL_VAR: &str = "OTEL_EXPORTER_OTLP_PROTOCOL";
const RATIO_VAR: &str = "OTEL_TRACES_SAMPLER_ARG";
const SERVICE_VAR: &str = "OTEL_SERVICE_NAME";
const DISABLED_VAR: &str = "OTEL_SDK_DISABLED";

/// `tracing` and the `OTEL_*` variables (`env` reads one; the server passes the process's
/// environment): a variable overrides its key of the file, a key of the file its default.
/// `None`: tracing is off (no endpoint anywhere, or `OTEL_SDK_DISABLED=true`). An error names
/// the key (`tracing.sample_ratio: …`) or the variable.
pub(crate) fn trace_config(
    raw: Option<RawTracing>,
    env: impl Fn(&str) -> Option<String>,
) -> Result<Option<TraceSettings>, FieldError> {
    let env = |name: &str| env(name).filter(|v| !v.trim().is_empty());
    if env(DISABLED_VAR).is_some_and(|v| v.trim().eq_ignore_ascii_case("true")) {
        return Ok(None);
    }
    let in_file = raw.is_some();
    let raw = raw.unwrap_or_default();
    let endpoint = match (env(ENDPOINT_VAR), raw.endpoint) {
        (Some(e), _) => endpoint(ENDPOINT_VAR, e.trim())?,
        (None, Some(e)) => endpoint("tracing.endpoint", e.trim())?,
        (None, None) if in_file => {
            return Err(FieldError::new(
                "tracing.endpoint",
                format!(
                    "missing; name the OpenTelemetry collector, e.g. \
                     http://otel-collector:4317 (or set {ENDPOINT_VAR}), or remove the section"
                ),
            ));
        }
        (None, None) => return Ok(None),
    };
    let protocol = match (env(PROTOCOL_VAR), raw.protocol) {
        (Some(p), _) => protocol(PROTOCOL_VAR, p.trim())?,
        (None, Some(p)) => protocol("tracing.protocol", p.trim())?,
        (None, None) => TraceProtocol::Grpc,
    };
    let sample_ratio = match (env(RATIO_VAR), raw.sample_ratio) {
        (Some(r), _) => match r.trim().parse::<f64>() {
            Ok(r) => ratio(RATIO_VAR, r)?,
            Err(_) => {
                return Err(FieldError::new(
                    RATIO_VAR,
                    format!("`{r}` is not a number; expected a ratio in [0, 1], e.g. 0.1"),
                ));
            }
        },
        (None, Some(r)) => ratio("tracing.sample_ratio", r)?,
        (None, None) => 1.0,
    };
    let service_name = match (env(SERVICE_VAR), raw.service_name) {
        (Some(s), _) => s.trim().to_owned(),
        (None, Some(s)) if s.trim().is_empty() => {
            return Err(FieldError::new(
                "tracing.service_name",
                "empty; name the service (the default is sluice)",
            ));
        }
        (None, Some(s)) => s.trim().to_owned(),
        (None, None) => DEFAULT_SERVICE_NAME.to_owned(),
    };
    for (name, value) in &raw.headers {
        header(name, value)?;
    }
    Ok(Some(TraceSettings {
        endpoint,
        protocol,
        sample_ratio,
        service_name,
        headers: raw.headers,
        follow_callers: raw.follow_callers.unwrap_or(true),
    }))
}

/// A collector URL: `http://host:port`. TLS to the collector is not offered: the exporter
/// speaks plain text to a collector next to the server, which forwards wherever it must.
fn endpoint(field: &str, text: &str) -> Result<ConfiguredUrl, FieldError> {
    // Errors show the URL as every other place does: without credentials.
    let shown = sluice_redis::redact(text);
    let uri: axum::http::Uri = text.parse().map_err(|e| {
        FieldError::new(
            field,
            format!("`{shown}` is not a URL ({e}); expected e.g. http://otel-collector:4317"),
        )
    })?;
    match uri.scheme_str() {
        Some("http") => {}
        Some("https") => {
            return Err(FieldError::new(
                field,
                format!(
                    "`{shown}`: TLS to the collector is not supported; send to a collector \
                     beside the server over http:// (it forwards over TLS)"
                ),
            ));
        }
        _ => {
            return Err(FieldError::new(
                field,
                format!(
                    "`{shown}` has no http:// scheme; expected e.g. http://otel-collector:4317"
                ),
            ));
        }
    }
    if uri.host().is_none_or(str::is_empty) {
        return Err(FieldError::new(
            field,
            format!("`{shown}` names no host; expected e.g. http://otel-collector:4317"),
        ));
    }
    ConfiguredUrl::parse(
        text,
        "a collector's token goes in tracing.headers, e.g. authorization: Basic …",
    )
    .map_err(|e| e.within(field))
}

fn protocol(field: &str, text: &str) -> Result<TraceProtocol, FieldError> {
    match text {
        "grpc" => Ok(TraceProtocol::Grpc),
        // `http/protobuf` is the variable's spelling in the OpenTelemetry specification.
        "http" | "http/protobuf" => Ok(TraceProtocol::Http),
        other => Err(FieldError::new(
            field,
            format!("`{other}` is not an OTLP protocol; expected grpc or http (http/protobuf)"),
        )),
    }
}

fn ratio(field: &str, r: f64) -> Result<f64, FieldError> {
    if (0.0..=1.0).contains(&r) {
        Ok(r)
    } else {
        Err(FieldError::new(
            field,
            format!(
                "{r} is not a ratio; expected a number in [0, 1] (0: only traces a caller \
                 sampled, 1: every decision)"
            ),
        ))
    }
}

/// A header must be one both gRPC metadata and HTTP accept: a lowercase name, a visible ASCII
/// value.
fn header(name: &str, value: &str) -> Result<(), FieldError> {
    let lower = !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-_.".contains(&b));
    if !lower || name.ends_with("-bin") {
        return Err(FieldError::new(
            format!("tracing.headers.{name}"),
            "not a header name; use lowercase letters, digits and `-`, e.g. authorization",
        ));
    }
    if axum::http::HeaderValue::from_str(value).is_err() {
        return Err(FieldError::new(
            format!("tracing.headers.{name}"),
            "the value is not a header value (visible ASCII only)",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(yaml: &str) -> RawTracing {
        match serde_yaml_ng::from_str(yaml) {
            Ok(r) => r,
            Err(e) => panic!("test YAML: {e}"),
        }
    }

    fn no_env(_: &str) -> Option<String> {
        None
    }

    #[test]
    fn without_a_section_or_a_variable_tracing_is_off() {
        assert_eq!(trace_config(None, no_env), Ok(None));
    }

    #[test]
    fn the_section_gives_the_endpoint_and_the_defaults_fill_the_rest() {
        let got = trace_config(Some(raw("endpoint: http://collector:4317")), no_env);
        assert_eq!(
            got,
            Ok(Some(TraceSettings {
                endpoint: ConfiguredUrl::new("http://collector:4317"),
                protocol: TraceProtocol::Grpc,
                sample_ratio: 1.0,
                service_name: "sluice".to_owned(),
                headers: BTreeMap::new(),
                follow_callers: true,
            }))
        );
    }

    #[test]
    fn a_variable_overrides_its_key_of_the_file() {
        let env = |name: &str| match name {
            "OTEL_EXPORTER_OTLP_ENDPOINT" => Some("http://other:4318".to_owned()),
            "OTEL_EXPORTER_OTLP_PROTOCOL" => Some("http/protobuf".to_owned()),
            "OTEL_TRACES_SAMPLER_ARG" => Some("0.25".to_owned()),
            "OTEL_SERVICE_NAME" => Some("edge-limits".to_owned()),
            _ => None,
        };
        let file = raw("{ endpoint: 'http://collector:4317', protocol: grpc, sample_ratio: 1 }");
        let Ok(Some(got)) = trace_config(Some(file), env) else {
            panic!("expected settings");
        };
        assert_eq!(got.endpoint.expose(), "http://other:4318");
        assert_eq!(got.protocol, TraceProtocol::Http);
        assert_eq!(got.sample_ratio, 0.25);
        assert_eq!(got.service_name, "edge-limits");
    }

    #[test]
    fn the_endpoint_variable_alone_turns_tracing_on_and_the_sdk_switch_off() {
        let env = |name: &str| {
            (name == "OTEL_EXPORTER_OTLP_ENDPOINT").then(|| "http://collector:4317".to_owned())
        };
        assert!(matches!(trace_config(None, env), Ok(Some(_))));
        let disabled = |name: &str| match name {
            "OTEL_EXPORTER_OTLP_ENDPOINT" => Some("http://collector:4317".to_owned()),
            "OTEL_SDK_DISABLED" => Some("true".to_owned()),
            _ => None,
        };
        assert_eq!(
            trace_config(Some(raw("endpoint: http://c:4317")), disabled),
            Ok(None)
        );
    }

    #[test]
    fn bad_values_name_their_key_or_variable() {
        let err = |yaml: &str| {
            trace_config(Some(raw(yaml)), no_env)
                .unwrap_err()
                .to_string()
        };
        assert!(err("sample_ratio: 0.5").starts_with("tracing.endpoint: missing"));
        assert!(
            err("{ endpoint: 'http://c:4317', sample_ratio: 1.5 }")
                .starts_with("tracing.sample_ratio: 1.5 is not a ratio")
        );
        assert!(
            err("{ endpoint: 'http://c:4317', protocol: thrift }")
                .starts_with("tracing.protocol: `thrift` is not an OTLP protocol")
        );
        assert!(
            err("endpoint: 'collector:4317'").starts_with("tracing.endpoint: `collector:4317`")
        );
        assert!(err("endpoint: 'https://c:4317'").contains("TLS to the collector"));
        assert!(
            err("{ endpoint: 'http://c:4317', headers: { Authorization: x } }")
                .starts_with("tracing.headers.Authorization: not a header name")
        );
        let env = |name: &str| (name == "OTEL_TRACES_SAMPLER_ARG").then(|| "half".to_owned());
        let e = trace_config(Some(raw("endpoint: http://c:4317")), env)
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("OTEL_TRACES_SAMPLER_ARG: `half` is not a number"),
            "{e}"
        );
    }
}
