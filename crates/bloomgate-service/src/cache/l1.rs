//! The in-process L1: bounded (S3-FIFO eviction, `quick_cache`), each
//! entry with a lifetime by kind (a found row, or a shorter-lived "not
//! found"), checked when the entry is read.
//!
//! It replaced moka, whose reads each recorded an access into a shared
//! channel drained by a maintenance pass, a measurable share of an L1
//! hit under load on two cores (`perf`, BENCHMARKS.md). Here a read is a shard's
//! read lock, a probe, a clock read and an `Arc` clone.

use std::hash::Hash;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::Entry;

#[derive(Debug)]
struct Timed<T> {
    entry: Entry<T>,
    expires: Instant,
}

impl<T> Clone for Timed<T> {
    fn clone(&self) -> Self {
        Self {
            entry: self.entry.clone(),
            expires: self.expires,
        }
    }
}

/// See the module docs. Clones share one cache.
pub struct L1<K, T> {
    inner: Arc<Inner<K, T>>,
}

struct Inner<K, T> {
    cache: quick_cache::sync::Cache<K, Timed<T>>,
    found_ttl: Duration,
    missing_ttl: Duration,
}

impl<K, T> Clone for L1<K, T> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<K, T> std::fmt::Debug for L1<K, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("L1")
            .field("found_ttl", &self.inner.found_ttl)
            .field("missing_ttl", &self.inner.missing_ttl)
            .finish_non_exhaustive()
    }
}

impl<K: Hash + Eq + Clone, T> L1<K, T> {
    /// Holds about `capacity` entries (at least one), found rows for
    /// `found_ttl`, "not found" answers for `missing_ttl`.
    #[must_use]
    pub fn new(capacity: u64, found_ttl: Duration, missing_ttl: Duration) -> Self {
        let capacity = usize::try_from(capacity).unwrap_or(usize::MAX).max(1);
        Self {
            inner: Arc::new(Inner {
                cache: quick_cache::sync::Cache::new(capacity),
                found_ttl,
                missing_ttl,
            }),
        }
    }

    /// The live entry of `key`; an expired one is dropped and misses.
    pub fn get(&self, key: &K) -> Option<Entry<T>> {
        let timed = self.inner.cache.get(key)?;
        if Instant::now() < timed.expires {
            return Some(timed.entry);
        }
        // Only the expired entry: one stored since is kept.
        let _ = self
            .inner
            .cache
            .remove_if(key, |t| t.expires == timed.expires);
        None
    }

    /// Whether `key` has a live entry.
    pub fn contains_key(&self, key: &K) -> bool {
        self.get(key).is_some()
    }

    /// Stores `entry` for `key`, replacing what was there.
    pub fn insert(&self, key: K, entry: Entry<T>) {
        let ttl = match entry {
            Entry::Found(_) => self.inner.found_ttl,
            Entry::Missing => self.inner.missing_ttl,
        };
        // A lifetime too long for the clock is as good as forever.
        let now = Instant::now();
        let expires = now
            .checked_add(ttl)
            .unwrap_or_else(|| now + Duration::from_secs(100 * 365 * 86_400));
        self.inner.cache.insert(key, Timed { entry, expires });
    }

    /// Drops `key`'s entry.
    pub fn invalidate(&self, key: &K) {
        let _ = self.inner.cache.remove(key);
    }

    /// Drops every entry.
    pub fn invalidate_all(&self) {
        self.inner.cache.clear();
    }

    /// Entries held, expired ones not read since included.
    #[must_use]
    pub fn entry_count(&self) -> u64 {
        self.inner.cache.len() as u64
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::L1;
    use crate::cache::{Cached, Entry};

    fn found(n: i64) -> Entry<i64> {
        Entry::Found(Cached::new(n))
    }

    #[test]
    fn an_entry_lives_for_its_kinds_lifetime() {
        // Wide margins: a loaded CI machine may oversleep by far.
        let t0 = std::time::Instant::now();
        let l1 = L1::new(100, Duration::from_secs(3), Duration::from_millis(300));
        l1.insert(1, found(1));
        l1.insert(2, Entry::Missing);
        assert!(matches!(l1.get(&1), Some(Entry::Found(c)) if c.row == 1));
        assert!(matches!(l1.get(&2), Some(Entry::Missing)));
        std::thread::sleep(Duration::from_millis(900));
        assert!(l1.get(&2).is_none(), "the not-found expired");
        // A found row outlives a not-found (unless this machine slept 3 s).
        assert!(l1.contains_key(&1) || t0.elapsed() >= Duration::from_secs(3));
        std::thread::sleep(Duration::from_millis(2400));
        assert!(l1.get(&1).is_none());
        assert_eq!(l1.entry_count(), 0, "expired entries are dropped when read");
    }

    #[test]
    fn a_replacement_gets_a_lifetime_of_its_own() {
        let l1 = L1::new(100, Duration::from_secs(60), Duration::from_millis(200));
        l1.insert(7, Entry::Missing);
        std::thread::sleep(Duration::from_millis(500));
        l1.insert(7, found(7));
        assert!(matches!(l1.get(&7), Some(Entry::Found(_))));
    }

    #[test]
    fn invalidation_and_capacity() {
        let l1 = L1::new(1000, Duration::from_secs(60), Duration::from_secs(60));
        for i in 0..10_000 {
            l1.insert(i, found(i));
        }
        let held = l1.entry_count();
        assert!(
            held > 0 && held <= 1100,
            "bounded near its capacity: {held}"
        );
        let last = 9_999;
        assert!(l1.contains_key(&last), "the newest entry is kept");
        l1.invalidate(&last);
        assert!(!l1.contains_key(&last));
        l1.invalidate_all();
        assert_eq!(l1.entry_count(), 0);
        let shared = l1.clone();
        shared.insert(1, found(1));
        assert!(l1.contains_key(&1), "clones share one cache");
    }
}
