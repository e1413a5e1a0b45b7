//! Filter subcommands: calc, build, query, info, bench.

use std::io::{BufRead, BufWriter, IsTerminal, Write};
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context};
use bloomgate_filter::snapshot::Layout;
use bloomgate_filter::{
    sizing, AtomicBloom, BlockedBloom, ClassicBloom, CountingBloom, Filter, HashPair, KeyKind,
    MappedBloom, Snapshot,
};
use clap::{Args, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};

/// A progress bar on a terminal, a hidden one otherwise.
pub fn progress_bar(len: u64, what: &str) -> ProgressBar {
    if !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(len);
    bar.set_style(
        ProgressStyle::with_template("{msg} [{bar:40}] {pos}/{len} ({per_sec}, {eta})")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar.set_message(what.to_string());
    bar
}

fn parse_fpr(s: &str) -> Result<f64, String> {
    let p: f64 = s.parse().map_err(|_| format!("not a number: {s}"))?;
    if p > 0.0 && p < 1.0 {
        Ok(p)
    } else {
        Err(format!("must be strictly between 0 and 1, got {s}"))
    }
}

fn parse_items(s: &str) -> Result<u64, String> {
    let n: u64 = s
        .replace('_', "")
        .parse()
        .map_err(|_| format!("not a positive integer: {s}"))?;
    if n == 0 {
        return Err("must be at least 1".into());
    }
    Ok(n)
}

/// `bloomgate calc`.
#[derive(Debug, Args)]
pub struct CalcArgs {
    /// Expected items.
    #[arg(long, value_parser = parse_items)]
    items: u64,
    /// Target false-positive rate.
    #[arg(long, value_parser = parse_fpr)]
    fpr: f64,
}

pub fn calc(a: &CalcArgs) -> anyhow::Result<()> {
    let c = sizing::classic(a.items, a.fpr)?;
    let b = sizing::blocked(a.items, a.fpr, 256)?;
    let w = sizing::blocked(a.items, a.fpr, 512)?;
    let n = sizing::blocked(a.items, a.fpr, 128)?;
    let mib = |bits: u64| bits as f64 / 8.0 / 1024.0 / 1024.0;
    println!("items {}  target fpr {}", a.items, a.fpr);
    println!(
        "{:<10} {:>14} {:>4} {:>12} {:>10} {:>12}",
        "layout", "m (bits)", "k", "bytes", "bits/key", "fpr at n"
    );
    let rows = [
        (
            "classic",
            c.bits,
            c.hashes,
            c.bits.div_ceil(8),
            sizing::classic_fpr(c.bits, c.hashes, a.items),
        ),
        (
            "blocked",
            b.bits(),
            b.hashes,
            b.bits() / 8,
            sizing::blocked_fpr(b.blocks, 256, b.hashes, a.items),
        ),
        (
            "blocked512",
            w.bits(),
            w.hashes,
            w.bits() / 8,
            sizing::blocked_fpr(w.blocks, 512, w.hashes, a.items),
        ),
        (
            "counting",
            n.bits(),
            n.hashes,
            n.bits() / 2,
            sizing::blocked_fpr(n.blocks, 128, n.hashes, a.items),
        ),
    ];
    let picked = sizing::blocked_auto(a.items, a.fpr)?;
    for (name, bits, k, bytes, fpr) in rows {
        println!(
            "{name:<10} {bits:>14} {k:>4} {bytes:>12} {:>10.2} {fpr:>12.3e}   ({:.2} MiB)",
            bits as f64 / a.items as f64,
            mib(bytes * 8)
        );
    }
    println!(
        "`build --layout blocked` uses {}-bit blocks at this rate",
        picked.block_bits
    );
    Ok(())
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum LayoutArg {
    Blocked,
    Classic,
    Counting,
}

/// `bloomgate build`.
#[derive(Debug, Args)]
pub struct BuildArgs {
    /// Expected items.
    #[arg(long, value_parser = parse_items)]
    items: u64,
    /// Target false-positive rate.
    #[arg(long, value_parser = parse_fpr)]
    fpr: f64,
    /// Filter layout.
    #[arg(long, value_enum, default_value = "blocked")]
    layout: LayoutArg,
    /// Output snapshot file (written atomically).
    #[arg(long)]
    out: PathBuf,
    /// Keys are arbitrary strings rather than decimal u64s.
    #[arg(long)]
    strings: bool,
    /// Input file (default: stdin).
    input: Option<PathBuf>,
}

enum Builder {
    Blocked(BlockedBloom),
    Classic(ClassicBloom),
    Counting(CountingBloom),
}

impl Builder {
    fn insert(&mut self, h: HashPair) {
        match self {
            Self::Blocked(f) => {
                f.insert_hash(h);
            }
            Self::Classic(f) => {
                f.insert_hash(h);
            }
            Self::Counting(f) => f.insert(&h),
        }
    }
}

fn key_hash(line: &str, strings: bool, seed: u64, line_no: usize) -> anyhow::Result<HashPair> {
    if strings {
        Ok(HashPair::from_bytes(line.as_bytes(), seed))
    } else {
        let n: u64 = line.trim().parse().with_context(|| {
            format!("line {line_no}: {line:?} is not a decimal u64 (use --strings for text keys)")
        })?;
        Ok(HashPair::from_u64(n, seed))
    }
}

pub fn build(a: &BuildArgs) -> anyhow::Result<()> {
    let mut builder = match a.layout {
        LayoutArg::Blocked => Builder::Blocked(BlockedBloom::with_fpr(a.items, a.fpr)?),
        LayoutArg::Classic => Builder::Classic(ClassicBloom::with_fpr(a.items, a.fpr)?),
        LayoutArg::Counting => Builder::Counting(CountingBloom::with_fpr(a.items, a.fpr)?),
    };
    let reader: Box<dyn BufRead> = match &a.input {
        Some(p) => Box::new(std::io::BufReader::with_capacity(
            1 << 20,
            std::fs::File::open(p).with_context(|| format!("cannot open {}", p.display()))?,
        )),
        None => Box::new(std::io::BufReader::with_capacity(
            1 << 20,
            std::io::stdin().lock(),
        )),
    };
    let bar = progress_bar(a.items, "building");
    let started = Instant::now();
    let mut n = 0u64;
    for (i, line) in reader.lines().enumerate() {
        let line = line.context("reading keys")?;
        if line.is_empty() {
            continue;
        }
        builder.insert(key_hash(&line, a.strings, 0, i + 1)?);
        n += 1;
        if n.is_multiple_of(65_536) {
            bar.set_position(n);
        }
    }
    bar.finish_and_clear();
    let kind = if a.strings {
        KeyKind::Bytes
    } else {
        KeyKind::Integer
    };
    let (bits, k, fpr) = match &builder {
        Builder::Blocked(f) => (f.bits(), f.hashes(), f.expected_fpr(n)),
        Builder::Classic(f) => (f.bits(), f.hashes(), f.expected_fpr(n)),
        Builder::Counting(f) => (f.bits(), f.hashes(), f.expected_fpr(n)),
    };
    match &builder {
        Builder::Blocked(f) => f.save(&a.out, kind),
        Builder::Classic(f) => f.save(&a.out, kind),
        Builder::Counting(f) => f.save(&a.out, kind),
    }
    .with_context(|| format!("cannot write {}", a.out.display()))?;
    eprintln!(
        "built {} filter: {n} keys, m={bits}, k={k}, expected fpr {fpr:.3e}, {:.2}s -> {}",
        match a.layout {
            LayoutArg::Blocked => "blocked",
            LayoutArg::Classic => "classic",
            LayoutArg::Counting => "counting",
        },
        started.elapsed().as_secs_f64(),
        a.out.display()
    );
    if n > a.items {
        eprintln!(
            "warning: {n} keys exceed --items {}; the rate is above target",
            a.items
        );
    }
    Ok(())
}

/// `bloomgate query`.
#[derive(Debug, Args)]
pub struct QueryArgs {
    /// Snapshot file.
    file: PathBuf,
    /// Keys (default: one per line on stdin).
    keys: Vec<String>,
    /// Treat keys as strings even if the snapshot was built from integers.
    #[arg(long)]
    strings: bool,
}

pub fn query(a: &QueryArgs) -> anyhow::Result<()> {
    let view =
        MappedBloom::open(&a.file).with_context(|| format!("cannot open {}", a.file.display()))?;
    let strings = a.strings || view.header().key_kind == KeyKind::Bytes;
    let seed = view.seed();
    let mut out = BufWriter::new(std::io::stdout().lock());
    let answer = |out: &mut dyn Write, key: &str, line_no: usize| -> anyhow::Result<()> {
        let h = key_hash(key, strings, seed, line_no)?;
        let verdict = if view.contains_hash(h) { "maybe" } else { "no" };
        writeln!(out, "{key}\t{verdict}")?;
        Ok(())
    };
    if a.keys.is_empty() {
        for (i, line) in std::io::stdin().lock().lines().enumerate() {
            let line = line?;
            if !line.is_empty() {
                answer(&mut out, &line, i + 1)?;
            }
        }
    } else {
        for (i, k) in a.keys.iter().enumerate() {
            answer(&mut out, k, i + 1)?;
        }
    }
    out.flush()?;
    Ok(())
}

/// `bloomgate info`.
#[derive(Debug, Args)]
pub struct InfoArgs {
    /// Snapshot file.
    file: PathBuf,
    /// Also verify the payload checksum (reads the whole file).
    #[arg(long)]
    verify: bool,
}

pub fn info(a: &InfoArgs) -> anyhow::Result<()> {
    // `info` only describes the file: the payload is read when asked to.
    let view = MappedBloom::open_unverified(&a.file)
        .with_context(|| format!("cannot open {}", a.file.display()))?;
    if a.verify {
        view.verify()
            .with_context(|| format!("{} is corrupt", a.file.display()))?;
    }
    let h = view.header();
    let items = view.items();
    let fill = view.fill_ratio();
    println!("file            {}", a.file.display());
    println!("layout          {}", h.layout.name());
    println!("m (positions)   {}", h.bits);
    println!("k (hashes)      {}", h.hashes);
    if h.layout != Layout::Classic {
        println!("block size      {}", h.block_bits);
    }
    println!("seed            {}", h.seed);
    println!("key kind        {:?}", h.key_kind);
    println!("bytes           {}", view.bytes());
    println!("items added     {items}");
    println!("fill ratio      {fill:.4}");
    println!("estimated items {:.0}", view.estimated_items());
    println!("expected fpr    {:.3e}", view.expected_fpr(items));
    match view.design() {
        Some(d) => println!("designed for    {} items at fpr {}", d.capacity, d.fpr),
        None => println!("designed for    (not recorded)"),
    }
    let past = if view.past_capacity() { "yes" } else { "no" };
    println!("past capacity   {past}");
    if a.verify {
        println!("checksum        ok");
    }
    Ok(())
}

/// `bloomgate bench`.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Items to insert.
    #[arg(long, value_parser = parse_items, default_value = "1000000")]
    items: u64,
    /// Target false-positive rate.
    #[arg(long, value_parser = parse_fpr, default_value = "0.01")]
    fpr: f64,
    /// Threads for the concurrent insert and query passes.
    #[arg(long, default_value_t = 1)]
    threads: usize,
}

pub fn bench(a: &BenchArgs) -> anyhow::Result<()> {
    if a.threads == 0 || a.threads > 256 {
        bail!("--threads must be between 1 and 256");
    }
    let n = a.items as usize;
    let keys: Vec<u64> = (0..n as u64)
        .map(|i| bloomgate_filter::hash::splitmix64(i ^ 0xbe7c))
        .collect();
    let probes: Vec<u64> = (0..n as u64)
        .map(|i| bloomgate_filter::hash::splitmix64(i ^ 0x5eed_0000_0000))
        .collect();
    let f = AtomicBloom::with_fpr(a.items, a.fpr)?;
    let per = n.div_ceil(a.threads);
    let t = Instant::now();
    std::thread::scope(|s| {
        for part in keys.chunks(per) {
            let f = &f;
            s.spawn(move || f.insert_many(part));
        }
    });
    let insert = t.elapsed();
    let t = Instant::now();
    let fp: usize = std::thread::scope(|s| {
        let handles: Vec<_> = probes
            .chunks(per)
            .map(|part| {
                let f = &f;
                s.spawn(move || part.iter().filter(|k| f.contains(*k)).count())
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap_or(0)).sum()
    });
    let query = t.elapsed();
    let missing = keys.iter().filter(|k| !f.contains(*k)).count();
    let ns = |d: std::time::Duration| d.as_nanos() as f64 / n as f64 * a.threads as f64;
    println!(
        "blocked filter, {} items, target fpr {}, {} thread(s)",
        a.items, a.fpr, a.threads
    );
    println!(
        "bits {} ({:.2} bits/key), k {}",
        f.bits(),
        f.bits() as f64 / a.items as f64,
        f.hashes()
    );
    println!(
        "insert   {:>8.1} ns/key/thread  {:>8.1} M keys/s",
        ns(insert),
        n as f64 / insert.as_secs_f64() / 1e6
    );
    println!(
        "query    {:>8.1} ns/key/thread  {:>8.1} M keys/s",
        ns(query),
        n as f64 / query.as_secs_f64() / 1e6
    );
    println!(
        "fpr      measured {:.4e} on {} non-members, formula {:.4e}",
        fp as f64 / n as f64,
        n,
        f.expected_fpr(a.items)
    );
    if missing != 0 {
        bail!("{missing} false negatives: the filter is broken");
    }
    Ok(())
}
