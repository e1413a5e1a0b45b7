//! The blocked scheme shared by every blocked filter: which block a key goes
//! to, and which positions inside that block it uses.
//!
//! * Block: `⌊h1 · blocks / 2^64⌋` (Lemire's multiply-shift range reduction;
//!   no division, no bias worth measuring).
//! * In-block hash: `y = (h1 ^ h1>>32) · 0x9e3779b97f4a7c15; y ^ y>>29`
//!   ([`inblock`]); `h2` is not used, so integer keys cost one splitmix64.
//! * Positions in a 512-bit block (eight 64-bit words): the `i`-th of the
//!   key's `k` bits goes to word `i mod 8`, at the bit given by the `i mod 8`-th
//!   6-bit slice (low bits first) of hash word `⌊i/8⌋`, where hash word 0 is
//!   `h2` and each next one is `splitmix64` of the previous. For `k ≤ 8` a
//!   key sets at most one bit per word, so the mask is eight independent
//!   shifts of one hash: no loop-carried dependency, no branch.
//! * Positions in a 128-position block (counting filters and their
//!   projection): `h2` is cut into nine 7-bit slices, low bits first; past
//!   nine positions the next hash word is `splitmix64` of the previous.
//!
//! The bits of a good 64-bit hash are independent, so positions are too,
//! and [`crate::sizing::blocked_fpr`] models each layout exactly.
//!
//! These definitions are part of the snapshot format (hash id 1): changing
//! them changes which bits a stored filter has set.

use crate::hash::{splitmix64, HashPair};

/// The hash that places a key's bits inside its block, derived from `h1`
/// alone by a multiply-xorshift remix, so a blocked filter needs one 64-bit
/// hash per key (for integer keys the compiler then drops `h2` entirely).
/// The block index takes `h1`'s top bits; the remix spreads all of `h1`'s
/// bits over the in-block hash.
#[inline(always)]
pub(crate) const fn inblock(h: HashPair) -> u64 {
    let y = (h.h1 ^ (h.h1 >> 32)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    y ^ (y >> 29)
}

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

/// The mask a key sets in a 512-bit block (see the module docs): AVX2 when
/// the CPU has it, scalar otherwise.
#[inline(always)]
pub(crate) fn mask512(h2: u64, k: u32) -> [u64; 8] {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 support was just checked.
        return unsafe { crate::simd::mask512_avx2(h2, k) };
    }
    mask512_scalar(h2, k)
}

/// The portable version of [`mask512`].
#[inline(always)]
pub(crate) fn mask512_scalar(h2: u64, k: u32) -> [u64; 8] {
    let mut m = [0u64; 8];
    let mut h = h2;
    let mut left = k;
    loop {
        let take = left.min(8) as usize;
        for (w, word) in m.iter_mut().enumerate() {
            let on = u64::from(w < take);
            *word |= on << ((h >> (6 * w)) & 63);
        }
        if left <= 8 {
            return m;
        }
        left -= 8;
        h = splitmix64(h);
    }
}

/// The in-block bit positions (`0..512`) of a 512-bit block key, in hash order.
pub(crate) fn positions512(h2: u64, k: u32) -> impl Iterator<Item = u32> {
    let mut h = h2;
    (0..k).map(move |i| {
        if i > 0 && i % 8 == 0 {
            h = splitmix64(h);
        }
        let w = i % 8;
        w * 64 + ((h >> (6 * w)) & 63) as u32
    })
}

/// The mask a key sets in a 128-position block of 2 words.
#[inline(always)]
pub(crate) fn mask128(h2: u64, k: u32) -> [u64; 2] {
    let mut m = [0u64; 2];
    for p in Positions::new(h2, k, 7) {
        m[(p >> 6) as usize] |= 1u64 << (p & 63);
    }
    m
}

/// True when this CPU has AVX2 (cached by the standard library).
#[inline(always)]
pub(crate) fn has_avx2() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx2")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// True when every bit of the key's 512-bit mask is set in `line`; `avx2`
/// must come from [`has_avx2`].
#[inline(always)]
pub(crate) fn covers512_with(avx2: bool, line: &crate::bitmap::Line, h2: u64, k: u32) -> bool {
    #[cfg(target_arch = "x86_64")]
    if avx2 {
        // SAFETY: `avx2` is true only when the CPU has AVX2.
        return unsafe { crate::simd::covers512_avx2(line, h2, k) };
    }
    let _ = avx2;
    covers(&line.0, &mask512_scalar(h2, k))
}

/// ORs the key's 512-bit mask into `line`; true when a bit was newly set.
/// `avx2` must come from [`has_avx2`].
#[inline(always)]
pub(crate) fn apply512_with(avx2: bool, line: &mut crate::bitmap::Line, h2: u64, k: u32) -> bool {
    #[cfg(target_arch = "x86_64")]
    if avx2 {
        // SAFETY: `avx2` is true only when the CPU has AVX2.
        return unsafe { crate::simd::apply512_avx2(line, h2, k) };
    }
    let _ = avx2;
    apply(&mut line.0, &mask512_scalar(h2, k))
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
pub(crate) const BATCH: usize = 16;
