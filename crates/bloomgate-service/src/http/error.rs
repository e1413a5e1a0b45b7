//! [`AppError`] as a response: the JSON body `{"error", "message"}`, with
//! `Retry-After` on a 503; and the 404s the read routes write in one
//! buffer.

use axum::http::header::RETRY_AFTER;
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;

use crate::error::{AppError, ErrorBody};

impl IntoResponse for AppError {
    fn into_response(self) -> Response {
        let (status, code) = self.status();
        let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
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
