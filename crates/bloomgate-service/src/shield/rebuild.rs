//! The shield's rebuild worker: requests numbered, coalesced and answered
//! through a `watch` channel by one worker task that scans the source and
//! publishes; start-up retries with capped backoff; the rebuilds owed
//! after a lost change-feed position.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::FutureExt;
use tokio::sync::watch;

use crate::filter::ShieldFilter;
use crate::shield::{Shield, ShieldConfig};
use crate::sql::StoreError;
use crate::sync::lock;

/// The outcome of one rebuild.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct RebuildReport {
    /// Ids streamed from SQL into the new filter.
    pub added: u64,
    /// Bits of the new filter.
    pub bits: u64,
    /// Hashes of the new filter.
    pub hashes: u32,
    /// Wall time, milliseconds.
    pub duration_ms: u64,
}

/// Why a rebuild failed. Cheap to clone: every caller that shared the
/// rebuild gets the same error.
#[derive(Debug, Clone, thiserror::Error)]
pub enum RebuildError {
    /// Scanning SQL failed; the old filter stays published.
    #[error(transparent)]
    Store(Arc<StoreError>),
    /// The filter could not be sized or allocated.
    #[error("filter: {0}")]
    Filter(Arc<bloomgate_filter::Error>),
    /// The rebuild worker stopped without an answer (it panicked, or the
    /// runtime is shutting down).
    #[error("the rebuild worker stopped: {0}")]
    Stopped(String),
}

/// What the rebuild worker last finished: every request numbered up to
/// `through` is answered by `outcome`.
#[derive(Debug, Clone)]
pub(super) struct Completed {
    pub(super) through: u64,
    pub(super) outcome: Result<RebuildReport, RebuildError>,
}

/// Request bookkeeping, under a short lock.
#[derive(Debug, Default)]
pub(super) struct Requests {
    /// Number of the newest request.
    pub(super) requested: u64,
    /// Number of the newest request the running (or last) rebuild covers.
    pub(super) started: u64,
    /// A worker task is running.
    pub(super) worker: bool,
}

/// Rebuilds kept in [`Shield::history`].
pub const HISTORY: usize = 32;

/// One rebuild, for the stats endpoint and the dashboard.
#[derive(Debug, Clone, serde::Serialize)]
pub struct RebuildRecord {
    /// When it finished, Unix time in milliseconds.
    pub finished_at_ms: u64,
    /// Wall time, milliseconds.
    pub duration_ms: u64,
    /// Ids added (when it succeeded).
    pub added: Option<u64>,
    /// Why it failed (when it did).
    pub error: Option<String>,
}

/// A registered rebuild request; [`RebuildTicket::wait`] resolves when a
/// rebuild that started after the request has finished. Dropping the
/// ticket does not cancel anything.
#[derive(Debug)]
pub struct RebuildTicket {
    number: u64,
    completed: watch::Receiver<Completed>,
}

impl RebuildTicket {
    /// Waits for the rebuild that serves this request and returns its
    /// outcome (shared with every request it served).
    ///
    /// # Errors
    /// [`RebuildError`]; the previously published filter stays in use.
    pub async fn wait(mut self) -> Result<RebuildReport, RebuildError> {
        let number = self.number;
        match self.completed.wait_for(|c| c.through >= number).await {
            Ok(c) => c.outcome.clone(),
            Err(_) => Err(RebuildError::Stopped(
                "the filter was dropped (the service is stopping)".into(),
            )),
        }
    }
}

impl Shield {
    /// Asks for a rebuild this instance needs because it may have missed
    /// creates (its change-feed position was lost, rows were written that
    /// no entry names): until one succeeds, a filter "no" is
    /// [`Verdict::Unvouched`]; a failed rebuild is retried with backoff.
    /// Calls `done` once a rebuild succeeded.
    pub fn rebuild_owed(self: &Arc<Self>, done: impl FnOnce() + Send + 'static) {
        if !self.config.enabled {
            // No filter to rebuild (the demo SKU table when it is off).
            done();
            return;
        }
        self.owed_rebuilds.fetch_add(1, Ordering::Relaxed);
        let shield = Arc::downgrade(self);
        self.background.spawn(async move {
            let mut backoff = Duration::from_millis(100);
            loop {
                let Some(g) = shield.upgrade() else { return };
                let ticket = g.request_rebuild();
                drop(g);
                let ok = ticket.wait().await.is_ok();
                let Some(g) = shield.upgrade() else { return };
                if ok {
                    g.owed_rebuilds.fetch_sub(1, Ordering::Relaxed);
                    done();
                    return;
                }
                drop(g);
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
        });
    }

    /// True while a rebuild asked for by [`Shield::rebuild_owed`] has not
    /// succeeded yet (the filter may lack creates).
    #[must_use]
    pub fn rebuild_is_owed(&self) -> bool {
        self.owed_rebuilds.load(Ordering::Relaxed) > 0
    }

    /// True while the published filter holds more keys than it was sized
    /// for and a rebuild (which sizes for them) is running or asked for:
    /// its rate is known to be past the target, so the instance is not
    /// counted ready on it. Once no rebuild is pending (they all failed)
    /// it is served as it is: its "no" is still exact.
    #[must_use]
    pub fn resizing(&self) -> bool {
        // Twice past: far from the target rate. An ordinary growth
        // rebuild, just past capacity on every instance at once, keeps the
        // fleet ready.
        let over = self.current.load().as_deref().is_some_and(|f| {
            f.as_filter().items() > self.capacity.load(Ordering::Relaxed).saturating_mul(2)
        });
        over && (self.is_rebuilding() || {
            let r = lock(&self.requests);
            r.requested > r.started
        })
    }

    /// Asks for a rebuild whose SQL scan starts after this call, starting
    /// the worker if none runs. Must be called within a Tokio runtime.
    pub fn request_rebuild(self: &Arc<Self>) -> RebuildTicket {
        let completed = self.completed.subscribe();
        let mut r = lock(&self.requests);
        r.requested += 1;
        let number = r.requested;
        if !r.worker {
            r.worker = true;
            // A plain task, not under the shutdown signal: it ends when
            // the requests are served, and cancelling it would leave
            // `worker` set and the tickets unanswered.
            tokio::spawn(Arc::clone(self).work());
        }
        RebuildTicket { number, completed }
    }

    /// Asks for a rebuild and waits for it: `request_rebuild().wait()`.
    ///
    /// # Errors
    /// [`RebuildError`].
    pub async fn rebuild(self: &Arc<Self>) -> Result<RebuildReport, RebuildError> {
        self.request_rebuild().wait().await
    }

    /// Builds until a build succeeds: on failure, waits `min` and retries,
    /// doubling the wait up to `max`. Reads fail open meanwhile.
    pub async fn build_until_ready(self: Arc<Self>, min: Duration, max: Duration) {
        let mut wait = min;
        loop {
            match self.rebuild().await {
                Ok(_) => return,
                Err(e) => {
                    let attempt = self.retries.fetch_add(1, Ordering::Relaxed) + 1;
                    tracing::warn!(error = %e, attempt, retry_in_ms = wait.as_millis() as u64,
                        "building the filter failed; reads fail open until it succeeds");
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(max);
                }
            }
        }
    }

    /// The worker: runs rebuilds while requests are waiting for one.
    async fn work(self: Arc<Self>) {
        loop {
            let through = {
                let mut r = lock(&self.requests);
                if r.started == r.requested {
                    r.worker = false;
                    return;
                }
                r.started = r.requested;
                r.started
            };
            let started = Instant::now();
            let outcome = std::panic::AssertUnwindSafe(self.rebuild_once())
                .catch_unwind()
                .await
                .unwrap_or_else(|_| {
                    self.building.store(None);
                    self.rebuilding.store(false, Ordering::Relaxed);
                    Err(RebuildError::Stopped("the rebuild panicked".into()))
                });
            self.record(started.elapsed(), &outcome);
            match &outcome {
                Ok(_) => {
                    *lock(&self.last_error) = None;
                    // A new filter starts a new window, with a clean slate.
                    *lock(&self.window) = (self.rejected.get(), self.passed_missing.get());
                    let still = self.structural_alarm(false);
                    if lock(&self.alarm).take().is_some() && still.is_none() {
                        tracing::info!("bloom filter alarm cleared by the rebuild");
                    }
                    if let Some(alarm) = still {
                        self.raise(alarm);
                    }
                }
                Err(e) => {
                    self.failures.fetch_add(1, Ordering::Relaxed);
                    // Shown to every client (stats, readiness): without
                    // the account the driver's message names.
                    *lock(&self.last_error) = Some(crate::text::public_error(&e.to_string()));
                }
            }
            self.completed.send_replace(Completed { through, outcome });
        }
    }

    fn record(&self, took: Duration, outcome: &Result<RebuildReport, RebuildError>) {
        self.rebuild_seconds.record(took.as_secs_f64());
        let record = RebuildRecord {
            finished_at_ms: crate::model::now_millis(),
            duration_ms: took.as_millis() as u64,
            added: outcome.as_ref().ok().map(|r| r.added),
            error: outcome
                .as_ref()
                .err()
                .map(|e| crate::text::public_error(&e.to_string())),
        };
        let mut h = lock(&self.history);
        if h.len() == HISTORY {
            h.pop_front();
        }
        h.push_back(record);
    }

    /// One rebuild: the published filter changes only if it succeeds, and
    /// `building` is cleared either way.
    async fn rebuild_once(self: &Arc<Self>) -> Result<RebuildReport, RebuildError> {
        self.rebuilding.store(true, Ordering::Relaxed);
        let result = self.scan_and_publish().await;
        {
            let _slots = lock(&self.slots);
            self.building.store(None);
        }
        self.rebuilding.store(false, Ordering::Relaxed);
        if let Err(e) = &result {
            tracing::warn!(error = %e, "filter rebuild failed; the previous filter stays in use");
        }
        result
    }

    /// Every range of the source at once, each in a task of its own (the
    /// decoding of one range's rows does not wait for another's).
    async fn scan_all(self: &Arc<Self>, filter: &Arc<ShieldFilter>) -> Result<u64, StoreError> {
        let ranges = self.keys.ranges().await?;
        // The rate limit counts from the first page, not from a wait for
        // a replica to catch up.
        self.progress.pace_from_now();
        tracing::info!(
            resource = %self.name,
            ranges = ranges.len(),
            estimated_total = self.progress.stats().estimated_total,
            "filter rebuild: scanning"
        );
        let meet = ranges
            .iter()
            .any(|r| r.descending)
            .then(|| Arc::new(super::progress::Meet::default()));
        let tasks: Vec<_> = ranges
            .into_iter()
            .map(|r| {
                let task = Arc::clone(self).scan_range(r, meet.clone(), Arc::clone(filter));
                tokio::spawn(task)
            })
            .collect();
        let mut added = 0;
        let mut failed = None;
        for t in tasks {
            match t.await {
                Ok(Ok(n)) => added += n,
                Ok(Err(e)) => failed = failed.or(Some(e)),
                Err(e) => {
                    // A reader that panicked before its first page must
                    // not leave the other waiting for it.
                    if let Some(m) = &meet {
                        m.first_page(true);
                    }
                    failed = failed.or(Some(StoreError::new("scan", e.to_string())));
                }
            }
        }
        failed.map_or(Ok(added), Err)
    }

    async fn scan_and_publish(self: &Arc<Self>) -> Result<RebuildReport, RebuildError> {
        let store_err = |e| RebuildError::Store(Arc::new(e));
        let started = Instant::now();
        let ShieldConfig {
            layout,
            expected,
            fpp,
            ..
        } = self.config;
        // Size for the configured capacity, or for the source's estimate
        // (or the last scan's count) with room to grow, whichever is
        // larger: no full count. A source past the size is still fully
        // added (no false negative); the capacity alarm then asks for a
        // rebuild sized for what this one scanned.
        let estimate = match self.keys.estimate_keys().await {
            Ok(e) => e,
            Err(e) => {
                tracing::warn!(error = %e, "no row estimate; sizing the filter without one");
                None
            }
        };
        // The estimate (the database's statistics, SQLite's MAX(rowid)) is
        // trusted up to what a filter of `MAX_SIZED_BYTES` holds: a 10^8-row
        // table gets a filter for 10^8 keys on its first scan, while a bad
        // figure (sparse rowids, a wild statistic) cannot size one of
        // terabytes. A source past the size is still fully added, and a
        // scan that finds it so asks at once for a resize (below).
        let last = self.last_scanned.load(Ordering::Relaxed);
        let known = estimate
            .unwrap_or(0)
            .min(keys_within(MAX_SIZED_BYTES, fpp))
            .max(last);
        let capacity = expected
            .max(known.saturating_mul(5) / 4)
            .max(self.min_capacity.load(Ordering::Relaxed));
        if capacity > expected {
            tracing::warn!(
                estimate = known,
                expected,
                capacity,
                "sizing the filter above bloom_expected: the source's estimate (or last scan) with a quarter to grow"
            );
        }
        let filter = Arc::new(
            ShieldFilter::with_fpr(layout, capacity, fpp)
                .map_err(|e| RebuildError::Filter(Arc::new(e)))?,
        );
        {
            let _slots = lock(&self.slots);
            self.building.store(Some(Arc::clone(&filter)));
        }
        let deleted_before = self.deleted_since_build.load(Ordering::Relaxed);
        self.progress
            .start(estimate.unwrap_or(0), self.config.scan_rows_per_sec);
        let scanned = self.scan_all(&filter).await;
        self.progress.finish();
        let added = scanned.map_err(store_err)?;
        self.last_scanned.store(added, Ordering::Relaxed);
        if added > capacity && self.config.auto_rebuild {
            // Past its size from the start (an estimate far below the
            // table): published, since it never refuses a key it holds,
            // but resized now rather than at the monitor's next look, and
            // not counted ready until then (`Shield::readiness`).
            tracing::warn!(
                added,
                capacity,
                "the scan found more keys than the filter was sized for: resizing"
            );
            self.min_capacity
                .fetch_max(added.saturating_mul(5) / 4, Ordering::Relaxed);
            drop(self.request_rebuild());
        }
        self.after_scan.pass(0).await;
        self.current.store(Some(Arc::clone(&filter)));
        self.capacity.store(capacity, Ordering::Relaxed);
        self.deleted_since_build
            .fetch_sub(deleted_before, Ordering::Relaxed);
        let duration_ms = started.elapsed().as_millis() as u64;
        self.rebuilds.fetch_add(1, Ordering::Relaxed);
        self.last_rebuild_ms.store(duration_ms, Ordering::Relaxed);
        let f = filter.as_filter();
        tracing::info!(resource = %self.name, added, duration_ms, bits = f.bits(), "bloom filter rebuilt");
        Ok(RebuildReport {
            added,
            bits: f.bits(),
            hashes: f.hashes(),
            duration_ms,
        })
    }
}

/// The largest filter a source's estimate may size on its own: 256 MiB,
/// about 2 x 10^8 keys at 1%.
pub(crate) const MAX_SIZED_BYTES: u64 = 256 << 20;

/// How many keys a filter of `bytes` holds at rate `fpp` (the classic
/// bound with a tenth to spare for the blocked layout's extra bits).
fn keys_within(bytes: u64, fpp: f64) -> u64 {
    let ln2 = std::f64::consts::LN_2;
    let bits_per_key = (-fpp.ln() / (ln2 * ln2) * 1.1).max(1.0);
    ((bytes * 8) as f64 / bits_per_key) as u64
}

#[cfg(test)]
mod sizing_tests {
    use super::*;

    #[test]
    fn an_estimate_may_size_a_filter_for_10_to_the_8_keys_and_no_more_than_256_mib() {
        assert!(keys_within(MAX_SIZED_BYTES, 0.01) > 100_000_000);
        assert!(keys_within(MAX_SIZED_BYTES, 0.001) > 100_000_000);
        assert!(keys_within(MAX_SIZED_BYTES, 0.01) < 300_000_000);
        let f = crate::filter::ShieldFilter::with_fpr(
            crate::config::BloomLayout::Blocked,
            keys_within(MAX_SIZED_BYTES, 0.01),
            0.01,
        )
        .unwrap();
        assert!(
            f.as_filter().bits() / 8 <= MAX_SIZED_BYTES,
            "{}",
            f.as_filter().bits() / 8
        );
    }
}
