//! Running futures together, polled in a fixed order.

use std::future::Future;
use std::task::Poll;

/// Runs `futures` concurrently on the current task, each polled in the order given on every
/// wake-up, and returns their outputs in that order. A store that coalesces concurrent
/// decisions queues them in the order they first ask, so this is how a test sends several
/// decisions that go out as one batch, in a known order.
pub async fn join_in_order<F: Future>(futures: impl IntoIterator<Item = F>) -> Vec<F::Output> {
    let mut futures: Vec<_> = futures.into_iter().map(Box::pin).collect();
    let mut out: Vec<Option<F::Output>> = futures.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (f, o) in futures.iter_mut().zip(out.iter_mut()) {
            if o.is_none() {
                match f.as_mut().poll(cx) {
                    Poll::Ready(v) => *o = Some(v),
                    Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    })
    .await;
    out.into_iter().flatten().collect()
}
