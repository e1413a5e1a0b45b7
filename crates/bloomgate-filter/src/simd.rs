//! The AVX2 version of the 512-bit block mask, chosen at run time.
//!
//! This module and `mmap` are the only places with `unsafe` code in the
//! crate. Every function here computes exactly what its scalar twin in
//! `block` computes (a property test checks it on random inputs).

#[cfg(target_arch = "x86_64")]
use core::arch::x86_64::{
    __m256i, _mm256_and_si256, _mm256_andnot_si256, _mm256_cmpgt_epi64, _mm256_load_si256,
    _mm256_or_si256, _mm256_set1_epi64x, _mm256_setr_epi64x, _mm256_sllv_epi64, _mm256_srlv_epi64,
    _mm256_store_si256, _mm256_storeu_si256, _mm256_testz_si256,
};

#[cfg(target_arch = "x86_64")]
use crate::bitmap::Line;

/// The mask of [`crate::block::mask512`] as two 256-bit halves.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
fn mask_regs(h2: u64, k: u32) -> (__m256i, __m256i) {
    let shifts_lo = _mm256_setr_epi64x(0, 6, 12, 18);
    let shifts_hi = _mm256_setr_epi64x(24, 30, 36, 42);
    let lanes_lo = _mm256_setr_epi64x(0, 1, 2, 3);
    let lanes_hi = _mm256_setr_epi64x(4, 5, 6, 7);
    let six_bits = _mm256_set1_epi64x(63);
    let one = _mm256_set1_epi64x(1);
    let mut lo = _mm256_set1_epi64x(0);
    let mut hi = _mm256_set1_epi64x(0);
    if k == 8 {
        // The common case at 1% (and the widest single round): every lane
        // gets one bit, no enable mask, no loop.
        let hv = _mm256_set1_epi64x(h2 as i64);
        let lo = _mm256_sllv_epi64(
            one,
            _mm256_and_si256(_mm256_srlv_epi64(hv, shifts_lo), six_bits),
        );
        let hi = _mm256_sllv_epi64(
            one,
            _mm256_and_si256(_mm256_srlv_epi64(hv, shifts_hi), six_bits),
        );
        return (lo, hi);
    }
    let mut h = h2;
    let mut left = k;
    loop {
        let take = _mm256_set1_epi64x(i64::from(left.min(8)));
        let hv = _mm256_set1_epi64x(h as i64);
        // Lanes at or past `take` stay empty.
        let slice_lo = _mm256_and_si256(_mm256_srlv_epi64(hv, shifts_lo), six_bits);
        let bit_lo = _mm256_sllv_epi64(one, slice_lo);
        lo = _mm256_or_si256(
            lo,
            _mm256_and_si256(bit_lo, _mm256_cmpgt_epi64(take, lanes_lo)),
        );
        let slice_hi = _mm256_and_si256(_mm256_srlv_epi64(hv, shifts_hi), six_bits);
        let bit_hi = _mm256_sllv_epi64(one, slice_hi);
        hi = _mm256_or_si256(
            hi,
            _mm256_and_si256(bit_hi, _mm256_cmpgt_epi64(take, lanes_hi)),
        );
        if left <= 8 {
            break;
        }
        left -= 8;
        h = crate::hash::splitmix64(h);
    }
    (lo, hi)
}

/// True when every bit of the key's mask is set in `line`.
///
/// # Safety
/// The CPU must support AVX2 (`is_x86_feature_detected!("avx2")`).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn covers512_avx2(line: &Line, h2: u64, k: u32) -> bool {
    let (lo, hi) = mask_regs(h2, k);
    let p = line.0.as_ptr();
    // SAFETY: `Line` is 64-byte aligned and 64 bytes long, so both aligned
    // 32-byte loads are in bounds.
    let (a, b) = unsafe {
        (
            _mm256_load_si256(p.cast()),
            _mm256_load_si256(p.add(4).cast()),
        )
    };
    let missing = _mm256_or_si256(_mm256_andnot_si256(a, lo), _mm256_andnot_si256(b, hi));
    _mm256_testz_si256(missing, missing) == 1
}

/// ORs the key's mask into `line`; true when a bit was newly set.
///
/// # Safety
/// The CPU must support AVX2 (`is_x86_feature_detected!("avx2")`).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn apply512_avx2(line: &mut Line, h2: u64, k: u32) -> bool {
    let (lo, hi) = mask_regs(h2, k);
    let p = line.0.as_mut_ptr();
    // SAFETY: `Line` is 64-byte aligned and 64 bytes long, so both aligned
    // 32-byte loads and stores are in bounds, and `line` is borrowed mutably.
    unsafe {
        let (a, b) = (
            _mm256_load_si256(p.cast()),
            _mm256_load_si256(p.add(4).cast()),
        );
        let fresh = _mm256_or_si256(_mm256_andnot_si256(a, lo), _mm256_andnot_si256(b, hi));
        _mm256_store_si256(p.cast(), _mm256_or_si256(a, lo));
        _mm256_store_si256(p.add(4).cast(), _mm256_or_si256(b, hi));
        _mm256_testz_si256(fresh, fresh) == 0
    }
}

/// [`crate::block::mask512`] with AVX2 (for the concurrent filter, which
/// needs the mask word by word).
///
/// # Safety
/// The CPU must support AVX2 (`is_x86_feature_detected!("avx2")`).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn mask512_avx2(h2: u64, k: u32) -> [u64; 8] {
    let (lo, hi) = mask_regs(h2, k);
    let mut out = [0u64; 8];
    let (a, b) = out.split_at_mut(4);
    // SAFETY: each half of `out` is 4 u64 = 32 writable bytes; the
    // unaligned store has no alignment requirement.
    unsafe {
        _mm256_storeu_si256(a.as_mut_ptr().cast(), lo);
        _mm256_storeu_si256(b.as_mut_ptr().cast(), hi);
    }
    out
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use crate::block::mask512_scalar;
    use crate::hash::splitmix64;

    #[test]
    fn avx2_mask_probe_and_insert_equal_the_scalar_ones() {
        if !std::arch::is_x86_feature_detected!("avx2") {
            eprintln!("SKIPPED: no AVX2 on this CPU; the scalar path is the one in use");
            return;
        }
        let mut differing_k = 0;
        for i in 0..200_000u64 {
            let h2 = splitmix64(i);
            let k = 1 + (i % 32) as u32;
            // SAFETY: AVX2 support was checked above.
            let simd = unsafe { super::mask512_avx2(h2, k) };
            let scalar = mask512_scalar(h2, k);
            assert_eq!(simd, scalar, "h2 {h2:#x} k {k}");
            // Probe and insert against a line with some random bits set.
            let mut line = crate::bitmap::Line(core::array::from_fn(|w| {
                splitmix64(i * 8 + w as u64) & splitmix64(i + w as u64)
            }));
            let covered = line.0.iter().zip(&scalar).all(|(l, m)| l & m == *m);
            // SAFETY: AVX2 support was checked above.
            assert_eq!(unsafe { super::covers512_avx2(&line, h2, k) }, covered);
            let mut expect = line;
            for (l, m) in expect.0.iter_mut().zip(&scalar) {
                *l |= m;
            }
            // SAFETY: as above.
            assert_eq!(unsafe { super::apply512_avx2(&mut line, h2, k) }, !covered);
            assert_eq!(line, expect);
            differing_k += usize::from(k > 8);
        }
        assert!(differing_k > 0, "multi-round masks were covered");
    }
}
