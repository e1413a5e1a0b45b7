//! A Bloom filter shared by every instance of a service, stored in Redis.
//!
//! An in-process filter per instance drifts: an SKU created through one
//! instance is in that instance's filter only until the others rebuild. A
//! [`RedisBloom`] keeps one bit string in Redis instead, with the same shape
//! and bit positions as a [`BlockedBloom`] (so a local filter can be merged
//! in and downloaded bit for bit). A lookup is one `GETRANGE` of the key's
//! 32-byte block, tested in the client; an insert is one `BITFIELD` setting
//! its `k` bits, in a script that refuses a segment that is not whole (a
//! lost segment is never recreated as zeros, which would read as "no");
//! batches of keys share one pipelined round trip.
//!
//! A string holds at most 512 MB in Redis, so a large filter is split into
//! segments of a configurable size (whole blocks each) under keys of their
//! own, `{key}:seg:{i}`, which a Redis Cluster spreads over its nodes by
//! their hash slots; a check or insert still touches one segment, and
//! batches send one pipeline per segment, concurrently. [`Conn`] is either
//! a single server's connection or a cluster's.
//!
//! The cost is a network round trip per lookup (tens of microseconds on a
//! LAN instead of nanoseconds), so the seckill service keeps its in-process
//! gate on the request path; this backend suits multi-instance deployments
//! that need every instance to see new ids at once.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod conn;
mod error;
#[cfg(feature = "tls")]
pub mod tls;
mod transfer;

pub use conn::Conn;
pub use error::{Error, Result};

/// The crate README, compiled and run as a doctest.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;

use bloomgate_filter::sizing::BlockedParams;
use bloomgate_filter::{BlockedBloom, BloomKey};
use redis::{AsyncCommands, Cmd};

/// The largest string Redis stores, so the largest segment.
pub const MAX_SEGMENT_BYTES: u64 = 512 << 20;

/// The segment size [`RedisBloom::create_or_open`] uses: filters up to
/// 128 MiB (about 10^8 keys at 1%) stay one string.
pub const DEFAULT_SEGMENT_BYTES: u64 = 128 << 20;

/// Bytes fetched per `GETRANGE` when downloading, so one reply never
/// holds Redis up for long.
const DOWNLOAD_CHUNK: u64 = 4 << 20;

/// A blocked Bloom filter stored in Redis under `key` (one string) or
/// `{key}:seg:{i}` (segments), with its shape in the hash `{key}:meta`.
///
/// ```
/// use bloomgate_redis::RedisBloom;
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let url = std::env::var("BLOOMGATE_TEST_REDIS_URL")
/// #     .unwrap_or_else(|_| "redis://127.0.0.1:6379/".into());
/// let client = redis::Client::open(url)?;
/// let conn = match redis::aio::ConnectionManager::new(client).await {
///     Ok(c) => c,
/// #   // Without a Redis to talk to, the example has nothing to show
/// #   // (under CI=true it fails instead).
/// #   Err(_) if std::env::var("CI").as_deref() != Ok("true") => return Ok(()),
///     Err(e) => return Err(e.into()),
/// };
/// let key = "bgdoc:skus";
/// # let _: () = redis::cmd("DEL").arg(key).arg(format!("{key}:meta")).query_async(&mut conn.clone()).await?;
/// // Instance A creates the filter and adds ids; instance B opens it and sees them.
/// let a = RedisBloom::create(conn.clone(), key, 10_000, 0.01, 7).await?;
/// a.insert_many(&[1u64, 2, 3]).await?;
/// let b = RedisBloom::open(conn, key).await?;
/// assert_eq!(b.contains_many(&[1u64, 2, 3]).await?, [true, true, true]);
/// a.destroy().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct RedisBloom {
    conn: Conn,
    key: String,
    params: BlockedParams,
    seed: u64,
    /// Bytes per segment; the last may be shorter.
    segment_bytes: u64,
}

impl std::fmt::Debug for RedisBloom {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisBloom")
            .field("key", &self.key)
            .field("params", &self.params)
            .field("seed", &self.seed)
            .field("segment_bytes", &self.segment_bytes)
            .finish_non_exhaustive()
    }
}

/// Writes the metadata unless it exists, in one atomic step: a concurrent
/// `open` sees every parameter or none. One key only, so it runs on a
/// cluster too; the segments are allocated afterwards.
const CREATE: &str = r"
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('HSET', KEYS[1], 'layout', 'blocked-v1', 'blocks', ARGV[1],
  'block_bits', ARGV[2], 'hashes', ARGV[3], 'seed', ARGV[4],
  'segment_bytes', ARGV[5])
return 1
";

/// Sets a key's bits in its segment only when the segment is there whole:
/// a plain `BITFIELD SET` on a lost segment (a flushed or restarted Redis)
/// would create a string of zeros up to the block, and every other key of
/// that segment would then read as a definite "no".
const SET_IN_WHOLE: &str = r"
if redis.call('STRLEN', KEYS[1]) < tonumber(ARGV[1]) then
  return redis.error_reply('BLOOMGATE segment missing or short')
end
return redis.call('BITFIELD', KEYS[1], unpack(ARGV, 2))
";

/// Where a key's block lives: segment, and the bit offsets and byte range
/// inside that segment's string.
struct Spot {
    segment: u64,
    offsets: Vec<u64>,
    start: u64,
}

impl RedisBloom {
    /// Creates the filter under `key` (or opens it if one of the same shape
    /// exists), sized for `n` items at rate `p` with 256-bit blocks, in
    /// segments of [`DEFAULT_SEGMENT_BYTES`].
    ///
    /// # Errors
    /// [`Error::ShapeMismatch`] if another shape exists; Redis errors.
    pub async fn create(
        conn: impl Into<Conn>,
        key: &str,
        n: u64,
        p: f64,
        seed: u64,
    ) -> Result<Self> {
        Ok(Self::create_or_open(conn, key, n, p, seed).await?.0)
    }

    /// As [`RedisBloom::create`]; also says whether the caller should fill
    /// it: true when this call created it, or found a segment missing (a
    /// cluster node restarted empty) and allocated it again; false when
    /// it found a whole filter of the same shape.
    ///
    /// # Errors
    /// As [`RedisBloom::create`].
    pub async fn create_or_open(
        conn: impl Into<Conn>,
        key: &str,
        n: u64,
        p: f64,
        seed: u64,
    ) -> Result<(Self, bool)> {
        Self::create_or_open_segmented(conn, key, n, p, seed, DEFAULT_SEGMENT_BYTES).await
    }

    /// As [`RedisBloom::create_or_open`], with segments of
    /// `segment_bytes` (a multiple of 64, at most [`MAX_SEGMENT_BYTES`]).
    /// Every client of one filter must use the same segment size.
    ///
    /// # Errors
    /// [`Error::Invalid`] for a bad segment size or a key with braces;
    /// otherwise as [`RedisBloom::create`].
    pub async fn create_or_open_segmented(
        conn: impl Into<Conn>,
        key: &str,
        n: u64,
        p: f64,
        seed: u64,
        segment_bytes: u64,
    ) -> Result<(Self, bool)> {
        Self::create_or_open_with(conn.into(), key, n, p, seed, segment_bytes, true).await
    }

    /// As [`RedisBloom::create_or_open_segmented`], but a segment is never
    /// allocated (as zeros): when this returns true, the caller uploads
    /// the whole filter ([`RedisBloom::upload`]), and until each segment
    /// arrives whole, every client reading it gets [`Error::Meta`] (a
    /// "maybe" for a caller guarding a database), never the zeros of a
    /// filter still being filled. Inserts into a missing segment fail the
    /// same way.
    ///
    /// # Errors
    /// As [`RedisBloom::create_or_open_segmented`].
    pub async fn create_or_open_unfilled(
        conn: impl Into<Conn>,
        key: &str,
        n: u64,
        p: f64,
        seed: u64,
        segment_bytes: u64,
    ) -> Result<(Self, bool)> {
        Self::create_or_open_with(conn.into(), key, n, p, seed, segment_bytes, false).await
    }

    async fn create_or_open_with(
        conn: Conn,
        key: &str,
        n: u64,
        p: f64,
        seed: u64,
        segment_bytes: u64,
        allocate: bool,
    ) -> Result<(Self, bool)> {
        let invalid = |reason: String| Error::Invalid {
            key: key.into(),
            reason,
        };
        check_key(key)?;
        if segment_bytes == 0
            || !segment_bytes.is_multiple_of(64)
            || segment_bytes > MAX_SEGMENT_BYTES
        {
            return Err(invalid(format!(
                "segment size {segment_bytes} must be a multiple of 64 bytes up to {MAX_SEGMENT_BYTES}"
            )));
        }
        let params = bloomgate_filter::sizing::blocked(n, p, 256)?;
        let total = params.bits() / 8;
        let mine = Self {
            conn: conn.clone(),
            key: key.into(),
            params,
            seed,
            segment_bytes: segment_bytes.min(total),
        };
        let created: i64 = redis::Script::new(CREATE)
            .key(format!("{key}:meta"))
            .arg(params.blocks)
            .arg(params.block_bits)
            .arg(params.hashes)
            .arg(seed)
            .arg(mine.segment_bytes)
            .invoke_async(&mut conn.clone())
            .await?;
        if created == 1 {
            if allocate {
                mine.allocate(None).await?;
            }
            return Ok((mine, true));
        }
        let existing = Self::open(conn, key).await?;
        if existing.params != params
            || existing.seed != seed
            || existing.segment_bytes != mine.segment_bytes
        {
            return Err(Error::ShapeMismatch { key: key.into() });
        }
        let missing = existing.missing_segments().await?;
        if missing.is_empty() {
            return Ok((existing, false));
        }
        if allocate {
            existing.allocate(Some(&missing)).await?;
        }
        Ok((existing, true))
    }

    /// Opens an existing filter.
    ///
    /// # Errors
    /// [`Error::Meta`] when `{key}:meta` is missing or malformed; Redis errors.
    pub async fn open(conn: impl Into<Conn>, key: &str) -> Result<Self> {
        let mut c = conn.into();
        check_key(key)?;
        let meta: std::collections::HashMap<String, String> =
            c.hgetall(format!("{key}:meta")).await?;
        let bad = |reason: &str| Error::Meta {
            key: key.into(),
            reason: reason.into(),
        };
        if meta.get("layout").map(String::as_str) != Some("blocked-v1") {
            return Err(bad("no bloomgate filter metadata"));
        }
        let field = |name: &str| -> Result<u64> {
            meta.get(name)
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| bad(&format!("field {name} missing or not a number")))
        };
        let params = BlockedParams {
            blocks: field("blocks")?,
            block_bits: u32::try_from(field("block_bits")?).map_err(|_| bad("block_bits"))?,
            hashes: u32::try_from(field("hashes")?).map_err(|_| bad("hashes"))?,
        };
        // Reject shapes a local filter could not have.
        BlockedBloom::new(
            BlockedParams {
                blocks: 1,
                ..params
            },
            0,
        )
        .map_err(|_| bad("invalid shape"))?;
        let total = params.bits() / 8;
        // Filters written before segments existed are one string.
        let segment_bytes = if meta.contains_key("segment_bytes") {
            field("segment_bytes")?
        } else {
            total
        };
        let block_bytes = u64::from(params.block_bits) / 8;
        if segment_bytes == 0
            || !segment_bytes.is_multiple_of(block_bytes)
            || segment_bytes > MAX_SEGMENT_BYTES.max(total)
        {
            return Err(bad("segment_bytes not a whole number of blocks"));
        }
        Ok(Self {
            conn: c,
            key: key.into(),
            params,
            seed: field("seed")?,
            segment_bytes: segment_bytes.min(total),
        })
    }

    /// The filter's shape.
    #[must_use]
    pub const fn params(&self) -> BlockedParams {
        self.params
    }

    /// The hash seed every client of this filter uses.
    #[must_use]
    pub const fn seed(&self) -> u64 {
        self.seed
    }

    /// How many strings hold the bits.
    #[must_use]
    pub fn segments(&self) -> u64 {
        (self.params.bits() / 8).div_ceil(self.segment_bytes)
    }

    /// The Redis key of segment `i`: the filter's key itself when there is
    /// one segment.
    #[must_use]
    pub fn segment_key(&self, i: u64) -> String {
        if self.segments() == 1 {
            self.key.clone()
        } else {
            format!("{}:seg:{i}", self.key)
        }
    }

    /// Bytes in segment `i` (the last may be shorter).
    fn segment_len(&self, i: u64) -> u64 {
        let total = self.params.bits() / 8;
        self.segment_bytes.min(total - i * self.segment_bytes)
    }

    /// Allocates segments whole (all, or the listed ones) without
    /// changing a bit: `BITFIELD … INCRBY u1 <last> 0` grows the string
    /// and adds nothing, so racing another allocator or an insert is safe.
    async fn allocate(&self, only: Option<&[u64]>) -> Result<()> {
        let all: Vec<u64> = (0..self.segments()).collect();
        for &i in only.unwrap_or(&all) {
            let _: Vec<u8> = redis::cmd("BITFIELD")
                .arg(self.segment_key(i))
                .arg("INCRBY")
                .arg("u1")
                .arg(self.segment_len(i) * 8 - 1)
                .arg(0)
                .query_async(&mut self.conn.clone())
                .await?;
        }
        Ok(())
    }

    /// Segments whose string is gone.
    async fn missing_segments(&self) -> Result<Vec<u64>> {
        let mut missing = Vec::new();
        for i in 0..self.segments() {
            let len: u64 = self.conn.clone().strlen(self.segment_key(i)).await?;
            if len != self.segment_len(i) {
                missing.push(i);
            }
        }
        Ok(missing)
    }

    /// The global bit offsets of a key, filter position p being Redis
    /// offset p of the concatenated segments. Redis numbers the bits of
    /// each byte from the most significant, the filter crate from the
    /// least; `upload` and `download` reverse each byte.
    fn offsets<K: BloomKey + ?Sized>(&self, key: &K) -> impl Iterator<Item = u64> {
        BlockedBloom::positions_for(self.params, key.hash_pair(self.seed))
    }

    /// The Redis bit offsets of a key (`GETBIT`/`SETBIT` offsets, in the
    /// concatenation of the segments): for baselines and tools that
    /// address the bits themselves.
    pub fn offsets_of<K: BloomKey + ?Sized>(&self, key: &K) -> Vec<u64> {
        self.offsets(key).collect()
    }

    /// The segment of a key's block, its offsets in that segment, and the
    /// block's first byte there: every one of its bits lies in the block.
    fn spot<K: BloomKey + ?Sized>(&self, key: &K) -> Spot {
        let block_bytes = u64::from(self.params.block_bits) / 8;
        let mut offsets = self.offsets_of(key);
        let first_byte = offsets.first().map_or(0, |&o| o / 8) / block_bytes * block_bytes;
        let segment = first_byte / self.segment_bytes;
        let base = segment * self.segment_bytes;
        for o in &mut offsets {
            *o -= base * 8;
        }
        Spot {
            segment,
            offsets,
            start: first_byte - base,
        }
    }

    /// The segment holding a key's block.
    pub fn segment_of<K: BloomKey + ?Sized>(&self, key: &K) -> u64 {
        self.spot(key).segment
    }

    fn block_bytes(&self) -> u64 {
        u64::from(self.params.block_bits) / 8
    }

    /// True when every offset is set in `bytes`, the block read from byte
    /// `start`.
    fn covered(spot: &Spot, bytes: &[u8]) -> bool {
        spot.offsets.iter().all(|&o| {
            let i = (o / 8 - spot.start) as usize;
            bytes.get(i).is_some_and(|b| b & (0x80 >> (o % 8)) != 0)
        })
    }

    fn set_cmd(&self, spot: &Spot) -> Cmd {
        // `EVAL` with the script's text: a pipeline of `EVALSHA`s could
        // not be retried whole after a `NOSCRIPT` (a restarted Redis), and
        // inserts are rare beside lookups.
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(SET_IN_WHOLE)
            .arg(1)
            .arg(self.segment_key(spot.segment))
            .arg(self.segment_len(spot.segment));
        for off in &spot.offsets {
            cmd.arg("SET").arg("u1").arg(off).arg(1);
        }
        cmd
    }

    fn get_cmd(&self, spot: &Spot) -> Cmd {
        let mut cmd = redis::cmd("GETRANGE");
        cmd.arg(self.segment_key(spot.segment))
            .arg(spot.start)
            .arg(spot.start + self.block_bytes() - 1);
        cmd
    }

    /// Adds a key in one command (`BITFIELD … SET u1` for its `k` bits,
    /// in a script that first checks its segment is whole); true when a
    /// bit was newly set.
    ///
    /// # Errors
    /// Redis errors, among them a refusal when the key's segment is
    /// missing or short (lost with a Redis flush or restart): the filter
    /// must be filled again ([`RedisBloom::upload`]) before it takes keys.
    pub async fn insert<K: BloomKey + ?Sized>(&self, key: &K) -> Result<bool> {
        let old: Vec<u8> = self
            .set_cmd(&self.spot(key))
            .query_async(&mut self.conn.clone())
            .await?;
        Ok(old.contains(&0))
    }

    /// Groups keys by segment: one pipeline per segment (a cluster routes
    /// a pipeline whole to one node), each key's index kept.
    fn by_segment<K: BloomKey>(&self, keys: &[K]) -> Vec<(u64, Vec<(usize, Spot)>)> {
        let mut groups: std::collections::BTreeMap<u64, Vec<(usize, Spot)>> =
            std::collections::BTreeMap::new();
        for (i, key) in keys.iter().enumerate() {
            let spot = self.spot(key);
            groups.entry(spot.segment).or_default().push((i, spot));
        }
        groups.into_iter().collect()
    }

    /// Adds many keys: one `BITFIELD` each, pipelined per segment, the
    /// segments' pipelines sent concurrently.
    ///
    /// # Errors
    /// Redis errors.
    pub async fn insert_many<K: BloomKey>(&self, keys: &[K]) -> Result<()> {
        let groups = self.by_segment(keys);
        let sends = groups.iter().map(|(_, spots)| {
            let mut pipe = redis::pipe();
            for (_, spot) in spots {
                pipe.add_command(self.set_cmd(spot)).ignore();
            }
            let mut c = self.conn.clone();
            async move { pipe.query_async::<()>(&mut c).await }
        });
        futures_util::future::try_join_all(sends).await?;
        Ok(())
    }

    /// Membership test in one command: `GETRANGE` of the key's 32-byte
    /// block in its segment, tested here (the same block an in-process
    /// filter of this shape reads).
    ///
    /// # Errors
    /// Redis errors; [`Error::Meta`] when the segment is gone. A caller
    /// guarding a database should treat an error as "maybe" (fail open),
    /// never as "no".
    pub async fn contains<K: BloomKey + ?Sized>(&self, key: &K) -> Result<bool> {
        let spot = self.spot(key);
        let bytes: Vec<u8> = self
            .get_cmd(&spot)
            .query_async(&mut self.conn.clone())
            .await?;
        self.whole(&spot, &bytes)?;
        Ok(Self::covered(&spot, &bytes))
    }

    /// Segments are allocated whole at creation, so a short read means the
    /// segment is gone (deleted, or lost with a Redis restart): an error,
    /// never a "no".
    fn whole(&self, spot: &Spot, bytes: &[u8]) -> Result<()> {
        let want = self.block_bytes();
        if bytes.len() as u64 == want {
            return Ok(());
        }
        Err(Error::Meta {
            key: self.segment_key(spot.segment),
            reason: format!(
                "bit string missing or short ({} of {want} bytes at {})",
                bytes.len(),
                spot.start
            ),
        })
    }

    /// Membership tests for many keys: one `GETRANGE` each, pipelined per
    /// segment, the segments' pipelines sent concurrently; answers in the
    /// order of `keys`.
    ///
    /// # Errors
    /// Redis errors; [`Error::Meta`] as [`RedisBloom::contains`].
    pub async fn contains_many<K: BloomKey>(&self, keys: &[K]) -> Result<Vec<bool>> {
        let groups = self.by_segment(keys);
        let sends = groups.iter().map(|(_, spots)| {
            let mut pipe = redis::pipe();
            for (_, spot) in spots {
                pipe.add_command(self.get_cmd(spot));
            }
            let mut c = self.conn.clone();
            async move { pipe.query_async::<Vec<Vec<u8>>>(&mut c).await }
        });
        let replies = futures_util::future::try_join_all(sends).await?;
        let mut answers = vec![false; keys.len()];
        for ((_, spots), blocks) in groups.iter().zip(&replies) {
            for ((i, spot), bytes) in spots.iter().zip(blocks) {
                self.whole(spot, bytes)?;
                answers[*i] = Self::covered(spot, bytes);
            }
        }
        Ok(answers)
    }
}

/// Segment names must hash by their whole name (a cluster spreads them),
/// so the key may not hold a hash tag.
fn check_key(key: &str) -> Result<()> {
    if key.contains(['{', '}']) || key.is_empty() {
        return Err(Error::Invalid {
            key: key.into(),
            reason: "the key must be non-empty and hold no braces (segment names carry their own hash tags)".into(),
        });
    }
    Ok(())
}
