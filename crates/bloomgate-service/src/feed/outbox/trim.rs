//! Trimming the outbox: entries older than `sql.outbox_retention_secs`
//! are deleted by one instance at a time, a bounded range per statement.
//!
//! **One instance.** Every instance's follower tries every minute (or
//! every retention, when shorter), but a trim first takes the lease row
//! `trim_lease` in `bloomgate_outbox_state`: one `UPDATE` that succeeds
//! only when the lease has expired, on the database's clock. The lease
//! lasts three quarters of the interval, so the instance that took it
//! takes it again at its next try and the others find it held: a fleet
//! trims once per interval, not once per instance.
//!
//! **Bounded statements.** The entries go in ranges of [`TRIM_BATCH`]
//! sequence numbers, one `DELETE` each under the background timeout, so
//! a backlog of millions (a retention shortened, a trim that failed for
//! days) is a series of short statements rather than one that times out
//! and holds its locks. The mark (`trimmed_through`) is raised first, as
//! before: a follower that reads it and then finds entries gone has
//! rebuilt already, never the reverse.

use super::*;

/// Sequence numbers deleted per statement.
pub const TRIM_BATCH: i64 = 10_000;

/// What one trim did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trimmed {
    /// Another instance holds the lease: nothing done.
    Elsewhere,
    /// Trimmed here: entries deleted, in `statements` deletes.
    Here {
        /// Entries deleted.
        deleted: u64,
        /// `DELETE` statements run.
        statements: u64,
    },
}

impl Outbox {
    /// Takes the trim lease for `hold` when it has expired; whether it was
    /// taken. Without its row (the outbox of an earlier release, not yet
    /// migrated), every instance trims, as that release did.
    async fn take_trim_lease(&self, hold: Duration) -> Result<bool, StoreError> {
        let now = self.store.now_ms_sql();
        let taken = sqlx::query(&format!(
            "UPDATE bloomgate_outbox_state SET value = {now} + {} \
             WHERE name = 'trim_lease' AND value < {now}",
            self.store.ph(1)
        ))
        .bind(hold.as_millis() as i64)
        .execute(&self.store.pool)
        .within(&self.store.limit, self.bg("outbox trim"))
        .await
        .map_err(err("outbox trim"))?
        .rows_affected();
        if taken > 0 {
            return Ok(true);
        }
        let row = sqlx::query("SELECT 1 FROM bloomgate_outbox_state WHERE name = 'trim_lease'")
            .fetch_optional(&self.store.pool)
            .within(&self.store.limit, self.bg("outbox trim"))
            .await
            .map_err(err("outbox trim"))?;
        Ok(row.is_none())
    }

    /// Deletes entries older than the retention, when this instance takes
    /// the lease, and notes the largest deleted seq.
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn trim(&self) -> Result<Trimmed, StoreError> {
        let hold = super::TRIM_EVERY.min(self.retention) * 3 / 4;
        if !self.take_trim_lease(hold).await? {
            return Ok(Trimmed::Elsewhere);
        }
        let age = self.retention.as_millis() as i64;
        let ph = |n| self.store.ph(n);
        let row = sqlx::query(&format!(
            "SELECT COALESCE(MAX(seq), 0), (SELECT COALESCE(MIN(seq), 0) FROM bloomgate_changes) \
             FROM bloomgate_changes WHERE at < {} - {}",
            self.store.now_ms_sql(),
            ph(1)
        ))
        .bind(age)
        .fetch_one(&self.store.pool)
        .within(&self.store.limit, self.bg("outbox trim"))
        .await
        .map_err(err("outbox trim"))?;
        let through: i64 = row.try_get(0).map_err(err("outbox trim"))?;
        let oldest: i64 = row.try_get(1).map_err(err("outbox trim"))?;
        let nothing = Trimmed::Here {
            deleted: 0,
            statements: 0,
        };
        if through == 0 {
            return Ok(nothing);
        }
        // The newest entry always stays, so the sequence never restarts
        // below a follower's cursor (MySQL before 8.0 resets an empty
        // table's auto-increment at restart).
        let through = through.min(self.max_seq().await? - 1);
        if through <= 0 {
            return Ok(nothing);
        }
        sqlx::query(&format!(
            "UPDATE bloomgate_outbox_state SET value = {} WHERE name = 'trimmed_through' AND value < {}",
            ph(1),
            ph(2)
        ))
        .bind(through)
        .bind(through)
        .execute(&self.store.pool)
        .within(&self.store.limit, self.bg("outbox trim"))
        .await
        .map_err(err("outbox trim"))?;
        let (mut deleted, mut statements) = (0, 0);
        let mut after = oldest.saturating_sub(1);
        while after < through {
            let upto = after.saturating_add(TRIM_BATCH).min(through);
            deleted += sqlx::query(&format!(
                "DELETE FROM bloomgate_changes WHERE seq > {} AND seq <= {}",
                ph(1),
                ph(2)
            ))
            .bind(after)
            .bind(upto)
            .execute(&self.store.pool)
            .within(&self.store.limit, self.bg("outbox trim"))
            .await
            .map_err(err("outbox trim"))?
            .rows_affected();
            statements += 1;
            after = upto;
        }
        self.counters.trimmed.fetch_add(deleted, Ordering::Relaxed);
        Ok(Trimmed::Here {
            deleted,
            statements,
        })
    }
}
