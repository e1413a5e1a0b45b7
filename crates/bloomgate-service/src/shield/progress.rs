//! A rebuild's progress: keys scanned against the source's estimate, the
//! rate, a log line at every tenth; and the page loop that reads one key
//! range into the new filter, retrying a failed page.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;

use crate::filter::ShieldFilter;
use crate::key::Key;
use crate::shield::Shield;
use crate::source::{KeyBatch, KeyRange};
use crate::sql::StoreError;
use crate::sync::lock;

/// Keys a rebuild reads per statement (streamed into the filter in chunks).
pub const PAGE: usize = 100_000;

/// Times a failed page is read again before the rebuild fails (which
/// start-up then retries with its own backoff).
pub const PAGE_RETRIES: u32 = 3;

/// Progress of the running (or last) rebuild.
#[derive(Debug, Default)]
pub struct Progress {
    scanned: AtomicU64,
    estimated: AtomicU64,
    /// Unix milliseconds the scan started at; 0 before the first.
    started_ms: AtomicU64,
    /// Milliseconds the last finished scan took.
    took_ms: AtomicU64,
    running: AtomicBool,
    /// Tenths of the estimate already logged.
    logged: AtomicU64,
    /// The scan's limit, keys per second (0: none).
    limit: AtomicU64,
    /// Milliseconds the scan's readers waited for the limit.
    throttled_ms: AtomicU64,
    /// Unix milliseconds the rate limit counts from (the first page).
    paced_from_ms: AtomicU64,
}

/// [`Progress`] for the stats endpoint and `/metrics`.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct ProgressStats {
    /// Keys the running (or last) rebuild has scanned.
    pub scanned: u64,
    /// The source's estimate of its keys when the scan started (0: none).
    pub estimated_total: u64,
    /// Keys scanned per second, over the scan so far.
    pub rows_per_sec: f64,
    /// The limit on it (`cache.bloom_scan_rows_per_sec`; 0: none).
    pub rows_per_sec_limit: u64,
    /// Milliseconds the scan waited for that limit, over its readers.
    pub throttled_ms: u64,
}

impl Progress {
    pub(super) fn start(&self, estimated: u64, limit: u64) {
        self.limit.store(limit, Ordering::Relaxed);
        self.throttled_ms.store(0, Ordering::Relaxed);
        self.pace_from_now();
        self.scanned.store(0, Ordering::Relaxed);
        self.logged.store(0, Ordering::Relaxed);
        self.estimated.store(estimated, Ordering::Relaxed);
        self.started_ms
            .store(crate::model::now_millis(), Ordering::Relaxed);
        self.running.store(true, Ordering::Relaxed);
    }

    pub(super) fn finish(&self) {
        let started = self.started_ms.load(Ordering::Relaxed);
        self.took_ms.store(
            crate::model::now_millis().saturating_sub(started),
            Ordering::Relaxed,
        );
        self.running.store(false, Ordering::Relaxed);
    }

    /// Counts `n` more keys and logs each tenth of the estimate crossed.
    pub(super) fn add(&self, n: u64, resource: &str) {
        let scanned = self.scanned.fetch_add(n, Ordering::Relaxed) + n;
        let estimated = self.estimated.load(Ordering::Relaxed);
        if estimated == 0 {
            return;
        }
        let tenth = (scanned.saturating_mul(10) / estimated).min(10);
        let logged = self.logged.load(Ordering::Relaxed);
        if tenth > logged
            && self
                .logged
                .compare_exchange(logged, tenth, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            let s = self.stats();
            tracing::info!(
                resource,
                scanned,
                estimated_total = estimated,
                percent = tenth * 10,
                rows_per_sec = s.rows_per_sec as u64,
                rows_per_sec_limit = s.rows_per_sec_limit,
                "filter rebuild progress"
            );
        }
    }

    /// Starts the rate limit's clock at the first page.
    pub(super) fn pace_from_now(&self) {
        self.paced_from_ms
            .store(crate::model::now_millis(), Ordering::Relaxed);
    }

    /// How long a reader waits before its next page, so that the keys
    /// scanned so far took at least `scanned / limit` seconds (the limit
    /// holds over all the readers); `None` without a limit or when the
    /// scan is behind it.
    fn pace(&self) -> Option<Duration> {
        let limit = self.limit.load(Ordering::Relaxed);
        if limit == 0 {
            return None;
        }
        let scanned = self.scanned.load(Ordering::Relaxed);
        let due = self
            .paced_from_ms
            .load(Ordering::Relaxed)
            .saturating_add(scanned.saturating_mul(1000) / limit);
        let wait = due.saturating_sub(crate::model::now_millis());
        (wait > 0).then(|| {
            self.throttled_ms.fetch_add(wait, Ordering::Relaxed);
            Duration::from_millis(wait)
        })
    }

    /// Keys per page under the limit: about a tenth of a second's worth
    /// (at least 100), so the database sees an even load, not a page of
    /// [`PAGE`] keys and then a long wait.
    fn page_under_limit(&self, page: usize) -> usize {
        match self.limit.load(Ordering::Relaxed) {
            0 => page,
            limit => page.min(usize::try_from(limit / 10).unwrap_or(usize::MAX).max(100)),
        }
    }

    /// The figures now.
    pub fn stats(&self) -> ProgressStats {
        let scanned = self.scanned.load(Ordering::Relaxed);
        let took = if self.running.load(Ordering::Relaxed) {
            crate::model::now_millis().saturating_sub(self.started_ms.load(Ordering::Relaxed))
        } else {
            self.took_ms.load(Ordering::Relaxed)
        };
        ProgressStats {
            scanned,
            estimated_total: self.estimated.load(Ordering::Relaxed),
            rows_per_sec: if took == 0 {
                0.0
            } else {
                scanned as f64 * 1e3 / took as f64
            },
            rows_per_sec_limit: self.limit.load(Ordering::Relaxed),
            throttled_ms: self.throttled_ms.load(Ordering::Relaxed),
        }
    }
}

/// Two readers meeting in the middle ([`KeyRange::meeting`]): the last key
/// each has read up to (every key beyond it, on its side, is in the
/// filter), ascending first; and whether the descending reader is needed
/// at all (0 not known yet, 1 yes, 2 no: the ascending reader's first
/// page held every key). It starts after that first page, so a table of
/// one page is read once.
#[derive(Debug)]
pub(super) struct Meet {
    reached: Mutex<[Option<Key>; 2]>,
    needed: watch::Sender<u8>,
}

impl Default for Meet {
    fn default() -> Self {
        Self {
            reached: Mutex::new([None, None]),
            needed: watch::channel(0).0,
        }
    }
}

impl Meet {
    /// `range` bounded by how far the other reader has got.
    fn bound(&self, range: &KeyRange) -> KeyRange {
        let other = lock(&self.reached)[usize::from(!range.descending)].clone();
        KeyRange {
            after: range.after.clone(),
            upto: other.or_else(|| range.upto.clone()),
            descending: range.descending,
        }
    }

    fn reached(&self, range: &KeyRange, last: Option<Key>) {
        if last.is_some() {
            lock(&self.reached)[usize::from(range.descending)] = last;
        }
    }

    /// The ascending reader's first page: full (the other reader is
    /// needed), or not; a failed one lets the other go on too.
    pub(super) fn first_page(&self, full: bool) {
        self.needed.send_if_modified(|n| {
            let first = *n == 0;
            if first {
                *n = if full { 1 } else { 2 };
            }
            first
        });
    }

    /// Waits for [`Meet::first_page`]; true when this reader is needed.
    async fn needed(&self) -> bool {
        let mut rx = self.needed.subscribe();
        rx.wait_for(|&n| n != 0).await.map_or(true, |n| *n == 1)
    }
}

impl Shield {
    /// Reads every key of `range` into `filter`, page by page; a page that
    /// fails is read again (from the last key it delivered) up to
    /// [`PAGE_RETRIES`] times. With `meet`, each page stops where the
    /// other reader has got to. Returns the keys added.
    pub(super) async fn scan_range(
        self: Arc<Self>,
        range: KeyRange,
        meet: Option<Arc<Meet>>,
        filter: Arc<ShieldFilter>,
    ) -> Result<u64, StoreError> {
        let mut after: Option<Key> = None;
        let mut total = 0u64;
        let mut pages = 0i64;
        let limit = self
            .progress
            .page_under_limit(self.page_rows.load(Ordering::Relaxed).max(1));
        if let (Some(m), true) = (&meet, range.descending) {
            if !m.needed().await {
                return Ok(0);
            }
        }
        let first_page = |full: bool| {
            if let (Some(m), false) = (&meet, range.descending) {
                m.first_page(full);
            }
        };
        loop {
            let mut failures = 0;
            let page = loop {
                // Keys a failed page delivered are read again: inserting
                // one twice changes no bit.
                let sink = |batch: KeyBatch<'_>| {
                    filter.insert_batch(batch);
                };
                let bounded = meet.as_ref().map(|m| m.bound(&range));
                let this = bounded.as_ref().unwrap_or(&range);
                match self.keys.page(this, after.as_ref(), limit, &sink).await {
                    Ok(page) => break page,
                    // A database that takes no connection is not waited
                    // for page by page: the rebuild fails at once, and
                    // start-up's build retries with its own backoff.
                    Err(e) if failures < PAGE_RETRIES && !e.is_unreachable() => {
                        failures += 1;
                        self.page_retries.fetch_add(1, Ordering::Relaxed);
                        tracing::warn!(error = %e, attempt = failures, "a filter rebuild's page failed; reading it again");
                        tokio::time::sleep(Duration::from_millis(100 << failures)).await;
                    }
                    Err(e) => {
                        first_page(true);
                        return Err(e);
                    }
                }
            };
            first_page(page.keys >= limit);
            total += page.keys as u64;
            if let Some(m) = &meet {
                m.reached(&range, page.last.clone());
            }
            self.progress.add(page.keys as u64, &self.name);
            if let Some(wait) = self.progress.pace() {
                tokio::time::sleep(wait).await;
            }
            pages += 1;
            self.scan_page.pass(pages).await;
            if page.keys < limit {
                return Ok(total);
            }
            after = page.last;
        }
    }
}

/// The background row check's state, as the stats name it.
pub(super) const ROW_CHECK: [&str; 5] = ["none", "running", "ok", "unaccounted", "failed"];

impl Shield {
    /// After a filter was restored or adopted instead of scanned: counts
    /// the source's rows in the background (under the background statement
    /// limit; three tries) and, when the filter accounts for fewer, or
    /// the count never succeeds, owes a rebuild (until it succeeds, a "no"
    /// is [`Verdict::Unvouched`]). Rows written
    /// behind the change feed's back are refused until this finds them:
    /// every create the service answered is in the feed, so it never is.
    pub fn verify_rows(self: &Arc<Self>) {
        let shield = Arc::downgrade(self);
        self.row_check.store(1, Ordering::Relaxed);
        self.background.spawn(async move {
            let Some(keys) = shield.upgrade().map(|g| Arc::clone(&g.keys)) else {
                return;
            };
            // A count that keeps failing (or outlasting the background
            // limit) leaves the filter unchecked: after three tries a
            // rebuild is owed instead, which reads in pages.
            let mut rows = None;
            for wait in [1, 5, 25] {
                match keys.count_keys().await {
                    Ok(n) => {
                        rows = Some(n);
                        break;
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, retry_in_s = wait, "the background row count failed");
                        tokio::time::sleep(Duration::from_secs(wait)).await;
                    }
                }
            }
            let Some(g) = shield.upgrade() else { return };
            let Some(rows) = rows else {
                g.row_check.store(4, Ordering::Relaxed);
                tracing::warn!("the background row count failed three times: rebuilding instead of trusting the restored filter unchecked");
                g.rebuild_owed(|| {});
                return;
            };
            // Creates committed during the count reach the filter through
            // the followers: a second look after a moment spares a rebuild.
            for second_look in [false, true] {
                let items = g.published().map_or(0, |f| f.as_filter().items());
                if rows <= items {
                    g.row_check.store(2, Ordering::Relaxed);
                    return;
                }
                if !second_look {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
            g.row_check.store(3, Ordering::Relaxed);
            let items = g.published().map_or(0, |f| f.as_filter().items());
            tracing::warn!(
                rows,
                items,
                "the source holds more rows than the restored filter accounts for (written behind the change feed's back): rebuilding"
            );
            g.rebuild_owed(|| {});
        });
    }
}

impl Shield {
    /// Whether this shield lets its instance take traffic, and its state:
    /// `ready`; `building` (no filter yet: every id would fail open to
    /// SQL), with the scan's progress; `out_of_step` (the change feed is
    /// unread: a "no" is not trusted); `rebuild_owed`; `disabled` and
    /// `not_built` (when `build_expected` is false: the operator chose to
    /// build later) count as ready.
    #[must_use]
    pub fn readiness(&self, build_expected: bool) -> (bool, serde_json::Value) {
        let state = if !self.config.enabled {
            "disabled"
        } else if self.current.load().is_none() {
            if build_expected || self.is_rebuilding() {
                "building"
            } else {
                "not_built"
            }
        } else if !self.in_step() {
            "out_of_step"
        } else if self.rebuild_is_owed() {
            "rebuild_owed"
        } else if self.resizing() {
            "resizing"
        } else {
            "ready"
        };
        let ready = matches!(state, "ready" | "disabled" | "not_built");
        let mut v = serde_json::json!({ "state": state });
        if self.is_rebuilding() || state == "building" {
            v["progress"] = serde_json::to_value(self.progress.stats()).unwrap_or_default();
        }
        if let Some(e) = lock(&self.last_error).clone() {
            v["last_rebuild_error"] = e.into();
        }
        (ready, v)
    }
}
