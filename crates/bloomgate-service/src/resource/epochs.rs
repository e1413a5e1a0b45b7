//! Shared rebuilds for a resource: one instance scans its source and
//! stores the filter in Redis as an epoch (the library's snapshot format,
//! in segments, under `{prefix}rf:{name}:bloom:epoch`; the default
//! resource's under `{prefix}bloom:epoch`), positioned in the
//! outbox; the others adopt it without a scan, replaying the keys created
//! after its position from the outbox, as a snapshot's restore does. A warm
//! with `rebuild_bloom` announces its epoch with an outbox entry (kind
//! `b`); an instance that starts with no snapshot adopts the newest.
//!
//! A shared rebuild is led: the instance a warm (or enough deletes)
//! reaches takes the resource's rebuild lock (`SET NX PX`) and scans; a
//! warm that reaches another instance meanwhile waits for the lock to go
//! and adopts that epoch instead of scanning again (or rebuilds here when
//! the leader stored none).
//!
//! A resource with a `watch_column` keeps its own builds: rows its watch
//! admitted are in no outbox entry, so an epoch's replay could not add them.
//!
//! The default resource's keys keep the names the previous release led
//! through the doorbell (`{prefix}bloom:epoch`, `{prefix}bloom:rebuild:lock`),
//! and its announcements are also appended to the doorbell stream in that
//! release's form: in a mixed fleet each release adopts the other's epochs
//! (see ARCHITECTURE.md, "A mixed fleet").

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::{Guarded, Resource};
use crate::filter::key_kind;
use crate::shield::{AdoptError, FilterMeta, How, ReadError, Want};

/// Why a filter was not stored (or announced) as an epoch.
#[derive(Debug, thiserror::Error)]
pub enum EpochError {
    /// The resource does not share its rebuilds (no Redis, a watch
    /// column, or the outbox off).
    #[error("this resource does not share its rebuilds")]
    NotShared,
    /// No filter is published yet.
    #[error("no filter published")]
    NoFilter,
    /// This database's identity is not known yet.
    #[error("this database has no identity yet")]
    NoIdentity,
    /// The filter could not be encoded.
    #[error(transparent)]
    Codec(#[from] crate::filter::CodecError),
    /// Redis failed.
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    /// The announcement could not be recorded in the outbox.
    #[error("recording the epoch in the outbox: {0}")]
    Outbox(#[from] crate::sql::StoreError),
}

/// When a start-up filter is stored as the epoch
/// ([`Resource::keep_start_filter`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replace {
    /// Only where Redis holds no epoch.
    IfNone,
    /// Also over an earlier release's epoch, which this one refused.
    IfEarlier,
    /// Always: this instance seeded the database, and an epoch left from
    /// before describes other data.
    Always,
}

/// Where a resource's epochs live in Redis.
#[derive(Debug, Clone)]
pub(super) struct EpochKeys {
    /// The epoch counter (`INCR`); meta and segments are named after it.
    pub(super) counter: String,
    /// The lock of a warm's shared rebuild, which other warms join.
    pub(super) lock: String,
    /// The lock of the rebuild after many deletes: apart, so no warm joins
    /// a scan that began before it was asked for.
    pub(super) deletes_lock: String,
}

impl EpochKeys {
    /// The keys under a resource's filter prefix.
    pub(super) fn under(prefix: &str) -> Self {
        let lock = crate::wire::rebuild_lock_key(prefix);
        Self {
            counter: crate::wire::epoch_counter_key(prefix),
            deletes_lock: format!("{lock}:deletes"),
            lock,
        }
    }
}

/// What a warm saw when it found another instance's rebuild running.
#[derive(Debug)]
pub(super) struct Joined {
    /// Redis's identity then.
    era: Option<String>,
    /// The newest epoch stored then (0: none).
    seen: u64,
}

/// How a joined warm's wait ended ([`Resource::join_lead`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum JoinEnd {
    /// The leader stored this epoch, and this instance holds it.
    Adopted(u64),
    /// The leader stored an epoch, and this instance could not take it:
    /// it rebuilds alone (the others have theirs).
    NotHere,
    /// The leader stored none (its build failed, it died, Redis went):
    /// this instance rebuilds and asks the others to.
    NoneStored,
}

/// How long a warm that found another instance's rebuild running waits
/// for its lock to go at most (the lock's own lifetime).
const JOIN_WAIT: Duration = Duration::from_millis(crate::feed::doorbell::REBUILD_LOCK_MS);

/// How often a joined warm looks whether the leader's lock is gone.
const JOIN_POLL: Duration = Duration::from_millis(100);

/// Where a filter starts ([`Resource::start_from`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartFrom {
    /// Restored from its snapshot or adopted from a shared epoch: complete
    /// up to outbox position `at`, holding the rows of the rebuild
    /// requests up to `covered`.
    Positioned {
        /// The outbox position.
        at: i64,
        /// The rebuild requests covered.
        covered: i64,
    },
    /// Scanned from the source.
    Scan {
        /// The newest shared epoch is an earlier release's: the scanned
        /// filter replaces it.
        over_earlier: bool,
    },
}

/// A resource's shared-rebuild counters.
#[derive(Debug, Default)]
pub struct EpochCounters {
    /// Epochs this instance built and stored.
    pub published: AtomicU64,
    /// Epochs this instance adopted instead of scanning.
    pub adopted: AtomicU64,
    /// Announced epochs it could not adopt (it rebuilt from the source).
    pub adopt_failures: AtomicU64,
    /// The newest epoch this instance's filter came from or went to.
    pub held: AtomicU64,
    /// Redis's identity `held` counts in (`Doorbell::redis_era`): under
    /// another one, epoch numbers started again and `held` says nothing.
    era: std::sync::Mutex<Option<String>>,
    /// The held epoch's outbox position: an epoch of the same number at
    /// another position is another epoch (numbers counted again where the
    /// identity key survived, as on a Redis Cluster node restarted empty
    /// that held the counter but not the identity).
    held_at: std::sync::atomic::AtomicI64,
    /// A rebuild after deletes is on its way (one at a time).
    rebuild_pending: AtomicBool,
    /// Shared rebuilds this instance led (took the lock, scanned, stored).
    pub led: AtomicU64,
    /// Warms that found another instance's shared rebuild running and
    /// waited for its epoch instead of scanning.
    pub joined: AtomicU64,
    /// Other instances' shared rebuilds read here: announced epochs, and
    /// the previous release's bare rebuild requests.
    pub requested: AtomicU64,
    /// Announced epochs adopted (`adopted` counts those at start too).
    pub followed: AtomicU64,
    /// One adoption of an announced epoch at a time (two at once would
    /// find the shield busy and scan).
    pub(super) following: tokio::sync::Mutex<()>,
}

impl<R: Guarded> Resource<R> {
    /// The doorbell and the epoch counter's key, when this resource
    /// shares its rebuilds (Redis is there and no watch column).
    pub(super) fn epoch_store(&self) -> Option<(&crate::feed::doorbell::Doorbell, &str)> {
        // An epoch is positioned in the outbox: without it (`sql.outbox`
        // off), none is stored or adopted.
        if self.is_watched() || !self.store.outbox_on() {
            return None;
        }
        let keys = self.epoch_keys.as_ref()?;
        Some((self.changes.as_ref()?, keys.counter.as_str()))
    }

    /// Tries to take the shared-rebuild lock: `Some(true)` when this
    /// instance now leads the rebuild every instance will adopt,
    /// `Some(false)` when another instance holds it, `None` when it cannot
    /// be asked (Redis did not answer, or the resource shares none).
    /// `after_deletes`: the lock of the rebuild after many deletes.
    pub(super) async fn try_lead(&self, after_deletes: bool) -> Option<bool> {
        let (log, _) = self.epoch_store()?;
        log.try_lock(self.lead_lock(after_deletes)?).await
    }

    /// Releases the shared-rebuild lock if this instance holds it.
    pub(super) async fn release_lead(&self, after_deletes: bool) {
        if let (Some((log, _)), Some(lock)) = (self.epoch_store(), self.lead_lock(after_deletes)) {
            log.unlock(lock).await;
        }
    }

    fn lead_lock(&self, after_deletes: bool) -> Option<&str> {
        let keys = self.epoch_keys.as_ref()?;
        Some(if after_deletes {
            &keys.deletes_lock
        } else {
            &keys.lock
        })
    }

    /// What a warm that found the lock taken notes: Redis's identity and
    /// the newest epoch number (the leader's will be newer).
    pub(super) async fn joining(&self) -> Joined {
        let (era, seen) = match self.epoch_store() {
            Some((log, counter)) => (
                log.redis_era().await.ok(),
                log.latest_epoch(counter)
                    .await
                    .ok()
                    .flatten()
                    .map_or(0, |(n, _)| n),
            ),
            None => (None, 0),
        };
        Joined { era, seen }
    }

    /// For a warm that found another instance's rebuild running (and
    /// noted `joined`): waits until its lock is gone (at most its
    /// lifetime; Redis not answering counts as gone), then adopts the
    /// epoch the leader stored, unless this instance holds it already.
    pub(super) async fn join_lead(self: &Arc<Self>, joined: &Joined) -> JoinEnd {
        let (Some((log, counter)), Some(lock)) = (self.epoch_store(), self.lead_lock(false)) else {
            return JoinEnd::NoneStored;
        };
        let waited = tokio::time::timeout(JOIN_WAIT, async {
            while log.lock_held(lock).await {
                tokio::time::sleep(JOIN_POLL).await;
            }
        })
        .await;
        if waited.is_err() {
            return JoinEnd::NoneStored;
        }
        let era = log.redis_era().await.ok();
        let Ok(Some((latest, _))) = log.latest_epoch(counter).await else {
            return JoinEnd::NoneStored;
        };
        // Under the identity noted, only a newer number is the leader's;
        // under a new one (Redis lost its state since), any is newer.
        if era.is_none() || (era == joined.era && latest <= joined.seen) {
            return JoinEnd::NoneStored;
        }
        Arc::clone(self).follow_epoch(latest).await;
        let held = self.epochs.held.load(Ordering::Relaxed);
        let same_era = crate::sync::lock(&self.epochs.era).as_deref() == era.as_deref();
        if same_era && held >= latest {
            JoinEnd::Adopted(held)
        } else {
            JoinEnd::NotHere
        }
    }

    /// Stores the published filter as a new epoch, complete up to outbox
    /// position `at` and holding the rows of the rebuild requests up to
    /// `covered` (both noted before its scan began: the watermark and
    /// `Outbox::max_seq`); with `announce`, an outbox entry tells the
    /// other instances to adopt it.
    ///
    /// # Errors
    /// Why not (no Redis, a watched table, no filter, Redis or SQL failed).
    pub async fn publish_epoch(
        &self,
        at: i64,
        covered: i64,
        announce: bool,
    ) -> Result<u64, EpochError> {
        let (log, counter) = self.epoch_store().ok_or(EpochError::NotShared)?;
        let shield = self.shield();
        let filter = shield.published().ok_or(EpochError::NoFilter)?;
        let kind = key_kind(self.key_type());
        let encoded = crate::filter::encode_one(filter, kind).await?;
        let bytes = &encoded.bytes;
        let meta = FilterMeta {
            outbox: at,
            covered,
            capacity: shield.capacity(),
            fpp: shield.fpp(),
            layout: shield.layout(),
            key_type: self.key_type(),
            identity: self
                .identity
                .as_deref()
                .ok_or(EpochError::NoIdentity)?
                .to_owned(),
        };
        let era = log.redis_era().await.ok();
        let epoch = log.store_epoch(counter, bytes, &meta).await?;
        self.hold(era, epoch, at);
        if announce {
            let recorded = self
                .store
                .record_many(&self.name, &[epoch.to_string()], crate::wire::kind::BUILT)
                .await;
            if self.announces_on_doorbell {
                // Unrecorded, the stream's entry is unmarked: every
                // instance of either release adopts it from there.
                let announced = log
                    .announce_for_earlier_release(epoch, &meta, recorded.is_ok())
                    .await;
                if let (Err(e), true) = (&recorded, announced) {
                    tracing::warn!(resource = %self.name, epoch, error = %e, "the epoch's outbox entry was not recorded; announced on the Redis stream alone");
                }
                if announced {
                    self.epochs.published.fetch_add(1, Ordering::Relaxed);
                    return Ok(epoch);
                }
            } else {
                log.ring().await;
            }
            recorded?;
        }
        self.epochs.published.fetch_add(1, Ordering::Relaxed);
        Ok(epoch)
    }

    /// Notes that this instance's filter came from or went to `epoch`
    /// (positioned at `at`), numbered under Redis identity `era`
    /// (unknown: the newest held).
    fn hold(&self, era: Option<String>, epoch: u64, at: i64) {
        let mut held_in = crate::sync::lock(&self.epochs.era);
        match era {
            Some(era) if held_in.as_deref() != Some(era.as_str()) => {
                *held_in = Some(era);
                self.epochs.held.store(epoch, Ordering::Relaxed);
            }
            _ => {
                self.epochs.held.fetch_max(epoch, Ordering::Relaxed);
            }
        }
        if self.epochs.held.load(Ordering::Relaxed) == epoch {
            self.epochs.held_at.store(at, Ordering::Relaxed);
        }
    }

    /// Whether the stored epoch `n`, whose meta is `fields`, is not the
    /// one held under that number (another position: numbered again).
    pub(super) fn renumbered(
        &self,
        n: u64,
        fields: &std::collections::HashMap<String, String>,
    ) -> bool {
        n == self.epochs.held.load(Ordering::Relaxed)
            && fields
                .get("outbox")
                .and_then(|v| v.parse::<i64>().ok())
                .is_some_and(|at| at != self.epochs.held_at.load(Ordering::Relaxed))
    }

    /// Forgets the epoch held when Redis's identity is not the one it was
    /// numbered under (Redis lost bloomgate's state: a flush, a new
    /// server), so the numbers counted again from 1 are followed.
    pub(super) async fn check_era(&self) {
        let Some((log, _)) = self.epoch_store() else {
            return;
        };
        let Ok(era) = log.redis_era().await else {
            return;
        };
        let mut held_in = crate::sync::lock(&self.epochs.era);
        if held_in.as_deref() == Some(era.as_str()) {
            return;
        }
        let held = self.epochs.held.swap(0, Ordering::Relaxed);
        if held_in.is_some() {
            tracing::info!(resource = %self.name, held, "Redis lost bloomgate's state (its identity key is new): following its epoch numbers afresh");
        }
        *held_in = Some(era);
    }

    /// Adopts epoch `epoch` (see [`crate::shield::adopt`]), then drops the
    /// cached rows: a warm's rebuild may follow rows gone that no entry
    /// named (a `TRUNCATE`). Returns the epoch's outbox position, the
    /// rebuild requests it covers and the keys replayed.
    ///
    /// # Errors
    /// Why not (the caller scans the source instead).
    pub async fn adopt_epoch(&self, epoch: u64) -> Result<(i64, i64, usize), AdoptError> {
        let (log, counter) = self.epoch_store().ok_or(AdoptError::Gone)?;
        let shield = self.shield();
        let era = log.redis_era().await.ok();
        let fields = log
            .epoch_meta(counter, epoch)
            .await
            .map_err(|e| ReadError::Redis(Box::new(e)))?;
        let meta = FilterMeta::from_fields(&fields)?;
        let want = Want {
            layout: shield.layout(),
            fpp: shield.fpp(),
            key_type: self.key_type(),
            fold: self.fold(),
            identity: self.identity.as_deref(),
        };
        let bytes = async { Ok(log.read_epoch_in(counter, epoch).await?) };
        let replayed = shield
            .adopt(&meta, &want, &self.outbox, &self.name, How::Adopt, bytes)
            .await?;
        // Its scan began after these rebuild requests: a follower that
        // reads them again need not rebuild.
        self.outbox.cover(&self.name, meta.covered);
        self.reader.invalidate_all_local();
        self.epochs.adopted.fetch_add(1, Ordering::Relaxed);
        self.hold(era, epoch, meta.outbox);
        Ok((meta.outbox, meta.covered, replayed))
    }

    /// Adopts the newest shared epoch. Returns its outbox position and the
    /// rebuild requests it covers.
    ///
    /// # Errors
    /// Why not: [`AdoptError::Gone`] where none is stored or none can be
    /// (no Redis, no outbox, a watched table).
    pub async fn adopt_latest(&self) -> Result<(i64, i64), AdoptError> {
        // An epoch is positioned in the outbox; a watched table's filter
        // holds rows no outbox entry names.
        if !self.store.outbox_on() || self.is_watched() {
            return Err(AdoptError::Gone);
        }
        let (log, counter) = self.epoch_store().ok_or(AdoptError::Gone)?;
        let (epoch, _) = log
            .latest_epoch(counter)
            .await
            .map_err(|e| ReadError::Redis(Box::new(e)))?
            .ok_or(AdoptError::Gone)?;
        let (at, covered, replayed) = self.adopt_epoch(epoch).await?;
        tracing::info!(resource = %self.name, epoch, replayed, "filter adopted from Redis at start; no scan");
        Ok((at, covered))
    }

    /// At start: where the filter comes from. Its snapshot, else the
    /// newest shared epoch ([`Resource::adopt_latest`]), else a scan of
    /// the source. Each refusal is logged with its reason.
    pub async fn start_from(&self) -> StartFrom {
        if let Some((at, covered)) = self.restore().await {
            return StartFrom::Positioned { at, covered };
        }
        match self.adopt_latest().await {
            Ok((at, covered)) => StartFrom::Positioned { at, covered },
            Err(why @ AdoptError::Gone) => {
                tracing::debug!(resource = %self.name, %why, "no epoch to adopt; scanning the source");
                StartFrom::Scan {
                    over_earlier: false,
                }
            }
            Err(why @ AdoptError::EarlierRelease(_)) => {
                tracing::info!(resource = %self.name, %why, "an earlier release's epoch is not adopted; scanning the source (this filter replaces it)");
                StartFrom::Scan { over_earlier: true }
            }
            Err(why @ (AdoptError::Outbox(_) | AdoptError::Read(_))) => {
                tracing::warn!(resource = %self.name, error = %why, "epoch not adopted; scanning the source");
                StartFrom::Scan {
                    over_earlier: false,
                }
            }
            Err(why) => {
                tracing::info!(resource = %self.name, %why, "epoch not adopted; scanning the source");
                StartFrom::Scan {
                    over_earlier: false,
                }
            }
        }
    }

    /// After a scan at start that began after outbox position `at` and
    /// rebuild request `covered`: keeps the filter in Redis for the next
    /// instances to adopt instead of scanning (not announced: running
    /// instances keep theirs), where `replace` says.
    pub async fn keep_start_filter(&self, at: i64, covered: i64, replace: Replace) {
        let Some((log, counter)) = self.epoch_store() else {
            return;
        };
        let store = match replace {
            Replace::Always => true,
            // An epoch whose meta expired is none: nothing adopts it.
            Replace::IfNone => match log.latest_epoch(counter).await {
                Ok(None) => true,
                Ok(Some((_, fields))) => fields.is_empty(),
                Err(_) => false,
            },
            // Only while the newest is still an earlier release's: one
            // stored since (a leader of this release) is kept.
            Replace::IfEarlier => match log.latest_epoch(counter).await {
                Ok(None) => true,
                Ok(Some((_, fields))) => {
                    fields.is_empty()
                        || matches!(
                            FilterMeta::from_fields(&fields),
                            Err(AdoptError::EarlierRelease(_))
                        )
                }
                Err(_) => false,
            },
        };
        if !store {
            return;
        }
        match self.publish_epoch(at, covered, false).await {
            Ok(epoch) => {
                tracing::info!(resource = %self.name, epoch, "start-up filter stored for the next instances to adopt");
            }
            Err(why) => {
                tracing::warn!(resource = %self.name, %why, "start-up filter not stored in Redis");
            }
        }
    }

    /// Rebuilds the filter from the source in the background and shares it
    /// as an epoch the other instances adopt (after many deletes: one
    /// scan for the fleet).
    pub fn rebuild_shared(self: &Arc<Self>) {
        // Deletes told while one is on its way join it.
        if self.epochs.rebuild_pending.swap(true, Ordering::AcqRel) {
            return;
        }
        let r = Arc::clone(self);
        self.background.spawn(async move {
            // Every instance counts the same deletes: the one that takes
            // the lock scans, the others adopt its epoch (which resets
            // their count). No warm joins this lock.
            let led = match r.try_lead(true).await {
                Some(false) => {
                    r.epochs.rebuild_pending.store(false, Ordering::Release);
                    return;
                }
                Some(true) => true,
                None => false,
            };
            let at = r.outbox.watermark();
            // Unread: the epoch covers no rebuild request.
            let covered = r.outbox.max_seq().await.unwrap_or(0);
            let built = r.shield().request_rebuild().wait().await.is_ok();
            if built && led {
                if let Err(why) = r.publish_epoch(at, covered, true).await {
                    tracing::warn!(resource = %r.name, %why, "the rebuild after deletes was not shared");
                }
            }
            if led {
                r.release_lead(true).await;
            }
            r.epochs.rebuild_pending.store(false, Ordering::Release);
        });
    }
}
