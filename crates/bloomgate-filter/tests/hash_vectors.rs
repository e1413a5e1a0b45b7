//! Fixed keys give fixed positions, on every platform and in every release.
//! The expected values were computed by an independent implementation of the
//! documented formulas (seed 000's C++ for the classic scheme).

use bloomgate_filter::hash::{splitmix64, HashPair};
use bloomgate_filter::sizing::{BlockedParams, ClassicParams};
use bloomgate_filter::{BlockedBloom, ClassicBloom};

#[test]
fn splitmix64_matches_the_reference_generator() {
    // The first output of the reference splitmix64 generator seeded with 0.
    assert_eq!(splitmix64(0), 0xe220_a839_7b1d_cdaf);
    assert_eq!(HashPair::from_u64(0, 0).h1, 0xe220_a839_7b1d_cdaf);
}

#[test]
fn xxh3_128_matches_the_reference_for_the_empty_input() {
    let h = HashPair::from_bytes(b"", 0);
    assert_eq!(h.h1, 0x6001_c324_468d_497f);
    assert_eq!(h.h2, 0x99aa_06d3_0147_98d8);
}

#[test]
fn classic_positions_match_seed_000() {
    let f = ClassicBloom::new(
        ClassicParams {
            bits: 7_188_794,
            hashes: 10,
        },
        0,
    )
    .unwrap();
    let cases: [(u64, [u64; 10]); 3] = [
        (
            1,
            [
                2561945, 4959166, 167593, 2564814, 6980617, 2189044, 4586265, 6983486, 2191913,
                4589134,
            ],
        ),
        (
            200_000,
            [
                6185634, 6589905, 4975594, 5379865, 3765554, 4169825, 2555514, 2959785, 1345474,
                1749745,
            ],
        ),
        (
            0xdead_beef,
            [
                3784687, 3415751, 5065397, 4696461, 6346107, 5977171, 438023, 69087, 6888945,
                1349797,
            ],
        ),
    ];
    for (key, want) in cases {
        let got: Vec<u64> = f.positions(&key).collect();
        assert_eq!(got, want, "key {key}");
    }
}

#[test]
fn blocked_positions_are_pinned() {
    let f = BlockedBloom::new(
        BlockedParams {
            blocks: 36_000,
            block_bits: 256,
            hashes: 10,
        },
        0,
    )
    .unwrap();
    let cases: [(u64, [u64; 10]); 3] = [
        (
            1,
            [
                5221391, 5221417, 5221467, 5221498, 5221528, 5221567, 5221571, 5221621, 5221401,
                5221417,
            ],
        ),
        (
            200_000,
            [
                5050897, 5050917, 5050971, 5050988, 5051034, 5051067, 5051091, 5051129, 5050905,
                5050923,
            ],
        ),
        (
            0xdead_beef,
            [
                2695450, 2695463, 2695493, 2695530, 2695555, 2695609, 2695623, 2695654, 2695450,
                2695474,
            ],
        ),
    ];
    for (key, want) in cases {
        let got: Vec<u64> = f.positions(&key).collect();
        assert_eq!(got, want, "key {key}");
    }
}

#[test]
fn integer_widths_hash_alike_and_strings_differ() {
    assert_eq!(
        HashPair::from_u64(5, 9),
        bloomgate_filter::BloomKey::hash_pair(&5u32, 9)
    );
    assert_ne!(HashPair::from_u64(5, 0), HashPair::from_bytes(b"5", 0));
    assert_ne!(HashPair::from_u64(5, 0), HashPair::from_u64(5, 1));
}

#[test]
fn wide_block_positions_are_pinned_and_are_what_insert_sets() {
    let shape = BlockedParams {
        blocks: 36_000,
        block_bits: 512,
        hashes: 12,
    };
    let mut f = BlockedBloom::new(shape, 0).unwrap();
    let cases: [(u64, [u64; 12]); 2] = [(1, PIN_1), (0xdead_beef, PIN_DEADBEEF)];
    for (key, want) in cases {
        let got: Vec<u64> = f.positions(&key).collect();
        assert_eq!(got, want, "key {key}");
        let block = want[0] / 512;
        assert!(want.iter().all(|p| p / 512 == block), "one line per key");
        f.insert(&key);
        for p in want {
            assert!(f.bitmap().test(p).unwrap(), "insert set {p}");
        }
    }
    let set: u64 = f.bitmap().count_ones();
    let distinct: std::collections::BTreeSet<u64> =
        PIN_1.iter().chain(&PIN_DEADBEEF).copied().collect();
    assert_eq!(set, distinct.len() as u64, "insert sets nothing else");
}

const PIN_1: [u64; 12] = [
    10442994, 10442900, 10443199, 10443177, 10443136, 10443260, 10442800, 10443094, 10443154,
    10442905, 10442955, 10442944,
];
/// Holds one position twice (5390965): positions are drawn with replacement.
const PIN_DEADBEEF: [u64; 12] = [
    5391269, 5390965, 5390939, 5391012, 5390899, 5391259, 5390965, 5390956, 5391274, 5391147,
    5391294, 5391304,
];
