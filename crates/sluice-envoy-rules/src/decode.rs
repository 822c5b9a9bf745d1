//! Decoding one configuration file into descriptors, with the reference service's checks.
//!
//! Mirrors `ConfigFileContentToYaml` in the reference's `src/config/config_impl.go`: the file
//! is first checked generically (`validateYamlKeys`: every mapping key anywhere must be a
//! string from one fixed list, lists may hold only mappings, scalars may not be
//! floating-point numbers), then decoded into its structs with yaml.v2's non-strict
//! `Unmarshal` (a known key in the wrong place is ignored; a key written twice keeps its last
//! value; fields take yaml.v2's conversions). Sluice reports the ignored cases as warnings.

use crate::error::{RlsConfigError, RlsConfigWarning, suggestion};
use crate::scalar::Resolved;
use crate::yaml::{self, Lines, Node, NodeKind};

mod fields;

/// The keys the reference accepts anywhere in a file (`validKeys` in `config_impl.go`, as of
/// the version with `quota_mode`, `value_to_metric` and `share_threshold`).
pub(super) const VALID_KEYS: &[&str] = &[
    "domain",
    "key",
    "value",
    "descriptors",
    "rate_limit",
    "unit",
    "requests_per_unit",
    "unlimited",
    "shadow_mode",
    "quota_mode",
    "name",
    "replaces",
    "detailed_metric",
    "value_to_metric",
    "share_threshold",
    "metadata",
];

const ROOT_FIELDS: &[&str] = &["domain", "descriptors"];
const DESCRIPTOR_FIELDS: &[&str] = &[
    "key",
    "value",
    "rate_limit",
    "descriptors",
    "shadow_mode",
    "quota_mode",
    "detailed_metric",
    "value_to_metric",
    "share_threshold",
    "metadata",
];
const RATE_LIMIT_FIELDS: &[&str] = &["requests_per_unit", "unit", "unlimited", "name", "replaces"];
const REPLACES_FIELDS: &[&str] = &["name"];

/// A decoded file (`YamlRoot`).
#[derive(Debug, Default)]
pub(super) struct YamlRoot {
    pub(super) domain: String,
    /// The line of `domain:`.
    pub(super) domain_line: Option<usize>,
    pub(super) descriptors: Vec<YamlDescriptor>,
}

/// A decoded descriptor (`YamlDescriptor`), with where it was written.
#[derive(Debug, Default)]
pub(super) struct YamlDescriptor {
    pub(super) key: String,
    pub(super) value: String,
    pub(super) rate_limit: Option<YamlRateLimit>,
    pub(super) descriptors: Vec<YamlDescriptor>,
    pub(super) shadow_mode: bool,
    pub(super) quota_mode: bool,
    pub(super) detailed_metric: bool,
    pub(super) value_to_metric: bool,
    pub(super) share_threshold: bool,
    /// Its YAML path, `descriptors[0].descriptors[2]`.
    pub(super) path: String,
    /// The line of its `key:` (or of its first key).
    pub(super) line: Option<usize>,
}

/// A decoded `rate_limit` block (`YamlRateLimit`).
#[derive(Debug, Default)]
pub(super) struct YamlRateLimit {
    pub(super) requests_per_unit: u32,
    /// The line of `requests_per_unit:`, when written.
    pub(super) requests_per_unit_line: Option<usize>,
    pub(super) unit: String,
    /// The line of `unit:`, when written.
    pub(super) unit_line: Option<usize>,
    pub(super) unlimited: bool,
    pub(super) name: String,
    /// Each `replaces` entry's name and line.
    pub(super) replaces: Vec<(String, Option<usize>)>,
    /// The line of `rate_limit:`.
    pub(super) line: Option<usize>,
}

/// One mapping entry after merge keys are applied: the key's text, the key and the value.
type Entry<'n> = (&'n str, &'n Node, &'n Node);

/// Decodes one file.
pub(super) fn decode_file(
    file: &str,
    text: &str,
    warnings: &mut Vec<RlsConfigWarning>,
) -> Result<YamlRoot, RlsConfigError> {
    let mut decoder = Decoder {
        file,
        lines: Lines::new(text),
        warnings,
    };
    decoder.decode(text)
}

struct Decoder<'a> {
    file: &'a str,
    lines: Lines,
    warnings: &'a mut Vec<RlsConfigWarning>,
}

impl Decoder<'_> {
    fn line_of(&self, node: &Node) -> Option<usize> {
        node.offset.map(|offset| self.lines.line(offset))
    }

    fn error(&self, line: Option<usize>, message: impl Into<String>) -> RlsConfigError {
        RlsConfigError::new(self.file, line, message)
    }

    fn warn(&mut self, line: Option<usize>, message: impl Into<String>) {
        self.warnings.push(RlsConfigWarning {
            file: self.file.to_owned(),
            line,
            message: message.into(),
        });
    }

    fn decode(&mut self, text: &str) -> Result<YamlRoot, RlsConfigError> {
        let document = yaml::parse(text).map_err(|err| {
            self.error(err.line, format!("this is not valid YAML: {}", err.message))
        })?;
        if document.more_documents {
            self.warn(
                None,
                "the file holds more than one YAML document (separated by `---`); only the \
                 first is read, as the reference service does",
            );
        }
        let root = &document.root;
        match &root.kind {
            NodeKind::Map(_) => {}
            _ if root.is_null() => {}
            _ => {
                return Err(self.error(
                    self.line_of(root),
                    format!(
                        "a configuration file must be a YAML mapping with `domain` and \
                         `descriptors`, but this file is {} (every file under the \
                         configuration directory is read as a configuration, as the reference \
                         service reads them)",
                        root.describe()
                    ),
                ));
            }
        }
        self.validate_keys(root, "")?;
        self.decode_root(root)
    }

    /// The entries of a mapping as yaml.v2 sees them: merge keys (`<<: *anchor`) expanded,
    /// a key written twice keeping its last value, non-string keys rejected. With the
    /// mapping's `fields` (while decoding; validating passes none, so each is said once), a
    /// key written twice and a key that is not one of them are warned about.
    fn entries<'n>(
        &mut self,
        map: &'n Node,
        path: &str,
        fields: Option<&[&str]>,
    ) -> Result<Vec<Entry<'n>>, RlsConfigError> {
        let mut out: Vec<Entry<'n>> = Vec::new();
        let mut explicit: Vec<&str> = Vec::new();
        self.collect_entries(map, path, &mut out, fields.map(|_| &mut explicit))?;
        if let Some(fields) = fields {
            self.warn_misplaced(&out, fields, path);
        }
        Ok(out)
    }

    fn collect_entries<'n>(
        &mut self,
        map: &'n Node,
        path: &str,
        out: &mut Vec<Entry<'n>>,
        mut explicit: Option<&mut Vec<&'n str>>,
    ) -> Result<(), RlsConfigError> {
        let NodeKind::Map(entries) = &map.kind else {
            return Ok(());
        };
        for (key, value) in entries {
            if let NodeKind::Scalar { text, plain: true } = &key.kind
                && text == "<<"
            {
                self.merge(value, path, out)?;
                continue;
            }
            let text = match (&key.kind, key.resolved()) {
                (NodeKind::Scalar { text, .. }, Some(Resolved::Str)) => text.as_str(),
                _ => {
                    let shown = key.text().map_or_else(|| key.describe(), str::to_owned);
                    return Err(self.error(
                        self.line_of(key).or(self.line_of(map)),
                        format!(
                            "{}key {shown} is not a string; keys are names such as `key`, \
                             `value` or `rate_limit`",
                            at(path)
                        ),
                    ));
                }
            };
            if let Some(seen) = explicit.as_mut() {
                let again = seen.contains(&text);
                seen.push(text);
                if again {
                    let line = self.line_of(key);
                    self.warn(
                        line,
                        format!(
                            "{}key `{text}` is written more than once; the last one is used, \
                             as in the reference service",
                            at(path)
                        ),
                    );
                }
            }
            if let Some(existing) = out.iter_mut().find(|(name, _, _)| *name == text) {
                *existing = (text, key, value);
            } else {
                out.push((text, key, value));
            }
        }
        Ok(())
    }

    /// yaml.v2's `merge`: a mapping, or a list of mappings where earlier ones win.
    fn merge<'n>(
        &mut self,
        value: &'n Node,
        path: &str,
        out: &mut Vec<Entry<'n>>,
    ) -> Result<(), RlsConfigError> {
        match &value.kind {
            NodeKind::Map(_) => self.collect_entries(value, path, out, None),
            NodeKind::Seq(items) if items.iter().all(|i| matches!(i.kind, NodeKind::Map(_))) => {
                for item in items.iter().rev() {
                    self.collect_entries(item, path, out, None)?;
                }
                Ok(())
            }
            _ => Err(self.error(
                self.line_of(value),
                format!(
                    "{}a merge key `<<` needs a mapping or a list of mappings, found {}",
                    at(path),
                    value.describe()
                ),
            )),
        }
    }

    /// `validateYamlKeys`: keys valid anywhere, lists of mappings only, no floats.
    fn validate_keys(&mut self, map: &Node, path: &str) -> Result<(), RlsConfigError> {
        for (key, key_node, value) in self.entries(map, path, None)? {
            if !VALID_KEYS.contains(&key) {
                let hint = suggestion(key, VALID_KEYS)
                    .map(|s| format!("did you mean `{s}`? "))
                    .unwrap_or_default();
                return Err(self.error(
                    self.line_of(key_node),
                    format!(
                        "{}unknown key `{key}`; {hint}the keys a rate limit configuration may \
                         use are {}",
                        at(path),
                        VALID_KEYS.join(", ")
                    ),
                ));
            }
            let child = join(path, key);
            if key == "metadata" {
                // Free-form, as in the reference: its keys and values are not validated.
                // (It feeds the reference's RESPONSE_DYNAMIC_METADATA, which Sluice does not
                // send; see docs/server.md.)
                continue;
            }
            match &value.kind {
                NodeKind::Seq(items) => {
                    for (i, item) in items.iter().enumerate() {
                        let item_path = format!("{child}[{i}]");
                        if !matches!(item.kind, NodeKind::Map(_)) {
                            return Err(self.error(
                                self.line_of(item).or(self.line_of(key_node)),
                                format!(
                                    "{item_path}: a list item must be a mapping (such as \
                                     `- key: ...`), found {}",
                                    item.describe()
                                ),
                            ));
                        }
                        self.validate_keys(item, &item_path)?;
                    }
                }
                NodeKind::Map(_) => self.validate_keys(value, &child)?,
                NodeKind::Scalar { text, .. } => {
                    let why = match value.resolved() {
                        Some(Resolved::Float) => {
                            "read as a floating-point number, which the reference service rejects"
                        }
                        Some(Resolved::Uint(_)) => "too large a number for the reference service",
                        _ => continue,
                    };
                    return Err(self.error(
                        self.line_of(value).or(self.line_of(key_node)),
                        format!(
                            "{child}: {text} is {why}; quote it (\"{text}\") if it is meant as text"
                        ),
                    ));
                }
            }
        }
        Ok(())
    }

    /// Warns about keys that are valid somewhere but not in this mapping (yaml.v2 ignores
    /// them when it fills the struct).
    fn warn_misplaced(&mut self, entries: &[Entry<'_>], fields: &[&str], path: &str) {
        for (key, key_node, _) in entries {
            if !fields.contains(key) {
                let home = match *key {
                    "domain" => "at the top of the file",
                    "descriptors" => "in a descriptor or at the top of the file",
                    k if DESCRIPTOR_FIELDS.contains(&k) => "in a descriptor",
                    k if RATE_LIMIT_FIELDS.contains(&k) => "in a `rate_limit` block",
                    _ => "elsewhere",
                };
                let where_ = if path.is_empty() {
                    "at the top of the file".to_owned()
                } else {
                    format!("in {path}")
                };
                let line = self.line_of(key_node);
                self.warn(
                    line,
                    format!(
                        "key `{key}` has no effect {where_} and is ignored, as the reference \
                         service ignores it; it belongs {home}"
                    ),
                );
            }
        }
    }

    fn decode_root(&mut self, root: &Node) -> Result<YamlRoot, RlsConfigError> {
        let entries = self.entries(root, "", Some(ROOT_FIELDS))?;
        let mut out = YamlRoot::default();
        for (key, key_node, value) in entries {
            match key {
                "domain" => {
                    out.domain = self.string(value, "domain", key_node)?;
                    out.domain_line = self.line_of(key_node);
                }
                "descriptors" => {
                    out.descriptors = self.descriptors(value, "descriptors", key_node)?
                }
                _ => {}
            }
        }
        Ok(out)
    }

    fn descriptors(
        &mut self,
        list: &Node,
        path: &str,
        key_node: &Node,
    ) -> Result<Vec<YamlDescriptor>, RlsConfigError> {
        self.list(list, path, key_node, "descriptors (`- key: ...`)")?
            .iter()
            .enumerate()
            .map(|(i, item)| self.descriptor(item, &format!("{path}[{i}]")))
            .collect()
    }

    fn descriptor(&mut self, node: &Node, path: &str) -> Result<YamlDescriptor, RlsConfigError> {
        let entries = self.entries(node, path, Some(DESCRIPTOR_FIELDS))?;
        let mut out = YamlDescriptor {
            path: path.to_owned(),
            line: self.line_of(node),
            ..YamlDescriptor::default()
        };
        for (key, key_node, value) in entries {
            let child = join(path, key);
            match key {
                "key" => {
                    out.key = self.string(value, &child, key_node)?;
                    out.line = self.line_of(key_node).or(out.line);
                }
                "value" => out.value = self.string(value, &child, key_node)?,
                "rate_limit" => out.rate_limit = self.rate_limit(value, &child, key_node)?,
                "descriptors" => out.descriptors = self.descriptors(value, &child, key_node)?,
                "shadow_mode" => out.shadow_mode = self.boolean(value, &child, key_node)?,
                "quota_mode" => out.quota_mode = self.boolean(value, &child, key_node)?,
                "detailed_metric" => out.detailed_metric = self.boolean(value, &child, key_node)?,
                "value_to_metric" => out.value_to_metric = self.boolean(value, &child, key_node)?,
                "share_threshold" => out.share_threshold = self.boolean(value, &child, key_node)?,
                _ => {}
            }
        }
        Ok(out)
    }

    /// `rate_limit` is a pointer in the reference: null (or absent) means no limit.
    fn rate_limit(
        &mut self,
        node: &Node,
        path: &str,
        key_node: &Node,
    ) -> Result<Option<YamlRateLimit>, RlsConfigError> {
        if node.is_null() {
            return Ok(None);
        }
        if !matches!(node.kind, NodeKind::Map(_)) {
            return Err(self.error(
                self.line_of(node).or(self.line_of(key_node)),
                format!(
                    "{path}: expected a mapping with `unit` and `requests_per_unit` (or \
                     `unlimited: true`), found {}",
                    node.describe()
                ),
            ));
        }
        let entries = self.entries(node, path, Some(RATE_LIMIT_FIELDS))?;
        let mut out = YamlRateLimit {
            line: self.line_of(key_node),
            ..YamlRateLimit::default()
        };
        for (key, key_node, value) in entries {
            let child = join(path, key);
            match key {
                "requests_per_unit" => {
                    out.requests_per_unit = self.uint32(value, &child, key_node)?;
                    out.requests_per_unit_line = self.line_of(key_node);
                }
                "unit" => {
                    out.unit = self.string(value, &child, key_node)?;
                    out.unit_line = self.line_of(key_node);
                }
                "unlimited" => out.unlimited = self.boolean(value, &child, key_node)?,
                "name" => out.name = self.string(value, &child, key_node)?,
                "replaces" => {
                    let items = self.list(value, &child, key_node, "`- name: ...` entries")?;
                    for (i, item) in items.iter().enumerate() {
                        let item_path = format!("{child}[{i}]");
                        let entries = self.entries(item, &item_path, Some(REPLACES_FIELDS))?;
                        let mut name = String::new();
                        for (key, key_node, value) in entries {
                            if key == "name" {
                                name = self.string(value, &join(&item_path, key), key_node)?;
                            }
                        }
                        out.replaces.push((name, self.line_of(item)));
                    }
                }
                _ => {}
            }
        }
        Ok(Some(out))
    }
}

/// `path: ` for messages, or nothing at the top of the file.
fn at(path: &str) -> String {
    if path.is_empty() {
        String::new()
    } else {
        format!("{path}: ")
    }
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_owned()
    } else {
        format!("{path}.{key}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode(text: &str) -> (Result<YamlRoot, RlsConfigError>, Vec<RlsConfigWarning>) {
        let mut warnings = Vec::new();
        let result = decode_file("t.yaml", text, &mut warnings);
        (result, warnings)
    }

    #[test]
    fn scalars_convert_as_in_yaml_v2() {
        let (root, warnings) = decode(
            "domain: d\ndescriptors:\n  - key: k\n    value: 0x1F\n    shadow_mode: yes\n    \
             rate_limit:\n      unit: Second\n      requests_per_unit: 010\n",
        );
        let root = root.unwrap();
        assert!(warnings.is_empty(), "{warnings:?}");
        let d = &root.descriptors[0];
        assert_eq!(d.value, "0x1F");
        assert!(d.shadow_mode);
        let rl = d.rate_limit.as_ref().unwrap();
        assert_eq!((rl.unit.as_str(), rl.requests_per_unit), ("Second", 8));
        assert_eq!((d.line, rl.unit_line), (Some(3), Some(7)));
    }

    #[test]
    fn merge_keys_and_duplicates() {
        let (root, warnings) =
            decode("domain: d\nbase: &b\n  unit: minute\n  requests_per_unit: 5\n");
        // `base` is not a valid key: rejected before anything else.
        assert!(root.unwrap_err().message.contains("unknown key `base`"));
        assert!(warnings.is_empty());

        let (root, warnings) = decode(
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit: &rl\n      unit: minute\n      \
             requests_per_unit: 5\n  - key: b\n    rate_limit:\n      <<: *rl\n      \
             requests_per_unit: 7\n  - key: c\n    key: c2\n",
        );
        let root = root.unwrap();
        let b = root.descriptors[1].rate_limit.as_ref().unwrap();
        assert_eq!((b.unit.as_str(), b.requests_per_unit), ("minute", 7));
        assert_eq!(root.descriptors[2].key, "c2");
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert_eq!(warnings[0].line, Some(12));
    }

    #[test]
    fn null_rate_limit_means_no_limit() {
        let (root, _) = decode("domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n");
        assert!(root.unwrap().descriptors[0].rate_limit.is_none());
        let (root, _) = decode("domain: d\ndescriptors:\n  - key: a\n    rate_limit: {}\n");
        assert!(root.unwrap().descriptors[0].rate_limit.is_some());
    }
}
