//! Forwarding to the upstream: one keep-alive pool (hyper's), bodies
//! streamed both ways frame by frame under an idle timeout (never a total
//! one), hop-by-hop headers removed and `X-Forwarded-*` appended, the
//! response headers bounded by `gate.timeout_ms`, and upgrades
//! (WebSocket) spliced once both sides have switched.

use std::future::Future as _;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{Either, Full};
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::header::{self, HeaderMap, HeaderName, HeaderValue};
use hyper::{Request, Response, StatusCode};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};

use crate::config::proxy::ProxyConfig;

/// A body's error: the upstream's or the client's, or an idle timeout.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// What the gate answers with: its own bytes, or the upstream's stream.
pub type ProxyBody = Either<Full<Bytes>, Idle<Incoming>>;

/// The upstream and the pool of connections to it.
#[derive(Debug)]
pub struct Upstream {
    client: Client<HttpConnector, Idle<Incoming>>,
    /// `host:port`, every forwarded target's authority.
    authority: hyper::http::uri::Authority,
    timeout: Duration,
    idle: Duration,
}

/// Why a forward failed before the upstream's response headers.
#[derive(Debug)]
pub enum Failure {
    /// No connection, or the connection failed (502).
    Unreachable(String),
    /// No response headers within `gate.timeout_ms` (504).
    Timeout,
}

impl Upstream {
    /// The pool for `config.upstream` (validated: `http://host:port`).
    #[must_use]
    pub fn new(config: &ProxyConfig) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(Duration::from_millis(config.connect_timeout_ms)));
        connector.enforce_http(true);
        let client = Client::builder(TokioExecutor::new())
            .timer(TokioTimer::new())
            .pool_timer(TokioTimer::new())
            .pool_max_idle_per_host(config.pool_max_idle)
            .pool_idle_timeout(Duration::from_secs(config.pool_idle_secs))
            .build(connector);
        let authority = crate::config::proxy::upstream_authority(&config.upstream)
            .ok()
            .and_then(|a| a.parse().ok())
            .unwrap_or_else(|| hyper::http::uri::Authority::from_static("127.0.0.1:80"));
        Self {
            client,
            authority,
            timeout: Duration::from_millis(config.timeout_ms),
            idle: Duration::from_millis(config.idle_timeout_ms),
        }
    }

    /// The idle timeout of bodies.
    #[must_use]
    pub fn idle(&self) -> Duration {
        self.idle
    }

    /// Sends `req` (its target already origin-form, its headers already
    /// cleaned) and waits for the response's headers.
    ///
    /// # Errors
    /// [`Failure`].
    pub async fn send(
        &self,
        mut req: Request<Idle<Incoming>>,
    ) -> Result<Response<Incoming>, Failure> {
        let mut parts = hyper::http::uri::Parts::default();
        parts.scheme = Some(hyper::http::uri::Scheme::HTTP);
        parts.authority = Some(self.authority.clone());
        parts.path_and_query = Some(
            req.uri()
                .path_and_query()
                .cloned()
                .unwrap_or_else(|| hyper::http::uri::PathAndQuery::from_static("/")),
        );
        *req.uri_mut() = hyper::Uri::from_parts(parts)
            .map_err(|e| Failure::Unreachable(format!("target: {e}")))?;
        // The response-header timeout counts from the end of the request
        // body: an upload may take as long as it keeps moving (its idle
        // timeout bounds it), and an upstream answers after reading it.
        let sent = req.body_mut().on_end();
        let answer = self.client.request(req);
        let mut answer = std::pin::pin!(answer);
        if let Some(sent) = sent {
            tokio::select! {
                r = answer.as_mut() => return r.map_err(|e| Failure::Unreachable(error_chain(&e))),
                _ = sent => {}
            }
        }
        match tokio::time::timeout(self.timeout, answer).await {
            Ok(Ok(resp)) => Ok(resp),
            Ok(Err(e)) => Err(Failure::Unreachable(error_chain(&e))),
            Err(_) => Err(Failure::Timeout),
        }
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut source = e.source();
    while let Some(inner) = source {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        source = inner.source();
    }
    s
}

/// The headers that belong to one connection (RFC 9110 §7.6.1), never
/// forwarded, beside those the `Connection` header names.
const HOP_BY_HOP: [HeaderName; 6] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];

/// End-to-end headers a `Connection` token never removes.
const PROTECTED: [HeaderName; 6] = [
    header::HOST,
    header::CONTENT_LENGTH,
    header::AUTHORIZATION,
    header::COOKIE,
    header::CONTENT_TYPE,
    HeaderName::from_static("forwarded"),
];

/// Whether a request asks to switch protocols (`Connection: upgrade`
/// with an `Upgrade` header).
#[must_use]
pub fn wants_upgrade(headers: &HeaderMap) -> bool {
    headers.contains_key(header::UPGRADE) && connection_names(headers, "upgrade")
}

/// Whether the protocol a request asks to switch to is WebSocket, and only
/// it: the one upgrade the gate tunnels. Any other (`h2c`, a protocol of
/// the client's naming) would carry requests the gate never judges; such
/// a request goes on without its `Upgrade`, as a plain one.
#[must_use]
pub fn tunnels(headers: &HeaderMap) -> bool {
    let mut tokens = headers
        .get_all(header::UPGRADE)
        .iter()
        .flat_map(|v| v.as_bytes().split(|&b| b == b','))
        .map(<[u8]>::trim_ascii)
        .peekable();
    tokens.peek().is_some() && tokens.all(|t| t.eq_ignore_ascii_case(b"websocket"))
}

fn connection_names(headers: &HeaderMap, token: &str) -> bool {
    headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case(token))
}

/// Removes the hop-by-hop headers; with `upgrade`, keeps `Upgrade` and
/// says `Connection: upgrade` again.
pub fn strip_hop_by_hop(headers: &mut HeaderMap, upgrade: bool) {
    if !headers.contains_key(header::CONNECTION) && !has_hop_by_hop(headers) {
        // The usual case (HTTP/1.1 keep-alive says nothing): one pass over
        // the names, nothing removed, nothing allocated.
        return;
    }
    // A name in `Connection` is removed unless it is one a sender may not
    // take away: a client's `Connection: host` must not drop `Host`, nor
    // `Connection: x-forwarded-for` a trusted proxy's list.
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|t| HeaderName::from_bytes(t.trim().as_bytes()).ok())
        .filter(|n| !PROTECTED.contains(n) && !n.as_str().starts_with("x-forwarded-"))
        .collect();
    let kept_upgrade = if upgrade {
        headers.get(header::UPGRADE).cloned()
    } else {
        None
    };
    for name in named.iter().chain(HOP_BY_HOP.iter()) {
        headers.remove(name);
    }
    let proxy: Vec<HeaderName> = headers
        .keys()
        .filter(|k| k.as_str().starts_with("proxy-"))
        .cloned()
        .collect();
    for name in proxy {
        headers.remove(name);
    }
    if let Some(u) = kept_upgrade {
        headers.insert(header::UPGRADE, u);
        headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    }
}

/// Whether any header is hop-by-hop by its name alone.
fn has_hop_by_hop(headers: &HeaderMap) -> bool {
    headers
        .keys()
        .any(|k| HOP_BY_HOP.contains(k) || k.as_str().starts_with("proxy-"))
}

/// This hop's `Forwarded` element (RFC 7239): the peer, `http`, and the
/// `Host` when it can be quoted.
#[must_use]
pub fn forwarded_element(peer: std::net::IpAddr, host: Option<&str>) -> String {
    let mut e = match peer {
        std::net::IpAddr::V4(v4) => format!("for={v4}"),
        std::net::IpAddr::V6(v6) => format!("for=\"[{v6}]\""),
    };
    e.push_str(";proto=http");
    if let Some(h) = host.filter(|h| !h.contains(['"', '\\'])) {
        e.push_str(&format!(";host=\"{h}\""));
    }
    e
}

/// Appends `value` to the list in `name` (one header line, comma-joined).
pub fn append_list(headers: &mut HeaderMap, name: HeaderName, value: &str) {
    if !headers.contains_key(&name) {
        // The usual case: the first proxy. No joining.
        if let Ok(v) = HeaderValue::from_str(value) {
            headers.insert(name, v);
        }
        return;
    }
    let mut joined = String::new();
    for v in headers.get_all(&name) {
        if let Ok(v) = v.to_str() {
            if !joined.is_empty() {
                joined.push_str(", ");
            }
            joined.push_str(v);
        }
    }
    if !joined.is_empty() {
        joined.push_str(", ");
    }
    joined.push_str(value);
    if let Ok(v) = HeaderValue::from_str(&joined) {
        headers.insert(name, v);
    }
}

/// Splices the client's and the upstream's upgraded connections, once
/// both have switched, until either side closes.
/// `slot`: the client connection's place under the connection limit,
/// held until the tunnel ends.
pub fn splice(
    client: hyper::upgrade::OnUpgrade,
    upstream: hyper::upgrade::OnUpgrade,
    slot: Option<super::serve::Slot>,
) {
    tokio::spawn(async move {
        let _slot = slot;
        let (Ok(c), Ok(u)) = tokio::join!(client, upstream) else {
            return;
        };
        let (mut c, mut u) = (TokioIo::new(c), TokioIo::new(u));
        let _ = tokio::io::copy_bidirectional(&mut c, &mut u).await;
    });
}

/// A body that fails once no frame has moved for its idle timeout. The
/// timer exists only while the body waits, and is moved on only when it
/// fires early, so a body that keeps flowing costs no timer at all.
#[derive(Debug)]
pub struct Idle<B> {
    inner: B,
    idle: Duration,
    last: quanta::Instant,
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
    /// Told when the body has ended (or failed): see [`Idle::on_end`].
    ended: Option<tokio::sync::oneshot::Sender<()>>,
}

impl<B> Idle<B> {
    /// Wraps `inner`.
    pub fn new(inner: B, idle: Duration) -> Self {
        Self {
            inner,
            idle,
            last: quanta::Instant::now(),
            timer: None,
            ended: None,
        }
    }

    /// A future that resolves once the body has ended, been cut, or been
    /// dropped; `None` for a body that is already over (a GET's), which
    /// costs no channel.
    pub fn on_end(&mut self) -> Option<tokio::sync::oneshot::Receiver<()>>
    where
        B: Body,
    {
        if self.inner.is_end_stream() {
            return None;
        }
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.ended = Some(tx);
        Some(rx)
    }
}

/// A body that moved nothing for the idle timeout.
#[derive(Debug, thiserror::Error)]
#[error("no byte moved for {0:?}")]
pub struct IdleTimeout(Duration);

impl<B> Body for Idle<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(frame) => {
                this.last = quanta::Instant::now();
                this.timer = None;
                if !matches!(frame, Some(Ok(_))) || this.inner.is_end_stream() {
                    if let Some(ended) = this.ended.take() {
                        let _ = ended.send(());
                    }
                }
                Poll::Ready(frame.map(|f| f.map_err(Into::into)))
            }
            Poll::Pending => loop {
                if this.timer.is_none() {
                    // Counted from the first wait, not from the last frame:
                    // the time the reader took before asking again (a
                    // client slow to read) is not the upstream's.
                    this.last = quanta::Instant::now();
                }
                let idle = this.idle;
                let deadline = this.last + idle;
                let timer = this.timer.get_or_insert_with(|| {
                    Box::pin(tokio::time::sleep(
                        deadline.saturating_duration_since(quanta::Instant::now()),
                    ))
                });
                if timer.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                let now = quanta::Instant::now();
                if now.saturating_duration_since(this.last) >= idle {
                    this.ended = None;
                    return Poll::Ready(Some(Err(Box::new(IdleTimeout(idle)))));
                }
                timer
                    .as_mut()
                    .reset(tokio::time::Instant::now() + deadline.saturating_duration_since(now));
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// One of the gate's own answers: `status` with a JSON error body.
#[must_use]
pub fn own_answer(status: StatusCode, error: &str, message: &str) -> Response<ProxyBody> {
    let body = serde_json::json!({ "error": error, "message": message }).to_string();
    fixed(
        status,
        HeaderValue::from_static("application/json"),
        Bytes::from(body),
    )
}

/// A response of the gate's own with `body`.
#[must_use]
pub fn fixed(status: StatusCode, content_type: HeaderValue, body: Bytes) -> Response<ProxyBody> {
    let mut resp = Response::new(Either::Left(Full::new(body)));
    *resp.status_mut() = status;
    resp.headers_mut()
        .insert(header::CONTENT_TYPE, content_type);
    resp
}

/// A client-side response body, for the forwarded response.
#[must_use]
pub fn streamed(resp: Response<Incoming>, idle: Duration) -> Response<ProxyBody> {
    resp.map(|b| Either::Right(Idle::new(b, idle)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hop_by_hop_headers_and_those_connection_names_are_removed() {
        let mut h = HeaderMap::new();
        for (k, v) in [
            (
                "connection",
                "keep-alive, x-secret, host, x-forwarded-for, content-length",
            ),
            ("x-forwarded-for", "10.0.0.1"),
            ("keep-alive", "timeout=5"),
            ("te", "trailers"),
            ("trailer", "x"),
            ("transfer-encoding", "chunked"),
            ("upgrade", "websocket"),
            ("proxy-authorization", "Basic x"),
            ("proxy-connection", "keep-alive"),
            ("x-secret", "1"),
            ("x-kept", "2"),
            ("host", "example.com"),
        ] {
            h.append(k, HeaderValue::from_static(v));
        }
        let mut plain = h.clone();
        strip_hop_by_hop(&mut plain, false);
        let mut names: Vec<&str> = plain.keys().map(HeaderName::as_str).collect();
        names.sort_unstable();
        assert_eq!(names, ["host", "x-forwarded-for", "x-kept"]);
        let mut up = h.clone();
        strip_hop_by_hop(&mut up, true);
        assert_eq!(up["upgrade"], "websocket");
        assert_eq!(up["connection"], "upgrade");
        assert!(!up.contains_key("x-secret"));
    }

    #[test]
    fn forwarded_lists_are_appended() {
        let mut h = HeaderMap::new();
        append_list(
            &mut h,
            HeaderName::from_static("x-forwarded-for"),
            "10.0.0.1",
        );
        assert_eq!(h["x-forwarded-for"], "10.0.0.1");
        h.append("x-forwarded-for", HeaderValue::from_static("10.0.0.2"));
        append_list(
            &mut h,
            HeaderName::from_static("x-forwarded-for"),
            "127.0.0.1",
        );
        assert_eq!(h["x-forwarded-for"], "10.0.0.1, 10.0.0.2, 127.0.0.1");
        assert_eq!(h.get_all("x-forwarded-for").iter().count(), 1);
    }

    #[test]
    fn the_forwarded_element_quotes_what_rfc_7239_quotes() {
        let v4 = std::net::IpAddr::from([10, 0, 0, 1]);
        assert_eq!(
            forwarded_element(v4, Some("api.example:8080")),
            "for=10.0.0.1;proto=http;host=\"api.example:8080\""
        );
        let v6 = std::net::IpAddr::from(std::net::Ipv6Addr::LOCALHOST);
        assert_eq!(forwarded_element(v6, None), "for=\"[::1]\";proto=http");
        assert_eq!(
            forwarded_element(v4, Some("a\"b")),
            "for=10.0.0.1;proto=http",
            "a host that cannot be quoted is left out"
        );
    }

    #[test]
    fn upgrades_are_recognised() {
        let mut h = HeaderMap::new();
        h.insert("upgrade", HeaderValue::from_static("websocket"));
        assert!(!wants_upgrade(&h));
        h.insert(
            "connection",
            HeaderValue::from_static("keep-alive, Upgrade"),
        );
        assert!(wants_upgrade(&h));
        assert!(tunnels(&h), "websocket is tunnelled");
        for other in ["h2c", "websocket, h2c", "WebSocket/13x", ""] {
            h.insert("upgrade", HeaderValue::from_static(other));
            assert!(wants_upgrade(&h) && !tunnels(&h), "{other:?}");
        }
        h.insert("upgrade", HeaderValue::from_static("WebSocket"));
        h.append("upgrade", HeaderValue::from_static("h2c"));
        assert!(!tunnels(&h), "a second Upgrade header counts too");
        h.remove("upgrade");
        assert!(!tunnels(&h));
    }
}
