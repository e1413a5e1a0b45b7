//! Snapshot round trips (heap and mmap) and a corpus of broken files.

mod common;

use bloomgate_filter::snapshot::{decode_header, HEADER_LEN};
use bloomgate_filter::{
    BlockedBloom, ClassicBloom, CountingBloom, Error, Filter, KeyKind, MappedBloom, Snapshot,
    SnapshotError,
};
use common::Rng;
use xxhash_rust_shim::rehash_header;

/// Recomputes the header checksum after a deliberate field change, so the
/// field validation (not the checksum) is what rejects the file.
mod xxhash_rust_shim {
    pub fn rehash_header(bytes: &mut [u8]) {
        let at = bloomgate_filter::snapshot::HEADER_LEN - 8;
        let sum = xxh3(&bytes[..at]);
        bytes[at..at + 8].copy_from_slice(&sum.to_le_bytes());
    }
    fn xxh3(b: &[u8]) -> u64 {
        bloomgate_filter::snapshot::header_checksum(b)
    }
}

fn sample_blocked() -> (BlockedBloom, Vec<u64>) {
    let keys = Rng(11).keys(20_000);
    let mut f = BlockedBloom::with_fpr(20_000, 0.01).unwrap();
    f.insert_many(&keys);
    (f, keys)
}

fn snapshot_err(r: Result<(BlockedBloom, KeyKind), Error>) -> SnapshotError {
    match r {
        Err(Error::Snapshot(e)) => e,
        Err(other) => panic!("expected a snapshot error, got {other}"),
        Ok(_) => panic!("a broken snapshot was accepted"),
    }
}

#[test]
fn heap_and_mmap_round_trips_give_identical_answers() {
    let dir = tempfile::tempdir().unwrap();
    let (f, keys) = sample_blocked();
    let path = dir.path().join("b.bgf");
    f.save(&path, KeyKind::Integer).unwrap();
    let (loaded, kind) = BlockedBloom::load(&path).unwrap();
    assert_eq!(kind, KeyKind::Integer);
    assert_eq!(loaded, f);
    let view = MappedBloom::open(&path).unwrap();
    view.verify().unwrap();
    assert_eq!(view.items(), f.items());
    assert_eq!(view.count_ones(), f.count_ones());
    assert!(keys.iter().all(|k| view.contains(k)));
    let mut rng = Rng(12);
    for _ in 0..200_000 {
        let k = rng.next_u64();
        assert_eq!(view.contains(&k), f.contains(&k));
    }

    // A low-rate filter (512-bit blocks) round-trips and maps the same way.
    let mut w = BlockedBloom::with_fpr(20_000, 1e-5).unwrap();
    assert_eq!(w.params().block_bits, 512);
    w.insert_many(&keys);
    let wpath = dir.path().join("w.bgf");
    w.save(&wpath, KeyKind::Integer).unwrap();
    assert_eq!(BlockedBloom::load(&wpath).unwrap().0, w);
    let wview = MappedBloom::open(&wpath).unwrap();
    wview.verify().unwrap();
    assert!(keys.iter().all(|k| wview.contains(k)));
    for _ in 0..100_000 {
        let k = rng.next_u64();
        assert_eq!(wview.contains(&k), w.contains(&k));
    }

    let mut c = ClassicBloom::with_fpr(5000, 0.001).unwrap();
    let mut cnt = CountingBloom::with_fpr(5000, 0.01).unwrap();
    for k in &keys[..5000] {
        c.insert(k);
        cnt.insert(k);
    }
    let cpath = dir.path().join("c.bgf");
    c.save(&cpath, KeyKind::Integer).unwrap();
    assert_eq!(ClassicBloom::load(&cpath).unwrap().0, c);
    let cview = MappedBloom::open(&cpath).unwrap();
    let npath = dir.path().join("n.bgf");
    cnt.save(&npath, KeyKind::Unspecified).unwrap();
    assert_eq!(CountingBloom::load(&npath).unwrap().0, cnt);
    let nview = MappedBloom::open(&npath).unwrap();
    for _ in 0..100_000 {
        let k = rng.next_u64();
        assert_eq!(cview.contains(&k), c.contains(&k));
        assert_eq!(nview.contains(&k), cnt.contains(&k));
    }
    assert!(keys[..5000]
        .iter()
        .all(|k| cview.contains(k) && nview.contains(k)));
}

#[test]
fn every_flipped_byte_is_rejected_with_the_right_error() {
    let (f, _) = sample_blocked();
    let good = f.to_bytes(KeyKind::Integer);
    assert!(BlockedBloom::from_bytes(&good).is_ok());
    let len = good.len();
    // Every header byte, a stride of payload bytes, and the trailer.
    let positions = (0..HEADER_LEN)
        .chain((HEADER_LEN..len - 8).step_by(97))
        .chain(len - 8..len);
    for at in positions {
        let mut bad = good.clone();
        bad[at] ^= 0x10;
        let e = snapshot_err(BlockedBloom::from_bytes(&bad));
        let want_ok = match at {
            0..8 => e == SnapshotError::BadMagic,
            8..10 => matches!(e, SnapshotError::UnsupportedVersion(_)),
            10..HEADER_LEN => e == SnapshotError::HeaderChecksum,
            _ => e == SnapshotError::PayloadChecksum,
        };
        assert!(want_ok, "byte {at}: got {e:?}");
    }
}

#[test]
fn truncated_and_extended_files_are_rejected() {
    let (f, _) = sample_blocked();
    let good = f.to_bytes(KeyKind::Integer);
    for cut in (0..good.len())
        .step_by(251)
        .chain([good.len() - 1, 7, 8, 63, 64])
    {
        let e = snapshot_err(BlockedBloom::from_bytes(&good[..cut]));
        assert!(
            matches!(e, SnapshotError::Truncated { .. } | SnapshotError::BadMagic),
            "cut at {cut}: {e:?}"
        );
    }
    let mut longer = good.clone();
    longer.extend_from_slice(&[0; 3]);
    assert_eq!(
        snapshot_err(BlockedBloom::from_bytes(&longer)),
        SnapshotError::TrailingBytes(3)
    );
}

/// `read_header` reads only the first bytes of the file, and judges it as
/// `decode_header` judges the whole of it.
#[test]
fn reading_a_files_header_agrees_with_decoding_the_whole_file() {
    let (f, _) = sample_blocked();
    let good = f.to_bytes(KeyKind::Integer);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("h.bgf");
    let mut longer = good.clone();
    longer.extend_from_slice(&[0; 3]);
    for bytes in [
        good.clone(),
        good[..good.len() - 1].to_vec(),
        good[..HEADER_LEN].to_vec(),
        good[..HEADER_LEN - 1].to_vec(),
        good[..7].to_vec(),
        longer,
    ] {
        std::fs::write(&path, &bytes).unwrap();
        let read = bloomgate_filter::snapshot::read_header(&path).map_err(|e| match e {
            Error::Snapshot(s) => s,
            other => panic!("{other:?}"),
        });
        assert_eq!(read, decode_header(&bytes, None), "{} bytes", bytes.len());
    }
    assert!(
        decode_header(&good, None).is_ok(),
        "the good file is read as good"
    );
}

#[test]
fn header_field_changes_are_rejected_even_with_a_valid_checksum() {
    let (f, _) = sample_blocked();
    let good = f.to_bytes(KeyKind::Integer);
    type Edit = fn(&mut Vec<u8>);
    type Check = fn(&SnapshotError) -> bool;
    let cases: [(&str, Edit, Check); 10] = [
        (
            "layout",
            |b| b[10] = 9,
            |e| matches!(e, SnapshotError::WrongLayout { .. }),
        ),
        (
            "classic layout",
            |b| b[10] = 1,
            |e| matches!(e, SnapshotError::WrongLayout { .. }),
        ),
        (
            "hash id",
            |b| b[11] = 7,
            |e| *e == SnapshotError::UnknownHash(7),
        ),
        (
            "zero hashes",
            |b| b[12..16].copy_from_slice(&0u32.to_le_bytes()),
            |e| {
                matches!(
                    e,
                    SnapshotError::InvalidField {
                        field: "hashes",
                        ..
                    }
                )
            },
        ),
        (
            "bits",
            |b| {
                let m = u64::from_le_bytes(b[24..32].try_into().unwrap());
                b[24..32].copy_from_slice(&(m + 512).to_le_bytes());
            },
            |e| {
                matches!(
                    e,
                    SnapshotError::InvalidField {
                        field: "payload_len",
                        ..
                    }
                )
            },
        ),
        (
            "payload length",
            |b| b[40] ^= 0x40,
            |e| {
                matches!(
                    e,
                    SnapshotError::InvalidField {
                        field: "payload_len",
                        ..
                    }
                )
            },
        ),
        (
            "block size",
            |b| b[48..50].copy_from_slice(&100u16.to_le_bytes()),
            |e| {
                matches!(
                    e,
                    SnapshotError::InvalidField {
                        field: "block_bits",
                        ..
                    }
                )
            },
        ),
        (
            "reserved",
            |b| b[53] = 1,
            |e| {
                matches!(
                    e,
                    SnapshotError::InvalidField {
                        field: "reserved",
                        ..
                    }
                )
            },
        ),
        (
            "reserved tail",
            |b| b[100] = 1,
            |e| {
                matches!(
                    e,
                    SnapshotError::InvalidField {
                        field: "reserved",
                        ..
                    }
                )
            },
        ),
        (
            "design rate",
            |b| b[64..72].copy_from_slice(&2.0f64.to_bits().to_le_bytes()),
            |e| {
                matches!(
                    e,
                    SnapshotError::InvalidField {
                        field: "design",
                        ..
                    }
                )
            },
        ),
    ];
    for (name, edit, ok) in cases {
        let mut bad = good.clone();
        edit(&mut bad);
        rehash_header(&mut bad);
        let e = snapshot_err(BlockedBloom::from_bytes(&bad));
        assert!(ok(&e), "{name}: got {e:?}");
    }
    let mut v2 = good.clone();
    v2[8..10].copy_from_slice(&2u16.to_le_bytes());
    rehash_header(&mut v2);
    assert_eq!(
        snapshot_err(BlockedBloom::from_bytes(&v2)),
        SnapshotError::UnsupportedVersion(2)
    );
}

#[test]
fn a_padding_bit_past_the_end_is_rejected() {
    // 100 bits: the rest of the 64-byte line is padding and must stay zero.
    let c = ClassicBloom::new(
        bloomgate_filter::sizing::ClassicParams {
            bits: 100,
            hashes: 3,
        },
        0,
    )
    .unwrap();
    let mut bytes = c.to_bytes(KeyKind::Integer);
    bytes[HEADER_LEN + 40] = 1; // bit 320
    let n = bytes.len();
    let sum = bloomgate_filter::snapshot::header_checksum(&bytes[HEADER_LEN..n - 8]);
    bytes[n - 8..].copy_from_slice(&sum.to_le_bytes());
    assert!(matches!(
        ClassicBloom::from_bytes(&bytes),
        Err(Error::Snapshot(SnapshotError::InvalidField {
            field: "payload",
            ..
        }))
    ));
}

#[test]
fn mmap_open_verifies_the_payload_so_a_flipped_byte_never_says_no() {
    let dir = tempfile::tempdir().unwrap();
    let (f, _) = sample_blocked();
    let mut bytes = f.to_bytes(KeyKind::Integer);
    let path = dir.path().join("x.bgf");
    bytes[HEADER_LEN + 5] ^= 1;
    std::fs::write(&path, &bytes).unwrap();
    // One flipped payload byte: opening for queries fails, and only the
    // explicitly unverified open maps it (and `verify` then says why).
    assert!(matches!(
        MappedBloom::open(&path),
        Err(Error::Snapshot(SnapshotError::PayloadChecksum))
    ));
    let view = MappedBloom::open_unverified(&path).unwrap();
    assert!(matches!(
        view.verify(),
        Err(Error::Snapshot(SnapshotError::PayloadChecksum))
    ));
    bytes[3] ^= 1;
    std::fs::write(&path, &bytes).unwrap();
    assert!(matches!(
        MappedBloom::open(&path),
        Err(Error::Snapshot(SnapshotError::BadMagic))
    ));
    std::fs::write(&path, b"").unwrap();
    assert!(matches!(
        MappedBloom::open(&path),
        Err(Error::Snapshot(SnapshotError::BadMagic))
    ));
    assert!(matches!(
        MappedBloom::open(&dir.path().join("missing")),
        Err(Error::Io { .. })
    ));
}

#[test]
fn failed_save_leaves_no_file_behind() {
    let dir = tempfile::tempdir().unwrap();
    let (f, _) = sample_blocked();
    let target = dir.path().join("no-such-dir").join("f.bgf");
    assert!(matches!(
        f.save(&target, KeyKind::Integer),
        Err(Error::Io { .. })
    ));
    // Saving over an existing file replaces it whole.
    let path = dir.path().join("f.bgf");
    std::fs::write(&path, b"old").unwrap();
    f.save(&path, KeyKind::Integer).unwrap();
    assert_eq!(BlockedBloom::load(&path).unwrap().0, f);
    let names: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names.len(), 1, "{names:?}");
}

#[test]
fn header_decoder_reports_layout_of_each_kind() {
    let c = ClassicBloom::with_fpr(10, 0.1)
        .unwrap()
        .to_bytes(KeyKind::Bytes);
    let h = decode_header(&c, None).unwrap();
    assert_eq!(h.layout, bloomgate_filter::Layout::Classic);
    assert_eq!(h.key_kind, KeyKind::Bytes);
    assert!(matches!(
        BlockedBloom::from_bytes(&c),
        Err(Error::Snapshot(SnapshotError::WrongLayout {
            expected: "blocked",
            found: 1
        }))
    ));
}

mod decoder_fuzz {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]
        /// Arbitrary bytes and arbitrary edits of a valid file never panic
        /// and are never accepted unless unchanged.
        #[test]
        fn decoder_never_panics(garbage in prop::collection::vec(any::<u8>(), 0..200),
                                edits in prop::collection::vec((any::<usize>(), any::<u8>()), 1..8)) {
            let _ = BlockedBloom::from_bytes(&garbage);
            let _ = ClassicBloom::from_bytes(&garbage);
            let _ = CountingBloom::from_bytes(&garbage);
            let mut f = BlockedBloom::with_fpr(100, 0.1).unwrap();
            f.insert(&1u64);
            let good = f.to_bytes(KeyKind::Integer);
            let mut bad = good.clone();
            for (at, v) in edits {
                let i = at % bad.len();
                bad[i] = v;
            }
            match BlockedBloom::from_bytes(&bad) {
                Ok((g, _)) => { prop_assert_eq!(&bad, &good); prop_assert!(g.contains(&1u64)); }
                Err(_) => prop_assert_ne!(&bad, &good),
            }
        }
    }
}

/// A concurrent filter's snapshot, read straight from its atomics, is byte
/// for byte the one its heap copy writes, and loads back with every key.
#[test]
fn concurrent_filters_encode_as_their_heap_copies_do() {
    let keys = Rng(29).keys(30_000);
    let blocked = bloomgate_filter::AtomicBloom::with_fpr(30_000, 0.001).unwrap();
    let classic = bloomgate_filter::AtomicClassicBloom::with_fpr(30_000, 0.001).unwrap();
    for k in &keys {
        blocked.insert(k);
        classic.insert(k);
    }
    for kind in [KeyKind::Integer, KeyKind::Bytes] {
        let direct = blocked.to_bytes(kind);
        assert_eq!(direct, blocked.to_blocked().to_bytes(kind));
        let (back, k) = BlockedBloom::from_bytes(&direct).unwrap();
        assert_eq!(k, kind);
        assert!(keys.iter().all(|key| back.contains(key)));
        let direct = classic.to_bytes(kind);
        assert_eq!(direct, classic.to_classic().to_bytes(kind));
        let (back, _) = ClassicBloom::from_bytes(&direct).unwrap();
        assert!(keys.iter().all(|key| back.contains(key)));
    }
}
