//! HTTP errors: every failure becomes a JSON body with a status code;
//! internals are logged, not sent to the client.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;

/// The JSON body of every error: `{"error": code, "message": text}`.
#[derive(serde::Serialize)]
struct ErrorBody<'a> {
    error: &'a str,
    message: &'a str,
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
    /// A backing store failed: 503, details logged.
    #[error("service unavailable")]
    Unavailable(String),
}

impl AppError {
    fn parts(&self) -> (StatusCode, &'static str) {
        match self {
            Self::BadRequest(_) => (StatusCode::BAD_REQUEST, "bad_request"),
            Self::NotFound(_) => (StatusCode::NOT_FOUND, "not_found"),
            Self::Unauthorized => (StatusCode::UNAUTHORIZED, "unauthorized"),
            Self::Forbidden => (StatusCode::FORBIDDEN, "forbidden"),
            Self::Conflict(_) => (StatusCode::CONFLICT, "conflict"),
            Self::Unavailable(_) => (StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
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
        (
            status,
            Json(ErrorBody {
                error: code,
                message: &message,
            }),
        )
            .into_response()
    }
}

impl From<crate::store::StoreError> for AppError {
    fn from(e: crate::store::StoreError) -> Self {
        Self::Unavailable(e.to_string())
    }
}
