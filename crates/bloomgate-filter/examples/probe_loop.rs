//! A query loop for profiling: `perf record` this binary.
use bloomgate_filter::{BlockedBloom, Filter};
fn main() {
    let n = 1_000_000u64;
    let mut f = BlockedBloom::with_fpr(n, 0.01).unwrap();
    for i in 0..n {
        f.insert(&bloomgate_filter::hash::splitmix64(i));
    }
    let mut hits = 0u64;
    let t = std::time::Instant::now();
    for round in 0..100u64 {
        for i in 0..1_000_000u64 {
            hits += u64::from(f.contains(&(i ^ (round << 40))));
        }
    }
    println!("{hits} {:.2} ns/query", t.elapsed().as_nanos() as f64 / 1e8);
}
