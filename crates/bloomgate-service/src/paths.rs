//! The route patterns other modules name: the metrics' `route` label and
//! the stats' per-route counts. A leaf, so naming one imports no handler.

/// The read route's pattern, its `route` label in metrics.
pub const SECKILL_ROUTE: &str = "/api/seckill/{sku_id}";

/// The default resource's read, `GET /api/skus/{id}`: the same answer as
/// [`SECKILL_ROUTE`], under the resource API's spelling.
pub const SKU_ROUTE: &str = "/api/skus/{sku_id}";
