//! The errors the service answers with: each [`AppError`] has an HTTP
//! status and a machine-readable code ([`AppError::status`]); `http::error`
//! renders it as a JSON body. Internals are logged, not sent to the client.

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
    /// Wrong credentials, or (without a token) an admin call from a page
    /// that is not this machine's: 403.
    #[error("{0}")]
    Forbidden(String),
    /// Conflicts with the current state: 409.
    #[error("{0}")]
    Conflict(String),
    /// A call that must reach every instance through bloomgate's outbox,
    /// which this service runs without (`sql.outbox`): 409, nothing done.
    #[error("{0}")]
    OutboxOff(String),
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
    /// The HTTP status and the code of the JSON body.
    #[must_use]
    pub fn status(&self) -> (u16, &'static str) {
        match self {
            Self::BadRequest(_) => (400, "bad_request"),
            Self::NotFound(_) => (404, "not_found"),
            Self::Unauthorized => (401, "unauthorized"),
            Self::Forbidden(_) => (403, "forbidden"),
            Self::Conflict(_) => (409, "conflict"),
            Self::OutboxOff(_) => (409, "outbox_off"),
            Self::UnsupportedMediaType(_) => (415, "unsupported_media_type"),
            Self::Unavailable(_) => (503, "unavailable"),
            Self::Overloaded => (503, "overloaded"),
        }
    }
}

impl From<crate::sql::StoreError> for AppError {
    fn from(e: crate::sql::StoreError) -> Self {
        Self::Unavailable(e.to_string())
    }
}
