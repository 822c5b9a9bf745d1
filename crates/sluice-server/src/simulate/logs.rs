//! Recorded traffic: CSV, JSON lines, Nginx's `combined` access log and Envoy's default access
//! log, read into events. Every error names the line and the field at fault.
//!
//! Timestamps are kept to the millisecond. CSV and JSON lines take Unix seconds (a fraction
//! allowed: `1767225600.250`) or RFC 3339 (`2026-01-01T00:00:00.250Z`); Nginx's `$time_local`
//! (`01/Jan/2026:00:00:00 +0000`) and Envoy's `%START_TIME%` (`2026-01-01T00:00:00.250Z`) are
//! read as they are written.

use std::collections::HashMap;

use super::{Bounds, Event, SimError, Traffic};

/// A log format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    /// `timestamp,key[,cost]` per line; a first line that does not start with a timestamp is a
    /// header and skipped. Fields may be double-quoted (`""` is a quote).
    Csv,
    /// One object per line: `{"timestamp": …, "key": "…", "cost": 1}` (`cost` optional).
    JsonLines,
    /// Nginx `combined`: `$remote_addr - $remote_user [$time_local] "$request" $status
    /// $body_bytes_sent "$http_referer" "$http_user_agent"`.
    Nginx,
    /// Envoy's default format: `[%START_TIME%] "%REQ(:METHOD)% %REQ(X-ENVOY-ORIGINAL-PATH?:PATH)%
    /// %PROTOCOL%" %RESPONSE_CODE% %RESPONSE_FLAGS% %BYTES_RECEIVED% %BYTES_SENT% %DURATION%
    /// %RESP(X-ENVOY-UPSTREAM-SERVICE-TIME)% "%REQ(X-FORWARDED-FOR)%" "%REQ(USER-AGENT)%"
    /// "%REQ(X-REQUEST-ID)%" "%REQ(:AUTHORITY)%" "%UPSTREAM_HOST%"`.
    Envoy,
}

impl LogFormat {
    /// Reads `csv`, `jsonl`, `nginx` or `envoy`.
    pub fn parse(text: &str) -> Result<Self, String> {
        match text {
            "csv" => Ok(Self::Csv),
            "jsonl" | "json_lines" => Ok(Self::JsonLines),
            "nginx" => Ok(Self::Nginx),
            "envoy" => Ok(Self::Envoy),
            other => Err(format!(
                "`{other}` is not a log format; expected csv, jsonl, nginx or envoy"
            )),
        }
    }

    /// The fields an access log line has, in order (none for CSV and JSON lines).
    pub fn fields(self) -> &'static [&'static str] {
        match self {
            Self::Nginx => NGINX_FIELDS,
            Self::Envoy => ENVOY_FIELDS,
            Self::Csv | Self::JsonLines => &[],
        }
    }

    /// The field an access log is keyed by unless told otherwise: the client's address.
    pub fn default_key_field(self) -> Option<&'static str> {
        match self {
            Self::Nginx => Some("remote_addr"),
            Self::Envoy => Some("x_forwarded_for"),
            Self::Csv | Self::JsonLines => None,
        }
    }
}

const NGINX_FIELDS: &[&str] = &[
    "remote_addr",
    "dash",
    "remote_user",
    "time_local",
    "request",
    "status",
    "body_bytes_sent",
    "http_referer",
    "http_user_agent",
];

const ENVOY_FIELDS: &[&str] = &[
    "start_time",
    "request",
    "response_code",
    "response_flags",
    "bytes_received",
    "bytes_sent",
    "duration",
    "upstream_service_time",
    "x_forwarded_for",
    "user_agent",
    "request_id",
    "authority",
    "upstream_host",
];

/// Reads a log into events, in time order (a stable sort: lines of one instant keep their
/// order), with time measured from the earliest line. `key_field` picks an access log's key
/// (see [`LogFormat::fields`]); for Envoy's `x_forwarded_for` the first address of the list.
pub fn read(
    format: LogFormat,
    text: &str,
    key_field: Option<&str>,
    bounds: &Bounds,
) -> Result<Traffic, SimError> {
    let key_index = match (format.default_key_field(), key_field) {
        (None, Some(_)) => {
            return Err(SimError::new(
                "traffic.log.key_field",
                "only an access log (nginx, envoy) has fields to choose from; a CSV or JSON \
                 lines log names its key in each line",
            ));
        }
        (None, None) => 0,
        (Some(default), chosen) => {
            let name = chosen.unwrap_or(default);
            format
                .fields()
                .iter()
                .position(|f| *f == name && *f != "dash")
                .ok_or_else(|| {
                    SimError::new(
                        "traffic.log.key_field",
                        format!(
                            "`{name}` is not a field of this log; the fields are {}",
                            format
                                .fields()
                                .iter()
                                .filter(|f| **f != "dash")
                                .copied()
                                .collect::<Vec<_>>()
                                .join(", ")
                        ),
                    )
                })?
        }
    };
    let mut keys: Vec<String> = Vec::new();
    let mut index: HashMap<String, u32> = HashMap::new();
    let mut raw: Vec<(u64, u32, u64)> = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line_no = n + 1;
        let line = line.trim_end_matches('\r');
        if line.trim().is_empty() {
            continue;
        }
        let at =
            |message: String| SimError::new("traffic.log", format!("line {line_no}: {message}"));
        let parsed = match format {
            LogFormat::Csv => {
                let fields = csv_fields(line).map_err(at)?;
                if n == 0 && fields.first().is_some_and(|f| parse_timestamp(f).is_err()) {
                    continue; // a header
                }
                csv_event(&fields).map_err(at)?
            }
            LogFormat::JsonLines => json_event(line).map_err(at)?,
            LogFormat::Nginx | LogFormat::Envoy => {
                access_event(format, line, key_index).map_err(at)?
            }
        };
        let (t, key, cost) = parsed;
        if sluice::check_key(&key).is_err() {
            return Err(at(format!(
                "the key must be 1 to {} bytes, got {} bytes",
                sluice::MAX_KEY_LEN,
                key.len()
            )));
        }
        if raw.len() >= bounds.max_events {
            return Err(SimError::new(
                "traffic.log",
                format!(
                    "more than the maximum of {} events (max_events); simulate a part of the log",
                    bounds.max_events
                ),
            ));
        }
        let k = match index.get(key.as_str()) {
            Some(&k) => k,
            None => {
                if keys.len() >= bounds.max_keys {
                    return Err(SimError::new(
                        "traffic.log",
                        format!(
                            "more than the maximum of {} distinct keys (max_keys)",
                            bounds.max_keys
                        ),
                    ));
                }
                let k = u32::try_from(keys.len()).unwrap_or(u32::MAX);
                index.insert(key.clone(), k);
                keys.push(key);
                k
            }
        };
        raw.push((t, k, cost));
    }
    if raw.is_empty() {
        return Err(SimError::new("traffic.log", "the log holds no request"));
    }
    raw.sort_by_key(|e| e.0);
    let first = raw[0].0;
    let last = raw[raw.len() - 1].0;
    let duration_ms = last - first + 1;
    if duration_ms > bounds.max_duration_ms {
        return Err(SimError::new(
            "traffic.log",
            format!(
                "the log spans {} ms, more than the maximum duration of {} ms (max_duration); \
                 simulate a part of it",
                duration_ms, bounds.max_duration_ms
            ),
        ));
    }
    Ok(Traffic {
        events: raw
            .into_iter()
            .map(|(t, key, cost)| Event {
                t_ms: t - first,
                key,
                cost,
            })
            .collect(),
        keys,
        duration_ms,
        start_ms: first,
    })
}

/// Splits a CSV line, honouring double quotes.
fn csv_fields(line: &str) -> Result<Vec<String>, String> {
    let mut fields = Vec::new();
    let mut field = String::new();
    let mut chars = line.chars().peekable();
    let mut quoted = false;
    let mut was_quoted = false;
    while let Some(c) = chars.next() {
        match (quoted, c) {
            (true, '"') if chars.peek() == Some(&'"') => {
                field.push('"');
                chars.next();
            }
            (true, '"') => quoted = false,
            (true, c) => field.push(c),
            (false, '"') if field.is_empty() && !was_quoted => {
                quoted = true;
                was_quoted = true;
            }
            (false, ',') => {
                fields.push(std::mem::take(&mut field));
                was_quoted = false;
            }
            (false, c) => field.push(c),
        }
    }
    if quoted {
        return Err("a quoted field is not closed".to_owned());
    }
    fields.push(field);
    Ok(fields)
}

fn csv_event(fields: &[String]) -> Result<(u64, String, u64), String> {
    if !(2..=3).contains(&fields.len()) {
        return Err(format!(
            "expected timestamp,key[,cost]; got {} fields",
            fields.len()
        ));
    }
    let t = parse_timestamp(fields[0].trim()).map_err(|e| format!("timestamp: {e}"))?;
    let cost = match fields.get(2).map(|c| c.trim()) {
        None | Some("") => 1,
        Some(c) => parse_cost(c)?,
    };
    Ok((t, fields[1].clone(), cost))
}

fn parse_cost(text: &str) -> Result<u64, String> {
    match text.parse::<u64>() {
        Ok(c) if c <= sluice::core::MAX_AMOUNT => Ok(c),
        _ => Err(format!(
            "cost: `{text}` is not a whole number from 0 to 2^53"
        )),
    }
}

fn json_event(line: &str) -> Result<(u64, String, u64), String> {
    let value: serde_json::Value =
        serde_json::from_str(line).map_err(|e| format!("not a JSON object: {e}"))?;
    let serde_json::Value::Object(map) = value else {
        return Err("not a JSON object".to_owned());
    };
    for field in map.keys() {
        if !matches!(field.as_str(), "timestamp" | "key" | "cost") {
            return Err(format!(
                "unknown field `{field}`; the fields are timestamp, key and cost"
            ));
        }
    }
    let t = match map.get("timestamp") {
        Some(serde_json::Value::String(s)) => parse_timestamp(s),
        Some(serde_json::Value::Number(n)) => parse_timestamp(&n.to_string()),
        Some(_) => Err("must be Unix seconds or an RFC 3339 string".to_owned()),
        None => Err("is missing".to_owned()),
    }
    .map_err(|e| format!("timestamp: {e}"))?;
    let key = match map.get("key") {
        Some(serde_json::Value::String(s)) => s.clone(),
        Some(_) => return Err("key: must be a string".to_owned()),
        None => return Err("key: is missing".to_owned()),
    };
    let cost = match map.get("cost") {
        None | Some(serde_json::Value::Null) => 1,
        Some(serde_json::Value::Number(n)) => parse_cost(&n.to_string())?,
        Some(_) => return Err("cost: must be a whole number".to_owned()),
    };
    Ok((t, key, cost))
}

/// Splits an access log line into fields: `[…]`, `"…"` (with `\"` escapes) or a run of
/// non-blanks.
fn access_fields(line: &str) -> Result<Vec<String>, String> {
    let mut fields = Vec::new();
    let mut chars = line.chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        let Some(&c) = chars.peek() else { break };
        let mut field = String::new();
        match c {
            '[' => {
                chars.next();
                loop {
                    match chars.next() {
                        Some(']') => break,
                        Some(c) => field.push(c),
                        None => return Err("a `[` is not closed".to_owned()),
                    }
                }
            }
            '"' => {
                chars.next();
                loop {
                    match chars.next() {
                        Some('\\') => match chars.next() {
                            Some(c) => field.push(c),
                            None => return Err("a quoted field is not closed".to_owned()),
                        },
                        Some('"') => break,
                        Some(c) => field.push(c),
                        None => return Err("a quoted field is not closed".to_owned()),
                    }
                }
            }
            _ => {
                while let Some(&c) = chars.peek() {
                    if c.is_whitespace() {
                        break;
                    }
                    field.push(c);
                    chars.next();
                }
            }
        }
        fields.push(field);
    }
    Ok(fields)
}

fn access_event(
    format: LogFormat,
    line: &str,
    key_index: usize,
) -> Result<(u64, String, u64), String> {
    let fields = access_fields(line)?;
    let names = format.fields();
    if fields.len() < names.len() {
        return Err(format!(
            "expected the {} fields of the {} format, got {}",
            names.len(),
            match format {
                LogFormat::Nginx => "Nginx combined",
                _ => "Envoy default",
            },
            fields.len()
        ));
    }
    let t = match format {
        LogFormat::Nginx => parse_nginx_time(&fields[3]),
        _ => parse_rfc3339(&fields[0]),
    }
    .map_err(|e| {
        format!(
            "{}: {e}",
            if format == LogFormat::Nginx {
                "time_local"
            } else {
                "start_time"
            }
        )
    })?;
    let mut key = fields[key_index].clone();
    if names[key_index] == "x_forwarded_for" {
        // The client is the first address of the list.
        key = key.split(',').next().unwrap_or("").trim().to_owned();
    }
    if key == "-" || key.is_empty() {
        return Err(format!(
            "{} is empty (`-`); choose another key_field",
            names[key_index]
        ));
    }
    Ok((t, key, 1))
}

/// Unix seconds (`1767225600`, `1767225600.25`) or RFC 3339, to ms.
pub(crate) fn parse_timestamp(text: &str) -> Result<u64, String> {
    if text.starts_with(|c: char| c.is_ascii_digit()) && !text.contains('-') {
        let (whole, frac) = text.split_once('.').unwrap_or((text, ""));
        let secs: u64 = whole
            .parse()
            .map_err(|_| format!("`{text}` is not Unix seconds or RFC 3339"))?;
        if !frac.chars().all(|c| c.is_ascii_digit()) {
            return Err(format!("`{text}` is not Unix seconds or RFC 3339"));
        }
        let ms: u64 = format!("{frac:0<3}")[..3].parse().unwrap_or(0);
        return secs
            .checked_mul(1_000)
            .and_then(|s| s.checked_add(ms))
            .filter(|&t| t <= sluice::core::MAX_AMOUNT)
            .ok_or_else(|| format!("`{text}` is too far in the future"));
    }
    parse_rfc3339(text)
}

/// `2026-01-01T00:00:00Z`, `2026-01-01T00:00:00.250+01:00` to ms since the epoch.
fn parse_rfc3339(text: &str) -> Result<u64, String> {
    let bad = || format!("`{text}` is not an RFC 3339 time such as 2026-01-01T00:00:00.250Z");
    let b = text.as_bytes();
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b't' | b' ') {
        return Err(bad());
    }
    let num = |r: std::ops::Range<usize>| -> Result<i64, String> {
        text.get(r)
            .filter(|s| s.chars().all(|c| c.is_ascii_digit()))
            .and_then(|s| s.parse().ok())
            .ok_or_else(bad)
    };
    let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    if b[13] != b':' || b[16] != b':' {
        return Err(bad());
    }
    let (h, mi, s) = (num(11..13)?, num(14..16)?, num(17..19)?);
    let mut rest = &text[19..];
    let mut ms = 0;
    if let Some(frac) = rest.strip_prefix('.') {
        let digits = frac.len() - frac.trim_start_matches(|c: char| c.is_ascii_digit()).len();
        if digits == 0 {
            return Err(bad());
        }
        ms = format!("{:0<3}", &frac[..digits])[..3]
            .parse()
            .map_err(|_| bad())?;
        rest = &frac[digits..];
    }
    let offset_min = match rest {
        "Z" | "z" => 0,
        _ if rest.len() == 6 && matches!(&rest[3..4], ":") => {
            let sign = match &rest[..1] {
                "+" => 1,
                "-" => -1,
                _ => return Err(bad()),
            };
            let oh: i64 = rest[1..3].parse().map_err(|_| bad())?;
            let om: i64 = rest[4..6].parse().map_err(|_| bad())?;
            sign * (oh * 60 + om)
        }
        _ => return Err(bad()),
    };
    to_epoch_ms(y, mo, d, h, mi, s, ms, offset_min).ok_or_else(bad)
}

/// Nginx `$time_local`: `10/Oct/2000:13:55:36 -0700`.
fn parse_nginx_time(text: &str) -> Result<u64, String> {
    let bad = || format!("`{text}` is not a time such as 10/Oct/2000:13:55:36 -0700");
    let (stamp, zone) = text.split_once(' ').ok_or_else(bad)?;
    let mut parts = stamp.splitn(3, '/');
    let (d, mon, rest) = (
        parts.next().ok_or_else(bad)?,
        parts.next().ok_or_else(bad)?,
        parts.next().ok_or_else(bad)?,
    );
    let mo = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ]
    .iter()
    .position(|m| *m == mon)
    .ok_or_else(bad)? as i64
        + 1;
    let mut hms = rest.split(':');
    let mut next =
        || -> Result<i64, String> { hms.next().and_then(|s| s.parse().ok()).ok_or_else(bad) };
    let (y, h, mi, s) = (next()?, next()?, next()?, next()?);
    let d: i64 = d.parse().map_err(|_| bad())?;
    let zb = zone.as_bytes();
    if zb.len() != 5 || !matches!(zb[0], b'+' | b'-') {
        return Err(bad());
    }
    let oh: i64 = zone[1..3].parse().map_err(|_| bad())?;
    let om: i64 = zone[3..5].parse().map_err(|_| bad())?;
    let offset = if zb[0] == b'-' { -1 } else { 1 } * (oh * 60 + om);
    to_epoch_ms(y, mo, d, h, mi, s, 0, offset).ok_or_else(bad)
}

/// A civil time (proleptic Gregorian) with a UTC offset in minutes, to ms since the epoch;
/// `None` when a field is out of range or the instant is before 1970.
#[allow(clippy::too_many_arguments)]
fn to_epoch_ms(
    y: i64,
    mo: i64,
    d: i64,
    h: i64,
    mi: i64,
    s: i64,
    ms: i64,
    offset_min: i64,
) -> Option<u64> {
    let leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    let days_in = [
        31,
        if leap { 29 } else { 28 },
        31,
        30,
        31,
        30,
        31,
        31,
        30,
        31,
        30,
        31,
    ];
    if !(1..=12).contains(&mo)
        || d < 1
        || d > days_in[(mo - 1) as usize]
        || h > 23
        || mi > 59
        || s > 60
    {
        return None;
    }
    // Days from the civil date (H. Hinnant's algorithm).
    let y2 = if mo <= 2 { y - 1 } else { y };
    let era = y2.div_euclid(400);
    let yoe = y2 - era * 400;
    let mp = (mo + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let secs = days * 86_400 + h * 3_600 + mi * 60 + s - offset_min * 60;
    u64::try_from(secs * 1_000 + ms).ok()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn times_read_as_written() {
        assert_eq!(parse_timestamp("1767225600").unwrap(), 1_767_225_600_000);
        assert_eq!(parse_timestamp("1767225600.25").unwrap(), 1_767_225_600_250);
        assert_eq!(
            parse_timestamp("2026-01-01T00:00:00.250Z").unwrap(),
            1_767_225_600_250
        );
        assert_eq!(
            parse_timestamp("2026-01-01T01:00:00+01:00").unwrap(),
            1_767_225_600_000
        );
        assert_eq!(
            parse_nginx_time("01/Jan/2026:00:00:01 +0000").unwrap(),
            1_767_225_601_000
        );
        assert_eq!(
            parse_nginx_time("10/Oct/2000:13:55:36 -0700").unwrap(),
            971_211_336_000
        );
        for bad in [
            "yesterday",
            "2026-13-01T00:00:00Z",
            "1.5.5",
            "2026-02-30T00:00:00Z",
        ] {
            assert!(parse_timestamp(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn access_fields_split_brackets_and_quotes() {
        let f = access_fields(
            r#"10.0.0.1 - - [01/Jan/2026:00:00:00 +0000] "GET /a \"b\" HTTP/1.1" 200 5 "-" "curl/8""#,
        )
        .unwrap();
        assert_eq!(f.len(), 9);
        assert_eq!(f[3], "01/Jan/2026:00:00:00 +0000");
        assert_eq!(f[4], r#"GET /a "b" HTTP/1.1"#);
        assert_eq!(f[8], "curl/8");
    }

    #[test]
    fn csv_fields_honour_quotes() {
        assert_eq!(
            csv_fields(r#"1,"a,""b""",3"#).unwrap(),
            vec!["1", r#"a,"b""#, "3"]
        );
        assert!(csv_fields(r#"1,"a"#).is_err());
    }
}
