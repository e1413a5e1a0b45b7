//! The SKU record and the bodies of the write endpoints.

use serde::{Deserialize, Serialize};

mod canonical;
pub use canonical::canonical;

/// A seckill SKU, as stored in SQL, cached as JSON and returned by the API.
/// Prices are integer cents; times are Unix seconds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Sku {
    /// Positive 64-bit id.
    pub id: i64,
    /// Display name.
    pub name: String,
    /// List price, cents.
    pub original_price: i64,
    /// Flash-sale price, cents.
    pub seckill_price: i64,
    /// Units left.
    pub stock: i64,
    /// Sale start, Unix seconds.
    pub seckill_start: i64,
    /// Sale end, Unix seconds.
    pub seckill_end: i64,
    /// Last write, Unix seconds.
    pub updated_at: i64,
}

/// The body of `POST /api/skus` and `PUT /api/skus/{id}`.
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SkuInput {
    /// Id for a create; omitted, the next free id is used. Ignored by updates
    /// unless it differs from the path, which is refused.
    #[schema(minimum = 1)]
    pub id: Option<i64>,
    /// Display name, 1 to 255 characters.
    #[schema(min_length = 1, max_length = 255)]
    pub name: String,
    /// List price, cents, ≥ 0.
    #[schema(minimum = 0)]
    pub original_price: i64,
    /// Flash-sale price, cents, ≥ 0 and ≤ the list price.
    #[schema(minimum = 0)]
    pub seckill_price: i64,
    /// Units, ≥ 0.
    #[schema(minimum = 0)]
    pub stock: i64,
    /// Sale start, Unix seconds.
    pub seckill_start: i64,
    /// Sale end, Unix seconds, after the start.
    pub seckill_end: i64,
}

/// Why a SKU write body was refused: the first bad field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum InvalidSku {
    /// An `id` that is not positive.
    #[error("id must be a positive integer, got {0}")]
    Id(i64),
    /// A `name` of no characters, or of more than 255.
    #[error("name must have 1 to 255 characters")]
    Name,
    /// A negative price or stock.
    #[error("prices and stock must not be negative")]
    Negative,
    /// A flash-sale price over the list price.
    #[error("seckill_price must not exceed original_price")]
    PriceOverList,
    /// A sale that ends at or before its start.
    #[error("seckill_end must be after seckill_start")]
    EndNotAfterStart,
}

impl SkuInput {
    /// Checks the fields; the error names the first bad one.
    ///
    /// # Errors
    /// [`InvalidSku`], whose message is the HTTP 400's.
    pub fn validate(&self) -> Result<(), InvalidSku> {
        if let Some(id) = self.id {
            if id <= 0 {
                return Err(InvalidSku::Id(id));
            }
        }
        let len = self.name.chars().count();
        if len == 0 || len > 255 {
            return Err(InvalidSku::Name);
        }
        if self.original_price < 0 || self.seckill_price < 0 || self.stock < 0 {
            return Err(InvalidSku::Negative);
        }
        if self.seckill_price > self.original_price {
            return Err(InvalidSku::PriceOverList);
        }
        if self.seckill_end <= self.seckill_start {
            return Err(InvalidSku::EndNotAfterStart);
        }
        Ok(())
    }

    /// The record this input describes, with `id` and `updated_at` filled in.
    #[must_use]
    pub fn into_sku(self, id: i64, now: i64) -> Sku {
        Sku {
            id,
            name: self.name,
            original_price: self.original_price,
            seckill_price: self.seckill_price,
            stock: self.stock,
            seckill_start: self.seckill_start,
            seckill_end: self.seckill_end,
            updated_at: now,
        }
    }
}

/// The deterministic catalogue entry for `id` (seed 000's 200,000 SKUs).
#[must_use]
pub fn catalogue_sku(id: i64) -> Sku {
    let h = bloomgate_filter::hash::splitmix64(id as u64);
    let original_price = 1_000 + (h % 99_000) as i64;
    let discount = 50 + ((h >> 20) % 40) as i64; // 50%..89%
    let base = 1_767_225_600; // 2026-01-01T00:00:00Z
    let start = base + (id % 720) * 3600;
    Sku {
        id,
        name: format!("Seckill item #{id:06}"),
        original_price,
        seckill_price: original_price * discount / 100,
        stock: ((h >> 40) % 1000) as i64,
        seckill_start: start,
        seckill_end: start + 2 * 3600,
        updated_at: base,
    }
}

/// Current Unix time in seconds.
#[must_use]
pub fn now_secs() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

/// Unix time in milliseconds.
#[must_use]
pub fn now_millis() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}
