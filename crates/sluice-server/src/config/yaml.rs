//! The configuration file as YAML, before any value is interpreted: an empty file, a file
//! that is not well-formed YAML and a key given twice are refused here, and serde's and
//! libyaml's messages are put in plain words, at their line.

use serde::de::{self, DeserializeOwned};

use super::ConfigError;

/// The file as written: refused when it is empty, when its YAML is not well-formed (reported
/// before any value is interpreted, so an unclosed `{` is reported as such and not as the odd
/// value it swallowed), or when a mapping names a key twice.
pub(super) fn read_raw<T: DeserializeOwned>(file: &str, text: &str) -> Result<T, ConfigError> {
    let document: Option<de::IgnoredAny> =
        serde_yaml_ng::from_str(text).map_err(|e| yaml_error(file, text, &e))?;
    if document.is_none() {
        return Err(ConfigError {
            file: file.to_owned(),
            line: None,
            message: "the file is empty (or holds only comments): an empty file is refused, so \
                      that a file caught half-written never replaces a configuration; write `{}` \
                      for every default and no policy"
                .to_owned(),
        });
    }
    duplicate_keys(file, text)?;
    serde_yaml_ng::from_str(text).map_err(|e| yaml_error(file, text, &e))
}

/// A key given twice in one mapping (serde would keep the last one silently), named with the
/// lines of both.
fn duplicate_keys(file: &str, text: &str) -> Result<(), ConfigError> {
    use sluice_spec::unique::{Parsed, Probe, read};
    let Parsed::Duplicate { duplicate, error } =
        read(serde_yaml_ng::Deserializer::from_str(text), None)
    else {
        return Ok(());
    };
    let second = error.location().map(|l| (l.line(), l.column()));
    let first = match read(
        serde_yaml_ng::Deserializer::from_str(text),
        Some(Probe(duplicate.clone())),
    ) {
        Parsed::Probed(e) => e.location().map(|l| l.line()),
        _ => None,
    };
    let lines = match (first, second) {
        (Some(a), Some((b, _))) if a == b => format!(" on line {a}"),
        (Some(a), Some((b, _))) => format!(", at lines {a} and {b}"),
        _ => String::new(),
    };
    let at = if duplicate.path.is_empty() {
        String::new()
    } else {
        format!("{}: ", duplicate.path)
    };
    let why = if duplicate.path == "policies" {
        "each policy needs its own name"
    } else {
        "a key may appear once in a mapping (the second would silently replace the first)"
    };
    Err(ConfigError {
        file: file.to_owned(),
        line: second,
        message: format!("{at}`{}` is given twice{lines}; {why}", duplicate.key),
    })
}

/// serde's messages name Rust types (`expected u64`, `expected struct RawConfig`); this says
/// what to write instead.
fn plain_words(message: &str) -> String {
    const WORDS: &[(&str, &str)] = &[
        ("f32", "a number"),
        ("f64", "a number"),
        ("a map", "a mapping (key: value)"),
        ("a sequence", "a list"),
        ("path string", "a file path"),
        ("a borrowed string", "a string"),
    ];
    let is_word = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let mut out = String::with_capacity(message.len());
    let mut rest = message;
    while let Some(at) = rest.find("expected ") {
        let (before, after) = rest.split_at(at + "expected ".len());
        out.push_str(before);
        rest = after;
        if let Some(name) = rest.strip_prefix("struct ") {
            // `struct RawConfig`, `struct RawLimit`: a mapping of the section's keys.
            let end = name.find(|c: char| !is_word(c)).unwrap_or(name.len());
            out.push_str("a mapping (key: value)");
            rest = &name[end..];
            continue;
        }
        let word = &rest[..rest.find(|c: char| !is_word(c)).unwrap_or(rest.len())];
        let bits = ["8", "16", "32", "64", "128", "size"];
        if word
            .strip_prefix(['u', 'i'])
            .is_some_and(|b| bits.contains(&b))
        {
            out.push_str("a whole number");
            rest = &rest[word.len()..];
            continue;
        }
        for (rust, words) in WORDS {
            if let Some(tail) = rest.strip_prefix(rust)
                && !tail.starts_with(is_word)
            {
                out.push_str(words);
                rest = tail;
                break;
            }
        }
    }
    out.push_str(rest);
    out
}

/// A YAML error with its line. The parser knows no line for a second document (`---`), so it
/// is found here: a configuration is one document, and the error points at the second. An
/// error that has no line says it is about the whole file.
fn yaml_error(file: &str, text: &str, e: &serde_yaml_ng::Error) -> ConfigError {
    let mut line = e.location().map(|l| (l.line(), l.column()));
    let mut message = plain_words(&strip_location(&e.to_string()));
    if line.is_none() && message.contains("more than one document") {
        let mut content = false;
        let mut markers = 0;
        for (i, l) in text.lines().enumerate() {
            if l.starts_with("---") {
                markers += 1;
                if content || markers == 2 {
                    line = Some((i + 1, 1));
                    break;
                }
            } else if !l.trim().is_empty() && !l.starts_with('#') && !l.starts_with('%') {
                content = true;
            }
        }
        message = "the file holds more than one YAML document (a second `---`); a \
                   configuration is one document"
            .to_owned();
    } else if line.is_none() {
        // The few errors the parser cannot place (e.g. a merge key `<<` of a scalar).
        message = format!("the file as a whole: {message}");
    }
    ConfigError {
        file: file.to_owned(),
        line,
        message,
    }
}

/// serde_yaml_ng appends " at line L column C"; the error already carries the location.
/// libyaml's own messages carry one inside (`did not find expected ',' or '}' at line 5 column
/// 8, while parsing a flow mapping`): every ` at line L column C` goes, and an unclosed flow
/// collection says so in words.
fn strip_location(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    let mut rest = message;
    while let Some(i) = rest.find(" at line ") {
        out.push_str(&rest[..i]);
        let after = &rest[i + " at line ".len()..];
        let digits = |t: &str| t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
        let after = &after[digits(after)..];
        rest = match after.strip_prefix(" column ") {
            Some(column) => &column[digits(column)..],
            None => after,
        };
    }
    out.push_str(rest);
    if out.contains("while parsing a flow mapping") {
        return "a `{` opened above is never closed: expected `,` or `}` here".to_owned();
    }
    if out.contains("while parsing a flow sequence") {
        return "a `[` opened above is never closed: expected `,` or `]` here".to_owned();
    }
    out
}
