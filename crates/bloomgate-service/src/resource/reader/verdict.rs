//! The shield's part of a read, and the answers that need no waiting: the
//! filter's verdict (asking Redis only in `redis` mode, or for a strict
//! instance's "no"), a live L1 entry, and the counts they leave.

use std::sync::atomic::Ordering;

use crate::cache::Entry;
use crate::resource::reader::{Rows, Source};
use crate::resource::{Lookup, ShieldedReader};
use crate::shield::Verdict;

impl<R: Rows> ShieldedReader<R> {
    /// The filter's verdict when it needs no Redis round trip: `None` in
    /// `redis` mode (Redis answers every check) and for a strict
    /// instance's "no" (Redis must agree), which [`Self::lookup`] awaits.
    pub(super) fn verdict_now(&self, id: &R::Key) -> Option<Verdict> {
        if self.mode.shared_only() && self.shield.enabled() {
            return None;
        }
        let verdict = self.shield.probe(id);
        if verdict == Verdict::Reject && matches!(self.mode, super::Mode::Strict(_)) {
            return None;
        }
        Some(verdict)
    }

    /// The verdict [`Self::verdict_now`] could not give: in `redis` mode,
    /// one round trip decides (a failure answers maybe); in strict mode,
    /// the replica's "no" stands only if Redis agrees.
    pub(super) async fn verdict_from_redis(&self, id: &R::Key) -> Verdict {
        let Some(shared) = self.shared() else {
            return Verdict::Pass;
        };
        let maybe = shared.maybe_contains(id).await;
        if self.mode.shared_only() {
            return if maybe {
                Verdict::Pass
            } else if self.shared_no_stands(shared) {
                Verdict::Reject
            } else {
                Verdict::Unvouched
            };
        }
        if maybe {
            shared.counters.overruled.fetch_add(1, Ordering::Relaxed);
            Verdict::Pass
        } else {
            Verdict::Reject
        }
    }

    /// In `redis` mode, whether the shared filter's "no" is a 404: not
    /// while this instance is out of step with the outbox (captured
    /// creates reach the shared filter through its followers), owes a
    /// rebuild, or owes the shared filter a fill (rows were written that
    /// no entry names: a capture gap, a warm's rebuild request). Asked
    /// after the Redis answer, so a request made while it was on its way
    /// counts.
    fn shared_no_stands(&self, shared: &crate::share::redis_filter::SharedFilter) -> bool {
        self.shield.in_step() && !self.shield.rebuild_is_owed() && !shared.fill_owed()
    }

    /// Whether a row with a loose key may exist ([`Rows::loose_mark`]):
    /// then the filter's "no" does not stand and no cache answers. Asked of
    /// the filter that judges reads (the shared one in `redis` mode); a
    /// filter that cannot say counts as holding the mark.
    pub async fn loose_rows(&self) -> bool {
        let Some(mark) = self.store.loose_mark() else {
            return false;
        };
        match self.loose_rows_now(&mark) {
            Some(loose) => loose,
            None => match self.shared() {
                Some(shared) => shared.maybe_contains(&mark).await,
                None => true,
            },
        }
    }

    /// [`Self::loose_rows`] when no Redis round trip is needed: `None` in
    /// `redis` mode, and in strict mode while the replica lacks the mark
    /// (another instance's loose create may be in the shared filter and
    /// still on its way here).
    fn loose_rows_now(&self, mark: &R::Key) -> Option<bool> {
        if self.mode.shared_only() && self.shield.enabled() {
            return None;
        }
        match self.shield.holds(mark) {
            Some(false) if matches!(self.mode, super::Mode::Strict(_)) => None,
            held => Some(held.unwrap_or(true)),
        }
    }

    /// The verdicts of many keys as [`Self::lookup`] would reach them: in
    /// `redis` mode one batch of Redis checks decides; in strict mode the
    /// replica's "no"s stand only where Redis agrees; otherwise the
    /// replica's batch call alone. Not counted as reads.
    pub async fn verdicts(&self, keys: &[R::Key]) -> Vec<Verdict>
    where
        R::Key: Clone,
    {
        let mut verdicts = self.filter_verdicts(keys).await;
        if self.store.loose_mark().is_some() {
            let loose = verdicts.contains(&Verdict::Reject) && self.loose_rows().await;
            for (v, k) in verdicts.iter_mut().zip(keys) {
                if *v == Verdict::Reject && (loose || !R::judged(k)) {
                    *v = Verdict::Unvouched;
                }
            }
        }
        verdicts
    }

    /// [`Self::verdicts`] as the filters alone give them.
    async fn filter_verdicts(&self, keys: &[R::Key]) -> Vec<Verdict>
    where
        R::Key: Clone,
    {
        let Some(shared) = self.shared().filter(|_| self.shield.enabled()) else {
            return self.shield.check_many(keys);
        };
        let to_verdict = |maybe: bool| {
            if maybe {
                Verdict::Pass
            } else {
                Verdict::Reject
            }
        };
        if self.mode.shared_only() {
            let answers = shared.maybe_contains_many(keys).await;
            let stands = self.shared_no_stands(shared);
            return answers
                .into_iter()
                .map(|maybe| match to_verdict(maybe) {
                    Verdict::Reject if !stands => Verdict::Unvouched,
                    v => v,
                })
                .collect();
        }
        let mut verdicts = self.shield.check_many(keys);
        let refused: Vec<usize> = (0..keys.len())
            .filter(|&i| verdicts[i] == Verdict::Reject)
            .collect();
        if refused.is_empty() {
            return verdicts;
        }
        let asked: Vec<R::Key> = refused.iter().map(|&i| keys[i].clone()).collect();
        for (&i, maybe) in refused.iter().zip(shared.maybe_contains_many(&asked).await) {
            if maybe {
                shared.counters.overruled.fetch_add(1, Ordering::Relaxed);
                verdicts[i] = Verdict::Pass;
            }
        }
        verdicts
    }

    /// In strict and redis modes a cached "not found" is trusted only
    /// where the shared filter agrees: a key told to another instance
    /// (its row committed after this instance cached its absence) is in
    /// the shared filter at once, and here only when the outbox delivers.
    fn doubts_negatives(&self) -> bool {
        self.shared().is_some() && self.shield.enabled()
    }

    /// Whether L1's entry for `id` may answer: always, except a "not
    /// found" in strict or redis mode that the shared filter calls
    /// "maybe" (then the read goes on to Redis and SQL). `asked`: the
    /// shared filter already said "maybe" for this read (redis mode, or a
    /// strict "no" it overruled), so it is not asked again.
    pub(super) async fn trusts_l1(&self, id: &R::Key, asked: bool) -> bool {
        if !self.doubts_negatives() || !matches!(self.l1.get(id), Some(Entry::Missing)) {
            return true;
        }
        if asked || self.mode.shared_only() {
            return false;
        }
        let Some(shared) = self.shared() else {
            return true;
        };
        !shared.maybe_contains(id).await
    }

    /// The answer [`Self::lookup`] would give, when it needs no waiting: a
    /// filter "no", or a live L1 entry. `None` when the read must go on to
    /// Redis or SQL (or ask Redis first); nothing is counted then, so the
    /// caller's `lookup` counts the read once.
    pub fn lookup_now(&self, id: &R::Key) -> Option<Lookup<R::Row>> {
        if let Some(mark) = self.store.loose_mark() {
            // A loose key, or a filter that holds the mark: `lookup` reads
            // around the caches.
            if !R::judged(id) || self.loose_rows_now(&mark) != Some(false) {
                return None;
            }
        }
        let verdict = self.verdict_now(id)?;
        if verdict == Verdict::Reject {
            self.shield.tally(verdict);
            self.audit_refusal(id);
            return Some(Lookup::Missing(Source::Filter));
        }
        if self.doubts_negatives() && matches!(self.l1.get(id), Some(Entry::Missing)) {
            // The shared filter must agree first (see `trusts_l1`).
            return None;
        }
        let answer = self.l1_answer(id)?;
        self.shield.tally(verdict);
        self.after_shield(verdict, &answer);
        Some(answer)
    }

    /// A live L1 entry as an answer, counted as a hit.
    pub(super) fn l1_answer(&self, id: &R::Key) -> Option<Lookup<R::Row>> {
        Some(match self.l1.get(id)? {
            Entry::Found(sku) => {
                self.l1_counters.hits.incr();
                Lookup::Found(sku, Source::L1)
            }
            Entry::Missing => {
                self.l1_counters.negative_hits.incr();
                Lookup::Missing(Source::L1)
            }
        })
    }

    /// Counts a "maybe" from the filter for an id that does not exist: a
    /// false positive, or a SKU deleted since the last build.
    pub(super) fn after_shield(&self, verdict: Verdict, answer: &Lookup<R::Row>) {
        if verdict == Verdict::Pass && matches!(answer, Lookup::Missing(_)) {
            self.shield.note_passed_missing();
        }
    }
}
