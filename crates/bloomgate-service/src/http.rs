//! The only module that knows axum: the router and its edge, the read,
//! write and operator routes, their JSON errors and input checks, the rate
//! limit's 429, request ids, the dashboard and the OpenAPI document, and
//! the server loop (on [`crate::listen`]). The rest of the crate answers in its own types
//! ([`crate::error::AppError`], [`crate::cache::Lookup`]); `http` turns
//! them into responses.

pub mod admin;
pub mod check;
pub mod dashboard;
pub mod edge;
pub mod error;
pub mod input;
pub mod json_errors;
pub mod limits;
pub mod openapi;
pub mod resources;
pub mod route_table;
pub mod router;
pub mod routes;
pub mod serve;
pub mod telemetry;

pub use router::router;

use crate::state::AppState;

/// Serves [`router`]`(state)` on `listener` until `signal` resolves, then
/// drains (see [`serve::serve`]: the header timeout and the connection
/// limit). The peer address is an extension on every request only when
/// the per-client rate limit needs it (it costs an allocation each).
///
/// # Errors
/// I/O errors from the listener.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: AppState,
    signal: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let h = &state.http;
    let max_connections = match h.max_connections {
        0 => state.default_max_connections(),
        n => n,
    };
    let limits = serve::Limits {
        header_timeout: std::time::Duration::from_millis(h.header_timeout_ms),
        max_connections: usize::try_from(max_connections).unwrap_or(usize::MAX),
        connect_info: h.rate_limit_per_sec > 0,
    };
    tracing::debug!(
        max_connections,
        header_timeout_ms = h.header_timeout_ms,
        "serving"
    );
    serve::serve(listener, router(state), limits, signal).await
}
