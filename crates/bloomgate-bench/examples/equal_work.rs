//! Equal work (issue 11): every filter is handed the same precomputed
//! 64-bit hash per key, so only the filters' own work is timed. Peers run
//! alternately in one process, several rounds, the queries in an order that
//! starts one peer later each round; the median per operation is reported,
//! and its ratio to sbbf-rs-safe as the median of the rounds' ratios (this
//! VM's speed drifts by up to 2x between rounds). At round 0 it prints each
//! large mapping's huge-page share: which filters the kernel actually gave
//! huge pages.
//!
//! sbbf runs twice: as shipped, and with its buffer advised
//! `MADV_HUGEPAGE` before the first write (through the bench's allocator,
//! [`BenchAlloc`]), as bloomgate's own storage of 2 MiB or more is. Where the kernel gives transparent huge pages only on
//! request, the shipped sbbf pays a TLB miss per query at 10^8 keys; the
//! ratios are taken against the huge-page run, the stricter peer.
//!
//! `cargo run --release -p bloomgate-bench --example equal_work -- 1000000 100000000`
//! (sizes as arguments; default both; `--rounds=N` for N rounds instead of
//! 5, for a machine whose timings drift; `--ab` for only the batch call
//! against sbbf's hand-prefetched loop). Build with
//! `RUSTFLAGS="-C target-cpu=x86-64-v3"` for the per-binary AVX2 build.

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use bloomgate_bench::{median, ns_per};

use bloomgate_filter::hash::{splitmix64, HashPair};
use bloomgate_filter::{AtomicBloom, BlockedBloom, Filter};

/// Rounds per size unless `--rounds=N` says otherwise.
const ROUNDS: usize = 5;

fn pair(h: u64) -> HashPair {
    HashPair { h1: h, h2: 0 }
}

/// The bench's allocator: the system's, except that a large block (2 MiB
/// or more, aligned to at most a page) asked for while [`ADVISE_HUGE`] is
/// set is a fresh anonymous mapping advised `MADV_HUGEPAGE`. sbbf allocates its buffer with
/// `alloc_zeroed` at 64-byte alignment, which the system allocator serves
/// by writing zeros over every page: advised afterwards, as this bench once
/// did, the buffer was already on 4 KiB pages (0 of 119 MiB huge at 10^8).
/// A fresh mapping is zero already and is advised before its first fault,
/// as bloomgate's own storage is. Everything else, the shipped sbbf's
/// buffer too, is the system allocator's.
struct BenchAlloc;

#[global_allocator]
static ALLOCATOR: BenchAlloc = BenchAlloc;

/// Set while the huge-page sbbf allocates its buffer.
static ADVISE_HUGE: AtomicBool = AtomicBool::new(false);

/// Set when a mapping's `madvise` failed (reported after, by [`sbbf_huge`]:
/// printing inside the allocator would allocate).
static ADVICE_FAILED: AtomicBool = AtomicBool::new(false);

/// The blocks [`BenchAlloc`] mapped (0: a free slot).
static MAPPED: [AtomicUsize; 8] = [const { AtomicUsize::new(0) }; 8];

/// A fresh zeroed mapping for `layout`, recorded in [`MAPPED`]; null when
/// the block is not one to map, or no slot or mapping is left.
fn map(layout: Layout) -> *mut u8 {
    if !ADVISE_HUGE.load(Ordering::Relaxed) || layout.size() < 2 << 20 || layout.align() > 4096 {
        return std::ptr::null_mut();
    }
    // SAFETY: an anonymous private mapping at an address the kernel picks
    // aliases nothing; `madvise` on it changes no contents.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            layout.size(),
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return std::ptr::null_mut();
    }
    let slot = MAPPED.iter().find(|s| {
        s.compare_exchange(0, p as usize, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
    });
    if slot.is_none() {
        // SAFETY: `p` is the mapping just made, of this size.
        unsafe { libc::munmap(p, layout.size()) };
        return std::ptr::null_mut();
    }
    // SAFETY: as above.
    if unsafe { libc::madvise(p, layout.size(), libc::MADV_HUGEPAGE) } != 0 {
        ADVICE_FAILED.store(true, Ordering::Relaxed);
    }
    p.cast()
}

/// Unmaps `ptr` if [`map`] made it; false when it is the system's.
fn unmap(ptr: *mut u8, size: usize) -> bool {
    let Some(slot) = MAPPED
        .iter()
        .find(|s| s.load(Ordering::Relaxed) == ptr as usize)
    else {
        return false;
    };
    slot.store(0, Ordering::Relaxed);
    // SAFETY: `ptr` is a mapping `map` made for a layout of this size.
    unsafe { libc::munmap(ptr.cast(), size) };
    true
}

// SAFETY: a mapped block is unmapped with the size it was mapped with (a
// layout's size is the same at alloc and dealloc), and only it; every
// other block is the system allocator's, allocated and freed by it.
unsafe impl GlobalAlloc for BenchAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = map(layout);
        if p.is_null() {
            // SAFETY: the caller's layout, as `GlobalAlloc::alloc` requires.
            unsafe { System.alloc(layout) }
        } else {
            p
        }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = map(layout);
        if p.is_null() {
            // SAFETY: the caller's layout, as `alloc_zeroed` requires.
            unsafe { System.alloc_zeroed(layout) }
        } else {
            p
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if !unmap(ptr, layout.size()) {
            // SAFETY: not one of ours, so the system allocated it with
            // this layout.
            unsafe { System.dealloc(ptr, layout) }
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if !MAPPED
            .iter()
            .any(|s| s.load(Ordering::Relaxed) == ptr as usize)
        {
            // SAFETY: the system's block, with the caller's layout.
            return unsafe { System.realloc(ptr, layout, new_size) };
        }
        // SAFETY: `realloc`'s contract makes `new_size` with the old
        // alignment a valid layout.
        let new = unsafe { Layout::from_size_align_unchecked(new_size, layout.align()) };
        // SAFETY: a valid, non-zero layout (`new_size` > 0 by contract).
        let moved = unsafe { self.alloc(new) };
        if !moved.is_null() {
            // SAFETY: both blocks are live and distinct, each at least the
            // smaller size long; the old one is ours, freed with its layout.
            unsafe {
                std::ptr::copy_nonoverlapping(ptr, moved, layout.size().min(new_size));
                self.dealloc(ptr, layout);
            }
        }
        moved
    }
}

/// An sbbf filter whose buffer is advised huge pages before its first write.
fn sbbf_huge(n: usize) -> sbbf_rs_safe::Filter {
    ADVISE_HUGE.store(true, Ordering::Relaxed);
    let s = sbbf_rs_safe::Filter::new(10, n);
    ADVISE_HUGE.store(false, Ordering::Relaxed);
    if ADVICE_FAILED.swap(false, Ordering::Relaxed) {
        eprintln!("madvise(MADV_HUGEPAGE) on sbbf's buffer failed");
    }
    s
}

/// sbbf's single query over `hs`, each key's bucket prefetched 32 keys
/// ahead by hand (sbbf's bucket: the high half of the hash, Lemire-reduced
/// over its 32-byte buckets): the memory limit the issue measured.
fn prefetched_queries(s: &sbbf_rs_safe::Filter, hs: &[u64]) -> usize {
    let bytes = s.as_bytes();
    let buckets = (bytes.len() / 32) as u64;
    let mut hits = 0;
    for (i, &h) in hs.iter().enumerate() {
        if let Some(&ahead) = hs.get(i + 32) {
            let bucket = ((ahead >> 32) * buckets) >> 32;
            prefetch(&bytes[bucket as usize * 32]);
        }
        hits += usize::from(s.contains_hash(black_box(h)));
    }
    hits
}

fn prefetch(r: &u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is only a hint: it never faults and reads nothing
    // into the program; SSE is part of the x86_64 baseline.
    unsafe {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        _mm_prefetch::<_MM_HINT_T0>(std::ptr::from_ref(r).cast());
    }
}

/// The `AnonHugePages` line of this process's memory map.
fn huge_pages() -> String {
    std::fs::read_to_string("/proc/self/smaps_rollup")
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("AnonHugePages"))
        .map_or_else(
            || "AnonHugePages: unknown".into(),
            |l| l.split_whitespace().collect::<Vec<_>>().join(" "),
        )
}

/// Each anonymous mapping of 64 MiB or more: its size and how much of it
/// the kernel backs with huge pages (which filter got them, at 10^8).
fn large_mappings() -> String {
    let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap_or_default();
    let mut out = Vec::new();
    let mut size_kb = 0u64;
    for line in smaps.lines() {
        let mut words = line.split_whitespace();
        match (words.next(), words.next()) {
            (Some("Size:"), Some(v)) => size_kb = v.parse().unwrap_or(0),
            (Some("AnonHugePages:"), Some(v)) if size_kb >= 64 << 10 => {
                out.push(format!(
                    "{} MiB ({} MiB huge)",
                    size_kb >> 10,
                    v.parse::<u64>().unwrap_or(0) >> 10
                ));
            }
            _ => {}
        }
    }
    out.join(", ")
}

fn run(n: usize, rounds: usize) {
    // Probes: large enough at 10^8 that each round misses the caches.
    let probes = if n > 10_000_000 {
        4_000_000
    } else {
        n.min(100_000)
    };
    // Small filters: repeat each probe loop so a timing covers ~2M queries.
    let reps = if n > 10_000_000 {
        1
    } else {
        2_000_000 / probes
    };
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
        "sbbf-rs-safe, huge pages",
        "BlockedBloom",
        "contains_hashes (batch)",
        "AtomicBloom",
        "AtomicBloom batch",
        "sbbf-rs-safe as shipped",
        "sbbf-rs-safe, huge pages, prefetch 32 ahead",
        "sbbf-rs-safe, huge pages, BlockedBloom's bits per key",
    ]
    .into_iter()
    .map(|name| (name, [vec![], vec![], vec![]]))
    .collect();
    // sbbf takes whole bits per key (the runs above: 10); BlockedBloom at
    // 1% spends more. The last row gives sbbf the same memory: sized for
    // proportionally more keys at 10 bits each.
    let ours_bits = BlockedBloom::with_fpr(n as u64, 0.01).unwrap().bits() as f64;
    let equal_keys = (ours_bits / 10.0).round() as usize;
    let mut fpr = [0.0f64; 3];
    for round in 0..rounds {
        // Inserts: fresh filters each round, timed over all n keys.
        let mut s = sbbf_huge(n);
        rows[0].1[0].push(ns_per(n, || {
            for &h in &member {
                s.insert_hash(h);
            }
        }));
        let mut equal = sbbf_huge(equal_keys);
        rows[7].1[0].push(ns_per(n, || {
            for &h in &member {
                equal.insert_hash(h);
            }
        }));
        let mut shipped = sbbf_rs_safe::Filter::new(10, n);
        rows[6].1[0].push(f64::NAN);
        rows[5].1[0].push(ns_per(n, || {
            for &h in &member {
                shipped.insert_hash(h);
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
        if round == 0 {
            eprintln!(
                "n = {n}, filters built: {}; mappings of 64 MiB or more: {}",
                huge_pages(),
                large_mappings()
            );
        }
        let (mut out2, mut out4) = (vec![false; probes], vec![false; probes]);
        for (col, (hs, ps)) in [(&members, &member_pairs), (&others, &other_pairs)]
            .into_iter()
            .enumerate()
        {
            let mut hits = [0usize; 8];
            let ops = probes * reps;
            // Each timing answers (ns per query, hits); they run in an order
            // that starts one later each round, so no peer always runs
            // first or after the same one.
            type Timing<'a> = Box<dyn FnMut() -> (f64, usize) + 'a>;
            let count = |f: &mut dyn FnMut() -> usize| -> (f64, usize) {
                let mut h = 0;
                let ns = ns_per(ops, || {
                    for _ in 0..reps {
                        h = f();
                    }
                });
                (ns, h)
            };
            let (s, shipped, b, a, equal) = (&s, &shipped, &b, &a, &equal);
            let (o2, o4) = (&mut out2, &mut out4);
            let mut timings: Vec<(usize, Timing<'_>)> = vec![
                (
                    0,
                    Box::new(move || {
                        count(&mut || {
                            hs.iter()
                                .filter(|&&h| s.contains_hash(black_box(h)))
                                .count()
                        })
                    }),
                ),
                (
                    6,
                    Box::new(move || count(&mut || prefetched_queries(s, hs))),
                ),
                (
                    7,
                    Box::new(move || {
                        count(&mut || {
                            hs.iter()
                                .filter(|&&h| equal.contains_hash(black_box(h)))
                                .count()
                        })
                    }),
                ),
                (
                    5,
                    Box::new(move || {
                        count(&mut || {
                            hs.iter()
                                .filter(|&&h| shipped.contains_hash(black_box(h)))
                                .count()
                        })
                    }),
                ),
                (
                    1,
                    Box::new(move || {
                        count(&mut || {
                            hs.iter()
                                .filter(|&&h| b.contains_hash(pair(black_box(h))))
                                .count()
                        })
                    }),
                ),
                (
                    2,
                    Box::new(move || {
                        count(&mut || {
                            b.contains_hashes(black_box(ps), o2).unwrap();
                            o2.iter().filter(|&&x| x).count()
                        })
                    }),
                ),
                (
                    3,
                    Box::new(move || {
                        count(&mut || {
                            hs.iter()
                                .filter(|&&h| a.contains_hash(pair(black_box(h))))
                                .count()
                        })
                    }),
                ),
                (
                    4,
                    Box::new(move || {
                        count(&mut || {
                            a.contains_hashes(black_box(ps), o4).unwrap();
                            o4.iter().filter(|&&x| x).count()
                        })
                    }),
                ),
            ];
            let shift = round % timings.len();
            timings.rotate_left(shift);
            for (row, timing) in &mut timings {
                let (ns, h) = timing();
                rows[*row].1[col + 1].push(ns);
                hits[*row] = h;
            }
            drop(timings);
            if col == 0 {
                assert!(
                    hits.iter().all(|&h| h == probes),
                    "no false negatives: {hits:?}"
                );
            } else {
                assert_eq!(hits[1], hits[2]);
                assert_eq!(hits[1], hits[3]);
                assert_eq!(hits[3], hits[4]);
                assert_eq!(hits[0], hits[5]);
                assert_eq!(hits[0], hits[6]);
                if round == 0 {
                    fpr = [
                        hits[0] as f64 / probes as f64,
                        hits[1] as f64 / probes as f64,
                        hits[7] as f64 / probes as f64,
                    ];
                }
            }
        }
    }
    println!("\n### n = {n} (equal work: one precomputed 64-bit hash per key; median of {rounds} rounds)\n");
    println!("| filter | insert ns | member ns | non-member ns | insert ÷ sbbf | member ÷ sbbf | non-member ÷ sbbf |");
    println!("|---|---|---|---|---|---|---|");
    // Ratios: the median over rounds of each round's ratio, so a machine
    // whose speed drifts between rounds moves both sides of each ratio.
    let paired = |row: usize, base: usize, col: usize| -> f64 {
        let (a, b) = (&rows[row].1[col], &rows[base].1[col]);
        median(a.iter().zip(b).map(|(x, y)| x / y).collect())
    };
    for (i, (name, cols)) in rows.iter().enumerate() {
        let m: Vec<f64> = cols.iter().map(|v| median(v.clone())).collect();
        // A row without inserts (the hand-prefetched queries) shows a dash.
        let cell = |x: f64| {
            if x.is_nan() {
                "–".to_string()
            } else {
                format!("{x:.2}")
            }
        };
        println!(
            "| {name} | {} | {} | {} | {} | {} | {} |",
            cell(m[0]),
            cell(m[1]),
            cell(m[2]),
            cell(paired(i, 0, 0)),
            cell(paired(i, 0, 1)),
            cell(paired(i, 0, 2))
        );
    }
    println!(
        "\nAtomicBloom ÷ BlockedBloom: insert {:.2}, member {:.2}, non-member {:.2}; \
         batch ÷ batch: insert {:.2}, member {:.2}, non-member {:.2}",
        paired(3, 1, 0),
        paired(3, 1, 1),
        paired(3, 1, 2),
        paired(4, 2, 0),
        paired(4, 2, 1),
        paired(4, 2, 2)
    );
    println!(
        "\nmeasured FPR over {probes} non-members: sbbf-rs-safe at 10 bits/key {:.3}%, BlockedBloom {:.3}% at {:.2} bits/key, sbbf-rs-safe at the same bits/key {:.3}%",
        fpr[0] * 100.0,
        fpr[1] * 100.0,
        ours_bits / n as f64,
        fpr[2] * 100.0
    );
}

/// `--ab`: only the batch call (`BlockedBloom::contains_hashes`) against
/// sbbf's hand-prefetched loop, alternating which runs first, `rounds`
/// times per key set; the ratio is the median of the rounds' ratios. The
/// two are memory-bound at 10^8 keys, where the full table's rounds
/// (eight peers in turn) drift too much to compare them.
fn ab(n: usize, rounds: usize) {
    let probes = 4_000_000.min(n);
    let member: Vec<u64> = (0..n as u64).map(|i| splitmix64(i ^ 0xabc)).collect();
    let mut s = sbbf_huge(n);
    for &h in &member {
        s.insert_hash(h);
    }
    let mut b = BlockedBloom::with_fpr(n as u64, 0.01).unwrap();
    b.insert_hashes(&member.iter().map(|&h| pair(h)).collect::<Vec<_>>());
    let stride = (n / probes).max(1);
    let members: Vec<u64> = member
        .iter()
        .step_by(stride)
        .take(probes)
        .copied()
        .collect();
    drop(member);
    let others: Vec<u64> = (0..probes as u64)
        .map(|i| splitmix64(i ^ (1 << 62)))
        .collect();
    println!(
        "\n### n = {n}: batch against sbbf prefetch 32 ahead ({rounds} rounds, alternating)\n"
    );
    println!("| keys | contains_hashes ns | sbbf prefetch ns | batch ÷ prefetch |");
    println!("|---|---|---|---|");
    for (name, hs) in [("members", &members), ("non-members", &others)] {
        let ps: Vec<HashPair> = hs.iter().map(|&h| pair(h)).collect();
        let mut out = vec![false; ps.len()];
        let reps = (2_000_000 / ps.len()).max(1);
        let (mut batch, mut hand) = (vec![], vec![]);
        for round in 0..rounds {
            let mut one = |first: bool| {
                if first {
                    batch.push(ns_per(ps.len() * reps, || {
                        for _ in 0..reps {
                            b.contains_hashes(black_box(&ps), &mut out).unwrap();
                            black_box(out.iter().filter(|&&x| x).count());
                        }
                    }));
                } else {
                    hand.push(ns_per(ps.len() * reps, || {
                        for _ in 0..reps {
                            black_box(prefetched_queries(&s, hs));
                        }
                    }));
                }
            };
            one(round % 2 == 0);
            one(round % 2 == 1);
        }
        let ratios = batch.iter().zip(&hand).map(|(a, b)| a / b).collect();
        println!(
            "| {name} | {:.2} | {:.2} | {:.3} |",
            median(batch),
            median(hand),
            median(ratios)
        );
    }
}

fn main() {
    let sizes = bloomgate_bench::sizes_from_args(&[1_000_000, 100_000_000]);
    let rounds = std::env::args()
        .find_map(|a| {
            a.strip_prefix("--rounds=")
                .map(|r| r.parse().expect("--rounds=N takes a positive count"))
        })
        .unwrap_or(ROUNDS);
    assert!(rounds > 0, "--rounds=N takes a positive count");
    println!(
        "avx2 at run time: {}; compiled with avx2: {}",
        std::arch::is_x86_feature_detected!("avx2"),
        cfg!(target_feature = "avx2")
    );
    let only_ab = std::env::args().any(|a| a == "--ab");
    for n in sizes {
        if only_ab {
            ab(n, rounds);
        } else {
            run(n, rounds);
        }
    }
}
