//! The one layer every request passes through, in one service and one
//! future instead of a stack of six: the request id (the client's
//! `x-request-id`, or a new one), the request's span (method, route, id,
//! then outcome, status and latency), the request counters and latency
//! histogram, the JSON error shape for errors that are not JSON yet, the
//! `x-request-id` echoed on the response, and the request timeout.
//!
//! It wraps the whole router once ([`crate::http::router`]), not each route:
//! `Router::layer` would box every route's service again and clone that
//! box on every request, and nest one more future holding the request.
//! So the edge finds the request's route itself, from the router's own
//! route patterns (`matchit`, the matcher axum uses), once per request.
//!
//! What the stack cost, per request, measured by `examples/router_cost.rs`:
//! every layer's future wrapping the next one (moved at each level), three
//! clock reads, a timer registered and cancelled, the id formatted through
//! `format!`. Here the clock is read once, the id is written into a
//! buffer on the stack, and the timer is armed only when the route does
//! not answer at its first poll: a filter rejection or an L1 hit answers
//! synchronously and never touches the timer wheel.
//!
//! A route may also have a fast answer for GET ([`EdgeLayer::fast_get`]):
//! a function of the raw path parameter that answers when it can without
//! waiting (the seckill read's and each resource's read's filter "no" and
//! L1 entries), or else starts the route's own work ([`Fast::Later`]: the
//! read past L1, to Redis or SQL). For an answer now the edge
//! finishes the request inside `call`; for work it runs the work's future
//! itself, under the same span, timeout and counting as a routed request,
//! in place of the router's second route match, its path extractor's
//! `String`, its state clone and its boxed route futures (at the cost of
//! one boxed future, a reference count on the resource and the layer's
//! own `Arc` clone into the response future). For an answer now, all of
//! that is skipped: the router, the path extractor, the per-request
//! clones of the state (shared reference counts that both cores write, so
//! the cache line moves between them: BENCHMARKS.md) and this layer's
//! own clone. Either way the request gets the same id, span, counters and
//! log line. A route under
//! the per-client rate limit ([`EdgeLayer::limit_get`]) is checked first,
//! so the limit and the fast answer work together.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{HeaderValue, Request, Response};
use tracing::Instrument;

mod unanswered;

pub use unanswered::EdgeFuture;
use unanswered::{Stage, Unanswered};

use crate::http::telemetry::{on_response, request_span, REQUEST_ID};
use crate::metrics::{Outcome, ServiceMetrics};
use tracing::Span;

/// The layer: see the module docs.
#[derive(Debug, Clone)]
pub struct EdgeLayer {
    shared: Arc<Shared>,
}

struct Shared {
    metrics: Arc<ServiceMetrics>,
    /// Route pattern → index into `patterns`.
    routes: matchit::Router<usize>,
    /// Each pattern with its series in `metrics`.
    patterns: Vec<(Box<str>, usize)>,
    /// Each pattern's fast answer for GET, if it has one.
    fast: Vec<Option<FastGet>>,
    /// Each pattern's per-client rate limit for GET and HEAD, if it has
    /// one: checked here, before the fast answer.
    limits: Vec<Option<Arc<crate::listen::RateLimit>>>,
    /// Each pattern's POSTs that run as long as their work takes (a warm
    /// that waits for a full rebuild): not under `timeout`.
    unbounded_post: Vec<bool>,
    timeout: Duration,
    /// `bg-<process>-`, the fixed part of generated ids.
    prefix: String,
    /// The next block of ids not handed to a thread yet.
    next: AtomicU64,
    /// Which layer this is, so a thread's block of ids is used only for
    /// the layer that gave it (several instances in one process).
    serial: u64,
}

/// A route's fast answer for GET: given the value of the route's first
/// parameter, what [`Fast`] says. The edge never offers it a value with a
/// percent escape (the router decodes those), so the value is the one the
/// handler's extractor would see.
pub type FastGet = Box<dyn Fn(&str) -> Fast + Send + Sync>;

/// The work of a [`Fast::Later`] answer: the response and its outcome.
pub type FastFuture = Pin<Box<dyn Future<Output = (Response<Body>, Outcome)> + Send>>;

/// What a route's fast answer gives the edge for one request.
pub enum Fast {
    /// The answer, without waiting (a filter "no", an L1 entry).
    Now(Response<Body>, Outcome),
    /// The route's own work, started without the router: the edge runs
    /// it as it runs a routed request (the span, the request timeout, a
    /// drop counted as cancelled), only without the router's second match,
    /// its path extractor's `String`, its state clone and its boxed
    /// futures; in their place one boxed future, which holds what it
    /// needs (a reference count on the resource, say).
    Later(FastFuture),
    /// The router answers (a value the handler refuses, with its own
    /// error).
    Route,
}

/// Ids a thread takes from a layer's counter at once: one shared atomic
/// increment per block instead of one per request, which both cores
/// would otherwise fight over.
const ID_BLOCK: u64 = 1024;

thread_local! {
    /// This thread's block of ids: (layer serial, next, end).
    static IDS: std::cell::Cell<(u64, u64, u64)> = const { std::cell::Cell::new((0, 0, 0)) };
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("patterns", &self.patterns)
            .field("timeout", &self.timeout)
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

impl EdgeLayer {
    /// Counts into `metrics` by the route `patterns` (axum's syntax, as
    /// given to the router it wraps); answers 503 for a request not
    /// answered within `timeout`. A pattern that conflicts with an
    /// earlier one (the router refuses it too) counts as unmatched.
    #[must_use]
    pub fn new(metrics: Arc<ServiceMetrics>, timeout: Duration, patterns: &[String]) -> Self {
        let mut routes = matchit::Router::new();
        let mut indexed = Vec::with_capacity(patterns.len());
        for p in patterns {
            if routes.insert(p.as_str(), indexed.len()).is_ok() {
                indexed.push((Box::from(p.as_str()), metrics.route_index(p)));
            }
        }
        Self {
            shared: Arc::new(Shared {
                routes,
                fast: indexed.iter().map(|_| None).collect(),
                limits: indexed.iter().map(|_| None).collect(),
                unbounded_post: indexed.iter().map(|_| false).collect(),
                patterns: indexed,
                metrics,
                timeout,
                prefix: format!("bg-{:08x}-", fastrand::u32(..)),
                next: AtomicU64::new(0),
                serial: {
                    static SERIAL: AtomicU64 = AtomicU64::new(1);
                    SERIAL.fetch_add(1, Ordering::Relaxed)
                },
            }),
        }
    }

    /// Gives GET requests on `pattern` (one of the layer's patterns, with
    /// a parameter) the fast answer `answer`; see the module docs. Call it
    /// before the layer wraps a service. Returns false, changing nothing,
    /// for a pattern the layer does not route or a layer already in use.
    pub fn fast_get(&mut self, pattern: &str, answer: FastGet) -> bool {
        let Some(shared) = Arc::get_mut(&mut self.shared) else {
            return false;
        };
        let Some(i) = shared.patterns.iter().position(|(p, _)| &**p == pattern) else {
            return false;
        };
        shared.fast[i] = Some(answer);
        true
    }

    /// Puts GET and HEAD requests on `pattern` under `limit`, checked
    /// before the fast answer and the router. Returns false as
    /// [`EdgeLayer::fast_get`] does.
    pub fn limit_get(&mut self, pattern: &str, limit: Arc<crate::listen::RateLimit>) -> bool {
        let Some(shared) = Arc::get_mut(&mut self.shared) else {
            return false;
        };
        let Some(i) = shared.patterns.iter().position(|(p, _)| &**p == pattern) else {
            return false;
        };
        shared.limits[i] = Some(limit);
        true
    }
}

impl EdgeLayer {
    /// Takes POST requests on `pattern` out of the request timeout: an
    /// admin call whose answer is the end of a long job (a warm that
    /// waits for a rebuild of 10^8 rows), which a 503 would only make an
    /// operator start again. Such a call ends when its job does, or when
    /// the client goes away. Returns false as [`EdgeLayer::fast_get`]
    /// does.
    pub fn unbounded_post(&mut self, pattern: &str) -> bool {
        let Some(shared) = Arc::get_mut(&mut self.shared) else {
            return false;
        };
        let Some(i) = shared.patterns.iter().position(|(p, _)| &**p == pattern) else {
            return false;
        };
        shared.unbounded_post[i] = true;
        true
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
    /// A number no other request of this layer got: the next of this
    /// thread's block, or the first of a new block.
    fn next_number(&self) -> u64 {
        IDS.with(|ids| {
            let (serial, next, end) = ids.get();
            if serial == self.serial && next < end {
                ids.set((serial, next + 1, end));
                return next;
            }
            let start = self.next.fetch_add(ID_BLOCK, Ordering::Relaxed);
            ids.set((self.serial, start + 1, start + ID_BLOCK));
            start
        })
    }

    /// `bg-<process>-<n>`, without `format!`.
    fn next_id(&self) -> HeaderValue {
        let n = self.next_number();
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
        // One lookup of the route for the counters, the span and the fast
        // answer.
        let shared = &*self.shared;
        let (matched, route, fast, limit, bounded) = match shared.routes.at(req.uri().path()) {
            Ok(m) => {
                let (pattern, series) = &shared.patterns[*m.value];
                // A value with a percent escape is not what the handler's
                // extractor sees: only the router decodes it.
                let fast = shared.fast[*m.value]
                    .as_ref()
                    .filter(|_| req.method() == axum::http::Method::GET)
                    .zip(m.params.iter().next().map(|(_, v)| v))
                    .filter(|(_, raw)| !raw.contains('%'));
                let read = matches!(
                    *req.method(),
                    axum::http::Method::GET | axum::http::Method::HEAD
                );
                let limit = shared.limits[*m.value].as_ref().filter(|_| read);
                let bounded =
                    !(shared.unbounded_post[*m.value] && req.method() == axum::http::Method::POST);
                (Some(&**pattern), *series, fast, limit, bounded)
            }
            Err(_) => (None, 0, None, None, true),
        };
        let span = request_span(&req, matched, &id);
        if let Some(limit) = limit {
            let client = crate::http::limits::client_of(limit, req.extensions());
            if let Some(res) = crate::http::limits::refuse(limit, client, 1) {
                let res = shared.finish(res, None, started, route, Some(id), &span);
                return EdgeFuture::answered(res);
            }
        }
        if let Some((answer, raw)) = fast {
            let answered = {
                let _entered = (!span.is_none()).then(|| span.enter());
                answer(raw)
            };
            match answered {
                Fast::Now(res, outcome) => {
                    shared.metrics.fast_answered();
                    let res = shared.finish(res, Some(outcome), started, route, Some(id), &span);
                    return EdgeFuture::answered(res);
                }
                Fast::Later(work) => {
                    shared.metrics.fast_answered();
                    return EdgeFuture {
                        state: Stage::Direct {
                            inner: work.instrument(span),
                            open: Unanswered::new(
                                Arc::clone(&self.shared),
                                started,
                                route,
                                bounded,
                                id,
                            ),
                        },
                    };
                }
                Fast::Route => {}
            }
        }
        EdgeFuture {
            state: Stage::Routed {
                inner: self.inner.call(req).instrument(span),
                open: Unanswered::new(Arc::clone(&self.shared), started, route, bounded, id),
            },
        }
    }
}

impl Shared {
    /// Everything a response gets on its way out: the JSON error shape
    /// unless the handler noted an outcome (such handlers answer JSON),
    /// the counters and histogram, the echoed id, the span's fields and
    /// the log line.
    fn finish(
        &self,
        answered: Response<Body>,
        noted: Option<Outcome>,
        started: Instant,
        route: usize,
        id: Option<HeaderValue>,
        span: &Span,
    ) -> Response<Body> {
        let mut res = if noted.is_some() {
            answered
        } else {
            crate::http::json_errors::json_errors(answered)
        };
        let status = res.status();
        let outcome = noted.unwrap_or_else(|| Outcome::of_status(status.as_u16()));
        let latency = started.elapsed();
        self.metrics
            .record(route, outcome, status.as_u16(), latency);
        if let Some(id) = id {
            res.headers_mut().insert(REQUEST_ID, id);
        }
        // The request's log line belongs to its span.
        let _entered = (!span.is_none()).then(|| span.enter());
        on_response(&res, latency, span);
        res
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;
    use std::sync::Arc;
    use std::time::Duration;

    use super::{EdgeLayer, Fast, ID_BLOCK};
    use crate::metrics::ServiceMetrics;

    fn layer() -> EdgeLayer {
        EdgeLayer::new(Arc::new(ServiceMetrics::new()), Duration::from_secs(1), &[])
    }

    /// A fast answer gets GETs only, and only values without a percent
    /// escape; everything else reaches the wrapped service.
    #[tokio::test]
    async fn a_fast_answer_sees_only_plain_values_of_gets() {
        use axum::body::Body;
        use axum::http::{Method, Request, Response, StatusCode};
        use tower::{Layer, ServiceExt};

        let mut edge = EdgeLayer::new(
            Arc::new(ServiceMetrics::new()),
            Duration::from_secs(1),
            &["/r/{key}".to_owned()],
        );
        let offered = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
        let log = Arc::clone(&offered);
        assert!(edge.fast_get(
            "/r/{key}",
            Box::new(move |raw| {
                log.lock().unwrap().push(raw.to_owned());
                Fast::Now(Response::new(Body::empty()), crate::metrics::Outcome::OK)
            }),
        ));
        assert!(!edge.fast_get("/nope/{key}", Box::new(|_| Fast::Route)));
        let routed = tower::service_fn(|_req: Request<Body>| async {
            let mut res = Response::new(Body::empty());
            *res.status_mut() = StatusCode::IM_A_TEAPOT;
            Ok::<_, std::convert::Infallible>(res)
        });
        let app = edge.layer(routed);
        let mut statuses = Vec::new();
        for (method, path) in [
            (Method::GET, "/r/abc"),
            (Method::GET, "/r/a%62c"),
            (Method::HEAD, "/r/abc"),
            (Method::POST, "/r/abc"),
            (Method::GET, "/elsewhere"),
        ] {
            let req = Request::builder()
                .method(method)
                .uri(path)
                .body(Body::empty());
            let res = app.clone().oneshot(req.unwrap()).await.unwrap();
            statuses.push(res.status().as_u16());
        }
        assert_eq!(statuses, [200, 418, 418, 418, 418]);
        assert_eq!(*offered.lock().unwrap(), ["abc"]);
    }

    /// A fast answer's later work runs as a routed request does: its
    /// answer with its outcome, "no answer" routed on, work past the
    /// request timeout answered 503 JSON with its future dropped, and
    /// work whose client went away counted as cancelled.
    #[tokio::test]
    async fn a_later_answer_runs_under_the_request_timeout() {
        use axum::body::Body;
        use axum::http::{Request, Response, StatusCode};
        use tower::{Layer, ServiceExt};

        let metrics = Arc::new(ServiceMetrics::new());
        let mut edge = EdgeLayer::new(
            Arc::clone(&metrics),
            Duration::from_secs(1),
            &["/r/{key}".to_owned()],
        );
        let dropped = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = Arc::clone(&dropped);
        assert!(edge.fast_get(
            "/r/{key}",
            Box::new(move |raw| match raw {
                "soon" => Fast::Later(Box::pin(async {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    let mut res = Response::new(Body::from("later"));
                    *res.status_mut() = StatusCode::ACCEPTED;
                    (res, crate::metrics::Outcome::OK)
                })),
                "never" => {
                    let guard = on_drop(Arc::clone(&flag));
                    Fast::Later(Box::pin(async move {
                        let _guard = guard;
                        std::future::pending::<()>().await;
                        unreachable!()
                    }))
                }
                _ => Fast::Route,
            }),
        ));
        let routed = tower::service_fn(|_req: Request<Body>| async {
            let mut res = Response::new(Body::empty());
            *res.status_mut() = StatusCode::IM_A_TEAPOT;
            Ok::<_, std::convert::Infallible>(res)
        });
        let app = edge.layer(routed);
        let get = |path: &str| Request::get(path).body(Body::empty()).unwrap();
        let started = std::time::Instant::now();
        // Bounded here, so a path that ignored the request timeout fails
        // instead of hanging.
        let within = |secs| Duration::from_secs(secs);
        let res = tokio::time::timeout(within(5), app.clone().oneshot(get("/r/never")))
            .await
            .expect("the request timeout did not end the work")
            .unwrap();
        assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
        let waited = started.elapsed();
        assert!(
            waited >= Duration::from_secs(1) && waited < Duration::from_secs(5),
            "{waited:?}"
        );
        assert!(
            dropped.load(std::sync::atomic::Ordering::SeqCst),
            "work not dropped"
        );
        let body = axum::body::to_bytes(res.into_body(), 1024).await.unwrap();
        let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(body["error"], "unavailable");
        let res = app.clone().oneshot(get("/r/soon")).await.unwrap();
        assert_eq!(res.status(), StatusCode::ACCEPTED);
        assert!(res.headers().contains_key("x-request-id"));
        let body = axum::body::to_bytes(res.into_body(), 1024).await.unwrap();
        assert_eq!(&body[..], b"later");
        let res = app.clone().oneshot(get("/r/other")).await.unwrap();
        assert_eq!(res.status(), StatusCode::IM_A_TEAPOT);
        // A client that goes away: the work is dropped unanswered.
        let gone = tokio::time::timeout(Duration::from_millis(20), app.oneshot(get("/r/never")));
        assert!(gone.await.is_err(), "the work answered");
        assert_eq!(metrics.fast_answers(), 3);
        // Each request counted once, by the outcome the work gave, or by
        // its end: the routed 418 is a client error.
        let counted = metrics.requests_by_outcome("/r/{key}");
        let expected = [
            ("cancelled", 1),
            ("client_error", 1),
            ("error", 1),
            ("ok", 1),
        ];
        assert_eq!(counted, expected.into_iter().collect(), "{counted:?}");
    }

    /// Sets its flag when dropped.
    fn on_drop(flag: Arc<std::sync::atomic::AtomicBool>) -> impl Send {
        struct Guard(Arc<std::sync::atomic::AtomicBool>);
        impl Drop for Guard {
            fn drop(&mut self) {
                self.0.store(true, std::sync::atomic::Ordering::SeqCst);
            }
        }
        Guard(flag)
    }

    /// Ids come from per-thread blocks: across threads, and with two
    /// layers used in turn on one thread, no id repeats within a layer.
    #[test]
    fn generated_ids_never_repeat_within_a_layer() {
        let (a, b) = (layer(), layer());
        let per_thread = 3 * ID_BLOCK as usize + 7;
        let threads: Vec<_> = (0..3)
            .map(|_| {
                let (a, b) = (a.clone(), b.clone());
                std::thread::spawn(move || {
                    let mut ids = (Vec::new(), Vec::new());
                    for i in 0..per_thread {
                        ids.0.push(a.shared.next_id());
                        // Alternate layers in runs, so a thread's block
                        // is abandoned and taken anew.
                        if i % 500 < 3 {
                            ids.1.push(b.shared.next_id());
                        }
                    }
                    ids
                })
            })
            .collect();
        let (mut seen_a, mut seen_b) = (HashSet::new(), HashSet::new());
        let mut total = (0, 0);
        for t in threads {
            let (ia, ib) = t.join().unwrap();
            total.0 += ia.len();
            total.1 += ib.len();
            seen_a.extend(ia);
            seen_b.extend(ib);
        }
        assert_eq!(seen_a.len(), total.0);
        assert_eq!(seen_b.len(), total.1);
        assert!(seen_a
            .iter()
            .all(|id| id.to_str().unwrap().starts_with(&a.shared.prefix)));
    }
}
