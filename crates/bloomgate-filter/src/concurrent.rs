//! A lock-free blocked filter whose `insert` takes `&self`.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::bitmap::Bitmap;
use crate::block::{self, BATCH};
use crate::blocked::BlockedBloom;
use crate::error::{Error, Result};
use crate::filter::Filter;
use crate::hash::{BloomKey, HashPair};
use crate::sizing::{self, BlockedParams, Design};
use crate::storage::{AtomicLine, AtomicStorage};

/// A [`BlockedBloom`] (256-bit blocks, same positions) that many threads can
/// insert into and read from at once, without locks.
///
/// # Concurrency
///
/// `insert` reads the key's block atomically, then sets the bits it lacks
/// with `fetch_or`; readers load with `Relaxed` ordering. Relaxed is enough
/// because a filter publishes nothing but its own bits: once `insert(x)`
/// has returned on one thread, every later `contains(x)` on any thread that
/// is ordered after it (by a join, a lock, a channel, an HTTP response…)
/// sees all of `x`'s bits, since those synchronisations carry the stores
/// with them. A `contains(x)` racing with `insert(x)` may answer either way.
///
/// An insert that finds all of a key's bits set writes nothing, and a
/// `contains` ordered after it still sees them: it saw another insert's
/// stores, and read-read coherence hands them to every later read.
///
/// `insert` returns true when at least one of the key's bits was clear when
/// this call read its block (single-threaded: exactly when it set a new
/// bit). Under races that is not "this key was new": two threads inserting
/// the same new key at once may both return true. Use it as a statistic,
/// never as a uniqueness test. [`Filter::items`] counts insert calls,
/// exactly, in any interleaving.
///
/// ```
/// use std::sync::Arc;
/// use bloomgate_filter::{AtomicBloom, Filter};
/// let f = Arc::new(AtomicBloom::with_fpr(100_000, 0.01).unwrap());
/// let handles: Vec<_> = (0..4u64)
///     .map(|t| {
///         let f = Arc::clone(&f);
///         std::thread::spawn(move || for i in 0..1000u64 { f.insert(&(t * 1000 + i)); })
///     })
///     .collect();
/// for h in handles { h.join().unwrap(); }
/// assert!((0..4000u64).all(|k| f.contains(&k)));
/// assert_eq!(f.items(), 4000);
/// ```
#[derive(Debug)]
pub struct AtomicBloom {
    storage: AtomicStorage,
    blocks: u64,
    hashes: u32,
    seed: u64,
    items: AtomicU64,
    design: Option<Design>,
    kernel: block::Kernel256,
}

impl AtomicBloom {
    /// An empty filter for `n` items at rate `p`, seed 0.
    ///
    /// # Errors
    /// See [`sizing::blocked`].
    pub fn with_fpr(n: u64, p: f64) -> Result<Self> {
        let mut f = Self::new(sizing::blocked(n, p, 256)?, 0)?;
        f.design = Some(Design {
            capacity: n,
            fpr: p,
        });
        Ok(f)
    }

    /// An empty filter of the given shape (256-bit blocks only).
    ///
    /// # Errors
    /// [`Error::InvalidParameter`] for a shape [`BlockedBloom::new`] refuses
    /// or 128-bit blocks; [`Error::TooLarge`].
    pub fn new(params: BlockedParams, seed: u64) -> Result<Self> {
        crate::blocked::check_shape(params)?;
        if params.block_bits != 256 {
            return Err(Error::InvalidParameter {
                name: "block_bits",
                reason: "the concurrent filter uses 256-bit blocks".into(),
            });
        }
        sizing::check_fits(u128::from(params.bits()))?;
        let storage = AtomicStorage::zeroed(params.blocks.div_ceil(2) as usize)?;
        Ok(Self {
            storage,
            blocks: params.blocks,
            hashes: params.hashes,
            seed,
            items: AtomicU64::new(0),
            design: None,
            kernel: block::Kernel256::pick(params.hashes),
        })
    }

    /// Copies a heap filter (which must have 256-bit blocks).
    ///
    /// # Errors
    /// As [`AtomicBloom::new`].
    pub fn from_blocked(f: &BlockedBloom) -> Result<Self> {
        let mut s = Self::new(f.params(), f.seed())?;
        s.design = f.design();
        for (line, words) in s
            .storage
            .lines()
            .iter()
            .zip(f.bitmap().words().chunks_exact(8))
        {
            for (a, &w) in line.0.iter().zip(words) {
                a.store(w, Ordering::Relaxed);
            }
        }
        s.items.store(f.items(), Ordering::Relaxed);
        Ok(s)
    }

    /// A heap copy of the current bits, for snapshots and set operations.
    #[must_use]
    pub fn to_blocked(&self) -> BlockedBloom {
        let params = self.params();
        let mut words = Vec::with_capacity(self.storage.lines().len() * 8);
        for line in self.storage.lines() {
            words.extend(line.0.iter().map(|a| a.load(Ordering::Relaxed)));
        }
        let bits = Bitmap::from_words(params.bits(), &words)
            .unwrap_or_else(|_| unreachable!("blocks fill whole lines, so there is no padding"));
        BlockedBloom::from_parts(bits, params, self.seed, self.items(), self.design)
    }

    /// This filter's shape.
    #[must_use]
    pub const fn params(&self) -> BlockedParams {
        BlockedParams {
            blocks: self.blocks,
            block_bits: 256,
            hashes: self.hashes,
        }
    }

    /// Adds a key from any thread; see the type's docs for what the answer
    /// means under races.
    #[inline]
    pub fn insert<K: BloomKey + ?Sized>(&self, key: &K) -> bool {
        self.insert_hash(key.hash_pair(self.seed))
    }

    /// The four atomic words of the block a key with first hash `h1` uses.
    #[inline(always)]
    fn block(&self, h1: u64) -> &[AtomicU64] {
        self.block_at(block::block_index256(h1, self.blocks))
    }

    /// The four atomic words of block `idx`.
    #[inline(always)]
    fn block_at(&self, idx: usize) -> &[AtomicU64] {
        let half = (idx % 2) * 4;
        &self.storage.lines()[idx / 2].0[half..half + 4]
    }

    /// Adds a pre-hashed key.
    #[inline]
    pub fn insert_hash(&self, h: HashPair) -> bool {
        self.items.fetch_add(1, Ordering::Relaxed);
        self.set(h.h1)
    }

    /// Sets a key's bits (without counting it): one atomic read of the
    /// block, then a locked `fetch_or` only for the words that lack some of
    /// the key's bits (an insert of a key already present writes nothing).
    #[inline(always)]
    fn set(&self, h1: u64) -> bool {
        let idx = block::block_index256(h1, self.blocks);
        let missing = block::missing256(self.kernel, self.storage.lines(), idx, h1, self.hashes);
        let mut fresh = 0;
        for (a, &bits) in self.block_at(idx).iter().zip(&missing) {
            if bits != 0 {
                // The old value is not asked for: x86 has no fetch-or that
                // returns it, so asking would turn `lock or` into a
                // compare-exchange loop.
                a.fetch_or(bits, Ordering::Relaxed);
                fresh |= bits;
            }
        }
        fresh != 0
    }

    /// Adds many keys, prefetching a batch ahead.
    pub fn insert_many<K: BloomKey>(&self, keys: &[K]) {
        let seed = self.seed;
        self.set_batch(keys.len(), |i| keys[i].hash_pair(seed).h1);
    }

    /// Sets `n` keys (first hashes `h1_of(i)`) and counts them once: a
    /// rolling window that prefetches each block [`BATCH`] keys before its
    /// locked ORs (chunks of 32 stalled at each chunk's first key).
    fn set_batch(&self, n: usize, h1_of: impl Fn(usize) -> u64) {
        let mut ring = [0u64; BATCH];
        for i in 0..n + BATCH {
            if i >= BATCH {
                self.set(ring[i % BATCH]);
            }
            if i < n {
                let h1 = h1_of(i);
                block::prefetch(&self.block(h1)[0]);
                ring[i % BATCH] = h1;
            }
        }
        self.items.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// Tests many keys, prefetching a batch ahead; one answer per key.
    ///
    /// # Errors
    /// [`Error::LengthMismatch`] when `out.len() != keys.len()`.
    pub fn contains_many<K: BloomKey>(&self, keys: &[K], out: &mut [bool]) -> Result<()> {
        crate::error::check_len(keys.len(), out.len())?;
        let seed = self.seed;
        block::probe_batch256(
            self.kernel.avx2(),
            self.storage.lines(),
            self.blocks,
            self.hashes,
            |i| keys[i].hash_pair(seed).h1,
            out,
        );
        Ok(())
    }

    /// As [`AtomicBloom::contains_many`] for keys already hashed with this
    /// filter's seed.
    ///
    /// # Errors
    /// [`Error::LengthMismatch`] when `out.len() != hashes.len()`.
    pub fn contains_hashes(&self, hashes: &[HashPair], out: &mut [bool]) -> Result<()> {
        crate::error::check_len(hashes.len(), out.len())?;
        block::probe_batch256(
            self.kernel.avx2(),
            self.storage.lines(),
            self.blocks,
            self.hashes,
            |i| hashes[i].h1,
            out,
        );
        Ok(())
    }

    /// As [`AtomicBloom::insert_many`] for keys already hashed with this
    /// filter's seed.
    pub fn insert_hashes(&self, hashes: &[HashPair]) {
        self.set_batch(hashes.len(), |i| hashes[i].h1);
    }
}

impl block::Blocks256 for [AtomicLine] {
    const SHARED: bool = true;
    #[inline(always)]
    fn block_ptr(&self, idx: usize) -> *const u64 {
        // Lines are 64-byte aligned and contiguous, so block `idx` starts
        // `32 · idx` bytes in, 32-byte aligned (one shift and one add, where
        // indexing line and half costs five instructions).
        assert!(idx < self.len() * 2, "block {idx} out of bounds");
        self.as_ptr().cast::<u64>().wrapping_add(idx * 4)
    }
    #[inline(always)]
    fn load(&self, idx: usize) -> [u64; 4] {
        let half = (idx % 2) * 4;
        let w = &self[idx / 2].0[half..half + 4];
        [
            w[0].load(Ordering::Relaxed),
            w[1].load(Ordering::Relaxed),
            w[2].load(Ordering::Relaxed),
            w[3].load(Ordering::Relaxed),
        ]
    }
    #[inline(always)]
    fn prefetch(&self, idx: usize) {
        block::prefetch(&self[idx / 2]);
    }
}

impl Filter for AtomicBloom {
    fn seed(&self) -> u64 {
        self.seed
    }
    #[inline]
    fn contains_hash(&self, h: HashPair) -> bool {
        // One call into the kernel, which reads the block with atomic
        // loads only (never a plain wide load: the words may be written by
        // atomic ORs meanwhile) and tests it against the mask.
        block::contains256(
            self.kernel,
            self.storage.lines(),
            self.blocks,
            h.h1,
            self.hashes,
        )
    }
    fn bits(&self) -> u64 {
        self.blocks * 256
    }
    fn hashes(&self) -> u32 {
        self.hashes
    }
    fn items(&self) -> u64 {
        self.items.load(Ordering::Relaxed)
    }
    fn bytes(&self) -> usize {
        self.storage.lines().len() * 64
    }
    fn count_ones(&self) -> u64 {
        self.storage
            .lines()
            .iter()
            .flat_map(|l| &l.0)
            .map(|a| u64::from(a.load(Ordering::Relaxed).count_ones()))
            .sum()
    }
    fn design(&self) -> Option<Design> {
        self.design
    }
    fn expected_fpr(&self, n_items: u64) -> f64 {
        sizing::blocked_fpr(self.blocks, 256, self.hashes, n_items)
    }
}
