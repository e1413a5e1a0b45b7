//! One error shape for every failure: responses that leave a handler (or a
//! layer, or axum itself: unknown methods, body limits, path rejections,
//! the rate limiter) with an error status and a body that is not JSON are
//! rewritten to `{"error": code, "message": text}`.

use axum::body::{to_bytes, Body};
use axum::http::header::CONTENT_TYPE;
use axum::http::{Response, StatusCode};

use crate::error::error_response;
use crate::input::clip_quoted;

/// The largest non-JSON error body read to build the message.
const READ_LIMIT: usize = 4096;
/// The longest message kept from such a body, in characters.
const MAX_MESSAGE: usize = 200;

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

/// Rewrites a non-JSON error response as the JSON error shape, keeping
/// its status and headers (`Allow`, `Retry-After`, rate-limit headers).
pub async fn json_errors(response: Response<Body>) -> Response<Body> {
    let status = response.status();
    let is_json = response
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if !(status.is_client_error() || status.is_server_error()) || is_json {
        return response;
    }
    let (mut parts, body) = response.into_parts();
    let text = to_bytes(body, READ_LIMIT).await.unwrap_or_default();
    let text = String::from_utf8_lossy(&text);
    let reason = status.canonical_reason().unwrap_or("error");
    let mut message = if text.trim().is_empty() {
        reason.to_string()
    } else {
        clip_quoted(&format!("{reason}: {}", text.trim()))
    };
    if let Some((cut, _)) = message.char_indices().nth(MAX_MESSAGE) {
        message.truncate(cut);
        message.push('…');
    }
    let rewritten = error_response(status, code_for(status), &message);
    parts.headers.remove(CONTENT_TYPE);
    parts.headers.remove(axum::http::header::CONTENT_LENGTH);
    let (new_parts, body) = rewritten.into_parts();
    parts.headers.extend(new_parts.headers);
    Response::from_parts(parts, body)
}
