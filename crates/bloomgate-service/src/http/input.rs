//! Parsing what clients send: path ids and JSON bodies. Pure functions, so
//! the fuzz targets call them directly; every failure is an
//! [`AppError::BadRequest`] (or 415) whose message quotes at most
//! [`MAX_QUOTED`] characters of the input.

use axum::http::header::CONTENT_TYPE;
use axum::http::HeaderMap;
use serde::de::DeserializeOwned;

use crate::error::AppError;

pub use crate::text::{clip, clip_quoted, MAX_QUOTED};

/// Parses a path id: a positive integer that fits in i64.
///
/// # Errors
/// [`AppError::BadRequest`].
pub fn parse_id(raw: &str) -> Result<i64, AppError> {
    id_of(raw).ok_or_else(|| {
        AppError::BadRequest(format!(
            "skuId must be a positive integer that fits in 64 bits, got {:?}",
            clip(raw)
        ))
    })
}

/// The id [`parse_id`] accepts, without building its error.
#[must_use]
pub fn id_of(raw: &str) -> Option<i64> {
    raw.parse::<i64>().ok().filter(|&id| id > 0)
}

/// Parses a JSON body ourselves so that every failure is a JSON 400.
///
/// # Errors
/// [`AppError::BadRequest`].
pub fn parse_body<T: DeserializeOwned>(body: &[u8]) -> Result<T, AppError> {
    serde_json::from_slice(body)
        .map_err(|e| AppError::BadRequest(clip_quoted(&format!("invalid JSON body: {e}"))))
}

/// A body must be declared JSON (`application/json`, any parameters) when
/// there is one.
///
/// # Errors
/// [`AppError::UnsupportedMediaType`].
pub fn require_json(headers: &HeaderMap, body: &[u8]) -> Result<(), AppError> {
    if body.is_empty() {
        return Ok(());
    }
    let declared = headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .map(str::trim);
    match declared {
        Some(t) if t.eq_ignore_ascii_case("application/json") => Ok(()),
        other => Err(AppError::UnsupportedMediaType(format!(
            "the body must be application/json, got {:?}",
            clip(other.unwrap_or("no content type"))
        ))),
    }
}

/// [`require_json`], then [`parse_body`]; an empty body parses as `{}`.
/// Every body of this API is an object (or `null` where optional): arrays,
/// which serde would accept for a struct field by field, are refused.
///
/// # Errors
/// As both.
pub fn json_body<T: DeserializeOwned>(headers: &HeaderMap, body: &[u8]) -> Result<T, AppError> {
    require_json(headers, body)?;
    let first = body.iter().find(|b| !b.is_ascii_whitespace());
    if first == Some(&b'[') {
        return Err(AppError::BadRequest(
            "invalid JSON body: expected an object, got an array".into(),
        ));
    }
    parse_body(if body.is_empty() { b"{}" } else { body })
}
