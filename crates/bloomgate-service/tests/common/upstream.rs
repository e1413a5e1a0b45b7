//! A protected service of the test's own, for the HTTP gate: a real
//! HTTP/1.1 server on port 0 that counts what reaches it and answers
//! with what each test needs (an echo of the request, streamed bodies,
//! a stall, an upgrade echo, fixed statuses).
#![allow(dead_code)]

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Body, Frame, Incoming};
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;

/// What the upstream saw.
#[derive(Debug, Default)]
pub struct Seen {
    /// Requests by path (as received, query excluded).
    pub paths: Mutex<HashMap<String, u64>>,
    /// Every request.
    pub total: AtomicU64,
    /// Requests whose handler was dropped before it answered (the gate
    /// cancelled them).
    pub cancelled: AtomicU64,
    /// Body bytes received by `/upload`.
    pub uploaded: AtomicU64,
    /// Paths answered 404, as an API answers a key it does not have.
    pub missing: Mutex<std::collections::HashSet<String>>,
    /// Paths whose answer waits for a permit: the answer is decided when
    /// the request arrives (what the API read), sent when released.
    pub held: Mutex<HashMap<String, Arc<tokio::sync::Semaphore>>>,
}

impl Seen {
    /// Requests that reached `path`.
    pub fn at(&self, path: &str) -> u64 {
        self.paths.lock().unwrap().get(path).copied().unwrap_or(0)
    }

    pub fn total(&self) -> u64 {
        self.total.load(Ordering::SeqCst)
    }

    /// Answers `path` 404 from now on (`true`) or the echo (`false`).
    pub fn set_missing(&self, path: &str, missing: bool) {
        let mut m = self.missing.lock().unwrap();
        if missing {
            m.insert(path.to_owned());
        } else {
            m.remove(path);
        }
    }

    /// Holds the answers to `path` until [`Seen::release`].
    pub fn hold(&self, path: &str) {
        let gate = Arc::new(tokio::sync::Semaphore::new(0));
        self.held.lock().unwrap().insert(path.to_owned(), gate);
    }

    /// Sends the held answers to `path`, and holds no more.
    pub fn release(&self, path: &str) {
        if let Some(gate) = self.held.lock().unwrap().remove(path) {
            gate.close();
        }
    }
}

/// The running upstream.
pub struct Upstream {
    pub addr: SocketAddr,
    pub seen: Arc<Seen>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Upstream {
    pub async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Seen::default());
        let s = Arc::clone(&seen);
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let s = Arc::clone(&s);
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |req| {
                        let s = Arc::clone(&s);
                        async move { Ok::<_, Infallible>(answer(req, s).await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .with_upgrades()
                        .await;
                });
            }
        });
        Self { addr, seen, task }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

type Out = http_body_util::combinators::BoxBody<Bytes, std::io::Error>;

fn full(b: impl Into<Bytes>) -> Out {
    Full::new(b.into()).map_err(|e| match e {}).boxed()
}

/// Counts a cancelled handler when dropped unanswered.
struct Watch(Arc<Seen>, bool);

impl Drop for Watch {
    fn drop(&mut self) {
        if !self.1 {
            self.0.cancelled.fetch_add(1, Ordering::SeqCst);
        }
    }
}

/// `n` bytes of zeros in 64 KiB frames, from one static buffer.
struct Zeros(u64);

static ZEROS: [u8; 65536] = [0; 65536];

impl Body for Zeros {
    type Data = Bytes;
    type Error = std::io::Error;
    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        if self.0 == 0 {
            return Poll::Ready(None);
        }
        let n = self.0.min(ZEROS.len() as u64);
        self.0 -= n;
        Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(
            &ZEROS[..n as usize],
        )))))
    }
}

async fn answer(mut req: Request<Incoming>, s: Arc<Seen>) -> Response<Out> {
    s.total.fetch_add(1, Ordering::SeqCst);
    let path = req.uri().path().to_owned();
    *s.paths.lock().unwrap().entry(path.clone()).or_default() += 1;
    let segs: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let resp = |status: u16, body: Out| {
        let mut r = Response::new(body);
        *r.status_mut() = hyper::StatusCode::from_u16(status).unwrap();
        r
    };
    let missing = s.missing.lock().unwrap().contains(&path);
    let held = s.held.lock().unwrap().get(&path).cloned();
    if let Some(held) = held {
        // Closed by `release`.
        let _ = held.acquire().await;
    }
    if missing {
        return resp(404, full(r#"{"upstream":"no such profile"}"#));
    }
    match segs.as_slice() {
        ["stall"] => {
            let mut w = Watch(Arc::clone(&s), false);
            tokio::time::sleep(Duration::from_secs(3600)).await;
            w.1 = true;
            resp(200, full(""))
        }
        ["download", n] => {
            let n: u64 = n.parse().unwrap();
            resp(200, Zeros(n).boxed())
        }
        ["download-cl", n] => {
            let n: u64 = n.parse().unwrap();
            let mut r = resp(200, Zeros(n).boxed());
            r.headers_mut().insert("content-length", n.into());
            r
        }
        ["slow-body"] => {
            // One frame, then nothing: the gate's idle timeout cuts it.
            let stream =
                futures_util::stream::iter([Ok(Frame::data(Bytes::from_static(b"first")))])
                    .chain(futures_util::stream::pending());
            resp(200, BodyExt::boxed(StreamBody::new(stream)))
        }
        ["upload"] => {
            let mut body = req.into_body();
            let mut n = 0u64;
            while let Some(frame) = body.frame().await {
                let Ok(frame) = frame else { break };
                if let Some(d) = frame.data_ref() {
                    n += d.len() as u64;
                }
            }
            s.uploaded.store(n, Ordering::SeqCst);
            resp(200, full(n.to_string()))
        }
        ["status", code] => {
            let code: u16 = code.parse().unwrap();
            let mut r = resp(code, full(""));
            r.headers_mut().insert("etag", "\"v1\"".parse().unwrap());
            r
        }
        ["exact"] => {
            let mut r = resp(201, full("exact body"));
            let h = r.headers_mut();
            h.append("x-multi", "a".parse().unwrap());
            h.append("x-multi", "b".parse().unwrap());
            h.insert(
                "content-type",
                "text/x-odd; charset=latin1".parse().unwrap(),
            );
            h.insert("date", "Thu, 01 Jan 2026 00:00:00 GMT".parse().unwrap());
            h.insert("connection", "x-hop".parse().unwrap());
            h.insert("x-hop", "dropped".parse().unwrap());
            h.insert("keep-alive", "timeout=5".parse().unwrap());
            r
        }
        ["ws"] => {
            let on = hyper::upgrade::on(&mut req);
            tokio::spawn(async move {
                if let Ok(up) = on.await {
                    let mut io = TokioIo::new(up);
                    let (mut r, mut w) = tokio::io::split(&mut io);
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                }
            });
            let mut r = resp(101, full(""));
            r.headers_mut().insert("upgrade", "echo".parse().unwrap());
            r.headers_mut()
                .insert("connection", "upgrade".parse().unwrap());
            r
        }
        _ => {
            // The echo: method, target and headers as JSON.
            let mut headers = serde_json::Map::new();
            for (k, v) in req.headers() {
                let e = headers
                    .entry(k.as_str().to_owned())
                    .or_insert_with(|| serde_json::json!([]));
                e.as_array_mut()
                    .unwrap()
                    .push(serde_json::json!(v.to_str().unwrap_or("?")));
            }
            let body = serde_json::json!({
                "method": req.method().as_str(),
                "target": req.uri().to_string(),
                "headers": headers,
            });
            let mut r = resp(200, full(body.to_string()));
            r.headers_mut()
                .insert("content-type", "application/json".parse().unwrap());
            r
        }
    }
}

use futures_util::StreamExt as _;

/// A raw HTTP/1.1 exchange: writes `request` on a new connection to
/// `addr` and reads until the peer closes or `within` passes; returns
/// what came back.
pub async fn raw(addr: SocketAddr, request: &[u8], within: Duration) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
    c.write_all(request).await.unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(within, c.read_to_end(&mut out)).await;
    String::from_utf8_lossy(&out).into_owned()
}

/// The status of the first response in `raw`.
pub fn status_of(raw: &str) -> u16 {
    raw.split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {raw:?}"))
}

/// Resident memory of this process, bytes.
pub fn rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .unwrap()
        * 1024
}
