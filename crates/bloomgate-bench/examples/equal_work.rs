//! Equal work (issue 11): every filter is handed the same precomputed
//! 64-bit hash per key, so only the filters' own work is timed. Peers run
//! alternately in one process, several rounds; the median per operation is
//! reported with its ratio to sbbf-rs-safe.
//!
//! `cargo run --release -p bloomgate-bench --example equal_work -- 1000000 100000000`
//! (sizes as arguments; default both). Build with
//! `RUSTFLAGS="-C target-cpu=x86-64-v3"` for the per-binary AVX2 build.

use std::hint::black_box;

use bloomgate_bench::{median, ns_per};

use bloomgate_filter::hash::{splitmix64, HashPair};
use bloomgate_filter::{AtomicBloom, BlockedBloom, Filter};

const ROUNDS: usize = 5;

fn pair(h: u64) -> HashPair {
    HashPair { h1: h, h2: 0 }
}

fn run(n: usize) {
    // Probes: large enough at 10^8 that each round misses the caches.
    let probes = if n > 10_000_000 { 4_000_000 } else { 100_000 };
    // Small filters: repeat each probe loop so a timing covers ~2M queries.
    let reps = if n > 10_000_000 { 1 } else { 20 };
    let member: Vec<u64> = (0..n as u64).map(|i| splitmix64(i ^ 0xabc)).collect();
    let stride = (n / probes).max(1);
    let members: Vec<u64> = member
        .iter()
        .step_by(stride)
        .take(probes)
        .copied()
        .collect();
    let others: Vec<u64> = (0..probes as u64)
        .map(|i| splitmix64(i ^ (1 << 62)))
        .collect();
    let member_pairs: Vec<HashPair> = members.iter().map(|&h| pair(h)).collect();
    let other_pairs: Vec<HashPair> = others.iter().map(|&h| pair(h)).collect();

    let mut rows: Vec<(&str, [Vec<f64>; 3])> = [
        "sbbf-rs-safe",
        "BlockedBloom",
        "contains_hashes (batch)",
        "AtomicBloom",
        "AtomicBloom batch",
    ]
    .into_iter()
    .map(|name| (name, [vec![], vec![], vec![]]))
    .collect();
    let mut fpr = [0.0f64; 2];
    for round in 0..ROUNDS {
        // Inserts: fresh filters each round, timed over all n keys.
        let mut s = sbbf_rs_safe::Filter::new(10, n);
        rows[0].1[0].push(ns_per(n, || {
            for &h in &member {
                s.insert_hash(h);
            }
        }));
        let mut b = BlockedBloom::with_fpr(n as u64, 0.01).unwrap();
        rows[1].1[0].push(ns_per(n, || {
            for &h in &member {
                b.insert_hash(pair(h));
            }
        }));
        let mut bb = BlockedBloom::with_fpr(n as u64, 0.01).unwrap();
        let all_pairs: Vec<HashPair> = member.iter().map(|&h| pair(h)).collect();
        rows[2].1[0].push(ns_per(n, || bb.insert_hashes(&all_pairs)));
        drop(bb);
        let a = AtomicBloom::with_fpr(n as u64, 0.01).unwrap();
        rows[3].1[0].push(ns_per(n, || {
            for &h in &member {
                a.insert_hash(pair(h));
            }
        }));
        let ab = AtomicBloom::with_fpr(n as u64, 0.01).unwrap();
        rows[4].1[0].push(ns_per(n, || ab.insert_hashes(&all_pairs)));
        drop(ab);
        drop(all_pairs);
        let mut out = vec![false; probes];
        for (col, (hs, ps)) in [(&members, &member_pairs), (&others, &other_pairs)]
            .into_iter()
            .enumerate()
        {
            let mut hits = [0usize; 5];
            let ops = probes * reps;
            rows[0].1[col + 1].push(ns_per(ops, || {
                for _ in 0..reps {
                    hits[0] = hs
                        .iter()
                        .filter(|&&h| s.contains_hash(black_box(h)))
                        .count();
                }
            }));
            rows[1].1[col + 1].push(ns_per(ops, || {
                for _ in 0..reps {
                    hits[1] = ps
                        .iter()
                        .filter(|&&h| b.contains_hash(black_box(h)))
                        .count();
                }
            }));
            rows[2].1[col + 1].push(ns_per(ops, || {
                for _ in 0..reps {
                    b.contains_hashes(black_box(ps), &mut out).unwrap();
                    hits[2] = out.iter().filter(|&&x| x).count();
                }
            }));
            rows[3].1[col + 1].push(ns_per(ops, || {
                for _ in 0..reps {
                    hits[3] = ps
                        .iter()
                        .filter(|&&h| a.contains_hash(black_box(h)))
                        .count();
                }
            }));
            rows[4].1[col + 1].push(ns_per(ops, || {
                for _ in 0..reps {
                    a.contains_hashes(black_box(ps), &mut out).unwrap();
                    hits[4] = out.iter().filter(|&&x| x).count();
                }
            }));
            if col == 0 {
                assert!(
                    hits.iter().all(|&h| h == probes),
                    "no false negatives: {hits:?}"
                );
            } else {
                assert_eq!(hits[1], hits[2]);
                assert_eq!(hits[1], hits[3]);
                assert_eq!(hits[3], hits[4]);
                if round == 0 {
                    fpr = [
                        hits[0] as f64 / probes as f64,
                        hits[1] as f64 / probes as f64,
                    ];
                }
            }
        }
    }
    println!("\n### n = {n} (equal work: one precomputed 64-bit hash per key; median of {ROUNDS} rounds)\n");
    println!("| filter | insert ns | member ns | non-member ns | insert ÷ sbbf | member ÷ sbbf | non-member ÷ sbbf |");
    println!("|---|---|---|---|---|---|---|");
    let base: Vec<f64> = rows[0].1.iter().map(|v| median(v.clone())).collect();
    for (name, cols) in &rows {
        let m: Vec<f64> = cols.iter().map(|v| median(v.clone())).collect();
        println!(
            "| {name} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} |",
            m[0],
            m[1],
            m[2],
            m[0] / base[0],
            m[1] / base[1],
            m[2] / base[2]
        );
    }
    println!(
        "\nmeasured FPR over {probes} non-members: sbbf-rs-safe {:.3}%, BlockedBloom {:.3}%",
        fpr[0] * 100.0,
        fpr[1] * 100.0
    );
}

fn main() {
    let sizes = bloomgate_bench::sizes_from_args(&[1_000_000, 100_000_000]);
    println!(
        "avx2 at run time: {}; compiled with avx2: {}",
        std::arch::is_x86_feature_detected!("avx2"),
        cfg!(target_feature = "avx2")
    );
    for n in sizes {
        run(n);
    }
}
