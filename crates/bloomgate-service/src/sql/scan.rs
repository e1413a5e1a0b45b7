//! Reading a whole table without blocking anything: emptiness by
//! `LIMIT 1`, the row count from the database's statistics (never a full
//! `COUNT(*)` on the way to start-up or readiness), the exact count for
//! the background row check, and key pages streamed into a sink, every
//! statement under the background limit (`sql.background_statement_timeout_ms`).

use std::sync::atomic::Ordering;
use std::time::Duration;

use futures_util::TryStreamExt;
use sqlx::any::AnyRow;
use sqlx::Row;

use super::error::err;
use crate::config::SqlConfig;
use crate::filter::KeyBatch;
use crate::key::{Fold, Key, KeyType};
use crate::source::{KeyRange, Page, StoreError};
use crate::sql::limits::Within;
use crate::sql::{Backend, Database};

/// Keys handed to a sink at once while a page streams in.
const CHUNK: usize = 8_192;

/// The driver's own pool for key scans on MySQL and PostgreSQL (sqlx's
/// `Any` converts every row into its own type first, which costs more
/// than the rest of a scan's decoding), opened lazily from the same URL
/// (TLS options and all) with `sql.scan_parallel` connections. `None` on
/// SQLite, or when the driver does not take the URL: the `Any` pool
/// scans then.
#[derive(Clone, Default)]
pub(crate) enum ScanPool {
    #[default]
    None,
    MySql(sqlx::MySqlPool),
    Postgres(sqlx::PgPool),
}

impl std::fmt::Debug for ScanPool {
    // The options hold the password: only the kind is shown.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::None => "ScanPool::None",
            Self::MySql(_) => "ScanPool::MySql",
            Self::Postgres(_) => "ScanPool::Postgres",
        })
    }
}

/// PostgreSQL's `LISTEN` connection for the outbox's doorbell: a pool of
/// one, made lazily from the store's URL (the options hold the password,
/// so only whether there is one is shown).
#[derive(Clone, Default)]
pub(crate) struct ListenPool(pub(crate) Option<sqlx::PgPool>);

impl std::fmt::Debug for ListenPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "ListenPool(Postgres)"
        } else {
            "ListenPool(None)"
        })
    }
}

impl ListenPool {
    pub(crate) fn lazy(backend: Backend, url: &str) -> Self {
        if backend != Backend::Postgres {
            return Self(None);
        }
        Self(
            sqlx::postgres::PgPoolOptions::new()
                .max_connections(1)
                .connect_lazy(url)
                .ok(),
        )
    }
}

impl ScanPool {
    pub(crate) fn lazy(backend: Backend, url: &str, c: &SqlConfig) -> Self {
        let size = c.scan_parallel.max(1);
        // As the read path's pool: a database that refuses connections
        // fails a page at once (start-up retries the build with backoff).
        let acquire = Duration::from_millis(c.acquire_timeout_ms);
        match backend {
            Backend::MySql => sqlx::mysql::MySqlPoolOptions::new()
                .max_connections(size)
                .acquire_timeout(acquire)
                .connect_lazy(url)
                .map_or(Self::None, Self::MySql),
            Backend::Postgres => sqlx::postgres::PgPoolOptions::new()
                .max_connections(size)
                .acquire_timeout(acquire)
                .connect_lazy(url)
                .map_or(Self::None, Self::Postgres),
            Backend::Sqlite => Self::None,
        }
    }

    pub(crate) async fn close(&self) {
        match self {
            Self::None => {}
            Self::MySql(p) => p.close().await,
            Self::Postgres(p) => p.close().await,
        }
    }
}

/// Keys gathered from a page's rows and handed to the sink [`CHUNK`] at
/// a time.
struct Chunks<'s> {
    sink: &'s (dyn Fn(KeyBatch<'_>) + Send + Sync),
    ints: Vec<i64>,
    texts: Vec<Key>,
    page: Page,
    /// How text keys are folded before the sink sees them.
    fold: Fold,
}

impl<'s> Chunks<'s> {
    fn new(sink: &'s (dyn Fn(KeyBatch<'_>) + Send + Sync), fold: Fold) -> Self {
        Self {
            sink,
            ints: Vec::new(),
            texts: Vec::new(),
            page: Page::default(),
            fold,
        }
    }

    fn int(&mut self, k: i64) {
        self.ints.push(k);
        if self.ints.len() == CHUNK {
            self.flush();
        }
    }

    fn text(&mut self, k: String) {
        self.texts.push(self.fold.apply(Key::Text(k)));
        if self.texts.len() == CHUNK {
            self.flush();
        }
    }

    fn flush(&mut self) {
        if !self.ints.is_empty() {
            self.page.keys += self.ints.len();
            (self.sink)(KeyBatch::Ints(&self.ints));
            self.page.last = self.ints.last().map(|&i| Key::Int(i));
            self.ints.clear();
        }
        if !self.texts.is_empty() {
            self.page.keys += self.texts.len();
            (self.sink)(KeyBatch::Keys(&self.texts));
            self.page.last = self.texts.pop();
            self.texts.clear();
        }
    }

    fn finish(mut self) -> Page {
        self.flush();
        self.page
    }
}

/// One page through a driver's own pool: the same statement and binds,
/// rows decoded as the driver's types.
macro_rules! native_page {
    ($pool:expr, $q:expr, $binds:expr, $key_type:expr, $fold:expr, $sink:expr) => {{
        let mut query = sqlx::query($q);
        for b in $binds {
            query = match b {
                Key::Int(i) => query.bind(*i),
                Key::Text(s) | Key::Loose(s) => query.bind(s.as_str()),
            };
        }
        let mut rows = query.fetch($pool);
        let mut chunks = Chunks::new($sink, $fold);
        while let Some(row) = rows.try_next().await? {
            // A NULL key names no row a read could ask for: skipped.
            match $key_type {
                KeyType::Int => {
                    if let Some(k) = row.try_get::<Option<i64>, _>(0)? {
                        chunks.int(k);
                    }
                }
                KeyType::Text => match row.try_get::<Option<&str>, _>(0) {
                    Ok(Some(s)) => chunks.text(s.to_owned()),
                    Ok(None) => {}
                    Err(e) => match row.try_get::<Option<&[u8]>, _>(0) {
                        Ok(Some(b)) => chunks.text(String::from_utf8_lossy(b).into_owned()),
                        Ok(None) => {}
                        Err(_) => return Err(e),
                    },
                },
            }
        }
        Ok::<_, sqlx::Error>(chunks.finish())
    }};
}

impl Database {
    /// Readers a rebuild may use: `sql.scan_parallel`, at most 2 on SQLite,
    /// whose readers share the read path's pool of 4.
    fn readers(&self) -> usize {
        if self.backend == Backend::Sqlite {
            self.scan_parallel.min(2)
        } else {
            self.scan_parallel
        }
    }

    /// True when the SKU table has no row (`LIMIT 1`, not a count).
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn is_empty(&self) -> Result<bool, StoreError> {
        let row = sqlx::query("SELECT id FROM skus LIMIT 1")
            .fetch_optional(&self.pool)
            .within(&self.bg_limit, "emptiness")
            .await
            .map_err(err("emptiness"))?;
        Ok(row.is_none())
    }

    /// Number of SKUs: a full `COUNT(*)` (counted in
    /// [`StoreCounters::full_counts`]), for the background row check and
    /// the CLI, never on the way to start-up or readiness.
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn count(&self) -> Result<u64, StoreError> {
        self.count_rows("skus").await
    }

    /// `SELECT COUNT(*) FROM {quoted}` under the background limit.
    pub(crate) async fn count_rows(&self, quoted: &str) -> Result<u64, StoreError> {
        self.counters.full_counts.fetch_add(1, Ordering::Relaxed);
        let row = sqlx::query(&format!("SELECT COUNT(*) FROM {quoted}"))
            .fetch_one(&self.pool)
            .within(&self.bg_limit, "count")
            .await
            .map_err(err("count"))?;
        Ok(row.try_get::<i64, _>(0).map_err(err("count"))? as u64)
    }

    /// The database's own estimate of a table's rows, without reading it:
    /// `information_schema.tables.TABLE_ROWS` (InnoDB samples it: off by
    /// tens of percent), `pg_class.reltuples` (as of the last `ANALYZE` or
    /// vacuum; `None` before the first), SQLite's `MAX(rowid)` (exact
    /// until rows are deleted; `None` for a `WITHOUT ROWID` table).
    /// `name` is the table's plain name, `quoted` as statements spell it.
    ///
    /// # Errors
    /// [`StoreError`].
    pub(crate) async fn estimate_rows(
        &self,
        name: &str,
        quoted: &str,
    ) -> Result<Option<u64>, StoreError> {
        let q = match self.backend {
            Backend::MySql => sqlx::query(
                "SELECT CAST(TABLE_ROWS AS SIGNED) FROM information_schema.tables \
                 WHERE table_schema = DATABASE() AND table_name = ?",
            )
            .bind(name.to_owned()),
            Backend::Postgres => sqlx::query(
                "SELECT CAST(reltuples AS BIGINT) FROM pg_class WHERE oid = to_regclass($1)",
            )
            .bind(quoted.to_owned()),
            Backend::Sqlite => {
                let q = format!("SELECT MAX(rowid) FROM {quoted}");
                match sqlx::query(&q)
                    .fetch_one(&self.pool)
                    .within(&self.bg_limit, "estimate")
                    .await
                {
                    Ok(row) => {
                        return Ok(row
                            .try_get::<Option<i64>, _>(0)
                            .ok()
                            .map(|n| n.unwrap_or(0).max(0) as u64))
                    }
                    // No rowid: no cheap figure.
                    Err(sqlx::Error::Database(_)) => return Ok(None),
                    Err(e) => return Err(err("estimate")(e)),
                }
            }
        };
        let row = q
            .fetch_optional(&self.pool)
            .within(&self.bg_limit, "estimate")
            .await
            .map_err(err("estimate"))?;
        Ok(row
            .and_then(|r| r.try_get::<Option<i64>, _>(0).ok().flatten())
            .and_then(|n| u64::try_from(n).ok()))
    }

    /// Up to `sql.scan_parallel` ranges covering every integer key of
    /// `key` in `quoted`, cut evenly between its `MIN` and `MAX` (read
    /// through its index); one range when that is 1 or the table is empty.
    pub(crate) async fn int_ranges(
        &self,
        key: &str,
        quoted: &str,
    ) -> Result<Vec<KeyRange>, StoreError> {
        let n = self.readers();
        if n <= 1 {
            return Ok(vec![KeyRange::default()]);
        }
        // Cast after the aggregate (the index answers MIN and MAX): the
        // `Any` driver decodes no MySQL TINYINT or MEDIUMINT.
        let (min, max) = match self.backend {
            Backend::MySql => (
                format!("CAST(MIN({key}) AS SIGNED)"),
                format!("CAST(MAX({key}) AS SIGNED)"),
            ),
            Backend::Postgres => (
                format!("CAST(MIN({key}) AS BIGINT)"),
                format!("CAST(MAX({key}) AS BIGINT)"),
            ),
            Backend::Sqlite => (format!("MIN({key})"), format!("MAX({key})")),
        };
        let q = format!("SELECT {min}, {max} FROM {quoted}");
        let bounds = async {
            let row = sqlx::query(&q)
                .fetch_one(&self.pool)
                .within(&self.bg_limit, "key bounds")
                .await?;
            Ok::<_, sqlx::Error>((
                row.try_get::<Option<i64>, _>(0)?,
                row.try_get::<Option<i64>, _>(1)?,
            ))
        };
        match bounds.await {
            Ok((Some(min), Some(max))) => Ok(KeyRange::cut_at(
                int_bounds(min, max, n).into_iter().map(Key::Int).collect(),
            )),
            Ok(_) => Ok(vec![KeyRange::default()]),
            Err(e) => {
                tracing::info!(error = %e, "no key bounds; the rebuild reads one range");
                Ok(vec![KeyRange::default()])
            }
        }
    }

    /// Ranges of the text keys of `key_name` in `table` for
    /// `sql.scan_parallel` readers: cut where PostgreSQL's statistics put
    /// the key's quantiles (`pg_stats.histogram_bounds`, after an
    /// `ANALYZE`, which autovacuum runs); elsewhere, or without them, two
    /// readers meeting in the middle ([`KeyRange::meeting`]). One range
    /// when `sql.scan_parallel` is 1, or on SQLite (a local file: the
    /// decoding is the cost, and one reader does it).
    pub(crate) async fn text_ranges(&self, table: &str, key_name: &str) -> Vec<KeyRange> {
        let n = self.readers();
        if n <= 1 || self.backend == Backend::Sqlite {
            return vec![KeyRange::default()];
        }
        if self.backend == Backend::Postgres {
            let rows = sqlx::query(
                "SELECT CAST(b AS TEXT) FROM pg_stats, \
                 unnest(CAST(CAST(histogram_bounds AS TEXT) AS TEXT[])) WITH ORDINALITY AS h(b, i) \
                 WHERE schemaname = current_schema() AND tablename = $1 AND attname = $2 ORDER BY i",
            )
            .bind(table.to_owned())
            .bind(key_name.to_owned())
            .fetch_all(&self.pool)
            .within(&self.bg_limit, "key bounds")
            .await;
            let all: Vec<String> = match rows {
                Ok(rows) => rows.iter().filter_map(|r| r.try_get(0).ok()).collect(),
                Err(e) => {
                    tracing::info!(error = %e, "no key quantiles; two readers meet in the middle");
                    Vec::new()
                }
            };
            if all.len() > n {
                // Quantiles 1/n .. (n-1)/n of the histogram.
                let mut bounds: Vec<String> = (1..n)
                    .map(|i| all[i * (all.len() - 1) / n].clone())
                    .collect();
                bounds.dedup();
                return KeyRange::cut_at(bounds.into_iter().map(Key::Text).collect());
            }
        }
        KeyRange::meeting()
    }

    /// Streams one page of keys into `sink`, [`CHUNK`] at a time: the
    /// statement `q` (ordered by the key, with its `LIMIT`) with `binds`,
    /// under the background limit for the whole page.
    pub(crate) async fn stream_page(
        &self,
        q: &str,
        binds: &[Key],
        key_type: KeyType,
        fold: Fold,
        sink: &(dyn Fn(KeyBatch<'_>) + Send + Sync),
    ) -> Result<Page, StoreError> {
        let read = async {
            match &self.scan_pool {
                ScanPool::MySql(pool) => native_page!(pool, q, binds, key_type, fold, sink),
                ScanPool::Postgres(pool) => native_page!(pool, q, binds, key_type, fold, sink),
                ScanPool::None => {
                    let mut query = sqlx::query(q);
                    for b in binds {
                        query = match b {
                            Key::Int(i) => query.bind(*i),
                            Key::Text(s) | Key::Loose(s) => query.bind(s.clone()),
                        };
                    }
                    let mut rows = query.fetch(&self.pool);
                    let mut chunks = Chunks::new(sink, fold);
                    while let Some(row) = rows.try_next().await? {
                        match key_type {
                            KeyType::Int => {
                                if let Some(k) = row.try_get::<Option<i64>, _>(0)? {
                                    chunks.int(k);
                                }
                            }
                            KeyType::Text => {
                                if let Some(k) = text_at(&row, 0)? {
                                    chunks.text(k);
                                }
                            }
                        }
                    }
                    Ok(chunks.finish())
                }
            }
        };
        read.within(&self.bg_limit, "scan page")
            .await
            .map_err(err("scan page"))
    }

    /// One page of the SKU ids in `range` above `after`.
    pub(crate) async fn id_page(
        &self,
        range: &KeyRange,
        after: Option<&Key>,
        limit: usize,
        sink: &(dyn Fn(KeyBatch<'_>) + Send + Sync),
    ) -> Result<Page, StoreError> {
        let (q, binds) = page_statement(self, "id", "id", "skus", range, after, limit);
        self.stream_page(&q, &binds, KeyType::Int, Fold::Exact, sink)
            .await
    }
}

/// The statement and binds of one page: `key` above `after` (or the
/// range's start) and at most the range's end, in key order, `limit` rows.
pub(crate) fn page_statement(
    store: &Database,
    select: &str,
    key: &str,
    quoted: &str,
    range: &KeyRange,
    after: Option<&Key>,
    limit: usize,
) -> (String, Vec<Key>) {
    let mut conditions = Vec::new();
    let mut binds = Vec::new();
    let (past, upto, order) = if range.descending {
        ("<", ">=", " DESC")
    } else {
        (">", "<=", "")
    };
    if let Some(k) = after.or(range.after.as_ref()) {
        binds.push(k.clone());
        conditions.push(format!("{key} {past} {}", store.ph(binds.len())));
    }
    if let Some(k) = &range.upto {
        binds.push(k.clone());
        conditions.push(format!("{key} {upto} {}", store.ph(binds.len())));
    }
    let filter = if conditions.is_empty() {
        String::new()
    } else {
        format!(" WHERE {}", conditions.join(" AND "))
    };
    (
        format!("SELECT {select} FROM {quoted}{filter} ORDER BY {key}{order} LIMIT {limit}"),
        binds,
    )
}

/// Text from column `i`: MySQL sends long text (and casts to `CHAR`) as
/// `BLOB`, which the `Any` driver decodes only as bytes.
pub(crate) fn text_at(row: &AnyRow, i: usize) -> Result<Option<String>, sqlx::Error> {
    match row.try_get::<Option<String>, _>(i) {
        Ok(v) => Ok(v),
        Err(e) => match row.try_get::<Option<Vec<u8>>, _>(i) {
            Ok(v) => Ok(v.map(|b| String::from_utf8_lossy(&b).into_owned())),
            Err(_) => Err(e),
        },
    }
}

/// The `n - 1` cut points that split `[min, max]` into `n` ranges of
/// about equal width (fewer when there are fewer keys than ranges).
fn int_bounds(min: i64, max: i64, n: usize) -> Vec<i64> {
    let width = i128::from(max) - i128::from(min) + 1;
    let n = (n as i128).min(width).max(1);
    (1..n)
        .map(|i| (i128::from(min) - 1 + width * i / n) as i64)
        .collect()
}

/// The SKU table's key scan, for its filter's rebuilds.
impl crate::source::KeyScan for Database {
    fn estimate_keys(&self) -> crate::source::BoxFuture<'_, Result<Option<u64>, StoreError>> {
        Box::pin(self.estimate_rows("skus", "skus"))
    }

    fn count_keys(&self) -> crate::source::BoxFuture<'_, Result<u64, StoreError>> {
        Box::pin(self.count())
    }

    fn ranges(&self) -> crate::source::BoxFuture<'_, Result<Vec<KeyRange>, StoreError>> {
        // Called once per full scan.
        self.counters
            .id_scans
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Box::pin(async move {
            self.scan_caught_up().await?;
            self.int_ranges("id", "skus").await
        })
    }

    fn page<'a>(
        &'a self,
        range: &'a KeyRange,
        after: Option<&'a Key>,
        limit: usize,
        sink: &'a (dyn Fn(KeyBatch<'_>) + Send + Sync),
    ) -> crate::source::BoxFuture<'a, Result<Page, StoreError>> {
        Box::pin(self.id_page(range, after, limit, sink))
    }
}

#[cfg(test)]
mod tests {
    use super::{int_bounds, Key, KeyRange};

    #[test]
    fn ranges_cover_every_key_once() {
        for (min, max, n) in [
            (1, 10_000_000, 2),
            (1, 1, 4),
            (-5, 5, 3),
            (i64::MIN, i64::MAX, 4),
            (7, 9, 16),
        ] {
            let b = int_bounds(min, max, n);
            assert!(b.len() < n.max(2));
            assert!(
                b.windows(2).all(|w| w[0] < w[1]),
                "{min} {max} {n}: ascending"
            );
            assert!(
                b.iter().all(|&x| x >= min && x < max),
                "{min} {max} {n}: inside"
            );
            let r = KeyRange::cut_at(b.iter().copied().map(Key::Int).collect());
            assert_eq!(r.len(), b.len() + 1);
            assert_eq!((&r[0].after, &r[r.len() - 1].upto), (&None, &None));
            for w in r.windows(2) {
                assert_eq!(w[0].upto, w[1].after, "contiguous");
            }
        }
        assert_eq!(int_bounds(1, 10, 2), vec![5]);
    }
}
