//! Slots: which slot a key hashes to, and who serves which slots (`CLUSTER SLOTS`).

use std::fmt::Write as _;
use std::ops::RangeInclusive;

use redis::Value;

use crate::Error;

/// The number of hash slots of a Redis Cluster.
pub const SLOT_COUNT: u16 = 16384;

/// The slot of a key: CRC16 (XMODEM) of the key modulo [`SLOT_COUNT`], where only the part
/// between the first `{` and the next `}` is hashed if that part is not empty (the hash tag,
/// which puts related keys on one node).
///
/// ```
/// use sluice_testkit::key_slot;
/// assert_eq!(key_slot(b"123456789"), 12739);
/// assert_eq!(key_slot(b"{user1000}.following"), key_slot(b"user1000"));
/// // An empty tag does not count: the whole key is hashed.
/// assert_ne!(key_slot(b"{}.a"), key_slot(b"{}.b"));
/// ```
pub fn key_slot(key: &[u8]) -> u16 {
    crc16(hash_tag(key)) % SLOT_COUNT
}

/// The part of `key` that is hashed: the first non-empty `{…}` section, else all of it.
fn hash_tag(key: &[u8]) -> &[u8] {
    let Some(open) = key.iter().position(|&b| b == b'{') else {
        return key;
    };
    let rest = &key[open + 1..];
    match rest.iter().position(|&b| b == b'}') {
        Some(len) if len > 0 => &rest[..len],
        _ => key,
    }
}

/// CRC16-CCITT (XMODEM): polynomial 0x1021, initial value 0, as Redis Cluster uses.
fn crc16(bytes: &[u8]) -> u16 {
    crc16::State::<crc16::XMODEM>::calculate(bytes)
}

/// One primary's share of the cluster: its slots and its replicas, as indexes into
/// [`RedisCluster::nodes`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Shard {
    /// The primary.
    pub primary: usize,
    /// Its replicas that the cluster does not consider failed, in index order.
    pub replicas: Vec<usize>,
    /// The slots it serves, in order.
    pub slots: Vec<RangeInclusive<u16>>,
}

impl Shard {
    /// Whether this shard serves `slot`.
    pub fn serves(&self, slot: u16) -> bool {
        self.slots.iter().any(|range| range.contains(&slot))
    }

    /// How many slots it serves.
    pub fn slot_count(&self) -> usize {
        self.slots.iter().map(|r| r.clone().count()).sum()
    }
}

/// One entry of `CLUSTER SLOTS`, by port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct SlotRange {
    pub(super) start: u16,
    pub(super) end: u16,
    pub(super) primary: u16,
    /// Sorted.
    pub(super) replicas: Vec<u16>,
}

/// Parses `CLUSTER SLOTS`: `[[start, end, [ip, port, id, …], [replica…]…]…]`, sorted by slot.
pub(super) fn parse_slots(reply: &Value, source: &str) -> Result<Vec<SlotRange>, Error> {
    let bad = || Error::UnexpectedReply {
        context: format!("CLUSTER SLOTS on {source}"),
        reply: format!("{reply:?}"),
    };
    let Value::Array(entries) = reply else {
        return Err(bad());
    };
    let mut ranges = Vec::with_capacity(entries.len());
    for entry in entries {
        let Value::Array(fields) = entry else {
            return Err(bad());
        };
        let [start, end, primary, replicas @ ..] = fields.as_slice() else {
            return Err(bad());
        };
        let port_of = |node: &Value| match node {
            Value::Array(node) => node.get(1).and_then(as_u16),
            _ => None,
        };
        let mut replica_ports = replicas
            .iter()
            .map(port_of)
            .collect::<Option<Vec<u16>>>()
            .ok_or_else(bad)?;
        replica_ports.sort_unstable();
        ranges.push(SlotRange {
            start: as_u16(start).ok_or_else(bad)?,
            end: as_u16(end).ok_or_else(bad)?,
            primary: port_of(primary).ok_or_else(bad)?,
            replicas: replica_ports,
        });
    }
    ranges.sort_by_key(|r| r.start);
    Ok(ranges)
}

fn as_u16(value: &Value) -> Option<u16> {
    match value {
        Value::Int(n) => u16::try_from(*n).ok(),
        Value::BulkString(bytes) => std::str::from_utf8(bytes).ok()?.parse().ok(),
        _ => None,
    }
}

/// `0-5460@30001[30004] 5461-10922@…`: a slot map in one line, for messages.
pub(super) fn summarize(ranges: &[SlotRange]) -> String {
    let mut out = String::new();
    for r in ranges {
        if !out.is_empty() {
            out.push(' ');
        }
        let _ = write!(out, "{}-{}@{}{:?}", r.start, r.end, r.primary, r.replicas);
    }
    out
}

pub(super) fn overlaps(a: &RangeInclusive<u16>, b: &RangeInclusive<u16>) -> bool {
    a.start() <= b.end() && b.start() <= a.end()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc16_matches_the_reference_check_value() {
        // The standard CRC-16/XMODEM check value, also in the Redis Cluster spec.
        assert_eq!(crc16(b"123456789"), 0x31C3);
        assert_eq!(crc16(b""), 0);
    }

    #[test]
    fn slots_of_known_keys() {
        // Values from `CLUSTER KEYSLOT` (the integration test checks many more live).
        assert_eq!(key_slot(b"foo"), 12182);
        assert_eq!(key_slot(b"bar"), 5061);
        assert_eq!(key_slot(b"hello"), 866);
        assert_eq!(key_slot(b""), 0);
    }

    #[test]
    fn the_hash_tag_rule() {
        assert_eq!(hash_tag(b"{user1000}.following"), b"user1000");
        assert_eq!(hash_tag(b"foo{bar}{zap}"), b"bar");
        assert_eq!(hash_tag(b"foo{}{bar}"), b"foo{}{bar}");
        assert_eq!(hash_tag(b"foo{{bar}}zap"), b"{bar");
        assert_eq!(hash_tag(b"foo{bar"), b"foo{bar");
        assert_eq!(hash_tag(b"}{x}"), b"x");
        assert_eq!(hash_tag(b"plain"), b"plain");
    }

    #[test]
    fn parses_cluster_slots() {
        let node = |port: i64| {
            Value::Array(vec![
                Value::BulkString(b"127.0.0.1".to_vec()),
                Value::Int(port),
                Value::BulkString(b"id".to_vec()),
                Value::Array(Vec::new()),
            ])
        };
        let reply = Value::Array(vec![
            Value::Array(vec![
                Value::Int(5461),
                Value::Int(16383),
                node(2),
                node(5),
                node(4),
            ]),
            Value::Array(vec![Value::Int(0), Value::Int(5460), node(1)]),
        ]);
        let ranges = parse_slots(&reply, "here").unwrap();
        assert_eq!(
            ranges,
            [
                SlotRange {
                    start: 0,
                    end: 5460,
                    primary: 1,
                    replicas: vec![]
                },
                SlotRange {
                    start: 5461,
                    end: 16383,
                    primary: 2,
                    replicas: vec![4, 5]
                },
            ]
        );
        assert_eq!(summarize(&ranges), "0-5460@1[] 5461-16383@2[4, 5]");
        let err = parse_slots(&Value::Int(1), "here").unwrap_err();
        assert!(matches!(err, Error::UnexpectedReply { .. }), "{err}");
    }

    #[test]
    fn shards_know_their_slots() {
        let shard = Shard {
            primary: 0,
            replicas: vec![3],
            slots: vec![0..=9, 20..=20],
        };
        assert!(shard.serves(0) && shard.serves(9) && shard.serves(20));
        assert!(!shard.serves(10) && !shard.serves(21));
        assert_eq!(shard.slot_count(), 11);
        assert!(overlaps(&(0..=5), &(5..=9)));
        assert!(!overlaps(&(0..=4), &(5..=9)));
    }
}
