//! Key hashing: every key becomes a [`HashPair`] of two 64-bit hashes.
//!
//! * Integer keys (`u64`, `u32`, `i64`, …) go through the splitmix64 finaliser:
//!   `h1 = splitmix64(key ^ seed)`, `h2 = splitmix64(key ^ seed ^ 0x94d0_49bb_1331_11eb)`.
//!   With seed 0 this is exactly the scheme of the seckill service's
//!   `BloomFilter.h`, so a classic filter reproduces its bit positions.
//! * Byte and string keys go through XXH3-128 with the seed; `h1` is the low
//!   half and `h2` the high half.
//!
//! # Stability guarantee
//!
//! For a given key and seed, [`BloomKey::hash_pair`] returns the same pair on
//! every platform (it is defined on the key's value, little-endian where bytes
//! are involved) and in every release of this crate with snapshot format
//! version 1 and hash id [`HASH_ID_V1`]. Any change to it gets a new hash id,
//! so an old snapshot is never read with the wrong positions. The test vectors
//! in `tests/hash_vectors.rs` pin this down.

/// Identifier of the hash scheme described in this module, stored in snapshots.
pub const HASH_ID_V1: u8 = 1;

/// The constant XOR-ed into an integer key to derive the second hash.
pub const H2_SALT: u64 = 0x94d0_49bb_1331_11eb;

/// The splitmix64 finaliser: a cheap bijective mixer that spreads any 64-bit
/// input evenly over the output.
#[inline]
#[must_use]
pub const fn splitmix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// Two 64-bit hashes of one key, from which every filter derives its positions.
///
/// ```
/// use bloomgate_filter::{BlockedBloom, BloomKey, Filter, HashPair};
/// let f = {
///     let mut f = BlockedBloom::with_fpr(1000, 0.01).unwrap();
///     f.insert(&42u64);
///     f
/// };
/// // Hash once, probe with the pair: the same answer as `contains`.
/// let h: HashPair = 42u64.hash_pair(f.seed());
/// assert_eq!(h, HashPair::from_u64(42, f.seed()));
/// assert!(f.contains_hash(h));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct HashPair {
    /// The first hash: the base position (classic) or the block (blocked).
    pub h1: u64,
    /// The second hash: the step (classic) or the in-block positions (blocked).
    pub h2: u64,
}

impl HashPair {
    /// Hashes an integer key with the splitmix64 scheme.
    #[inline]
    #[must_use]
    pub const fn from_u64(key: u64, seed: u64) -> Self {
        let x = key ^ seed;
        Self {
            h1: splitmix64(x),
            h2: splitmix64(x ^ H2_SALT),
        }
    }

    /// Hashes a byte string with XXH3-128.
    #[inline]
    #[must_use]
    pub fn from_bytes(bytes: &[u8], seed: u64) -> Self {
        let h = xxhash_rust::xxh3::xxh3_128_with_seed(bytes, seed);
        Self {
            h1: h as u64,
            h2: (h >> 64) as u64,
        }
    }
}

/// A value that can be put in a filter.
///
/// Implemented for the unsigned and signed integers (hashed by value, so
/// `5u32` and `5u64` are the same key; negative signed values are hashed as
/// their two's-complement `u64`), and for strings and byte slices (hashed by
/// content, so `"5"` is a different key from `5u64`).
///
/// ```
/// use bloomgate_filter::{BlockedBloom, BloomKey, Filter, HashPair};
/// // A key type of your own: hash its canonical bytes.
/// struct UserId(String);
/// impl BloomKey for UserId {
///     fn hash_pair(&self, seed: u64) -> HashPair {
///         HashPair::from_bytes(self.0.as_bytes(), seed)
///     }
/// }
/// let mut users = BlockedBloom::with_fpr(1000, 0.01).unwrap();
/// users.insert(&UserId("u1001".into()));
/// assert!(users.contains(&UserId("u1001".into())));
/// assert!(users.contains("u1001")); // the same bytes, the same key
/// ```
pub trait BloomKey {
    /// The two hashes of this key under `seed`.
    fn hash_pair(&self, seed: u64) -> HashPair;
}

macro_rules! int_key {
    ($($t:ty),*) => {$(
        impl BloomKey for $t {
            #[inline]
            fn hash_pair(&self, seed: u64) -> HashPair {
                #[allow(clippy::cast_sign_loss, clippy::cast_lossless)]
                HashPair::from_u64(*self as u64, seed)
            }
        }
    )*};
}
int_key!(u8, u16, u32, u64, usize, i8, i16, i32, i64, isize);

impl BloomKey for [u8] {
    #[inline]
    fn hash_pair(&self, seed: u64) -> HashPair {
        HashPair::from_bytes(self, seed)
    }
}

impl BloomKey for str {
    #[inline]
    fn hash_pair(&self, seed: u64) -> HashPair {
        HashPair::from_bytes(self.as_bytes(), seed)
    }
}

impl BloomKey for String {
    #[inline]
    fn hash_pair(&self, seed: u64) -> HashPair {
        HashPair::from_bytes(self.as_bytes(), seed)
    }
}

impl BloomKey for Vec<u8> {
    #[inline]
    fn hash_pair(&self, seed: u64) -> HashPair {
        HashPair::from_bytes(self, seed)
    }
}

impl<const N: usize> BloomKey for [u8; N] {
    #[inline]
    fn hash_pair(&self, seed: u64) -> HashPair {
        HashPair::from_bytes(self, seed)
    }
}

impl<T: BloomKey + ?Sized> BloomKey for &T {
    #[inline]
    fn hash_pair(&self, seed: u64) -> HashPair {
        (**self).hash_pair(seed)
    }
}

impl BloomKey for HashPair {
    /// A pre-computed pair is used as is; the seed was applied when it was made.
    #[inline]
    fn hash_pair(&self, _seed: u64) -> HashPair {
        *self
    }
}
