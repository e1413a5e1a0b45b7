//! The Bloom gate: an in-process filter of every SKU id, swapped atomically
//! on rebuild.
//!
//! * Not built yet (or disabled): every id passes (fail-open). The filter is
//!   an availability optimisation, never a correctness gate.
//! * Built: "no" is exact, so the request is answered 404 without touching
//!   Redis or SQL.
//! * Rebuild: a new filter is registered as `building` *before* SQL is
//!   scanned, and every insert goes to `building` and `current`. An id
//!   committed to SQL before the scan starts is seen by the scan; one added
//!   after `building` is set is inserted into it directly. Inserts read
//!   `building` before `current`, and the rebuild publishes `current` before
//!   clearing `building`, so an insert racing the swap reaches the filter
//!   that ends up published. Readers keep using the old (complete) filter
//!   until the swap, and never wait.
//!
//! Rebuilds are owned by the gate, not by whoever asked: [`Gate::request_rebuild`]
//! registers a request and returns a [`RebuildTicket`]; one worker task runs
//! rebuilds one after another until every request is served. A request that
//! arrives while a rebuild runs is served by the next one, whose SQL scan
//! starts after it arrived; all requests that arrive meanwhile share that
//! next rebuild. So at most one rebuild runs and one is pending, however
//! many callers ask, and a caller that goes away (an HTTP client that
//! disconnects) changes nothing.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arc_swap::ArcSwapOption;
use bloomgate_filter::{sizing, AtomicBloom, AtomicClassicBloom, Filter};
use futures_util::FutureExt;
use tokio::sync::watch;

use crate::config::BloomLayout;
use crate::metrics::Counter;
use crate::pause::PausePoint;
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

/// A snapshot of the gate for the stats endpoint. Seed 000's keys come
/// first, so its `grep -o '"bloom":{[^}]*}'` shows them at the start.
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
    /// The filter's layout.
    pub layout: BloomLayout,
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
    /// Requests are waiting for the next rebuild.
    pub rebuild_pending: bool,
    /// Rebuild requests so far (each warm with `rebuild_bloom`, start-up
    /// builds and their retries, delete-triggered rebuilds).
    pub rebuild_requests: u64,
    /// Completed rebuilds.
    pub rebuilds: u64,
    /// Rebuilds that failed (the previous filter stayed published).
    pub rebuild_failures: u64,
    /// Retries of the start-up build after failures.
    pub rebuild_retries: u64,
    /// Why the last failed rebuild failed, until one succeeds.
    pub last_rebuild_error: Option<String>,
    /// Duration of the last rebuild, milliseconds.
    pub last_rebuild_ms: u64,
    /// SKUs deleted since the last rebuild (still answered "maybe").
    pub deleted_since_build: u64,
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

/// The in-process filter, in the configured layout.
#[derive(Debug)]
pub enum GateFilter {
    /// One 256-bit block per id.
    Blocked(AtomicBloom),
    /// Seed 000's classic scheme.
    Classic(AtomicClassicBloom),
}

impl GateFilter {
    /// An empty filter for `n` ids at rate `p`.
    ///
    /// # Errors
    /// The filter crate's sizing errors.
    pub fn with_fpr(layout: BloomLayout, n: u64, p: f64) -> bloomgate_filter::Result<Self> {
        Ok(match layout {
            BloomLayout::Blocked => Self::Blocked(AtomicBloom::with_fpr(n, p)?),
            BloomLayout::Classic => Self::Classic(AtomicClassicBloom::with_fpr(n, p)?),
        })
    }

    /// Membership of an id.
    #[inline]
    #[must_use]
    pub fn contains(&self, id: i64) -> bool {
        match self {
            Self::Blocked(f) => f.contains(&id),
            Self::Classic(f) => f.contains(&id),
        }
    }

    /// Adds an id.
    #[inline]
    pub fn insert(&self, id: i64) {
        match self {
            Self::Blocked(f) => {
                f.insert(&id);
            }
            Self::Classic(f) => {
                f.insert(&id);
            }
        }
    }

    /// Adds many ids.
    pub fn insert_many(&self, ids: &[i64]) {
        match self {
            Self::Blocked(f) => f.insert_many(ids),
            Self::Classic(f) => f.insert_many(ids),
        }
    }

    /// The filter's figures.
    #[must_use]
    pub fn as_filter(&self) -> &dyn Filter {
        match self {
            Self::Blocked(f) => f,
            Self::Classic(f) => f,
        }
    }
}

/// Bytes of a gate filter for `n` ids at rate `p` in `layout`.
///
/// # Errors
/// The filter crate's sizing errors (a rate it cannot serve, too large).
pub fn filter_bytes(layout: BloomLayout, n: u64, p: f64) -> bloomgate_filter::Result<u64> {
    Ok(match layout {
        BloomLayout::Blocked => sizing::blocked(n, p, 256)?.bits().div_ceil(8),
        BloomLayout::Classic => sizing::classic(n, p)?.bits.div_ceil(8),
    })
}

/// The gate's settings.
#[derive(Debug, Clone, Copy)]
pub struct GateConfig {
    /// Gate reads at all.
    pub enabled: bool,
    /// The filter's layout.
    pub layout: BloomLayout,
    /// Ids the filter is sized for, at least.
    pub expected: u64,
    /// Target false-positive rate.
    pub fpp: f64,
}

/// What the rebuild worker last finished: every request numbered up to
/// `through` is answered by `outcome`.
#[derive(Debug, Clone)]
struct Completed {
    through: u64,
    outcome: Result<RebuildReport, RebuildError>,
}

/// Request bookkeeping, under a short lock.
#[derive(Debug, Default)]
struct Requests {
    /// Number of the newest request.
    requested: u64,
    /// Number of the newest request the running (or last) rebuild covers.
    started: u64,
    /// A worker task is running.
    worker: bool,
}

/// The gate. Cheap to share behind an `Arc`.
#[derive(Debug)]
pub struct Gate {
    config: GateConfig,
    store: SkuStore,
    current: ArcSwapOption<GateFilter>,
    building: ArcSwapOption<GateFilter>,
    requests: Mutex<Requests>,
    completed: watch::Sender<Completed>,
    rebuilding: AtomicBool,
    capacity: AtomicU64,
    rejected: Counter,
    passed: Counter,
    rebuilds: AtomicU64,
    failures: AtomicU64,
    retries: AtomicU64,
    last_error: Mutex<Option<String>>,
    last_rebuild_ms: AtomicU64,
    deleted_since_build: AtomicU64,
    /// Test hook: where a rebuild stops after its scan, before publishing.
    #[doc(hidden)]
    pub after_scan: PausePoint,
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
            Err(_) => Err(RebuildError::Stopped("the gate was dropped".into())),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // The guarded data stays consistent under panics (plain counters and
    // an optional string), so a poisoned lock is still usable.
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Gate {
    /// A gate that is not built yet, reading ids from `store`.
    #[must_use]
    pub fn new(config: GateConfig, store: SkuStore) -> Self {
        let (completed, _) = watch::channel(Completed {
            through: 0,
            outcome: Err(RebuildError::Stopped("no rebuild yet".into())),
        });
        Self {
            config,
            store,
            current: ArcSwapOption::empty(),
            building: ArcSwapOption::empty(),
            requests: Mutex::new(Requests::default()),
            completed,
            rebuilding: AtomicBool::new(false),
            capacity: AtomicU64::new(0),
            rejected: Counter::default(),
            passed: Counter::default(),
            rebuilds: AtomicU64::new(0),
            failures: AtomicU64::new(0),
            retries: AtomicU64::new(0),
            last_error: Mutex::new(None),
            last_rebuild_ms: AtomicU64::new(0),
            deleted_since_build: AtomicU64::new(0),
            after_scan: PausePoint::default(),
        }
    }

    /// Judges an id; counts rejections and passes.
    #[inline]
    pub fn check(&self, id: i64) -> Verdict {
        if !self.config.enabled {
            return Verdict::Pass;
        }
        let guard = self.current.load();
        match guard.as_deref() {
            Some(f) if !f.contains(id) => {
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
            f.insert(id);
        }
        if let Some(f) = self.current.load().as_deref() {
            f.insert(id);
        }
    }

    /// Notes a deletion; returns true when enough have piled up that a
    /// rebuild is due.
    pub fn note_delete(&self, threshold: u64) -> bool {
        let n = self.deleted_since_build.fetch_add(1, Ordering::Relaxed) + 1;
        self.config.enabled && n >= threshold
    }

    /// True when a rebuild is running.
    pub fn is_rebuilding(&self) -> bool {
        self.rebuilding.load(Ordering::Relaxed)
    }

    /// True when a filter is published.
    pub fn is_ready(&self) -> bool {
        self.current.load().is_some()
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
            let outcome = std::panic::AssertUnwindSafe(self.rebuild_once())
                .catch_unwind()
                .await
                .unwrap_or_else(|_| {
                    self.building.store(None);
                    self.rebuilding.store(false, Ordering::Relaxed);
                    Err(RebuildError::Stopped("the rebuild panicked".into()))
                });
            match &outcome {
                Ok(_) => *lock(&self.last_error) = None,
                Err(e) => {
                    self.failures.fetch_add(1, Ordering::Relaxed);
                    *lock(&self.last_error) = Some(e.to_string());
                }
            }
            self.completed.send_replace(Completed { through, outcome });
        }
    }

    /// One rebuild: the published filter changes only if it succeeds, and
    /// `building` is cleared either way.
    async fn rebuild_once(&self) -> Result<RebuildReport, RebuildError> {
        self.rebuilding.store(true, Ordering::Relaxed);
        let result = self.scan_and_publish().await;
        self.building.store(None);
        self.rebuilding.store(false, Ordering::Relaxed);
        if let Err(e) = &result {
            tracing::warn!(error = %e, "filter rebuild failed; the previous filter stays in use");
        }
        result
    }

    async fn scan_and_publish(&self) -> Result<RebuildReport, RebuildError> {
        let store_err = |e| RebuildError::Store(Arc::new(e));
        let started = Instant::now();
        let GateConfig {
            layout,
            expected,
            fpp,
            ..
        } = self.config;
        // Size for the configured capacity, or for the actual count with
        // room to grow when the catalogue has outgrown it.
        let count = self.store.count().await.map_err(store_err)?;
        let capacity = expected.max(count.saturating_mul(5) / 4);
        if capacity > expected {
            tracing::warn!(
                count,
                expected,
                capacity,
                "catalogue outgrew cache.bloom_expected; sizing the filter for the actual count"
            );
        }
        let filter = Arc::new(
            GateFilter::with_fpr(layout, capacity, fpp)
                .map_err(|e| RebuildError::Filter(Arc::new(e)))?,
        );
        self.building.store(Some(Arc::clone(&filter)));
        let deleted_before = self.deleted_since_build.load(Ordering::Relaxed);
        let added = self
            .store
            .for_each_id_batch(10_000, |ids| filter.insert_many(ids))
            .await
            .map_err(store_err)?;
        self.after_scan.pass(0).await;
        self.current.store(Some(Arc::clone(&filter)));
        self.capacity.store(capacity, Ordering::Relaxed);
        self.deleted_since_build
            .fetch_sub(deleted_before, Ordering::Relaxed);
        let duration_ms = started.elapsed().as_millis() as u64;
        self.rebuilds.fetch_add(1, Ordering::Relaxed);
        self.last_rebuild_ms.store(duration_ms, Ordering::Relaxed);
        let f = filter.as_filter();
        tracing::info!(added, duration_ms, bits = f.bits(), "bloom filter rebuilt");
        Ok(RebuildReport {
            added,
            bits: f.bits(),
            hashes: f.hashes(),
            duration_ms,
        })
    }

    /// Waits (polling) until the gate is ready or `timeout` passes.
    pub async fn wait_ready(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while !self.is_ready() {
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
        let f = guard.as_deref().map(GateFilter::as_filter);
        let (requests, pending) = {
            let r = lock(&self.requests);
            (r.requested, r.requested > r.started)
        };
        GateStats {
            enabled: self.config.enabled,
            ready: self.config.enabled && f.is_some(),
            added: f.map_or(0, Filter::items),
            rejected: self.rejected.get(),
            bits: f.map_or(0, Filter::bits),
            hashes: f.map_or(0, Filter::hashes),
            layout: self.config.layout,
            passed: self.passed.get(),
            capacity: self.capacity.load(Ordering::Relaxed),
            fill_ratio: f.map_or(0.0, Filter::fill_ratio),
            expected_fpr: f.map_or(1.0, |f| f.expected_fpr(f.items())),
            rebuilding: self.is_rebuilding(),
            rebuild_pending: pending,
            rebuild_requests: requests,
            rebuilds: self.rebuilds.load(Ordering::Relaxed),
            rebuild_failures: self.failures.load(Ordering::Relaxed),
            rebuild_retries: self.retries.load(Ordering::Relaxed),
            last_rebuild_error: lock(&self.last_error).clone(),
            last_rebuild_ms: self.last_rebuild_ms.load(Ordering::Relaxed),
            deleted_since_build: self.deleted_since_build.load(Ordering::Relaxed),
        }
    }
}
