//! Recorded traffic read into events: the access logs operators have (Nginx `combined` and
//! `main`, Apache `common` and `combined`, Envoy's default text format, Istio's, Envoy JSON
//! access logs), JSON lines and CSV, named or detected (docs/simulate.md#logs).
//!
//! A line that cannot be read is skipped and counted by its reason, never read wrongly: every
//! field of an access log line is checked against what it is named (an address, a number, a
//! time), so a line of another layout is a counted skip rather than a key taken from the wrong
//! column. What stops a run is what concerns the whole log: an unknown format or key field, a
//! bound, or a log none of whose lines can be read.

mod access;
mod format;
mod key;
mod records;
mod sink;
mod text;
mod time;

pub use format::{LogFormat, LogOptions, UnknownFormat};
pub use sink::{LogReport, SHOWN_SKIPS, SkipCount, SkippedLine, skip_summary};
pub use time::{TimeError, TimeUnit};

use access::access_line;
use format::NAMES;
use key::{clip, key_names, parts};
use sink::Sink;

use super::{Bounds, SimError, Traffic};

/// Lines looked at to detect a log's format.
const PROBE_LINES: usize = 50;

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
    let mut sink = Sink::new(bounds);
    let (key_names, time_field) = fill(format, text, options, &mut sink)?;
    sink.finish(format, detected, key_names, time_field)
}

/// Reads `text` as `format` into `sink`; answers the key's fields and the time field.
fn fill(
    format: LogFormat,
    text: &str,
    options: &LogOptions,
    sink: &mut Sink<'_>,
) -> Result<(Vec<String>, String), SimError> {
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
    let time_field = match format {
        LogFormat::Csv => records::csv(text, options, &key_names, sink)?,
        LogFormat::JsonLines | LogFormat::EnvoyJson => {
            let parts = parts(format, &key_names, options)?;
            let time_field = options
                .time_field
                .clone()
                .unwrap_or_else(|| format.default_time_field().to_owned());
            let mut clock = time::Clock {
                named: options.time_unit,
                seen: None,
            };
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
    Ok((key_names, time_field))
}

/// The non-blank lines of a text, numbered from 1, without their `\r`.
fn lines(text: &str) -> impl Iterator<Item = (u64, &str)> {
    text.lines()
        .enumerate()
        .map(|(n, l)| (n as u64 + 1, l.trim_end_matches('\r')))
        .filter(|(_, l)| !l.trim().is_empty())
}

/// The format that reads the most of the log's first lines (a line of the format without a
/// key counts); ties go to the earlier in [`LogFormat::ALL`].
fn detect(text: &str, options: &LogOptions) -> Result<LogFormat, SimError> {
    let mut sample = lines(text).take(PROBE_LINES);
    let Some((first_n, first)) = sample.next() else {
        return Err(SimError::new("traffic.log", "the log holds no request"));
    };
    let sample_text: String = text
        .lines()
        .take(sample.last().map_or(first_n, |(n, _)| n) as usize)
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
        let read = probe_count(format, &sample_text, &probe);
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

/// How many of the sample lines `format` reads, a line of the format without a key counted
/// (0 when the options do not fit it).
fn probe_count(format: LogFormat, sample_text: &str, options: &LogOptions) -> usize {
    let bounds = Bounds::default();
    let mut sink = Sink::new(&bounds);
    sink.probing = true;
    match fill(format, sample_text, options, &mut sink) {
        Ok(_) => sink.raw.len() + sink.keyless as usize,
        Err(_) => 0,
    }
}
