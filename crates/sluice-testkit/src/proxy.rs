//! A TCP proxy on a free loopback port that delays or cuts a link: put it between a replica
//! and its primary (`ServerOptions::new().replica_of(proxy.port())`) to make replication lag
//! by a chosen delay, or stop it altogether.
//!
//! Every byte is held for the delay in force when it arrived, then forwarded in order (a
//! delay lowered later never reorders bytes). [`DelayProxy::cut`] closes every connection
//! and closes new ones at once until [`DelayProxy::heal`]: to the replica its primary is
//! unreachable. Threads, not async: the kit is synchronous.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use crate::Error;

/// A delaying, cuttable TCP proxy to `127.0.0.1:<upstream>`; stopped (every connection
/// closed) when dropped.
#[derive(Debug)]
pub struct DelayProxy {
    port: u16,
    shared: Arc<Shared>,
}

#[derive(Debug, Default)]
struct Shared {
    delay_ms: AtomicU64,
    cut: AtomicBool,
    stopped: AtomicBool,
    /// Both ends of every open connection, to close on a cut.
    open: Mutex<Vec<TcpStream>>,
    /// Bytes forwarded, both ways.
    forwarded: AtomicU64,
}

impl Shared {
    fn close_all(&self) {
        for s in self
            .open
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain(..)
        {
            let _ = s.shutdown(Shutdown::Both);
        }
    }
}

impl DelayProxy {
    /// Listens on a free loopback port and forwards to `127.0.0.1:<upstream>`, with no delay.
    pub fn start(upstream: u16) -> Result<Self, Error> {
        let listener = TcpListener::bind("127.0.0.1:0").map_err(|source| Error::Io {
            context: "binding the proxy".to_owned(),
            source,
        })?;
        let port = listener
            .local_addr()
            .map_err(|source| Error::Io {
                context: "reading the proxy's port".to_owned(),
                source,
            })?
            .port();
        let shared = Arc::new(Shared::default());
        let upstream = SocketAddr::from(([127, 0, 0, 1], upstream));
        let accepting = shared.clone();
        thread::spawn(move || accept(&listener, upstream, &accepting));
        Ok(Self { port, shared })
    }

    /// The port to connect to instead of the upstream's.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Holds every byte that arrives from now on for `delay` before forwarding it.
    pub fn set_delay(&self, delay: Duration) {
        let ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
        self.shared.delay_ms.store(ms, Ordering::SeqCst);
    }

    /// The delay in force.
    pub fn delay(&self) -> Duration {
        Duration::from_millis(self.shared.delay_ms.load(Ordering::SeqCst))
    }

    /// Closes every connection and every new one until [`DelayProxy::heal`].
    pub fn cut(&self) {
        self.shared.cut.store(true, Ordering::SeqCst);
        self.shared.close_all();
    }

    /// Lets connections through again.
    pub fn heal(&self) {
        self.shared.cut.store(false, Ordering::SeqCst);
    }

    /// Whether the link is cut.
    pub fn is_cut(&self) -> bool {
        self.shared.cut.load(Ordering::SeqCst)
    }

    /// Bytes forwarded so far, both ways.
    pub fn forwarded(&self) -> u64 {
        self.shared.forwarded.load(Ordering::SeqCst)
    }
}

impl Drop for DelayProxy {
    fn drop(&mut self) {
        self.shared.stopped.store(true, Ordering::SeqCst);
        self.shared.close_all();
        // Wakes the accepting thread, which then sees `stopped`.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

fn accept(listener: &TcpListener, upstream: SocketAddr, shared: &Arc<Shared>) {
    for client in listener.incoming() {
        if shared.stopped.load(Ordering::SeqCst) {
            return;
        }
        let Ok(client) = client else { continue };
        if shared.cut.load(Ordering::SeqCst) {
            let _ = client.shutdown(Shutdown::Both);
            continue;
        }
        let Ok(server) = TcpStream::connect_timeout(&upstream, Duration::from_secs(2)) else {
            let _ = client.shutdown(Shutdown::Both);
            continue;
        };
        let _ = client.set_nodelay(true);
        let _ = server.set_nodelay(true);
        let ends = [&client, &server].map(|s| s.try_clone());
        let [Ok(c), Ok(s)] = ends else { continue };
        shared
            .open
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend([c, s]);
        for (from, to) in [(&client, &server), (&server, &client)] {
            if let (Ok(from), Ok(to)) = (from.try_clone(), to.try_clone()) {
                pipe(from, to, shared.clone());
            }
        }
    }
}

/// Forwards `from` to `to`, each chunk held for the delay in force when it was read.
fn pipe(mut from: TcpStream, mut to: TcpStream, shared: Arc<Shared>) {
    let (send, recv) = mpsc::channel::<(Instant, Vec<u8>)>();
    let reading = shared.clone();
    thread::spawn(move || {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match from.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    let due = Instant::now()
                        + Duration::from_millis(reading.delay_ms.load(Ordering::SeqCst));
                    if send.send((due, buf[..n].to_vec())).is_err() {
                        break;
                    }
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => break,
            }
        }
        let _ = from.shutdown(Shutdown::Read);
    });
    thread::spawn(move || {
        for (due, bytes) in recv {
            // The proxy's job is the delay itself: holding the bytes is what it simulates.
            let wait = due.saturating_duration_since(Instant::now());
            if !wait.is_zero() {
                thread::sleep(wait);
            }
            if shared.cut.load(Ordering::SeqCst) || to.write_all(&bytes).is_err() {
                break;
            }
            let n = u64::try_from(bytes.len()).unwrap_or(u64::MAX);
            shared.forwarded.fetch_add(n, Ordering::SeqCst);
        }
        let _ = to.shutdown(Shutdown::Write);
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An echo server on a free port.
    fn echo() -> u16 {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                thread::spawn(move || {
                    let mut stream = stream;
                    let mut buf = [0u8; 1024];
                    while let Ok(n) = stream.read(&mut buf) {
                        if n == 0 || stream.write_all(&buf[..n]).is_err() {
                            break;
                        }
                    }
                });
            }
        });
        port
    }

    fn round_trip(port: u16) -> std::io::Result<Vec<u8>> {
        let mut s = TcpStream::connect(("127.0.0.1", port))?;
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        s.write_all(b"ping")?;
        let mut got = vec![0u8; 4];
        s.read_exact(&mut got)?;
        Ok(got)
    }

    #[test]
    fn bytes_are_held_for_the_delay_and_a_cut_link_closes_until_healed() {
        let proxy = DelayProxy::start(echo()).unwrap();
        assert_eq!(round_trip(proxy.port()).unwrap(), b"ping");

        // Held both ways: a round trip takes at least twice the delay.
        proxy.set_delay(Duration::from_millis(100));
        let started = Instant::now();
        assert_eq!(round_trip(proxy.port()).unwrap(), b"ping");
        assert!(
            started.elapsed() >= Duration::from_millis(200),
            "{:?}",
            started.elapsed()
        );
        proxy.set_delay(Duration::ZERO);

        // Cut: an open connection is closed, and so is a new one.
        let mut open = TcpStream::connect(("127.0.0.1", proxy.port())).unwrap();
        open.write_all(b"ping").unwrap();
        let mut got = [0u8; 4];
        open.read_exact(&mut got).unwrap();
        proxy.cut();
        assert!(proxy.is_cut());
        open.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let _ = open.write_all(b"ping");
        assert!(
            matches!(open.read(&mut got), Ok(0) | Err(_)),
            "the open connection is closed"
        );
        assert!(
            round_trip(proxy.port()).is_err(),
            "a new connection is closed"
        );

        proxy.heal();
        assert_eq!(round_trip(proxy.port()).unwrap(), b"ping");
        assert!(proxy.forwarded() >= 24);
    }
}
