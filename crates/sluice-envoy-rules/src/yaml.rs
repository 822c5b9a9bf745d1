//! A YAML reader that sees a file the way the reference service's YAML library does.
//!
//! The reference service (github.com/envoyproxy/ratelimit) reads its files with
//! `gopkg.in/yaml.v2` (`src/config/config_impl.go`, `ConfigFileContentToYaml`). That library
//! follows YAML 1.1: `yes`/`no`/`on`/`off`/`y`/`n` are booleans, `010` is an octal integer,
//! `08` is a float, and a string field takes the *raw text* of whatever scalar is there
//! (`value: 0x1F` is the string `"0x1F"`, not `"31"`). `serde_yaml_ng` follows YAML 1.2 and
//! resolves scalars differently, so this module does not use its resolution: it reads every
//! scalar as its raw text, remembers whether it was quoted, and resolves plain scalars with
//! yaml.v2's rules ([`crate::scalar`]).
//!
//! It also keeps the byte offset of every scalar, so that errors can name a line: the
//! deserializer hands out scalars as slices of the input, and the slice's address gives its
//! offset. That needs to know in advance whether the next node is a scalar (read as a string)
//! or a collection, so a file is read twice: once to learn its shape, once to read it.
//!
//! Not interpreted (they are rare in rate limit files): explicit tags such as `!!str 5`, which
//! yaml.v2 honours and this reader ignores (the raw text is kept, resolved as if untagged).

use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};

use crate::scalar::{Resolved, resolve_plain};

/// One node of a YAML document.
#[derive(Debug, Clone)]
pub(super) struct Node {
    /// What the node is.
    pub(super) kind: NodeKind,
    /// Byte offset in the file: of the scalar's text, of a mapping's first key, of a
    /// sequence's first item. `None` where it is not known (escaped or block scalars, empty
    /// collections).
    pub(super) offset: Option<usize>,
}

/// The kinds of YAML nodes.
#[derive(Debug, Clone)]
pub(super) enum NodeKind {
    /// A scalar: its text (unquoted and unescaped) and whether it was written plain
    /// (without quotes; only plain scalars can be null, booleans or numbers).
    Scalar { text: String, plain: bool },
    /// A mapping, its entries in file order (duplicates and merge keys `<<` included).
    Map(Vec<(Node, Node)>),
    /// A sequence.
    Seq(Vec<Node>),
}

impl Node {
    /// A null node, standing for an empty document.
    fn null() -> Self {
        Self {
            kind: NodeKind::Scalar {
                text: String::new(),
                plain: true,
            },
            offset: None,
        }
    }

    /// How yaml.v2 resolves this node when it is a scalar; `None` for collections.
    pub(super) fn resolved(&self) -> Option<Resolved> {
        match &self.kind {
            NodeKind::Scalar { text, plain: true } => Some(resolve_plain(text)),
            NodeKind::Scalar { plain: false, .. } => Some(Resolved::Str),
            _ => None,
        }
    }

    /// The scalar's text, if this is a scalar.
    pub(super) fn text(&self) -> Option<&str> {
        match &self.kind {
            NodeKind::Scalar { text, .. } => Some(text),
            _ => None,
        }
    }

    /// Whether this is a plain scalar yaml.v2 reads as null (`~`, `null`, empty).
    pub(super) fn is_null(&self) -> bool {
        matches!(self.resolved(), Some(Resolved::Null))
    }

    /// A short description for messages: `the string "abc"`, `a mapping`.
    pub(super) fn describe(&self) -> String {
        match (&self.kind, self.resolved()) {
            (NodeKind::Map(_), _) => "a mapping".to_owned(),
            (NodeKind::Seq(_), _) => "a list".to_owned(),
            (_, Some(Resolved::Null)) => "nothing (null)".to_owned(),
            (NodeKind::Scalar { text, .. }, Some(Resolved::Bool(_))) => {
                format!("the boolean {text}")
            }
            (NodeKind::Scalar { text, .. }, Some(Resolved::Int(_) | Resolved::Uint(_))) => {
                format!("the number {text}")
            }
            (NodeKind::Scalar { text, .. }, Some(Resolved::Float)) => {
                format!("the floating-point number {text}")
            }
            (NodeKind::Scalar { text, .. }, _) => format!("the string {text:?}"),
        }
    }
}

/// A parsed file: its first document, and whether more followed.
#[derive(Debug)]
pub(super) struct Document {
    /// The first document (a null node for an empty file).
    pub(super) root: Node,
    /// Whether the file holds more than one document (yaml.v2 reads only the first).
    pub(super) more_documents: bool,
}

/// A syntax error: its 1-based line when known, and libyaml's description.
#[derive(Debug)]
pub(super) struct SyntaxError {
    pub(super) line: Option<usize>,
    pub(super) message: String,
}

/// Parses `text`: the first document, read twice (shape, then raw scalars with offsets).
pub(super) fn parse(text: &str) -> Result<Document, SyntaxError> {
    let syntax = |err: serde_yaml_ng::Error| SyntaxError {
        line: err.location().map(|l| l.line()),
        message: strip_location(&err.to_string()),
    };
    let mut documents = serde_yaml_ng::Deserializer::from_str(text);
    let Some(first) = documents.next() else {
        return Ok(Document {
            root: Node::null(),
            more_documents: false,
        });
    };
    let shape = Shape::deserialize_any(first).map_err(syntax)?;
    let more_documents = documents.next().is_some();
    let root = match shape {
        Shape::Void => Node::null(),
        shape => {
            let second = serde_yaml_ng::Deserializer::from_str(text)
                .next()
                .ok_or_else(|| SyntaxError {
                    line: None,
                    message: "the document vanished on the second reading".to_owned(),
                })?;
            NodeSeed {
                shape: &shape,
                base: text,
            }
            .deserialize(second)
            .map_err(syntax)?
        }
    };
    Ok(Document {
        root,
        more_documents,
    })
}

/// serde_yaml_ng writes marks as " at line L column C": the first (the problem, reported
/// apart as the error's line) is dropped, later ones (the context) become " on line L".
fn strip_location(message: &str) -> String {
    const AT: &str = " at line ";
    let mut out = String::new();
    let mut rest = message;
    let mut first = true;
    while let Some(at) = rest.find(AT) {
        out.push_str(&rest[..at]);
        let after = &rest[at + AT.len()..];
        let line_len = after
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(after.len());
        let line = &after[..line_len];
        let mut tail = &after[line_len..];
        if let Some(column) = tail.strip_prefix(" column ") {
            tail = column.trim_start_matches(|c: char| c.is_ascii_digit());
        }
        if !first {
            out.push_str(" on line ");
            out.push_str(line);
        }
        first = false;
        rest = tail;
    }
    out.push_str(rest);
    out
}

/// The shape of a document: which nodes are scalars and which are collections.
enum Shape {
    /// No node at all (an empty document).
    Void,
    Scalar,
    Map(Vec<(Shape, Shape)>),
    Seq(Vec<Shape>),
}

impl Shape {
    fn deserialize_any<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(ShapeVisitor)
    }
}

impl<'de> de::Deserialize<'de> for Shape {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Self::deserialize_any(deserializer)
    }
}

struct ShapeVisitor;

impl<'de> Visitor<'de> for ShapeVisitor {
    type Value = Shape;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any YAML value")
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Shape, E> {
        Ok(Shape::Scalar)
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Shape, E> {
        Ok(Shape::Scalar)
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Shape, E> {
        Ok(Shape::Scalar)
    }
    fn visit_i128<E: de::Error>(self, _: i128) -> Result<Shape, E> {
        Ok(Shape::Scalar)
    }
    fn visit_u128<E: de::Error>(self, _: u128) -> Result<Shape, E> {
        Ok(Shape::Scalar)
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Shape, E> {
        Ok(Shape::Scalar)
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<Shape, E> {
        Ok(Shape::Scalar)
    }
    fn visit_unit<E: de::Error>(self) -> Result<Shape, E> {
        Ok(Shape::Scalar)
    }
    fn visit_none<E: de::Error>(self) -> Result<Shape, E> {
        Ok(Shape::Void)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Shape, A::Error> {
        let mut entries = Vec::new();
        while let Some(key) = map.next_key::<Shape>()? {
            entries.push((key, map.next_value::<Shape>()?));
        }
        Ok(Shape::Map(entries))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Shape, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element::<Shape>()? {
            items.push(item);
        }
        Ok(Shape::Seq(items))
    }
}

/// Reads one node of known shape: scalars as raw text with their offset.
struct NodeSeed<'s, 'de> {
    shape: &'s Shape,
    base: &'de str,
}

impl<'de> DeserializeSeed<'de> for NodeSeed<'_, 'de> {
    type Value = Node;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Node, D::Error> {
        match self.shape {
            Shape::Void => Ok(Node::null()),
            Shape::Scalar => deserializer.deserialize_str(self),
            Shape::Map(_) => deserializer.deserialize_map(self),
            Shape::Seq(_) => deserializer.deserialize_seq(self),
        }
    }
}

impl<'de> NodeSeed<'_, 'de> {
    fn seed<'s>(&self, shape: &'s Shape) -> NodeSeed<'s, 'de> {
        NodeSeed {
            shape,
            base: self.base,
        }
    }
}

/// A node as the first reading saw it: a scalar, a mapping or a sequence.
impl<'de> Visitor<'de> for NodeSeed<'_, 'de> {
    type Value = Node;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("the node of the first reading")
    }

    /// A slice of the input: its address gives its offset, and the byte before it tells a
    /// quoted scalar (which starts after its quote) from a plain one.
    fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Node, E> {
        let start = self.base.as_ptr() as usize;
        let at = (v.as_ptr() as usize)
            .checked_sub(start)
            .filter(|&offset| offset + v.len() <= self.base.len());
        let plain = match at {
            Some(offset) => {
                offset == 0 || !matches!(self.base.as_bytes()[offset - 1], b'"' | b'\'')
            }
            None => false,
        };
        Ok(Node {
            kind: NodeKind::Scalar {
                text: v.to_owned(),
                plain,
            },
            offset: at,
        })
    }

    /// Not a slice of the input: an escaped quoted scalar, a block scalar (`|`, `>`) or a
    /// plain scalar folded over several lines. All are strings for yaml.v2.
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Node, E> {
        Ok(Node {
            kind: NodeKind::Scalar {
                text: v.to_owned(),
                plain: false,
            },
            offset: None,
        })
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Node, A::Error> {
        let Shape::Map(shapes) = self.shape else {
            return Err(de::Error::custom(
                "a mapping where the first reading saw none",
            ));
        };
        let mut entries = Vec::with_capacity(shapes.len());
        for (key_shape, value_shape) in shapes {
            let Some(key) = map.next_key_seed(self.seed(key_shape))? else {
                return Err(de::Error::custom(
                    "the mapping changed between two readings",
                ));
            };
            entries.push((key, map.next_value_seed(self.seed(value_shape))?));
        }
        let offset = entries.first().and_then(|(key, _)| key.offset);
        Ok(Node {
            kind: NodeKind::Map(entries),
            offset,
        })
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Node, A::Error> {
        let Shape::Seq(shapes) = self.shape else {
            return Err(de::Error::custom(
                "a sequence where the first reading saw none",
            ));
        };
        let mut items = Vec::with_capacity(shapes.len());
        for shape in shapes {
            let Some(item) = seq.next_element_seed(self.seed(shape))? else {
                return Err(de::Error::custom(
                    "the sequence changed between two readings",
                ));
            };
            items.push(item);
        }
        let offset = items.first().and_then(|item| item.offset);
        Ok(Node {
            kind: NodeKind::Seq(items),
            offset,
        })
    }
}

/// Byte offsets to 1-based lines.
#[derive(Debug)]
pub(super) struct Lines(Vec<usize>);

impl Lines {
    pub(super) fn new(text: &str) -> Self {
        let starts = std::iter::once(0)
            .chain(text.match_indices('\n').map(|(i, _)| i + 1))
            .collect();
        Self(starts)
    }

    pub(super) fn line(&self, offset: usize) -> usize {
        self.0.partition_point(|&start| start <= offset)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scalar(node: &Node) -> (&str, bool, Option<usize>) {
        match &node.kind {
            NodeKind::Scalar { text, plain } => (text, *plain, node.offset),
            other => panic!("not a scalar: {other:?}"),
        }
    }

    #[test]
    fn keeps_raw_text_quoting_and_offsets() {
        let text = "# c\nk: 0x1F\nq: 'yes'\nd: \"a\\nb\"\ne:\nl:\n  - x\n";
        let doc = parse(text).unwrap();
        let NodeKind::Map(entries) = &doc.root.kind else {
            panic!("not a map")
        };
        let (k, plain, off) = scalar(&entries[0].0);
        assert_eq!((k, plain, off), ("k", true, Some(4)));
        assert_eq!(scalar(&entries[0].1), ("0x1F", true, Some(7)));
        assert_eq!(scalar(&entries[1].1).0, "yes");
        assert!(!scalar(&entries[1].1).1);
        assert_eq!(scalar(&entries[2].1), ("a\nb", false, None));
        assert!(entries[3].1.is_null());
        let NodeKind::Seq(items) = &entries[4].1.kind else {
            panic!("not a seq")
        };
        assert_eq!(scalar(&items[0]).0, "x");
        assert!(!doc.more_documents);
    }

    #[test]
    fn empty_and_multi_document_files() {
        assert!(parse("").unwrap().root.is_null());
        assert!(parse("# only a comment\n").unwrap().root.is_null());
        let doc = parse("a: 1\n---\nb: 2\n").unwrap();
        assert!(doc.more_documents);
    }

    #[test]
    fn syntax_errors_carry_a_line() {
        let err = parse("a: 1\nb: [1, 2\n").unwrap_err();
        assert!(err.line.is_some(), "{err:?}");
        assert!(!err.message.contains(" at line "), "{}", err.message);
        assert_eq!(
            strip_location("bad at line 3 column 1, while parsing at line 2 column 4"),
            "bad, while parsing on line 2"
        );
    }
}
