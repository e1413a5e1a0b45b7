//! The server loop: accepts connections up to a limit, serves each with
//! hyper's HTTP/1 under a header timeout, and drains on a signal. What
//! `axum::serve` does, plus what a service in front of attackers needs:
//! a connection that sends no whole request head within
//! `http.header_timeout_ms` (counted from when the connection is ready for
//! a request, so an idle keep-alive one too) is closed, and at most
//! `http.max_connections` are open at once (by default the open-file
//! limit less what the pools need), the rest waiting in the kernel's
//! backlog instead of taking the descriptors SQL and Redis need. An
//! accept that fails (`EMFILE`, a connection reset before it was taken)
//! is retried after a pause, never the end of the loop.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::ConnectInfo;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;

use super::lazy_timer::LazyTimer;
use super::router::App;

/// Descriptors kept for everything but client connections, beside the
/// SQL pool and the scan readers: Redis, files, the listener, logs.
const RESERVED_FDS: u64 = 64;

/// The connection limit when none is configured: the soft open-file limit
/// less `others` (the pools) and [`RESERVED_FDS`]; at least 16.
#[must_use]
pub fn default_max_connections(others: u64) -> u64 {
    let soft = rlimit::getrlimit(rlimit::Resource::NOFILE).map_or(1024, |(soft, _)| soft);
    soft.saturating_sub(others + RESERVED_FDS).max(16)
}

/// How the loop serves.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// See `http.header_timeout_ms`.
    pub header_timeout: Duration,
    /// See `http.max_connections` (already derived when 0).
    pub max_connections: usize,
    /// Whether each request carries the peer's address (`ConnectInfo`):
    /// the per-client rate limit needs it.
    pub connect_info: bool,
}

/// Serves `app` on `listener` until `signal`, then stops accepting and
/// asks every connection to close after its request in flight; returns
/// once they have (the caller bounds that wait).
///
/// # Errors
/// None today: accept errors are retried.
pub async fn serve(
    listener: tokio::net::TcpListener,
    app: App,
    limits: Limits,
    signal: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let permits = connection_permits(limits.max_connections);
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut signal = std::pin::pin!(signal);
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .header_read_timeout(limits.header_timeout)
        .keep_alive(true);
    let mut tasks = tokio::task::JoinSet::new();
    while let Some((stream, peer, permit)) = next_connection(&listener, &permits, &mut signal).await
    {
        let service = per_connection(&app, peer, limits.connect_info);
        // Each connection its own timer, which keeps one armed sleep for
        // all its requests (see `lazy_timer`).
        let mut builder = builder.clone();
        builder.timer(LazyTimer::default());
        let stop = stop_rx.clone();
        tasks.spawn(async move {
            let conn = builder
                .serve_connection(TokioIo::new(stream), service)
                .with_upgrades();
            until_stopped(conn, stop, std::future::pending(), |c| {
                c.graceful_shutdown()
            })
            .await;
            drop(permit);
        });
        // Finished connections' tasks, reaped as we go.
        while tasks.try_join_next().is_some() {}
    }
    drop(listener);
    let _ = stop_tx.send(true);
    while tasks.join_next().await.is_some() {}
    Ok(())
}

/// Drives one connection to its end; once `stop` turns true, or `cut`
/// resolves (the gate's scan refused what follows: see
/// `proxy::framing`), asks it to close after its request in flight
/// (`shutdown`: hyper's `graceful_shutdown`) and waits for that. The HTTP
/// listener's and the gate's.
pub async fn until_stopped<C: std::future::Future>(
    conn: C,
    mut stop: tokio::sync::watch::Receiver<bool>,
    cut: impl std::future::Future<Output = ()>,
    shutdown: impl Fn(std::pin::Pin<&mut C>),
) {
    let mut conn = std::pin::pin!(conn);
    let mut cut = std::pin::pin!(cut);
    loop {
        tokio::select! {
            _ = conn.as_mut() => return,
            () = &mut cut => {
                shutdown(conn.as_mut());
                let _ = conn.as_mut().await;
                return;
            }
            changed = stop.changed() => {
                if changed.is_err() || *stop.borrow() {
                    shutdown(conn.as_mut());
                    let _ = conn.as_mut().await;
                    return;
                }
            }
        }
    }
}

/// The permits of a listener's connection limit (at least one).
#[must_use]
pub fn connection_permits(max_connections: usize) -> Arc<tokio::sync::Semaphore> {
    Arc::new(tokio::sync::Semaphore::new(
        max_connections.clamp(1, tokio::sync::Semaphore::MAX_PERMITS),
    ))
}

/// The next connection within the limit: a permit first (the rest wait
/// in the kernel's backlog), then an accepted socket with `TCP_NODELAY`
/// (accept errors retried: [`accept_failed`]); `None` once `signal`
/// resolves. The HTTP and the Redis-protocol listeners' one accept loop.
pub async fn next_connection<F: std::future::Future<Output = ()>>(
    listener: &tokio::net::TcpListener,
    permits: &Arc<tokio::sync::Semaphore>,
    signal: &mut std::pin::Pin<&mut F>,
) -> Option<(
    tokio::net::TcpStream,
    SocketAddr,
    tokio::sync::OwnedSemaphorePermit,
)> {
    let permit = tokio::select! {
        () = signal.as_mut() => return None,
        p = Arc::clone(permits).acquire_owned() => p.ok()?,
    };
    loop {
        tokio::select! {
            () = signal.as_mut() => return None,
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    let _ = stream.set_nodelay(true);
                    return Some((stream, peer, permit));
                }
                Err(e) => accept_failed(&e).await,
            },
        }
    }
}

/// The hyper service of one connection: the app (cloned per request, as
/// `axum::serve` does), with the peer's address on every request when
/// the rate limit needs it.
fn per_connection(
    app: &App,
    peer: SocketAddr,
    connect_info: bool,
) -> TowerToHyperService<
    tower::util::MapRequest<
        App,
        impl Fn(hyper::Request<Incoming>) -> axum::extract::Request + Clone + Send + 'static,
    >,
> {
    TowerToHyperService::new(tower::util::MapRequest::new(
        app.clone(),
        move |req: hyper::Request<Incoming>| {
            let mut req = req.map(axum::body::Body::new);
            if connect_info {
                req.extensions_mut().insert(ConnectInfo(peer));
            }
            req
        },
    ))
}

/// Connection errors (the peer gone before its connection was taken)
/// are retried at once; others (`EMFILE`, `ENFILE`, `ENOMEM`) after a
/// pause, so the loop neither spins nor stops.
async fn accept_failed(e: &std::io::Error) {
    use std::io::ErrorKind::{ConnectionAborted, ConnectionRefused, ConnectionReset};
    if matches!(
        e.kind(),
        ConnectionAborted | ConnectionRefused | ConnectionReset
    ) {
        return;
    }
    tracing::warn!(error = %e, "accepting a connection failed; retrying in 100 ms");
    tokio::time::sleep(Duration::from_millis(100)).await;
}
