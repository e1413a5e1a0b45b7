//! The reverse proxy's listener: connections up to a limit (the rest
//! wait in the kernel's backlog), each served by hyper's HTTP/1 with the
//! service's header timeout (an idle keep-alive connection too), a head
//! size and header count limit, upgrades allowed, and every byte read
//! also given to the smuggling scan ([`super::framing`]), and every
//! write bounded by the idle timeout ([`WriteIdle`]: a client that stops
//! reading does not hold its upstream request for ever). Drains on a
//! signal as the service's own listener does.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::framing::{Scanned, Scanner};
use super::Proxy;

/// A connection's place under the connection limit, carried in each of
/// its requests' extensions: an upgraded connection's tunnel holds it
/// until the tunnel ends (hyper's connection ends at the upgrade).
#[derive(Debug, Clone)]
pub struct Slot(#[allow(dead_code)] Arc<tokio::sync::OwnedSemaphorePermit>);

/// How the listener serves.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// A connection that sends no whole head within this is closed (an
    /// idle keep-alive one too).
    pub header_timeout: Duration,
    /// Most connections open at once.
    pub max_connections: usize,
    /// Longest request head, bytes (hyper answers 431 past it).
    pub max_header_bytes: usize,
    /// Most headers (hyper answers 431 past it).
    pub max_headers: usize,
    /// A write to the client that makes no progress for this long ends
    /// the connection (`gate.idle_timeout_ms`).
    pub write_idle: Duration,
}

/// A client connection whose writes give up after `idle` without
/// progress: the client stopped reading (or its network did), so the
/// connection ends, and with it the upstream request that streams to it.
/// The timer exists only while a write waits.
#[derive(Debug)]
pub struct WriteIdle<T> {
    inner: T,
    idle: Duration,
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl<T> WriteIdle<T> {
    /// `inner`, its writes bounded by `idle`.
    pub fn new(inner: T, idle: Duration) -> Self {
        Self {
            inner,
            idle,
            timer: None,
        }
    }

    /// A write's outcome: bytes written (`progress`) clear the timer; a
    /// wait starts it, and one that outlasts it fails the write. A flush
    /// that is done clears nothing: only bytes the client took are
    /// progress.
    fn timed<R>(
        &mut self,
        cx: &mut Context<'_>,
        r: Poll<std::io::Result<R>>,
        progress: fn(&R) -> bool,
    ) -> Poll<std::io::Result<R>> {
        if let Poll::Ready(done) = &r {
            if done.as_ref().is_ok_and(progress) {
                self.timer = None;
            }
            return r;
        }
        let idle = self.idle;
        let timer = self
            .timer
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(idle)));
        match timer.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("the client read nothing for {idle:?}"),
            ))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for WriteIdle<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for WriteIdle<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.timed(cx, r, |&n| n > 0)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let r = Pin::new(&mut self.inner).poll_flush(cx);
        self.timed(cx, r, |()| false)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.timed(cx, r, |&n| n > 0)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

/// Serves the proxy on `listener` until `signal`, then stops accepting
/// and lets every connection finish its request in flight.
///
/// # Errors
/// None today: accept errors are retried.
pub async fn serve(
    listener: tokio::net::TcpListener,
    proxy: Arc<Proxy>,
    limits: Limits,
    signal: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let permits = crate::http::serve::connection_permits(limits.max_connections);
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut signal = std::pin::pin!(signal);
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .keep_alive(true)
        .max_buf_size(limits.max_header_bytes.max(8192))
        .max_headers(limits.max_headers);
    let builder = Arc::new(builder);
    let mut tasks = tokio::task::JoinSet::new();
    while let Some((stream, peer, permit)) =
        crate::http::serve::next_connection(&listener, &permits, &mut signal).await
    {
        let (builder, stop) = (Arc::clone(&builder), stop_rx.clone());
        let (scanner, verdicts) = Scanner::new(limits.max_header_bytes, limits.max_headers);
        let proxy = Arc::clone(&proxy);
        let slot = Slot(Arc::new(permit));
        let service = hyper::service::service_fn(move |mut req: hyper::Request<_>| {
            req.extensions_mut().insert(slot.clone());
            // Popped as hyper dispatches the request: its head's verdict.
            let framing = verdicts.next();
            let proxy = Arc::clone(&proxy);
            async move { Ok::<_, Infallible>(proxy.handle(req, peer, framing).await) }
        });
        tasks.spawn(async move {
            let io = TokioIo::new(WriteIdle::new(
                Scanned::new(stream, scanner),
                limits.write_idle,
            ));
            let conn = builder.serve_connection(io, service).with_upgrades();
            crate::http::serve::until_stopped(conn, stop, |c| c.graceful_shutdown()).await;
        });
        while tasks.try_join_next().is_some() {}
    }
    drop(listener);
    let _ = stop_tx.send(true);
    while tasks.join_next().await.is_some() {}
    Ok(())
}
