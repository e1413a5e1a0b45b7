//! The promise, checked while the service runs: a small, rate-limited
//! sample of the filter's "no" answers is looked up in the source, off
//! the request path (a task of its own, one at a time per table). A row
//! found there may be a create this instance has not applied yet (another
//! instance's or program's, in flight on the change feed): the audit waits
//! out the feed's bound (`sql.out_of_step_ms`, after which an instance
//! that has not read the outbox stops vouching, or the late check's 5 s
//! if longer, plus a second) and asks again, comparing keys as the
//! column does (the filter holds them folded that way, `key::Fold`). A
//! key the filter still refuses while in step, with its row still there,
//! is a false negative: the filter refused a key that exists. A false
//! negative is counted (`false_negatives`), logged as an error, and the
//! filter's "no" is not trusted again until a rebuild succeeds (the shield
//! owes one, so every "no" is unvouched and readiness says
//! `rebuild_owed`), and L1's cached "not found"s are dropped with it.
//!
//! No false negative is expected; this is what finds one that a bug, a
//! corrupted snapshot, a filter from another database or a collation the
//! filter does not fold would otherwise leave in place.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use super::{Rows, ShieldedReader};

/// The sampler's state and counts, shared by a reader's clones.
#[derive(Debug)]
pub struct Audit {
    /// Milliseconds between samples; 0: off.
    every_ms: AtomicU64,
    /// How long a create may take to reach this instance's filter.
    settle: std::time::Duration,
    /// When the next sample may be taken (milliseconds since the epoch).
    next_at_ms: AtomicU64,
    /// A lookup runs.
    running: AtomicBool,
    /// Refused keys looked up.
    pub sampled: AtomicU64,
    /// Of those, the ones the source had: the filter was wrong.
    pub false_negatives: AtomicU64,
    /// Lookups that failed (the source down): nothing learned.
    pub failed: AtomicU64,
}

impl Default for Audit {
    fn default() -> Self {
        Self {
            every_ms: AtomicU64::new(0),
            settle: std::time::Duration::ZERO,
            next_at_ms: AtomicU64::new(0),
            running: AtomicBool::new(false),
            sampled: AtomicU64::new(0),
            false_negatives: AtomicU64::new(0),
            failed: AtomicU64::new(0),
        }
    }
}

impl Audit {
    /// Samples at most one refused key every `every_ms` (0: none); a row
    /// found is judged after `settle`, the change feed's bound.
    #[must_use]
    pub fn every(every_ms: u64, settle: std::time::Duration) -> Self {
        let a = Self {
            settle,
            ..Self::default()
        };
        a.every_ms.store(every_ms, Ordering::Relaxed);
        a
    }

    /// Samples at most one refused key every `every_ms` from now on (0:
    /// none).
    pub fn set_every(&self, every_ms: u64) {
        self.every_ms.store(every_ms, Ordering::Relaxed);
    }

    /// Whether this refusal is sampled: the interval passed and no lookup
    /// runs. One load of an atomic when off or not due.
    fn take(&self) -> bool {
        let every = self.every_ms.load(Ordering::Relaxed);
        if every == 0 {
            return false;
        }
        let now = crate::model::now_millis();
        let next = self.next_at_ms.load(Ordering::Relaxed);
        if now < next || self.running.load(Ordering::Relaxed) {
            return false;
        }
        self.next_at_ms
            .compare_exchange(next, now + every, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
            && !self.running.swap(true, Ordering::AcqRel)
    }
}

impl<R: Rows> ShieldedReader<R> {
    /// Called for every refused key: when due, looks it up in the source
    /// in a task of its own (outside a Tokio runtime: not sampled).
    pub(super) fn audit_refusal(&self, key: &R::Key) {
        if !self.audit.take() {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            self.audit.running.store(false, Ordering::Release);
            return;
        };
        let (reader, key) = (self.clone(), key.clone());
        runtime.spawn(async move {
            reader.audit.sampled.fetch_add(1, Ordering::Relaxed);
            match reader.store.audit(&key).await {
                Ok(true) => {
                    // A create in flight reaches the filter within the
                    // feed's bound; a "no" that outlives it is wrong.
                    tokio::time::sleep(reader.audit.settle).await;
                    if reader.shield.probe(&key) == crate::shield::Verdict::Reject
                        && matches!(reader.store.audit(&key).await, Ok(true))
                    {
                        reader.false_negative(&key);
                    }
                }
                Ok(false) => {}
                Err(e) => {
                    reader.audit.failed.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(error = %e, "filter audit: the lookup failed");
                }
            }
            reader.audit.running.store(false, Ordering::Release);
        });
    }

    /// The filter refused a key that exists.
    fn false_negative(&self, key: &R::Key) {
        self.audit.false_negatives.fetch_add(1, Ordering::Relaxed);
        tracing::error!(
            %key,
            "FALSE NEGATIVE: the filter refused a key the database has; its no is not trusted until a rebuild"
        );
        self.shield.raise_false_negative();
        // One rebuild answers them all.
        if !self.shield.rebuild_is_owed() {
            self.shield.rebuild_owed(|| {});
        }
        self.invalidate_all_local();
    }
}
