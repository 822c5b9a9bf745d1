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

impl fmt::Display for RlsConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_located(f, &self.file, self.line, &self.message)
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
        write_located(f, &self.file, self.line, &self.message)
    }
}

fn write_located(
    f: &mut fmt::Formatter<'_>,
    file: &str,
    line: Option<usize>,
    message: &str,
) -> fmt::Result {
    match line {
        Some(line) => write!(f, "{file}:{line}: {message}"),
        None => write!(f, "{file}: {message}"),
    }
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
}
