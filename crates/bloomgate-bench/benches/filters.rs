//! Side-by-side filter benchmarks: bloomgate's layouts against other Rust
//! filter crates, on the same u64 keys at a 1% target, at 10^6 keys (fits in
//! cache) and 10^8 keys (DRAM).
//!
//! `cargo bench -p bloomgate-bench --bench filters` runs everything;
//! `BLOOMGATE_BENCH_SIZES=1000000` limits the sizes. Besides criterion's
//! timings it writes the measured FPR and bits per key of every filter to
//! `target/criterion/figures-<n>.tsv`; `scripts/bench_table.py` joins both
//! into the tables of BENCHMARKS.md.

use std::hint::black_box;
use std::io::Write;
use std::time::Duration;

use bloomgate_bench::keys;
use bloomgate_filter::hash::splitmix64;
use bloomgate_filter::{
    AtomicBloom, BlockedBloom, ClassicBloom, CountingBloom, Filter, ScalableBloom, ScalableOptions,
};
use criterion::{BenchmarkGroup, Criterion, Throughput};
use xorf::Filter as _;

/// One small trait puts every filter crate behind the same three calls,
/// so each is measured on the same keys with the same loop.
/// A filter under test.
pub trait Peer {
    /// Adds a key.
    fn put(&mut self, key: u64);
    /// Membership test.
    fn has(&self, key: u64) -> bool;
    /// Bits of filter storage.
    fn storage_bits(&self) -> u64;
}

/// Measured false-positive rate over `probes` (all non-members).
#[must_use]
pub fn measured_fpr<P: Peer>(p: &P, probes: &[u64]) -> f64 {
    probes.iter().filter(|&&k| p.has(k)).count() as f64 / probes.len() as f64
}

const P: f64 = 0.01;
/// Keys per timed batch: at 10^6 keys 100,000 probes touch every line of
/// the filter; at 10^8 keys the batch must be far larger than the CPU's
/// last-level cache, or repeated iterations would find its lines cached and
/// measure cache hits, not DRAM.
fn batch_for(n: usize) -> usize {
    if n > 10_000_000 {
        4_000_000
    } else {
        100_000
    }
}
const BATCH: usize = 100_000;

/// `Peer` for filters whose API is `insert(&key)` / `contains(&key)`.
macro_rules! peer {
    ($t:ty, $bits:expr) => {
        impl Peer for $t {
            fn put(&mut self, key: u64) {
                let _ = self.insert(&key);
            }
            fn has(&self, key: u64) -> bool {
                self.contains(&key)
            }
            fn storage_bits(&self) -> u64 {
                let bits: fn(&$t) -> u64 = $bits;
                bits(self)
            }
        }
    };
}
peer!(BlockedBloom, |f| f.bits());
peer!(ClassicBloom, |f| f.bits());
peer!(AtomicBloom, |f| f.bits());
peer!(CountingBloom, |f| f.bytes() as u64 * 8);
peer!(ScalableBloom, |f| f.bits());
peer!(fastbloom::BloomFilter, |f| f.num_bits() as u64);
peer!(fastbloom::AtomicBloomFilter, |f| f.num_bits() as u64);
peer!(
    fastbloom::BloomFilter<foldhash::fast::FixedState>,
    |f| f.num_bits() as u64
);
/// sbbf takes a hash, not a key: it gets one splitmix64 of the key.
impl Peer for sbbf_rs_safe::Filter {
    fn put(&mut self, key: u64) {
        self.insert_hash(splitmix64(key));
    }
    fn has(&self, key: u64) -> bool {
        self.contains_hash(splitmix64(key))
    }
    fn storage_bits(&self) -> u64 {
        self.as_bytes().len() as u64 * 8
    }
}
impl Peer for bloomfilter::Bloom<u64> {
    fn put(&mut self, key: u64) {
        self.set(&key);
    }
    fn has(&self, key: u64) -> bool {
        self.check(&key)
    }
    fn storage_bits(&self) -> u64 {
        self.len()
    }
}
/// Static: built once from all keys; `put` is not benchmarked.
impl Peer for xorf::BinaryFuse8 {
    fn put(&mut self, _key: u64) {}
    fn has(&self, key: u64) -> bool {
        self.contains(&key)
    }
    fn storage_bits(&self) -> u64 {
        self.fingerprints.len() as u64 * 8
    }
}
impl Peer for growable_bloom_filter::GrowableBloom {
    fn put(&mut self, key: u64) {
        self.insert(key);
    }
    fn has(&self, key: u64) -> bool {
        self.contains(key)
    }
    fn storage_bits(&self) -> u64 {
        // Not exposed by the crate; estimated from its serialised size.
        0
    }
}
impl Peer for qfilter::Filter {
    fn put(&mut self, key: u64) {
        let _ = self.insert(key);
    }
    fn has(&self, key: u64) -> bool {
        self.contains(key)
    }
    fn storage_bits(&self) -> u64 {
        0
    }
}

struct Ctx<'a> {
    n: usize,
    batch: usize,
    members: &'a [u64],
    non_members: &'a [u64],
    fresh: &'a [u64],
    probes: &'a [u64],
    figures: Vec<(String, f64, f64)>,
}

/// Times insert (of keys not yet in the filter; after the first pass they
/// are, which touches the same lines), member and non-member queries.
fn bench_peer<P: Peer>(
    g: &mut BenchmarkGroup<'_, criterion::measurement::WallTime>,
    ctx: &mut Ctx<'_>,
    name: &str,
    mut f: P,
    timed_insert: bool,
) {
    let fpr = measured_fpr(&f, ctx.probes);
    let bits_per_key = f.storage_bits() as f64 / ctx.n as f64;
    eprintln!(
        "{name}: n={} fpr={fpr:.5} bits/key={bits_per_key:.2}",
        ctx.n
    );
    ctx.figures.push((name.to_string(), fpr, bits_per_key));
    g.throughput(Throughput::Elements(ctx.batch as u64));
    g.bench_function(format!("{name}/member"), |b| {
        b.iter(|| ctx.members.iter().filter(|&&k| f.has(black_box(k))).count());
    });
    g.bench_function(format!("{name}/non-member"), |b| {
        b.iter(|| {
            ctx.non_members
                .iter()
                .filter(|&&k| f.has(black_box(k)))
                .count()
        });
    });
    if timed_insert {
        g.bench_function(format!("{name}/insert"), |b| {
            b.iter(|| {
                for &k in ctx.fresh {
                    f.put(black_box(k));
                }
            });
        });
    }
}

fn configure(c: &mut Criterion, n: usize) -> BenchmarkGroup<'_, criterion::measurement::WallTime> {
    let mut g = c.benchmark_group(format!("n={n}"));
    g.sample_size(10);
    if n > 10_000_000 {
        // Each iteration is long (millions of keys): one per sample.
        g.sampling_mode(criterion::SamplingMode::Flat);
    }
    g.warm_up_time(Duration::from_millis(500));
    g.measurement_time(Duration::from_secs(if n > 10_000_000 { 3 } else { 2 }));
    g
}

fn write_figures(n: usize, figures: &[(String, f64, f64)]) {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/criterion");
    let _ = std::fs::create_dir_all(&dir);
    if let Ok(mut f) = std::fs::File::create(dir.join(format!("figures-{n}.tsv"))) {
        for (name, fpr, bpk) in figures {
            let _ = writeln!(f, "{name}\t{fpr}\t{bpk}");
        }
    }
}

fn plain_filters(c: &mut Criterion, n: usize) {
    let batch = batch_for(n);
    let all = keys(n, 1);
    let non_members = keys(batch, 2);
    let probes = keys(1_000_000, 3);
    let fresh = keys(batch, 4);
    let members: Vec<u64> = all
        .iter()
        .step_by((n / batch).max(1))
        .copied()
        .take(batch)
        .collect();
    let mut ctx = Ctx {
        n,
        batch,
        members: &members,
        non_members: &non_members,
        fresh: &fresh,
        probes: &probes,
        figures: Vec::new(),
    };
    let mut g = configure(c, n);

    let mut blocked = BlockedBloom::with_fpr(n as u64, P).unwrap();
    blocked.insert_many(&all);
    // The batch API, on the same filter.
    {
        g.throughput(Throughput::Elements(batch as u64));
        let mut out = vec![false; batch];
        g.bench_function("bloomgate-blocked-batch/member", |b| {
            b.iter(|| {
                blocked
                    .contains_many(black_box(&members), &mut out)
                    .unwrap()
            });
        });
        g.bench_function("bloomgate-blocked-batch/non-member", |b| {
            b.iter(|| {
                blocked
                    .contains_many(black_box(&non_members), &mut out)
                    .unwrap()
            });
        });
        let mut b2 = blocked.clone();
        g.bench_function("bloomgate-blocked-batch/insert", |b| {
            b.iter(|| b2.insert_many(black_box(&fresh)))
        });
    }
    bench_peer(&mut g, &mut ctx, "bloomgate-blocked", blocked, true);

    let atomic = AtomicBloom::with_fpr(n as u64, P).unwrap();
    atomic.insert_many(&all);
    bench_peer(&mut g, &mut ctx, "bloomgate-atomic", atomic, true);

    let mut classic = ClassicBloom::with_fpr(n as u64, P).unwrap();
    for &k in &all {
        classic.insert(&k);
    }
    bench_peer(&mut g, &mut ctx, "bloomgate-classic", classic, true);

    let mut fb = fastbloom::BloomFilter::with_false_pos(P).expected_items(n);
    for k in &all {
        fb.insert(k);
    }
    bench_peer(&mut g, &mut ctx, "fastbloom", fb, true);

    // fastbloom with a hasher as cheap as bloomgate's for u64 keys (its
    // default is SipHash-1-3; foldhash is the fast one its docs suggest).
    let mut fbf = fastbloom::BloomFilter::with_false_pos(P)
        .hasher(foldhash::fast::FixedState::with_seed(7))
        .expected_items(n);
    for k in &all {
        fbf.insert(k);
    }
    bench_peer(&mut g, &mut ctx, "fastbloom-foldhash", fbf, true);

    let fba = fastbloom::AtomicBloomFilter::with_false_pos(P).expected_items(n);
    for k in &all {
        fba.insert(k);
    }
    bench_peer(&mut g, &mut ctx, "fastbloom-atomic", fba, true);

    let mut sbbf = sbbf_rs_safe::Filter::new(10, n);
    for &k in &all {
        sbbf.insert_hash(splitmix64(k));
    }
    bench_peer(&mut g, &mut ctx, "sbbf-rs-safe", sbbf, true);

    let mut bf = bloomfilter::Bloom::new_for_fp_rate(n, P).unwrap();
    for k in &all {
        bf.set(k);
    }
    bench_peer(&mut g, &mut ctx, "bloomfilter", bf, true);

    let xf = xorf::BinaryFuse8::try_from(&all).unwrap();
    bench_peer(&mut g, &mut ctx, "xorf-binaryfuse8", xf, false);
    g.finish();
    write_figures(n, &ctx.figures);
}

/// Deletable and growable filters, at 10^6 keys.
fn growing_filters(c: &mut Criterion) {
    let n = 1_000_000usize;
    let all = keys(n, 11);
    let non_members = keys(BATCH, 12);
    let probes = keys(1_000_000, 13);
    let fresh = keys(BATCH, 14);
    let members: Vec<u64> = all.iter().step_by(n / BATCH).copied().take(BATCH).collect();
    let mut ctx = Ctx {
        n,
        batch: BATCH,
        members: &members,
        non_members: &non_members,
        fresh: &fresh,
        probes: &probes,
        figures: Vec::new(),
    };
    let mut g = c.benchmark_group("counting-scalable n=1000000");
    g.sample_size(10);
    g.warm_up_time(Duration::from_millis(500));
    g.measurement_time(Duration::from_secs(2));

    // Removal: insert then remove the same batch, per key pair.
    let mut counting = CountingBloom::with_fpr(n as u64, P).unwrap();
    for k in &all {
        counting.insert(k);
    }
    g.throughput(Throughput::Elements(BATCH as u64));
    g.bench_function("bloomgate-counting/insert+remove", |b| {
        b.iter(|| {
            for &k in &fresh {
                counting.insert(&k);
            }
            for &k in &fresh {
                counting.remove(&k).unwrap();
            }
        });
    });
    let mut qf = qfilter::Filter::new(n as u64 + BATCH as u64, P).unwrap();
    for &k in &all {
        qf.insert(k).unwrap();
    }
    g.bench_function("qfilter/insert+remove", |b| {
        b.iter(|| {
            for &k in &fresh {
                qf.insert(k).unwrap();
            }
            for &k in &fresh {
                qf.remove(k);
            }
        });
    });
    bench_peer(&mut g, &mut ctx, "bloomgate-counting", counting, false);
    bench_peer(&mut g, &mut ctx, "qfilter", qf, false);

    // Growth: start at 1/16 of the final count, so the chain grows 4-5 times.
    let mut scalable = ScalableBloom::new(ScalableOptions::new(n as u64 / 16, P)).unwrap();
    for k in &all {
        let _ = scalable.insert(k);
    }
    let mut growable = growable_bloom_filter::GrowableBloom::new(P, n / 16);
    for &k in &all {
        growable.insert(k);
    }
    bench_peer(&mut g, &mut ctx, "bloomgate-scalable", scalable, true);
    bench_peer(&mut g, &mut ctx, "growable-bloom-filter", growable, true);
    g.finish();
    write_figures(0, &ctx.figures);
}

fn main() {
    let sizes: Vec<usize> = std::env::var("BLOOMGATE_BENCH_SIZES")
        .ok()
        .map(|s| s.split(',').filter_map(|x| x.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![1_000_000, 100_000_000]);
    let mut c = Criterion::default().configure_from_args();
    for n in sizes {
        plain_filters(&mut c, n);
    }
    growing_filters(&mut c);
    c.final_summary();
}
