//! The Bloom gate: an in-process filter of every SKU id, swapped atomically
//! on rebuild.
//!
//! * Not built yet (or disabled): every id passes (fail-open). The filter is
//!   an availability optimisation, never a correctness gate.
//! * Built: "no" is exact, so the request is answered 404 without touching
//!   Redis or SQL.
//! * Rebuild: a new filter is registered as `building` *before* SQL is
//!   scanned, and every insert goes to `current` and `building`. An id
//!   committed to SQL before the scan starts is seen by the scan; one added
//!   after `building` is set is inserted into it directly. Inserts read
//!   `building` before `current`, and the rebuild publishes `current` before
//!   clearing `building`, so an insert racing the swap reaches the filter
//!   that ends up published. Readers keep using the old (complete) filter
//!   until the swap, and never wait.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwapOption;
use bloomgate_filter::{AtomicBloom, Filter};

use crate::metrics::Counter;
use crate::store::{SkuStore, StoreError};

/// What the gate says about an id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Certainly absent: answer 404 now.
    Reject,
    /// Possibly present (or the gate is not ready): continue to the caches.
    Pass,
}

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

/// A snapshot of the gate for the stats endpoint.
#[derive(Debug, Clone, serde::Serialize)]
pub struct GateStats {
    /// Gating is configured on.
    pub enabled: bool,
    /// A filter is built and in use.
    pub ready: bool,
    /// Ids in the published filter (its insert count).
    pub added: u64,
    /// Requests answered 404 by the filter alone.
    pub rejected: u64,
    /// Bits of the published filter.
    pub bits: u64,
    /// Hashes of the published filter.
    pub hashes: u32,
    /// Requests the filter let through.
    pub passed: u64,
    /// Items the filter was sized for.
    pub capacity: u64,
    /// Fraction of bits set.
    pub fill_ratio: f64,
    /// Exact expected false-positive rate at the current load.
    pub expected_fpr: f64,
    /// A rebuild is running.
    pub rebuilding: bool,
    /// Completed rebuilds.
    pub rebuilds: u64,
    /// Duration of the last rebuild, milliseconds.
    pub last_rebuild_ms: u64,
    /// SKUs deleted since the last rebuild (still answered "maybe").
    pub deleted_since_build: u64,
}

/// The gate. Cheap to share behind an `Arc`.
#[derive(Debug)]
pub struct Gate {
    enabled: bool,
    expected: u64,
    fpp: f64,
    current: ArcSwapOption<AtomicBloom>,
    building: ArcSwapOption<AtomicBloom>,
    rebuild_lock: tokio::sync::Mutex<()>,
    rebuilding: AtomicBool,
    capacity: AtomicU64,
    rejected: Counter,
    passed: Counter,
    rebuilds: AtomicU64,
    last_rebuild_ms: AtomicU64,
    deleted_since_build: AtomicU64,
}

/// A rebuild was asked for while one is running.
#[derive(Debug, thiserror::Error)]
#[error("a filter rebuild is already running")]
pub struct RebuildBusy;

/// Why a rebuild failed.
#[derive(Debug, thiserror::Error)]
pub enum RebuildError {
    /// Another rebuild holds the lock.
    #[error(transparent)]
    Busy(#[from] RebuildBusy),
    /// Scanning SQL failed; the old filter stays published.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The filter could not be sized or allocated.
    #[error("filter: {0}")]
    Filter(#[from] bloomgate_filter::Error),
}

impl Gate {
    /// A gate that is not built yet.
    #[must_use]
    pub fn new(enabled: bool, expected: u64, fpp: f64) -> Self {
        Self {
            enabled,
            expected,
            fpp,
            current: ArcSwapOption::empty(),
            building: ArcSwapOption::empty(),
            rebuild_lock: tokio::sync::Mutex::new(()),
            rebuilding: AtomicBool::new(false),
            capacity: AtomicU64::new(0),
            rejected: Counter::default(),
            passed: Counter::default(),
            rebuilds: AtomicU64::new(0),
            last_rebuild_ms: AtomicU64::new(0),
            deleted_since_build: AtomicU64::new(0),
        }
    }

    /// Judges an id; counts rejections and passes.
    #[inline]
    pub fn check(&self, id: i64) -> Verdict {
        if !self.enabled {
            return Verdict::Pass;
        }
        let guard = self.current.load();
        match guard.as_deref() {
            Some(f) if !f.contains(&id) => {
                self.rejected.incr();
                Verdict::Reject
            }
            _ => {
                self.passed.incr();
                Verdict::Pass
            }
        }
    }

    /// Adds a new id, to the filter being built first, then the published one.
    pub fn insert(&self, id: i64) {
        if let Some(f) = self.building.load().as_deref() {
            f.insert(&id);
        }
        if let Some(f) = self.current.load().as_deref() {
            f.insert(&id);
        }
    }

    /// Notes a deletion; returns true when enough have piled up that a
    /// rebuild is due.
    pub fn note_delete(&self, threshold: u64) -> bool {
        let n = self.deleted_since_build.fetch_add(1, Ordering::Relaxed) + 1;
        self.enabled && n >= threshold
    }

    /// True when a rebuild is running.
    pub fn is_rebuilding(&self) -> bool {
        self.rebuilding.load(Ordering::Relaxed)
    }

    /// Builds a new filter from every id in SQL and swaps it in. Fails with
    /// [`RebuildError::Busy`] at once when another rebuild is running.
    ///
    /// # Errors
    /// [`RebuildError`]; on failure the published filter is unchanged.
    pub async fn rebuild(&self, store: &SkuStore) -> Result<RebuildReport, RebuildError> {
        let _lock = self.rebuild_lock.try_lock().map_err(|_| RebuildBusy)?;
        self.rebuilding.store(true, Ordering::Relaxed);
        let result = self.rebuild_locked(store).await;
        self.building.store(None);
        self.rebuilding.store(false, Ordering::Relaxed);
        result
    }

    async fn rebuild_locked(&self, store: &SkuStore) -> Result<RebuildReport, RebuildError> {
        let started = Instant::now();
        // Size for the configured capacity, or for the actual count with
        // room to grow when the catalogue has outgrown it.
        let count = store.count().await?;
        let capacity = self.expected.max(count.saturating_mul(5) / 4);
        if capacity > self.expected {
            tracing::warn!(
                count,
                expected = self.expected,
                capacity,
                "catalogue outgrew cache.bloom_expected; sizing the filter for the actual count"
            );
        }
        let filter = Arc::new(AtomicBloom::with_fpr(capacity, self.fpp)?);
        self.building.store(Some(Arc::clone(&filter)));
        let deleted_before = self.deleted_since_build.load(Ordering::Relaxed);
        let added = store
            .for_each_id_batch(10_000, |ids| filter.insert_many(ids))
            .await?;
        self.current.store(Some(Arc::clone(&filter)));
        self.capacity.store(capacity, Ordering::Relaxed);
        self.deleted_since_build
            .fetch_sub(deleted_before, Ordering::Relaxed);
        let duration_ms = started.elapsed().as_millis() as u64;
        self.rebuilds.fetch_add(1, Ordering::Relaxed);
        self.last_rebuild_ms.store(duration_ms, Ordering::Relaxed);
        tracing::info!(
            added,
            duration_ms,
            bits = filter.bits(),
            "bloom filter rebuilt"
        );
        Ok(RebuildReport {
            added,
            bits: filter.bits(),
            hashes: filter.hashes(),
            duration_ms,
        })
    }

    /// Waits (polling) until the gate is ready or `timeout` passes.
    pub async fn wait_ready(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while self.current.load().is_none() {
            if Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        true
    }

    /// Figures for `/api/cache/stats`.
    pub fn stats(&self) -> GateStats {
        let guard = self.current.load();
        let f = guard.as_deref();
        GateStats {
            enabled: self.enabled,
            ready: self.enabled && f.is_some(),
            added: f.map_or(0, Filter::items),
            rejected: self.rejected.get(),
            bits: f.map_or(0, Filter::bits),
            hashes: f.map_or(0, Filter::hashes),
            passed: self.passed.get(),
            capacity: self.capacity.load(Ordering::Relaxed),
            fill_ratio: f.map_or(0.0, Filter::fill_ratio),
            expected_fpr: f.map_or(1.0, |f| f.expected_fpr(f.items())),
            rebuilding: self.is_rebuilding(),
            rebuilds: self.rebuilds.load(Ordering::Relaxed),
            last_rebuild_ms: self.last_rebuild_ms.load(Ordering::Relaxed),
            deleted_since_build: self.deleted_since_build.load(Ordering::Relaxed),
        }
    }
}
