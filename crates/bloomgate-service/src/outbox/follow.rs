//! The outbox's follower: a cursor, the open gaps and the watermark below
//! the oldest; each poll applies what it read (to the SKU funnel or the
//! resource its entry names) before the position moves; the in-step
//! watchdog; the rebuilds after a lost position.

use super::*;
use crate::wire::kind;

impl Outbox {
    /// Follows the table from `from`, applying other instances' changes to
    /// `reader`, and keeps the gate's in-step flag (true while the outbox
    /// was read within `sql.out_of_step_ms`) until the service is dropped.
    /// Starts once per handle.
    /// Rebuild requests up to `covered` are not acted on: the filter this
    /// instance starts with holds their rows (a scan after
    /// [`Outbox::max_seq`], or a snapshot or epoch complete up to it).
    pub fn spawn_follower(&self, from: i64, covered: i64, reader: &ShieldedReader) {
        if self.running.swap(true, Ordering::Relaxed) {
            return;
        }
        {
            let mut f = lock(&self.follow);
            f.cursor = from;
            f.rebuilds_covered = covered;
        }
        self.last_ok_ms.store(now_millis(), Ordering::Relaxed);
        let (outbox, follower_reader) = (self.clone(), reader.clone());
        self.background.spawn(async move {
            let reader = follower_reader;
            let mut failing = false;
            let mut trimmed_at = Instant::now();
            let mut first = true;
            let _guard = Gate::follow(&reader.gate);
            while !Gate::only_followers_left(&reader.gate) {
                if !std::mem::take(&mut first) {
                    tokio::select! {
                        () = tokio::time::sleep(outbox.poll) => {}
                        () = outbox.doorbell.notified() => {}
                    }
                }
                outbox.before_poll.pass(0).await;
                match outbox.poll_once(&reader).await {
                    Ok(()) => {
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
                    }
                }
                if trimmed_at.elapsed() >= TRIM_EVERY.min(outbox.retention) {
                    trimmed_at = Instant::now();
                    if let Err(e) = outbox.trim().await {
                        tracing::warn!(error = %e, "trimming the change outbox failed");
                    }
                }
            }
        });
        let (outbox, reader) = (self.clone(), reader.clone());
        self.background.spawn(async move {
            let _guard = Gate::follow(&reader.gate);
            while !Gate::only_followers_left(&reader.gate) {
                tokio::time::sleep(outbox.poll).await;
                // Only the outbox is complete (the Redis log misses what a
                // writer that died with its appends queued never sent), so
                // only reading it vouches for the filter.
                let in_step = now_millis().saturating_sub(outbox.last_ok_ms())
                    <= outbox.out_of_step.as_millis() as u64;
                for r in outbox.resource_readers() {
                    if r.gate.set_in_step(in_step) && !in_step {
                        r.invalidate_all_local();
                    }
                }
                if reader.gate.set_in_step(in_step) {
                    if in_step {
                        tracing::info!(
                            "in step with the change outbox again: the filter's no is a 404 again"
                        );
                    } else {
                        // Cached "not found"s may be as stale as the filter.
                        reader.invalidate_all_local();
                        outbox.counters.out_of_step.fetch_add(1, Ordering::Relaxed);
                        tracing::error!(
                            out_of_step_ms = outbox.out_of_step.as_millis() as u64,
                            "out of step: the change outbox could not be read; the filter's no no longer answers 404"
                        );
                    }
                }
            }
        });
    }

    /// In strict and redis modes, adds other instances' creates to the
    /// shared filters too (one pipelined call per table and page): the
    /// writer adds them before it answers, so this only repairs one whose
    /// tries all failed, or a shared filter refilled meanwhile.
    async fn share_creates(&self, entries: &[Entry], reader: &ShieldedReader) {
        let origin = self.store.origin();
        let created = entries
            .iter()
            .filter(|e| e.kind == kind::CREATED && e.origin != origin);
        let mut ids = Vec::new();
        let mut keys: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for e in created {
            if e.resource == SKU_RESOURCE {
                ids.extend(e.key.parse::<i64>().ok());
            } else {
                keys.entry(&e.resource).or_default().push(&e.key);
            }
        }
        if let (Some(shared), false) = (&reader.shared, ids.is_empty()) {
            if let Err(e) = shared.insert_many(&ids).await {
                tracing::debug!(error = %e, "sharing followed creates failed");
            }
        }
        for (name, spelled) in keys {
            let Some(r) = lock(&self.resources).get(name).cloned() else {
                continue;
            };
            let Some(shared) = &r.shared else { continue };
            let ty = r.store.0.key_type();
            let parsed: Vec<Key> = spelled
                .iter()
                .filter_map(|k| Key::parse(ty, k).ok())
                .collect();
            if let Err(e) = shared.insert_many(&parsed).await {
                tracing::debug!(resource = name, error = %e, "sharing followed creates failed");
            }
        }
    }

    /// Reads everything after the cursor and the open gaps, and applies it.
    async fn poll_once(&self, reader: &ShieldedReader) -> Result<(), StoreError> {
        if self.watermark() < self.trimmed_through().await? {
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
                f.gaps.clear();
            }
            self.rebuild(reader, None);
        }
        loop {
            let cursor = lock(&self.follow).cursor;
            let page = self.after(cursor).await?;
            // Applied first, then the position moves: whoever reads the
            // watermark (a snapshot, a shared rebuild) may rely on every
            // create up to it being in the filter.
            for e in &page {
                self.apply(e, reader);
            }
            self.share_creates(&page, reader).await;
            let mut jumped = false;
            {
                let mut f = lock(&self.follow);
                let now = Instant::now();
                for e in &page {
                    let missing = e.seq - f.cursor - 1;
                    if missing > 0 {
                        if f.gaps.len() as i64 + missing > MAX_GAPS as i64 {
                            jumped = true;
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
            }
            if jumped {
                tracing::warn!(
                    "change outbox jumped past {MAX_GAPS} unseen numbers: rebuilding the filter"
                );
                self.rebuild(reader, None);
            }
            if page.len() < PAGE {
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
            for e in &found {
                self.apply(e, reader);
            }
            self.share_creates(&found, reader).await;
            {
                let mut f = lock(&self.follow);
                for e in &found {
                    if f.gaps.remove(&e.seq).is_some() {
                        self.counters.gaps_filled.fetch_add(1, Ordering::Relaxed);
                    }
                }
                let before = f.gaps.len();
                let wait = self.gap_wait;
                f.gaps
                    .retain(|_, seen| reread_at.saturating_duration_since(*seen) < wait);
                self.counters
                    .gaps_expired
                    .fetch_add((before - f.gaps.len()) as u64, Ordering::Relaxed);
            }
        }
        Ok(())
    }

    fn apply(&self, e: &Entry, reader: &ShieldedReader) {
        let own = e.origin == self.store.origin();
        if e.resource != SKU_RESOURCE {
            if e.kind == kind::BUILT {
                // Another instance's shared rebuild of the resource.
                let hook = lock(&self.built).get(&e.resource).cloned();
                if let (false, Some(hook), Ok(epoch)) = (own, hook, e.key.parse()) {
                    (hook.0)(epoch);
                }
                return;
            }
            let Some(r) = lock(&self.resources).get(&e.resource).cloned() else {
                return;
            };
            let Ok(key) = Key::parse(r.store.0.key_type(), &e.key) else {
                tracing::warn!(seq = e.seq, resource = %e.resource, key = %e.key, "change outbox: a key the resource cannot parse; skipped");
                return;
            };
            if e.kind == kind::CREATED {
                r.gate.learn(&key);
            }
            if !own {
                r.invalidate_local(&key);
                self.counters.applied.fetch_add(1, Ordering::Relaxed);
            }
            return;
        }
        // An own create is learned too (a no-op unless it is still between
        // its commit and its insert here): past the watermark, every
        // create is in the filter, whoever made it.
        if own && e.kind != kind::CREATED {
            return;
        }
        if e.kind == kind::REBUILD {
            if e.seq <= lock(&self.follow).rebuilds_covered {
                return;
            }
            tracing::info!(
                seq = e.seq,
                "change outbox: rows were written that no entry names; rebuilding the filter"
            );
            // Its scan starts after this request, so after the entry
            // committed: once it succeeds, the filter holds those rows.
            self.rebuild(reader, Some(e.seq));
            return;
        }
        let Ok(id) = e.key.parse::<i64>() else {
            tracing::warn!(seq = e.seq, key = %e.key, "change outbox: an entry with a key that is not a SKU id; skipped");
            return;
        };
        if e.kind == kind::CREATED {
            reader.gate.learn(id);
        }
        if own {
            return;
        }
        reader.invalidate_local(&id);
        self.counters.applied.fetch_add(1, Ordering::Relaxed);
    }

    /// This instance may have missed creates: its filter's "no" is not
    /// trusted until a rebuild succeeds (retried until one does), and L1
    /// is emptied through the shards.
    fn rebuild(&self, reader: &ShieldedReader, covers: Option<i64>) {
        // Lost entries may have named any resource; an `r` entry (covers)
        // names the SKUs only.
        if covers.is_none() {
            for r in self.resource_readers() {
                r.gate.rebuild_owed(|| {});
                r.invalidate_all_local();
            }
        }
        let outbox = self.clone();
        reader.gate.rebuild_owed(move || {
            if let Some(seq) = covers {
                outbox.cover(seq);
            }
        });
        reader.invalidate_all_local();
        self.counters.rebuilds.fetch_add(1, Ordering::Relaxed);
    }
}
