//! The only module that knows axum: the router and its edge, the read,
//! write and operator routes, their JSON errors and input checks, the rate
//! limit, request ids, the dashboard and the OpenAPI document, and the
//! server loop. The rest of the crate answers in its own types
//! ([`crate::error::AppError`], [`crate::cache::Lookup`]); `http` turns
//! them into responses.

pub mod admin;
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
pub mod telemetry;

pub use router::router;

use crate::state::AppState;

/// Serves [`router`]`(state)` on `listener` until `signal` resolves, then
/// drains (axum's graceful shutdown). The peer address is an extension on
/// every request only when the per-client rate limit needs it (it costs
/// an allocation each).
///
/// # Errors
/// I/O errors from the listener.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: AppState,
    signal: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let per_client = state.http.rate_limit_per_sec > 0;
    let app = router(state);
    if per_client {
        let app = axum::ServiceExt::<axum::extract::Request>::into_make_service_with_connect_info::<
            std::net::SocketAddr,
        >(app);
        axum::serve(listener, app)
            .with_graceful_shutdown(signal)
            .await
    } else {
        axum::serve(
            listener,
            axum::ServiceExt::<axum::extract::Request>::into_make_service(app),
        )
        .with_graceful_shutdown(signal)
        .await
    }
}
