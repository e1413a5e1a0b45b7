//! The batch calls' prefetching loops (the window over keys being hashed,
//! and the one over precomputed hashes) set and answer exactly what the
//! per-key calls do. A filter takes those loops only when it is larger
//! than the L2 cache, which differs per machine, so this binary sets the
//! cache to 1 KiB (`BLOOMGATE_L2_CACHE_BYTES`) before any filter reads it:
//! every filter here above 32 blocks takes them.

use bloomgate_filter::hash::{splitmix64, BloomKey, HashPair};
use bloomgate_filter::sizing::BlockedParams;
use bloomgate_filter::{AtomicBloom, BlockedBloom, Filter};

#[test]
fn prefetching_batches_agree_with_single_calls() {
    // SAFETY: the only test of this binary, so no other thread reads the
    // environment while it is written.
    unsafe { std::env::set_var("BLOOMGATE_L2_CACHE_BYTES", "1024") };
    assert_eq!(bloomgate_filter::l2_cache_bytes(), 1024);
    let keys: Vec<u64> = (0..60_000u64).map(|i| splitmix64(i ^ 0x5eed)).collect();
    let others: Vec<u64> = (0..20_000u64).map(|i| splitmix64(i ^ (1 << 60))).collect();
    // Sizes around the window (31 keys, 32, 33, many) and filters of a few
    // % FPR, so non-members answer both ways.
    for (blocks, m, k) in [
        (2_000u64, 60_000usize, 8u32),
        (2_000, 33, 3),
        (500, 32, 5),
        (500, 31, 1),
    ] {
        let params = BlockedParams {
            blocks,
            block_bits: 256,
            hashes: k,
        };
        let hashes: Vec<HashPair> = keys[..m].iter().map(|key| key.hash_pair(7)).collect();
        let mut single = BlockedBloom::new(params, 7).unwrap();
        for key in &keys[..m] {
            single.insert(key);
        }
        let mut by_key = BlockedBloom::new(params, 7).unwrap();
        by_key.insert_many(&keys[..m]);
        let mut by_hash = BlockedBloom::new(params, 7).unwrap();
        by_hash.insert_hashes(&hashes);
        let atomic_key = AtomicBloom::new(params, 7).unwrap();
        atomic_key.insert_many(&keys[..m]);
        let atomic_hash = AtomicBloom::new(params, 7).unwrap();
        atomic_hash.insert_hashes(&hashes);
        let words = single.bitmap().words();
        assert_eq!(by_key.bitmap().words(), words, "blocks {blocks} m {m}");
        assert_eq!(by_hash.bitmap().words(), words, "blocks {blocks} m {m}");
        assert_eq!(atomic_key.to_blocked().bitmap().words(), words);
        assert_eq!(atomic_hash.to_blocked().bitmap().words(), words);

        let probe: Vec<u64> = keys[..m.min(5_000)]
            .iter()
            .chain(&others)
            .copied()
            .collect();
        let probe_hashes: Vec<HashPair> = probe.iter().map(|key| key.hash_pair(7)).collect();
        let expect: Vec<bool> = probe.iter().map(|key| single.contains(key)).collect();
        let mut out = vec![false; probe.len()];
        single.contains_many(&probe, &mut out).unwrap();
        assert_eq!(out, expect, "contains_many, blocks {blocks} m {m}");
        single.contains_hashes(&probe_hashes, &mut out).unwrap();
        assert_eq!(out, expect, "contains_hashes, blocks {blocks} m {m}");
        atomic_hash.contains_many(&probe, &mut out).unwrap();
        assert_eq!(out, expect, "atomic contains_many, blocks {blocks} m {m}");
        atomic_hash
            .contains_hashes(&probe_hashes, &mut out)
            .unwrap();
        assert_eq!(out, expect, "atomic contains_hashes, blocks {blocks} m {m}");
        let members = m.min(5_000);
        assert!(expect[..members].iter().all(|&x| x), "no false negatives");
        if m == 60_000 {
            let fp = expect[members..].iter().filter(|&&x| x).count();
            assert!(fp > 0 && fp < others.len(), "a mix: {fp} false positives");
        }
    }
}
