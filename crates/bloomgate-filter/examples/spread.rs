//! Prints the expected rate and its filter-to-filter spread for a few shapes.
use bloomgate_filter::sizing;
fn main() {
    for n in [10_000u64, 1_000_000] {
        for p in [1e-1, 1e-2, 1e-3, 1e-4] {
            let b = sizing::blocked(n, p, 256).unwrap();
            let e = sizing::blocked_fpr(b.blocks, 256, b.hashes, n);
            let sd = sizing::blocked_fpr_spread(b.blocks, 256, b.hashes, n);
            println!(
                "n={n} p={p} k={} bits/key={:.2} expected={e:.4e} spread={sd:.3e} ({:.1}%)",
                b.hashes,
                b.bits() as f64 / n as f64,
                100.0 * sd / e
            );
        }
    }
}
