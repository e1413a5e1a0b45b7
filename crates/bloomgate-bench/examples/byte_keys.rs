//! Byte keys (issue 11): 16- and 64-byte keys, every filter hashing them
//! itself (bloomgate: XXH3-128; fastbloom: its default SipHash-1-3, and
//! foldhash, the fast hasher its documentation suggests), 1% target.
//! Peers alternate in one process; median of 5 rounds.
//!
//! `cargo run --release -p bloomgate-bench --example byte_keys -- 1000000`

use std::hint::black_box;

use bloomgate_bench::{median, ns_per};

use bloomgate_filter::hash::splitmix64;
use bloomgate_filter::{BlockedBloom, Filter};

const ROUNDS: usize = 5;

fn key<const N: usize>(i: u64) -> [u8; N] {
    let mut k = [0u8; N];
    for (j, chunk) in k.chunks_mut(8).enumerate() {
        let w = splitmix64(i.wrapping_mul(31).wrapping_add(j as u64)).to_le_bytes();
        chunk.copy_from_slice(&w[..chunk.len()]);
    }
    k
}

fn run<const N: usize>(n: usize) {
    let members: Vec<[u8; N]> = (0..n as u64).map(key::<N>).collect();
    let probes = n.min(1_000_000);
    let others: Vec<[u8; N]> = (0..probes as u64).map(|i| key::<N>(i | 1 << 60)).collect();
    let names = [
        "fastbloom (default: SipHash-1-3)",
        "fastbloom + foldhash",
        "BlockedBloom",
        "BlockedBloom insert_many / contains_many",
    ];
    let mut t: Vec<[Vec<f64>; 3]> = (0..4).map(|_| Default::default()).collect();
    let mut fpr = [0.0; 4];
    for round in 0..ROUNDS {
        let mut fb = fastbloom::BloomFilter::with_false_pos(0.01).expected_items(n);
        t[0][0].push(ns_per(n, || {
            for k in &members {
                fb.insert(k);
            }
        }));
        let mut ff = fastbloom::BloomFilter::with_false_pos(0.01)
            .hasher(foldhash::fast::FixedState::with_seed(7))
            .expected_items(n);
        t[1][0].push(ns_per(n, || {
            for k in &members {
                ff.insert(k);
            }
        }));
        let mut b = BlockedBloom::with_fpr(n as u64, 0.01).unwrap();
        t[2][0].push(ns_per(n, || {
            for k in &members {
                b.insert(k);
            }
        }));
        let mut bm = BlockedBloom::with_fpr(n as u64, 0.01).unwrap();
        t[3][0].push(ns_per(n, || bm.insert_many(&members)));
        let mut out = vec![false; probes];
        for (col, set) in [(1, &members[..probes]), (2, &others[..])] {
            let mut hits = [0usize; 4];
            t[0][col].push(ns_per(probes, || {
                hits[0] = set.iter().filter(|k| fb.contains(black_box(*k))).count();
            }));
            t[1][col].push(ns_per(probes, || {
                hits[1] = set.iter().filter(|k| ff.contains(black_box(*k))).count();
            }));
            t[2][col].push(ns_per(probes, || {
                hits[2] = set.iter().filter(|k| b.contains(black_box(*k))).count();
            }));
            t[3][col].push(ns_per(probes, || {
                bm.contains_many(black_box(set), &mut out).unwrap();
                hits[3] = out.iter().filter(|&&x| x).count();
            }));
            if col == 1 {
                assert!(hits.iter().all(|&h| h == probes), "false negative");
            } else if round == 0 {
                fpr = hits.map(|h| h as f64 / probes as f64);
            }
        }
    }
    println!("\n### {N}-byte keys, n = {n} (1% target; median of {ROUNDS} rounds)\n");
    println!("| filter | bits/key | insert ns | member ns | non-member ns | insert ÷ fastbloom | member ÷ fastbloom | non-member ÷ fastbloom | FPR |");
    println!("|---|---|---|---|---|---|---|---|---|");
    let base: Vec<f64> = t[0].iter().map(|v| median(v.clone())).collect();
    let fb_bits = fastbloom::BloomFilter::with_false_pos(0.01)
        .expected_items(n)
        .num_bits() as f64;
    let bits = [
        fb_bits,
        fb_bits,
        BlockedBloom::with_fpr(n as u64, 0.01).unwrap().bits() as f64,
        BlockedBloom::with_fpr(n as u64, 0.01).unwrap().bits() as f64,
    ];
    for (i, name) in names.iter().enumerate() {
        let m: Vec<f64> = t[i].iter().map(|v| median(v.clone())).collect();
        println!(
            "| {name} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.3}% |",
            bits[i] / n as f64,
            m[0],
            m[1],
            m[2],
            m[0] / base[0],
            m[1] / base[1],
            m[2] / base[2],
            fpr[i] * 100.0
        );
    }
}

fn main() {
    let sizes = bloomgate_bench::sizes_from_args(&[1_000_000]);
    for n in sizes {
        run::<16>(n);
        run::<64>(n);
    }
}
