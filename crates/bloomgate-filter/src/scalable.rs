//! A scalable Bloom filter: a chain of blocked filters that grows with the data.

use crate::blocked::BlockedBloom;
use crate::error::{Error, Result};
use crate::filter::Filter;
use crate::hash::{splitmix64, BloomKey, HashPair};
use crate::sizing;

/// How a [`ScalableBloom`] grows.
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
        let mut s = Self {
            options,
            subs: Vec::new(),
        };
        s.grow()?;
        Ok(s)
    }

    fn grow(&mut self) -> Result<()> {
        let o = &self.options;
        let i = self.subs.len() as i32;
        let capacity = (o.initial_capacity as f64 * o.growth.powi(i)).ceil() as u64;
        let target_fpr = o.fpr * (1.0 - o.tightening) * o.tightening.powi(i);
        let params = sizing::blocked(capacity, target_fpr, 256)?;
        let filter = BlockedBloom::new(params, o.seed)?;
        self.subs.push(Sub {
            filter,
            capacity,
            target_fpr,
        });
        Ok(())
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
