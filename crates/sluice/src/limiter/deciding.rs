//! [`Deciding`]: the future of one limiter call, written out by hand.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use sluice_core::evaluate::Op;
use sluice_core::{Clock, Decision, FailureMode, Policy};

use super::{Error, Limiter, validate};
use crate::store::{Store, StoreError};

pin_project_lite::pin_project! {
    /// The future of [`Limiter::call`], written out rather than `async`: a decision is a few
    /// hundred bytes, and an `async fn` moves its answer through its state several times
    /// where this moves it once.
    pub(super) struct Deciding<'a, S, C, G, F> {
        limiter: &'a Limiter<S, C>,
        policy: &'a Policy,
        key: &'a str,
        op: Op,
        now: u64,
        // Makes the store's future at the first poll, given `now`.
        start: Option<G>,
        #[pin]
        store: Option<F>,
        // Only after the store answered for a `local` policy while local admissions are owed:
        // their charge-back (rare, so boxed), then the decision it waits with.
        charge: Option<Pin<Box<dyn Future<Output = ()> + Send + 'a>>>,
        decided: Option<Decision>,
    }
}

impl<'a, S, C, G, F> Deciding<'a, S, C, G, F>
where
    G: FnOnce(u64) -> F,
{
    pub(super) fn new(
        limiter: &'a Limiter<S, C>,
        policy: &'a Policy,
        key: &'a str,
        op: Op,
        start: G,
    ) -> Self {
        Self {
            limiter,
            policy,
            key,
            op,
            now: 0,
            start: Some(start),
            store: None,
            charge: None,
            decided: None,
        }
    }
}

impl<S, C, G, F> Future for Deciding<'_, S, C, G, F>
where
    S: Store,
    C: Clock + Sync,
    G: FnOnce(u64) -> F,
    F: Future<Output = Result<Decision, StoreError>>,
{
    type Output = Result<Decision, Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        if let Some(start) = this.start.take() {
            if let Err(e) = validate(this.policy, this.key, *this.op) {
                return Poll::Ready(Err(e));
            }
            *this.now = this.limiter.clock.now_ms();
            this.store.set(Some(start(*this.now)));
        }
        if let Some(charge) = this.charge.as_mut() {
            return match charge.as_mut().poll(cx) {
                Poll::Pending => Poll::Pending,
                Poll::Ready(()) => {
                    *this.charge = None;
                    match this.decided.take() {
                        Some(d) => Poll::Ready(Ok(d)),
                        None => Poll::Ready(Err(polled_after_completion())),
                    }
                }
            };
        }
        let Some(store) = this.store.as_mut().as_pin_mut() else {
            return Poll::Ready(Err(polled_after_completion()));
        };
        match store.poll(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Ok(d)) => {
                let limiter = *this.limiter;
                if this.policy.failure_mode() != FailureMode::Local || !limiter.charges.owed() {
                    return Poll::Ready(Ok(d));
                }
                this.store.set(None);
                *this.decided = Some(d);
                let mut charge = Box::pin(limiter.charge_after(this.policy, this.key, *this.now));
                match charge.as_mut().poll(cx) {
                    Poll::Ready(()) => match this.decided.take() {
                        Some(d) => Poll::Ready(Ok(d)),
                        None => Poll::Ready(Err(polled_after_completion())),
                    },
                    Poll::Pending => {
                        *this.charge = Some(charge);
                        Poll::Pending
                    }
                }
            }
            Poll::Ready(Err(e)) => {
                Poll::Ready(
                    this.limiter
                        .failed(this.policy, this.key, *this.op, *this.now, e),
                )
            }
        }
    }
}

/// The error of a limiter call's future polled again after it completed.
fn polled_after_completion() -> Error {
    Error::Store(StoreError::Backend(
        "a limiter call was polled after it completed".to_owned(),
    ))
}
