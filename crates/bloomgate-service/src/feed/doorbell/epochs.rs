//! Shared rebuilds in Redis, for every resource: the lock one instance
//! takes to lead, the epochs it stores (the library's snapshot format in
//! segments of at most `cache.bloom_segment_bytes`, named by a `:meta`
//! hash written last), and Redis's identity they are numbered under.
//! Adopting one is [`crate::shield::adopt`]'s, through
//! [`crate::resource::Resource`].

use std::sync::atomic::Ordering;
use std::time::Duration;

use bloomgate_redis::Conn;

use crate::feed::doorbell::{Doorbell, RECORDED};
use crate::redis_link::query_each;
use crate::shield::{FilterMeta, ReadError};
use crate::wire::kind;

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
pub const REBUILD_LOCK_MS: u64 = 10 * 60 * 1000;

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

    /// Tries to take the shared-rebuild lock `lock`: `Some(true)` when
    /// this instance now holds it, `Some(false)` when another instance
    /// does, `None` when Redis did not answer.
    pub async fn try_lock(&self, lock: &str) -> Option<bool> {
        let mut conn = self.conn.clone();
        let set: redis::RedisResult<Option<String>> = redis::cmd("SET")
            .arg(lock)
            .arg(&self.instance)
            .arg("NX")
            .arg("PX")
            .arg(REBUILD_LOCK_MS)
            .query_async(&mut conn)
            .await;
        set.ok().map(|s| s.is_some())
    }

    /// Whether some instance holds the lock `lock` (Redis not answering:
    /// no, as nothing can then be shared through it).
    pub async fn lock_held(&self, lock: &str) -> bool {
        let mut conn = self.conn.clone();
        let held: redis::RedisResult<bool> =
            redis::cmd("EXISTS").arg(lock).query_async(&mut conn).await;
        held.unwrap_or(false)
    }

    /// Releases the lock `lock` if this instance holds it (best effort:
    /// it expires anyway).
    pub async fn unlock(&self, lock: &str) {
        let mut conn = self.conn.clone();
        let released: redis::RedisResult<i64> = redis::Script::new(RELEASE)
            .key(lock)
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

    /// Stores a filter's `bytes` as the next epoch under `counter` (the
    /// default resource's `{prefix}bloom:epoch`, another's
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

    /// Announces the default resource's epoch `epoch`, stored with
    /// `meta`, on the stream, as the previous release announced it
    /// (`{kind: b, epoch, outbox, covered, capacity}`): an instance of that
    /// release adopts it from there. Where it is `recorded` in the outbox
    /// too, the entry is marked so, and this release's followers act on
    /// the outbox entry alone; unmarked, they adopt it from here. Appended
    /// once (a retry could announce it twice), best effort, as every ring:
    /// whether it was.
    pub async fn announce_for_earlier_release(
        &self,
        epoch: u64,
        meta: &FilterMeta,
        recorded: bool,
    ) -> bool {
        let mut fields = vec![
            ("kind", kind::BUILT.into()),
            ("epoch", epoch.to_string()),
            ("outbox", meta.outbox.to_string()),
            ("covered", meta.covered.to_string()),
            ("capacity", meta.capacity.to_string()),
        ];
        if recorded {
            fields.push((RECORDED, "1".into()));
        }
        let sent = self.append(&fields).await.is_ok();
        if sent {
            self.counters.published.fetch_add(1, Ordering::Relaxed);
        } else {
            self.counters
                .publish_failures
                .fetch_add(1, Ordering::Relaxed);
        }
        sent
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
