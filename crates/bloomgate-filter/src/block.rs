//! The blocked scheme shared by every blocked filter: which block a key goes
//! to, and which positions inside that block it uses.
//!
//! * Block: `⌊h1 · blocks / 2^64⌋` (Lemire's multiply-shift range reduction;
//!   no division, no bias worth measuring).
//! * Positions: `h2` is cut into `⌊64 / log2(B)⌋` slices of `log2(B)` bits
//!   (seven 9-bit slices for 512-bit blocks, nine 7-bit slices for 128), low
//!   bits first; when a key needs more positions than one word holds, the
//!   next word is `splitmix64` of the previous one. The bits of a good 64-bit
//!   hash are independent, so the positions are too, and the exact blocked
//!   formula holds for the measured rate.
//!
//! These definitions are part of the snapshot format (hash id 1): changing
//! them changes which bits a stored filter has set.

use crate::hash::splitmix64;

/// The block a key with first hash `h1` goes to, in `0..blocks`.
#[inline(always)]
pub(crate) fn block_index(h1: u64, blocks: u64) -> usize {
    ((u128::from(h1) * u128::from(blocks)) >> 64) as usize
}

/// The in-block positions of a key, in hash order.
#[derive(Debug, Clone)]
pub(crate) struct Positions {
    word: u64,
    cur: u64,
    left: u32,
    per_word: u32,
    log2: u32,
    remaining: u32,
}

impl Positions {
    /// `k` positions in `0..2^log2` from `h2`.
    #[inline(always)]
    pub(crate) const fn new(h2: u64, k: u32, log2: u32) -> Self {
        Self {
            word: h2,
            cur: h2,
            left: 64 / log2,
            per_word: 64 / log2,
            log2,
            remaining: k,
        }
    }
}

impl Iterator for Positions {
    type Item = u32;

    #[inline(always)]
    fn next(&mut self) -> Option<u32> {
        if self.remaining == 0 {
            return None;
        }
        self.remaining -= 1;
        if self.left == 0 {
            self.word = splitmix64(self.word);
            self.cur = self.word;
            self.left = self.per_word;
        }
        self.left -= 1;
        let p = (self.cur & ((1 << self.log2) - 1)) as u32;
        self.cur >>= self.log2;
        Some(p)
    }
}

/// The bit mask a key sets in a block of `W` words (`64·W` bits).
#[inline(always)]
pub(crate) fn mask<const W: usize>(h2: u64, k: u32) -> [u64; W] {
    let log2 = (64 * W).trailing_zeros();
    let mut m = [0u64; W];
    for p in Positions::new(h2, k, log2) {
        m[(p >> 6) as usize] |= 1u64 << (p & 63);
    }
    m
}

/// True when every bit of `m` is set in `block`.
#[inline(always)]
pub(crate) fn covers<const W: usize>(block: &[u64; W], m: &[u64; W]) -> bool {
    let mut missing = 0u64;
    for w in 0..W {
        missing |= m[w] & !block[w];
    }
    missing == 0
}

/// ORs `m` into `block`; true when at least one bit was newly set.
#[inline(always)]
pub(crate) fn apply<const W: usize>(block: &mut [u64; W], m: &[u64; W]) -> bool {
    let mut fresh = 0u64;
    for w in 0..W {
        fresh |= m[w] & !block[w];
        block[w] |= m[w];
    }
    fresh != 0
}

/// Issues a read prefetch for the cache line holding `r`.
#[inline(always)]
pub(crate) fn prefetch<T>(r: &T) {
    #[cfg(target_arch = "x86_64")]
    {
        use core::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        let p = std::ptr::from_ref(r).cast::<i8>();
        // SAFETY: a prefetch is only a hint: it never faults and reads
        // nothing into the program, and SSE is part of the x86_64 baseline.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(p) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = r;
    }
}

/// How many keys the batch APIs hash and prefetch ahead before probing.
pub(crate) const BATCH: usize = 32;
