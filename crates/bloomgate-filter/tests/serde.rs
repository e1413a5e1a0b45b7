//! The `serde` feature (on for the crate's own tests): every filter makes a
//! round trip through JSON and through postcard with fixed-seed members,
//! answers exactly as before afterwards (so every member is still "maybe"
//! and the rate is the original's), stays compact, and refuses corrupted
//! bytes with an error instead of becoming a filter that says a wrong "no".

mod common;

use bloomgate_filter::{
    AtomicBloom, AtomicClassicBloom, BlockedBloom, ClassicBloom, CountingBloom, Filter, KeyKind,
    ScalableBloom, ScalableOptions, Snapshot,
};
use common::{three_sigma, Rng};
use serde::{de::DeserializeOwned, Serialize};

const N: usize = 20_000;
const P: f64 = 0.01;
const PROBES: u64 = 200_000;

/// At most the 1% target (times the classic scheme's allowance for
/// rounding k: its formula rate at 1% is 1.0039%) plus three standard
/// deviations of the probe count.
fn fpr_bound() -> f64 {
    P * 1.004 + three_sigma(P * 1.004, PROBES)
}

/// Round trips `f` through JSON and postcard; `bytes_len` is the size of
/// its snapshot, which both forms must stay close to.
fn check<F: Filter + Serialize + DeserializeOwned>(
    name: &str,
    f: &F,
    members: &[u64],
    bytes_len: usize,
) {
    let json = serde_json::to_string(f).unwrap();
    let binary = postcard::to_allocvec(f).unwrap();
    // Compact: postcard adds a length prefix; JSON a base64 string.
    assert!(
        binary.len() <= bytes_len + 10,
        "{name}: postcard {} bytes for a {bytes_len}-byte snapshot",
        binary.len()
    );
    assert!(
        json.len() <= bytes_len * 4 / 3 + 10 && json.starts_with('"'),
        "{name}: JSON {} bytes for a {bytes_len}-byte snapshot",
        json.len()
    );
    let from_json: F = serde_json::from_str(&json).unwrap();
    let from_binary: F = postcard::from_bytes(&binary).unwrap();
    for (form, g) in [("json", &from_json), ("postcard", &from_binary)] {
        assert!(
            members.iter().all(|k| g.contains(k)),
            "{name} via {form}: a member answers no"
        );
        assert_eq!(g.items(), f.items(), "{name} via {form}");
        let mut rng = Rng(0xfeed);
        let mut hits = 0u64;
        for _ in 0..PROBES {
            let k = rng.next_u64();
            let (before, after) = (f.contains(&k), g.contains(&k));
            assert_eq!(before, after, "{name} via {form}: {k} answers differently");
            hits += u64::from(after);
        }
        let rate = hits as f64 / PROBES as f64;
        assert!(
            rate <= fpr_bound(),
            "{name} via {form}: rate {rate} above {}",
            fpr_bound()
        );
    }
    // Corrupted bytes are refused, in both forms.
    let mut bad = binary.clone();
    let mid = bad.len() / 2;
    bad[mid] ^= 0x10;
    assert!(
        postcard::from_bytes::<F>(&bad).is_err(),
        "{name}: a flipped bit was accepted"
    );
    let truncated = &binary[..binary.len() - 9];
    assert!(
        postcard::from_bytes::<F>(truncated).is_err(),
        "{name}: truncated"
    );
    let mut bad_json = json.into_bytes();
    let mid = bad_json.len() / 2;
    bad_json[mid] = if bad_json[mid] == b'A' { b'B' } else { b'A' };
    assert!(
        serde_json::from_slice::<F>(&bad_json).is_err(),
        "{name}: a changed base64 character was accepted"
    );
    assert!(serde_json::from_str::<F>("\"not base64!\"").is_err());
    assert!(serde_json::from_str::<F>("[1, 2, 3]").is_err());
}

fn members(seed: u64) -> Vec<u64> {
    Rng(seed).keys(N)
}

#[test]
fn blocked_classic_and_counting_round_trip() {
    let keys = members(1);
    let mut blocked = BlockedBloom::with_fpr(N as u64, P).unwrap();
    blocked.insert_many(&keys);
    let len = blocked.to_bytes(KeyKind::Unspecified).len();
    check("blocked", &blocked, &keys, len);

    let keys = members(2);
    let mut classic = ClassicBloom::with_fpr(N as u64, P).unwrap();
    for k in &keys {
        classic.insert(k);
    }
    let len = classic.to_bytes(KeyKind::Unspecified).len();
    check("classic", &classic, &keys, len);

    let keys = members(3);
    let mut counting = CountingBloom::with_fpr(N as u64, P).unwrap();
    for k in &keys {
        counting.insert(k);
    }
    let len = counting.to_bytes(KeyKind::Unspecified).len();
    check("counting", &counting, &keys, len);
}

#[test]
fn concurrent_filters_round_trip_through_their_twins() {
    let keys = members(4);
    let atomic = AtomicBloom::with_fpr(N as u64, P).unwrap();
    atomic.insert_many(&keys);
    let len = atomic.to_blocked().to_bytes(KeyKind::Unspecified).len();
    check("atomic", &atomic, &keys, len);

    let keys = members(5);
    let classic = AtomicClassicBloom::with_fpr(N as u64, P).unwrap();
    classic.insert_many(&keys);
    let len = classic.to_classic().to_bytes(KeyKind::Unspecified).len();
    check("atomic classic", &classic, &keys, len);
}

#[test]
fn a_grown_scalable_chain_round_trips() {
    let keys = members(6);
    let mut chain = ScalableBloom::new(ScalableOptions {
        seed: 11,
        ..ScalableOptions::new(2_000, P)
    })
    .unwrap();
    for k in &keys {
        chain.insert(k).unwrap();
    }
    assert!(chain.chain().len() >= 4, "the chain grew");
    check("scalable", &chain, &keys, chain.to_bytes().len());
}

#[test]
fn a_scalable_snapshot_refuses_bad_bytes_field_by_field() {
    let mut chain = ScalableBloom::new(ScalableOptions::new(100, P)).unwrap();
    for k in 0..500u64 {
        chain.insert(&k).unwrap();
    }
    let good = chain.to_bytes();
    let back = ScalableBloom::from_bytes(&good).unwrap();
    assert_eq!(back.chain(), chain.chain());
    assert_eq!(back.options(), chain.options());
    // Every single-byte change anywhere is refused (header checksum,
    // payload checksum, or a link's own checks).
    for at in (0..good.len()).step_by(7) {
        let mut bad = good.clone();
        bad[at] ^= 0x01;
        assert!(
            ScalableBloom::from_bytes(&bad).is_err(),
            "byte {at} of {} changed and accepted",
            good.len()
        );
    }
    for cut in [0, 8, 63, 64, 72, good.len() - 1] {
        assert!(
            ScalableBloom::from_bytes(&good[..cut]).is_err(),
            "cut at {cut}"
        );
    }
    let mut longer = good.clone();
    longer.push(0);
    assert!(ScalableBloom::from_bytes(&longer).is_err());
    // A plain filter's snapshot is not a chain.
    let plain = BlockedBloom::with_fpr(100, P)
        .unwrap()
        .to_bytes(KeyKind::Integer);
    assert!(ScalableBloom::from_bytes(&plain).is_err());
    // Save and load through a file.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("chain.bgs");
    chain.save(&path).unwrap();
    let loaded = ScalableBloom::load(&path).unwrap();
    assert!((0..500u64).all(|k| loaded.contains(&k)));
}
