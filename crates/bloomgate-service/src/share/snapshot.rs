//! Restart without a cold window: the published filter is written to a
//! snapshot file (the filter library's format, written to a temporary file
//! and renamed) after each rebuild, every `cache.bloom_snapshot_every_secs`
//! and at shutdown, beside a small JSON file naming the change-outbox
//! position it is complete up to. At start the instance loads it (the
//! library verifies its checksum), replays the keys created after that
//! position from the outbox, and serves at once; it scans SQL only when
//! the snapshot is missing, does not verify, was made for another layout
//! or rate, or names a position the outbox was trimmed past (or one
//! beyond its end: another database). Rows written behind the outbox's
//! back (as `bloomgate seed` does) are found afterwards, by the gate's
//! background row check ([`Gate::verify_rows`]): no full count stands
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
use crate::filter::decode;
use crate::gate::{Gate, GateFilter};
use crate::key::{Key, KeyType};
use bloomgate_filter::KeyKind;

/// The metadata file's format version.
const VERSION: u32 = 1;

/// What sits beside the snapshot.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
struct Meta {
    version: u32,
    /// The outbox watermark the snapshot is complete up to (absent in
    /// files written before the outbox: such a file is not used).
    #[serde(default)]
    outbox: Option<i64>,
    /// Rebuild requests in the outbox up to here are held by the file.
    #[serde(default)]
    covered: i64,
    /// Items the filter was sized for.
    capacity: u64,
    layout: BloomLayout,
    fpp: f64,
    /// XXH3-64 of the snapshot file, so a file and a metadata file written
    /// by different saves never pair up.
    file_xxh3: String,
    /// What the filter holds (`Resource::identity`: the database, table,
    /// key column and key type). Absent in files of earlier releases:
    /// such a file is not restored (once: the next save writes it).
    #[serde(default)]
    identity: Option<String>,
    saved_at_ms: u64,
}

/// Where and how this instance keeps its snapshot.
#[derive(Debug, Clone)]
pub struct Persist {
    path: PathBuf,
    layout: BloomLayout,
    fpp: f64,
    outbox: Outbox,
    /// How the filter's keys are hashed, as the file records it.
    kind: KeyKind,
    /// What the filter holds (see [`Meta`]).
    identity: Option<Arc<str>>,
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
    /// Snapshots at `path` for a filter of `layout` at `fpp`
    /// whose keys are `key_type`, positioned in `outbox`.
    #[must_use]
    pub fn new(
        path: PathBuf,
        layout: BloomLayout,
        fpp: f64,
        key_type: KeyType,
        outbox: Outbox,
    ) -> Self {
        Self {
            path,
            layout,
            fpp,
            outbox,
            kind: crate::filter::key_kind(key_type),
            identity: None,
        }
    }

    /// Snapshots of a filter holding `identity` (see [`Meta`]).
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

    /// Saves `gate`'s published filter (nothing when none is published).
    ///
    /// # Errors
    /// I/O errors (logged by the callers; the previous files stay whole).
    pub async fn save(&self, gate: &Gate) -> std::io::Result<bool> {
        // The position first, then the copy: the copy holds at least what
        // was applied up to the position.
        // A filter that may lack creates (a rebuild is owed) is not saved:
        // its positions would vouch for what it does not hold.
        if gate.rebuild_is_owed() {
            return Ok(false);
        }
        let outbox = Some(self.outbox.watermark());
        let covered = self.outbox.rebuilds_covered();
        let Some(filter) = gate.published() else {
            return Ok(false);
        };
        let capacity = gate.capacity();
        let (path, layout, fpp, kind) = (self.path.clone(), self.layout, self.fpp, self.kind);
        let identity = self.identity.clone();
        let encoded = crate::filter::encode_one(filter, kind)
            .await
            .map_err(std::io::Error::other)?;
        tokio::task::spawn_blocking(move || {
            let bytes = &encoded.bytes;
            let meta = Meta {
                version: VERSION,
                outbox,
                covered,
                capacity,
                layout,
                fpp,
                file_xxh3: hash_hex(bytes),
                saved_at_ms: crate::model::now_millis(),
                identity: identity.as_deref().map(str::to_owned),
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
    /// its outbox position and publishes it in `gate`. Returns the outbox
    /// position the snapshot is complete up to and the rebuild requests
    /// it covers.
    ///
    /// # Errors
    /// A sentence for the log: the resource then scans its source.
    pub async fn restore(
        &self,
        gate: &Gate,
        resource: &str,
        key_type: KeyType,
    ) -> Result<(i64, i64), String> {
        let (filter, meta) = self.load().await?;
        let want = self
            .identity
            .as_deref()
            .ok_or("this database has no identity yet")?;
        match meta.identity.as_deref() {
            Some(made) if made == want => {}
            Some(made) => {
                return Err(format!(
                    "the snapshot holds {made}, not {want}: made against another database, table or key column"
                ))
            }
            None => return Err("the snapshot names no database (an earlier release's)".into()),
        }
        let at = meta.outbox.ok_or("the snapshot has no outbox position")?;
        self.not_ahead(at).await?;
        let created = match self.outbox.created_keys_after(at, resource).await {
            Ok(Some(keys)) => keys,
            Ok(None) => {
                return Err(format!(
                    "the change outbox was trimmed past the snapshot's position {at}"
                ))
            }
            Err(e) => return Err(format!("reading the change outbox: {e}")),
        };
        let mut keys = Vec::with_capacity(created.len());
        for raw in &created {
            keys.push(Key::parse(key_type, raw).map_err(|e| {
                format!("the outbox holds a key of {resource} that does not parse: {e}")
            })?);
        }
        keys.sort_unstable();
        keys.dedup();
        filter.insert_many(&keys);
        if !gate.install(filter, meta.capacity) {
            return Err("a filter was published meanwhile".into());
        }
        tracing::info!(
            resource,
            path = %self.path.display(),
            outbox = at,
            replayed = keys.len(),
            "filter restored from its snapshot; no scan"
        );
        Ok((at, meta.covered))
    }

    /// A snapshot positioned past the end of this database's outbox was
    /// made against another database (one recreated, or restored from a
    /// backup): what it lacks could not be replayed.
    async fn not_ahead(&self, at: i64) -> Result<(), String> {
        let max = self.outbox.max_seq().await.map_err(|e| e.to_string())?;
        if at > max {
            return Err(format!(
                "the snapshot's outbox position {at} is ahead of this database's outbox ({max}): it was made against another database"
            ));
        }
        Ok(())
    }

    async fn load(&self) -> Result<(GateFilter, Meta), String> {
        let (path, layout, fpp, kind) = (self.path.clone(), self.layout, self.fpp, self.kind);
        tokio::task::spawn_blocking(move || load(&path, layout, fpp, kind))
            .await
            .map_err(|e| e.to_string())?
    }

    /// Saves after every rebuild (checked each second) and every `every`,
    /// until the gate is dropped.
    pub fn spawn_saver(&self, gate: &Arc<Gate>, every: Duration, bg: &crate::tasks::Background) {
        let (persist, gate) = (self.clone(), Arc::downgrade(gate));
        bg.spawn(async move {
            let mut saved_rebuilds = None;
            let mut last_save = tokio::time::Instant::now();
            loop {
                tokio::time::sleep(Duration::from_secs(1)).await;
                let Some(gate) = gate.upgrade() else { return };
                let rebuilds = gate.rebuild_count();
                if saved_rebuilds == Some(rebuilds) && last_save.elapsed() < every {
                    continue;
                }
                match persist.save(&gate).await {
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

/// Reads, pairs and verifies the two files.
fn load(
    path: &Path,
    layout: BloomLayout,
    fpp: f64,
    kind: KeyKind,
) -> Result<(GateFilter, Meta), String> {
    let meta_file = meta_path(path);
    let json = std::fs::read(&meta_file)
        .map_err(|e| format!("no snapshot metadata at {}: {e}", meta_file.display()))?;
    let meta: Meta = serde_json::from_slice(&json)
        .map_err(|e| format!("unreadable snapshot metadata {}: {e}", meta_file.display()))?;
    if meta.version != VERSION {
        return Err(format!(
            "snapshot metadata version {} (this build writes {VERSION})",
            meta.version
        ));
    }
    if meta.layout != layout || meta.fpp != fpp {
        return Err(format!(
            "snapshot made for layout {:?} at fpp {}, configured {:?} at {}",
            meta.layout, meta.fpp, layout, fpp
        ));
    }
    let bytes =
        std::fs::read(path).map_err(|e| format!("no snapshot at {}: {e}", path.display()))?;
    if hash_hex(&bytes) != meta.file_xxh3 {
        return Err("the snapshot file does not match its metadata (a save was cut short)".into());
    }
    let filter = decode(layout, &bytes, kind)?;
    Ok((filter, meta))
}
