//! Helpers shared by the integration tests: a seeded key generator.
#![allow(dead_code)]

/// A splitmix64 stream: deterministic, fast, and good enough to draw test keys.
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    pub fn keys(&mut self, n: usize) -> Vec<u64> {
        (0..n).map(|_| self.next_u64()).collect()
    }
}

/// Three standard deviations of a rate estimated from `trials` draws.
pub fn three_sigma(p: f64, trials: u64) -> f64 {
    3.0 * (p * (1.0 - p) / trials as f64).sqrt()
}
