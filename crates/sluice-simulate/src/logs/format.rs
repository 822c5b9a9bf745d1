//! What a log is named as: its [`LogFormat`] (each fixed layout's fields, the client and time
//! fields, the default key) and the [`LogOptions`] a request or the command gives.

use super::text::{self, Kind};
use super::time::TimeUnit;

/// The formats, as listed to people.
pub(super) const NAMES: &str =
    "nginx, nginx_main, apache_common, apache_combined, envoy, istio, envoy_json, jsonl, csv";

/// A log format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    /// `timestamp,key[,cost]` per record, or any columns under a header naming them.
    Csv,
    /// One JSON object per line: `{"timestamp": …, "key": "…", "cost": 1}`, or any fields
    /// chosen with `time_field` and `key`.
    JsonLines,
    /// Envoy's JSON access log (and Istio's JSON encoding): `start_time`,
    /// `downstream_remote_address`, `x_forwarded_for`, `method`, `path`, … per line.
    EnvoyJson,
    /// Nginx `combined`.
    Nginx,
    /// Nginx `main`: `combined` and `"$http_x_forwarded_for"`.
    NginxMain,
    /// Apache `common`: `%h %l %u %t "%r" %>s %b`.
    ApacheCommon,
    /// Apache `combined`: `common` and `"%{Referer}i" "%{User-agent}i"`.
    ApacheCombined,
    /// Envoy's default text format.
    Envoy,
    /// Istio's default text format (`accessLogEncoding: TEXT`).
    Istio,
}

/// A `format` that names no log format.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{0}` is not a log format; expected auto, {names}", names = NAMES)]
pub struct UnknownFormat(pub String);

impl LogFormat {
    /// Every format, in the order detection prefers them when several read a log equally
    /// well (the more specific first). Apache `combined` has the layout of Nginx `combined`
    /// and is only read when named. JSON lines and Envoy JSON differ only in their default
    /// fields (`timestamp` and `key`, `start_time` and the client), so a JSON log is Envoy's
    /// when its lines have no `timestamp`.
    pub const ALL: [Self; 9] = [
        Self::Istio,
        Self::Envoy,
        Self::NginxMain,
        Self::Nginx,
        Self::ApacheCombined,
        Self::ApacheCommon,
        Self::JsonLines,
        Self::EnvoyJson,
        Self::Csv,
    ];

    /// The format's name in requests and reports.
    pub fn name(self) -> &'static str {
        match self {
            Self::Csv => "csv",
            Self::JsonLines => "jsonl",
            Self::EnvoyJson => "envoy_json",
            Self::Nginx => "nginx",
            Self::NginxMain => "nginx_main",
            Self::ApacheCommon => "apache_common",
            Self::ApacheCombined => "apache_combined",
            Self::Envoy => "envoy",
            Self::Istio => "istio",
        }
    }

    /// Reads a format's name (`-` and `_` alike); `None` for `auto`, detection.
    pub fn parse(text: &str) -> Result<Option<Self>, UnknownFormat> {
        let name = text.replace('-', "_");
        match name.as_str() {
            "auto" => return Ok(None),
            "json_lines" => return Ok(Some(Self::JsonLines)),
            "nginx_combined" => return Ok(Some(Self::Nginx)),
            _ => {}
        }
        Self::ALL
            .into_iter()
            .find(|f| f.name() == name)
            .map(Some)
            .ok_or_else(|| UnknownFormat(text.to_owned()))
    }

    /// The fields of a fixed-layout access log line, in order; `None` for CSV and JSON.
    pub(super) fn layout(self) -> Option<&'static [(&'static str, Kind)]> {
        match self {
            Self::Nginx => Some(text::NGINX_COMBINED),
            Self::NginxMain => Some(text::NGINX_MAIN),
            Self::ApacheCommon => Some(text::APACHE_COMMON),
            Self::ApacheCombined => Some(text::APACHE_COMBINED),
            Self::Envoy => Some(text::ENVOY),
            Self::Istio => Some(text::ISTIO),
            Self::Csv | Self::JsonLines | Self::EnvoyJson => None,
        }
    }

    /// Whether a line may have fields after the layout's (Nginx and Apache logs often append
    /// some); Envoy's and Istio's layouts must match exactly, so one is never read as the
    /// other.
    pub(super) fn trailing_fields(self) -> bool {
        matches!(
            self,
            Self::Nginx | Self::NginxMain | Self::ApacheCommon | Self::ApacheCombined
        )
    }

    /// Where the client's address is: the `X-Forwarded-For` field (its first address), then
    /// the address of the connection (an address with a port for Envoy).
    pub(super) fn client_fields(self) -> (Option<&'static str>, Option<&'static str>) {
        match self {
            Self::Nginx => (None, Some("remote_addr")),
            Self::NginxMain => (Some("http_x_forwarded_for"), Some("remote_addr")),
            Self::ApacheCommon | Self::ApacheCombined => (None, Some("remote_host")),
            Self::Envoy => (Some("x_forwarded_for"), None),
            Self::Istio | Self::EnvoyJson | Self::JsonLines => {
                (Some("x_forwarded_for"), Some("downstream_remote_address"))
            }
            Self::Csv => (None, None),
        }
    }

    /// The key unless told otherwise.
    pub(super) fn default_key(self) -> &'static str {
        match self {
            Self::Csv | Self::JsonLines => "key",
            _ => "client",
        }
    }

    /// The time field unless told otherwise (a fixed layout's own).
    pub(super) fn default_time_field(self) -> &'static str {
        match self {
            Self::Csv | Self::JsonLines => "timestamp",
            Self::Nginx | Self::NginxMain => "time_local",
            Self::ApacheCommon | Self::ApacheCombined => "time",
            Self::Envoy | Self::Istio | Self::EnvoyJson => "start_time",
        }
    }
}

/// What to read from a log, as `traffic` of a request or the flags of `sluice simulate` give.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LogOptions {
    /// The format; `None` detects it.
    pub format: Option<LogFormat>,
    /// The key: a field, or fields separated by commas whose values are joined by `|`
    /// (`method,path,client`). By default the client for an access log, `key` otherwise.
    pub key: Option<String>,
    /// The request field `key` came from (named in errors about it).
    pub key_path: String,
    /// The time field of a JSON lines or CSV log (`timestamp` by default).
    pub time_field: Option<String>,
    /// The unit of Unix times; by default told by their magnitude.
    pub time_unit: Option<TimeUnit>,
}
