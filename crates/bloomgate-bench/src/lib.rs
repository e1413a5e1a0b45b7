//! Shared pieces of the benchmarks: the seeded key streams.

use bloomgate_filter::hash::splitmix64;

/// `n` pseudo-random u64 keys from a seeded splitmix64 stream.
#[must_use]
pub fn keys(n: usize, seed: u64) -> Vec<u64> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s.wrapping_add(0x9e37_79b9_7f4a_7c15);
            splitmix64(s)
        })
        .collect()
}
