//! What other processes read, named once: the kind codes of change entries
//! (the outbox's `kind` column and the Redis stream's `kind` field) and
//! the Redis keys under `cache.redis_prefix`. Changing one of these is a
//! protocol change between instances of different versions.

/// Change-entry kinds.
pub mod kind {
    /// A row was created (or a resource's key added).
    pub const CREATED: &str = "c";
    /// A row was updated (or a resource's key invalidated).
    pub const UPDATED: &str = "u";
    /// A row was deleted.
    pub const DELETED: &str = "d";
    /// Rebuild: rows were written that no entry names (outbox; on the
    /// stream, only from older versions, read as a ring).
    pub const REBUILD: &str = "r";
    /// Stream only: a shared rebuild's epoch to adopt, or, without one, a
    /// rebuild every instance runs from SQL.
    pub const BUILT: &str = "b";
    /// Stream only: the outbox holds new entries (any write; a SKU
    /// create's ring also names it, `learn`).
    pub const RING: &str = "n";
}

/// The key prefix of a rebuild entry (`kind::REBUILD`) asked for once a
/// table's capture triggers fire again: `capture:{fingerprint}` names
/// those triggers (`CaptureState::fingerprint`), so an instance that
/// finds them replaced after reading it does not ask again. Older
/// releases read the kind alone.
pub const CAPTURE_REQUEST: &str = "capture:";

/// The key prefix of every other rebuild entry: `request:{16 hex}`, new
/// for each request. An entry whose insert was slow is recorded again
/// (`Database::record_many`), and both copies carry one key, so a
/// follower that read one acts on the other no more. Older releases
/// wrote an empty key, which is acted on each time.
pub const REBUILD_REQUEST: &str = "request:";

/// The key of a rebuild entry asked for once `fingerprint`'s triggers
/// fire ([`CAPTURE_REQUEST`]; a [`rebuild_request_key`] without one).
#[must_use]
pub fn capture_request_key(fingerprint: Option<&str>) -> String {
    fingerprint.map_or_else(rebuild_request_key, |f| format!("{CAPTURE_REQUEST}{f}"))
}

/// A new key for a rebuild entry ([`REBUILD_REQUEST`]).
#[must_use]
pub fn rebuild_request_key() -> String {
    format!("{REBUILD_REQUEST}{:016x}", fastrand::u64(..))
}

/// The namespace of SKU values: `{prefix}sku:{id}`.
pub const SKU_NAMESPACE: &str = "sku:";

/// The namespace of a resource's values: `{prefix}rv:{name}:{identity}:{key}`.
/// `identity` names what a value holds (for a table: its key column,
/// fold and selected columns, `SqlTable::value_identity`), so a value
/// cached under another column set (`columns` narrowed to hide a field)
/// is never read. The previous release's values (`r:{name}:{key}`) are
/// another namespace: during a deploy each release reads, fills and
/// invalidates its own (every follower deletes the keys it applies).
#[must_use]
pub fn resource_namespace(name: &str, identity: &str) -> String {
    format!("rv:{name}:{identity}:")
}

/// The namespace of a gate route's remembered 404s:
/// `{prefix}gnf:{name}:{tag}:{key}`, `tag` naming the route and what its
/// resource's filter holds ([`crate::cache::AbsentMemory`]).
#[must_use]
pub fn absent_namespace(name: &str, tag: &str) -> String {
    format!("gnf:{name}:{tag}:")
}

/// A short, stable name for `parts` (FNV-1a, 8 hex digits): trigger names,
/// value identities.
#[must_use]
pub fn short_tag(parts: &[&str]) -> String {
    let mut h: u32 = 0x811c_9dc5;
    for p in parts {
        for b in p.bytes().chain([0]) {
            h = (h ^ u32::from(b)).wrapping_mul(0x0100_0193);
        }
    }
    format!("{h:08x}")
}

/// Where a resource's own structures live beside its cached rows (its
/// shared filter, its epochs): `rf:{name}:`, which no value key of
/// [`resource_namespace`] can spell, whatever the resource's keys are.
#[must_use]
pub fn resource_filter_namespace(name: &str) -> String {
    format!("rf:{name}:")
}

/// The change stream.
#[must_use]
pub fn changes_key(prefix: &str) -> String {
    format!("{prefix}changes")
}

/// The shared filter of `strict` and `redis` modes: `{prefix}bloom:{tag}`,
/// the tag naming what it holds (the database's identity, the table, its
/// key column and key type: [`filter_identity`]), so a filter made
/// against another database or another key column under the same prefix
/// is another key, never read; `{prefix}bloom` where that is unknown.
#[must_use]
pub fn shared_filter_key(prefix: &str, holds: Option<&str>) -> String {
    match holds {
        Some(holds) => format!("{prefix}bloom:{}", short_tag(&[holds])),
        None => format!("{prefix}bloom"),
    }
}

/// The lock of a shared rebuild's leader.
#[must_use]
pub fn rebuild_lock_key(prefix: &str) -> String {
    format!("{prefix}bloom:rebuild:lock")
}

/// Redis's identity under the prefix (see `Doorbell::redis_era`): its
/// absence means Redis lost bloomgate's state.
#[must_use]
pub fn redis_identity_key(prefix: &str) -> String {
    format!("{prefix}redis:id")
}

/// The epoch counter; an epoch's keys are named after it.
#[must_use]
pub fn epoch_counter_key(prefix: &str) -> String {
    format!("{prefix}bloom:epoch")
}

/// Epoch `n`'s meta hash (segments, bytes, position, shape), written last.
#[must_use]
pub fn epoch_meta_key(counter: &str, n: u64) -> String {
    format!("{counter}:{n}:meta")
}

/// Segment `i` of epoch `n`.
#[must_use]
pub fn epoch_segment_key(counter: &str, n: u64, i: usize) -> String {
    format!("{counter}:{n}:seg:{i}")
}

/// What a filter holds, as snapshots and shared epochs name it: the
/// database's identity (`Database::identity`), `table.key` (or `source
/// <name>`) and the key type. Instances refuse a filter whose identity is
/// not theirs.
#[must_use]
pub fn filter_identity(database: &str, holds: &str, key_type: crate::key::KeyType) -> String {
    format!("{database}:{holds}:{key_type:?}")
}
