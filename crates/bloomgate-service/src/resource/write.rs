//! The default resource's owned writes, one place the handlers call: a
//! SKU create, update or delete commits with its outbox entry (`sql`), then, in this order,
//! the filter (a create's id enters it inside the transaction), the shared
//! filter (`strict`), the caches (Redis `DEL`, L1 through the shards), the
//! doorbell (the other instances' outbox followers read the entry now),
//! and for a create `Shield::ensure` (an adopted filter swapped in
//! meanwhile). It knows nothing of HTTP beyond `AppError`.

use super::Resource;
use crate::error::AppError;
use crate::model::{now_secs, Sku, SkuInput};
use crate::sql::Database;

impl Resource<Database> {
    /// Creates a SKU from a validated `input` (the next free id when it has
    /// none; a few tries when another create takes that id first).
    ///
    /// # Errors
    /// [`AppError::Conflict`] for a taken id or no id left; store failures.
    pub async fn create(&self, input: SkuInput) -> Result<Sku, AppError> {
        let store = &self.reader.store;
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
            // The id enters the filter inside the transaction, before the
            // commit makes the row visible anywhere.
            let shield = &self.reader.shield;
            if store
                .insert_then(&candidate, || shield.insert(candidate.id))
                .await?
            {
                sku = Some(candidate);
                break;
            }
            if explicit.is_some() {
                return Err(AppError::Conflict(format!("sku {id} already exists")));
            }
        }
        let sku =
            sku.ok_or_else(|| AppError::Conflict("could not allocate an id; retry".into()))?;
        // Any cached "not found" for it (in Redis or L1, or being loaded) is
        // dropped, so the next read loads it from SQL.
        if let Some(shared) = self.reader.shared() {
            // Every instance must see it in Redis before the create answers:
            // a few tries within the request (each under redis_timeout_ms).
            let mut tries = 0;
            while let Err(e) = shared.insert_many(&[sku.id]).await {
                tries += 1;
                if tries == 3 {
                    tracing::warn!(id = sku.id, error = %e, "the shared filter did not take a created SKU; other instances learn it through the outbox");
                    break;
                }
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
        }
        self.reader.invalidate(&sku.id).await;
        if let Some(log) = &self.changes {
            log.ring_created(sku.id).await;
        }
        // Again after the commit (a no-op unless the filter was swapped for
        // another instance's in between): an adopting instance replays the
        // outbox as its read found it, so a create committed after that read
        // must enter the adopted filter here.
        self.reader.shield.ensure(sku.id);
        Ok(sku)
    }

    /// Replaces SKU `id`'s fields with a validated `input`.
    ///
    /// # Errors
    /// [`AppError::NotFound`]; store failures.
    pub async fn update(&self, id: i64, input: SkuInput) -> Result<Sku, AppError> {
        let sku = input.into_sku(id, now_secs());
        if !self.reader.store.update(&sku).await? {
            return Err(AppError::NotFound(format!("sku {id} not found")));
        }
        self.reader.invalidate(&id).await;
        self.ring_others().await;
        Ok(sku)
    }

    /// Deletes SKU `id`; enough deletes since the last build ask for a rebuild
    /// (the filter cannot forget an id).
    ///
    /// # Errors
    /// [`AppError::NotFound`]; store failures.
    pub async fn delete(&self, id: i64) -> Result<(), AppError> {
        if !self.reader.store.delete(id).await? {
            return Err(AppError::NotFound(format!("sku {id} not found")));
        }
        self.reader.invalidate(&id).await;
        self.ring_others().await;
        // The plain filter cannot forget the id; it keeps answering "maybe",
        // which costs one cached lookup. Enough deletes trigger a rebuild.
        // The shield's worker runs it; nobody waits for the answer.
        // Captured: the trigger's entry counts it, on every instance.
        if !self
            .deletes_captured
            .load(std::sync::atomic::Ordering::Relaxed)
            && self.reader.shield.note_delete(self.rebuild_after_deletes)
        {
            drop(self.reader.shield.request_rebuild());
        }
        Ok(())
    }

    /// Rings the other instances' outbox followers: a write committed.
    async fn ring_others(&self) {
        if let Some(log) = &self.changes {
            log.ring().await;
        }
    }
}
