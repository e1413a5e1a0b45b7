//! The change outbox: every create, update and delete writes an entry into
//! `bloomgate_changes (seq, resource, item_key, kind, origin, at)` in the
//! same SQL transaction as its row (see `Database::insert`), so a write
//! that committed has its entry, and one that rolled back (a writer killed
//! mid-write) has none. Every instance follows the table: it adds the ids
//! other instances created to its filter and drops updated or deleted ids
//! from its L1. The Redis stream (`crate::feed::doorbell`) is only the doorbell
//! that makes this immediate (and the epochs' announcer); without Redis the follower reads
//! the table every `sql.outbox_poll_ms`. Nothing an instance must learn
//! lives only in Redis or in another process's memory.
//!
//! **Gaps.** Sequence numbers are taken when a transaction inserts its
//! entry and become visible when it commits, so seq 10 may appear after
//! seq 11. The follower keeps a cursor (the largest seq it has read) and
//! the set of smaller numbers it has not seen yet, each with the time it
//! was first missed; it reads each of those again on every poll until it
//! appears, or until it has been missing for `sql.outbox_gap_ms`, when it
//! is taken as rolled back (or skipped by the sequence). Its *watermark*,
//! the position it is complete up to, is just below the oldest open gap.
//! This is correct because a transaction cannot stay uncommitted that long
//! without noticing: a write that took more than half of
//! `sql.outbox_gap_ms` between taking its number and committing records
//! its change again, in a short transaction of its own, before it answers
//! (a follower first misses a number no earlier than the commit of a larger
//! one, which comes after the late transaction took its own). At most
//! [`MAX_GAPS`] numbers are tracked; a jump past that asks for a rebuild.
//!
//! **Late commits.** Another program's transaction, whose entry a capture
//! trigger wrote, may stay open longer than any wait, and nobody re-records
//! it. So a given-up number is not forgotten: it joins the follower's late
//! set (`late`), looked for every 5 s by a task of its own (a large late
//! transaction is applied a page at a time and never holds up the poll
//! that keeps the instance in step). So do the numbers of a jump past
//! [`MAX_GAPS`] (one run, beside the rebuild it asks for: a rebuild
//! cannot see rows still uncommitted) and, at start, those missing among
//! the [`MAX_LATE`] before the start position. Found, an entry is applied
//! and recorded again under a new number. Nothing positioned past the old
//! number misses it: every follower that ran past it has it in its own
//! late set; a snapshot or epoch whose watermark passed it was either
//! copied after the new entry was applied (the filter has the key) or is
//! replayed from a watermark below the new entry (the replay has it); a
//! follower that starts later starts below the new entry. Past
//! [`MAX_LATE`] runs the oldest are watched by their count instead (a
//! late commit there rebuilds every filter and records a rebuild entry).
//! Bounds, each reaching the filter at its next rebuild only: a number
//! the outbox trimmed past before it committed (a transaction open longer
//! than the retention, counted as `late_abandoned`); a number given up by
//! a process that restarted, more than [`MAX_LATE`] numbers before the
//! new start position.
//!
//! **Positions.** A new follower starts at the largest seq whose entry is
//! older than twice `sql.outbox_gap_ms` (ages by the database's clock,
//! which every instance shares) (every smaller number was taken
//! longer ago than any of the service's transactions stays open; another
//! program's, under capture, may stay open longer: see **Late commits**
//! and `seed_late`), and re-applies the newer
//! entries, which is harmless: applying an entry twice changes nothing.
//! Snapshots and shared rebuilds record the watermark taken before their
//! filter was copied or scanned, and whoever loads them replays the
//! creates after it from this table before publishing.
//!
//! **Trimming.** Entries older than `sql.outbox_retention_secs` are
//! deleted, and the largest deleted seq is kept in `bloomgate_outbox_state`
//! (`trimmed_through`): a follower whose watermark is below it cannot know
//! what it missed, and rebuilds its filter and empties its L1.
//!
//! **Out of step.** An instance that has not read this table for
//! `sql.out_of_step_ms` cannot vouch for its filter (the doorbell stream
//! does not count: it holds no change): it empties L1 and the shield stops
//! turning a filter "no" into a 404 (see `Verdict::Unvouched`) until a read
//! succeeds again, and stats, `/metrics` and a log line say so. The same
//! holds while a rebuild this follower asked for because it may have
//! missed creates has not succeeded (`Shield::rebuild_owed`).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use crate::config::SqlConfig;
use crate::model::now_millis;
use crate::pause::PausePoint;
use crate::sql::{Database, StoreError};
use crate::sync::lock;

mod apply;
mod follow;
mod late;
mod listen;
mod trim;

pub use trim::{Trimmed, TRIM_BATCH};

pub use crate::sql::outbox::Entry;
pub use apply::{Change, Follower};

/// Entries read per statement.
const PAGE: usize = 1000;
/// Open gaps tracked at most; a larger jump asks for a rebuild.
pub const MAX_GAPS: usize = 100_000;
/// Runs of given-up numbers watched for a late commit at most (the
/// oldest go).
pub const MAX_LATE: usize = 10_000;
/// How often given-up numbers are looked for.
const LATE_EVERY: Duration = Duration::from_secs(5);
/// How often `trimmed_through` is read while polls succeed (and on the
/// first success after a failure).
const TRIM_CHECK_EVERY: Duration = Duration::from_secs(30);
/// How often each instance trims the table (more often when the
/// retention is shorter).
const TRIM_EVERY: Duration = Duration::from_secs(60);

/// Counters of the follower.
#[derive(Debug, Default)]
pub struct OutboxCounters {
    /// Entries from other instances applied here.
    pub applied: AtomicU64,
    /// Successful reads of the table.
    pub polls: AtomicU64,
    /// Failed reads (SQL down or slow).
    pub poll_failures: AtomicU64,
    /// Sequence numbers found missing (a gap opened).
    pub gaps: AtomicU64,
    /// Gaps that filled in later (a transaction committed out of order).
    pub gaps_filled: AtomicU64,
    /// Gaps given up after `sql.outbox_gap_ms` (rolled back).
    pub gaps_expired: AtomicU64,
    /// Rebuilds this follower asked for (its position was trimmed, a
    /// rebuild entry, or a jump past [`MAX_GAPS`]).
    pub rebuilds: AtomicU64,
    /// Times this instance went out of step.
    pub out_of_step: AtomicU64,
    /// Entries this instance deleted as too old.
    pub trimmed: AtomicU64,
    /// Given-up numbers whose entry appeared later (a transaction that
    /// stayed open past `sql.outbox_gap_ms`): applied late.
    pub late_applied: AtomicU64,
    /// Given-up numbers forgotten once the outbox trimmed past them (a
    /// transaction open longer than `sql.outbox_retention_secs`). A span
    /// counts every number it covers, seen ones among them: past
    /// [`MAX_LATE`] runs this is an upper bound.
    pub late_abandoned: AtomicU64,
    /// Given-up numbers moved from the runs looked up one by one to the
    /// spans watched by their count ([`MAX_LATE`] runs exceeded).
    pub late_spanned: AtomicU64,
    /// Rebuilds of every filter after a span's count grew (a late commit
    /// among numbers not looked up one by one).
    pub late_rebuilds: AtomicU64,
    /// Checks that found a captured table's triggers missing or changed.
    pub capture_lost: AtomicU64,
    /// Times the outbox went back behind this instance's position (a
    /// restore, a failover to a lagging replica): each a rebuild.
    pub rewound: AtomicU64,
}

/// The captured tables and what their checks found.
#[derive(Debug, Default)]
struct CaptureWatch {
    /// The tables whose triggers are checked.
    targets: Vec<crate::sql::CaptureTarget>,
    /// Resources whose triggers do not fire and could not be installed
    /// again: their filters do not vouch until they are back and rebuilt.
    lost: std::collections::BTreeSet<String>,
    /// Resources whose triggers were installed again after writes went
    /// unrecorded: a rebuild entry asking every instance is still owed,
    /// naming the triggers this instance's own rebuild was owed for (their
    /// fingerprint, when read).
    announce: std::collections::BTreeMap<String, Option<String>>,
    /// Resources that scan at this start (see `Outbox::scans_at_start`).
    scan_at_start: std::collections::BTreeSet<String>,
    /// Each resource's triggers as last found current
    /// (`CaptureState::fingerprint`): another one at the next check means
    /// they were made again or enabled again in between, so writes may
    /// have gone unrecorded though no check found them missing.
    seen: std::collections::BTreeMap<String, String>,
    /// The triggers the latest rebuild request read or recorded for each
    /// resource names (its key `capture:{fingerprint}`): triggers found
    /// replaced by that one are already being rebuilt for.
    announced: std::collections::BTreeMap<String, String>,
}

#[derive(Debug, Default)]
struct Follow {
    /// The largest seq read.
    cursor: i64,
    /// Per table: rebuild requests up to here are covered by its filter
    /// (see [`Outbox::max_seq`]).
    rebuilds_covered: BTreeMap<String, i64>,
    /// Per table: the newest rebuild request acted on here (an entry
    /// applied, or one this instance recorded after a capture gap).
    rebuilds_requested: BTreeMap<String, i64>,
    /// Smaller numbers not seen yet, with when they were first missed.
    gaps: BTreeMap<i64, Instant>,
    /// Numbers given up as gaps, still looked for every [`LATE_EVERY`]
    /// until the outbox trims past them (a long transaction may still
    /// commit them).
    late: late::Late,
    /// When `trimmed_through` was last read.
    trim_checked: Option<Instant>,
    /// The entry at `cursor` as read: every read starts at it again, to
    /// notice the outbox going back (see `follow`'s `rewound`).
    at_cursor: Option<Entry>,
    /// The keys of the rebuild entries read lately, `(resource, key)`, at
    /// most [`REQUESTS_KEPT`]: a copy of one (recorded again after a slow
    /// insert, or a second instance asking for the same triggers) is not
    /// acted on again.
    requests_read: std::collections::VecDeque<(String, String)>,
}

/// Rebuild-entry keys remembered (see `Follow::requests_read`): requests
/// are rare, and a copy read after its key was forgotten costs one more
/// rebuild, nothing else.
const REQUESTS_KEPT: usize = 256;

impl Follow {
    /// Gives up `from..=to` as gaps: watched as late (see [`late`]).
    /// Returns how many numbers moved from runs to spans.
    fn give_up(&mut self, from: i64, to: i64) -> u64 {
        self.late.add(from, to, &self.gaps)
    }

    fn watermark(&self) -> i64 {
        self.gaps.keys().next().map_or(self.cursor, |g| g - 1)
    }
}

/// The follower's handle. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Outbox {
    pub(crate) store: Database,
    poll: Duration,
    /// The poll interval while a doorbell is healthy.
    idle_poll: Duration,
    /// When a doorbell (the Redis stream's blocking read, PostgreSQL's
    /// `LISTEN`) last answered, ms since the epoch.
    doorbell_ok_ms: Arc<AtomicU64>,
    gap_wait: Duration,
    retention: Duration,
    pub(crate) out_of_step: Duration,
    follow: Arc<Mutex<Follow>>,
    doorbell: Arc<Notify>,
    /// When a read of the table last succeeded (ms since the epoch).
    last_ok_ms: Arc<AtomicU64>,
    /// The position this follower applies every entry after
    /// (`i64::MAX` before it starts).
    since: Arc<std::sync::atomic::AtomicI64>,
    running: Arc<AtomicBool>,
    /// Counters, shared by clones.
    pub counters: Arc<OutboxCounters>,
    /// Test hook: where the follower waits before each read.
    #[doc(hidden)]
    pub before_poll: Arc<PausePoint>,
    /// Every guarded table, by resource name: their entries are applied
    /// to them (see [`Follower`]).
    tables: Arc<Mutex<BTreeMap<String, std::sync::Weak<dyn Follower>>>>,
    /// The tables whose capture triggers this instance relies on (checked
    /// again at each trim, see `Outbox::recheck_capture`).
    captured: Arc<Mutex<CaptureWatch>>,
    /// The instance's shutdown signal.
    background: crate::tasks::Background,
}

impl Outbox {
    /// The outbox of `store`, with the timings of `c`.
    #[must_use]
    pub fn new(store: Database, c: &SqlConfig) -> Self {
        Self {
            store,
            poll: Duration::from_millis(c.outbox_poll_ms),
            // At most a third of `out_of_step_ms`, so a quiet instance
            // never falls out of step between two polls.
            idle_poll: Duration::from_millis(
                c.outbox_idle_poll_ms
                    .min(c.out_of_step_ms / 3)
                    .max(c.outbox_poll_ms),
            ),
            doorbell_ok_ms: Arc::default(),
            gap_wait: Duration::from_millis(c.outbox_gap_ms),
            retention: Duration::from_secs(c.outbox_retention_secs),
            out_of_step: Duration::from_millis(c.out_of_step_ms),
            follow: Arc::default(),
            doorbell: Arc::new(Notify::new()),
            last_ok_ms: Arc::new(AtomicU64::new(now_millis())),
            since: Arc::new(std::sync::atomic::AtomicI64::new(i64::MAX)),
            running: Arc::default(),
            counters: Arc::default(),
            before_poll: Arc::default(),
            tables: Arc::default(),
            captured: Arc::default(),
            background: crate::tasks::Background::new(),
        }
    }

    /// Ends the follower and the watchdog at `bg`'s signal.
    #[must_use]
    pub fn with_background(mut self, bg: crate::tasks::Background) -> Self {
        self.background = bg;
        self
    }

    /// The capture targets to check again while running, and those whose
    /// triggers this start installed after writes went unrecorded
    /// (`feed::capture::install_missing`): these scan instead of adopting
    /// a positioned filter, and every other instance is asked to rebuild
    /// them (an outbox entry, recorded once the follower runs).
    pub fn set_captured(&self, targets: Vec<crate::sql::CaptureTarget>, gaps: Vec<String>) {
        let mut c = lock(&self.captured);
        c.targets = targets;
        // Owed for the triggers found at start (`saw_triggers`).
        for g in &gaps {
            let seen = c.seen.get(g).cloned();
            c.announce.insert(g.clone(), seen);
        }
        c.scan_at_start.extend(gaps);
    }

    /// Whether `resource`'s capture triggers were installed at this start
    /// after its writes went unrecorded: no snapshot or epoch is adopted
    /// for it (one may lack those rows).
    #[must_use]
    pub fn scans_at_start(&self, resource: &str) -> bool {
        lock(&self.captured).scan_at_start.contains(resource)
    }

    /// `resource`'s triggers as found current at start
    /// (`CaptureState::fingerprint`): the checks compare with it.
    pub fn saw_triggers(&self, resource: &str, fingerprint: &str) {
        lock(&self.captured)
            .seen
            .insert(resource.to_owned(), fingerprint.to_owned());
    }

    /// Notes `fingerprint` as `resource`'s triggers now; whether they
    /// were others at the last look and no rebuild request names these
    /// yet (whoever made them again asks for one; an instance that reads
    /// it rebuilds, so a second request is not owed).
    pub(super) fn triggers_replaced(&self, resource: &str, fingerprint: &str) -> bool {
        let mut c = lock(&self.captured);
        let before = c.seen.insert(resource.to_owned(), fingerprint.to_owned());
        before.is_some_and(|b| b != fingerprint)
            && c.announced.get(resource).map(String::as_str) != Some(fingerprint)
    }

    /// A rebuild request for `resource` named triggers `fingerprint`
    /// (`seen` is left alone: only this instance's own checks set it, so
    /// two instances that tagged the same triggers differently cost one
    /// request more, never one at every check).
    pub(super) fn announced_for(&self, resource: &str, fingerprint: &str) {
        lock(&self.captured)
            .announced
            .insert(resource.to_owned(), fingerprint.to_owned());
    }

    /// Whether `resource`'s capture triggers were last found not firing,
    /// and could not be installed again: writes by other programs are not
    /// recorded, so its filter's "no" is not vouched for.
    #[must_use]
    pub fn capture_is_lost(&self, resource: &str) -> bool {
        lock(&self.captured).lost.contains(resource)
    }

    /// A doorbell answered (a blocking read returned, with or without
    /// news): while one does, the follower polls every
    /// `sql.outbox_idle_poll_ms` instead of `sql.outbox_poll_ms`.
    pub fn doorbell_ok(&self) {
        self.doorbell_ok_ms.store(now_millis(), Ordering::Relaxed);
    }

    /// A doorbell failed (its connection dropped): the follower polls at
    /// `sql.outbox_poll_ms` from now, not after the 3 s a silent doorbell
    /// is given, and reads the outbox at once for what the doorbell may
    /// have missed. A doorbell that still answers marks it healthy again.
    pub fn doorbell_lost(&self) {
        self.doorbell_ok_ms.store(0, Ordering::Relaxed);
        self.ring();
    }

    /// Whether a doorbell answered within the last 3 s (each answers at
    /// least every second: its blocking reads time out then).
    #[must_use]
    pub fn doorbell_healthy(&self) -> bool {
        now_millis().saturating_sub(self.doorbell_ok_ms.load(Ordering::Relaxed)) < 3_000
    }

    /// How long the follower waits for a doorbell before polling anyway.
    fn poll_wait(&self) -> Duration {
        if self.doorbell_healthy() {
            self.idle_poll
        } else {
            self.poll
        }
    }

    /// Wakes the follower now (another instance announced a change).
    pub fn ring(&self) {
        self.doorbell.notify_one();
    }

    /// The position this instance's filter is complete up to.
    #[must_use]
    pub fn watermark(&self) -> i64 {
        lock(&self.follow).watermark()
    }

    /// The position after which this follower has applied, or will
    /// apply, every entry: where it started, or jumped to (a trimmed
    /// position, a rewound outbox). `i64::MAX` before it starts.
    #[must_use]
    pub fn followed_since(&self) -> i64 {
        self.since.load(Ordering::Relaxed)
    }

    fn follow_from(&self, from: i64) {
        self.since.store(from, Ordering::Relaxed);
    }

    /// When a read of the table last succeeded, ms since the epoch.
    #[must_use]
    pub fn last_ok_ms(&self) -> u64 {
        self.last_ok_ms.load(Ordering::Relaxed)
    }

    /// `resource`'s rebuild requests (`r` entries) up to here are covered
    /// by its published filter, or by a rebuild that already started.
    #[must_use]
    pub fn rebuilds_covered(&self, resource: &str) -> i64 {
        lock(&self.follow)
            .rebuilds_covered
            .get(resource)
            .copied()
            .unwrap_or(0)
    }

    /// Whether a rebuild entry of `resource` keyed `key` is the first read
    /// here (noted now). Empty keys (older releases) are always first.
    fn first_request(&self, resource: &str, key: &str) -> bool {
        if key.is_empty() {
            return true;
        }
        let mut f = lock(&self.follow);
        let read = &mut f.requests_read;
        if read.iter().any(|(r, k)| r == resource && k == key) {
            return false;
        }
        if read.len() == REQUESTS_KEPT {
            read.pop_front();
        }
        read.push_back((resource.to_owned(), key.to_owned()));
        true
    }

    /// Notes that a rebuild of `resource` was asked for at `seq`: a
    /// positioned filter covering less is not adopted after it.
    pub fn note_rebuild_requested(&self, resource: &str, seq: i64) {
        let mut f = lock(&self.follow);
        let r = f.rebuilds_requested.entry(resource.to_owned()).or_default();
        *r = (*r).max(seq);
    }

    /// Notes that `resource`'s published filter holds the rows of every
    /// rebuild request up to `seq` (it was scanned, or adopted from a
    /// scan, after [`Outbox::max_seq`] returned `seq`).
    pub fn cover(&self, resource: &str, seq: i64) {
        let mut f = lock(&self.follow);
        let c = f.rebuilds_covered.entry(resource.to_owned()).or_default();
        *c = (*c).max(seq);
    }

    /// Open gaps.
    #[must_use]
    pub fn open_gaps(&self) -> usize {
        lock(&self.follow).gaps.len()
    }

    /// Where a new follower may start (see the module docs): the largest
    /// seq whose entry is older than twice `sql.outbox_gap_ms`, and never
    /// below what was trimmed.
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn start_position(&self) -> Result<i64, StoreError> {
        let age = 2 * self.gap_wait.as_millis() as i64;
        let old = self.store.outbox_older_than(age).await?;
        Ok(old.max(self.trimmed_through().await?))
    }

    /// The largest visible seq. A filter scanned from SQL after this call
    /// holds the rows of every rebuild request (`r`) up to it (recorded
    /// after its rows commit; a smaller number was taken before).
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn max_seq(&self) -> Result<i64, StoreError> {
        self.store.outbox_max_seq().await
    }

    /// The largest seq deleted as too old.
    async fn trimmed_through(&self) -> Result<i64, StoreError> {
        self.store.outbox_trimmed_through().await
    }

    /// Up to [`PAGE`] entries from `cursor` on, in seq order.
    async fn page_at(&self, cursor: i64) -> Result<Vec<Entry>, StoreError> {
        self.store.outbox_page(cursor, PAGE).await
    }

    /// The entries among `seqs` that are visible now.
    async fn among(&self, seqs: &[i64]) -> Result<Vec<Entry>, StoreError> {
        self.store.outbox_among(seqs).await
    }

    /// The keys of `resource` created after `from`, as the entries spell
    /// them (a resource's keys are no SKU ids, even when they parse); `None`
    /// when entries after `from` were trimmed.
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn created_keys_after(
        &self,
        from: i64,
        resource: &str,
    ) -> Result<Option<Vec<String>>, StoreError> {
        if self.trimmed_through().await? > from {
            return Ok(None);
        }
        let mut created = Vec::new();
        let mut cursor = from;
        loop {
            let page = self.page_at(cursor + 1).await?;
            for e in &page {
                if e.kind == crate::wire::kind::CREATED && e.resource == resource {
                    created.push(e.key.clone());
                }
                cursor = e.seq;
            }
            if page.len() < PAGE {
                // A trim between the check above and these reads would
                // have deleted some of them: check again.
                if self.trimmed_through().await? > from {
                    return Ok(None);
                }
                return Ok(Some(created));
            }
        }
    }
}

impl crate::shield::ChangeLog for Outbox {
    fn max_seq(&self) -> impl std::future::Future<Output = Result<i64, StoreError>> + Send {
        Outbox::max_seq(self)
    }

    fn created_keys_after(
        &self,
        from: i64,
        resource: &str,
    ) -> impl std::future::Future<Output = Result<Option<Vec<String>>, StoreError>> + Send {
        Outbox::created_keys_after(self, from, resource)
    }

    fn rebuild_requested(&self, resource: &str) -> i64 {
        lock(&self.follow)
            .rebuilds_requested
            .get(resource)
            .copied()
            .unwrap_or(0)
    }
}
