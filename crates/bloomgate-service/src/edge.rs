//! The one layer every request passes through, in one service and one
//! future instead of a stack of six: the request id (the client's
//! `x-request-id`, or a new one), the request's span (method, route, id,
//! then outcome, status and latency), the request counters and latency
//! histogram, the JSON error shape for errors that are not JSON yet, the
//! `x-request-id` echoed on the response, and the request timeout.
//!
//! What the stack cost, per request, measured by `examples/router_cost.rs`:
//! every layer's future wrapping the next one (moved at each level), three
//! clock reads, a timer registered and cancelled, the id formatted through
//! `format!`. Here the clock is read once, the id is written into a
//! buffer on the stack, and the timer is armed only when the route does
//! not answer at its first poll: a filter rejection or an L1 hit answers
//! synchronously and never touches the timer wheel.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::MatchedPath;
use axum::http::{HeaderValue, Request, Response, StatusCode};
use tracing::instrument::Instrumented;
use tracing::Instrument;

use crate::metrics::{Outcome, ServiceMetrics};
use crate::telemetry::{on_response, request_span, REQUEST_ID};

/// The layer: see the module docs.
#[derive(Debug, Clone)]
pub struct EdgeLayer {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    metrics: Arc<ServiceMetrics>,
    timeout: Duration,
    /// `bg-<process>-`, the fixed part of generated ids.
    prefix: String,
    next: AtomicU64,
}

impl EdgeLayer {
    /// Counts into `metrics`; answers 503 for a request not answered
    /// within `timeout`.
    #[must_use]
    pub fn new(metrics: Arc<ServiceMetrics>, timeout: Duration) -> Self {
        Self {
            shared: Arc::new(Shared {
                metrics,
                timeout,
                prefix: format!("bg-{:08x}-", fastrand::u32(..)),
                next: AtomicU64::new(0),
            }),
        }
    }
}

impl<S> tower::Layer<S> for EdgeLayer {
    type Service = Edge<S>;
    fn layer(&self, inner: S) -> Self::Service {
        Edge {
            inner,
            shared: Arc::clone(&self.shared),
        }
    }
}

/// See [`EdgeLayer`].
#[derive(Debug, Clone)]
pub struct Edge<S> {
    inner: S,
    shared: Arc<Shared>,
}

impl Shared {
    /// `bg-<process>-<n>`, without `format!`.
    fn next_id(&self) -> HeaderValue {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let mut buf = [0u8; 48];
        let p = self.prefix.as_bytes();
        buf[..p.len()].copy_from_slice(p);
        let mut digits = itoa::Buffer::new();
        let d = digits.format(n).as_bytes();
        buf[p.len()..p.len() + d.len()].copy_from_slice(d);
        HeaderValue::from_bytes(&buf[..p.len() + d.len()])
            .unwrap_or_else(|_| HeaderValue::from_static("bg"))
    }
}

impl<S> tower::Service<Request<Body>> for Edge<S>
where
    S: tower::Service<Request<Body>, Response = Response<Body>>,
{
    type Response = Response<Body>;
    type Error = S::Error;
    type Future = EdgeFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        let started = Instant::now();
        let id = match req.headers().get(&REQUEST_ID) {
            Some(given) => given.clone(),
            None => self.shared.next_id(),
        };
        // One lookup of the matched route for the counters and the span.
        let matched = req
            .extensions()
            .get::<MatchedPath>()
            .map(MatchedPath::as_str);
        let route = matched.map_or(0, |p| self.shared.metrics.route_index(p));
        let span = request_span(&req, matched, &id);
        EdgeFuture {
            inner: self.inner.call(req).instrument(span),
            sleep: None,
            shared: Arc::clone(&self.shared),
            started,
            route,
            id: Some(id),
        }
    }
}

pin_project_lite::pin_project! {
    /// The response future of [`Edge`].
    pub struct EdgeFuture<F> {
        #[pin]
        inner: Instrumented<F>,
        // Armed at the first `Pending`.
        sleep: Option<Pin<Box<tokio::time::Sleep>>>,
        shared: Arc<Shared>,
        started: Instant,
        route: usize,
        id: Option<HeaderValue>,
    }
}

impl<F, E> Future for EdgeFuture<F>
where
    F: Future<Output = Result<Response<Body>, E>>,
{
    type Output = Result<Response<Body>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        // Whatever an earlier request on this thread left unclaimed.
        let _ = Outcome::take_noted();
        let answered = match this.inner.as_mut().poll(cx) {
            Poll::Ready(Ok(res)) => res,
            Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
            Poll::Pending => {
                let deadline = tokio::time::Instant::from_std(*this.started + this.shared.timeout);
                let sleep = this
                    .sleep
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
                if sleep.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                // Too long: the route's future is dropped (cancelled) with
                // this one.
                crate::error::error_response(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "unavailable",
                    "the request took too long; retry",
                )
            }
        };
        let mut res = crate::json_errors::json_errors(answered);
        let status = res.status();
        let outcome = Outcome::take_noted().unwrap_or_else(|| Outcome::of_status(status.as_u16()));
        let latency = this.started.elapsed();
        this.shared
            .metrics
            .record(*this.route, outcome, status.as_u16(), latency.as_secs_f64());
        if let Some(id) = this.id.take() {
            res.headers_mut().insert(REQUEST_ID, id);
        }
        // The request's log line belongs to its span.
        let span = this.inner.span();
        let _entered = span.enter();
        on_response(&res, latency, span);
        Poll::Ready(Ok(res))
    }
}
