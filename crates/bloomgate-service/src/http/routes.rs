//! HTTP routes: the seckill read, the operator endpoints, SKU writes.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::header::CONTENT_TYPE;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::IntoResponse;
use axum::Json;
use serde::Deserialize;
use serde_json::json;

use crate::error::AppError;
use crate::gate::RebuildError;
use crate::http::admin::authorize;
use crate::http::input::{json_body, parse_id};
use crate::metrics::Outcome;
use crate::model::{Sku, SkuInput};
use crate::reader::Lookup;
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
    let answer = state.reader.lookup(id).await;
    let outcome = answer.as_ref().map_or(Outcome::ERROR, Lookup::outcome);
    crate::http::telemetry::record_outcome(id, outcome.label());
    let res = match answer {
        Ok(answer) => sku_response(id, answer),
        Err(e) => e.into_response(),
    };
    outcome.note();
    Ok(res)
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

/// What [`sku_detail`] answers for the raw path segment `raw`, when it
/// can answer without waiting (a filter "no", an L1 hit): the edge sends
/// it at once, without the router (`crate::http::edge`, `EdgeLayer::fast_get`).
/// `None` sends the request the whole way: an id that does not parse (its
/// 400 is the handler's), and every read that goes on to Redis or SQL.
pub fn sku_detail_now(state: &AppState, raw: &str) -> Option<(axum::response::Response, Outcome)> {
    let id = crate::http::input::id_of(raw)?;
    let answer = state.reader.lookup_now(&id)?;
    let outcome = answer.outcome();
    crate::http::telemetry::record_outcome(id, outcome.label());
    Some((sku_response(id, answer), outcome))
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
    authorize(state.admin_token.as_deref(), &headers, "/api/cache/warm")?;
    let req = WarmRequest::parse(&headers, &body)?;
    let started = Instant::now();
    let reader = &state.reader;
    // Started before the warm, finished in a task of its own: if this
    // client goes away, the rebuild still completes, is shared with the
    // other instances and releases the lock.
    let rebuild = if req.rebuild_bloom {
        let r = start_rebuild(&state).await;
        Some(tokio::spawn(finish_rebuild(Arc::clone(&state), r)))
    } else {
        None
    };
    // A page at a time: lease its keys, read its rows, fill. Leases live
    // for `LEASE_MS`; taken all at once, the first pages' had expired
    // before a large warm's fills reached them, which then wrote nothing.
    // `warmed` counts the ids paged through (the limit), `rows` the rows read.
    let (mut warmed, mut rows, mut after) = (0u64, 0u64, 0i64);
    let mut outcome = crate::reader::WarmOutcome::default();
    while warmed < req.limit {
        let want = (req.limit - warmed).min(crate::reader::WARM_CHUNK as u64);
        let ids = reader.store.page_ids(after, want).await?;
        let Some(&last) = ids.last() else { break };
        let start = reader.warm_start(&ids, outcome.redis_error.is_none()).await;
        // Exactly the leased range: a row inserted into it meanwhile holds
        // no lease and fills L1 alone; one deleted is simply not there.
        let skus: Vec<(i64, Sku)> = reader
            .store
            .range(after, last)
            .await?
            .into_iter()
            .map(|s| (s.id, s))
            .collect();
        outcome.add(reader.warm(start, &skus).await);
        warmed += ids.len() as u64;
        rows += skus.len() as u64;
        after = last;
        if (ids.len() as u64) < want {
            break;
        }
    }
    let (report, epoch) = match rebuild {
        Some(task) => task
            .await
            .map_err(|e| AppError::Unavailable(format!("the rebuild stopped: {e}")))??,
        None => (None, None),
    };
    Ok(Json(json!({
        "warmed": rows,
        "redis_written": outcome.redis_written,
        "redis_error": outcome.redis_error,
        "rebuild_bloom": report,
        "added": report.map_or(0, |r| r.added),
        "epoch": epoch,
        "duration_ms": started.elapsed().as_millis() as u64,
    })))
}

/// A warm's rebuild, as it was started.
enum WarmRebuild {
    /// This instance rebuilds; with Redis it shares the result (the
    /// outbox watermark before the scan and the rebuild requests it
    /// covers).
    Build(crate::gate::RebuildTicket, Option<(i64, i64)>),
    /// Another instance holds the shared-rebuild lock: adopt its epoch,
    /// newer than this one.
    Adopt(u64),
}

async fn start_rebuild(state: &AppState) -> WarmRebuild {
    let gate = &state.reader.gate;
    let Some(log) = &state.changes else {
        return WarmRebuild::Build(gate.request_rebuild(), None);
    };
    match log.try_lead().await {
        Some(true) => {}
        // One SQL scan for every instance: the leader's.
        Some(false) => {
            log.counters.rebuilds_joined.fetch_add(1, Ordering::Relaxed);
            return WarmRebuild::Adopt(log.epoch());
        }
        // Redis is not answering: rebuild here; the others keep their
        // filters (complete through the outbox, stale only by deletes).
        None => return WarmRebuild::Build(gate.request_rebuild(), None),
    }
    // The position first, then the request: the scan starts after both,
    // so the ids created after the watermark are the only ones it may
    // miss, and the adopting instances replay exactly those.
    let watermark = state.outbox.watermark();
    let at = state
        .outbox
        .max_seq()
        .await
        .ok()
        .map(|covered| (watermark, covered));
    // The rebuild runs in the gate's worker: if this client goes away, it
    // still completes and is published.
    WarmRebuild::Build(gate.request_rebuild(), at)
}

async fn finish_rebuild(
    state: Arc<AppState>,
    rebuild: WarmRebuild,
) -> Result<(Option<crate::gate::RebuildReport>, Option<u64>), AppError> {
    match rebuild {
        WarmRebuild::Build(ticket, at) => {
            let report = ticket.wait().await;
            let mut epoch = None;
            if let Some(log) = &state.changes {
                match (&report, at) {
                    (Ok(_), Some(outbox_at)) => {
                        epoch = log.publish_built(&state.reader.gate, outbox_at).await.ok();
                    }
                    // Could not note the position, or the build failed:
                    // every instance rebuilds from SQL by itself.
                    _ => log.publish_rebuild().await,
                }
                log.release_lead().await;
            }
            let report = report.map_err(|e| match e {
                RebuildError::Store(e) => AppError::Unavailable(e.to_string()),
                other => AppError::Unavailable(other.to_string()),
            })?;
            Ok((Some(report), epoch))
        }
        WarmRebuild::Adopt(seen) => {
            let log = state.changes.as_ref();
            let epoch = match log {
                Some(log) => log.wait_epoch_after(seen).await,
                None => seen,
            };
            Ok((None, Some(epoch)))
        }
    }
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
    input.validate().map_err(AppError::BadRequest)?;
    let sku = crate::skus::write::create(&state, input).await?;
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
    input.validate().map_err(AppError::BadRequest)?;
    if input.id.is_some_and(|body_id| body_id != id) {
        return Err(AppError::BadRequest(
            "id in the body differs from the path".into(),
        ));
    }
    let sku = crate::skus::write::update(&state, id, input).await?;
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
    crate::skus::write::delete(&state, id).await?;
    Ok(Json(json!({ "deleted": id })))
}
