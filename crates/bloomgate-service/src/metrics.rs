//! Counters for the stats endpoint that request handlers on every worker
//! thread bump without contending: each thread adds to its own cache line,
//! and reads sum the shards.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

const SHARDS: usize = 16;

#[derive(Debug, Default)]
#[repr(align(64))]
struct Shard(AtomicU64);

/// A monotonically increasing counter, sharded by thread.
#[derive(Debug, Default)]
pub struct Counter {
    shards: [Shard; SHARDS],
}

fn shard_index() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static INDEX: Cell<usize> = const { Cell::new(usize::MAX) };
    }
    INDEX.with(|i| {
        if i.get() == usize::MAX {
            i.set(NEXT.fetch_add(1, Ordering::Relaxed) % SHARDS);
        }
        i.get()
    })
}

impl Counter {
    /// Adds one.
    #[inline]
    pub fn incr(&self) {
        self.add(1);
    }

    /// Adds `n`.
    #[inline]
    pub fn add(&self, n: u64) {
        self.shards[shard_index()].0.fetch_add(n, Ordering::Relaxed);
    }

    /// Subtracts `n` (for counts reset after an event, like deletes since a
    /// rebuild). The total never goes below what was added.
    pub fn sub(&self, n: u64) {
        self.shards[shard_index()].0.fetch_sub(n, Ordering::Relaxed);
    }

    /// The current total.
    #[must_use]
    pub fn get(&self) -> u64 {
        self.shards
            .iter()
            .fold(0u64, |acc, s| acc.wrapping_add(s.0.load(Ordering::Relaxed)))
    }
}

#[cfg(test)]
mod tests {
    use super::Counter;

    #[test]
    fn sums_over_threads() {
        let c = Counter::default();
        std::thread::scope(|s| {
            for _ in 0..8 {
                s.spawn(|| {
                    for _ in 0..10_000 {
                        c.incr();
                    }
                });
            }
        });
        assert_eq!(c.get(), 80_000);
        c.sub(5);
        assert_eq!(c.get(), 79_995);
    }
}
