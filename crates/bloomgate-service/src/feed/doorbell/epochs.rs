//! Shared rebuilds: the lock one instance takes to lead, the epochs it
//! publishes (the library's snapshot format in segments of at most
//! `cache.bloom_segment_bytes`, named by a `:meta` hash written last), and
//! their adoption by the others (verified, then the creates since replayed).

use super::*;
use crate::gate::{AdoptError, FilterMeta, How, ReadError, Want};

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

/// A Redis failure while reading an epoch.
fn redis_read(e: redis::RedisError) -> AdoptError {
    AdoptError::Read(ReadError::Redis(Box::new(e)))
}

/// When a start-up filter is stored as the epoch ([`Doorbell::publish_first`]).
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

/// Releases the shared-rebuild lock only if this instance still holds it.
const RELEASE: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
";

/// Redis's identity as bloomgate knows it: the value under the key, made
/// by whoever finds it missing (a new server, a flush, an eviction).
const ERA: &str = r"
local v = redis.call('GET', KEYS[1])
if v then return v end
redis.call('SET', KEYS[1], ARGV[1])
return ARGV[1]
";

/// How long the shared-rebuild lock holds if its owner dies.
const REBUILD_LOCK_MS: u64 = 10 * 60 * 1000;

/// How long an epoch's filter stays in Redis (the next epoch deletes it
/// sooner).
const EPOCH_TTL_SECS: u64 = 3600;

/// The largest segment an epoch is stored in, bytes.
pub const EPOCH_SEGMENT_MAX: u64 = 8 << 20;

impl Doorbell {
    /// A connection for moving whole filters: the shared one answers
    /// within `redis_timeout_ms`, too short for megabytes.
    async fn bulk_conn(&self) -> redis::RedisResult<Conn> {
        self.target
            .connect(
                self.timeout.max(Duration::from_millis(200)),
                Duration::from_secs(60),
            )
            .await
    }

    /// Tries to take the shared-rebuild lock: `Some(true)` when this
    /// instance now leads the rebuild every instance will adopt,
    /// `Some(false)` when another instance holds it, `None` when Redis did
    /// not answer.
    pub async fn try_lead(&self) -> Option<bool> {
        let mut conn = self.conn.clone();
        let set: redis::RedisResult<Option<String>> = redis::cmd("SET")
            .arg(crate::wire::rebuild_lock_key(&self.prefix))
            .arg(&self.instance)
            .arg("NX")
            .arg("PX")
            .arg(REBUILD_LOCK_MS)
            .query_async(&mut conn)
            .await;
        set.ok().map(|s| s.is_some())
    }

    /// Releases the lock if this instance holds it (best effort: it
    /// expires anyway).
    pub async fn release_lead(&self) {
        let mut conn = self.conn.clone();
        let released: redis::RedisResult<i64> = redis::Script::new(RELEASE)
            .key(crate::wire::rebuild_lock_key(&self.prefix))
            .arg(&self.instance)
            .invoke_async(&mut conn)
            .await;
        if let Err(e) = released {
            tracing::warn!(error = %e, "releasing the shared-rebuild lock failed; it expires by itself");
        }
    }

    /// Redis's identity under this prefix (`{prefix}redis:id`, a random
    /// value written by the first instance to find it missing). Epoch
    /// numbers count within one identity: a flushed or new Redis numbers
    /// them from 1 again, under a new identity.
    ///
    /// # Errors
    /// Redis failed.
    pub async fn redis_era(&self) -> redis::RedisResult<String> {
        let mut conn = self.bulk_conn().await?;
        redis::Script::new(ERA)
            .key(crate::wire::redis_identity_key(&self.prefix))
            .arg(format!("{:016x}", fastrand::u64(..)))
            .invoke_async(&mut conn)
            .await
    }

    /// The newest epoch built or adopted here (0: none).
    #[must_use]
    pub fn epoch(&self) -> u64 {
        *self.epoch.borrow()
    }

    /// Waits until an epoch newer than `seen` is built or adopted here.
    pub async fn wait_epoch_after(&self, seen: u64) -> u64 {
        let mut rx = self.epoch.subscribe();
        let newer = rx.wait_for(|&e| e > seen).await.map_or(seen, |e| *e);
        newer
    }

    /// Publishes `gate`'s filter, just rebuilt from a scan that started
    /// after the outbox position `outbox.0`, as a new epoch for the other instances. On any
    /// failure they are asked to rebuild from SQL instead.
    ///
    /// # Errors
    /// Why the filter was not shared (already logged).
    pub async fn publish_built(&self, gate: &Gate, outbox: (i64, i64)) -> Result<u64, EpochError> {
        let result = self.publish_epoch(gate, outbox, true).await;
        match &result {
            Ok(epoch) => {
                self.counters.rebuilds_led.fetch_add(1, Ordering::Relaxed);
                self.counters.published.fetch_add(1, Ordering::Relaxed);
                self.epoch.send_replace(*epoch);
                tracing::info!(epoch, "shared rebuild published for the other instances");
            }
            Err(why) => {
                tracing::warn!(%why, "the rebuilt filter was not shared; the other instances rebuild from SQL");
                self.publish_rebuild().await;
            }
        }
        result
    }

    /// After a start-up build from a scan that began after the outbox
    /// position `outbox.0`: stores the filter as a new epoch, so the next
    /// instances to start adopt it instead of scanning SQL, as `replace`
    /// says. Not announced: running instances keep their filters.
    pub async fn publish_first(&self, gate: &Gate, outbox: (i64, i64), replace: Replace) {
        let counter = crate::wire::epoch_counter_key(&self.prefix);
        let store = match replace {
            Replace::Always => true,
            // An epoch whose meta expired is none: nothing adopts it.
            Replace::IfNone => match self.latest_epoch(&counter).await {
                Ok(None) => true,
                Ok(Some((_, fields))) => fields.is_empty(),
                Err(_) => false,
            },
            // Only while the newest is still an earlier release's: one
            // stored since (a leader of this release) is kept.
            Replace::IfEarlier => match self.latest_epoch(&counter).await {
                Ok(None) => true,
                Ok(Some((_, fields))) => matches!(
                    FilterMeta::from_fields(&fields),
                    Err(AdoptError::EarlierRelease(_))
                ),
                Err(_) => false,
            },
        };
        if !store {
            return;
        }
        match self.publish_epoch(gate, outbox, false).await {
            Ok(epoch) => {
                self.epoch.send_replace(epoch);
                tracing::info!(
                    epoch,
                    "start-up filter stored for the next instances to adopt"
                );
            }
            Err(why) => tracing::warn!(%why, "the start-up filter was not stored in Redis"),
        }
    }

    /// At start, for the table it leads (through
    /// [`crate::resource::Resource::adopt_latest`]): adopts the newest
    /// epoch instead of scanning SQL (see [`crate::gate::adopt`]). Returns
    /// the outbox position the epoch is complete up to and the rebuild
    /// requests it covers.
    ///
    /// # Errors
    /// Why not (the caller scans SQL; after [`AdoptError::EarlierRelease`]
    /// it stores its own filter in place of the epoch).
    pub(crate) async fn adopt_latest(&self, gate: &Gate) -> Result<(i64, i64), AdoptError> {
        let counter = crate::wire::epoch_counter_key(&self.prefix);
        let (epoch, fields) = self
            .latest_epoch(&counter)
            .await
            .map_err(redis_read)?
            .ok_or(AdoptError::Gone)?;
        let (meta, replayed) = self.adopt_epoch(gate, epoch, &fields).await?;
        self.epoch.send_replace(epoch);
        tracing::info!(
            epoch,
            replayed,
            "filter adopted from Redis at start; no SQL scan"
        );
        Ok((meta.outbox, meta.covered))
    }

    /// `outbox`: the outbox watermark before the filter's scan (replays
    /// start after it) and the largest seq visible then (the rebuild
    /// requests it covers).
    async fn publish_epoch(
        &self,
        gate: &Gate,
        outbox: (i64, i64),
        announce: bool,
    ) -> Result<u64, EpochError> {
        let (outbox_at, covered) = outbox;
        let filter = gate.published().ok_or(EpochError::NoFilter)?;
        let encoded = crate::filter::encode_one(filter, bloomgate_filter::KeyKind::Integer).await?;
        let bytes = &encoded.bytes;
        let counter = crate::wire::epoch_counter_key(&self.prefix);
        let meta = FilterMeta {
            outbox: outbox_at,
            covered,
            capacity: gate.capacity(),
            fpp: gate.fpp(),
            layout: gate.layout(),
            key_type: crate::key::KeyType::Int,
            identity: self.sku_identity().ok_or(EpochError::NoIdentity)?,
        };
        let epoch = self.store_epoch(&counter, bytes, &meta).await?;
        self.counters.epochs_stored.fetch_add(1, Ordering::Relaxed);
        if !announce {
            return Ok(epoch);
        }
        self.append(&[
            ("kind", crate::wire::kind::BUILT.into()),
            ("epoch", epoch.to_string()),
            ("outbox", outbox_at.to_string()),
            ("covered", covered.to_string()),
            ("capacity", gate.capacity().to_string()),
        ])
        .await?;
        Ok(epoch)
    }

    /// Stores a filter's `bytes` as the next epoch under `counter` (the
    /// SKUs' `{prefix}bloom:epoch`, a resource's
    /// `{prefix}rf:{name}:bloom:epoch`): its segments first, one string each
    /// (a cluster spreads them over its nodes), then the meta that names
    /// them with `meta`'s fields, so an epoch whose meta exists has every
    /// segment written. The epoch before it is deleted. Returns its number.
    ///
    /// # Errors
    /// Redis failed.
    pub async fn store_epoch(
        &self,
        counter: &str,
        bytes: &[u8],
        meta: &FilterMeta,
    ) -> redis::RedisResult<u64> {
        let mut conn = self.bulk_conn().await?;
        let epoch: u64 = redis::cmd("INCR")
            .arg(counter)
            .query_async(&mut conn)
            .await?;
        let chunks: Vec<&[u8]> = bytes.chunks(self.segment_len()).collect();
        for (i, chunk) in chunks.iter().enumerate() {
            let _: () = redis::cmd("SET")
                .arg(crate::wire::epoch_segment_key(counter, epoch, i))
                .arg(*chunk)
                .arg("EX")
                .arg(EPOCH_TTL_SECS)
                .query_async(&mut conn)
                .await?;
        }
        let fields = meta.fields();
        let meta = crate::wire::epoch_meta_key(counter, epoch);
        let mut hset = redis::cmd("HSET");
        hset.arg(&meta)
            .arg("segments")
            .arg(chunks.len())
            .arg("bytes")
            .arg(bytes.len());
        for (k, v) in fields {
            hset.arg(k).arg(v);
        }
        let _: () = redis::pipe()
            .add_command(hset)
            .ignore()
            .cmd("EXPIRE")
            .arg(&meta)
            .arg(EPOCH_TTL_SECS)
            .ignore()
            .query_async(&mut conn)
            .await?;
        if epoch > 1 {
            self.delete_epoch(&conn, counter, epoch - 1).await;
        }
        Ok(epoch)
    }

    /// The newest epoch under `counter` and its meta, if there is one.
    ///
    /// # Errors
    /// Redis failed.
    pub async fn latest_epoch(
        &self,
        counter: &str,
    ) -> redis::RedisResult<Option<(u64, std::collections::HashMap<String, String>)>> {
        let mut conn = self.bulk_conn().await?;
        let epoch: Option<u64> = redis::cmd("GET")
            .arg(counter)
            .query_async(&mut conn)
            .await?;
        let Some(epoch) = epoch else { return Ok(None) };
        Ok(Some((epoch, self.epoch_meta(counter, epoch).await?)))
    }

    /// An epoch's meta (empty when it is gone).
    ///
    /// # Errors
    /// Redis failed.
    pub async fn epoch_meta(
        &self,
        counter: &str,
        epoch: u64,
    ) -> redis::RedisResult<std::collections::HashMap<String, String>> {
        let mut conn = self.bulk_conn().await?;
        redis::cmd("HGETALL")
            .arg(crate::wire::epoch_meta_key(counter, epoch))
            .query_async(&mut conn)
            .await
    }

    /// Adopts another instance's announced epoch (its meta read from
    /// Redis: the announcement's copy of the position is not needed).
    /// Falls back to a rebuild from SQL.
    pub(super) async fn adopt(&self, gate: &Arc<Gate>, epoch: u64) {
        let counter = crate::wire::epoch_counter_key(&self.prefix);
        let adopted = match self.epoch_meta(&counter, epoch).await {
            Ok(fields) => self.adopt_epoch(gate, epoch, &fields).await,
            Err(e) => Err(redis_read(e)),
        };
        match adopted {
            Ok((meta, replayed)) => {
                self.outbox.cover(crate::sql::SKU_RESOURCE, meta.covered);
                self.counters
                    .rebuilds_adopted
                    .fetch_add(1, Ordering::Relaxed);
                self.epoch.send_replace(epoch);
                tracing::info!(
                    epoch,
                    replayed,
                    "adopted another instance's rebuild; no SQL scan"
                );
            }
            Err(why) if why.is_superseded() => {}
            Err(AdoptError::Busy) => {
                // The rebuild running here may have begun its scan before
                // the leader's: one more, begun after the announcement.
                drop(gate.request_rebuild());
            }
            Err(why) => {
                self.counters.adopt_failures.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(epoch, %why, "cannot adopt another instance's rebuild; rebuilding from SQL");
                drop(gate.request_rebuild());
            }
        }
    }

    /// Adopts the SKU table's epoch `epoch`, whose meta is `fields` (see
    /// [`crate::gate::adopt`]). Returns its meta and the ids replayed.
    async fn adopt_epoch(
        &self,
        gate: &Gate,
        epoch: u64,
        fields: &std::collections::HashMap<String, String>,
    ) -> Result<(FilterMeta, usize), AdoptError> {
        let meta = FilterMeta::from_fields(fields)?;
        let identity = self.sku_identity();
        let want = Want {
            layout: gate.layout(),
            fpp: gate.fpp(),
            key_type: crate::key::KeyType::Int,
            fold: crate::key::Fold::Exact,
            identity: identity.as_deref(),
        };
        let bytes = async { Ok(self.read_epoch(epoch).await?) };
        let replayed = gate
            .adopt(
                &meta,
                &want,
                &self.outbox,
                crate::sql::SKU_RESOURCE,
                How::Adopt,
                bytes,
            )
            .await?;
        Ok((meta, replayed))
    }

    /// What the SKU table's filter holds (see [`crate::wire::filter_identity`]).
    fn sku_identity(&self) -> Option<String> {
        let db = self.outbox.store.identity()?;
        Some(crate::wire::filter_identity(
            db,
            "skus.id",
            crate::key::KeyType::Int,
        ))
    }

    /// Bytes per epoch segment (whole `usize`s; Redis's limit at most).
    /// An epoch's segments: at most `cache.bloom_segment_bytes`, and at
    /// most [`EPOCH_SEGMENT_MAX`], so a `SET` copies little beside the
    /// encoded filter (readers take any number of segments).
    fn segment_len(&self) -> usize {
        usize::try_from(
            self.segment_bytes
                .min(bloomgate_redis::MAX_SEGMENT_BYTES)
                .min(EPOCH_SEGMENT_MAX),
        )
        .unwrap_or(usize::MAX)
    }

    /// Deletes an older epoch's meta, then its segments (best effort:
    /// they expire anyway).
    async fn delete_epoch(&self, conn: &Conn, counter: &str, epoch: u64) {
        let meta = crate::wire::epoch_meta_key(counter, epoch);
        let segments: redis::RedisResult<Option<usize>> = redis::cmd("HGET")
            .arg(&meta)
            .arg("segments")
            .query_async(&mut conn.clone())
            .await;
        let mut dels = vec![{
            let mut cmd = redis::cmd("DEL");
            cmd.arg(&meta);
            cmd
        }];
        for i in 0..segments.ok().flatten().unwrap_or(0) {
            let mut cmd = redis::cmd("DEL");
            cmd.arg(crate::wire::epoch_segment_key(counter, epoch, i));
            dels.push(cmd);
        }
        let _: redis::RedisResult<Vec<i64>> = query_each(conn, dels).await;
    }

    /// An epoch's filter bytes, from its segments.
    async fn read_epoch(&self, epoch: u64) -> Result<Vec<u8>, ReadError> {
        self.read_epoch_in(&crate::wire::epoch_counter_key(&self.prefix), epoch)
            .await
    }

    /// The bytes of epoch `epoch` under `counter`, from its segments.
    ///
    /// # Errors
    /// Redis failed, or the epoch is gone or incomplete.
    pub async fn read_epoch_in(&self, counter: &str, epoch: u64) -> Result<Vec<u8>, ReadError> {
        let counter = counter.to_string();
        let redis = |e: redis::RedisError| ReadError::Redis(Box::new(e));
        let mut conn = self.bulk_conn().await.map_err(redis)?;
        let (segments, len): (Option<usize>, Option<usize>) = redis::cmd("HMGET")
            .arg(crate::wire::epoch_meta_key(&counter, epoch))
            .arg("segments")
            .arg("bytes")
            .query_async(&mut conn)
            .await
            .map_err(redis)?;
        let (Some(segments), Some(len)) = (segments, len) else {
            return Err(ReadError::EpochGone);
        };
        let mut bytes = Vec::with_capacity(len);
        for i in 0..segments {
            let part: Option<Vec<u8>> = redis::cmd("GET")
                .arg(crate::wire::epoch_segment_key(&counter, epoch, i))
                .query_async(&mut conn)
                .await
                .map_err(redis)?;
            bytes.extend(part.ok_or(ReadError::EpochGone)?);
        }
        if bytes.len() != len {
            return Err(ReadError::EpochShort {
                epoch,
                got: bytes.len(),
                len,
            });
        }
        Ok(bytes)
    }
}
