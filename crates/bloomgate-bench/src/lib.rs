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

/// Nanoseconds per operation of `f`, which performs `ops` operations.
#[must_use]
pub fn ns_per(ops: usize, f: impl FnOnce()) -> f64 {
    let t = std::time::Instant::now();
    f();
    t.elapsed().as_nanos() as f64 / ops as f64
}

/// The median of the rounds' timings.
#[must_use]
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The filter sizes given as command-line arguments, or `default`.
#[must_use]
pub fn sizes_from_args(default: &[usize]) -> Vec<usize> {
    let sizes: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|s| s.parse().ok())
        .collect();
    if sizes.is_empty() {
        default.to_vec()
    } else {
        sizes
    }
}
