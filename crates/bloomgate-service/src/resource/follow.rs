//! A resource as the outbox follower sees it: the one implementation of
//! [`Follower`], for the SKU table and every other guarded table.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::{Guarded, Resource};
use crate::feed::outbox::{Change, Follower};
use crate::shield::AdoptError;
use crate::source::BoxFuture;

impl<R: Guarded> Resource<R> {
    /// `keys` parsed as this table's; the ones that do not parse are
    /// skipped (the follower logged them when it applied them).
    fn parsed(&self, keys: &[&str]) -> Vec<R::Key> {
        keys.iter()
            .filter_map(|k| self.reader.store.parse_key(k).ok())
            .collect()
    }

    /// Adopts the epoch another instance announced, or the newest one if
    /// newer; one that cannot be is answered by a rebuild from the source.
    pub(super) async fn follow_epoch(self: Arc<Self>, epoch: u64) {
        if self.epoch_store().is_none() {
            // A watched table keeps its own builds: rebuild here too (the
            // other instance rebuilt for a reason: deletes, growth).
            if self.shield().enabled() {
                drop(self.shield().request_rebuild());
            }
            return;
        }
        let _one_at_a_time = self.epochs.following.lock().await;
        // Epoch numbers held under another Redis identity say nothing.
        self.check_era().await;
        // The newest epoch, which may be newer than the one announced (a
        // start-up filter stored since, or an announcement replayed from
        // before this instance's filter): none when this instance holds
        // it already.
        let stored = match self.epoch_store() {
            Some((log, counter)) => log.latest_epoch(counter).await.ok().flatten(),
            None => None,
        };
        if let Some((n, fields)) = &stored {
            let n = *n;
            // The counter went back, or the held number names another
            // epoch now: Redis lost our epochs (a flush, a new server, a
            // Cluster node restarted empty) and numbers them from 1 again,
            // so what this instance holds says nothing of what is newer.
            let held = self.epochs.held.load(Ordering::Relaxed);
            if n < held || self.renumbered(n, fields) {
                tracing::info!(resource = %self.name, held, stored = n, "the epoch counter went back (Redis lost its state); following its numbers afresh");
                self.epochs.held.store(0, Ordering::Relaxed);
            }
        }
        let latest = stored.map_or(epoch, |(n, _)| n.max(epoch));
        if latest <= self.epochs.held.load(Ordering::Relaxed) {
            return;
        }
        match self.adopt_epoch(latest).await {
            Ok(_) => {
                self.epochs.followed.fetch_add(1, Ordering::Relaxed);
            }
            Err(why) if why.is_superseded() => {}
            Err(AdoptError::Busy) => {
                // The rebuild running here may have begun its scan before
                // the other instance's: one more, begun after the
                // announcement.
                drop(self.shield().request_rebuild());
            }
            Err(why) => {
                self.epochs.adopt_failures.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(resource = %self.name, epoch = latest, %why, "cannot adopt another instance's rebuild; rebuilding from the source");
                drop(self.shield().request_rebuild());
            }
        }
    }
}

impl<R: Guarded> Follower for Resource<R> {
    fn apply(&self, change: Change, key: &str, own: bool) -> Result<(), crate::key::KeyError> {
        let key = self.reader.store.parse_key(key)?;
        if change == Change::Created {
            self.shield().learn(key.clone());
        }
        if !own {
            self.reader.invalidate_local(&key);
        }
        Ok(())
    }

    fn invalidate_shared<'a>(&'a self, keys: &'a [&'a str]) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            let keys = self.parsed(keys);
            if !keys.is_empty() {
                self.reader.invalidate_many(&keys).await;
            }
        })
    }

    fn share_creates<'a>(&'a self, keys: &'a [&'a str]) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            let Some(shared) = self.reader.shared() else {
                return;
            };
            let keys = self.parsed(keys);
            if keys.is_empty() {
                return;
            }
            if let Err(e) = shared.insert_many(&keys).await {
                tracing::debug!(resource = %self.name, error = %e, "sharing followed creates failed");
            }
        })
    }

    fn captured_deletes(self: Arc<Self>, n: u64) {
        let mut due = false;
        for _ in 0..n {
            due |= self.shield().note_delete(self.rebuild_after_deletes);
        }
        if due {
            self.rebuild_shared();
        }
    }

    fn capture_checked(&self, firing: bool) {
        self.deletes_captured
            .store(firing, std::sync::atomic::Ordering::Relaxed);
    }

    fn built(self: Arc<Self>, epoch: u64) {
        self.epochs.requested.fetch_add(1, Ordering::Relaxed);
        let bg = self.background.clone();
        bg.track(self.follow_epoch(epoch));
    }

    fn rebuild_owed(&self, done: Box<dyn FnOnce() + Send>) {
        self.shield().rebuild_owed(done);
        self.fill_shared_again();
        self.reader.invalidate_all_local();
        // Rows were written that no entry names: the shield's remembered
        // 404s may hold some of them.
        if !self.reader.absent_memories().is_empty() {
            let reader = self.reader.clone();
            self.background
                .spawn(async move { reader.sweep_absent().await });
        }
    }

    fn set_in_step(&self, in_step: bool) -> bool {
        let changed = self.shield().set_in_step(in_step);
        if changed && !in_step {
            // Cached "not found"s may be as stale as the filter.
            self.reader.invalidate_all_local();
        }
        changed
    }
}

impl crate::feed::doorbell::Led for Resource<crate::sql::Database> {
    fn created(&self, id: i64) {
        self.shield().learn(id);
        self.reader.invalidate_local(&id);
    }

    fn built_by_earlier_release(self: Arc<Self>, epoch: Option<u64>) -> BoxFuture<'static, ()> {
        Box::pin(async move {
            self.epochs.requested.fetch_add(1, Ordering::Relaxed);
            // A warm's rebuild: rows may have gone that no entry named (a
            // `TRUNCATE`).
            self.reader.invalidate_all_local();
            match epoch {
                // Stored under this resource's counter, in the one meta
                // format: adopted as this release's own.
                Some(epoch) => self.follow_epoch(epoch).await,
                None => {
                    tracing::info!(resource = %self.name, "an instance of the previous release asked for a filter rebuild");
                    if self.shield().enabled() {
                        drop(self.shield().request_rebuild());
                    }
                }
            }
        })
    }
}
