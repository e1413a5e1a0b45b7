//! The smaller promises of the public API: bitmap bounds, sizing errors,
//! union, figures, and the seed-000 shapes.

mod common;

use bloomgate_filter::sizing::{self, BlockedParams, ClassicParams};
use bloomgate_filter::{
    AtomicBloom, AtomicClassicBloom, Bitmap, BlockedBloom, ClassicBloom, Error, Filter,
};
use common::Rng;

#[test]
fn bitmap_operations_and_bounds() {
    let mut b = Bitmap::new(130).unwrap();
    assert!(b.none() && !b.any() && b.len() == 130);
    assert!(!b.set(0).unwrap());
    assert!(b.set(0).unwrap(), "second set reports the bit was set");
    assert!(!b.set(129).unwrap());
    assert!(b.test(129).unwrap() && !b.test(128).unwrap());
    assert_eq!(b.count_ones(), 2);
    assert!(b.reset(0).unwrap());
    assert!(!b.reset(0).unwrap());
    assert_eq!(b.count_ones(), 1);
    for pos in [130, 131, 256, u64::MAX] {
        assert!(matches!(b.set(pos), Err(Error::OutOfRange { pos: p, len: 130 }) if p == pos));
        assert!(b.test(pos).is_err() && b.reset(pos).is_err());
    }
    // Storage is whole 64-byte lines; padding stays zero and is checked.
    assert_eq!(b.words().len(), 8);
    assert_eq!(b.bytes(), 64);
    let mut words = b.words().to_vec();
    assert_eq!(Bitmap::from_words(130, &words).unwrap(), b);
    words[2] |= 1 << 2; // bit 130: past the end
    assert!(Bitmap::from_words(130, &words).is_err());
    assert!(Bitmap::from_words(130, &words[..4]).is_err());
    b.clear();
    assert!(b.none());
    let mut other = Bitmap::new(130).unwrap();
    other.set(5).unwrap();
    b.union_with(&other).unwrap();
    assert!(b.test(5).unwrap());
    assert!(b.union_with(&Bitmap::new(131).unwrap()).is_err());
}

#[test]
fn sizing_rejects_bad_input_with_typed_errors() {
    assert!(matches!(sizing::classic(0, 0.01), Err(Error::ZeroItems)));
    for p in [0.0, 1.0, -0.5, 1.5, f64::NAN, f64::INFINITY] {
        assert!(
            matches!(sizing::classic(10, p), Err(Error::InvalidFpr(_))),
            "{p}"
        );
        assert!(
            matches!(sizing::blocked(10, p, 256), Err(Error::InvalidFpr(_))),
            "{p}"
        );
        assert!(BlockedBloom::with_fpr(10, p).is_err());
    }
    assert!(matches!(
        sizing::classic(u64::MAX, 1e-30),
        Err(Error::TooLarge { .. })
    ));
    assert!(matches!(
        sizing::blocked(u64::MAX / 2, 1e-9, 256),
        Err(Error::TooLarge { .. })
    ));
    assert!(matches!(
        sizing::blocked(10, 0.1, 1024),
        Err(Error::InvalidParameter { .. })
    ));
    assert!(ClassicBloom::new(ClassicParams { bits: 0, hashes: 3 }, 0).is_err());
    assert!(ClassicBloom::new(
        ClassicParams {
            bits: 10,
            hashes: 0
        },
        0
    )
    .is_err());
    assert!(BlockedBloom::new(
        BlockedParams {
            blocks: 1,
            block_bits: 256,
            hashes: 33
        },
        0
    )
    .is_err());
    assert!(AtomicBloom::new(
        BlockedParams {
            blocks: 1,
            block_bits: 128,
            hashes: 3
        },
        0
    )
    .is_err());
}

#[test]
fn seed_000_shape_and_formula() {
    let p = sizing::classic(500_000, 0.001).unwrap();
    assert_eq!((p.bits, p.hashes), (7_188_794, 10));
    let e = sizing::classic_fpr(p.bits, p.hashes, 500_000);
    assert!((e - 0.001).abs() < 1e-5, "{e}");
    // The blocked shape meets its target under the exact formula and is
    // larger than the classic one, which the classic formula would miss.
    let b = sizing::blocked(500_000, 0.001, 256).unwrap();
    assert!(sizing::blocked_fpr(b.blocks, 256, b.hashes, 500_000) <= 0.001);
    assert!(
        sizing::blocked_fpr(b.blocks - 1, 256, b.hashes, 500_000) > 0.001,
        "minimal"
    );
    assert!(b.bits() > p.bits);
}

#[test]
fn union_holds_both_sets_and_refuses_other_shapes() {
    let a_keys = Rng(1).keys(5000);
    let b_keys = Rng(2).keys(5000);
    let mut a = BlockedBloom::with_fpr(10_000, 0.01).unwrap();
    let mut b = BlockedBloom::with_fpr(10_000, 0.01).unwrap();
    a.insert_many(&a_keys);
    b.insert_many(&b_keys);
    a.union(&b).unwrap();
    assert!(a_keys.iter().chain(&b_keys).all(|k| a.contains(k)));
    assert_eq!(a.items(), 10_000);
    let other = BlockedBloom::with_fpr(20_000, 0.01).unwrap();
    assert!(matches!(a.union(&other), Err(Error::ShapeMismatch(_))));
    let reseeded = BlockedBloom::new(a.params(), 99).unwrap();
    assert!(matches!(a.union(&reseeded), Err(Error::ShapeMismatch(_))));

    let mut c = ClassicBloom::with_fpr(10_000, 0.01).unwrap();
    let mut d = ClassicBloom::with_fpr(10_000, 0.01).unwrap();
    for k in &a_keys {
        c.insert(k);
    }
    for k in &b_keys {
        d.insert(k);
    }
    c.union(&d).unwrap();
    assert!(a_keys.iter().chain(&b_keys).all(|k| c.contains(k)));
    assert!(c
        .union(&ClassicBloom::with_fpr(10_001, 0.01).unwrap())
        .is_err());
}

#[test]
fn figures_track_the_contents() {
    let mut f = BlockedBloom::with_fpr(100_000, 0.01).unwrap();
    assert_eq!((f.fill_ratio(), f.items(), f.count_ones()), (0.0, 0, 0));
    assert!(!f.past_capacity());
    let keys = Rng(3).keys(100_000);
    f.insert_many(&keys);
    let est = f.estimated_items();
    assert!(
        (est - 100_000.0).abs() / 100_000.0 < 0.05,
        "estimated {est}"
    );
    assert!(
        f.fill_ratio() > 0.3 && f.fill_ratio() < 0.6,
        "{}",
        f.fill_ratio()
    );
    assert!(f.bytes() as u64 * 8 >= f.bits() && f.bytes() as u64 * 8 - f.bits() < 512);
    assert!(!f.past_capacity());
    f.insert(&1u64);
    assert!(f.past_capacity(), "one past the design capacity");
    let mut out = vec![false; 3];
    assert!(matches!(
        f.contains_many(&keys[..2], &mut out),
        Err(Error::LengthMismatch {
            expected: 2,
            got: 3
        })
    ));
}

#[test]
fn atomic_and_heap_filters_set_the_same_bits() {
    let keys = Rng(4).keys(20_000);
    let mut heap = BlockedBloom::with_fpr(20_000, 0.01).unwrap();
    let shared = AtomicBloom::with_fpr(20_000, 0.01).unwrap();
    heap.insert_many(&keys[..10_000]);
    for k in &keys[10_000..] {
        heap.insert(k);
    }
    shared.insert_many(&keys[..10_000]);
    for k in &keys[10_000..] {
        shared.insert(k);
    }
    let copy = shared.to_blocked();
    assert_eq!(copy.bitmap().words(), heap.bitmap().words());
    let back = AtomicBloom::from_blocked(&heap).unwrap();
    assert_eq!(back.count_ones(), heap.count_ones());
    let mut out = vec![false; keys.len()];
    back.contains_many(&keys, &mut out).unwrap();
    assert!(out.iter().all(|&b| b));
}

#[test]
fn atomic_classic_sets_the_bits_of_seed_000s_scheme() {
    // Seed 000's configuration: 500,000 ids at 0.001.
    let keys: Vec<u64> = (1..=200_000).collect();
    let mut heap = ClassicBloom::with_fpr(500_000, 0.001).unwrap();
    let shared = AtomicClassicBloom::with_fpr(500_000, 0.001).unwrap();
    assert_eq!((shared.bits(), shared.hashes()), (7_188_794, 10));
    for k in &keys {
        heap.insert(k);
    }
    std::thread::scope(|s| {
        for part in keys.chunks(50_000) {
            let shared = &shared;
            s.spawn(move || shared.insert_many(part));
        }
    });
    let copy = shared.to_classic();
    assert_eq!(copy.bitmap().words(), heap.bitmap().words());
    assert_eq!(shared.items(), 200_000);
    assert_eq!(shared.count_ones(), heap.count_ones());
    assert!(keys.iter().all(|k| shared.contains(k)));
    let absent = (200_001..300_001u64).filter(|k| shared.contains(k)).count();
    assert_eq!(
        absent,
        (200_001..300_001u64).filter(|k| heap.contains(k)).count()
    );
    assert!(AtomicClassicBloom::with_fpr(0, 0.01).is_err());
    assert!(AtomicClassicBloom::with_fpr(10, 1.5).is_err());
}

/// The pre-hashed batch calls set and answer exactly what the per-key
/// calls do, for the plain and the concurrent filter, members and
/// non-members alike (their kernels are chosen once per batch).
#[test]
fn batch_calls_on_hashes_agree_with_single_calls() {
    use bloomgate_filter::hash::BloomKey;
    let keys = Rng(5).keys(400_000);
    let others = Rng(6).keys(30_000);
    // A cache-sized filter and one of 640 KiB (probed through the prefetch
    // window where L2 is smaller; `batch_window.rs` forces the window),
    // each filled to a few % FPR.
    for (blocks, m, k) in [1u32, 3, 8, 11, 16]
        .into_iter()
        .map(|k| (1_000, 10_000, k))
        .chain([(20_000, 400_000, 8), (20_000, 200_000, 3)])
    {
        let params = bloomgate_filter::sizing::BlockedParams {
            blocks,
            block_bits: 256,
            hashes: k,
        };
        let mut single = BlockedBloom::new(params, 9).unwrap();
        let mut batch = BlockedBloom::new(params, 9).unwrap();
        let atomic = AtomicBloom::new(params, 9).unwrap();
        let atomic_single = AtomicBloom::new(params, 9).unwrap();
        let hashes: Vec<_> = keys.iter().map(|key| key.hash_pair(9)).collect();
        let mut fresh = 0;
        for key in &keys[..m] {
            // One thread: both say whether the key set a new bit.
            let new = single.insert(key);
            assert_eq!(atomic_single.insert(key), new, "k {k}");
            fresh += usize::from(new);
        }
        assert!(fresh > 1_000, "new bits seen: {fresh}");
        assert!(!atomic_single.insert(&keys[0]), "a key already present");
        assert_eq!(
            atomic_single.to_blocked().bitmap().words(),
            single.bitmap().words()
        );
        batch.insert_hashes(&hashes[..m]);
        atomic.insert_hashes(&hashes[..m]);
        assert_eq!(single.bitmap().words(), batch.bitmap().words(), "k {k}");
        assert_eq!(atomic.to_blocked().bitmap().words(), batch.bitmap().words());
        assert_eq!((batch.items(), atomic.items()), (m as u64, m as u64));
        let probe: Vec<_> = keys[..5_000]
            .iter()
            .chain(&others)
            .map(|key| key.hash_pair(9))
            .collect();
        let (mut a, mut b) = (vec![false; probe.len()], vec![false; probe.len()]);
        batch.contains_hashes(&probe, &mut a).unwrap();
        atomic.contains_hashes(&probe, &mut b).unwrap();
        let expect: Vec<bool> = probe.iter().map(|&h| single.contains_hash(h)).collect();
        assert_eq!(a, expect, "k {k}");
        assert_eq!(b, expect, "k {k}");
        let one_by_one: Vec<bool> = probe.iter().map(|&h| atomic.contains_hash(h)).collect();
        assert_eq!(one_by_one, expect, "k {k}");
        assert!(a[..5_000].iter().all(|&x| x), "no false negatives");
        assert!(
            a[5_000..].iter().any(|&x| !x) && a[5_000..].iter().any(|&x| x),
            "a mix"
        );
        assert!(batch.contains_hashes(&probe, &mut a[..1]).is_err());
        assert!(atomic.contains_hashes(&probe, &mut b[..1]).is_err());
    }
}
