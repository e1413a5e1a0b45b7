//! The shared filter in Redis (`cache.bloom_mode = "strict"`): one
//! `bloomgate-redis` filter under `{prefix}bloom`, in the blocked layout,
//! sized for `cache.bloom_expected` at `cache.bloom_fpp` (split into
//! strings of `cache.bloom_segment_bytes`), that every
//! instance adds its creates to (after the SQL commit). A "no" from the
//! in-process replica is confirmed here before a 404 (one `GETRANGE`). So
//! an id is refused only when both say no: the replica holds everything
//! in SQL at its build plus what the outbox delivered, the shared
//! filter every create since it was filled. Any failure (timeout, Redis
//! down, the bit string lost with a Redis restart) answers "maybe", never
//! "no"; the SQL bulkhead bounds what then reaches the database. A lost
//! string (or one lost segment) is refilled from SQL in the background,
//! and never read as zeros meanwhile: an insert refuses a segment that is
//! not whole (it would create zeros up to its block), and the refill
//! builds the filter here and uploads each segment whole in one step, so
//! a segment is either missing ("maybe") or complete. The first fill is
//! made the same way: the filter is created without segments (never
//! allocated as zeros, which another instance would read as "no" for
//! every key not filled yet). Creates that arrive while a fill or refill
//! runs (their inserts refused) are kept and added into the upload and
//! after it.
//!
//! Every resource in `strict` or `redis` mode has one of its own, under
//! `{prefix}rf:{name}:bloom`, filled from its source's key scan; its `keys`
//! calls add to it before they answer. Fills and refills read the scan a
//! page at a time (one page in memory), under
//! `cache.bloom_scan_rows_per_sec`.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bloomgate_filter::{BlockedBloom, BloomKey, HashPair};
use bloomgate_redis::{Conn, RedisBloom};

use crate::filter::KeyBatch;
use crate::key::Key;
use crate::redis_link::RedisTarget;
use crate::source::{KeyRange, KeyScan};
use crate::sql::StoreError;

/// A key as its hashes under the shared filter's seed (0): what a refill
/// keeps of the creates that arrive while it runs.
#[derive(Clone, Copy)]
struct Hashed(HashPair);

impl BloomKey for Hashed {
    fn hash_pair(&self, _seed: u64) -> HashPair {
        self.0
    }
}

/// One page of a key scan, owned.
enum Page {
    Ints(Vec<i64>),
    Keys(Vec<Key>),
}

/// The fills [`SharedFilter::fill_in_background`] was asked for: owed
/// while `asked` is past `done` (the `asked` value a successful scan began
/// at), run by one task at a time.
#[derive(Debug, Default)]
struct Fills {
    asked: AtomicU64,
    done: AtomicU64,
    running: AtomicBool,
}

/// Keys per page of a fill, at most.
const FILL_PAGE: usize = 10_000;

/// The source's keys, one page held at a time, at most `limit` keys a
/// second (`cache.bloom_scan_rows_per_sec`; 0: no limit): what a fill
/// and a refill read, so a 10^8-key table neither sits in memory whole
/// nor is read faster than a rebuild may.
struct Pages<'a> {
    keys: &'a dyn KeyScan,
    ranges: std::vec::IntoIter<KeyRange>,
    /// The range being read, and the last key read of it.
    at: Option<(KeyRange, Option<Key>)>,
    batch: usize,
    limit: u64,
    started: Instant,
    read: u64,
}

impl<'a> Pages<'a> {
    async fn open(keys: &'a dyn KeyScan, limit: u64) -> Result<Self, StoreError> {
        // One reader: a descending range only ever pairs with a full
        // ascending one (`KeyRange::meeting`), which reads it all.
        let mut ranges = keys.ranges().await?;
        ranges.retain(|r| !r.descending);
        let batch = match limit {
            0 => FILL_PAGE,
            // About a tenth of a second's worth: an even load.
            l => usize::try_from(l / 10)
                .unwrap_or(FILL_PAGE)
                .clamp(100, FILL_PAGE),
        };
        Ok(Self {
            keys,
            ranges: ranges.into_iter(),
            at: None,
            batch,
            limit,
            started: Instant::now(),
            read: 0,
        })
    }

    /// The next page (in the parts its sink was handed), `None` at the end.
    async fn next(&mut self) -> Result<Option<Vec<Page>>, StoreError> {
        loop {
            if self.at.is_none() {
                match self.ranges.next() {
                    Some(r) => self.at = Some((r, None)),
                    None => return Ok(None),
                }
            }
            if let Some(ms) = self.read.saturating_mul(1000).checked_div(self.limit) {
                if let Some(wait) = Duration::from_millis(ms).checked_sub(self.started.elapsed()) {
                    tokio::time::sleep(wait).await;
                }
            }
            let parts = std::sync::Mutex::new(Vec::new());
            let sink = |batch: KeyBatch<'_>| {
                crate::sync::lock(&parts).push(match batch {
                    KeyBatch::Ints(ids) => Page::Ints(ids.to_vec()),
                    KeyBatch::Keys(keys) => Page::Keys(keys.to_vec()),
                });
            };
            let Some((range, after)) = &self.at else {
                continue;
            };
            let page = self
                .keys
                .page(range, after.as_ref(), self.batch, &sink)
                .await?;
            self.read += page.keys as u64;
            if page.keys < self.batch {
                self.at = None;
            } else if let Some((_, after)) = &mut self.at {
                *after = page.last;
            }
            let parts = parts
                .into_inner()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if !parts.is_empty() {
                return Ok(Some(parts));
            }
        }
    }
}

/// Counters of the shared filter.
#[derive(Debug, Default)]
pub struct SharedCounters {
    /// Checks sent to Redis.
    pub checks: AtomicU64,
    /// Replica "no"s that Redis turned into "maybe" (`strict`).
    pub overruled: AtomicU64,
    /// Checks and inserts that failed or timed out (answered "maybe").
    pub errors: AtomicU64,
    /// Times the bit string was found missing and refilled.
    pub refills: AtomicU64,
}

/// The shared filter and how this instance talks to it.
#[derive(Clone)]
pub struct SharedFilter {
    bloom: RedisBloom,
    conn: Conn,
    key: String,
    expected: u64,
    fpp: f64,
    segment_bytes: u64,
    timeout: Duration,
    /// Where its keys come from when it is filled: the SKU table, or a
    /// resource's source.
    keys: Arc<dyn KeyScan>,
    /// Keys a second a fill may read (0: no limit).
    scan_limit: u64,
    refilling: Arc<AtomicBool>,
    /// Fills asked for after unnamed writes, and their runner.
    fills: Arc<Fills>,
    /// Creates that arrived while a refill runs (their inserts refused).
    pending: Arc<std::sync::Mutex<Vec<HashPair>>>,
    /// Counters, shared by clones.
    pub counters: Arc<SharedCounters>,
    /// The instance's shutdown signal (ends a refill).
    background: crate::tasks::Background,
    /// Made (and filled) by this instance's start: it holds every row
    /// written before its fill's scan.
    pub(crate) created_here: bool,
}

impl std::fmt::Debug for SharedFilter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedFilter")
            .field("key", &self.key)
            .field("bloom", &self.bloom)
            .finish_non_exhaustive()
    }
}

/// Why the shared filter did not take keys, or could not be refilled.
#[derive(Debug, thiserror::Error)]
pub enum SharedFailure {
    /// Redis failed (or the filter's metadata is missing).
    #[error(transparent)]
    Redis(#[from] bloomgate_redis::Error),
    /// Redis did not answer within `redis_timeout_ms`.
    #[error("timed out")]
    TimedOut,
    /// The refill's scan of the source failed.
    #[error("scanning SQL: {0}")]
    Scan(#[from] StoreError),
    /// The refill's local filter could not be made.
    #[error(transparent)]
    Filter(#[from] bloomgate_filter::Error),
}

/// Why the shared filter could not be opened at start.
#[derive(Debug, thiserror::Error)]
#[error("shared filter {key}: {source}{hint}")]
pub struct SharedError {
    key: String,
    source: bloomgate_redis::Error,
    hint: &'static str,
}

impl SharedFilter {
    /// Its key in Redis (see [`crate::wire::shared_filter_key`]).
    #[must_use]
    pub fn key(&self) -> &str {
        &self.key
    }

    /// Whether a fill asked for by [`Self::fill_in_background`] has not
    /// ended yet (none since the request succeeded): keys written that no
    /// entry named may be missing from the filter until then.
    #[must_use]
    pub fn fill_owed(&self) -> bool {
        self.fills.asked.load(Ordering::Acquire) > self.fills.done.load(Ordering::Acquire)
    }

    /// Merges every key of the source into the filter again, in the
    /// background (`BITOP OR`: what other instances add meanwhile stays):
    /// after rows were written that no outbox entry names (a capture gap,
    /// a warm's rebuild, numbers given up). Owed at once ([`Self::fill_owed`]),
    /// until a scan that began after this call succeeds: a fill or refill
    /// already running when it is asked for does not count, and failures
    /// are retried (with a backoff up to 30 s) until the instance ends.
    pub(crate) fn fill_in_background(&self) {
        self.fills.asked.fetch_add(1, Ordering::AcqRel);
        self.run_fills();
    }

    /// Starts the one task that runs owed fills, unless it runs.
    fn run_fills(&self) {
        if self.fills.running.swap(true, Ordering::AcqRel) {
            return;
        }
        tracing::info!(key = %self.key, "rows were written that no change named: adding every key from the source to the shared filter");
        let this = self.clone();
        self.background.spawn(async move {
            let mut wait = Duration::from_secs(1);
            loop {
                let asked = this.fills.asked.load(Ordering::Acquire);
                if this.fills.done.load(Ordering::Acquire) >= asked {
                    break;
                }
                // One scan at a time: a refill of lost segments may run.
                if this.refilling.swap(true, Ordering::AcqRel) {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
                let filled = this.refill().await;
                this.refilling.store(false, Ordering::Release);
                this.add_kept_since().await;
                match filled {
                    Ok(()) => {
                        this.fills.done.fetch_max(asked, Ordering::AcqRel);
                        wait = Duration::from_secs(1);
                    }
                    Err(e) => {
                        this.counters.errors.fetch_add(1, Ordering::Relaxed);
                        tracing::warn!(error = %e, retry_in_ms = wait.as_millis() as u64, "filling the shared filter again failed; its no is not a 404 until a fill succeeds");
                        tokio::time::sleep(wait).await;
                        wait = (wait * 2).min(Duration::from_secs(30));
                    }
                }
            }
            this.fills.running.store(false, Ordering::Release);
            // Asked for between the last look and the flag: run again.
            if this.fill_owed() {
                this.run_fills();
            }
        });
    }

    /// Opens (or creates and fills from SQL) the shared filter.
    ///
    /// # Errors
    /// [`SharedError`]: Redis unreachable, or a filter of another shape
    /// (other instances configured with another `bloom_expected` or
    /// `bloom_fpp`) under the key.
    #[allow(clippy::too_many_arguments)]
    pub async fn connect(
        target: &RedisTarget,
        prefix: &str,
        holds: Option<&str>,
        expected: u64,
        fpp: f64,
        segment_bytes: u64,
        timeout: Duration,
        keys: Arc<dyn KeyScan>,
        scan_limit: u64,
    ) -> Result<Self, SharedError> {
        let key = crate::wire::shared_filter_key(prefix, holds);
        let fail = |source, hint| SharedError {
            key: key.clone(),
            source,
            hint,
        };
        // Checks and inserts carry their own `timeout`; the connection's
        // own bound is longer, for filling whole segments.
        let conn = target
            .connect(
                timeout.max(Duration::from_millis(200)),
                timeout.max(Duration::from_secs(10)),
            )
            .await
            .map_err(|e| fail(bloomgate_redis::Error::Redis(e), ""))?;
        // Never allocated as zeros: another instance would read a filter
        // still being filled as a definite "no" for every key not in it yet.
        let (bloom, created) =
            RedisBloom::create_or_open_unfilled(conn.clone(), &key, expected, fpp, 0, segment_bytes)
            .await
            .map_err(|e| {
                let hint = if matches!(e, bloomgate_redis::Error::ShapeMismatch { .. }) {
                    ": every instance must use the same cache.bloom_expected, cache.bloom_fpp and cache.bloom_segment_bytes (or another cache.redis_prefix)"
                } else {
                    ""
                };
                fail(e, hint)
            })?;
        let shared = Self {
            bloom,
            conn,
            key,
            expected,
            fpp,
            segment_bytes,
            timeout,
            keys,
            scan_limit,
            refilling: Arc::default(),
            fills: Arc::default(),
            pending: Arc::default(),
            counters: Arc::default(),
            background: crate::tasks::Background::new(),
            created_here: created,
        };
        if created {
            shared.fill().await;
        }
        Ok(shared)
    }

    /// Adds every id in SQL (after creating the filter, finding segments
    /// missing, or seeding SQL): built here and uploaded whole, as a
    /// refill is, so no instance reads a segment before it holds every
    /// key (a missing one answers "maybe"). Creates meanwhile are kept
    /// and added after.
    pub(crate) async fn fill(&self) {
        if self.refilling.swap(true, Ordering::AcqRel) {
            return;
        }
        match self.refill().await {
            Ok(()) => {}
            Err(e) => {
                self.counters.errors.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(error = %e, "filling the shared filter failed; it answers maybe where segments are missing, and is refilled when read");
            }
        }
        self.refilling.store(false, Ordering::Release);
        self.add_kept_since().await;
    }

    /// Creates kept after a refill's last look at them (between it and the
    /// end of the refill): added now, or (the refill failed, Redis failed)
    /// kept for the next refill, which the next check or create that finds
    /// the filter lost starts (not this call: a refill that keeps failing
    /// would start the next at once, a scan after a scan).
    async fn add_kept_since(&self) {
        let late: Vec<Hashed> = self.take_pending().into_iter().map(Hashed).collect();
        if late.is_empty() {
            return;
        }
        if !matches!(
            tokio::time::timeout(self.timeout, self.bloom.insert_many(&late)).await,
            Ok(Ok(()))
        ) {
            self.counters.errors.fetch_add(1, Ordering::Relaxed);
            crate::sync::lock(&self.pending).extend(late.into_iter().map(|h| h.0));
        }
    }

    /// Ends a refill at `bg`'s signal.
    #[must_use]
    pub fn with_background(mut self, bg: crate::tasks::Background) -> Self {
        self.background = bg;
        self
    }

    /// True unless Redis says the id is certainly absent. Failures answer
    /// true (maybe); a lost bit string is refilled in the background.
    pub async fn maybe_contains<K: bloomgate_filter::BloomKey + ?Sized>(&self, id: &K) -> bool {
        self.counters.checks.fetch_add(1, Ordering::Relaxed);
        if self.refilling.load(Ordering::Acquire) {
            // Part of the filter is gone or being refilled: only "maybe".
            return true;
        }
        match tokio::time::timeout(self.timeout, self.bloom.contains(id)).await {
            Ok(Ok(answer)) => answer,
            Ok(Err(bloomgate_redis::Error::Meta { reason, .. })) => {
                self.counters.errors.fetch_add(1, Ordering::Relaxed);
                self.refill_in_background(&reason);
                true
            }
            _ => {
                self.counters.errors.fetch_add(1, Ordering::Relaxed);
                true
            }
        }
    }

    /// [`Self::maybe_contains`] for many keys, one pipelined round trip
    /// per segment; any failure answers "maybe" for all of them.
    pub async fn maybe_contains_many<K: bloomgate_filter::BloomKey>(
        &self,
        keys: &[K],
    ) -> Vec<bool> {
        self.counters
            .checks
            .fetch_add(keys.len() as u64, Ordering::Relaxed);
        if self.refilling.load(Ordering::Acquire) {
            return vec![true; keys.len()];
        }
        match tokio::time::timeout(self.timeout, self.bloom.contains_many(keys)).await {
            Ok(Ok(answers)) => answers,
            Ok(Err(bloomgate_redis::Error::Meta { reason, .. })) => {
                self.counters.errors.fetch_add(1, Ordering::Relaxed);
                self.refill_in_background(&reason);
                vec![true; keys.len()]
            }
            _ => {
                self.counters.errors.fetch_add(1, Ordering::Relaxed);
                vec![true; keys.len()]
            }
        }
    }

    /// Adds a created key (after its SQL commit). A failure is counted and
    /// logged; checks then answer maybe for it only if the string is lost.
    pub async fn insert<K: bloomgate_filter::BloomKey + ?Sized>(&self, key: &K) {
        self.keep_if_refilling(std::iter::once(key.hash_pair(0)));
        match tokio::time::timeout(self.timeout, self.bloom.insert(key)).await {
            Ok(Ok(_)) => {}
            Ok(Err(bloomgate_redis::Error::Meta { reason, .. })) => {
                self.counters.errors.fetch_add(1, Ordering::Relaxed);
                self.refill_keeping(&reason, std::iter::once(key.hash_pair(0)));
            }
            _ => {
                self.counters.errors.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(key = %self.key, "adding to the shared filter failed");
            }
        }
    }

    /// Adds created keys, one pipelined round trip per segment.
    ///
    /// # Errors
    /// Redis failed or did not answer within the timeout: the caller must
    /// not answer as if every instance could see the keys.
    pub async fn insert_many<K: bloomgate_filter::BloomKey>(
        &self,
        keys: &[K],
    ) -> Result<(), SharedFailure> {
        self.keep_if_refilling(keys.iter().map(|k| k.hash_pair(0)));
        match tokio::time::timeout(self.timeout, self.bloom.insert_many(keys)).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => {
                self.counters.errors.fetch_add(1, Ordering::Relaxed);
                if let bloomgate_redis::Error::Meta { reason, .. } = &e {
                    self.refill_keeping(reason, keys.iter().map(|k| k.hash_pair(0)));
                }
                Err(e.into())
            }
            Err(_) => {
                self.counters.errors.fetch_add(1, Ordering::Relaxed);
                Err(SharedFailure::TimedOut)
            }
        }
    }

    /// Keeps created keys for the refill that runs, if one does.
    fn keep_if_refilling(&self, hashes: impl Iterator<Item = HashPair>) {
        if self.refilling.load(Ordering::Acquire) {
            crate::sync::lock(&self.pending).extend(hashes);
        }
    }

    /// A create found the filter's metadata missing (lost, or another
    /// instance's first fill not arrived yet, whose scan may predate the
    /// create): the create is kept and a refill from SQL started here, so
    /// the key is in the filter once the metadata is.
    fn refill_keeping(&self, why: &str, hashes: impl Iterator<Item = HashPair>) {
        crate::sync::lock(&self.pending).extend(hashes);
        self.refill_in_background(why);
    }

    /// The creates kept, each once.
    fn take_pending(&self) -> Vec<HashPair> {
        let mut kept = std::mem::take(&mut *crate::sync::lock(&self.pending));
        kept.sort_unstable_by_key(|h| (h.h1, h.h2));
        kept.dedup();
        kept
    }

    /// Builds the whole filter here from a scan (and the creates kept
    /// meanwhile), uploads it segment by segment (each appears whole), then
    /// restores the metadata and adds the creates kept since.
    async fn refill(&self) -> Result<(), SharedFailure> {
        let mut local = BlockedBloom::new(self.bloom.params(), 0)?;
        let mut pages = Pages::open(&*self.keys, self.scan_limit).await?;
        let mut scanned = 0_u64;
        while let Some(parts) = pages.next().await? {
            for part in parts {
                match part {
                    Page::Ints(ids) => {
                        scanned += ids.len() as u64;
                        for id in &ids {
                            local.insert(id);
                        }
                    }
                    Page::Keys(keys) => {
                        scanned += keys.len() as u64;
                        for k in &keys {
                            local.insert(k);
                        }
                    }
                }
            }
        }
        for h in self.take_pending() {
            local.insert_hash(h);
        }
        self.bloom.upload(&local).await?;
        RedisBloom::create_or_open_unfilled(
            self.conn.clone(),
            &self.key,
            self.expected,
            self.fpp,
            0,
            self.segment_bytes,
        )
        .await?;
        let late: Vec<Hashed> = self.take_pending().into_iter().map(Hashed).collect();
        self.bloom.insert_many(&late).await?;
        tracing::info!(key = %self.key, scanned, kept = late.len(), "shared filter refilled from SQL");
        Ok(())
    }

    fn refill_in_background(&self, why: &str) {
        if self.refilling.swap(true, Ordering::AcqRel) {
            return;
        }
        tracing::warn!(key = %self.key, why, "shared filter lost; recreating it from SQL");
        let this = self.clone();
        // Tracked, not cancelled: a refill cut short leaves segments
        // missing ("maybe"), never zeros; the next check starts another.
        self.background.track(async move {
            match this.refill().await {
                Ok(()) => {
                    this.counters.refills.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) => {
                    this.counters.errors.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(error = %e, "refilling the shared filter failed; it answers maybe where it is lost");
                }
            }
            this.refilling.store(false, Ordering::Release);
            this.add_kept_since().await;
        });
    }
}
