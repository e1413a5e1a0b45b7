//! The router: every route with its layers (the body limit where a body
//! is read; the optional rate limit on every read, checked by `edge`),
//! merged once over the handlers of `routes`, `resources`, `dashboard`
//! and `openapi`, and wrapped as a whole in `edge`.

use std::sync::Arc;

use axum::extract::DefaultBodyLimit;
use axum::http::StatusCode;
use axum::routing::{any, get, post, put};
use axum::Router;

use crate::error::AppError;
use crate::http::route_table::Routes;
use crate::http::routes::{
    create_sku, delete_sku, metrics, ping, sku_by_id, sku_detail, stats, update_sku, warm,
    SECKILL_ROUTE,
};
use crate::state::AppState;

/// The service: every route, wrapped once in the edge layer.
pub type App = crate::http::edge::Edge<Router>;

/// The service's routes over `state`, with the body limit, a request
/// timeout (`edge`), the optional per-client rate limit on every read
/// (checked by `edge`, and by the batch calls per key), and JSON for
/// every error.
pub fn router(state: AppState) -> App {
    let read = Routes::new()
        .route(SECKILL_ROUTE, get(sku_detail))
        .route(crate::paths::SKU_ROUTE, get(sku_by_id));
    // One limiter for every read: the edge checks the reads (before their
    // fast answers), the batch calls their keys.
    let rate = crate::listen::rate::rate_limit(&state.http);
    // The routes that read a body, under the body limit (a layer that
    // costs the others an extension per request for nothing).
    let limit = DefaultBodyLimit::max(state.http.body_limit_bytes);
    let with_bodies = Routes::new()
        .route("/api/cache/warm", post(warm))
        // The default resource's warm, as every resource has one (a GET
        // reads "warm" as an id: a 400, as for `/api/skus/abc`).
        .route(
            "/api/skus/warm",
            get(|s| sku_detail(s, axum::extract::Path("warm".to_owned())))
                .post(crate::http::routes::sku_warm),
        )
        .route("/api/skus", post(create_sku))
        .route(crate::paths::SKU_ROUTE, put(update_sku).delete(delete_sku))
        .layer(limit);
    // The demo SKU table's routes only where it is served (`demo`).
    let demo = state.demo;
    let mut routes = Routes::new();
    if demo {
        routes = routes
            .merge(read)
            .merge(with_bodies)
            .merge(crate::http::resources::sku_routes(&state, rate.as_ref()));
    }
    // The HTTP gate's auth-request check, where a `[gate]` is configured.
    if state.gate.is_set() {
        routes = routes
            .route(
                crate::proxy::check::CHECK_PATH,
                any(crate::http::check::gate_check),
            )
            .route(
                "/api/gate/check/{*path}",
                any(crate::http::check::gate_check),
            );
    }
    let (router, patterns) = routes
        .merge(crate::http::resources::routes(&state, rate.as_ref()))
        .route("/api/cache/stats", get(stats))
        .route("/metrics", get(metrics))
        .route("/dashboard", get(crate::http::dashboard::page))
        .route("/api/ping", get(ping))
        .route("/healthz", get(ping))
        .route("/readyz", get(crate::http::routes::readyz))
        .route("/openapi.json", get(crate::http::openapi::serve))
        .into_parts();
    let router = router
        .fallback(|| async { AppError::NotFound("no such route".into()) })
        .method_not_allowed_fallback(|| async {
            crate::http::error::error_response(
                StatusCode::METHOD_NOT_ALLOWED,
                "method_not_allowed",
                "method not allowed on this route",
            )
        });
    // One layer for what every request needs (id, span, counters, JSON
    // errors, timeout: see `edge`), around the whole router.
    let mut edge = crate::http::edge::EdgeLayer::new(
        Arc::clone(&state.metrics),
        std::time::Duration::from_millis(state.http.request_timeout_ms),
        &patterns,
    );
    // The warms answer when their rebuild is done, however long a scan
    // of the table takes.
    let warms = ["/api/cache/warm".to_owned(), "/api/skus/warm".to_owned()]
        .into_iter()
        .filter(|_| demo)
        .chain(
            state
                .resources
                .iter()
                .map(|r| format!("/api/{}/warm", r.name)),
        );
    for route in warms {
        let registered = edge.unbounded_post(&route);
        debug_assert!(registered, "{route} is routed");
    }
    let state = Arc::new(state);
    // The SKU reads, and each resource's, taken by the edge without the
    // router (answered at once for a filter "no" or an L1 entry), except
    // keys that do not parse, after the edge's check of the per-client
    // rate limit when one is set.
    let fast_answers = state.http.fast_answers;
    for route in [SECKILL_ROUTE, crate::paths::SKU_ROUTE]
        .into_iter()
        .filter(|_| demo)
    {
        if fast_answers {
            let skus = Arc::clone(&state.skus);
            let registered = edge.fast_get(
                route,
                Box::new(move |raw| crate::http::routes::sku_detail_fast(&skus, raw)),
            );
            // The route is one of the edge's patterns and the layer is new.
            debug_assert!(registered, "{route} has its fast answer");
        }
        if let Some(limit) = &rate {
            edge.limit_get(route, Arc::clone(limit));
        }
    }
    for r in &state.resources {
        let fast = Arc::clone(r);
        let route = crate::http::resources::read_route(&r.name);
        if fast_answers {
            let registered = edge.fast_get(
                &route,
                Box::new(move |raw| crate::http::resources::read_fast(&fast, raw)),
            );
            debug_assert!(registered, "{}'s read has its fast answer", r.name);
        }
        if let Some(limit) = &rate {
            edge.limit_get(&route, Arc::clone(limit));
        }
    }
    tower::Layer::layer(&edge, router.with_state(state))
}
