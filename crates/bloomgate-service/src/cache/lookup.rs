//! Reading a key of the Redis tier: a plain `GET`, the lease script, or
//! both in turn, each answer counted once (hit, nil or miss).

use std::sync::Arc;

use super::{
    CacheError, Cached, CachedRow, Lease, RedisLookup, RedisTier, LEASE_MS, LEASE_PREFIX,
    NIL_SENTINEL,
};

/// How far a lookup goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reach {
    /// A `GET` alone: a key that holds nothing is answered `None` and not
    /// counted (the caller goes on to [`Reach::Lease`]).
    Get,
    /// The lease script alone: it reads the key and, when it holds
    /// nothing, leases it in one step.
    Lease,
    /// A `GET`, then the script when the key held nothing.
    GetThenLease,
}

impl RedisTier {
    /// Looks an id up with a `GET`; when the key holds nothing, takes a
    /// lease on it with a script that reads it again and sets the lease in
    /// one step. An id whose invalidation Redis is still owed is a miss
    /// without a lease (Redis may hold its older state).
    ///
    /// # Errors
    /// [`CacheError`] (counted).
    pub async fn lookup<T: serde::de::DeserializeOwned>(
        &self,
        id: impl std::fmt::Display,
    ) -> Result<RedisLookup<T>, CacheError> {
        let out = self
            .lookup_with(id, Reach::GetThenLease, |raw| serde_json::from_slice(&raw))
            .await?;
        Ok(out.unwrap_or(RedisLookup::Miss(None)))
    }

    /// [`RedisTier::lookup`] as far as `reach` goes, the value kept as the
    /// answer's JSON: a hit is not encoded again (what this tier writes is
    /// the row's own encoding; a value another writer formatted
    /// differently is the same row). `None` only for [`Reach::Get`] on a
    /// key that holds nothing.
    ///
    /// # Errors
    /// [`CacheError`] (counted).
    pub async fn lookup_cached<T: CachedRow>(
        &self,
        id: impl std::fmt::Display,
        reach: Reach,
    ) -> Result<Option<RedisLookup<Arc<Cached<T>>>>, CacheError> {
        self.lookup_with(id, reach, |raw| {
            let row = T::from_json(&raw)?;
            Ok(Arc::new(Cached {
                row,
                json: raw.into(),
            }))
        })
        .await
    }

    pub(super) async fn lookup_with<T>(
        &self,
        id: impl std::fmt::Display,
        reach: Reach,
        decode: impl FnOnce(Vec<u8>) -> serde_json::Result<T>,
    ) -> Result<Option<RedisLookup<T>>, CacheError> {
        let key = self.key(id);
        if self.guard.owed.contains(&key) {
            return Ok(Some(RedisLookup::Miss(None)));
        }
        let mut conn = self.conn.clone();
        // A plain GET first: a hit (the usual answer) then costs Redis no
        // script run. Only a key that holds nothing takes the script,
        // which leases it unless a value arrived in between.
        let mut lease = None;
        let mut raw: Option<Vec<u8>> = if reach == Reach::Lease {
            None
        } else {
            self.guarded(redis::cmd("GET").arg(&key).query_async(&mut conn))
                .await?
        };
        if raw.is_none() {
            if reach == Reach::Get {
                return Ok(None);
            }
            let new = Lease::new();
            raw = self
                .guarded(
                    self.lookup_or_lease
                        .key(&key)
                        .arg(&new.token)
                        .arg(LEASE_MS)
                        .invoke_async(&mut conn),
                )
                .await?;
            lease = Some(new);
        }
        let out = match raw {
            None => RedisLookup::Miss(lease),
            Some(v) if v == NIL_SENTINEL.as_bytes() => RedisLookup::Nil,
            Some(v) if v.starts_with(LEASE_PREFIX.as_bytes()) => RedisLookup::Miss(None),
            Some(json) => match decode(json) {
                Ok(row) => RedisLookup::Hit(row),
                Err(e) => {
                    tracing::warn!(%key, error = %e, "undecodable cache value; deleting it");
                    let _: Result<(), CacheError> = self
                        .guarded(redis::cmd("DEL").arg(&key).query_async(&mut conn))
                        .await;
                    RedisLookup::Miss(None)
                }
            },
        };
        let c = match out {
            RedisLookup::Hit(_) => &self.counters.hits,
            RedisLookup::Nil => &self.counters.nil_hits,
            RedisLookup::Miss(_) => &self.counters.misses,
        };
        c.incr();
        Ok(Some(out))
    }
}
