//! A lock-free blocked filter whose `insert` takes `&self`.

use std::sync::atomic::Ordering;

use crate::bitmap::Bitmap;
use crate::block;
use crate::blocked::BlockedBloom;
use crate::counter::Count;
use crate::error::{Error, Result};
use crate::filter::Filter;
use crate::hash::{BloomKey, HashPair};
use crate::sizing::{self, BlockedParams, Design};
use crate::snapshot::{self, Header, KeyKind, Layout};
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
/// never as a uniqueness test. [`Filter::items`] counts insert calls: each
/// thread counts in a cell of its own, and the sum is exact once the
/// inserting threads are ordered before the read (joined, say).
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
    /// Per-thread cells behind a pointer: inserts write no line that
    /// queries read, and the struct itself holds no atomics, so the
    /// compiler knows its fields do not change and a loop of queries keeps
    /// them in registers.
    items: Count,
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
            items: Count::default(),
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
        s.items = Count::new(f.items());
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

    /// The snapshot [`AtomicBloom::to_blocked`]'s `to_bytes` gives, read
    /// straight from the atomics: the output is the only copy (a snapshot
    /// of a large filter costs its size once, not three times).
    #[must_use]
    pub fn to_bytes(&self, key_kind: KeyKind) -> Vec<u8> {
        let params = self.params();
        let header = Header {
            layout: Layout::Blocked,
            hashes: self.hashes,
            seed: self.seed,
            bits: params.bits(),
            items: self.items(),
            block_bits: params.block_bits,
            key_kind,
            design: self.design,
        };
        let lines = self.storage.lines();
        let words = lines
            .iter()
            .flat_map(|line| line.0.iter().map(|a| a.load(Ordering::Relaxed)));
        snapshot::encode_words(&header, lines.len() * 8, words)
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

    /// Adds a pre-hashed key.
    #[inline]
    pub fn insert_hash(&self, h: HashPair) -> bool {
        self.items.add(1);
        self.set(h.h1)
    }

    /// Sets a key's bits (without counting it): one atomic read of the
    /// block, then locked writes only where some of the key's bits are
    /// missing (an insert of a key already present writes nothing).
    #[inline(always)]
    fn set(&self, h1: u64) -> bool {
        block::set256_atomic(
            self.kernel,
            self.storage.lines(),
            block::block_index256(h1, self.blocks),
            h1,
            self.hashes,
        )
    }

    /// Adds many keys, prefetching a batch ahead.
    pub fn insert_many<K: BloomKey>(&self, keys: &[K]) {
        let seed = self.seed;
        self.set_batch::<false>(keys.len(), |i| keys[i].hash_pair(seed).h1);
    }

    /// Sets `n` keys (first hashes `h1_of(i)`) and counts them once; see
    /// [`block::set_batch_with`] for the loop.
    /// `CHEAP`: `h1_of` is a load.
    fn set_batch<const CHEAP: bool>(&self, n: usize, h1_of: impl Fn(usize) -> u64) {
        self.items.add(n as u64);
        block::set_batch256::<CHEAP>(
            self.kernel,
            self.storage.lines(),
            self.blocks,
            self.hashes,
            n,
            h1_of,
        );
    }

    /// Tests many keys, prefetching a batch ahead; one answer per key.
    ///
    /// # Errors
    /// [`Error::LengthMismatch`] when `out.len() != keys.len()`.
    pub fn contains_many<K: BloomKey>(&self, keys: &[K], out: &mut [bool]) -> Result<()> {
        crate::error::check_len(keys.len(), out.len())?;
        let seed = self.seed;
        block::probe_batch256::<_, false>(
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
        block::probe_batch256::<_, true>(
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
        self.set_batch::<true>(hashes.len(), |i| hashes[i].h1);
    }
}

impl block::Blocks256 for [AtomicLine] {
    const SHARED: bool = true;
    #[inline(always)]
    fn base_ptr(&self) -> *const u64 {
        // Lines are 64-byte aligned and contiguous, so block `idx` starts
        // `32 · idx` bytes in, 32-byte aligned (one shift, where indexing
        // line and half costs five instructions).
        self.as_ptr().cast()
    }
    #[inline(always)]
    fn block_count(&self) -> usize {
        self.len() * 2
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
        self.items.get()
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hash::splitmix64;
    use std::sync::Barrier;

    /// `params`' filter on every kernel this CPU runs: the AVX2 one (when
    /// it has AVX2) and the portable one.
    fn every_path(params: BlockedParams) -> Vec<AtomicBloom> {
        let mut paths = vec![AtomicBloom::new(params, 3).unwrap()];
        if paths[0].kernel != block::Kernel256::Portable {
            let mut f = AtomicBloom::new(params, 3).unwrap();
            f.kernel = block::Kernel256::Portable;
            paths.push(f);
        }
        paths
    }

    fn shape(blocks: u64, hashes: u32) -> BlockedParams {
        BlockedParams {
            blocks,
            block_bits: 256,
            hashes,
        }
    }

    #[test]
    fn every_insert_path_sets_and_answers_as_the_heap_filter() {
        // 500 blocks (the batch's plain loop) at several k; 20,000 blocks
        // (its prefetch window) at k = 8.
        for (blocks, k, n) in [1, 3, 8, 11, 16]
            .into_iter()
            .map(|k| (500, k, 20_000u64))
            .chain([(20_000, 8, 300_000)])
        {
            let params = shape(blocks, k);
            let (singles, batches) = (every_path(params), every_path(params));
            if crate::block::has_avx2() {
                assert_eq!(singles.len(), 2, "both kernels run on this CPU");
            }
            let mut heap = BlockedBloom::new(params, 3).unwrap();
            let hashes: Vec<HashPair> = (0..n)
                .map(|i| HashPair {
                    h1: splitmix64(i),
                    h2: 0,
                })
                .collect();
            let mut fresh = 0;
            for (i, &h) in hashes.iter().enumerate() {
                let new = heap.insert_hash(h);
                fresh += usize::from(new);
                for f in &singles {
                    assert_eq!(f.insert_hash(h), new, "k {k} key {i} {:?}", f.kernel);
                }
            }
            assert!(fresh > 2_000 && fresh < n as usize, "both answers: {fresh}");
            for f in &batches {
                f.insert_hashes(&hashes[..n as usize / 2]);
                f.insert_hashes(&hashes[n as usize / 2..]);
            }
            for f in singles.iter().chain(&batches) {
                let words = f.to_blocked();
                assert_eq!(words.bitmap().words(), heap.bitmap().words(), "k {k}");
                assert_eq!(f.items(), n);
            }
        }
    }

    #[test]
    fn racing_inserts_into_the_same_blocks_lose_no_bit() {
        // Two blocks, so that the threads' writes keep meeting on the same
        // words: a lost OR would drop another thread's bits.
        let params = shape(2, 8);
        let threads = 4;
        let per_thread = 12;
        let mut heap = BlockedBloom::new(params, 3).unwrap();
        let keys: Vec<u64> = (0..threads * per_thread)
            .map(|i| splitmix64(i as u64 ^ 77))
            .collect();
        for &h1 in &keys {
            heap.insert_hash(HashPair { h1, h2: 0 });
        }
        let expect = heap.bitmap().words().to_vec();
        assert!(
            heap.count_ones() > 150 && heap.count_ones() < 400,
            "neither sparse nor saturated: {}",
            heap.count_ones()
        );
        for round in 0..1000 {
            for f in every_path(params) {
                let barrier = Barrier::new(threads);
                std::thread::scope(|s| {
                    // Half the threads insert one key at a time, half in
                    // batches.
                    for (t, part) in keys.chunks(per_thread).enumerate() {
                        let (f, barrier) = (&f, &barrier);
                        let part: Vec<HashPair> =
                            part.iter().map(|&h1| HashPair { h1, h2: 0 }).collect();
                        s.spawn(move || {
                            barrier.wait();
                            if t % 2 == 0 {
                                part.iter().for_each(|&h| {
                                    f.insert_hash(h);
                                });
                            } else {
                                f.insert_hashes(&part);
                            }
                        });
                    }
                });
                assert_eq!(
                    f.to_blocked().bitmap().words(),
                    &expect[..],
                    "round {round}"
                );
                assert_eq!(f.items(), keys.len() as u64);
            }
        }
    }
}
