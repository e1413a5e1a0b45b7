//! A Redis hit outside the single flight. A read past L1 asks Redis with
//! a plain `GET` before any load starts; a value or the null sentinel
//! answers it there, and only a key that holds nothing (or cannot be
//! trusted) goes on to a load, which protects SQL.
//!
//! Why: the load is the single flight's machinery (a shared entry under
//! the shard lock, a channel for the readers that join, a boxed future,
//! the reader's handles cloned into it, a guard against a panicking
//! source), which only a read of SQL needs; `perf` put it at about 6% of
//! a Redis hit's CPU. Readers of one id at the same moment each send
//! their own `GET`, which Redis answers as cheaply as one.
//!
//! The write-back rule is the load's: the shard's write count is noted
//! before the `GET`, and the answer goes into L1 under the shard lock only
//! if no write to the shard came in between (see the parent module). A
//! read that starts after a write returned finds the key deleted, so it
//! cannot answer what that write replaced.

use crate::cache::{Entry, Reach, RedisLookup};
use crate::resource::reader::{Rows, Source};
use crate::resource::{Lookup, ShieldedReader};
use crate::sync::lock;

impl<R: Rows> ShieldedReader<R> {
    /// The answer of a `GET` that found a value or the null sentinel, or
    /// how far the load that follows reads Redis: `Err(Some(Lease))` when
    /// the key held nothing (the load leases it), `Err(None)` when the
    /// load must read SQL without a lease (another reader's lease, an
    /// owed invalidation, Redis failing) and `Err(Some(GetThenLease))`
    /// without a Redis tier or when a load of the id is in flight already
    /// (the read joins it).
    pub(super) async fn redis_hit(&self, id: &R::Key) -> Result<Lookup<R::Row>, Option<Reach>> {
        let Some(redis) = &self.redis else {
            return Err(Some(Reach::GetThenLease));
        };
        let writes = {
            let shard = lock(self.shard(id));
            if shard.flights.contains_key(id) {
                return Err(Some(Reach::GetThenLease));
            }
            shard.writes
        };
        let entry = match redis.lookup_cached(id, Reach::Get).await {
            Ok(Some(RedisLookup::Hit(cached))) => Entry::Found(cached),
            Ok(Some(RedisLookup::Nil)) => Entry::Missing,
            Ok(None) => return Err(Some(Reach::Lease)),
            Ok(Some(RedisLookup::Miss(_))) => return Err(None),
            Err(e) => {
                tracing::warn!(%id, error = %e, "redis lookup failed; reading SQL");
                return Err(None);
            }
        };
        self.after_read.pass(R::pause_id(id)).await;
        let shard = lock(self.shard(id));
        if shard.writes == writes {
            self.l1.insert(id.clone(), entry.clone());
        } else {
            self.l1_counters.stale_skipped.incr();
        }
        drop(shard);
        Ok(match entry {
            Entry::Found(row) => Lookup::Found(row, Source::Redis),
            Entry::Missing => Lookup::Missing(Source::Redis),
        })
    }
}
