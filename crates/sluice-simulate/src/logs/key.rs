//! A line's request: the key made of its parts (fields, the request line's parts, the
//! client's address), or the reason the line is skipped.

use super::format::{LogFormat, LogOptions};
use super::text::{self, Kind};
use crate::SimError;

/// Why one line is skipped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Skip {
    /// The reason without the value, to count by.
    pub(super) reason: String,
    /// The reason with the value, to show.
    pub(super) detail: String,
    /// Whether the line is of the format, only without a key (detection counts it as read).
    pub(super) keyless: bool,
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

/// The parts of a request line, by their index in [`Part::Request`].
const REQUEST_PARTS: [&str; 3] = ["method", "path", "protocol"];

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

/// The key's field names, as given or the format's default.
pub(super) fn key_names(format: LogFormat, options: &LogOptions) -> Result<Vec<String>, SimError> {
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
pub(super) fn parts(
    format: LogFormat,
    names: &[String],
    options: &LogOptions,
) -> Result<Vec<Part>, SimError> {
    names
        .iter()
        .map(|name| match name.as_str() {
            "client" => Ok(Part::Client),
            "method" | "path" | "protocol" if format.layout().is_some() => Ok(Part::Request(
                REQUEST_PARTS.iter().position(|p| p == name).unwrap_or(0),
            )),
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
                        Part::Request(i) => REQUEST_PARTS[*i],
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
