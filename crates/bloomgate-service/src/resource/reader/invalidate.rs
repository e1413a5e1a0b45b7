//! What a write does to the read path: its key dropped from Redis and
//! L1, and its load in flight detached, under the shard protocol of
//! [`super`] (a load that read before the write does not cache), and
//! from the HTTP gate's remembered 404s ([`crate::cache::AbsentMemory`]).

use crate::cache::AbsentMemory;
use crate::resource::reader::Rows;
use crate::resource::ShieldedReader;
use crate::sync::lock;

impl<R: Rows> ShieldedReader<R> {
    /// Keeps `memory` in step with this table: each key invalidated here
    /// is forgotten there too.
    pub fn track_absent(&self, memory: AbsentMemory<R::Key>) {
        self.absent
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(memory);
    }

    /// The remembered-404 memories kept in step with this table.
    #[must_use]
    pub fn absent_memories(&self) -> Vec<AbsentMemory<R::Key>> {
        self.absent
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Drops an id from Redis and L1 and detaches its load in flight. Every
    /// write calls this after its SQL commit, before it answers.
    pub async fn invalidate(&self, id: &R::Key) {
        if let Some(redis) = &self.redis {
            if let Err(e) = redis.invalidate(id).await {
                tracing::warn!(%id, error = %e, "redis DEL failed; the entry expires with its TTL");
            }
        }
        for m in self.absent_memories() {
            m.forget_shared(std::slice::from_ref(id)).await;
        }
        self.invalidate_local(id);
    }

    /// [`ShieldedReader::invalidate`] for many keys, Redis in one round
    /// trip. Returns whether Redis confirmed the deletes (true without
    /// Redis); when it did not, they are owed and this instance reads
    /// around Redis for those keys, but other instances may still read
    /// what Redis holds.
    pub async fn invalidate_many(&self, keys: &[R::Key]) -> bool {
        let confirmed = match &self.redis {
            Some(redis) => match redis.invalidate_many(keys).await {
                Ok(()) => true,
                Err(e) => {
                    tracing::warn!(keys = keys.len(), error = %e, "redis DEL failed; owed");
                    false
                }
            },
            None => true,
        };
        let mut confirmed = confirmed;
        for m in self.absent_memories() {
            confirmed &= m.forget_shared(keys).await;
        }
        for k in keys {
            self.invalidate_local(k);
        }
        confirmed
    }

    /// This instance's part of an invalidation: under the id's shard lock,
    /// bump the write counter, detach the load in flight, drop the L1
    /// entry. Also applied for writes made through other instances.
    pub fn invalidate_local(&self, id: &R::Key) {
        let mut shard = lock(self.shard(id));
        shard.writes += 1;
        shard.flights.remove(id);
        self.l1.invalidate(id);
        drop(shard);
        for m in self.absent_memories() {
            m.forget_local(id);
        }
    }

    /// [`ShieldedReader::invalidate_local`] for every id at once (this
    /// instance may have missed writes): each shard's write counter is
    /// bumped and its loads in flight detached under its lock, then L1 is
    /// emptied, so a load that read SQL before this call cannot store its
    /// (possibly older) row into L1 after it.
    pub fn invalidate_all_local(&self) {
        for s in self.shards.iter() {
            let mut shard = lock(s);
            shard.writes += 1;
            shard.flights.clear();
        }
        self.l1.invalidate_all();
        for m in self.absent_memories() {
            m.forget_all_local();
        }
    }

    /// Drops every remembered 404 from Redis (see
    /// [`AbsentMemory::sweep`]).
    pub async fn sweep_absent(&self) {
        for m in self.absent_memories() {
            m.sweep().await;
        }
    }
}
