//! The late set: sequence numbers given up as gaps, kept until the outbox
//! trims past them (a transaction may commit any of them later).
//!
//! Up to a limit ([`MAX_LATE`] runs) they are kept exactly, as runs of
//! numbers (a long transaction's rows, a jump past `MAX_GAPS`, the numbers
//! missing before a start position): a 100,000-row transaction costs one
//! run. Each run is looked up every [`super::LATE_EVERY`], and an entry
//! found is applied and recorded again.
//!
//! Past the limit the oldest runs are not dropped: they move to *spans*,
//! watched by their count of entries, every [`SPAN_EVERY`]. A span's
//! count is known without asking: a run moved there is unseen numbers
//! only, and the numbers between it and the span below (which it then
//! extends) were all seen, unless one of them is an open gap or a run
//! (then it starts a span of its own). Spans past [`MAX_SPANS`] are
//! merged two at a time, the merged count read in the same statement
//! that checks both. A count that grew means a late commit somewhere in
//! the span: which entry is not known, so every filter is rebuilt (its
//! scan sees the row) and a rebuild entry is recorded for instances that
//! load an older filter. Both kinds are forgotten only once the outbox
//! trims past them (its entries older than `sql.outbox_retention_secs`
//! are gone then). Counting a span costs the database a range count of
//! the outbox's index: the whole retained outbox at worst (Galera's
//! `auto_increment_increment` leaves numbers no writer ever takes, so
//! spans are routine there).

use std::sync::atomic::Ordering;
use std::time::Duration;

mod set;

pub(super) use set::Late;
use set::MAX_SPANS;

use super::{Entry, Outbox};
use crate::sql::StoreError;
use crate::sync::lock;

impl Outbox {
    /// At most `runs` runs of given-up numbers are looked up one by one;
    /// more are watched as spans, counted every `span_every` (a test
    /// lowers both).
    #[doc(hidden)]
    pub fn set_late_limits(&self, runs: usize, span_every: Duration) {
        let mut f = lock(&self.follow);
        f.late.limit = runs.max(1);
        f.late.span_every = span_every;
    }

    /// Counts the spans of given-up numbers, merging those past
    /// [`MAX_SPANS`] first, each merge checking both in the statement
    /// that counts them together. A count that grew is a late commit of
    /// unknown key: every filter is rebuilt, and a rebuild entry recorded
    /// for every table (an instance that loads a filter made before it
    /// replays the entry and rebuilds too).
    pub(super) async fn check_spans(&self) -> Result<(), StoreError> {
        {
            let mut f = lock(&self.follow);
            if !f.late.spans_due() && !f.late.growth_owed {
                return Ok(());
            }
        }
        let mut grew = false;
        let counted = self.count_spans(&mut grew).await;
        if grew {
            // Here first (it cannot fail), whatever the counting met after
            // the growth; then the entries, owed until they are recorded.
            tracing::error!(
                "a change committed among numbers given up long ago (more runs than are looked up one by one): rebuilding every filter"
            );
            self.counters.late_rebuilds.fetch_add(1, Ordering::Relaxed);
            self.rebuild_all();
            lock(&self.follow).late.growth_owed = true;
        }
        if lock(&self.follow).late.growth_owed {
            for (name, _) in self.tables() {
                self.store
                    .record_many(
                        &name,
                        &[crate::wire::rebuild_request_key()],
                        crate::wire::kind::REBUILD,
                    )
                    .await?;
            }
            lock(&self.follow).late.growth_owed = false;
        }
        counted
    }

    /// Counts the spans (see [`Outbox::check_spans`]); `grew` is set as
    /// soon as a count shows growth, before the count is recorded.
    async fn count_spans(&self, grew: &mut bool) -> Result<(), StoreError> {
        for _ in 0..4 * MAX_SPANS {
            let Some((a, b)) = lock(&self.follow).late.merge_due() else {
                break;
            };
            let [in_a, in_b, all] = self
                .count_within(&[(a.0, a.1.hi), (b.0, b.1.hi), (a.0, b.1.hi)])
                .await?;
            *grew |= a.1.seen.is_some_and(|n| in_a > n) || b.1.seen.is_some_and(|n| in_b > n);
            lock(&self.follow).late.merged(a, b, all);
        }
        let spans = lock(&self.follow).late.spans();
        for (lo, span) in spans {
            let [n] = self.count_within(&[(lo, span.hi)]).await?;
            *grew |= span.seen.is_some_and(|seen| n > seen);
            lock(&self.follow).late.counted(lo, span, n);
        }
        Ok(())
    }

    /// The entries in each inclusive range, in one statement (one
    /// snapshot of the table).
    async fn count_within<const N: usize>(
        &self,
        ranges: &[(i64, i64); N],
    ) -> Result<[i64; N], StoreError> {
        self.store.outbox_count_within(ranges).await
    }

    /// The entries visible now within the inclusive `ranges`, a few
    /// hundred ranges per statement.
    pub(super) async fn within_ranges(
        &self,
        ranges: &[(i64, i64)],
    ) -> Result<Vec<Entry>, StoreError> {
        self.store.outbox_within(ranges).await
    }
}
