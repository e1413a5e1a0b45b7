//! Admin authorisation: `Authorization: Bearer <token>` on the warm and
//! SKU-write endpoints when `admin_token` is set.

use axum::http::header::AUTHORIZATION;
use axum::http::HeaderMap;
use subtle::ConstantTimeEq;

use crate::error::AppError;

/// Checks the bearer token. The scheme is matched case-insensitively (RFC
/// 9110 §11.1), the token in constant time; failures are logged without
/// the token. Without a configured token every caller is admitted: the
/// server then only listens on loopback (see `Config::validate`).
///
/// # Errors
/// [`AppError::Unauthorized`] without credentials, [`AppError::Forbidden`]
/// with wrong ones.
pub fn authorize(token: Option<&str>, headers: &HeaderMap, path: &str) -> Result<(), AppError> {
    let Some(token) = token else {
        return Ok(());
    };
    let given = headers
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim_start().split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, t)| t.trim());
    let Some(given) = given else {
        tracing::warn!(path, "admin call without a bearer token");
        return Err(AppError::Unauthorized);
    };
    if bool::from(given.as_bytes().ct_eq(token.as_bytes())) {
        Ok(())
    } else {
        tracing::warn!(path, "admin call with a wrong bearer token");
        Err(AppError::Forbidden)
    }
}
