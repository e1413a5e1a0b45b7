//! A table's watch column: compared and ordered raw (an index serves it),
//! read cast to an integer or text, and the reads the watch task makes.

use sqlx::any::AnyRow;
use sqlx::Row;

use crate::key::Key;
use crate::sql::limits::Within;
use crate::sql::table::SqlTable;
use crate::sql::{err, text_at, StoreError};

/// A table's watch column: compared raw, read cast.
#[derive(Debug)]
pub(super) struct Watch {
    /// Quoted.
    pub(super) column: String,
    /// The column as selected (cast to an integer or text).
    pub(super) selected: String,
    /// An integer column; else compared as text (text, dates, times).
    pub(super) as_int: bool,
    /// The bound value in a comparison (cast to the column's type where
    /// the dialect needs it).
    pub(super) bound: String,
}

impl Watch {
    pub(super) fn value(&self, row: &AnyRow, at: usize) -> Result<Option<WatchValue>, sqlx::Error> {
        Ok(if self.as_int {
            row.try_get::<Option<i64>, _>(at)?.map(WatchValue::Int)
        } else {
            text_at(row, at)?.map(WatchValue::Text)
        })
    }
}

/// A watch column's value.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum WatchValue {
    /// An integer column.
    Int(i64),
    /// Any other column, compared as text (ISO dates sort as text).
    Text(String),
}

impl SqlTable {
    /// The watch column's largest value (`None` for an empty table or no
    /// watch column).
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn watched_max(&self) -> Result<Option<WatchValue>, StoreError> {
        let Some(w) = &self.watch else {
            return Ok(None);
        };
        // MAX of the raw column (an index answers it), cast for reading.
        let q = format!(
            "SELECT {} FROM (SELECT MAX({}) AS {} FROM {}) m",
            w.selected, w.column, w.column, self.table
        );
        self.count_statement();
        let row = sqlx::query(&q)
            .fetch_one(&self.store.pool)
            .within(&self.store.bg_limit, "resource watch")
            .await
            .map_err(err("resource watch"))?;
        w.value(&row, 0).map_err(err("resource watch"))
    }

    /// Keys of rows whose watch column is at least `from` (past it, with
    /// `past`; every row with a value when `None`), in the column's order, at most `limit`, with the column's
    /// value. `None` when no watch column is set. The raw column is
    /// compared and ordered, so an index on it serves the statement.
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn watched(
        &self,
        from: Option<&WatchValue>,
        past: bool,
        limit: usize,
    ) -> Result<Option<Vec<(Key, WatchValue)>>, StoreError> {
        let Some(w) = &self.watch else {
            return Ok(None);
        };
        let filter = match from {
            Some(_) => format!(
                " WHERE {} {} {}",
                w.column,
                if past { ">" } else { ">=" },
                w.bound
            ),
            // The table was empty: every row is new.
            None => format!(" WHERE {} IS NOT NULL", w.column),
        };
        let q = format!(
            "SELECT {}, {} FROM {}{filter} ORDER BY {} LIMIT {limit}",
            self.key_select, w.selected, self.table, w.column
        );
        let query = match from {
            Some(WatchValue::Int(i)) => sqlx::query(&q).bind(*i),
            Some(WatchValue::Text(s)) => sqlx::query(&q).bind(s.clone()),
            None => sqlx::query(&q),
        };
        self.count_statement();
        let rows = query
            .fetch_all(&self.store.pool)
            .within(&self.store.bg_limit, "resource watch")
            .await
            .map_err(err("resource watch"))?;
        let mut out = Vec::with_capacity(rows.len());
        for r in &rows {
            let key = self.key_from(r, 0).map_err(err("resource watch"))?;
            if let Some(v) = w.value(r, 1).map_err(err("resource watch"))? {
                out.push((key, v));
            }
        }
        Ok(Some(out))
    }
}
