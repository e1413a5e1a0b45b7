//! Request tracing: every request runs in a span with its method, route,
//! request id, SKU id, outcome, status and duration (opened by
//! [`crate::http::edge`]), and carries an `x-request-id`: the client's, or a new
//! one, echoed on the response.

use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderValue, Request, Response};
use tracing::Span;

/// The request-id header.
pub const REQUEST_ID: axum::http::HeaderName = axum::http::HeaderName::from_static("x-request-id");

/// The span of one request (`route`: the matched pattern, if any);
/// `sku_id` and `outcome` are filled in by the handler, `status` and
/// `latency_ms` when the response leaves. The fields are only read when
/// the span is enabled; when no subscriber wants `info`, the span is
/// `Span::none()` without asking any (the per-request cost of a span
/// nobody records).
pub fn request_span(req: &Request<Body>, route: Option<&str>, id: &HeaderValue) -> Span {
    if !tracing::level_enabled!(tracing::Level::INFO) {
        return Span::none();
    }
    tracing::info_span!(
        "request",
        method = %req.method(),
        route = route.unwrap_or("(unmatched)"),
        request_id = id.to_str().unwrap_or(""),
        sku_id = tracing::field::Empty,
        outcome = tracing::field::Empty,
        status = tracing::field::Empty,
        latency_ms = tracing::field::Empty,
    )
}

/// Records the status and duration on the span, and logs the request at
/// debug level (server errors at warn).
pub fn on_response(res: &Response<Body>, latency: Duration, span: &Span) {
    let status = res.status().as_u16();
    if !span.is_none() {
        span.record("status", status);
        span.record("latency_ms", latency.as_secs_f64() * 1e3);
    }
    if res.status().is_server_error() {
        tracing::warn!(
            status,
            latency_ms = latency.as_secs_f64() * 1e3,
            "request failed"
        );
    } else if tracing::level_enabled!(tracing::Level::DEBUG) {
        tracing::debug!(status, latency_ms = latency.as_secs_f64() * 1e3, "request");
    }
}

/// Names where a read's answer came from, on the current request's span.
pub fn record_outcome(sku_id: i64, outcome: &'static str) {
    if !tracing::level_enabled!(tracing::Level::INFO) {
        return;
    }
    let span = Span::current();
    span.record("sku_id", sku_id);
    span.record("outcome", outcome);
}

/// Records a resource read's outcome on the current request span.
pub fn record_outcome_only(outcome: &'static str) {
    if !tracing::level_enabled!(tracing::Level::INFO) {
        return;
    }
    Span::current().record("outcome", outcome);
}
