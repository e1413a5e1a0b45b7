//! A counting Bloom filter: 4-bit counters, so keys can be removed.

use crate::bitmap::Bitmap;
use crate::block;
use crate::blocked::BlockedBloom;
use crate::error::{Error, Result};
use crate::filter::Filter;
use crate::hash::{BloomKey, HashPair};
use crate::probe;
use crate::sizing::{self, BlockedParams, Design};
use crate::snapshot::{self, Header, KeyKind, Layout, Snapshot};

/// The value a counter sticks at once reached.
pub const SATURATED: u64 = 15;

/// A blocked counting filter: 128 four-bit counters per 64-byte line; each
/// key picks one line and increments `k` counters in it.
///
/// * A counter that reaches 15 stays at 15 forever: it is never decremented
///   again, so overflow can never create a false negative (it only leaves
///   that counter permanently set).
/// * [`CountingBloom::remove`] refuses a key the filter says is absent.
///   Removing a key that was never inserted but happens to test positive (a
///   false positive) cannot be detected, and would decrement other keys'
///   counters: only remove keys you inserted.
/// * [`CountingBloom::to_bloom`] projects the counters to a plain
///   [`BlockedBloom`] with the same blocks and positions, for a fast read path.
///
/// ```
/// use bloomgate_filter::{CountingBloom, Filter};
/// let mut f = CountingBloom::with_fpr(10_000, 0.01).unwrap();
/// f.insert(&7u64);
/// assert!(f.contains(&7u64));
/// f.remove(&7u64).unwrap();
/// assert!(!f.contains(&7u64));
/// assert!(f.remove(&7u64).is_err()); // absent: refused
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct CountingBloom {
    // 512 storage bits (128 counters) per block.
    store: Bitmap,
    blocks: u64,
    hashes: u32,
    seed: u64,
    items: u64,
    design: Option<Design>,
}

impl CountingBloom {
    /// An empty filter for `n` items at rate `p`, seed 0, sized with the exact
    /// blocked formula for 128-position blocks.
    ///
    /// # Errors
    /// See [`sizing::blocked`].
    pub fn with_fpr(n: u64, p: f64) -> Result<Self> {
        let mut f = Self::new(sizing::blocked(n, p, 128)?, 0)?;
        f.design = Some(Design {
            capacity: n,
            fpr: p,
        });
        Ok(f)
    }

    /// An empty filter of the given shape (`block_bits` must be 128).
    ///
    /// # Errors
    /// [`Error::InvalidParameter`] or [`Error::TooLarge`].
    pub fn new(params: BlockedParams, seed: u64) -> Result<Self> {
        crate::blocked::check_shape(params)?;
        if params.block_bits != 128 {
            return Err(Error::InvalidParameter {
                name: "block_bits",
                reason: "a counting filter has 128 counters per block".into(),
            });
        }
        let storage_bits = params.blocks.checked_mul(512).ok_or(Error::TooLarge {
            bits: u128::from(params.blocks) * 512,
        })?;
        Ok(Self {
            store: Bitmap::new(storage_bits)?,
            blocks: params.blocks,
            hashes: params.hashes,
            seed,
            items: 0,
            design: None,
        })
    }

    /// This filter's shape.
    #[must_use]
    pub const fn params(&self) -> BlockedParams {
        BlockedParams {
            blocks: self.blocks,
            block_bits: 128,
            hashes: self.hashes,
        }
    }

    fn slots(&self, h: HashPair) -> impl Iterator<Item = (usize, u32)> {
        let idx = block::block_index(h.h1, self.blocks);
        block::Positions::new(block::inblock(h), self.hashes, 7)
            .map(move |p| probe::counter_slot(idx, p))
    }

    /// Adds a key, incrementing its counters (saturating at 15).
    pub fn insert<K: BloomKey + ?Sized>(&mut self, key: &K) {
        let h = key.hash_pair(self.seed);
        let idx = block::block_index(h.h1, self.blocks);
        let words = self.store.words_mut();
        for p in block::Positions::new(block::inblock(h), self.hashes, 7) {
            let (w, s) = probe::counter_slot(idx, p);
            let c = (words[w] >> s) & 0xF;
            if c < SATURATED {
                words[w] += 1 << s;
            }
        }
        self.items += 1;
    }

    /// Removes a key, decrementing its counters (saturated ones stay at 15).
    ///
    /// # Errors
    /// [`Error::NotPresent`] when the filter says the key is absent; nothing
    /// is changed then.
    pub fn remove<K: BloomKey + ?Sized>(&mut self, key: &K) -> Result<()> {
        let h = key.hash_pair(self.seed);
        if !self.contains_hash(h) {
            return Err(Error::NotPresent);
        }
        let idx = block::block_index(h.h1, self.blocks);
        let words = self.store.words_mut();
        for p in block::Positions::new(block::inblock(h), self.hashes, 7) {
            let (w, s) = probe::counter_slot(idx, p);
            let c = (words[w] >> s) & 0xF;
            // A key's positions may repeat; a counter it already took to
            // zero stays at zero.
            if c != SATURATED && c > 0 {
                words[w] -= 1 << s;
            }
        }
        self.items = self.items.saturating_sub(1);
        Ok(())
    }

    /// The counter values of a key's positions, in hash order.
    pub fn counters<K: BloomKey + ?Sized>(&self, key: &K) -> Vec<u8> {
        let words = self.store.words();
        self.slots(key.hash_pair(self.seed))
            .map(|(w, s)| ((words[w] >> s) & 0xF) as u8)
            .collect()
    }

    /// A plain filter with the same blocks and positions: a position is set
    /// when its counter is non-zero.
    #[must_use]
    pub fn to_bloom(&self) -> BlockedBloom {
        let params = self.params();
        let mut words = vec![0u64; (params.bits().div_ceil(512) * 8) as usize];
        for (i, &w) in self.store.words().iter().enumerate() {
            // Storage word i holds counters 16·(i%8).. of block i/8; the
            // projected block has 2 words of 64 bits.
            let mut bits = 0u64;
            for c in 0..16 {
                if (w >> (c * 4)) & 0xF != 0 {
                    bits |= 1 << c;
                }
            }
            let block = i / 8;
            let first = (i % 8) * 16;
            let word = block * 2 + first / 64;
            words[word] |= bits << (first % 64);
        }
        let bits = Bitmap::from_words(params.bits(), &words)
            .unwrap_or_else(|_| unreachable!("projection only sets bits inside the filter"));
        BlockedBloom::from_parts(bits, params, self.seed, self.items, self.design)
    }
}

impl Snapshot for CountingBloom {
    const LAYOUT: Layout = Layout::Counting;

    fn snapshot_header(&self, key_kind: KeyKind) -> Header {
        Header {
            layout: Layout::Counting,
            hashes: self.hashes,
            seed: self.seed,
            bits: self.blocks * 128,
            items: self.items,
            block_bits: 128,
            key_kind,
            design: self.design,
        }
    }

    fn snapshot_words(&self) -> &[u64] {
        self.store.words()
    }

    fn from_snapshot(h: &Header, payload: &[u8]) -> Result<Self> {
        Ok(Self {
            store: snapshot::bitmap_from_payload(h.bits * 4, payload)?,
            blocks: h.bits / 128,
            hashes: h.hashes,
            seed: h.seed,
            items: h.items,
            design: h.design,
        })
    }
}

impl Filter for CountingBloom {
    fn seed(&self) -> u64 {
        self.seed
    }
    fn contains_hash(&self, h: HashPair) -> bool {
        probe::counting_contains(self.store.words(), self.blocks, self.hashes, h)
    }
    /// Number of counters.
    fn bits(&self) -> u64 {
        self.blocks * 128
    }
    fn hashes(&self) -> u32 {
        self.hashes
    }
    /// Inserts minus successful removes.
    fn items(&self) -> u64 {
        self.items
    }
    fn bytes(&self) -> usize {
        self.store.bytes()
    }
    /// Number of non-zero counters.
    fn count_ones(&self) -> u64 {
        self.store
            .words()
            .iter()
            .map(|&w| (0..16).filter(|i| (w >> (i * 4)) & 0xF != 0).count() as u64)
            .sum()
    }
    fn design(&self) -> Option<Design> {
        self.design
    }
    fn expected_fpr(&self, n_items: u64) -> f64 {
        sizing::blocked_fpr(self.blocks, 128, self.hashes, n_items)
    }
}
