//! The open RLQS streams, for `GET /v1/stats`: each stream registers itself when it opens and
//! is gone when its task ends (a guard), and says its domain and how many buckets it holds
//! after each report. Nothing here is on the decision path of `ShouldRateLimit` or the HTTP
//! API; a report updates its own stream's entry (an atomic store, and a lock of its own
//! entry only the first time, for the domain).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

/// One open stream.
#[derive(Debug)]
struct Stream {
    domain: OnceLock<String>,
    peer: Option<String>,
    opened_ms: u64,
    buckets: AtomicU64,
}

/// What one stream reads as.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub(crate) struct StreamReading {
    /// Its domain.
    pub domain: String,
    /// The client's address, when known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peer: Option<String>,
    /// When it opened, in Unix milliseconds.
    pub opened_ms: u64,
    /// The buckets it holds.
    pub buckets: u64,
}

/// The open streams, by a number of their own.
#[derive(Debug, Default)]
pub(crate) struct Streams {
    open: Arc<Mutex<BTreeMap<u64, Arc<Stream>>>>,
    next: AtomicU64,
}

/// A stream's entry, removed when dropped.
#[derive(Debug)]
pub(crate) struct Registered {
    id: u64,
    stream: Arc<Stream>,
    open: Arc<Mutex<BTreeMap<u64, Arc<Stream>>>>,
}

impl Registered {
    /// The stream's domain (its first report's; later calls change nothing).
    pub(crate) fn set_domain(&self, domain: &str) {
        if self.stream.domain.get().is_none() {
            let _ = self.stream.domain.set(domain.to_owned());
        }
    }

    /// How many buckets the stream holds now.
    pub(crate) fn set_buckets(&self, n: usize) {
        self.stream
            .buckets
            .store(u64::try_from(n).unwrap_or(u64::MAX), Ordering::Relaxed);
    }
}

impl Drop for Registered {
    fn drop(&mut self) {
        self.open
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&self.id);
    }
}

impl Streams {
    /// Registers a stream opened at `opened_ms` by `peer`.
    pub(crate) fn open(&self, peer: Option<String>, opened_ms: u64) -> Registered {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let stream = Arc::new(Stream {
            domain: OnceLock::new(),
            peer,
            opened_ms,
            buckets: AtomicU64::new(0),
        });
        self.open
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id, stream.clone());
        Registered {
            id,
            stream,
            open: self.open.clone(),
        }
    }

    /// The open streams that have named their domain, in the order they opened.
    pub(crate) fn read(&self) -> Vec<StreamReading> {
        let open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        open.values()
            .filter_map(|s| {
                Some(StreamReading {
                    domain: s.domain.get()?.clone(),
                    peer: s.peer.clone(),
                    opened_ms: s.opened_ms,
                    buckets: s.buckets.load(Ordering::Relaxed),
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stream_is_listed_once_it_names_its_domain_and_until_it_ends() {
        let streams = Streams::default();
        let a = streams.open(Some("10.0.0.7:5000".to_owned()), 1_000);
        assert!(streams.read().is_empty());
        a.set_domain("mesh");
        a.set_domain("other");
        a.set_buckets(3);
        let b = streams.open(None, 2_000);
        b.set_domain("mesh");
        let read = streams.read();
        assert_eq!(read.len(), 2);
        assert_eq!(
            read[0],
            StreamReading {
                domain: "mesh".to_owned(),
                peer: Some("10.0.0.7:5000".to_owned()),
                opened_ms: 1_000,
                buckets: 3
            }
        );
        drop(a);
        assert_eq!(streams.read().len(), 1);
        drop(b);
        assert!(streams.read().is_empty());
    }
}
