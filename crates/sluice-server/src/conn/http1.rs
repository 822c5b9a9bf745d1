//! HTTP/1 on an accepted [`super::Conn`]: hyper's connection with the header-read deadline that
//! moves with the client ([`HeadTimer`]), and the body deadline ([`body_deadline`]).

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, ready};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::Response;

use super::{Activity, ConnLimits, Incoming, ListenerEvents, poll_deadline};

/// hyper's timer for one HTTP/1 connection. hyper asks a server connection's timer for one
/// thing only: the header-read deadline, armed each time the connection starts waiting for a
/// request head. The sleep it gets is [`HeadSleep`].
#[derive(Debug, Clone)]
struct HeadTimer {
    activity: Arc<Activity>,
    limits: ConnLimits,
    series: Arc<dyn ListenerEvents>,
}

impl hyper::rt::Timer for HeadTimer {
    /// A plain sleep, for any other use hyper might make of its timer.
    fn sleep(&self, duration: Duration) -> Pin<Box<dyn hyper::rt::Sleep>> {
        hyper::rt::Timer::sleep(&hyper_util::rt::TokioTimer::new(), duration)
    }

    fn sleep_until(&self, _deadline: Instant) -> Pin<Box<dyn hyper::rt::Sleep>> {
        self.activity.mark();
        let armed = Instant::now();
        Box::pin(HeadSleep {
            activity: self.activity.clone(),
            armed,
            limits: self.limits,
            series: self.series.clone(),
            sleep: Box::pin(tokio::time::sleep_until(tokio::time::Instant::from_std(
                armed + self.limits.idle_timeout,
            ))),
        })
    }
}

/// The deadline of a request head: `idle_timeout` after the connection started waiting for
/// it while nothing has arrived, `header_timeout` after its first byte once one has.
struct HeadSleep {
    activity: Arc<Activity>,
    armed: Instant,
    limits: ConnLimits,
    series: Arc<dyn ListenerEvents>,
    sleep: Pin<Box<tokio::time::Sleep>>,
}

impl Future for HeadSleep {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let started = *self.activity.first();
        let deadline = match started {
            Some(first) => first + self.limits.header_timeout,
            None => self.armed + self.limits.idle_timeout,
        };
        ready!(poll_deadline(&mut self.sleep, deadline, cx));
        let which = if started.is_some() { "header" } else { "idle" };
        self.series.timed_out(which);
        Poll::Ready(())
    }
}

impl hyper::rt::Sleep for HeadSleep {}

/// Serves `app` over HTTP/1.1 on the connections of `incoming` until `stopped` completes, then
/// stops accepting and lets the requests in flight finish (idle connections close at once).
pub(crate) fn serve_http(
    mut incoming: Incoming,
    series: Arc<dyn ListenerEvents>,
    limits: ConnLimits,
    app: axum::Router,
    stopped: impl Future<Output = ()> + Send + 'static,
) -> tokio::task::JoinHandle<io::Result<()>> {
    let app = app.layer(axum::middleware::from_fn_with_state(
        (limits.body_timeout, series.clone()),
        body_deadline,
    ));
    tokio::spawn(async move {
        let graceful = hyper_util::server::graceful::GracefulShutdown::new();
        let mut stopped = std::pin::pin!(stopped);
        loop {
            tokio::select! {
                conn = incoming.next() => {
                    let Some(conn) = conn else { break };
                    let timer = HeadTimer {
                        activity: conn.activity.clone(),
                        limits,
                        series: series.clone(),
                    };
                    let mut builder = hyper::server::conn::http1::Builder::new();
                    builder.timer(timer).header_read_timeout(limits.header_timeout);
                    let service = hyper_util::service::TowerToHyperService::new(app.clone());
                    let served = graceful.watch(
                        builder.serve_connection(hyper_util::rt::TokioIo::new(conn), service),
                    );
                    tokio::spawn(async move {
                        if let Err(e) = served.await {
                            tracing::debug!(error = %e, "HTTP connection ended with an error");
                        }
                    });
                }
                () = &mut stopped => break,
            }
        }
        drop(incoming);
        graceful.shutdown().await;
        Ok(())
    })
}

// ----- the body deadline --------------------------------------------------------------------

/// Gives each request body `body_timeout` from its head to its end. A body that takes longer
/// fails where the handler reads it, and the answer becomes `408 request_timeout` with
/// `connection: close`: what the handler made of the failed read is not sent.
pub(crate) async fn body_deadline(
    State((limit, series)): State<(Duration, Arc<dyn ListenerEvents>)>,
    request: Request,
    next: Next,
) -> Response {
    let expired = Arc::new(AtomicBool::new(false));
    let deadline = Instant::now() + limit;
    let request = request.map(|body| {
        Body::new(DeadlineBody {
            inner: body,
            deadline,
            sleep: None,
            expired: expired.clone(),
        })
    });
    let response = next.run(request).await;
    if !expired.load(Ordering::Relaxed) {
        return response;
    }
    series.timed_out("body");
    let mut r = crate::reply::error(
        StatusCode::REQUEST_TIMEOUT,
        "request_timeout",
        format!(
            "the request body did not arrive within {} (listen.body_timeout); send it whole, \
             or ask the operator for a longer timeout",
            sluice::core::duration_text(u64::try_from(limit.as_millis()).unwrap_or(u64::MAX))
        ),
    );
    r.headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    r
}

/// A request body that fails once its deadline has passed. The timer is made only when the
/// body makes a reader wait, so a body that came with its head costs none.
struct DeadlineBody {
    inner: Body,
    deadline: Instant,
    sleep: Option<Pin<Box<tokio::time::Sleep>>>,
    expired: Arc<AtomicBool>,
}

/// Why a body read failed: its deadline passed.
#[derive(Debug, thiserror::Error)]
#[error("the request body did not arrive within listen.body_timeout")]
struct BodyTimeout;

impl http_body::Body for DeadlineBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, axum::Error>>> {
        let this = self.get_mut();
        if let Poll::Ready(frame) = Pin::new(&mut this.inner).poll_frame(cx) {
            return Poll::Ready(frame);
        }
        let deadline = tokio::time::Instant::from_std(this.deadline);
        let sleep = this
            .sleep
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
        ready!(sleep.as_mut().poll(cx));
        this.expired.store(true, Ordering::Relaxed);
        Poll::Ready(Some(Err(axum::Error::new(BodyTimeout))))
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}
