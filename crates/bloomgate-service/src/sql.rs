//! The source of truth: SQL (SQLite, MySQL/MariaDB, PostgreSQL) via sqlx's `Any`.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx::any::{AnyPoolOptions, AnyRow};
use sqlx::{AnyPool, Row};

use crate::config::SqlConfig;
use crate::model::Sku;
use crate::wire::kind;

mod audit;
mod capture;
mod connect;
mod error;
mod hints;
mod identity;
mod limits;
mod many;
mod migrations;
pub mod outbox;
mod owners;
mod privileges;
mod recorded;
mod scan;
pub mod table;

pub use crate::source::{Failure, KeyRange, Page, StoreError};
pub use capture::{CaptureState, CaptureTarget, CAPTURED, CAPTURE_VERSION, NOTIFY_CHANNEL};
pub(crate) use error::err;
pub use error::is_permission_denied;
pub(crate) use error::{driver_error, is_unique_violation};
pub use hints::connect_hint;
pub(crate) use limits::{StatementLimit, Within};
pub use migrations::OutboxOff;
pub(crate) use scan::{page_statement, text_at};

/// Which SQL dialect the URL selected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// SQLite (embedded default).
    Sqlite,
    /// MySQL or MariaDB.
    MySql,
    /// PostgreSQL.
    Postgres,
}

/// The resource every SKU change is recorded under in the outbox.
pub const SKU_RESOURCE: &str = "skus";

const COLUMNS: &str =
    "id, name, original_price, seckill_price, stock, seckill_start, seckill_end, updated_at";

/// Counters of the queries this store sent, by outcome.
#[derive(Debug, Default)]
pub struct StoreCounters {
    /// Statements that took longer than `sql.statement_timeout_ms`.
    pub timeouts: AtomicU64,
    /// Point lookups sent.
    pub queries: AtomicU64,
    /// Point lookups that found a row.
    pub found: AtomicU64,
    /// Point lookups that found nothing.
    pub missing: AtomicU64,
    /// Full id scans started (filter builds).
    pub id_scans: AtomicU64,
    /// Full `COUNT(*)` statements sent (the background row check only).
    pub full_counts: AtomicU64,
    /// Statements that failed (timeouts and unique-key collisions apart).
    pub errors: AtomicU64,
    /// Writes that committed so late that their change was recorded again.
    pub rerecorded: AtomicU64,
    /// Background statements (outbox reads and trims, the audit), apart.
    pub background: AtomicU64,
    /// Statements slower than `sql.slow_query_ms`, by statement.
    pub slow: Mutex<BTreeMap<&'static str, u64>>,
}

impl StoreCounters {
    /// Slow statements so far, by statement name.
    #[must_use]
    pub fn slow_by_statement(&self) -> BTreeMap<&'static str, u64> {
        crate::sync::lock(&self.slow).clone()
    }
}

/// The SKU table.
#[derive(Debug, Clone)]
pub struct Database {
    pub(crate) pool: AnyPool,
    backend: Backend,
    pub(crate) limit: StatementLimit,
    /// The bound on background statements (scans, counts, the outbox).
    pub(crate) bg_limit: StatementLimit,
    /// Key ranges a rebuild reads at once.
    scan_parallel: usize,
    /// The driver's own pool for key scans (MySQL and PostgreSQL), opened
    /// lazily: rows decoded without `Any`'s conversion.
    scan_pool: scan::ScanPool,
    /// PostgreSQL's `LISTEN` connection (see `crate::feed::outbox`).
    pub(crate) listen_pool: scan::ListenPool,
    /// This process's name in the outbox's `origin` column.
    origin: Arc<str>,
    /// A write that takes longer than this between recording its change
    /// and committing records it again (see `crate::feed::outbox`).
    pub(crate) rerecord_after: Duration,
    /// Query counters, shared by clones.
    pub counters: Arc<StoreCounters>,
    /// Test hook: where a write waits after recording its change, before
    /// its transaction commits (keyed by the SKU id).
    #[doc(hidden)]
    pub before_commit: Arc<crate::pause::PausePoint>,
    /// Test hook: where a write waits after writing its row, before it
    /// records its change (keyed by the SKU id).
    #[doc(hidden)]
    pub after_row: Arc<crate::pause::PausePoint>,
    /// The instance's shutdown signal: tracks late entries recorded again.
    background: crate::tasks::Background,
    /// This database's identity, read after the migrations.
    identity: Arc<std::sync::OnceLock<String>>,
    /// `sql.outbox` resolved off: nothing is recorded ([`OutboxOff`]).
    outbox_off: Arc<std::sync::atomic::AtomicBool>,
    /// The scan readers read a replica (`scan_database_url`).
    scan_replica: bool,
}

impl Database {
    /// Connects (creating a SQLite file and its directory if needed) and
    /// runs the migrations.
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        Self::connect_with(url, &SqlConfig::default()).await
    }

    /// As [`Database::connect`], with the pool size and timeouts of `c`.
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn connect_with(url: &str, c: &SqlConfig) -> Result<Self, StoreError> {
        let store = Self::connect_unmigrated(url, c).await?;
        store.migrate().await?;
        Ok(store)
    }

    /// Tracks the background work this store starts under `bg`.
    #[must_use]
    pub fn with_background(mut self, bg: crate::tasks::Background) -> Self {
        self.background = bg;
        self
    }

    /// As [`Database::connect_with`] without running the migrations (call
    /// [`Database::migrate`]): for checks that must leave the database as
    /// they found it when they fail.
    ///
    /// # Errors
    /// [`StoreError`] when the database is unreachable.
    pub async fn connect_unmigrated(url: &str, c: &SqlConfig) -> Result<Self, StoreError> {
        sqlx::any::install_default_drivers();
        let backend = if url.starts_with("sqlite:") {
            Backend::Sqlite
        } else if url.starts_with("postgres") {
            Backend::Postgres
        } else {
            Backend::MySql
        };
        let mut url = url.to_string();
        if backend == Backend::Sqlite {
            url = connect::prepare_sqlite(&url);
        }
        let acquire = Duration::from_millis(c.acquire_timeout_ms);
        let pool = match AnyPoolOptions::new()
            .max_connections(if backend == Backend::Sqlite {
                c.pool_size.min(4)
            } else {
                c.pool_size
            })
            .acquire_timeout(acquire)
            .connect(&url)
            .await
        {
            Ok(pool) => pool,
            // The pool retries a refused connection until its acquire
            // timeout and then says only that it timed out: one direct
            // attempt says why.
            Err(sqlx::Error::PoolTimedOut) => {
                use sqlx::Connection;
                let why =
                    match tokio::time::timeout(acquire, sqlx::AnyConnection::connect(&url)).await {
                        Ok(Err(e)) => e,
                        _ => sqlx::Error::PoolTimedOut,
                    };
                return Err(err("connect")(why));
            }
            Err(e) => return Err(err("connect")(e)),
        };
        let counters = Arc::<StoreCounters>::default();
        let store = Self {
            pool,
            backend,
            limit: StatementLimit {
                timeout: Duration::from_millis(c.statement_timeout_ms),
                slow: Duration::from_millis(c.slow_query_ms),
                counters: Arc::clone(&counters),
            },
            bg_limit: StatementLimit {
                timeout: Duration::from_millis(c.background_statement_timeout_ms),
                slow: Duration::from_millis(c.background_statement_timeout_ms / 2),
                counters: Arc::clone(&counters),
            },
            scan_parallel: c.scan_parallel.max(1) as usize,
            scan_pool: scan::ScanPool::lazy(backend, &url, c),
            listen_pool: scan::ListenPool::lazy(backend, &url),
            origin: format!("{:016x}", fastrand::u64(..)).into(),
            rerecord_after: Duration::from_millis(c.outbox_gap_ms / 2),
            counters,
            before_commit: Arc::default(),
            after_row: Arc::default(),
            background: crate::tasks::Background::new(),
            identity: Arc::default(),
            outbox_off: Arc::default(),
            scan_replica: false,
        };
        Ok(store)
    }

    /// This process's name in the outbox (its follower skips its entries).
    #[must_use]
    pub fn origin(&self) -> &str {
        &self.origin
    }

    /// The dialect in use.
    #[must_use]
    pub const fn backend(&self) -> Backend {
        self.backend
    }

    /// The database's clock in milliseconds since the epoch, as SQL: the
    /// outbox's `at` comes from the one clock every instance shares, so
    /// instances' clocks may disagree without moving a start position.
    pub(crate) const fn now_ms_sql(&self) -> &'static str {
        match self.backend {
            Backend::Sqlite => "CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)",
            Backend::MySql => "CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED)",
            Backend::Postgres => "CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT)",
        }
    }

    /// Placeholder `n` (1-based) in this dialect.
    pub(crate) fn ph(&self, n: usize) -> String {
        match self.backend {
            Backend::Postgres => format!("${n}"),
            _ => "?".into(),
        }
    }

    fn phs(&self, from: usize, count: usize) -> String {
        (from..from + count)
            .map(|i| self.ph(i))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// One SKU by id (counted in [`StoreCounters`]).
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn get(&self, id: i64) -> Result<Option<Sku>, StoreError> {
        self.counters.queries.fetch_add(1, Ordering::Relaxed);
        let q = format!("SELECT {COLUMNS} FROM skus WHERE id = {}", self.ph(1));
        let row = sqlx::query(&q)
            .bind(id)
            .fetch_optional(&self.pool)
            .within(&self.limit, "get")
            .await
            .map_err(err("get"))?;
        let sku = row
            .map(|r| sku_from_row(&r))
            .transpose()
            .map_err(err("get"))?;
        let counter = if sku.is_some() {
            &self.counters.found
        } else {
            &self.counters.missing
        };
        counter.fetch_add(1, Ordering::Relaxed);
        Ok(sku)
    }

    /// The SKUs with ids in `(after, upto]`, by id.
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn range(&self, after: i64, upto: i64) -> Result<Vec<Sku>, StoreError> {
        let q = format!(
            "SELECT {COLUMNS} FROM skus WHERE id > {} AND id <= {} ORDER BY id",
            self.ph(1),
            self.ph(2)
        );
        sqlx::query(&q)
            .bind(after)
            .bind(upto)
            .fetch_all(&self.pool)
            .within(&self.limit, "range")
            .await
            .map_err(err("range"))?
            .iter()
            .map(sku_from_row)
            .collect::<Result<_, _>>()
            .map_err(err("range"))
    }

    /// Up to `limit` ids above `after`, ascending (keyset pagination:
    /// `after = 0` starts from the first): one page of the id scan that
    /// [`Database::for_each_id_batch`] and the warm walk.
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn page_ids(&self, after: i64, limit: u64) -> Result<Vec<i64>, StoreError> {
        let q = format!(
            "SELECT id FROM skus WHERE id > {} ORDER BY id LIMIT {}",
            self.ph(1),
            self.ph(2)
        );
        sqlx::query(&q)
            .bind(after)
            .bind(limit as i64)
            .fetch_all(&self.pool)
            .within(&self.limit, "scan ids")
            .await
            .map_err(err("scan ids"))?
            .iter()
            .map(|r| r.try_get::<i64, _>(0))
            .collect::<Result<_, _>>()
            .map_err(err("scan ids"))
    }

    /// Inserts a new SKU and records it in the outbox, in one transaction.
    /// Returns false (and records nothing) when the id is taken.
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn insert(&self, sku: &Sku) -> Result<bool, StoreError> {
        self.insert_then(sku, || {}).await
    }

    /// As [`Database::insert`], calling `before_commit` after the row and
    /// its entry are written and before the transaction commits: the
    /// create route adds the id to the filter there, so the filter holds
    /// it before any instance can see the row (a commit that then fails
    /// leaves a harmless "maybe"; one that succeeds finds the id in place,
    /// and the outbox follower's own learn of it changes nothing).
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn insert_then(
        &self,
        sku: &Sku,
        before_commit: impl FnOnce() + Send,
    ) -> Result<bool, StoreError> {
        let q = format!("INSERT INTO skus ({COLUMNS}) VALUES ({})", self.phs(1, 8));
        match self
            .write_recorded(
                bind_sku(sqlx::query(&q), sku),
                "insert",
                sku.id,
                kind::CREATED,
                before_commit,
            )
            .await
        {
            Ok(_) => Ok(true),
            Err(e) if driver_error(&e).is_some_and(is_unique_violation) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// The next id after the largest one in use, or `None` when the largest
    /// is `i64::MAX` and there is no next one.
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn next_id(&self) -> Result<Option<i64>, StoreError> {
        let row = sqlx::query("SELECT COALESCE(MAX(id), 0) FROM skus")
            .fetch_one(&self.pool)
            .within(&self.limit, "next id")
            .await
            .map_err(err("next id"))?;
        Ok(row
            .try_get::<i64, _>(0)
            .map_err(err("next id"))?
            .checked_add(1))
    }

    /// Replaces a SKU's fields and records the change in the outbox, in one
    /// transaction. Returns false when no such id.
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn update(&self, sku: &Sku) -> Result<bool, StoreError> {
        let q = format!(
            "UPDATE skus SET name = {}, original_price = {}, seckill_price = {}, stock = {}, seckill_start = {}, seckill_end = {}, updated_at = {} WHERE id = {}",
            self.ph(1), self.ph(2), self.ph(3), self.ph(4), self.ph(5), self.ph(6), self.ph(7), self.ph(8)
        );
        let write = sqlx::query(&q)
            .bind(sku.name.clone())
            .bind(sku.original_price)
            .bind(sku.seckill_price)
            .bind(sku.stock)
            .bind(sku.seckill_start)
            .bind(sku.seckill_end)
            .bind(sku.updated_at)
            .bind(sku.id);
        Ok(self
            .write_recorded(write, "update", sku.id, kind::UPDATED, || {})
            .await?
            > 0)
    }

    /// Deletes a SKU and records the change in the outbox, in one
    /// transaction. Returns false when no such id.
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn delete(&self, id: i64) -> Result<bool, StoreError> {
        let q = format!("DELETE FROM skus WHERE id = {}", self.ph(1));
        let write = sqlx::query(&q).bind(id);
        Ok(self
            .write_recorded(write, "delete", id, kind::DELETED, || {})
            .await?
            > 0)
    }

    /// Inserts the deterministic catalogue SKUs with ids `from..=to` that do
    /// not exist yet, in batches of 500 rows per statement, calling
    /// `progress` with the number of rows handled after each batch. Each
    /// batch that inserted rows records, in its transaction, an outbox
    /// entry asking every instance to rebuild its filter.
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn seed_range(
        &self,
        from: i64,
        to: i64,
        mut progress: impl FnMut(u64),
    ) -> Result<u64, StoreError> {
        const BATCH: i64 = 500;
        let ignore = match self.backend {
            Backend::MySql => "INSERT IGNORE INTO",
            Backend::Sqlite => "INSERT OR IGNORE INTO",
            Backend::Postgres => "INSERT INTO",
        };
        let suffix = if self.backend == Backend::Postgres {
            " ON CONFLICT (id) DO NOTHING"
        } else {
            ""
        };
        let mut inserted = 0u64;
        let mut start = from;
        while start <= to {
            let end = (start + BATCH - 1).min(to);
            let n = (end - start + 1) as usize;
            let values: Vec<String> = (0..n)
                .map(|i| format!("({})", self.phs(i * 8 + 1, 8)))
                .collect();
            let q = format!(
                "{ignore} skus ({COLUMNS}) VALUES {}{suffix}",
                values.join(", ")
            );
            let mut query = sqlx::query(&q);
            for id in start..=end {
                query = bind_sku(query, &crate::model::catalogue_sku(id));
            }
            // Each batch asks every instance to rebuild in its own
            // transaction, so a seed that dies part-way leaves no row that
            // no entry accounts for.
            let mut tx = self
                .pool
                .begin()
                .within(&self.limit, "begin")
                .await
                .map_err(err("seed"))?;
            let res = query
                .execute(&mut *tx)
                .within(&self.limit, "seed")
                .await
                .map_err(err("seed"))?;
            if res.rows_affected() > 0 {
                self.record_in(
                    &mut tx,
                    SKU_RESOURCE,
                    &crate::wire::rebuild_request_key(),
                    kind::REBUILD,
                )
                .await?;
            }
            tx.commit()
                .within(&self.limit, "commit")
                .await
                .map_err(err("seed"))?;
            inserted += res.rows_affected();
            progress(n as u64);
            start = end + 1;
        }
        Ok(inserted)
    }

    /// Closes the pool.
    pub async fn close(&self) {
        self.pool.close().await;
        self.scan_pool.close().await;
        if let Some(p) = &self.listen_pool.0 {
            p.close().await;
        }
    }
}

fn bind_sku<'q>(
    q: sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments<'q>>,
    s: &Sku,
) -> sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments<'q>> {
    q.bind(s.id)
        .bind(s.name.clone())
        .bind(s.original_price)
        .bind(s.seckill_price)
        .bind(s.stock)
        .bind(s.seckill_start)
        .bind(s.seckill_end)
        .bind(s.updated_at)
}

fn sku_from_row(r: &AnyRow) -> Result<Sku, sqlx::Error> {
    Ok(Sku {
        id: r.try_get(0)?,
        name: r.try_get(1)?,
        original_price: r.try_get(2)?,
        seckill_price: r.try_get(3)?,
        stock: r.try_get(4)?,
        seckill_start: r.try_get(5)?,
        seckill_end: r.try_get(6)?,
        updated_at: r.try_get(7)?,
    })
}
