//! One query loop, two filters: bloomgate's blocked filter and sbbf-rs-safe,
//! for profiling the difference (`perf record` this binary).
use bloomgate_filter::hash::splitmix64;
use bloomgate_filter::{BlockedBloom, Filter};
use std::hint::black_box;

fn time(name: &str, f: impl Fn(u64) -> bool) {
    let only = std::env::args().nth(2).unwrap_or_default();
    if !only.is_empty() && only != name {
        return;
    }
    let rounds = if only.is_empty() { 50 } else { 1 };
    let t = std::time::Instant::now();
    let mut hits = 0u64;
    for round in 0..rounds {
        for i in 0..1_000_000u64 {
            hits += u64::from(f(black_box(i ^ (round << 40))));
        }
    }
    println!(
        "{name}: {hits} {:.2} ns/query",
        t.elapsed().as_nanos() as f64 / 5e7
    );
}

fn main() {
    let n = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(1_000_000u64);
    let mut f = BlockedBloom::with_fpr(n, 0.01).unwrap();
    let mut s = sbbf_rs_safe::Filter::new(10, n as usize);
    for i in 0..n {
        let k = splitmix64(i);
        f.insert(&k);
        s.insert_hash(splitmix64(k));
    }
    for _ in 0..2 {
        time("bloomgate", |k| f.contains(&k));
        time("sbbf", |k| s.contains_hash(splitmix64(k)));
        let keys: Vec<u64> = (0..1_000_000u64).map(|i| i ^ (7 << 40)).collect();
        let mut out = vec![false; keys.len()];
        let t = std::time::Instant::now();
        for _ in 0..10 {
            f.contains_many(black_box(&keys), &mut out).unwrap();
        }
        let hits = out.iter().filter(|&&b| b).count();
        println!(
            "bloomgate batch: {hits} {:.2} ns/query",
            t.elapsed().as_nanos() as f64 / 1e7
        );
    }
}
