//! HTTP routes: the seckill read, the operator endpoints, SKU writes.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::header::CONTENT_TYPE;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::IntoResponse;
use axum::Json;
use serde::Deserialize;
use serde_json::json;

use crate::error::AppError;
use crate::http::admin::authorize;
use crate::http::edge::Fast;
use crate::http::input::{json_body, parse_id};
use crate::metrics::Outcome;
use crate::model::{Sku, SkuInput};
use crate::resource::reader::Lookup;
use crate::resource::Resource;
use crate::sql::Database;
use crate::state::AppState;

pub use crate::paths::SECKILL_ROUTE;

/// Prometheus text format: every counter of `/api/cache/stats`, requests
/// by route, outcome and status, and latency histograms.
#[utoipa::path(get, path = "/metrics",
    responses((status = 200, description = "Prometheus text exposition format", body = String, content_type = "text/plain")))]
pub async fn metrics(State(state): State<Arc<AppState>>) -> impl IntoResponse {
    (
        [(CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")],
        crate::stats::export(&state).await,
    )
}

/// Liveness: a fixed answer, the benchmarks' ceiling.
#[utoipa::path(get, path = "/api/ping", responses((status = 200, description = "Alive", body = Object)))]
pub async fn ping() -> impl IntoResponse {
    Json(json!({ "ok": true }))
}

/// Readiness for an orchestrator: 200 once every guarded table's filter
/// is built (or restored) and in step with the change feed; 503 JSON
/// saying why (and how far each rebuild has got) until then.
#[utoipa::path(get, path = "/readyz",
    responses(
        (status = 200, description = "Every filter is built and in step"),
        (status = 503, description = "Not ready: the body names each resource's state and rebuild progress")
    )
)]
pub async fn readyz(State(state): State<Arc<AppState>>) -> impl IntoResponse {
    let (ready, body) = crate::stats::ready::readiness(&state);
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, Json(body))
}

/// A SKU's details through the funnel: filter, L1, Redis, SQL.
#[utoipa::path(get, path = "/api/seckill/{skuId}",
    params(("skuId" = i64, Path, minimum = 1, description = "A positive 64-bit SKU id")),
    responses(
        (status = 200, description = "The SKU", body = crate::model::Sku),
        (status = 400, description = "Not a positive 64-bit integer", body = crate::error::ErrorBody),
        (status = 404, description = "No such SKU", body = crate::error::ErrorBody),
        (status = 429, description = "Over the per-client rate limit", body = crate::error::ErrorBody),
        (status = 503, description = "The database is unavailable or overloaded", body = crate::error::ErrorBody),
    ))]
pub async fn sku_detail(
    State(state): State<Arc<AppState>>,
    Path(raw): Path<String>,
) -> Result<impl IntoResponse, AppError> {
    let id = parse_id(&raw)?;
    let (res, outcome) = sku_read(&state.skus, id).await;
    outcome.note();
    Ok(res)
}

/// The read of SKU `id` through the funnel, as the route answers it.
async fn sku_read(skus: &Resource<Database>, id: i64) -> (axum::response::Response, Outcome) {
    let answer = skus.get(id).await;
    let outcome = answer.as_ref().map_or(Outcome::ERROR, Lookup::outcome);
    crate::http::telemetry::record_outcome(id, outcome.label());
    let res = match answer {
        Ok(answer) => sku_response(id, answer),
        Err(e) => e.into_response(),
    };
    (res, outcome)
}

/// The SKU table as the default resource `skus`: `GET /api/skus/{id}`
/// answers exactly as `GET /api/seckill/{skuId}` does.
#[utoipa::path(get, path = "/api/skus/{skuId}",
    params(("skuId" = i64, Path, minimum = 1, description = "A positive 64-bit SKU id")),
    responses(
        (status = 200, description = "The SKU", body = crate::model::Sku),
        (status = 400, description = "Not a positive 64-bit integer", body = crate::error::ErrorBody),
        (status = 404, description = "No such SKU", body = crate::error::ErrorBody),
        (status = 429, description = "Over the per-client rate limit", body = crate::error::ErrorBody),
        (status = 503, description = "The database is unavailable or overloaded", body = crate::error::ErrorBody),
    ))]
pub async fn sku_by_id(
    state: State<Arc<AppState>>,
    raw: Path<String>,
) -> Result<impl IntoResponse, AppError> {
    sku_detail(state, raw).await
}

/// [`sku_detail`] for the raw path segment `raw`, without the router
/// (`crate::http::edge`, `EdgeLayer::fast_get`): the answer now when there
/// is one without waiting (a filter "no", an L1 entry), else the read
/// past L1 as the route's work. An id that does not parse goes to the
/// router, whose handler answers its 400.
pub fn sku_detail_fast(skus: &Arc<Resource<Database>>, raw: &str) -> Fast {
    let Some(id) = crate::http::input::id_of(raw) else {
        return Fast::Route;
    };
    if let Some(answer) = skus.get_now(&id) {
        let outcome = answer.outcome();
        crate::http::telemetry::record_outcome(id, outcome.label());
        return Fast::Now(sku_response(id, answer), outcome);
    }
    let skus = Arc::clone(skus);
    Fast::Later(Box::pin(async move { sku_read(&skus, id).await }))
}

fn sku_response(id: i64, answer: Lookup<Sku>) -> axum::response::Response {
    match answer {
        Lookup::Found(cached, _) => (
            [(CONTENT_TYPE, HeaderValue::from_static("application/json"))],
            cached.body(),
        )
            .into_response(),
        Lookup::Missing(_) => crate::http::error::sku_not_found(id),
    }
}

/// The body of `POST /api/cache/warm` (optional: an empty body or `null`
/// is `{}`).
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct WarmRequest {
    /// SKUs to load into Redis and L1, from the smallest id.
    #[serde(default = "default_warm_limit")]
    #[schema(minimum = 0, maximum = 1_000_000, default = 1000)]
    pub limit: u64,
    /// Also rebuild the filter from SQL, waiting for it.
    #[serde(default)]
    pub rebuild_bloom: bool,
}

impl WarmRequest {
    /// The body of a warm call (an empty body or `null` is `{}`), checked.
    ///
    /// # Errors
    /// [`AppError::BadRequest`] (or 415) for a body that is no such
    /// object, or a limit over [`MAX_WARM_LIMIT`].
    pub fn parse(headers: &HeaderMap, body: &Bytes) -> Result<Self, AppError> {
        let req: Self = json_body::<Option<Self>>(headers, body)?.unwrap_or_default();
        if req.limit > MAX_WARM_LIMIT {
            return Err(AppError::BadRequest(format!(
                "limit must be at most {MAX_WARM_LIMIT}"
            )));
        }
        Ok(req)
    }
}

const fn default_warm_limit() -> u64 {
    1000
}

impl Default for WarmRequest {
    fn default() -> Self {
        Self {
            limit: default_warm_limit(),
            rebuild_bloom: false,
        }
    }
}

/// The largest `limit` a warm call accepts.
pub const MAX_WARM_LIMIT: u64 = 1_000_000;

/// Warms Redis and L1 with the first SKUs; optionally rebuilds the filter.
#[utoipa::path(post, path = "/api/cache/warm",
    request_body(content = Option<WarmRequest>, content_type = "application/json"),
    responses(
        (status = 200, description = "Warmed (and rebuilt)", body = Object),
        (status = 400, description = "Bad body", body = crate::error::ErrorBody),
        (status = 401, description = "Missing bearer token", body = crate::error::ErrorBody),
        (status = 403, description = "Wrong bearer token", body = crate::error::ErrorBody),
        (status = 413, description = "Body over the limit", body = crate::error::ErrorBody),
        (status = 415, description = "Body not declared JSON", body = crate::error::ErrorBody),
        (status = 503, description = "The database is unavailable", body = crate::error::ErrorBody),
    ))]
pub async fn warm(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<impl IntoResponse, AppError> {
    warm_skus(&state, &headers, &body, "/api/cache/warm").await
}

/// `POST /api/skus/warm`: the default resource's warm, as every resource
/// has one; the same call and answer as `POST /api/cache/warm`.
pub async fn sku_warm(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<impl IntoResponse, AppError> {
    warm_skus(&state, &headers, &body, "/api/skus/warm").await
}

async fn warm_skus(
    state: &AppState,
    headers: &HeaderMap,
    body: &Bytes,
    route: &str,
) -> Result<Json<crate::resource::WarmReport>, AppError> {
    authorize(state.admin_token.as_deref(), headers, route)?;
    let req = WarmRequest::parse(headers, body)?;
    Ok(Json(state.skus.warm(req.limit, req.rebuild_bloom).await?))
}

/// Counters of every level: bloom, l1, redis, sql.
#[utoipa::path(get, path = "/api/cache/stats",
    responses((status = 200, description = "Counters", body = Object),
        (status = 503, description = "The database is unavailable", body = crate::error::ErrorBody)))]
pub async fn stats(State(state): State<Arc<AppState>>) -> Result<impl IntoResponse, AppError> {
    Ok(Json(crate::stats::json(&state).await))
}

/// Creates a SKU (the next free id when none is given).
#[utoipa::path(post, path = "/api/skus",
    request_body(content = crate::model::SkuInput, content_type = "application/json"),
    responses(
        (status = 201, description = "Created", body = crate::model::Sku),
        (status = 400, description = "Bad body", body = crate::error::ErrorBody),
        (status = 401, description = "Missing bearer token", body = crate::error::ErrorBody),
        (status = 403, description = "Wrong bearer token", body = crate::error::ErrorBody),
        (status = 413, description = "Body over the limit", body = crate::error::ErrorBody),
        (status = 415, description = "Body not declared JSON", body = crate::error::ErrorBody),
        (status = 409, description = "The id is taken, or no automatic id is left", body = crate::error::ErrorBody),
        (status = 503, description = "The database is unavailable", body = crate::error::ErrorBody),
    ))]
pub async fn create_sku(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<impl IntoResponse, AppError> {
    authorize(state.admin_token.as_deref(), &headers, "/api/skus")?;
    let input: SkuInput = json_body(&headers, &body)?;
    input
        .validate()
        .map_err(|e| AppError::BadRequest(e.to_string()))?;
    let sku = state.skus.create(input).await?;
    Ok((StatusCode::CREATED, Json(sku)))
}

/// Replaces a SKU's fields.
#[utoipa::path(put, path = "/api/skus/{skuId}",
    params(("skuId" = i64, Path, minimum = 1)),
    request_body(content = crate::model::SkuInput, content_type = "application/json"),
    responses(
        (status = 200, description = "Updated", body = crate::model::Sku),
        (status = 400, description = "Bad body", body = crate::error::ErrorBody),
        (status = 401, description = "Missing bearer token", body = crate::error::ErrorBody),
        (status = 403, description = "Wrong bearer token", body = crate::error::ErrorBody),
        (status = 413, description = "Body over the limit", body = crate::error::ErrorBody),
        (status = 415, description = "Body not declared JSON", body = crate::error::ErrorBody),
        (status = 404, description = "No such SKU", body = crate::error::ErrorBody),
        (status = 503, description = "The database is unavailable", body = crate::error::ErrorBody),
    ))]
pub async fn update_sku(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    Path(raw): Path<String>,
    body: Bytes,
) -> Result<impl IntoResponse, AppError> {
    authorize(state.admin_token.as_deref(), &headers, "/api/skus/{sku_id}")?;
    let id = parse_id(&raw)?;
    let input: SkuInput = json_body(&headers, &body)?;
    input
        .validate()
        .map_err(|e| AppError::BadRequest(e.to_string()))?;
    if input.id.is_some_and(|body_id| body_id != id) {
        return Err(AppError::BadRequest(
            "id in the body differs from the path".into(),
        ));
    }
    let sku = state.skus.update(id, input).await?;
    Ok(Json(sku))
}

/// Deletes a SKU.
#[utoipa::path(delete, path = "/api/skus/{skuId}",
    params(("skuId" = i64, Path, minimum = 1)),
    responses(
        (status = 200, description = "Deleted", body = Object),
        (status = 400, description = "Bad id", body = crate::error::ErrorBody),
        (status = 401, description = "Missing bearer token", body = crate::error::ErrorBody),
        (status = 403, description = "Wrong bearer token", body = crate::error::ErrorBody),
        (status = 404, description = "No such SKU", body = crate::error::ErrorBody),
        (status = 503, description = "The database is unavailable", body = crate::error::ErrorBody),
    ))]
pub async fn delete_sku(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    Path(raw): Path<String>,
) -> Result<impl IntoResponse, AppError> {
    authorize(state.admin_token.as_deref(), &headers, "/api/skus/{sku_id}")?;
    let id = parse_id(&raw)?;
    state.skus.delete(id).await?;
    Ok(Json(json!({ "deleted": id })))
}
