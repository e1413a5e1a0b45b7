//! A funnel's figures in the one shape every resource's stats use (the
//! SKU table's `skus` too): its filter, L1 and Redis levels.

use std::sync::atomic::Ordering;

use serde_json::{json, Value};

use super::{Rows, ShieldedReader};

impl<R: Rows> ShieldedReader<R> {
    /// `{"key_type", "filter", "l1", "redis"?}` for `/api/cache/stats`
    /// under `resources.<name>`, with `filter` as the caller read it (the
    /// filter's fill is counted once per snapshot); the caller adds its
    /// SQL figures.
    #[must_use]
    pub fn figures(&self, key_type: crate::key::KeyType, bloom: Value) -> Value {
        let get = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
        let l1 = &self.l1_counters;
        let mut v = json!({
            "key_type": key_type,
            "filter": bloom,
            "l1": {
                "hits": l1.hits.get(),
                "negative_hits": l1.negative_hits.get(),
                "misses": l1.misses.get(),
                "entries": self.l1.entry_count(),
            },
        });
        let a = &self.audit;
        v["audit"] = json!({
            "sampled": get(&a.sampled),
            "false_negatives": get(&a.false_negatives),
            "failed": get(&a.failed),
        });
        if let Some(redis) = &self.redis {
            let c = &redis.counters;
            v["redis"] = json!({
                "hits": get(&c.hits),
                "nil_hits": get(&c.nil_hits),
                "misses": get(&c.misses),
                "keys_written": get(&c.keys_written),
            });
        }
        if let Some(shared) = self.shared() {
            let c = &shared.counters;
            v["shared"] = json!({
                "mode": if self.mode.shared_only() { "redis" } else { "strict" },
                "checks": get(&c.checks),
                "overruled": get(&c.overruled),
                "errors": get(&c.errors),
                "refills": get(&c.refills),
            });
        }
        v
    }
}
