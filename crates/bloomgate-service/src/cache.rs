//! The cache tiers: L1 in process ([`l1`]), L2 in Redis.
//!
//! Redis values are written only by a reader that holds a *lease* on the
//! key (after Facebook's "Scaling Memcache at Facebook", §3.2.1): a reader
//! whose `GET` finds nothing sets a lease token on the key (with a script
//! that reads the key again and sets the token in one step) and,
//! after reading SQL, replaces the value only if its own token is still
//! there. Every write deletes the key after its SQL commit, which removes
//! any lease, so a reader that read SQL before the commit can no longer
//! write what it read. ARCHITECTURE.md spells out why this is enough.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bloomgate_redis::Conn;

use crate::redis_link::{query_each, RedisTarget};

use crate::config::CacheConfig;
use crate::model::Sku;

mod absent;
mod guard;
mod l1;
mod lease;
mod lookup;
mod sweep;

pub use absent::{AbsentCounters, AbsentMemory, Positions, Recall, Ticket, CLOCK_MARGIN_MS};

pub use crate::wire::{resource_namespace, SKU_NAMESPACE};
pub use guard::BreakerState;
use guard::{deliver_owed, BreakerWatch, Doubling, Guard, Owed};
pub use l1::L1;
pub use lease::{Lease, LEASE_MS, LEASE_PREFIX};
use lease::{FILL_IF_LEASED, LEASE_IF_EMPTY, LEASE_IF_HOLDS, LOOKUP_OR_LEASE};
pub use lookup::Reach;

/// The Redis value that marks an id confirmed missing in SQL.
pub const NIL_SENTINEL: &str = "__nil__";

/// A row with its JSON encoding, made once when it enters L1, so an L1 hit
/// answers without serialising anything.
#[derive(Debug)]
pub struct Cached<T> {
    /// The record.
    pub row: T,
    /// Its JSON, as the API returns it.
    pub json: bytes::Bytes,
}

impl<T> Cached<T> {
    /// A response body holding a copy of the JSON. A copy, not a clone of
    /// `json`: a clone bumps one reference count that every core serving
    /// this row writes, and the bytes beside it, which the kernel then
    /// reads to send, bounce between the cores with it (`perf` showed the
    /// kernel's copy of an L1 hit's body costing about half as much with
    /// copies: BENCHMARKS.md).
    #[must_use]
    pub fn body(&self) -> bytes::Bytes {
        bytes::Bytes::copy_from_slice(&self.json)
    }
}

impl<T: serde::Serialize> Cached<T> {
    /// Encodes `row` once.
    #[must_use]
    pub fn new(row: T) -> Arc<Self> {
        let json = serde_json::to_vec(&row).unwrap_or_default().into();
        Arc::new(Self { row, json })
    }
}

/// A SKU with its JSON.
pub type CachedSku = Cached<Sku>;

/// A row as the caches hold it, read back from a cached value's JSON.
pub trait CachedRow: serde::Serialize + serde::de::DeserializeOwned {
    /// `raw` as a row: serde's reading, unless the type has a faster one
    /// that accepts exactly the same.
    ///
    /// # Errors
    /// What serde says of a value that is not such a row.
    fn from_json(raw: &[u8]) -> serde_json::Result<Self> {
        serde_json::from_slice(raw)
    }
}

impl CachedRow for crate::source::Row {}

impl CachedRow for Sku {
    /// The SKU's own encoding without serde's field matching
    /// ([`crate::model::canonical`]); serde reads anything else.
    fn from_json(raw: &[u8]) -> serde_json::Result<Self> {
        crate::model::canonical(raw).map_or_else(|| serde_json::from_slice(raw), Ok)
    }
}

/// What the read path caches per key: the row, or a confirmed "not found".
#[derive(Debug)]
pub enum Entry<T = Sku> {
    /// The row exists.
    Found(Arc<Cached<T>>),
    /// The source said no such key.
    Missing,
}

impl<T> Clone for Entry<T> {
    fn clone(&self) -> Self {
        match self {
            Self::Found(c) => Self::Found(Arc::clone(c)),
            Self::Missing => Self::Missing,
        }
    }
}

/// What Redis holds for a key.
#[derive(Debug, Clone)]
pub enum RedisLookup<T = Sku> {
    /// A value.
    Hit(T),
    /// The null sentinel.
    Nil,
    /// Nothing usable: with `Some(lease)` this reader may fill the key; with
    /// `None` another reader holds the lease (or the value was undecodable
    /// and was deleted), so this one reads SQL without writing back.
    Miss(Option<Lease>),
}

impl<T> Default for RedisLookup<T> {
    /// A miss without a lease.
    fn default() -> Self {
        Self::Miss(None)
    }
}

/// Counters of the Redis tier.
#[derive(Debug, Default)]
pub struct RedisCounters {
    /// Lookups that found a SKU (sharded, as every counter a hit
    /// passes: one shared atomic would bounce between the cores serving).
    pub hits: crate::metrics::Counter,
    /// Lookups that found the sentinel.
    pub nil_hits: crate::metrics::Counter,
    /// Lookups that found nothing (or another reader's lease).
    pub misses: crate::metrics::Counter,
    /// Fills refused because a write (or expiry) took the lease away.
    pub fills_refused: AtomicU64,
    /// Keys written by fills and warms (values and null sentinels).
    pub keys_written: AtomicU64,
    /// Commands that failed (the read path then goes to SQL).
    pub errors: AtomicU64,
    /// Commands that took longer than `cache.redis_timeout_ms`.
    pub timeouts: AtomicU64,
    /// Commands not sent because the breaker was open.
    pub skipped: AtomicU64,
    /// Rounds of owed invalidations the background task tried to deliver
    /// (each a pipeline of `DEL`s, or skipped by the open breaker).
    pub owed_rounds: AtomicU64,
}

/// Why a Redis command gave no answer. The read path treats every one
/// alike: go on to SQL.
#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    /// The breaker is open: the command was not sent.
    #[error("redis breaker open")]
    BreakerOpen,
    /// No answer within the timeout.
    #[error("redis command timed out after {0:?}")]
    Timeout(Duration),
    /// Redis answered with an error, or the connection failed.
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
}

/// The Redis tier: row JSON, `__nil__` or a lease under
/// `{prefix}{namespace}{key}` (`{prefix}sku:{id}` for SKUs). Every command
/// runs under a timeout and a circuit breaker (failsafe), shared by every
/// namespace ([`RedisTier::namespaced`]).
#[derive(Clone)]
pub struct RedisTier {
    conn: Conn,
    prefix: String,
    namespace: Arc<str>,
    value_ttl: u64,
    nil_ttl: u64,
    lookup_or_lease: Arc<redis::Script>,
    fill_if_leased: Arc<redis::Script>,
    guard: Arc<Guard>,
    /// Counters, shared by clones.
    pub counters: Arc<RedisCounters>,
}

impl std::fmt::Debug for RedisTier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisTier")
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

/// `base` seconds ± 10%, at least 1.
#[must_use]
pub fn jittered(base: u64) -> u64 {
    let spread = base / 10;
    if spread == 0 {
        return base.max(1);
    }
    (base - spread + fastrand::u64(0..=2 * spread)).max(1)
}

impl RedisTier {
    /// Connects (with automatic reconnection) and starts the task that
    /// delivers owed invalidations once Redis answers again.
    ///
    /// # Errors
    /// The client's error when the URL is bad or the server unreachable.
    pub async fn connect(
        target: &RedisTarget,
        c: &CacheConfig,
        bg: &crate::tasks::Background,
    ) -> redis::RedisResult<Self> {
        let timeout = Duration::from_millis(c.redis_timeout_ms);
        // Every command of the tier runs under the guard's timeout.
        let conn = target
            .connect_guarded(timeout.max(Duration::from_millis(200)))
            .await?;
        let watch = BreakerWatch::default();
        let policy = failsafe::failure_policy::consecutive_failures(
            c.redis_breaker_failures,
            Doubling {
                next: Duration::from_millis(c.redis_breaker_open_ms),
                max: Duration::from_millis(c.redis_breaker_max_open_ms),
            },
        );
        let breaker = failsafe::Config::new()
            .failure_policy(policy)
            .instrument(watch.clone())
            .build();
        let tier = Self {
            conn,
            prefix: c.redis_prefix.clone(),
            namespace: Arc::from(SKU_NAMESPACE),
            value_ttl: c.redis_ttl_secs,
            nil_ttl: c.redis_nil_ttl_secs,
            lookup_or_lease: Arc::new(redis::Script::new(LOOKUP_OR_LEASE)),
            fill_if_leased: Arc::new(redis::Script::new(FILL_IF_LEASED)),
            guard: Arc::new(Guard {
                timeout,
                breaker,
                watch,
                clean: AtomicBool::new(true),
                owed: Owed::default(),
            }),
            counters: Arc::default(),
        };
        bg.spawn(deliver_owed(
            Arc::downgrade(&tier.guard),
            tier.conn.clone(),
            Arc::clone(&tier.counters),
        ));
        Ok(tier)
    }

    /// The same connection, breaker and owed invalidations, for keys under
    /// `{prefix}{namespace}`, with counters of its own.
    #[must_use]
    pub fn namespaced(&self, namespace: &str) -> Self {
        Self {
            namespace: Arc::from(namespace),
            counters: Arc::default(),
            ..self.clone()
        }
    }

    async fn guarded<T>(
        &self,
        command: impl Future<Output = redis::RedisResult<T>>,
    ) -> Result<T, CacheError> {
        self.guard.run(&self.counters, command).await
    }

    /// The breaker's state.
    #[must_use]
    pub fn breaker_state(&self) -> BreakerState {
        match self.guard.watch.0.state.load(Ordering::Relaxed) {
            1 => BreakerState::Open,
            2 => BreakerState::HalfOpen,
            _ => BreakerState::Closed,
        }
    }

    /// Times the breaker opened.
    #[must_use]
    pub fn breaker_opened(&self) -> u64 {
        self.guard.watch.0.opened.load(Ordering::Relaxed)
    }

    /// Invalidations Redis is still owed.
    #[must_use]
    pub fn owed_invalidations(&self) -> usize {
        self.guard.owed.len()
    }

    /// The Redis key of a row's key.
    #[must_use]
    pub fn key(&self, id: impl std::fmt::Display) -> String {
        use std::fmt::Write;
        // Sized once: `format!` would start empty and grow two or three
        // times on every read.
        let mut key = String::with_capacity(self.prefix.len() + self.namespace.len() + 24);
        key.push_str(&self.prefix);
        key.push_str(&self.namespace);
        let _ = write!(key, "{id}");
        key
    }

    fn value_of<T: serde::Serialize>(&self, sku: Option<&T>) -> (String, u64) {
        match sku {
            Some(sku) => (
                serde_json::to_string(sku).unwrap_or_default(),
                jittered(self.value_ttl),
            ),
            None => (NIL_SENTINEL.to_string(), jittered(self.nil_ttl)),
        }
    }

    /// Stores what SQL said about an id (the SKU, or `__nil__` for none)
    /// if `lease` is still on its key. Returns false when the lease was
    /// lost: a write deleted the key since the lookup (or the lease expired).
    ///
    /// # Errors
    /// [`CacheError`] (counted).
    pub async fn fill<T: serde::Serialize>(
        &self,
        id: impl std::fmt::Display,
        lease: &Lease,
        sku: Option<&T>,
    ) -> Result<bool, CacheError> {
        let mut conn = self.conn.clone();
        let (value, ttl) = self.value_of(sku);
        let filled: i64 = self
            .guarded(
                self.fill_if_leased
                    .key(self.key(id))
                    .arg(&lease.token)
                    .arg(value)
                    .arg(ttl)
                    .invoke_async(&mut conn),
            )
            .await?;
        let counter = if filled == 0 {
            &self.counters.fills_refused
        } else {
            &self.counters.keys_written
        };
        counter.fetch_add(1, Ordering::Relaxed);
        Ok(filled == 1)
    }

    /// Takes leases on the keys of `ids` that hold nothing, in one
    /// pipelined round trip; `None` for keys that hold something already
    /// (or whose invalidation is owed).
    ///
    /// # Errors
    /// [`CacheError`] (counted).
    pub async fn lease_many<K: std::fmt::Display>(
        &self,
        ids: &[K],
    ) -> Result<Vec<Option<Lease>>, CacheError> {
        let leases: Vec<Lease> = ids.iter().map(|_| Lease::new()).collect();
        let keys: Vec<String> = ids.iter().map(|id| self.key(id)).collect();
        let cmds = keys
            .iter()
            .zip(&leases)
            .map(|(key, lease)| {
                let mut cmd = redis::cmd("EVAL");
                cmd.arg(LEASE_IF_EMPTY)
                    .arg(1)
                    .arg(key)
                    .arg(&lease.token)
                    .arg(LEASE_MS);
                cmd
            })
            .collect();
        let got: Vec<i64> = self.guarded(query_each(&self.conn, cmds)).await?;
        let owed = self.guard.owed.contains_each(&keys);
        Ok(leases
            .into_iter()
            .zip(got)
            .zip(owed)
            .map(|((l, g), owed)| (g == 1 && !owed).then_some(l))
            .collect())
    }

    /// Fills many leased keys with rows in one pipelined round trip;
    /// returns how many were written (the rest lost their lease to a write).
    ///
    /// # Errors
    /// [`CacheError`] (counted).
    pub async fn fill_many<K: std::fmt::Display, T: serde::Serialize>(
        &self,
        items: &[(&Lease, K, &T)],
    ) -> Result<u64, CacheError> {
        let cmds = items
            .iter()
            .map(|(lease, id, row)| {
                let (value, ttl) = self.value_of(Some(*row));
                let mut cmd = redis::cmd("EVAL");
                cmd.arg(FILL_IF_LEASED)
                    .arg(1)
                    .arg(self.key(id))
                    .arg(&lease.token)
                    .arg(value)
                    .arg(ttl);
                cmd
            })
            .collect();
        let filled: Vec<i64> = self.guarded(query_each(&self.conn, cmds)).await?;
        let written = filled.iter().filter(|&&f| f == 1).count() as u64;
        self.counters
            .fills_refused
            .fetch_add(items.len() as u64 - written, Ordering::Relaxed);
        self.counters
            .keys_written
            .fetch_add(written, Ordering::Relaxed);
        Ok(written)
    }

    /// Deletes an id's entry (value, sentinel or lease). Every SQL write
    /// calls this after its commit. When the `DEL` fails (or the breaker
    /// is open) the id is remembered: reads bypass Redis for it, and a
    /// background task delivers the `DEL` once Redis answers again.
    ///
    /// # Errors
    /// [`CacheError`] (counted); the invalidation is then owed.
    pub async fn invalidate(&self, id: impl std::fmt::Display) -> Result<(), CacheError> {
        let mut conn = self.conn.clone();
        let key = self.key(id);
        let res: Result<(), CacheError> = self
            .guarded(redis::cmd("DEL").arg(&key).query_async(&mut conn))
            .await;
        if res.is_err() {
            self.guard.owed.owe([key]);
        }
        res
    }

    /// [`RedisTier::invalidate`] for many keys in one round trip (one
    /// pipeline on a server, concurrent `DEL`s on a cluster). On failure
    /// every key is owed.
    ///
    /// # Errors
    /// [`CacheError`] (counted); the invalidations are then owed.
    pub async fn invalidate_many<K: std::fmt::Display>(&self, ids: &[K]) -> Result<(), CacheError> {
        if ids.is_empty() {
            return Ok(());
        }
        let keys: Vec<String> = ids.iter().map(|id| self.key(id)).collect();
        let cmds = keys
            .iter()
            .map(|k| {
                let mut cmd = redis::cmd("DEL");
                cmd.arg(k);
                cmd
            })
            .collect();
        let res: Result<Vec<i64>, CacheError> = self.guarded(query_each(&self.conn, cmds)).await;
        if res.is_err() {
            self.guard.owed.owe(keys);
        }
        res.map(drop)
    }

    /// The value under an id's key; none for a key whose invalidation
    /// Redis is still owed (it may hold the key's older state).
    ///
    /// # Errors
    /// [`CacheError`].
    pub async fn peek(&self, id: impl std::fmt::Display) -> Result<Option<Vec<u8>>, CacheError> {
        let key = self.key(id);
        if self.guard.owed.contains(&key) {
            return Ok(None);
        }
        let mut conn = self.conn.clone();
        self.guarded(redis::cmd("GET").arg(key).query_async(&mut conn))
            .await
    }

    /// Leases an id's key only while it still holds `held` (no `DEL` landed
    /// since it was read: a change whose `DEL` is still owed does not stop
    /// it, its instance's own `forget_local` does); `None` otherwise.
    ///
    /// # Errors
    /// [`CacheError`] (counted).
    pub async fn lease_if_holds(
        &self,
        id: impl std::fmt::Display,
        held: &[u8],
    ) -> Result<Option<Lease>, CacheError> {
        let (key, new) = (self.key(id), Lease::new());
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(LEASE_IF_HOLDS).arg(1).arg(&key).arg(held);
        cmd.arg(&new.token).arg(LEASE_MS);
        let took: i64 = self
            .guarded(cmd.query_async(&mut self.conn.clone()))
            .await?;
        Ok((took == 1 && !self.guard.owed.contains(&key)).then_some(new))
    }

    /// The raw value under an id's key (for inspection and tests).
    ///
    /// # Errors
    /// [`CacheError`].
    pub async fn raw(&self, id: impl std::fmt::Display) -> Result<Option<String>, CacheError> {
        let mut conn = self.conn.clone();
        self.guarded(redis::cmd("GET").arg(self.key(id)).query_async(&mut conn))
            .await
    }

    /// Number of keys in the selected Redis database (`DBSIZE`).
    ///
    /// # Errors
    /// [`CacheError`].
    pub async fn key_count(&self) -> Result<u64, CacheError> {
        let mut conn = self.conn.clone();
        self.guarded(redis::cmd("DBSIZE").query_async(&mut conn))
            .await
    }
}
