//! Membership probes over raw words, shared by heap filters and mmap'd views.

use crate::block;
use crate::hash::HashPair;

/// The `i`-th classic position: `(h1 + i·h2) mod m` in wrapping 64-bit
/// arithmetic, `h2` forced non-zero, exactly as seed 000's `BloomFilter.h`.
#[inline(always)]
pub(crate) fn classic_position(h: HashPair, i: u32, bits: u64) -> u64 {
    let h2 = if h.h2 == 0 { 1 } else { h.h2 };
    h.h1.wrapping_add(u64::from(i).wrapping_mul(h2)) % bits
}

#[inline]
pub(crate) fn classic_contains(words: &[u64], bits: u64, k: u32, h: HashPair) -> bool {
    (0..k).all(|i| {
        let p = classic_position(h, i, bits);
        words[(p / 64) as usize] & (1 << (p % 64)) != 0
    })
}

/// Probe of a blocked filter with `block_words` words (4, 2 or 8) per block.
#[inline(always)]
pub(crate) fn blocked_contains(
    words: &[u64],
    blocks: u64,
    block_words: usize,
    k: u32,
    h: HashPair,
) -> bool {
    if block_words == 4 {
        let idx = block::block_index256(h.h1, blocks);
        words[idx * 4..]
            .first_chunk::<4>()
            .is_some_and(|b| block::covers256_with(block::has_avx2(), b, h.h1, k))
    } else if block_words == 8 {
        let idx = block::block_index256(h.h1, blocks);
        words[idx * 8..]
            .first_chunk::<8>()
            .is_some_and(|b| block::covers512_with(block::has_avx2(), b, h.h1, k))
    } else {
        let idx = block::block_index(h.h1, blocks);
        words[idx * 2..]
            .first_chunk::<2>()
            .is_some_and(|b| block::covers(b, &block::mask128(h, k)))
    }
}

/// Position of counter `p` of block `idx` in a counting filter: (word, shift).
#[inline(always)]
pub(crate) const fn counter_slot(idx: usize, p: u32) -> (usize, u32) {
    (idx * 8 + (p / 16) as usize, (p % 16) * 4)
}

#[inline]
pub(crate) fn counting_contains(words: &[u64], blocks: u64, k: u32, h: HashPair) -> bool {
    let idx = block::block_index(h.h1, blocks);
    block::Positions::new(block::inblock(h), k, 7).all(|p| {
        let (w, s) = counter_slot(idx, p);
        (words[w] >> s) & 0xF != 0
    })
}
