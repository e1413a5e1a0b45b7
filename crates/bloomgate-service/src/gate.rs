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

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arc_swap::ArcSwapOption;
use bloomgate_filter::{sizing, AtomicBloom, AtomicClassicBloom, BloomKey, Filter};
use futures_util::FutureExt;
use tokio::sync::watch;

use crate::config::BloomLayout;
use crate::metrics::Counter;
use crate::pause::PausePoint;
use crate::source::{KeyBatch, KeyScan};
use crate::store::StoreError;

/// What the gate says about an id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Certainly absent: answer 404 now.
    Reject,
    /// Possibly present: continue to the caches.
    Pass,
    /// No filter to ask (not built yet, or disabled): continue (fail-open).
    Open,
    /// The filter said no, but this instance is out of step with the
    /// change feed (it may have missed creates): continue, as if open.
    Unvouched,
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
    /// The configured target rate (`cache.bloom_fpp`).
    pub target_fpr: f64,
    /// Distinct ids estimated from the set bits.
    pub estimated_items: f64,
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
    /// Requests the filter passed that turned out not to exist (false
    /// positives and deleted SKUs).
    pub passed_missing: u64,
    /// `passed_missing` over all missing ids seen (rejected + passed_missing).
    pub observed_fpr: f64,
    /// The alarm in force, if any, as text: `bloom` stays a flat object so
    /// seed 000's `grep -o '"bloom":{[^}]*}'` still shows all of it.
    pub alarm: Option<String>,
    /// The kind of the alarm in force (see [`Alarm::kind`]).
    pub alarm_kind: Option<&'static str>,
    /// Alarms raised so far (each crossing once).
    pub alarms_raised: u64,
    /// Filters published from a snapshot (at start) instead of a SQL scan.
    pub snapshot_restores: u64,
    /// Filters another instance built and this one adopted (shared
    /// rebuilds) instead of a SQL scan.
    pub adopted: u64,
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
    pub fn contains<K: BloomKey>(&self, id: K) -> bool {
        match self {
            Self::Blocked(f) => f.contains(&id),
            Self::Classic(f) => f.contains(&id),
        }
    }

    /// Adds an id.
    #[inline]
    pub fn insert<K: BloomKey>(&self, id: K) {
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
    pub fn insert_many<K: BloomKey>(&self, ids: &[K]) {
        match self {
            Self::Blocked(f) => f.insert_many(ids),
            Self::Classic(f) => f.insert_many(ids),
        }
    }

    /// Membership of many keys, written into `out` (the blocked filter's
    /// batch call; the classic one answers key by key).
    pub fn contains_many<K: BloomKey>(&self, keys: &[K], out: &mut [bool]) {
        if let Self::Blocked(f) = self {
            if f.contains_many(keys, out).is_ok() {
                return;
            }
        }
        for (k, o) in keys.iter().zip(out.iter_mut()) {
            *o = self.contains(k);
        }
    }

    /// Adds one batch of a key scan.
    pub fn insert_batch(&self, batch: KeyBatch<'_>) {
        match batch {
            KeyBatch::Ints(ids) => self.insert_many(ids),
            KeyBatch::Keys(keys) => self.insert_many(keys),
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
    /// Rebuild with room for twice the items when an alarm is raised.
    pub auto_rebuild: bool,
}

/// Why the filter needs attention (002 §六: a filter past its capacity, or
/// more than half full, or letting through more than it should, no longer
/// protects the database as sized).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Alarm {
    /// More items than the filter was sized for.
    PastCapacity {
        /// Items in the filter.
        items: u64,
        /// Items it was sized for.
        capacity: u64,
    },
    /// More than half the bits are set.
    FillRatio {
        /// Fraction of bits set.
        fill_ratio: f64,
    },
    /// Over the last window, ids that passed the filter but did not exist
    /// were more than twice the filter's expected false-positive rate.
    ObservedFpr {
        /// Passed-but-missing over all missing ids in the window.
        observed: f64,
        /// The filter's expected rate at its load.
        expected: f64,
    },
}

impl Alarm {
    /// Every kind, as named by [`Alarm::kind`].
    pub const KINDS: [&'static str; 3] = ["past_capacity", "fill_ratio", "observed_fpr"];

    /// The alarm's kind: `past_capacity`, `fill_ratio` or `observed_fpr`.
    #[must_use]
    pub const fn kind(&self) -> &'static str {
        match self {
            Self::PastCapacity { .. } => Self::KINDS[0],
            Self::FillRatio { .. } => Self::KINDS[1],
            Self::ObservedFpr { .. } => Self::KINDS[2],
        }
    }
}

impl std::fmt::Display for Alarm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::PastCapacity { items, capacity } => {
                write!(f, "past_capacity: {items} items, sized for {capacity}")
            }
            Self::FillRatio { fill_ratio } => write!(f, "fill_ratio: {fill_ratio:.3} > 0.5"),
            Self::ObservedFpr { observed, expected } => write!(
                f,
                "observed_fpr: {observed:.6} > 2 x expected {expected:.6}"
            ),
        }
    }
}

impl Gate {
    /// The alarm in force, if any.
    pub fn alarm(&self) -> Option<Alarm> {
        *lock(&self.alarm)
    }
}

/// Missing ids a monitoring window must see before its observed rate
/// counts: fewer is noise.
pub const MIN_WINDOW_SAMPLES: u64 = 200;

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

/// A test hook: a function a test may set, called at one place in the
/// gate (nothing in production sets one).
#[derive(Default)]
pub struct Hook(Mutex<Option<Box<dyn Fn() + Send + Sync>>>);

impl Hook {
    /// Sets the function to call.
    pub fn set(&self, f: impl Fn() + Send + Sync + 'static) {
        *lock(&self.0) = Some(Box::new(f));
    }

    fn call(&self) {
        if let Some(f) = lock(&self.0).as_ref() {
            f();
        }
    }
}

impl std::fmt::Debug for Hook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if lock(&self.0).is_some() {
            "Hook(set)"
        } else {
            "Hook(none)"
        })
    }
}

/// A follower's registration (see [`Gate::follow`]).
#[derive(Debug)]
pub struct FollowerGuard(std::sync::Weak<Gate>);

impl Drop for FollowerGuard {
    fn drop(&mut self) {
        if let Some(g) = self.0.upgrade() {
            g.followers.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// The gate. Cheap to share behind an `Arc`.
#[derive(Debug)]
pub struct Gate {
    config: GateConfig,
    keys: Arc<dyn KeyScan>,
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
    /// Serialises the two-slot writes (an insert into `building`, then
    /// `current`) with the swaps of those slots, so no insert can fall
    /// between a filter being published and the slot it was built in
    /// being cleared. Creates and followed changes take it, never reads.
    slots: Mutex<()>,
    /// Test hook, called inside [`Gate::finish_adopt`] between publishing
    /// the adopted filter and clearing `building`.
    #[doc(hidden)]
    pub adopt_hook: Hook,
    /// False while this instance cannot read the change feed: then a "no"
    /// is not answered 404 (see [`Verdict::Unvouched`]).
    in_step: AtomicBool,
    unvouched: Counter,
    /// Rebuilds this instance needs before its filter's "no" is trusted
    /// again (it may have missed creates): while any is owed, rejections
    /// are [`Verdict::Unvouched`].
    owed_rebuilds: AtomicU64,
    /// Background tasks that hold the gate for as long as the service
    /// lives (the change followers): see [`Gate::only_followers_left`].
    followers: AtomicU64,
    passed_missing: Counter,
    /// The next rebuild sizes for at least this many items.
    min_capacity: AtomicU64,
    alarm: Mutex<Option<Alarm>>,
    alarms_raised: AtomicU64,
    /// (rejected, passed_missing) at the start of the monitor's window.
    window: Mutex<(u64, u64)>,
    /// The last [`HISTORY`] rebuilds, oldest first.
    history: Mutex<VecDeque<RebuildRecord>>,
    /// Every rebuild's duration, successful or not (for `/metrics`).
    rebuild_seconds: ::metrics::Histogram,
    /// Filters published from a snapshot instead of a SQL scan.
    restores: AtomicU64,
    /// Filters adopted from another instance's rebuild.
    adoptions: AtomicU64,
}

/// Rebuilds kept in [`Gate::history`].
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
    /// A gate that is not built yet, rebuilding from `keys`.
    #[must_use]
    pub fn new(config: GateConfig, keys: Arc<dyn KeyScan>) -> Self {
        let (completed, _) = watch::channel(Completed {
            through: 0,
            outcome: Err(RebuildError::Stopped("no rebuild yet".into())),
        });
        Self {
            config,
            keys,
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
            slots: Mutex::new(()),
            adopt_hook: Hook::default(),
            in_step: AtomicBool::new(true),
            unvouched: Counter::default(),
            followers: AtomicU64::new(0),
            owed_rebuilds: AtomicU64::new(0),
            passed_missing: Counter::default(),
            min_capacity: AtomicU64::new(0),
            alarm: Mutex::new(None),
            alarms_raised: AtomicU64::new(0),
            window: Mutex::new((0, 0)),
            history: Mutex::new(VecDeque::with_capacity(HISTORY)),
            rebuild_seconds: ::metrics::Histogram::noop(),
            restores: AtomicU64::new(0),
            adoptions: AtomicU64::new(0),
        }
    }

    /// Records every rebuild's duration in `h` as well.
    #[must_use]
    pub fn with_rebuild_histogram(mut self, h: ::metrics::Histogram) -> Self {
        self.rebuild_seconds = h;
        self
    }

    /// The published filter, if any.
    pub fn published(&self) -> Option<Arc<GateFilter>> {
        self.current.load_full()
    }

    /// Completed rebuilds (cheap, unlike [`Gate::stats`]).
    pub fn rebuild_count(&self) -> u64 {
        self.rebuilds.load(Ordering::Relaxed)
    }

    /// Items the published filter was sized for.
    pub fn capacity(&self) -> u64 {
        self.capacity.load(Ordering::Relaxed)
    }

    /// Publishes a filter restored from a snapshot, sized for `capacity`,
    /// if none is published and no rebuild runs; false otherwise (the
    /// filter is then dropped).
    pub fn install(&self, filter: GateFilter, capacity: u64) -> bool {
        if self.is_rebuilding() || self.current.load().is_some() {
            return false;
        }
        self.capacity.store(capacity, Ordering::Relaxed);
        self.current.store(Some(Arc::new(filter)));
        self.restores.fetch_add(1, Ordering::Relaxed);
        true
    }

    /// Starts adopting a filter another instance built (a shared
    /// rebuild): it becomes the filter being built, so every insert from
    /// now on reaches it too. `None` when a rebuild runs here (its filter,
    /// published when it finishes, is as new).
    pub fn begin_adopt(&self, filter: GateFilter) -> Option<Arc<GateFilter>> {
        if self.is_rebuilding() {
            return None;
        }
        let filter = Arc::new(filter);
        let _slots = lock(&self.slots);
        // Only into an empty slot: never over a rebuild's filter.
        let prev = self
            .building
            .compare_and_swap(&None::<Arc<GateFilter>>, Some(Arc::clone(&filter)));
        prev.is_none().then_some(filter)
    }

    /// Drops an adoption [`Gate::begin_adopt`] started (nothing published).
    pub fn abandon_adopt(&self, filter: &Arc<GateFilter>) {
        let ours = Some(Arc::clone(filter));
        let _slots = lock(&self.slots);
        drop(self.building.compare_and_swap(&ours, None));
    }

    /// Publishes the filter [`Gate::begin_adopt`] started, sized for
    /// `capacity`, once the caller has replayed what it lacked; false (and
    /// nothing published) when a rebuild took over meanwhile. As a rebuild
    /// does: `current` first, then `building` cleared, under the slots
    /// lock, so every insert reaches the filter that ends up published.
    pub fn finish_adopt(&self, filter: &Arc<GateFilter>, capacity: u64) -> bool {
        let _slots = lock(&self.slots);
        if !self
            .building
            .load()
            .as_ref()
            .is_some_and(|p| Arc::ptr_eq(p, filter))
        {
            return false;
        }
        self.capacity.store(capacity, Ordering::Relaxed);
        self.current.store(Some(Arc::clone(filter)));
        self.adopt_hook.call();
        drop(
            self.building
                .compare_and_swap(&Some(Arc::clone(filter)), None),
        );
        self.adoptions.fetch_add(1, Ordering::Relaxed);
        true
    }

    /// The configured layout.
    #[must_use]
    pub fn layout(&self) -> BloomLayout {
        self.config.layout
    }

    /// The configured target rate.
    #[must_use]
    pub fn fpp(&self) -> f64 {
        self.config.fpp
    }

    /// The last rebuilds (at most [`HISTORY`]), oldest first.
    pub fn history(&self) -> Vec<RebuildRecord> {
        lock(&self.history).iter().cloned().collect()
    }

    /// When the last successful rebuild finished, Unix milliseconds.
    pub fn last_success_ms(&self) -> Option<u64> {
        lock(&self.history)
            .iter()
            .rev()
            .find(|r| r.error.is_none())
            .map(|r| r.finished_at_ms)
    }

    /// Judges an id; counts rejections and passes.
    #[inline]
    pub fn check<K: BloomKey>(&self, id: K) -> Verdict {
        let verdict = self.probe(id);
        self.tally(verdict);
        verdict
    }

    /// Judges many keys against one published filter with its batch
    /// call, and counts each as [`Gate::check`] does.
    pub fn check_many<K: BloomKey>(&self, keys: &[K]) -> Vec<Verdict> {
        let filter = self.current.load();
        let verdicts: Vec<Verdict> = match filter.as_deref() {
            Some(f) if self.config.enabled => {
                let mut found = vec![false; keys.len()];
                f.contains_many(keys, &mut found);
                let vouched = self.in_step.load(Ordering::Relaxed)
                    && self.owed_rebuilds.load(Ordering::Relaxed) == 0;
                found
                    .into_iter()
                    .map(|maybe| match (maybe, vouched) {
                        (true, _) => Verdict::Pass,
                        (false, true) => Verdict::Reject,
                        (false, false) => Verdict::Unvouched,
                    })
                    .collect()
            }
            _ => vec![Verdict::Open; keys.len()],
        };
        for v in &verdicts {
            self.tally(*v);
        }
        verdicts
    }

    /// Whether the gate is on (`cache.bloom_enabled`).
    #[must_use]
    pub fn enabled(&self) -> bool {
        self.config.enabled
    }

    /// Judges an id without counting it (see [`Gate::tally`]): for a caller
    /// that may overrule a rejection first (strict mode).
    #[inline]
    pub fn probe<K: BloomKey>(&self, id: K) -> Verdict {
        if !self.config.enabled {
            return Verdict::Open;
        }
        match self.current.load().as_deref() {
            Some(f) if !f.contains(&id) => {
                if self.in_step.load(Ordering::Relaxed)
                    && self.owed_rebuilds.load(Ordering::Relaxed) == 0
                {
                    Verdict::Reject
                } else {
                    Verdict::Unvouched
                }
            }
            Some(_) => Verdict::Pass,
            None => Verdict::Open,
        }
    }

    /// Says whether this instance can read the change feed: while it
    /// cannot, its filter's "no" is not turned into a 404. Returns true
    /// when that changed.
    pub fn set_in_step(&self, in_step: bool) -> bool {
        self.in_step.swap(in_step, Ordering::Relaxed) != in_step
    }

    /// Registers a follower task that holds `gate` (through its reader)
    /// until [`Gate::only_followers_left`]; the guard unregisters it.
    pub fn follow(gate: &Arc<Self>) -> FollowerGuard {
        gate.followers.fetch_add(1, Ordering::Relaxed);
        FollowerGuard(Arc::downgrade(gate))
    }

    /// True once nothing but follower tasks holds `gate`: the service
    /// was dropped and they should stop.
    #[must_use]
    pub fn only_followers_left(gate: &Arc<Self>) -> bool {
        Arc::strong_count(gate) as u64 <= gate.followers.load(Ordering::Relaxed)
    }

    /// Asks for a rebuild this instance needs because it may have missed
    /// creates (its change-feed position was lost, rows were written that
    /// no entry names): until one succeeds, a filter "no" is
    /// [`Verdict::Unvouched`]; a failed rebuild is retried with backoff.
    /// Calls `done` once a rebuild succeeded.
    pub fn rebuild_owed(self: &Arc<Self>, done: impl FnOnce() + Send + 'static) {
        self.owed_rebuilds.fetch_add(1, Ordering::Relaxed);
        let gate = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut backoff = Duration::from_millis(100);
            loop {
                let Some(g) = gate.upgrade() else { return };
                let ticket = g.request_rebuild();
                drop(g);
                let ok = ticket.wait().await.is_ok();
                let Some(g) = gate.upgrade() else { return };
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

    /// True while a rebuild asked for by [`Gate::rebuild_owed`] has not
    /// succeeded yet (the filter may lack creates).
    #[must_use]
    pub fn rebuild_is_owed(&self) -> bool {
        self.owed_rebuilds.load(Ordering::Relaxed) > 0
    }

    /// False while this instance is out of step with the change feed.
    #[must_use]
    pub fn in_step(&self) -> bool {
        self.in_step.load(Ordering::Relaxed)
    }

    /// Filter "no"s passed on because the instance was out of step.
    #[must_use]
    pub fn unvouched(&self) -> u64 {
        self.unvouched.get()
    }

    /// Counts a final verdict: rejected, or passed (a disabled gate
    /// counts nothing).
    #[inline]
    pub fn tally(&self, verdict: Verdict) {
        match verdict {
            Verdict::Reject => self.rejected.incr(),
            Verdict::Pass => self.passed.incr(),
            Verdict::Open if self.config.enabled => self.passed.incr(),
            Verdict::Open => {}
            Verdict::Unvouched => {
                self.passed.incr();
                self.unvouched.incr();
            }
        }
    }

    /// Adds a new id, to the filter being built first, then the published
    /// one; raises the capacity alarm when the filter fills past its size.
    pub fn insert<K: BloomKey>(self: &Arc<Self>, id: K) {
        let past = {
            let _slots = lock(&self.slots);
            if let Some(f) = self.building.load().as_deref() {
                f.insert(&id);
            }
            let current = self.current.load();
            current.as_deref().and_then(|f| {
                f.insert(&id);
                let (items, capacity) =
                    (f.as_filter().items(), self.capacity.load(Ordering::Relaxed));
                (items > capacity).then_some(Alarm::PastCapacity { items, capacity })
            })
        };
        if let Some(alarm) = past {
            self.raise(alarm);
        }
    }

    /// Adds an id another instance created (from the change log): always
    /// to a filter being built, to the published one only if it does not
    /// already answer "maybe" (so replays do not inflate the item count).
    pub fn learn<K: BloomKey>(self: &Arc<Self>, id: K) {
        let _slots = lock(&self.slots);
        if let Some(f) = self.building.load().as_deref() {
            f.insert(&id);
        }
        if let Some(f) = self.current.load().as_deref() {
            if !f.contains(&id) {
                f.insert(&id);
            }
        }
    }

    /// Makes sure an id this instance just created is in the filters (a
    /// no-op unless one was swapped in since [`Gate::insert`]); counts
    /// nothing twice.
    pub fn ensure<K: BloomKey>(&self, id: K) {
        // A scan rebuild's filter gets the row from its scan (the commit
        // came first); only an adopted one (no scan) needs it here, and
        // skipping the other keeps `added` from counting it twice.
        let _slots = lock(&self.slots);
        let building = (!self.is_rebuilding()).then_some(&self.building);
        for slot in building.into_iter().chain([&self.current]) {
            if let Some(f) = slot.load().as_deref() {
                if !f.contains(&id) {
                    f.insert(&id);
                }
            }
        }
    }

    /// Notes that a request the filter passed found no SKU.
    pub fn note_passed_missing(&self) {
        self.passed_missing.incr();
    }

    /// Raises `alarm` unless one is in force (one warning per crossing) and,
    /// with auto-rebuild on, asks for a rebuild sized for twice the items.
    fn raise(self: &Arc<Self>, alarm: Alarm) {
        {
            let mut current = lock(&self.alarm);
            if current.is_some() {
                return;
            }
            *current = Some(alarm);
        }
        self.alarms_raised.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(
            ?alarm,
            auto_rebuild = self.config.auto_rebuild,
            "bloom filter alarm"
        );
        if self.config.auto_rebuild {
            let items = self
                .current
                .load()
                .as_deref()
                .map_or(0, |f| f.as_filter().items());
            self.min_capacity
                .fetch_max(items.saturating_mul(2), Ordering::Relaxed);
            drop(self.request_rebuild());
        }
    }

    /// The alarm the published filter deserves now, from its own figures
    /// (`fill` is the fill ratio, which costs a pass over the bits).
    fn structural_alarm(&self, fill: bool) -> Option<Alarm> {
        let guard = self.current.load();
        let f = guard.as_deref()?.as_filter();
        let (items, capacity) = (f.items(), self.capacity.load(Ordering::Relaxed));
        if items > capacity {
            return Some(Alarm::PastCapacity { items, capacity });
        }
        if fill {
            let fill_ratio = f.fill_ratio();
            if fill_ratio > 0.5 {
                return Some(Alarm::FillRatio { fill_ratio });
            }
        }
        None
    }

    /// One monitoring step: closes the window of missing ids, checks the
    /// observed rate against twice the expected one and the fill ratio,
    /// and raises or clears the alarm.
    pub fn monitor_step(self: &Arc<Self>) {
        let (rejected, passed_missing) = (self.rejected.get(), self.passed_missing.get());
        let (r0, p0) = std::mem::replace(&mut *lock(&self.window), (rejected, passed_missing));
        let (dr, dp) = (
            rejected.saturating_sub(r0),
            passed_missing.saturating_sub(p0),
        );
        let expected = self
            .current
            .load()
            .as_deref()
            .map(|f| f.as_filter().expected_fpr(f.as_filter().items()));
        let observed_alarm = match expected {
            Some(expected) if dr + dp >= MIN_WINDOW_SAMPLES => {
                let observed = dp as f64 / (dr + dp) as f64;
                (observed > 2.0 * expected).then_some(Alarm::ObservedFpr { observed, expected })
            }
            _ => None,
        };
        let observed_ok =
            expected.is_some() && dr + dp >= MIN_WINDOW_SAMPLES && observed_alarm.is_none();
        match self.structural_alarm(true).or(observed_alarm) {
            Some(alarm) => self.raise(alarm),
            None => {
                // An observed-rate alarm clears only after a full window
                // below the threshold; a structural one as soon as it holds.
                let mut current = lock(&self.alarm);
                let clears = match *current {
                    Some(Alarm::ObservedFpr { .. }) => observed_ok,
                    Some(_) => true,
                    None => false,
                };
                if clears {
                    *current = None;
                    tracing::info!("bloom filter alarm cleared");
                }
            }
        }
    }

    /// Runs [`Gate::monitor_step`] every `every` until the gate is dropped.
    pub fn spawn_monitor(self: &Arc<Self>, every: Duration) {
        let gate = Arc::downgrade(self);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                let Some(gate) = gate.upgrade() else {
                    return;
                };
                gate.monitor_step();
            }
        });
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
                    *lock(&self.last_error) = Some(e.to_string());
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
            error: outcome.as_ref().err().map(ToString::to_string),
        };
        let mut h = lock(&self.history);
        if h.len() == HISTORY {
            h.pop_front();
        }
        h.push_back(record);
    }

    /// One rebuild: the published filter changes only if it succeeds, and
    /// `building` is cleared either way.
    async fn rebuild_once(&self) -> Result<RebuildReport, RebuildError> {
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
        let count = self.keys.count_keys().await.map_err(store_err)?;
        let capacity = expected
            .max(count.saturating_mul(5) / 4)
            .max(self.min_capacity.load(Ordering::Relaxed));
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
        {
            let _slots = lock(&self.slots);
            self.building.store(Some(Arc::clone(&filter)));
        }
        let deleted_before = self.deleted_since_build.load(Ordering::Relaxed);
        let sink = |batch: KeyBatch<'_>| filter.insert_batch(batch);
        let added = self
            .keys
            .scan_keys(10_000, &sink)
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
        let alarm = *lock(&self.alarm);
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
            target_fpr: self.config.fpp,
            estimated_items: f.map_or(0.0, Filter::estimated_items),
            rebuilding: self.is_rebuilding(),
            rebuild_pending: pending,
            rebuild_requests: requests,
            rebuilds: self.rebuilds.load(Ordering::Relaxed),
            rebuild_failures: self.failures.load(Ordering::Relaxed),
            rebuild_retries: self.retries.load(Ordering::Relaxed),
            last_rebuild_error: lock(&self.last_error).clone(),
            last_rebuild_ms: self.last_rebuild_ms.load(Ordering::Relaxed),
            deleted_since_build: self.deleted_since_build.load(Ordering::Relaxed),
            passed_missing: self.passed_missing.get(),
            observed_fpr: {
                let (r, p) = (self.rejected.get(), self.passed_missing.get());
                if r + p == 0 {
                    0.0
                } else {
                    p as f64 / (r + p) as f64
                }
            },
            alarm: alarm.map(|a| a.to_string()),
            alarm_kind: alarm.map(|a| a.kind()),
            alarms_raised: self.alarms_raised.load(Ordering::Relaxed),
            snapshot_restores: self.restores.load(Ordering::Relaxed),
            adopted: self.adoptions.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::SkuStore;

    /// Sized filters reach half full only past their capacity, so the
    /// fill-ratio alarm is the safety net for a capacity that does not
    /// match the filter (here: set by hand). It fires on its own
    /// threshold, shows in stats, and is raised once.
    #[tokio::test]
    async fn a_filter_over_half_full_raises_the_fill_ratio_alarm() {
        let dir = tempfile::tempdir().unwrap();
        let store = SkuStore::connect(&format!("sqlite://{}/g.db", dir.path().display()))
            .await
            .unwrap();
        let gate = Arc::new(Gate::new(
            GateConfig {
                enabled: true,
                layout: BloomLayout::Blocked,
                expected: 1000,
                fpp: 0.01,
                auto_rebuild: false,
            },
            Arc::new(store),
        ));
        gate.request_rebuild().wait().await.unwrap();
        gate.capacity.store(u64::MAX, Ordering::Relaxed);
        for id in 0..500 {
            gate.insert(id);
        }
        gate.monitor_step();
        assert_eq!(gate.stats().alarm_kind, None, "{:?}", gate.stats());
        for id in 500..10_000 {
            gate.insert(id);
        }
        assert!(matches!(
            gate.structural_alarm(true),
            Some(Alarm::FillRatio { fill_ratio }) if fill_ratio > 0.5
        ));
        gate.monitor_step();
        gate.monitor_step();
        let s = gate.stats();
        assert_eq!(s.alarm_kind, Some("fill_ratio"));
        assert_eq!(s.alarms_raised, 1);
    }
}
