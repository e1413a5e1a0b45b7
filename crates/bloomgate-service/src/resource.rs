//! A resource: one guarded source beside the SKUs, with a funnel of its
//! own (filter, L1, Redis under `{prefix}r:{name}:`, single flight, leases)
//! over the instance's shared SQL bulkhead, and the calls for writes made
//! elsewhere: `keys` (add to every instance's filter), `invalidate` (drop
//! from every instance's caches), `exists` (the filter alone) and `batch`
//! reads. `keys` and `invalidate` are recorded in the SQL outbox under the
//! resource's name before they answer, so every instance applies them
//! (within milliseconds with the Redis doorbell, within
//! `sql.outbox_poll_ms` without), as SKU writes are.

use std::collections::{HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::cache::{resource_namespace, Entry, RedisTier, L1};
use crate::config::{BloomLayout, BloomMode, CacheConfig};
use crate::error::AppError;
use crate::gate::{Gate, GateConfig, Verdict};
use crate::key::{Key, KeyType};
use crate::reader::{Bulkhead, Lookup, ShieldedReader, SourceRows};
use crate::source::{DynSource, Row, ScanOf};
use crate::store::SkuStore;
use crate::table::{SqlTable, WatchValue};

/// A resource's funnel.
pub type ResourceReader = ShieldedReader<SourceRows>;

/// How a resource's filter is sized and its calls bounded.
#[derive(Debug, Clone)]
pub struct ResourceOptions {
    /// Keys the filter is sized for.
    pub expected: u64,
    /// The target false-positive rate.
    pub fpp: f64,
    /// The filter's layout.
    pub layout: BloomLayout,
    /// Most keys in one call.
    pub max_batch_keys: usize,
    /// Where the filter's snapshot is kept (restart without a scan).
    /// `None`: `<cache.bloom_snapshot_path>.<name>` when that is set.
    pub snapshot_path: Option<std::path::PathBuf>,
    /// `local`, `strict` or `redis`; `None`: `cache.bloom_mode`.
    pub mode: Option<crate::config::BloomMode>,
}

impl Default for ResourceOptions {
    fn default() -> Self {
        Self {
            expected: 100_000,
            fpp: 0.001,
            layout: BloomLayout::Blocked,
            max_batch_keys: 1000,
            snapshot_path: None,
            mode: None,
        }
    }
}

/// What a resource shares with the rest of the instance.
#[derive(Debug, Clone)]
pub struct Shared {
    /// The SQL store (the outbox lives there).
    pub store: SkuStore,
    /// The Redis tier, when configured.
    pub redis: Option<RedisTier>,
    /// The instance's SQL bulkhead.
    pub bulkhead: Bulkhead,
    /// The Redis change log (its doorbell).
    pub changes: Option<crate::changes::ChangeLog>,
    /// The outbox follower, which applies other instances' entries.
    pub outbox: crate::outbox::Outbox,
    /// Where Redis is, for a resource's shared filter (`strict`, `redis`).
    pub target: Option<crate::redis_link::RedisTarget>,
    /// L1 sizes and the filter switches.
    pub cache: CacheConfig,
    /// The instance's shutdown signal.
    pub background: crate::tasks::Background,
}

/// Counters of the resource's calls.
#[derive(Debug, Default)]
pub struct CallCounters {
    /// Keys added through `keys`.
    pub keys_added: AtomicU64,
    /// Keys dropped through `invalidate`.
    pub invalidated: AtomicU64,
    /// Keys answered by `exists`.
    pub exists_checked: AtomicU64,
    /// Keys asked for in `batch`.
    pub batch_keys: AtomicU64,
    /// Keys the watch found new to this instance's filter.
    pub watched: AtomicU64,
}

/// One guarded resource.
#[derive(Debug)]
pub struct Resource {
    /// Its name (routes, Redis namespace, outbox entries, labels).
    pub name: Arc<str>,
    /// The funnel.
    pub reader: ResourceReader,
    /// Most keys in one call.
    pub max_batch_keys: usize,
    /// The SQL table, when the source is one (its counters and watch).
    pub table: Option<SqlTable>,
    /// Call counters.
    pub counters: CallCounters,
    /// The filter's snapshot, when one is configured.
    pub persist: Option<crate::persist::Persist>,
    store: SkuStore,
    changes: Option<crate::changes::ChangeLog>,
    background: crate::tasks::Background,
    /// How often the watch column is read (ms; 0: no watch).
    watch_every_ms: AtomicU64,
}

/// The answer of a batch read.
#[derive(Debug)]
pub struct BatchAnswer {
    /// The rows found, with their keys, in the order asked.
    pub found: Vec<(Key, Arc<crate::cache::Cached<Row>>)>,
    /// The keys with no row, in the order asked.
    pub missing: Vec<Key>,
}

impl Resource {
    /// A resource named `name` over `source`, registered with the outbox
    /// follower. Its filter is not built yet: see [`Resource::start`].
    ///
    /// # Errors
    /// The shared filter of `strict` or `redis` mode could not be opened.
    pub async fn new(
        name: &str,
        source: Arc<dyn DynSource>,
        options: &ResourceOptions,
        shared: &Shared,
    ) -> Result<Arc<Self>, crate::shared::SharedError> {
        Self::assemble(name, source, None, options, shared).await
    }

    /// [`Resource::new`] over a configured SQL table (which also gives it
    /// SQL counters and, with `watch_column`, the watch).
    ///
    /// # Errors
    /// As [`Resource::new`].
    pub async fn from_table(
        name: &str,
        table: SqlTable,
        options: &ResourceOptions,
        shared: &Shared,
    ) -> Result<Arc<Self>, crate::shared::SharedError> {
        Self::assemble(name, Arc::new(table.clone()), Some(table), options, shared).await
    }

    async fn assemble(
        name: &str,
        source: Arc<dyn DynSource>,
        table: Option<SqlTable>,
        options: &ResourceOptions,
        shared: &Shared,
    ) -> Result<Arc<Self>, crate::shared::SharedError> {
        let c = &shared.cache;
        let gate = Gate::new(
            GateConfig {
                enabled: c.bloom_enabled,
                layout: options.layout,
                expected: options.expected,
                fpp: options.fpp,
                auto_rebuild: c.bloom_auto_rebuild,
            },
            Arc::new(ScanOf(Arc::clone(&source))),
        )
        .with_background(shared.background.clone());
        let l1 = L1::new(
            c.l1_capacity,
            Duration::from_secs(c.l1_ttl_secs),
            Duration::from_secs(c.l1_negative_ttl_secs),
        );
        let redis = shared
            .redis
            .as_ref()
            .map(|r| r.namespaced(&resource_namespace(name)));
        let mut reader = ShieldedReader::new(
            Arc::new(gate),
            l1,
            redis,
            SourceRows(Arc::clone(&source)),
            shared.bulkhead.clone(),
        );
        let mode = options.mode.unwrap_or(c.bloom_mode);
        if let (BloomMode::Strict | BloomMode::Redis, Some(target)) = (mode, &shared.target) {
            let prefix = format!(
                "{}{}",
                c.redis_prefix,
                crate::wire::resource_namespace(name)
            );
            reader.shared = Some(
                crate::shared::SharedFilter::connect(
                    target,
                    &prefix,
                    options.expected,
                    options.fpp,
                    c.bloom_segment_bytes,
                    Duration::from_millis(c.redis_timeout_ms),
                    Arc::new(ScanOf(Arc::clone(&source))),
                )
                .await?
                .with_background(shared.background.clone()),
            );
            reader.shared_only = mode == BloomMode::Redis;
        }
        shared.outbox.register(name, reader.clone());
        let snapshot = options.snapshot_path.clone().or_else(|| {
            c.bloom_snapshot_path
                .as_ref()
                .map(|p| crate::config::resources::derived_snapshot_path(p, name))
        });
        let persist = snapshot.map(|path| {
            crate::persist::Persist::for_resource(
                path,
                options.layout,
                options.fpp,
                reader.store.0.key_type(),
                shared.outbox.clone(),
            )
        });
        Ok(Arc::new(Self {
            persist,
            name: Arc::from(name),
            reader,
            max_batch_keys: options.max_batch_keys.max(1),
            table,
            counters: CallCounters::default(),
            store: shared.store.clone(),
            changes: shared.changes.clone(),
            background: shared.background.clone(),
            watch_every_ms: AtomicU64::new(0),
        }))
    }

    /// How keys are spelled.
    #[must_use]
    pub fn key_type(&self) -> KeyType {
        self.reader.store.0.key_type()
    }

    /// The filter.
    #[must_use]
    pub fn gate(&self) -> &Arc<Gate> {
        &self.reader.gate
    }

    /// Reads the SQL table's watch column every `every` once started.
    pub fn set_watch_every(&self, every: Duration) {
        self.watch_every_ms
            .store(every.as_millis() as u64, Ordering::Relaxed);
    }

    /// Publishes the filter from its snapshot, if one is configured and
    /// can be trusted (see [`crate::persist::Persist::restore_resource`]).
    /// Returns the outbox position it is complete up to; `None` when the
    /// filter must be built from the source.
    pub async fn restore(&self) -> Option<i64> {
        let persist = self.persist.as_ref()?;
        let source = &self.reader.store.0;
        match persist
            .restore_resource(self.gate(), &self.name, self.key_type(), source.count())
            .await
        {
            Ok(at) => Some(at),
            Err(why) => {
                tracing::warn!(resource = %self.name, %why, "resource snapshot not used; scanning its source");
                None
            }
        }
    }

    /// Starts the filter build (retried until it succeeds; not when
    /// `restored`), its monitor, the snapshot saver and the watch of a SQL
    /// table's watch column, if set. Returns the build task.
    pub fn start(
        self: &Arc<Self>,
        retry: (Duration, Duration),
        monitor_every: Duration,
        restored: bool,
        snapshot_every: Duration,
    ) -> tokio::task::JoinHandle<()> {
        let gate = Arc::clone(self.gate());
        gate.spawn_monitor(monitor_every);
        let every = self.watch_every_ms.load(Ordering::Relaxed);
        if every > 0 && self.table.is_some() {
            self.background
                .spawn(watch(Arc::downgrade(self), Duration::from_millis(every)));
        }
        if let Some(persist) = &self.persist {
            persist.spawn_saver(&gate, snapshot_every, &self.background);
        }
        if restored {
            return self.background.spawn(async {});
        }
        self.background
            .spawn(gate.build_until_ready(retry.0, retry.1))
    }

    /// Reads one key through the funnel (poll it to its end or drop it:
    /// see [`ShieldedReader::lookup`]).
    ///
    /// # Errors
    /// [`AppError::Unavailable`] or [`AppError::Overloaded`].
    pub async fn get(&self, key: Key) -> Result<Lookup<Row>, AppError> {
        self.reader.lookup(key).await
    }

    fn check_len(&self, n: usize) -> Result<(), AppError> {
        if n > self.max_batch_keys {
            return Err(AppError::BadRequest(format!(
                "at most {} keys per call, got {n}",
                self.max_batch_keys
            )));
        }
        Ok(())
    }

    /// Adds `keys` (rows the application committed) to every instance's
    /// filter: added here, dropped from Redis and this instance's L1 (a
    /// "not found" cached before the row existed must not answer),
    /// recorded in the outbox (which the others follow), then the others
    /// are rung. Answers only after all of that.
    ///
    /// # Errors
    /// [`AppError::BadRequest`] over the limit; [`AppError::Unavailable`]
    /// when Redis did not confirm the deletes or the outbox could not be
    /// written (the keys are in this instance's filter anyway; call
    /// again).
    pub async fn add_keys(&self, keys: &[Key]) -> Result<(), AppError> {
        self.check_len(keys.len())?;
        // Redis first: once the entry is in the outbox another instance
        // may learn the key and read it, and must not find a "not found"
        // cached before the row existed. Without that, nothing is
        // recorded and the call fails (the caller retries).
        for k in keys {
            self.reader.gate.insert(k);
        }
        if !self.reader.invalidate_many(keys).await {
            return Err(AppError::Unavailable(
                "redis did not confirm dropping the keys' cached \"not found\"; call again".into(),
            ));
        }
        self.record(keys, crate::wire::kind::CREATED).await?;
        // Strict and redis modes: every instance sees the keys in Redis
        // before the call answers (the outbox reaches them later).
        if let Some(shared) = &self.reader.shared {
            if let Err(e) = shared.insert_many(keys).await {
                tracing::warn!(resource = %self.name, error = %e, "adding keys to the shared filter failed");
                return Err(AppError::Unavailable(
                    "the shared filter did not take the keys (they are recorded and reach every instance through the outbox); call again".into(),
                ));
            }
        }
        self.counters
            .keys_added
            .fetch_add(keys.len() as u64, Ordering::Relaxed);
        self.ring().await;
        Ok(())
    }

    /// Drops `keys` from L1 and Redis on every instance (recorded in the
    /// outbox; this instance's part done before it answers).
    ///
    /// # Errors
    /// As [`Resource::add_keys`].
    pub async fn invalidate(&self, keys: &[Key]) -> Result<(), AppError> {
        self.check_len(keys.len())?;
        let recorded = self.record(keys, crate::wire::kind::UPDATED).await;
        let confirmed = self.reader.invalidate_many(keys).await;
        recorded?;
        if !confirmed {
            return Err(AppError::Unavailable(
                "redis did not confirm dropping the keys; call again".into(),
            ));
        }
        self.counters
            .invalidated
            .fetch_add(keys.len() as u64, Ordering::Relaxed);
        self.ring().await;
        Ok(())
    }

    async fn record(&self, keys: &[Key], kind: &'static str) -> Result<(), AppError> {
        let spelled: Vec<String> = keys.iter().map(ToString::to_string).collect();
        self.store
            .record_many(&self.name, &spelled, kind)
            .await
            .map_err(|e| {
                tracing::warn!(resource = %self.name, error = %e, "recording keys in the outbox failed");
                AppError::Unavailable(e.to_string())
            })
    }

    /// Rings the others in the background: the outbox holds the entries
    /// already, so the caller need not wait for Redis.
    async fn ring(&self) {
        if let Some(log) = self.changes.clone() {
            tokio::spawn(async move { log.ring().await });
        }
    }

    /// The filter's answer for each key: false only where it says "no"
    /// and this instance can vouch for it (built, in step).
    ///
    /// # Errors
    /// [`AppError::BadRequest`] over the limit.
    pub fn exists(&self, keys: &[Key]) -> Result<Vec<bool>, AppError> {
        self.check_len(keys.len())?;
        self.counters
            .exists_checked
            .fetch_add(keys.len() as u64, Ordering::Relaxed);
        Ok(self
            .reader
            .gate
            .check_many(keys)
            .into_iter()
            .map(|v| v != Verdict::Reject)
            .collect())
    }

    /// Reads many keys: screened by the filter's batch call, then L1, then
    /// one `IN (…)` load of the rest through the SQL bulkhead (not written
    /// back to the caches).
    ///
    /// # Errors
    /// [`AppError::BadRequest`] over the limit; [`AppError::Overloaded`]
    /// when the bulkhead is full; [`AppError::Unavailable`] when SQL fails.
    pub async fn batch(&self, keys: &[Key]) -> Result<BatchAnswer, AppError> {
        self.check_len(keys.len())?;
        self.counters
            .batch_keys
            .fetch_add(keys.len() as u64, Ordering::Relaxed);
        let verdicts = self.reader.gate.check_many(keys);
        let mut answers: Vec<Option<Option<Arc<crate::cache::Cached<Row>>>>> =
            vec![None; keys.len()];
        let mut to_load = Vec::new();
        for (i, (k, v)) in keys.iter().zip(&verdicts).enumerate() {
            if *v == Verdict::Reject {
                answers[i] = Some(None);
                continue;
            }
            match self.reader.l1.get(k) {
                Some(Entry::Found(row)) => answers[i] = Some(Some(row)),
                Some(Entry::Missing) => answers[i] = Some(None),
                None => to_load.push(i),
            }
        }
        if !to_load.is_empty() {
            let wanted: Vec<Key> = to_load.iter().map(|&i| keys[i].clone()).collect();
            let loaded = {
                let Some(_slot) = self.reader.bulkhead.slot().await else {
                    return Err(AppError::Overloaded);
                };
                self.reader
                    .store
                    .0
                    .load_many(&wanted)
                    .await
                    .map_err(|e| AppError::Unavailable(e.to_string()))?
            };
            let mut rows: std::collections::HashMap<Key, Row> = loaded.into_iter().collect();
            for &i in &to_load {
                let row = rows.remove(&keys[i]);
                if row.is_none() && verdicts[i] == Verdict::Pass {
                    self.reader.gate.note_passed_missing();
                }
                answers[i] = Some(row.map(crate::cache::Cached::new));
            }
        }
        let mut out = BatchAnswer {
            found: Vec::new(),
            missing: Vec::new(),
        };
        for (k, a) in keys.iter().zip(answers) {
            match a.flatten() {
                Some(row) => out.found.push((k.clone(), row)),
                None => out.missing.push(k.clone()),
            }
        }
        Ok(out)
    }

    /// Figures for `/api/cache/stats` under `resources.<name>`.
    #[must_use]
    pub fn stats(&self) -> serde_json::Value {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let bloom = serde_json::to_value(self.reader.gate.stats()).unwrap_or_default();
        let mut v = self.reader.figures(self.key_type(), bloom);
        v["calls"] = serde_json::json!({
            "keys_added": get(&self.counters.keys_added),
            "invalidated": get(&self.counters.invalidated),
            "exists_checked": get(&self.counters.exists_checked),
            "batch_keys": get(&self.counters.batch_keys),
            "watched": get(&self.counters.watched),
        });
        if let Some(t) = &self.table {
            let c = &t.counters;
            v["sql"] = serde_json::json!({
                "statements": get(&c.statements),
                "loads": get(&c.loads),
                "found": get(&c.found),
                "batch_loads": get(&c.batch_loads),
            });
        }
        v
    }
}

/// Rows read per watch statement.
const WATCH_PAGE: usize = 10_000;
/// Each poll reads from the largest value seen this many polls ago, so a
/// row that committed after a row with a larger value (auto ids commit
/// out of order) is still seen if it committed within that many polls.
const WATCH_LAG_POLLS: usize = 5;

/// Polls the table's watch column until the resource is dropped. Keys of
/// rows at or past the low mark go into the filter; keys not seen by the
/// recent polls are also dropped from Redis and L1 (a "not found" may be
/// cached from before the row existed, even where the filter already
/// said "maybe").
async fn watch(resource: std::sync::Weak<Resource>, every: Duration) {
    let mut maxima: VecDeque<Option<WatchValue>> = VecDeque::new();
    let mut recent: VecDeque<HashSet<Key>> = VecDeque::new();
    let mut high: Option<WatchValue> = None;
    let mut started = false;
    loop {
        let Some(r) = resource.upgrade() else { return };
        let Some(table) = r.table.clone() else { return };
        let mut seen = HashSet::new();
        if !started {
            // Rows that exist now are the build's; start from the top.
            match table.watched_max().await {
                Ok(m) => {
                    high = m;
                    started = true;
                }
                Err(e) => {
                    tracing::warn!(resource = %r.name, error = %e, "watch: reading the largest value failed")
                }
            }
        } else {
            let mut from = maxima.front().cloned().flatten().or_else(|| high.clone());
            let mut past = false;
            loop {
                let page = match table.watched(from.as_ref(), past, WATCH_PAGE).await {
                    Ok(Some(p)) => p,
                    Ok(None) => return,
                    Err(e) => {
                        tracing::warn!(resource = %r.name, error = %e, "watch: read failed");
                        break;
                    }
                };
                let mut fresh = Vec::new();
                for (key, value) in &page {
                    r.reader.gate.learn(key);
                    if !recent.iter().any(|s| s.contains(key)) && seen.insert(key.clone()) {
                        fresh.push(key.clone());
                    }
                    if high.as_ref().is_none_or(|h| value > h) {
                        high = Some(value.clone());
                    }
                }
                if !fresh.is_empty() {
                    r.counters
                        .watched
                        .fetch_add(fresh.len() as u64, Ordering::Relaxed);
                    r.reader.invalidate_many(&fresh).await;
                }
                if page.len() < WATCH_PAGE {
                    break;
                }
                let Some((_, last)) = page.into_iter().next_back() else {
                    break;
                };
                // A full page of one value: go on past it.
                past = from.as_ref() == Some(&last);
                from = Some(last);
            }
        }
        maxima.push_back(high.clone());
        recent.push_back(seen);
        if maxima.len() > WATCH_LAG_POLLS {
            maxima.pop_front();
            recent.pop_front();
        }
        drop(r);
        tokio::time::sleep(every).await;
    }
}
