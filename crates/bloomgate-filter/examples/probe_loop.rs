//! A query loop for profiling: `perf record` this binary.
//! `probe_loop [n] [p] [member|other|insert]` (defaults 10^6, 0.01, other).
use bloomgate_filter::hash::splitmix64;
use bloomgate_filter::{BlockedBloom, Filter};
fn main() {
    let args: Vec<String> = std::env::args().collect();
    let n: u64 = args
        .get(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(1_000_000);
    let p: f64 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(0.01);
    let what = args.get(3).map_or("other", String::as_str);
    let mut f = BlockedBloom::with_fpr(n, p).unwrap();
    let t = std::time::Instant::now();
    for i in 0..n {
        f.insert(&splitmix64(i));
    }
    let insert_ns = t.elapsed().as_nanos() as f64 / n as f64;
    if what == "insert" {
        let t = std::time::Instant::now();
        for round in 0..100u64 {
            for i in 0..n {
                f.insert(&splitmix64(i ^ round << 40));
            }
        }
        let ns = t.elapsed().as_nanos() as f64 / (100 * n) as f64;
        println!(
            "block_bits {}: insert {ns:.2} ns (warm)",
            f.params().block_bits
        );
        return;
    }
    let mut hits = 0u64;
    let t = std::time::Instant::now();
    let rounds = 100_000_000 / n.max(1);
    for round in 0..rounds {
        for i in 0..n {
            let key = if what == "member" {
                splitmix64(i)
            } else {
                i ^ (round << 40) ^ (1 << 62)
            };
            hits += u64::from(f.contains(&key));
        }
    }
    let q = (rounds * n) as f64;
    println!(
        "block_bits {} k {}: insert {insert_ns:.2} ns, {what} {:.2} ns/query ({hits} hits)",
        f.params().block_bits,
        f.hashes(),
        t.elapsed().as_nanos() as f64 / q
    );
}
