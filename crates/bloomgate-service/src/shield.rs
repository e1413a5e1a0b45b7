//! The shield: one guarded table's slot for its in-process Bloom filter of
//! every key, swapped atomically on rebuild, and when it vouches for a "no".
//!
//! * Not built yet (or disabled): every key passes (fail-open). The filter
//!   is an availability optimisation, never a correctness check.
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
//! Rebuilds are owned by the shield, not by whoever asked: [`Shield::request_rebuild`]
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

use arc_swap::ArcSwapOption;
use bloomgate_filter::BloomKey;
use tokio::sync::watch;

use crate::filter::BloomLayout;
pub use crate::filter::{filter_bytes, ShieldFilter};
use crate::sync::lock;

mod adopt;
mod alarm;
mod progress;
mod rebuild;
mod stats;

use crate::metrics::Counter;
use crate::pause::PausePoint;
use crate::source::KeyScan;
pub use adopt::{AdoptError, ChangeLog, FilterMeta, How, MetaRead, ReadError, Want};
pub use alarm::{Alarm, MIN_WINDOW_SAMPLES};
pub use progress::{Progress, ProgressStats, PAGE, PAGE_RETRIES};
use rebuild::{Completed, Requests};
pub use rebuild::{RebuildError, RebuildRecord, RebuildReport, RebuildTicket, HISTORY};
pub use stats::ShieldStats;

/// What the shield says about an id.
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

/// The shield's settings.
#[derive(Debug, Clone, Copy)]
pub struct ShieldConfig {
    /// Guard reads with the filter at all.
    pub enabled: bool,
    /// The filter's layout.
    pub layout: BloomLayout,
    /// Ids the filter is sized for, at least.
    pub expected: u64,
    /// Target false-positive rate.
    pub fpp: f64,
    /// Rebuild with room for twice the items when an alarm is raised.
    pub auto_rebuild: bool,
    /// Keys per second a rebuild's scan may read (all its readers); 0:
    /// no limit.
    pub scan_rows_per_sec: u64,
}

/// A test hook: a function a test may set, called at one place in the
/// shield (nothing in production sets one).
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

/// A follower's registration (see [`Shield::follow`]).
#[derive(Debug)]
pub struct FollowerGuard(std::sync::Weak<Shield>);

impl Drop for FollowerGuard {
    fn drop(&mut self) {
        if let Some(g) = self.0.upgrade() {
            g.followers.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// The shield. Cheap to share behind an `Arc`.
#[derive(Debug)]
pub struct Shield {
    config: ShieldConfig,
    keys: Arc<dyn KeyScan>,
    current: ArcSwapOption<ShieldFilter>,
    building: ArcSwapOption<ShieldFilter>,
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
    /// Test hook: where a rebuild's range stops after its page `n`.
    #[doc(hidden)]
    pub scan_page: PausePoint,
    /// Keys per page of a rebuild's scan ([`progress::PAGE`]; tests set
    /// fewer).
    #[doc(hidden)]
    pub page_rows: std::sync::atomic::AtomicUsize,
    /// The running (or last) rebuild's progress.
    progress: Progress,
    /// Pages of a rebuild's scan read again after failing.
    page_retries: AtomicU64,
    /// Keys the last successful scan added (the next one sizes for them).
    last_scanned: AtomicU64,
    /// The background row check's state (an index of `progress::ROW_CHECK`).
    row_check: std::sync::atomic::AtomicU8,
    /// The resource it guards, for the log (`skus` by default).
    name: Arc<str>,
    /// Serialises the two-slot writes (an insert into `building`, then
    /// `current`) with the swaps of those slots, so no insert can fall
    /// between a filter being published and the slot it was built in
    /// being cleared. Creates and followed changes take it, never reads.
    slots: Mutex<()>,
    /// Test hook, called inside [`Shield::finish_adopt`] between publishing
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
    /// Background tasks that hold the shield for as long as the service
    /// lives (the change followers): see [`Shield::only_followers_left`].
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
    /// The instance's shutdown signal (its own when used alone).
    background: crate::tasks::Background,
}

impl Shield {
    /// A shield that is not built yet, rebuilding from `keys`.
    #[must_use]
    pub fn new(config: ShieldConfig, keys: Arc<dyn KeyScan>) -> Self {
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
            scan_page: PausePoint::default(),
            page_rows: std::sync::atomic::AtomicUsize::new(progress::PAGE),
            progress: Progress::default(),
            page_retries: AtomicU64::new(0),
            last_scanned: AtomicU64::new(0),
            row_check: std::sync::atomic::AtomicU8::new(0),
            name: Arc::from(crate::sql::SKU_RESOURCE),
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
            background: crate::tasks::Background::new(),
        }
    }

    /// Ends the shield's loops (the monitor, owed rebuilds) at `bg`'s signal.
    #[must_use]
    pub fn with_background(mut self, bg: crate::tasks::Background) -> Self {
        self.background = bg;
        self
    }

    /// Names the resource it guards in its log lines.
    #[must_use]
    pub fn with_name(mut self, name: &str) -> Self {
        self.name = Arc::from(name);
        self
    }

    /// Records every rebuild's duration in `h` as well.
    #[must_use]
    pub fn with_rebuild_histogram(mut self, h: ::metrics::Histogram) -> Self {
        self.rebuild_seconds = h;
        self
    }

    /// The published filter, if any.
    pub fn published(&self) -> Option<Arc<ShieldFilter>> {
        self.current.load_full()
    }

    /// The filter being built or adopted, which inserts reach too (for
    /// tests of the swap's order).
    #[doc(hidden)]
    pub fn building(&self) -> Option<Arc<ShieldFilter>> {
        self.building.load_full()
    }

    /// Completed rebuilds (cheap, unlike [`Shield::stats`]).
    pub fn rebuild_count(&self) -> u64 {
        self.rebuilds.load(Ordering::Relaxed)
    }

    /// Items the published filter was sized for.
    pub fn capacity(&self) -> u64 {
        self.capacity.load(Ordering::Relaxed)
    }

    /// Starts adopting a filter made elsewhere (a snapshot, another
    /// instance's shared rebuild): it becomes the filter being built, so every insert from
    /// now on reaches it too. `None` when a rebuild runs here (its filter,
    /// published when it finishes, is as new).
    pub fn begin_adopt(&self, filter: ShieldFilter) -> Option<Arc<ShieldFilter>> {
        if self.is_rebuilding() {
            return None;
        }
        let filter = Arc::new(filter);
        let _slots = lock(&self.slots);
        // Only into an empty slot: never over a rebuild's filter.
        let prev = self
            .building
            .compare_and_swap(&None::<Arc<ShieldFilter>>, Some(Arc::clone(&filter)));
        prev.is_none().then_some(filter)
    }

    /// Drops an adoption [`Shield::begin_adopt`] started (nothing published).
    pub fn abandon_adopt(&self, filter: &Arc<ShieldFilter>) {
        let ours = Some(Arc::clone(filter));
        let _slots = lock(&self.slots);
        drop(self.building.compare_and_swap(&ours, None));
    }

    /// Publishes the filter [`Shield::begin_adopt`] started, sized for
    /// `capacity`, once the caller has replayed what it lacked; false (and
    /// nothing published) when a rebuild took over meanwhile. As a rebuild
    /// does: `current` first, then `building` cleared, under the slots
    /// lock, so every insert reaches the filter that ends up published.
    pub fn finish_adopt(&self, filter: &Arc<ShieldFilter>, capacity: u64) -> bool {
        self.finish(filter, capacity, How::Adopt)
    }

    /// [`Shield::finish_adopt`], counted as `how`.
    fn finish(&self, filter: &Arc<ShieldFilter>, capacity: u64, how: How) -> bool {
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
        match how {
            How::Adopt => {
                // Another instance's scan: the deletes counted here are
                // behind it as they are behind a scan of this instance's.
                self.deleted_since_build.store(0, Ordering::Relaxed);
                self.adoptions.fetch_add(1, Ordering::Relaxed)
            }
            How::Restore => self.restores.fetch_add(1, Ordering::Relaxed),
        };
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

    /// Judges an id; counts rejections and passes.
    #[inline]
    pub fn check<K: BloomKey>(&self, id: K) -> Verdict {
        let verdict = self.probe(id);
        self.tally(verdict);
        verdict
    }

    /// Judges many keys against one published filter with its batch
    /// call, and counts each as [`Shield::check`] does.
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

    /// Whether the shield is on (`cache.bloom_enabled`).
    #[must_use]
    pub fn enabled(&self) -> bool {
        self.config.enabled
    }

    /// Judges an id without counting it (see [`Shield::tally`]): for a caller
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

    /// Whether this shield vouches for its filter: on, built, in step with
    /// the change feed and owing no rebuild.
    #[must_use]
    pub fn vouches(&self) -> bool {
        self.config.enabled
            && self.in_step.load(Ordering::Relaxed)
            && self.owed_rebuilds.load(Ordering::Relaxed) == 0
            && self.current.load().is_some()
    }

    /// Whether the published filter holds `key` (`None`: the shield is off,
    /// has published no filter, or cannot vouch for it: out of step, or
    /// owing a rebuild).
    #[must_use]
    pub fn holds<K: BloomKey>(&self, key: K) -> Option<bool> {
        if !self.config.enabled
            || !self.in_step.load(Ordering::Relaxed)
            || self.owed_rebuilds.load(Ordering::Relaxed) > 0
        {
            return None;
        }
        self.current.load().as_deref().map(|f| f.contains(&key))
    }

    /// Says whether this instance can read the change feed: while it
    /// cannot, its filter's "no" is not turned into a 404. Returns true
    /// when that changed.
    pub fn set_in_step(&self, in_step: bool) -> bool {
        self.in_step.swap(in_step, Ordering::Relaxed) != in_step
    }

    /// Registers a follower task that holds `shield` (through its reader)
    /// until [`Shield::only_followers_left`]; the guard unregisters it.
    pub fn follow(shield: &Arc<Self>) -> FollowerGuard {
        shield.followers.fetch_add(1, Ordering::Relaxed);
        FollowerGuard(Arc::downgrade(shield))
    }

    /// True once nothing but follower tasks holds `shield`: the service
    /// was dropped and they should stop.
    #[must_use]
    pub fn only_followers_left(shield: &Arc<Self>) -> bool {
        Arc::strong_count(shield) as u64 <= shield.followers.load(Ordering::Relaxed)
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

    /// Counts a final verdict: rejected, or passed (a disabled shield
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

    /// Adds an id created here or elsewhere (from the outbox or the change
    /// log) to the filter being built and the published one, each only if
    /// it does not already answer "maybe": a "maybe" means every bit of the
    /// id is set, so nothing is lost, and replays (an own create seen again
    /// while a rebuild is paused, say) do not inflate the item count.
    pub fn learn<K: BloomKey>(self: &Arc<Self>, id: K) {
        let _slots = lock(&self.slots);
        for slot in [&self.building, &self.current] {
            if let Some(f) = slot.load().as_deref() {
                if !f.contains(&id) {
                    f.insert(&id);
                }
            }
        }
    }

    /// Makes sure an id this instance just created is in the filters (a
    /// no-op unless one was swapped in since [`Shield::insert`]); counts
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
}
