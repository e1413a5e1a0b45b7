//! The HTTP gate (`[gate]`): bloomgate in front of an HTTP API it did
//! not write. Not to be confused with [`crate::shield`], a filter's slots
//! and trust; this room only asks a resource for its verdict, through the
//! call the service's own `exists` makes.
//!
//! Two ways in, one decision ([`judge`]):
//! - the reverse proxy ([`serve`]): a listener of its own that answers a
//!   route's refused keys itself and forwards everything else to
//!   `gate.upstream` unchanged ([`forward`]), after refusing what a proxy
//!   must not pass (smuggling: [`framing`]; `CONNECT`, targets for other
//!   hosts, over-long targets);
//! - the auth-request check ([`check`]): `/api/gate/check` on the
//!   service's listener, asked by an nginx, Caddy, Traefik or Envoy in
//!   front of the API.
//!
//! [`route`] normalises paths and matches them to route patterns.

use std::net::SocketAddr;
use std::sync::Arc;

use hyper::body::Incoming;
use hyper::header::{self, HeaderName, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};

use crate::config::proxy::ProxyConfig;
use crate::metrics::proxy::Outcome;
use crate::metrics::ServiceMetrics;

pub mod check;
pub mod forward;
pub mod framing;
pub mod judge;
pub mod route;
mod serve;

pub use serve::{serve_per_core, Limits};

use forward::{own_answer, ProxyBody, Upstream};
use judge::{Asked, Asker, Judgement, Passed, Route, Routes};

/// The reverse proxy: the routes, the upstream's pool, the metrics.
#[derive(Debug)]
pub struct Proxy {
    routes: Arc<Routes>,
    upstream: Upstream,
    metrics: Arc<ServiceMetrics>,
    max_uri: usize,
    /// Peers whose forwarding headers are kept (`gate.trusted_proxies`).
    trusted: Vec<ipnet::IpNet>,
    /// The service's runtime, entered while the filter and the Redis
    /// memory are asked (see [`on_service`]); `None`: the current one.
    service: Option<tokio::runtime::Handle>,
}

impl Proxy {
    /// The proxy of a validated `[gate]` table over `routes`.
    #[must_use]
    pub fn new(config: &ProxyConfig, routes: Arc<Routes>, metrics: Arc<ServiceMetrics>) -> Self {
        Self {
            routes,
            upstream: Upstream::new(config),
            metrics,
            max_uri: config.max_uri_bytes,
            trusted: config
                .trusted_proxies
                .iter()
                .filter_map(|p| crate::config::proxy::trusted_net(p))
                .collect(),
            service: None,
        }
    }

    /// Asks the filter and the Redis memory on `service`'s runtime (the
    /// gate's threads run runtimes of their own).
    #[must_use]
    pub fn on_service_runtime(mut self, service: tokio::runtime::Handle) -> Self {
        self.service = Some(service);
        self
    }

    /// Answers one request: refused by the gate, or the upstream's answer.
    /// `framing` is the verdict on the request's head ([`framing`]).
    pub async fn handle(
        &self,
        req: Request<Incoming>,
        peer: SocketAddr,
        framing: framing::Head,
    ) -> Response<ProxyBody> {
        let mut resp = self.answer(req, peer).await;
        if framing == framing::Head::Unscanned {
            // The scan cannot vouch for the bytes after this request.
            resp.headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        resp
    }

    async fn answer(&self, req: Request<Incoming>, peer: SocketAddr) -> Response<ProxyBody> {
        let m = &self.metrics.gate;
        if let Some(refused) = self.refused(&req) {
            m.record(m.unrouted(), Outcome::BadRequest);
            return refused;
        }
        let host = req
            .headers()
            .get(header::HOST)
            .and_then(|h| h.to_str().ok())
            .or_else(|| {
                req.uri()
                    .authority()
                    .map(hyper::http::uri::Authority::as_str)
            })
            .unwrap_or("");
        let asked = Asked {
            method: req.method().as_str(),
            path: req.uri().path(),
            query: req.uri().query().is_some(),
            host,
            headers: req.headers(),
        };
        let judged = on_service(
            self.service.as_ref(),
            self.routes.judge(&asked, Asker::Proxy),
        )
        .await;
        match judged {
            Judgement::Refuse(route) => {
                m.record(route.slot, Outcome::Rejected);
                refuse(route)
            }
            Judgement::Remembered(route) => {
                m.record(route.slot, Outcome::NotFoundCached);
                refuse(route)
            }
            Judgement::Pass(route, passed) => self.forward(req, peer, Some((route, passed))).await,
            Judgement::Unrouted => self.forward(req, peer, None).await,
        }
    }

    /// The gate's own refusal of what a proxy must not pass.
    fn refused(&self, req: &Request<Incoming>) -> Option<Response<ProxyBody>> {
        if req.method() == Method::CONNECT {
            let mut r = own_answer(
                StatusCode::METHOD_NOT_ALLOWED,
                "not_a_proxy",
                "CONNECT is refused: this gate forwards only to its upstream",
            );
            // The smuggling scan stops at a CONNECT: so does the connection.
            r.headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
            return Some(r);
        }
        if req.headers().get_all(header::HOST).iter().count() > 1 {
            return Some(own_answer(
                StatusCode::BAD_REQUEST,
                "bad_request",
                "more than one Host header",
            ));
        }
        if let Some(authority) = req.uri().authority() {
            let host = req.headers().get(header::HOST).map(HeaderValue::as_bytes);
            if host != Some(authority.as_str().as_bytes()) {
                return Some(own_answer(
                    StatusCode::BAD_REQUEST,
                    "not_a_proxy",
                    "an absolute target for another host is refused: this gate forwards only to its upstream",
                ));
            }
        }
        let target = req.uri().path_and_query().map_or(0, |p| p.as_str().len());
        if target > self.max_uri {
            return Some(own_answer(
                StatusCode::URI_TOO_LONG,
                "uri_too_long",
                &format!("the target is longer than {} bytes", self.max_uri),
            ));
        }
        None
    }

    /// Sends `req` to the upstream and streams its answer back; a 404 for
    /// a `pending` key is remembered first.
    async fn forward(
        &self,
        mut req: Request<Incoming>,
        peer: SocketAddr,
        route: Option<(&Route, Passed)>,
    ) -> Response<ProxyBody> {
        let m = &self.metrics.gate;
        let slot = route.as_ref().map(|(r, _)| r.slot);
        // Any upgrade asked for stops the smuggling scan at its head; only
        // WebSocket is tunnelled, any other goes on as a plain request.
        let upgrade = forward::wants_upgrade(req.headers());
        let tunnel = upgrade && forward::tunnels(req.headers());
        let client_side = tunnel.then(|| hyper::upgrade::on(&mut req));
        let (mut parts, body) = req.into_parts();
        // The connection's place under the limit: a tunnel keeps it.
        let held = parts.extensions.remove::<serve::Slot>();
        // A chunked body keeps its framing (hyper's client would send a
        // GET's or HEAD's body of unknown length as none at all).
        let chunked = parts.headers.contains_key(header::TRANSFER_ENCODING);
        forward::strip_hop_by_hop(&mut parts.headers, tunnel);
        if chunked {
            parts.headers.insert(
                header::TRANSFER_ENCODING,
                HeaderValue::from_static("chunked"),
            );
        }
        // A client's own forwarding headers are replaced: an API that reads
        // the leftmost value (Express, Django, Spring) would read its
        // spoof. A trusted proxy's are kept, the gate's appended.
        // A dual-stack listener sees an IPv4 peer as `::ffff:a.b.c.d`.
        let peer_ip = peer.ip().to_canonical();
        let trusted = self.trusted.iter().any(|n| n.contains(&peer_ip));
        let forwarded = parts.headers.contains_key(FORWARDED);
        if !trusted {
            for name in [
                X_FORWARDED_FOR,
                X_FORWARDED_PROTO,
                X_FORWARDED_HOST,
                FORWARDED,
            ] {
                parts.headers.remove(name);
            }
        }
        let ip = peer_ip.to_string();
        forward::append_list(&mut parts.headers, X_FORWARDED_FOR, &ip);
        forward::append_list(&mut parts.headers, X_FORWARDED_PROTO, "http");
        let host = parts
            .headers
            .get(header::HOST)
            .and_then(|h| h.to_str().ok())
            .map(str::to_owned);
        if let Some(host) = &host {
            forward::append_list(&mut parts.headers, X_FORWARDED_HOST, host);
        }
        if forwarded {
            let element = forward::forwarded_element(peer_ip, host.as_deref());
            forward::append_list(&mut parts.headers, FORWARDED, &element);
        }
        parts.version = hyper::Version::HTTP_11;
        let req = Request::from_parts(parts, forward::Idle::new(body, self.upstream.idle()));
        let started = quanta::Instant::now();
        let sent = {
            let _flight = InFlight::new(&self.metrics);
            self.upstream.send(req).await
        };
        let outcome = |o| m.record(slot.unwrap_or_else(|| m.unrouted()), o);
        match sent {
            Err(forward::Failure::Unreachable(why)) => {
                outcome(Outcome::UpstreamError);
                tracing::warn!(error = %why, "the gate's upstream could not be reached");
                own_answer(
                    StatusCode::BAD_GATEWAY,
                    "bad_gateway",
                    "the upstream could not be reached",
                )
            }
            Err(forward::Failure::Timeout) => {
                outcome(Outcome::UpstreamError);
                own_answer(
                    StatusCode::GATEWAY_TIMEOUT,
                    "gateway_timeout",
                    "the upstream sent no response in time",
                )
            }
            Ok(mut resp) => {
                m.upstream_latency(started.elapsed());
                outcome(Outcome::Forwarded);
                if let Some((route, passed)) = route {
                    let not_found = resp.status() == StatusCode::NOT_FOUND;
                    if passed.maybe {
                        m.judged(route.slot, not_found);
                    }
                    if let (true, Some(pending)) = (not_found, passed.pending) {
                        on_service(self.service.as_ref(), pending.remember(route)).await;
                    }
                }
                let switched = tunnel && resp.status() == StatusCode::SWITCHING_PROTOCOLS;
                if let (true, Some(client_side)) = (switched, client_side) {
                    forward::splice(client_side, hyper::upgrade::on(&mut resp), held);
                }
                forward::strip_hop_by_hop(resp.headers_mut(), switched);
                if upgrade && !switched {
                    // A declined upgrade: the smuggling scan stopped at its
                    // head, so the connection ends with this answer.
                    resp.headers_mut()
                        .insert(header::CONNECTION, HeaderValue::from_static("close"));
                }
                forward::streamed(resp, self.upstream.idle())
            }
        }
    }
}

/// A route's refusal: its configured answer.
fn refuse(route: &Route) -> Response<ProxyBody> {
    let r = &route.refusal;
    forward::fixed(
        StatusCode::from_u16(r.status).unwrap_or(StatusCode::NOT_FOUND),
        r.content_type.clone(),
        r.body.clone(),
    )
}

const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
const X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
const X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");
const FORWARDED: HeaderName = HeaderName::from_static("forwarded");

/// One upstream request in flight, for the gauge (dropped with the
/// request when the client goes away, too).
struct InFlight<'a>(&'a ServiceMetrics);

impl<'a> InFlight<'a> {
    fn new(m: &'a ServiceMetrics) -> Self {
        m.gate.in_flight(1);
        Self(m)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.gate.in_flight(-1);
    }
}

/// Polls `inner` with `service`'s runtime entered: what it spawns or
/// registers belongs to the service, not to the gate thread polling it. A
/// Redis reconnect's driver task and socket, a shared filter's refill
/// scan and the timers of both would otherwise live on that thread's
/// runtime: every Redis reply of the service would wait on it, and they
/// would end when the gate drains.
async fn on_service<F: std::future::Future>(
    service: Option<&tokio::runtime::Handle>,
    inner: F,
) -> F::Output {
    let mut inner = std::pin::pin!(inner);
    std::future::poll_fn(|cx| {
        let _entered = service.map(tokio::runtime::Handle::enter);
        inner.as_mut().poll(cx)
    })
    .await
}
