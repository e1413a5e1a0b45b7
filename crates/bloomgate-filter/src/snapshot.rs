//! The snapshot format: a versioned little-endian header, the raw words, and
//! a checksum.
//!
//! ```text
//! offset size field
//!  0      8   magic  b"BLOOMGT\0"
//!  8      2   format version (1)
//! 10      1   layout: 1 classic, 2 blocked, 3 counting
//! 11      1   hash id (1: see `hash`)
//! 12      4   k, positions per key
//! 16      8   seed
//! 24      8   m, positions (bits, or counters)
//! 32      8   items added
//! 40      8   payload length in bytes
//! 48      2   block size in positions (0 classic, 128, 256 or 512)
//! 50      1   key kind: 0 unspecified, 1 integers, 2 byte strings
//! 51      5   reserved, zero
//! 56      8   design capacity (0: not recorded)
//! 64      8   design false-positive rate, f64 bits (0: not recorded)
//! 72     48   reserved, zero
//! 120     8   XXH3-64 of bytes 0..120
//! 128     …   payload: the words, little-endian, whole 64-byte lines
//! end-8   8   XXH3-64 of the payload
//! ```
//!
//! The payload starts at offset 128, so a page-aligned mmap of the file gives
//! 64-byte aligned blocks. Files are written to a temporary name, fsynced,
//! and renamed over the target, so a reader sees the old file or the new one,
//! never a mix. Decoding checks every field and both checksums and returns a
//! typed [`SnapshotError`]; it never panics and never yields a filter that
//! could answer "no" for a key that was added.

use std::borrow::Cow;
use std::io::Write;
use std::path::{Path, PathBuf};

use xxhash_rust::xxh3::{xxh3_64, Xxh3Default};

use crate::bitmap::Bitmap;
use crate::error::{Error, Result, SnapshotError};
use crate::hash::HASH_ID_V1;
use crate::sizing::{self, Design};

/// The eight bytes every snapshot starts with.
pub const MAGIC: [u8; 8] = *b"BLOOMGT\0";
/// The format version this release writes and reads.
pub const FORMAT_VERSION: u16 = 1;
/// Header size in bytes.
pub const HEADER_LEN: usize = 128;
const SUM_AT: usize = HEADER_LEN - 8;
/// Trailer (payload checksum) size in bytes.
pub const TRAILER_LEN: usize = 8;

/// Which filter a snapshot holds.
///
/// ```
/// use bloomgate_filter::{snapshot, ClassicBloom, KeyKind, Layout, Snapshot};
/// let bytes = ClassicBloom::with_fpr(100, 0.01).unwrap().to_bytes(KeyKind::Integer);
/// let header = snapshot::decode_header(&bytes, None).unwrap();
/// assert_eq!(header.layout, Layout::Classic);
/// assert_eq!(header.layout.name(), "classic");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Layout {
    /// [`crate::ClassicBloom`].
    Classic = 1,
    /// [`crate::BlockedBloom`].
    Blocked = 2,
    /// [`crate::CountingBloom`].
    Counting = 3,
}

impl Layout {
    fn from_code(code: u8) -> Option<Self> {
        match code {
            1 => Some(Self::Classic),
            2 => Some(Self::Blocked),
            3 => Some(Self::Counting),
            _ => None,
        }
    }

    /// Lower-case name, as the CLI prints it.
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Self::Classic => "classic",
            Self::Blocked => "blocked",
            Self::Counting => "counting",
        }
    }
}

/// What kind of keys a snapshot was built from, so tools can parse queries
/// the same way. The filter itself does not depend on it.
///
/// ```
/// use bloomgate_filter::{BlockedBloom, KeyKind, Snapshot};
/// let bytes = BlockedBloom::with_fpr(100, 0.01).unwrap().to_bytes(KeyKind::Bytes);
/// let (_, kind) = BlockedBloom::from_bytes(&bytes).unwrap();
/// assert_eq!(kind, KeyKind::Bytes);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum KeyKind {
    /// Not recorded.
    Unspecified = 0,
    /// Integer keys (hashed with splitmix64).
    Integer = 1,
    /// Byte-string keys (hashed with XXH3).
    Bytes = 2,
}

/// A filter with a snapshot form: implementors say how to describe and
/// rebuild themselves; encoding, atomic saving, verified decoding and loading
/// are shared.
///
/// ```
/// use bloomgate_filter::{BlockedBloom, Filter, KeyKind, Snapshot};
/// let mut f = BlockedBloom::with_fpr(1000, 0.01).unwrap();
/// f.insert(&7u64);
/// let bytes = f.to_bytes(KeyKind::Integer);
/// let (g, kind) = BlockedBloom::from_bytes(&bytes).unwrap();
/// assert!(g.contains(&7u64) && kind == KeyKind::Integer);
/// ```
pub trait Snapshot: Sized {
    /// The layout this type is stored as.
    const LAYOUT: Layout;

    /// The header that describes this filter.
    fn snapshot_header(&self, key_kind: KeyKind) -> Header;

    /// The words to store (whole 64-byte lines).
    fn snapshot_words(&self) -> &[u64];

    /// Rebuilds a filter from a header and payload that [`decode`] verified.
    ///
    /// # Errors
    /// [`Error::Snapshot`] when the payload does not fit the header.
    fn from_snapshot(header: &Header, payload: &[u8]) -> Result<Self>;

    /// Encodes the filter as a snapshot.
    #[must_use]
    fn to_bytes(&self, key_kind: KeyKind) -> Vec<u8> {
        encode(&self.snapshot_header(key_kind), self.snapshot_words())
    }

    /// Writes the filter to `path` atomically (temporary file, fsync, rename).
    ///
    /// # Errors
    /// [`Error::Io`].
    fn save(&self, path: &Path, key_kind: KeyKind) -> Result<()> {
        write_atomic(path, &self.snapshot_header(key_kind), self.snapshot_words())
    }

    /// Decodes a snapshot of this layout, verifying everything.
    ///
    /// # Errors
    /// [`Error::Snapshot`] for anything but a valid snapshot of this layout.
    fn from_bytes(bytes: &[u8]) -> Result<(Self, KeyKind)> {
        let (h, payload) = decode(bytes, Some(Self::LAYOUT))?;
        Ok((Self::from_snapshot(&h, payload)?, h.key_kind))
    }

    /// Reads and verifies a snapshot file.
    ///
    /// # Errors
    /// [`Error::Io`] or [`Error::Snapshot`].
    fn load(path: &Path) -> Result<(Self, KeyKind)> {
        Self::from_bytes(&read_file(path)?)
    }
}

/// A decoded header.
///
/// ```
/// use bloomgate_filter::{snapshot, BlockedBloom, Filter, KeyKind, Snapshot};
/// let mut f = BlockedBloom::with_fpr(1000, 0.01).unwrap();
/// f.insert(&1u64);
/// let bytes = f.to_bytes(KeyKind::Integer);
/// let h = snapshot::decode_header(&bytes, None).unwrap();
/// assert_eq!((h.items, h.hashes, h.seed), (1, f.hashes(), f.seed()));
/// assert_eq!(bytes.len() as u64, 128 + h.payload_len() + 8);
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Header {
    /// The filter kind.
    pub layout: Layout,
    /// Positions per key.
    pub hashes: u32,
    /// Hash seed.
    pub seed: u64,
    /// Positions (bits or counters).
    pub bits: u64,
    /// Items added.
    pub items: u64,
    /// Block size in positions (0 for classic).
    pub block_bits: u32,
    /// Key kind.
    pub key_kind: KeyKind,
    /// What the filter was sized for, when recorded.
    pub design: Option<Design>,
}

impl Header {
    /// Payload bytes for this shape: whole 64-byte lines.
    #[must_use]
    pub fn payload_len(&self) -> u64 {
        let storage_bits = match self.layout {
            // Four bits per counter.
            Layout::Counting => self.bits * 4,
            Layout::Classic | Layout::Blocked => self.bits,
        };
        storage_bits.div_ceil(512) * 64
    }

    fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..8].copy_from_slice(&MAGIC);
        b[8..10].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
        b[10] = self.layout as u8;
        b[11] = HASH_ID_V1;
        b[12..16].copy_from_slice(&self.hashes.to_le_bytes());
        b[16..24].copy_from_slice(&self.seed.to_le_bytes());
        b[24..32].copy_from_slice(&self.bits.to_le_bytes());
        b[32..40].copy_from_slice(&self.items.to_le_bytes());
        b[40..48].copy_from_slice(&self.payload_len().to_le_bytes());
        b[48..50].copy_from_slice(&(self.block_bits as u16).to_le_bytes());
        b[50] = self.key_kind as u8;
        if let Some(d) = self.design {
            b[56..64].copy_from_slice(&d.capacity.to_le_bytes());
            b[64..72].copy_from_slice(&d.fpr.to_bits().to_le_bytes());
        }
        let sum = xxh3_64(&b[..SUM_AT]);
        b[SUM_AT..].copy_from_slice(&sum.to_le_bytes());
        b
    }
}

/// The checksum the format uses (XXH3-64, seed 0), exposed so tools and
/// tests can build or repair files deliberately.
#[must_use]
pub fn header_checksum(bytes: &[u8]) -> u64 {
    xxh3_64(bytes)
}

fn le_u64(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

fn invalid(field: &'static str, reason: impl Into<String>) -> SnapshotError {
    SnapshotError::InvalidField {
        field,
        reason: reason.into(),
    }
}

/// Decodes and checks the header of `bytes` (the whole file), and checks the
/// file length. Does not read the payload.
///
/// # Errors
/// A [`SnapshotError`] naming the first problem found.
pub fn decode_header(bytes: &[u8], expect: Option<Layout>) -> Result<Header, SnapshotError> {
    decode_header_of(
        &bytes[..bytes.len().min(HEADER_LEN)],
        bytes.len() as u64,
        expect,
    )
}

/// [`decode_header`] of a file of `have` bytes from its first bytes
/// (`head`, at most [`HEADER_LEN`] of them).
fn decode_header_of(
    bytes: &[u8],
    have: u64,
    expect: Option<Layout>,
) -> Result<Header, SnapshotError> {
    if bytes.len() < 8 || bytes[..8] != MAGIC {
        return Err(SnapshotError::BadMagic);
    }
    if bytes.len() < HEADER_LEN {
        return Err(SnapshotError::Truncated {
            expected: HEADER_LEN as u64,
            found: have,
        });
    }
    let version = u16::from_le_bytes([bytes[8], bytes[9]]);
    if version != FORMAT_VERSION {
        return Err(SnapshotError::UnsupportedVersion(version));
    }
    if le_u64(bytes, SUM_AT) != xxh3_64(&bytes[..SUM_AT]) {
        return Err(SnapshotError::HeaderChecksum);
    }
    let layout = Layout::from_code(bytes[10]).ok_or(SnapshotError::WrongLayout {
        expected: expect.map_or("any", Layout::name),
        found: bytes[10],
    })?;
    if let Some(want) = expect {
        if want != layout {
            return Err(SnapshotError::WrongLayout {
                expected: want.name(),
                found: bytes[10],
            });
        }
    }
    if bytes[11] != HASH_ID_V1 {
        return Err(SnapshotError::UnknownHash(bytes[11]));
    }
    let hashes = u32::from_le_bytes([bytes[12], bytes[13], bytes[14], bytes[15]]);
    let key_kind = match bytes[50] {
        0 => KeyKind::Unspecified,
        1 => KeyKind::Integer,
        2 => KeyKind::Bytes,
        other => return Err(invalid("key_kind", format!("unknown code {other}"))),
    };
    if bytes[51..56]
        .iter()
        .chain(&bytes[72..SUM_AT])
        .any(|&b| b != 0)
    {
        return Err(invalid("reserved", "must be zero"));
    }
    let capacity = le_u64(bytes, 56);
    let fpr = f64::from_bits(le_u64(bytes, 64));
    let design = match (capacity, fpr) {
        (0, f) if f == 0.0 && f.is_sign_positive() => None,
        (c, f) if c > 0 && f > 0.0 && f < 1.0 => Some(Design {
            capacity: c,
            fpr: f,
        }),
        _ => {
            return Err(invalid(
                "design",
                format!("capacity {capacity} with rate {fpr} is not a design"),
            ))
        }
    };
    let h = Header {
        layout,
        hashes,
        seed: le_u64(bytes, 16),
        bits: le_u64(bytes, 24),
        items: le_u64(bytes, 32),
        block_bits: u32::from(u16::from_le_bytes([bytes[48], bytes[49]])),
        key_kind,
        design,
    };
    check_header_shape(&h)?;
    let payload_len = le_u64(bytes, 40);
    if payload_len != h.payload_len() {
        return Err(invalid(
            "payload_len",
            format!(
                "{payload_len} does not match the shape ({})",
                h.payload_len()
            ),
        ));
    }
    let total = (HEADER_LEN + TRAILER_LEN) as u64 + payload_len;
    if have < total {
        return Err(SnapshotError::Truncated {
            expected: total,
            found: have,
        });
    }
    if have > total {
        return Err(SnapshotError::TrailingBytes(have - total));
    }
    Ok(h)
}

fn check_header_shape(h: &Header) -> Result<(), SnapshotError> {
    if h.bits == 0 {
        return Err(invalid("bits", "must be at least 1"));
    }
    let (max_hashes, blocks_ok) = match h.layout {
        Layout::Classic => (sizing::MAX_CLASSIC_HASHES, h.block_bits == 0),
        Layout::Blocked => (
            sizing::MAX_BLOCKED_HASHES,
            [128, 256, 512].contains(&h.block_bits)
                && h.bits.is_multiple_of(u64::from(h.block_bits))
                && (h.block_bits == 128 || h.bits / u64::from(h.block_bits) <= 1 << 32),
        ),
        Layout::Counting => (
            sizing::MAX_BLOCKED_HASHES,
            h.block_bits == 128 && h.bits.is_multiple_of(128),
        ),
    };
    if !(1..=max_hashes).contains(&h.hashes) {
        return Err(invalid(
            "hashes",
            format!("{} is outside 1..={max_hashes}", h.hashes),
        ));
    }
    if !blocks_ok {
        return Err(invalid(
            "block_bits",
            format!(
                "{} does not fit a {} filter of {} positions",
                h.block_bits,
                h.layout.name(),
                h.bits
            ),
        ));
    }
    let storage = match h.layout {
        Layout::Counting => u128::from(h.bits) * 4,
        _ => u128::from(h.bits),
    };
    if sizing::check_fits(storage).is_err() {
        return Err(invalid(
            "bits",
            format!("{} positions do not fit in memory", h.bits),
        ));
    }
    Ok(())
}

/// Decodes a whole snapshot, verifying header, length and both checksums.
/// Returns the header and the payload bytes.
///
/// # Errors
/// [`Error::Snapshot`].
pub fn decode(bytes: &[u8], expect: Option<Layout>) -> Result<(Header, &[u8])> {
    let h = decode_header(bytes, expect)?;
    let payload = payload_of(bytes);
    let stored = le_u64(bytes, bytes.len() - TRAILER_LEN);
    if stored != xxh3_64(payload) {
        return Err(SnapshotError::PayloadChecksum.into());
    }
    Ok((h, payload))
}

/// The payload of a file whose header was validated.
pub(crate) fn payload_of(bytes: &[u8]) -> &[u8] {
    &bytes[HEADER_LEN..bytes.len() - TRAILER_LEN]
}

/// True when the payload checksum of a header-validated file matches.
pub(crate) fn payload_ok(bytes: &[u8]) -> bool {
    le_u64(bytes, bytes.len() - TRAILER_LEN) == xxh3_64(payload_of(bytes))
}

/// Builds a bitmap of `len` bits from little-endian payload bytes.
pub(crate) fn bitmap_from_payload(len: u64, payload: &[u8]) -> Result<Bitmap> {
    let mut b = Bitmap::new(len)?;
    let words = b.words_mut();
    if words.len() * 8 != payload.len() {
        return Err(invalid("payload_len", "does not match the bitmap").into());
    }
    for (w, chunk) in words.iter_mut().zip(payload.chunks_exact(8)) {
        let mut a = [0u8; 8];
        a.copy_from_slice(chunk);
        *w = u64::from_le_bytes(a);
    }
    b.check_padding()
        .map_err(|_| invalid("payload", "bits set past the filter's end").into())
}

fn le_bytes(words: &[u64]) -> Cow<'_, [u8]> {
    if cfg!(target_endian = "little") {
        Cow::Borrowed(bytemuck::cast_slice(words))
    } else {
        Cow::Owned(words.iter().flat_map(|w| w.to_le_bytes()).collect())
    }
}

/// Encodes a snapshot in memory.
pub(crate) fn encode(h: &Header, words: &[u64]) -> Vec<u8> {
    encode_words(h, words.len(), words.iter().copied())
}

/// Encodes a snapshot in memory from `len` words read one at a time: the
/// output is the only copy of the payload (a filter of concurrent words
/// is read straight from its atomics; the checksum runs over the output).
pub(crate) fn encode_words(h: &Header, len: usize, words: impl Iterator<Item = u64>) -> Vec<u8> {
    debug_assert_eq!(len as u64 * 8, h.payload_len());
    let mut out = Vec::with_capacity(HEADER_LEN + len * 8 + TRAILER_LEN);
    out.extend_from_slice(&h.encode());
    for w in words {
        out.extend_from_slice(&w.to_le_bytes());
    }
    debug_assert_eq!(out.len(), HEADER_LEN + len * 8);
    let sum = xxh3_64(&out[HEADER_LEN..]);
    out.extend_from_slice(&sum.to_le_bytes());
    out
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> Error + '_ {
    move |source| Error::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Writes a snapshot atomically: a temporary file in the same directory,
/// fsync, rename over `path`, fsync of the directory. On failure the
/// temporary file is removed and `path` is untouched.
pub(crate) fn write_atomic(path: &Path, h: &Header, words: &[u64]) -> Result<()> {
    write_atomic_with(path, |w, tmp| {
        w.write_all(&h.encode()).map_err(io_err(tmp))?;
        let mut sum = Xxh3Default::new();
        for chunk in words.chunks(1 << 16) {
            let bytes = le_bytes(chunk);
            sum.update(&bytes);
            w.write_all(&bytes).map_err(io_err(tmp))?;
        }
        w.write_all(&sum.digest().to_le_bytes())
            .map_err(io_err(tmp))
    })
}

/// Writes `bytes` to `path` atomically, as [`write_atomic`] does.
pub(crate) fn write_bytes_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    write_atomic_with(path, |w, tmp| w.write_all(bytes).map_err(io_err(tmp)))
}

/// The temporary file, fsync and rename around `fill`.
fn write_atomic_with(
    path: &Path,
    fill: impl FnOnce(&mut std::io::BufWriter<std::fs::File>, &Path) -> Result<()>,
) -> Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let name = path.file_name().ok_or_else(|| Error::Io {
        path: path.to_path_buf(),
        source: std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a file path"),
    })?;
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(name);
    tmp_name.push(format!(".tmp-{}", std::process::id()));
    let tmp = dir.join(tmp_name);
    let result = (|| {
        let file = std::fs::File::create(&tmp).map_err(io_err(&tmp))?;
        let mut w = std::io::BufWriter::with_capacity(1 << 20, file);
        fill(&mut w, &tmp)?;
        let file = w.into_inner().map_err(|e| io_err(&tmp)(e.into_error()))?;
        file.sync_all().map_err(io_err(&tmp))?;
        std::fs::rename(&tmp, path).map_err(io_err(path))?;
        if let Ok(d) = std::fs::File::open(&dir) {
            // Persist the rename; not every platform can fsync a directory.
            let _ = d.sync_all();
        }
        Ok(())
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// Reads a whole file.
pub(crate) fn read_file(path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(io_err(path))
}

/// Reads only the header of a snapshot file (and checks its length).
///
/// # Errors
/// [`Error::Io`] or [`Error::Snapshot`].
pub fn read_header(path: &Path) -> Result<Header> {
    use std::io::Read;
    let file = std::fs::File::open(path).map_err(io_err(path))?;
    let have = file.metadata().map_err(io_err(path))?.len();
    let mut head = Vec::with_capacity(HEADER_LEN);
    file.take(HEADER_LEN as u64)
        .read_to_end(&mut head)
        .map_err(io_err(path))?;
    Ok(decode_header_of(&head, have, None)?)
}
