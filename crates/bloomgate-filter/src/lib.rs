//! Fast, exactly sized Bloom filters for guarding a data store against
//! lookups of keys that do not exist.
//!
//! | type | what it is for |
//! |---|---|
//! | [`BlockedBloom`] | the default: one 32-byte block per key, exact sizing |
//! | [`AtomicBloom`] | the same, with `insert(&self)` from many threads |
//! | [`ClassicBloom`] | the textbook scheme, bit-compatible with seed 000's `BloomFilter.h` |
//! | [`AtomicClassicBloom`] | the same, with `insert(&self)` from many threads |
//! | [`CountingBloom`] | 4-bit counters, so keys can be removed |
//! | [`ScalableBloom`] | a chain that grows past its first capacity at a fixed total rate |
//! | [`MappedBloom`] | a zero-copy, read-only view of a snapshot file |
//! | [`Bitmap`] | the underlying 64-byte aligned bit array |
//!
//! All of them answer through the [`Filter`] trait. A "no" is exact: a key
//! that was inserted is always found. Sizing lives in [`sizing`], hashing in
//! [`hash`], the file format in [`snapshot`].
//!
//! This crate does no network I/O; its only I/O is reading and writing
//! snapshot files. `unsafe` code lives in five small modules: `mmap` (mapping
//! a file), `simd` (the AVX2 block mask, and the atomic block load in
//! assembly), `block` (calling `simd` after the run-time AVX2 check, and the
//! prefetch hint), `batch` (the batch loops' calls of `simd`, and cpuid)
//! and `storage` (a slice view of owned, possibly huge-page-mapped lines).
//!
//! ```
//! use bloomgate_filter::{BlockedBloom, Filter};
//! let mut skus = BlockedBloom::with_fpr(200_000, 0.001).unwrap();
//! for id in 1..=200_000u64 {
//!     skus.insert(&id);
//! }
//! assert!(skus.contains(&199_999u64));
//! let rejected = (200_001..300_001u64).filter(|id| !skus.contains(id)).count();
//! assert!(rejected > 99_800); // about 0.1% of absent ids get through
//! ```
#![deny(missing_docs)]

/// The crate README, compiled and run as a doctest.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;

mod bitmap;
mod block;
mod blocked;
mod classic;
mod concurrent;
mod concurrent_classic;
mod counter;
mod counting;
pub mod error;
mod filter;
pub mod hash;
mod mmap;
mod probe;
mod scalable;
#[cfg(feature = "serde")]
mod serde_impl;
pub mod sizing;
pub mod snapshot;
mod storage;

pub use bitmap::Bitmap;
pub use block::l2_cache_bytes;
pub use blocked::BlockedBloom;
pub use classic::ClassicBloom;
pub use concurrent::AtomicBloom;
pub use concurrent_classic::AtomicClassicBloom;
pub use counting::{CountingBloom, SATURATED};
pub use error::{Error, Result, SnapshotError};
pub use filter::Filter;
pub use hash::{BloomKey, HashPair};
pub use mmap::{MappedBloom, MappedFile};
pub use scalable::{
    ScalableBloom, ScalableOptions, SubFilterInfo, SCALABLE_FORMAT_VERSION, SCALABLE_MAGIC,
};
pub use snapshot::{KeyKind, Layout, Snapshot};
pub use storage::{Line, LINE_BITS};
