//! Many SKUs by id in one statement per thousand (`batch`).

use super::{err, sku_from_row, Database, StoreError, Within, COLUMNS};
use crate::model::Sku;

impl Database {
    /// The SKUs of `ids` that exist, in any order: one `IN (…)` per
    /// thousand ids (integers, written into the statement as numbers).
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn get_many(&self, ids: &[i64]) -> Result<Vec<Sku>, StoreError> {
        let mut found = Vec::with_capacity(ids.len());
        for chunk in ids.chunks(1000) {
            let list: Vec<String> = chunk.iter().map(i64::to_string).collect();
            let q = format!(
                "SELECT {COLUMNS} FROM skus WHERE id IN ({})",
                list.join(", ")
            );
            let rows = sqlx::query(&q)
                .fetch_all(&self.pool)
                .within(&self.limit, "get many")
                .await
                .map_err(err("get many"))?;
            for r in &rows {
                found.push(sku_from_row(r).map_err(err("get many"))?);
            }
        }
        Ok(found)
    }
}
