//! Seed 000's warm for every resource (`POST /api/{name}/warm`; for the
//! SKUs `/api/skus/warm` and seed 000's `/api/cache/warm`): its first `limit` keys, a page at a
//! time, into Redis and L1 under the same leases as a read; with
//! `rebuild_bloom`, a rebuild of its filter from the source, waited for
//! and shared with the other instances.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use super::epochs::JoinEnd;
use super::{Guarded, Resource};
use crate::error::AppError;
use crate::resource::reader::{WarmOutcome, WARM_CHUNK};
use crate::shield::{RebuildError, RebuildReport, RebuildTicket};

/// What a warm did, as `POST /api/cache/warm` answers it.
#[derive(Debug, serde::Serialize)]
pub struct WarmReport {
    /// Rows read from the source into the caches.
    pub warmed: u64,
    /// Redis keys written.
    pub redis_written: u64,
    /// Why Redis was skipped, if it was.
    pub redis_error: Option<String>,
    /// The rebuild, when one was asked for.
    pub rebuild_bloom: Option<crate::shield::RebuildReport>,
    /// Keys the rebuild added.
    pub added: u64,
    /// The epoch the rebuild was shared as (the others adopt it), if it was.
    pub epoch: Option<u64>,
    /// `"this_instance"` when the rebuild could reach no other instance
    /// (the service runs without its outbox: `sql.outbox` off); absent
    /// otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reached: Option<&'static str>,
    /// How long it took.
    pub duration_ms: u64,
}

/// A warm's rebuild, as it was started.
enum WarmRebuild {
    /// This instance rebuilds, and shares the result from the outbox
    /// position before the scan and the rebuild requests it covers; it
    /// holds the shared-rebuild lock when `led`.
    Build {
        ticket: RebuildTicket,
        at: Option<(i64, i64)>,
        led: bool,
    },
    /// Another instance holds the shared-rebuild lock: wait for it and
    /// adopt its epoch (what this instance saw when it joined).
    Adopt(super::epochs::Joined),
}

impl<R: Guarded> Resource<R> {
    /// Warms the first `limit` keys and, with `rebuild`, rebuilds the
    /// filter from the source. The rebuild is started, finished and shared
    /// in a task of its own, and the warm goes on once it has started: a
    /// caller that goes away cancels none of it, its epoch is still
    /// shared, and a lead is released.
    ///
    /// # Errors
    /// [`AppError::Unavailable`]: the source failed, or the rebuild did.
    pub async fn warm(self: &Arc<Self>, limit: u64, rebuild: bool) -> Result<WarmReport, AppError> {
        let started = Instant::now();
        let rebuild = if rebuild {
            let (started, on_start) = tokio::sync::oneshot::channel();
            let r = Arc::clone(self);
            let task = tokio::spawn(async move {
                let how = r.start_rebuild().await;
                started.send(()).ok();
                r.finish_rebuild(how).await
            });
            // The position noted and the rebuild asked for before the
            // cached values are swept.
            drop(on_start.await);
            Some(task)
        } else {
            None
        };
        if rebuild.is_some() {
            self.sweep_cached().await;
        }
        let (rows, outcome) = self.warm_first(limit).await?;
        let report_asked = rebuild.is_some();
        let (report, epoch) = match rebuild {
            Some(task) => task
                .await
                .map_err(|e| AppError::Unavailable(format!("the rebuild stopped: {e}")))??,
            None => (None, None),
        };
        Ok(WarmReport {
            warmed: rows,
            redis_written: outcome.redis_written,
            redis_error: outcome.redis_error,
            added: report.as_ref().map_or(0, |r| r.added),
            rebuild_bloom: report,
            epoch,
            reached: (report_asked && !self.store.outbox_on()).then_some("this_instance"),
            duration_ms: started.elapsed().as_millis() as u64,
        })
    }

    /// A warm with `rebuild_bloom` is the remedy for changes no trigger
    /// sees (`TRUNCATE`, cascades): the table's cached values go with the
    /// old filter, from L1 here (the other instances drop theirs when they
    /// adopt the rebuild, or rebuild themselves) and from Redis.
    async fn sweep_cached(&self) {
        self.reader.invalidate_all_local();
        self.reader.sweep_absent().await;
        if let Some(redis) = &self.reader.redis {
            match redis.sweep().await {
                Ok(Some(n)) => {
                    tracing::info!(resource = %self.name, deleted = n, "cached values dropped from Redis with the rebuild")
                }
                Ok(None) => {
                    tracing::info!(resource = %self.name, "a Redis Cluster is not swept: cached values expire within cache.redis_ttl_secs")
                }
                Err(e) => {
                    tracing::warn!(resource = %self.name, error = %e, "dropping cached values from Redis failed; they expire within cache.redis_ttl_secs")
                }
            }
        }
    }

    /// Starts a warm's rebuild. Where the resource shares its rebuilds,
    /// one instance holds the shared-rebuild lock and scans, and a warm
    /// that reaches another instance meanwhile waits for its epoch.
    async fn start_rebuild(&self) -> WarmRebuild {
        let shield = self.shield();
        // The outbox position first, then the request: the scan starts
        // after both, so the keys recorded after the position are the only
        // ones it may miss, and the adopting instances replay exactly those.
        let watermark = self.outbox.watermark();
        // `None`: Redis is not answering, or nothing is shared: rebuild
        // here; the others are asked to rebuild from the source.
        let led = match self.try_lead(false).await {
            // One scan for every instance: the leader's.
            Some(false) => {
                self.epochs.joined.fetch_add(1, Ordering::Relaxed);
                return WarmRebuild::Adopt(self.joining().await);
            }
            Some(true) => true,
            None => false,
        };
        self.fill_shared_again();
        // The rebuild requests its scan begins after (unread: none).
        let at = self
            .outbox
            .max_seq()
            .await
            .ok()
            .map(|covered| (watermark, covered));
        WarmRebuild::Build {
            ticket: shield.request_rebuild(),
            at,
            led,
        }
    }

    async fn finish_rebuild(
        self: &Arc<Self>,
        how: WarmRebuild,
    ) -> Result<(Option<RebuildReport>, Option<u64>), AppError> {
        match how {
            WarmRebuild::Build { ticket, at, led } => {
                let report = ticket.wait().await;
                let epoch = match (&report, at, self.epoch_store()) {
                    // Shared with the other instances, which adopt it
                    // without a scan.
                    (Ok(_), Some((at, covered)), Some(_)) => {
                        match self.publish_epoch(at, covered, true).await {
                            Ok(epoch) => {
                                if led {
                                    self.epochs.led.fetch_add(1, Ordering::Relaxed);
                                }
                                tracing::info!(resource = %self.name, epoch, "shared rebuild published for the other instances");
                                Some(epoch)
                            }
                            Err(why) => {
                                tracing::warn!(resource = %self.name, %why, "the rebuilt filter was not shared; the other instances rebuild from the source");
                                None
                            }
                        }
                    }
                    _ => None,
                };
                if led {
                    self.release_lead(false).await;
                }
                let report = report.map_err(|e| match e {
                    RebuildError::Store(e) => AppError::Unavailable(e.to_string()),
                    other => AppError::Unavailable(other.to_string()),
                })?;
                if epoch.is_none() {
                    self.ask_others_to_rebuild().await;
                }
                Ok((Some(report), epoch))
            }
            WarmRebuild::Adopt(joined) => {
                let end = self.join_lead(&joined).await;
                if let JoinEnd::Adopted(epoch) = end {
                    return Ok((None, Some(epoch)));
                }
                // The leader stored no epoch (its build failed, it died),
                // or this instance could not take it: rebuild here, and
                // in the first case ask the others to.
                tracing::warn!(resource = %self.name, ?end, "the rebuild this warm waited for is not held here; rebuilding here");
                let report = self
                    .shield()
                    .request_rebuild()
                    .wait()
                    .await
                    .map_err(|e| AppError::Unavailable(e.to_string()))?;
                if end == JoinEnd::NoneStored {
                    self.ask_others_to_rebuild().await;
                }
                Ok((Some(report), None))
            }
        }
    }

    /// A warm's rebuild that reached no other instance as an epoch (no
    /// Redis, Redis not answering, a watched table): a rebuild entry in
    /// the SQL outbox asks every other instance to rebuild from SQL, so the
    /// remedy for a `TRUNCATE` reaches the whole fleet without Redis too.
    async fn ask_others_to_rebuild(&self) {
        if !self.store.outbox_on() {
            tracing::info!(resource = %self.name, "rebuilt on this instance alone: without bloomgate's outbox (sql.outbox) no other instance is asked");
            return;
        }
        let recorded = self
            .store
            .record_many(
                &self.name,
                &[crate::wire::rebuild_request_key()],
                crate::wire::kind::REBUILD,
            )
            .await;
        match recorded {
            Ok(()) => {
                if let Some(log) = &self.changes {
                    log.ring().await;
                }
            }
            Err(e) => {
                tracing::warn!(resource = %self.name, error = %e, "the other instances were not asked to rebuild: each keeps its filter");
            }
        }
    }

    /// Loads the first `limit` keys' rows into Redis and L1, a page at a
    /// time: lease the page's Redis keys, read its rows, fill (leases live
    /// for `LEASE_MS`: taken all at once, the first pages' had expired
    /// before a large warm's fills reached them, which then wrote
    /// nothing). Returns the rows read and what Redis did.
    ///
    /// # Errors
    /// [`AppError::Unavailable`]: the source failed.
    pub async fn warm_first(&self, limit: u64) -> Result<(u64, WarmOutcome), AppError> {
        let source = &self.reader.store;
        let (mut paged, mut rows) = (0u64, 0u64);
        let mut after: Option<R::Key> = None;
        let mut outcome = WarmOutcome::default();
        while paged < limit {
            let want = (limit - paged).min(WARM_CHUNK as u64) as usize;
            let keys = source.page_keys(after.as_ref(), want).await?;
            let Some(last) = keys.last().cloned() else {
                break;
            };
            let start = self
                .reader
                .warm_start(&keys, outcome.redis_error.is_none())
                .await;
            // Exactly the keys leased: a row deleted meanwhile is simply
            // not there; one inserted into the page holds no lease and
            // fills L1 alone.
            let found = source.page_rows(after.as_ref(), &keys).await?;
            outcome.add(self.reader.warm(start, &found).await);
            paged += keys.len() as u64;
            rows += found.len() as u64;
            after = Some(last);
            if keys.len() < want {
                break;
            }
        }
        Ok((rows, outcome))
    }
}
