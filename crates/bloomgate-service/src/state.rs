//! Start-up: connecting the stores and assembling the shared state.

use std::sync::Arc;
use std::time::Duration;

use crate::cache::RedisTier;
use crate::config::Config;
use crate::resource::reader::Bulkhead;
use crate::resource::Resource;
use crate::sql::{Database, StoreError};

/// What every handler shares.
#[derive(Debug, Clone)]
pub struct AppState {
    /// The SKU table, the default resource `skus`: its funnel (and
    /// through it the shield, caches and store), snapshot and key API.
    pub skus: Arc<Resource<Database>>,
    /// Admin bearer token, if configured.
    pub admin_token: Option<Arc<str>>,
    /// Body limit, rate limit, shutdown grace.
    pub http: crate::config::HttpConfig,
    /// The doorbell stream shared with other instances (with Redis).
    pub changes: Option<crate::feed::doorbell::Doorbell>,
    /// This instance's metrics (request counters, histograms, exporter).
    pub metrics: Arc<crate::metrics::ServiceMetrics>,
    /// The change outbox in SQL, which every instance follows.
    pub outbox: crate::feed::outbox::Outbox,
    /// The resources beside the SKUs, in configuration order.
    pub resources: Vec<Arc<Resource>>,
    /// Whether the demo SKU table is served (`Config::demo`). Off, the
    /// `skus` resource exists inside but is inert (a disabled filter, no
    /// shared filter, no snapshot): never created, seeded, scanned,
    /// routed or reported.
    pub demo: bool,
    /// The Redis-protocol listener's settings (`[resp]`).
    pub resp: crate::config::resp::RespConfig,
    /// The HTTP gate's settings (`[gate]`).
    pub gate: crate::config::proxy::ProxyConfig,
    /// The HTTP gate's routes, bound to their resources (the reverse
    /// proxy and the auth-request check judge with them).
    pub gate_routes: Arc<crate::proxy::judge::Routes>,
    /// Descriptors the pools may hold (SQL, scan readers, Redis), which
    /// client connections must leave free.
    descriptors: u64,
    /// The cache settings resources are assembled with.
    cache: crate::config::CacheConfig,
    /// Where Redis is (a resource's shared filter connects there).
    redis_target: Option<crate::redis_link::RedisTarget>,
    /// The one shutdown signal of every background loop (`run` gives it).
    pub background: crate::tasks::Background,
}

/// Why the service could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The configuration is invalid.
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    /// SQL is unreachable or failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Redis is unreachable.
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    /// The database or Redis that `key` names cannot be reached, or
    /// refused the connection: a wrong password, a certificate that does
    /// not verify, TLS required by the server or by the URL. The message
    /// never holds the URL's password.
    #[error("{key}: cannot connect: {source}{hint}")]
    Connect {
        /// The configuration key: `database_url`, `redis_url` or `redis_cluster`.
        key: &'static str,
        /// What the driver said.
        source: Box<dyn std::error::Error + Send + Sync>,
        /// Where to look, for a certificate that did not verify.
        hint: &'static str,
    },
    /// The database user may not create bloomgate's outbox, which the
    /// features named need; nothing was written.
    #[error("database_url: the database user cannot make or use bloomgate's outbox tables (bloomgate_changes, bloomgate_outbox_state, bloomgate_migrations): {source}. {needs} needs them. Grant the user {rights} (or have a DBA make them: `bloomgate capture install` does, with capture), or turn {needs} off; without them the service needs only SELECT (docs/guard-your-table.md#what-bloomgate-creates-in-your-database)")]
    Rights {
        /// The features, by configuration key.
        needs: String,
        /// The rights to grant, in this database's terms.
        rights: &'static str,
        /// What the database said.
        source: StoreError,
    },
    /// The shared filter (strict mode) could not be opened.
    #[error(transparent)]
    Shared(#[from] crate::share::redis_filter::SharedError),
    /// The listen address could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: std::net::SocketAddr,
        /// Why.
        source: std::io::Error,
    },
}

impl StartError {
    fn connect(
        key: &'static str,
        source: Box<dyn std::error::Error + Send + Sync>,
        url: Option<&str>,
    ) -> Self {
        let text = source.to_string().to_ascii_lowercase();
        let hint = if key == "database_url" {
            crate::sql::connect_hint(url, &text)
        } else if url.is_some_and(|u| u.starts_with("redis://")) && text.contains("reset by peer") {
            " (a Redis that speaks only TLS resets plain connections: use rediss://)"
        } else if text.contains("certificaterequired") || text.contains("certificate required") {
            " (the server asks for a client certificate: set redis_tls_cert and redis_tls_key)"
        } else if text.contains("certificate") {
            " (the server's certificate did not verify: check redis_tls_ca, and that it names the URL's host)"
        } else {
            ""
        };
        Self::Connect { key, source, hint }
    }
}

impl AppState {
    /// File descriptors the pools may hold beside client connections.
    #[must_use]
    pub fn descriptors_needed(&self) -> u64 {
        self.descriptors
    }

    /// A listener's connection limit when none is configured: the
    /// open-file limit less what the pools need
    /// ([`crate::listen::default_max_connections`]), halved when the
    /// Redis-protocol listener shares it with HTTP.
    #[must_use]
    pub fn default_max_connections(&self) -> u64 {
        let all = crate::listen::default_max_connections(self.descriptors);
        if self.resp.listen.is_some() {
            (all / 2).max(16)
        } else {
            all
        }
    }

    /// The `[cache]` settings the service was started with.
    #[must_use]
    pub fn cache_config(&self) -> &crate::config::CacheConfig {
        &self.cache
    }

    /// Connects SQL (running migrations) and Redis, and builds the state.
    /// Does not seed or build the filter; see [`crate::prepare`].
    ///
    /// # Errors
    /// [`StartError`].
    pub async fn connect(config: &Config) -> Result<Self, StartError> {
        config.validate()?;
        let background = crate::tasks::Background::new();
        let store = Database::connect_unmigrated(&config.database_url, &config.sql)
            .await
            .map_err(|e| StartError::connect("database_url", e.source, Some(&config.database_url)))?
            .with_background(background.clone());
        let store = match &config.scan_database_url {
            Some(url) => store.with_scan_replica(url, &config.sql)?,
            None => store,
        };
        // The configured tables are checked before anything is written: a
        // bad one stops the start with the database as it was.
        let mut tables = Vec::with_capacity(config.resources.len());
        for (i, rc) in config.resources.iter().enumerate() {
            tables.push((rc, crate::sql::table::SqlTable::open(&store, rc, i).await??));
        }
        let demo = config.demo();
        let captured = crate::feed::capture::targets(config);
        crate::feed::capture::check_before_migrate(&store, &captured).await??;
        // bloomgate's own tables only where a configured feature needs
        // them (or an earlier start made them): a guarded table needs
        // SELECT alone.
        let needs = config.outbox_needs();
        let outbox_on =
            !needs.is_empty() || (config.sql.outbox.is_none() && store.outbox_exists().await?);
        if outbox_on {
            store.migrate_for(demo).await.map_err(|e| {
                if e.is_permission_denied() {
                    StartError::Rights {
                        // Found there with no feature asking: a later
                        // migration of it.
                        needs: if needs.is_empty() {
                            "the outbox found in the database (sql.outbox unset; set it to false to run without it)".to_owned()
                        } else {
                            needs.join(", ")
                        },
                        rights: store.backend().outbox_rights(),
                        source: e,
                    }
                } else {
                    e.into()
                }
            })?;
            let by = if needs.is_empty() {
                "the outbox found in the database".to_owned()
            } else {
                needs.join(", ")
            };
            tracing::info!(needed_by = %by, "bloomgate's outbox is on: changes recorded here reach every instance");
        } else {
            store.set_outbox_off();
            tracing::info!("bloomgate's outbox is off (no configured feature needs it; sql.outbox): nothing is created in the database, every start scans, a warm's rebuild reaches this instance alone, and keys and invalidate calls answer 409");
            // A snapshot is positioned in the outbox: without one, none is
            // restored.
            let snapshots: Vec<&str> = config
                .cache
                .bloom_snapshot_path
                .iter()
                .map(|_| "cache.bloom_snapshot_path")
                .chain(
                    config
                        .resources
                        .iter()
                        .filter(|r| r.bloom_snapshot_path.is_some())
                        .map(|_| "resources[].bloom_snapshot_path"),
                )
                .collect();
            if !snapshots.is_empty() {
                tracing::warn!(set = %snapshots.join(", "), "filter snapshots are not restored while bloomgate's outbox is off (a snapshot is positioned in it): every start scans; set sql.outbox = true to use them");
            }
        }
        // Without the outbox's own (a SELECT-only user), the server's.
        store.note_server_identity().await;
        let mut capture_gaps = crate::feed::capture::install_missing(&store, &captured).await?;
        // The SKU table exists now (with the demo): its watch column is
        // checked as a configured table's is.
        let sku_table = match &config.cache.watch_column {
            Some(_) if demo => Some(
                crate::sql::table::SqlTable::open_as(
                    &store,
                    &crate::config::resources::ResourceConfig::skus(&config.cache),
                    &|f| format!("cache.{f}"),
                )
                .await??,
            ),
            _ => None,
        };
        let outbox = crate::feed::outbox::Outbox::new(store.clone(), &config.sql)
            .with_background(background.clone());
        // The triggers as they are now: a check that finds others made
        // or enabled again in between owes a rebuild, and so does a start
        // that finds others than the fleet last saw (replaced while no
        // instance ran: a positioned filter may lack the rows of the gap).
        for c in &captured {
            let gap = |gaps: &mut Vec<String>, why: &str| {
                tracing::warn!(table = %c.target.table, resource = %c.name, "{why}: scanning the table, and asking every instance to rebuild");
                if !gaps.contains(&c.name) {
                    gaps.push(c.name.clone());
                }
            };
            let f = match store.capture_state(&c.target).await {
                Ok(crate::sql::CaptureState {
                    fingerprint: Some(f),
                    ..
                }) => f,
                // Triggers that are not all current (found by
                // the install above).
                Ok(_) => continue,
                Err(_) => {
                    gap(
                        &mut capture_gaps,
                        "the capture triggers could not be read at start",
                    );
                    continue;
                }
            };
            outbox.saw_triggers(&c.name, &f);
            match store.capture_seen(&c.target).await {
                Ok(Some(seen)) if seen != f => {
                    gap(
                        &mut capture_gaps,
                        "the capture triggers were replaced while no instance ran",
                    );
                }
                Ok(Some(_)) => {}
                // A first start: noted now, unless a rebuild request is
                // owed (noted once it is recorded).
                Ok(None) if capture_gaps.contains(&c.name) => {}
                Ok(None) => {
                    if let Err(e) = store.note_capture_seen(&c.target, &f).await {
                        tracing::warn!(error = %e, "the capture triggers' identity was not kept: a start that cannot compare with it scans");
                    }
                }
                Err(_) => gap(
                    &mut capture_gaps,
                    "the capture triggers last seen could not be read at start",
                ),
            }
        }
        outbox.set_captured(
            captured.into_iter().map(|c| c.target).collect(),
            capture_gaps,
        );
        // Before this instance's start position and covered rebuilds are
        // read (and before another instance starting now reads its own),
        // so only instances already running rebuild for it.
        outbox.announce_gaps().await;
        let c = &config.cache;
        let target = crate::redis_link::RedisTarget::of(config);
        if let Some(target) = &target {
            let timeout = Duration::from_millis(c.redis_timeout_ms).max(Duration::from_secs(2));
            target.check(timeout).await.map_err(|e| {
                let url = match &target.nodes {
                    crate::redis_link::RedisNodes::Server(u) => u.as_str(),
                    crate::redis_link::RedisNodes::Cluster(n) => {
                        n.first().map_or("", |u| u.as_str())
                    }
                };
                StartError::connect(target.key(), e.into(), Some(url))
            })?;
        }
        let (redis, changes) = match &target {
            Some(target) => (
                Some(RedisTier::connect(target, c, &background).await?),
                Some(
                    crate::feed::doorbell::Doorbell::connect(
                        target,
                        &c.redis_prefix,
                        c.change_log_max_len,
                        Duration::from_millis(c.redis_timeout_ms),
                        c.bloom_segment_bytes,
                        outbox.clone(),
                    )
                    .await?
                    .with_background(background.clone()),
                ),
            ),
            None => (None, None),
        };
        let metrics = Arc::new(crate::metrics::ServiceMetrics::new());
        let bulkhead = Bulkhead::new(
            config.sql.max_concurrent_loads as usize,
            Duration::from_millis(config.sql.queue_timeout_ms),
        );
        let shared = crate::resource::Shared {
            store,
            redis,
            bulkhead,
            changes: changes.clone(),
            outbox: outbox.clone(),
            target: target.clone(),
            cache: c.clone(),
            background: background.clone(),
        };
        let skus = if demo {
            Resource::skus(&shared, metrics.rebuild_histogram(), sku_table).await?
        } else {
            let mut inert = shared.clone();
            inert.cache.bloom_enabled = false;
            inert.cache.bloom_mode = crate::config::BloomMode::Local;
            inert.cache.bloom_snapshot_path = None;
            inert.cache.watch_column = None;
            Resource::skus(&inert, metrics.rebuild_histogram(), None).await?
        };
        Self {
            skus,
            demo,
            resp: config.resp.clone(),
            gate: config.gate.clone(),
            gate_routes: Arc::default(),
            // The SQL pool and the scan readers' pool, and Redis's few
            // (the tier, the doorbell, the shared filters, epochs).
            descriptors: u64::from(config.sql.pool_size)
                + 2 * u64::from(config.sql.scan_parallel)
                + 16,
            admin_token: config.admin_token.as_deref().map(Arc::from),
            http: config.http.clone(),
            metrics,
            changes,
            outbox,
            resources: Vec::new(),
            cache: c.clone(),
            background,
            redis_target: target,
        }
        .with_tables(tables)
        .await
    }

    /// Guards every `[[resources]]` table.
    async fn with_tables(
        mut self,
        tables: Vec<(
            &crate::config::resources::ResourceConfig,
            crate::sql::table::SqlTable,
        )>,
    ) -> Result<Self, StartError> {
        for (rc, table) in tables {
            let options = crate::resource::ResourceOptions::of_resource(rc);
            let r = Resource::from_table(&rc.name, table, &options, &self.shared()).await?;
            if rc.watch_column.is_some() {
                r.set_watch_every(Duration::from_millis(rc.watch_every_ms));
            }
            self.resources.push(r);
        }
        if self.gate.is_set() {
            let routes = crate::proxy::judge::Routes::of(
                &self.gate,
                &self.resources,
                self.cache.l1_capacity,
            );
            let paths: Vec<&str> = routes.all().iter().map(|r| r.path.as_str()).collect();
            self.metrics.gate.init(&paths);
            self.gate_routes = Arc::new(routes);
        }
        Ok(self)
    }

    /// What a resource shares with this instance.
    #[must_use]
    pub fn shared(&self) -> crate::resource::Shared {
        crate::resource::Shared {
            store: self.skus.source().clone(),
            redis: self.skus.redis().cloned(),
            bulkhead: self.skus.reader.bulkhead.clone(),
            changes: self.changes.clone(),
            outbox: self.outbox.clone(),
            cache: self.cache.clone(),
            background: self.background.clone(),
            target: self.redis_target.clone(),
        }
    }

    /// Guards `source` as resource `name` too (before [`crate::prepare`],
    /// which builds its filter): `GET /api/{name}/{key}` and its calls.
    ///
    /// # Errors
    /// [`StartError::Config`] for a name that is not a lower-case
    /// identifier, is reserved, or is taken; [`StartError::Shared`] when
    /// its shared filter (`strict`, `redis`) cannot be opened.
    pub async fn with_resource(
        mut self,
        name: &str,
        source: Arc<dyn crate::source::DynSource>,
        options: &crate::resource::ResourceOptions,
    ) -> Result<Self, StartError> {
        let index = self.resources.len();
        if index >= crate::config::resources::MAX_RESOURCES {
            return Err(crate::config::ConfigError::Invalid {
                key: "resources".into(),
                message: format!(
                    "at most {} resources",
                    crate::config::resources::MAX_RESOURCES
                ),
            }
            .into());
        }
        crate::config::resources::check_name(name, index)?;
        if self.resources.iter().any(|r| &*r.name == name) {
            return Err(crate::config::ConfigError::Invalid {
                key: crate::config::resources::ResourceConfig::key_of(index, "name"),
                message: format!("{name:?} is taken"),
            }
            .into());
        }
        let r = Resource::new(name, source, options, &self.shared()).await?;
        self.resources.push(r);
        Ok(self)
    }
}
