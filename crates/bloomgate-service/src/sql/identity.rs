//! The database's identity where bloomgate may not write one: the
//! server's own. Snapshots, epochs and the shared Redis filter name the
//! database they were made against, so a filter of another database
//! (staging and production under one Redis prefix) is never read as this
//! one's. With its outbox, that is the random number the outbox's first
//! migration wrote (it also tells a database recreated under the same
//! name apart); without it (a `SELECT`-only user), it is read from the
//! server:
//!
//! - PostgreSQL: `pg_control_system()`'s `system_identifier` (readable by
//!   any role) with `current_database()`;
//! - MySQL: `@@server_uuid` with the schema; MariaDB, which has none: the
//!   host name, port, data directory and `@@server_id` with the schema (a
//!   container whose host name changes at each restart gets a new
//!   identity: its shared filter is then filled again, never misread);
//! - SQLite: the file's path and inode (an in-memory database: a random
//!   one per process).

use sqlx::Row;

use super::error::err;
use crate::source::StoreError;
use crate::sql::limits::Within;
use crate::sql::{Backend, Database};

impl Database {
    /// Sets this database's identity from the server's own where the
    /// outbox gave none (see the module docs); a no-op otherwise. A server
    /// that does not answer gets a random identity of this process's: its
    /// filters are then shared with no other instance, never misread.
    pub async fn note_server_identity(&self) {
        if self.identity.get().is_some() {
            return;
        }
        let raw = match self.server_identity().await {
            Ok(raw) => raw,
            Err(e) => {
                tracing::warn!(error = %e, "the database server's identity could not be read: this instance's shared filter and snapshots are its own");
                format!("process-{:016x}", fastrand::u64(..))
            }
        };
        let _ = self.identity.set(format!(
            "server-{:016x}",
            xxhash_rust::xxh3::xxh3_64(raw.as_bytes())
        ));
    }

    async fn server_identity(&self) -> Result<String, StoreError> {
        let one = |sql: &'static str| async move {
            let row = sqlx::query(sql)
                .fetch_one(&self.pool)
                .within(&self.bg_limit, "identity")
                .await
                .map_err(err("identity"))?;
            row.try_get::<String, _>(0).map_err(err("identity"))
        };
        match self.backend {
            Backend::Postgres => {
                one("SELECT CAST(system_identifier AS TEXT) || '/' || current_database() FROM pg_control_system()")
                    .await
            }
            Backend::MySql => match one("SELECT CAST(CONCAT(@@server_uuid, '/', DATABASE()) AS CHAR)").await {
                Ok(id) => Ok(id),
                // MariaDB: no `server_uuid` (error 1193). Any other failure
                // is said as it is: a MySQL server must not take the
                // MariaDB identity, which its other instances do not.
                Err(e) if e.to_string().contains("1193") => {
                    one("SELECT CAST(CONCAT(@@hostname, ':', @@port, ':', @@datadir, ':', @@server_id, '/', DATABASE()) AS CHAR)")
                        .await
                }
                Err(e) => Err(e),
            },
            Backend::Sqlite => {
                let file = one("SELECT file FROM pragma_database_list WHERE name = 'main'").await?;
                if file.is_empty() {
                    return Ok(format!("memory-{:016x}", fastrand::u64(..)));
                }
                Ok(format!("{file}:{}", inode(&file)))
            }
        }
    }
}

#[cfg(unix)]
fn inode(path: &str) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).map_or(0, |m| m.ino())
}

#[cfg(not(unix))]
fn inode(_path: &str) -> u64 {
    0
}
