//! Applying what the follower read: each entry goes to the table its
//! resource names, through [`Follower`], the one small trait every
//! guarded table implements (the SKU table as every other). The follower
//! itself ([`super::follow`]) only keeps the position.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::feed::outbox::Outbox;
use crate::source::BoxFuture;
use crate::sql::outbox::Entry;
use crate::sql::CAPTURED;
use crate::sync::lock;
use crate::wire::kind;

/// A change an entry records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// A row created, or a key added.
    Created,
    /// A row updated, or a key invalidated.
    Updated,
    /// A row deleted.
    Deleted,
}

/// What the follower needs of a guarded table. Keys come as the outbox
/// spells them; a table parses them as its own (and says when it cannot).
pub trait Follower: Send + Sync {
    /// A change of `key`: a created key into the filter (whoever made
    /// it); unless `own`, the key out of L1.
    ///
    /// # Errors
    /// The key is not one of this table's (the entry is skipped).
    fn apply(&self, change: Change, key: &str, own: bool) -> Result<(), crate::key::KeyError>;

    /// Other instances' and programs' changes of `keys`: out of Redis
    /// (or owed), then out of L1 again.
    fn invalidate_shared<'a>(&'a self, keys: &'a [&'a str]) -> BoxFuture<'a, ()>;

    /// Other instances' creates into the shared filter, where there is one.
    fn share_creates<'a>(&'a self, keys: &'a [&'a str]) -> BoxFuture<'a, ()>;

    /// Deletes the table's capture triggers recorded (toward a rebuild).
    fn captured_deletes(self: Arc<Self>, n: u64);

    /// What a capture check found: the table's triggers fire (or fire
    /// again), or not. While they fire, a table that writes its own rows
    /// (the SKU table) counts its deletes through their entries. Nothing
    /// by default.
    fn capture_checked(&self, _firing: bool) {}

    /// Another instance announced a shared rebuild's epoch.
    fn built(self: Arc<Self>, epoch: u64);

    /// Rows were written that no entry names, or entries were lost: the
    /// filter's "no" is not trusted until a rebuild succeeds, then `done`
    /// runs; L1 is emptied.
    fn rebuild_owed(&self, done: Box<dyn FnOnce() + Send>);

    /// In step with the outbox or not; true when that changed (going out
    /// of step also empties L1).
    fn set_in_step(&self, in_step: bool) -> bool;
}

impl Outbox {
    /// Follows `name`'s entries into `table` (weakly held: the table's
    /// owners decide when it ends). A name a live table holds stays its:
    /// a second one would take its entries away (its creates would never
    /// reach its filter).
    pub fn register(&self, name: &str, table: std::sync::Weak<dyn Follower>) {
        let mut tables = lock(&self.tables);
        if tables.get(name).is_some_and(|t| t.strong_count() > 0) {
            tracing::error!(
                resource = name,
                "a second table under one resource name: its outbox entries stay the first one's"
            );
            return;
        }
        tables.insert(name.to_owned(), table);
    }

    /// The registered tables still alive.
    pub(super) fn tables(&self) -> Vec<(String, Arc<dyn Follower>)> {
        lock(&self.tables)
            .iter()
            .filter_map(|(name, t)| Some((name.clone(), t.upgrade()?)))
            .collect()
    }

    pub(super) fn table(&self, name: &str) -> Option<Arc<dyn Follower>> {
        lock(&self.tables)
            .get(name)
            .and_then(std::sync::Weak::upgrade)
    }

    /// Applies a page the follower read, in order, then what a change made
    /// elsewhere needs beyond that, one round trip per table: its keys
    /// deleted from Redis by every instance that applies it (the writer's
    /// own `DEL` may have failed, which only the writer knows; a follower
    /// that only dropped L1 would refill it from the older value), and
    /// other instances' creates added to the shared filters (the writer
    /// adds them before it answers: this repairs one whose tries failed,
    /// or a filter refilled meanwhile). Captured deletes count toward a
    /// rebuild.
    pub(super) async fn apply_page(&self, entries: &[Entry]) {
        for e in entries {
            self.apply(e);
        }
        let own = self.store.origin();
        let mut changed: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        let mut created: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        let mut deletes: BTreeMap<&str, u64> = BTreeMap::new();
        for e in entries.iter().filter(|e| e.origin != own) {
            let Some(change) = change_of(&e.kind) else {
                continue;
            };
            changed.entry(&e.resource).or_default().push(&e.key);
            if change == Change::Created {
                created.entry(&e.resource).or_default().push(&e.key);
            }
            if e.origin == CAPTURED && change == Change::Deleted {
                *deletes.entry(&e.resource).or_default() += 1;
            }
        }
        for (name, keys) in changed {
            if let Some(t) = self.table(name) {
                t.invalidate_shared(&keys).await;
            }
        }
        for (name, keys) in created {
            if let Some(t) = self.table(name) {
                t.share_creates(&keys).await;
            }
        }
        for (name, n) in deletes {
            if let Some(t) = self.table(name) {
                t.captured_deletes(n);
            }
        }
    }

    fn apply(&self, e: &Entry) {
        let own = e.origin == self.store.origin();
        let Some(table) = self.table(&e.resource) else {
            return;
        };
        if e.kind == kind::BUILT {
            // Another instance's shared rebuild of the table.
            if let (false, Ok(epoch)) = (own, e.key.parse()) {
                table.built(epoch);
            }
            return;
        }
        if e.kind == kind::REBUILD {
            if let Some(fingerprint) = e.key.strip_prefix(crate::wire::CAPTURE_REQUEST) {
                self.announced_for(&e.resource, fingerprint);
            }
            // Noted even when covered: a copy read later asks for the rows
            // of the same request, which the covering scan holds.
            let first = self.first_request(&e.resource, &e.key);
            if own {
                return;
            }
            // Acted on or not, no filter scanned before it is adopted
            // here (a copy too: its scan may have begun before the copy).
            self.note_rebuild_requested(&e.resource, e.seq);
            if e.seq <= self.rebuilds_covered(&e.resource) {
                return;
            }
            if !first {
                tracing::debug!(seq = e.seq, resource = %e.resource, key = %e.key, "change outbox: a rebuild request read before; not acted on again");
                return;
            }
            tracing::info!(
                seq = e.seq,
                resource = %e.resource,
                "change outbox: rows were written that no entry names; rebuilding the filter"
            );
            // Its scan starts after this request, so after the entry
            // committed: once it succeeds, the filter holds those rows.
            let (outbox, name, seq) = (self.clone(), e.resource.clone(), e.seq);
            table.rebuild_owed(Box::new(move || outbox.cover(&name, seq)));
            self.counters.rebuilds.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let Some(change) = change_of(&e.kind) else {
            return;
        };
        // An own create is learned too (a no-op unless it is still between
        // its commit and its insert here): past the watermark, every
        // create is in the filter, whoever made it.
        if own && change != Change::Created {
            return;
        }
        match table.apply(change, &e.key, own) {
            Ok(()) if !own => {
                self.counters.applied.fetch_add(1, Ordering::Relaxed);
            }
            Ok(()) => {}
            Err(why) => {
                tracing::warn!(seq = e.seq, resource = %e.resource, key = %e.key, %why, "change outbox: a key the table cannot parse; skipped");
            }
        }
    }

    /// This instance may have missed entries of any table (a lost
    /// position, a jump, a rewound outbox): every filter's "no" is
    /// untrusted until a rebuild succeeds, and L1 is emptied.
    pub(super) fn rebuild_all(&self) {
        for (_, t) in self.tables() {
            t.rebuild_owed(Box::new(|| {}));
        }
        self.counters.rebuilds.fetch_add(1, Ordering::Relaxed);
    }
}

fn change_of(kind: &str) -> Option<Change> {
    match kind {
        kind::CREATED => Some(Change::Created),
        kind::UPDATED => Some(Change::Updated),
        kind::DELETED => Some(Change::Deleted),
        _ => None,
    }
}
