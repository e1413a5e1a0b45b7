//! Each filter's start, one code path for the demo SKU table and every
//! resource ([`Starts`], implemented once for every [`Resource`]): where
//! it starts from ([`Start::position`]: its snapshot, else a shared epoch,
//! else a scan) and how ([`Build::start`]).

use std::sync::Arc;
use std::time::Duration;

use crate::resource::{Guarded, Replace, Resource, StartFrom};
use crate::source::BoxFuture;

/// One filter to start, and what its start may do.
pub(super) struct Filter<'a> {
    /// The table.
    pub(super) table: &'a dyn Starts,
    /// This instance seeded it now: scanned, never positioned, and its
    /// filter stored over any epoch.
    pub(super) seeded: bool,
    /// Built at start (`cache.bloom_build_on_start` for the SKU table).
    pub(super) build: bool,
    /// The demo SKU table, whose build task [`super::prepare`] returns.
    pub(super) demo: bool,
}

/// A table whose filter starts: every [`Resource`], whatever it reads.
pub(super) trait Starts: Send + Sync {
    /// The resource's name.
    fn name(&self) -> &str;
    /// [`Start::position`] for this table.
    fn position<'a>(
        &'a self,
        at: &'a Start<'_>,
        may_adopt: bool,
        outbox_from: &'a mut i64,
    ) -> BoxFuture<'a, StartFrom>;
    /// [`Build::start`] for this table.
    fn start<'a>(
        &'a self,
        build: &'a Build,
        start: Option<StartFrom>,
        filter: &'a Filter<'_>,
        background: &'a crate::tasks::Background,
    ) -> BoxFuture<'a, Option<tokio::task::JoinHandle<()>>>;
}

impl<R: Guarded> Starts for Arc<Resource<R>> {
    fn name(&self) -> &str {
        &self.name
    }

    fn position<'a>(
        &'a self,
        at: &'a Start<'_>,
        may_adopt: bool,
        outbox_from: &'a mut i64,
    ) -> BoxFuture<'a, StartFrom> {
        Box::pin(at.position(self, may_adopt, outbox_from))
    }

    fn start<'a>(
        &'a self,
        build: &'a Build,
        start: Option<StartFrom>,
        filter: &'a Filter<'_>,
        background: &'a crate::tasks::Background,
    ) -> BoxFuture<'a, Option<tokio::task::JoinHandle<()>>> {
        Box::pin(build.start(self, start, filter, background))
    }
}

/// What every filter's start position is decided with.
pub(super) struct Start<'a> {
    pub(super) outbox: &'a crate::feed::outbox::Outbox,
    pub(super) outbox_on: bool,
    /// The rebuild requests a scan begun now covers.
    pub(super) covered_now: i64,
}

impl Start<'_> {
    /// Where `r`'s filter starts ([`Resource::start_from`]); nothing
    /// positioned without the outbox, after writes went unrecorded (capture
    /// triggers installed at start after a gap) or unless `may_adopt`.
    /// Notes the rebuild requests it covers and moves `outbox_from` back
    /// to its position.
    pub(super) async fn position<R: Guarded>(
        &self,
        r: &Resource<R>,
        may_adopt: bool,
        outbox_from: &mut i64,
    ) -> StartFrom {
        let scans = self.outbox.scans_at_start(&r.name);
        if scans {
            // A first install too: no warning (the periodic check warns
            // when it finds triggers gone at run time).
            tracing::info!(resource = %r.name, "capture triggers were missing or replaced at start (a first install, or changed since): writes before them may be in no outbox entry, so the filter is scanned; no snapshot or epoch is adopted");
            // A shared filter outlives the fleet: it may lack those rows
            // too, and this instance's own rebuild request does not reach
            // it (its "no" waits for the fill).
            r.fill_shared_after_a_gap();
        }
        let start = if self.outbox_on && may_adopt && !scans {
            r.start_from().await
        } else {
            StartFrom::Scan {
                over_earlier: false,
            }
        };
        let covered = match start {
            StartFrom::Positioned { at, covered } => {
                *outbox_from = (*outbox_from).min(at);
                covered
            }
            // Its scan begins after the rebuild requests read at start
            // (covered before the follower can read them again).
            StartFrom::Scan { .. } => self.covered_now,
        };
        self.outbox.cover(&r.name, covered);
        start
    }
}

/// How every filter's start is run.
pub(super) struct Build {
    pub(super) retry: (Duration, Duration),
    pub(super) monitor_every: Duration,
    pub(super) snapshot_every: Duration,
    /// The outbox follower's start: a scan's filter is positioned there.
    pub(super) outbox_from: i64,
    pub(super) covered_now: i64,
}

impl Build {
    /// Starts `r`'s filter from `start`: its watch (before the build: see
    /// [`Resource::start_watch`]), its upkeep, and, scanned and `build`, a
    /// build kept in Redis for the next instances to adopt
    /// ([`Resource::keep_start_filter`]), over a stored epoch only where
    /// none is (another instance's is kept) or where it is an earlier
    /// release's, always after a seed here. Not started (the filters are
    /// off): its snapshot saver only. Returns that build's task.
    pub(super) async fn start<R: Guarded>(
        &self,
        r: &Arc<Resource<R>>,
        start: Option<StartFrom>,
        filter: &Filter<'_>,
        background: &crate::tasks::Background,
    ) -> Option<tokio::task::JoinHandle<()>> {
        let Some(start) = start else {
            r.spawn_upkeep(None, self.snapshot_every);
            return None;
        };
        let replace = match start {
            _ if filter.seeded => Replace::Always,
            StartFrom::Scan { over_earlier: true } => Replace::IfEarlier,
            _ => Replace::IfNone,
        };
        let build = filter.build;
        r.start_watch().await;
        r.spawn_upkeep(Some(self.monitor_every), self.snapshot_every);
        if let StartFrom::Positioned { .. } = start {
            // Restored or adopted, not scanned: rows written behind the
            // outbox's back are looked for in the background.
            r.shield().verify_rows();
            return None;
        }
        if !build {
            return None;
        }
        // The build runs in this task: its end (or its panic) is the
        // task's, and nothing is kept after a shutdown cut it short.
        let (r, at, covered) = (Arc::clone(r), self.outbox_from, self.covered_now);
        let (min, max) = self.retry;
        Some(background.spawn(async move {
            Arc::clone(r.shield()).build_until_ready(min, max).await;
            r.keep_start_filter(at, covered, replace).await;
        }))
    }
}
