//! What a resource needs of its rows beyond the funnel's [`Rows`]: the
//! SKU store and every [`crate::source::Source`] (as [`SourceRows`]).

use std::sync::Arc;

use crate::key::{Fold, Key, KeyType};
use crate::resource::reader::{Rows, SourceRows};
use crate::source::{BoxFuture, KeyScan, ScanOf};
use crate::sql::{Database, StoreError};

/// Rows found, with their keys, some time later.
pub type RowsFuture<'a, R> =
    BoxFuture<'a, Result<Vec<(<R as Rows>::Key, <R as Rows>::Row)>, StoreError>>;

/// What a resource reads its rows from: the funnel's [`Rows`], plus what
/// the key API, the warm and the shared rebuilds need of a source. The
/// SKU store and every [`crate::source::Source`] (as [`SourceRows`]) are
/// one.
pub trait Guarded: Rows {
    /// How keys are spelled.
    fn key_type(&self) -> KeyType;

    /// How text keys are folded before they are judged or cached.
    fn fold(&self) -> Fold {
        Fold::Exact
    }

    /// A key as the outbox spells it.
    ///
    /// # Errors
    /// Not a key of this source.
    fn parse_key(&self, raw: &str) -> Result<Self::Key, crate::key::KeyError>;

    /// The rows of `keys` that exist, with their keys, in any order.
    fn load_many<'a>(&'a self, keys: &'a [Self::Key]) -> RowsFuture<'a, Self>;

    /// Up to `limit` keys after `after` (from the first: `None`), in the
    /// source's order: one page of a warm.
    fn page_keys<'a>(
        &'a self,
        after: Option<&'a Self::Key>,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<Self::Key>, StoreError>>;

    /// The rows of a page of `keys` that came after `after`: exactly the
    /// keys leased (a row added into the page meanwhile may be there too).
    fn page_rows<'a>(
        &'a self,
        after: Option<&'a Self::Key>,
        keys: &'a [Self::Key],
    ) -> RowsFuture<'a, Self>;

    /// The scan a rebuild reads every key with.
    fn key_scan(&self) -> Arc<dyn KeyScan>;
}

impl Guarded for Database {
    fn key_type(&self) -> KeyType {
        KeyType::Int
    }

    fn parse_key(&self, raw: &str) -> Result<i64, crate::key::KeyError> {
        match Key::parse(KeyType::Int, raw)? {
            Key::Int(id) => Ok(id),
            _ => unreachable!("an integer key parses as Key::Int"),
        }
    }

    fn load_many<'a>(&'a self, keys: &'a [i64]) -> RowsFuture<'a, Self> {
        Box::pin(async move {
            let found = self.get_many(keys).await?;
            Ok(found.into_iter().map(|s| (s.id, s)).collect())
        })
    }

    fn page_keys<'a>(
        &'a self,
        after: Option<&'a i64>,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<i64>, StoreError>> {
        Box::pin(self.page_ids(after.copied().unwrap_or(0), limit as u64))
    }

    fn page_rows<'a>(&'a self, after: Option<&'a i64>, keys: &'a [i64]) -> RowsFuture<'a, Self> {
        Box::pin(async move {
            let Some(&last) = keys.last() else {
                return Ok(Vec::new());
            };
            // The whole leased range: one ordered read, not an `IN (…)`.
            let rows = self.range(after.copied().unwrap_or(0), last).await?;
            Ok(rows.into_iter().map(|s| (s.id, s)).collect())
        })
    }

    fn key_scan(&self) -> Arc<dyn KeyScan> {
        Arc::new(self.clone())
    }
}

impl Guarded for SourceRows {
    fn key_type(&self) -> KeyType {
        self.0.key_type()
    }

    fn fold(&self) -> Fold {
        self.0.fold()
    }

    fn parse_key(&self, raw: &str) -> Result<Key, crate::key::KeyError> {
        self.0.fold().parse(self.0.key_type(), raw)
    }

    fn load_many<'a>(&'a self, keys: &'a [Key]) -> RowsFuture<'a, Self> {
        self.0.load_many(keys)
    }

    fn page_keys<'a>(
        &'a self,
        after: Option<&'a Key>,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<Key>, StoreError>> {
        self.0.scan(after, limit)
    }

    fn page_rows<'a>(&'a self, _after: Option<&'a Key>, keys: &'a [Key]) -> RowsFuture<'a, Self> {
        self.0.load_many(keys)
    }

    fn key_scan(&self) -> Arc<dyn KeyScan> {
        Arc::new(ScanOf(Arc::clone(&self.0)))
    }
}
