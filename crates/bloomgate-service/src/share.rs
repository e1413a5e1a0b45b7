//! What a filter shares beyond its process: `snapshot` files for restarts
//! without a scan, and the `redis_filter` of `strict` and `redis` modes.
//! (Shared rebuild epochs live with the doorbell that announces them.)

pub mod redis_filter;
pub mod snapshot;
