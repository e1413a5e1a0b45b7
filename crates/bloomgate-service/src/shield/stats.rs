//! The shield's figures for `/api/cache/stats` and `/metrics`: `ShieldStats`,
//! seed 000's keys first.

use std::sync::atomic::Ordering;

use bloomgate_filter::Filter;

use crate::filter::{BloomLayout, ShieldFilter};
use crate::shield::Shield;
use crate::sync::lock;

/// A snapshot of the shield for the stats endpoint. Seed 000's keys come
/// first, so its `grep -o '"bloom":{[^}]*}'` shows them at the start.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ShieldStats {
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
    /// Keys the running (or last) rebuild has scanned.
    pub rebuild_scanned: u64,
    /// The source's estimate of its keys when that scan started (0: none).
    pub rebuild_estimated_total: u64,
    /// Its keys scanned per second.
    pub rebuild_rows_per_sec: f64,
    /// The limit on that (`cache.bloom_scan_rows_per_sec`; 0: none).
    pub rebuild_rows_per_sec_limit: u64,
    /// Milliseconds that scan waited for the limit, over its readers.
    pub rebuild_throttled_ms: u64,
    /// Pages of a rebuild's scan read again after failing.
    pub rebuild_page_retries: u64,
    /// The background row check of a restored or adopted filter: `none`,
    /// `running`, `ok`, `unaccounted` (a rebuild is owed) or `failed`.
    pub row_check: &'static str,
}

impl Shield {
    /// Figures for `/api/cache/stats`.
    pub fn stats(&self) -> ShieldStats {
        let guard = self.current.load();
        let f = guard.as_deref().map(ShieldFilter::as_filter);
        let (requests, pending) = {
            let r = lock(&self.requests);
            (r.requested, r.requested > r.started)
        };
        let alarm = *lock(&self.alarm);
        let progress = self.progress.stats();
        ShieldStats {
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
            rebuild_scanned: progress.scanned,
            rebuild_estimated_total: progress.estimated_total,
            rebuild_rows_per_sec: progress.rows_per_sec,
            rebuild_rows_per_sec_limit: progress.rows_per_sec_limit,
            rebuild_throttled_ms: progress.throttled_ms,
            rebuild_page_retries: self.page_retries.load(Ordering::Relaxed),
            row_check: super::progress::ROW_CHECK
                [usize::from(self.row_check.load(Ordering::Relaxed)).min(4)],
        }
    }
}
