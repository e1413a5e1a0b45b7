//! Seed 000's warm for any resource (`POST /api/{name}/warm`): its first
//! `limit` keys, a page at a time, into Redis and L1 under the same leases
//! as a read; with `rebuild_bloom`, a rebuild of its filter from the
//! source, waited for.

use std::time::Instant;

use super::Resource;
use crate::error::AppError;
use crate::gate::RebuildError;
use crate::reader::{WarmOutcome, WARM_CHUNK};

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
    pub rebuild_bloom: Option<crate::gate::RebuildReport>,
    /// Keys the rebuild added.
    pub added: u64,
    /// The epoch the rebuild was shared as (the others adopt it), if it was.
    pub epoch: Option<u64>,
    /// How long it took.
    pub duration_ms: u64,
}

impl Resource {
    /// Warms the first `limit` keys and, with `rebuild`, rebuilds the
    /// filter from the source (started first, in the gate's worker, so a
    /// caller that goes away does not cancel it).
    ///
    /// # Errors
    /// [`AppError::Unavailable`]: the source failed, or the rebuild did.
    pub async fn warm(&self, limit: u64, rebuild: bool) -> Result<WarmReport, AppError> {
        let started = Instant::now();
        // The outbox position before the scan: an epoch of the rebuild is
        // complete up to it (keys recorded after it are replayed).
        let at = self.outbox.watermark();
        let ticket = rebuild.then(|| self.gate().request_rebuild());
        let source = &self.reader.store.0;
        let (mut paged, mut rows) = (0u64, 0u64);
        let mut after = None;
        let mut outcome = WarmOutcome::default();
        while paged < limit {
            let want = (limit - paged).min(WARM_CHUNK as u64) as usize;
            let keys = source.scan(after.as_ref(), want).await?;
            let Some(last) = keys.last().cloned() else {
                break;
            };
            let start = self
                .reader
                .warm_start(&keys, outcome.redis_error.is_none())
                .await;
            // Exactly the keys leased: a row deleted meanwhile is simply
            // not there.
            let found = source.load_many(&keys).await?;
            outcome.add(self.reader.warm(start, &found).await);
            paged += keys.len() as u64;
            rows += found.len() as u64;
            after = Some(last);
            if keys.len() < want {
                break;
            }
        }
        let report = match ticket {
            Some(t) => Some(t.wait().await.map_err(|e| match e {
                RebuildError::Store(e) => AppError::Unavailable(e.to_string()),
                other => AppError::Unavailable(other.to_string()),
            })?),
            None => None,
        };
        // Shared with the other instances, which adopt it without a scan.
        let epoch = match (&report, self.epoch_store()) {
            (Some(_), Some(_)) => match self.publish_epoch(at, true).await {
                Ok(epoch) => Some(epoch),
                Err(why) => {
                    tracing::warn!(resource = %self.name, %why, "the rebuilt filter was not shared; each instance keeps its own");
                    None
                }
            },
            _ => None,
        };
        Ok(WarmReport {
            warmed: rows,
            redis_written: outcome.redis_written,
            redis_error: outcome.redis_error,
            added: report.as_ref().map_or(0, |r| r.added),
            rebuild_bloom: report,
            epoch,
            duration_ms: started.elapsed().as_millis() as u64,
        })
    }
}
