//! Adopting a positioned filter: one copied elsewhere (a snapshot file, a
//! shared rebuild's epoch in Redis) that holds every key created up to a
//! position in the change outbox. Every adoption takes these steps, for
//! the SKU table and every resource alike, at start and when another
//! instance announces a rebuild:
//!
//! 1. its metadata ([`FilterMeta`]) must describe this filter: layout,
//!    rate, key type and identity (database, table, key column, fold).
//!    An earlier release's metadata, which lacks a field, is refused; the
//!    caller answers with a scan and, at start, a republish;
//! 2. its scan must have begun after the newest rebuild request this
//!    instance acted on (`covered`: rows no entry names are in no replay),
//!    and its position must not be ahead of this database's outbox (such a
//!    filter was made against another database, one recreated or
//!    restored, and what it lacks could not be replayed);
//! 3. its bytes are read and decoded (the filter library verifies them);
//! 4. it becomes the filter being built: every insert from then on
//!    reaches it too;
//! 5. the keys created after its position are replayed from the outbox,
//!    folded as the table's are (refused when trimmed past it);
//! 6. it is published, unless a rebuild took over meanwhile.
//!
//! So every key is held: up to the position (the watermark noted before
//! the scan or copy) in the bytes, after it in the replay or, once step 4
//! ran, inserted straight into the filter.

use std::collections::HashMap;
use std::future::Future;

use serde::{Deserialize, Serialize};

use super::Shield;
use crate::config::BloomLayout;
use crate::key::{Fold, Key, KeyType};
use crate::sql::StoreError;

mod error;
pub use error::{AdoptError, ReadError};

/// A positioned filter's metadata (a snapshot's JSON, an epoch's hash).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FilterMeta {
    /// The outbox watermark the filter holds every create up to.
    pub outbox: i64,
    /// Rebuild requests in the outbox up to here are held by the filter.
    pub covered: i64,
    /// Items the filter was sized for.
    pub capacity: u64,
    /// The target rate it was sized for.
    pub fpp: f64,
    /// Its layout.
    pub layout: BloomLayout,
    /// How its keys are hashed.
    pub key_type: KeyType,
    /// What it holds (see [`crate::wire::filter_identity`]).
    pub identity: String,
}

/// [`FilterMeta`] as read (an earlier release wrote fewer fields).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct MetaRead {
    #[serde(default)]
    outbox: Option<i64>,
    #[serde(default)]
    covered: Option<i64>,
    #[serde(default)]
    capacity: Option<u64>,
    #[serde(default)]
    fpp: Option<f64>,
    #[serde(default)]
    layout: Option<BloomLayout>,
    #[serde(default)]
    key_type: Option<KeyType>,
    #[serde(default)]
    identity: Option<String>,
}

impl MetaRead {
    /// The whole metadata, or the first field it lacks.
    ///
    /// # Errors
    /// [`AdoptError::EarlierRelease`].
    pub fn complete(self) -> Result<FilterMeta, AdoptError> {
        let lacks = AdoptError::EarlierRelease;
        Ok(FilterMeta {
            outbox: self.outbox.ok_or(lacks("outbox"))?,
            covered: self.covered.ok_or(lacks("covered"))?,
            capacity: self.capacity.ok_or(lacks("capacity"))?,
            fpp: self.fpp.ok_or(lacks("fpp"))?,
            layout: self.layout.ok_or(lacks("layout"))?,
            key_type: self.key_type.ok_or(lacks("key_type"))?,
            identity: self.identity.ok_or(lacks("identity"))?,
        })
    }
}

impl FilterMeta {
    /// The fields of an epoch's Redis hash. Every release since epochs
    /// exist reads these spellings: numbers in decimal, the layout and key
    /// type by their Rust names (`Blocked`, `Int`).
    #[must_use]
    pub fn fields(&self) -> Vec<(&'static str, String)> {
        vec![
            ("outbox", self.outbox.to_string()),
            ("covered", self.covered.to_string()),
            ("capacity", self.capacity.to_string()),
            ("fpp", self.fpp.to_string()),
            ("layout", format!("{:?}", self.layout)),
            ("key_type", format!("{:?}", self.key_type)),
            ("identity", self.identity.clone()),
        ]
    }

    /// Reads an epoch's Redis hash (fields it does not know, such as the
    /// segment count, are ignored).
    ///
    /// # Errors
    /// [`AdoptError::Gone`] for an empty hash, [`AdoptError::EarlierRelease`]
    /// for a missing field, [`AdoptError::Unreadable`] for a bad one.
    pub fn from_fields(fields: &HashMap<String, String>) -> Result<Self, AdoptError> {
        if fields.is_empty() {
            return Err(AdoptError::Gone);
        }
        fn parsed<T: std::str::FromStr>(
            fields: &HashMap<String, String>,
            name: &'static str,
        ) -> Result<Option<T>, AdoptError> {
            fields
                .get(name)
                .map(|v| v.parse().map_err(|_| AdoptError::Unreadable(name)))
                .transpose()
        }
        let layout = fields
            .get("layout")
            .map(|v| match v.as_str() {
                "Blocked" => Ok(BloomLayout::Blocked),
                "Classic" => Ok(BloomLayout::Classic),
                _ => Err(AdoptError::Unreadable("layout")),
            })
            .transpose()?;
        let key_type = fields
            .get("key_type")
            .map(|v| match v.as_str() {
                "Int" => Ok(KeyType::Int),
                "Text" => Ok(KeyType::Text),
                _ => Err(AdoptError::Unreadable("key_type")),
            })
            .transpose()?;
        MetaRead {
            outbox: parsed(fields, "outbox")?,
            covered: parsed(fields, "covered")?,
            capacity: parsed(fields, "capacity")?,
            fpp: parsed(fields, "fpp")?,
            layout,
            key_type,
            identity: fields.get("identity").cloned(),
        }
        .complete()
    }

    /// Whether it describes the filter `want` asks for.
    ///
    /// # Errors
    /// [`AdoptError::NoIdentity`], [`AdoptError::OtherShape`],
    /// [`AdoptError::OtherIdentity`].
    pub fn check(&self, want: &Want<'_>) -> Result<(), AdoptError> {
        let want_identity = want.identity.ok_or(AdoptError::NoIdentity)?;
        if self.layout != want.layout || self.fpp != want.fpp || self.key_type != want.key_type {
            return Err(AdoptError::OtherShape {
                made: format!(
                    "{:?} at {} over {:?} keys",
                    self.layout, self.fpp, self.key_type
                ),
                want: format!(
                    "{:?} at {} over {:?} keys",
                    want.layout, want.fpp, want.key_type
                ),
            });
        }
        if self.identity != want_identity {
            return Err(AdoptError::OtherIdentity {
                made: self.identity.clone(),
                want: want_identity.to_owned(),
            });
        }
        Ok(())
    }
}

/// The filter this instance would build, which an adopted one must match
/// (its fold also folds the replayed keys).
#[derive(Debug, Clone, Copy)]
#[allow(missing_docs)]
pub struct Want<'a> {
    pub layout: BloomLayout,
    pub fpp: f64,
    pub key_type: KeyType,
    pub fold: Fold,
    /// This database's identity for the table (`None` until it is known).
    pub identity: Option<&'a str>,
}

/// How an adopted filter is counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum How {
    /// Restored from this instance's snapshot file.
    Restore,
    /// Adopted from another instance's epoch.
    Adopt,
}

/// The change outbox as an adoption reads it.
pub trait ChangeLog: Sync {
    /// The largest seq in the outbox (0 when empty).
    fn max_seq(&self) -> impl Future<Output = Result<i64, StoreError>> + Send;

    /// The keys of `resource` created after `from`, as entries spell them;
    /// `None` when entries after `from` were trimmed.
    fn created_keys_after(
        &self,
        from: i64,
        resource: &str,
    ) -> impl Future<Output = Result<Option<Vec<String>>, StoreError>> + Send;

    /// The newest rebuild request for `resource` this instance acted on
    /// (rows were written that no entry names): a filter whose scan began
    /// before it (`covered` below it) may lack them.
    fn rebuild_requested(&self, _resource: &str) -> i64 {
        0
    }
}

impl Shield {
    /// Adopts the positioned filter `meta` describes, whose bytes `bytes`
    /// reads (only once the metadata passed), replaying from `log` the
    /// keys of `resource` created after its position (see the module
    /// docs). Returns how many keys were replayed.
    ///
    /// # Errors
    /// [`AdoptError`]: the caller scans instead (nothing was published).
    pub async fn adopt<L, B>(
        &self,
        meta: &FilterMeta,
        want: &Want<'_>,
        log: &L,
        resource: &str,
        how: How,
        bytes: B,
    ) -> Result<usize, AdoptError>
    where
        L: ChangeLog,
        B: Future<Output = Result<Vec<u8>, AdoptError>>,
    {
        meta.check(want)?;
        let asked = log.rebuild_requested(resource);
        if meta.covered < asked {
            return Err(AdoptError::Uncovered {
                covered: meta.covered,
                asked,
            });
        }
        let max = log.max_seq().await.map_err(AdoptError::Outbox)?;
        if meta.outbox > max {
            return Err(AdoptError::Ahead {
                at: meta.outbox,
                max,
            });
        }
        let bytes = bytes.await?;
        let (layout, kind) = (want.layout, crate::filter::key_kind(want.key_type));
        let filter =
            tokio::task::spawn_blocking(move || crate::filter::decode(layout, &bytes, kind))
                .await
                .map_err(crate::filter::CodecError::from)??;
        if how == How::Restore && self.published().is_some() {
            return Err(AdoptError::Busy);
        }
        let filter = self.begin_adopt(filter).ok_or(AdoptError::Busy)?;
        let keys = match replay(log, meta.outbox, resource, want).await {
            Ok(keys) => keys,
            Err(e) => {
                self.abandon_adopt(&filter);
                return Err(e);
            }
        };
        filter.insert_many(&keys);
        if !self.finish(&filter, meta.capacity, how) {
            return Err(AdoptError::TookOver);
        }
        Ok(keys.len())
    }
}

/// The keys of `resource` created after `from`, parsed, sorted, unique.
async fn replay<L: ChangeLog>(
    log: &L,
    from: i64,
    resource: &str,
    want: &Want<'_>,
) -> Result<Vec<Key>, AdoptError> {
    let created = log
        .created_keys_after(from, resource)
        .await
        .map_err(AdoptError::Outbox)?
        .ok_or(AdoptError::Trimmed(from))?;
    let mut keys = created
        .iter()
        .map(|raw| want.fold.parse(want.key_type, raw))
        .collect::<Result<Vec<_>, _>>()
        .map_err(AdoptError::BadKey)?;
    keys.sort_unstable();
    keys.dedup();
    Ok(keys)
}

#[cfg(test)]
mod tests;
