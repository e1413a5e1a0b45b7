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
//! let b = sizing::blocked(500_000, 0.001, 256).unwrap();
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
///
/// ```
/// use bloomgate_filter::{sizing::Design, BlockedBloom, Filter};
/// let f = BlockedBloom::with_fpr(5000, 0.01).unwrap();
/// assert_eq!(f.design(), Some(Design { capacity: 5000, fpr: 0.01 }));
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Design {
    /// Items the filter was sized for.
    pub capacity: u64,
    /// Target false-positive rate at that many items.
    pub fpr: f64,
}

/// The shape of a classic (unblocked) filter.
///
/// ```
/// use bloomgate_filter::sizing;
/// // Seed 000's example: 500,000 items at 0.1%.
/// let p = sizing::classic(500_000, 0.001).unwrap();
/// assert_eq!((p.bits, p.hashes), (7_188_794, 10));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClassicParams {
    /// Number of bits, `m`.
    pub bits: u64,
    /// Number of hash positions per key, `k`.
    pub hashes: u32,
}

/// The shape of a blocked filter.
///
/// ```
/// use bloomgate_filter::{sizing, BlockedBloom, Filter};
/// let p = sizing::blocked(200_000, 0.001, 256).unwrap();
/// assert_eq!(p.block_bits, 256);
/// let f = BlockedBloom::new(p, 0).unwrap();
/// assert_eq!(f.bits(), p.blocks * 256);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockedParams {
    /// Number of blocks.
    pub blocks: u64,
    /// Positions per block (256 or 512 for bit blocks, 128 for counter
    /// blocks).
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
/// Keys per block follow a Poisson law with mean `λ = n / blocks`; the rate
/// is `Σ_j Poisson(j; λ) · hit(j)`, where `hit(j)` is the probability that a
/// non-member's positions are all set in a block holding `j` keys. The two
/// block layouts (see `block`) differ only in `hit`:
///
/// * 256-bit blocks set their `k` bits in the block's eight 32-bit lanes in
///   turn, so lane `w` gets `c_w = ⌊k/8⌋ (+1 if w < k mod 8)` bits per key.
///   Lanes fill independently, and `hit(j) = Π_w E[(X_w/32)^{c_w}]` with
///   `X_w` the number of distinct bits set by `c_w·j` uniform throws.
/// * 128-position blocks (counting filters) and 512-bit blocks place `k`
///   positions uniformly: `hit(j) = E[(X/B)^k]` with `X` the distinct
///   positions set by `k·j` throws into `B` bins.
///
/// The occupancy distributions are computed exactly by dynamic programming.
/// (The common shortcut `(1 - (1-1/B)^{kj})^k` replaces `E[(X/B)^k]` by
/// `(E[X]/B)^k`, which by Jensen's inequality is too small. It is used only
/// for filters so overfull that the exact sum would cost more than ~10^8
/// steps.)
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

/// The standard deviation of one filter's rate around [`blocked_fpr`].
///
/// `blocked_fpr` averages over the random loads of the blocks; a particular
/// filter has particular loads, so its rate is `(1/blocks)·Σ_b hit(load_b)`,
/// which varies from filter to filter with standard deviation
/// `sqrt(Var[hit(J)] / blocks)`, `J ~ Poisson(λ)`. Small filters at low rates
/// vary the most (a few heavily loaded blocks carry most false positives);
/// tests use this to set tolerances the sample sizes justify.
#[must_use]
pub fn blocked_fpr_spread(blocks: u64, block_bits: u32, hashes: u32, n: u64) -> f64 {
    if n == 0 || blocks == 0 {
        return 0.0;
    }
    let mut model = BlockModel::new(block_bits, hashes);
    let lambda = n as f64 / blocks as f64;
    let mean = model.fpr(lambda);
    let second = model.moment(lambda, 2);
    ((second - mean * mean).max(0.0) / blocks as f64).sqrt()
}

/// Occupancy of `bins` bins under `per_key` uniform throws per key:
/// `q[j] = E[(X_{per_key·j} / bins)^per_key]`, extended lazily in `j`.
#[derive(Debug)]
struct Occupancy {
    bins: usize,
    per_key: u32,
    /// Distribution of the number of occupied bins after the throws so far.
    dist: Vec<f64>,
    q: Vec<f64>,
    powk: Vec<f64>,
    max_x: usize,
}

impl Occupancy {
    fn new(bins: usize, per_key: u32) -> Self {
        let mut dist = vec![0.0; bins + 1];
        dist[0] = 1.0;
        let powk = (0..=bins)
            .map(|x| (x as f64 / bins as f64).powi(per_key as i32))
            .collect();
        Self {
            bins,
            per_key,
            dist,
            q: vec![if per_key == 0 { 1.0 } else { 0.0 }],
            powk,
            max_x: 0,
        }
    }

    fn cost(&self, jmax: usize) -> f64 {
        jmax as f64 * f64::from(self.per_key) * self.bins as f64
    }

    fn extend(&mut self, jmax: usize) {
        let b = self.bins as f64;
        while self.q.len() <= jmax {
            for _ in 0..self.per_key {
                self.max_x = (self.max_x + 1).min(self.bins);
                for x in (1..=self.max_x).rev() {
                    self.dist[x] = self.dist[x] * (x as f64 / b)
                        + self.dist[x - 1] * ((self.bins - x + 1) as f64 / b);
                }
                self.dist[0] = 0.0;
            }
            let hit = (0..=self.max_x).map(|x| self.dist[x] * self.powk[x]).sum();
            self.q.push(hit);
        }
    }

    /// The shortcut `(1 - (1 - 1/bins)^{per_key·j})^per_key`.
    fn approx(&self, j: usize) -> f64 {
        let c = f64::from(self.per_key);
        let ln_miss = (1.0 - 1.0 / self.bins as f64).ln();
        (-(c * j as f64 * ln_miss).exp_m1()).powf(c)
    }
}

/// `hit(j)` for one block layout: a product of occupancy factors.
#[derive(Debug)]
struct BlockModel {
    /// `(occupancy, exponent)` pairs.
    factors: Vec<(Occupancy, i32)>,
}

impl BlockModel {
    fn new(block_bits: u32, k: u32) -> Self {
        let factors = if block_bits == 256 {
            let (a, r) = (k / 8, (k % 8) as i32);
            let mut f = vec![(Occupancy::new(32, a + 1), r)];
            if a > 0 {
                f.push((Occupancy::new(32, a), 8 - r));
            }
            f
        } else {
            vec![(Occupancy::new(block_bits as usize, k), 1)]
        };
        Self { factors }
    }

    fn fpr(&mut self, lambda: f64) -> f64 {
        self.moment(lambda, 1)
    }

    /// `E[hit(J)^power]`, `J ~ Poisson(λ)`.
    fn moment(&mut self, lambda: f64, power: i32) -> f64 {
        let sd = lambda.sqrt();
        let hi = (lambda + 14.0 * sd + 40.0).ceil() as usize;
        let lo = (lambda - 14.0 * sd - 40.0).floor().max(0.0) as usize;
        let cost: f64 = self.factors.iter().map(|(o, _)| o.cost(hi)).sum();
        let exact = cost <= 1e8;
        if exact {
            for (o, _) in &mut self.factors {
                o.extend(hi);
            }
        }
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
            let hit: f64 = self
                .factors
                .iter()
                .map(|(o, e)| if exact { o.q[j] } else { o.approx(j) }.powi(*e))
                .product();
            total += pmf * hit.powi(power);
        }
        total.min(1.0)
    }
}

/// The bit-filter shape for `n` items at rate `p`: 256-bit blocks (eight
/// lanes, the fastest probe) unless `p < 1e-3` and 512-bit blocks need at
/// most 90% of their bits (at `p ≥ 1e-3` they save less than that, and
/// their exact model costs ~50 ms to search, so it is not asked). Both are one cache line per check; the wider block wins at
/// low rates, where the 256-bit block's few lanes fill unevenly (at
/// `p = 1e-4` it needs ~1.37x the classic optimum's bits, the 512-bit
/// block ~1.15x; see BENCHMARKS.md).
///
/// # Errors
/// As [`blocked`].
pub fn blocked_auto(n: u64, p: f64) -> Result<BlockedParams> {
    let narrow = blocked(n, p, 256)?;
    if p >= 1e-3 {
        return Ok(narrow);
    }
    match blocked(n, p, 512) {
        Ok(wide) if u128::from(wide.bits()) * 10 <= u128::from(narrow.bits()) * 9 => Ok(wide),
        _ => Ok(narrow),
    }
}

/// The smallest blocked shape (fewest blocks, then fewest hashes) whose exact
/// rate at `n` items is at most `p`.
///
/// # Errors
/// [`Error::ZeroItems`], [`Error::InvalidFpr`], [`Error::InvalidParameter`]
/// for a block size that is not 128, 256 or 512, or [`Error::TooLarge`].
pub fn blocked(n: u64, p: f64, block_bits: u32) -> Result<BlockedParams> {
    check_inputs(n, p)?;
    if ![128, 256, 512].contains(&block_bits) {
        return Err(Error::InvalidParameter {
            name: "block_bits",
            reason: format!("must be 128, 256 or 512, got {block_bits}"),
        });
    }
    // The blocked optimum has about as many or more hashes than the classic
    // one: search k from a little below it to twice it, and blocks by
    // bisection between bounds found by doubling.
    let classic = classic(n, p)?;
    let k_lo = classic.hashes.saturating_sub(4).max(1);
    // Uniform positions over 512 bits stay close to the classic k.
    let k_hi = if block_bits == 512 {
        classic.hashes + 6
    } else {
        classic.hashes * 2 + 2
    }
    .min(MAX_BLOCKED_HASHES);
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
