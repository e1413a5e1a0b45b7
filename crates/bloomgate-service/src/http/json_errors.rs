//! One error shape for every failure: responses that leave a handler (or a
//! layer, or axum itself: unknown methods, body limits, path rejections)
//! with an error status and a body that is not JSON are
//! rewritten to `{"error": code, "message": text}`.

use axum::body::Body;
use axum::http::header::CONTENT_TYPE;
use axum::http::{Response, StatusCode};

use crate::http::error::error_response;

/// Marks a response whose error body is what it must be, not rewritten:
/// the HTTP gate's check answers an auth-request proxy with a bare 403 or
/// with the route's configured refusal, whatever its content type.
#[derive(Debug, Clone, Copy)]
pub struct AsIs;

/// The machine-readable code for a status.
#[must_use]
pub fn code_for(status: StatusCode) -> &'static str {
    match status {
        StatusCode::BAD_REQUEST => "bad_request",
        StatusCode::UNAUTHORIZED => "unauthorized",
        StatusCode::FORBIDDEN => "forbidden",
        StatusCode::NOT_FOUND => "not_found",
        StatusCode::METHOD_NOT_ALLOWED => "method_not_allowed",
        StatusCode::CONFLICT => "conflict",
        StatusCode::PAYLOAD_TOO_LARGE => "payload_too_large",
        StatusCode::UNSUPPORTED_MEDIA_TYPE => "unsupported_media_type",
        StatusCode::TOO_MANY_REQUESTS => "too_many_requests",
        StatusCode::SERVICE_UNAVAILABLE => "unavailable",
        StatusCode::REQUEST_TIMEOUT => "timeout",
        s if s.is_server_error() => "internal",
        _ => "error",
    }
}

/// What a rewritten response says for `status`.
fn message_for(status: StatusCode) -> &'static str {
    match status {
        StatusCode::BAD_REQUEST => "the request could not be parsed (path or headers)",
        StatusCode::PAYLOAD_TOO_LARGE => "the request body is larger than the limit",
        StatusCode::TOO_MANY_REQUESTS => "too many requests from this client; slow down",
        StatusCode::SERVICE_UNAVAILABLE => "the request took too long; retry",
        s => s.canonical_reason().unwrap_or("error"),
    }
}

/// Rewrites a non-JSON error response as the JSON error shape, keeping its
/// status and headers (`Allow`, `Retry-After`, rate-limit headers). It
/// runs on every response, so it is synchronous and allocates only when
/// it rewrites; the original body (plain text from axum or a layer) is
/// replaced by a fixed message for the status.
pub fn json_errors(response: Response<Body>) -> Response<Body> {
    let status = response.status();
    if !(status.is_client_error() || status.is_server_error()) {
        return response;
    }
    if response.extensions().get::<AsIs>().is_some() {
        return response;
    }
    let is_json = response
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if is_json {
        return response;
    }
    let (mut parts, _) = response.into_parts();
    let rewritten = error_response(status, code_for(status), message_for(status));
    parts.headers.remove(CONTENT_TYPE);
    parts.headers.remove(axum::http::header::CONTENT_LENGTH);
    let (new_parts, body) = rewritten.into_parts();
    parts.headers.extend(new_parts.headers);
    Response::from_parts(parts, body)
}
