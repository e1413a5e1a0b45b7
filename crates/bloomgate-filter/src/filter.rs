//! The read-side API every filter shares.

use crate::hash::{BloomKey, HashPair};

/// What every filter (heap, concurrent, counting, scalable and mmap'd views)
/// can answer.
///
/// A "no" from [`Filter::contains`] is exact: the key was never inserted. A
/// "yes" means "probably": it is wrong at about [`Filter::expected_fpr`] of the
/// time for keys that were never inserted.
///
/// ```
/// use bloomgate_filter::{BlockedBloom, ClassicBloom, Filter};
/// fn admits<F: Filter>(f: &F, id: u64) -> bool {
///     f.contains(&id)
/// }
/// let mut blocked = BlockedBloom::with_fpr(1000, 0.01).unwrap();
/// let mut classic = ClassicBloom::with_fpr(1000, 0.01).unwrap();
/// blocked.insert(&7u64);
/// classic.insert(&7u64);
/// assert!(admits(&blocked, 7) && admits(&classic, 7));
/// assert_eq!(blocked.items(), 1);
/// ```
pub trait Filter {
    /// The seed keys are hashed with.
    fn seed(&self) -> u64;

    /// Membership test for a key that was already hashed with [`Filter::seed`].
    fn contains_hash(&self, h: HashPair) -> bool;

    /// Membership test: false means the key was certainly never inserted.
    #[inline]
    fn contains<K: BloomKey + ?Sized>(&self, key: &K) -> bool
    where
        Self: Sized,
    {
        self.contains_hash(key.hash_pair(self.seed()))
    }

    /// Number of positions (bits, or counters for a counting filter), `m`.
    fn bits(&self) -> u64;

    /// Positions set per key, `k`.
    fn hashes(&self) -> u32;

    /// Number of `insert` calls so far (repeats included).
    fn items(&self) -> u64;

    /// Bytes of position storage.
    fn bytes(&self) -> usize;

    /// Number of set positions.
    fn count_ones(&self) -> u64;

    /// The false-positive rate this filter has once it holds `n_items` keys.
    fn expected_fpr(&self, n_items: u64) -> f64;

    /// The capacity and rate the filter was sized for, when known.
    fn design(&self) -> Option<crate::sizing::Design> {
        None
    }

    /// True when more items were added than the filter was sized for (or,
    /// with no recorded design, when more than half its positions are set).
    fn past_capacity(&self) -> bool {
        match self.design() {
            Some(d) => self.items() > d.capacity,
            None => self.fill_ratio() > 0.5,
        }
    }

    /// Fraction of positions set, in `[0, 1]`. Past one half, the rate
    /// degrades quickly.
    fn fill_ratio(&self) -> f64 {
        self.count_ones() as f64 / self.bits() as f64
    }

    /// Estimated number of distinct keys from the fill ratio
    /// (`-(m/k)·ln(1 - X/m)`, Swamidass and Baldi). Infinite when every
    /// position is set.
    fn estimated_items(&self) -> f64 {
        let m = self.bits() as f64;
        let x = self.count_ones() as f64;
        -(m / f64::from(self.hashes())) * (1.0 - x / m).ln()
    }
}
