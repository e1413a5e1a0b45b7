//! The in-process filter in the configured layout (`ShieldFilter`), its
//! sizing for the configuration's checks, and its snapshot encoding, below
//! everything that keeps, ships or restores one (the shield, the snapshot
//! file, the shared-rebuild epochs).

use bloomgate_filter::{
    AtomicBloom, AtomicClassicBloom, BlockedBloom, BloomKey, ClassicBloom, Filter, KeyKind,
    Snapshot,
};

use crate::key::Key;

/// One batch of a key scan.
#[derive(Debug, Clone, Copy)]
pub enum KeyBatch<'a> {
    /// SKU ids.
    Ints(&'a [i64]),
    /// A resource's keys.
    Keys(&'a [Key]),
}

pub use crate::config::{
    filter_bytes, BloomLayout, MAX_BLOOM_FPP, MAX_FILTER_BYTES, MIN_BLOOM_FPP,
};

/// A filter in the library's snapshot format, recording how its keys
/// were hashed (`Integer` for the SKUs and integer resources, `Bytes` for
/// text keys).
pub fn encode(filter: &ShieldFilter, kind: KeyKind) -> Vec<u8> {
    // Straight from the atomics: the snapshot is the only copy.
    match filter {
        ShieldFilter::Blocked(f) => f.to_bytes(kind),
        ShieldFilter::Classic(f) => f.to_bytes(kind),
    }
}

/// One encoded copy of a filter at a time in the whole process (a
/// snapshot save and an epoch's publication after the same rebuild would
/// otherwise each hold one: at 10^8 keys, hundreds of MB at once).
static ENCODING: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(1);

/// A filter's snapshot bytes, holding the process's one encoding permit
/// until dropped.
#[derive(Debug)]
pub struct Encoded {
    /// The snapshot.
    pub bytes: Vec<u8>,
    _permit: tokio::sync::SemaphorePermit<'static>,
}

/// Why a filter's snapshot bytes could not be made or read.
#[derive(Debug, thiserror::Error)]
pub enum CodecError {
    /// The bytes fail the library's checks (checksum, header, sizes).
    #[error("the snapshot fails to verify: {0}")]
    Verify(#[source] bloomgate_filter::Error),
    /// The bytes hold keys hashed as another kind.
    #[error("the snapshot holds {recorded:?} keys, this filter {want:?} keys")]
    KeyKind {
        /// What the snapshot records.
        recorded: KeyKind,
        /// What this filter hashes.
        want: KeyKind,
    },
    /// The blocking task that encodes or decodes panicked or was cancelled.
    #[error("the encoding task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
    /// The process is shutting down (the encoding permit is gone).
    #[error("shutting down")]
    Closed,
}

/// [`encode`] on a blocking thread, once no other encoded copy is held.
///
/// # Errors
/// [`CodecError::Task`] when the blocking task failed.
pub async fn encode_one(
    filter: std::sync::Arc<ShieldFilter>,
    kind: KeyKind,
) -> Result<Encoded, CodecError> {
    let permit = ENCODING.acquire().await.map_err(|_| CodecError::Closed)?;
    let bytes = tokio::task::spawn_blocking(move || encode(&filter, kind)).await?;
    Ok(Encoded {
        bytes,
        _permit: permit,
    })
}

/// How a resource's keys are hashed, as the snapshot format records it.
#[must_use]
pub const fn key_kind(key_type: crate::key::KeyType) -> KeyKind {
    match key_type {
        crate::key::KeyType::Int => KeyKind::Integer,
        crate::key::KeyType::Text => KeyKind::Bytes,
    }
}

/// A filter of `layout` from snapshot bytes, checksum verified.
///
/// # Errors
/// [`CodecError`]: what failed to verify.
pub fn decode(
    layout: BloomLayout,
    bytes: &[u8],
    kind: KeyKind,
) -> Result<ShieldFilter, CodecError> {
    let (filter, recorded) = match layout {
        BloomLayout::Blocked => BlockedBloom::from_bytes(bytes).and_then(|(f, k)| {
            AtomicBloom::from_blocked(&f).map(|f| (ShieldFilter::Blocked(f), k))
        }),
        BloomLayout::Classic => ClassicBloom::from_bytes(bytes).and_then(|(f, k)| {
            AtomicClassicBloom::from_classic(&f).map(|f| (ShieldFilter::Classic(f), k))
        }),
    }
    .map_err(CodecError::Verify)?;
    if recorded != kind {
        return Err(CodecError::KeyKind {
            recorded,
            want: kind,
        });
    }
    Ok(filter)
}

/// The in-process filter, in the configured layout.
#[derive(Debug)]
pub enum ShieldFilter {
    /// One 256-bit block per id.
    Blocked(AtomicBloom),
    /// Seed 000's classic scheme.
    Classic(AtomicClassicBloom),
}

impl ShieldFilter {
    /// An empty filter for `n` ids at rate `p`.
    ///
    /// # Errors
    /// The filter crate's sizing errors.
    pub fn with_fpr(layout: BloomLayout, n: u64, p: f64) -> bloomgate_filter::Result<Self> {
        Ok(match layout {
            BloomLayout::Blocked => Self::Blocked(AtomicBloom::with_fpr(n, p)?),
            BloomLayout::Classic => Self::Classic(AtomicClassicBloom::with_fpr(n, p)?),
        })
    }

    /// Membership of an id.
    #[inline]
    #[must_use]
    pub fn contains<K: BloomKey>(&self, id: K) -> bool {
        match self {
            Self::Blocked(f) => f.contains(&id),
            Self::Classic(f) => f.contains(&id),
        }
    }

    /// Adds an id.
    #[inline]
    pub fn insert<K: BloomKey>(&self, id: K) {
        match self {
            Self::Blocked(f) => {
                f.insert(&id);
            }
            Self::Classic(f) => {
                f.insert(&id);
            }
        }
    }

    /// Adds many ids.
    pub fn insert_many<K: BloomKey>(&self, ids: &[K]) {
        match self {
            Self::Blocked(f) => f.insert_many(ids),
            Self::Classic(f) => f.insert_many(ids),
        }
    }

    /// Membership of many keys, written into `out` (the blocked filter's
    /// batch call; the classic one answers key by key).
    pub fn contains_many<K: BloomKey>(&self, keys: &[K], out: &mut [bool]) {
        if let Self::Blocked(f) = self {
            if f.contains_many(keys, out).is_ok() {
                return;
            }
        }
        for (k, o) in keys.iter().zip(out.iter_mut()) {
            *o = self.contains(k);
        }
    }

    /// Adds one batch of a key scan.
    pub fn insert_batch(&self, batch: KeyBatch<'_>) {
        match batch {
            KeyBatch::Ints(ids) => self.insert_many(ids),
            KeyBatch::Keys(keys) => self.insert_many(keys),
        }
    }

    /// The filter's figures.
    #[must_use]
    pub fn as_filter(&self) -> &dyn Filter {
        match self {
            Self::Blocked(f) => f,
            Self::Classic(f) => f,
        }
    }
}
