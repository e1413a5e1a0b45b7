//! A funnel's figures in the one shape every resource's stats use (the
//! SKU table's `skus` too): its filter, L1 and Redis levels, as typed
//! values that `/api/cache/stats` serialises and `/metrics` reads field by
//! field (a renamed field fails to compile, never exports 0).

use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;

use super::{Rows, ShieldedReader};
use crate::key::KeyType;
use crate::shield::ShieldStats;

/// A funnel's figures: `{"key_type", "filter", "l1", "audit", "redis"?,
/// "shared"?}` under `resources.<name>`.
#[derive(Debug, Clone, Serialize)]
pub struct FunnelFigures {
    /// The resource's key type.
    pub key_type: KeyType,
    /// Its filter.
    pub filter: ShieldStats,
    /// Its L1.
    pub l1: L1Figures,
    /// The audit of its filter's "no".
    pub audit: AuditFigures,
    /// Its Redis lookups (with Redis).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub redis: Option<RedisLookups>,
    /// Its shared filter (strict and redis modes).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shared: Option<SharedFigures>,
}

/// L1's lookups and size.
#[derive(Debug, Clone, Serialize)]
pub struct L1Figures {
    /// Rows answered from L1.
    pub hits: u64,
    /// Absences answered from L1.
    pub negative_hits: u64,
    /// Lookups L1 could not answer.
    pub misses: u64,
    /// Entries held.
    pub entries: u64,
}

/// The filter audit.
#[derive(Debug, Clone, Serialize)]
pub struct AuditFigures {
    /// Refused keys looked up in SQL.
    pub sampled: u64,
    /// Of those, keys SQL held.
    pub false_negatives: u64,
    /// Lookups that failed.
    pub failed: u64,
}

/// A resource's Redis lookups.
#[derive(Debug, Clone, Serialize)]
pub struct RedisLookups {
    /// Rows answered from Redis.
    pub hits: u64,
    /// Absences answered from Redis (`__nil__`).
    pub nil_hits: u64,
    /// Lookups Redis could not answer.
    pub misses: u64,
    /// Keys written to Redis.
    pub keys_written: u64,
}

/// The shared filter.
#[derive(Debug, Clone, Serialize)]
pub struct SharedFigures {
    /// `strict` or `redis`.
    pub mode: &'static str,
    /// Keys asked.
    pub checks: u64,
    /// A local "no" the shared filter overruled.
    pub overruled: u64,
    /// Failures (answered "maybe").
    pub errors: u64,
    /// Refills from SQL.
    pub refills: u64,
}

impl<R: Rows> ShieldedReader<R> {
    /// The funnel's figures, with `filter` as the caller read it (the
    /// filter's fill is counted once per snapshot).
    #[must_use]
    pub fn figures(&self, key_type: KeyType, filter: ShieldStats) -> FunnelFigures {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let l1 = &self.l1_counters;
        let a = &self.audit;
        FunnelFigures {
            key_type,
            filter,
            l1: L1Figures {
                hits: l1.hits.get(),
                negative_hits: l1.negative_hits.get(),
                misses: l1.misses.get(),
                entries: self.l1.entry_count(),
            },
            audit: AuditFigures {
                sampled: get(&a.sampled),
                false_negatives: get(&a.false_negatives),
                failed: get(&a.failed),
            },
            redis: self.redis.as_ref().map(|redis| {
                let c = &redis.counters;
                RedisLookups {
                    hits: c.hits.get(),
                    nil_hits: c.nil_hits.get(),
                    misses: c.misses.get(),
                    keys_written: get(&c.keys_written),
                }
            }),
            shared: self.shared().map(|shared| {
                let c = &shared.counters;
                SharedFigures {
                    mode: if self.mode.shared_only() {
                        "redis"
                    } else {
                        "strict"
                    },
                    checks: get(&c.checks),
                    overruled: get(&c.overruled),
                    errors: get(&c.errors),
                    refills: get(&c.refills),
                }
            }),
        }
    }
}
