//! The accept loop's step, shared by every listener: a permit of the
//! connection limit first (the rest wait in the kernel's backlog instead
//! of taking the descriptors SQL and Redis need), then an accepted socket.
//! An accept that fails (`EMFILE`, a connection reset before it was taken)
//! is retried after a pause, never the end of the loop.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

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
/// resolves. Every listener's one accept loop.
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
