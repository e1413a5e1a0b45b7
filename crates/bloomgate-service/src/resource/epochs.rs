//! Shared rebuilds for a resource: one instance scans its source and
//! stores the filter in Redis as an epoch (the library's snapshot format,
//! in segments, under `{prefix}r:{name}:bloom:epoch`), positioned in the
//! outbox; the others adopt it without a scan, replaying the keys created
//! after its position from the outbox, as a snapshot's restore does. A warm
//! with `rebuild_bloom` announces its epoch with an outbox entry (kind
//! `b`); an instance that starts with no snapshot adopts the newest.
//!
//! A resource with a `watch_column` keeps its own builds: rows its watch
//! admitted are in no outbox entry, so an epoch's replay could not add them.
//! The default resource `skus` stores and announces none here: its epochs
//! are led through the doorbell ([`crate::feed::doorbell::Doorbell`],
//! `{prefix}bloom:epoch`), as seed 000's instances share them.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use super::{Guarded, Resource};
use crate::filter::{decode, key_kind};

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
    /// A rebuild after deletes is on its way (one at a time).
    rebuild_pending: AtomicBool,
}

/// How an adoption ends that a local rebuild made needless (its filter,
/// published when it finishes, is as new).
const AS_NEW: &str = "its filter is as new";

impl EpochCounters {
    /// The figures under `epochs` in the stats.
    #[must_use]
    pub fn json(&self) -> serde_json::Value {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        serde_json::json!({
            "published": get(&self.published),
            "adopted": get(&self.adopted),
            "adopt_failures": get(&self.adopt_failures),
            "held": get(&self.held),
        })
    }
}

impl<R: Guarded> Resource<R> {
    /// The doorbell and the epoch counter's key, when this resource
    /// shares its rebuilds (Redis is there and no watch column).
    pub(super) fn epoch_store(&self) -> Option<(&crate::feed::doorbell::Doorbell, &str)> {
        if self.is_watched() {
            return None;
        }
        Some((self.changes.as_ref()?, self.epoch_counter.as_deref()?))
    }

    /// Stores the published filter as a new epoch, complete up to outbox
    /// position `at` (noted before its scan began); with `announce`, an
    /// outbox entry tells the other instances to adopt it.
    ///
    /// # Errors
    /// Why not (no Redis, a watched table, no filter, Redis or SQL failed).
    pub async fn publish_epoch(&self, at: i64, announce: bool) -> Result<u64, String> {
        let (log, counter) = self
            .epoch_store()
            .ok_or("this resource does not share its rebuilds")?;
        let gate = self.gate();
        let filter = gate.published().ok_or("no filter published")?;
        let kind = key_kind(self.key_type());
        let encoded = crate::filter::encode_one(filter, kind).await?;
        let bytes = &encoded.bytes;
        let epoch = log
            .store_epoch(
                counter,
                bytes,
                &[
                    ("outbox", at.to_string()),
                    ("capacity", gate.capacity().to_string()),
                    ("fpp", gate.fpp().to_string()),
                    ("layout", format!("{:?}", gate.layout())),
                    ("key_type", format!("{:?}", self.key_type())),
                    (
                        "identity",
                        self.identity.as_deref().unwrap_or("").to_owned(),
                    ),
                ],
            )
            .await?;
        if announce {
            self.store
                .record_many(&self.name, &[epoch.to_string()], crate::wire::kind::BUILT)
                .await
                .map_err(|e| e.to_string())?;
            log.ring().await;
        }
        self.epochs.published.fetch_add(1, Ordering::Relaxed);
        self.epochs.held.fetch_max(epoch, Ordering::Relaxed);
        Ok(epoch)
    }

    /// Adopts epoch `epoch`: verified, made the filter being built (so
    /// every insert from now on reaches it), the keys created after its
    /// position replayed from the outbox, then published. Returns the
    /// epoch's outbox position and the keys replayed.
    ///
    /// # Errors
    /// Why not (the caller scans the source instead).
    pub async fn adopt_epoch(&self, epoch: u64) -> Result<(i64, usize), String> {
        let (log, counter) = self
            .epoch_store()
            .ok_or("this resource does not share its rebuilds")?;
        let gate = self.gate();
        let meta = log.epoch_meta(counter, epoch).await?;
        let field = |name: &str| {
            meta.get(name)
                .cloned()
                .ok_or_else(|| format!("epoch {epoch} has no {name}"))
        };
        if field("fpp")? != gate.fpp().to_string()
            || field("layout")? != format!("{:?}", gate.layout())
            || field("key_type")? != format!("{:?}", self.key_type())
        {
            return Err(format!(
                "epoch {epoch} was made for another layout, rate or key type"
            ));
        }
        // Made for another database, table or key column (staging and
        // production under one prefix; an earlier release's names none).
        let want = self.identity.as_deref().ok_or("no database identity yet")?;
        if meta.get("identity").map(String::as_str) != Some(want) {
            return Err(format!(
                "epoch {epoch} holds {:?}, not {want}",
                meta.get("identity")
            ));
        }
        let at: i64 = field("outbox")?
            .parse()
            .map_err(|_| "bad outbox position")?;
        let capacity: u64 = field("capacity")?.parse().map_err(|_| "bad capacity")?;
        // Made against another database under the same Redis prefix: what
        // it lacks could not be replayed (at start and on an announcement).
        let max = self.outbox.max_seq().await.map_err(|e| e.to_string())?;
        if at > max {
            return Err(format!(
                "epoch {epoch} is positioned at {at}, ahead of this database's outbox ({max})"
            ));
        }
        let bytes = log.read_epoch_in(counter, epoch).await?;
        let (layout, kind) = (gate.layout(), key_kind(self.key_type()));
        let filter = tokio::task::spawn_blocking(move || decode(layout, &bytes, kind))
            .await
            .map_err(|e| e.to_string())??;
        let filter = gate
            .begin_adopt(filter)
            .ok_or_else(|| format!("a rebuild runs here; {AS_NEW}"))?;
        let replayed = async {
            let created = self
                .outbox
                .created_keys_after(at, &self.name)
                .await
                .map_err(|e| e.to_string())?
                .ok_or("the change outbox was trimmed past the epoch's position")?;
            let mut keys = Vec::with_capacity(created.len());
            for raw in &created {
                keys.push(self.reader.store.parse_key(raw)?);
            }
            Ok::<_, String>(keys)
        }
        .await;
        let keys = match replayed {
            Ok(keys) => keys,
            Err(why) => {
                gate.abandon_adopt(&filter);
                return Err(why);
            }
        };
        filter.insert_many(&keys);
        if !gate.finish_adopt(&filter, capacity) {
            return Err(format!("a rebuild took over; {AS_NEW}"));
        }
        // A warm's rebuild: rows may have gone that no entry named (a
        // TRUNCATE); the cached ones go too.
        self.reader.invalidate_all_local();
        self.epochs.adopted.fetch_add(1, Ordering::Relaxed);
        self.epochs.held.fetch_max(epoch, Ordering::Relaxed);
        Ok((at, keys.len()))
    }

    /// At start, with no snapshot: adopts the newest epoch, if one was
    /// stored. Returns its outbox position (the follower starts there or
    /// before); `None` when the filter must be built from the source.
    pub async fn adopt_latest(&self) -> Option<i64> {
        let (log, counter) = self.epoch_store()?;
        let (epoch, meta) = match log.latest_epoch(counter).await {
            Ok(Some(found)) => found,
            Ok(None) => return None,
            Err(e) => {
                tracing::warn!(resource = %self.name, error = %e, "reading the resource's epoch failed; scanning its source");
                return None;
            }
        };
        // An epoch ahead of this database's outbox was made against another
        // database (one recreated, or restored from a backup) under the
        // same Redis prefix.
        let at: i64 = meta
            .get("outbox")
            .and_then(|v| v.parse().ok())
            .unwrap_or(i64::MAX);
        match self.outbox.max_seq().await {
            Ok(max) if at <= max => {}
            Ok(max) => {
                tracing::info!(resource = %self.name, epoch, at, max, "resource epoch is ahead of this database's outbox; scanning its source");
                return None;
            }
            Err(e) => {
                tracing::warn!(resource = %self.name, error = %e, "reading the outbox failed; scanning the source");
                return None;
            }
        }
        match self.adopt_epoch(epoch).await {
            Ok((at, replayed)) => {
                tracing::info!(resource = %self.name, epoch, replayed, "resource filter adopted from Redis at start; no scan");
                Some(at)
            }
            Err(why) => {
                tracing::info!(resource = %self.name, epoch, %why, "resource epoch not adopted; scanning its source");
                None
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
            let at = r.outbox.watermark();
            let built = r.gate().request_rebuild().wait().await.is_ok();
            if built && r.epoch_store().is_some() {
                if let Err(why) = r.publish_epoch(at, true).await {
                    tracing::warn!(resource = %r.name, %why, "the rebuild after deletes was not shared");
                }
            }
            r.epochs.rebuild_pending.store(false, Ordering::Release);
        });
    }

    /// Follows another instance's announced epochs: each is adopted in the
    /// background; one that cannot be is answered by a rebuild from the
    /// source here.
    pub(super) fn follow_epochs(self: &Arc<Self>) {
        let weak = Arc::downgrade(self);
        self.outbox.on_built(
            &self.name,
            crate::feed::outbox::BuiltHook(Arc::new(move |epoch| {
                let Some(r) = weak.upgrade() else { return };
                let bg = r.background.clone();
                bg.track(async move {
                    if r.epoch_store().is_none() {
                        // A watched table keeps its own builds: rebuild
                        // here too (the other instance rebuilt for a
                        // reason: deletes, growth).
                        drop(r.gate().request_rebuild());
                        return;
                    }
                    // The newest epoch, which may be newer than the one
                    // announced (a start-up filter stored since, or an
                    // announcement replayed from before this instance's
                    // filter): none when this instance holds it already.
                    let latest = match r.epoch_store() {
                        Some((log, counter)) => match log.latest_epoch(counter).await {
                            Ok(Some((n, _))) => n.max(epoch),
                            _ => epoch,
                        },
                        None => epoch,
                    };
                    if latest <= r.epochs.held.load(Ordering::Relaxed) || r.gate().is_rebuilding() {
                        return;
                    }
                    match r.adopt_epoch(latest).await {
                        Ok(_) => {}
                        Err(why) if why.ends_with(AS_NEW) => {}
                        Err(why) => {
                            r.epochs.adopt_failures.fetch_add(1, Ordering::Relaxed);
                            tracing::warn!(resource = %r.name, epoch = latest, %why, "cannot adopt another instance's rebuild; rebuilding from the source");
                            drop(r.gate().request_rebuild());
                        }
                    }
                });
            })),
        );
    }
}
