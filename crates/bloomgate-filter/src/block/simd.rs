//! The AVX2 versions of the 256-bit block mask, probe and insert, chosen at
//! run time.
//!
//! Every function here computes exactly what its scalar twin in `block`
//! computes (a unit test checks it on random inputs). ARCHITECTURE.md lists
//! every module with `unsafe` code.

#[cfg(target_arch = "x86_64")]
use core::arch::x86_64::{
    __m256i, _mm256_and_si256, _mm256_blendv_epi8, _mm256_cmpgt_epi32, _mm256_loadu_si256,
    _mm256_mullo_epi32, _mm256_or_si256, _mm256_permutevar8x32_epi32, _mm256_set1_epi32,
    _mm256_set_epi64x, _mm256_setr_epi32, _mm256_setzero_si256, _mm256_sllv_epi32,
    _mm256_srli_epi32, _mm256_storeu_si256, _mm256_testc_si256,
};

#[cfg(target_arch = "x86_64")]
use core::arch::asm;
#[cfg(target_arch = "x86_64")]
use core::arch::x86_64::{__m128i, _mm256_andnot_si256, _mm256_set_m128i};

#[cfg(target_arch = "x86_64")]
use crate::block::{Blocks256, SALTS};
#[cfg(target_arch = "x86_64")]
use crate::storage::AtomicLine;

/// The key's mask over eight 32-bit lanes: lane `j` of round `r` gets bit
/// `(lo · SALTS[8r + j]) >> 27`; lanes past `k` in the last round stay empty.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
fn mask_reg(h1: u64, k: u32) -> __m256i {
    let round = |r: usize| mask_round(h1 as u32, r);
    if k == 8 {
        return round(0);
    }
    let lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    let mut m = _mm256_setzero_si256();
    let mut left = k;
    let mut r = 0;
    loop {
        let take = _mm256_set1_epi32(left.min(8) as i32);
        m = _mm256_or_si256(
            m,
            _mm256_and_si256(round(r), _mm256_cmpgt_epi32(take, lanes)),
        );
        if left <= 8 {
            return m;
        }
        left -= 8;
        r += 1;
    }
}

/// Round `r` (`r < 4`) of the mask: lane `j` gets bit
/// `(lo · SALTS[8r + j]) >> 27`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
fn mask_round(lo: u32, r: usize) -> __m256i {
    // SAFETY: `SALTS` has 32 entries and `r < 4`, so the 8 u32 read from
    // `8r` are in bounds; the load has no alignment requirement.
    let salts = unsafe { _mm256_loadu_si256(SALTS.as_ptr().add(8 * r).cast()) };
    let lo = _mm256_set1_epi32(lo as i32);
    _mm256_sllv_epi32(
        _mm256_set1_epi32(1),
        _mm256_srli_epi32(_mm256_mullo_epi32(lo, salts), 27),
    )
}

/// True when every bit of the key's mask is set in `block`.
///
/// # Safety
/// The CPU must support AVX2 (`is_x86_feature_detected!("avx2")`).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn covers256_avx2(block: &[u64; 4], h1: u64, k: u32) -> bool {
    // SAFETY: `block` is 32 readable bytes; the load is unaligned-safe.
    let b = unsafe { _mm256_loadu_si256(block.as_ptr().cast()) };
    _mm256_testc_si256(b, mask_reg(h1, k)) == 1
}

/// Block `idx` of `store` in a register. Plain words: one 32-byte load.
/// Atomics ([`Blocks256::SHARED`]): two 16-byte `vmovdqa` loads in inline
/// assembly, each single-copy atomic, so the block reads as four relaxed
/// atomic loads would (in two instructions instead of four loads and the
/// shuffles that put them together, which were slower).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
fn load_block<S: Blocks256 + ?Sized>(store: &S, idx: usize) -> __m256i {
    if S::SHARED {
        let blocks = store.block_count();
        if idx >= blocks {
            crate::block::block_out_of_bounds(idx, blocks);
        }
        let (base, off) = (store.base_ptr(), idx * 32);
        let (lo, hi): (__m128i, __m128i);
        // SAFETY: `base + off` is block `idx`'s first word (`idx` is in
        // bounds, checked above), 32-byte aligned, followed by the block's
        // other three words: both loads are in bounds and 16-byte aligned.
        // On every CPU with AVX (implied by AVX2) an aligned 16-byte
        // `vmovdqa` is a single-copy atomic access (Intel SDM vol. 3A
        // §10.1.1; AMD APM vol. 2 §7.3.2), so each 64-bit word holds a value
        // some write stored, exactly what `AtomicU64::load(Relaxed)` of that
        // word may return: the assembly is four relaxed atomic loads, and no
        // non-atomic access races the writers' `fetch_or`.
        unsafe {
            asm!(
                "vmovdqa {lo}, xmmword ptr [{base} + {off}]",
                "vmovdqa {hi}, xmmword ptr [{base} + {off} + 16]",
                base = in(reg) base,
                off = in(reg) off,
                lo = out(xmm_reg) lo,
                hi = out(xmm_reg) hi,
                options(nostack, readonly, preserves_flags),
            );
        }
        _mm256_set_m128i(hi, lo)
    } else {
        let w = store.load(idx);
        _mm256_set_epi64x(w[3] as i64, w[2] as i64, w[1] as i64, w[0] as i64)
    }
}

/// True when every bit of the key's mask is set in block `idx`.
///
/// # Safety
/// The CPU must support AVX2 (`is_x86_feature_detected!("avx2")`).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
pub(crate) unsafe fn covers_at_avx2<S: Blocks256 + ?Sized>(
    store: &S,
    idx: usize,
    h1: u64,
    k: u32,
) -> bool {
    _mm256_testc_si256(load_block(store, idx), mask_reg(h1, k)) == 1
}

/// The whole query over 256-bit blocks in one AVX2 function: the block
/// index, the load, the mask and the test. A caller compiled without AVX2
/// cannot inline an AVX2 function, so it pays one call per query; keeping
/// the index and load inside makes that call the only cost, as sbbf's
/// trait-object call is for its kernel.
///
/// # Safety
/// The CPU must support AVX2 (`is_x86_feature_detected!("avx2")`).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn contains256_avx2<S: Blocks256 + ?Sized>(
    store: &S,
    blocks: u64,
    h1: u64,
    k: u32,
) -> bool {
    // SAFETY: this function runs only on CPUs with AVX2.
    unsafe { covers_at_avx2(store, crate::block::block_index256(h1, blocks), h1, k) }
}

/// [`contains256_avx2`] for `k = 8`, the hash count at 1%: one round of
/// the mask, no branch on `k`.
///
/// # Safety
/// The CPU must support AVX2 (`is_x86_feature_detected!("avx2")`).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn contains256_k8_avx2<S: Blocks256 + ?Sized>(
    store: &S,
    blocks: u64,
    h1: u64,
) -> bool {
    let idx = crate::block::block_index256(h1, blocks);
    _mm256_testc_si256(load_block(store, idx), mask_round(h1 as u32, 0)) == 1
}

/// The bits of the key's mask that block `idx` lacks, as four words.
///
/// # Safety
/// The CPU must support AVX2 (`is_x86_feature_detected!("avx2")`).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
pub(crate) unsafe fn missing256_avx2<S: Blocks256 + ?Sized>(
    store: &S,
    idx: usize,
    h1: u64,
    k: u32,
) -> [u64; 4] {
    let missing = _mm256_andnot_si256(load_block(store, idx), mask_reg(h1, k));
    let mut out = [0u64; 4];
    // SAFETY: `out` is 32 writable bytes; unaligned-safe store.
    unsafe { _mm256_storeu_si256(out.as_mut_ptr().cast(), missing) };
    out
}

/// [`crate::block::set_batch_with`] compiled for AVX2, the block read and
/// mask ([`missing256_avx2`]) inlined.
///
/// # Safety
/// The CPU must support AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn set_batch_avx2<const CHEAP: bool>(
    lines: &[AtomicLine],
    blocks: u64,
    k: u32,
    n: usize,
    h1_of: impl Fn(usize) -> u64,
) {
    crate::block::set_batch_with::<CHEAP>(lines, blocks, n, h1_of, |idx, h1| {
        // SAFETY: this function runs only on CPUs with AVX2.
        let missing = unsafe { missing256_avx2(lines, idx, h1, k) };
        crate::block::or_missing(lines, idx, missing);
    });
}

/// True when every position of the key ([`crate::block::positions512`]) is
/// set in a 512-bit block: eight positions per round, each picking its
/// 32-bit word out of the line with two permutes and a blend, no loop over
/// positions.
///
/// # Safety
/// The CPU must support AVX2 (`is_x86_feature_detected!("avx2")`).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn covers512_avx2(block: &[u64; 8], h1: u64, k: u32) -> bool {
    // SAFETY: `block` is 64 readable bytes; unaligned-safe loads.
    let (lo_half, hi_half) = unsafe {
        (
            _mm256_loadu_si256(block.as_ptr().cast()),
            _mm256_loadu_si256(block.as_ptr().add(4).cast()),
        )
    };
    let lo = _mm256_set1_epi32(h1 as u32 as i32);
    let one = _mm256_set1_epi32(1);
    let seven = _mm256_set1_epi32(7);
    let lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    let mut left = k as i32;
    let mut r = 0;
    while left > 0 {
        // SAFETY: `SALTS` has 32 entries and `k <= 32`, so `8r + 8 <= 32`.
        let salts = unsafe { _mm256_loadu_si256(SALTS.as_ptr().add(8 * r).cast()) };
        let p = _mm256_srli_epi32(_mm256_mullo_epi32(lo, salts), 23);
        // 32-bit word `p >> 5` of the line (0..16), bit `p & 31` in it.
        let word = _mm256_srli_epi32(p, 5);
        let picked = _mm256_blendv_epi8(
            _mm256_permutevar8x32_epi32(lo_half, word),
            _mm256_permutevar8x32_epi32(hi_half, word),
            _mm256_cmpgt_epi32(word, seven),
        );
        let bit = _mm256_sllv_epi32(one, _mm256_and_si256(p, _mm256_set1_epi32(31)));
        let wanted = _mm256_and_si256(bit, _mm256_cmpgt_epi32(_mm256_set1_epi32(left), lanes));
        if _mm256_testc_si256(picked, wanted) == 0 {
            return false;
        }
        left -= 8;
        r += 1;
    }
    true
}

/// ORs the key's mask into `block`; true when a bit was newly set.
///
/// # Safety
/// The CPU must support AVX2 (`is_x86_feature_detected!("avx2")`).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn apply256_avx2(block: &mut [u64; 4], h1: u64, k: u32) -> bool {
    let m = mask_reg(h1, k);
    // SAFETY: `block` is 32 bytes, borrowed mutably; unaligned-safe load
    // and store.
    unsafe {
        let b = _mm256_loadu_si256(block.as_ptr().cast());
        _mm256_storeu_si256(block.as_mut_ptr().cast(), _mm256_or_si256(b, m));
        _mm256_testc_si256(b, m) == 0
    }
}

/// The key's mask as four 64-bit words (the unit test compares it with
/// the scalar mask).
///
/// # Safety
/// The CPU must support AVX2 (`is_x86_feature_detected!("avx2")`).
#[cfg(all(test, target_arch = "x86_64"))]
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn mask256_avx2(h1: u64, k: u32) -> [u64; 4] {
    let mut out = [0u64; 4];
    // SAFETY: `out` is 32 writable bytes; unaligned-safe store.
    unsafe { _mm256_storeu_si256(out.as_mut_ptr().cast(), mask_reg(h1, k)) };
    out
}

/// [`crate::block::probe_batch_with`] compiled for AVX2, the kernel inlined.
///
/// # Safety
/// The CPU must support AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn probe_batch_avx2<S: Blocks256 + ?Sized, const CHEAP: bool>(
    store: &S,
    blocks: u64,
    k: u32,
    h1_of: impl Fn(usize) -> u64,
    out: &mut [bool],
) {
    crate::block::probe_batch_with::<_, CHEAP>(store, blocks, k, h1_of, out, |s, idx, h1, k| {
        // SAFETY: this function runs only on CPUs with AVX2.
        unsafe { covers_at_avx2(s, idx, h1, k) }
    });
}

/// [`crate::block::insert_batch_with`] compiled for AVX2, the kernel inlined.
///
/// # Safety
/// The CPU must support AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn insert_batch_avx2<const CHEAP: bool>(
    store: &mut [[u64; 4]],
    blocks: u64,
    k: u32,
    n: usize,
    h1_of: impl Fn(usize) -> u64,
) {
    crate::block::insert_batch_with::<CHEAP>(store, blocks, k, n, h1_of, |b, h1, k| {
        // SAFETY: this function runs only on CPUs with AVX2.
        unsafe { apply256_avx2(b, h1, k) };
    });
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use crate::block::{covers, mask256_scalar};
    use crate::hash::splitmix64;

    #[test]
    fn avx2_mask_probe_and_insert_equal_the_scalar_ones() {
        if !std::arch::is_x86_feature_detected!("avx2") {
            eprintln!("SKIPPED: no AVX2 on this CPU; the scalar path is the one in use");
            return;
        }
        let mut multi_round = 0;
        for i in 0..200_000u64 {
            let h1 = splitmix64(i);
            let k = 1 + (i % 32) as u32;
            let scalar = mask256_scalar(h1, k);
            // SAFETY: AVX2 support was checked above.
            let mask = unsafe { super::mask256_avx2(h1, k) };
            assert_eq!(mask, scalar, "h1 {h1:#x} k {k}");
            let mut block: [u64; 4] =
                core::array::from_fn(|w| splitmix64(i * 4 + w as u64) & splitmix64(i + w as u64));
            let covered = covers(&block, &scalar);
            // SAFETY: as above.
            assert_eq!(unsafe { super::covers256_avx2(&block, h1, k) }, covered);
            let mut expect = block;
            for (b, m) in expect.iter_mut().zip(&scalar) {
                *b |= m;
            }
            // SAFETY: as above.
            assert_eq!(unsafe { super::apply256_avx2(&mut block, h1, k) }, !covered);
            assert_eq!(block, expect);
            multi_round += usize::from(k > 8);
        }
        assert!(multi_round > 0, "multi-round masks were covered");
    }

    #[test]
    fn avx2_512_probe_equals_the_scalar_one() {
        if !std::arch::is_x86_feature_detected!("avx2") {
            eprintln!("SKIPPED: no AVX2 on this CPU; the scalar path is the one in use");
            return;
        }
        let (mut yes, mut no) = (0, 0);
        for i in 0..200_000u64 {
            let h1 = splitmix64(i);
            let k = 1 + (i % 32) as u32;
            // Dense random blocks, and blocks holding exactly the key's mask
            // (every answer yes) with one of its bits cleared (every answer no).
            let dense: [u64; 8] = core::array::from_fn(|w| {
                splitmix64(i * 8 + w as u64) | splitmix64(i ^ (w as u64) << 40)
            });
            let mut exact = [0u64; 8];
            crate::block::apply512(&mut exact, h1, k);
            let mut holed = exact;
            let first = crate::block::positions512(h1, k).next().unwrap_or(0);
            holed[(first >> 6) as usize] &= !(1u64 << (first & 63));
            for block in [dense, exact, holed] {
                let scalar = crate::block::covers512(&block, h1, k);
                // SAFETY: AVX2 support was checked above.
                let fast = unsafe { super::covers512_avx2(&block, h1, k) };
                assert_eq!(fast, scalar, "h1 {h1:#x} k {k}");
                if scalar {
                    yes += 1
                } else {
                    no += 1
                }
            }
        }
        assert!(
            yes > 200_000 && no > 200_000,
            "both answers covered: {yes} {no}"
        );
    }
}
