//! No false negatives, for every layout, checked over random key sets.

mod common;

use std::collections::HashMap;

use bloomgate_filter::{
    AtomicBloom, AtomicClassicBloom, BlockedBloom, ClassicBloom, CountingBloom, Filter,
    ScalableBloom, ScalableOptions,
};
use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn blocked_finds_every_key(keys in prop::collection::vec(any::<u64>(), 1..2000), p in 0.0001f64..0.5) {
        let mut f = BlockedBloom::with_fpr(keys.len() as u64, p).unwrap();
        for k in &keys { f.insert(k); }
        prop_assert!(keys.iter().all(|k| f.contains(k)));
        let mut out = vec![false; keys.len()];
        f.contains_many(&keys, &mut out).unwrap();
        prop_assert!(out.iter().all(|&b| b));
    }

    #[test]
    fn blocked_batch_insert_finds_every_key(keys in prop::collection::vec(any::<u64>(), 1..2000)) {
        let mut f = BlockedBloom::with_fpr(keys.len() as u64, 0.01).unwrap();
        f.insert_many(&keys);
        prop_assert!(keys.iter().all(|k| f.contains(k)));
        prop_assert_eq!(f.items(), keys.len() as u64);
    }

    #[test]
    fn classic_finds_every_key(keys in prop::collection::vec(any::<u64>(), 1..2000), p in 0.0001f64..0.5) {
        let mut f = ClassicBloom::with_fpr(keys.len() as u64, p).unwrap();
        for k in &keys { f.insert(k); }
        prop_assert!(keys.iter().all(|k| f.contains(k)));
    }

    #[test]
    fn string_keys_are_found(keys in prop::collection::vec(".{0,40}", 1..500)) {
        let mut b = BlockedBloom::with_fpr(keys.len() as u64, 0.01).unwrap();
        let mut c = ClassicBloom::with_fpr(keys.len() as u64, 0.01).unwrap();
        for k in &keys { b.insert(k.as_str()); c.insert(k.as_str()); }
        prop_assert!(keys.iter().all(|k| b.contains(k.as_str()) && c.contains(k.as_str())));
    }

    #[test]
    fn concurrent_filters_find_keys_inserted_from_several_threads(keys in prop::collection::vec(any::<u64>(), 4..4000), threads in 2usize..6) {
        let f = AtomicBloom::with_fpr(keys.len() as u64, 0.01).unwrap();
        insert_from_threads(&keys, threads, |k| { f.insert(k); });
        prop_assert!(keys.iter().all(|k| f.contains(k)));
        prop_assert_eq!(f.items(), keys.len() as u64);
        // Its heap copy says the same.
        let heap = f.to_blocked();
        prop_assert!(keys.iter().all(|k| heap.contains(k)));

        let f = AtomicClassicBloom::with_fpr(keys.len() as u64, 0.01).unwrap();
        insert_from_threads(&keys, threads, |k| { f.insert(k); });
        prop_assert!(keys.iter().all(|k| f.contains(k)));
        prop_assert_eq!(f.items(), keys.len() as u64);
        let heap = f.to_classic();
        prop_assert!(keys.iter().all(|k| heap.contains(k)));
    }

    #[test]
    fn counting_never_loses_a_key_with_positive_count(
        ops in prop::collection::vec((0u64..300, any::<bool>()), 1..3000)
    ) {
        // A reference multiset; removals are only issued for keys it holds,
        // as the filter's contract requires.
        let mut f = CountingBloom::with_fpr(300, 0.01).unwrap();
        let mut reference: HashMap<u64, u32> = HashMap::new();
        for (key, insert) in ops {
            let count = reference.entry(key).or_default();
            if insert || *count == 0 {
                f.insert(&key);
                *count += 1;
            } else {
                f.remove(&key).unwrap();
                *count -= 1;
            }
            for (k, &c) in &reference {
                if c > 0 {
                    prop_assert!(f.contains(k), "lost key {k} with count {c}");
                }
            }
        }
        let plain = f.to_bloom();
        for (k, &c) in &reference {
            if c > 0 { prop_assert!(plain.contains(k)); }
        }
    }

    #[test]
    fn scalable_finds_every_key(keys in prop::collection::vec(any::<u64>(), 1..5000)) {
        let mut f = ScalableBloom::new(ScalableOptions::new(100, 0.01)).unwrap();
        for k in &keys { f.insert(k).unwrap(); }
        prop_assert!(keys.iter().all(|k| f.contains(k)));
    }
}

/// Splits `keys` over `threads` scoped threads, each calling `insert`.
fn insert_from_threads(keys: &[u64], threads: usize, insert: impl Fn(&u64) + Sync) {
    std::thread::scope(|s| {
        for part in keys.chunks(keys.len().div_ceil(threads)) {
            let insert = &insert;
            s.spawn(move || part.iter().for_each(insert));
        }
    });
}
