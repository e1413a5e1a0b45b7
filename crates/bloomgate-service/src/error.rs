//! HTTP errors: every failure becomes a JSON body with a status code;
//! internals are logged, not sent to the client.

use axum::http::header::RETRY_AFTER;
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;

/// The JSON body of every error: `{"error": code, "message": text}`.
#[derive(serde::Serialize, utoipa::ToSchema)]
pub struct ErrorBody<'a> {
    /// A machine-readable code: `bad_request`, `not_found`, `conflict`,
    /// `unavailable`, `overloaded`, `payload_too_large`, …
    pub error: &'a str,
    /// What went wrong, for people; quotes at most 64 characters of input.
    pub message: &'a str,
}

/// An error answered to an HTTP client.
#[derive(Debug, thiserror::Error)]
pub enum AppError {
    /// Bad input: 400.
    #[error("{0}")]
    BadRequest(String),
    /// No such resource: 404.
    #[error("{0}")]
    NotFound(String),
    /// No credentials on an admin call: 401.
    #[error("missing bearer token")]
    Unauthorized,
    /// Wrong credentials: 403.
    #[error("invalid bearer token")]
    Forbidden,
    /// Conflicts with the current state: 409.
    #[error("{0}")]
    Conflict(String),
    /// A body that is not declared JSON: 415.
    #[error("{0}")]
    UnsupportedMediaType(String),
    /// A backing store failed: 503, details logged.
    #[error("service unavailable")]
    Unavailable(String),
    /// The database bulkhead is full: 503 with `Retry-After`.
    #[error("too many lookups are waiting for the database; retry shortly")]
    Overloaded,
}

impl AppError {
    fn parts(&self) -> (StatusCode, &'static str) {
        match self {
            Self::BadRequest(_) => (StatusCode::BAD_REQUEST, "bad_request"),
            Self::NotFound(_) => (StatusCode::NOT_FOUND, "not_found"),
            Self::Unauthorized => (StatusCode::UNAUTHORIZED, "unauthorized"),
            Self::Forbidden => (StatusCode::FORBIDDEN, "forbidden"),
            Self::Conflict(_) => (StatusCode::CONFLICT, "conflict"),
            Self::UnsupportedMediaType(_) => {
                (StatusCode::UNSUPPORTED_MEDIA_TYPE, "unsupported_media_type")
            }
            Self::Unavailable(_) => (StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
            Self::Overloaded => (StatusCode::SERVICE_UNAVAILABLE, "overloaded"),
        }
    }
}

impl IntoResponse for AppError {
    fn into_response(self) -> Response {
        let (status, code) = self.parts();
        if let Self::Unavailable(detail) = &self {
            tracing::error!(%detail, "request failed on a backing store");
        }
        let message = self.to_string();
        let mut response = error_response(status, code, &message);
        if status == StatusCode::SERVICE_UNAVAILABLE {
            // Both causes are transient: tell clients when to come back.
            response
                .headers_mut()
                .insert(RETRY_AFTER, HeaderValue::from_static("1"));
        }
        response
    }
}

impl From<crate::store::StoreError> for AppError {
    fn from(e: crate::store::StoreError) -> Self {
        Self::Unavailable(e.to_string())
    }
}

/// The read route's 404, `{"error":"not_found","message":"sku {id} not
/// found"}` as [`AppError::NotFound`] renders it, written in one buffer:
/// under a random-id attack it is most of what the service answers.
#[must_use]
pub fn sku_not_found(id: i64) -> Response {
    const HEAD: &str = r#"{"error":"not_found","message":"sku "#;
    const TAIL: &str = r#" not found"}"#;
    let mut digits = itoa::Buffer::new();
    let id = digits.format(id);
    let mut body = Vec::with_capacity(HEAD.len() + id.len() + TAIL.len());
    body.extend_from_slice(HEAD.as_bytes());
    body.extend_from_slice(id.as_bytes());
    body.extend_from_slice(TAIL.as_bytes());
    json_404(body)
}

/// A 404 `{"error":"not_found","message":…}` as [`AppError::NotFound`]
/// renders it, in one buffer (a resource's read under a random-key
/// attack answers mostly this).
#[must_use]
pub fn not_found(message: &str) -> Response {
    const HEAD: &[u8] = br#"{"error":"not_found","message":"#;
    let mut body = Vec::with_capacity(HEAD.len() + message.len() + 8);
    body.extend_from_slice(HEAD);
    // A `str` always serialises.
    let _ = serde_json::to_writer(&mut body, message);
    body.push(b'}');
    json_404(body)
}

/// A 404 with a JSON body written by the caller.
fn json_404(body: Vec<u8>) -> Response {
    (
        StatusCode::NOT_FOUND,
        [(
            axum::http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        body,
    )
        .into_response()
}

/// The JSON error body every failure answers with, for `status`.
#[must_use]
pub fn error_response(status: StatusCode, code: &str, message: &str) -> Response {
    (
        status,
        Json(ErrorBody {
            error: code,
            message,
        }),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::{not_found, sku_not_found, AppError};
    use axum::response::IntoResponse;

    async fn parts(res: axum::response::Response) -> (u16, String, Vec<u8>) {
        let status = res.status().as_u16();
        let kind = res.headers()["content-type"].to_str().unwrap().to_owned();
        let body = axum::body::to_bytes(res.into_body(), 1 << 16)
            .await
            .unwrap();
        (status, kind, body.to_vec())
    }

    #[tokio::test]
    async fn the_fast_404_is_byte_for_byte_the_error_it_stands_for() {
        for id in [1, 42, 200_100, i64::MAX] {
            let slow = AppError::NotFound(format!("sku {id} not found")).into_response();
            assert_eq!(parts(sku_not_found(id)).await, parts(slow).await, "{id}");
        }
        for message in [
            "users u1001 not found",
            "users \"quoted\" \\ ✓ not found",
            "",
        ] {
            let slow = AppError::NotFound(message.to_owned()).into_response();
            assert_eq!(
                parts(not_found(message)).await,
                parts(slow).await,
                "{message}"
            );
        }
    }
}
