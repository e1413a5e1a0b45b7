//! The cache tiers: L1 in process (moka), L2 in Redis.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use moka::future::Cache;
use redis::aio::ConnectionManager;

use crate::model::Sku;

/// The Redis value that marks an id confirmed missing in SQL.
pub const NIL_SENTINEL: &str = "__nil__";

/// A SKU with its JSON encoding, made once when it enters L1, so an L1 hit
/// answers without serialising anything.
#[derive(Debug)]
pub struct CachedSku {
    /// The record.
    pub sku: Sku,
    /// Its JSON, as the API returns it.
    pub json: axum::body::Bytes,
}

impl CachedSku {
    /// Encodes `sku` once.
    #[must_use]
    pub fn new(sku: Sku) -> Arc<Self> {
        let json = serde_json::to_vec(&sku).unwrap_or_default().into();
        Arc::new(Self { sku, json })
    }
}

/// What the read path caches per id: the SKU, or a confirmed "not found".
#[derive(Debug, Clone)]
pub enum Entry {
    /// The SKU exists.
    Found(Arc<CachedSku>),
    /// SQL said no such id.
    Missing,
}

struct EntryExpiry {
    found: Duration,
    missing: Duration,
}

impl moka::Expiry<i64, Entry> for EntryExpiry {
    fn expire_after_create(&self, _: &i64, value: &Entry, _: Instant) -> Option<Duration> {
        Some(match value {
            Entry::Found(_) => self.found,
            Entry::Missing => self.missing,
        })
    }
}

/// The in-process L1 cache: bounded, short-lived, holding found SKUs and
/// recent "not found" answers (with a shorter lifetime).
pub fn new_l1(capacity: u64, found_ttl: Duration, missing_ttl: Duration) -> Cache<i64, Entry> {
    Cache::builder()
        .max_capacity(capacity)
        .expire_after(EntryExpiry {
            found: found_ttl,
            missing: missing_ttl,
        })
        .build()
}

/// What Redis holds for an id.
#[derive(Debug, Clone)]
pub enum RedisLookup {
    /// A SKU value.
    Hit(Sku),
    /// The null sentinel.
    Nil,
    /// Nothing (or an undecodable value, which is deleted).
    Miss,
}

/// Counters of the Redis tier.
#[derive(Debug, Default)]
pub struct RedisCounters {
    /// GETs that found a SKU.
    pub hits: AtomicU64,
    /// GETs that found the sentinel.
    pub nil_hits: AtomicU64,
    /// GETs that found nothing.
    pub misses: AtomicU64,
    /// Commands that failed (the read path then goes to SQL).
    pub errors: AtomicU64,
}

/// The Redis tier: SKU JSON or `__nil__` under `{prefix}sku:{id}`.
#[derive(Clone)]
pub struct RedisTier {
    conn: ConnectionManager,
    prefix: String,
    value_ttl: u64,
    nil_ttl: u64,
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
    /// Connects (with automatic reconnection).
    ///
    /// # Errors
    /// The client's error when the URL is bad or the server unreachable.
    pub async fn connect(
        url: &str,
        prefix: &str,
        value_ttl: u64,
        nil_ttl: u64,
    ) -> redis::RedisResult<Self> {
        let client = redis::Client::open(url)?;
        let config = redis::aio::ConnectionManagerConfig::new()
            .set_connection_timeout(Duration::from_secs(2))
            .set_response_timeout(Duration::from_secs(2))
            .set_number_of_retries(1);
        let conn = ConnectionManager::new_with_config(client, config).await?;
        Ok(Self {
            conn,
            prefix: prefix.to_string(),
            value_ttl,
            nil_ttl,
            counters: Arc::default(),
        })
    }

    /// The key of an id.
    #[must_use]
    pub fn key(&self, id: i64) -> String {
        format!("{}sku:{id}", self.prefix)
    }

    /// GET an id.
    ///
    /// # Errors
    /// Redis errors (counted).
    pub async fn get(&self, id: i64) -> redis::RedisResult<RedisLookup> {
        let mut conn = self.conn.clone();
        let key = self.key(id);
        let raw: Option<String> = redis::cmd("GET")
            .arg(&key)
            .query_async(&mut conn)
            .await
            .inspect_err(|_| {
                self.counters.errors.fetch_add(1, Ordering::Relaxed);
            })?;
        let out = match raw.as_deref() {
            None => RedisLookup::Miss,
            Some(NIL_SENTINEL) => RedisLookup::Nil,
            Some(json) => match serde_json::from_str(json) {
                Ok(sku) => RedisLookup::Hit(sku),
                Err(e) => {
                    tracing::warn!(%key, error = %e, "undecodable cache value; deleting it");
                    let _: redis::RedisResult<()> =
                        redis::cmd("DEL").arg(&key).query_async(&mut conn).await;
                    RedisLookup::Miss
                }
            },
        };
        let c = match out {
            RedisLookup::Hit(_) => &self.counters.hits,
            RedisLookup::Nil => &self.counters.nil_hits,
            RedisLookup::Miss => &self.counters.misses,
        };
        c.fetch_add(1, Ordering::Relaxed);
        Ok(out)
    }

    /// Stores a SKU (overwriting a sentinel) with a jittered TTL.
    ///
    /// # Errors
    /// Redis errors (counted).
    pub async fn put(&self, sku: &Sku) -> redis::RedisResult<()> {
        let mut conn = self.conn.clone();
        let json = serde_json::to_string(sku).unwrap_or_default();
        redis::cmd("SET")
            .arg(self.key(sku.id))
            .arg(json)
            .arg("EX")
            .arg(jittered(self.value_ttl))
            .query_async(&mut conn)
            .await
            .inspect_err(|_| {
                self.counters.errors.fetch_add(1, Ordering::Relaxed);
            })
    }

    /// Stores many SKUs in one pipelined round trip.
    ///
    /// # Errors
    /// Redis errors (counted).
    pub async fn put_many(&self, skus: &[Sku]) -> redis::RedisResult<()> {
        let mut conn = self.conn.clone();
        let mut pipe = redis::pipe();
        for sku in skus {
            let json = serde_json::to_string(sku).unwrap_or_default();
            pipe.cmd("SET")
                .arg(self.key(sku.id))
                .arg(json)
                .arg("EX")
                .arg(jittered(self.value_ttl))
                .ignore();
        }
        pipe.query_async(&mut conn).await.inspect_err(|_| {
            self.counters.errors.fetch_add(1, Ordering::Relaxed);
        })
    }

    /// Writes the `__nil__` sentinel with `SET NX EX`: it never overwrites a
    /// real value that another request stored meanwhile.
    ///
    /// # Errors
    /// Redis errors (counted).
    pub async fn put_nil(&self, id: i64) -> redis::RedisResult<()> {
        let mut conn = self.conn.clone();
        let _: Option<String> = redis::cmd("SET")
            .arg(self.key(id))
            .arg(NIL_SENTINEL)
            .arg("NX")
            .arg("EX")
            .arg(jittered(self.nil_ttl))
            .query_async(&mut conn)
            .await
            .inspect_err(|_| {
                self.counters.errors.fetch_add(1, Ordering::Relaxed);
            })?;
        Ok(())
    }

    /// Deletes an id's entry (value or sentinel).
    ///
    /// # Errors
    /// Redis errors (counted).
    pub async fn invalidate(&self, id: i64) -> redis::RedisResult<()> {
        let mut conn = self.conn.clone();
        redis::cmd("DEL")
            .arg(self.key(id))
            .query_async(&mut conn)
            .await
            .inspect_err(|_| {
                self.counters.errors.fetch_add(1, Ordering::Relaxed);
            })
    }

    /// Number of keys in the selected Redis database (`DBSIZE`).
    ///
    /// # Errors
    /// Redis errors.
    pub async fn key_count(&self) -> redis::RedisResult<u64> {
        let mut conn = self.conn.clone();
        redis::cmd("DBSIZE").query_async(&mut conn).await
    }
}
