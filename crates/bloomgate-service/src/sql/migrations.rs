//! The schema: migrations applied in order and recorded in
//! `bloomgate_migrations` (the SKU table in portable DDL, the change outbox
//! whose auto-increment column each backend spells its own way, its state
//! row and index), safe when several instances migrate at once.

use sqlx::Row;

use super::error::{driver_error, err, is_undefined_table, is_unique_violation};
use crate::source::StoreError;
use crate::sql::limits::Within;
use crate::sql::{Backend, Database};

/// Migrations, applied in order and recorded in `bloomgate_migrations`:
/// the SKU table (portable DDL), then the change outbox (whose
/// auto-increment column each backend spells its own way) and its state
/// row.
/// What recording a change answers when the service runs without its
/// outbox (`sql.outbox` off: a `SELECT`-only user's configuration).
#[derive(Debug, thiserror::Error)]
#[error("bloomgate's outbox is off (sql.outbox): a change recorded here would reach no other instance; set sql.outbox = true (the database user then needs CREATE, or a DBA runs `bloomgate capture install`)")]
pub struct OutboxOff;

/// The migration that creates the demo SKU table.
const SKU_TABLE_MIGRATION: i64 = 1;

fn migrations(backend: Backend) -> Vec<(i64, String)> {
    let seq = match backend {
        Backend::Sqlite => "seq INTEGER PRIMARY KEY AUTOINCREMENT",
        Backend::MySql => "seq BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY",
        Backend::Postgres => "seq BIGSERIAL PRIMARY KEY",
    };
    // Start positions and trimming look entries up by age: MySQL takes the
    // index inside CREATE TABLE, the others in a statement of their own.
    let (at_index, index_ddl) = match backend {
        Backend::MySql => (", INDEX bloomgate_changes_at (at)", "SELECT 1"),
        _ => (
            "",
            "CREATE INDEX IF NOT EXISTS bloomgate_changes_at ON bloomgate_changes (at)",
        ),
    };
    vec![
        (
            1,
            "CREATE TABLE IF NOT EXISTS skus (\
                id BIGINT NOT NULL PRIMARY KEY, \
                name VARCHAR(255) NOT NULL, \
                original_price BIGINT NOT NULL, \
                seckill_price BIGINT NOT NULL, \
                stock BIGINT NOT NULL, \
                seckill_start BIGINT NOT NULL, \
                seckill_end BIGINT NOT NULL, \
                updated_at BIGINT NOT NULL)"
                .into(),
        ),
        (
            2,
            format!(
                "CREATE TABLE IF NOT EXISTS bloomgate_changes ({seq}, \
                    resource VARCHAR(64) NOT NULL, \
                    item_key VARCHAR(255) NOT NULL, \
                    kind VARCHAR(1) NOT NULL, \
                    origin VARCHAR(32) NOT NULL, \
                    at BIGINT NOT NULL{at_index})"
            ),
        ),
        (
            3,
            "CREATE TABLE IF NOT EXISTS bloomgate_outbox_state (\
                name VARCHAR(64) NOT NULL PRIMARY KEY, \
                value BIGINT NOT NULL)"
                .into(),
        ),
        (
            4,
            "INSERT INTO bloomgate_outbox_state (name, value) VALUES ('trimmed_through', 0)".into(),
        ),
        (5, index_ddl.into()),
        // MySQL: keys of any character (a server whose default is latin1
        // would make a capture trigger fail the writer's statement on an
        // emoji key). The default collation, not `utf8mb4_bin`: drivers
        // read a `_bin` column as VARBINARY, not text.
        (
            6,
            match backend {
                Backend::MySql => "ALTER TABLE bloomgate_changes CONVERT TO CHARACTER SET utf8mb4",
                _ => "SELECT 1",
            }
            .into(),
        ),
        // This database's identity (see `Database::identity`); positive,
        // so every backend's BIGINT holds it.
        (
            7,
            format!(
                "INSERT INTO bloomgate_outbox_state (name, value) VALUES ('identity', {})",
                fastrand::i64(1..)
            ),
        ),
        // The trim lease (see `feed::outbox::trim`): one instance trims.
        (
            8,
            "INSERT INTO bloomgate_outbox_state (name, value) VALUES ('trim_lease', 0)".into(),
        ),
    ]
}

impl Database {
    /// Applies the migrations not applied yet.
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn migrate(&self) -> Result<(), StoreError> {
        self.migrate_for(true).await
    }

    /// [`Self::migrate`], without the demo SKU table unless `demo` (its
    /// migration is applied by the first start that serves it).
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn migrate_for(&self, demo: bool) -> Result<(), StoreError> {
        // Read first: a database migrated already needs no DDL (nor the
        // right to run it) from a later start.
        let applied = match self.applied_migrations().await {
            Ok(applied) => applied,
            Err(e) if driver_error(&e).is_some_and(is_undefined_table) => {
                sqlx::query("CREATE TABLE IF NOT EXISTS bloomgate_migrations (version BIGINT NOT NULL PRIMARY KEY, applied_at BIGINT NOT NULL)")
                    .execute(&self.pool)
                    .within(&self.bg_limit, "migrate")
                    .await
                    .map_err(err("migrate"))?;
                self.applied_migrations().await?
            }
            // A right missing, a timeout: said as it is (a CREATE would
            // only blame the wrong right).
            Err(e) => return Err(e),
        };
        for (version, ddl) in migrations(self.backend) {
            if applied.contains(&version) || (version == SKU_TABLE_MIGRATION && !demo) {
                continue;
            }
            let res = sqlx::query(&ddl)
                .execute(&self.pool)
                .within(&self.bg_limit, "migrate")
                .await;
            // Two instances migrating at once: a seeding insert collides.
            if let Err(e) = res {
                if !is_unique_violation(&e) {
                    return Err(err("migrate")(e));
                }
            }
            let q = format!(
                "INSERT INTO bloomgate_migrations (version, applied_at) VALUES ({}, {})",
                self.ph(1),
                self.ph(2)
            );
            let res = sqlx::query(&q)
                .bind(version)
                .bind(crate::model::now_secs())
                .execute(&self.pool)
                .within(&self.bg_limit, "record migration")
                .await;
            // Two instances migrating at once: the loser's insert collides.
            if let Err(e) = res {
                if !is_unique_violation(&e) {
                    return Err(err("migrate")(e));
                }
            }
        }
        let row = sqlx::query("SELECT value FROM bloomgate_outbox_state WHERE name = 'identity'")
            .fetch_optional(&self.pool)
            .within(&self.bg_limit, "migrate")
            .await
            .map_err(err("migrate"))?;
        if let Some(row) = row {
            let id: i64 = row.try_get(0).map_err(err("migrate"))?;
            let _ = self.identity.set(format!("{:016x}", id as u64));
        }
        Ok(())
    }

    async fn applied_migrations(&self) -> Result<Vec<i64>, StoreError> {
        sqlx::query("SELECT version FROM bloomgate_migrations")
            .fetch_all(&self.pool)
            .within(&self.bg_limit, "migrate")
            .await
            .map_err(err("migrate"))?
            .iter()
            .map(|r| r.try_get::<i64, _>(0))
            .collect::<Result<_, _>>()
            .map_err(err("migrate"))
    }

    /// This database's identity: a random number the first migration of
    /// its outbox wrote, so a snapshot, a shared epoch or a shared filter
    /// made against another database (staging and production under one
    /// Redis prefix, a database recreated) is told apart from one of this
    /// database; without the outbox, the server's own
    /// ([`Self::note_server_identity`]). `None` before either.
    #[must_use]
    pub fn identity(&self) -> Option<&str> {
        self.identity.get().map(String::as_str)
    }

    /// Runs this store without bloomgate's outbox: nothing is migrated,
    /// and recording a change answers [`OutboxOff`].
    pub fn set_outbox_off(&self) {
        self.outbox_off
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// Runs this store with bloomgate's outbox again (found made by
    /// another instance after this one started without it).
    pub fn set_outbox_on(&self) {
        self.outbox_off
            .store(false, std::sync::atomic::Ordering::Relaxed);
    }

    /// Whether bloomgate's outbox is there to record changes in.
    #[must_use]
    pub fn outbox_on(&self) -> bool {
        !self.outbox_off.load(std::sync::atomic::Ordering::Relaxed)
    }

    pub(crate) fn refuse_without_outbox(&self) -> Result<(), StoreError> {
        if self.outbox_on() {
            Ok(())
        } else {
            Err(StoreError::new("record change", OutboxOff))
        }
    }

    /// Whether bloomgate's outbox is in the database already (an earlier
    /// start, another instance or a DBA made it) and this user may write
    /// it, read from the catalogue and the grants without touching it.
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn outbox_exists(&self) -> Result<bool, StoreError> {
        let q = match self.backend {
            Backend::Sqlite => {
                "SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = 'bloomgate_outbox_state'"
            }
            Backend::MySql => {
                "SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name = 'bloomgate_outbox_state'"
            }
            Backend::Postgres => {
                "SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = current_schema() AND table_name = 'bloomgate_outbox_state'"
            }
        };
        let n: i64 = sqlx::query(q)
            .fetch_one(&self.pool)
            .within(&self.bg_limit, "migrate")
            .await
            .map_err(err("migrate"))?
            .try_get(0)
            .map_err(err("migrate"))?;
        Ok(n > 0 && self.may_write_outbox().await?)
    }
}
