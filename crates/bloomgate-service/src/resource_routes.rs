//! The routes of each resource, registered by name (so each has its own
//! `route` label in metrics):
//!
//! * `GET /api/{name}/{key}`: the row as a JSON object, or a 404 JSON error;
//! * `POST /api/{name}/batch` `{"keys": [...]}`: the rows found and the
//!   keys missing;
//! * `POST /api/{name}/exists` `{"keys": [...]}`: the filter's answers;
//! * `POST /api/{name}/keys` and `POST /api/{name}/invalidate` (admin):
//!   writes made elsewhere, applied on every instance.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Path};
use axum::http::header::CONTENT_TYPE;
use axum::http::{HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::json;

use crate::admin::authorize;
use crate::error::AppError;
use crate::input::json_body;
use crate::key::Key;
use crate::metrics::Outcome;
use crate::reader::Lookup;
use crate::resource::Resource;
use crate::state::AppState;

/// The body of every resource call.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct KeysBody {
    keys: Vec<serde_json::Value>,
}

fn keys_of(r: &Resource, headers: &HeaderMap, body: &[u8]) -> Result<Vec<Key>, AppError> {
    let b: KeysBody = json_body(headers, body)?;
    if b.keys.len() > r.max_batch_keys {
        return Err(AppError::BadRequest(format!(
            "at most {} keys per call, got {}",
            r.max_batch_keys,
            b.keys.len()
        )));
    }
    b.keys
        .iter()
        .enumerate()
        .map(|(i, v)| {
            Key::from_json(r.key_type(), v)
                .map_err(|e| AppError::BadRequest(format!("keys[{i}]: {e}")))
        })
        .collect()
}

async fn read(r: Arc<Resource>, raw: String) -> Response {
    let key = match Key::parse(r.key_type(), &raw) {
        Ok(k) => k,
        Err(e) => return AppError::BadRequest(e).into_response(),
    };
    let answer = r.get(key).await;
    let outcome = answer.as_ref().map_or(Outcome::ERROR, Lookup::outcome);
    crate::telemetry::record_outcome_only(outcome.label());
    let res = match answer {
        Ok(Lookup::Found(cached, _)) => (
            [(CONTENT_TYPE, HeaderValue::from_static("application/json"))],
            cached.json.clone(),
        )
            .into_response(),
        Ok(Lookup::Missing(_)) => crate::error::not_found(&format!(
            "{} {} not found",
            r.name,
            crate::input::clip(&raw)
        )),
        Err(e) => e.into_response(),
    };
    outcome.note();
    res
}

async fn batch(r: Arc<Resource>, headers: HeaderMap, body: Bytes) -> Result<Response, AppError> {
    let keys = keys_of(&r, &headers, &body)?;
    let answer = r.batch(&keys).await?;
    let found: Vec<serde_json::Value> = answer
        .found
        .iter()
        .map(|(k, row)| json!({ "key": k.to_json(), "row": row.row }))
        .collect();
    let missing: Vec<serde_json::Value> = answer.missing.iter().map(Key::to_json).collect();
    Ok(Json(json!({ "found": found, "missing": missing })).into_response())
}

async fn exists(r: Arc<Resource>, headers: HeaderMap, body: Bytes) -> Result<Response, AppError> {
    let keys = keys_of(&r, &headers, &body)?;
    Ok(Json(json!({ "exists": r.exists(&keys)? })).into_response())
}

async fn add_keys(
    r: Arc<Resource>,
    token: Option<Arc<str>>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, AppError> {
    authorize(token.as_deref(), &headers, "/api/{name}/keys")?;
    let keys = keys_of(&r, &headers, &body)?;
    r.add_keys(&keys).await?;
    Ok(Json(json!({ "added": keys.len() })).into_response())
}

async fn invalidate(
    r: Arc<Resource>,
    token: Option<Arc<str>>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, AppError> {
    authorize(token.as_deref(), &headers, "/api/{name}/invalidate")?;
    let keys = keys_of(&r, &headers, &body)?;
    r.invalidate(&keys).await?;
    Ok(Json(json!({ "invalidated": keys.len() })).into_response())
}

/// Every resource's routes.
pub fn routes(state: &AppState) -> Router<Arc<AppState>> {
    let mut router = Router::new();
    for r in &state.resources {
        let base = format!("/api/{}", r.name);
        let token = state.admin_token.clone();
        let (r1, r2, r3, r4, r5) = (
            Arc::clone(r),
            Arc::clone(r),
            Arc::clone(r),
            Arc::clone(r),
            Arc::clone(r),
        );
        let t2 = token.clone();
        // A GET of a key spelled like a call (`/api/users/keys`) reads
        // that key: the static route would otherwise answer 405.
        let reads = |word: &'static str| {
            let r = Arc::clone(r);
            get(move || read(Arc::clone(&r), word.to_owned()))
        };
        let bodies = Router::new()
            .route(
                &format!("{base}/batch"),
                reads("batch").post(move |h: HeaderMap, b: Bytes| batch(Arc::clone(&r2), h, b)),
            )
            .route(
                &format!("{base}/exists"),
                reads("exists").post(move |h: HeaderMap, b: Bytes| exists(Arc::clone(&r3), h, b)),
            )
            .route(
                &format!("{base}/keys"),
                reads("keys").post(move |h: HeaderMap, b: Bytes| {
                    add_keys(Arc::clone(&r4), token.clone(), h, b)
                }),
            )
            .route(
                &format!("{base}/invalidate"),
                reads("invalidate").post(move |h: HeaderMap, b: Bytes| {
                    invalidate(Arc::clone(&r5), t2.clone(), h, b)
                }),
            )
            .layer(DefaultBodyLimit::max(state.http.body_limit_bytes));
        router = router
            .route(
                &format!("{base}/{{key}}"),
                get(move |Path(raw): Path<String>| read(Arc::clone(&r1), raw)),
            )
            .merge(bodies);
    }
    router
}
