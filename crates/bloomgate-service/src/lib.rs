//! bloomgate's service: guarded tables that no stream of random keys can
//! push through to their database. Each table (the seckill SKU table of
//! seed 000 on a fresh checkout, or the `[[resources]]` a config names) is
//! read through a funnel of Bloom filter → in-process L1 → Redis → SQL,
//! where a filter "no" is a 404 that touches neither Redis nor SQL; every
//! write, whoever makes it, reaches every instance through the change
//! feed. Three listeners answer from the same filters: the HTTP API
//! (`http`, with operator endpoints to warm, rebuild and read stats), the
//! HTTP gate in front of an API bloomgate did not write (`proxy`), and
//! RedisBloom's `BF.*` over the Redis protocol (`resp`).
//!
//! Tests and the CLI use [`router`] (no socket) or [`run`] (a bound
//! listener and a shutdown future).
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod cache;
pub mod config;
pub mod error;
pub mod feed;
pub mod filter;
pub mod http;
pub mod key;
pub mod listen;
pub mod metrics;
pub mod model;
pub mod paths;
#[doc(hidden)]
pub mod pause;
pub mod proxy;
pub mod redis_link;
pub mod resource;
pub mod resp;
pub mod service;
pub mod share;
pub mod shield;
pub mod source;
pub mod sql;
pub mod state;
pub mod stats;
pub mod sync;
pub mod tasks;
pub mod text;
pub mod wire;

pub use config::Config;
pub use http::router;
pub use service::{prepare, run, run_with, serve, shutdown_signal, Listeners};
pub use state::{AppState, StartError};
