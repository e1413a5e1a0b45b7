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

use std::sync::atomic::Ordering;

use crate::feed::outbox::Outbox;
use crate::sql::StoreError;

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
    /// Deletes entries older than the retention, when this instance takes
    /// the lease, and notes the largest deleted seq.
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn trim(&self) -> Result<Trimmed, StoreError> {
        let hold = super::TRIM_EVERY.min(self.retention) * 3 / 4;
        if !self.store.outbox_take_trim_lease(hold).await? {
            return Ok(Trimmed::Elsewhere);
        }
        let age = self.retention.as_millis() as i64;
        let (through, oldest) = self.store.outbox_trim_bounds(age).await?;
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
        self.store.outbox_mark_trimmed(through).await?;
        let (mut deleted, mut statements) = (0, 0);
        let mut after = oldest.saturating_sub(1);
        while after < through {
            let upto = after.saturating_add(TRIM_BATCH).min(through);
            deleted += self.store.outbox_delete(after, upto).await?;
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
