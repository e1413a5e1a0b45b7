//! The read path: filter → L1 → Redis → SQL, each level counted.

use std::sync::Arc;

use moka::future::Cache;

use crate::cache::{CachedSku, Entry, RedisLookup, RedisTier};
use crate::error::AppError;
use crate::gate::{Gate, Verdict};
use crate::metrics::Counter;
use crate::store::SkuStore;

/// L1 counters.
#[derive(Debug, Default)]
pub struct L1Counters {
    /// Lookups answered by a cached SKU.
    pub hits: Counter,
    /// Lookups answered by a cached "not found".
    pub negative_hits: Counter,
    /// Lookups that went on to Redis/SQL (or joined such a load).
    pub misses: Counter,
}

/// Where an answer came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// The Bloom filter said no.
    Filter,
    /// The in-process cache.
    L1,
    /// Redis or SQL, through one shared load.
    Load,
}

/// The reader's answer for an id.
#[derive(Debug, Clone)]
pub enum Lookup {
    /// The SKU.
    Found(Arc<CachedSku>, Source),
    /// No such SKU.
    Missing(Source),
}

/// The shielded read path for SKU details.
#[derive(Debug, Clone)]
pub struct ShieldedReader {
    /// The Bloom gate.
    pub gate: Arc<Gate>,
    /// The L1 cache.
    pub l1: Cache<i64, Entry>,
    /// The Redis tier, when configured.
    pub redis: Option<RedisTier>,
    /// The SQL store.
    pub store: SkuStore,
    /// L1 counters.
    pub l1_counters: Arc<L1Counters>,
}

impl ShieldedReader {
    /// Looks an id up through the funnel.
    ///
    /// # Errors
    /// [`AppError::Unavailable`] when SQL fails (never cached).
    pub async fn lookup(&self, id: i64) -> Result<Lookup, AppError> {
        if self.gate.check(id) == Verdict::Reject {
            return Ok(Lookup::Missing(Source::Filter));
        }
        if let Some(entry) = self.l1.get(&id).await {
            return Ok(match entry {
                Entry::Found(sku) => {
                    self.l1_counters.hits.incr();
                    Lookup::Found(sku, Source::L1)
                }
                Entry::Missing => {
                    self.l1_counters.negative_hits.incr();
                    Lookup::Missing(Source::L1)
                }
            });
        }
        self.l1_counters.misses.incr();
        // moka runs one loader per key; concurrent misses wait for it and
        // share its result (single flight). Errors are not cached.
        let entry = self
            .l1
            .try_get_with(id, self.load(id))
            .await
            .map_err(|e| AppError::Unavailable(e.to_string()))?;
        Ok(match entry {
            Entry::Found(sku) => Lookup::Found(sku, Source::Load),
            Entry::Missing => Lookup::Missing(Source::Load),
        })
    }

    /// Redis, then SQL with write-back. Redis failures degrade to SQL.
    async fn load(&self, id: i64) -> Result<Entry, crate::store::StoreError> {
        if let Some(redis) = &self.redis {
            match redis.get(id).await {
                Ok(RedisLookup::Hit(sku)) => return Ok(Entry::Found(CachedSku::new(sku))),
                Ok(RedisLookup::Nil) => return Ok(Entry::Missing),
                Ok(RedisLookup::Miss) => {}
                Err(e) => tracing::warn!(id, error = %e, "redis GET failed; reading SQL"),
            }
        }
        let found = self.store.get(id).await?;
        if let Some(redis) = &self.redis {
            let res = match &found {
                Some(sku) => redis.put(sku).await,
                None => redis.put_nil(id).await,
            };
            if let Err(e) = res {
                tracing::warn!(id, error = %e, "redis write-back failed");
            }
        }
        Ok(found.map_or(Entry::Missing, |sku| Entry::Found(CachedSku::new(sku))))
    }

    /// Drops an id from L1 and Redis (after a write).
    pub async fn invalidate(&self, id: i64) {
        self.l1.invalidate(&id).await;
        if let Some(redis) = &self.redis {
            if let Err(e) = redis.invalidate(id).await {
                tracing::warn!(id, error = %e, "redis DEL failed; the entry expires with its TTL");
            }
        }
    }
}
