//! Who owns bloomgate's objects, and what the service needs of them when
//! a DBA made them (`bloomgate capture install` with the DBA's rights).
//!
//! On PostgreSQL a capture function is `SECURITY DEFINER`: it runs as its
//! owner on every write to the captured table, whoever writes. It inserts
//! into the outbox, and the outbox's owner may add a trigger to the
//! outbox, which then runs inside the function, as the function's owner.
//! So a function owned by a DBA (say `postgres`) over an outbox the
//! service owns hands the DBA's rights to anyone holding the service's
//! credentials. The rule kept here: **a capture function belongs to the
//! outbox's owner** ([`Database::align_capture_owner`]), so it never runs
//! with rights the owner of the table it writes lacks. Where the DBA owns
//! the outbox too, the service gets plain DML on bloomgate's tables
//! ([`Database::outbox_grants`]) and no right to add triggers to them.
//! MySQL's nested triggers run as their own definers: nothing to align.

use sqlx::Row;

use super::capture::{q, CaptureTarget};
use super::error::err;
use crate::source::StoreError;
use crate::sql::limits::Within;
use crate::sql::{Backend, Database};

/// bloomgate's own tables, which the service reads and writes.
pub const OWN_TABLES: [&str; 3] = [
    "bloomgate_changes",
    "bloomgate_outbox_state",
    "bloomgate_migrations",
];

impl Database {
    /// The role this connection acts as (PostgreSQL).
    async fn current_role(&self) -> Result<String, StoreError> {
        let row = sqlx::query("SELECT CAST(current_user AS TEXT)")
            .fetch_one(&self.pool)
            .within(&self.bg_limit, "owners")
            .await
            .map_err(err("owners"))?;
        row.try_get(0).map_err(err("owners"))
    }

    /// The owner of the outbox in the current schema (PostgreSQL); `None`
    /// before it exists.
    async fn outbox_owner(&self) -> Result<Option<String>, StoreError> {
        let row = sqlx::query(
            "SELECT CAST(tableowner AS TEXT) FROM pg_tables \
             WHERE schemaname = current_schema() AND tablename = 'bloomgate_changes'",
        )
        .fetch_optional(&self.pool)
        .within(&self.bg_limit, "owners")
        .await
        .map_err(err("owners"))?;
        row.map(|r| r.try_get(0).map_err(err("owners"))).transpose()
    }

    /// The owner of `t`'s capture function (PostgreSQL); `None` when it
    /// is not installed.
    async fn capture_function_owner(
        &self,
        t: &CaptureTarget,
    ) -> Result<Option<String>, StoreError> {
        let row = sqlx::query(
            "SELECT CAST(r.rolname AS TEXT) FROM pg_proc p JOIN pg_roles r ON r.oid = p.proowner \
             WHERE p.proname = $1 AND p.pronamespace = CAST(current_schema() AS regnamespace)",
        )
        .bind(t.function_name())
        .fetch_optional(&self.pool)
        .within(&self.bg_limit, "owners")
        .await
        .map_err(err("owners"))?;
        row.map(|r| r.try_get(0).map_err(err("owners"))).transpose()
    }

    /// PostgreSQL: gives `t`'s capture function to the outbox's owner when
    /// another role owns it. Returns the new owner when it changed.
    ///
    /// # Errors
    /// [`StoreError`], naming what to do, when this connection may not
    /// (only a superuser or a member of the outbox owner's role may).
    pub async fn align_capture_owner(
        &self,
        t: &CaptureTarget,
    ) -> Result<Option<String>, StoreError> {
        if self.backend != Backend::Postgres {
            return Ok(None);
        }
        let (Some(outbox), Some(function)) = (
            self.outbox_owner().await?,
            self.capture_function_owner(t).await?,
        ) else {
            return Ok(None);
        };
        if outbox == function {
            return Ok(None);
        }
        let alter = format!(
            "ALTER FUNCTION {}() OWNER TO {}",
            q(self.backend, &t.function_name()),
            q(self.backend, &outbox)
        );
        sqlx::raw_sql(&alter)
            .execute(&self.pool)
            .within(&self.bg_limit, "capture owner")
            .await
            .map_err(|e| {
                StoreError::new(
                    "capture owner",
                    format!(
                        "the capture function of {:?} belongs to {function:?} while {outbox:?} owns the outbox it writes, \
                         so {outbox:?} could run code as {function:?}; giving it to {outbox:?} failed ({e}): \
                         run `bloomgate capture install` as a superuser or a member of {outbox:?}",
                        t.table
                    ),
                )
            })?;
        Ok(Some(outbox))
    }

    /// PostgreSQL, at start: the escalation [`Self::align_capture_owner`]
    /// closes, where this connection cannot close it itself (it owns the
    /// outbox, another role owns `t`'s function): that role's name.
    ///
    /// # Errors
    /// [`StoreError`] when the catalogue cannot be read.
    pub async fn capture_owner_risk(
        &self,
        t: &CaptureTarget,
    ) -> Result<Option<String>, StoreError> {
        if self.backend != Backend::Postgres {
            return Ok(None);
        }
        let me = self.current_role().await?;
        if self.outbox_owner().await?.as_deref() != Some(me.as_str()) {
            return Ok(None);
        }
        Ok(self
            .capture_function_owner(t)
            .await?
            .filter(|owner| *owner != me))
    }

    /// The statements that give `user` what the service needs of
    /// bloomgate's own tables when another role owns them: plain DML and
    /// the outbox's sequence, no right to alter them or add triggers.
    #[must_use]
    pub fn outbox_grants(&self, user: &str) -> Vec<String> {
        let user = q(self.backend, user);
        let tables = OWN_TABLES.join(", ");
        let mut out = vec![format!(
            "GRANT SELECT, INSERT, UPDATE, DELETE ON {tables} TO {user}"
        )];
        if self.backend == Backend::Postgres {
            out.push(format!(
                "GRANT USAGE, SELECT ON SEQUENCE bloomgate_changes_seq_seq TO {user}"
            ));
        }
        out
    }

    /// PostgreSQL, after `capture install` made bloomgate's tables as a
    /// DBA: grants `user` (the service's) [`Self::outbox_grants`] when
    /// this connection owns the outbox and is not `user`. Returns whether
    /// it granted.
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn grant_outbox_to(&self, user: &str) -> Result<bool, StoreError> {
        if self.backend != Backend::Postgres {
            return Ok(false);
        }
        let me = self.current_role().await?;
        if me == user || self.outbox_owner().await?.as_deref() != Some(me.as_str()) {
            return Ok(false);
        }
        for s in self.outbox_grants(user) {
            sqlx::raw_sql(&s)
                .execute(&self.pool)
                .within(&self.bg_limit, "outbox grants")
                .await
                .map_err(err("outbox grants"))?;
        }
        Ok(true)
    }

    /// Drops bloomgate's own tables (`capture remove --outbox`): what an
    /// install as a DBA made, so the database is left as it was.
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn drop_own_tables(&self) -> Result<(), StoreError> {
        for t in OWN_TABLES {
            sqlx::raw_sql(&format!("DROP TABLE IF EXISTS {t}"))
                .execute(&self.pool)
                .within(&self.bg_limit, "drop outbox")
                .await
                .map_err(err("drop outbox"))?;
        }
        Ok(())
    }
}
