//! The batch loops of the 256-bit layout: the plain loop for filters that
//! fit the per-core L2 cache, the prefetching loop for larger ones (hash
//! [`BATCH`] keys, prefetch their blocks, then probe or set them), each
//! calling the AVX2 kernel after the run-time check. And how large that L2
//! cache is ([`l2_cache_bytes`]).

use super::{
    apply, block_index256, covers, mask256_scalar, set256_atomic, simd, Blocks256, Kernel256, BATCH,
};
use crate::storage::AtomicLine;

/// The per-core L2 cache this filter's batch calls plan for, in bytes,
/// as the CPU reports it: `cpuid` leaf `0x8000_0006` on x86-64 (AMD and
/// Intel both fill it), else Linux's `/sys/devices/system/cpu/cpu0/cache`,
/// else 512 KiB. The environment variable `BLOOMGATE_L2_CACHE_BYTES`
/// overrides what the CPU says (a virtual machine that reports a cache it
/// does not have, or a benchmark of both loops). Read once per process.
///
/// ```
/// let l2 = bloomgate_filter::l2_cache_bytes();
/// assert!(l2 >= 1 << 10, "{l2}");
/// ```
#[must_use]
pub fn l2_cache_bytes() -> u64 {
    static L2: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *L2.get_or_init(|| {
        if let Ok(forced) = std::env::var("BLOOMGATE_L2_CACHE_BYTES") {
            // At least 1 KiB: a smaller "cache" is a typo, not a CPU.
            if let Ok(b) = forced.parse::<u64>() {
                return b.max(1 << 10);
            }
        }
        l2_from_cpuid()
            .or_else(l2_from_sysfs)
            .unwrap_or(DEFAULT_L2_BYTES)
    })
}

/// When the CPU says nothing.
const DEFAULT_L2_BYTES: u64 = 512 << 10;

#[cfg(target_arch = "x86_64")]
fn l2_from_cpuid() -> Option<u64> {
    use std::arch::x86_64::__cpuid;
    #[allow(unused_unsafe)]
    // SAFETY: `cpuid` exists on every x86-64 CPU; leaf 0x8000_0000 says
    // which extended leaves do, so 0x8000_0006 is asked only when present.
    let ecx = unsafe {
        let max = __cpuid(0x8000_0000).eax;
        (max >= 0x8000_0006).then(|| __cpuid(0x8000_0006).ecx)
    };
    // ECX[31:16]: the L2 size in KiB.
    let kib = u64::from(ecx? >> 16);
    (kib > 0).then_some(kib << 10)
}

#[cfg(not(target_arch = "x86_64"))]
fn l2_from_cpuid() -> Option<u64> {
    None
}

/// The level-2 data or unified cache of CPU 0 in sysfs (`512K`, `2M`).
fn l2_from_sysfs() -> Option<u64> {
    let dir = std::fs::read_dir("/sys/devices/system/cpu/cpu0/cache").ok()?;
    for entry in dir.flatten() {
        // `index0`…`indexN`, and files (`uevent`) that are none: skipped.
        let read = |name: &str| std::fs::read_to_string(entry.path().join(name)).ok();
        let (Some(level), Some(kind), Some(size)) = (read("level"), read("type"), read("size"))
        else {
            continue;
        };
        if level.trim() != "2" || kind.trim() == "Instruction" {
            continue;
        }
        return parse_cache_size(&size);
    }
    None
}

/// sysfs's cache size (`512K`, `2M`, `32768K`) in bytes.
fn parse_cache_size(text: &str) -> Option<u64> {
    let size = text.trim();
    let (digits, unit) = size.split_at(size.trim_end_matches(['K', 'M', 'G']).len());
    let n: u64 = digits.parse().ok()?;
    let shift = match unit {
        "" => 0,
        "K" => 10,
        "M" => 20,
        "G" => 30,
        _ => return None,
    };
    n.checked_mul(1 << shift).filter(|&b| b > 0)
}

/// Filters whose blocks fit the L2 cache ([`l2_cache_bytes`]) run their
/// batch calls as a plain loop ([`batch_loop`]): their blocks are in
/// cache, and the prefetch window's bookkeeping costs more than it saves.
/// Larger filters take the window. A constant (512 KiB) chose wrongly on
/// a CPU with 2 MiB of L2: a 1.3 MB filter took the window and its batch
/// ran slower than the single-query loop (BENCHMARKS.md).
#[inline]
pub(crate) fn direct_max_blocks() -> u64 {
    l2_cache_bytes() / 32
}

/// The loop of every batch call over `n` keys (first hashes `h1_of(i)`),
/// visiting key `i` with its block index: for filters of at most
/// [`direct_max_blocks`], a plain loop (in cache a prefetch saves nothing);
/// above, each key's block is prefetched [`BATCH`] keys before `visit`
/// reaches it, so the misses of a large filter overlap. With `CHEAP`
/// (`h1_of` is a load: precomputed hashes) the first hash is read twice,
/// once to prefetch and once to visit, as a hand-written prefetch loop
/// does; otherwise (`h1_of` hashes a key) a ring of [`BATCH`] slots keeps
/// each hash from the prefetch to the visit. `target` is what `visit`
/// writes (answers, plain blocks), lent to `prefetch` between visits.
#[inline(always)]
fn batch_loop<T: ?Sized, const CHEAP: bool>(
    target: &mut T,
    n: usize,
    blocks: u64,
    h1_of: impl Fn(usize) -> u64,
    prefetch: impl Fn(&T, usize),
    mut visit: impl FnMut(&mut T, usize, usize, u64),
) {
    if blocks <= direct_max_blocks() {
        for i in 0..n {
            let h1 = h1_of(i);
            visit(target, i, block_index256(h1, blocks), h1);
        }
        return;
    }
    if CHEAP {
        // The ring's stores and loads and a branch per key cost more than
        // a second load of the hash (`equal_work --ab` in BENCHMARKS.md
        // compares the two). 64 keys ahead did no better.
        let ahead = n.saturating_sub(BATCH);
        for i in 0..n.min(BATCH) {
            prefetch(target, block_index256(h1_of(i), blocks));
        }
        for i in 0..ahead {
            prefetch(target, block_index256(h1_of(i + BATCH), blocks));
            let h1 = h1_of(i);
            visit(target, i, block_index256(h1, blocks), h1);
        }
        for i in ahead..n {
            let h1 = h1_of(i);
            visit(target, i, block_index256(h1, blocks), h1);
        }
        return;
    }
    let mut ring = [(0usize, 0u64); BATCH];
    for i in 0..n + BATCH {
        if i >= BATCH {
            let (idx, h1) = ring[i % BATCH];
            visit(target, i - BATCH, idx, h1);
        }
        if i < n {
            let h1 = h1_of(i);
            let idx = block_index256(h1, blocks);
            prefetch(target, idx);
            ring[i % BATCH] = (idx, h1);
        }
    }
}

/// The batch probe ([`batch_loop`]): answer `i` is `covers` of key `i`.
#[inline(always)]
pub(crate) fn probe_batch_with<S: Blocks256 + ?Sized, const CHEAP: bool>(
    store: &S,
    blocks: u64,
    k: u32,
    h1_of: impl Fn(usize) -> u64,
    out: &mut [bool],
    covers: impl Fn(&S, usize, u64, u32) -> bool,
) {
    let n = out.len();
    batch_loop::<_, CHEAP>(
        out,
        n,
        blocks,
        h1_of,
        |_, idx| store.prefetch(idx),
        |out, i, idx, h1| out[i] = covers(store, idx, h1, k),
    );
}

/// The insert twin of [`probe_batch_with`], into plain blocks.
#[inline(always)]
pub(crate) fn insert_batch_with<const CHEAP: bool>(
    store: &mut [[u64; 4]],
    blocks: u64,
    k: u32,
    n: usize,
    h1_of: impl Fn(usize) -> u64,
    apply: impl Fn(&mut [u64; 4], u64, u32),
) {
    batch_loop::<_, CHEAP>(
        store,
        n,
        blocks,
        h1_of,
        |s, idx| s.prefetch(idx),
        |s, _, idx, h1| apply(&mut s[idx], h1, k),
    );
}

/// The insert twin of [`probe_batch_with`], into atomic lines: `set` gets
/// each key's block index and first hash.
#[inline(always)]
pub(crate) fn set_batch_with<const CHEAP: bool>(
    lines: &[AtomicLine],
    blocks: u64,
    n: usize,
    h1_of: impl Fn(usize) -> u64,
    set: impl Fn(usize, u64),
) {
    batch_loop::<_, CHEAP>(
        &mut (),
        n,
        blocks,
        h1_of,
        |_, idx| lines.prefetch(idx),
        |_, _, idx, h1| set(idx, h1),
    );
}

/// [`set256_atomic`] over many keys (first hashes `h1_of(i)`), the AVX2
/// kernel inlined into the loop when the filter has it.
#[inline]
pub(crate) fn set_batch256<const CHEAP: bool>(
    kernel: Kernel256,
    lines: &[AtomicLine],
    blocks: u64,
    k: u32,
    n: usize,
    h1_of: impl Fn(usize) -> u64,
) {
    #[cfg(target_arch = "x86_64")]
    if kernel.avx2() {
        // SAFETY: `Kernel256::pick` makes the AVX2 variants only when the
        // CPU has AVX2, and nothing else makes them.
        unsafe { simd::set_batch_avx2::<CHEAP>(lines, blocks, k, n, h1_of) };
        return;
    }
    set_batch_with::<CHEAP>(lines, blocks, n, h1_of, |idx, h1| {
        set256_atomic(kernel, lines, idx, h1, k);
    });
}

/// The batch probe over 256-bit blocks, the AVX2 or the portable kernel
/// chosen once per call and inlined into the loop; `avx2` must come from
/// [`has_avx2`].
#[inline]
pub(crate) fn probe_batch256<S: Blocks256 + ?Sized, const CHEAP: bool>(
    avx2: bool,
    store: &S,
    blocks: u64,
    k: u32,
    h1_of: impl Fn(usize) -> u64,
    out: &mut [bool],
) {
    #[cfg(target_arch = "x86_64")]
    if avx2 {
        // SAFETY: `avx2` is true only when the CPU has AVX2.
        unsafe { simd::probe_batch_avx2::<_, CHEAP>(store, blocks, k, h1_of, out) };
        return;
    }
    let _ = avx2;
    probe_batch_with::<_, CHEAP>(store, blocks, k, h1_of, out, |s, idx, h1, k| {
        covers(&s.load(idx), &mask256_scalar(h1, k))
    });
}

/// The batch insert twin of [`probe_batch256`].
#[inline]
pub(crate) fn insert_batch256<const CHEAP: bool>(
    avx2: bool,
    store: &mut [[u64; 4]],
    blocks: u64,
    k: u32,
    n: usize,
    h1_of: impl Fn(usize) -> u64,
) {
    #[cfg(target_arch = "x86_64")]
    if avx2 {
        // SAFETY: `avx2` is true only when the CPU has AVX2.
        unsafe { simd::insert_batch_avx2::<CHEAP>(store, blocks, k, n, h1_of) };
        return;
    }
    let _ = avx2;
    insert_batch_with::<CHEAP>(store, blocks, k, n, h1_of, |b, h1, k| {
        apply(b, &mask256_scalar(h1, k));
    });
}

#[cfg(test)]
mod tests {
    #[test]
    fn cache_sizes_parse_as_sysfs_writes_them() {
        use super::parse_cache_size;
        assert_eq!(parse_cache_size("512K\n"), Some(512 << 10));
        assert_eq!(parse_cache_size("2M"), Some(2 << 20));
        assert_eq!(parse_cache_size("32768K"), Some(32 << 20));
        assert_eq!(parse_cache_size("4096"), Some(4096));
        for bad in ["", "K", "0K", "12X", "-1K", "99999999999999999999G"] {
            assert_eq!(parse_cache_size(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn the_plain_loop_covers_what_fits_the_l2_cache() {
        let l2 = super::l2_cache_bytes();
        assert!(l2 >= 1 << 10, "{l2}");
        assert_eq!(super::direct_max_blocks(), l2 / 32);
    }

    #[test]
    fn cpuid_and_sysfs_report_the_same_l2_where_both_answer() {
        // Within a factor of 4 (a hybrid CPU's cores differ; CPU 0's sysfs
        // entry need not be the core this test runs on): a unit slip
        // (KiB read as bytes) is a factor of 1,024.
        if let (Some(cpuid), Some(sysfs)) = (super::l2_from_cpuid(), super::l2_from_sysfs()) {
            let ratio = cpuid.max(sysfs) as f64 / cpuid.min(sysfs) as f64;
            assert!(ratio <= 4.0, "cpuid {cpuid} B, sysfs {sysfs} B");
        }
    }
}
