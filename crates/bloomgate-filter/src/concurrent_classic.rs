//! A lock-free classic filter whose `insert` takes `&self`: seed 000's exact
//! scheme for a service that wants its bit-for-bit layout.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::counter::Count;

use crate::bitmap::Bitmap;
use crate::classic::{self, ClassicBloom};
use crate::error::Result;
use crate::filter::Filter;
use crate::hash::{BloomKey, HashPair};
use crate::probe;
use crate::sizing::{self, ClassicParams, Design};
use crate::snapshot::{self, Header, KeyKind, Layout};

/// A [`ClassicBloom`] (positions `(h1 + i·h2) mod m`, same bits) that many
/// threads can insert into and read from at once, without locks.
///
/// Concurrency follows [`crate::AtomicBloom`]: `fetch_or` with `Relaxed`
/// ordering, and a `contains(x)` ordered after `insert(x)` returned (by a
/// join, a lock, a channel, an HTTP response…) finds `x`. Each check may
/// touch `k` cache lines, where the blocked filter touches one; choose this
/// one for compatibility with seed 000's `BloomFilter.h` or for the fewest
/// bits per key.
///
/// ```
/// use bloomgate_filter::{AtomicClassicBloom, Filter};
/// let f = AtomicClassicBloom::with_fpr(500_000, 0.001).unwrap();
/// assert_eq!((f.bits(), f.hashes()), (7_188_794, 10));
/// f.insert(&42u64);
/// assert!(f.contains(&42u64));
/// ```
#[derive(Debug)]
pub struct AtomicClassicBloom {
    words: Vec<AtomicU64>,
    bits: u64,
    hashes: u32,
    seed: u64,
    items: Count,
    design: Option<Design>,
}

impl AtomicClassicBloom {
    /// An empty filter sized by the classic formula for `n` items at rate
    /// `p`, seed 0.
    ///
    /// # Errors
    /// See [`sizing::classic`].
    pub fn with_fpr(n: u64, p: f64) -> Result<Self> {
        let mut f = Self::new(sizing::classic(n, p)?, 0)?;
        f.design = Some(Design {
            capacity: n,
            fpr: p,
        });
        Ok(f)
    }

    /// An empty filter of the given shape.
    ///
    /// # Errors
    /// As [`ClassicBloom::new`].
    pub fn new(params: ClassicParams, seed: u64) -> Result<Self> {
        classic::check_shape(params.bits, params.hashes)?;
        sizing::check_fits(u128::from(params.bits))?;
        // Whole 64-byte lines, as the heap bitmap stores them, so copies
        // between the two are word for word.
        let mut words = Vec::new();
        words.resize_with(params.bits.div_ceil(512) as usize * 8, AtomicU64::default);
        Ok(Self {
            words,
            bits: params.bits,
            hashes: params.hashes,
            seed,
            items: Count::default(),
            design: None,
        })
    }

    /// Adds a key from any thread; true when this call set at least one bit
    /// (a statistic under races, as for [`crate::AtomicBloom::insert`]).
    #[inline]
    pub fn insert<K: BloomKey + ?Sized>(&self, key: &K) -> bool {
        self.insert_hash(key.hash_pair(self.seed))
    }

    /// Adds a pre-hashed key.
    pub fn insert_hash(&self, h: HashPair) -> bool {
        self.items.add(1);
        let mut fresh = false;
        for i in 0..self.hashes {
            let p = probe::classic_position(h, i, self.bits);
            let word = &self.words[(p / 64) as usize];
            let bit = 1u64 << (p % 64);
            // A load is cheaper than a locked read-modify-write when the bit
            // is already set, which it mostly is once the filter fills.
            if word.load(Ordering::Relaxed) & bit == 0 {
                fresh |= word.fetch_or(bit, Ordering::Relaxed) & bit == 0;
            }
        }
        fresh
    }

    /// Adds many keys.
    pub fn insert_many<K: BloomKey>(&self, keys: &[K]) {
        for key in keys {
            self.insert(key);
        }
    }

    /// A concurrent copy of `f`: the same bits, items and design.
    ///
    /// # Errors
    /// As [`AtomicClassicBloom::new`].
    pub fn from_classic(f: &ClassicBloom) -> Result<Self> {
        let mut s = Self::new(
            ClassicParams {
                bits: f.bits(),
                hashes: f.hashes(),
            },
            f.seed(),
        )?;
        s.design = f.design();
        for (a, &w) in s.words.iter().zip(f.bitmap().words()) {
            a.store(w, Ordering::Relaxed);
        }
        s.items = Count::new(f.items());
        Ok(s)
    }

    /// The snapshot [`AtomicClassicBloom::to_classic`]'s `to_bytes` gives,
    /// read straight from the atomics: the output is the only copy.
    #[must_use]
    pub fn to_bytes(&self, key_kind: KeyKind) -> Vec<u8> {
        let header = Header {
            layout: Layout::Classic,
            hashes: self.hashes,
            seed: self.seed,
            bits: self.bits,
            items: self.items(),
            block_bits: 0,
            key_kind,
            design: self.design,
        };
        let words = self.words.iter().map(|a| a.load(Ordering::Relaxed));
        snapshot::encode_words(&header, self.words.len(), words)
    }

    /// A heap copy of the current bits.
    #[must_use]
    pub fn to_classic(&self) -> ClassicBloom {
        let words: Vec<u64> = self
            .words
            .iter()
            .map(|w| w.load(Ordering::Relaxed))
            .collect();
        let bits = Bitmap::from_words(self.bits, &words)
            .unwrap_or_else(|_| unreachable!("same line count, and bits past m are never set"));
        ClassicBloom::from_parts(bits, self.hashes, self.seed, self.items(), self.design)
    }
}

impl Filter for AtomicClassicBloom {
    fn seed(&self) -> u64 {
        self.seed
    }
    #[inline]
    fn contains_hash(&self, h: HashPair) -> bool {
        (0..self.hashes).all(|i| {
            let p = probe::classic_position(h, i, self.bits);
            self.words[(p / 64) as usize].load(Ordering::Relaxed) & (1 << (p % 64)) != 0
        })
    }
    fn bits(&self) -> u64 {
        self.bits
    }
    fn hashes(&self) -> u32 {
        self.hashes
    }
    fn items(&self) -> u64 {
        self.items.get()
    }
    fn bytes(&self) -> usize {
        self.words.len() * 8
    }
    fn count_ones(&self) -> u64 {
        self.words
            .iter()
            .map(|w| u64::from(w.load(Ordering::Relaxed).count_ones()))
            .sum()
    }
    fn design(&self) -> Option<Design> {
        self.design
    }
    fn expected_fpr(&self, n_items: u64) -> f64 {
        sizing::classic_fpr(self.bits, self.hashes, n_items)
    }
}
