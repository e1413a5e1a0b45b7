//! What a guarded resource reads from: a [`Source`] answers point loads
//! (a JSON object, or missing), batch loads, key scans in key order and a
//! row count. A Rust user implements it with `async fn` for a source of
//! their own; the service holds it as a [`DynSource`] (boxed futures,
//! object-safe), which [`crate::sql::table::SqlTable`], the SQL one,
//! implements directly. [`KeyScan`] is the part of it
//! the shield rebuilds from, which the SKU store implements too. Below
//! `sql`: the SQL store implements these traits, and this module names
//! no database.

use std::future::Future;
use std::pin::Pin;

use crate::key::{Fold, Key, KeyType};

mod error;
mod range;

pub use error::{Failure, StoreError};
pub use range::{KeyRange, Page};

/// A boxed future, as the object-safe traits here return.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A row, as the API answers it: column name → value, in column order.
pub type Row = serde_json::Map<String, serde_json::Value>;

/// A source of rows a resource guards, written with `async fn`. Every
/// method may fail; a failure is answered 503 and never cached.
///
/// ```
/// use bloomgate_service::key::{Key, KeyType};
/// use bloomgate_service::source::{Row, Source};
/// use bloomgate_service::sql::StoreError;
///
/// /// Two fixed rows.
/// #[derive(Debug)]
/// struct Two;
///
/// impl Source for Two {
///     fn key_type(&self) -> KeyType {
///         KeyType::Text
///     }
///     async fn load(&self, key: &Key) -> Result<Option<Row>, StoreError> {
///         let known = ["a", "b"].contains(&key.to_string().as_str());
///         Ok(known.then(|| {
///             let mut row = Row::new();
///             row.insert("id".into(), key.to_string().into());
///             row
///         }))
///     }
///     async fn scan(&self, after: Option<&Key>, limit: usize) -> Result<Vec<Key>, StoreError> {
///         let after = after.map(ToString::to_string).unwrap_or_default();
///         Ok(["a", "b"]
///             .into_iter()
///             .filter(|k| **k > *after)
///             .take(limit)
///             .map(|k| Key::Text(k.into()))
///             .collect())
///     }
///     async fn count(&self) -> Result<u64, StoreError> {
///         Ok(2)
///     }
/// }
/// # let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
/// # rt.block_on(async {
/// let keys = Two.scan(None, 10).await.unwrap();
/// assert_eq!(keys.len(), 2);
/// assert!(Two.load(&Key::Text("c".into())).await.unwrap().is_none());
/// # });
/// ```
pub trait Source: Send + Sync + std::fmt::Debug + 'static {
    /// How this source's keys are spelled.
    fn key_type(&self) -> KeyType;

    /// The row of `key`, or `None` when there is none.
    fn load(&self, key: &Key) -> impl Future<Output = Result<Option<Row>, StoreError>> + Send;

    /// The rows of `keys` that exist, with their keys, in any order. The
    /// default loads them one by one.
    fn load_many(
        &self,
        keys: &[Key],
    ) -> impl Future<Output = Result<Vec<(Key, Row)>, StoreError>> + Send {
        async move {
            let mut found = Vec::new();
            for k in keys {
                if let Some(row) = self.load(k).await? {
                    found.push((k.clone(), row));
                }
            }
            Ok(found)
        }
    }

    /// Up to `limit` keys greater than `after` (all keys when `None`), in
    /// ascending order: the filter is rebuilt by calling this until it
    /// returns fewer than `limit`.
    fn scan(
        &self,
        after: Option<&Key>,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<Key>, StoreError>> + Send;

    /// How many rows there are. It may read everything: the service
    /// calls it only in the background, to check that a restored filter
    /// accounts for every row.
    fn count(&self) -> impl Future<Output = Result<u64, StoreError>> + Send;

    /// A cheap estimate of the row count, if the source has one: it sizes
    /// the filter and is the total a rebuild's progress is shown against.
    /// The default has none (the filter is sized for the configured
    /// `bloom_expected`, or for the keys the last rebuild scanned).
    fn estimate(&self) -> impl Future<Output = Result<Option<u64>, StoreError>> + Send {
        async { Ok(None) }
    }
}

/// [`Source`] as the service holds it, behind `Arc<dyn DynSource>`: the
/// same methods returning boxed futures. Every [`Source`] is one; the
/// service's own [`crate::sql::table::SqlTable`] implements it directly.
pub trait DynSource: Send + Sync + std::fmt::Debug + 'static {
    /// [`Source::key_type`].
    fn key_type(&self) -> KeyType;

    /// How the source compares text keys: [`Fold::Exact`] (byte for byte)
    /// unless it knows better.
    fn fold(&self) -> Fold {
        Fold::Exact
    }

    /// [`Source::load`].
    fn load<'a>(&'a self, key: &'a Key) -> BoxFuture<'a, Result<Option<Row>, StoreError>>;

    /// [`Source::load_many`].
    fn load_many<'a>(
        &'a self,
        keys: &'a [Key],
    ) -> BoxFuture<'a, Result<Vec<(Key, Row)>, StoreError>>;

    /// [`Source::scan`].
    fn scan<'a>(
        &'a self,
        after: Option<&'a Key>,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<Key>, StoreError>>;

    /// [`Source::count`].
    fn count(&self) -> BoxFuture<'_, Result<u64, StoreError>>;

    /// [`Source::estimate`].
    fn estimate(&self) -> BoxFuture<'_, Result<Option<u64>, StoreError>>;

    /// Whether `key` has a row, for the audit of the filter's "no" (see
    /// `reader::audit`), off the request path: through [`Self::load`]
    /// unless the source has a cheaper way.
    fn audit<'a>(&'a self, key: &'a Key) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move { Ok(self.load(key).await?.is_some()) })
    }

    /// The key ranges a rebuild may read at once (one, unless the source
    /// knows better).
    fn ranges(&self) -> BoxFuture<'_, Result<Vec<KeyRange>, StoreError>> {
        Box::pin(async { Ok(vec![KeyRange::default()]) })
    }

    /// One page of keys handed to `sink` (see [`KeyScan::page`]); the
    /// default reads it with `scan` and knows one range only.
    fn scan_page<'a>(
        &'a self,
        range: &'a KeyRange,
        after: Option<&'a Key>,
        limit: usize,
        sink: &'a (dyn Fn(KeyBatch<'_>) + Send + Sync),
    ) -> BoxFuture<'a, Result<Page, StoreError>> {
        let _ = range;
        Box::pin(page_of(self, after, limit, sink))
    }
}

impl<S: Source> DynSource for S {
    fn key_type(&self) -> KeyType {
        Source::key_type(self)
    }

    fn load<'a>(&'a self, key: &'a Key) -> BoxFuture<'a, Result<Option<Row>, StoreError>> {
        Box::pin(Source::load(self, key))
    }

    fn load_many<'a>(
        &'a self,
        keys: &'a [Key],
    ) -> BoxFuture<'a, Result<Vec<(Key, Row)>, StoreError>> {
        Box::pin(Source::load_many(self, keys))
    }

    fn scan<'a>(
        &'a self,
        after: Option<&'a Key>,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<Key>, StoreError>> {
        Box::pin(Source::scan(self, after, limit))
    }

    fn count(&self) -> BoxFuture<'_, Result<u64, StoreError>> {
        Box::pin(Source::count(self))
    }

    fn estimate(&self) -> BoxFuture<'_, Result<Option<u64>, StoreError>> {
        Box::pin(Source::estimate(self))
    }
}

pub use crate::filter::KeyBatch;

/// A page of `scan` handed to `sink`: how [`DynSource::scan_page`] reads
/// a source that has only [`Source::scan`].
async fn page_of<S: DynSource + ?Sized>(
    source: &S,
    after: Option<&Key>,
    limit: usize,
    sink: &(dyn Fn(KeyBatch<'_>) + Send + Sync),
) -> Result<Page, StoreError> {
    let keys = source.scan(after, limit).await?;
    if !keys.is_empty() {
        sink(KeyBatch::Keys(&keys));
    }
    Ok(Page {
        keys: keys.len(),
        last: keys.into_iter().next_back(),
    })
}

/// What the shield rebuilds its filter from: an estimate to size it, then
/// every key, page by page, in ranges it may read at once.
pub trait KeyScan: Send + Sync + std::fmt::Debug + 'static {
    /// A cheap estimate of how many keys there are (the database's
    /// statistics), if the source has one: it sizes the filter and is the
    /// total a rebuild's progress is shown against.
    fn estimate_keys(&self) -> BoxFuture<'_, Result<Option<u64>, StoreError>>;

    /// The exact number of keys. It may read everything: the service
    /// calls it only in the background, never on the way to readiness.
    fn count_keys(&self) -> BoxFuture<'_, Result<u64, StoreError>>;

    /// The ranges a rebuild reads at once; together they hold every key.
    /// A descending range comes only with a full ascending one, the two
    /// meeting in the middle ([`KeyRange::meeting`]).
    fn ranges(&self) -> BoxFuture<'_, Result<Vec<KeyRange>, StoreError>>;

    /// Calls `sink` with up to `limit` keys of `range` greater than `after`
    /// (from the range's start when `None`), in key order; fewer than
    /// `limit` means the range is done.
    fn page<'a>(
        &'a self,
        range: &'a KeyRange,
        after: Option<&'a Key>,
        limit: usize,
        sink: &'a (dyn Fn(KeyBatch<'_>) + Send + Sync),
    ) -> BoxFuture<'a, Result<Page, StoreError>>;

    /// Calls `sink` with every key, `batch` at a time, one range after the
    /// other; returns how many.
    fn scan_keys<'a>(
        &'a self,
        batch: usize,
        sink: &'a (dyn Fn(KeyBatch<'_>) + Send + Sync),
    ) -> BoxFuture<'a, Result<u64, StoreError>> {
        Box::pin(async move {
            let mut total = 0u64;
            // One reader: a descending range only ever pairs with a full
            // ascending one (`KeyRange::meeting`), which reads it all.
            let mut ranges = self.ranges().await?;
            ranges.retain(|r| !r.descending);
            for range in ranges {
                let mut after: Option<Key> = None;
                loop {
                    let page = self.page(&range, after.as_ref(), batch, sink).await?;
                    total += page.keys as u64;
                    if page.keys < batch {
                        break;
                    }
                    after = page.last;
                }
            }
            Ok(total)
        })
    }
}

/// Every [`Source`] is a [`KeyScan`] through its `scan`.
#[derive(Debug)]
pub struct ScanOf(pub std::sync::Arc<dyn DynSource>);

impl KeyScan for ScanOf {
    fn estimate_keys(&self) -> BoxFuture<'_, Result<Option<u64>, StoreError>> {
        self.0.estimate()
    }

    fn count_keys(&self) -> BoxFuture<'_, Result<u64, StoreError>> {
        self.0.count()
    }

    fn ranges(&self) -> BoxFuture<'_, Result<Vec<KeyRange>, StoreError>> {
        self.0.ranges()
    }

    fn page<'a>(
        &'a self,
        range: &'a KeyRange,
        after: Option<&'a Key>,
        limit: usize,
        sink: &'a (dyn Fn(KeyBatch<'_>) + Send + Sync),
    ) -> BoxFuture<'a, Result<Page, StoreError>> {
        self.0.scan_page(range, after, limit, sink)
    }
}
