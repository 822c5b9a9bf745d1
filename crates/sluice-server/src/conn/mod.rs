//! What a connection may hold on the server's listeners: `listen.header_timeout`,
//! `listen.body_timeout`, `listen.idle_timeout` and `listen.max_connections`
//! (docs/configuration.md#listen).
//!
//! Without them a client that connects and says nothing, sends its request head one byte a
//! second (slowloris), its body as slowly, or half an HTTP/2 preface, holds a socket for as
//! long as it likes; enough of them exhaust the process's file descriptors, and then no
//! client is answered. So:
//!
//! - **The connection bound.** Each listener accepts at most `max_connections` at once (TLS
//!   handshakes included). At the bound it stops accepting: new clients wait in the kernel's
//!   backlog, the open ones are served, and as soon as one closes the next is accepted. The
//!   moment the bound is reached is logged (at most every 10 s) and counted
//!   (`sluice_connections_limited_total`); `sluice_connections_open` is the gauge.
//! - **Idle and header timeouts, HTTP/1** (`http1.rs`). hyper arms its header-read timer
//!   when a connection starts waiting for a request; `HeadTimer` gives it a deadline that
//!   moves with what the client does: `idle_timeout` while nothing of the next request has arrived, then
//!   `header_timeout` from its first byte to the end of its head. A connection between two
//!   requests is idle; a request being answered is never cut by either.
//! - **Body timeout, HTTP/1.** The whole body must arrive within `body_timeout` of its head
//!   ([`body_deadline`]); after it the answer is `408 request_timeout` and the connection
//!   closes.
//! - **gRPC (HTTP/2).** hyper's HTTP/2 server has no such timers, so the connection's reads
//!   carry them ([`Conn`]): `idle_timeout` until the first byte, `header_timeout` from it to
//!   the end of the 24-byte preface, then `idle_timeout` between any two reads (an open RLQS
//!   stream reports at least every `rlqs.reporting_interval`, which must be shorter). A read
//!   past its deadline fails, and hyper drops the connection.
//! - **TLS.** A handshake has `header_timeout` to finish, in its own task, so a client that
//!   connects and says nothing holds only its own socket, never the accept loop.
//!
//! Every timeout that closes a connection is counted in
//! `sluice_connection_timeouts_total{listener, timeout}` (`idle`, `header`, `body`,
//! `handshake`).

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tokio_util::either::Either;
use tokio_util::task::AbortOnDropHandle;

/// The default `listen.header_timeout`.
pub(crate) const DEFAULT_HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// The default `listen.body_timeout`.
pub(crate) const DEFAULT_BODY_TIMEOUT: Duration = Duration::from_secs(30);
/// The default `listen.idle_timeout`.
pub(crate) const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// The most `listen.max_connections` defaults to (per listener).
pub(crate) const MAX_DEFAULT_CONNECTIONS: usize = 10_000;
/// The most `listen.max_connections` may be.
pub(crate) const MAX_CONNECTIONS: usize = 1_000_000;

/// The HTTP/2 connection preface a gRPC client sends first.
const H2_PREFACE_LEN: u64 = 24;

/// The `listen` settings that bound a connection (one set for every listener).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnLimits {
    /// From the first byte of a request to the end of its head (HTTP/1), of the HTTP/2
    /// preface (gRPC), or of a TLS handshake (from the connection).
    pub header_timeout: Duration,
    /// From the end of a request's head to the end of its body (HTTP).
    pub body_timeout: Duration,
    /// How long a connection may stay silent: before its first request, between two
    /// requests (HTTP/1), between two reads (gRPC).
    pub idle_timeout: Duration,
    /// Connections each listener holds at once; beyond, new ones wait to be accepted.
    pub max_connections: usize,
}

impl Default for ConnLimits {
    fn default() -> Self {
        Self {
            header_timeout: DEFAULT_HEADER_TIMEOUT,
            body_timeout: DEFAULT_BODY_TIMEOUT,
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
            max_connections: default_max_connections(),
        }
    }
}

/// A quarter of the process's open-file limit (three listeners then use at most three
/// quarters, leaving the rest to the store's connections and files), at most
/// [`MAX_DEFAULT_CONNECTIONS`], at least 64.
pub(crate) fn default_max_connections() -> usize {
    #[cfg(unix)]
    let soft = rustix::process::getrlimit(rustix::process::Resource::Nofile).current;
    #[cfg(not(unix))]
    let soft: Option<u64> = None;
    soft.map_or(MAX_DEFAULT_CONNECTIONS, |n| {
        usize::try_from(n / 4).unwrap_or(usize::MAX)
    })
    .clamp(64, MAX_DEFAULT_CONNECTIONS)
}

/// Which listener, in logs and metric labels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Listener {
    /// `listen.http`.
    Http,
    /// `listen.grpc`.
    Grpc,
    /// `listen.admin`.
    Admin,
}

impl Listener {
    /// Its name in `listen` and in metric labels.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Listener::Http => "http",
            Listener::Grpc => "grpc",
            Listener::Admin => "admin",
        }
    }

    fn http2(self) -> bool {
        self == Listener::Grpc
    }
}

/// What a listener reports of its connections (the server's metrics take it).
pub(crate) trait ListenerEvents: Send + Sync + std::fmt::Debug {
    /// A connection opened (`1.0`) or closed (`-1.0`).
    fn opened(&self, delta: f64);
    /// The listener reached `listen.max_connections`.
    fn limited(&self);
    /// A connection was closed by the listen timeout `timeout` (idle, header, body,
    /// handshake).
    fn timed_out(&self, timeout: &'static str);
}

// ----- accepting ----------------------------------------------------------------------------

/// A TCP connection (`Left`), or one over TLS (`Right`).
type Stream = Either<TcpStream, Box<TlsStream<TcpStream>>>;

/// What a connection has read, shared with the timer of its HTTP/1 request heads.
#[derive(Debug, Default)]
struct Activity {
    /// Bytes read since the connection opened.
    read: AtomicU64,
    /// When the first byte since the last [`Activity::mark`] arrived.
    first_since_mark: Mutex<Option<Instant>>,
}

impl Activity {
    fn on_read(&self, n: usize, now: Instant) {
        self.read.fetch_add(n as u64, Ordering::Relaxed);
        self.first().get_or_insert(now);
    }

    /// From now on, wait for a new first byte.
    fn mark(&self) {
        *self.first() = None;
    }

    fn first(&self) -> MutexGuard<'_, Option<Instant>> {
        self.first_since_mark
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

/// The read deadline of an HTTP/2 connection: `idle_timeout` until the first byte,
/// `header_timeout` from it to the end of the preface, then `idle_timeout` from each read.
#[derive(Debug)]
struct H2Deadline {
    opened: Instant,
    first_read: Option<Instant>,
    last_read: Instant,
    sleep: Pin<Box<tokio::time::Sleep>>,
}

/// An accepted connection: the stream, its slot under `max_connections` (freed when it is
/// dropped), and, for gRPC, its read deadline.
#[derive(Debug)]
pub(crate) struct Conn {
    stream: Stream,
    limits: ConnLimits,
    activity: Arc<Activity>,
    h2: Option<H2Deadline>,
    series: Arc<dyn ListenerEvents>,
    _slot: OwnedSemaphorePermit,
    local: Option<std::net::SocketAddr>,
    remote: Option<std::net::SocketAddr>,
}

impl Conn {
    fn new(stream: Stream, slot: OwnedSemaphorePermit, accepting: &Accepting) -> Self {
        let tcp = match &stream {
            Either::Left(s) => s,
            Either::Right(s) => s.get_ref().0,
        };
        let (local, remote) = (tcp.local_addr().ok(), tcp.peer_addr().ok());
        let now = Instant::now();
        accepting.series.opened(1.0);
        Self {
            stream,
            limits: accepting.limits,
            activity: Arc::default(),
            h2: accepting.listener.http2().then(|| H2Deadline {
                opened: now,
                first_read: None,
                last_read: now,
                sleep: Box::pin(tokio::time::sleep(accepting.limits.idle_timeout)),
            }),
            series: accepting.series.clone(),
            _slot: slot,
            local,
            remote,
        }
    }

    /// The gRPC read deadline, checked while a read waits: `Err` when it has passed.
    fn poll_h2_deadline(&mut self, cx: &mut Context<'_>) -> io::Result<()> {
        let Some(h2) = &mut self.h2 else {
            return Ok(());
        };
        let read = self.activity.read.load(Ordering::Relaxed);
        let (deadline, which) = match h2.first_read {
            None => (h2.opened + self.limits.idle_timeout, "idle"),
            Some(first) if read < H2_PREFACE_LEN => (first + self.limits.header_timeout, "header"),
            Some(_) => (h2.last_read + self.limits.idle_timeout, "idle"),
        };
        if poll_deadline(&mut h2.sleep, deadline, cx).is_ready() {
            self.series.timed_out(which);
            let what = if which == "header" {
                "the HTTP/2 preface did not arrive within listen.header_timeout"
            } else {
                "nothing was received within listen.idle_timeout"
            };
            return Err(io::Error::new(io::ErrorKind::TimedOut, what));
        }
        Ok(())
    }
}

/// Polls `sleep` towards `deadline`, moved there first when it has moved.
fn poll_deadline(
    sleep: &mut Pin<Box<tokio::time::Sleep>>,
    deadline: Instant,
    cx: &mut Context<'_>,
) -> Poll<()> {
    let deadline = tokio::time::Instant::from_std(deadline);
    if sleep.deadline() != deadline {
        sleep.as_mut().reset(deadline);
    }
    sleep.as_mut().poll(cx)
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.series.opened(-1.0);
    }
}

impl AsyncRead for Conn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        match Pin::new(&mut this.stream).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                let n = buf.filled().len() - before;
                if n > 0 {
                    let now = Instant::now();
                    this.activity.on_read(n, now);
                    if let Some(h2) = &mut this.h2 {
                        h2.first_read.get_or_insert(now);
                        h2.last_read = now;
                    }
                }
                Poll::Ready(Ok(()))
            }
            Poll::Pending => match this.poll_h2_deadline(cx) {
                Ok(()) => Poll::Pending,
                Err(e) => Poll::Ready(Err(e)),
            },
            ready => ready,
        }
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}

impl tonic::transport::server::Connected for Conn {
    type ConnectInfo = tonic::transport::server::TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        tonic::transport::server::TcpConnectInfo {
            local_addr: self.local,
            remote_addr: self.remote,
        }
    }
}

/// What the accept loop of one listener shares with its handshakes.
#[derive(Debug)]
struct Accepting {
    listener: Listener,
    limits: ConnLimits,
    series: Arc<dyn ListenerEvents>,
}

/// The connections a listener accepts, as they come (TLS-terminated when `tls` is given);
/// the accept loop stops when this is dropped.
#[derive(Debug)]
pub(crate) struct Incoming {
    conns: mpsc::Receiver<Conn>,
    _accept_loop: AbortOnDropHandle<()>,
}

impl Incoming {
    /// Starts accepting on `listener` under `limits`, counting into `series`.
    pub(crate) fn new(
        tcp: TcpListener,
        listener: Listener,
        limits: ConnLimits,
        tls: Option<Arc<rustls::ServerConfig>>,
        series: Arc<dyn ListenerEvents>,
    ) -> Self {
        let (tx, conns) = mpsc::channel(64);
        let accepting = Arc::new(Accepting {
            listener,
            limits,
            series,
        });
        let accept_loop = tokio::spawn(accept_loop(tcp, accepting, tls.map(TlsAcceptor::from), tx));
        Self {
            conns,
            _accept_loop: AbortOnDropHandle::new(accept_loop),
        }
    }

    /// The next connection; `None` once the accept loop has stopped.
    pub(crate) async fn next(&mut self) -> Option<Conn> {
        self.conns.recv().await
    }

    /// The connections as a stream, for tonic's `serve_with_incoming`.
    pub(crate) fn into_stream(
        self,
    ) -> impl tokio_stream::Stream<Item = io::Result<Conn>> + Send + 'static {
        let guard = self._accept_loop;
        tokio_stream::StreamExt::map(
            tokio_stream::wrappers::ReceiverStream::new(self.conns),
            move |conn| {
                let _ = &guard;
                Ok(conn)
            },
        )
    }
}

/// How often the bound being reached is logged at most (it is counted every time).
const BOUND_LOG_EVERY: Duration = Duration::from_secs(10);

async fn accept_loop(
    tcp: TcpListener,
    accepting: Arc<Accepting>,
    tls: Option<TlsAcceptor>,
    tx: mpsc::Sender<Conn>,
) {
    let slots = Arc::new(Semaphore::new(accepting.limits.max_connections));
    let mut last_logged: Option<Instant> = None;
    loop {
        let slot = match slots.clone().try_acquire_owned() {
            Ok(slot) => slot,
            Err(_) => {
                accepting.series.limited();
                if last_logged.is_none_or(|t| t.elapsed() >= BOUND_LOG_EVERY) {
                    last_logged = Some(Instant::now());
                    tracing::warn!(
                        listener = accepting.listener.as_str(),
                        max_connections = accepting.limits.max_connections,
                        "listener at its connection bound (listen.max_connections): new \
                         connections wait to be accepted until an open one closes"
                    );
                }
                match slots.clone().acquire_owned().await {
                    Ok(slot) => slot,
                    Err(_) => return,
                }
            }
        };
        let (stream, peer) = match tcp.accept().await {
            Ok(conn) => conn,
            Err(e) => {
                // Out of file descriptors and the like: back off rather than spin.
                tracing::warn!(listener = accepting.listener.as_str(), error = %e, "accepting a connection failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        // No Nagle: a decision is one small answer, and delayed ACKs would add ~40 ms.
        let _ = stream.set_nodelay(true);
        match &tls {
            None => {
                if tx
                    .send(Conn::new(Either::Left(stream), slot, &accepting))
                    .await
                    .is_err()
                {
                    return;
                }
            }
            Some(acceptor) => {
                let (acceptor, tx, accepting) = (acceptor.clone(), tx.clone(), accepting.clone());
                tokio::spawn(async move {
                    let limit = accepting.limits.header_timeout;
                    match tokio::time::timeout(limit, acceptor.accept(stream)).await {
                        Ok(Ok(tls)) => {
                            let conn = Conn::new(Either::Right(Box::new(tls)), slot, &accepting);
                            let _ = tx.send(conn).await;
                        }
                        Ok(Err(e)) => tracing::debug!(%peer, error = %e, "TLS handshake failed"),
                        Err(_) => {
                            accepting.series.timed_out("handshake");
                            tracing::debug!(%peer, "TLS handshake timed out");
                        }
                    }
                });
            }
        }
    }
}

mod http1;
pub(crate) use http1::serve_http;
