//! The reverse proxy's listener: connections up to a limit (the rest
//! wait in the kernel's backlog), each served by hyper's HTTP/1 with the
//! service's header timeout (an idle keep-alive connection too), a head
//! size and header count limit, upgrades allowed, and every byte read
//! also given to the smuggling scan ([`super::framing`]). Drains on a
//! signal as the service's own listener does.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::{TokioIo, TokioTimer};

use super::framing::{Scanned, Scanner};
use super::Proxy;

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
        let service = hyper::service::service_fn(move |req| {
            // Popped as hyper dispatches the request: its head's verdict.
            let framing = verdicts.next();
            let proxy = Arc::clone(&proxy);
            async move { Ok::<_, Infallible>(proxy.handle(req, peer, framing).await) }
        });
        tasks.spawn(async move {
            let io = TokioIo::new(Scanned::new(stream, scanner));
            let conn = builder.serve_connection(io, service).with_upgrades();
            crate::http::serve::until_stopped(conn, stop, |c| c.graceful_shutdown()).await;
            drop(permit);
        });
        while tasks.try_join_next().is_some() {}
    }
    drop(listener);
    let _ = stop_tx.send(true);
    while tasks.join_next().await.is_some() {}
    Ok(())
}
