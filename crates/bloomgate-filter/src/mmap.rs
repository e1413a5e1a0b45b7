//! Zero-copy, read-only views of snapshot files through `mmap`.
//!
//! Its one `unsafe` block maps the file; ARCHITECTURE.md lists every module
//! with `unsafe` code.

use std::path::Path;

use memmap2::Mmap;

use crate::error::{Error, Result, SnapshotError};
use crate::filter::Filter;
use crate::hash::HashPair;
use crate::probe;
use crate::sizing;
use crate::snapshot::{self, Header, Layout};

/// A snapshot file mapped into memory, read-only.
///
/// ```
/// use bloomgate_filter::{BlockedBloom, KeyKind, MappedFile, Snapshot};
/// let dir = tempfile::tempdir().unwrap();
/// let path = dir.path().join("f.bgf");
/// BlockedBloom::with_fpr(100, 0.01).unwrap().save(&path, KeyKind::Integer).unwrap();
/// let file = MappedFile::open(&path).unwrap();
/// assert_eq!(&file.bytes()[..8], b"BLOOMGT\0");
/// ```
#[derive(Debug)]
pub struct MappedFile {
    map: Option<Mmap>,
}

impl MappedFile {
    /// Maps `path` read-only.
    ///
    /// # Errors
    /// [`Error::Io`].
    pub fn open(path: &Path) -> Result<Self> {
        let io = |source| Error::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = std::fs::File::open(path).map_err(io)?;
        let len = file.metadata().map_err(io)?.len();
        if len == 0 {
            // mmap of an empty file fails on some platforms; nothing to map.
            return Ok(Self { map: None });
        }
        // SAFETY: the mapping is read-only and private to this process. The
        // hazard of mmap is another process truncating or rewriting the file
        // while it is mapped. bloomgate never does that: snapshots are
        // replaced by rename, which leaves the mapped inode intact. Other
        // writers are outside our control, which `MappedBloom`'s docs state.
        let map = unsafe { Mmap::map(&file) }.map_err(io)?;
        Ok(Self { map: Some(map) })
    }

    /// The file's bytes.
    #[must_use]
    pub fn bytes(&self) -> &[u8] {
        self.map.as_deref().unwrap_or(&[])
    }
}

/// A filter answered straight from a mapped snapshot file, without reading
/// it into the heap: opening a 1 GB filter costs a header check, and lookups
/// page in only the lines they touch.
///
/// [`MappedBloom::open`] checks the header, the file length and the payload
/// checksum, so a corrupted file is an error and never a filter that could
/// say "no" to an inserted key. Verifying reads the whole file once;
/// [`MappedBloom::open_unverified`] skips that for callers that verified the
/// file before (it still checks the header). The file must not be modified
/// in place while it is mapped (bloomgate's own writers replace files by
/// rename, which is safe). Requires a little-endian host, where the stored
/// words are used as they are.
///
/// ```
/// use bloomgate_filter::{BlockedBloom, Filter, KeyKind, MappedBloom, Snapshot};
/// let dir = tempfile::tempdir().unwrap();
/// let path = dir.path().join("skus.bgf");
/// let mut f = BlockedBloom::with_fpr(1000, 0.01).unwrap();
/// f.insert(&42u64);
/// f.save(&path, KeyKind::Integer).unwrap();
/// let view = MappedBloom::open(&path).unwrap(); // header and payload verified
/// assert!(view.contains(&42u64));
/// ```
#[derive(Debug)]
pub struct MappedBloom {
    file: MappedFile,
    header: Header,
}

impl MappedBloom {
    /// Maps a snapshot of any layout and checks its header and payload
    /// checksum (reading the whole file once).
    ///
    /// # Errors
    /// [`Error::Io`], [`Error::Snapshot`] (including
    /// [`SnapshotError::PayloadChecksum`] for a corrupted payload), or
    /// [`Error::InvalidParameter`] on a big-endian host.
    pub fn open(path: &Path) -> Result<Self> {
        let view = Self::open_unverified(path)?;
        view.verify()?;
        Ok(view)
    }

    /// Maps a snapshot and checks its header and length, but not the payload
    /// checksum: for callers that verified this file before. A corrupted
    /// payload is not detected, so an inserted key may be answered "no".
    ///
    /// # Errors
    /// As [`MappedBloom::open`], except the payload checksum.
    pub fn open_unverified(path: &Path) -> Result<Self> {
        if cfg!(target_endian = "big") {
            return Err(Error::InvalidParameter {
                name: "host",
                reason: "the zero-copy view needs a little-endian host; use load".into(),
            });
        }
        let file = MappedFile::open(path)?;
        let header = snapshot::decode_header(file.bytes(), None)?;
        if bytemuck::try_cast_slice::<u8, u64>(snapshot::payload_of(file.bytes())).is_err() {
            return Err(Error::InvalidParameter {
                name: "mapping",
                reason: "payload is not 8-byte aligned".into(),
            });
        }
        Ok(Self { file, header })
    }

    /// Verifies the payload checksum (reads the whole file).
    ///
    /// # Errors
    /// [`SnapshotError::PayloadChecksum`].
    pub fn verify(&self) -> Result<()> {
        if snapshot::payload_ok(self.file.bytes()) {
            Ok(())
        } else {
            Err(SnapshotError::PayloadChecksum.into())
        }
    }

    /// The snapshot's header.
    #[must_use]
    pub const fn header(&self) -> &Header {
        &self.header
    }

    fn words(&self) -> &[u64] {
        // Alignment was checked in `open`; an empty slice is the fallback
        // that can never be reached.
        bytemuck::try_cast_slice(snapshot::payload_of(self.file.bytes())).unwrap_or(&[])
    }
}

impl Filter for MappedBloom {
    fn seed(&self) -> u64 {
        self.header.seed
    }

    fn contains_hash(&self, h: HashPair) -> bool {
        let hd = &self.header;
        let words = self.words();
        match hd.layout {
            Layout::Classic => probe::classic_contains(words, hd.bits, hd.hashes, h),
            Layout::Blocked => {
                let block_words = (hd.block_bits / 64) as usize;
                let blocks = hd.bits / u64::from(hd.block_bits);
                probe::blocked_contains(words, blocks, block_words, hd.hashes, h)
            }
            Layout::Counting => probe::counting_contains(words, hd.bits / 128, hd.hashes, h),
        }
    }

    fn bits(&self) -> u64 {
        self.header.bits
    }

    fn hashes(&self) -> u32 {
        self.header.hashes
    }

    fn items(&self) -> u64 {
        self.header.items
    }

    fn bytes(&self) -> usize {
        self.header.payload_len() as usize
    }

    fn count_ones(&self) -> u64 {
        let words = self.words();
        match self.header.layout {
            Layout::Counting => words
                .iter()
                .map(|&w| (0..16).filter(|i| (w >> (i * 4)) & 0xF != 0).count() as u64)
                .sum(),
            _ => words.iter().map(|w| u64::from(w.count_ones())).sum(),
        }
    }

    fn design(&self) -> Option<crate::sizing::Design> {
        self.header.design
    }

    fn expected_fpr(&self, n_items: u64) -> f64 {
        let hd = &self.header;
        match hd.layout {
            Layout::Classic => sizing::classic_fpr(hd.bits, hd.hashes, n_items),
            Layout::Blocked | Layout::Counting => sizing::blocked_fpr(
                hd.bits / u64::from(hd.block_bits),
                hd.block_bits,
                hd.hashes,
                n_items,
            ),
        }
    }
}
