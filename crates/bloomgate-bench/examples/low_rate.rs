//! Low rates (issue 11): bits per key, speed and measured FPR at p = 1e-4
//! and 1e-6 for the classic filter (the memory optimum, `k` cache lines),
//! 256-bit blocks, 512-bit blocks (what `BlockedBloom::with_fpr` picks
//! there) and sbbf-rs-safe given the 512-bit filter's memory. Every filter
//! gets the same precomputed hashes; peers run alternately in one process.
//!
//! `cargo run --release -p bloomgate-bench --example low_rate -- 1000000`

use std::hint::black_box;

use bloomgate_bench::{median, ns_per};

use bloomgate_filter::hash::{splitmix64, HashPair};
use bloomgate_filter::{sizing, BlockedBloom, ClassicBloom, Filter};

const ROUNDS: usize = 3;

/// One filter under test, behind closures over precomputed hashes.
enum Peer {
    Classic(ClassicBloom),
    Blocked(BlockedBloom),
    Sbbf(sbbf_rs_safe::Filter),
}

impl Peer {
    fn insert(&mut self, h: HashPair) {
        match self {
            Self::Classic(f) => {
                f.insert_hash(h);
            }
            Self::Blocked(f) => {
                f.insert_hash(h);
            }
            Self::Sbbf(f) => {
                f.insert_hash(h.h1);
            }
        }
    }

    fn contains(&self, h: HashPair) -> bool {
        match self {
            Self::Classic(f) => f.contains_hash(h),
            Self::Blocked(f) => f.contains_hash(h),
            Self::Sbbf(f) => f.contains_hash(h.h1),
        }
    }
}

fn pair(i: u64) -> HashPair {
    let h1 = splitmix64(i);
    HashPair {
        h1,
        h2: splitmix64(h1) | 1,
    }
}

fn run(n: usize, p: f64) {
    let optimum = -p.ln() / std::f64::consts::LN_2.powi(2);
    let classic = sizing::classic(n as u64, p).unwrap();
    let narrow = sizing::blocked(n as u64, p, 256).unwrap();
    let wide = sizing::blocked_auto(n as u64, p).unwrap();
    let wide_bits_per_key = wide.bits() as f64 / n as f64;
    // sbbf sizes by whole bits per key; give it the 512-bit filter's memory.
    let sbbf_bpk = wide_bits_per_key.round() as usize;
    let make = |which: usize| -> Peer {
        match which {
            0 => Peer::Classic(ClassicBloom::new(classic, 0).unwrap()),
            1 => Peer::Blocked(BlockedBloom::new(narrow, 0).unwrap()),
            2 => Peer::Blocked(BlockedBloom::new(wide, 0).unwrap()),
            _ => Peer::Sbbf(sbbf_rs_safe::Filter::new(sbbf_bpk, n)),
        }
    };
    let names = [
        "ClassicBloom (k lines)",
        "BlockedBloom 256-bit",
        "BlockedBloom 512-bit (with_fpr)",
        "sbbf-rs-safe, same memory as 512",
    ];
    let bits = [
        classic.bits as f64,
        narrow.bits() as f64,
        wide.bits() as f64,
        (sbbf_bpk * n) as f64,
    ];
    let members: Vec<HashPair> = (0..n as u64).map(pair).collect();
    let probes = 1_000_000usize.min(n);
    let others: Vec<HashPair> = (0..probes as u64).map(|i| pair(i | 1 << 62)).collect();
    let mut times = vec![[vec![], vec![], vec![]]; 4];
    let mut filters: Vec<Peer> = Vec::new();
    for round in 0..ROUNDS {
        filters.clear();
        for (which, t) in times.iter_mut().enumerate() {
            let mut f = make(which);
            t[0].push(ns_per(n, || {
                for &h in &members {
                    f.insert(h);
                }
            }));
            filters.push(f);
        }
        for (f, t) in filters.iter().zip(times.iter_mut()) {
            let mut found = 0;
            t[1].push(ns_per(probes, || {
                found = members[..probes]
                    .iter()
                    .filter(|&&h| f.contains(black_box(h)))
                    .count();
            }));
            assert_eq!(found, probes, "false negative");
            t[2].push(ns_per(probes, || {
                black_box(others.iter().filter(|&&h| f.contains(black_box(h))).count());
            }));
        }
        let _ = round;
    }
    // Measured FPR: enough probes for ~300 false positives at the target.
    let fpr_probes = ((300.0 / p) as u64).max(1_000_000);
    println!("\n### n = {n}, p = {p:e} (classic optimum {optimum:.2} bits/key; median of {ROUNDS} rounds; FPR over {fpr_probes} non-members)\n");
    println!("| filter | bits/key | ÷ optimum | lines/check | insert ns | member ns | non-member ns | non-member ÷ 512 | measured FPR |");
    println!("|---|---|---|---|---|---|---|---|---|");
    let base = median(times[2][2].clone());
    for (i, f) in filters.iter().enumerate() {
        let hits = (0..fpr_probes)
            .filter(|&j| f.contains(pair(j | 1 << 61)))
            .count();
        let lines = if i == 0 {
            format!("≤{}", classic.hashes)
        } else {
            "1".into()
        };
        let m: Vec<f64> = times[i].iter().map(|v| median(v.clone())).collect();
        println!(
            "| {} | {:.2} | {:.3} | {lines} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2e} |",
            names[i],
            bits[i] / n as f64,
            bits[i] / n as f64 / optimum,
            m[0],
            m[1],
            m[2],
            m[2] / base,
            hits as f64 / fpr_probes as f64
        );
    }
    println!(
        "\nshapes: classic k={}, 256-bit k={}, 512-bit k={}",
        classic.hashes, narrow.hashes, wide.hashes
    );
}

fn main() {
    let sizes = bloomgate_bench::sizes_from_args(&[1_000_000]);
    for n in sizes {
        for p in [1e-4, 1e-6] {
            run(n, p);
        }
    }
}
