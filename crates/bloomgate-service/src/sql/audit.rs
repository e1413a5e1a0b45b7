//! The audit's lookups (see `reader::audit`): whether a key the filter
//! refused has a row, as `SELECT 1`, counted among the background
//! statements (not among `queries`, the reads' own) and under their
//! timeout.

use std::sync::atomic::Ordering;

use super::error::err;
use crate::key::Key;
use crate::source::StoreError;
use crate::sql::limits::Within;
use crate::sql::Database;

impl Database {
    /// Whether SKU `id` has a row.
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn audit(&self, id: i64) -> Result<bool, StoreError> {
        self.counters.background.fetch_add(1, Ordering::Relaxed);
        let q = format!("SELECT 1 FROM skus WHERE id = {}", self.ph(1));
        let row = sqlx::query(&q)
            .bind(id)
            .fetch_optional(&self.pool)
            .within(&self.bg_limit, "filter audit")
            .await
            .map_err(err("filter audit"))?;
        Ok(row.is_some())
    }
}

/// Whether `key` has a row in `table` (both quoted), for a configured
/// resource's table.
pub(super) async fn row_exists(
    store: &Database,
    table: &str,
    column: &str,
    key: &Key,
) -> Result<bool, StoreError> {
    store.counters.background.fetch_add(1, Ordering::Relaxed);
    // As the column compares: the filter holds keys folded as its
    // collation compares (see `crate::key::Fold`), so a row any spelling
    // of the refused key finds is a false negative.
    let q = format!("SELECT 1 FROM {table} WHERE {column} = {}", store.ph(1));
    let q = match key {
        Key::Int(i) => sqlx::query(&q).bind(*i),
        Key::Text(t) | Key::Loose(t) => sqlx::query(&q).bind(t.clone()),
    };
    let row = q
        .fetch_optional(&store.pool)
        .within(&store.bg_limit, "filter audit")
        .await
        .map_err(err("filter audit"))?;
    Ok(row.is_some())
}
