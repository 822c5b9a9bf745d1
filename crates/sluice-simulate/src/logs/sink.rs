//! Where a log's rows go: its keys and events (within the bounds), the skipped lines counted
//! by reason, and the [`LogReport`] that says how the log was read.

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;

use super::format::LogFormat;
use super::key::{Row, Skip};
use crate::{Bounds, Event, SimError, Traffic};

/// How many skipped lines a report shows (line number and reason); all are counted.
pub const SHOWN_SKIPS: usize = 5;

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

/// Collects the rows of a log: its keys, events and skips, within the bounds.
pub(crate) struct Sink<'b> {
    bounds: &'b Bounds,
    keys: Vec<String>,
    index: HashMap<String, u32>,
    pub(super) raw: Vec<(u64, u32, u64)>,
    lines: u64,
    reasons: BTreeMap<String, u64>,
    first: Vec<SkippedLine>,
    /// Detection: rows are only counted.
    pub(super) probing: bool,
    pub(super) keyless: u64,
}

impl<'b> Sink<'b> {
    pub(super) fn new(bounds: &'b Bounds) -> Self {
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
        let over =
            |what: String| SimError::new("traffic.log", format!("more than the maximum of {what}"));
        if self.raw.len() >= self.bounds.max_events {
            let max = self.bounds.max_events;
            return Err(over(format!(
                "{max} events (max_events); simulate a part of the log"
            )));
        }
        let k = match self.index.get(row.key.as_str()) {
            Some(&k) => k,
            None => {
                if self.keys.len() >= self.bounds.max_keys {
                    let max = self.bounds.max_keys;
                    return Err(over(format!("{max} distinct keys (max_keys)")));
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

    pub(super) fn finish(
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
                    crate::render::count(report.lines, "line", "lines"),
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
