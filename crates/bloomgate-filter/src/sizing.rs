//! Sizing: how many bits and hashes a filter needs for `n` items at a target
//! false-positive rate `p`, and the rate a given shape actually has.
//!
//! The classic formulas (`m = ceil(-n·ln p / ln²2)`, `k = round(m/n·ln 2)`,
//! `fpr = (1 - e^(-kn/m))^k`) assume every bit is equally likely to be hit.
//! A blocked filter puts all of a key's bits in one block, and blocks are
//! loaded unevenly (the number of keys per block is Poisson distributed), so
//! the classic formula under-estimates its rate. [`blocked_fpr`] computes the
//! exact rate as a Poisson mixture over per-block loads, and [`blocked`]
//! searches for the smallest shape whose exact rate meets the target.
//!
//! ```
//! use bloomgate_filter::sizing;
//! // Seed 000: 500,000 SKUs at 0.1% give 7,188,794 bits and 10 hashes.
//! let p = sizing::classic(500_000, 0.001).unwrap();
//! assert_eq!((p.bits, p.hashes), (7_188_794, 10));
//! // The blocked layout needs a little more room for the same rate.
//! let b = sizing::blocked(500_000, 0.001, 512).unwrap();
//! assert!(b.bits() > p.bits);
//! assert!(sizing::blocked_fpr(b.blocks, b.block_bits, b.hashes, 500_000) <= 0.001);
//! ```

use crate::error::{Error, Result};

/// The largest hash count a classic filter accepts.
pub const MAX_CLASSIC_HASHES: u32 = 64;
/// The largest hash count a blocked filter accepts.
pub const MAX_BLOCKED_HASHES: u32 = 32;

/// What a filter was sized for: `capacity` items at rate `fpr`. Recorded
/// by the `with_fpr` constructors and kept in snapshots, so tools can tell
/// whether a filter is past capacity.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Design {
    /// Items the filter was sized for.
    pub capacity: u64,
    /// Target false-positive rate at that many items.
    pub fpr: f64,
}

/// The shape of a classic (unblocked) filter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClassicParams {
    /// Number of bits, `m`.
    pub bits: u64,
    /// Number of hash positions per key, `k`.
    pub hashes: u32,
}

/// The shape of a blocked filter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockedParams {
    /// Number of blocks.
    pub blocks: u64,
    /// Positions per block (512 for bit blocks, 128 for counter blocks).
    pub block_bits: u32,
    /// Number of positions set per key, `k`.
    pub hashes: u32,
}

impl BlockedParams {
    /// Total positions, `blocks × block_bits`.
    #[must_use]
    pub const fn bits(&self) -> u64 {
        self.blocks * self.block_bits as u64
    }
}

pub(crate) fn check_inputs(n: u64, p: f64) -> Result<()> {
    if n == 0 {
        return Err(Error::ZeroItems);
    }
    if !(p > 0.0 && p < 1.0) {
        return Err(Error::InvalidFpr(p));
    }
    Ok(())
}

/// Bytes needed for `bits` bits rounded up to whole 64-byte lines, or
/// [`Error::TooLarge`] when that does not fit in this platform's memory.
pub(crate) fn check_fits(bits: u128) -> Result<usize> {
    let lines = bits.div_ceil(512);
    let bytes = lines.checked_mul(64).ok_or(Error::TooLarge { bits })?;
    if bytes > isize::MAX as u128 || bits > u128::from(u64::MAX) {
        return Err(Error::TooLarge { bits });
    }
    Ok(bytes as usize)
}

/// The classic optimum for `n` items at rate `p`.
///
/// # Errors
/// [`Error::ZeroItems`], [`Error::InvalidFpr`], or [`Error::TooLarge`] when
/// the filter would not fit in memory.
pub fn classic(n: u64, p: f64) -> Result<ClassicParams> {
    check_inputs(n, p)?;
    let ln2 = std::f64::consts::LN_2;
    let m = (-(n as f64) * p.ln() / (ln2 * ln2)).ceil();
    if !m.is_finite() || m >= u64::MAX as f64 {
        return Err(Error::TooLarge { bits: u128::MAX });
    }
    let bits = (m as u64).max(1);
    check_fits(u128::from(bits))?;
    let k = ((bits as f64 / n as f64) * ln2).round();
    let hashes = (k as u32).clamp(1, MAX_CLASSIC_HASHES);
    Ok(ClassicParams { bits, hashes })
}

/// The classic approximation of the false-positive rate after `n` inserts.
#[must_use]
pub fn classic_fpr(bits: u64, hashes: u32, n: u64) -> f64 {
    if n == 0 {
        return 0.0;
    }
    let k = f64::from(hashes);
    (1.0 - (-k * n as f64 / bits as f64).exp()).powf(k)
}

/// The exact false-positive rate of a blocked filter after `n` inserts.
///
/// Keys per block follow a Poisson law with mean `λ = n / blocks`. A block
/// holding `j` keys has had `k·j` positions thrown at it; the number `X` of
/// distinct positions set follows the occupancy distribution, computed here
/// exactly by dynamic programming. A query then hits `k` independent
/// positions, all set with probability `E[(X/B)^k]`. So
/// `fpr = Σ_j Poisson(j; λ) · E[(X_{kj}/B)^k]`.
///
/// (The common shortcut `(1 - (1-1/B)^{kj})^k` replaces `E[(X/B)^k]` by
/// `(E[X]/B)^k`, which by Jensen's inequality is too small: by 3–5% for
/// 512-bit blocks and more for 128-bit ones. It is still used when a filter
/// is so overfull that the exact sum would cost more than ~10^8 steps.)
#[must_use]
pub fn blocked_fpr(blocks: u64, block_bits: u32, hashes: u32, n: u64) -> f64 {
    if n == 0 {
        return 0.0;
    }
    if blocks == 0 {
        return 1.0;
    }
    BlockModel::new(block_bits, hashes).fpr(n as f64 / blocks as f64)
}

/// Per-block hit probabilities for one `(B, k)`, extended lazily in `j`.
struct BlockModel {
    b: usize,
    k: u32,
    /// Distribution of the number of set positions after `k·(q.len()-1)` throws.
    dist: Vec<f64>,
    /// `q[j] = E[(X_{kj}/B)^k]`.
    q: Vec<f64>,
    powk: Vec<f64>,
    max_x: usize,
}

impl BlockModel {
    fn new(block_bits: u32, k: u32) -> Self {
        let b = block_bits as usize;
        let mut dist = vec![0.0; b + 1];
        dist[0] = 1.0;
        let powk = (0..=b)
            .map(|x| (x as f64 / b as f64).powi(k as i32))
            .collect();
        Self {
            b,
            k,
            dist,
            q: vec![0.0],
            powk,
            max_x: 0,
        }
    }

    /// Makes `q` cover `0..=jmax`.
    fn extend(&mut self, jmax: usize) {
        let bf = self.b as f64;
        while self.q.len() <= jmax {
            for _ in 0..self.k {
                self.max_x = (self.max_x + 1).min(self.b);
                for x in (1..=self.max_x).rev() {
                    self.dist[x] = self.dist[x] * (x as f64 / bf)
                        + self.dist[x - 1] * ((self.b - x + 1) as f64 / bf);
                }
                self.dist[0] = 0.0;
            }
            let hit = (0..=self.max_x).map(|x| self.dist[x] * self.powk[x]).sum();
            self.q.push(hit);
        }
    }

    fn fpr(&mut self, lambda: f64) -> f64 {
        let sd = lambda.sqrt();
        let hi = (lambda + 14.0 * sd + 40.0).ceil() as usize;
        let lo = (lambda - 14.0 * sd - 40.0).floor().max(0.0) as usize;
        let exact = (hi as f64) * f64::from(self.k) * self.b as f64 <= 1e8;
        if exact {
            self.extend(hi);
        }
        let k = f64::from(self.k);
        let ln_miss = (1.0 - 1.0 / self.b as f64).ln();
        let ln_lambda = lambda.ln();
        let mut ln_fact = 0.0f64;
        let mut total = 0.0;
        for j in 0..=hi {
            if j > 0 {
                ln_fact += (j as f64).ln();
            }
            if j < lo {
                continue;
            }
            let pmf = (-lambda + j as f64 * ln_lambda - ln_fact).exp();
            let hit = if exact {
                self.q[j]
            } else {
                (-(k * j as f64 * ln_miss).exp_m1()).powf(k)
            };
            total += pmf * hit;
        }
        total.min(1.0)
    }
}

/// The smallest blocked shape (fewest blocks, then fewest hashes) whose exact
/// rate at `n` items is at most `p`.
///
/// # Errors
/// [`Error::ZeroItems`], [`Error::InvalidFpr`], [`Error::InvalidParameter`]
/// for a block size that is not 128 or 512, or [`Error::TooLarge`].
pub fn blocked(n: u64, p: f64, block_bits: u32) -> Result<BlockedParams> {
    check_inputs(n, p)?;
    if block_bits != 128 && block_bits != 512 {
        return Err(Error::InvalidParameter {
            name: "block_bits",
            reason: format!("must be 128 or 512, got {block_bits}"),
        });
    }
    // The exact optimum is near the classic one: search k around the
    // classic k, and blocks by bisection between bounds found by doubling.
    let classic = classic(n, p)?;
    let k_lo = classic.hashes.saturating_sub(4).max(1);
    let k_hi = (classic.hashes + 4).min(MAX_BLOCKED_HASHES);
    let mut best: Option<BlockedParams> = None;
    for hashes in k_lo..=k_hi {
        let mut model = BlockModel::new(block_bits, hashes);
        let mut fpr_at = |blocks: u64| model.fpr(n as f64 / blocks as f64);
        let mut hi = classic.bits.div_ceil(u64::from(block_bits)).max(1);
        let mut grown = 0;
        while fpr_at(hi) > p && grown < 8 {
            hi = hi.saturating_mul(2);
            grown += 1;
        }
        if fpr_at(hi) > p {
            continue; // This k cannot reach p within 256x the classic size.
        }
        let mut lo = hi / 2;
        while lo > 0 && fpr_at(lo) <= p {
            hi = lo;
            lo /= 2;
        }
        // Invariant: fpr(lo) > p (or lo = 0), fpr(hi) <= p.
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if fpr_at(mid) <= p {
                hi = mid;
            } else {
                lo = mid;
            }
        }
        if best.is_none_or(|b| hi < b.blocks) {
            best = Some(BlockedParams {
                blocks: hi,
                block_bits,
                hashes,
            });
        }
    }
    let best = best.ok_or(Error::TooLarge { bits: u128::MAX })?;
    check_fits(u128::from(best.blocks) * u128::from(block_bits))?;
    Ok(best)
}
