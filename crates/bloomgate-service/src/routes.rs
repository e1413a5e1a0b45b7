//! HTTP routes.

use std::sync::atomic::Ordering;
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::header::CONTENT_TYPE;
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::routing::{get, post, put};
use axum::{Json, Router};
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::json;

use crate::error::AppError;
use crate::gate::RebuildError;
use crate::model::{now_secs, SkuInput};
use crate::reader::Lookup;
use crate::state::AppState;

/// The service's routes over `state`.
pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/api/seckill/{sku_id}", get(sku_detail))
        .route("/api/cache/warm", post(warm))
        .route("/api/cache/stats", get(stats))
        .route("/api/skus", post(create_sku))
        .route("/api/skus/{sku_id}", put(update_sku).delete(delete_sku))
        .route("/api/ping", get(ping))
        .route("/healthz", get(ping))
        .fallback(|| async { AppError::NotFound("no such route".into()) })
        .with_state(state)
}

/// The most characters of a client's input an error message quotes.
pub const MAX_QUOTED: usize = 64;

/// `s`, cut to [`MAX_QUOTED`] characters with `…` when longer.
fn clip(s: &str) -> String {
    match s.char_indices().nth(MAX_QUOTED) {
        Some((at, _)) => format!("{}…", &s[..at]),
        None => s.to_string(),
    }
}

/// Clips every quoted span (between backticks or double quotes) of a
/// parser's message, which may echo the client's input.
fn clip_quoted(message: &str) -> String {
    let mut out = String::with_capacity(message.len().min(512));
    let mut rest = message;
    while let Some(open) = rest.find(['`', '"']) {
        let quote = &rest[open..=open];
        out.push_str(&rest[..=open]);
        let after = &rest[open + 1..];
        let Some(close) = after.find(quote) else {
            out.push_str(&clip(after));
            return out;
        };
        out.push_str(&clip(&after[..close]));
        out.push_str(quote);
        rest = &after[close + 1..];
    }
    out.push_str(rest);
    out
}

/// Parses a path id: a positive integer that fits in i64.
fn parse_id(raw: &str) -> Result<i64, AppError> {
    match raw.parse::<i64>() {
        Ok(id) if id > 0 => Ok(id),
        _ => Err(AppError::BadRequest(format!(
            "skuId must be a positive integer that fits in 64 bits, got {:?}",
            clip(raw)
        ))),
    }
}

/// Parses a JSON body ourselves so that every failure is a JSON 400.
fn parse_body<T: DeserializeOwned>(body: &Bytes) -> Result<T, AppError> {
    serde_json::from_slice(body)
        .map_err(|e| AppError::BadRequest(clip_quoted(&format!("invalid JSON body: {e}"))))
}

/// Admin calls need `Authorization: Bearer <token>` when a token is
/// configured. Without one, the server only starts on loopback (see
/// `Config::validate`), so local callers are accepted.
fn authorize(state: &AppState, headers: &HeaderMap) -> Result<(), AppError> {
    let Some(token) = state.admin_token.as_deref() else {
        return Ok(());
    };
    let given = headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .ok_or(AppError::Unauthorized)?;
    if constant_time_eq(given.as_bytes(), token.as_bytes()) {
        Ok(())
    } else {
        Err(AppError::Forbidden)
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

async fn ping() -> impl IntoResponse {
    Json(json!({ "ok": true }))
}

async fn sku_detail(
    State(state): State<AppState>,
    Path(raw): Path<String>,
) -> Result<impl IntoResponse, AppError> {
    let id = parse_id(&raw)?;
    match state.reader.lookup(id).await? {
        Lookup::Found(cached, _) => Ok(([(CONTENT_TYPE, "application/json")], cached.json.clone())),
        Lookup::Missing(_) => Err(AppError::NotFound(format!("sku {id} not found"))),
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct WarmRequest {
    #[serde(default = "default_warm_limit")]
    limit: u64,
    #[serde(default)]
    rebuild_bloom: bool,
}

const fn default_warm_limit() -> u64 {
    1000
}

/// The largest `limit` a warm call accepts.
pub const MAX_WARM_LIMIT: u64 = 1_000_000;

async fn warm(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<impl IntoResponse, AppError> {
    authorize(&state, &headers)?;
    let req: WarmRequest = if body.is_empty() {
        parse_body(&Bytes::from_static(b"{}"))?
    } else {
        parse_body(&body)?
    };
    if req.limit > MAX_WARM_LIMIT {
        return Err(AppError::BadRequest(format!(
            "limit must be at most {MAX_WARM_LIMIT}"
        )));
    }
    let started = Instant::now();
    let reader = &state.reader;
    // Registered first, so the rebuild's SQL scan starts after this call
    // arrived. The rebuild runs in the gate's worker: if this client goes
    // away, it still completes and is published.
    let ticket = req.rebuild_bloom.then(|| reader.gate.request_rebuild());
    let ids = reader.store.first_ids(req.limit).await?;
    let redis_down = |e: redis::RedisError| AppError::Unavailable(format!("redis: {e}"));
    let start = reader.warm_start(&ids).await.map_err(redis_down)?;
    let skus = reader.store.first(req.limit).await?;
    let redis_written = reader.warm(start, &skus).await.map_err(redis_down)?;
    let rebuild = match ticket {
        Some(t) => Some(t.wait().await.map_err(|e| match e {
            RebuildError::Store(e) => AppError::Unavailable(e.to_string()),
            other => AppError::Unavailable(other.to_string()),
        })?),
        None => None,
    };
    Ok(Json(json!({
        "warmed": skus.len(),
        "redis_written": redis_written,
        "rebuild_bloom": rebuild,
        "added": rebuild.map_or(0, |r| r.added),
        "duration_ms": started.elapsed().as_millis() as u64,
    })))
}

async fn stats(State(state): State<AppState>) -> Result<impl IntoResponse, AppError> {
    let r = &state.reader;
    let l1 = &r.l1_counters;
    let sql = &r.store.counters;
    let redis = match &r.redis {
        Some(redis) => {
            let c = &redis.counters;
            json!({
                "enabled": true,
                "hits": c.hits.load(Ordering::Relaxed),
                "nil_hits": c.nil_hits.load(Ordering::Relaxed),
                "misses": c.misses.load(Ordering::Relaxed),
                "fills_refused": c.fills_refused.load(Ordering::Relaxed),
                "errors": c.errors.load(Ordering::Relaxed),
                "keys": redis.key_count().await.ok(),
            })
        }
        None => json!({ "enabled": false }),
    };
    Ok(Json(json!({
        "bloom": r.gate.stats(),
        "l1": {
            "hits": l1.hits.get(),
            "negative_hits": l1.negative_hits.get(),
            "misses": l1.misses.get(),
            "stale_skipped": l1.stale_skipped.get(),
            "entries": r.l1.entry_count(),
        },
        "redis": redis,
        "sql": {
            "queries": sql.queries.load(Ordering::Relaxed),
            "found": sql.found.load(Ordering::Relaxed),
            "missing": sql.missing.load(Ordering::Relaxed),
        },
    })))
}

async fn create_sku(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<impl IntoResponse, AppError> {
    authorize(&state, &headers)?;
    let input: SkuInput = parse_body(&body)?;
    input.validate().map_err(AppError::BadRequest)?;
    let store = &state.reader.store;
    let explicit = input.id;
    let mut sku = None;
    for _ in 0..5 {
        let id = match explicit {
            Some(id) => id,
            None => store.next_id().await?.ok_or_else(|| {
                AppError::Conflict(format!(
                    "no automatic id is left: the largest id in use is {}; give an explicit id",
                    i64::MAX
                ))
            })?,
        };
        let candidate = input.clone().into_sku(id, now_secs());
        if store.insert(&candidate).await? {
            sku = Some(candidate);
            break;
        }
        if explicit.is_some() {
            return Err(AppError::Conflict(format!("sku {id} already exists")));
        }
    }
    let sku = sku.ok_or_else(|| AppError::Conflict("could not allocate an id; retry".into()))?;
    // The id enters the filter before the response, and any cached
    // "not found" for it (in Redis or L1, or being loaded) is dropped, so
    // the next read loads it from SQL.
    state.reader.gate.insert(sku.id);
    state.reader.invalidate(sku.id).await;
    Ok((StatusCode::CREATED, Json(sku)))
}

async fn update_sku(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(raw): Path<String>,
    body: Bytes,
) -> Result<impl IntoResponse, AppError> {
    authorize(&state, &headers)?;
    let id = parse_id(&raw)?;
    let input: SkuInput = parse_body(&body)?;
    input.validate().map_err(AppError::BadRequest)?;
    if input.id.is_some_and(|body_id| body_id != id) {
        return Err(AppError::BadRequest(
            "id in the body differs from the path".into(),
        ));
    }
    let sku = input.into_sku(id, now_secs());
    if !state.reader.store.update(&sku).await? {
        return Err(AppError::NotFound(format!("sku {id} not found")));
    }
    state.reader.invalidate(id).await;
    Ok(Json(sku))
}

async fn delete_sku(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(raw): Path<String>,
) -> Result<impl IntoResponse, AppError> {
    authorize(&state, &headers)?;
    let id = parse_id(&raw)?;
    if !state.reader.store.delete(id).await? {
        return Err(AppError::NotFound(format!("sku {id} not found")));
    }
    state.reader.invalidate(id).await;
    // The plain filter cannot forget the id; it keeps answering "maybe",
    // which costs one cached lookup. Enough deletes trigger a rebuild.
    // The gate's worker runs it; nobody waits for the answer.
    if state.reader.gate.note_delete(state.rebuild_after_deletes) {
        drop(state.reader.gate.request_rebuild());
    }
    Ok(Json(json!({ "deleted": id })))
}
