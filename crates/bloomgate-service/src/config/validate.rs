//! Checking a loaded [`Config`]: values that parse but make no sense are
//! refused with the key named; the `redis_tls_*` files; where Redis is.

use super::Config;
use crate::config::{check_filter, invalid, resources, BloomMode, ConfigError};

impl Config {
    /// Checks values that parse but make no sense.
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] naming the key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        resources::validate_all(&self.resources)?;
        if self.sql.outbox == Some(false) {
            if let Some(need) = self.outbox_needs().first() {
                return Err(invalid(
                    "sql.outbox",
                    format!("is false, but {need} needs bloomgate's outbox (its tables in the database): set it to true, or turn {need} off"),
                ));
            }
        }
        let c = &self.cache;
        if c.capture == super::Capture::Triggers {
            if let Some(i) = self
                .resources
                .iter()
                .position(|r| r.capture == super::Capture::Triggers && r.table == "skus")
            {
                return Err(invalid(
                    &resources::ResourceConfig::key_of(i, "capture"),
                    "table \"skus\" is captured by cache.capture already: one captured resource per table",
                ));
            }
        }
        // Two filters never share a snapshot file (the later save would
        // replace the other's, and a restart would refuse or misread it).
        let mut paths: Vec<(String, std::path::PathBuf)> = c
            .bloom_snapshot_path
            .iter()
            .map(|p| ("cache.bloom_snapshot_path".to_string(), p.clone()))
            .collect();
        for (i, r) in self.resources.iter().enumerate() {
            let derived = c
                .bloom_snapshot_path
                .as_ref()
                .map(|p| resources::derived_snapshot_path(p, &r.name));
            if let Some(path) = r.bloom_snapshot_path.clone().or(derived) {
                let key = resources::ResourceConfig::key_of(i, "bloom_snapshot_path");
                if let Some((other, _)) = paths.iter().find(|(_, p)| *p == path) {
                    return Err(invalid(
                        &key,
                        format!("{} is also the snapshot of {other}", path.display()),
                    ));
                }
                paths.push((key, path));
            }
        }
        if c.bloom_mode != BloomMode::Local && !self.uses_redis() {
            return Err(invalid(
                "cache.bloom_mode",
                "strict and redis keep a shared filter in Redis: set redis_url or redis_cluster",
            ));
        }
        for (i, r) in self.resources.iter().enumerate() {
            let shared = matches!(r.bloom_mode, Some(BloomMode::Strict | BloomMode::Redis));
            if shared && !self.uses_redis() {
                return Err(invalid(
                    &resources::ResourceConfig::key_of(i, "bloom_mode"),
                    "strict and redis keep a shared filter in Redis: set redis_url or redis_cluster",
                ));
            }
            if shared && c.redis_prefix.contains(['{', '}']) {
                return Err(invalid(
                    "cache.redis_prefix",
                    "strict and redis modes name the shared filter's segments after the prefix, so that a Redis Cluster spreads them: the prefix may not hold braces",
                ));
            }
        }
        check_filter(
            &|field| format!("cache.{field}"),
            c.bloom_layout,
            c.bloom_expected,
            c.bloom_fpp,
            Some(c.bloom_segment_bytes),
        )?;
        if c.bloom_mode != BloomMode::Local && c.redis_prefix.contains(['{', '}']) {
            return Err(invalid(
                "cache.redis_prefix",
                "strict and redis modes name the shared filter's segments after the prefix, so that a Redis Cluster spreads them: the prefix may not hold braces",
            ));
        }
        if let Some(w) = &c.watch_column {
            if !resources::is_identifier(w) {
                return Err(invalid(
                    "cache.watch_column",
                    format!(
                        "must be a plain SQL identifier (letters, digits, _), got {:?}",
                        crate::text::clip(w)
                    ),
                ));
            }
        }
        if c.watch_every_ms < 10 {
            return Err(invalid("cache.watch_every_ms", "must be at least 10"));
        }
        if c.bloom_retry_min_ms == 0 || c.bloom_retry_max_ms < c.bloom_retry_min_ms {
            return Err(invalid(
                "cache.bloom_retry_max_ms",
                "bloom_retry_min_ms must be at least 1 and bloom_retry_max_ms at least bloom_retry_min_ms",
            ));
        }
        if self.sql.outbox_retention_secs.saturating_mul(1000) < 4 * self.sql.outbox_gap_ms {
            return Err(invalid(
                "sql.outbox_retention_secs",
                format!(
                    "must be at least four times sql.outbox_gap_ms ({} ms), so nothing still uncommitted is trimmed, got {} s",
                    self.sql.outbox_gap_ms, self.sql.outbox_retention_secs
                ),
            ));
        }
        if self.sql.out_of_step_ms < 2 * self.sql.outbox_poll_ms {
            return Err(invalid(
                "sql.out_of_step_ms",
                format!(
                    "must be at least twice sql.outbox_poll_ms ({}), got {}",
                    self.sql.outbox_poll_ms, self.sql.out_of_step_ms
                ),
            ));
        }
        if c.l1_capacity == 0 {
            return Err(invalid("cache.l1_capacity", "must be at least 1"));
        }
        for (key, v) in [
            ("cache.l1_ttl_secs", c.l1_ttl_secs),
            ("cache.l1_negative_ttl_secs", c.l1_negative_ttl_secs),
            ("cache.redis_ttl_secs", c.redis_ttl_secs),
            ("cache.redis_nil_ttl_secs", c.redis_nil_ttl_secs),
        ] {
            if v == 0 {
                return Err(invalid(key, "must be at least 1 second"));
            }
        }
        for (key, v) in [
            ("cache.redis_timeout_ms", c.redis_timeout_ms),
            ("cache.bloom_monitor_ms", c.bloom_monitor_ms),
            (
                "cache.bloom_snapshot_every_secs",
                c.bloom_snapshot_every_secs,
            ),
            ("cache.change_log_max_len", c.change_log_max_len),
            ("cache.redis_breaker_open_ms", c.redis_breaker_open_ms),
            ("sql.acquire_timeout_ms", self.sql.acquire_timeout_ms),
            ("sql.statement_timeout_ms", self.sql.statement_timeout_ms),
            (
                "sql.background_statement_timeout_ms",
                self.sql.background_statement_timeout_ms,
            ),
            ("sql.scan_parallel", u64::from(self.sql.scan_parallel)),
            ("sql.queue_timeout_ms", self.sql.queue_timeout_ms),
            ("sql.slow_query_ms", self.sql.slow_query_ms),
            ("sql.outbox_poll_ms", self.sql.outbox_poll_ms),
            ("sql.outbox_idle_poll_ms", self.sql.outbox_idle_poll_ms),
            ("sql.outbox_gap_ms", self.sql.outbox_gap_ms),
            ("sql.outbox_retention_secs", self.sql.outbox_retention_secs),
            ("sql.out_of_step_ms", self.sql.out_of_step_ms),
            (
                "cache.redis_breaker_failures",
                u64::from(c.redis_breaker_failures),
            ),
            ("sql.pool_size", u64::from(self.sql.pool_size)),
            (
                "sql.max_concurrent_loads",
                u64::from(self.sql.max_concurrent_loads),
            ),
            ("http.body_limit_bytes", self.http.body_limit_bytes as u64),
            ("http.request_timeout_ms", self.http.request_timeout_ms),
            ("http.header_timeout_ms", self.http.header_timeout_ms),
        ] {
            if v == 0 {
                return Err(invalid(key, "must be at least 1"));
            }
        }
        if self.sql.scan_parallel > 16 {
            return Err(invalid("sql.scan_parallel", "must be at most 16"));
        }
        if c.redis_breaker_max_open_ms < c.redis_breaker_open_ms {
            return Err(invalid(
                "cache.redis_breaker_max_open_ms",
                "must be at least cache.redis_breaker_open_ms",
            ));
        }
        if self.http.rate_limit_per_sec > 0 && self.http.rate_limit_burst == 0 {
            return Err(invalid("http.rate_limit_burst", "must be at least 1"));
        }
        let scheme = self.database_url.split_once("://").map(|(s, _)| s);
        if !matches!(
            scheme,
            Some("sqlite" | "mysql" | "mariadb" | "postgres" | "postgresql")
        ) {
            // Quote only what is a scheme: a secret file holding the
            // password instead of the URL must not be echoed.
            let shown = scheme
                .filter(|s| {
                    s.len() <= 16
                        && s.chars()
                            .all(|c| c.is_ascii_alphanumeric() || "+.-".contains(c))
                })
                .map_or_else(|| "not a URL".to_string(), |s| format!("`{s}`"));
            return Err(invalid(
                "database_url",
                format!("unsupported scheme {shown} (sqlite://, mysql://, postgres://)"),
            ));
        }
        if let Some(scan) = &self.scan_database_url {
            let family = |url: &str| match url.split_once("://").map(|(s, _)| s) {
                Some("mysql" | "mariadb") => Some("mysql"),
                Some("postgres" | "postgresql") => Some("postgres"),
                _ => None,
            };
            if family(scan).is_none() || family(scan) != family(&self.database_url) {
                return Err(invalid(
                    "scan_database_url",
                    "must be a replica of database_url: a mysql:// or postgres:// URL of the same kind (SQLite has no replica)",
                ));
            }
        }
        if let Some(url) = &self.redis_url {
            if !(url.starts_with("redis://")
                || url.starts_with("rediss://")
                || url.starts_with("unix://"))
            {
                return Err(invalid(
                    "redis_url",
                    "must start with redis:// (or rediss:// for TLS)",
                ));
            }
        }
        if self.redis_url.is_some() && !self.redis_cluster.is_empty() {
            return Err(invalid(
                "redis_cluster",
                "set either redis_url (one server) or redis_cluster (a cluster's nodes), not both",
            ));
        }
        for node in &self.redis_cluster {
            if !(node.starts_with("redis://") || node.starts_with("rediss://")) {
                return Err(invalid(
                    "redis_cluster",
                    format!(
                        "each node must start with redis:// or rediss:// (got `{}`)",
                        crate::text::redact_url(node)
                    ),
                ));
            }
        }
        let tls_nodes = self
            .redis_cluster
            .iter()
            .filter(|n| n.starts_with("rediss://"))
            .count();
        if tls_nodes > 0 && tls_nodes < self.redis_cluster.len() {
            return Err(invalid(
                "redis_cluster",
                "all nodes rediss:// or none: the cluster client speaks one way to every node",
            ));
        }
        self.validate_redis_tls()?;
        let mut served: Vec<&str> = self.resources.iter().map(|r| r.name.as_str()).collect();
        if self.demo() {
            served.push("skus");
        }
        self.resp.validate(&served, self.admin_token.is_some())?;
        let tables: Vec<&str> = self.resources.iter().map(|r| r.name.as_str()).collect();
        let captured: Vec<&str> = self
            .resources
            .iter()
            .filter(|r| r.capture == super::Capture::Triggers)
            .map(|r| r.name.as_str())
            .collect();
        self.gate.validate(&tables, &captured)?;
        if self.admin_token.as_deref() == Some("") {
            return Err(invalid("admin_token", "must not be empty"));
        }
        if self.admin_token.is_none() && !self.listen.ip().is_loopback() {
            return Err(invalid(
                "admin_token",
                format!(
                    "required when listening on a non-loopback address ({})",
                    self.listen
                ),
            ));
        }
        Ok(())
    }
}

impl Config {
    /// The `redis_tls_*` files: only beside a `rediss://` target, a client
    /// certificate with its key, and each file there to read.
    fn validate_redis_tls(&self) -> Result<(), ConfigError> {
        let files = [
            ("redis_tls_ca", &self.redis_tls_ca),
            ("redis_tls_cert", &self.redis_tls_cert),
            ("redis_tls_key", &self.redis_tls_key),
        ];
        let Some((first, _)) = files.iter().find(|(_, f)| f.is_some()) else {
            return Ok(());
        };
        let tls = self
            .redis_url
            .iter()
            .chain(&self.redis_cluster)
            .any(|u| u.starts_with("rediss://"));
        if !tls {
            return Err(invalid(
                first,
                "is for a Redis spoken to over TLS: redis_url or redis_cluster must use rediss://",
            ));
        }
        match (&self.redis_tls_cert, &self.redis_tls_key) {
            (Some(_), None) => {
                return Err(invalid("redis_tls_key", "redis_tls_cert needs its key"))
            }
            (None, Some(_)) => {
                return Err(invalid(
                    "redis_tls_cert",
                    "redis_tls_key needs its certificate",
                ))
            }
            _ => {}
        }
        for (key, file) in files {
            if let Some(path) = file {
                std::fs::metadata(path)
                    .map_err(|e| invalid(key, format!("cannot read {}: {e}", path.display())))?;
            }
        }
        Ok(())
    }

    /// Whether Redis is configured (`redis_url` or `redis_cluster`);
    /// `redis_link::RedisTarget::of` says where.
    #[must_use]
    pub fn uses_redis(&self) -> bool {
        self.redis_url.is_some() || !self.redis_cluster.is_empty()
    }
}
