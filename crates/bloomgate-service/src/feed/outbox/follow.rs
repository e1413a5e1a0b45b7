//! The outbox's follower: a cursor, the open gaps and the watermark below
//! the oldest; each poll hands what it read to the tables (see
//! [`super::apply`]) before the position moves; the in-step watchdog; the
//! rebuilds after a lost position.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use crate::feed::outbox::{
    Outbox, LATE_EVERY, MAX_GAPS, MAX_LATE, PAGE, TRIM_CHECK_EVERY, TRIM_EVERY,
};
use crate::model::now_millis;
use crate::shield::Shield;
use crate::sql::StoreError;
use crate::sync::lock;
use crate::wire::kind;

impl Outbox {
    /// Follows the table from `from`, applying other instances' changes to
    /// the registered tables, and keeps their in-step flags (true while
    /// the outbox was read within `sql.out_of_step_ms`) until only
    /// followers hold `anchor` (the service was dropped) or the
    /// background's signal. Starts once per handle. (Rebuild requests a
    /// table's starting filter holds: [`Outbox::cover`].)
    pub fn spawn_follower(&self, from: i64, anchor: &Arc<Shield>) {
        if self.running.swap(true, Ordering::Relaxed) {
            return;
        }
        lock(&self.follow).cursor = from;
        self.follow_from(from);
        self.last_ok_ms.store(now_millis(), Ordering::Relaxed);
        self.spawn_listener(anchor);
        let (outbox, held) = (self.clone(), Arc::clone(anchor));
        self.background.spawn(async move {
            let anchor = held;
            let mut failing = false;
            let mut trimmed_at = Instant::now();
            let mut first = true;
            let mut check_trim = true;
            let _guard = Shield::follow(&anchor);
            if let Err(e) = outbox.seed_late(from).await {
                tracing::warn!(error = %e, "change outbox: the numbers missing before the start position were not read");
            }
            outbox.announce_gaps().await;
            while !Shield::only_followers_left(&anchor) {
                if !std::mem::take(&mut first) {
                    tokio::select! {
                        () = tokio::time::sleep(outbox.poll_wait()) => {}
                        () = outbox.doorbell.notified() => {}
                    }
                }
                outbox.before_poll.pass(0).await;
                // A position is trimmed only past entries older than the
                // retention, so only a follower that did not poll for that
                // long can have lost one: checked at half of it, at most.
                let every = TRIM_CHECK_EVERY.min(outbox.retention / 2);
                let due = check_trim
                    || lock(&outbox.follow)
                        .trim_checked
                        .is_none_or(|t| t.elapsed() >= every);
                match outbox.poll_once(due).await {
                    Ok(()) => {
                        check_trim = false;
                        outbox.last_ok_ms.store(now_millis(), Ordering::Relaxed);
                        outbox.counters.polls.fetch_add(1, Ordering::Relaxed);
                        if std::mem::take(&mut failing) {
                            tracing::info!("change outbox readable again; caught up");
                        }
                    }
                    Err(e) => {
                        outbox
                            .counters
                            .poll_failures
                            .fetch_add(1, Ordering::Relaxed);
                        if !std::mem::replace(&mut failing, true) {
                            tracing::warn!(error = %e, "change outbox unreadable; retrying");
                        }
                        // Entries may have been trimmed meanwhile.
                        check_trim = true;
                    }
                }
                if trimmed_at.elapsed() >= TRIM_EVERY.min(outbox.retention) {
                    trimmed_at = Instant::now();
                    if let Err(e) = outbox.trim().await {
                        tracing::warn!(error = %e, "trimming the change outbox failed");
                    }
                    outbox.recheck_capture().await;
                }
            }
        });
        // The late numbers, apart from the poll: applying a large late
        // transaction takes longer than the poll may.
        let (outbox, held) = (self.clone(), Arc::clone(anchor));
        self.background.spawn(async move {
            let anchor = held;
            let _guard = Shield::follow(&anchor);
            while !Shield::only_followers_left(&anchor) {
                tokio::time::sleep(LATE_EVERY).await;
                if let Err(e) = outbox.late().await {
                    tracing::warn!(error = %e, "change outbox: looking for late commits failed; retrying");
                }
            }
        });
        let (outbox, anchor) = (self.clone(), Arc::clone(anchor));
        self.background.spawn(async move {
            let _guard = Shield::follow(&anchor);
            let mut was_in_step = true;
            while !Shield::only_followers_left(&anchor) {
                tokio::time::sleep(outbox.poll).await;
                // Only the outbox is complete (the doorbell stream holds
                // no change), so only reading it vouches for the filters.
                let in_step = now_millis().saturating_sub(outbox.last_ok_ms())
                    <= outbox.out_of_step.as_millis() as u64;
                // A table whose capture is lost never vouches.
                for (name, t) in outbox.tables() {
                    t.set_in_step(in_step && !outbox.capture_is_lost(&name));
                }
                if std::mem::replace(&mut was_in_step, in_step) == in_step {
                    continue;
                }
                if in_step {
                    tracing::info!(
                        "in step with the change outbox again: the filter's no is a 404 again"
                    );
                } else {
                    outbox.counters.out_of_step.fetch_add(1, Ordering::Relaxed);
                    tracing::error!(
                        out_of_step_ms = outbox.out_of_step.as_millis() as u64,
                        "out of step: the change outbox could not be read; the filter's no no longer answers 404"
                    );
                }
            }
        });
    }

    /// Checks every captured table's triggers again (a DBA may have
    /// dropped or disabled them, or another version replaced them):
    /// missing ones are installed again where this connection may. Where
    /// it may not, an error is logged every check, the table's filter
    /// stops vouching (writes by other programs go unrecorded), and each
    /// table hears whether its triggers fire (`capture_checked`: the SKU
    /// table's writer then counts its own deletes toward a rebuild, which
    /// no trigger entry counts). Once they fire again after such a gap, whoever
    /// installed them, the filter is rebuilt here and every other
    /// instance is asked to rebuild it (an outbox entry): rows written in
    /// the gap are in no entry.
    async fn recheck_capture(&self) {
        let targets = lock(&self.captured).targets.clone();
        for t in targets {
            let state = match self.store.capture_state(&t).await {
                Ok(state) => state,
                Err(e) => {
                    tracing::debug!(table = %t.table, error = %e, "capture check failed");
                    continue;
                }
            };
            let current = state.is_current();
            // Counted before the install, so whoever sees the triggers
            // back sees the count too.
            self.counters
                .capture_lost
                .fetch_add(u64::from(!current), Ordering::Relaxed);
            // Made again or enabled again since the last check, with no
            // check in between: writes may have gone unrecorded as well.
            let replaced = state
                .fingerprint
                .as_deref()
                .is_some_and(|f| self.triggers_replaced(&t.resource, f));
            if replaced {
                tracing::warn!(table = %t.table, resource = %t.resource, "capture triggers were made or enabled again since the last check");
            }
            let gap = state.has_gap() || replaced || self.capture_is_lost(&t.resource);
            let ok = current
                || {
                    tracing::warn!(table = %t.table, resource = %t.resource, "capture triggers missing or changed; installing them again");
                    match self.store.install_capture(&t, false).await {
                        Ok(_) => true,
                        Err(e) => {
                            tracing::error!(table = %t.table, resource = %t.resource, error = %e, "capture triggers missing and cannot be installed: writes by other programs are not recorded, so the filter's no is not a 404 (bloomgate capture install)");
                            false
                        }
                    }
                };
            if ok && gap {
                // The triggers this rebuild is owed for: the ones checked,
                // or those just installed. If others replace them before
                // the next check, it finds them changed again.
                let fingerprint = if current {
                    state.fingerprint.clone()
                } else {
                    match self.store.capture_state(&t).await {
                        Ok(now) => now.fingerprint,
                        Err(_) => None,
                    }
                };
                tracing::warn!(table = %t.table, resource = %t.resource, "capture triggers fire again after writes went unrecorded: rebuilding the filter on every instance");
                // Untrusted before it stops being lost, so it never
                // vouches in between.
                if let Some(table) = self.table(&t.resource) {
                    table.rebuild_owed(Box::new(|| {}));
                    self.counters.rebuilds.fetch_add(1, Ordering::Relaxed);
                }
                // No filter scanned before now is adopted here (noted
                // again once the entry is recorded).
                if let Ok(seq) = self.max_seq().await {
                    self.note_rebuild_requested(&t.resource, seq + 1);
                }
                {
                    let mut c = lock(&self.captured);
                    if let Some(f) = &fingerprint {
                        c.seen.insert(t.resource.clone(), f.clone());
                    }
                    c.announce.insert(t.resource.clone(), fingerprint);
                }
            }
            {
                let mut c = lock(&self.captured);
                if ok {
                    c.lost.remove(&t.resource);
                } else if gap {
                    c.lost.insert(t.resource.clone());
                }
            }
            if !ok && gap {
                // At once, not at the watchdog's next tick.
                if let Some(table) = self.table(&t.resource) {
                    table.set_in_step(false);
                }
            }
            if let Some(table) = self.table(&t.resource) {
                table.capture_checked(ok);
            }
        }
        self.announce_gaps().await;
    }

    /// Records the rebuild entries owed for tables whose writes went
    /// unrecorded (kept for the next check when the outbox does not
    /// answer). Each is recorded after its triggers fire again, so a
    /// rebuild that applies it scans every row of the gap.
    pub async fn announce_gaps(&self) {
        let (owed, targets): (Vec<(String, Option<String>)>, _) = {
            let c = lock(&self.captured);
            let owed = c
                .announce
                .iter()
                .map(|(name, f)| (name.clone(), f.clone()))
                .collect();
            (owed, c.targets.clone())
        };
        for (name, fingerprint) in owed {
            // Named for the triggers this instance rebuilt for: whoever
            // finds those installed after reading it does not ask again.
            let key = crate::wire::capture_request_key(fingerprint.as_deref());
            match self.store.record_many(&name, &[key], kind::REBUILD).await {
                Ok(()) => {
                    {
                        // Unless a later check owes another one meanwhile.
                        let mut c = lock(&self.captured);
                        if c.announce.get(&name) == Some(&fingerprint) {
                            c.announce.remove(&name);
                        }
                    }
                    if let Some(f) = &fingerprint {
                        self.announced_for(&name, f);
                        // Asked for: a start that finds these triggers
                        // owes nothing more.
                        if let Some(t) = targets.iter().find(|t| t.resource == name) {
                            if let Err(e) = self.store.note_capture_seen(t, f).await {
                                tracing::warn!(resource = %name, error = %e, "the capture triggers' identity was not kept: the next start scans");
                            }
                        }
                    }
                    // At or past the entry just recorded: no filter whose
                    // scan began before it is adopted here.
                    if let Ok(seq) = self.max_seq().await {
                        self.note_rebuild_requested(&name, seq);
                    }
                }
                Err(e) => {
                    tracing::warn!(resource = %name, error = %e, "the other instances were not asked to rebuild after a capture gap; asked again at the next check");
                }
            }
        }
    }

    /// Reads everything after the cursor and the open gaps, and applies
    /// it; with `check_trim`, first whether entries this instance never
    /// read were trimmed (not on every poll: they are trimmed only when
    /// older than `sql.outbox_retention_secs`, which a follower that polls
    /// never falls behind by).
    async fn poll_once(&self, check_trim: bool) -> Result<(), StoreError> {
        if check_trim && self.watermark() < self.trimmed_through().await? {
            // Entries this instance never read are gone: rebuild, and go
            // on from a fresh start position (what is newer is re-read).
            let from = self.start_position().await?;
            tracing::warn!(
                from,
                "change outbox trimmed past this instance's position: rebuilding the filter"
            );
            {
                let mut f = lock(&self.follow);
                f.cursor = from;
                f.at_cursor = None;
                self.follow_from(from);
                // Still uncommitted ones may commit later: watched as late.
                let open: Vec<i64> = f.gaps.keys().copied().collect();
                let mut moved = 0;
                for g in open {
                    moved += f.give_up(g, g);
                }
                f.gaps.clear();
                f.late.seal(from);
                self.counters
                    .late_spanned
                    .fetch_add(moved, Ordering::Relaxed);
            }
            // Untrusted at once (the cursor already moved past entries
            // never read).
            self.rebuild_all();
            // Numbers skipped by the jump that are still uncommitted (the
            // rebuild cannot see their rows) are watched as late, as at a
            // start; and a rebuild is asked for again once they are read,
            // so one scan begins after this read: a number that commits
            // after it is in that scan, one read as uncommitted is
            // watched until it commits.
            if let Err(e) = self.seed_late(from).await {
                tracing::warn!(error = %e, "change outbox: the numbers skipped by the jump were not read");
            }
            self.rebuild_all();
        }
        if check_trim {
            lock(&self.follow).trim_checked = Some(Instant::now());
        }
        loop {
            let (cursor, seen) = {
                let f = lock(&self.follow);
                (f.cursor, f.at_cursor.clone())
            };
            let mut page = self.page_at(cursor).await?;
            let full = page.len() >= PAGE;
            if page.first().is_some_and(|e| e.seq == cursor) {
                let at = page.remove(0);
                if seen.is_some_and(|seen| seen != at) {
                    self.rewound(cursor).await?;
                    continue;
                }
            } else if cursor > 0 && page.is_empty() && self.max_seq().await? < cursor {
                // The newest entry is never trimmed, so the position's own
                // entry is missing with nothing after it only when the
                // outbox went back.
                self.rewound(cursor).await?;
                continue;
            }
            // Applied first, then the position moves: whoever reads the
            // watermark (a snapshot, a shared rebuild) may rely on every
            // create up to it being in the filter.
            self.apply_page(&page).await;
            let mut jumped = false;
            {
                let mut f = lock(&self.follow);
                let now = Instant::now();
                for e in &page {
                    let missing = e.seq - f.cursor - 1;
                    if missing > 0 {
                        if f.gaps.len() as i64 + missing > MAX_GAPS as i64 {
                            // Too many to wait for one by one: a rebuild,
                            // and the run watched as late (a rebuild cannot
                            // see rows still uncommitted).
                            jumped = true;
                            let (from, to) = (f.cursor + 1, e.seq - 1);
                            let moved = f.give_up(from, to);
                            self.counters
                                .late_spanned
                                .fetch_add(moved, Ordering::Relaxed);
                        } else {
                            for g in f.cursor + 1..e.seq {
                                f.gaps.insert(g, now);
                            }
                            self.counters
                                .gaps
                                .fetch_add(missing as u64, Ordering::Relaxed);
                        }
                    }
                    f.cursor = f.cursor.max(e.seq);
                }
                if let Some(last) = page.last() {
                    f.at_cursor = Some(last.clone());
                }
            }
            if jumped {
                tracing::warn!(
                    "change outbox jumped past {MAX_GAPS} unseen numbers: rebuilding the filter"
                );
                self.rebuild_all();
            }
            if !full {
                break;
            }
        }
        let open: Vec<i64> = lock(&self.follow).gaps.keys().copied().collect();
        if !open.is_empty() {
            // Expiry is judged against the time before the re-read: a gap
            // is given up only if it was still missing a whole wait after
            // it was first missed.
            let reread_at = Instant::now();
            let found = self.among(&open).await?;
            self.apply_page(&found).await;
            {
                let mut f = lock(&self.follow);
                for e in &found {
                    if f.gaps.remove(&e.seq).is_some() {
                        self.counters.gaps_filled.fetch_add(1, Ordering::Relaxed);
                    }
                }
                let wait = self.gap_wait;
                let mut expired = Vec::new();
                f.gaps.retain(|&seq, seen| {
                    let open = reread_at.saturating_duration_since(*seen) < wait;
                    if !open {
                        expired.push(seq);
                    }
                    open
                });
                self.counters
                    .gaps_expired
                    .fetch_add(expired.len() as u64, Ordering::Relaxed);
                // Given up, not forgotten: a transaction that stays open
                // longer still commits its entry (see `late`).
                let mut moved = 0;
                for seq in expired {
                    moved += f.give_up(seq, seq);
                }
                self.counters
                    .late_spanned
                    .fetch_add(moved, Ordering::Relaxed);
            }
        }
        Ok(())
    }

    /// The outbox went back below this instance's position (a restore, a
    /// failover to a lagging replica): new writes take numbers at or below
    /// it, which reading on from it would never see. Goes on from the
    /// outbox's end and rebuilds every filter (its "no" untrusted until
    /// then): what the restored database holds is unknown.
    async fn rewound(&self, cursor: i64) -> Result<(), StoreError> {
        let to = self.max_seq().await?;
        tracing::error!(
            position = cursor,
            outbox_end = to,
            "the change outbox went back behind this instance's position (a restore, or a failover to a lagging replica): rebuilding every filter"
        );
        {
            let mut f = lock(&self.follow);
            f.cursor = to;
            f.at_cursor = None;
            self.follow_from(to);
            f.gaps.clear();
            f.late = f.late.emptied();
            for c in f.rebuilds_covered.values_mut() {
                *c = (*c).min(to);
            }
            // Numbers past the end are another history's now.
            for r in f.rebuilds_requested.values_mut() {
                *r = (*r).min(to);
            }
        }
        self.counters.rewound.fetch_add(1, Ordering::Relaxed);
        self.rebuild_all();
        Ok(())
    }

    /// At start: the numbers missing among the [`MAX_LATE`] before `from`
    /// join the late set, so a transaction open across this instance's
    /// restart (its number given up by the previous process, or below the
    /// start position) is still found when it commits.
    async fn seed_late(&self, from: i64) -> Result<(), StoreError> {
        let floor = (from - MAX_LATE as i64).max(self.trimmed_through().await?);
        if floor >= from {
            return Ok(());
        }
        let seen = self.store.outbox_seqs_between(floor, from).await?;
        let mut f = lock(&self.follow);
        for seq in (floor + 1..=from).filter(|s| !seen.contains(s)) {
            f.give_up(seq, seq);
        }
        Ok(())
    }

    /// Looks for the numbers given up as gaps (run every [`LATE_EVERY`]
    /// by a task of its own, so a large late transaction never holds up
    /// the poll that keeps this instance in step): one that appeared
    /// belongs to a transaction that stayed open past `sql.outbox_gap_ms`
    /// (another program's, with capture triggers). It is applied here
    /// now, a page at a time, and recorded again under a new number (many
    /// keys a statement), so that a snapshot or shared rebuild whose
    /// watermark passed the old number (and whoever replays from it) gets
    /// it too. Then the spans (see [`late`]) are counted.
    pub(super) async fn late(&self) -> Result<(), StoreError> {
        if lock(&self.follow).late.is_empty() {
            return Ok(());
        }
        let trimmed = self.trimmed_through().await?;
        let forgotten = lock(&self.follow).late.forget_through(trimmed);
        self.counters
            .late_abandoned
            .fetch_add(forgotten, Ordering::Relaxed);
        let due = lock(&self.follow).late.ranges();
        let found = self.within_ranges(&due).await?;
        for page in found.chunks(PAGE) {
            tracing::warn!(
                entries = page.len(),
                first_seq = page[0].seq,
                resource = %page[0].resource,
                key = %page[0].key,
                "changes committed after their numbers were given up as gaps: applied late and recorded again"
            );
            self.apply_page(page).await;
            // Recorded again first, forgotten after: a failed re-record is
            // found (and applied, harmlessly) again next time, and retried.
            let mut again: BTreeMap<(&str, &'static str), Vec<String>> = BTreeMap::new();
            for e in page {
                let kind = match e.kind.as_str() {
                    kind::CREATED => kind::CREATED,
                    kind::UPDATED => kind::UPDATED,
                    kind::DELETED => kind::DELETED,
                    _ => continue,
                };
                again
                    .entry((&e.resource, kind))
                    .or_default()
                    .push(e.key.clone());
            }
            for ((resource, kind), keys) in &again {
                self.store.record_many(resource, keys, kind).await?;
            }
            let mut f = lock(&self.follow);
            for e in page {
                f.late.remove(e.seq);
            }
            drop(f);
            self.counters
                .late_applied
                .fetch_add(page.len() as u64, Ordering::Relaxed);
        }
        self.check_spans().await
    }
}
