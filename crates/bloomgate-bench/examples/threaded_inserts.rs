//! `AtomicBloom` inserts from one and two threads at once, with its
//! per-thread item count, next to the same inserts plus one shared
//! `fetch_add` each (what the count cost before it was per-thread; the
//! shared counter here sits on a line of its own, so this is a lower bound
//! of that cost).
//!
//! `cargo run --release -p bloomgate-bench --example threaded_inserts -- [n…]`
//!
//! Each thread inserts its own `n / threads` keys (precomputed hashes) into
//! one fresh filter sized for `n` at 1%; the time is wall-clock per insert,
//! median of 5 rounds.

use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use bloomgate_bench::median;
use bloomgate_filter::hash::{splitmix64, HashPair};
use bloomgate_filter::{AtomicBloom, Filter};

const ROUNDS: usize = 5;

/// A counter alone on its cache lines.
#[repr(align(128))]
struct Shared(AtomicU64);

fn main() {
    let sizes: Vec<u64> = std::env::args()
        .skip(1)
        .map(|a| a.parse().expect("sizes are key counts"))
        .collect();
    let sizes = if sizes.is_empty() {
        vec![1_000_000, 10_000_000]
    } else {
        sizes
    };
    println!("| n | threads | per-thread count ns | + shared `fetch_add` ns | ratio |");
    println!("|---|---|---|---|---|");
    for n in sizes {
        let hashes: Vec<HashPair> = (0..n)
            .map(|i| HashPair {
                h1: splitmix64(i),
                h2: 0,
            })
            .collect();
        for threads in [1usize, 2] {
            let mut t = [vec![], vec![]];
            for _ in 0..ROUNDS {
                for (col, shared) in [None, Some(Shared(AtomicU64::new(0)))]
                    .into_iter()
                    .enumerate()
                {
                    let f = AtomicBloom::with_fpr(n, 0.01).unwrap();
                    let start = Instant::now();
                    std::thread::scope(|s| {
                        for part in hashes.chunks(hashes.len().div_ceil(threads)) {
                            let (f, shared) = (&f, &shared);
                            s.spawn(move || {
                                for &h in part {
                                    f.insert_hash(h);
                                    if let Some(c) = shared {
                                        c.0.fetch_add(1, Ordering::Relaxed);
                                    }
                                }
                            });
                        }
                    });
                    t[col].push(start.elapsed().as_nanos() as f64 / n as f64);
                    assert_eq!(f.items(), n);
                    black_box(&f);
                }
            }
            let (own, shared) = (median(t[0].clone()), median(t[1].clone()));
            println!(
                "| {n} | {threads} | {own:.2} | {shared:.2} | {:.2} |",
                shared / own
            );
        }
    }
}
