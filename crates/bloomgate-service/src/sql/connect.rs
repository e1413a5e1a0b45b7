//! Where the store's connections go: SQLite's file, and the scan
//! readers' read replica (`scan_database_url`) with the wait that makes a
//! scan there see everything the primary had committed when it began.

use std::time::{Duration, Instant};

use super::error::err;
use super::scan;
use crate::config::SqlConfig;
use crate::source::StoreError;
use crate::sql::limits::Within;
use crate::sql::Database;

impl Database {
    /// Scans read `url`, a replica of this store's database, from now on
    /// (the driver's own pool of `sql.scan_parallel` connections, opened
    /// lazily); every full scan first waits for it to catch up
    /// ([`Self::scan_caught_up`]).
    ///
    /// # Errors
    /// [`StoreError`] for a URL the driver cannot read (rather than
    /// scanning the primary without a word).
    pub fn with_scan_replica(mut self, url: &str, c: &SqlConfig) -> Result<Self, StoreError> {
        self.scan_pool = scan::ScanPool::lazy(self.backend, url, c);
        if matches!(self.scan_pool, scan::ScanPool::None) {
            return Err(StoreError::new(
                "scan replica",
                "scan_database_url is not a URL the driver can connect with",
            ));
        }
        self.scan_replica = true;
        Ok(self)
    }

    /// With a scan replica: waits until it has replayed everything the
    /// primary had committed now (MariaDB: `MASTER_GTID_WAIT` for the
    /// primary's `gtid_binlog_pos`; MySQL: `WAIT_FOR_EXECUTED_GTID_SET`
    /// for its `gtid_executed`, refused when empty; PostgreSQL: its replay
    /// position reaching the primary's WAL insert position), at most the
    /// background statement limit. A scan that starts after this misses
    /// no row a scan of the primary would have found; the change feed was
    /// positioned before.
    ///
    /// # Errors
    /// [`StoreError`]: the replica did not catch up in time, is not a
    /// replica (PostgreSQL), or a statement failed.
    pub(crate) async fn scan_caught_up(&self) -> Result<(), StoreError> {
        if !self.scan_replica {
            return Ok(());
        }
        let started = Instant::now();
        let timeout = self.bg_limit.timeout;
        let behind = |why: String| StoreError::new("scan replica", why);
        match &self.scan_pool {
            scan::ScanPool::MySql(replica) => {
                let version: String = sqlx::query_scalar("SELECT VERSION()")
                    .fetch_one(&self.pool)
                    .within(&self.bg_limit, "scan replica")
                    .await
                    .map_err(err("scan replica"))?;
                let mariadb = version.to_ascii_lowercase().contains("mariadb");
                let (position, wait) = if mariadb {
                    (
                        "SELECT CAST(@@GLOBAL.gtid_binlog_pos AS CHAR)",
                        "SELECT MASTER_GTID_WAIT(?, ?)",
                    )
                } else {
                    (
                        "SELECT CAST(@@GLOBAL.gtid_executed AS CHAR)",
                        "SELECT WAIT_FOR_EXECUTED_GTID_SET(?, ?)",
                    )
                };
                let position: String = sqlx::query_scalar(position)
                    .fetch_one(&self.pool)
                    .within(&self.bg_limit, "scan replica")
                    .await
                    .map_err(err("scan replica"))?;
                // An empty position is reached at once by any server: the
                // wait would prove nothing (MySQL with gtid_mode OFF, a
                // primary without a binary log).
                if position.trim().is_empty() {
                    return Err(behind(
                        "the primary reports no GTID position (MySQL: gtid_mode must be ON; MariaDB: log_bin must be on): the scan replica's progress cannot be checked".into(),
                    ));
                }
                // MariaDB answers 0 when there, -1 on the timeout; MySQL
                // 0 and 1.
                let answer: Option<i64> = sqlx::query_scalar(wait)
                    .bind(&position)
                    // Whole seconds: MySQL's wait takes no fraction.
                    .bind(timeout.as_secs().max(1))
                    .fetch_one(replica)
                    .within(&self.bg_limit, "scan replica")
                    .await
                    .map_err(err("scan replica"))?;
                if answer != Some(0) {
                    return Err(behind(format!(
                        "the replica of scan_database_url did not reach the primary's position {position:?} within {timeout:?}"
                    )));
                }
            }
            scan::ScanPool::Postgres(replica) => {
                let position: String = sqlx::query_scalar(
                    // The insert position: at or past every commit record,
                    // even one not yet written out (synchronous_commit off).
                    "SELECT (CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() ELSE pg_current_wal_insert_lsn() END)::text",
                )
                .fetch_one(&self.pool)
                .within(&self.bg_limit, "scan replica")
                .await
                .map_err(err("scan replica"))?;
                loop {
                    let (standby, there): (bool, bool) = sqlx::query_as(
                        "SELECT pg_is_in_recovery(), COALESCE(pg_last_wal_replay_lsn() >= $1::pg_lsn, false)",
                    )
                    .bind(&position)
                    .fetch_one(replica)
                    .within(&self.bg_limit, "scan replica")
                    .await
                    .map_err(err("scan replica"))?;
                    if !standby {
                        return Err(behind(
                            "scan_database_url is not a standby (pg_is_in_recovery() is false): its WAL position says nothing of the primary's".into(),
                        ));
                    }
                    if there {
                        break;
                    }
                    if started.elapsed() >= timeout {
                        return Err(behind(format!(
                            "the standby of scan_database_url did not replay the primary's WAL to {position} within {timeout:?}"
                        )));
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
            scan::ScanPool::None => {}
        }
        let waited = started.elapsed();
        if waited > Duration::from_millis(100) {
            tracing::info!(
                waited_ms = waited.as_millis() as u64,
                "the scan replica caught up; scanning it"
            );
        }
        Ok(())
    }
}

/// Adds `mode=rwc` to a SQLite URL and creates the file's directory.
pub(super) fn prepare_sqlite(url: &str) -> String {
    let rest = url
        .trim_start_matches("sqlite://")
        .trim_start_matches("sqlite:");
    let (path, query) = rest.split_once('?').unwrap_or((rest, ""));
    if path != ":memory:" && !path.is_empty() {
        if let Some(dir) = std::path::Path::new(path).parent() {
            if !dir.as_os_str().is_empty() {
                let _ = std::fs::create_dir_all(dir);
            }
        }
    }
    let mut params: Vec<&str> = query.split('&').filter(|p| !p.is_empty()).collect();
    if !params.iter().any(|p| p.starts_with("mode=")) {
        params.push("mode=rwc");
    }
    format!("sqlite://{path}?{}", params.join("&"))
}
