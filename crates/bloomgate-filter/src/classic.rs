//! The classic Bloom filter: `k` positions spread over the whole bit array.

use crate::bitmap::Bitmap;
use crate::error::{Error, Result};
use crate::filter::Filter;
use crate::hash::{BloomKey, HashPair};
use crate::probe;
use crate::sizing::{self, ClassicParams, Design};
use crate::snapshot::{self, Header, KeyKind, Layout, Snapshot};

/// A Bloom filter with the seeds' exact scheme: positions
/// `(h1 + i·h2) mod m` for `i` in `0..k` over one array of `m` bits.
///
/// With seed 0 and integer keys it sets the same bits as the seckill
/// service's `BloomFilter.h`. Each probe may touch `k` cache lines; prefer
/// [`crate::BlockedBloom`] unless you need that compatibility.
///
/// ```
/// use bloomgate_filter::{ClassicBloom, Filter};
/// let mut f = ClassicBloom::with_fpr(500_000, 0.001).unwrap();
/// assert_eq!((f.bits(), f.hashes()), (7_188_794, 10));
/// f.insert(&42u64);
/// assert!(f.contains(&42u64));
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct ClassicBloom {
    bits: Bitmap,
    hashes: u32,
    seed: u64,
    items: u64,
    design: Option<Design>,
}

impl ClassicBloom {
    /// An empty filter sized by the classic formula for `n` items at rate `p`, seed 0.
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
    /// [`Error::InvalidParameter`] for zero bits or a hash count outside
    /// `1..=64`; [`Error::TooLarge`].
    pub fn new(params: ClassicParams, seed: u64) -> Result<Self> {
        check_shape(params.bits, params.hashes)?;
        Ok(Self {
            bits: Bitmap::new(params.bits)?,
            hashes: params.hashes,
            seed,
            items: 0,
            design: None,
        })
    }

    /// Adds a key; true when at least one of its bits was newly set.
    pub fn insert<K: BloomKey + ?Sized>(&mut self, key: &K) -> bool {
        self.insert_hash(key.hash_pair(self.seed))
    }

    /// Adds a key that was already hashed with this filter's seed.
    pub fn insert_hash(&mut self, h: HashPair) -> bool {
        let m = self.bits.len();
        let mut fresh = false;
        for i in 0..self.hashes {
            fresh |= !self.bits.set_unchecked(probe::classic_position(h, i, m));
        }
        self.items += 1;
        fresh
    }

    /// The bit positions of a key, in hash order. Stable across releases.
    pub fn positions<K: BloomKey + ?Sized>(&self, key: &K) -> impl Iterator<Item = u64> {
        let h = key.hash_pair(self.seed);
        let m = self.bits.len();
        (0..self.hashes).map(move |i| probe::classic_position(h, i, m))
    }

    /// ORs another filter of the same shape into this one.
    ///
    /// # Errors
    /// [`Error::ShapeMismatch`] when bits, hashes or seed differ.
    pub fn union(&mut self, other: &Self) -> Result<()> {
        if (self.hashes, self.seed) != (other.hashes, other.seed) {
            return Err(Error::ShapeMismatch(format!(
                "hashes/seed {}/{} vs {}/{}",
                self.hashes, self.seed, other.hashes, other.seed
            )));
        }
        self.bits.union_with(&other.bits)?;
        self.items += other.items;
        Ok(())
    }

    /// The underlying bitmap.
    #[must_use]
    pub const fn bitmap(&self) -> &Bitmap {
        &self.bits
    }

    pub(crate) const fn from_parts(
        bits: Bitmap,
        hashes: u32,
        seed: u64,
        items: u64,
        design: Option<Design>,
    ) -> Self {
        Self {
            bits,
            hashes,
            seed,
            items,
            design,
        }
    }
}

impl Snapshot for ClassicBloom {
    const LAYOUT: Layout = Layout::Classic;

    fn snapshot_header(&self, key_kind: KeyKind) -> Header {
        Header {
            layout: Layout::Classic,
            hashes: self.hashes,
            seed: self.seed,
            bits: self.bits.len(),
            items: self.items,
            block_bits: 0,
            key_kind,
            design: self.design,
        }
    }

    fn snapshot_words(&self) -> &[u64] {
        self.bits.words()
    }

    fn from_snapshot(h: &Header, payload: &[u8]) -> Result<Self> {
        Ok(Self {
            bits: snapshot::bitmap_from_payload(h.bits, payload)?,
            hashes: h.hashes,
            seed: h.seed,
            items: h.items,
            design: h.design,
        })
    }
}

pub(crate) fn check_shape(bits: u64, hashes: u32) -> Result<()> {
    if bits == 0 {
        return Err(Error::InvalidParameter {
            name: "bits",
            reason: "must be at least 1".into(),
        });
    }
    if !(1..=sizing::MAX_CLASSIC_HASHES).contains(&hashes) {
        return Err(Error::InvalidParameter {
            name: "hashes",
            reason: format!(
                "must be in 1..={}, got {hashes}",
                sizing::MAX_CLASSIC_HASHES
            ),
        });
    }
    Ok(())
}

impl Filter for ClassicBloom {
    fn seed(&self) -> u64 {
        self.seed
    }
    #[inline]
    fn contains_hash(&self, h: HashPair) -> bool {
        probe::classic_contains(self.bits.words(), self.bits.len(), self.hashes, h)
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
        sizing::classic_fpr(self.bits.len(), self.hashes, n_items)
    }
}
