//! Fuzz targets for Sluice, and what they share.
//!
//! The targets live in `tests/targets/` as [`bolero`] harnesses, one test each:
//!
//! | target | what it feeds | what it holds |
//! |---|---|---|
//! | `config::text`, `config::edits` | the server's YAML configuration: any bytes; the corpus's files structurally edited | no panic; an error names its file and a line, or the field at fault; a loaded file's policies load again, identical, when written back out |
//! | `rls::text`, `rls::edits` | Envoy rate limit service YAML files, one to three at a time | no panic; an error names a file given and a line within it; a loaded configuration answers lookups consistently |
//! | `http::raw`, `http::structured_sessions` | requests to the real axum router on the memory store: HTTP text, or sessions of up to 8 requests built from the API's vocabulary | never a 5xx; every error is JSON naming the problem; a refused or read-only request changes no state |
//! | `reply::decode` | reply trees of the Lua function, to the reply decoder | a typed error exactly when the reply is not in the documented layout; otherwise a decision saying what the reply said; rendering it never panics |
//! | `reply::decode_lean` | reply trees and integer arrays of any length, to the lean path's decoder (the state each limit's script read, evaluated by the core) | a typed error or a decision of the policy's limits, never a panic, whatever state the reply claims; rendering it never panics |
//! | `algorithms::model` | policies of 1 to 4 limits, up to 64 checks, peeks, refunds and acquires, a clock that jumps and goes back | the core agrees with a naive model on every limit's answer |
//!
//! The `config` and `rls` targets also have a plain test that every `valid_*` seed of their
//! corpus loads and every `invalid_*` seed is refused naming where.
//!
//! On stable Rust each target is an ordinary `#[test]`: bolero first replays the committed
//! corpus (`tests/targets/__fuzz__/<target>/corpus/`, plus any `crashes/`), then generates
//! random inputs for [`budget`] (`SLUICE_FUZZ_SECS`, default 2 s per target). bolero's
//! random run on stable generates inputs; it does not mutate the corpus, so the structured
//! targets do the mutating themselves ([`Edit`]s of the committed seeds). On nightly the same
//! targets run under a coverage-guided engine with `cargo +nightly bolero test --package
//! sluice-fuzz --engine libfuzzer <target>` (or `--engine afl`), which grows the corpus
//! directory in place. docs/security.md#fuzzing has the commands and the figures
//! of the last long run.
//!
//! Every target takes bytes, as any engine supplies them. Some read them as they are (so a
//! seed is a real file: a configuration, an HTTP request); the others read a value derived
//! with [`arbitrary`] from them ([`structured`]).

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use arbitrary::Arbitrary;

/// The default length of one target's random run on stable.
pub const DEFAULT_SECS: f64 = 2.0;

/// How long one target generates random inputs after its corpus: `SLUICE_FUZZ_SECS`
/// (seconds, fractions allowed), default [`DEFAULT_SECS`]. bolero's own
/// `BOLERO_RANDOM_TEST_TIME_MS` and `BOLERO_RANDOM_ITERATIONS` take precedence when set.
pub fn budget() -> Duration {
    let secs = std::env::var("SLUICE_FUZZ_SECS")
        .ok()
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s >= 0.0)
        .unwrap_or(DEFAULT_SECS);
    Duration::from_secs_f64(secs)
}

/// Counts the inputs a target ran and how many reached its deepest checks ("valid": a
/// configuration that loaded, a reply that decoded), and prints both when dropped (seen with
/// `--nocapture`, or in nextest's output of a failing test).
#[derive(Debug)]
pub struct Tally {
    target: &'static str,
    inputs: AtomicU64,
    valid: AtomicU64,
}

impl Tally {
    /// A tally for `target`.
    pub fn new(target: &'static str) -> Self {
        Self {
            target,
            inputs: AtomicU64::new(0),
            valid: AtomicU64::new(0),
        }
    }

    /// One input ran; `valid` when it reached the checks of a valid input.
    pub fn input(&self, valid: bool) {
        self.inputs.fetch_add(1, Ordering::Relaxed);
        if valid {
            self.valid.fetch_add(1, Ordering::Relaxed);
        }
    }
}

impl Drop for Tally {
    fn drop(&mut self) {
        let (inputs, valid) = (self.inputs.get_mut(), self.valid.get_mut());
        println!(
            "fuzz target {}: {inputs} inputs, {valid} valid",
            self.target
        );
    }
}

/// The structured input that `bytes` encode, as `cargo fuzz` targets read theirs: the whole
/// input through [`Arbitrary::arbitrary_take_rest`]. Every target takes bytes, so any engine
/// (bolero's random run, libFuzzer, AFL) can drive it and a corpus file is just bytes.
///
/// An input shorter than [`WIDE`] bytes is first extended to it by a generator seeded from
/// the input itself ([`widen`]): bolero's random run mostly generates inputs of a few dozen
/// bytes, which `arbitrary` reads as a policy and no operations. The input's own bytes come
/// first, so an engine's mutations still change the value where they change the bytes.
pub fn structured<T: for<'a> Arbitrary<'a>>(bytes: &[u8]) -> Option<T> {
    let wide = widen(bytes);
    T::arbitrary_take_rest(arbitrary::Unstructured::new(&wide)).ok()
}

/// A list of at most `N` values whose length is read first. `arbitrary`'s own `Vec` decides
/// element by element whether to go on, so random bytes make lists of one or two; a sequence
/// of operations needs dozens.
#[derive(Debug, Clone)]
pub struct Many<T, const N: usize>(pub Vec<T>);

impl<'a, T: Arbitrary<'a>, const N: usize> Arbitrary<'a> for Many<T, N> {
    fn arbitrary(u: &mut arbitrary::Unstructured<'a>) -> arbitrary::Result<Self> {
        let n = u.int_in_range(0..=N)?;
        (0..n)
            .map(|_| T::arbitrary(u))
            .collect::<arbitrary::Result<Vec<T>>>()
            .map(Many)
    }
}

impl<T, const N: usize> std::ops::Deref for Many<T, N> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        &self.0
    }
}

impl<'m, T, const N: usize> IntoIterator for &'m Many<T, N> {
    type Item = &'m T;
    type IntoIter = std::slice::Iter<'m, T>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

/// The length [`widen`] extends inputs to.
pub const WIDE: usize = 1024;

/// `bytes`, followed by SplitMix64 output seeded with their FNV-1a hash up to [`WIDE`] bytes.
pub fn widen(bytes: &[u8]) -> Vec<u8> {
    let mut out = bytes.to_vec();
    let mut state = bytes.iter().fold(0xcbf2_9ce4_8422_2325_u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    while out.len() < WIDE {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        out.extend_from_slice(&(z ^ (z >> 31)).to_le_bytes());
    }
    out
}

/// The corpus directory of a target, as bolero finds it.
pub fn corpus_dir(target: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/targets/__fuzz__")
        .join(target)
        .join("corpus")
}

/// The files of a target's corpus as `(file name, text)`, by name (bytes that are not UTF-8
/// read as U+FFFD). Structured targets use another target's corpus as their seeds.
pub fn seeds(target: &str) -> Vec<(String, String)> {
    let mut found: Vec<(String, String)> = std::fs::read_dir(corpus_dir(target))
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .filter_map(|entry| {
            let name = entry.file_name().to_string_lossy().into_owned();
            let bytes = std::fs::read(entry.path()).ok()?;
            Some((name, String::from_utf8_lossy(&bytes).into_owned()))
        })
        .collect();
    found.sort();
    found
}

/// A word to put somewhere: one of the target's dictionary (`Known`, an index taken modulo
/// its length) or any text.
#[derive(Debug, Clone, Arbitrary)]
pub enum Word {
    /// A dictionary word.
    Known(u8),
    /// Anything.
    Free(String),
}

impl Word {
    /// The text of the word under `dictionary`.
    pub fn text<'a>(&'a self, dictionary: &[&'a str]) -> &'a str {
        match self {
            Word::Known(i) if !dictionary.is_empty() => {
                dictionary[usize::from(*i) % dictionary.len()]
            }
            Word::Known(_) => "",
            Word::Free(s) => s,
        }
    }
}

/// One structural change to a text document, by line (indexes are taken modulo the number
/// of lines). These are the mistakes people make in YAML: a line lost, doubled or moved, a
/// value or key replaced, an indentation off, a stray character, a file cut short.
#[derive(Debug, Clone, Arbitrary)]
pub enum Edit {
    /// Removes a line.
    DeleteLine(u16),
    /// Writes a line twice.
    DuplicateLine(u16),
    /// Swaps two lines.
    SwapLines(u16, u16),
    /// Replaces what follows the first `:` of a line (or the whole line).
    ReplaceValue(u16, Word),
    /// Replaces what precedes the first `:` of a line, keeping its indentation.
    ReplaceKey(u16, Word),
    /// Indents a line by `n` more spaces (negative: fewer).
    Indent(u16, i8),
    /// Inserts a word at a byte offset of a line.
    Insert(u16, u8, Word),
    /// Adds a line `  key: value` after a line, at that line's indentation.
    AddEntry(u16, Word, Word),
    /// Cuts the document after a number of lines.
    Truncate(u16),
}

/// `text` with `edits` applied in order under `dictionary`.
pub fn apply_edits(text: &str, edits: &[Edit], dictionary: &[&str]) -> String {
    let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
    for edit in edits {
        if lines.is_empty() {
            lines.push(String::new());
        }
        let n = lines.len();
        let at = |i: &u16| usize::from(*i) % n;
        match edit {
            Edit::DeleteLine(i) => {
                lines.remove(at(i));
            }
            Edit::DuplicateLine(i) => {
                let line = lines[at(i)].clone();
                lines.insert(at(i), line);
            }
            Edit::SwapLines(a, b) => lines.swap(at(a), at(b)),
            Edit::ReplaceValue(i, w) => {
                let line = &mut lines[at(i)];
                match line.find(':') {
                    Some(c) => {
                        line.truncate(c + 1);
                        line.push(' ');
                        line.push_str(w.text(dictionary));
                    }
                    None => *line = w.text(dictionary).to_owned(),
                }
            }
            Edit::ReplaceKey(i, w) => {
                let line = &mut lines[at(i)];
                let indent = line.len() - line.trim_start_matches([' ', '-']).len();
                let rest = line
                    .find(':')
                    .map_or(String::new(), |c| line[c..].to_owned());
                *line = format!("{}{}{rest}", &line[..indent], w.text(dictionary));
            }
            Edit::Indent(i, by) => {
                let line = &mut lines[at(i)];
                if *by >= 0 {
                    line.insert_str(0, &" ".repeat(usize::from(by.unsigned_abs() % 9)));
                } else {
                    let spaces = line.len() - line.trim_start_matches(' ').len();
                    let cut = spaces.min(usize::from(by.unsigned_abs() % 9));
                    line.replace_range(..cut, "");
                }
            }
            Edit::Insert(i, offset, w) => {
                let line = &mut lines[at(i)];
                let mut pos = usize::from(*offset).min(line.len());
                while !line.is_char_boundary(pos) {
                    pos -= 1;
                }
                line.insert_str(pos, w.text(dictionary));
            }
            Edit::AddEntry(i, k, v) => {
                let line = &lines[at(i)];
                let indent = line.len() - line.trim_start_matches([' ', '-']).len();
                let entry = format!(
                    "{}{}: {}",
                    " ".repeat(indent),
                    k.text(dictionary),
                    v.text(dictionary)
                );
                lines.insert(at(i) + 1, entry);
            }
            Edit::Truncate(i) => lines.truncate(at(i)),
        }
    }
    let mut out = lines.join("\n");
    out.push('\n');
    out
}

/// One change to the bytes of a seed: what a mutational fuzzer does to its corpus, for the
/// targets whose inputs are raw bytes.
#[derive(Debug, Clone, Arbitrary)]
pub enum ByteEdit {
    /// XORs the byte at an offset (taken modulo the length).
    Flip(u16, u8),
    /// Inserts a dictionary word or any text at an offset.
    Insert(u16, Word),
    /// Removes up to `n` bytes at an offset.
    Delete(u16, u8),
    /// Repeats up to `n` bytes at an offset.
    Repeat(u16, u8),
    /// Cuts the input at an offset.
    Truncate(u16),
}

/// `seed` with `edits` applied in order under `dictionary`.
pub fn apply_byte_edits(seed: &[u8], edits: &[ByteEdit], dictionary: &[&str]) -> Vec<u8> {
    let mut out = seed.to_vec();
    for edit in edits {
        let at = |i: &u16| usize::from(*i) % (out.len() + 1);
        match edit {
            ByteEdit::Flip(i, x) => {
                if !out.is_empty() {
                    let i = usize::from(*i) % out.len();
                    out[i] ^= x | 1;
                }
            }
            ByteEdit::Insert(i, w) => {
                let i = at(i);
                out.splice(i..i, w.text(dictionary).bytes());
            }
            ByteEdit::Delete(i, n) => {
                let i = at(i);
                let end = (i + usize::from(*n)).min(out.len());
                out.drain(i..end);
            }
            ByteEdit::Repeat(i, n) => {
                let i = at(i);
                let end = (i + usize::from(*n)).min(out.len());
                let copy = out[i..end].to_vec();
                out.splice(end..end, copy);
            }
            ByteEdit::Truncate(i) => {
                let i = at(i);
                out.truncate(i);
            }
        }
    }
    out
}

/// Words every YAML target tries: scalars YAML reads in surprising ways, numbers at the edges
/// of Sluice's ranges, and syntax that changes a document's shape.
pub const YAML_WORDS: &[&str] = &[
    "0",
    "1",
    "-1",
    "20",
    "1.5",
    "1e3",
    "0x10",
    "0o17",
    ".inf",
    ".nan",
    "9007199254740992",
    "9007199254740993",
    "18446744073709551615",
    "18446744073709551616",
    "4294967295",
    "4294967296",
    "-9223372036854775808",
    "true",
    "false",
    "yes",
    "no",
    "on",
    "off",
    "null",
    "~",
    "\"\"",
    "''",
    "[]",
    "{}",
    "[1, 2]",
    "{a: 1}",
    "&anchor 1",
    "*anchor",
    "!!str 5",
    "!!binary aGk=",
    "!custom x",
    "|\n  block",
    ">-",
    "- item",
    "? complex",
    "\"\\u0000\"",
    "\"\\xff\"",
    "é",
    "\t",
    "#",
    "---",
    "...",
    "%YAML 1.2",
    "<<: *anchor",
];
