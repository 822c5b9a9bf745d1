//! How the reference service's YAML library, `gopkg.in/yaml.v2` (YAML 1.1), reads a plain
//! scalar: null, a boolean, an integer, a float or a string (`resolve` in its `resolve.go`).

/// What yaml.v2 makes of a scalar (`resolve` in yaml.v2's `resolve.go`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Resolved {
    /// `~`, `null`, `Null`, `NULL` or nothing.
    Null,
    /// `true`/`yes`/`on`/`y` and their capitalisations, or their negatives.
    Bool(bool),
    /// An integer that fits an `int64` (decimal, `0x`, `0o`, `0b`, or octal with a leading 0;
    /// underscores ignored).
    Int(i64),
    /// An integer above `int64`'s range that fits a `uint64`.
    Uint(u64),
    /// A floating-point number.
    Float,
    /// Anything else, and every quoted scalar.
    Str,
}

/// Resolves a plain (unquoted) scalar as yaml.v2 does.
pub(crate) fn resolve_plain(text: &str) -> Resolved {
    match text {
        "" | "~" | "null" | "Null" | "NULL" => return Resolved::Null,
        "y" | "Y" | "yes" | "Yes" | "YES" | "true" | "True" | "TRUE" | "on" | "On" | "ON" => {
            return Resolved::Bool(true);
        }
        "n" | "N" | "no" | "No" | "NO" | "false" | "False" | "FALSE" | "off" | "Off" | "OFF" => {
            return Resolved::Bool(false);
        }
        ".nan" | ".NaN" | ".NAN" | ".inf" | ".Inf" | ".INF" | "+.inf" | "+.Inf" | "+.INF"
        | "-.inf" | "-.Inf" | "-.INF" => return Resolved::Float,
        _ => {}
    }
    match text.as_bytes()[0] {
        b'.' => {
            if is_float(text) {
                Resolved::Float
            } else {
                Resolved::Str
            }
        }
        b'+' | b'-' | b'0'..=b'9' => {
            let plain: String = text.chars().filter(|&c| c != '_').collect();
            if let Some((negative, magnitude)) = go_parse_int_base0(&plain) {
                if negative {
                    if magnitude <= 1u128 << 63 {
                        // The magnitude fits, so this cannot wrap.
                        return Resolved::Int((-(magnitude as i128)) as i64);
                    }
                } else if let Ok(v) = i64::try_from(magnitude) {
                    return Resolved::Int(v);
                } else if let Ok(v) = u64::try_from(magnitude)
                    && !plain.starts_with('+')
                {
                    return Resolved::Uint(v);
                }
            }
            if is_yaml_style_float(&plain) && is_float(&plain) {
                return Resolved::Float;
            }
            Resolved::Str
        }
        _ => Resolved::Str,
    }
}

/// Go's `strconv.ParseInt(s, 0, …)` syntax: an optional sign, then `0x`/`0o`/`0b` or a
/// leading `0` (octal) or decimal digits. Returns the sign and the magnitude.
fn go_parse_int_base0(s: &str) -> Option<(bool, u128)> {
    let (negative, rest) = match s.as_bytes().first()? {
        b'-' => (true, &s[1..]),
        b'+' => (false, &s[1..]),
        _ => (false, s),
    };
    let lower = rest.get(..2).map(str::to_ascii_lowercase);
    let (radix, digits) = match lower.as_deref() {
        Some("0x") => (16, &rest[2..]),
        Some("0o") => (8, &rest[2..]),
        Some("0b") => (2, &rest[2..]),
        _ if rest.len() > 1 && rest.starts_with('0') => (8, &rest[1..]),
        _ => (10, rest),
    };
    if digits.is_empty() || !digits.chars().all(|c| c.is_digit(radix)) {
        return None;
    }
    u128::from_str_radix(digits, radix)
        .ok()
        .map(|magnitude| (negative, magnitude))
}

/// yaml.v2's `yamlStyleFloat`: `^[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?$`.
fn is_yaml_style_float(s: &str) -> bool {
    let b = s.as_bytes();
    let mut i = 0;
    if matches!(b.first(), Some(b'+' | b'-')) {
        i += 1;
    }
    let digits = |i: &mut usize| {
        let start = *i;
        while *i < b.len() && b[*i].is_ascii_digit() {
            *i += 1;
        }
        *i - start
    };
    if b.get(i) == Some(&b'.') {
        i += 1;
        if digits(&mut i) == 0 {
            return false;
        }
    } else {
        if digits(&mut i) == 0 {
            return false;
        }
        if b.get(i) == Some(&b'.') {
            i += 1;
            digits(&mut i);
        }
    }
    if matches!(b.get(i), Some(b'e' | b'E')) {
        i += 1;
        if matches!(b.get(i), Some(b'+' | b'-')) {
            i += 1;
        }
        if digits(&mut i) == 0 {
            return false;
        }
    }
    i == b.len()
}

/// Whether Go's `strconv.ParseFloat` accepts `s` without a range error (close enough for
/// the shapes that reach it).
fn is_float(s: &str) -> bool {
    s.parse::<f64>().is_ok_and(f64::is_finite)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolves_like_yaml_v2() {
        use Resolved::*;
        let cases = [
            ("", Null),
            ("~", Null),
            ("null", Null),
            ("yes", Bool(true)),
            ("On", Bool(true)),
            ("n", Bool(false)),
            ("OFF", Bool(false)),
            ("true1", Str),
            ("123", Int(123)),
            ("+5", Int(5)),
            ("-7", Int(-7)),
            ("0x1F", Int(31)),
            ("010", Int(8)),
            ("0o17", Int(15)),
            ("0b101", Int(5)),
            ("1_000", Int(1000)),
            ("08", Float),
            ("0800", Float),
            ("1.5", Float),
            ("1e3", Float),
            (".5", Float),
            (".inf", Float),
            ("1e400", Str),
            ("9223372036854775807", Int(i64::MAX)),
            ("-9223372036854775808", Int(i64::MIN)),
            ("9223372036854775808", Uint(1 << 63)),
            ("18446744073709551616", Float),
            ("2001-12-14", Str),
            ("50.0.0.5", Str),
            ("abc", Str),
            ("0x", Str),
            ("-", Str),
        ];
        for (text, want) in cases {
            assert_eq!(resolve_plain(text), want, "{text:?}");
        }
    }
}
