//! The SKU table's key API, as every resource has it (the SKUs are the
//! default resource `skus`): `keys` and `invalidate` for rows other
//! programs wrote (recorded in the outbox under `skus`, so every instance
//! applies them as it applies the service's own SKU writes), `exists` (the
//! filter alone) and `batch` (many ids through the funnel, one `IN (…)`).

use std::sync::atomic::Ordering;

use crate::error::AppError;
use crate::model::Sku;
use crate::reader::BatchRow;
use crate::state::AppState;
use crate::store::SKU_RESOURCE;

pub mod write;

/// Most ids in one call (a resource's `max_batch_keys` default).
pub const MAX_BATCH_KEYS: usize = 1000;

fn check_len(n: usize) -> Result<(), AppError> {
    if n > MAX_BATCH_KEYS {
        return Err(AppError::BadRequest(format!(
            "at most {MAX_BATCH_KEYS} keys per call, got {n}"
        )));
    }
    Ok(())
}

/// The filter's answer for each id: false only where this instance can
/// vouch for its "no" (in strict mode, the shared filter agrees).
///
/// # Errors
/// [`AppError::BadRequest`] over the limit.
pub async fn exists(state: &AppState, ids: &[i64]) -> Result<Vec<bool>, AppError> {
    check_len(ids.len())?;
    state
        .sku_calls
        .exists_checked
        .fetch_add(ids.len() as u64, Ordering::Relaxed);
    Ok(state
        .reader
        .verdicts(ids)
        .await
        .into_iter()
        .map(|v| v != crate::gate::Verdict::Reject)
        .collect())
}

/// The SKUs of `ids`, in their order (`None`: no such SKU).
///
/// # Errors
/// [`AppError::BadRequest`] over the limit; [`AppError::Overloaded`];
/// [`AppError::Unavailable`] when SQL fails.
pub async fn batch(state: &AppState, ids: &[i64]) -> Result<Vec<BatchRow<Sku>>, AppError> {
    check_len(ids.len())?;
    state
        .sku_calls
        .batch_keys
        .fetch_add(ids.len() as u64, Ordering::Relaxed);
    let store = &state.reader.store;
    state
        .reader
        .batch(ids, |wanted| async move {
            let found = store.get_many(&wanted).await?;
            Ok(found.into_iter().map(|s| (s.id, s)).collect())
        })
        .await
}

/// SKUs another program committed: into this instance's filter, out of
/// Redis and L1 (a "not found" cached before the row), recorded in the
/// outbox for the others, into the shared filter in strict mode; answers
/// after all of that.
///
/// # Errors
/// [`AppError::BadRequest`] over the limit; [`AppError::Unavailable`]
/// when Redis did not confirm the deletes, the outbox could not be
/// written or the shared filter did not take them (call again).
pub async fn add_keys(state: &AppState, ids: &[i64]) -> Result<(), AppError> {
    check_len(ids.len())?;
    for &id in ids {
        state.reader.gate.insert(id);
    }
    if !state.reader.invalidate_many(ids).await {
        return Err(AppError::Unavailable(
            "redis did not confirm dropping the keys' cached \"not found\"; call again".into(),
        ));
    }
    record(state, ids, crate::wire::kind::CREATED).await?;
    // As a create does: an adoption that began after the insert above and
    // replayed before the entry committed would lack them.
    for &id in ids {
        state.reader.gate.ensure(id);
    }
    if let Some(shared) = &state.reader.shared {
        shared.insert_many(ids).await.map_err(|e| {
            tracing::warn!(error = %e, "adding SKU ids to the shared filter failed");
            AppError::Unavailable(
                "the shared filter did not take the keys (they are recorded and reach every instance through the outbox); call again".into(),
            )
        })?;
    }
    state
        .sku_calls
        .keys_added
        .fetch_add(ids.len() as u64, Ordering::Relaxed);
    Ok(())
}

/// SKUs another program updated or deleted: out of L1 and Redis here
/// before it answers, and on every instance through the outbox.
///
/// # Errors
/// [`AppError::BadRequest`] over the limit; [`AppError::Unavailable`]
/// when the outbox could not be written or Redis did not confirm the
/// deletes (call again).
pub async fn invalidate(state: &AppState, ids: &[i64]) -> Result<(), AppError> {
    check_len(ids.len())?;
    let recorded = record(state, ids, crate::wire::kind::UPDATED).await;
    let confirmed = state.reader.invalidate_many(ids).await;
    recorded?;
    if !confirmed {
        return Err(AppError::Unavailable(
            "redis did not confirm dropping the keys; call again".into(),
        ));
    }
    state
        .sku_calls
        .invalidated
        .fetch_add(ids.len() as u64, Ordering::Relaxed);
    Ok(())
}

/// SKUs another program deleted: [`invalidate`], counted toward
/// `cache.bloom_rebuild_after_deletes` as the service's own deletes are
/// (the instance that crosses it rebuilds).
///
/// # Errors
/// As [`invalidate`].
pub async fn deleted(state: &AppState, ids: &[i64]) -> Result<(), AppError> {
    invalidate(state, ids).await?;
    let mut due = false;
    for _ in ids {
        due |= state.reader.gate.note_delete(state.rebuild_after_deletes);
    }
    if due {
        drop(state.reader.gate.request_rebuild());
    }
    Ok(())
}

async fn record(state: &AppState, ids: &[i64], kind: &'static str) -> Result<(), AppError> {
    let spelled: Vec<String> = ids.iter().map(i64::to_string).collect();
    state
        .reader
        .store
        .record_many(SKU_RESOURCE, &spelled, kind)
        .await
        .map_err(|e| {
            tracing::warn!(error = %e, "recording SKU keys in the outbox failed");
            AppError::Unavailable(e.to_string())
        })?;
    // The outbox holds the entries: ring the others without waiting.
    if let Some(log) = state.changes.clone() {
        tokio::spawn(async move { log.ring().await });
    }
    Ok(())
}
