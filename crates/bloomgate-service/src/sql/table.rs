//! [`SqlTable`]: a [`Source`] over a table named in the configuration.
//!
//! Opening it reads the database's catalogue (SQLite's `pragma_table_info`,
//! `information_schema.columns` elsewhere) and refuses a table or column
//! that is not there, and a key column whose type does not match
//! `key_type`, naming the config key; it writes nothing. Names reach a
//! statement only after they passed [`is_identifier`] *and* were found in
//! the catalogue, quoted in the dialect's way. Values are selected with a
//! cast to one of four kinds (integer, float, boolean, text), so dates,
//! decimals and anything else arrive as text, which sqlx's `Any` driver
//! decodes on every backend.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use serde_json::Value;
use sqlx::any::AnyRow;
use sqlx::Row as _;

use crate::config::resources::{is_identifier, ResourceConfig};
use crate::config::ConfigError;
use crate::key::{Fold, Key, KeyType};
use crate::source::{BoxFuture, DynSource, KeyBatch, KeyRange, Page, Row};
use crate::sql::{err, page_statement, text_at, Backend, Database, StoreError, Within};

mod catalogue;
mod watch;

pub use catalogue::Kind;
use catalogue::{catalogue, is_text_type, kind_of, Column};

use watch::Watch;
pub use watch::WatchValue;

/// Counters of one table.
#[derive(Debug, Default)]
pub struct TableCounters {
    /// Every statement sent (loads, batch loads, scans, counts, watches).
    pub statements: AtomicU64,
    /// Point loads.
    pub loads: AtomicU64,
    /// Point loads that found a row.
    pub found: AtomicU64,
    /// Batch loads (one `IN (…)` each).
    pub batch_loads: AtomicU64,
    /// Pages of a key scan (a filter build reads them all).
    pub scans: AtomicU64,
}

/// A configured table as a [`Source`].
#[derive(Debug, Clone)]
pub struct SqlTable {
    store: Database,
    key_type: KeyType,
    /// `SELECT <columns> FROM <table>`.
    select: Arc<str>,
    /// The selected columns, cast to their kinds, comma-separated.
    list: Arc<str>,
    /// The quoted key column.
    key: Arc<str>,
    /// The quoted table.
    table: Arc<str>,
    /// The table's plain name (for the catalogue's statistics).
    table_name: Arc<str>,
    /// The key column's plain name.
    key_name: Arc<str>,
    /// The key as selected (cast to its kind).
    key_select: Arc<str>,
    columns: Arc<[Column]>,
    /// The watch column.
    watch: Option<Arc<Watch>>,
    /// How the key column compares (see [`catalogue`]).
    fold: Fold,
    /// Counters, shared by clones.
    pub counters: Arc<TableCounters>,
}

impl SqlTable {
    /// Checks `config` (the resource at `index`) against the catalogue and
    /// prepares its statements.
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] naming `resources[index].<field>` for an
    /// unknown table or column or a key type that does not match;
    /// [`StoreError`] (as the `Err` of the outer result) when the
    /// catalogue cannot be read.
    pub async fn open(
        store: &Database,
        config: &ResourceConfig,
        index: usize,
    ) -> Result<Result<Self, ConfigError>, StoreError> {
        Self::open_as(store, config, &|f| ResourceConfig::key_of(index, f)).await
    }

    /// [`SqlTable::open`], its errors naming `key(field)`.
    ///
    /// # Errors
    /// As [`SqlTable::open`].
    pub async fn open_as(
        store: &Database,
        config: &ResourceConfig,
        key: &(dyn Fn(&str) -> String + Sync),
    ) -> Result<Result<Self, ConfigError>, StoreError> {
        let bad = |field: &str, message: String| {
            Ok(Err(ConfigError::Invalid {
                key: key(field),
                message,
            }))
        };
        // Validated already; checked again because nothing unchecked may
        // reach a statement.
        for name in [&config.table, &config.key]
            .into_iter()
            .chain(&config.columns)
            .chain(&config.watch_column)
        {
            if !is_identifier(name) {
                let field = if name == &config.table {
                    "table"
                } else if name == &config.key {
                    "key"
                } else if config.columns.contains(name) {
                    "columns"
                } else {
                    "watch_column"
                };
                return bad(field, format!("{name:?} is not a plain identifier"));
            }
        }
        let backend = store.backend();
        let catalogue = catalogue(store, &config.table).await?;
        if catalogue.is_empty() {
            return bad(
                "table",
                format!(
                    "no table {:?} in the database (or it has no columns)",
                    config.table
                ),
            );
        }
        let find = |name: &str| catalogue.iter().find(|(n, _, _)| n == name);
        let Some((_, key_data_type, key_column_type)) = find(&config.key) else {
            return bad(
                "key",
                format!("table {:?} has no column {:?}", config.table, config.key),
            );
        };
        let key_ok = match config.key_type {
            KeyType::Int => kind_of(backend, key_data_type, key_column_type) == Kind::Int,
            KeyType::Text => is_text_type(backend, key_data_type),
        };
        if !key_ok {
            return bad(
                "key_type",
                format!(
                    "column {:?} is {key_data_type}, which is not a{} column",
                    config.key,
                    match config.key_type {
                        KeyType::Int => "n integer",
                        KeyType::Text => " text",
                    }
                ),
            );
        }
        let mut columns = Vec::new();
        match config.selected() {
            Some(names) => {
                for name in names {
                    let Some((n, dt, ct)) = find(name) else {
                        return bad(
                            "columns",
                            format!("table {:?} has no column {name:?}", config.table),
                        );
                    };
                    columns.push(Column {
                        name: n.clone(),
                        kind: kind_of(backend, dt, ct),
                    });
                }
            }
            None => columns.extend(catalogue.iter().map(|(n, dt, ct)| Column {
                name: n.clone(),
                kind: kind_of(backend, dt, ct),
            })),
        }
        let watch = match &config.watch_column {
            Some(w) => {
                let Some((n, dt, ct)) = find(w) else {
                    return bad(
                        "watch_column",
                        format!("table {:?} has no column {w:?}", config.table),
                    );
                };
                let as_int = kind_of(backend, dt, ct) == Kind::Int;
                let lower = dt.to_ascii_lowercase();
                let timely = lower.contains("date") || lower.contains("time");
                if !as_int && !timely && !is_text_type(backend, dt) {
                    return bad(
                        "watch_column",
                        format!(
                            "column {n:?} is {dt}: a watch column must be an integer, text, date or time column (other values do not sort as their text)"
                        ),
                    );
                }
                // PostgreSQL compares a timestamp with text only after a
                // cast of the bound value to the column's type.
                let bound = match backend {
                    Backend::Postgres if !as_int && is_identifier(ct) => {
                        format!("CAST({} AS {ct})", store.ph(1))
                    }
                    _ => store.ph(1),
                };
                let column = quote(backend, n);
                Some(Arc::new(Watch {
                    selected: cast(
                        backend,
                        &column,
                        if as_int { Kind::Int } else { Kind::Text },
                    ),
                    column,
                    as_int,
                    bound,
                }))
            }
            None => None,
        };
        let list: Vec<String> = columns
            .iter()
            .map(|c| cast(backend, &quote(backend, &c.name), c.kind))
            .collect();
        let table = quote(backend, &config.table);
        let key_quoted = quote(backend, &config.key);
        let key_kind = match config.key_type {
            KeyType::Int => Kind::Int,
            KeyType::Text => Kind::Text,
        };
        let fold = match config.key_type {
            KeyType::Int => Fold::Exact,
            KeyType::Text => {
                let (fold, name) = catalogue::key_fold(store, &config.table, &config.key).await?;
                catalogue::tell(&config.table, &config.key, fold, &name);
                fold
            }
        };
        Ok(Ok(Self {
            store: store.clone(),
            key_type: config.key_type,
            select: format!("SELECT {} FROM {table}", list.join(", ")).into(),
            list: list.join(", ").into(),
            key_select: cast(backend, &key_quoted, key_kind).into(),
            key: key_quoted.into(),
            table: table.into(),
            table_name: config.table.as_str().into(),
            key_name: config.key.as_str().into(),
            columns: columns.into(),
            watch,
            fold,
            counters: Arc::default(),
        }))
    }

    /// `table.key` as configured (plain names), with the key's fold where
    /// it is not exact, for identities.
    #[must_use]
    pub fn describe(&self) -> String {
        format!(
            "{}.{}{}",
            self.table_name,
            self.key_name,
            self.fold.identity_suffix()
        )
    }

    /// What a cached value of this table holds: its key column, fold and
    /// selected columns with their kinds, as a short tag (part of the
    /// values' Redis namespace, see [`crate::wire::resource_namespace`]).
    #[must_use]
    pub fn value_identity(&self) -> String {
        let fold = self.fold.describe();
        let mut parts = vec![&*self.key_name, fold.as_str()];
        let kinds: Vec<String> = self
            .columns
            .iter()
            .map(|c| format!("{:?}", c.kind))
            .collect();
        for (c, k) in self.columns.iter().zip(&kinds) {
            parts.push(&c.name);
            parts.push(k);
        }
        crate::wire::short_tag(&parts)
    }

    fn bind_key<'q>(
        q: sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments<'q>>,
        key: &Key,
    ) -> sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments<'q>> {
        match key {
            Key::Int(i) => q.bind(*i),
            Key::Text(s) | Key::Loose(s) => q.bind(s.clone()),
        }
    }

    fn key_from(&self, row: &AnyRow, at: usize) -> Result<Key, sqlx::Error> {
        Ok(match self.key_type {
            KeyType::Int => Key::Int(row.try_get::<i64, _>(at)?),
            KeyType::Text => self
                .fold
                .apply(Key::Text(text_at(row, at)?.unwrap_or_default())),
        })
    }

    fn row_from(&self, row: &AnyRow) -> Row {
        let mut out = Row::new();
        for (i, c) in self.columns.iter().enumerate() {
            out.insert(c.name.clone(), value(row, i, c.kind));
        }
        out
    }

    fn count_statement(&self) {
        self.counters.statements.fetch_add(1, Ordering::Relaxed);
    }
}

fn quote(backend: Backend, ident: &str) -> String {
    match backend {
        Backend::MySql => format!("`{ident}`"),
        _ => format!("\"{ident}\""),
    }
}

fn cast(backend: Backend, column: &str, kind: Kind) -> String {
    match (backend, kind) {
        (Backend::Sqlite, Kind::Text) => format!("CAST({column} AS TEXT)"),
        // sqlx's Any driver refuses a row holding a column it sees as BOOLEAN.
        (Backend::Sqlite, Kind::Bool) => format!("CAST({column} AS INTEGER)"),
        (Backend::Sqlite, _) => column.to_owned(),
        (Backend::MySql, Kind::Int | Kind::Bool) => format!("CAST({column} AS SIGNED)"),
        (Backend::MySql, Kind::Float) => format!("CAST({column} AS DOUBLE)"),
        (Backend::MySql, Kind::Text) => format!("CAST({column} AS CHAR)"),
        (Backend::Postgres, Kind::Int) => format!("CAST({column} AS BIGINT)"),
        (Backend::Postgres, Kind::Float) => format!("CAST({column} AS DOUBLE PRECISION)"),
        (Backend::Postgres, Kind::Bool) => column.to_owned(),
        (Backend::Postgres, Kind::Text) => format!("CAST({column} AS TEXT)"),
    }
}

/// A value of `kind` from column `i`; a value SQLite's dynamic typing
/// stored as another type is answered as text, NULL as `null`.
fn value(row: &AnyRow, i: usize, kind: Kind) -> Value {
    let typed = match kind {
        Kind::Int => row.try_get::<Option<i64>, _>(i).map(|v| v.map(Value::from)),
        Kind::Float => row.try_get::<Option<f64>, _>(i).map(|v| v.map(Value::from)),
        Kind::Bool => row
            .try_get::<Option<bool>, _>(i)
            .or_else(|_| row.try_get::<Option<i64>, _>(i).map(|v| v.map(|b| b != 0)))
            .map(|v| v.map(Value::from)),
        Kind::Text => text_at(row, i).map(|v| v.map(Value::from)),
    };
    match typed {
        Ok(v) => v.unwrap_or(Value::Null),
        Err(_) => text_at(row, i)
            .ok()
            .flatten()
            .or_else(|| row.try_get::<f64, _>(i).ok().map(|f| f.to_string()))
            .or_else(|| row.try_get::<i64, _>(i).ok().map(|f| f.to_string()))
            .map_or(Value::Null, Value::from),
    }
}

impl DynSource for SqlTable {
    fn key_type(&self) -> KeyType {
        self.key_type
    }

    fn fold(&self) -> Fold {
        self.fold
    }

    fn load<'a>(&'a self, key: &'a Key) -> BoxFuture<'a, Result<Option<Row>, StoreError>> {
        Box::pin(async move {
            let q = format!("{} WHERE {} = {}", self.select, self.key, self.store.ph(1));
            self.count_statement();
            self.counters.loads.fetch_add(1, Ordering::Relaxed);
            let row = Self::bind_key(sqlx::query(&q), key)
                .fetch_optional(&self.store.pool)
                .within(&self.store.limit, "resource load")
                .await
                .map_err(err("resource load"))?;
            if row.is_some() {
                self.counters.found.fetch_add(1, Ordering::Relaxed);
            }
            Ok(row.as_ref().map(|r| self.row_from(r)))
        })
    }

    fn audit<'a>(&'a self, key: &'a Key) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(super::audit::row_exists(
            &self.store,
            &self.table,
            &self.key,
            key,
        ))
    }

    fn load_many<'a>(
        &'a self,
        keys: &'a [Key],
    ) -> BoxFuture<'a, Result<Vec<(Key, Row)>, StoreError>> {
        Box::pin(async move {
            // A loose key may find a row spelled otherwise, which the
            // caller could not match to it: each is loaded alone, under
            // its own spelling.
            let (keys, loose): (Vec<&Key>, Vec<&Key>) = keys.iter().partition(|k| k.judged());
            let mut found = Vec::new();
            for k in loose {
                if let Some(row) = self.load(k).await? {
                    found.push((k.clone(), row));
                }
            }
            if keys.is_empty() {
                return Ok(found);
            }
            let phs: Vec<String> = (1..=keys.len()).map(|n| self.store.ph(n)).collect();
            let q = format!(
                "SELECT {}, {} FROM {} WHERE {} IN ({})",
                self.list,
                self.key_select,
                self.table,
                self.key,
                phs.join(", ")
            );
            let mut query = sqlx::query(&q);
            for k in &keys {
                query = Self::bind_key(query, k);
            }
            self.count_statement();
            self.counters.batch_loads.fetch_add(1, Ordering::Relaxed);
            let rows = query
                .fetch_all(&self.store.pool)
                .within(&self.store.limit, "resource batch load")
                .await
                .map_err(err("resource batch load"))?;
            let before = found.len();
            for r in &rows {
                found.push((
                    self.key_from(r, self.columns.len())
                        .map_err(err("resource batch load"))?,
                    self.row_from(r),
                ));
            }
            // A row whose own key is loose answers a key asked under
            // another spelling, which the caller could not match: the keys
            // left without a row are loaded alone, under their spelling.
            if found[before..].iter().any(|(k, _)| !k.judged()) {
                let matched: std::collections::HashSet<&Key> =
                    found[before..].iter().map(|(k, _)| k).collect();
                let unmatched: Vec<&Key> = keys
                    .iter()
                    .copied()
                    .filter(|k| !matched.contains(k))
                    .collect();
                for k in unmatched {
                    if let Some(row) = self.load(k).await? {
                        found.push((k.clone(), row));
                    }
                }
            }
            Ok(found)
        })
    }

    fn scan<'a>(
        &'a self,
        after: Option<&'a Key>,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<Key>, StoreError>> {
        Box::pin(async move {
            let filter = match after {
                Some(_) => format!(" WHERE {} > {}", self.key, self.store.ph(1)),
                None => String::new(),
            };
            let q = format!(
                "SELECT {} FROM {}{filter} ORDER BY {} LIMIT {limit}",
                self.key_select, self.table, self.key
            );
            let mut query = sqlx::query(&q);
            if let Some(k) = after {
                query = Self::bind_key(query, k);
            }
            self.count_statement();
            self.counters.scans.fetch_add(1, Ordering::Relaxed);
            let rows = query
                .fetch_all(&self.store.pool)
                .within(&self.store.limit, "resource scan")
                .await
                .map_err(err("resource scan"))?;
            rows.iter()
                .map(|r| self.key_from(r, 0))
                .collect::<Result<_, sqlx::Error>>()
                .map_err(err("resource scan"))
        })
    }

    fn count(&self) -> BoxFuture<'_, Result<u64, StoreError>> {
        Box::pin(async move {
            self.count_statement();
            self.store.count_rows(&self.table).await
        })
    }

    fn estimate(&self) -> BoxFuture<'_, Result<Option<u64>, StoreError>> {
        Box::pin(async move {
            self.count_statement();
            self.store
                .estimate_rows(&self.table_name, &self.table)
                .await
        })
    }

    fn ranges(&self) -> BoxFuture<'_, Result<Vec<KeyRange>, StoreError>> {
        Box::pin(async move {
            self.count_statement();
            // Called once per full scan: a replica scanned is caught up.
            self.store.scan_caught_up().await?;
            match self.key_type {
                KeyType::Int => self.store.int_ranges(&self.key, &self.table).await,
                KeyType::Text => Ok(self
                    .store
                    .text_ranges(&self.table_name, &self.key_name)
                    .await),
            }
        })
    }

    fn scan_page<'a>(
        &'a self,
        range: &'a KeyRange,
        after: Option<&'a Key>,
        limit: usize,
        sink: &'a (dyn Fn(KeyBatch<'_>) + Send + Sync),
    ) -> BoxFuture<'a, Result<Page, StoreError>> {
        Box::pin(async move {
            let (q, binds) = page_statement(
                &self.store,
                &self.key_select,
                &self.key,
                &self.table,
                range,
                after,
                limit,
            );
            self.count_statement();
            self.counters.scans.fetch_add(1, Ordering::Relaxed);
            self.store
                .stream_page(&q, &binds, self.key_type, self.fold, sink)
                .await
        })
    }
}
