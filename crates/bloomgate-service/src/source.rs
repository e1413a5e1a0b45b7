//! What a guarded resource reads from: a [`Source`] answers point loads
//! (a JSON object, or missing), batch loads, key scans in key order and a
//! row count. [`crate::table::SqlTable`] is the SQL one; a Rust user
//! implements it for a source of their own. [`KeyScan`] is the part of it
//! the gate rebuilds from, which the SKU store implements too.

use std::future::Future;
use std::pin::Pin;

use crate::key::{Key, KeyType};
use crate::store::{SkuStore, StoreError};

/// A boxed future, as the object-safe traits here return.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A row, as the API answers it: column name → value, in column order.
pub type Row = serde_json::Map<String, serde_json::Value>;

/// A source of rows a resource guards. Every method may fail; a failure is
/// answered 503 and never cached.
pub trait Source: Send + Sync + std::fmt::Debug + 'static {
    /// How this source's keys are spelled.
    fn key_type(&self) -> KeyType;

    /// The row of `key`, or `None` when there is none.
    fn load<'a>(&'a self, key: &'a Key) -> BoxFuture<'a, Result<Option<Row>, StoreError>>;

    /// The rows of `keys` that exist, with their keys, in any order. The
    /// default loads them one by one.
    fn load_many<'a>(
        &'a self,
        keys: &'a [Key],
    ) -> BoxFuture<'a, Result<Vec<(Key, Row)>, StoreError>> {
        Box::pin(async move {
            let mut found = Vec::new();
            for k in keys {
                if let Some(row) = self.load(k).await? {
                    found.push((k.clone(), row));
                }
            }
            Ok(found)
        })
    }

    /// Up to `limit` keys greater than `after` (all keys when `None`), in
    /// ascending order: the filter is rebuilt by calling this until it
    /// returns fewer than `limit`.
    fn scan<'a>(
        &'a self,
        after: Option<&'a Key>,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<Key>, StoreError>>;

    /// How many rows there are (the filter is sized for it).
    fn count(&self) -> BoxFuture<'_, Result<u64, StoreError>>;
}

pub use crate::filter::KeyBatch;

/// What the gate rebuilds its filter from: a count to size it, then every
/// key in batches.
pub trait KeyScan: Send + Sync + std::fmt::Debug + 'static {
    /// How many keys there are.
    fn count_keys(&self) -> BoxFuture<'_, Result<u64, StoreError>>;

    /// Calls `sink` with every key, `batch` at a time; returns how many.
    fn scan_keys<'a>(
        &'a self,
        batch: usize,
        sink: &'a (dyn Fn(KeyBatch<'_>) + Send + Sync),
    ) -> BoxFuture<'a, Result<u64, StoreError>>;
}

/// Every [`Source`] is a [`KeyScan`] through its `scan`.
#[derive(Debug)]
pub struct ScanOf(pub std::sync::Arc<dyn Source>);

impl KeyScan for ScanOf {
    fn count_keys(&self) -> BoxFuture<'_, Result<u64, StoreError>> {
        self.0.count()
    }

    fn scan_keys<'a>(
        &'a self,
        batch: usize,
        sink: &'a (dyn Fn(KeyBatch<'_>) + Send + Sync),
    ) -> BoxFuture<'a, Result<u64, StoreError>> {
        Box::pin(async move {
            let mut after: Option<Key> = None;
            let mut total = 0u64;
            loop {
                let keys = self.0.scan(after.as_ref(), batch).await?;
                if keys.is_empty() {
                    return Ok(total);
                }
                sink(KeyBatch::Keys(&keys));
                total += keys.len() as u64;
                if keys.len() < batch {
                    return Ok(total);
                }
                after = keys.into_iter().next_back();
            }
        })
    }
}

impl KeyScan for SkuStore {
    fn count_keys(&self) -> BoxFuture<'_, Result<u64, StoreError>> {
        Box::pin(self.count())
    }

    fn scan_keys<'a>(
        &'a self,
        batch: usize,
        sink: &'a (dyn Fn(KeyBatch<'_>) + Send + Sync),
    ) -> BoxFuture<'a, Result<u64, StoreError>> {
        Box::pin(self.for_each_id_batch(batch as u64, |ids| {
            sink(KeyBatch::Ints(ids));
        }))
    }
}
