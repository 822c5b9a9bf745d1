//! Recorded traffic read into events: the access logs operators have (Nginx `combined` and
//! `main`, Apache `common` and `combined`, Envoy's default text format, Istio's, Envoy JSON
//! access logs), JSON lines and CSV, named or detected (docs/simulate.md#logs).
//!
//! A line that cannot be read is skipped and counted by its reason, never read wrongly: every
//! field of an access log line is checked against what it is named (an address, a number, a
//! time), so a line of another layout is a counted skip rather than a key taken from the wrong
//! column. What stops a run is what concerns the whole log: an unknown format or key field, a
//! bound, or a log none of whose lines can be read.

mod records;
mod text;
mod time;

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;

pub use time::TimeUnit;

use super::{Bounds, Event, SimError, Traffic};
use text::Kind;

/// How many skipped lines a report shows (line number and reason); all are counted.
pub const SHOWN_SKIPS: usize = 5;

/// The formats, as listed to people.
const NAMES: &str =
    "nginx, nginx_main, apache_common, apache_combined, envoy, istio, envoy_json, jsonl, csv";

/// Lines looked at to detect a log's format.
const PROBE_LINES: usize = 50;

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
    pub fn parse(text: &str) -> Result<Option<Self>, String> {
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
            .ok_or_else(|| format!("`{text}` is not a log format; expected auto, {NAMES}"))
    }

    /// The fields of a fixed-layout access log line, in order; `None` for CSV and JSON.
    fn layout(self) -> Option<&'static [(&'static str, Kind)]> {
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
    fn trailing_fields(self) -> bool {
        matches!(
            self,
            Self::Nginx | Self::NginxMain | Self::ApacheCommon | Self::ApacheCombined
        )
    }

    /// Where the client's address is: the `X-Forwarded-For` field (its first address), then
    /// the address of the connection (an address with a port for Envoy).
    fn client_fields(self) -> (Option<&'static str>, Option<&'static str>) {
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
    fn default_key(self) -> &'static str {
        match self {
            Self::Csv | Self::JsonLines => "key",
            _ => "client",
        }
    }

    /// The time field unless told otherwise (a fixed layout's own).
    fn default_time_field(self) -> &'static str {
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

/// How a log was read: its format, key, and the lines skipped.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LogReport {
    /// The format read.
    pub format: &'static str,
    /// Whether the format was detected rather than named.
    pub detected: bool,
    /// The fields the key is made of.
    pub key: Vec<String>,
    /// The field the time is read from.
    pub time_field: String,
    /// Lines (records) that are not blank.
    pub lines: u64,
    /// Lines read into requests.
    pub read: u64,
    /// Lines skipped.
    pub skipped: u64,
    /// The skipped lines by reason, the most frequent first.
    pub skip_reasons: Vec<SkipCount>,
    /// The first few skipped lines.
    pub first_skipped: Vec<SkippedLine>,
}

/// How many lines were skipped for one reason.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SkipCount {
    /// The reason (the field and what is wrong with it, without the value).
    pub reason: String,
    /// Lines.
    pub lines: u64,
}

/// One skipped line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SkippedLine {
    /// Its number, from 1.
    pub line: u64,
    /// Why, with the value at fault.
    pub reason: String,
}

/// Why one line is skipped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Skip {
    /// The reason without the value, to count by.
    reason: String,
    /// The reason with the value, to show.
    detail: String,
    /// Whether the line is of the format, only without a key (detection counts it as read).
    keyless: bool,
}

impl Skip {
    pub(crate) fn new(reason: impl Into<String>, detail: impl Into<String>) -> Self {
        Self {
            reason: reason.into(),
            detail: detail.into(),
            keyless: false,
        }
    }

    fn keyless(mut self) -> Self {
        self.keyless = true;
        self
    }
}

/// One request read from a line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Row {
    pub(crate) t_ms: u64,
    pub(crate) key: String,
    pub(crate) cost: u64,
}

/// A part of a key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Part {
    /// The client's address ([`LogFormat::client_fields`]).
    Client,
    /// The method, path or protocol of the request line.
    Request(usize),
    /// A field.
    Field(String),
}

/// Reads a log into events, in time order (a stable sort: lines of one instant keep their
/// order), with time measured from the earliest line.
pub fn read(text: &str, options: &LogOptions, bounds: &Bounds) -> Result<Traffic, SimError> {
    read_as(text, options, bounds).map_err(|mut e| {
        // A named format none of whose lines reads: say which format they read as.
        if let Some(named) = options.format
            && e.message.starts_with("none of the")
            && let Ok(found) = detect(
                text,
                &LogOptions {
                    format: None,
                    ..options.clone()
                },
            )
            && found != named
        {
            e.message.push_str(&format!(
                " (the lines read as {}: name that format)",
                found.name()
            ));
        }
        e
    })
}

fn read_as(text: &str, options: &LogOptions, bounds: &Bounds) -> Result<Traffic, SimError> {
    let (format, detected) = match options.format {
        Some(f) => (f, false),
        None => (detect(text, options)?, true),
    };
    if format.layout().is_some() && options.time_field.is_some() {
        return Err(SimError::new(
            "traffic.time_field",
            format!(
                "only for csv, jsonl and envoy_json; a {} line's time is its `{}`",
                format.name(),
                format.default_time_field()
            ),
        ));
    }
    let key_names = key_names(format, options)?;
    let mut sink = Sink::new(bounds);
    let time_field = match format {
        LogFormat::Csv => records::csv(text, options, &key_names, &mut sink)?,
        LogFormat::JsonLines | LogFormat::EnvoyJson => {
            let parts = parts(format, &key_names, options)?;
            let time_field = options
                .time_field
                .clone()
                .unwrap_or_else(|| format.default_time_field().to_owned());
            let mut clock = clock(options);
            for (n, line) in lines(text) {
                let row = records::json_line(format, line, &time_field, &parts, &mut clock);
                sink.push(n, row)?;
            }
            time_field
        }
        _ => {
            let parts = parts(format, &key_names, options)?;
            for (n, line) in lines(text) {
                sink.push(n, access_line(format, line, &parts))?;
            }
            format.default_time_field().to_owned()
        }
    };
    sink.finish(format, detected, key_names, time_field)
}

/// The non-blank lines of a text, numbered from 1, without their `\r`.
fn lines(text: &str) -> impl Iterator<Item = (u64, &str)> {
    text.lines()
        .enumerate()
        .map(|(n, l)| (n as u64 + 1, l.trim_end_matches('\r')))
        .filter(|(_, l)| !l.trim().is_empty())
}

fn clock(options: &LogOptions) -> time::Clock {
    time::Clock {
        named: options.time_unit,
        seen: None,
    }
}

/// The key's field names, as given or the format's default.
fn key_names(format: LogFormat, options: &LogOptions) -> Result<Vec<String>, SimError> {
    let Some(key) = &options.key else {
        return Ok(vec![format.default_key().to_owned()]);
    };
    let names: Vec<String> = key.split(',').map(|k| k.trim().to_owned()).collect();
    if names.iter().any(String::is_empty) {
        return Err(SimError::new(
            options.key_path.clone(),
            format!(
                "`{key}` names an empty field; give fields separated by commas: method,path,client"
            ),
        ));
    }
    Ok(names)
}

/// The key's parts for an access log or JSON lines; a name a fixed layout does not have is
/// refused with the names it has.
fn parts(format: LogFormat, names: &[String], options: &LogOptions) -> Result<Vec<Part>, SimError> {
    names
        .iter()
        .map(|name| match name.as_str() {
            "client" => Ok(Part::Client),
            "method" | "path" | "protocol" if format.layout().is_some() => {
                Ok(Part::Request(match name.as_str() {
                    "method" => 0,
                    "path" => 1,
                    _ => 2,
                }))
            }
            _ => match format.layout() {
                None => Ok(Part::Field(name.clone())),
                Some(layout) if layout.iter().any(|(f, _)| f == name && *f != "-") => {
                    Ok(Part::Field(name.clone()))
                }
                Some(layout) => Err(SimError::new(
                    options.key_path.clone(),
                    format!(
                        "`{name}` is not a field of this log ({}); the fields are client, \
                         method, path, protocol, {}",
                        format.name(),
                        layout
                            .iter()
                            .map(|(f, _)| *f)
                            .filter(|f| *f != "-")
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                )),
            },
        })
        .collect()
}

/// Reads one line of a fixed-layout access log.
fn access_line(format: LogFormat, line: &str, parts: &[Part]) -> Result<Row, Skip> {
    let layout = format.layout().unwrap_or_default();
    let fields = text::split(line).map_err(|e| Skip::new("a quote or bracket not closed", e))?;
    let count_ok = if format.trailing_fields() {
        fields.len() >= layout.len()
    } else {
        fields.len() == layout.len()
    };
    if !count_ok {
        return Err(Skip::new(
            format!("not the {} fields of {}", layout.len(), format.name()),
            format!(
                "{} fields where {} has {}",
                fields.len(),
                format.name(),
                layout.len()
            ),
        ));
    }
    let mut t_ms = None;
    for ((name, kind), value) in layout.iter().zip(&fields) {
        let time = match kind {
            Kind::CommonTime => Some(time::common_log(value)),
            Kind::Rfc3339 => Some(time::rfc3339(value)),
            _ => None,
        };
        match time {
            Some(Ok(t)) => t_ms = Some(t),
            Some(Err(e)) => {
                return Err(Skip::new(
                    format!("{name}: not a time"),
                    format!("{name}: {e}"),
                ));
            }
            None => text::check(*kind, value).map_err(|why| {
                Skip::new(
                    format!("{name}: {why}"),
                    format!("{name}: `{}` {why}", clip(value)),
                )
            })?,
        }
    }
    let t_ms = t_ms.unwrap_or_default();
    let get = |name: &str| -> Option<&str> {
        layout
            .iter()
            .position(|(f, _)| *f == name)
            .map(|i| fields[i].as_str())
    };
    let key = make_key(format, parts, |part| match part {
        Part::Request(i) => Ok(get("request").and_then(|r| text::request_part(r, *i))),
        Part::Field(name) => Ok(get(name)),
        Part::Client => Ok(None),
    })?;
    Ok(Row { t_ms, key, cost: 1 })
}

/// Builds a key from its parts; `value` answers a part's text (`None` when absent). A part
/// absent or `-` skips the line.
pub(crate) fn make_key<'a>(
    format: LogFormat,
    parts: &[Part],
    value: impl Fn(&Part) -> Result<Option<&'a str>, Skip>,
) -> Result<String, Skip> {
    let mut key = String::new();
    for (i, part) in parts.iter().enumerate() {
        if i > 0 {
            key.push('|');
        }
        let text = match part {
            Part::Client => client(format, &|name| value(&Part::Field(name.to_owned())))?,
            _ => match value(part)? {
                Some(v) if !v.is_empty() && v != "-" => v.to_owned(),
                absent => {
                    let name = match part {
                        Part::Request(0) => "method",
                        Part::Request(1) => "path",
                        Part::Request(_) => "protocol",
                        Part::Field(name) => name,
                        Part::Client => "client",
                    };
                    let what = if absent.is_some() {
                        "is `-`"
                    } else {
                        "is missing"
                    };
                    return Err(Skip::new(
                        format!("{name} {what}"),
                        format!("{name} {what}; the key needs it"),
                    )
                    .keyless());
                }
            },
        };
        key.push_str(&text);
    }
    if sluice::check_key(&key).is_err() {
        return Err(Skip::new(
            "the key is too long",
            format!(
                "the key is {} bytes, more than {}",
                key.len(),
                sluice::MAX_KEY_LEN
            ),
        ));
    }
    Ok(key)
}

/// The client's address: the first of `X-Forwarded-For`, else the connection's.
fn client<'a>(
    format: LogFormat,
    value: &dyn Fn(&str) -> Result<Option<&'a str>, Skip>,
) -> Result<String, Skip> {
    let (forwarded, direct) = format.client_fields();
    if let Some(name) = forwarded
        && let Some(list) = value(name)?.filter(|v| !v.is_empty() && *v != "-")
    {
        let first = list.split(',').next().unwrap_or("").trim();
        if first.parse::<std::net::IpAddr>().is_err() {
            return Err(Skip::new(
                format!("{name}: not a list of IP addresses"),
                format!("{name}: `{}` is not a list of IP addresses", clip(list)),
            ));
        }
        return Ok(first.to_owned());
    }
    if let Some(name) = direct
        && let Some(address) = value(name)?.filter(|v| !v.is_empty() && *v != "-")
    {
        if let Some(ip) = text::host_of(address) {
            return Ok(ip.to_string());
        }
        if text::check(Kind::Host, address).is_ok() {
            return Ok(address.to_owned());
        }
        return Err(Skip::new(
            format!("{name}: not an address"),
            format!("{name}: `{}` is not an address", clip(address)),
        ));
    }
    let named: Vec<&str> = [forwarded, direct].into_iter().flatten().collect();
    Err(Skip::new(
        "client: no address",
        format!(
            "no client address: {} (choose another key)",
            if named.is_empty() {
                "this log has none".to_owned()
            } else {
                format!("{} missing or `-`", named.join(" and "))
            }
        ),
    )
    .keyless())
}

/// A value shown in a reason: at most 60 characters.
pub(crate) fn clip(value: &str) -> String {
    if value.chars().count() <= 60 {
        return value.to_owned();
    }
    let mut s: String = value.chars().take(57).collect();
    s.push('…');
    s
}

/// The format that reads the most of the log's first lines (a line of the format without a
/// key counts); ties go to the earlier in [`LogFormat::ALL`].
fn detect(text: &str, options: &LogOptions) -> Result<LogFormat, SimError> {
    let sample: Vec<(u64, &str)> = lines(text).take(PROBE_LINES).collect();
    let Some(&(_, first)) = sample.first() else {
        return Err(SimError::new("traffic.log", "the log holds no request"));
    };
    let sample_text: String = text
        .lines()
        .take(sample.last().map_or(0, |(n, _)| *n as usize))
        .collect::<Vec<_>>()
        .join("\n");
    let mut best: Option<(usize, LogFormat)> = None;
    for format in LogFormat::ALL {
        if format == LogFormat::ApacheCombined {
            continue;
        }
        let probe = LogOptions {
            format: Some(format),
            ..options.clone()
        };
        let read = probe_count(format, &sample, &sample_text, &probe);
        if read > 0 && best.is_none_or(|(n, _)| read > n) {
            best = Some((read, format));
        }
    }
    best.map(|(_, f)| f).ok_or_else(|| {
        SimError::new(
            "traffic.format",
            format!(
                "the log is in none of the formats read ({NAMES}); its first line: `{}`. Name \
                 the format, or check the key and time options",
                clip(first)
            ),
        )
    })
}

/// How many of the sample lines `format` reads (0 when the options do not fit it).
fn probe_count(
    format: LogFormat,
    sample: &[(u64, &str)],
    sample_text: &str,
    options: &LogOptions,
) -> usize {
    let readable = |r: &Result<Row, Skip>| match r {
        Ok(_) => true,
        Err(skip) => skip.keyless,
    };
    if format.layout().is_some() && options.time_field.is_some() {
        return 0;
    }
    let Ok(names) = key_names(format, options) else {
        return 0;
    };
    match format {
        LogFormat::Csv => {
            let bounds = Bounds::default();
            let mut sink = Sink::new(&bounds);
            sink.probing = true;
            match records::csv(sample_text, options, &names, &mut sink) {
                Ok(_) => sink.raw.len() + sink.keyless as usize,
                Err(_) => 0,
            }
        }
        LogFormat::JsonLines | LogFormat::EnvoyJson => {
            let Ok(parts) = parts(format, &names, options) else {
                return 0;
            };
            let time_field = options
                .time_field
                .clone()
                .unwrap_or_else(|| format.default_time_field().to_owned());
            let mut clock = clock(options);
            sample
                .iter()
                .filter(|(_, l)| {
                    readable(&records::json_line(
                        format,
                        l,
                        &time_field,
                        &parts,
                        &mut clock,
                    ))
                })
                .count()
        }
        _ => {
            let Ok(parts) = parts(format, &names, options) else {
                return 0;
            };
            sample
                .iter()
                .filter(|(_, l)| readable(&access_line(format, l, &parts)))
                .count()
        }
    }
}

/// Collects the rows of a log: its keys, events and skips, within the bounds.
pub(crate) struct Sink<'b> {
    bounds: &'b Bounds,
    keys: Vec<String>,
    index: HashMap<String, u32>,
    raw: Vec<(u64, u32, u64)>,
    lines: u64,
    reasons: BTreeMap<String, u64>,
    first: Vec<SkippedLine>,
    /// Detection: rows are only counted.
    probing: bool,
    keyless: u64,
}

impl<'b> Sink<'b> {
    fn new(bounds: &'b Bounds) -> Self {
        Self {
            bounds,
            keys: Vec::new(),
            index: HashMap::new(),
            raw: Vec::new(),
            lines: 0,
            reasons: BTreeMap::new(),
            first: Vec::new(),
            probing: false,
            keyless: 0,
        }
    }

    /// Takes line `line`'s row, or counts its skip.
    pub(crate) fn push(&mut self, line: u64, row: Result<Row, Skip>) -> Result<(), SimError> {
        self.lines += 1;
        let row = match row {
            Ok(row) => row,
            Err(skip) => {
                self.keyless += u64::from(skip.keyless);
                *self.reasons.entry(skip.reason).or_default() += 1;
                if self.first.len() < SHOWN_SKIPS {
                    self.first.push(SkippedLine {
                        line,
                        reason: skip.detail,
                    });
                }
                return Ok(());
            }
        };
        if self.probing {
            self.raw.push((row.t_ms, 0, row.cost));
            return Ok(());
        }
        if self.raw.len() >= self.bounds.max_events {
            return Err(SimError::new(
                "traffic.log",
                format!(
                    "more than the maximum of {} events (max_events); simulate a part of the log",
                    self.bounds.max_events
                ),
            ));
        }
        let k = match self.index.get(row.key.as_str()) {
            Some(&k) => k,
            None => {
                if self.keys.len() >= self.bounds.max_keys {
                    return Err(SimError::new(
                        "traffic.log",
                        format!(
                            "more than the maximum of {} distinct keys (max_keys)",
                            self.bounds.max_keys
                        ),
                    ));
                }
                let k = u32::try_from(self.keys.len()).unwrap_or(u32::MAX);
                self.index.insert(row.key.clone(), k);
                self.keys.push(row.key);
                k
            }
        };
        self.raw.push((row.t_ms, k, row.cost));
        Ok(())
    }

    fn finish(
        mut self,
        format: LogFormat,
        detected: bool,
        key: Vec<String>,
        time_field: String,
    ) -> Result<Traffic, SimError> {
        let mut skip_reasons: Vec<SkipCount> = std::mem::take(&mut self.reasons)
            .into_iter()
            .map(|(reason, lines)| SkipCount { reason, lines })
            .collect();
        skip_reasons.sort_by(|a, b| b.lines.cmp(&a.lines).then(a.reason.cmp(&b.reason)));
        let report = LogReport {
            format: format.name(),
            detected,
            key,
            time_field,
            lines: self.lines,
            read: self.raw.len() as u64,
            skipped: self.lines - self.raw.len() as u64,
            skip_reasons,
            first_skipped: self.first,
        };
        if self.raw.is_empty() {
            if report.lines == 0 {
                return Err(SimError::new("traffic.log", "the log holds no request"));
            }
            return Err(SimError::new(
                "traffic.log",
                format!(
                    "none of the {} could be read as {}: {}",
                    super::render::count(report.lines, "line", "lines"),
                    format.name(),
                    skip_summary(&report)
                ),
            ));
        }
        let raw = &mut self.raw;
        raw.sort_by_key(|e| e.0);
        let first = raw[0].0;
        let last = raw[raw.len() - 1].0;
        let duration_ms = last - first + 1;
        if duration_ms > self.bounds.max_duration_ms {
            return Err(SimError::new(
                "traffic.log",
                format!(
                    "the log spans {} ms, more than the maximum duration of {} ms \
                     (max_duration); simulate a part of it",
                    duration_ms, self.bounds.max_duration_ms
                ),
            ));
        }
        Ok(Traffic {
            events: self
                .raw
                .into_iter()
                .map(|(t, key, cost)| Event {
                    t_ms: t - first,
                    key,
                    cost,
                })
                .collect(),
            keys: self.keys,
            duration_ms,
            start_ms: first,
            log: Some(report),
        })
    }
}

/// `3 × time_local: not a time, 1 × …; line 2: time_local: `nope` is not …; line 7: …`.
pub fn skip_summary(report: &LogReport) -> String {
    let reasons: Vec<String> = report
        .skip_reasons
        .iter()
        .map(|r| format!("{} × {}", r.lines, r.reason))
        .collect();
    let lines: Vec<String> = report
        .first_skipped
        .iter()
        .map(|s| format!("line {}: {}", s.line, s.reason))
        .collect();
    format!("{}; {}", reasons.join(", "), lines.join("; "))
}
