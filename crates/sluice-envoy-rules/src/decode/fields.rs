//! A field's value as yaml.v2 decodes it into the reference's structs: lists, strings (the
//! raw text of any scalar), `uint32` and `bool` (YAML 1.1's booleans), null as the zero value.

use super::Decoder;
use crate::error::RlsConfigError;
use crate::scalar::Resolved;
use crate::yaml::{Node, NodeKind};

impl Decoder<'_> {
    /// The error of a field holding something other than `expected`, on the value's line (the
    /// key's where the value has none).
    fn expected(&self, node: &Node, path: &str, key_node: &Node, expected: &str) -> RlsConfigError {
        self.error(
            self.line_of(node).or(self.line_of(key_node)),
            format!("{path}: expected {expected}, found {}", node.describe()),
        )
    }

    /// A list field: null is empty, a list is its items, anything else is an error.
    pub(super) fn list<'n>(
        &self,
        node: &'n Node,
        path: &str,
        key_node: &Node,
        of: &str,
    ) -> Result<&'n [Node], RlsConfigError> {
        match &node.kind {
            NodeKind::Seq(items) => Ok(items),
            _ if node.is_null() => Ok(&[]),
            _ => Err(self.expected(node, path, key_node, &format!("a list of {of}"))),
        }
    }

    /// A string field: yaml.v2 takes the raw text of any scalar; null is empty.
    pub(super) fn string(
        &self,
        node: &Node,
        path: &str,
        key_node: &Node,
    ) -> Result<String, RlsConfigError> {
        if node.is_null() {
            return Ok(String::new());
        }
        match &node.kind {
            NodeKind::Scalar { text, .. } => Ok(text.clone()),
            _ => Err(self.expected(node, path, key_node, "a string")),
        }
    }

    /// A `uint32` field: a plain integer in range; null is 0.
    pub(super) fn uint32(
        &self,
        node: &Node,
        path: &str,
        key_node: &Node,
    ) -> Result<u32, RlsConfigError> {
        let expected = format!("a whole number between 0 and {}", u32::MAX);
        let words = ["a number", "the number", &expected];
        self.typed(node, path, key_node, words, |r| match r {
            Resolved::Null => Some(0),
            Resolved::Int(v) => u32::try_from(v).ok(),
            _ => None,
        })
    }

    /// A `bool` field: yaml.v2's booleans (`true`, `yes`, `on`, ...); null is false.
    pub(super) fn boolean(
        &self,
        node: &Node,
        path: &str,
        key_node: &Node,
    ) -> Result<bool, RlsConfigError> {
        let words = ["a boolean", "true or false", "true or false"];
        self.typed(node, path, key_node, words, |r| match r {
            Resolved::Null => Some(false),
            Resolved::Bool(b) => Some(b),
            _ => None,
        })
    }

    /// A scalar field `pick` reads from yaml.v2's resolution. `words`: what the field is, how
    /// to write it, and what is expected (for a value that is no such scalar).
    fn typed<T>(
        &self,
        node: &Node,
        path: &str,
        key_node: &Node,
        [what, write, expected]: [&str; 3],
        pick: impl Fn(Resolved) -> Option<T>,
    ) -> Result<T, RlsConfigError> {
        if let Some(v) = node.resolved().and_then(pick) {
            return Ok(v);
        }
        match &node.kind {
            // Only a plain scalar can be a number or a boolean.
            NodeKind::Scalar { text, plain: false } => Err(self.error(
                self.line_of(node).or(self.line_of(key_node)),
                format!(
                    "{path}: \"{text}\" is quoted, so it is text, not {what}; write {write} \
                     without quotes"
                ),
            )),
            _ => Err(self.expected(node, path, key_node, expected)),
        }
    }
}
