//! A lock-free blocked filter whose `insert` takes `&self`.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::bitmap::Bitmap;
use crate::block::{self, BATCH};
use crate::blocked::BlockedBloom;
use crate::error::{Error, Result};
use crate::filter::Filter;
use crate::hash::{BloomKey, HashPair};
use crate::sizing::{self, BlockedParams, Design};

#[derive(Debug, Default)]
#[repr(C, align(64))]
struct AtomicLine([AtomicU64; 8]);

/// A [`BlockedBloom`] (256-bit blocks, same positions) that many threads can
/// insert into and read from at once, without locks.
///
/// # Concurrency
///
/// `insert` sets bits with `fetch_or` and readers load with `Relaxed`
/// ordering. Relaxed is enough because a filter publishes nothing but its own
/// bits: once `insert(x)` has returned on one thread, every later
/// `contains(x)` on any thread that is ordered after it (by a join, a lock, a
/// channel, an HTTP response…) sees all of `x`'s bits, since those
/// synchronisations carry the stores with them. A `contains(x)` racing with
/// `insert(x)` may answer either way.
///
/// `insert` returns true when this call set at least one bit that was clear
/// just before its `fetch_or`. Under races that is not "this key was new":
/// two threads inserting the same new key at once may both return true, or
/// one of two different keys whose bits overlap may return false. Use it as
/// a statistic, never as a uniqueness test. [`Filter::items`] counts insert
/// calls, exactly, in any interleaving.
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
    lines: Vec<AtomicLine>,
    blocks: u64,
    hashes: u32,
    seed: u64,
    items: AtomicU64,
    design: Option<Design>,
    avx2: bool,
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
        let mut lines = Vec::new();
        lines.resize_with(params.blocks.div_ceil(2) as usize, AtomicLine::default);
        Ok(Self {
            lines,
            blocks: params.blocks,
            hashes: params.hashes,
            seed,
            items: AtomicU64::new(0),
            design: None,
            avx2: block::has_avx2(),
        })
    }

    /// Copies a heap filter (which must have 256-bit blocks).
    ///
    /// # Errors
    /// As [`AtomicBloom::new`].
    pub fn from_blocked(f: &BlockedBloom) -> Result<Self> {
        let mut s = Self::new(f.params(), f.seed())?;
        s.design = f.design();
        for (line, words) in s.lines.iter().zip(f.bitmap().words().chunks_exact(8)) {
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
        let mut words = Vec::with_capacity(self.lines.len() * 8);
        for line in &self.lines {
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
        let idx = block::block_index256(h1, self.blocks);
        let half = (idx % 2) * 4;
        &self.lines[idx / 2].0[half..half + 4]
    }

    /// Adds a pre-hashed key.
    #[inline]
    pub fn insert_hash(&self, h: HashPair) -> bool {
        self.items.fetch_add(1, Ordering::Relaxed);
        self.set(h)
    }

    /// Sets a key's bits (without counting it).
    #[inline(always)]
    fn set(&self, h: HashPair) -> bool {
        let m = block::mask256_with(self.avx2, h.h1, self.hashes);
        let mut fresh = 0;
        for (a, &bits) in self.block(h.h1).iter().zip(&m) {
            // Skip words this key does not touch, and words already
            // holding all its bits: a load is cheaper than a locked RMW.
            if bits != 0 && a.load(Ordering::Relaxed) & bits != bits {
                fresh |= bits & !a.fetch_or(bits, Ordering::Relaxed);
            }
        }
        fresh != 0
    }

    /// Adds many keys, prefetching a batch ahead.
    pub fn insert_many<K: BloomKey>(&self, keys: &[K]) {
        let mut hashes = [HashPair { h1: 0, h2: 0 }; BATCH];
        for chunk in keys.chunks(BATCH) {
            for (slot, key) in hashes.iter_mut().zip(chunk) {
                *slot = key.hash_pair(self.seed);
                block::prefetch(&self.block(slot.h1)[0]);
            }
            for h in &hashes[..chunk.len()] {
                self.set(*h);
            }
        }
        self.items.fetch_add(keys.len() as u64, Ordering::Relaxed);
    }

    /// Tests many keys, prefetching a batch ahead; one answer per key.
    ///
    /// # Errors
    /// [`Error::LengthMismatch`] when `out.len() != keys.len()`.
    pub fn contains_many<K: BloomKey>(&self, keys: &[K], out: &mut [bool]) -> Result<()> {
        crate::error::check_len(keys.len(), out.len())?;
        let seed = self.seed;
        block::probe_batch256(
            self.avx2,
            &self.lines[..],
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
            self.avx2,
            &self.lines[..],
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
        for chunk in hashes.chunks(BATCH) {
            for h in chunk {
                block::prefetch(&self.block(h.h1)[0]);
            }
            for h in chunk {
                self.set(*h);
            }
        }
        self.items.fetch_add(hashes.len() as u64, Ordering::Relaxed);
    }
}

impl block::Blocks256 for [AtomicLine] {
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
        // The key's mask, then four relaxed loads tested word by word
        // (never one wide load: the words may be written by atomic ORs
        // meanwhile). Handing the four loaded words to the vector kernel
        // instead measured 1.7× slower (11 against 6.4 ns at 10^6 keys):
        // four 8-byte stores read back as one 32-byte load stall on store
        // forwarding.
        let m = block::mask256_with(self.avx2, h.h1, self.hashes);
        let mut missing = 0;
        for (a, &bits) in self.block(h.h1).iter().zip(&m) {
            missing |= bits & !a.load(Ordering::Relaxed);
        }
        missing == 0
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
        self.lines.len() * 64
    }
    fn count_ones(&self) -> u64 {
        self.lines
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
