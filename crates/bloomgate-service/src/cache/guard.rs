//! What every Redis command of the tier runs under: a timeout, a circuit
//! breaker (`failsafe`: consecutive failures open it, open periods double
//! up to a cap, half-open probes), and the set of invalidations Redis is
//! still owed.

use super::*;

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
        self.0.state.store(1, Ordering::Relaxed);
        self.0.opened.fetch_add(1, Ordering::Relaxed);
        tracing::warn!("redis breaker opened: reads go to SQL without Redis");
    }
    fn on_half_open(&self) {
        self.0.state.store(2, Ordering::Relaxed);
    }
    fn on_closed(&self) {
        if self.0.state.swap(0, Ordering::Relaxed) != 0 {
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
    /// Keys whose `DEL` after a write failed or was not sent: Redis may
    /// hold an older state for them, so they bypass Redis until the `DEL`
    /// lands.
    pub(super) owed: Owed,
}

/// The owed invalidations, and whether there are any: every lookup asks,
/// and while none are owed (the usual state) it asks an atomic that no
/// one writes instead of locking the set (a lock is a write to one line
/// that every core serving Redis hits would pass back and forth).
#[derive(Debug, Default)]
pub(super) struct Owed {
    keys: Mutex<HashSet<String>>,
    /// `!keys.is_empty()`, stored under the lock after every change.
    any: AtomicBool,
}

impl Owed {
    /// The set, locked; `any` is brought up to date when it is released.
    pub(super) fn lock(&self) -> OwedGuard<'_> {
        OwedGuard {
            keys: crate::sync::lock(&self.keys),
            any: &self.any,
        }
    }

    /// Whether `key`'s invalidation is owed.
    pub(super) fn contains(&self, key: &str) -> bool {
        self.any.load(Ordering::SeqCst) && self.lock().contains(key)
    }
}

/// The locked owed set; on release it records whether any key is left.
pub(super) struct OwedGuard<'a> {
    keys: std::sync::MutexGuard<'a, HashSet<String>>,
    any: &'a AtomicBool,
}

impl std::ops::Deref for OwedGuard<'_> {
    type Target = HashSet<String>;
    fn deref(&self) -> &HashSet<String> {
        &self.keys
    }
}

impl std::ops::DerefMut for OwedGuard<'_> {
    fn deref_mut(&mut self) -> &mut HashSet<String> {
        &mut self.keys
    }
}

impl Drop for OwedGuard<'_> {
    fn drop(&mut self) {
        self.any.store(!self.keys.is_empty(), Ordering::SeqCst);
    }
}

impl Guard {
    pub(super) fn owed(&self) -> OwedGuard<'_> {
        self.owed.lock()
    }

    /// Runs one command under the timeout and the breaker.
    pub(super) async fn run<T>(
        &self,
        counters: &RedisCounters,
        command: impl Future<Output = redis::RedisResult<T>>,
    ) -> Result<T, CacheError> {
        if !self.breaker.is_call_permitted() {
            counters.skipped.fetch_add(1, Ordering::Relaxed);
            return Err(CacheError::BreakerOpen);
        }
        match tokio::time::timeout(self.timeout, command).await {
            Ok(Ok(v)) => {
                self.breaker.on_success();
                Ok(v)
            }
            Ok(Err(e)) => {
                self.breaker.on_error();
                counters.errors.fetch_add(1, Ordering::Relaxed);
                Err(CacheError::Redis(e))
            }
            Err(_) => {
                self.breaker.on_error();
                counters.timeouts.fetch_add(1, Ordering::Relaxed);
                Err(CacheError::Timeout(self.timeout))
            }
        }
    }
}
