//! A Bloom filter shared by every instance of a service, stored in Redis.
//!
//! An in-process filter per instance drifts: an SKU created through one
//! instance is in that instance's filter only until the others rebuild. A
//! [`RedisBloom`] keeps one bit string in Redis instead, with the same shape
//! and bit positions as a [`BlockedBloom`] (so a local filter can be merged
//! in and downloaded bit for bit). A lookup is one `GETRANGE` of the key's
//! 32-byte block, tested in the client; an insert is one `BITFIELD` setting
//! its `k` bits; batches of keys share one pipelined round trip.
//!
//! The cost is a network round trip per lookup (tens of microseconds on a
//! LAN instead of nanoseconds), so the seckill service keeps its in-process
//! gate on the request path; this backend suits multi-instance deployments
//! that need every instance to see new ids at once.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

use bloomgate_filter::sizing::BlockedParams;
use bloomgate_filter::{BlockedBloom, BloomKey, Filter};
use redis::aio::ConnectionManager;
use redis::AsyncCommands;

/// What can go wrong with a shared filter.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Redis failed or is unreachable.
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    /// Sizing or filter construction failed.
    #[error(transparent)]
    Filter(#[from] bloomgate_filter::Error),
    /// The metadata under `{key}:meta` is missing or not a bloomgate filter's.
    #[error("shared filter {key}: {reason}")]
    Meta {
        /// The filter's key.
        key: String,
        /// What is wrong.
        reason: String,
    },
    /// A filter of another shape already exists under the key.
    #[error("shared filter {key} exists with another shape")]
    ShapeMismatch {
        /// The filter's key.
        key: String,
    },
}

/// Shorthand for results in this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A blocked Bloom filter stored as a Redis string under `key`, with its
/// shape in the hash `{key}:meta`.
#[derive(Clone)]
pub struct RedisBloom {
    conn: ConnectionManager,
    key: String,
    params: BlockedParams,
    seed: u64,
}

impl std::fmt::Debug for RedisBloom {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisBloom")
            .field("key", &self.key)
            .field("params", &self.params)
            .field("seed", &self.seed)
            .finish_non_exhaustive()
    }
}

/// Writes the metadata and allocates the bit string (the last bit set to 0,
/// so later `SETBIT`s never reallocate), unless metadata exists.
const CREATE: &str = r"
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('HSET', KEYS[1], 'layout', 'blocked-v1', 'blocks', ARGV[1],
  'block_bits', ARGV[2], 'hashes', ARGV[3], 'seed', ARGV[4])
redis.call('SETBIT', KEYS[2], ARGV[5], 0)
return 1
";

impl RedisBloom {
    /// Creates the filter under `key` (or opens it if one of the same shape
    /// exists), sized for `n` items at rate `p` with 256-bit blocks.
    ///
    /// # Errors
    /// [`Error::ShapeMismatch`] if another shape exists; Redis errors.
    pub async fn create(
        conn: ConnectionManager,
        key: &str,
        n: u64,
        p: f64,
        seed: u64,
    ) -> Result<Self> {
        Ok(Self::create_or_open(conn, key, n, p, seed).await?.0)
    }

    /// As [`RedisBloom::create`]; also says whether this call created it
    /// (true) or found one of the same shape (false), so the creator can
    /// fill it.
    ///
    /// # Errors
    /// As [`RedisBloom::create`].
    pub async fn create_or_open(
        conn: ConnectionManager,
        key: &str,
        n: u64,
        p: f64,
        seed: u64,
    ) -> Result<(Self, bool)> {
        let params = bloomgate_filter::sizing::blocked(n, p, 256)?;
        let mut c = conn.clone();
        // Parameters and the allocated bit string appear in one atomic
        // step, so a concurrent `open` sees all of them or none.
        let created: i64 = redis::Script::new(CREATE)
            .key(format!("{key}:meta"))
            .key(key)
            .arg(params.blocks)
            .arg(params.block_bits)
            .arg(params.hashes)
            .arg(seed)
            .arg(params.bits() - 1)
            .invoke_async(&mut c)
            .await?;
        if created == 1 {
            return Ok((
                Self {
                    conn,
                    key: key.into(),
                    params,
                    seed,
                },
                true,
            ));
        }
        let existing = Self::open(conn, key).await?;
        if existing.params != params || existing.seed != seed {
            return Err(Error::ShapeMismatch { key: key.into() });
        }
        Ok((existing, false))
    }

    /// Opens an existing filter.
    ///
    /// # Errors
    /// [`Error::Meta`] when `{key}:meta` is missing or malformed; Redis errors.
    pub async fn open(conn: ConnectionManager, key: &str) -> Result<Self> {
        let mut c = conn.clone();
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
        Ok(Self {
            conn,
            key: key.into(),
            params,
            seed: field("seed")?,
        })
    }

    /// The filter's shape.
    #[must_use]
    pub const fn params(&self) -> BlockedParams {
        self.params
    }

    fn offsets<K: BloomKey + ?Sized>(&self, key: &K) -> impl Iterator<Item = u64> {
        // Redis numbers the bits of each byte from the most significant;
        // the filter crate from the least. `upload` and `download` reverse
        // each byte, so filter position p is Redis offset p.
        BlockedBloom::positions_for(self.params, key.hash_pair(self.seed))
    }

    /// The Redis bit offsets of a key (`GETBIT`/`SETBIT` offsets): for
    /// baselines and tools that address the bits themselves.
    pub fn offsets_of<K: BloomKey + ?Sized>(&self, key: &K) -> Vec<u64> {
        self.offsets(key).collect()
    }

    /// The byte range of a key's block: every one of its bits lies in it.
    fn block_range(&self, offsets: &[u64]) -> (u64, u64) {
        let block_bytes = u64::from(self.params.block_bits) / 8;
        let start = offsets
            .first()
            .map_or(0, |&o| o / 8 / block_bytes * block_bytes);
        (start, start + block_bytes - 1)
    }

    /// True when every offset is set in `bytes`, the block read from byte
    /// `start` (missing bytes, past the end of a shorter string, are 0).
    fn covered(offsets: &[u64], start: u64, bytes: &[u8]) -> bool {
        offsets.iter().all(|&o| {
            let i = (o / 8 - start) as usize;
            bytes.get(i).is_some_and(|b| b & (0x80 >> (o % 8)) != 0)
        })
    }

    /// Adds a key in one command (`BITFIELD … SET u1` for its `k` bits);
    /// true when a bit was newly set.
    ///
    /// # Errors
    /// Redis errors.
    pub async fn insert<K: BloomKey + ?Sized>(&self, key: &K) -> Result<bool> {
        let old: Vec<u8> = self
            .set_cmd(key)
            .query_async(&mut self.conn.clone())
            .await?;
        Ok(old.contains(&0))
    }

    fn set_cmd<K: BloomKey + ?Sized>(&self, key: &K) -> redis::Cmd {
        let mut cmd = redis::cmd("BITFIELD");
        cmd.arg(&self.key);
        for off in self.offsets(key) {
            cmd.arg("SET").arg("u1").arg(off).arg(1);
        }
        cmd
    }

    /// Adds many keys in one round trip (one `BITFIELD` each, pipelined).
    ///
    /// # Errors
    /// Redis errors.
    pub async fn insert_many<K: BloomKey>(&self, keys: &[K]) -> Result<()> {
        let mut pipe = redis::pipe();
        for key in keys {
            pipe.add_command(self.set_cmd(key)).ignore();
        }
        let () = pipe.query_async(&mut self.conn.clone()).await?;
        Ok(())
    }

    /// Membership test in one command: `GETRANGE` of the key's 32-byte
    /// block, tested here (the same block an in-process filter of this
    /// shape reads).
    ///
    /// # Errors
    /// Redis errors; [`Error::Meta`] when the bit string is gone. A caller
    /// guarding a database should treat an error as "maybe" (fail open),
    /// never as "no".
    pub async fn contains<K: BloomKey + ?Sized>(&self, key: &K) -> Result<bool> {
        let offsets = self.offsets_of(key);
        let (start, end) = self.block_range(&offsets);
        let bytes: Vec<u8> = redis::cmd("GETRANGE")
            .arg(&self.key)
            .arg(start)
            .arg(end)
            .query_async(&mut self.conn.clone())
            .await?;
        self.whole(start, end, &bytes)?;
        Ok(Self::covered(&offsets, start, &bytes))
    }

    /// The bit string is allocated whole at creation, so a short read
    /// means it is gone (deleted, or lost with a Redis restart): an error,
    /// never a "no".
    fn whole(&self, start: u64, end: u64, bytes: &[u8]) -> Result<()> {
        if bytes.len() as u64 == end - start + 1 {
            return Ok(());
        }
        Err(Error::Meta {
            key: self.key.clone(),
            reason: format!(
                "bit string missing or short ({} of {} bytes at {start})",
                bytes.len(),
                end - start + 1
            ),
        })
    }

    /// Membership tests for many keys in one round trip (one `GETRANGE`
    /// each, pipelined).
    ///
    /// # Errors
    /// Redis errors.
    pub async fn contains_many<K: BloomKey>(&self, keys: &[K]) -> Result<Vec<bool>> {
        let mut pipe = redis::pipe();
        let mut asked = Vec::with_capacity(keys.len());
        for key in keys {
            let offsets = self.offsets_of(key);
            let (start, end) = self.block_range(&offsets);
            pipe.cmd("GETRANGE").arg(&self.key).arg(start).arg(end);
            asked.push((offsets, start));
        }
        let blocks: Vec<Vec<u8>> = pipe.query_async(&mut self.conn.clone()).await?;
        let block_bytes = u64::from(self.params.block_bits) / 8;
        asked
            .iter()
            .zip(&blocks)
            .map(|((offsets, start), bytes)| {
                self.whole(*start, start + block_bytes - 1, bytes)?;
                Ok(Self::covered(offsets, *start, bytes))
            })
            .collect()
    }

    /// Merges a local filter's bits (same shape and seed) into the shared
    /// ones with `BITOP OR`, e.g. after building from the database. A merge,
    /// not a replacement: a `SETBIT` another instance makes while the
    /// upload runs is kept (replacing the string would drop it, a false
    /// negative). Clearing bits (forgetting deleted keys) needs a fresh key.
    ///
    /// # Errors
    /// [`Error::ShapeMismatch`]; Redis errors.
    pub async fn upload(&self, local: &BlockedBloom) -> Result<()> {
        if local.params() != self.params || local.seed() != self.seed {
            return Err(Error::ShapeMismatch {
                key: self.key.clone(),
            });
        }
        let bytes: Vec<u8> = local
            .bitmap()
            .words()
            .iter()
            .flat_map(|w| w.to_le_bytes())
            .map(u8::reverse_bits)
            .take((self.params.bits() / 8) as usize)
            .collect();
        let tmp = format!("{}:upload:{:016x}", self.key, fastrand::u64(..));
        let mut c = self.conn.clone();
        let _: () = redis::pipe()
            .atomic()
            .set(&tmp, bytes)
            .ignore()
            .cmd("BITOP")
            .arg("OR")
            .arg(&self.key)
            .arg(&self.key)
            .arg(&tmp)
            .ignore()
            .del(&tmp)
            .ignore()
            .query_async(&mut c)
            .await?;
        Ok(())
    }

    /// Copies the shared bits into a local filter.
    ///
    /// # Errors
    /// [`Error::Meta`] when the stored string has the wrong length; Redis errors.
    pub async fn download(&self) -> Result<BlockedBloom> {
        let mut c = self.conn.clone();
        let bytes: Vec<u8> = c.get(&self.key).await?;
        let want = (self.params.bits() / 8) as usize;
        if bytes.len() != want {
            return Err(Error::Meta {
                key: self.key.clone(),
                reason: format!(
                    "bit string has {} bytes, the shape needs {want}",
                    bytes.len()
                ),
            });
        }
        let mut local = BlockedBloom::new(self.params, self.seed)?;
        let mut words: Vec<u64> = bytes
            .chunks(8)
            .map(|c| {
                let mut a = [0u8; 8];
                for (d, s) in a.iter_mut().zip(c) {
                    *d = s.reverse_bits();
                }
                u64::from_le_bytes(a)
            })
            .collect();
        words.resize(local.bitmap().words().len(), 0);
        local.set_words(&words)?;
        Ok(local)
    }

    /// Deletes the filter and its metadata.
    ///
    /// # Errors
    /// Redis errors.
    pub async fn destroy(self) -> Result<()> {
        let mut c = self.conn.clone();
        let _: () = c
            .del(&[self.key.clone(), format!("{}:meta", self.key)])
            .await?;
        Ok(())
    }
}
