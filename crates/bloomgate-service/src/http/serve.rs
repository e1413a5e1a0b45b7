//! The API's server loop: accepts connections up to a limit
//! ([`crate::listen`]), serves each with hyper's HTTP/1 under a header
//! timeout, and drains on a signal. What `axum::serve` does, plus what a
//! service in front of attackers needs:
//! a connection that sends no whole request head within
//! `http.header_timeout_ms` (counted from when the connection is ready for
//! a request, so an idle keep-alive one too) is closed, and at most
//! `http.max_connections` are open at once (by default the open-file
//! limit less what the pools need), the rest waiting in the kernel's
//! backlog instead of taking the descriptors SQL and Redis need.

use std::net::SocketAddr;
use std::time::Duration;

use axum::extract::ConnectInfo;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;

use super::router::App;
use crate::listen::{connection_permits, next_connection, until_stopped, LazyTimer};

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
        // all its requests (see `listen::lazy_timer`).
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
