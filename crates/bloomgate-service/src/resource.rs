//! A resource: one guarded table or source, with its funnel (filter, L1,
//! Redis, single flight, leases) over the instance's shared SQL bulkhead,
//! its snapshot and shared rebuilds, and the calls for writes made
//! elsewhere: `keys` (add to every instance's filter), `invalidate` (drop
//! from every instance's caches), `exists` (the filter alone) and `batch`
//! reads. The SKU table is the default resource, `skus`
//! ([`Resource<Database>`]); every `[[resources]]` table and every
//! [`crate::source::Source`] is a [`Resource`] over [`SourceRows`], under
//! `{prefix}rv:{name}:{value identity}:` in Redis. `keys` and `invalidate` are recorded in
//! the SQL outbox under the resource's name before they answer, so every
//! instance applies them (within milliseconds with the Redis doorbell,
//! within `sql.outbox_poll_ms` without), as owned writes are.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::cache::{resource_namespace, RedisTier, L1};
use crate::config::{BloomLayout, BloomMode, CacheConfig};
use crate::error::AppError;
use crate::key::KeyType;
use crate::resource::reader::{Bulkhead, Lookup, ShieldedReader, SourceRows};
use crate::shield::{Shield, ShieldConfig};
use crate::source::DynSource;
use crate::sql::table::SqlTable;
use crate::sql::Database;

mod calls;
mod epochs;
mod figures;
mod follow;
mod guarded;
mod parts;
pub mod reader;
mod warm;
mod watch;
mod write;

pub use calls::{BatchAnswer, Judged};
pub use epochs::{EpochCounters, EpochError, Replace, StartFrom};
pub use figures::{CallFigures, EpochFigures, ResourceFigures, SqlLoads};
pub use guarded::Guarded;
pub use warm::WarmReport;

/// Most keys in one call, unless a resource's `max_batch_keys` says
/// otherwise (the SKUs' limit).
pub const MAX_BATCH_KEYS: usize = 1000;

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
    /// Rebuild when the capacity alarm fires; `None`:
    /// `cache.bloom_auto_rebuild`.
    pub auto_rebuild: Option<bool>,
    /// Bytes per string of the shared filter; `None`:
    /// `cache.bloom_segment_bytes`.
    pub segment_bytes: Option<u64>,
    /// Deletes told (`invalidate` with `"deleted": true`) after which the
    /// filter is rebuilt; `None`: `cache.bloom_rebuild_after_deletes`.
    pub rebuild_after_deletes: Option<u64>,
}

impl ResourceOptions {
    /// The SKU table's, from `[cache]`.
    #[must_use]
    pub fn of_cache(c: &CacheConfig) -> Self {
        Self {
            expected: c.bloom_expected,
            fpp: c.bloom_fpp,
            layout: c.bloom_layout,
            max_batch_keys: MAX_BATCH_KEYS,
            snapshot_path: c.bloom_snapshot_path.clone(),
            mode: Some(c.bloom_mode),
            auto_rebuild: Some(c.bloom_auto_rebuild),
            segment_bytes: Some(c.bloom_segment_bytes),
            rebuild_after_deletes: Some(c.bloom_rebuild_after_deletes),
        }
    }

    /// A configured resource's, from its `[[resources]]` entry (what it
    /// leaves unset is `[cache]`'s).
    #[must_use]
    pub fn of_resource(rc: &crate::config::resources::ResourceConfig) -> Self {
        Self {
            expected: rc.bloom_expected,
            fpp: rc.bloom_fpp,
            layout: rc.bloom_layout,
            max_batch_keys: rc.max_batch_keys,
            snapshot_path: rc.bloom_snapshot_path.clone(),
            mode: rc.bloom_mode,
            auto_rebuild: rc.bloom_auto_rebuild,
            segment_bytes: rc.bloom_segment_bytes,
            rebuild_after_deletes: rc.bloom_rebuild_after_deletes,
        }
    }
}

impl Default for ResourceOptions {
    fn default() -> Self {
        Self {
            expected: 100_000,
            fpp: 0.001,
            layout: BloomLayout::Blocked,
            max_batch_keys: MAX_BATCH_KEYS,
            snapshot_path: None,
            mode: None,
            auto_rebuild: None,
            segment_bytes: None,
            rebuild_after_deletes: None,
        }
    }
}

/// What a resource shares with the rest of the instance.
#[derive(Debug, Clone)]
pub struct Shared {
    /// The SQL store (the outbox lives there).
    pub store: Database,
    /// The Redis tier, when configured.
    pub redis: Option<RedisTier>,
    /// The instance's SQL bulkhead.
    pub bulkhead: Bulkhead,
    /// The Redis doorbell stream.
    pub changes: Option<crate::feed::doorbell::Doorbell>,
    /// The outbox follower, which applies other instances' entries.
    pub outbox: crate::feed::outbox::Outbox,
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

/// One guarded resource: the SKU table ([`Resource<Database>`], the
/// default resource `skus`) or any other table or source (a
/// [`Resource`] over [`SourceRows`]).
#[derive(Debug)]
pub struct Resource<R: Guarded = SourceRows> {
    /// Its name (routes, Redis namespace, outbox entries, labels).
    pub name: Arc<str>,
    /// The funnel (the crate's own: others use the calls in `parts`).
    pub(crate) reader: ShieldedReader<R>,
    /// Most keys in one call.
    pub max_batch_keys: usize,
    /// The SQL table, when the source is a configured one (its counters
    /// and watch).
    pub table: Option<SqlTable>,
    /// Call counters.
    pub counters: CallCounters,
    /// The filter's snapshot, when one is configured.
    pub persist: Option<crate::share::snapshot::Persist>,
    /// Its shared rebuilds.
    pub epochs: EpochCounters,
    /// Where its epochs live in Redis (with Redis).
    epoch_keys: Option<epochs::EpochKeys>,
    /// Its announced epochs also go on the doorbell stream, in the form
    /// the previous release led the default resource's rebuilds with (a
    /// mixed fleet adopts them both ways).
    announces_on_doorbell: bool,
    /// The outbox (replays after a snapshot or an epoch).
    outbox: crate::feed::outbox::Outbox,
    /// Deletes after which the filter is rebuilt.
    rebuild_after_deletes: u64,
    /// Its capture triggers fire (last found so by a check): its own
    /// deletes are then counted as their entries are applied, not twice.
    deletes_captured: std::sync::atomic::AtomicBool,
    store: Database,
    changes: Option<crate::feed::doorbell::Doorbell>,
    background: crate::tasks::Background,
    /// How often the watch column is read (ms; 0: no watch).
    watch_every_ms: AtomicU64,
    /// What its filter holds: this database's identity, the table, the
    /// key column and key type (`None` before the migrations: nothing is
    /// restored or adopted then). Snapshots and epochs carry it; one made
    /// for anything else is refused.
    pub identity: Option<Arc<str>>,
}

impl Resource<Database> {
    /// The SKU table as the default resource `skus`, with the `[cache]`
    /// settings: its Redis keys, shared filter and epochs under the bare
    /// prefix, as seed 000 and the previous release have them.
    ///
    /// `table`: the SKU table as a configured one, for
    /// `cache.watch_column`'s watch.
    ///
    /// # Errors
    /// The shared filter of `strict` or `redis` mode could not be opened.
    pub async fn skus(
        shared: &Shared,
        rebuild_seconds: ::metrics::Histogram,
        table: Option<SqlTable>,
    ) -> Result<Arc<Self>, crate::share::redis_filter::SharedError> {
        let c = &shared.cache;
        let options = ResourceOptions::of_cache(c);
        let place = Place {
            cache_namespace: None,
            filter_prefix: c.redis_prefix.clone(),
            announces_on_doorbell: true,
            holds: Some("skus.id"),
        };
        let shield = Shield::new(shield_config(c, &options), shared.store.key_scan())
            .with_rebuild_histogram(rebuild_seconds);
        let r = Self::assemble(
            crate::sql::SKU_RESOURCE,
            shared.store.clone(),
            shield,
            table,
            &options,
            &place,
            shared,
        )
        .await?;
        r.deletes_captured.store(
            c.capture == crate::config::Capture::Triggers,
            std::sync::atomic::Ordering::Relaxed,
        );
        if c.watch_column.is_some() {
            // Rows its watch admits are in no outbox entry: it keeps its
            // own rebuilds, as a watched resource does.
            r.set_watch_every(Duration::from_millis(c.watch_every_ms));
        }
        Ok(r)
    }
}

impl Resource<SourceRows> {
    /// A resource named `name` over `source`, registered with the outbox
    /// follower. Its filter is not built yet: `service::prepare` starts it.
    ///
    /// # Errors
    /// The shared filter of `strict` or `redis` mode could not be opened.
    pub async fn new(
        name: &str,
        source: Arc<dyn DynSource>,
        options: &ResourceOptions,
        shared: &Shared,
    ) -> Result<Arc<Self>, crate::share::redis_filter::SharedError> {
        Self::named(name, source, None, options, shared).await
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
    ) -> Result<Arc<Self>, crate::share::redis_filter::SharedError> {
        Self::named(name, Arc::new(table.clone()), Some(table), options, shared).await
    }

    async fn named(
        name: &str,
        source: Arc<dyn DynSource>,
        table: Option<SqlTable>,
        options: &ResourceOptions,
        shared: &Shared,
    ) -> Result<Arc<Self>, crate::share::redis_filter::SharedError> {
        let c = &shared.cache;
        // A shared filter holds keys folded one way: another fold (an
        // upgrade, a collation changed) gets a filter of its own.
        let fold = table.as_ref().map(DynSource::fold).unwrap_or_default();
        let filter_prefix = format!(
            "{}{}",
            c.redis_prefix,
            crate::wire::resource_filter_namespace(&format!("{name}{}", fold.identity_suffix()))
        );
        let place = Place {
            // An embedder's source says nothing of its rows' shape: `s`.
            cache_namespace: Some(resource_namespace(
                name,
                &table
                    .as_ref()
                    .map_or_else(|| "s".into(), SqlTable::value_identity),
            )),
            filter_prefix,
            announces_on_doorbell: false,
            holds: None,
        };
        let rows = SourceRows(source);
        let shield = Shield::new(shield_config(c, options), rows.key_scan()).with_name(name);
        Self::assemble(name, rows, shield, table, options, &place, shared).await
    }
}

/// Where a resource lives in Redis.
struct Place {
    /// Its cache keys' namespace (`None`: the bare prefix).
    cache_namespace: Option<String>,
    /// Its shared filter's prefix.
    filter_prefix: String,
    /// Its epochs are announced on the doorbell too, in the previous
    /// release's form (the default resource).
    announces_on_doorbell: bool,
    /// What its filter holds, without a configured table (`None`: an
    /// embedder's source, `source {name}`).
    holds: Option<&'static str>,
}

fn shield_config(c: &CacheConfig, options: &ResourceOptions) -> ShieldConfig {
    ShieldConfig {
        enabled: c.bloom_enabled,
        layout: options.layout,
        expected: options.expected,
        fpp: options.fpp,
        auto_rebuild: options.auto_rebuild.unwrap_or(c.bloom_auto_rebuild),
        scan_rows_per_sec: c.bloom_scan_rows_per_sec,
    }
}

impl<R: Guarded> Resource<R> {
    async fn assemble(
        name: &str,
        rows: R,
        shield: Shield,
        table: Option<SqlTable>,
        options: &ResourceOptions,
        place: &Place,
        shared: &Shared,
    ) -> Result<Arc<Self>, crate::share::redis_filter::SharedError> {
        let c = &shared.cache;
        let shield = shield.with_background(shared.background.clone());
        let l1 = L1::new(
            c.l1_capacity,
            Duration::from_secs(c.l1_ttl_secs),
            Duration::from_secs(c.l1_negative_ttl_secs),
        );
        let redis = shared.redis.as_ref().map(|r| match &place.cache_namespace {
            Some(ns) => r.namespaced(ns),
            None => r.clone(),
        });
        let scan = rows.key_scan();
        let key_type = rows.key_type();
        let mut reader =
            ShieldedReader::new(Arc::new(shield), l1, redis, rows, shared.bulkhead.clone());
        reader.audit = Arc::new(crate::resource::reader::audit::Audit::every(
            c.bloom_audit_every_ms,
            // The feed's bound, or the late check's period (a commit whose
            // number was given up is found by it), and a second more.
            shared.outbox.out_of_step.max(Duration::from_secs(5)) + Duration::from_secs(1),
        ));
        let mode = options.mode.unwrap_or(c.bloom_mode);
        // The SKU table, a configured table, or a source of the embedder.
        let holds = match (&table, place.holds) {
            (Some(t), _) => t.describe(),
            (None, Some(holds)) => holds.to_owned(),
            (None, None) => format!("source {name}"),
        };
        let identity: Option<Arc<str>> = shared
            .store
            .identity()
            .map(|db| Arc::from(crate::wire::filter_identity(db, &holds, key_type)));
        if let (BloomMode::Strict | BloomMode::Redis, Some(target)) = (mode, &shared.target) {
            let filter = crate::share::redis_filter::SharedFilter::connect(
                target,
                &place.filter_prefix,
                identity.as_deref(),
                options.expected,
                options.fpp,
                options.segment_bytes.unwrap_or(c.bloom_segment_bytes),
                Duration::from_millis(c.redis_timeout_ms),
                scan,
                c.bloom_scan_rows_per_sec,
            )
            .await?
            .with_background(shared.background.clone());
            reader.set_mode(if mode == BloomMode::Redis {
                crate::resource::reader::Mode::Redis(filter)
            } else {
                crate::resource::reader::Mode::Strict(filter)
            });
        }
        let snapshot = options.snapshot_path.clone().or_else(|| {
            c.bloom_snapshot_path
                .as_ref()
                .map(|p| crate::config::resources::derived_snapshot_path(p, name))
        });
        let persist = snapshot.map(|path| {
            crate::share::snapshot::Persist::new(
                path,
                options.layout,
                options.fpp,
                (name, key_type),
                shared.outbox.clone(),
            )
            .with_identity(identity.clone())
            .with_fold(reader.store.fold())
        });
        let r = Arc::new(Self {
            epochs: EpochCounters::default(),
            identity,
            epoch_keys: shared
                .changes
                .as_ref()
                .map(|_| epochs::EpochKeys::under(&place.filter_prefix)),
            announces_on_doorbell: place.announces_on_doorbell,
            outbox: shared.outbox.clone(),
            rebuild_after_deletes: options
                .rebuild_after_deletes
                .unwrap_or(c.bloom_rebuild_after_deletes)
                .max(1),
            deletes_captured: std::sync::atomic::AtomicBool::new(false),
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
        });
        // Weakly held: the owners decide when it ends.
        let weak: std::sync::Weak<dyn crate::feed::outbox::Follower> = Arc::downgrade(&r) as _;
        shared.outbox.register(name, weak);
        Ok(r)
    }

    /// How keys are spelled.
    #[must_use]
    pub fn key_type(&self) -> KeyType {
        self.reader.store.key_type()
    }

    /// How text keys are folded (see [`crate::key::Fold`]).
    #[must_use]
    pub fn fold(&self) -> crate::key::Fold {
        self.reader.store.fold()
    }

    /// Reads the SQL table's watch column every `every` once started.
    pub fn set_watch_every(&self, every: Duration) {
        self.watch_every_ms
            .store(every.as_millis() as u64, Ordering::Relaxed);
    }

    /// Whether a watch column admits rows here (a watched table keeps its
    /// own rebuilds: it neither restores nor adopts a filter).
    #[must_use]
    pub fn is_watched(&self) -> bool {
        self.watch_every_ms.load(Ordering::Relaxed) > 0 && self.table.is_some()
    }

    /// Starts the watch of the SQL table's watch column, if it has one.
    /// Call it before the filter's build starts: it reads the column's
    /// largest value first, so a row inserted while the build's scan runs
    /// is past that value (the watch's) or was there before the scan (the
    /// scan's), never neither.
    pub async fn start_watch(self: &Arc<Self>) {
        if !self.is_watched() {
            return;
        }
        let every = self.watch_every_ms.load(Ordering::Relaxed);
        let first = match &self.table {
            Some(t) => match t.watched_max().await {
                Ok(top) => Some(top),
                Err(e) => {
                    tracing::warn!(resource = %self.name, error = %e, "watch: reading the largest value failed; the first poll reads it");
                    None
                }
            },
            None => None,
        };
        self.background.spawn(watch::watch(
            Arc::downgrade(self),
            Duration::from_millis(every),
            first,
        ));
    }

    /// In `redis` mode, where the shared filter alone answers: merges
    /// every key of the source into it again (rows were written that no
    /// entry names, so it lacks them as the in-process filter does); its
    /// "no" is not a 404 until that succeeds. In `strict` mode the
    /// rebuilt in-process filter's "maybe" already lets them through.
    pub(crate) fn fill_shared_again(&self) {
        if let crate::resource::reader::Mode::Redis(shared) = self.reader.mode() {
            shared.fill_in_background();
        }
    }

    /// At a start that scans after a capture gap: the shared filter, which
    /// outlives the fleet, is filled again unless this start made it.
    pub(crate) fn fill_shared_after_a_gap(&self) {
        if let crate::resource::reader::Mode::Redis(shared) = self.reader.mode() {
            if !shared.created_here {
                shared.fill_in_background();
            }
        }
    }

    /// The filter.
    #[must_use]
    pub fn shield(&self) -> &Arc<Shield> {
        &self.reader.shield
    }

    /// Publishes the filter from its snapshot, if one is configured and
    /// can be trusted (see [`crate::share::snapshot::Persist::restore`]).
    /// Returns the outbox position it is complete up to and the rebuild
    /// requests it covers; `None` when the filter must be built from the
    /// source.
    pub async fn restore(&self) -> Option<(i64, i64)> {
        let persist = self.persist.as_ref()?;
        if self.is_watched() {
            // Rows its watch admitted after the last save are in no outbox
            // entry a replay could add: a watched table scans at start.
            tracing::info!(resource = %self.name, "a watched table scans at start; its snapshot is not used");
            return None;
        }
        match persist.restore(self.shield(), &self.name).await {
            Ok(restored) => Some(restored),
            Err(why @ crate::shield::AdoptError::EarlierRelease(_)) => {
                tracing::info!(resource = %self.name, %why, "filter snapshot of an earlier release not used; scanning its source (the next save writes this release's)");
                None
            }
            Err(crate::shield::AdoptError::Gone) => {
                tracing::info!(resource = %self.name, path = %persist.path().display(), "no filter snapshot yet; scanning its source");
                None
            }
            Err(why) => {
                tracing::warn!(resource = %self.name, %why, "filter snapshot not used; scanning its source");
                None
            }
        }
    }

    /// Starts the filter's capacity monitor (every `monitor_every`, when
    /// given) and, with a snapshot configured, its saver.
    pub fn spawn_upkeep(&self, monitor_every: Option<Duration>, snapshot_every: Duration) {
        if let Some(every) = monitor_every {
            self.shield().spawn_monitor(every);
        }
        if let Some(persist) = &self.persist {
            persist.spawn_saver(self.shield(), snapshot_every, &self.background);
        }
    }

    /// Reads one key through the funnel (poll it to its end or drop it:
    /// see [`ShieldedReader::lookup`]).
    ///
    /// # Errors
    /// [`AppError::Unavailable`] or [`AppError::Overloaded`].
    pub async fn get(&self, key: R::Key) -> Result<Lookup<R::Row>, AppError> {
        self.reader.lookup(key).await
    }
}
