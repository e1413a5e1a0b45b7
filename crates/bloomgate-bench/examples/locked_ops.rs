//! What an `AtomicBloom` insert is made of (issue 11): the locked
//! read-modify-writes it cannot avoid, timed on words already in L1, next
//! to both filters' inserts into a filter small enough for L1.
//!
//! `cargo run --release -p bloomgate-bench --example locked_ops`
//!
//! A fresh key at `k = 8` lacks bits in all four words of its block, so the
//! insert pays four `lock or` (one per word); the item count is a plain
//! load and store into the thread's own cell, and the shared `lock xadd` it
//! replaced is timed too. The heap filter pays one 32-byte OR. Also timed:
//! two `lock cmpxchg16b` (one per 16-byte half), the alternative that
//! halves the locked instructions; BENCHMARKS.md says why inserts do not
//! use it.

use std::arch::asm;
use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};

use bloomgate_bench::{median, ns_per};
use bloomgate_filter::hash::{splitmix64, HashPair};
use bloomgate_filter::{AtomicBloom, BlockedBloom};

/// A cache line of words, aligned as the filters' lines are.
#[derive(Clone, Copy)]
#[repr(align(64))]
struct Line([u64; 8]);

const OPS: usize = 20_000_000;
const ROUNDS: usize = 5;

fn main() {
    assert!(
        std::arch::is_x86_feature_detected!("cmpxchg16b"),
        "this example times cmpxchg16b, which this CPU lacks"
    );
    let words: Vec<AtomicU64> = (0..4096).map(|_| AtomicU64::new(0)).collect();
    let count = AtomicU64::new(0);
    let mut plain = vec![0u64; 4096];
    // 10^4 keys at 1%: 12 KiB, in L1; fresh filters each round.
    let keys: Vec<HashPair> = (0..10_000u64)
        .map(|i| HashPair {
            h1: splitmix64(i),
            h2: 0,
        })
        .collect();
    // The shape is searched once; `new` then only allocates 12 KiB.
    let shape = bloomgate_filter::sizing::blocked(10_000, 0.01, 256).unwrap();
    let mut lines = vec![Line([0; 8]); 512];
    let mut t: [Vec<f64>; 7] = Default::default();
    for _ in 0..ROUNDS {
        t[0].push(ns_per(OPS, || {
            for i in 0..OPS {
                let j = (i * 4) & 4095;
                let v = black_box(i as u64);
                for w in &words[j..j + 4] {
                    w.fetch_or(v, Ordering::Relaxed);
                }
            }
        }));
        t[1].push(ns_per(OPS, || {
            for i in 0..OPS {
                count.fetch_add(black_box(1), Ordering::Relaxed);
                black_box(i);
            }
        }));
        t[2].push(ns_per(OPS, || {
            for i in 0..OPS {
                let j = (i * 4) & 4095;
                let v = black_box(i as u64);
                for w in &mut plain[j..j + 4] {
                    *w |= v;
                }
            }
        }));
        let reps = OPS / keys.len() / 10;
        let ops = reps * keys.len();
        t[3].push(ns_per(ops, || {
            for _ in 0..reps {
                let mut f = BlockedBloom::new(shape, 0).unwrap();
                for &h in &keys {
                    f.insert_hash(black_box(h));
                }
                black_box(&f);
            }
        }));
        t[4].push(ns_per(ops, || {
            for _ in 0..reps {
                let f = AtomicBloom::new(shape, 0).unwrap();
                for &h in &keys {
                    f.insert_hash(black_box(h));
                }
                black_box(&f);
            }
        }));
        t[5].push(ns_per(ops, || {
            for _ in 0..reps {
                let f = AtomicBloom::new(shape, 0).unwrap();
                f.insert_hashes(black_box(&keys));
                black_box(&f);
            }
        }));
        t[6].push(ns_per(OPS, || {
            for i in 0..OPS {
                let line = &mut lines[(i * 7) & 511].0;
                let v = black_box(i as u64);
                let (p, seen) = (line.as_mut_ptr(), [line[0], line[1], line[2], line[3]]);
                or128(p, [seen[0], seen[1]], [v, v]);
                or128(p.wrapping_add(2), [seen[2], seen[3]], [v, v]);
            }
        }));
    }
    black_box(&lines);
    let m: Vec<f64> = t.iter().map(|v| median(v.clone())).collect();
    println!("median of {ROUNDS} rounds, ns per operation (L1-resident words)\n");
    println!("| operation | ns | ÷ BlockedBloom insert |");
    println!("|---|---|---|");
    for (name, ns) in [
        (
            "2 × `lock cmpxchg16b`, one block (the alternative; value read first)",
            m[6],
        ),
        ("4 × `fetch_or` (`lock or`), one block", m[0]),
        (
            "1 × `fetch_add` (`lock xadd`), the shared count it replaced",
            m[1],
        ),
        ("4 × plain OR, one block", m[2]),
        ("BlockedBloom insert_hash (10^4 keys)", m[3]),
        ("AtomicBloom insert_hash (10^4 keys)", m[4]),
        ("AtomicBloom insert_hashes (10^4 keys, counted once)", m[5]),
    ] {
        println!("| {name} | {ns:.2} | {:.2} |", ns / m[3]);
    }
    println!(
        "\nfloor of a fresh AtomicBloom insert (4 locked ORs): {:.2} ns = {:.2}× BlockedBloom's insert",
        m[0],
        m[0] / m[3]
    );
}

/// ORs `bits` into the 16 bytes at `p` with one `lock cmpxchg16b`,
/// retrying from what it finds.
fn or128(p: *mut u64, seen: [u64; 2], bits: [u64; 2]) {
    assert!((p as usize).is_multiple_of(16));
    // SAFETY: `p` points at 16 aligned bytes of `lines`, which this thread
    // borrows mutably; this runs only on x86_64 CPUs with `cmpxchg16b`
    // (checked in `main`). rbx, which the exchange needs and the compiler
    // may use, is saved in rsi; every operand has a named register.
    unsafe {
        asm!(
            "mov rsi, rbx",
            "2:",
            "mov rbx, rax",
            "or rbx, r8",
            "mov rcx, rdx",
            "or rcx, r9",
            "lock cmpxchg16b xmmword ptr [rdi]",
            "jne 2b",
            "mov rbx, rsi",
            in("rdi") p,
            in("r8") bits[0],
            in("r9") bits[1],
            out("rsi") _,
            inout("rax") seen[0] => _,
            inout("rdx") seen[1] => _,
            out("rcx") _,
            options(nostack),
        );
    }
}
