//! The seckill SKU service: `GET /api/seckill/{skuId}` through a funnel of
//! Bloom filter → in-process L1 → Redis → SQL, with operator endpoints to
//! warm the caches and rebuild the filter, and a stats endpoint.
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
pub mod gate;
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
