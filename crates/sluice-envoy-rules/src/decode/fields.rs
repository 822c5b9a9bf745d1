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
        let line = self.line_of(node).or(self.line_of(key_node));
        match (node.resolved(), &node.kind) {
            (Some(Resolved::Null), _) => Ok(0),
            (Some(Resolved::Int(v)), _) if (0..=i64::from(u32::MAX)).contains(&v) => {
                Ok(u32::try_from(v).unwrap_or(u32::MAX))
            }
            (Some(Resolved::Str), NodeKind::Scalar { text, plain: false }) => Err(self.error(
                line,
                format!(
                    "{path}: \"{text}\" is quoted, so it is text, not a number; write the \
                     number without quotes"
                ),
            )),
            _ => Err(self.expected(
                node,
                path,
                key_node,
                &format!("a whole number between 0 and {}", u32::MAX),
            )),
        }
    }

    /// A `bool` field: yaml.v2's booleans (`true`, `yes`, `on`, ...); null is false.
    pub(super) fn boolean(
        &self,
        node: &Node,
        path: &str,
        key_node: &Node,
    ) -> Result<bool, RlsConfigError> {
        let line = self.line_of(node).or(self.line_of(key_node));
        match (node.resolved(), &node.kind) {
            (Some(Resolved::Null), _) => Ok(false),
            (Some(Resolved::Bool(b)), _) => Ok(b),
            (Some(Resolved::Str), NodeKind::Scalar { text, plain: false }) => Err(self.error(
                line,
                format!(
                    "{path}: \"{text}\" is quoted, so it is text, not a boolean; write true or \
                     false without quotes"
                ),
            )),
            _ => Err(self.expected(node, path, key_node, "true or false")),
        }
    }
}
