//! The reverse proxy's listener: one acceptor handing each connection to
//! the least busy of a single-threaded runtime per core, each with an
//! upstream pool of its own ([`serve_per_core`]); connections up to a
//! limit (the rest wait in the kernel's backlog), each served by hyper's HTTP/1 with the
//! service's header timeout (an idle keep-alive connection too), a head
//! size and header count limit, upgrades allowed, and every byte read
//! also given to the smuggling scan ([`super::framing`]: a head hyper
//! would refuse with a bare status gets the gate's JSON answer instead), and every
//! write bounded by the idle timeout ([`WriteIdle`]: a client that stops
//! reading does not hold its upstream request for ever). Drains on a
//! signal as the service's own listener does.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::mpsc;

use super::framing::{Scanned, Scanner};
use super::Proxy;

/// A connection's place under the connection limit and among its
/// thread's open connections, carried in each of its requests'
/// extensions: an upgraded connection's tunnel holds it until the tunnel
/// ends (hyper's connection ends at the upgrade).
#[derive(Debug, Clone)]
pub struct Slot(#[allow(dead_code)] Arc<(tokio::sync::OwnedSemaphorePermit, Gone)>);

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
        // It may write (the scan's answer to a refused head).
        let r = Pin::new(&mut self.inner).poll_shutdown(cx);
        self.timed(cx, r, |()| true)
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

/// A connection handed to a worker: the socket, its peer and its place
/// under the connection limit.
type Handed = (
    std::net::TcpStream,
    std::net::SocketAddr,
    tokio::sync::OwnedSemaphorePermit,
);

/// One of the gate's threads, as the acceptor sees it.
struct Worker {
    connections: mpsc::UnboundedSender<Handed>,
    /// Its connections open now.
    open: Arc<AtomicUsize>,
}

/// Serves the proxy on `threads` threads (0: one per core), each running
/// a single-threaded runtime with its own upstream pool (a [`Proxy`] of
/// `proxy`'s making), so a request and its upstream connection are driven
/// on one thread, with no wake-up crossing to another (nginx's worker
/// model). This task accepts, under the connection limit, and hands each
/// connection to the thread with the fewest open (a long keep-alive
/// connection stays where it landed, so the threads share the load
/// evenly only if they share the connections). Once `signal` resolves it
/// stops accepting; each thread lets its connections finish their
/// requests in flight, and those still open `grace` later go with its
/// runtime.
///
/// # Errors
/// A thread or its runtime could not be started.
pub async fn serve_per_core(
    listener: tokio::net::TcpListener,
    threads: usize,
    proxy: impl Fn() -> Proxy + Clone + Send + 'static,
    limits: Limits,
    signal: impl std::future::Future<Output = ()> + Send + 'static,
    grace: Duration,
) -> std::io::Result<()> {
    let threads = match threads {
        0 => std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get),
        n => n,
    };
    // `gate8088-0`…: which listener, within the 15 bytes a thread's name
    // keeps (`top -H`, `ps -L`).
    let port = listener.local_addr()?.port();
    let mut workers = Vec::with_capacity(threads);
    let mut ends = Vec::with_capacity(threads);
    for i in 0..threads {
        let (tx, rx) = mpsc::unbounded_channel();
        let open = Arc::new(AtomicUsize::new(0));
        let (ended, end) = tokio::sync::oneshot::channel::<()>();
        let (proxy, count) = (proxy.clone(), Arc::clone(&open));
        std::thread::Builder::new()
            .name(format!("gate{port}-{i}"))
            .spawn(move || {
                match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => {
                        rt.block_on(work(rx, Arc::new(proxy()), limits, count, grace));
                        // A DNS lookup of the upstream's may still run.
                        rt.shutdown_timeout(Duration::from_millis(500));
                    }
                    Err(e) => tracing::error!(error = %e, "a gate thread's runtime did not start"),
                }
                drop(ended);
            })?;
        workers.push(Worker {
            connections: tx,
            open,
        });
        ends.push(end);
    }
    let permits = crate::listen::connection_permits(limits.max_connections);
    let mut signal = std::pin::pin!(signal);
    while let Some((stream, peer, permit)) =
        crate::listen::next_connection(&listener, &permits, &mut signal).await
    {
        let Ok(stream) = stream.into_std() else {
            continue;
        };
        let mut handed = (stream, peer, permit);
        loop {
            let Some((at, least)) = workers
                .iter()
                .enumerate()
                .min_by_key(|(_, w)| w.open.load(Ordering::Relaxed))
            else {
                return Err(std::io::Error::other("every gate thread ended"));
            };
            least.open.fetch_add(1, Ordering::Relaxed);
            match least.connections.send(handed) {
                Ok(()) => break,
                // That thread ended (its runtime failed, or it panicked):
                // the connection goes to another.
                Err(mpsc::error::SendError(back)) => {
                    handed = back;
                    tracing::error!(thread = at, "a gate thread ended; serving on the others");
                    workers.swap_remove(at);
                }
            }
        }
    }
    drop(listener);
    // Each thread drains once its channel closes.
    drop(workers);
    for end in ends {
        let _ = end.await;
    }
    Ok(())
}

/// A gate thread: serves the connections handed to it until the acceptor
/// hangs up, then lets them finish their requests in flight, for `grace`
/// at most.
async fn work(
    mut handed: mpsc::UnboundedReceiver<Handed>,
    proxy: Arc<Proxy>,
    limits: Limits,
    open: Arc<AtomicUsize>,
    grace: Duration,
) {
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .keep_alive(true)
        .max_buf_size(limits.max_header_bytes.max(8192))
        .max_headers(limits.max_headers);
    let builder = Arc::new(builder);
    let mut tasks = tokio::task::JoinSet::new();
    while let Some((stream, peer, permit)) = handed.recv().await {
        // Counted down when the connection (or its tunnel) ends, however
        // it ends.
        let slot = Slot(Arc::new((permit, Gone(Arc::clone(&open)))));
        let Ok(stream) = tokio::net::TcpStream::from_std(stream) else {
            continue;
        };
        let (builder, stop) = (Arc::clone(&builder), stop_rx.clone());
        let (scanner, verdicts) = Scanner::new(limits.max_header_bytes, limits.max_headers);
        let cut = verdicts.clone();
        let metrics = Arc::clone(&proxy.metrics);
        let proxy = Arc::clone(&proxy);
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
            crate::listen::until_stopped(conn, stop, cut.cut(), |c| c.graceful_shutdown()).await;
            // A head refused by the scan never reaches the handler: it is
            // counted here.
            if cut.was_cut() {
                let m = &metrics.gate;
                m.record(m.unrouted(), crate::metrics::proxy::Outcome::BadRequest);
            }
        });
        while tasks.try_join_next().is_some() {}
    }
    let _ = stop_tx.send(true);
    let drained = async { while tasks.join_next().await.is_some() {} };
    if tokio::time::timeout(grace, drained).await.is_err() {
        tracing::warn!(
            grace_secs = grace.as_secs(),
            "gate connections still open after the shutdown grace period; closing them"
        );
    }
}

/// Counts a connection out of its thread's open ones when dropped.
#[derive(Debug)]
pub struct Gone(Arc<AtomicUsize>);

impl Drop for Gone {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}
