//! The key API of a resource: writes made elsewhere (`keys` adds to every
//! instance's filter, `invalidate` drops from every instance's caches),
//! each recorded in the outbox before it answers, and the reads of many
//! keys (`exists`, the filter alone; `batch`, through the funnel).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::{Guarded, Resource};
use crate::error::AppError;
use crate::key::Key;
use crate::shield::Verdict;
use crate::source::Row;

/// A filter's verdict on one key, for the HTTP gate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Judged {
    /// The filter vouches the key is absent.
    Absent,
    /// It may be present (or the filter cannot vouch); `vouched`: this
    /// instance vouches for what it knows of the key (see
    /// [`Resource::judge_one`]).
    Maybe {
        /// Remembered 404s may answer it.
        vouched: bool,
    },
}

/// The change feed's positions, for the HTTP gate's remembered 404s.
#[derive(Debug)]
struct FeedPositions(crate::feed::outbox::Outbox);

impl crate::cache::Positions for FeedPositions {
    fn watermark(&self) -> i64 {
        self.0.watermark()
    }

    fn since(&self) -> i64 {
        self.0.followed_since()
    }
}

/// The answer of a batch read.
#[derive(Debug)]
pub struct BatchAnswer<K = Key, T = Row> {
    /// The rows found, with their keys, in the order asked.
    pub found: Vec<(K, Arc<crate::cache::Cached<T>>)>,
    /// The keys with no row, in the order asked.
    pub missing: Vec<K>,
}

impl<R: Guarded> Resource<R> {
    fn check_len(&self, n: usize) -> Result<(), AppError> {
        if n > self.max_batch_keys {
            return Err(AppError::BadRequest(format!(
                "at most {} keys per call, got {n}",
                self.max_batch_keys
            )));
        }
        Ok(())
    }

    /// Adds `keys` (rows the application committed) to every instance's
    /// filter: added here, dropped from Redis and this instance's L1 (a
    /// "not found" cached before the row existed must not answer),
    /// recorded in the outbox (which the others follow), then the others
    /// are rung. Answers only after all of that, with which keys were
    /// added: all but a loose key that names no row ([`Self::rows_only`]).
    ///
    /// # Errors
    /// [`AppError::BadRequest`] over the limit; [`AppError::Unavailable`]
    /// when Redis did not confirm the deletes or the outbox could not be
    /// written (the keys are in this instance's filter anyway; call
    /// again), or the table could not be asked about a loose key.
    pub async fn add_keys(&self, keys: &[R::Key]) -> Result<Vec<bool>, AppError> {
        self.check_len(keys.len())?;
        self.need_outbox()?;
        let added = self.rows_only(keys).await?;
        let kept: Vec<R::Key> = keys
            .iter()
            .zip(&added)
            .filter(|(_, a)| **a)
            .map(|(k, _)| k.clone())
            .collect();
        if !kept.is_empty() {
            self.add_rows(&kept).await?;
        }
        Ok(added)
    }

    /// Which of `keys` may mark the filter: every one its filter judges,
    /// and a loose one (see [`crate::key::Fold`]) only where the table has
    /// its row. A loose key in a filter sets its loose mark, and a marked
    /// filter vouches for no "no" on any instance until a rebuild: one
    /// call naming a key that no row has (a typo, a guess, `BF.ADD users
    /// é` on a case-folding column) must not switch every instance's
    /// refusals off.
    async fn rows_only(&self, keys: &[R::Key]) -> Result<Vec<bool>, AppError> {
        let mut added = Vec::with_capacity(keys.len());
        for k in keys {
            let row = R::judged(k)
                || self
                    .reader
                    .store
                    .get(k)
                    .await
                    .map_err(|e| {
                        AppError::Unavailable(format!(
                            "checking a loose key against the table failed (nothing was added): {e}"
                        ))
                    })?
                    .is_some();
            if !row {
                tracing::debug!(resource = %self.name, "a loose key with no row was not added");
            }
            added.push(row);
        }
        Ok(added)
    }

    /// [`Self::add_keys`] for keys that may mark the filter.
    async fn add_rows(&self, keys: &[R::Key]) -> Result<(), AppError> {
        // Redis first: once the entry is in the outbox another instance
        // may learn the key and read it, and must not find a "not found"
        // cached before the row existed. Without that, nothing is
        // recorded and the call fails (the caller retries).
        for k in keys {
            self.reader.shield.insert(k);
        }
        if !self.reader.invalidate_many(keys).await {
            return Err(AppError::Unavailable(
                "redis did not confirm dropping the keys' cached \"not found\"; call again".into(),
            ));
        }
        self.record(keys, crate::wire::kind::CREATED).await?;
        // An adoption that began after the insert above and read its
        // replay before the entry committed would lack the keys: put them
        // in whichever filter is now published (as a SKU create does).
        for k in keys {
            self.reader.shield.ensure(k);
        }
        // Strict and redis modes: every instance sees the keys in Redis
        // before the call answers (the outbox reaches them later).
        if let Some(shared) = self.reader.shared() {
            if let Err(e) = shared.insert_many(keys).await {
                tracing::warn!(resource = %self.name, error = %e, "adding keys to the shared filter failed");
                return Err(AppError::Unavailable(
                    "the shared filter did not take the keys (they are recorded and reach every instance through the outbox); call again".into(),
                ));
            }
        }
        self.counters
            .keys_added
            .fetch_add(keys.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    /// Drops `keys` from L1 and Redis on every instance (recorded in the
    /// outbox; this instance's part done before it answers).
    ///
    /// # Errors
    /// As [`Resource::add_keys`].
    pub async fn invalidate(&self, keys: &[R::Key]) -> Result<(), AppError> {
        self.invalidate_as(keys, crate::wire::kind::UPDATED).await
    }

    /// Rows the application deleted: [`Resource::invalidate`], counted
    /// toward `bloom_rebuild_after_deletes` (the filter cannot forget a
    /// key; each deleted one costs a miss until a rebuild). Returns true
    /// when enough deletes piled up that a rebuild is due
    /// ([`Resource::rebuild_shared`]).
    ///
    /// # Errors
    /// As [`Resource::invalidate`].
    pub async fn deleted(&self, keys: &[R::Key]) -> Result<bool, AppError> {
        self.invalidate_as(keys, crate::wire::kind::DELETED).await?;
        let mut due = false;
        for _ in keys {
            due |= self.shield().note_delete(self.rebuild_after_deletes);
        }
        Ok(due)
    }

    async fn invalidate_as(&self, keys: &[R::Key], kind: &'static str) -> Result<(), AppError> {
        self.check_len(keys.len())?;
        self.need_outbox()?;
        let recorded = self.record(keys, kind).await;
        let confirmed = self.reader.invalidate_many(keys).await;
        recorded?;
        if !confirmed {
            return Err(AppError::Unavailable(
                "redis did not confirm dropping the keys; call again".into(),
            ));
        }
        self.counters
            .invalidated
            .fetch_add(keys.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    /// A call the other instances must learn of is refused, before it
    /// changes anything here, when there is no outbox to reach them.
    fn need_outbox(&self) -> Result<(), AppError> {
        if self.store.outbox_on() {
            Ok(())
        } else {
            Err(AppError::OutboxOff(crate::sql::OutboxOff.to_string()))
        }
    }

    async fn record(&self, keys: &[R::Key], kind: &'static str) -> Result<(), AppError> {
        let spelled: Vec<String> = keys.iter().map(ToString::to_string).collect();
        self.store
            .record_many(&self.name, &spelled, kind)
            .await
            .map_err(|e| {
                if let Some(off) = e.source.downcast_ref::<crate::sql::OutboxOff>() {
                    return AppError::OutboxOff(off.to_string());
                }
                tracing::warn!(resource = %self.name, error = %e, "recording keys in the outbox failed");
                AppError::Unavailable(e.to_string())
            })?;
        // Recorded: ring the others at once, whatever else fails (they
        // apply the entries), without waiting for Redis (the outbox holds
        // them already).
        if let Some(log) = self.changes.clone() {
            tokio::spawn(async move { log.ring().await });
        }
        Ok(())
    }

    /// The filter's answer for each key: false only where it says "no"
    /// and this instance can vouch for it (built, in step; in strict mode
    /// the shared filter agrees).
    ///
    /// # Errors
    /// [`AppError::BadRequest`] over the limit.
    pub async fn exists(&self, keys: &[R::Key]) -> Result<Vec<bool>, AppError> {
        self.check_len(keys.len())?;
        self.counters
            .exists_checked
            .fetch_add(keys.len() as u64, Ordering::Relaxed);
        Ok(self
            .reader
            .verdicts(keys)
            .await
            .into_iter()
            .map(|v| v != Verdict::Reject)
            .collect())
    }

    /// [`Resource::exists`] for one key, without the batch's buffers (the
    /// Redis-protocol listener's `BF.EXISTS`).
    pub async fn exists_one(&self, key: &R::Key) -> bool
    where
        R::Key: Clone,
    {
        self.verdict_one(key).await != Verdict::Reject
    }

    async fn verdict_one(&self, key: &R::Key) -> Verdict {
        self.counters.exists_checked.fetch_add(1, Ordering::Relaxed);
        let plain = self.reader.store.loose_mark().is_none();
        if plain && (self.reader.shared().is_none() || !self.reader.shield.enabled()) {
            return self.reader.shield.check(key);
        }
        self.reader.verdicts(std::slice::from_ref(key)).await[0]
    }

    /// [`Resource::exists_one`], and for a key it may hold whether this
    /// instance vouches for its answers about the key: the filter built,
    /// in step with the change feed and owing no rebuild, and the key one
    /// whose every spelling the caches tell apart. Only then may the HTTP
    /// gate answer it from a remembered 404
    /// ([`crate::cache::AbsentMemory`]).
    pub async fn judge_one(&self, key: &R::Key) -> Judged {
        match self.verdict_one(key).await {
            Verdict::Reject => Judged::Absent,
            Verdict::Pass => Judged::Maybe {
                vouched: self.reader.shield.vouches()
                    && R::judged(key)
                    && !self.reader.loose_rows().await,
            },
            Verdict::Open | Verdict::Unvouched => Judged::Maybe { vouched: false },
        }
    }

    /// A memory of an upstream's 404s for one HTTP gate route over this
    /// table (`route` names it), kept in step with the table: a change of
    /// a key applied here, or told through `keys` and `invalidate`, drops
    /// the key from it, here and in Redis.
    pub fn remember_absent(
        &self,
        route: &str,
        capacity: u64,
        ttl: std::time::Duration,
    ) -> crate::cache::AbsentMemory<R::Key> {
        let tag = crate::wire::short_tag(&[
            route,
            self.identity.as_deref().unwrap_or(""),
            &self.fold().identity_suffix(),
        ]);
        let namespace = crate::wire::absent_namespace(&self.name, &tag);
        let redis = self.reader.redis.as_ref().map(|r| r.namespaced(&namespace));
        let positions = Arc::new(FeedPositions(self.outbox.clone()));
        let memory = crate::cache::AbsentMemory::new(capacity, ttl, redis, Some(positions));
        self.reader.track_absent(memory.clone());
        memory
    }

    /// Reads many keys: screened by the filter's batch call, then L1, then
    /// one `IN (…)` load of the rest through the SQL bulkhead (not written
    /// back to the caches).
    ///
    /// # Errors
    /// [`AppError::BadRequest`] over the limit; [`AppError::Overloaded`]
    /// when the bulkhead is full; [`AppError::Unavailable`] when SQL fails.
    pub async fn batch(&self, keys: &[R::Key]) -> Result<BatchAnswer<R::Key, R::Row>, AppError> {
        self.check_len(keys.len())?;
        self.counters
            .batch_keys
            .fetch_add(keys.len() as u64, Ordering::Relaxed);
        let source = &self.reader.store;
        let answers = self
            .reader
            .batch(
                keys,
                |wanted| async move { source.load_many(&wanted).await },
            )
            .await?;
        let mut out = BatchAnswer {
            found: Vec::new(),
            missing: Vec::new(),
        };
        for (k, a) in keys.iter().zip(answers) {
            match a {
                Some(row) => out.found.push((k.clone(), row)),
                None => out.missing.push(k.clone()),
            }
        }
        Ok(out)
    }
}
