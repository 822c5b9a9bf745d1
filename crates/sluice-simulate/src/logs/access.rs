//! One line of a fixed-layout access log (Nginx, Apache, Envoy, Istio) read into a request:
//! every field checked against its kind, the time read, the key made.

use super::format::LogFormat;
use super::key::{Part, Row, Skip, clip, make_key};
use super::text::{self, Kind};
use super::time;

/// Reads one line of a fixed-layout access log.
pub(super) fn access_line(format: LogFormat, line: &str, parts: &[Part]) -> Result<Row, Skip> {
    let layout = format.layout().unwrap_or_default();
    let fields =
        text::split(line).map_err(|e| Skip::new("a quote or bracket not closed", e.to_string()))?;
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
