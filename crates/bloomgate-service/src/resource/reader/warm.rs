//! The warm path of the funnel, a page of rows at a time: lease the page's
//! Redis keys and note the shards' write counters before reading its rows
//! from SQL, then fill Redis only where the lease holds and L1 only where
//! no write intervened, the same rules as a read.

use std::collections::HashMap;

use crate::cache::{Cached, Entry, Lease};
use crate::resource::reader::Rows;
use crate::resource::ShieldedReader;
use crate::sync::lock;

/// Rows per page of a warm: one Redis round trip of leases, one SQL read,
/// one round trip of fills, well within a lease's life (`LEASE_MS`).
pub const WARM_CHUNK: usize = 1000;

/// What a warm did with Redis.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct WarmOutcome {
    /// Keys written.
    pub redis_written: u64,
    /// Why Redis was skipped, if it was.
    pub redis_error: Option<String>,
}

impl WarmOutcome {
    /// Adds a later page's outcome (the first error stays).
    pub fn add(&mut self, page: Self) {
        self.redis_written += page.redis_written;
        if self.redis_error.is_none() {
            self.redis_error = page.redis_error;
        }
    }
}

/// What a warm noted before reading SQL: see [`ShieldedReader::warm_start`].
#[derive(Debug)]
pub struct WarmStart<K> {
    writes: Vec<u64>,
    leases: HashMap<K, Lease>,
    redis_error: Option<String>,
}

impl<R: Rows> ShieldedReader<R> {
    /// Notes the shards' write counters and leases the Redis keys of `ids`
    /// that hold nothing (unless `redis` is false: an earlier page found
    /// Redis failing), before a warm reads their rows from SQL. When Redis
    /// fails, the warm goes on for L1 alone.
    pub async fn warm_start(&self, ids: &[R::Key], redis: bool) -> WarmStart<R::Key> {
        let writes = self.shards.iter().map(|s| lock(s).writes).collect();
        let mut leases = HashMap::new();
        let mut redis_error = None;
        if let Some(redis) = self.redis.as_ref().filter(|_| redis) {
            for chunk in ids.chunks(WARM_CHUNK) {
                match redis.lease_many(chunk).await {
                    Ok(got) => {
                        for (id, lease) in chunk.iter().zip(got) {
                            if let Some(l) = lease {
                                leases.insert(id.clone(), l);
                            }
                        }
                    }
                    Err(e) => {
                        redis_error = Some(e.to_string());
                        break;
                    }
                }
            }
        }
        WarmStart {
            writes,
            leases,
            redis_error,
        }
    }

    /// Loads `skus` (read from SQL after [`ShieldedReader::warm_start`])
    /// into Redis and L1 under the same rules as a read: Redis keys are
    /// filled only while their lease holds; L1 entries are stored only if
    /// no write touched their shard since the start.
    pub async fn warm(&self, start: WarmStart<R::Key>, rows: &[(R::Key, R::Row)]) -> WarmOutcome {
        let mut outcome = WarmOutcome {
            redis_written: 0,
            redis_error: start.redis_error,
        };
        if let (Some(redis), None) = (&self.redis, &outcome.redis_error) {
            let leased: Vec<(&Lease, &R::Key, &R::Row)> = rows
                .iter()
                .filter_map(|(k, row)| start.leases.get(k).map(|l| (l, k, row)))
                .collect();
            // In round trips of WARM_CHUNK, as the leases were taken: one
            // pipeline of a large warm's every fill outlasts the command
            // timeout (200,000 rows did, at the default 50 ms), and then
            // nothing at all was written.
            for chunk in leased.chunks(WARM_CHUNK) {
                match redis.fill_many(chunk).await {
                    Ok(n) => outcome.redis_written += n,
                    Err(e) => {
                        outcome.redis_error = Some(e.to_string());
                        break;
                    }
                }
            }
        }
        for (key, row) in rows {
            let shard_no = R::shard_of(key);
            let shard = lock(&self.shards[shard_no]);
            if shard.writes == start.writes[shard_no] {
                self.l1
                    .insert(key.clone(), Entry::Found(Cached::new(row.clone())));
            }
        }
        outcome
    }
}
