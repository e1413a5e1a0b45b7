//! Why an adoption did not happen: `AdoptError`, and `ReadError` for
//! the bytes of a snapshot file or an epoch that could not be read.

use crate::sql::StoreError;

/// Why a positioned filter was not adopted (the caller scans instead).
#[derive(Debug, thiserror::Error)]
pub enum AdoptError {
    /// Nothing is there (none stored, or a newer one replaced it).
    #[error("nothing to adopt: it is gone (a newer one replaced it) or was never stored")]
    Gone,
    /// Metadata without a field this release needs.
    #[error("made by an earlier release: its metadata has no `{0}`")]
    EarlierRelease(&'static str),
    /// A field that does not parse.
    #[error("its metadata has an unreadable `{0}`")]
    Unreadable(&'static str),
    /// This database's identity is not known yet.
    #[error("this database has no identity yet")]
    NoIdentity,
    /// Made for another layout, rate or key type.
    #[error("made as {made}, configured {want}")]
    OtherShape {
        /// What the metadata says.
        made: String,
        /// What this instance builds.
        want: String,
    },
    /// Made for another database, table or key column.
    #[error("it holds {made}, not {want}: made against another database, table or key column")]
    OtherIdentity {
        /// What the metadata says.
        made: String,
        /// What this instance's filter holds.
        want: String,
    },
    /// Positioned past the end of this database's outbox.
    #[error("positioned at {at}, ahead of this database's outbox ({max}): made against another database")]
    Ahead {
        /// Its position.
        at: i64,
        /// The outbox's largest seq.
        max: i64,
    },
    /// Its scan began before a rebuild request this instance acted on.
    #[error("it covers rebuild requests up to {covered}, not the one at {asked}: its scan began before rows no entry names were written")]
    Uncovered {
        /// The requests its scan began after.
        covered: i64,
        /// The newest request acted on here.
        asked: i64,
    },
    /// The outbox no longer holds every entry after its position.
    #[error("the change outbox was trimmed past its position {0}")]
    Trimmed(i64),
    /// The outbox could not be read.
    #[error("reading the change outbox: {0}")]
    Outbox(StoreError),
    /// The outbox holds a key this table's type cannot parse.
    #[error("the outbox holds a key that does not parse: {0}")]
    BadKey(#[from] crate::key::KeyError),
    /// Its bytes could not be read (I/O, Redis, a save cut short).
    #[error(transparent)]
    Read(#[from] ReadError),
    /// Its bytes do not decode as a filter of this layout.
    #[error("it does not decode: {0}")]
    Decode(#[from] crate::filter::CodecError),
    /// A rebuild runs here (its scan may predate the filter offered: ask
    /// for another), or, at a restore, a filter is published.
    #[error("a rebuild runs here")]
    Busy,
    /// A rebuild took over during the replay: its filter is as new.
    #[error("a rebuild took over; its filter is as new")]
    TookOver,
}

/// Why a positioned filter's bytes (a snapshot file, an epoch in Redis)
/// could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// Redis failed.
    #[error("reading the epoch from Redis: {0}")]
    Redis(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// The epoch's segments are gone (a newer one replaced it).
    #[error("the epoch's filter is gone (a newer one replaced it)")]
    EpochGone,
    /// The epoch holds fewer bytes than its metadata names.
    #[error("epoch {epoch} holds {got} of its {len} bytes")]
    EpochShort {
        /// The epoch.
        epoch: u64,
        /// Bytes found.
        got: usize,
        /// Bytes named.
        len: usize,
    },
    /// A snapshot file could not be read.
    #[error("no snapshot{what} at {path}: {source}")]
    Io {
        /// `""` for the filter, `" metadata"` for its metadata file.
        what: &'static str,
        /// The file.
        path: std::path::PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The metadata file does not parse.
    #[error("unreadable snapshot metadata {path}: {source}")]
    Unparsable {
        /// The file.
        path: std::path::PathBuf,
        /// Why.
        #[source]
        source: serde_json::Error,
    },
    /// The metadata file is of another format version.
    #[error("snapshot metadata version {found} (this build writes {writes})")]
    Version {
        /// Its version.
        found: u32,
        /// This build's.
        writes: u32,
    },
    /// The snapshot file is not the one its metadata names.
    #[error("the snapshot file does not match its metadata (a save was cut short)")]
    CutShort,
    /// The blocking task that read the file panicked or was cancelled.
    #[error("the reading task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
}

impl AdoptError {
    /// A rebuild here made the adoption needless: nothing to answer.
    #[must_use]
    pub fn is_superseded(&self) -> bool {
        matches!(self, Self::TookOver)
    }
}
