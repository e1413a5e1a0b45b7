//! The change outbox's write side: every SKU write in one transaction with
//! its entry (`write_recorded`, re-recording a late commit), single entries
//! (`record`, kind `r` for rows written behind the outbox's back) and a
//! resource's many (`record_many`, multi-row `INSERT`s); and the outbox's
//! name as capture triggers write it (`outbox_for_triggers`).

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use capture::{q, NOTIFY_CHANNEL};
use sqlx::Row;

use super::capture;
use super::error::err;
use crate::source::StoreError;
use crate::sql::limits::Within;
use crate::sql::{Backend, Database, SKU_RESOURCE};

impl Database {
    /// Runs `write` and records `(SKU_RESOURCE, id, kind)` in the outbox
    /// in one transaction, whether or not capture triggers record it too; returns the rows `write` affected (nothing is
    /// recorded, and the transaction rolls back, when that is zero). A
    /// transaction that took longer than `rerecord_after` between taking
    /// its outbox sequence number and committing records the change again
    /// in a short transaction of its own, so a follower that gave that
    /// number up as a gap (see `crate::feed::outbox`) still sees it.
    pub(super) async fn write_recorded<'q>(
        &self,
        write: sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments<'q>>,
        op: &'static str,
        id: i64,
        kind: &'static str,
        before_commit: impl FnOnce() + Send,
    ) -> Result<u64, StoreError> {
        // Recorded here even when the table's triggers record it too
        // (captured): a trigger a DBA dropped is found only at the next
        // check, and a write in between must still reach every instance.
        // The second entry is harmless (a create learned twice).
        let mut tx = self
            .pool
            .begin()
            .within(&self.limit, "begin")
            .await
            .map_err(err(op))?;
        let affected = write
            .execute(&mut *tx)
            .within(&self.limit, op)
            .await
            .map_err(err(op))?
            .rows_affected();
        if affected == 0 {
            tx.rollback().await.map_err(err(op))?;
            return Ok(0);
        }
        self.after_row.pass(id).await;
        let recorded = Instant::now();
        self.record_in(&mut tx, SKU_RESOURCE, &id.to_string(), kind)
            .await?;
        before_commit();
        self.before_commit.pass(id).await;
        tx.commit()
            .within(&self.limit, "commit")
            .await
            .map_err(err(op))?;
        if recorded.elapsed() > self.rerecord_after {
            tracing::warn!(
                id,
                took_ms = recorded.elapsed().as_millis() as u64,
                "a write committed late; recording its change again"
            );
            self.counters.rerecorded.fetch_add(1, Ordering::Relaxed);
            // The row committed: the write succeeded whatever happens here.
            // The entry is retried until it lands (the followers may have
            // given the first number up).
            if let Err(e) = self.record(&id.to_string(), kind).await {
                tracing::warn!(id, error = %e, "re-recording a late write failed; retrying in the background");
                let store = self.clone();
                self.background.track(async move {
                    let mut backoff = Duration::from_millis(100);
                    while store.record(&id.to_string(), kind).await.is_err() {
                        tokio::time::sleep(backoff).await;
                        backoff = (backoff * 2).min(Duration::from_secs(5));
                    }
                });
            }
        }
        Ok(affected)
    }

    /// One outbox entry inside `tx`.
    pub(super) async fn record_in(
        &self,
        tx: &mut sqlx::Transaction<'_, sqlx::Any>,
        resource: &str,
        key: &str,
        kind: &'static str,
    ) -> Result<(), StoreError> {
        self.refuse_without_outbox()?;
        // PostgreSQL: the same statement notifies the listeners (on
        // commit; see `crate::feed::outbox`'s listener), no extra round trip.
        let q = if self.backend == Backend::Postgres {
            format!(
                "INSERT INTO bloomgate_changes (resource, item_key, kind, origin, at) \
                 SELECT {}, {} FROM (SELECT pg_notify('{NOTIFY_CHANNEL}', '')) AS bell",
                self.phs(1, 4),
                self.now_ms_sql()
            )
        } else {
            format!(
                "INSERT INTO bloomgate_changes (resource, item_key, kind, origin, at) VALUES ({}, {})",
                self.phs(1, 4),
                self.now_ms_sql()
            )
        };
        sqlx::query(&q)
            .bind(resource.to_string())
            .bind(key.to_string())
            .bind(kind.to_string())
            .bind(self.origin.to_string())
            .execute(&mut **tx)
            .within(&self.limit, "record change")
            .await
            .map_err(err("record change"))?;
        Ok(())
    }

    /// One outbox entry in a transaction of its own: `kind` `r` asks
    /// every instance to rebuild its filter (rows were written that no
    /// entry names, as `bloomgate seed` does).
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn record(&self, key: &str, kind: &'static str) -> Result<(), StoreError> {
        let mut tx = self
            .pool
            .begin()
            .within(&self.limit, "begin")
            .await
            .map_err(err("record change"))?;
        self.record_in(&mut tx, SKU_RESOURCE, key, kind).await?;
        tx.commit()
            .within(&self.limit, "commit")
            .await
            .map_err(err("record change"))?;
        Ok(())
    }

    /// Entries `(resource, key, kind)` for every key, in one statement
    /// (a resource's `keys` and `invalidate` calls). One slower than half
    /// of `sql.outbox_gap_ms` records them again, as a late write does
    /// (retried in the background until it lands), so no follower that
    /// gave their numbers up as gaps misses them.
    ///
    /// # Errors
    /// [`StoreError`]; some entries may have been recorded (recording
    /// them again is harmless).
    pub async fn record_many(
        &self,
        resource: &str,
        keys: &[String],
        kind: &'static str,
    ) -> Result<(), StoreError> {
        if keys.is_empty() {
            return Ok(());
        }
        self.refuse_without_outbox()?;
        let started = Instant::now();
        // SQLite takes at most 32,766 bound values in a statement.
        for chunk in keys.chunks(1000) {
            self.insert_entries(resource, chunk, kind).await?;
        }
        if started.elapsed() > self.rerecord_after {
            self.counters.rerecorded.fetch_add(1, Ordering::Relaxed);
            let (store, resource, keys) = (self.clone(), resource.to_owned(), keys.to_vec());
            self.background.track(async move {
                for chunk in keys.chunks(1000) {
                    let mut backoff = Duration::from_millis(100);
                    while let Err(e) = store.insert_entries(&resource, chunk, kind).await {
                        tracing::warn!(error = %e, "re-recording late outbox entries failed; retrying");
                        tokio::time::sleep(backoff).await;
                        backoff = (backoff * 2).min(Duration::from_secs(5));
                    }
                }
            });
        }
        Ok(())
    }

    /// One multi-row `INSERT` of outbox entries (atomic by itself).
    async fn insert_entries(
        &self,
        resource: &str,
        keys: &[String],
        kind: &'static str,
    ) -> Result<(), StoreError> {
        let rows: Vec<String> = (0..keys.len())
            .map(|i| format!("({}, {})", self.phs(1 + 4 * i, 4), self.now_ms_sql()))
            .collect();
        let q = format!(
            "INSERT INTO bloomgate_changes (resource, item_key, kind, origin, at) VALUES {}",
            rows.join(", ")
        );
        let mut query = sqlx::query(&q);
        for key in keys {
            query = query
                .bind(resource.to_owned())
                .bind(key.clone())
                .bind(kind.to_string())
                .bind(self.origin.to_string());
        }
        query
            .execute(&self.pool)
            .within(&self.limit, "record changes")
            .await
            .map_err(err("record changes"))?;
        if self.backend == Backend::Postgres {
            // Only a doorbell: a lost one costs a poll interval.
            let _ = sqlx::query(&format!("SELECT 1 FROM pg_notify('{NOTIFY_CHANNEL}', '')"))
                .execute(&self.pool)
                .within(&self.limit, "notify")
                .await;
        }
        Ok(())
    }

    /// The outbox table as triggers name it: schema-qualified on
    /// PostgreSQL (a writer's `search_path` need not find it; the
    /// function's is pinned).
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn outbox_for_triggers(&self) -> Result<String, StoreError> {
        if self.backend != Backend::Postgres {
            return Ok("bloomgate_changes".into());
        }
        let row = sqlx::query("SELECT CAST(current_schema() AS TEXT)")
            .fetch_one(&self.pool)
            .within(&self.bg_limit, "capture schema")
            .await
            .map_err(err("capture schema"))?;
        let schema: String = row.try_get(0).map_err(err("capture schema"))?;
        // Written into the function's (quoted) body: a plain identifier only.
        if !crate::config::resources::is_identifier(&schema) {
            let why = format!("the current schema {:?} is not a plain identifier (letters, digits, _): the capture function names it in its body; connect with a search_path whose first schema is one", crate::text::clip(&schema));
            return Err(StoreError::new("capture schema", why));
        }
        Ok(format!("{}.bloomgate_changes", q(self.backend, &schema)))
    }
}
