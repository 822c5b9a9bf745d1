//! Envoy's rate limit service configuration (`sluice_envoy_rules`: the YAML reader, the
//! decoder and the descriptor tree), through [`RlsConfig::from_files_with`].
//!
//! Properties: no input panics; an error names one of the files given and a line within it;
//! the corpus's `valid_*` seeds load and its `invalid_*` seeds do not; a configuration that
//! loads answers lookups (built from the keys and values its own text mentions, and from any
//! text) without panicking and consistently: a match belongs to the domain asked, counts in a
//! counter of that domain naming every entry's key, is unlimited exactly when it has no
//! unit, and the same question gets the same answer.

use bolero::check;
use sluice_envoy_rules::{Asked, LoadOptions, Match, RlsConfig, RlsConfigError, Unit};
use sluice_fuzz::{Edit, Many, Tally, Word, YAML_WORDS, apply_edits, budget, seeds, structured};

/// Keys and values of the format, for edits: its words (split at white space), then
/// fragments.
const KEYS: &str = "domain descriptors key value rate_limit unit requests_per_unit unlimited \
     shadow_mode quota_mode name replaces detailed_metric value_to_metric \
     share_threshold metadata second minute hour day week month year SECOND fortnight";
const FRAGMENTS: &[&str] = &[
    "- key: k",
    "- name: n",
    "*",
    "a*",
    "*b",
    "a*b*c",
    "[{name: x}]",
    "{unit: second, requests_per_unit: 1}",
    "- key: x\n    value: y",
];

/// The keys, values, domains and names a text mentions: what lookups should ask about.
fn mentioned(text: &str) -> Vec<String> {
    let mut words = vec![String::new(), "*".to_owned(), "unknown".to_owned()];
    for marker in ["domain:", "key:", "value:", "name:"] {
        for (i, _) in text.match_indices(marker) {
            let rest = &text[i + marker.len()..];
            let end = rest.find([',', '}', '\n']).unwrap_or(rest.len());
            let word = rest[..end].trim().trim_matches(['"', '\'']);
            words.push(word.to_owned());
            // A wildcard value: ask about a value it matches too.
            if let Some(star) = word.find('*') {
                words.push(format!("{}matched{}", &word[..star], &word[star + 1..]));
            }
        }
    }
    words.sort();
    words.dedup();
    words
}

fn names_where(e: &RlsConfigError, files: &[(String, String)]) {
    let Some((_, text)) = files.iter().find(|(name, _)| *name == e.file) else {
        panic!("the error names no file given: {e}");
    };
    assert!(!e.message.trim().is_empty(), "an empty message: {e:?}");
    if let Some(line) = e.line {
        // Lines as YAML counts them: `\r` alone and NEL, LS, PS break lines too; libyaml
        // places an error at the end of the input on the line after the last.
        let breaks = text
            .replace("\r\n", "\n")
            .matches(['\n', '\r', '\u{85}', '\u{2028}', '\u{2029}'])
            .count();
        assert!(
            line >= 1 && line <= breaks + 2,
            "line {line} of a file of {} lines: {e}",
            breaks + 1
        );
    }
}

/// One descriptor of a lookup: entries as indexes into the words, and an optional carried
/// limit (requests per unit, unit).
#[derive(Debug, arbitrary::Arbitrary)]
struct Descriptor {
    entries: Many<(Word, Word), 4>,
    limit: Option<(u32, u8)>,
}

#[derive(Debug, arbitrary::Arbitrary)]
struct Lookup {
    domain: Word,
    descriptors: Many<Descriptor, 4>,
    now_secs: u64,
}

fn check_match(m: &Match, domain: &str, entries: &[(&str, &str)], files: &[(String, String)]) {
    let rule = &m.rule;
    assert_eq!(&*rule.domain, domain);
    assert!(
        m.counter_key.starts_with(&format!("{domain}_")),
        "{} for domain {domain}",
        m.counter_key
    );
    for (key, _) in entries {
        assert!(
            m.counter_key.contains(&format!("{key}_")),
            "{} does not name {key}",
            m.counter_key
        );
    }
    assert_eq!(rule.unit.is_none(), rule.unlimited, "{rule:?}");
    assert!(
        &*rule.file == "the request" || files.iter().any(|(name, _)| **name == *rule.file),
        "{rule:?}"
    );
    assert!(!rule.location().is_empty());
}

fn lookups(config: &RlsConfig, words: &[&str], asked: &[Lookup], files: &[(String, String)]) {
    let domains: Vec<&str> = config.domains().collect();
    for d in &domains {
        assert!(config.has_domain(d));
        assert!(
            config.get_limit::<&str, &str>(d, &[]).is_none(),
            "no entries, no limit"
        );
        // Every word as a one-entry descriptor, keyed by every word.
        for key in words {
            for value in words {
                let entries = [(*key, *value)];
                let got = config.get_limit(d, &entries);
                if let Some(m) = &got {
                    check_match(m, d, &entries, files);
                }
                assert_eq!(
                    got,
                    config.get_limit(d, &entries),
                    "a second answer differs"
                );
            }
        }
    }
    for lookup in asked {
        let domain = lookup.domain.text(words);
        let owned: Vec<Vec<(&str, &str)>> = lookup
            .descriptors
            .iter()
            .map(|d| {
                d.entries
                    .iter()
                    .map(|(k, v)| (k.text(words), v.text(words)))
                    .collect()
            })
            .collect();
        let with_limits: Vec<Asked<'_, &str, &str>> = owned
            .iter()
            .zip(&lookup.descriptors)
            .map(|(entries, d)| {
                let limit = d
                    .limit
                    .map(|(rpu, unit)| (rpu, Unit::ALL[usize::from(unit) % Unit::ALL.len()]));
                (entries.as_slice(), limit)
            })
            .collect();
        let resolved = config.resolve(domain, &with_limits);
        assert_eq!(resolved.len(), owned.len());
        let plain = config.get_limits(domain, &owned);
        assert_eq!(plain.len(), owned.len());
        if !config.has_domain(domain) {
            assert!(resolved.iter().chain(&plain).all(Option::is_none));
        }
        for (i, m) in resolved.iter().enumerate() {
            let Some(m) = m else { continue };
            check_match(m, domain, &owned[i], files);
            if let Some(key) = m.reference_cache_key("prefix_", lookup.now_secs) {
                assert!(key.starts_with("prefix_"));
                let divider = m.rule.unit.map_or(1, Unit::seconds);
                let start = lookup.now_secs / divider * divider;
                assert!(key.ends_with(&start.to_string()), "{key}");
            } else {
                assert!(m.rule.unlimited);
            }
            if with_limits[i].1.is_none() {
                // Without a carried limit, resolve is get_limits (replaces included).
                assert_eq!(Some(m), plain[i].as_ref());
            }
        }
    }
}

/// Loads `files`; on success asks `asked` and the one-entry lookups of every word mentioned.
/// Returns whether it loaded.
fn load_and_ask(files: &[(String, String)], merge: bool, asked: &[Lookup]) -> bool {
    let options = LoadOptions {
        merge_domains: merge,
        ignore_dot_files: false,
    };
    match RlsConfig::from_files_with(files, &options) {
        Ok(config) => {
            let all: String = files.iter().map(|(_, t)| t.as_str()).collect();
            let mut words = mentioned(&all);
            words.truncate(24);
            let words: Vec<&str> = words.iter().map(String::as_str).collect();
            lookups(&config, &words, asked, files);
            true
        }
        Err(e) => {
            names_where(&e, files);
            false
        }
    }
}

/// Any bytes as one configuration file.
#[test]
fn text() {
    let tally = Tally::new("rls::text");
    check!().with_test_time(budget()).for_each(|bytes: &[u8]| {
        let files = [(
            "fuzz.yaml".to_owned(),
            String::from_utf8_lossy(bytes).into_owned(),
        )];
        tally.input(load_and_ask(&files, false, &[]));
    });
}

#[derive(Debug, arbitrary::Arbitrary)]
struct Edited {
    /// Which seeds, as files `0.yaml`, `1.yaml`, … (one to three).
    seeds: (u8, Option<u8>, Option<u8>),
    edits: Many<Edit, 8>,
    merge: bool,
    lookups: Many<Lookup, 4>,
}

/// The corpus's files, one to three at a time, structurally edited, loaded with and without
/// merged domains, then asked arbitrary lookups.
#[test]
fn edits() {
    let tally = Tally::new("rls::edits");
    let seeds = seeds("rls__text");
    assert!(!seeds.is_empty(), "the rls corpus is missing");
    let words: Vec<&str> = KEYS
        .split_whitespace()
        .chain(FRAGMENTS.iter().chain(YAML_WORDS).copied())
        .collect();
    check!().with_test_time(budget()).for_each(|bytes: &[u8]| {
        let Some(input) = structured::<Edited>(bytes) else {
            return;
        };
        let (a, b, c) = input.seeds;
        let mut files: Vec<(String, String)> = [Some(a), b, c]
            .into_iter()
            .flatten()
            .enumerate()
            .map(|(i, s)| {
                let (_, text) = &seeds[usize::from(s) % seeds.len()];
                (format!("{i}.yaml"), text.clone())
            })
            .collect();
        // The edits apply to the first file.
        files[0].1 = apply_edits(&files[0].1, &input.edits, &words);
        tally.input(load_and_ask(&files, input.merge, &input.lookups));
    });
}

/// The corpus says which of its seeds are valid: those load, the others fail naming where.
#[test]
fn corpus_seeds_load_as_named() {
    let seeds = seeds("rls__text");
    assert!(seeds.len() >= 10, "{} seeds", seeds.len());
    for (name, text) in &seeds {
        let files = [(name.clone(), text.clone())];
        match RlsConfig::from_files(&files) {
            Ok(config) => {
                assert!(name.starts_with("valid_"), "{name} loads");
                assert!(!config.is_empty(), "{name}");
                let words = mentioned(text);
                let words: Vec<&str> = words.iter().map(String::as_str).collect();
                lookups(&config, &words, &[], &files);
            }
            Err(e) => {
                assert!(name.starts_with("invalid_"), "{name}: {e}");
                names_where(&e, &files);
            }
        }
    }
}
