//! Statistical false-positive tests with fixed seeds: the measured rate is at
//! most the target (within three standard deviations of sampling error) and
//! within ±15% of the filter's own `expected_fpr`.

mod common;

use bloomgate_filter::{
    sizing, AtomicBloom, AtomicClassicBloom, BlockedBloom, ClassicBloom, CountingBloom, Filter,
};
use common::{three_sigma, Rng};

const RATES: [f64; 4] = [1e-1, 1e-2, 1e-3, 1e-4];
const SIZES: [u64; 2] = [10_000, 1_000_000];

/// Enough non-member queries for ~2000 expected false positives (a 2.2%
/// relative standard error), and never fewer than 10^6.
fn trials_for(p: f64) -> u64 {
    ((2000.0 / p) as u64).max(1_000_000)
}

/// Filters averaged per case: one at 10^6 keys, eight independently seeded
/// ones at 10^4, where a single small filter's rate varies by up to ~14%
/// around the formula (see `sizing::blocked_fpr_spread`).
fn filters_for(n: u64) -> u64 {
    if n >= 1_000_000 {
        1
    } else {
        8
    }
}

struct Outcome {
    measured: f64,
    expected: f64,
    /// Standard deviation of `measured` from probe sampling and from the
    /// filters' own variation.
    sd: f64,
}

/// Builds `filters_for(n)` filters with `make(seed)`, fills each with its
/// own keys, checks no key is missing, and averages the measured rate on
/// non-member probes.
fn measure<F: Filter>(
    n: u64,
    p: f64,
    case: u64,
    block_bits: u32,
    make: impl Fn(u64) -> F,
    fill: impl Fn(&mut F, &[u64]),
) -> Outcome {
    let count = filters_for(n);
    let trials = trials_for(p);
    let (mut measured, mut expected, mut spread2) = (0.0, 0.0, 0.0);
    for i in 0..count {
        let seed = case * 1000 + i;
        let members = Rng(seed).keys(n as usize);
        let mut f = make(seed);
        fill(&mut f, &members);
        assert!(members.iter().all(|k| f.contains(k)), "false negative");
        let mut rng = Rng(seed ^ 0xdead_beef);
        let hits = (0..trials).filter(|_| f.contains(&rng.next_u64())).count();
        measured += hits as f64 / trials as f64;
        expected += f.expected_fpr(n);
        let spread = if block_bits > 0 {
            sizing::blocked_fpr_spread(f.bits() / u64::from(block_bits), block_bits, f.hashes(), n)
        } else {
            classic_fpr_spread(f.bits(), f.hashes(), n)
        };
        spread2 += spread * spread;
    }
    let c = count as f64;
    let (measured, expected) = (measured / c, expected / c);
    let probe_var = expected * (1.0 - expected) / (trials as f64 * c);
    Outcome {
        measured,
        expected,
        sd: (probe_var + spread2 / (c * c)).sqrt(),
    }
}

/// The standard deviation of one classic filter's rate around the formula:
/// the `k·n` throws into `m` bits leave a set fraction `ρ` whose variance is
/// the occupancy variance `m e^{-λ}(1 - (1+λ)e^{-λ})`, `λ = kn/m`, and the
/// rate `ρ^k` moves by `k ρ^{k-1}` per unit of `ρ`. About 1.6% of the rate
/// at n = 10^4, p = 10^-4; negligible at 10^6.
fn classic_fpr_spread(bits: u64, hashes: u32, n: u64) -> f64 {
    let (m, k) = (bits as f64, f64::from(hashes));
    let lambda = k * n as f64 / m;
    let empty = (-lambda).exp();
    let var_set = m * empty * (1.0 - (1.0 + lambda) * empty);
    let rho = 1.0 - empty;
    k * rho.powf(k - 1.0) * var_set.sqrt() / m
}

/// How far above `p` the classic scheme may sit because it rounds `k`:
/// the rate of seed 000's formula (`m = ⌈-n ln p / ln² 2⌉`,
/// `k = round(m/n · ln 2)`, rate `(1 - e^{-kn/m})^k`) over `p`, computed
/// here from the formula and never from the filter under test, so a sizing
/// change that undersizes classic filters cannot move its own allowance.
/// For the rates tested it is at most 1.0072 (p = 0.1, k = 3 for 3.32).
fn classic_rounding_allowance(n: u64, p: f64) -> f64 {
    let ln2 = std::f64::consts::LN_2;
    let n = n as f64;
    let m = (-n * p.ln() / (ln2 * ln2)).ceil();
    let k = (m / n * ln2).round();
    let allowance = (1.0 - (-k * n / m).exp()).powf(k) / p;
    assert!(
        allowance <= 1.01,
        "rounding k costs {allowance} at n={n} p={p}"
    );
    allowance.max(1.0)
}

/// Asserts the measured rate is at most `target` (+3 sd) and within 15% of
/// the filter's own estimate.
fn check(name: &str, n: u64, target: f64, o: &Outcome) {
    eprintln!(
        "{name} n={n} target={target:.6}: measured {:.6} expected {:.6} (sd {:.2e})",
        o.measured, o.expected, o.sd
    );
    assert!(
        o.measured <= target + 3.0 * o.sd,
        "{name} n={n} target={target}: measured {} above target (+3 sd = {})",
        o.measured,
        3.0 * o.sd
    );
    let rel = (o.measured - o.expected).abs() / o.expected;
    assert!(
        rel <= 0.15,
        "{name} n={n}: measured {} is {:.1}% from expected {}",
        o.measured,
        rel * 100.0,
        o.expected
    );
}

#[test]
fn blocked_meets_target_and_its_own_formula() {
    for &n in &SIZES {
        for (j, &p) in RATES.iter().enumerate() {
            let shape = sizing::blocked(n, p, 256).unwrap();
            let o = measure(
                n,
                p,
                10 + j as u64,
                256,
                |seed| BlockedBloom::new(shape, seed).unwrap(),
                |f, keys| f.insert_many(keys),
            );
            check("blocked", n, p, &o);
        }
    }
}

#[test]
fn classic_meets_target_and_its_own_formula() {
    for &n in &SIZES {
        for (j, &p) in RATES.iter().enumerate() {
            let shape = sizing::classic(n, p).unwrap();
            let o = measure(
                n,
                p,
                20 + j as u64,
                0,
                |seed| ClassicBloom::new(shape, seed).unwrap(),
                |f, keys| {
                    for k in keys {
                        f.insert(k);
                    }
                },
            );
            // The classic formula rounds k, so a classic filter may sit a
            // hair above p: held to p times the formula's own allowance.
            check("classic", n, p * classic_rounding_allowance(n, p), &o);
        }
    }
}

#[test]
fn concurrent_filter_matches_blocked_rate() {
    let n = 1_000_000u64;
    for (j, &p) in RATES.iter().enumerate() {
        let shape = sizing::blocked(n, p, 256).unwrap();
        let o = measure(
            n,
            p,
            30 + j as u64,
            256,
            |seed| AtomicBloom::new(shape, seed).unwrap(),
            |f, keys| {
                std::thread::scope(|s| {
                    for part in keys.chunks(keys.len() / 4) {
                        s.spawn(|| f.insert_many(part));
                    }
                });
            },
        );
        check("atomic", n, p, &o);
    }
}

#[test]
fn concurrent_classic_matches_its_formula() {
    let n = 1_000_000u64;
    for (j, &p) in RATES[1..3].iter().enumerate() {
        let shape = sizing::classic(n, p).unwrap();
        let o = measure(
            n,
            p,
            50 + j as u64,
            0,
            |seed| AtomicClassicBloom::new(shape, seed).unwrap(),
            |f, keys| {
                std::thread::scope(|s| {
                    for part in keys.chunks(keys.len() / 4) {
                        s.spawn(|| f.insert_many(part));
                    }
                });
            },
        );
        check(
            "atomic classic",
            n,
            p * classic_rounding_allowance(n, p),
            &o,
        );
    }
}

#[test]
fn counting_meets_target_and_its_own_formula() {
    let n = 100_000u64;
    for (j, &p) in RATES[..3].iter().enumerate() {
        let shape = sizing::blocked(n, p, 128).unwrap();
        let o = measure(
            n,
            p,
            40 + j as u64,
            128,
            |seed| CountingBloom::new(shape, seed).unwrap(),
            |f, keys| {
                for k in keys {
                    f.insert(k);
                }
            },
        );
        check("counting", n, p, &o);
    }
}

#[test]
fn counting_projection_answers_as_the_counters() {
    let members = Rng(4000).keys(50_000);
    let mut f = CountingBloom::with_fpr(50_000, 0.01).unwrap();
    for k in &members {
        f.insert(k);
    }
    let plain = f.to_bloom();
    let mut rng = Rng(4001);
    let mut positives = 0;
    for _ in 0..1_000_000 {
        let k = rng.next_u64();
        assert_eq!(plain.contains(&k), f.contains(&k));
        positives += usize::from(f.contains(&k));
    }
    assert!(positives > 0, "the comparison covered some positives");
    assert!(members.iter().all(|k| plain.contains(k)));
}

#[test]
fn string_keys_meet_target() {
    let n = 200_000u64;
    let p = 0.01;
    let members: Vec<String> = (0..n).map(|i| format!("user:{i}")).collect();
    let mut f = BlockedBloom::with_fpr(n, p).unwrap();
    for k in &members {
        f.insert(k.as_str());
    }
    assert!(members.iter().all(|k| f.contains(k.as_str())));
    let trials = 1_000_000u64;
    // Keys with the same prefix: the case where weak string hashes fail.
    let hits = (0..trials)
        .filter(|i| f.contains(format!("user:{}", n + i).as_str()))
        .count();
    let measured = hits as f64 / trials as f64;
    let expected = f.expected_fpr(n);
    assert!(
        measured <= p + three_sigma(p, trials),
        "measured {measured}"
    );
    assert!(
        (measured - expected).abs() / expected <= 0.15,
        "measured {measured} expected {expected}"
    );
}

#[test]
fn blocked_bits_per_key_at_one_percent_is_near_the_optimum() {
    for n in [10_000u64, 1_000_000, 100_000_000] {
        let s = bloomgate_filter::sizing::blocked(n, 0.01, 256).unwrap();
        let per_key = s.bits() as f64 / n as f64;
        assert!(per_key <= 9.59 * 1.15, "n={n}: {per_key} bits per key");
    }
}

/// 512-bit blocks (one whole cache line, positions uniform over it): the
/// measured rate meets the target and the exact model at the low rates
/// they are chosen for. At 1e-6 one filter of 10^6 keys and 3·10^8 probes
/// (about 300 false positives expected), so the tolerance is 4 standard
/// deviations of the count instead of a flat 15%.
#[test]
fn wide_blocks_meet_target_and_their_own_formula_at_low_rates() {
    for &n in &SIZES {
        for (j, &p) in [1e-3, 1e-4].iter().enumerate() {
            let shape = sizing::blocked(n, p, 512).unwrap();
            let o = measure(
                n,
                p,
                40 + j as u64,
                512,
                |seed| BlockedBloom::new(shape, seed).unwrap(),
                |f, keys| f.insert_many(keys),
            );
            check("blocked512", n, p, &o);
        }
    }
    let (n, p) = (1_000_000u64, 1e-6);
    let shape = sizing::blocked(n, p, 512).unwrap();
    let mut f = BlockedBloom::new(shape, 77).unwrap();
    let members = Rng(77).keys(n as usize);
    f.insert_many(&members);
    assert!(members.iter().all(|k| f.contains(k)), "false negative");
    let trials = 300_000_000u64;
    let mut rng = Rng(78);
    let hits = (0..trials).filter(|_| f.contains(&rng.next_u64())).count() as f64;
    let expected = f.expected_fpr(n) * trials as f64;
    let spread = sizing::blocked_fpr_spread(shape.blocks, 512, shape.hashes, n) * trials as f64;
    let sd = (expected + spread * spread).sqrt();
    eprintln!(
        "blocked512 n={n} p={p}: {hits} false positives, expected {expected:.1} (sd {sd:.1})"
    );
    assert!(hits <= p * trials as f64 + 4.0 * sd, "{hits} above target");
    assert!(
        (hits - expected).abs() <= 4.0 * sd,
        "{hits} vs model {expected}"
    );
}

/// Bits per key against the classic optimum `-ln p / ln² 2`: what one
/// cache line per check costs. 512-bit blocks reach 1.2x at 1e-4; at 1e-6
/// no single-line blocked layout can (the exact model's best is ~1.35x,
/// BENCHMARKS.md), and `with_fpr` keeps 256-bit blocks where they cost
/// less than a tenth more memory.
#[test]
fn low_rates_pick_wide_blocks_and_stay_near_the_optimum() {
    for n in [10_000u64, 1_000_000, 100_000_000] {
        let classic = |p: f64| -p.ln() / std::f64::consts::LN_2.powi(2);
        let per_key = |s: sizing::BlockedParams| s.bits() as f64 / n as f64;
        let at4 = sizing::blocked_auto(n, 1e-4).unwrap();
        assert_eq!(at4.block_bits, 512);
        assert!(
            per_key(at4) <= 1.2 * classic(1e-4),
            "n={n} 1e-4: {}",
            per_key(at4)
        );
        let narrow4 = sizing::blocked(n, 1e-4, 256).unwrap();
        assert!(
            per_key(narrow4) > 1.3 * classic(1e-4),
            "the reason for the switch"
        );
        let at6 = sizing::blocked_auto(n, 1e-6).unwrap();
        assert_eq!(at6.block_bits, 512);
        assert!(
            per_key(at6) <= 1.36 * classic(1e-6),
            "n={n} 1e-6: {}",
            per_key(at6)
        );
        let at2 = sizing::blocked_auto(n, 1e-2).unwrap();
        assert_eq!(at2.block_bits, 256, "1% keeps the fast 256-bit probe");
        assert_eq!(
            BlockedBloom::with_fpr(n.min(1_000_000), 1e-4)
                .unwrap()
                .params()
                .block_bits,
            512
        );
    }
}
