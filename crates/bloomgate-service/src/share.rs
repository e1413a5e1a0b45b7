//! What a filter shares beyond its process: `snapshot` files for restarts
//! without a scan, and the `redis_filter` of `strict` and `redis` modes.
//! (Shared rebuild epochs are stored through the doorbell's connection,
//! `feed::doorbell::epochs`, and adopted through `resource`.)

pub mod redis_filter;
pub mod snapshot;
