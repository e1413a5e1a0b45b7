//! The filter crate's error type: every fallible operation returns [`Error`].

use std::path::PathBuf;

/// Everything that can go wrong in this crate.
///
/// Variants carry enough context to print a useful one-line message; I/O
/// errors keep the path they concern.
///
/// ```
/// use bloomgate_filter::{BlockedBloom, Error};
/// assert!(matches!(BlockedBloom::with_fpr(0, 0.01), Err(Error::ZeroItems)));
/// assert!(matches!(BlockedBloom::with_fpr(10, 1.5), Err(Error::InvalidFpr(_))));
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The expected number of items was zero.
    #[error("expected item count must be at least 1")]
    ZeroItems,
    /// The target false-positive rate was not strictly between 0 and 1.
    #[error("false-positive rate must be strictly between 0 and 1, got {0}")]
    InvalidFpr(f64),
    /// A size or hash count that the filter cannot have.
    #[error("invalid {name}: {reason}")]
    InvalidParameter {
        /// Which parameter.
        name: &'static str,
        /// Why it was rejected.
        reason: String,
    },
    /// The requested filter would not fit in this process's address space.
    #[error("filter too large: {bits} bits do not fit in memory on this platform")]
    TooLarge {
        /// The number of bits that was asked for.
        bits: u128,
    },
    /// A bit position outside the bitmap.
    #[error("bit position {pos} is out of range for a bitmap of {len} bits")]
    OutOfRange {
        /// The position asked for.
        pos: u64,
        /// The bitmap's length in bits.
        len: u64,
    },
    /// Two filters of different shapes (layout, bits, hashes or seed) were combined.
    #[error("filters have different shapes: {0}")]
    ShapeMismatch(String),
    /// `remove` on a counting filter for a key the filter says is absent.
    #[error("refusing to remove a key the filter does not contain")]
    NotPresent,
    /// An output slice whose length does not match the input.
    #[error("output length {got} does not match input length {expected}")]
    LengthMismatch {
        /// The input length.
        expected: usize,
        /// The output length that was given.
        got: usize,
    },
    /// Reading or writing a snapshot file failed.
    #[error("{path}: {source}")]
    Io {
        /// The file concerned.
        path: PathBuf,
        /// The underlying I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A snapshot that is not a valid bloomgate snapshot.
    #[error("invalid snapshot: {0}")]
    Snapshot(#[from] SnapshotError),
}

/// Why a snapshot was rejected.
///
/// ```
/// use bloomgate_filter::{BlockedBloom, Error, KeyKind, Snapshot, SnapshotError};
/// let mut bytes = BlockedBloom::with_fpr(100, 0.01).unwrap().to_bytes(KeyKind::Integer);
/// let last = bytes.len() - 1;
/// bytes[last] ^= 1; // the payload checksum no longer matches
/// assert!(matches!(
///     BlockedBloom::from_bytes(&bytes),
///     Err(Error::Snapshot(SnapshotError::PayloadChecksum))
/// ));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SnapshotError {
    /// The file does not start with the bloomgate magic bytes.
    #[error("not a bloomgate snapshot (bad magic)")]
    BadMagic,
    /// A format version this release cannot read.
    #[error("unsupported format version {0}")]
    UnsupportedVersion(u16),
    /// The file holds another kind of filter than the one asked for.
    #[error("wrong layout: expected {expected}, found {found}")]
    WrongLayout {
        /// The layout the caller asked for.
        expected: &'static str,
        /// The layout code found in the file.
        found: u8,
    },
    /// A hash function id this release does not know.
    #[error("unknown hash function id {0}")]
    UnknownHash(u8),
    /// The file is shorter than its header says it must be.
    #[error("truncated: need {expected} bytes, have {found}")]
    Truncated {
        /// Bytes the header promises.
        expected: u64,
        /// Bytes actually present.
        found: u64,
    },
    /// The file is longer than its header says.
    #[error("{0} unexpected trailing bytes")]
    TrailingBytes(u64),
    /// The header checksum does not match.
    #[error("header checksum mismatch")]
    HeaderChecksum,
    /// The payload checksum does not match.
    #[error("payload checksum mismatch")]
    PayloadChecksum,
    /// A header field holds a value no valid filter has.
    #[error("invalid header field {field}: {reason}")]
    InvalidField {
        /// The field name.
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
}

/// Shorthand for results in this crate.
///
/// ```
/// use bloomgate_filter::{BlockedBloom, Result};
/// fn skus() -> Result<BlockedBloom> {
///     BlockedBloom::with_fpr(200_000, 0.001)
/// }
/// assert!(skus().is_ok());
/// ```
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// [`Error::LengthMismatch`] unless an output has as many slots as inputs.
pub(crate) fn check_len(expected: usize, got: usize) -> Result<()> {
    if expected == got {
        Ok(())
    } else {
        Err(Error::LengthMismatch { expected, got })
    }
}
