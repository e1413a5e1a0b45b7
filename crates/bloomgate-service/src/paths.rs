//! The route patterns other modules name: the metrics' `route` label and
//! the stats' per-route counts. A leaf, so naming one imports no handler.

/// The read route's pattern, its `route` label in metrics.
pub const SECKILL_ROUTE: &str = "/api/seckill/{sku_id}";
