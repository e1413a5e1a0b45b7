//! Reading a whole table without blocking anything: emptiness by
//! `LIMIT 1`, the row count from the database's statistics (never a full
//! `COUNT(*)` on the way to start-up or readiness), the exact count for
//! the background row check, and key pages streamed into a sink, every
//! statement under the background limit (`sql.background_statement_timeout_ms`).

use futures_util::TryStreamExt;

use super::*;
use crate::filter::KeyBatch;
use crate::key::{Key, KeyType};

/// A part of the key space a rebuild reads on its own: integer keys in
/// `(after, upto]`; `None` is every key.
pub type KeyRange = Option<(i64, i64)>;

/// What one page delivered.
#[derive(Debug, Clone, Default)]
pub struct Page {
    /// Keys passed to the sink.
    pub keys: usize,
    /// The last of them (the next page starts after it).
    pub last: Option<Key>,
}

/// Keys handed to a sink at once while a page streams in.
const CHUNK: usize = 8_192;

impl SkuStore {
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

    /// Up to `n` ranges covering every integer key of `key` in `quoted`
    /// (`MIN` and `MAX` through its index), split evenly; one range (`None`)
    /// when `n` is 1 or the table is empty.
    pub(crate) async fn int_ranges(
        &self,
        key: &str,
        quoted: &str,
    ) -> Result<Vec<KeyRange>, StoreError> {
        let n = self.scan_parallel;
        if n <= 1 {
            return Ok(vec![None]);
        }
        let q = format!("SELECT MIN({key}), MAX({key}) FROM {quoted}");
        let row = sqlx::query(&q)
            .fetch_one(&self.pool)
            .within(&self.bg_limit, "key bounds")
            .await
            .map_err(err("key bounds"))?;
        let (Some(min), Some(max)) = (
            row.try_get::<Option<i64>, _>(0)
                .map_err(err("key bounds"))?,
            row.try_get::<Option<i64>, _>(1)
                .map_err(err("key bounds"))?,
        ) else {
            return Ok(vec![None]);
        };
        Ok(split(min, max, n))
    }

    /// Streams one page of keys into `sink`, [`CHUNK`] at a time: the
    /// statement `q` (ordered by the key, with its `LIMIT`) with `binds`,
    /// under the background limit for the whole page.
    pub(crate) async fn stream_page(
        &self,
        q: &str,
        binds: &[Key],
        key_type: KeyType,
        sink: &(dyn Fn(KeyBatch<'_>) + Send + Sync),
    ) -> Result<Page, StoreError> {
        let mut query = sqlx::query(q);
        for b in binds {
            query = match b {
                Key::Int(i) => query.bind(*i),
                Key::Text(s) => query.bind(s.clone()),
            };
        }
        let read = async {
            let mut rows = query.fetch(&self.pool);
            let mut page = Page::default();
            let (mut ints, mut texts) = (Vec::new(), Vec::new());
            while let Some(row) = rows.try_next().await? {
                match key_type {
                    KeyType::Int => {
                        ints.push(row.try_get::<i64, _>(0)?);
                        if ints.len() == CHUNK {
                            page.keys += ints.len();
                            sink(KeyBatch::Ints(&ints));
                            page.last = ints.last().map(|&i| Key::Int(i));
                            ints.clear();
                        }
                    }
                    KeyType::Text => {
                        let k = text_at(&row, 0)?.unwrap_or_default();
                        texts.push(Key::Text(k));
                        if texts.len() == CHUNK {
                            page.keys += texts.len();
                            sink(KeyBatch::Keys(&texts));
                            page.last = texts.pop();
                            texts.clear();
                        }
                    }
                }
            }
            if !ints.is_empty() {
                page.keys += ints.len();
                sink(KeyBatch::Ints(&ints));
                page.last = ints.last().map(|&i| Key::Int(i));
            }
            if !texts.is_empty() {
                page.keys += texts.len();
                sink(KeyBatch::Keys(&texts));
                page.last = texts.pop();
            }
            Ok::<_, sqlx::Error>(page)
        };
        read.within(&self.bg_limit, "scan page")
            .await
            .map_err(err("scan page"))
    }

    /// One page of the SKU ids in `range` above `after`.
    pub(crate) async fn id_page(
        &self,
        range: KeyRange,
        after: Option<&Key>,
        limit: usize,
        sink: &(dyn Fn(KeyBatch<'_>) + Send + Sync),
    ) -> Result<Page, StoreError> {
        let (q, binds) = page_statement(self, "id", "id", "skus", range, after, limit);
        self.stream_page(&q, &binds, KeyType::Int, sink).await
    }
}

/// The statement and binds of one page: `key` above `after` (or the
/// range's start) and at most the range's end, in key order, `limit` rows.
pub(crate) fn page_statement(
    store: &SkuStore,
    select: &str,
    key: &str,
    quoted: &str,
    range: KeyRange,
    after: Option<&Key>,
    limit: usize,
) -> (String, Vec<Key>) {
    let mut conditions = Vec::new();
    let mut binds = Vec::new();
    let lower = match (after, range) {
        (Some(k), _) => Some(k.clone()),
        (None, Some((lo, _))) => Some(Key::Int(lo)),
        (None, None) => None,
    };
    if let Some(k) = lower {
        binds.push(k);
        conditions.push(format!("{key} > {}", store.ph(binds.len())));
    }
    if let Some((_, hi)) = range {
        binds.push(Key::Int(hi));
        conditions.push(format!("{key} <= {}", store.ph(binds.len())));
    }
    let filter = if conditions.is_empty() {
        String::new()
    } else {
        format!(" WHERE {}", conditions.join(" AND "))
    };
    (
        format!("SELECT {select} FROM {quoted}{filter} ORDER BY {key} LIMIT {limit}"),
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

/// `(min - 1, max]` in `n` ranges of about equal width.
fn split(min: i64, max: i64, n: usize) -> Vec<KeyRange> {
    if min == i64::MIN {
        // `(min - 1, …]` has no i64 spelling: one range, no lower bound.
        return vec![None];
    }
    let lo = i128::from(min) - 1;
    let width = (i128::from(max) - lo).max(1);
    let n = (n as i128).min(width);
    (0..n)
        .map(|i| {
            let a = lo + width * i / n;
            let b = if i == n - 1 {
                i128::from(max)
            } else {
                lo + width * (i + 1) / n
            };
            Some((a as i64, b as i64))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::split;

    #[test]
    fn the_smallest_key_leaves_one_unbounded_range() {
        assert_eq!(split(i64::MIN, 5, 4), vec![None]);
    }

    #[test]
    fn ranges_cover_every_key_once() {
        for (min, max, n) in [
            (1, 10_000_000, 2),
            (1, 1, 4),
            (-5, 5, 3),
            (i64::MIN + 1, i64::MAX, 4),
            (7, 9, 16),
        ] {
            let r: Vec<(i64, i64)> = split(min, max, n).into_iter().flatten().collect();
            assert!(r.len() <= n && !r.is_empty());
            assert_eq!(r.last().unwrap().1, max);
            assert_eq!(r[0].0, min - 1);
            for w in r.windows(2) {
                assert_eq!(w[0].1, w[1].0, "{min} {max} {n}: contiguous");
                assert!(w[0].0 < w[0].1);
            }
        }
    }
}
