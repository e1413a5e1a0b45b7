//! A scalable Bloom filter: a chain of blocked filters that grows with the data.

use std::path::Path;

use xxhash_rust::xxh3::xxh3_64;

use crate::blocked::BlockedBloom;
use crate::error::{Error, Result, SnapshotError};
use crate::filter::Filter;
use crate::hash::{splitmix64, BloomKey, HashPair};
use crate::sizing;
use crate::snapshot::{self, KeyKind, Snapshot};

/// The eight bytes a [`ScalableBloom`] snapshot starts with (a plain
/// filter's snapshot starts with [`snapshot::MAGIC`]).
pub const SCALABLE_MAGIC: [u8; 8] = *b"BLOOMGS\0";
/// The chain format version this release writes and reads.
pub const SCALABLE_FORMAT_VERSION: u16 = 1;
/// Bytes before the first link.
const CHAIN_HEADER_LEN: usize = 64;
/// More links than a chain can have: each doubles (by default) the last.
const MAX_LINKS: u32 = 64;

/// How a [`ScalableBloom`] grows.
///
/// ```
/// use bloomgate_filter::{ScalableBloom, ScalableOptions};
/// let options = ScalableOptions { growth: 4.0, seed: 9, ..ScalableOptions::new(1000, 0.001) };
/// let f = ScalableBloom::new(options).unwrap();
/// assert_eq!(f.options().growth, 4.0);
/// assert!(ScalableBloom::new(ScalableOptions { growth: 1.0, ..options }).is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ScalableOptions {
    /// Capacity of the first sub-filter.
    pub initial_capacity: u64,
    /// Target false-positive rate of the whole chain.
    pub fpr: f64,
    /// Capacity multiplier for each new sub-filter (default 2).
    pub growth: f64,
    /// Rate multiplier for each new sub-filter (default 0.5).
    pub tightening: f64,
    /// Hash seed.
    pub seed: u64,
}

impl ScalableOptions {
    /// Options with the default growth (2) and tightening (0.5).
    #[must_use]
    pub const fn new(initial_capacity: u64, fpr: f64) -> Self {
        Self {
            initial_capacity,
            fpr,
            growth: 2.0,
            tightening: 0.5,
            seed: 0,
        }
    }
}

/// One link of the chain, as [`ScalableBloom::chain`] reports it.
///
/// ```
/// use bloomgate_filter::{ScalableBloom, ScalableOptions};
/// let mut f = ScalableBloom::new(ScalableOptions::new(100, 0.01)).unwrap();
/// for k in 0..250u64 {
///     f.insert(&k).unwrap();
/// }
/// let chain = f.chain();
/// assert_eq!(chain[0].capacity, 100);
/// assert_eq!(chain[1].capacity, 200);
/// assert!(chain[1].target_fpr < chain[0].target_fpr);
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SubFilterInfo {
    /// Keys this sub-filter was sized for.
    pub capacity: u64,
    /// Keys inserted into it.
    pub items: u64,
    /// Its target rate at capacity.
    pub target_fpr: f64,
    /// Its exact expected rate at its current load.
    pub expected_fpr: f64,
    /// Its size in bits.
    pub bits: u64,
    /// Its hash count.
    pub hashes: u32,
    /// Its storage in bytes.
    pub bytes: usize,
}

#[derive(Debug, Clone)]
struct Sub {
    filter: BlockedBloom,
    capacity: u64,
    target_fpr: f64,
}

/// A chain of [`BlockedBloom`]s. When the newest reaches its capacity, a new
/// one is added with `capacity × growth` and `rate × tightening`. The first
/// sub-filter's rate is `fpr × (1 - tightening)`, so the rates form a
/// geometric series that sums to less than `fpr`: the whole chain stays at
/// or below its target however many keys arrive. Reads check every
/// sub-filter; writes go to the newest only.
///
/// ```
/// use bloomgate_filter::{Filter, ScalableBloom, ScalableOptions};
/// let mut f = ScalableBloom::new(ScalableOptions::new(1000, 0.01)).unwrap();
/// for k in 0..10_000u64 {
///     f.insert(&k);
/// }
/// assert!(f.chain().len() > 1);
/// assert!((0..10_000u64).all(|k| f.contains(&k)));
/// assert!(f.expected_fpr(0) <= 0.01);
/// ```
#[derive(Debug, Clone)]
pub struct ScalableBloom {
    options: ScalableOptions,
    subs: Vec<Sub>,
}

impl ScalableBloom {
    /// An empty chain with one sub-filter.
    ///
    /// # Errors
    /// [`Error::ZeroItems`], [`Error::InvalidFpr`], or
    /// [`Error::InvalidParameter`] for growth ≤ 1 or tightening outside (0, 1).
    pub fn new(options: ScalableOptions) -> Result<Self> {
        Self::check_options(&options)?;
        let mut s = Self {
            options,
            subs: Vec::new(),
        };
        s.grow()?;
        Ok(s)
    }

    fn check_options(options: &ScalableOptions) -> Result<()> {
        sizing::check_inputs(options.initial_capacity, options.fpr)?;
        if !(options.growth > 1.0 && options.growth.is_finite()) {
            return Err(Error::InvalidParameter {
                name: "growth",
                reason: format!("must be greater than 1, got {}", options.growth),
            });
        }
        if !(options.tightening > 0.0 && options.tightening < 1.0) {
            return Err(Error::InvalidParameter {
                name: "tightening",
                reason: format!("must be in (0, 1), got {}", options.tightening),
            });
        }
        Ok(())
    }

    /// Link `i`'s capacity and target rate: both follow from the options.
    fn link_design(o: &ScalableOptions, i: usize) -> (u64, f64) {
        let i = i as i32;
        let capacity = (o.initial_capacity as f64 * o.growth.powi(i)).ceil() as u64;
        let target_fpr = o.fpr * (1.0 - o.tightening) * o.tightening.powi(i);
        (capacity, target_fpr)
    }

    fn grow(&mut self) -> Result<()> {
        let o = &self.options;
        let (capacity, target_fpr) = Self::link_design(o, self.subs.len());
        let params = sizing::blocked(capacity, target_fpr, 256)?;
        let filter = BlockedBloom::new(params, o.seed)?;
        self.subs.push(Sub {
            filter,
            capacity,
            target_fpr,
        });
        Ok(())
    }

    /// Encodes the chain: a 64-byte checksummed header with the options,
    /// then each link as a length and a [`BlockedBloom`] snapshot (each
    /// checksummed itself), then an XXH3-64 of everything after the
    /// header.
    ///
    /// ```text
    /// offset size field
    ///  0      8   magic b"BLOOMGS\0"
    ///  8      2   chain format version (1)
    /// 10      2   reserved, zero
    /// 12      4   links
    /// 16      8   initial capacity
    /// 24      8   target rate, f64 bits
    /// 32      8   growth, f64 bits
    /// 40      8   tightening, f64 bits
    /// 48      8   seed
    /// 56      8   XXH3-64 of bytes 0..56
    /// 64      …   per link: 8-byte length n, n bytes of snapshot
    /// end-8   8   XXH3-64 of bytes 64..end-8
    /// ```
    ///
    /// ```
    /// use bloomgate_filter::{Filter, ScalableBloom, ScalableOptions};
    /// let mut f = ScalableBloom::new(ScalableOptions::new(100, 0.01)).unwrap();
    /// for k in 0..1000u64 {
    ///     f.insert(&k).unwrap();
    /// }
    /// let g = ScalableBloom::from_bytes(&f.to_bytes()).unwrap();
    /// assert_eq!(g.chain(), f.chain());
    /// assert!((0..1000u64).all(|k| g.contains(&k)));
    /// ```
    #[must_use]
    pub fn to_bytes(&self) -> Vec<u8> {
        let o = &self.options;
        let mut out = Vec::with_capacity(CHAIN_HEADER_LEN + self.bytes() + 256 * self.subs.len());
        out.extend_from_slice(&SCALABLE_MAGIC);
        out.extend_from_slice(&SCALABLE_FORMAT_VERSION.to_le_bytes());
        out.extend_from_slice(&[0, 0]);
        out.extend_from_slice(&(self.subs.len() as u32).to_le_bytes());
        out.extend_from_slice(&o.initial_capacity.to_le_bytes());
        for v in [o.fpr, o.growth, o.tightening] {
            out.extend_from_slice(&v.to_bits().to_le_bytes());
        }
        out.extend_from_slice(&o.seed.to_le_bytes());
        let sum = xxh3_64(&out);
        out.extend_from_slice(&sum.to_le_bytes());
        for sub in &self.subs {
            let link = sub.filter.to_bytes(KeyKind::Unspecified);
            out.extend_from_slice(&(link.len() as u64).to_le_bytes());
            out.extend_from_slice(&link);
        }
        let sum = xxh3_64(&out[CHAIN_HEADER_LEN..]);
        out.extend_from_slice(&sum.to_le_bytes());
        out
    }

    /// Decodes a chain that [`ScalableBloom::to_bytes`] wrote, verifying
    /// both checksums, every link's own snapshot, and that every link has
    /// the shape and seed its options give it.
    ///
    /// # Errors
    /// [`Error::Snapshot`] for anything but a valid chain.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self> {
        let bad = |field: &'static str, reason: String| {
            Error::Snapshot(SnapshotError::InvalidField { field, reason })
        };
        let min = (CHAIN_HEADER_LEN + 8) as u64;
        if bytes.len() < 8 || bytes[..8] != SCALABLE_MAGIC {
            return Err(SnapshotError::BadMagic.into());
        }
        if (bytes.len() as u64) < min {
            return Err(SnapshotError::Truncated {
                expected: min,
                found: bytes.len() as u64,
            }
            .into());
        }
        let u64_at = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap_or([0; 8]));
        if u64_at(56) != xxh3_64(&bytes[..56]) {
            return Err(SnapshotError::HeaderChecksum.into());
        }
        let version = u16::from_le_bytes([bytes[8], bytes[9]]);
        if version != SCALABLE_FORMAT_VERSION {
            return Err(SnapshotError::UnsupportedVersion(version).into());
        }
        if bytes[10..12] != [0, 0] {
            return Err(bad("reserved", "must be zero".into()));
        }
        let links = u32::from_le_bytes(bytes[12..16].try_into().unwrap_or([0; 4]));
        if links == 0 || links > MAX_LINKS {
            return Err(bad(
                "links",
                format!("must be 1..={MAX_LINKS}, got {links}"),
            ));
        }
        let options = ScalableOptions {
            initial_capacity: u64_at(16),
            fpr: f64::from_bits(u64_at(24)),
            growth: f64::from_bits(u64_at(32)),
            tightening: f64::from_bits(u64_at(40)),
            seed: u64_at(48),
        };
        Self::check_options(&options).map_err(|e| bad("options", e.to_string()))?;
        let end = bytes.len() - 8;
        if u64_at(end) != xxh3_64(&bytes[CHAIN_HEADER_LEN..end]) {
            return Err(SnapshotError::PayloadChecksum.into());
        }
        let mut subs = Vec::with_capacity(links as usize);
        let mut at = CHAIN_HEADER_LEN;
        for i in 0..links as usize {
            if end - at < 8 {
                return Err(SnapshotError::Truncated {
                    expected: at as u64 + 8,
                    found: end as u64,
                }
                .into());
            }
            let len = u64_at(at);
            at += 8;
            if len > (end - at) as u64 {
                return Err(SnapshotError::Truncated {
                    expected: at as u64 + len,
                    found: end as u64,
                }
                .into());
            }
            let (filter, _) = BlockedBloom::from_bytes(&bytes[at..at + len as usize])?;
            at += len as usize;
            let (capacity, target_fpr) = Self::link_design(&options, i);
            let want = sizing::blocked(capacity, target_fpr, 256)
                .map_err(|e| bad("links", e.to_string()))?;
            if filter.params() != want || filter.seed() != options.seed {
                return Err(bad(
                    "links",
                    format!("link {i} does not have the shape or seed its options give it"),
                ));
            }
            subs.push(Sub {
                filter,
                capacity,
                target_fpr,
            });
        }
        if at != end {
            return Err(SnapshotError::TrailingBytes((end - at) as u64).into());
        }
        Ok(Self { options, subs })
    }

    /// Writes the chain to `path` atomically (temporary file, fsync,
    /// rename).
    ///
    /// # Errors
    /// [`Error::Io`].
    pub fn save(&self, path: &Path) -> Result<()> {
        snapshot::write_bytes_atomic(path, &self.to_bytes())
    }

    /// Reads and verifies a chain that [`ScalableBloom::save`] wrote.
    ///
    /// # Errors
    /// [`Error::Io`] or [`Error::Snapshot`].
    pub fn load(path: &Path) -> Result<Self> {
        Self::from_bytes(&snapshot::read_file(path)?)
    }

    /// Sub-filter `i` hashes with a derived pair, so the links' false
    /// positives are independent.
    #[inline]
    fn link_hash(h: HashPair, i: usize) -> HashPair {
        if i == 0 {
            return h;
        }
        let salt = (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        HashPair {
            h1: splitmix64(h.h1 ^ salt),
            h2: splitmix64(h.h2 ^ salt),
        }
    }

    /// Adds a key unless the chain already (probably) holds it; returns true
    /// when it was added. Adds a new sub-filter once the newest is full.
    ///
    /// # Errors
    /// [`Error::TooLarge`] when the next sub-filter cannot be allocated.
    pub fn insert<K: BloomKey + ?Sized>(&mut self, key: &K) -> Result<bool> {
        let h = key.hash_pair(self.options.seed);
        if self.contains_hash(h) {
            return Ok(false);
        }
        let last = self.subs.len() - 1;
        let sub = &mut self.subs[last];
        sub.filter.insert_hash(Self::link_hash(h, last));
        if sub.filter.items() >= sub.capacity {
            self.grow()?;
        }
        Ok(true)
    }

    /// The chain, oldest first.
    #[must_use]
    pub fn chain(&self) -> Vec<SubFilterInfo> {
        self.subs
            .iter()
            .map(|s| SubFilterInfo {
                capacity: s.capacity,
                items: s.filter.items(),
                target_fpr: s.target_fpr,
                expected_fpr: s.filter.expected_fpr(s.filter.items()),
                bits: s.filter.bits(),
                hashes: s.filter.hashes(),
                bytes: s.filter.bytes(),
            })
            .collect()
    }

    /// The options the chain was made with.
    #[must_use]
    pub const fn options(&self) -> &ScalableOptions {
        &self.options
    }
}

impl Filter for ScalableBloom {
    fn seed(&self) -> u64 {
        self.options.seed
    }
    fn contains_hash(&self, h: HashPair) -> bool {
        self.subs
            .iter()
            .enumerate()
            .rev()
            .any(|(i, s)| s.filter.contains_hash(Self::link_hash(h, i)))
    }
    /// Total bits over the chain.
    fn bits(&self) -> u64 {
        self.subs.iter().map(|s| s.filter.bits()).sum()
    }
    /// Hash count of the newest sub-filter.
    fn hashes(&self) -> u32 {
        self.subs.last().map_or(0, |s| s.filter.hashes())
    }
    fn items(&self) -> u64 {
        self.subs.iter().map(|s| s.filter.items()).sum()
    }
    fn bytes(&self) -> usize {
        self.subs.iter().map(|s| s.filter.bytes()).sum()
    }
    fn count_ones(&self) -> u64 {
        self.subs.iter().map(|s| s.filter.count_ones()).sum()
    }
    /// The compound rate of the chain at its current load,
    /// `1 - Π(1 - fpr_i)`; the argument is ignored, since a chain's load
    /// is spread over its links as they filled.
    fn expected_fpr(&self, _n_items: u64) -> f64 {
        1.0 - self
            .subs
            .iter()
            .map(|s| 1.0 - s.filter.expected_fpr(s.filter.items()))
            .product::<f64>()
    }
    fn estimated_items(&self) -> f64 {
        self.subs.iter().map(|s| s.filter.estimated_items()).sum()
    }
}
