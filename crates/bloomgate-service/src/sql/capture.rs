//! Change capture by triggers: `AFTER INSERT`, `AFTER UPDATE`
//! and `AFTER DELETE` triggers on a guarded table write its changes into
//! `bloomgate_changes` inside the writer's own transaction, whoever the
//! writer is. A rolled-back write leaves no entry; a committed one has
//! its entry, which every instance's outbox follower applies.
//!
//! Each entry names the resource, the key as text, the kind (`c`, `u`,
//! `d`; an update of the key column is a `d` of the old key and a `c` of
//! the new one) and the origin [`CAPTURED`]. Keys that are NULL or longer
//! than [`crate::key::MAX_TEXT_KEY`] bytes are not recorded: no request
//! can name them (the API refuses them with a 400), and a trigger must
//! never fail the writer's statement.
//!
//! Trigger names carry [`CAPTURE_VERSION`] and a hash of what they
//! record (resource, table, key column), so a changed definition has a
//! new name. Installing creates the current ones, idempotently; at start
//! it also drops `bloomgate_` triggers of a strictly older version (with
//! a log line). Triggers of the same or a newer version with another
//! definition belong to another instance of a rolling deploy: they are
//! left alone, so two definitions never drop each other in turn.
//!
//! A trigger counts as installed only when it fires for ordinary
//! sessions: on PostgreSQL it is enabled (`tgenabled` `O` or `A`; a
//! `DISABLE TRIGGER` or an `ENABLE REPLICA` one is re-enabled as
//! `ENABLE ALWAYS`, which needs the table's owner) on the table and on
//! every partition of a partitioned table. A trigger this service
//! creates is made `ENABLE ALWAYS` too where it owns the table, so
//! sessions with `session_replication_role = replica` are recorded as
//! well. Installing triggers on a table whose writes went unrecorded
//! ([`CaptureState::has_gap`]) owes its filter a rebuild (the outbox
//! follower's check, and the start, see to it). MySQL and MariaDB have no
//! disabled triggers; what they never fire for (`TRUNCATE`, foreign-key
//! cascades) is in the capture docs.
//! PostgreSQL's triggers call one function per table, `SECURITY DEFINER`
//! (other programs' roles need no right on the outbox), which also
//! `NOTIFY`s channel [`NOTIFY_CHANNEL`]. MySQL's triggers run with their
//! definer's rights anyway.

use sqlx::Row;

use super::error::err;
use crate::source::StoreError;
use crate::sql::limits::Within;
use crate::sql::{Backend, Database};

/// The version of the triggers' text; part of their names.
/// Version 2: PostgreSQL's function records a partition's rows under
/// its partitioned table (version 1 recorded nothing for them).
pub const CAPTURE_VERSION: u32 = 2;

/// The origin of the entries triggers write.
pub const CAPTURED: &str = "db";

/// The PostgreSQL channel the capture triggers notify.
pub const NOTIFY_CHANNEL: &str = "bloomgate_changes";

/// One captured table: the resource its entries name, the table, its key
/// column (each already checked by `is_identifier` and the catalogue).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CaptureTarget {
    /// The resource name written into each entry.
    pub resource: String,
    /// The table.
    pub table: String,
    /// The key column.
    pub key: String,
}

/// What the database holds for a target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CaptureState {
    /// The current triggers that exist and fire.
    pub current: Vec<String>,
    /// Current triggers that exist but do not fire for ordinary sessions
    /// (PostgreSQL: disabled or replica-only, here or on a partition).
    pub disabled: Vec<String>,
    /// `bloomgate_` triggers of a strictly older version on the table.
    pub stale: Vec<String>,
    /// Whether one of `stale` fires (it records this table's writes
    /// while the current ones are made).
    pub stale_fires: bool,
    /// Ours of this or a newer version, another definition (a deploy's).
    pub others: Vec<String>,
    /// How many current triggers there should be.
    pub wanted: usize,
    /// Where every current trigger fires: a tag of their identities in
    /// the catalogue ([`Database::capture_state`]), which changes when
    /// one is dropped and made again or disabled and enabled again (on
    /// SQLite any DDL). `None` while they are not all current.
    pub fingerprint: Option<String>,
}

impl CaptureState {
    /// Every current trigger is there and fires (others beside them do
    /// not change that: this instance's entries are recorded).
    #[must_use]
    pub fn is_current(&self) -> bool {
        self.current.len() == self.wanted
    }

    /// Writes to the table may be unrecorded: the current triggers do
    /// not all fire and no older version of them does either (missing,
    /// disabled, replaced by another definition). A filter positioned in
    /// the outbox may then lack rows, so installing them again owes a
    /// rebuild.
    #[must_use]
    pub fn has_gap(&self) -> bool {
        !self.is_current() && !self.stale_fires
    }
}

/// The version a name of ours carries (`bloomgate_v<n>_…`).
fn version_of(name: &str) -> Option<u32> {
    name.strip_prefix("bloomgate_v")?
        .split_once('_')?
        .0
        .parse()
        .ok()
}

/// FNV-1a, 32 bits: a short, stable tag of a definition.
fn tag(parts: &[&str]) -> String {
    crate::wire::short_tag(parts)
}

/// FNV-1a, 64 bits: a tag of the current triggers' identities (a
/// collision would hide one replacement, so wider than [`tag`]).
fn fingerprint(parts: &[&str]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for b in p.bytes().chain([0]) {
            h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
    }
    format!("{h:016x}")
}

impl CaptureTarget {
    /// The prefix of every trigger (and PostgreSQL function) of this
    /// version and definition.
    pub(super) fn stem(&self) -> String {
        format!(
            "bloomgate_v{CAPTURE_VERSION}_{}",
            tag(&[&self.resource, &self.table, &self.key])
        )
    }

    /// The (unquoted) name of its PostgreSQL capture function.
    #[must_use]
    pub fn function_name(&self) -> String {
        format!("{}_fn", self.stem())
    }

    /// The trigger names this target has in `backend`.
    #[must_use]
    pub fn trigger_names(&self, backend: Backend) -> Vec<String> {
        let stem = self.stem();
        match backend {
            Backend::Postgres => vec![stem],
            _ => ["i", "u", "d"]
                .iter()
                .map(|op| format!("{stem}_{op}"))
                .collect(),
        }
    }
}

/// `name` quoted for `backend` (a quote inside doubled).
pub(super) fn q(backend: Backend, name: &str) -> String {
    match backend {
        Backend::MySql => format!("`{}`", name.replace('`', "``")),
        _ => format!("\"{}\"", name.replace('"', "\"\"")),
    }
}

/// Whether `name` is ours (`bloomgate_v<n>_<8 hex>`, then `_i`, `_u` or
/// `_d`): only such names are ever dropped or put into a statement.
fn is_ours(name: &str) -> bool {
    let Some(rest) = name.strip_prefix("bloomgate_v") else {
        return false;
    };
    let Some((version, rest)) = rest.split_once('_') else {
        return false;
    };
    let (tag, op) = rest.split_at(rest.len().min(8));
    !version.is_empty()
        && version.bytes().all(|b| b.is_ascii_digit())
        && tag.len() == 8
        && tag
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
        && ["", "_i", "_u", "_d"].contains(&op)
}

impl Database {
    /// The statements that install `t`'s triggers (what `bloomgate
    /// capture show` prints). `outbox` is the outbox table as the
    /// triggers name it (schema-qualified on PostgreSQL).
    #[must_use]
    pub fn capture_ddl(&self, t: &CaptureTarget, outbox: &str) -> Vec<String> {
        let b = self.backend;
        let (table, key) = (q(b, &t.table), q(b, &t.key));
        let now = self.now_ms_sql();
        let res = t.resource.replace('\'', "''");
        let cols = format!("{outbox} (resource, item_key, kind, origin, at)");
        let names = t.trigger_names(b);
        let max = crate::key::MAX_TEXT_KEY;
        match b {
            Backend::Sqlite => {
                let text = |row: &str| format!("CAST({row}.{key} AS TEXT)");
                let fits = |row: &str| {
                    format!(
                        "{row}.{key} IS NOT NULL AND length(CAST({row}.{key} AS BLOB)) <= {max}"
                    )
                };
                vec![
                    format!(
                        "CREATE TRIGGER {} AFTER INSERT ON {table} BEGIN \
                         INSERT INTO {cols} SELECT '{res}', {}, 'c', '{CAPTURED}', {now} WHERE {}; END",
                        q(b, &names[0]), text("NEW"), fits("NEW")
                    ),
                    format!(
                        "CREATE TRIGGER {} AFTER UPDATE ON {table} BEGIN \
                         INSERT INTO {cols} SELECT '{res}', {}, 'd', '{CAPTURED}', {now} \
                         WHERE OLD.{key} IS NOT NEW.{key} COLLATE BINARY AND {}; \
                         INSERT INTO {cols} SELECT '{res}', {}, \
                         CASE WHEN OLD.{key} IS NEW.{key} COLLATE BINARY THEN 'u' ELSE 'c' END, '{CAPTURED}', {now} \
                         WHERE {}; END",
                        q(b, &names[1]), text("OLD"), fits("OLD"), text("NEW"), fits("NEW")
                    ),
                    format!(
                        "CREATE TRIGGER {} AFTER DELETE ON {table} BEGIN \
                         INSERT INTO {cols} SELECT '{res}', {}, 'd', '{CAPTURED}', {now} WHERE {}; END",
                        q(b, &names[2]), text("OLD"), fits("OLD")
                    ),
                ]
            }
            Backend::MySql => {
                let text = |row: &str| format!("CAST({row}.{key} AS CHAR)");
                let fits = |row: &str| {
                    format!("{row}.{key} IS NOT NULL AND OCTET_LENGTH(CAST({row}.{key} AS CHAR)) <= {max}")
                };
                // Keys compare as bytes: a case-insensitive collation would
                // call 'A' -> 'a' no change of key.
                let same = format!("BINARY OLD.{key} <=> BINARY NEW.{key}");
                // Plain `INSERT … VALUES` under `IF`: a trigger's
                // `INSERT … SELECT` is a bulk insert to InnoDB (the AUTO-INC
                // table lock, and numbers reserved but not used).
                let put = |key: String, kind: String| {
                    format!(
                        "INSERT INTO {cols} VALUES ('{res}', {key}, {kind}, '{CAPTURED}', {now});"
                    )
                };
                vec![
                    format!(
                        "CREATE TRIGGER {} AFTER INSERT ON {table} FOR EACH ROW BEGIN \
                         IF {} THEN {} END IF; END",
                        q(b, &names[0]),
                        fits("NEW"),
                        put(text("NEW"), "'c'".into())
                    ),
                    format!(
                        "CREATE TRIGGER {} AFTER UPDATE ON {table} FOR EACH ROW BEGIN \
                         IF NOT ({same}) AND {} THEN {} END IF; \
                         IF {} THEN {} END IF; END",
                        q(b, &names[1]),
                        fits("OLD"),
                        put(text("OLD"), "'d'".into()),
                        fits("NEW"),
                        put(text("NEW"), format!("IF({same}, 'u', 'c')"))
                    ),
                    format!(
                        "CREATE TRIGGER {} AFTER DELETE ON {table} FOR EACH ROW BEGIN \
                         IF {} THEN {} END IF; END",
                        q(b, &names[2]),
                        fits("OLD"),
                        put(text("OLD"), "'d'".into())
                    ),
                ]
            }
            Backend::Postgres => {
                let func = q(b, &t.function_name());
                // Defence in depth beside the REVOKE below: the function
                // records nothing for a table that is neither this one nor
                // one of its partitions (a partitioned table's row trigger
                // fires on the partition, under the partition's name; the
                // catalogue is read only then).
                let table_lit = format!("'{}'", t.table.replace('\'', "''"));
                vec![
                    format!(
                        "CREATE OR REPLACE FUNCTION {func}() RETURNS trigger LANGUAGE plpgsql \
                         SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $bloomgate$ \
                         DECLARE o text; n text; \
                         BEGIN \
                           IF TG_TABLE_NAME <> {table_lit} THEN \
                             IF NOT EXISTS ( \
                               SELECT 1 FROM pg_catalog.pg_partition_ancestors(TG_RELID) a \
                               JOIN pg_catalog.pg_class c ON c.oid = a.relid \
                               WHERE c.relname = {table_lit}) THEN RETURN NULL; END IF; \
                           END IF; \
                           IF TG_OP <> 'INSERT' THEN o := OLD.{key}::text; END IF; \
                           IF TG_OP <> 'DELETE' THEN n := NEW.{key}::text; END IF; \
                           IF o IS NOT NULL AND o IS DISTINCT FROM n AND octet_length(o) <= {max} THEN \
                             INSERT INTO {cols} VALUES ('{res}', o, 'd', '{CAPTURED}', {now}); \
                           END IF; \
                           IF n IS NOT NULL AND octet_length(n) <= {max} THEN \
                             INSERT INTO {cols} VALUES ('{res}', n, \
                               CASE WHEN o IS NOT DISTINCT FROM n THEN 'u' ELSE 'c' END, '{CAPTURED}', {now}); \
                           END IF; \
                           PERFORM pg_notify('{NOTIFY_CHANNEL}', '{res}'); \
                           RETURN NULL; \
                         END $bloomgate$"
                    ),
                    // Only triggers call it (a role attaching it to a
                    // table of its own would run its casts as the owner).
                    format!("REVOKE EXECUTE ON FUNCTION {func}() FROM PUBLIC"),
                    format!(
                        "CREATE TRIGGER {} AFTER INSERT OR UPDATE OR DELETE ON {table} \
                         FOR EACH ROW EXECUTE FUNCTION {func}()",
                        q(b, &names[0])
                    ),
                ]
            }
        }
    }

    /// The statements that drop trigger `name` from `table` (and, on
    /// PostgreSQL, its function).
    #[must_use]
    pub fn capture_drop_ddl(&self, table: &str, name: &str) -> Vec<String> {
        let b = self.backend;
        match b {
            Backend::Postgres => vec![
                format!("DROP TRIGGER IF EXISTS {} ON {}", q(b, name), q(b, table)),
                format!("DROP FUNCTION IF EXISTS {}()", q(b, &format!("{name}_fn"))),
            ],
            _ => vec![format!("DROP TRIGGER IF EXISTS {}", q(b, name))],
        }
    }

    /// The `bloomgate_` triggers on `table`, each with whether it fires
    /// for ordinary sessions (PostgreSQL: enabled, `O` or `A`, on the table
    /// and on every partition of its partition tree; elsewhere always) and
    /// its identity in the catalogue: on PostgreSQL each `pg_trigger`
    /// row's `oid` (new when it is made again, a partition's clone
    /// included) and `xmin` (new when the row is updated: `ENABLE` and
    /// `DISABLE`, a rename), and the same of its function's `pg_proc` row
    /// (`CREATE OR REPLACE FUNCTION`, an owner change); on MySQL and MariaDB its `CREATED` time (to
    /// the hundredth of a second; no disabled triggers); on SQLite the
    /// schema's version (any DDL moves it: it costs a rebuild).
    async fn our_triggers(&self, table: &str) -> Result<Vec<(String, bool, String)>, StoreError> {
        let sql = match self.backend {
            Backend::Sqlite => format!(
                "SELECT name, 1, (SELECT CAST(schema_version AS TEXT) FROM pragma_schema_version) \
                 FROM sqlite_master WHERE type = 'trigger' AND tbl_name = {}",
                self.ph(1)
            ),
            Backend::MySql => format!(
                "SELECT CAST(TRIGGER_NAME AS CHAR), CAST(1 AS SIGNED), \
                   CAST(COALESCE(CAST(CREATED AS CHAR), '') AS CHAR) FROM information_schema.TRIGGERS \
                 WHERE TRIGGER_SCHEMA = DATABASE() AND EVENT_OBJECT_TABLE = {}",
                self.ph(1)
            ),
            // A partitioned table's row triggers are cloned onto each
            // partition; `pg_partition_tree` of a plain table is empty.
            Backend::Postgres => format!(
                "WITH rels AS (SELECT to_regclass({p}) AS relid \
                   UNION SELECT relid FROM pg_catalog.pg_partition_tree(to_regclass({p}))) \
                 SELECT CAST(t.tgname AS TEXT), \
                   CAST(CASE WHEN bool_and(t.tgenabled IN ('O', 'A')) \
                     AND count(*) = (SELECT count(*) FROM rels) THEN 1 ELSE 0 END AS BIGINT), \
                   CAST(string_agg(CAST(t.oid AS TEXT) || ':' || CAST(t.xmin AS TEXT) \
                     || ':' || CAST(p.oid AS TEXT) || ':' || CAST(p.xmin AS TEXT), ',' \
                     ORDER BY t.oid) AS TEXT) \
                 FROM pg_catalog.pg_trigger t JOIN pg_catalog.pg_proc p ON p.oid = t.tgfoid \
                 WHERE t.tgrelid IN (SELECT relid FROM rels) \
                 GROUP BY t.tgname",
                p = self.ph(1)
            ),
        };
        let arg = match self.backend {
            Backend::Postgres => q(self.backend, table),
            _ => table.to_owned(),
        };
        let rows = sqlx::query(&sql)
            .bind(arg)
            .fetch_all(&self.pool)
            .within(&self.bg_limit, "capture check")
            .await
            .map_err(err("capture check"))?;
        let mut names = Vec::new();
        for r in rows {
            let name: String = r.try_get(0).map_err(err("capture check"))?;
            let fires: i64 = r.try_get(1).map_err(err("capture check"))?;
            let identity: String = r.try_get(2).map_err(err("capture check"))?;
            if is_ours(&name) {
                names.push((name, fires == 1, identity));
            }
        }
        Ok(names)
    }

    /// Which of `t`'s triggers exist and fire, which exist disabled, and
    /// which other triggers of ours the table holds.
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn capture_state(&self, t: &CaptureTarget) -> Result<CaptureState, StoreError> {
        let wanted = t.trigger_names(self.backend);
        let mut state = CaptureState {
            current: Vec::new(),
            disabled: Vec::new(),
            stale: Vec::new(),
            stale_fires: false,
            others: Vec::new(),
            wanted: wanted.len(),
            fingerprint: None,
        };
        let mut identities = Vec::new();
        for (name, fires, identity) in self.our_triggers(&t.table).await? {
            if wanted.contains(&name) {
                if fires {
                    identities.push(format!("{name}={identity}"));
                    state.current.push(name);
                } else {
                    state.disabled.push(name);
                }
            } else if version_of(&name).is_some_and(|v| v < CAPTURE_VERSION) {
                state.stale_fires |= fires;
                state.stale.push(name);
            } else {
                state.others.push(name);
            }
        }
        if state.is_current() {
            identities.sort();
            let parts: Vec<&str> = identities.iter().map(String::as_str).collect();
            state.fingerprint = Some(fingerprint(&parts));
        }
        Ok(state)
    }

    /// Enables `t`'s current triggers that do not fire, installs those
    /// that are missing, then, with `drop_older`, drops those of an older
    /// version (each named in a log line): the new set records before the
    /// old one goes, so no write in between goes unrecorded (one recorded
    /// twice is harmless). On a failure the triggers this call created are
    /// dropped again, so the table is left as it was found. Returns
    /// whether anything changed.
    ///
    /// # Errors
    /// [`StoreError`] from the first statement that failed.
    pub async fn install_capture(
        &self,
        t: &CaptureTarget,
        drop_older: bool,
    ) -> Result<bool, StoreError> {
        let state = self.capture_state(t).await?;
        if state.is_current() {
            return Ok(drop_older && self.drop_older(t, &state).await?);
        }
        // Present but not firing (a `DISABLE TRIGGER`, a restore with
        // triggers disabled, `ENABLE REPLICA`): enabled for every session.
        for name in &state.disabled {
            tracing::warn!(table = %t.table, trigger = %name, "a capture trigger was disabled; enabling it (ENABLE ALWAYS)");
            if let Some(ddl) = self.capture_always_ddl(t, name) {
                self.run_ddl(&[ddl]).await?;
            }
        }
        let outbox = self.outbox_for_triggers().await?;
        let names = t.trigger_names(self.backend);
        let ddl = self.capture_ddl(t, &outbox);
        // Per trigger, the statements that make it: one each, or on
        // PostgreSQL the function and then the one trigger.
        let pieces: Vec<(&String, &[String])> = if self.backend == Backend::Postgres {
            vec![(&names[0], &ddl[..])]
        } else {
            names.iter().zip(ddl.chunks(1)).collect()
        };
        let mut created = Vec::new();
        for (name, statements) in pieces {
            if state.current.contains(name) || state.disabled.contains(name) {
                continue;
            }
            if let Err(e) = self.run_ddl(statements).await {
                // Another instance starting at the same time may have made
                // it (or all of them) meanwhile.
                if self
                    .capture_state(t)
                    .await
                    .is_ok_and(|now| now.is_current())
                {
                    return Ok(false);
                }
                if self
                    .capture_state(t)
                    .await
                    .is_ok_and(|now| now.current.contains(name))
                {
                    continue;
                }
                for made in created {
                    let _ = self.run_ddl(&self.capture_drop_ddl(&t.table, made)).await;
                }
                return Err(e);
            }
            created.push(name);
        }
        for name in created {
            self.enable_always(t, name).await;
        }
        if drop_older {
            self.drop_older(t, &state).await?;
        }
        Ok(true)
    }

    /// The statement that makes a new PostgreSQL trigger fire for every
    /// session, `session_replication_role = replica` ones too (a logical
    /// replication apply, `pg_restore` and bulk loaders set it); `None`
    /// elsewhere (MySQL and SQLite triggers always fire).
    #[must_use]
    pub fn capture_always_ddl(&self, t: &CaptureTarget, name: &str) -> Option<String> {
        (self.backend == Backend::Postgres).then(|| {
            format!(
                "ALTER TABLE {} ENABLE ALWAYS TRIGGER {}",
                q(self.backend, &t.table),
                q(self.backend, name)
            )
        })
    }

    /// Makes a trigger this call created fire for every session, where
    /// this connection owns the table; otherwise it stays enabled for
    /// ordinary sessions only, which the install's log line says.
    async fn enable_always(&self, t: &CaptureTarget, name: &str) {
        let Some(ddl) = self.capture_always_ddl(t, name) else {
            return;
        };
        if let Err(e) = self.run_ddl(&[ddl]).await {
            tracing::warn!(table = %t.table, trigger = %name, error = %e, "capture trigger left enabled for ordinary sessions only (ENABLE ALWAYS needs the table's owner): writes by sessions with session_replication_role = replica are not recorded");
        }
    }

    /// Drops the triggers of a strictly older version; whether there were
    /// any. Only at start and by `capture install`, never by the periodic
    /// check: an instance of the older release may still run beside this
    /// one, and its check would install them again in turn.
    async fn drop_older(
        &self,
        t: &CaptureTarget,
        state: &CaptureState,
    ) -> Result<bool, StoreError> {
        for name in &state.stale {
            tracing::info!(table = %t.table, trigger = %name, "replacing an older capture trigger");
            self.run_ddl(&self.capture_drop_ddl(&t.table, name)).await?;
        }
        if !state.others.is_empty() {
            tracing::warn!(table = %t.table, triggers = ?state.others, "the table holds capture triggers of another definition (another instance's, or a resource renamed); left alone: `bloomgate capture remove` drops them once no instance uses them");
        }
        Ok(!state.stale.is_empty())
    }

    /// Drops every `bloomgate_` trigger on `t`'s table; returns how many.
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn remove_capture(&self, t: &CaptureTarget) -> Result<usize, StoreError> {
        let names: Vec<String> = self
            .our_triggers(&t.table)
            .await?
            .into_iter()
            .map(|(n, _, _)| n)
            .collect();
        for name in &names {
            self.run_ddl(&self.capture_drop_ddl(&t.table, name)).await?;
        }
        Ok(names.len())
    }

    async fn run_ddl(&self, statements: &[String]) -> Result<(), StoreError> {
        for s in statements {
            sqlx::raw_sql(s)
                .execute(&self.pool)
                .within(&self.bg_limit, "capture install")
                .await
                .map_err(err("capture install"))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
