//! The blocked schemes: which block a key goes to, and which positions
//! inside that block it uses.
//!
//! * 256-bit blocks (the bit filters): block `⌊(h1 >> 32) · blocks / 2^32⌋`
//!   (Lemire's multiply-shift range reduction on the high half of `h1`). The
//!   block is eight 32-bit lanes; the `i`-th of the key's `k` bits goes to
//!   lane `i mod 8`, at bit `(lo · SALT_i) >> 27`, where `lo` is the low half
//!   of `h1` and `SALT_i` fixed odd constants (the first eight are Parquet's
//!   split-block constants). The block index and the bits use disjoint
//!   halves of one 64-bit hash, so integer keys cost one splitmix64; the mask
//!   is one multiply, one shift and one variable shift over eight lanes
//!   (AVX2, see `simd`), the probe one 32-byte load.
//! * 128-position blocks (counting filters and their projection): block
//!   `⌊h1 · blocks / 2^64⌋`; positions from [`inblock`] cut into nine 7-bit
//!   slices, low bits first; past nine positions the next hash word is
//!   `splitmix64` of the previous.
//! * 512-bit blocks (one whole 64-byte line, for low rates): block as for
//!   256 (high half of `h1`); the `i`-th position is the top nine bits of
//!   `lo · SALT_i` (low half of `h1`), anywhere in the line (not one per
//!   lane), which at `p = 1e-4` needs ~16% fewer bits than lanes of 32
//!   (sizing's exact model of uniform positions; the FPR tests check the
//!   multiply-shift positions against it).
//!
//! [`crate::sizing::blocked_fpr`] models each layout exactly. These
//! definitions are part of the snapshot format (hash id 1): changing them
//! changes which bits a stored filter has set.

use crate::hash::{splitmix64, HashPair};
use crate::storage::AtomicLine;

mod batch;
mod simd;

pub use batch::l2_cache_bytes;
pub(crate) use batch::{
    insert_batch256, insert_batch_with, probe_batch256, probe_batch_with, set_batch256,
    set_batch_with,
};

/// Multipliers for the 256-bit layout: bit `i` of a key uses `SALTS[i]`.
pub(crate) const SALTS: [u32; 32] = [
    0x47b6_137b,
    0x4497_4d91,
    0x8824_ad5b,
    0xa2b7_289d,
    0x7054_95c7,
    0x2df1_424b,
    0x9efc_4947,
    0x5c6b_fb31,
    0xb39e_e81b,
    0x7784_14c9,
    0x5b55_127b,
    0x9e2c_b53d,
    0xfbae_8d6b,
    0xf869_61f9,
    0xa7b9_1e1f,
    0xb5a0_1107,
    0x2f49_5e27,
    0x7332_357f,
    0xe16f_dda7,
    0x4604_acd7,
    0x2d84_7267,
    0x4b5d_85b5,
    0x349c_de51,
    0xea2d_7e95,
    0x47f4_69c9,
    0xa21f_b3cb,
    0xf259_0111,
    0x89aa_14f1,
    0xb813_72db,
    0x8129_7c27,
    0x53b0_dd0d,
    0xf322_6c6f,
];

/// The 256-bit block a key with first hash `h1` goes to, in `0..blocks`
/// (`blocks ≤ 2^32`).
#[inline(always)]
pub(crate) const fn block_index256(h1: u64, blocks: u64) -> usize {
    (((h1 >> 32) * blocks) >> 32) as usize
}

/// The bit (`0..32`) that the `i`-th position of a key sets in its lane.
#[inline(always)]
const fn lane_bit(lo: u32, i: usize) -> u32 {
    lo.wrapping_mul(SALTS[i]) >> 27
}

/// The mask a key sets in a 256-bit block, as four 64-bit words (lane `j` is
/// bits `32·(j mod 2)..` of word `j / 2`, the little-endian layout of eight
/// u32 lanes). Scalar version of the AVX2 mask in `simd`.
#[inline(always)]
pub(crate) fn mask256_scalar(h1: u64, k: u32) -> [u64; 4] {
    let lo = h1 as u32;
    let mut m = [0u64; 4];
    for i in 0..k as usize {
        let lane = i % 8;
        m[lane / 2] |= 1u64 << (lane_bit(lo, i) + 32 * (lane % 2) as u32);
    }
    m
}

/// The in-block bit positions (`0..256`) of a key, in hash order.
pub(crate) fn positions256(h1: u64, k: u32) -> impl Iterator<Item = u32> {
    let lo = h1 as u32;
    (0..k as usize).map(move |i| (i % 8) as u32 * 32 + lane_bit(lo, i))
}

/// Which 256-bit query kernel a filter runs, picked once per filter by
/// [`Kernel256::pick`]: the AVX2 variants exist only on CPUs with AVX2.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kernel256 {
    /// AVX2, `k = 8` (one mask round, no branch on `k`).
    Avx2Eight,
    /// AVX2, any `k`.
    Avx2,
    /// Scalar, any CPU.
    Portable,
}

impl Kernel256 {
    /// The fastest kernel this CPU runs for `k` hashes.
    pub(crate) fn pick(k: u32) -> Self {
        match (has_avx2(), k) {
            (true, 8) => Self::Avx2Eight,
            (true, _) => Self::Avx2,
            (false, _) => Self::Portable,
        }
    }

    /// True when the CPU has AVX2 (what the other kernels of a filter,
    /// batch and 512-bit, are chosen by).
    pub(crate) fn avx2(self) -> bool {
        self != Self::Portable
    }
}

/// The whole query of a key with first hash `h1` against 256-bit blocks:
/// the index, the load and the test, in one call into the filter's kernel.
#[inline(always)]
pub(crate) fn contains256<S: Blocks256 + ?Sized>(
    kernel: Kernel256,
    store: &S,
    blocks: u64,
    h1: u64,
    k: u32,
) -> bool {
    match kernel {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Kernel256::pick` makes the AVX2 variants only when the
        // CPU has AVX2, and nothing else makes them.
        Kernel256::Avx2Eight => unsafe { simd::contains256_k8_avx2(store, blocks, h1) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        Kernel256::Avx2 => unsafe { simd::contains256_avx2(store, blocks, h1, k) },
        _ => covers(
            &store.load(block_index256(h1, blocks)),
            &mask256_scalar(h1, k),
        ),
    }
}

/// Sets a key's bits in block `idx` of atomic lines: one atomic read of
/// the block, then [`or_missing`]; true when some bit was clear when the
/// block was read.
#[inline(always)]
pub(crate) fn set256_atomic(
    kernel: Kernel256,
    lines: &[AtomicLine],
    idx: usize,
    h1: u64,
    k: u32,
) -> bool {
    or_missing(lines, idx, missing256(kernel, lines, idx, h1, k))
}

/// ORs `missing` into block `idx` of atomic lines with a relaxed
/// `fetch_or` per word that lacks bits (a key already present writes
/// nothing); true when some word did. The old value is not asked for: x86
/// has no fetch-or that returns it, and asking would turn `lock or` into a
/// compare-exchange loop per word.
#[inline(always)]
pub(crate) fn or_missing(lines: &[AtomicLine], idx: usize, missing: [u64; 4]) -> bool {
    let half = (idx % 2) * 4;
    let mut fresh = 0;
    for (a, &bits) in lines[idx / 2].0[half..half + 4].iter().zip(&missing) {
        if bits != 0 {
            a.fetch_or(bits, std::sync::atomic::Ordering::Relaxed);
            fresh |= bits;
        }
    }
    fresh != 0
}

/// The bits of a key's mask that block `idx` lacks, as four words: what
/// an insert into atomics has to OR in (nothing when all are zero).
#[inline(always)]
fn missing256<S: Blocks256 + ?Sized>(
    kernel: Kernel256,
    store: &S,
    idx: usize,
    h1: u64,
    k: u32,
) -> [u64; 4] {
    #[cfg(target_arch = "x86_64")]
    if kernel.avx2() {
        // SAFETY: `Kernel256::pick` makes the AVX2 variants only when the
        // CPU has AVX2, and nothing else makes them.
        return unsafe { simd::missing256_avx2(store, idx, h1, k) };
    }
    let _ = kernel;
    let (block, m) = (store.load(idx), mask256_scalar(h1, k));
    core::array::from_fn(|w| m[w] & !block[w])
}

/// True when every bit of the key's mask is set in `block`; `avx2` must
/// come from [`has_avx2`].
#[inline(always)]
pub(crate) fn covers256_with(avx2: bool, block: &[u64; 4], h1: u64, k: u32) -> bool {
    #[cfg(target_arch = "x86_64")]
    if avx2 {
        // SAFETY: `avx2` is true only when the CPU has AVX2.
        return unsafe { simd::covers256_avx2(block, h1, k) };
    }
    let _ = avx2;
    covers(block, &mask256_scalar(h1, k))
}

/// ORs the key's mask into `block`; true when a bit was newly set. `avx2`
/// must come from [`has_avx2`].
#[inline(always)]
pub(crate) fn apply256_with(avx2: bool, block: &mut [u64; 4], h1: u64, k: u32) -> bool {
    #[cfg(target_arch = "x86_64")]
    if avx2 {
        // SAFETY: `avx2` is true only when the CPU has AVX2.
        return unsafe { simd::apply256_avx2(block, h1, k) };
    }
    let _ = avx2;
    apply(block, &mask256_scalar(h1, k))
}

/// The hash that places a key's positions inside a 128-position block,
/// derived from `h1` by a multiply-xorshift remix (the block index takes
/// `h1`'s top bits through the 64-bit range reduction).
#[inline(always)]
pub(crate) const fn inblock(h: HashPair) -> u64 {
    let y = (h.h1 ^ (h.h1 >> 32)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    y ^ (y >> 29)
}

/// The 128-position block a key with first hash `h1` goes to, in `0..blocks`.
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

/// The mask a key sets in a 128-position block of 2 words.
#[inline(always)]
pub(crate) fn mask128(h: HashPair, k: u32) -> [u64; 2] {
    let mut m = [0u64; 2];
    for p in Positions::new(inblock(h), k, 7) {
        m[(p >> 6) as usize] |= 1u64 << (p & 63);
    }
    m
}

/// The in-block positions (`0..512`) of a key in a 512-bit block: the top
/// nine bits of `lo · SALT_i`, `lo` the low half of `h1` (the block index
/// takes the high half).
#[inline(always)]
pub(crate) fn positions512(h1: u64, k: u32) -> impl Iterator<Item = u32> {
    let lo = h1 as u32;
    (0..k as usize).map(move |i| lo.wrapping_mul(SALTS[i]) >> 23)
}

/// True when every position of the key is set in a 512-bit block,
/// branch-free: the `k` positions are independent multiplies, so they
/// overlap instead of forming a chain.
#[inline(always)]
pub(crate) fn covers512(block: &[u64; 8], h1: u64, k: u32) -> bool {
    let lo = h1 as u32;
    let mut missing = 0u64;
    for &salt in &SALTS[..k as usize] {
        let p = lo.wrapping_mul(salt) >> 23;
        missing |= !(block[(p >> 6) as usize] >> (p & 63)) & 1;
    }
    missing == 0
}

/// [`covers512`]: AVX2 when `avx2` (which must come from [`has_avx2`]).
#[inline(always)]
pub(crate) fn covers512_with(avx2: bool, block: &[u64; 8], h1: u64, k: u32) -> bool {
    #[cfg(target_arch = "x86_64")]
    if avx2 {
        // SAFETY: `avx2` is true only when the CPU has AVX2.
        return unsafe { simd::covers512_avx2(block, h1, k) };
    }
    let _ = avx2;
    covers512(block, h1, k)
}

/// Sets the key's positions in a 512-bit block, bit by bit (no mask is
/// built, so no chain of read-modify-writes through the stack); true when
/// a bit was newly set.
#[inline(always)]
pub(crate) fn apply512(block: &mut [u64; 8], h1: u64, k: u32) -> bool {
    let lo = h1 as u32;
    let mut fresh = 0u64;
    for &salt in &SALTS[..k as usize] {
        let p = lo.wrapping_mul(salt) >> 23;
        let (w, bit) = ((p >> 6) as usize, 1u64 << (p & 63));
        fresh |= bit & !block[w];
        block[w] |= bit;
    }
    fresh != 0
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

/// The panic of a block index past the end, out of line so that the
/// kernels that check it keep no stack frame for its message.
#[cold]
#[inline(never)]
pub(crate) fn block_out_of_bounds(idx: usize, blocks: usize) -> ! {
    panic!("block {idx} out of bounds ({blocks} blocks)")
}

/// How many keys the batch APIs hash and prefetch ahead before probing.
pub(crate) const BATCH: usize = 32;

/// 256-bit blocks the probes read: plain words or atomics.
pub(crate) trait Blocks256 {
    /// True for atomics that other threads may write meanwhile: the AVX2
    /// kernels read them with atomic loads only (see `simd`), never with
    /// one plain wide load.
    const SHARED: bool;
    /// Block `idx`'s four words (relaxed loads for atomics).
    fn load(&self, idx: usize) -> [u64; 4];
    /// The address of block 0's first word, 32-byte aligned; block `idx`
    /// starts `32 · idx` bytes in.
    fn base_ptr(&self) -> *const u64;
    /// How many blocks there are.
    fn block_count(&self) -> usize;
    /// Prefetches block `idx`'s cache line.
    fn prefetch(&self, idx: usize);
}

impl Blocks256 for [[u64; 4]] {
    const SHARED: bool = false;
    #[inline(always)]
    fn load(&self, idx: usize) -> [u64; 4] {
        self[idx]
    }
    #[inline(always)]
    fn base_ptr(&self) -> *const u64 {
        self.as_ptr().cast()
    }
    #[inline(always)]
    fn block_count(&self) -> usize {
        self.len()
    }
    #[inline(always)]
    fn prefetch(&self, idx: usize) {
        prefetch(&self[idx]);
    }
}
