//! The router: every route with its layers (`edge` on all of them, the
//! body limit where a body is read, the optional rate limit on the read
//! route), merged once over the handlers of `routes`, `resource_routes`,
//! `dashboard` and `openapi`.

use std::sync::Arc;

use axum::extract::DefaultBodyLimit;
use axum::http::StatusCode;
use axum::routing::{get, post, put};
use axum::Router;

use crate::error::AppError;
use crate::routes::{
    create_sku, delete_sku, metrics, ping, sku_detail, stats, update_sku, warm, SECKILL_ROUTE,
};
use crate::state::AppState;

/// The service's routes over `state`, with the body limit, a request
/// timeout (`edge`), the optional per-client rate limit on the read
/// route, and JSON for every error.
pub fn router(state: AppState) -> Router {
    let mut read = Router::new().route(SECKILL_ROUTE, get(sku_detail));
    if let Some(limit) = crate::limits::rate_limit_layer(&state.http) {
        read = read.layer(limit);
    }
    // The routes that read a body, under the body limit (a layer that
    // costs the others an extension per request for nothing).
    let with_bodies = Router::new()
        .route("/api/cache/warm", post(warm))
        .route("/api/skus", post(create_sku))
        .route("/api/skus/{sku_id}", put(update_sku).delete(delete_sku))
        .layer(DefaultBodyLimit::max(state.http.body_limit_bytes));
    Router::new()
        .merge(read)
        .merge(with_bodies)
        .merge(crate::resource_routes::routes(&state))
        .route("/api/cache/stats", get(stats))
        .route("/metrics", get(metrics))
        .route("/dashboard", get(crate::dashboard::page))
        .route("/api/ping", get(ping))
        .route("/healthz", get(ping))
        .route("/openapi.json", get(crate::openapi::serve))
        .fallback(|| async { AppError::NotFound("no such route".into()) })
        .method_not_allowed_fallback(|| async {
            crate::error::error_response(
                StatusCode::METHOD_NOT_ALLOWED,
                "method_not_allowed",
                "method not allowed on this route",
            )
        })
        // One layer for what every request needs (id, span, counters,
        // JSON errors, timeout: see `edge`), applied once: each
        // `Router::layer` call would box and clone every route's service
        // again on every request.
        .layer(crate::edge::EdgeLayer::new(
            Arc::clone(&state.metrics),
            std::time::Duration::from_millis(state.http.request_timeout_ms),
        ))
        .with_state(Arc::new(state))
}
