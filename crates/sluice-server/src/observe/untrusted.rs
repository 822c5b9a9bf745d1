//! [`Untrusted`]: how text from outside (an xDS control plane's versions, names and messages,
//! a client's values) is shown wherever Sluice logs, stores or answers it.
//!
//! Two harms, one place: a control character (a line feed followed by a forged timestamp,
//! `ESC[2J`) would write lines of its own in the human log format or reach an operator's
//! terminal, so each is escaped as Rust escapes it (`\n`, `\u{1b}`), with the invisible
//! direction and line-separator characters that make text read otherwise than it is; and a
//! string of any length would be copied into every log line, error and stored message, so
//! at most [`Untrusted::MAX`] bytes of it are kept, followed by how many were left out.

use std::fmt;

/// Text from outside, as shown: control characters escaped, at most a bound of it kept.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Untrusted<'a> {
    text: &'a str,
    max: usize,
}

impl<'a> Untrusted<'a> {
    /// How many bytes of the text are kept by default: a few hundred, enough for any honest
    /// version, name or message.
    pub(crate) const MAX: usize = 256;

    /// `text`, up to [`Untrusted::MAX`] bytes.
    pub(crate) fn new(text: &'a str) -> Self {
        Self {
            text,
            max: Self::MAX,
        }
    }

    /// `text`, up to `max` bytes (for a message that embeds several bounded texts).
    pub(crate) fn up_to(text: &'a str, max: usize) -> Self {
        Self { text, max }
    }
}

/// A character that must not reach a log or a terminal as itself.
fn escaped(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{200e}' | '\u{200f}' | '\u{2028}' | '\u{2029}' | '\u{202a}'..='\u{202e}'
                | '\u{2066}'..='\u{2069}'
        )
}

impl fmt::Display for Untrusted<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut kept = 0;
        for (i, c) in self.text.char_indices() {
            if i + c.len_utf8() > self.max {
                kept = i;
                break;
            }
            kept = i + c.len_utf8();
            if escaped(c) {
                write!(f, "{}", c.escape_default())?;
            } else {
                f.write_str(c.encode_utf8(&mut [0; 4]))?;
            }
        }
        if kept < self.text.len() {
            write!(f, "… ({} more bytes)", self.text.len() - kept)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_are_escaped_and_long_text_is_clipped() {
        let forged = "v1\n2026-01-01T00:00:00Z  WARN forged\u{1b}[2J\u{202e}";
        assert_eq!(
            Untrusted::new(forged).to_string(),
            "v1\\n2026-01-01T00:00:00Z  WARN forged\\u{1b}[2J\\u{202e}"
        );
        assert_eq!(Untrusted::new("plain é").to_string(), "plain é");
        let long = "é".repeat(1_000);
        let shown = Untrusted::new(&long).to_string();
        assert!(shown.starts_with(&"é".repeat(128)), "{shown}");
        assert!(shown.ends_with("… (1744 more bytes)"), "{shown}");
        assert_eq!(
            Untrusted::up_to("abcdef", 4).to_string(),
            "abcd… (2 more bytes)"
        );
    }
}
