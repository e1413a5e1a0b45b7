//! The cache-blocked Bloom filter: every key lives in one 64-byte line.

use crate::bitmap::Bitmap;
use crate::block;
use crate::error::{Error, Result};
use crate::filter::Filter;
use crate::hash::{BloomKey, HashPair};
use crate::probe;
use crate::sizing::{self, BlockedParams, Design};
use crate::snapshot::{self, Header, KeyKind, Layout, Snapshot};

/// A blocked Bloom filter: each key picks one block and sets `k` bits in it,
/// so an insert or a lookup touches one 32-byte block in one cache line.
///
/// Blocks are 256 bits (half an aligned 64-byte line, eight 32-bit lanes,
/// AVX2 probes) or, at low rates, 512 bits (a whole line, positions
/// uniform over it: at `p = 1e-4` about 16% fewer bits than 256-bit
/// blocks); 128-bit blocks exist only as the projection of a
/// [`crate::CountingBloom`]. [`BlockedBloom::with_fpr`] picks the block
/// size with [`sizing::blocked_auto`] and sizes the filter with the exact
/// blocked formula, so the measured rate at `n` items is at or below the
/// target.
///
/// ```
/// use bloomgate_filter::{BlockedBloom, Filter};
/// let mut f = BlockedBloom::with_fpr(1_000_000, 0.01).unwrap();
/// for id in 1..=1000u64 {
///     f.insert(&id);
/// }
/// assert!(f.contains(&7u64));
/// assert!(f.expected_fpr(1_000_000) <= 0.01);
/// assert!((f.bits() as f64 / 1e6) < 9.59 * 1.15); // bits per key at 1%
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct BlockedBloom {
    bits: Bitmap,
    blocks: u64,
    block_words: usize,
    hashes: u32,
    seed: u64,
    items: u64,
    design: Option<Design>,
    /// The single-query kernel for 256-bit blocks, picked at construction
    /// (it also says whether this CPU has AVX2, for the other kernels).
    kernel: block::Kernel256,
}

impl BlockedBloom {
    /// An empty filter for `n` items at rate `p`, seed 0, in the block
    /// size [`sizing::blocked_auto`] picks (256 bits unless 512 saves a
    /// tenth of the memory, which happens below about `p = 1e-3`).
    ///
    /// # Errors
    /// See [`sizing::blocked`].
    pub fn with_fpr(n: u64, p: f64) -> Result<Self> {
        let mut f = Self::new(sizing::blocked_auto(n, p)?, 0)?;
        f.design = Some(Design {
            capacity: n,
            fpr: p,
        });
        Ok(f)
    }

    /// An empty filter of the given shape.
    ///
    /// # Errors
    /// [`Error::InvalidParameter`] for zero blocks, a block size other than
    /// 128, 256 or 512, or a hash count outside `1..=32`; [`Error::TooLarge`].
    pub fn new(params: BlockedParams, seed: u64) -> Result<Self> {
        check_shape(params)?;
        Ok(Self {
            bits: Bitmap::new(params.bits())?,
            blocks: params.blocks,
            block_words: (params.block_bits / 64) as usize,
            hashes: params.hashes,
            seed,
            items: 0,
            design: None,
            kernel: block::Kernel256::pick(params.hashes),
        })
    }

    pub(crate) fn from_parts(
        bits: Bitmap,
        params: BlockedParams,
        seed: u64,
        items: u64,
        design: Option<Design>,
    ) -> Self {
        Self {
            bits,
            blocks: params.blocks,
            block_words: (params.block_bits / 64) as usize,
            hashes: params.hashes,
            seed,
            items,
            design,
            kernel: block::Kernel256::pick(params.hashes),
        }
    }

    /// This filter's shape.
    #[must_use]
    pub const fn params(&self) -> BlockedParams {
        BlockedParams {
            blocks: self.blocks,
            block_bits: self.block_words as u32 * 64,
            hashes: self.hashes,
        }
    }

    /// Adds a key; true when at least one of its bits was newly set.
    #[inline]
    pub fn insert<K: BloomKey + ?Sized>(&mut self, key: &K) -> bool {
        self.insert_hash(key.hash_pair(self.seed))
    }

    /// Adds a key that was already hashed with this filter's seed.
    #[inline(always)]
    pub fn insert_hash(&mut self, h: HashPair) -> bool {
        self.items += 1;
        if self.block_words == 4 {
            let idx = block::block_index256(h.h1, self.blocks);
            block::apply256_with(
                self.kernel.avx2(),
                &mut self.bits.blocks256_mut()[idx],
                h.h1,
                self.hashes,
            )
        } else {
            self.insert_hash_wide(h)
        }
    }

    /// The 128-bit (projections of counting filters) and 512-bit (low
    /// rates) paths, kept out of line so the 256-bit path inlines into
    /// callers' loops.
    #[inline(never)]
    fn insert_hash_wide(&mut self, h: HashPair) -> bool {
        let k = self.hashes;
        if self.block_words == 8 {
            let idx = block::block_index256(h.h1, self.blocks);
            block::apply512(&mut self.bits.lines_mut()[idx].0, h.h1, k)
        } else {
            let words = self.bits.words_mut();
            let idx = block::block_index(h.h1, self.blocks);
            match words[idx * 2..].first_chunk_mut::<2>() {
                Some(b) => block::apply(b, &block::mask128(h, k)),
                None => unreachable!("block index is always below the block count"),
            }
        }
    }

    #[inline(never)]
    fn contains_hash_wide(&self, h: HashPair) -> bool {
        let words = self.bits.words();
        probe::blocked_contains(words, self.blocks, self.block_words, self.hashes, h)
    }

    /// The global bit positions of a key (`block · block_bits + offset`), in
    /// hash order. Stable across releases.
    pub fn positions<K: BloomKey + ?Sized>(&self, key: &K) -> impl Iterator<Item = u64> {
        Self::positions_for(self.params(), key.hash_pair(self.seed))
    }

    /// The global bit positions a key hashed to `h` has in any blocked
    /// filter of shape `params`: what [`BlockedBloom::insert_hash`] sets.
    /// Lets other stores (a shared filter in Redis, say) use the same bits.
    pub fn positions_for(params: BlockedParams, h: HashPair) -> impl Iterator<Item = u64> {
        let bits = u64::from(params.block_bits);
        let (base, positions): (u64, Box<dyn Iterator<Item = u32>>) = if params.block_bits == 256 {
            (
                block::block_index256(h.h1, params.blocks) as u64 * bits,
                Box::new(block::positions256(h.h1, params.hashes)),
            )
        } else if params.block_bits == 512 {
            (
                block::block_index256(h.h1, params.blocks) as u64 * bits,
                Box::new(block::positions512(h.h1, params.hashes)),
            )
        } else {
            let log2 = params.block_bits.trailing_zeros();
            (
                block::block_index(h.h1, params.blocks) as u64 * bits,
                Box::new(block::Positions::new(
                    block::inblock(h),
                    params.hashes,
                    log2,
                )),
            )
        };
        positions.map(move |p| base + u64::from(p))
    }

    /// Adds many keys, hashing and prefetching a batch ahead of the writes.
    pub fn insert_many<K: BloomKey>(&mut self, keys: &[K]) {
        if self.block_words != 4 {
            for key in keys {
                self.insert(key);
            }
            return;
        }
        let seed = self.seed;
        self.insert_batch::<false>(keys.len(), |i| keys[i].hash_pair(seed).h1);
    }

    /// Adds many keys already hashed with this filter's seed (as
    /// [`BlockedBloom::insert_many`], without the hashing).
    pub fn insert_hashes(&mut self, hashes: &[HashPair]) {
        if self.block_words != 4 {
            for &h in hashes {
                self.insert_hash(h);
            }
            return;
        }
        self.insert_batch::<true>(hashes.len(), |i| hashes[i].h1);
    }

    /// The batch insert over 256-bit blocks: the AVX2 or the portable
    /// kernel, chosen once per call, with the kernel inlined into the loop.
    /// `CHEAP`: `h1_of` is a load (see `block::batch_loop`).
    fn insert_batch<const CHEAP: bool>(&mut self, n: usize, h1_of: impl Fn(usize) -> u64) {
        let (avx2, blocks, k) = (self.kernel.avx2(), self.blocks, self.hashes);
        block::insert_batch256::<CHEAP>(avx2, self.bits.blocks256_mut(), blocks, k, n, h1_of);
        self.items += n as u64;
    }

    /// Tests many keys at once, writing one answer per key into `out`.
    /// Hashes and prefetches a batch of blocks before probing, so the cache
    /// misses of a large filter overlap instead of queueing.
    ///
    /// # Errors
    /// [`Error::LengthMismatch`] when `out.len() != keys.len()`.
    pub fn contains_many<K: BloomKey>(&self, keys: &[K], out: &mut [bool]) -> Result<()> {
        crate::error::check_len(keys.len(), out.len())?;
        if self.block_words != 4 {
            for (answer, key) in out.iter_mut().zip(keys) {
                *answer = self.contains(key);
            }
            return Ok(());
        }
        let seed = self.seed;
        self.probe_batch::<false>(|i| keys[i].hash_pair(seed).h1, out);
        Ok(())
    }

    /// As [`BlockedBloom::contains_many`] for keys already hashed with this
    /// filter's seed.
    ///
    /// # Errors
    /// [`Error::LengthMismatch`] when `out.len() != hashes.len()`.
    pub fn contains_hashes(&self, hashes: &[HashPair], out: &mut [bool]) -> Result<()> {
        crate::error::check_len(hashes.len(), out.len())?;
        if self.block_words != 4 {
            for (answer, &h) in out.iter_mut().zip(hashes) {
                *answer = self.contains_hash(h);
            }
            return Ok(());
        }
        self.probe_batch::<true>(|i| hashes[i].h1, out);
        Ok(())
    }

    /// The batch probe over 256-bit blocks: the AVX2 or the portable
    /// kernel, chosen once per call, with the kernel inlined into the loop.
    /// `CHEAP`: `h1_of` is a load (see `block::batch_loop`).
    fn probe_batch<const CHEAP: bool>(&self, h1_of: impl Fn(usize) -> u64, out: &mut [bool]) {
        let store = self.bits.blocks256();
        block::probe_batch256::<_, CHEAP>(
            self.kernel.avx2(),
            store,
            self.blocks,
            self.hashes,
            h1_of,
            out,
        );
    }

    /// ORs another filter of the same shape and seed into this one.
    ///
    /// # Errors
    /// [`Error::ShapeMismatch`] when the shape or seed differ.
    pub fn union(&mut self, other: &Self) -> Result<()> {
        if (self.params(), self.seed) != (other.params(), other.seed) {
            return Err(Error::ShapeMismatch(format!(
                "{:?} seed {} vs {:?} seed {}",
                self.params(),
                self.seed,
                other.params(),
                other.seed
            )));
        }
        self.bits.union_with(&other.bits)?;
        self.items += other.items;
        Ok(())
    }

    /// Replaces the filter's bits with `words` (as [`crate::Bitmap::words`]
    /// returns them), e.g. bits fetched from a shared store. The insert
    /// count is left as it was.
    ///
    /// # Errors
    /// [`Error::InvalidParameter`] when the length is wrong or a bit past
    /// the filter's end is set.
    pub fn set_words(&mut self, words: &[u64]) -> Result<()> {
        self.bits = Bitmap::from_words(self.bits.len(), words)?;
        Ok(())
    }

    /// The underlying bitmap.
    #[must_use]
    pub const fn bitmap(&self) -> &Bitmap {
        &self.bits
    }
}

impl Snapshot for BlockedBloom {
    const LAYOUT: Layout = Layout::Blocked;

    fn snapshot_header(&self, key_kind: KeyKind) -> Header {
        Header {
            layout: Layout::Blocked,
            hashes: self.hashes,
            seed: self.seed,
            bits: self.bits.len(),
            items: self.items,
            block_bits: self.block_words as u32 * 64,
            key_kind,
            design: self.design,
        }
    }

    fn snapshot_words(&self) -> &[u64] {
        self.bits.words()
    }

    fn from_snapshot(h: &Header, payload: &[u8]) -> Result<Self> {
        let bits = snapshot::bitmap_from_payload(h.bits, payload)?;
        let params = BlockedParams {
            blocks: h.bits / u64::from(h.block_bits),
            block_bits: h.block_bits,
            hashes: h.hashes,
        };
        Ok(Self::from_parts(bits, params, h.seed, h.items, h.design))
    }
}

pub(crate) fn check_shape(p: BlockedParams) -> Result<()> {
    if p.blocks == 0 {
        return Err(Error::InvalidParameter {
            name: "blocks",
            reason: "must be at least 1".into(),
        });
    }
    if ![128, 256, 512].contains(&p.block_bits) {
        return Err(Error::InvalidParameter {
            name: "block_bits",
            reason: format!("must be 128, 256 or 512, got {}", p.block_bits),
        });
    }
    if p.block_bits >= 256 && p.blocks > 1 << 32 {
        return Err(Error::TooLarge {
            bits: u128::from(p.blocks) * u128::from(p.block_bits),
        });
    }
    if !(1..=sizing::MAX_BLOCKED_HASHES).contains(&p.hashes) {
        return Err(Error::InvalidParameter {
            name: "hashes",
            reason: format!(
                "must be in 1..={}, got {}",
                sizing::MAX_BLOCKED_HASHES,
                p.hashes
            ),
        });
    }
    Ok(())
}

impl Filter for BlockedBloom {
    fn seed(&self) -> u64 {
        self.seed
    }
    #[inline(always)]
    fn contains_hash(&self, h: HashPair) -> bool {
        if self.block_words == 4 {
            let store = self.bits.blocks256();
            block::contains256(self.kernel, store, self.blocks, h.h1, self.hashes)
        } else if self.block_words == 8 {
            let idx = block::block_index256(h.h1, self.blocks);
            block::covers512_with(
                self.kernel.avx2(),
                &self.bits.lines()[idx].0,
                h.h1,
                self.hashes,
            )
        } else {
            self.contains_hash_wide(h)
        }
    }
    fn bits(&self) -> u64 {
        self.bits.len()
    }
    fn hashes(&self) -> u32 {
        self.hashes
    }
    fn items(&self) -> u64 {
        self.items
    }
    fn bytes(&self) -> usize {
        self.bits.bytes()
    }
    fn count_ones(&self) -> u64 {
        self.bits.count_ones()
    }
    fn design(&self) -> Option<Design> {
        self.design
    }
    fn expected_fpr(&self, n_items: u64) -> f64 {
        let p = self.params();
        sizing::blocked_fpr(p.blocks, p.block_bits, p.hashes, n_items)
    }
}
