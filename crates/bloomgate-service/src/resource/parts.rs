//! What a caller outside the read path may reach of a resource (the
//! assembler, the CLI, tests): its source, its Redis tier and shared
//! filter, its caches' local state, and the test hooks. The funnel itself
//! (`ShieldedReader`) is the crate's own: nothing outside it writes to L1
//! or Redis except through these calls.

use std::sync::Arc;

use super::{Guarded, Resource};
use crate::cache::RedisTier;
use crate::pause::PausePoint;
use crate::resource::reader::Lookup;
use crate::share::redis_filter::SharedFilter;

impl<R: Guarded> Resource<R> {
    /// Its source of rows (the SQL handle for the SKU table).
    #[must_use]
    pub fn source(&self) -> &R {
        &self.reader.store
    }

    /// Its Redis tier, when Redis is configured.
    #[must_use]
    pub fn redis(&self) -> Option<&RedisTier> {
        self.reader.redis.as_ref()
    }

    /// Its shared filter, in `strict` and `redis` modes.
    #[must_use]
    pub fn shared(&self) -> Option<&SharedFilter> {
        self.reader.shared()
    }

    /// Answers from the filter and L1 alone, when they can answer without
    /// waiting (`None`: the caller must [`Resource::get`]).
    pub fn get_now(&self, key: &R::Key) -> Option<Lookup<R::Row>> {
        self.reader.lookup_now(key)
    }

    /// Drops every key from this instance's caches (L1, loads in flight,
    /// remembered 404s): the next read of each asks Redis or SQL.
    pub fn forget_local(&self) {
        self.reader.invalidate_all_local();
    }

    /// Drops `key` from this instance's caches.
    pub fn forget_local_key(&self, key: &R::Key) {
        self.reader.invalidate_local(key);
    }

    /// Whether L1 holds `key` (a row or an absence).
    #[must_use]
    pub fn cached_locally(&self, key: &R::Key) -> bool {
        self.reader.l1.contains_key(key)
    }

    /// Test hook: where a load stops between its read and its write-back.
    #[doc(hidden)]
    #[must_use]
    pub fn after_read(&self) -> &Arc<PausePoint> {
        &self.reader.after_read
    }

    /// How often a refusal is audited against the source (ms; 0: every
    /// one the audit is free for).
    pub fn set_audit_every(&self, every_ms: u64) {
        self.reader.audit.set_every(every_ms);
    }
}
