//! A request the edge has not answered yet: its response future (an
//! answer already made, the router's future, or a route's own work
//! started without the router), the request timeout armed at its first
//! `Pending`, and its count as cancelled (499) or failed (500) when it is
//! dropped unanswered.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use axum::body::Body;
use axum::http::{HeaderValue, Response, StatusCode};
use tracing::instrument::Instrumented;
use tracing::Span;

use super::{FastFuture, Shared};
use crate::metrics::Outcome;

pin_project_lite::pin_project! {
    /// The response future of [`super::Edge`].
    pub struct EdgeFuture<F> {
        #[pin]
        pub(super) state: Stage<F>,
    }
}

impl<F> EdgeFuture<F> {
    pub(super) fn answered(res: Response<Body>) -> Self {
        Self {
            state: Stage::Answered { res: Some(res) },
        }
    }
}

/// A request whose work (routed or direct) has not answered yet. Dropped so (the client went away
/// and the server dropped the request's future, or the shutdown grace
/// ran out), it is counted as [`Outcome::CANCELLED`] with status 499; one
/// dropped by a handler's panic as an `error`, 500.
pub(super) struct Unanswered {
    shared: Arc<Shared>,
    started: Instant,
    route: usize,
    /// Under the request timeout (see [`super::EdgeLayer::unbounded_post`]).
    bounded: bool,
    answered: bool,
    /// The request timeout, armed at the first `Pending`.
    sleep: Option<Pin<Box<tokio::time::Sleep>>>,
    /// The id the response echoes.
    id: Option<HeaderValue>,
}

impl Unanswered {
    pub(super) fn new(
        shared: Arc<Shared>,
        started: Instant,
        route: usize,
        bounded: bool,
        id: HeaderValue,
    ) -> Self {
        Self {
            shared,
            started,
            route,
            bounded,
            answered: false,
            sleep: None,
            id: Some(id),
        }
    }

    /// The request's end, given what its work's latest poll gave (with
    /// the outcome its handler noted, if any): the finished response, or
    /// the 503 once the request timeout has passed, or `Pending`.
    fn settle(
        &mut self,
        polled: Poll<(Response<Body>, Option<Outcome>)>,
        cx: &mut Context<'_>,
        span: &Span,
    ) -> Poll<Response<Body>> {
        let (answered, noted) = match polled {
            Poll::Ready(done) => done,
            Poll::Pending if !self.bounded => return Poll::Pending,
            Poll::Pending => {
                let deadline = tokio::time::Instant::from_std(self.started + self.shared.timeout);
                let sleep = self
                    .sleep
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
                if sleep.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                // Too long: the work's future is dropped (cancelled) with
                // this one.
                let res = crate::http::error::error_response(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "unavailable",
                    "the request took too long; retry",
                );
                (res, None)
            }
        };
        self.answered = true;
        Poll::Ready(self.shared.finish(
            answered,
            noted,
            self.started,
            self.route,
            self.id.take(),
            span,
        ))
    }
}

impl Drop for Unanswered {
    fn drop(&mut self) {
        if !self.answered {
            let (outcome, status) = if std::thread::panicking() {
                (Outcome::ERROR, 500)
            } else {
                (Outcome::CANCELLED, 499)
            };
            let latency = self.started.elapsed();
            self.shared
                .metrics
                .record(self.route, outcome, status, latency);
            tracing::debug!(
                status,
                latency_ms = latency.as_millis() as u64,
                "request dropped before its answer"
            );
        }
    }
}

pin_project_lite::pin_project! {
    #[project = StageProj]
    pub(super) enum Stage<F> {
        // Finished in `call` (a fast answer).
        Answered { res: Option<Response<Body>> },
        // Through the router.
        Routed {
            #[pin]
            inner: Instrumented<F>,
            open: Unanswered,
        },
        // The route's own work, without the router (`Fast::Later`).
        Direct {
            #[pin]
            inner: Instrumented<FastFuture>,
            open: Unanswered,
        },
    }
}

impl<F, E> Future for EdgeFuture<F>
where
    F: Future<Output = Result<Response<Body>, E>>,
{
    type Output = Result<Response<Body>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().state.project() {
            // Polled again after it answered: nothing more to give.
            StageProj::Answered { res } => res.take().map_or(Poll::Pending, |r| Poll::Ready(Ok(r))),
            StageProj::Routed { mut inner, open } => {
                // Whatever an earlier request on this thread left unclaimed.
                let _ = Outcome::take_noted();
                let polled = match inner.as_mut().poll(cx) {
                    // A handler that notes its outcome answers JSON
                    // already (the read routes: see `Outcome::note`); any
                    // other response is checked.
                    Poll::Ready(Ok(res)) => Poll::Ready((res, Outcome::take_noted())),
                    Poll::Ready(Err(e)) => {
                        open.answered = true;
                        return Poll::Ready(Err(e));
                    }
                    Poll::Pending => Poll::Pending,
                };
                open.settle(polled, cx, inner.span()).map(Ok)
            }
            StageProj::Direct { mut inner, open } => {
                let polled = inner
                    .as_mut()
                    .poll(cx)
                    .map(|(res, outcome)| (res, Some(outcome)));
                open.settle(polled, cx, inner.span()).map(Ok)
            }
        }
    }
}
