//! A connection's end on shutdown: once the listener stops, or its scan
//! cut what follows, the connection is asked to close after its request
//! in flight, and awaited.

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
