//! Restart without a cold window: the published filter is written to a
//! snapshot file (the filter library's format, written to a temporary file
//! and renamed) after each rebuild, every `cache.bloom_snapshot_every_secs`
//! and at shutdown, beside a small JSON file naming the change-outbox
//! position it is complete up to. At start the instance loads it (the
//! library verifies its checksum), replays the keys created after that
//! position from the outbox, and serves at once (all through
//! [`Shield::adopt`]); it scans SQL only when the snapshot is missing, does
//! not verify, was made for another layout, rate, key type, database or
//! table, or by an earlier release, or names a position the outbox was
//! trimmed past (or one beyond its end: another database). Rows written behind the outbox's
//! back (as `bloomgate seed` does) are found afterwards, by the shield's
//! background row check ([`Shield::verify_rows`]): no full count stands
//! between a restart and readiness.
//!
//! Why the snapshot plus the replay holds every key: the position saved
//! is the outbox watermark the follower had applied *before* the filter
//! was copied, and the filter only grows; the follower applies every
//! create up to its watermark (its own too) before the watermark moves.
//! So every key created up to the position is in the file, and every key
//! created after it is in the replay (the outbox is complete: an owned
//! write commits its entry with its row, a captured table's triggers
//! write theirs in the writer's transaction, `keys` records before it
//! answers). Redis plays no part, so a snapshot needs none. The follower
//! then starts at or before the snapshot's position, so an entry that
//! commits late (a long transaction) is applied by it, with its gap
//! handling, even when the replay did not see it.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::config::BloomLayout;
use crate::feed::outbox::Outbox;
use crate::key::{Fold, KeyType};
use crate::shield::{AdoptError, FilterMeta, How, MetaRead, ReadError, Shield, Want};

/// The metadata file's format version.
const VERSION: u32 = 1;

/// What sits beside the snapshot: the one positioned-filter metadata
/// ([`FilterMeta`], flattened), its format version, and the file's hash.
/// Fields this release does not know are ignored, as the previous release
/// ignores `key_type`.
#[derive(Debug, Serialize)]
struct Meta {
    version: u32,
    #[serde(flatten)]
    filter: FilterMeta,
    /// XXH3-64 of the snapshot file, so a file and a metadata file written
    /// by different saves never pair up.
    file_xxh3: String,
    saved_at_ms: u64,
}

/// [`Meta`] as read (an earlier release's lacks fields).
#[derive(Debug, Deserialize)]
struct MetaFile {
    version: u32,
    #[serde(flatten)]
    filter: MetaRead,
    file_xxh3: String,
}

/// Where and how this instance keeps its snapshot.
#[derive(Debug, Clone)]
pub struct Persist {
    path: PathBuf,
    layout: BloomLayout,
    fpp: f64,
    outbox: Outbox,
    /// The filter's keys.
    key_type: KeyType,
    /// The resource whose filter it is (its rebuild requests covered).
    resource: Arc<str>,
    /// What the filter holds (see [`FilterMeta`]).
    identity: Option<Arc<str>>,
    /// How its text keys are folded (replayed keys too).
    fold: Fold,
}

fn meta_path(path: &Path) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(".json");
    PathBuf::from(p)
}

/// Writes `bytes` to `path` through a temporary file in the same directory,
/// synced, then renamed over it.
fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let tmp = dir.join(format!(
        ".{}.{:016x}.tmp",
        path.file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("snapshot"),
        fastrand::u64(..)
    ));
    let result = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)?;
        std::fs::File::open(dir)?.sync_all()
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

fn hash_hex(bytes: &[u8]) -> String {
    format!("{:016x}", xxhash_rust::xxh3::xxh3_64(bytes))
}

impl Persist {
    /// Snapshots at `path` for `resource`'s filter of `layout` at `fpp`
    /// whose keys are `key_type`, positioned in `outbox`.
    #[must_use]
    pub fn new(
        path: PathBuf,
        layout: BloomLayout,
        fpp: f64,
        (resource, key_type): (&str, KeyType),
        outbox: Outbox,
    ) -> Self {
        Self {
            path,
            layout,
            fpp,
            outbox,
            key_type,
            resource: Arc::from(resource),
            identity: None,
            fold: Fold::Exact,
        }
    }

    /// Snapshots of a filter whose text keys are folded by `fold`.
    #[must_use]
    pub const fn with_fold(mut self, fold: Fold) -> Self {
        self.fold = fold;
        self
    }

    /// Snapshots of a filter holding `identity` (see [`FilterMeta`]).
    #[must_use]
    pub fn with_identity(mut self, identity: Option<Arc<str>>) -> Self {
        self.identity = identity;
        self
    }

    /// Where the snapshot is written.
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Saves `shield`'s published filter (nothing when none is published).
    ///
    /// # Errors
    /// I/O errors (logged by the callers; the previous files stay whole).
    pub async fn save(&self, shield: &Shield) -> std::io::Result<bool> {
        // The position first, then the copy: the copy holds at least what
        // was applied up to the position.
        // A filter that may lack creates (a rebuild is owed) is not saved:
        // its positions would vouch for what it does not hold.
        if shield.rebuild_is_owed() {
            return Ok(false);
        }
        let outbox = self.outbox.watermark();
        let covered = self.outbox.rebuilds_covered(&self.resource);
        let Some(filter) = shield.published() else {
            return Ok(false);
        };
        let Some(identity) = self.identity.as_deref().map(str::to_owned) else {
            // Not restorable without one: nothing worth writing.
            return Ok(false);
        };
        let meta = FilterMeta {
            outbox,
            covered,
            capacity: shield.capacity(),
            fpp: self.fpp,
            layout: self.layout,
            key_type: self.key_type,
            identity,
        };
        let path = self.path.clone();
        let encoded = crate::filter::encode_one(filter, crate::filter::key_kind(self.key_type))
            .await
            .map_err(std::io::Error::other)?;
        tokio::task::spawn_blocking(move || {
            let bytes = &encoded.bytes;
            let meta = Meta {
                version: VERSION,
                filter: meta,
                file_xxh3: hash_hex(bytes),
                saved_at_ms: crate::model::now_millis(),
            };
            write_atomic(&path, bytes)?;
            let json = serde_json::to_vec_pretty(&meta).map_err(std::io::Error::other)?;
            write_atomic(&meta_path(&path), &json)?;
            Ok(true)
        })
        .await
        .map_err(std::io::Error::other)?
    }

    /// Loads the snapshot, replays the keys of `resource` created after
    /// its outbox position and publishes it in `shield`. Returns the outbox
    /// position the snapshot is complete up to and the rebuild requests
    /// it covers.
    ///
    /// # Errors
    /// [`AdoptError`]: the resource then scans its source.
    pub async fn restore(&self, shield: &Shield, resource: &str) -> Result<(i64, i64), AdoptError> {
        let path = self.path.clone();
        let (meta, file_xxh3) = tokio::task::spawn_blocking(move || read_meta(&path))
            .await
            .map_err(ReadError::from)??;
        let want = Want {
            layout: self.layout,
            fpp: self.fpp,
            key_type: self.key_type,
            fold: self.fold,
            identity: self.identity.as_deref(),
        };
        let path = self.path.clone();
        let bytes = async move {
            tokio::task::spawn_blocking(move || read_file(&path, &file_xxh3))
                .await
                .map_err(ReadError::from)?
        };
        let replayed = shield
            .adopt(&meta, &want, &self.outbox, resource, How::Restore, bytes)
            .await?;
        tracing::info!(
            resource,
            path = %self.path.display(),
            outbox = meta.outbox,
            replayed,
            "filter restored from its snapshot; no scan"
        );
        Ok((meta.outbox, meta.covered))
    }

    /// Saves after every rebuild (checked each second) and every `every`,
    /// until the shield is dropped.
    pub fn spawn_saver(
        &self,
        shield: &Arc<Shield>,
        every: Duration,
        bg: &crate::tasks::Background,
    ) {
        let (persist, shield) = (self.clone(), Arc::downgrade(shield));
        bg.spawn(async move {
            let mut saved_rebuilds = None;
            let mut last_save = tokio::time::Instant::now();
            loop {
                tokio::time::sleep(Duration::from_secs(1)).await;
                let Some(shield) = shield.upgrade() else { return };
                let rebuilds = shield.rebuild_count();
                if saved_rebuilds == Some(rebuilds) && last_save.elapsed() < every {
                    continue;
                }
                match persist.save(&shield).await {
                    Ok(true) => {
                        saved_rebuilds = Some(rebuilds);
                        last_save = tokio::time::Instant::now();
                    }
                    Ok(false) => {}
                    Err(e) => {
                        tracing::warn!(error = %e, path = %persist.path.display(), "saving the filter snapshot failed");
                        last_save = tokio::time::Instant::now();
                        saved_rebuilds = Some(rebuilds);
                    }
                }
            }
        });
    }
}

/// Reads the metadata file: the filter's metadata and the snapshot
/// file's hash.
fn read_meta(path: &Path) -> Result<(FilterMeta, String), AdoptError> {
    let meta_file = meta_path(path);
    let json = match std::fs::read(&meta_file) {
        Ok(json) => json,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(AdoptError::Gone),
        Err(source) => {
            return Err(ReadError::Io {
                what: " metadata",
                path: meta_file,
                source,
            }
            .into())
        }
    };
    let meta: MetaFile = serde_json::from_slice(&json).map_err(|source| ReadError::Unparsable {
        path: meta_file.clone(),
        source,
    })?;
    if meta.version != VERSION {
        return Err(ReadError::Version {
            found: meta.version,
            writes: VERSION,
        }
        .into());
    }
    Ok((meta.filter.complete()?, meta.file_xxh3))
}

/// The snapshot file's bytes, if they are the ones the metadata names.
fn read_file(path: &Path, file_xxh3: &str) -> Result<Vec<u8>, AdoptError> {
    let bytes = std::fs::read(path).map_err(|source| ReadError::Io {
        what: "",
        path: path.to_owned(),
        source,
    })?;
    if hash_hex(&bytes) != file_xxh3 {
        return Err(ReadError::CutShort.into());
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    // The metadata file in a rolling upgrade, against fixtures of the
    // previous release's file and reader.

    use super::*;

    /// A metadata file as the previous release wrote it: no `key_type`.
    const PREVIOUS_FILE: &str = r#"{
      "version": 1,
      "outbox": 120,
      "covered": 118,
      "capacity": 5000,
      "layout": "blocked",
      "fpp": 0.01,
      "file_xxh3": "00000000deadbeef",
      "identity": "sqlite:/tmp/a.db:skus.id:Int",
      "saved_at_ms": 1700000000000
    }"#;

    /// The previous release's reader of the file (its `Meta`, as it was).
    #[derive(Debug, Deserialize)]
    #[allow(dead_code)]
    struct PreviousMeta {
        version: u32,
        #[serde(default)]
        outbox: Option<i64>,
        #[serde(default)]
        covered: i64,
        capacity: u64,
        layout: BloomLayout,
        fpp: f64,
        file_xxh3: String,
        #[serde(default)]
        identity: Option<String>,
        saved_at_ms: u64,
    }

    #[test]
    fn a_previous_release_file_is_refused_by_the_field_it_lacks() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("skus.bgf");
        std::fs::write(meta_path(&path), PREVIOUS_FILE).unwrap();
        let err = read_meta(&path).unwrap_err();
        assert!(
            matches!(err, AdoptError::EarlierRelease("key_type")),
            "{err}"
        );
        // And no file at all is "gone", not an error to warn about.
        std::fs::remove_file(meta_path(&path)).unwrap();
        assert!(matches!(read_meta(&path), Err(AdoptError::Gone)));
    }

    #[test]
    fn this_release_writes_a_file_both_releases_read() {
        let meta = Meta {
            version: VERSION,
            filter: FilterMeta {
                outbox: 120,
                covered: 118,
                capacity: 5000,
                fpp: 0.01,
                layout: BloomLayout::Classic,
                key_type: KeyType::Int,
                identity: "sqlite:/tmp/a.db:skus.id:Int".into(),
            },
            file_xxh3: "00000000deadbeef".into(),
            saved_at_ms: 1,
        };
        let json = serde_json::to_vec_pretty(&meta).unwrap();
        let previous: PreviousMeta = serde_json::from_slice(&json).unwrap();
        assert_eq!(
            previous.version, 1,
            "the previous release checks the version"
        );
        assert_eq!(
            (previous.outbox, previous.covered, previous.capacity),
            (Some(120), 118, 5000)
        );
        assert_eq!(previous.layout, BloomLayout::Classic);
        assert_eq!(
            previous.identity.as_deref(),
            Some(meta.filter.identity.as_str())
        );
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("skus.bgf");
        std::fs::write(meta_path(&path), &json).unwrap();
        let (read, hash) = read_meta(&path).unwrap();
        assert_eq!(read, meta.filter);
        assert_eq!(hash, "00000000deadbeef");
        // The bytes must be the ones the metadata names.
        std::fs::write(&path, b"not the saved filter").unwrap();
        assert!(matches!(
            read_file(&path, &hash),
            Err(AdoptError::Read(ReadError::CutShort))
        ));
    }
}
