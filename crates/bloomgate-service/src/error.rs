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
