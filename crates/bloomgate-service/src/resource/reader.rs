//! The read path: filter → L1 → Redis → SQL, each level counted, with one
//! load per id at a time (single flight) and no stale write-back. A Redis
//! hit is answered before any load starts (`hit`), under the same rule.
//!
//! # Why a load never caches what a write replaced
//!
//! (What follows holds for `hit`'s plain `GET` too: it notes the counter
//! before the `GET` and fills L1 under the same test.)
//!
//! Ids are spread over [`SHARDS`] shards, each a small lock around a write
//! counter and the loads in flight. A load notes its shard's counter when it
//! starts, before it reads Redis or SQL. A write, after its SQL commit and
//! its Redis `DEL`, takes the shard lock, bumps the counter, drops the id
//! from L1 and detaches the id's load in flight. The load stores its answer
//! in L1 under the same lock, and only if the counter has not moved. So:
//!
//! * a load that read before the write's commit sees the bump (it happens
//!   after the commit, and the load stores after its read) and does not
//!   cache; its Redis fill fails too, because the `DEL` took its lease;
//! * a read that starts after the write returned finds no L1 entry and no
//!   load to join, so it loads afresh, after the commit.
//!
//! A write to another id of the same shard also stops a load from caching:
//! harmless, it only costs the next read a load.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use futures_util::FutureExt;
use tokio::sync::watch;

use bloomgate_filter::BloomKey;

use crate::cache::{AbsentMemory, Cached, Entry, Lease, Reach, RedisLookup, RedisTier};
use crate::error::AppError;
use crate::key::Key;
use crate::metrics::{Counter, Outcome};
use crate::model::Sku;
use crate::pause::PausePoint;
use crate::shield::{Shield, Verdict};
use crate::source::{BoxFuture, DynSource as RowSource, Row};
use crate::sql::{Database, StoreError};
use crate::sync::lock;

use inline::Inline;

pub mod audit;
mod batch;
mod bulkhead;
mod figures;
mod hit;
pub use figures::{AuditFigures, FunnelFigures, L1Figures, RedisLookups, SharedFigures};
mod inline;
mod invalidate;
mod mode;
mod verdict;
mod warm;

pub use batch::BatchRow;
pub use bulkhead::Bulkhead;
pub use mode::Mode;

pub use warm::{WarmOutcome, WarmStart, WARM_CHUNK};

/// What the funnel reads rows from: the SKU store, or a resource's
/// [`crate::source::Source`].
pub trait Rows: Clone + Send + Sync + std::fmt::Debug + 'static {
    /// The key type.
    type Key: Clone
        + Eq
        + std::hash::Hash
        + Send
        + Sync
        + std::fmt::Debug
        + std::fmt::Display
        + BloomKey
        + 'static;
    /// The row type, as cached in L1 and Redis.
    type Row: Clone + Send + Sync + std::fmt::Debug + crate::cache::CachedRow + 'static;

    /// The row of `key`, if any.
    fn get<'a>(
        &'a self,
        key: &'a Self::Key,
    ) -> BoxFuture<'a, Result<Option<Self::Row>, StoreError>>;

    /// The shard of `key` (any spread will do).
    fn shard_of(key: &Self::Key) -> usize;

    /// Whether `key` has a row, for the audit of the filter's "no"
    /// ([`audit`]), counted apart from the reads' own statements where the
    /// store can.
    fn audit<'a>(&'a self, key: &'a Self::Key) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move { Ok(self.get(key).await?.is_some()) })
    }

    /// The key a pause point matches (SKU ids; other keys never pause).
    fn pause_id(_key: &Self::Key) -> i64 {
        i64::MIN
    }

    /// Whether the filter may judge `key` and a cache hold its row: false
    /// for a [`Key::Loose`] key.
    fn judged(_key: &Self::Key) -> bool {
        true
    }

    /// What a filter holds once a row with a loose key was added, when
    /// this source's keys may be loose (see [`crate::key::Fold`]).
    fn loose_mark(&self) -> Option<Self::Key> {
        None
    }
}

impl Rows for Database {
    type Key = i64;
    type Row = Sku;

    fn get<'a>(&'a self, key: &'a i64) -> BoxFuture<'a, Result<Option<Sku>, StoreError>> {
        Box::pin(Database::get(self, *key))
    }

    fn shard_of(key: &i64) -> usize {
        (*key as u64 % SHARDS as u64) as usize
    }

    fn audit<'a>(&'a self, key: &'a i64) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(Database::audit(self, *key))
    }

    fn pause_id(key: &i64) -> i64 {
        *key
    }
}

/// A resource's [`crate::source::Source`] as the funnel's [`Rows`] (a
/// named type: futures over a bare `Arc<dyn Source>` trip the compiler's
/// `Send` check).
#[derive(Debug, Clone)]
pub struct SourceRows(pub Arc<dyn RowSource>);

impl Rows for SourceRows {
    type Key = Key;
    type Row = Row;

    fn get<'a>(&'a self, key: &'a Key) -> BoxFuture<'a, Result<Option<Row>, StoreError>> {
        self.0.load(key)
    }

    fn shard_of(key: &Key) -> usize {
        (key.hash_pair(0).h1 % SHARDS as u64) as usize
    }

    fn audit<'a>(&'a self, key: &'a Key) -> BoxFuture<'a, Result<bool, StoreError>> {
        self.0.audit(key)
    }

    fn judged(key: &Key) -> bool {
        key.judged()
    }

    fn loose_mark(&self) -> Option<Key> {
        self.0.fold().has_loose().then(|| Key::Loose(String::new()))
    }
}

/// What a lookup answers.
type LookupResult<T> = Result<Lookup<T>, AppError>;

/// Number of lock shards for loads and writes.
pub const SHARDS: usize = 64;

/// L1 counters.
#[derive(Debug, Default)]
pub struct L1Counters {
    /// Lookups answered by a cached SKU.
    pub hits: Counter,
    /// Lookups answered by a cached "not found".
    pub negative_hits: Counter,
    /// Lookups that went on to Redis/SQL (or joined such a load).
    pub misses: Counter,
    /// Answers (a load's, or a Redis hit's) not cached in L1 because a
    /// write intervened.
    pub stale_skipped: Counter,
}

/// Where an answer came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// The Bloom filter said no.
    Filter,
    /// The in-process cache.
    L1,
    /// Redis: a plain `GET` before any load, or a shared load.
    Redis,
    /// SQL, through a shared load.
    Sql,
}

/// The reader's answer for a key.
#[derive(Debug)]
pub enum Lookup<T = Sku> {
    /// The row.
    Found(Arc<Cached<T>>, Source),
    /// No such row.
    Missing(Source),
}

impl<T> Lookup<T> {
    /// The outcome of this answer in logs and metrics.
    #[must_use]
    pub const fn outcome(&self) -> Outcome {
        match self {
            Self::Found(_, Source::L1) => Outcome::L1_HIT,
            Self::Found(_, Source::Redis) => Outcome::REDIS_HIT,
            // The filter never finds a SKU; listed for completeness.
            Self::Found(_, Source::Sql | Source::Filter) => Outcome::DB_FOUND,
            Self::Missing(Source::Filter) => Outcome::FILTER_REJECTED,
            Self::Missing(Source::L1) => Outcome::L1_NEGATIVE_HIT,
            Self::Missing(Source::Redis) => Outcome::REDIS_NIL_HIT,
            Self::Missing(Source::Sql) => Outcome::DB_MISSING,
        }
    }
}

/// Why a load gave no answer.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// SQL failed or timed out.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Too many loads are querying SQL: the bulkhead is full.
    #[error("too many lookups are waiting for the database")]
    Overloaded,
    /// The load panicked.
    #[error("the load stopped")]
    Stopped,
}

/// What a load found, and where (Redis or SQL).
type LoadResult<T> = Result<(Entry<T>, Source), Arc<LoadError>>;

/// Where a load's answer arrives (`None` until it does).
type Answer<T> = watch::Receiver<Option<LoadResult<T>>>;

/// A read's part in an id's load: run it, or wait for its answer.
enum Join<T: 'static> {
    Run(Inline<LoadResult<T>>),
    Wait(Answer<T>),
}

#[derive(Debug)]
struct Flight<T> {
    number: u64,
    answer: Answer<T>,
}

#[derive(Debug)]
struct Shard<K, T> {
    writes: u64,
    next_flight: u64,
    flights: HashMap<K, Flight<T>>,
}

/// The shard type of a funnel over `R`.
type ShardOf<R> = Shard<<R as Rows>::Key, <R as Rows>::Row>;

impl<K, T> Default for Shard<K, T> {
    fn default() -> Self {
        Self {
            writes: 0,
            next_flight: 0,
            flights: HashMap::new(),
        }
    }
}

/// The shielded read path: SKU details by default, a resource's rows
/// over its [`crate::source::Source`] (`ShieldedReader<SourceRows>`).
#[derive(Debug)]
pub struct ShieldedReader<R: Rows = Database> {
    /// The table's shield: its Bloom filter slot.
    pub(crate) shield: Arc<Shield>,
    /// The L1 cache. Write to it only through [`ShieldedReader`]'s methods:
    /// an insert that bypasses the shard protocol may cache a stale answer.
    pub(crate) l1: crate::cache::L1<R::Key, R::Row>,
    /// The Redis tier, when configured.
    pub(crate) redis: Option<RedisTier>,
    /// The source of truth (the SQL store for SKUs).
    pub(crate) store: R,
    /// L1 counters.
    pub(crate) l1_counters: Arc<L1Counters>,
    /// The SQL bulkhead of the read path.
    pub(crate) bulkhead: Bulkhead,
    shards: Arc<[Mutex<ShardOf<R>>]>,
    /// Test hook: where a load stops between its read and its write-back.
    #[doc(hidden)]
    pub(crate) after_read: Arc<PausePoint>,
    /// How the filter answers: alone, confirmed by the shared filter, or
    /// the shared filter alone.
    mode: Mode,
    /// The sampled check of the filter's "no" against the source.
    pub(crate) audit: Arc<audit::Audit>,
    /// The HTTP gate's remembered 404s over this table, one per route
    /// that keeps them: every invalidation below drops the key from them
    /// too.
    absent: Arc<std::sync::RwLock<Vec<AbsentMemory<R::Key>>>>,
}

impl<R: Rows> Clone for ShieldedReader<R> {
    fn clone(&self) -> Self {
        Self {
            shield: Arc::clone(&self.shield),
            l1: self.l1.clone(),
            redis: self.redis.clone(),
            store: self.store.clone(),
            l1_counters: Arc::clone(&self.l1_counters),
            bulkhead: self.bulkhead.clone(),
            shards: Arc::clone(&self.shards),
            after_read: Arc::clone(&self.after_read),
            mode: self.mode.clone(),
            audit: Arc::clone(&self.audit),
            absent: Arc::clone(&self.absent),
        }
    }
}

/// What a load read, before anything is written back.
struct Fetched<T> {
    entry: Entry<T>,
    /// Redis or SQL.
    from: Source,
    /// Read from SQL with this lease on the Redis key: fill it.
    lease: Option<Lease>,
}

impl<R: Rows> ShieldedReader<R> {
    /// Assembles the read path.
    #[must_use]
    pub fn new(
        shield: Arc<Shield>,
        l1: crate::cache::L1<R::Key, R::Row>,
        redis: Option<RedisTier>,
        store: R,
        bulkhead: Bulkhead,
    ) -> Self {
        Self {
            shield,
            l1,
            redis,
            store,
            l1_counters: Arc::default(),
            bulkhead,
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            after_read: Arc::default(),
            mode: Mode::Local,
            audit: Arc::default(),
            absent: Arc::default(),
        }
    }

    fn shard(&self, id: &R::Key) -> &Mutex<ShardOf<R>> {
        &self.shards[R::shard_of(id)]
    }

    /// Looks an id up through the funnel.
    ///
    /// The first reader of an id that misses L1 runs its load inside this
    /// future, and readers of the same id that come meanwhile wait for it:
    /// poll the future to its end or drop it (dropping hands the load to a
    /// task of its own); one held unpolled holds up those readers.
    ///
    /// # Errors
    /// [`AppError::Unavailable`] when SQL fails (never cached).
    pub async fn lookup(&self, id: R::Key) -> Result<Lookup<R::Row>, AppError> {
        if !R::judged(&id) {
            self.shield.tally(Verdict::Unvouched);
            return self.lookup_uncached(&id).await;
        }
        let (mut verdict, asked) = match self.verdict_now(&id) {
            Some(verdict) => (verdict, false),
            None => (self.verdict_from_redis(&id).await, true),
        };
        let loose = self.loose_rows().await;
        if loose && verdict == Verdict::Reject {
            verdict = Verdict::Unvouched;
        }
        self.shield.tally(verdict);
        if verdict == Verdict::Reject {
            self.audit_refusal(&id);
            return Ok(Lookup::Missing(Source::Filter));
        }
        if loose {
            let answer = self.lookup_uncached(&id).await;
            if let Ok(answer) = &answer {
                self.after_shield(verdict, answer);
            }
            return answer;
        }
        let answer = self.lookup_past_the_shield(id, asked).await;
        if let Ok(answer) = &answer {
            self.after_shield(verdict, answer);
        }
        answer
    }

    /// `asked`: the shared filter said "maybe" already (see `trusts_l1`).
    async fn lookup_past_the_shield(&self, id: R::Key, asked: bool) -> LookupResult<R::Row> {
        let trusted = self.trusts_l1(&id, asked).await;
        if let Some(answer) = trusted.then(|| self.l1_answer(&id)).flatten() {
            return Ok(answer);
        }
        self.l1_counters.misses.incr();
        let reach = match self.redis_hit(&id).await {
            Ok(answer) => return Ok(answer),
            Err(reach) => reach,
        };
        let entry = match self.join_or_start(id, reach) {
            Join::Run(load) => load.await,
            Join::Wait(mut answer) => match answer.wait_for(Option::is_some).await {
                Ok(v) => v.clone(),
                Err(_) => None,
            },
        };
        match entry {
            Some(Ok((Entry::Found(sku), from))) => Ok(Lookup::Found(sku, from)),
            Some(Ok((Entry::Missing, from))) => Ok(Lookup::Missing(from)),
            Some(Err(e)) => Err(match &*e {
                LoadError::Overloaded => AppError::Overloaded,
                LoadError::Store(e) => AppError::Unavailable(e.to_string()),
                LoadError::Stopped => AppError::Unavailable("the load stopped".into()),
            }),
            None => Err(AppError::Unavailable("the load stopped".into())),
        }
    }

    /// A read of SQL alone, through the bulkhead, with nothing cached and
    /// no load shared: for a key whose spellings the caches cannot tell
    /// apart (see [`crate::key::Fold`]).
    async fn lookup_uncached(&self, id: &R::Key) -> LookupResult<R::Row> {
        self.l1_counters.misses.incr();
        let Some(_slot) = self.bulkhead.slot().await else {
            return Err(AppError::Overloaded);
        };
        match self.store.get(id).await {
            Ok(Some(row)) => Ok(Lookup::Found(Cached::new(row), Source::Sql)),
            Ok(None) => Ok(Lookup::Missing(Source::Sql)),
            Err(e) => Err(AppError::Unavailable(e.to_string())),
        }
    }

    /// Joins the id's load in flight, or starts one for the caller to run
    /// ([`Inline`]: spawned as a task of its own if the caller goes away,
    /// so a client that leaves does not cancel it), reading Redis as far
    /// as `reach` (`None`: not at all).
    fn join_or_start(&self, id: R::Key, reach: Option<Reach>) -> Join<R::Row> {
        let mut shard = lock(self.shard(&id));
        if let Some(f) = shard.flights.get(&id) {
            return Join::Wait(f.answer.clone());
        }
        let (tx, rx) = watch::channel(None);
        shard.next_flight += 1;
        let number = shard.next_flight;
        let writes = shard.writes;
        shard
            .flights
            .insert(id.clone(), Flight { number, answer: rx });
        drop(shard);
        let reader = self.clone();
        Join::Run(Inline(Some(Box::pin(async move {
            // A load that panics (a `Source` of the user's, say) answers
            // its readers "the load stopped" (a 503) instead of unwinding
            // through the request that runs it.
            let result = std::panic::AssertUnwindSafe(reader.load(&id, writes, reach))
                .catch_unwind()
                .await
                .unwrap_or_else(|_| Err(Arc::new(LoadError::Stopped)));
            let mut shard = lock(reader.shard(&id));
            if shard.flights.get(&id).is_some_and(|f| f.number == number) {
                shard.flights.remove(&id);
            }
            drop(shard);
            // The flight is out of the map: no reader joins any more, so
            // with none waiting the answer goes to the starter alone.
            if tx.receiver_count() > 0 {
                tx.send_replace(Some(result.clone()));
            }
            result
        }))))
    }

    /// Reads Redis, then SQL; writes back under the lease; caches in L1 if
    /// no write to the shard happened since `writes` was read.
    async fn load(&self, id: &R::Key, writes: u64, reach: Option<Reach>) -> LoadResult<R::Row> {
        let fetched = self.fetch(id, reach).await.map_err(Arc::new)?;
        self.after_read.pass(R::pause_id(id)).await;
        let mut cacheable = true;
        if let (Some(redis), Some(lease)) = (&self.redis, &fetched.lease) {
            let sku = match &fetched.entry {
                Entry::Found(c) => Some(&c.row),
                Entry::Missing => None,
            };
            match redis.fill(id, lease, sku).await {
                Ok(true) => {}
                // The lease is gone: a write deleted the key since our
                // lookup, so what we read may be older than that write.
                Ok(false) => cacheable = false,
                Err(e) => tracing::warn!(%id, error = %e, "redis write-back failed"),
            }
        }
        let shard = lock(self.shard(id));
        if cacheable && shard.writes == writes {
            self.l1.insert(id.clone(), fetched.entry.clone());
        } else {
            self.l1_counters.stale_skipped.incr();
        }
        drop(shard);
        Ok((fetched.entry, fetched.from))
    }

    async fn fetch(&self, id: &R::Key, reach: Option<Reach>) -> Result<Fetched<R::Row>, LoadError> {
        let mut lease = None;
        if let (Some(redis), Some(reach)) = (&self.redis, reach) {
            match redis
                .lookup_cached(id, reach)
                .await
                .map(Option::unwrap_or_default)
            {
                Ok(RedisLookup::Hit(cached)) => {
                    return Ok(Fetched {
                        entry: Entry::Found(cached),
                        from: Source::Redis,
                        lease: None,
                    })
                }
                Ok(RedisLookup::Nil) => {
                    return Ok(Fetched {
                        entry: Entry::Missing,
                        from: Source::Redis,
                        lease: None,
                    })
                }
                Ok(RedisLookup::Miss(l)) => lease = l,
                Err(e) => tracing::warn!(%id, error = %e, "redis lookup failed; reading SQL"),
            }
        }
        let Some(_slot) = self.bulkhead.slot().await else {
            return Err(LoadError::Overloaded);
        };
        let found = self.store.get(id).await?;
        Ok(Fetched {
            entry: found.map_or(Entry::Missing, |row| Entry::Found(Cached::new(row))),
            from: Source::Sql,
            lease,
        })
    }
}
