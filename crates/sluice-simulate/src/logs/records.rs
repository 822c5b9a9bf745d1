//! Logs of records with named fields: CSV (read by the `csv` crate) and JSON lines (plain, or
//! Envoy's JSON access log).

use serde_json::{Map, Value};

use super::format::{LogFormat, LogOptions};
use super::key::{Part, Row, Skip, clip, make_key};
use super::sink::Sink;
use super::text::Kind;
use super::time::Clock;
use crate::SimError;

/// The time columns a CSV header may have, the first found taken.
const TIME_COLUMNS: [&str; 4] = ["timestamp", "time", "start_time", "@timestamp"];

/// Where a CSV log's fields are: its columns (a header's, or `timestamp,key,cost`), and the
/// time, key and cost among them.
#[derive(Debug)]
struct Columns {
    names: Vec<String>,
    header: bool,
    time_at: usize,
    key_at: Vec<usize>,
    /// The key's parts: the columns `key_at` names.
    parts: Vec<Part>,
    cost_at: Option<usize>,
}

impl Columns {
    /// The columns of a log whose first record is `first`: a header unless its first field
    /// reads as a time (and no `time_field` is named, which only a header can hold).
    fn of(
        first: Option<&::csv::StringRecord>,
        options: &LogOptions,
        key_names: &[String],
    ) -> Result<Self, SimError> {
        let header = first.filter(|first| {
            options.time_field.is_some()
                || first
                    .get(0)
                    .is_none_or(|f| Clock::default().read(f).is_err())
        });
        let names: Vec<String> = match header {
            Some(h) => h.iter().map(|f| f.trim().to_owned()).collect(),
            None => ["timestamp", "key", "cost"].map(str::to_owned).to_vec(),
        };
        let position = |name: &str| names.iter().position(|c| c == name);
        let time_field = options.time_field.clone().or_else(|| {
            TIME_COLUMNS
                .iter()
                .find(|c| position(c).is_some())
                .map(|c| (*c).to_owned())
        });
        let Some(time_at) = time_field.as_deref().and_then(position) else {
            return Err(SimError::new(
                if options.time_field.is_some() {
                    "traffic.time_field"
                } else {
                    "traffic.log"
                },
                format!(
                    "the CSV header ({}) has no time column{}; name it with time_field",
                    names.join(","),
                    time_field
                        .as_deref()
                        .map(|t| format!(" `{t}`"))
                        .unwrap_or_else(|| format!(" ({})", TIME_COLUMNS.join(", ")))
                ),
            ));
        };
        let key_at = key_names
            .iter()
            .map(|name| {
                position(name).ok_or_else(|| {
                    SimError::new(
                        options.key_path.clone(),
                        format!(
                            "`{name}` is not a column of this CSV log; {}",
                            if header.is_some() {
                                format!("its header names {}", names.join(", "))
                            } else {
                                "without a header its columns are timestamp, key, cost".to_owned()
                            }
                        ),
                    )
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            parts: key_at
                .iter()
                .map(|&i| Part::Field(names[i].clone()))
                .collect(),
            cost_at: position("cost"),
            header: header.is_some(),
            names,
            time_at,
            key_at,
        })
    }
}

/// Reads a CSV log into `sink`: `timestamp,key[,cost]` records, or under a header any columns
/// (the time column named by `time_field`, or the first of [`TIME_COLUMNS`]; the key of the
/// columns `key` names). A first record whose first field reads as a time is data, whatever
/// it holds (`2026-01-01T01:00:00+0100,a`); otherwise it is a header. Answers the time column.
pub(crate) fn csv(
    text: &str,
    options: &LogOptions,
    key_names: &[String],
    sink: &mut Sink<'_>,
) -> Result<String, SimError> {
    let mut reader = ::csv::ReaderBuilder::new()
        .has_headers(false)
        .flexible(true)
        .from_reader(text.as_bytes());
    let mut clock = Clock {
        named: options.time_unit,
        seen: None,
    };
    let mut records = reader.records().peekable();
    let columns = match records.peek() {
        None => return Err(SimError::new("traffic.log", "the log holds no request")),
        Some(first) => Columns::of(first.as_ref().ok(), options, key_names)?,
    };
    if columns.header {
        records.next();
    }
    for (n, record) in records.enumerate() {
        let (line, row) = match record {
            Err(e) => (
                e.position().map_or(n as u64 + 1, |p| p.line()),
                Err(Skip::new(
                    "not a CSV record",
                    format!("not a CSV record: {e}"),
                )),
            ),
            Ok(r) if r.iter().all(|f| f.trim().is_empty()) => continue,
            Ok(r) => (
                r.position().map_or(n as u64 + 1, |p| p.line()),
                csv_row(&r, &columns, &mut clock),
            ),
        };
        sink.push(line, row)?;
    }
    Ok(columns.names[columns.time_at].clone())
}

fn csv_row(
    record: &::csv::StringRecord,
    columns: &Columns,
    clock: &mut Clock,
) -> Result<Row, Skip> {
    // Under a header a record may leave out trailing columns it does not need (`cost`).
    let needed = columns
        .key_at
        .iter()
        .copied()
        .chain([columns.time_at])
        .max()
        .unwrap_or(0)
        + 1;
    let count_ok = if columns.header {
        (needed..=columns.names.len()).contains(&record.len())
    } else {
        (2..=3).contains(&record.len())
    };
    if !count_ok {
        return Err(Skip::new(
            "not the fields of the header",
            format!(
                "{} fields where {} are expected ({})",
                record.len(),
                if columns.header {
                    format!("{needed} to {}", columns.names.len())
                } else {
                    "2 or 3".to_owned()
                },
                columns.names.join(",")
            ),
        ));
    }
    let time_name = &columns.names[columns.time_at];
    let raw_time = record.get(columns.time_at).unwrap_or_default();
    let t_ms = clock.read(raw_time).map_err(|e| {
        Skip::new(
            format!("{time_name}: not a time"),
            format!("{time_name}: {e}"),
        )
    })?;
    let cost = match columns.cost_at.and_then(|i| record.get(i)).map(str::trim) {
        None | Some("") => 1,
        Some(c) => cost(c)?,
    };
    let key = make_key(LogFormat::Csv, &columns.parts, |part| match part {
        Part::Field(name) => Ok(columns
            .names
            .iter()
            .position(|c| c == name)
            .and_then(|i| record.get(i))),
        _ => Ok(None),
    })?;
    Ok(Row { t_ms, key, cost })
}

fn cost(text: &str) -> Result<u64, Skip> {
    match text.parse::<u64>() {
        Ok(c) if sluice::check_cost(c).is_ok() => Ok(c),
        _ => Err(Skip::new(
            "cost: not a whole number",
            format!(
                "cost: `{}` is not a whole number from 0 to 2^53",
                clip(text)
            ),
        )),
    }
}

/// Reads one line of a JSON lines log (or Envoy's JSON access log): the time from
/// `time_field`, the key from its parts, the cost from `cost` if present.
pub(crate) fn json_line(
    format: LogFormat,
    line: &str,
    time_field: &str,
    parts: &[Part],
    clock: &mut Clock,
) -> Result<Row, Skip> {
    let value: Value = serde_json::from_str(line)
        .map_err(|e| Skip::new("not a JSON object", format!("not a JSON object: {e}")))?;
    let Value::Object(map) = value else {
        return Err(Skip::new("not a JSON object", "not a JSON object"));
    };
    let t_ms = match map.get(time_field) {
        Some(Value::String(s)) => clock.read(s).map_err(|e| e.to_string()),
        Some(Value::Number(n)) => clock.read(&n.to_string()).map_err(|e| e.to_string()),
        Some(_) => Err("must be Unix time or an RFC 3339 string".to_owned()),
        None => Err("is missing".to_owned()),
    }
    .map_err(|e| {
        Skip::new(
            format!("{time_field}: not a time"),
            format!("{time_field}: {e}"),
        )
    })?;
    let cost = match map.get("cost") {
        None | Some(Value::Null) => 1,
        Some(v) => cost(&v.to_string())?,
    };
    let texts = texts(&map);
    let key = make_key(format, parts, |part| match part {
        Part::Field(name) => {
            let v = texts
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.as_str());
            check_address(name, v)?;
            Ok(v)
        }
        _ => Ok(None),
    })?;
    Ok(Row { t_ms, key, cost })
}

/// Every scalar field as text (a string as is, a number or boolean as written).
fn texts(map: &Map<String, Value>) -> Vec<(String, String)> {
    map.iter()
        .filter_map(|(k, v)| match v {
            Value::String(s) => Some((k.clone(), s.clone())),
            Value::Number(n) => Some((k.clone(), n.to_string())),
            Value::Bool(b) => Some((k.clone(), b.to_string())),
            _ => None,
        })
        .collect()
}

/// An Envoy address field must hold an address: `downstream_remote_address` and the like an
/// address with a port, `x_forwarded_for` addresses.
fn check_address(name: &str, value: Option<&str>) -> Result<(), Skip> {
    let Some(value) = value else { return Ok(()) };
    let kind = if name == "x_forwarded_for" {
        Kind::AddrList
    } else if name.ends_with("_address") {
        Kind::AddrPort
    } else {
        return Ok(());
    };
    super::text::check(kind, value).map_err(|why| {
        Skip::new(
            format!("{name}: {why}"),
            format!("{name}: `{}` {why}", clip(value)),
        )
    })
}
