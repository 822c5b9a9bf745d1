//! Errors and warnings of the configuration loader.

use std::fmt;

/// A configuration that cannot be loaded: the file at fault, the line when known, and what
/// is wrong in words a person can act on.
///
/// Displayed as `file:line: message` (or `file: message` without a line), for example
/// `ratelimit-config/api.yaml:12: descriptors[0].rate_limit.unit: "fortnight" is not a unit;
/// expected one of second, minute, hour, day, week, month, year`. The message starts with
/// the YAML path of the offending node where there is one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}: {message}", located(file, *line))]
pub struct RlsConfigError {
    /// The file, as given to [`super::RlsConfig::from_files`] or as found under the directory
    /// given to [`super::RlsConfig::load_dir`] (the directory joined with the relative path).
    pub file: String,
    /// The 1-based line, when it is known.
    pub line: Option<usize>,
    /// What is wrong, and where in the file (a YAML path such as `descriptors[1].key`).
    pub message: String,
}

impl RlsConfigError {
    pub(super) fn new(file: &str, line: Option<usize>, message: impl Into<String>) -> Self {
        Self {
            file: file.to_owned(),
            line,
            message: message.into(),
        }
    }
}

/// Something in a configuration that loads, but probably not as its author meant: a key in
/// the wrong place (ignored, as the reference service ignores it), a key written twice (the
/// last one wins), a second YAML document (ignored), a file that could not be read.
///
/// The reference service accepts all of these silently; Sluice accepts them too, so that a
/// configuration directory behaves the same under both, and reports them here so the server
/// can log them. Displayed like [`RlsConfigError`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RlsConfigWarning {
    /// The file.
    pub file: String,
    /// The 1-based line, when it is known.
    pub line: Option<usize>,
    /// What was noticed, and what happens because of it.
    pub message: String,
}

impl fmt::Display for RlsConfigWarning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", located(&self.file, self.line), self.message)
    }
}

/// `file:line`, or `file` without a line.
pub(crate) fn located(file: &str, line: Option<usize>) -> String {
    match line {
        Some(line) => format!("{file}:{line}"),
        None => file.to_owned(),
    }
}

/// The valid key closest to a misspelt one, when one is close (for "did you mean").
pub(super) fn suggestion(key: &str, valid_keys: &[&'static str]) -> Option<&'static str> {
    let squash = |s: &str| {
        s.chars()
            .filter(|c| c.is_alphanumeric())
            .flat_map(char::to_lowercase)
            .collect::<String>()
    };
    let wanted = squash(key);
    valid_keys
        .iter()
        .map(|valid| (strsim::levenshtein(&wanted, &squash(valid)), *valid))
        .filter(|(distance, valid)| *distance <= 2.max(valid.len() / 4))
        .min_by_key(|(distance, _)| *distance)
        .map(|(_, valid)| valid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn displays_file_line_and_message() {
        let err = RlsConfigError::new("cfg/api.yaml", Some(12), "descriptors[0]: bad");
        assert_eq!(err.to_string(), "cfg/api.yaml:12: descriptors[0]: bad");
        let err = RlsConfigError::new("cfg/api.yaml", None, "bad");
        assert_eq!(err.to_string(), "cfg/api.yaml: bad");
    }

    #[test]
    fn suggests_close_keys() {
        use super::super::decode::VALID_KEYS as VALID;
        assert_eq!(
            suggestion("requestsperunit", VALID),
            Some("requests_per_unit")
        );
        assert_eq!(suggestion("ratelimit", VALID), Some("rate_limit"));
        assert_eq!(suggestion("shadowmode", VALID), Some("shadow_mode"));
        assert_eq!(suggestion("descriptor", VALID), Some("descriptors"));
        assert_eq!(suggestion("completely_different", VALID), None);
    }
}
