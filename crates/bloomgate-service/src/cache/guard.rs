//! What every Redis command of the tier runs under: a timeout, a circuit
//! breaker (`failsafe`: consecutive failures open it, open periods double
//! up to a cap, half-open probes), and the set of invalidations Redis is
//! still owed.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use bloomgate_redis::Conn;

use crate::cache::{CacheError, RedisCounters};
use crate::redis_link::query_each;

/// The breaker's state, for stats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BreakerState {
    /// Commands are sent.
    Closed,
    /// Commands are not sent until the open period ends.
    Open,
    /// The open period ended: the next commands probe Redis.
    HalfOpen,
}

/// Records the breaker's transitions (failsafe calls it on each one).
#[derive(Debug, Default)]
pub(super) struct WatchInner {
    pub(super) state: AtomicU8,
    pub(super) opened: AtomicU64,
}

#[derive(Debug, Default, Clone)]
pub(super) struct BreakerWatch(pub(super) Arc<WatchInner>);

impl failsafe::Instrument for BreakerWatch {
    fn on_call_rejected(&self) {}
    fn on_open(&self) {
        // SeqCst: `Guard::succeeded` orders its `clean` against it.
        self.0.state.store(1, Ordering::SeqCst);
        self.0.opened.fetch_add(1, Ordering::Relaxed);
        tracing::warn!("redis breaker opened: reads go to SQL without Redis");
    }
    fn on_half_open(&self) {
        self.0.state.store(2, Ordering::SeqCst);
    }
    fn on_closed(&self) {
        if self.0.state.swap(0, Ordering::SeqCst) != 0 {
            tracing::info!("redis breaker closed: Redis answers again");
        }
    }
}

/// Open periods that double from `next` up to `max` (failsafe's own
/// exponential backoff starts at one second at least; ours may be shorter).
#[derive(Debug, Clone)]
pub(super) struct Doubling {
    pub(super) next: Duration,
    pub(super) max: Duration,
}

impl Iterator for Doubling {
    type Item = Duration;
    fn next(&mut self) -> Option<Duration> {
        let now = self.next;
        self.next = (self.next * 2).min(self.max);
        Some(now)
    }
}

pub(super) type Breaker =
    failsafe::StateMachine<failsafe::failure_policy::ConsecutiveFailures<Doubling>, BreakerWatch>;

/// The timeout, the breaker and the invalidations Redis is still owed,
/// shared by every clone of a [`RedisTier`].
#[derive(Debug)]
pub(super) struct Guard {
    pub(super) timeout: Duration,
    pub(super) breaker: Breaker,
    pub(super) watch: BreakerWatch,
    /// The breaker is closed and counts no failure: a command needs
    /// neither its permission nor its record of a success. failsafe keeps
    /// its state under one mutex, locked twice per command; every core
    /// serving Redis hits passed that lock's line back and forth.
    pub(super) clean: AtomicBool,
    /// Keys whose `DEL` after a write failed or was not sent: Redis may
    /// hold an older state for them, so they bypass Redis until the `DEL`
    /// lands.
    pub(super) owed: Owed,
}

/// The owed invalidations, each with the number of the failed `DEL` that
/// owes it last, and whether there are any. Every lookup asks; while none
/// are owed (the usual state) it reads an atomic that only a change of the
/// set writes, instead of locking the set (a lock is a write to a line
/// that every core serving Redis would pass back and forth).
///
/// The numbers keep a newer failure owed: the deliverer removes a key
/// only if no `DEL` failed for it again since its snapshot. Without them,
/// a write whose `DEL` failed while an older owed `DEL` of the same key
/// was being delivered would have its debt erased with the older one, and
/// reads would go back to a Redis that may hold a fill older than it.
#[derive(Debug, Default)]
pub(super) struct Owed {
    keys: Mutex<OwedKeys>,
    /// Whether `keys` holds any, stored under its lock on every change.
    any: AtomicBool,
}

#[derive(Debug, Default)]
struct OwedKeys {
    by_key: HashMap<String, u64>,
    next: u64,
}

impl Owed {
    fn change(&self, f: impl FnOnce(&mut OwedKeys)) {
        let mut keys = crate::sync::lock(&self.keys);
        f(&mut keys);
        self.any.store(!keys.by_key.is_empty(), Ordering::SeqCst);
    }

    /// Records failed `DEL`s of `keys`.
    pub(super) fn owe(&self, keys: impl IntoIterator<Item = String>) {
        self.change(|o| {
            for key in keys {
                o.next += 1;
                o.by_key.insert(key, o.next);
            }
        });
    }

    /// Whether `key`'s invalidation is owed.
    pub(super) fn contains(&self, key: &str) -> bool {
        self.any.load(Ordering::SeqCst) && crate::sync::lock(&self.keys).by_key.contains_key(key)
    }

    /// For each of `keys`, whether its invalidation is owed (one lock).
    pub(super) fn contains_each<'a>(
        &self,
        keys: impl IntoIterator<Item = &'a String>,
    ) -> Vec<bool> {
        let owed = crate::sync::lock(&self.keys);
        keys.into_iter()
            .map(|k| owed.by_key.contains_key(k))
            .collect()
    }

    /// How many are owed.
    pub(super) fn len(&self) -> usize {
        crate::sync::lock(&self.keys).by_key.len()
    }

    /// Up to `n` owed keys with their numbers, for delivery.
    pub(super) fn snapshot(&self, n: usize) -> Vec<(String, u64)> {
        if !self.any.load(Ordering::SeqCst) {
            return Vec::new();
        }
        let owed = crate::sync::lock(&self.keys);
        owed.by_key
            .iter()
            .take(n)
            .map(|(k, &g)| (k.clone(), g))
            .collect()
    }

    /// Drops the keys of a delivered snapshot, except those owed again
    /// since (a newer number).
    pub(super) fn settle(&self, delivered: &[(String, u64)]) {
        self.change(|o| {
            for (key, number) in delivered {
                if o.by_key.get(key) == Some(number) {
                    o.by_key.remove(key);
                }
            }
        });
    }
}

impl Guard {
    /// Runs one command under the timeout and the breaker.
    pub(super) async fn run<T>(
        &self,
        counters: &RedisCounters,
        command: impl Future<Output = redis::RedisResult<T>>,
    ) -> Result<T, CacheError> {
        let clean = self.clean.load(Ordering::SeqCst);
        if !clean && !self.breaker.is_call_permitted() {
            counters.skipped.fetch_add(1, Ordering::Relaxed);
            return Err(CacheError::BreakerOpen);
        }
        match tokio::time::timeout(self.timeout, command).await {
            Ok(Ok(v)) => {
                if !clean {
                    self.succeeded();
                }
                Ok(v)
            }
            Ok(Err(e)) => {
                self.failed();
                counters.errors.fetch_add(1, Ordering::Relaxed);
                Err(CacheError::Redis(e))
            }
            Err(_) => {
                self.failed();
                counters.timeouts.fetch_add(1, Ordering::Relaxed);
                Err(CacheError::Timeout(self.timeout))
            }
        }
    }

    /// A success while not clean: failsafe records it (closing a
    /// half-open breaker, clearing the failure count), and a closed
    /// breaker is clean again. The second look at the state undoes a
    /// `clean` stored while another command's failure opened the
    /// breaker: that failure opens it (state 1) before it stores
    /// `clean = false`, all in one order (SeqCst), so either this look
    /// sees it open, or that store comes after this one. (A failure that
    /// does not open the breaker may still be overtaken so: its count
    /// then outlives this success, and the breaker opens one failure
    /// early, once.)
    fn succeeded(&self) {
        self.breaker.on_success();
        if self.watch.0.state.load(Ordering::SeqCst) == 0 {
            self.clean.store(true, Ordering::SeqCst);
            if self.watch.0.state.load(Ordering::SeqCst) != 0 {
                self.clean.store(false, Ordering::SeqCst);
            }
        }
    }

    /// A failure: failsafe counts it (and may open the breaker), then the
    /// commands that follow ask it again.
    fn failed(&self) {
        self.breaker.on_error();
        self.clean.store(false, Ordering::SeqCst);
    }
}

/// Delivers owed invalidations (`DEL`s that failed) every 100 ms while
/// there are any, until the tier is dropped.
pub(super) async fn deliver_owed(guard: Weak<Guard>, conn: Conn, counters: Arc<RedisCounters>) {
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let Some(guard) = guard.upgrade() else {
            return;
        };
        let owed = guard.owed.snapshot(1000);
        if owed.is_empty() {
            continue;
        }
        // Read every reply (no `ignore()`), so success means Redis ran
        // every DEL, not only that the pipeline was written.
        let dels = owed
            .iter()
            .map(|(key, _)| {
                let mut cmd = redis::cmd("DEL");
                cmd.arg(key);
                cmd
            })
            .collect();
        let sent: Result<Vec<i64>, CacheError> =
            guard.run(&counters, query_each(&conn, dels)).await;
        counters.owed_rounds.fetch_add(1, Ordering::Relaxed);
        if sent.is_ok() {
            guard.owed.settle(&owed);
            tracing::info!(delivered = owed.len(), "owed redis invalidations delivered");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn guard(failures: u32, open: Duration) -> Guard {
        let watch = BreakerWatch::default();
        let policy = failsafe::failure_policy::consecutive_failures(
            failures,
            Doubling {
                next: open,
                max: open,
            },
        );
        Guard {
            timeout: Duration::from_secs(5),
            breaker: failsafe::Config::new()
                .failure_policy(policy)
                .instrument(watch.clone())
                .build(),
            watch,
            clean: AtomicBool::new(true),
            owed: Owed::default(),
        }
    }

    async fn ok(g: &Guard, c: &RedisCounters) -> Result<u8, CacheError> {
        g.run(c, async { Ok(1) }).await
    }

    async fn fail(g: &Guard, c: &RedisCounters) -> Result<u8, CacheError> {
        g.run(c, async {
            Err(redis::RedisError::from((
                redis::ErrorKind::IoError,
                "refused",
            )))
        })
        .await
    }

    #[tokio::test]
    async fn the_breaker_opens_and_closes_past_the_clean_fast_path() {
        let (g, c) = (
            guard(2, Duration::from_millis(50)),
            RedisCounters::default(),
        );
        assert!(ok(&g, &c).await.is_ok());
        assert!(g.clean.load(Ordering::SeqCst));
        // One failure: not clean, not open; a success clears it.
        assert!(matches!(fail(&g, &c).await, Err(CacheError::Redis(_))));
        assert!(!g.clean.load(Ordering::SeqCst));
        assert!(ok(&g, &c).await.is_ok());
        assert!(g.clean.load(Ordering::SeqCst));
        // Two in a row open it: commands are skipped, not sent.
        assert!(fail(&g, &c).await.is_err());
        assert!(fail(&g, &c).await.is_err());
        assert_eq!(g.watch.0.state.load(Ordering::SeqCst), 1);
        assert!(matches!(ok(&g, &c).await, Err(CacheError::BreakerOpen)));
        assert_eq!(c.skipped.load(Ordering::Relaxed), 1);
        assert_eq!(c.errors.load(Ordering::Relaxed), 3);
        // After the open period a probe goes through and closes it.
        tokio::time::sleep(Duration::from_millis(80)).await;
        assert!(ok(&g, &c).await.is_ok());
        assert_eq!(g.watch.0.state.load(Ordering::SeqCst), 0);
        assert!(g.clean.load(Ordering::SeqCst));
        assert_eq!(g.watch.0.opened.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn a_delivery_settles_only_the_debts_it_saw() {
        let owed = Owed::default();
        assert!(!owed.contains("k"));
        assert!(owed.snapshot(10).is_empty());
        owed.owe(["k".to_owned(), "j".to_owned()]);
        assert!(owed.contains("k") && owed.contains("j"));
        let sent = owed.snapshot(10);
        assert_eq!(sent.len(), 2);
        // A newer write's DEL of k fails while the snapshot is delivered.
        owed.owe(["k".to_owned()]);
        owed.settle(&sent);
        assert!(
            owed.contains("k"),
            "the newer debt survives the older delivery"
        );
        assert!(!owed.contains("j"));
        assert_eq!(owed.len(), 1);
        owed.settle(&owed.snapshot(10));
        assert!(!owed.contains("k"));
        assert_eq!(owed.len(), 0);
        assert!(owed.snapshot(10).is_empty());
        assert_eq!(owed.contains_each(&["k".to_owned()]), [false]);
    }
}
