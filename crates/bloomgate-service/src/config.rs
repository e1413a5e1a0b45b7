//! Configuration in layers: defaults, then a TOML file, then environment
//! variables; validated once into a typed [`Config`].
//!
//! Keys follow seed 000's `cache.bloom_*` names. Environment variables are
//! `BLOOMGATE_` plus the key in upper case with `__` between levels
//! (`BLOOMGATE_CACHE__BLOOM_ENABLED=false`, `BLOOMGATE_LISTEN=127.0.0.1:9000`);
//! `DATABASE_URL` and `REDIS_URL` are honoured too (the `BLOOMGATE_` forms win).
//!
//! A leaf: it knows no other module of the crate but the leaf
//! [`crate::text`] (quoting input in messages), as every refusal it writes
//! quotes something (a tidy test). The types its keys name
//! (`BloomLayout`, `KeyType`) live here, and the modules that act on them
//! re-export them.

use std::net::SocketAddr;

use serde::Deserialize;

mod load;
pub use load::{is_reserved_env, RESERVED_ENV};
pub mod proxy;
pub mod resources;
pub mod resp;
mod validate;

/// The default embedded database: a SQLite file under `./data/`.
pub const DEFAULT_DATABASE_URL: &str = "sqlite://data/bloomgate.db";

/// Everything the service needs to start. Its `Debug` hides the URLs'
/// passwords and the admin token.
#[derive(Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Address to listen on.
    pub listen: SocketAddr,
    /// SQL database URL: `sqlite://…`, `mysql://…` or `postgres://…`.
    /// TLS is asked for in the URL as each database's own clients ask:
    /// `sslmode` (`disable` … `verify-full`) and `sslrootcert` on
    /// PostgreSQL, `ssl-mode` (`DISABLED` … `VERIFY_IDENTITY`) and `ssl-ca`
    /// on MySQL/MariaDB.
    pub database_url: String,
    /// A file whose content is `database_url` (a mounted secret), read by
    /// [`Config::load`]; it wins over `DATABASE_URL` and may not be set
    /// beside `database_url`. (A `Config` built in code sets
    /// `database_url` itself.)
    pub database_url_file: Option<std::path::PathBuf>,
    /// A read replica of `database_url` (same kind of server) that filter
    /// rebuilds scan instead of the primary. A scan starts only once the
    /// replica has replayed everything the primary had committed when it
    /// began (MariaDB's GTID position, MySQL's executed GTID set,
    /// PostgreSQL's WAL position), so replication lag hides no row.
    pub scan_database_url: Option<String>,
    /// A file whose content is `scan_database_url`, read as
    /// `database_url_file`.
    pub scan_database_url_file: Option<std::path::PathBuf>,
    /// Redis URL; without one (and without `redis_cluster`) the service
    /// runs filter + L1 + SQL. `rediss://` speaks TLS; an ACL user logs in
    /// as `redis[s]://user:password@host:port/`.
    pub redis_url: Option<String>,
    /// A file whose content is `redis_url`, read as `database_url_file`.
    pub redis_url_file: Option<std::path::PathBuf>,
    /// The CA file (PEM) that signed the TLS certificate of the Redis
    /// server or of every Cluster node (`rediss://`); without it, the
    /// Mozilla roots.
    pub redis_tls_ca: Option<std::path::PathBuf>,
    /// A client certificate (PEM) for a Redis that asks for one.
    pub redis_tls_cert: Option<std::path::PathBuf>,
    /// The client certificate's private key (PEM).
    pub redis_tls_key: Option<std::path::PathBuf>,
    /// A Redis Cluster instead of one server: some of its nodes
    /// (`redis://host:port` each; the environment's
    /// `BLOOMGATE_REDIS_CLUSTER` separates them with commas). Every Redis
    /// use then goes through the cluster client.
    pub redis_cluster: Vec<String>,
    /// Bearer token for the admin endpoints (warm, SKU writes).
    pub admin_token: Option<String>,
    /// How many SKUs to generate when the database is empty at start (0: none).
    pub seed_if_empty: u64,
    /// Cache and filter settings.
    pub cache: CacheConfig,
    /// SQL pool, timeouts and the load bulkhead.
    pub sql: SqlConfig,
    /// HTTP limits and shutdown.
    pub http: HttpConfig,
    /// Tables guarded beside the SKUs (`[[resources]]`).
    pub resources: Vec<resources::ResourceConfig>,
    /// The demo SKU table of seed 000 (`skus`, its routes, seed, stats and
    /// filter). Unset: on when no `[[resources]]` and no `[gate]` are configured, so a
    /// fresh checkout serves the seeds' commands and a database of your
    /// own gets no table of ours. See [`Config::demo`].
    pub demo: Option<bool>,
    /// The Redis-protocol listener (`[resp]`): RedisBloom's `BF.*`
    /// commands answered from the filters.
    pub resp: resp::RespConfig,
    /// bloomgate in front of an HTTP API it did not write (`[gate]`): a
    /// reverse proxy and an auth-request check whose routes the
    /// resources' filters judge.
    pub gate: proxy::ProxyConfig,
}

impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use crate::text::redact_url;
        f.debug_struct("Config")
            .field("listen", &self.listen)
            .field("database_url", &redact_url(&self.database_url))
            .field("database_url_file", &self.database_url_file)
            .field(
                "scan_database_url",
                &self.scan_database_url.as_deref().map(redact_url),
            )
            .field("scan_database_url_file", &self.scan_database_url_file)
            .field("redis_url", &self.redis_url.as_deref().map(redact_url))
            .field("redis_url_file", &self.redis_url_file)
            .field(
                "redis_cluster",
                &self
                    .redis_cluster
                    .iter()
                    .map(|n| redact_url(n))
                    .collect::<Vec<_>>(),
            )
            .field("redis_tls_ca", &self.redis_tls_ca)
            .field("redis_tls_cert", &self.redis_tls_cert)
            .field("redis_tls_key", &self.redis_tls_key)
            .field("admin_token", &self.admin_token.as_ref().map(|_| "***"))
            .field("seed_if_empty", &self.seed_if_empty)
            .field("cache", &self.cache)
            .field("sql", &self.sql)
            .field("http", &self.http)
            .field("resources", &self.resources)
            .field("demo", &self.demo)
            .field("resp", &self.resp)
            .field("gate", &self.gate)
            .finish()
    }
}

impl Config {
    /// Whether the demo SKU table is served: `demo` when set, else only
    /// when no `[[resources]]` and no `[gate]` are configured. Off, bloomgate creates,
    /// seeds, routes and reports no `skus` table, builds no filter for it
    /// and installs no trigger on it.
    #[must_use]
    pub fn demo(&self) -> bool {
        self.demo
            .unwrap_or(self.resources.is_empty() && !self.gate.is_set())
    }

    /// The configured features that need bloomgate's outbox (its tables
    /// in the database), by the key that turns each on; empty when the
    /// service can run with `SELECT` alone.
    #[must_use]
    pub fn outbox_needs(&self) -> Vec<String> {
        let mut needs = Vec::new();
        if self.demo() {
            needs.push("demo".to_owned());
            if self.cache.capture == Capture::Triggers {
                needs.push("cache.capture".to_owned());
            }
        }
        for (i, r) in self.resources.iter().enumerate() {
            if r.capture == Capture::Triggers {
                needs.push(resources::ResourceConfig::key_of(i, "capture"));
            }
        }
        if self.sql.outbox == Some(true) {
            needs.push("sql.outbox".to_owned());
        }
        needs
    }
}

/// The `sql.*` table: how much the service may ask of the database.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct SqlConfig {
    /// Connections in the pool (at most).
    pub pool_size: u32,
    /// Longest wait for a pooled connection, milliseconds.
    pub acquire_timeout_ms: u64,
    /// Longest time one read-path statement may take, milliseconds.
    pub statement_timeout_ms: u64,
    /// Longest time one background statement may take, milliseconds: the
    /// pages of a filter rebuild's key scan (a page past it is retried),
    /// the emptiness check and estimates at start, the background row
    /// count and the change-outbox follower's reads (its trims keep
    /// `statement_timeout_ms`: a slow one is retried on the next pass).
    pub background_statement_timeout_ms: u64,
    /// Readers a rebuild scans a table with at once (1 = one ordered scan;
    /// at most 2 on SQLite): integer keys cut between `MIN` and `MAX`, text
    /// keys at PostgreSQL's quantiles or two readers meeting in the middle.
    pub scan_parallel: u32,
    /// Read-path loads that may query SQL at once (the bulkhead); more wait.
    pub max_concurrent_loads: u32,
    /// Longest wait for a bulkhead slot before answering 503, milliseconds.
    pub queue_timeout_ms: u64,
    /// Statements slower than this are counted by name and logged once,
    /// milliseconds.
    pub slow_query_ms: u64,
    /// How often an instance reads the change outbox (`bloomgate_changes`)
    /// when nothing rings the Redis doorbell, milliseconds: the bound on
    /// propagation while Redis is away.
    pub outbox_poll_ms: u64,
    /// How often an instance reads the change outbox while a doorbell is
    /// healthy (the Redis doorbell stream's reads answer, or PostgreSQL's
    /// `LISTEN`), milliseconds: writes the doorbell does not announce
    /// (another program's, recorded by capture triggers on MySQL or
    /// SQLite) arrive within this.
    pub outbox_idle_poll_ms: u64,
    /// How long a missing outbox sequence number (a transaction that took
    /// it and has not committed) is waited for before it is taken as
    /// rolled back, milliseconds; a write slower than half of this
    /// records its change again.
    pub outbox_gap_ms: u64,
    /// Outbox entries older than this are deleted, seconds; an instance
    /// whose position was deleted rebuilds its filter.
    pub outbox_retention_secs: u64,
    /// An instance that has read neither the outbox nor the Redis change
    /// log for this long stops answering 404 on its filter's word alone
    /// (it may have missed creates), milliseconds.
    pub out_of_step_ms: u64,
    /// bloomgate's own tables in the database (`bloomgate_changes`, its
    /// state and migrations): the outbox every instance follows. Unset:
    /// made only when a configured feature needs it (the demo SKU table,
    /// `capture = "triggers"`), and used when an earlier start made it.
    /// `true`: made and used (a `keys` or `invalidate` call then reaches
    /// every instance durably). `false`: never; the service needs only
    /// `SELECT` on the tables it guards (see [`Config::outbox_needs`]).
    pub outbox: Option<bool>,
}

impl Default for SqlConfig {
    fn default() -> Self {
        Self {
            pool_size: 16,
            acquire_timeout_ms: 1_000,
            statement_timeout_ms: 2_000,
            background_statement_timeout_ms: 60_000,
            scan_parallel: 2,
            max_concurrent_loads: 32,
            queue_timeout_ms: 100,
            slow_query_ms: 200,
            outbox_poll_ms: 100,
            outbox_idle_poll_ms: 1_000,
            outbox_gap_ms: 10_000,
            outbox_retention_secs: 86_400,
            out_of_step_ms: 3_000,
            outbox: None,
        }
    }
}

/// The `http.*` table.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct HttpConfig {
    /// Largest request body accepted, bytes (larger: 413).
    pub body_limit_bytes: usize,
    /// Longest time a request may take, milliseconds (longer: 503 JSON).
    /// A warm's filter rebuild goes on in the background when its request
    /// times out.
    pub request_timeout_ms: u64,
    /// After SIGTERM or Ctrl-C, how long in-flight requests may take to
    /// finish before the server closes them, seconds.
    pub shutdown_grace_secs: u64,
    /// Requests per second per client IP on every read (a `batch` or
    /// `exists` call takes one per key); 0 = off.
    pub rate_limit_per_sec: u64,
    /// Burst allowed above the rate, requests.
    pub rate_limit_burst: u32,
    /// Longest wait for a request's headers, milliseconds, from the
    /// moment the connection is ready for a request (so an idle
    /// keep-alive connection is closed after it too): a client that opens
    /// connections and sends nothing whole holds none for longer.
    pub header_timeout_ms: u64,
    /// Most connections open at once (the next wait in the kernel's
    /// backlog); 0: the process's open-file limit less what the SQL pool,
    /// the scan readers and Redis need (half of it when `[resp]` listens
    /// too: the two listeners share it).
    pub max_connections: u64,
    /// Whether the edge takes the reads itself (`http::edge`): a filter
    /// "no" and an L1 hit answered at once, a read past L1 run without
    /// the router. `false` sends every request through the router: the
    /// same answers, slower; for comparing the two.
    pub fast_answers: bool,
}

impl Default for HttpConfig {
    fn default() -> Self {
        Self {
            body_limit_bytes: 64 * 1024,
            request_timeout_ms: 30_000,
            shutdown_grace_secs: 10,
            rate_limit_per_sec: 0,
            rate_limit_burst: 50,
            fast_answers: true,
            header_timeout_ms: 10_000,
            max_connections: 0,
        }
    }
}

/// How the service learns writes that other programs make to a table
/// (`cache.capture` for the SKUs, `resources[i].capture`).
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Capture {
    /// Only through the service's own writes and its `keys` and
    /// `invalidate` calls (and `watch_column` where set).
    #[default]
    None,
    /// Triggers on the table record every insert, update and delete in
    /// the change outbox inside the writer's own transaction (installed
    /// at start when missing, or by `bloomgate capture install`).
    Triggers,
}

/// Where the shield's answers come from (`cache.bloom_mode`).
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum BloomMode {
    /// The in-process replica alone, kept in step by the change outbox.
    #[default]
    Local,
    /// The replica; a "no" is confirmed against the shared filter in
    /// Redis before a 404, so a SKU created through any instance is not
    /// refused even before the outbox reaches this one.
    Strict,
    /// Every check goes to the shared filter in Redis (one `GETRANGE`);
    /// the replica is not asked. How go-zero and Redisson gate reads:
    /// kept as the comparison baseline, not recommended (a Redis round
    /// trip on every request, and a Redis failure lets everything pass).
    Redis,
}

/// Which filter the shield uses (`cache.bloom_layout`).
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum BloomLayout {
    /// 256-bit blocks: one cache line per check, ~10% more bits than classic.
    #[default]
    Blocked,
    /// Seed 000's scheme: `k` positions over the whole array, fewest bits,
    /// up to `k` cache lines per check.
    Classic,
}

/// The lowest `cache.bloom_fpp` accepted: below it the blocked layout needs
/// more than ~140 bits per key and sizing stops being sensible.
pub const MIN_BLOOM_FPP: f64 = 1e-9;
/// The highest `cache.bloom_fpp` accepted: past one half a filter passes
/// more absent ids than it stops.
pub const MAX_BLOOM_FPP: f64 = 0.5;
/// The largest filter the service will allocate (4 GiB).
pub const MAX_FILTER_BYTES: u64 = 4 << 30;

/// Bytes of a shield's filter for `n` ids at rate `p` in `layout`.
///
/// # Errors
/// The filter crate's sizing errors (a rate it cannot serve, too large).
pub fn filter_bytes(layout: BloomLayout, n: u64, p: f64) -> bloomgate_filter::Result<u64> {
    use bloomgate_filter::sizing;
    Ok(match layout {
        BloomLayout::Blocked => sizing::blocked(n, p, 256)?.bits().div_ceil(8),
        BloomLayout::Classic => sizing::classic(n, p)?.bits.div_ceil(8),
    })
}

/// Checks one filter's settings, the same for `[cache]` (the default
/// resource) and each `[[resources]]` entry: the rate in range, at least
/// one item, a size the service can allocate, and (when set) a Redis
/// segment size. `key` spells a field's full key.
///
/// # Errors
/// [`ConfigError::Invalid`] naming the field.
pub fn check_filter(
    key: &dyn Fn(&str) -> String,
    layout: BloomLayout,
    expected: u64,
    fpp: f64,
    segment_bytes: Option<u64>,
) -> Result<(), ConfigError> {
    let invalid = |field: &str, message: String| invalid(&key(field), message);
    if !(MIN_BLOOM_FPP..=MAX_BLOOM_FPP).contains(&fpp) {
        return Err(invalid(
            "bloom_fpp",
            format!("must be between {MIN_BLOOM_FPP:e} and {MAX_BLOOM_FPP} (inclusive), got {fpp}"),
        ));
    }
    if expected == 0 {
        return Err(invalid("bloom_expected", "must be at least 1".into()));
    }
    // The rebuild sizes for at least `bloom_expected`: check now that
    // sizing can serve it, rather than failing every build later.
    let bytes = filter_bytes(layout, expected, fpp)
        .map_err(|e| invalid("bloom_expected", format!("with bloom_fpp = {fpp}: {e}")))?;
    if bytes > MAX_FILTER_BYTES {
        return Err(invalid(
            "bloom_expected",
            format!(
                "{expected} items at bloom_fpp = {fpp} need a {bytes}-byte filter; the limit is {MAX_FILTER_BYTES} bytes (4 GiB)"
            ),
        ));
    }
    if let Some(bytes) = segment_bytes {
        if bytes == 0 || !bytes.is_multiple_of(64) || bytes > bloomgate_redis::MAX_SEGMENT_BYTES {
            return Err(invalid(
                "bloom_segment_bytes",
                format!(
                    "must be a multiple of 64 up to {} (Redis's largest string), got {bytes}",
                    bloomgate_redis::MAX_SEGMENT_BYTES
                ),
            ));
        }
    }
    Ok(())
}

/// The `cache.*` table.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct CacheConfig {
    /// Guard reads with the Bloom filter.
    pub bloom_enabled: bool,
    /// The filter's layout: `blocked` (default) or `classic`.
    pub bloom_layout: BloomLayout,
    /// Items the filter is sized for.
    pub bloom_expected: u64,
    /// Target false-positive rate at `bloom_expected` items.
    pub bloom_fpp: f64,
    /// Build the filter from SQL at start-up (in the background; fail-open until ready).
    pub bloom_build_on_start: bool,
    /// Deletes since the last build that trigger a background rebuild.
    pub bloom_rebuild_after_deletes: u64,
    /// On a capacity, fill or observed-rate alarm, rebuild sized for twice
    /// the current items.
    pub bloom_auto_rebuild: bool,
    /// How often the fill ratio and the observed false-positive rate are
    /// checked (the observed rate's window), milliseconds.
    pub bloom_monitor_ms: u64,
    /// The filter's "no" checked against the database, off the request
    /// path: at most one refused key per this many milliseconds per
    /// guarded table is looked up; a row found there is a false negative,
    /// which stops the filter's "no" until a rebuild. 0: never.
    pub bloom_audit_every_ms: u64,
    /// First wait before retrying a failed start-up build, milliseconds
    /// (doubling up to `bloom_retry_max_ms`).
    pub bloom_retry_min_ms: u64,
    /// Longest wait between retries of a failed start-up build, milliseconds.
    pub bloom_retry_max_ms: u64,
    /// Keys per second a filter rebuild may read from its table, across
    /// its readers (start-up scans and rebuilds; per table and instance,
    /// so rebuilds at once add up; the Redis shared filter's fill is not
    /// paced): spares the
    /// database, and a build takes rows / this at least. 0: as fast as
    /// the database answers.
    pub bloom_scan_rows_per_sec: u64,
    /// Where to keep the filter snapshot for restarts without a SQL scan
    /// (the change outbox replays what came after it).
    pub bloom_snapshot_path: Option<std::path::PathBuf>,
    /// Seconds between snapshots (also written after each rebuild and at
    /// shutdown).
    pub bloom_snapshot_every_secs: u64,
    /// `local`, `strict` or `redis` (the last two need `redis_url` or
    /// `redis_cluster`).
    pub bloom_mode: BloomMode,
    /// Bytes per Redis string of the shared filter (`strict`): a larger
    /// filter is split into segments, which a Redis Cluster spreads over
    /// its nodes. Every instance must use the same value.
    pub bloom_segment_bytes: u64,
    /// `none` or `triggers`: how writes other programs make to the SKU
    /// table reach every instance (see [`Capture`]).
    pub capture: Capture,
    /// A column of the SKU table (an auto-increment id, a creation time)
    /// read every `watch_every_ms`: rows other programs insert are admitted
    /// without a `keys` call, as a resource's `watch_column` does. A
    /// watched table keeps its own rebuilds (it restores no snapshot and
    /// adopts no epoch). `capture = "triggers"` is exact; this is not.
    pub watch_column: Option<String>,
    /// How often the watch column is read, ms.
    pub watch_every_ms: u64,
    /// Entries in the in-process L1 cache.
    pub l1_capacity: u64,
    /// L1 lifetime of a found SKU, seconds.
    pub l1_ttl_secs: u64,
    /// L1 lifetime of a "not found" answer, seconds.
    pub l1_negative_ttl_secs: u64,
    /// Redis lifetime of a SKU value, seconds (±10% jitter).
    pub redis_ttl_secs: u64,
    /// Redis lifetime of a `__nil__` sentinel, seconds (±10% jitter).
    pub redis_nil_ttl_secs: u64,
    /// Prefix of every Redis key the service writes.
    pub redis_prefix: String,
    /// Longest time one Redis command may take, milliseconds.
    pub redis_timeout_ms: u64,
    /// Entries kept in the doorbell stream shared by instances (about).
    pub change_log_max_len: u64,
    /// Consecutive Redis failures (errors or timeouts) that open the breaker.
    pub redis_breaker_failures: u32,
    /// How long the breaker stays open before a probe, milliseconds
    /// (doubling on repeated failure up to `redis_breaker_max_open_ms`).
    pub redis_breaker_open_ms: u64,
    /// Longest open period of the breaker, milliseconds.
    pub redis_breaker_max_open_ms: u64,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            database_url: DEFAULT_DATABASE_URL.into(),
            database_url_file: None,
            scan_database_url: None,
            scan_database_url_file: None,
            redis_url: None,
            redis_url_file: None,
            redis_tls_ca: None,
            redis_tls_cert: None,
            redis_tls_key: None,
            redis_cluster: Vec::new(),
            admin_token: None,
            seed_if_empty: 200_000,
            cache: CacheConfig::default(),
            sql: SqlConfig::default(),
            http: HttpConfig::default(),
            resources: Vec::new(),
            demo: None,
            resp: resp::RespConfig::default(),
            gate: proxy::ProxyConfig::default(),
        }
    }
}

impl Default for CacheConfig {
    fn default() -> Self {
        Self {
            bloom_enabled: true,
            bloom_layout: BloomLayout::Blocked,
            bloom_expected: 500_000,
            bloom_fpp: 0.001,
            bloom_build_on_start: true,
            bloom_rebuild_after_deletes: 10_000,
            bloom_auto_rebuild: true,
            bloom_monitor_ms: 10_000,
            bloom_audit_every_ms: 1_000,
            bloom_retry_min_ms: 100,
            bloom_retry_max_ms: 30_000,
            bloom_scan_rows_per_sec: 0,
            bloom_snapshot_path: None,
            bloom_snapshot_every_secs: 300,
            bloom_mode: BloomMode::Local,
            bloom_segment_bytes: bloomgate_redis::DEFAULT_SEGMENT_BYTES,
            capture: Capture::None,
            watch_column: None,
            watch_every_ms: 1000,
            l1_capacity: 100_000,
            l1_ttl_secs: 30,
            l1_negative_ttl_secs: 5,
            redis_ttl_secs: 3600,
            redis_nil_ttl_secs: 300,
            redis_prefix: "bloomgate:".into(),
            redis_timeout_ms: 50,
            change_log_max_len: 100_000,
            redis_breaker_failures: 5,
            redis_breaker_open_ms: 500,
            redis_breaker_max_open_ms: 10_000,
        }
    }
}

/// A configuration problem, naming the key.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("config file {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// The TOML or an environment value does not parse or has the wrong type.
    #[error("config key `{key}`: {message}")]
    Invalid {
        /// The dotted key.
        key: String,
        /// What is wrong.
        message: String,
    },
}

fn invalid(key: &str, message: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        key: key.into(),
        message: message.into(),
    }
}
