//! The change outbox's statements (`bloomgate_changes` and
//! `bloomgate_outbox_state`), in each dialect: what `crate::feed::outbox`
//! reads, trims and listens with. Every statement here is a background
//! one (counted as such); the trim's run under the read path's timeout,
//! as they hold locks others wait on.

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::time::Duration;

use sqlx::Row;

use super::{err, Database, StoreError, Within};

/// One outbox entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Its sequence number.
    pub seq: i64,
    /// The key it names (none for a rebuild request).
    pub key: String,
    /// `c`, `u`, `d`, or `r` (rebuild).
    pub kind: String,
    /// The instance that wrote it.
    pub origin: String,
    /// The resource it belongs to (every entry is read: no gaps).
    pub resource: String,
}

const COLUMNS: &str = "seq, item_key, kind, origin, resource";

impl Database {
    /// Counts a background statement and names it.
    fn bg(&self, name: &'static str) -> &'static str {
        self.counters.background.fetch_add(1, Ordering::Relaxed);
        name
    }

    /// The largest seq whose entry is older than `age_ms` (0 if none).
    pub(crate) async fn outbox_older_than(&self, age_ms: i64) -> Result<i64, StoreError> {
        let q = format!(
            "SELECT COALESCE(MAX(seq), 0) FROM bloomgate_changes WHERE at < {} - {}",
            self.now_ms_sql(),
            self.ph(1)
        );
        let row = sqlx::query(&q)
            .bind(age_ms)
            .fetch_one(&self.pool)
            .within(&self.bg_limit, self.bg("outbox start"))
            .await
            .map_err(err("outbox start"))?;
        row.try_get(0).map_err(err("outbox start"))
    }

    /// The largest visible seq (0 if none).
    pub(crate) async fn outbox_max_seq(&self) -> Result<i64, StoreError> {
        let row = sqlx::query("SELECT COALESCE(MAX(seq), 0) FROM bloomgate_changes")
            .fetch_one(&self.pool)
            .within(&self.bg_limit, self.bg("outbox max"))
            .await
            .map_err(err("outbox max"))?;
        row.try_get(0).map_err(err("outbox max"))
    }

    /// The largest seq deleted as too old (0 if none).
    pub(crate) async fn outbox_trimmed_through(&self) -> Result<i64, StoreError> {
        let row = sqlx::query(
            "SELECT COALESCE(MAX(value), 0) FROM bloomgate_outbox_state WHERE name = 'trimmed_through'",
        )
        .fetch_one(&self.pool)
        .within(&self.bg_limit, self.bg("outbox trimmed"))
        .await
        .map_err(err("outbox trimmed"))?;
        row.try_get(0).map_err(err("outbox trimmed"))
    }

    async fn outbox_fetch(&self, sql: &str, binds: &[i64]) -> Result<Vec<Entry>, StoreError> {
        let mut q = sqlx::query(sql);
        for b in binds {
            q = q.bind(*b);
        }
        let rows = q
            .fetch_all(&self.pool)
            .within(&self.bg_limit, self.bg("outbox read"))
            .await
            .map_err(err("outbox read"))?;
        rows.iter()
            .map(|r| {
                Ok(Entry {
                    seq: r.try_get(0)?,
                    key: r.try_get(1)?,
                    kind: r.try_get(2)?,
                    origin: r.try_get(3)?,
                    resource: r.try_get(4)?,
                })
            })
            .collect::<Result<_, sqlx::Error>>()
            .map_err(err("outbox read"))
    }

    /// Up to `limit` entries from `cursor` on, in seq order.
    pub(crate) async fn outbox_page(
        &self,
        cursor: i64,
        limit: usize,
    ) -> Result<Vec<Entry>, StoreError> {
        let q = format!(
            "SELECT {COLUMNS} FROM bloomgate_changes WHERE seq >= {} ORDER BY seq LIMIT {limit}",
            self.ph(1)
        );
        self.outbox_fetch(&q, &[cursor]).await
    }

    /// The entries among `seqs` that are visible now.
    pub(crate) async fn outbox_among(&self, seqs: &[i64]) -> Result<Vec<Entry>, StoreError> {
        let mut out = Vec::new();
        for chunk in seqs.chunks(1000) {
            let q = format!(
                "SELECT {COLUMNS} FROM bloomgate_changes WHERE seq IN ({})",
                self.phs(1, chunk.len())
            );
            out.extend(self.outbox_fetch(&q, chunk).await?);
        }
        Ok(out)
    }

    /// The entries visible now within the inclusive `ranges`, a few
    /// hundred ranges per statement.
    pub(crate) async fn outbox_within(
        &self,
        ranges: &[(i64, i64)],
    ) -> Result<Vec<Entry>, StoreError> {
        let mut out = Vec::new();
        for chunk in ranges.chunks(250) {
            let cond: Vec<String> = (0..chunk.len())
                .map(|i| {
                    format!(
                        "seq BETWEEN {} AND {}",
                        self.ph(2 * i + 1),
                        self.ph(2 * i + 2)
                    )
                })
                .collect();
            let q = format!(
                "SELECT {COLUMNS} FROM bloomgate_changes WHERE {}",
                cond.join(" OR ")
            );
            let binds: Vec<i64> = chunk.iter().flat_map(|&(a, b)| [a, b]).collect();
            out.extend(self.outbox_fetch(&q, &binds).await?);
        }
        Ok(out)
    }

    /// The seqs visible now in `floor < seq <= to`.
    pub(crate) async fn outbox_seqs_between(
        &self,
        floor: i64,
        to: i64,
    ) -> Result<HashSet<i64>, StoreError> {
        let q = format!(
            "SELECT seq FROM bloomgate_changes WHERE seq > {} AND seq <= {}",
            self.ph(1),
            self.ph(2)
        );
        sqlx::query(&q)
            .bind(floor)
            .bind(to)
            .fetch_all(&self.pool)
            .within(&self.bg_limit, self.bg("outbox read"))
            .await
            .map_err(err("outbox read"))?
            .iter()
            .map(|r| r.try_get::<i64, _>(0))
            .collect::<Result<_, _>>()
            .map_err(err("outbox read"))
    }

    /// The entries in each inclusive range, in one statement (one
    /// snapshot of the table).
    pub(crate) async fn outbox_count_within<const N: usize>(
        &self,
        ranges: &[(i64, i64); N],
    ) -> Result<[i64; N], StoreError> {
        let parts: Vec<String> = (0..N)
            .map(|i| {
                format!(
                    "(SELECT COUNT(*) FROM bloomgate_changes WHERE seq BETWEEN {} AND {})",
                    self.ph(2 * i + 1),
                    self.ph(2 * i + 2)
                )
            })
            .collect();
        let q = format!("SELECT {}", parts.join(", "));
        let mut query = sqlx::query(&q);
        for &(lo, hi) in ranges {
            query = query.bind(lo).bind(hi);
        }
        let row = query
            .fetch_one(&self.pool)
            .within(&self.bg_limit, self.bg("outbox read"))
            .await
            .map_err(err("outbox read"))?;
        let mut out = [0; N];
        for (i, n) in out.iter_mut().enumerate() {
            *n = row.try_get::<i64, _>(i).map_err(err("outbox read"))?;
        }
        Ok(out)
    }

    /// Takes the trim lease for `hold` when it has expired; whether it was
    /// taken. Without its row (the outbox of an earlier release, not yet
    /// migrated), every instance trims, as that release did.
    pub(crate) async fn outbox_take_trim_lease(&self, hold: Duration) -> Result<bool, StoreError> {
        let now = self.now_ms_sql();
        let taken = sqlx::query(&format!(
            "UPDATE bloomgate_outbox_state SET value = {now} + {} \
             WHERE name = 'trim_lease' AND value < {now}",
            self.ph(1)
        ))
        .bind(i64::try_from(hold.as_millis()).unwrap_or(i64::MAX))
        .execute(&self.pool)
        .within(&self.limit, self.bg("outbox trim"))
        .await
        .map_err(err("outbox trim"))?
        .rows_affected();
        if taken > 0 {
            return Ok(true);
        }
        let row = sqlx::query("SELECT 1 FROM bloomgate_outbox_state WHERE name = 'trim_lease'")
            .fetch_optional(&self.pool)
            .within(&self.limit, self.bg("outbox trim"))
            .await
            .map_err(err("outbox trim"))?;
        Ok(row.is_none())
    }

    /// The fingerprint of `t`'s triggers (`CaptureState::fingerprint`)
    /// an instance last saw current, kept beside the outbox so that a
    /// start can tell triggers replaced while no instance ran; `None`
    /// before any was noted (or from an earlier release's outbox).
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn capture_seen(
        &self,
        t: &super::CaptureTarget,
    ) -> Result<Option<String>, StoreError> {
        let row = sqlx::query(&format!(
            "SELECT value FROM bloomgate_outbox_state WHERE name = {}",
            self.ph(1)
        ))
        .bind(seen_name(t))
        .fetch_optional(&self.pool)
        .within(&self.bg_limit, "capture check")
        .await
        .map_err(err("capture check"))?;
        row.map(|r| r.try_get::<i64, _>(0).map(|v| format!("{:016x}", v as u64)))
            .transpose()
            .map_err(err("capture check"))
    }

    /// Notes `fingerprint` as the triggers of `t` last seen current (see
    /// [`Database::capture_seen`]); every instance that sees them notes
    /// the same value.
    ///
    /// # Errors
    /// [`StoreError`]; a fingerprint that is not one is ignored.
    pub async fn note_capture_seen(
        &self,
        t: &super::CaptureTarget,
        fingerprint: &str,
    ) -> Result<(), StoreError> {
        let Ok(value) = u64::from_str_radix(fingerprint, 16) else {
            return Ok(());
        };
        let value = value as i64;
        let name = seen_name(t);
        let updated = sqlx::query(&format!(
            "UPDATE bloomgate_outbox_state SET value = {} WHERE name = {}",
            self.ph(1),
            self.ph(2)
        ))
        .bind(value)
        .bind(name.clone())
        .execute(&self.pool)
        .within(&self.bg_limit, "capture check")
        .await
        .map_err(err("capture check"))?
        .rows_affected();
        if updated > 0 {
            return Ok(());
        }
        let inserted = sqlx::query(&format!(
            "INSERT INTO bloomgate_outbox_state (name, value) VALUES ({}, {})",
            self.ph(1),
            self.ph(2)
        ))
        .bind(name)
        .bind(value)
        .execute(&self.pool)
        .within(&self.bg_limit, "capture check")
        .await;
        match inserted {
            Ok(_) => Ok(()),
            // Another instance inserted it meanwhile (the same triggers'
            // value, or, if they changed in between, one the next start
            // finds different: a scan more, never one less).
            Err(e) if self.capture_seen(t).await.is_ok_and(|v| v.is_some()) => {
                tracing::debug!(error = %e, "capture fingerprint noted by another instance");
                Ok(())
            }
            Err(e) => Err(err("capture check")(e)),
        }
    }

    /// The largest seq older than `age_ms` (0 if none) and the smallest
    /// seq held (0 if none), in one statement.
    pub(crate) async fn outbox_trim_bounds(&self, age_ms: i64) -> Result<(i64, i64), StoreError> {
        let row = sqlx::query(&format!(
            "SELECT COALESCE(MAX(seq), 0), (SELECT COALESCE(MIN(seq), 0) FROM bloomgate_changes) \
             FROM bloomgate_changes WHERE at < {} - {}",
            self.now_ms_sql(),
            self.ph(1)
        ))
        .bind(age_ms)
        .fetch_one(&self.pool)
        .within(&self.limit, self.bg("outbox trim"))
        .await
        .map_err(err("outbox trim"))?;
        let through: i64 = row.try_get(0).map_err(err("outbox trim"))?;
        let oldest: i64 = row.try_get(1).map_err(err("outbox trim"))?;
        Ok((through, oldest))
    }

    /// Raises `trimmed_through` to `through` (never lowers it).
    pub(crate) async fn outbox_mark_trimmed(&self, through: i64) -> Result<(), StoreError> {
        sqlx::query(&format!(
            "UPDATE bloomgate_outbox_state SET value = {} WHERE name = 'trimmed_through' AND value < {}",
            self.ph(1),
            self.ph(2)
        ))
        .bind(through)
        .bind(through)
        .execute(&self.pool)
        .within(&self.limit, self.bg("outbox trim"))
        .await
        .map_err(err("outbox trim"))?;
        Ok(())
    }

    /// Deletes the entries in `after < seq <= upto`; how many.
    pub(crate) async fn outbox_delete(&self, after: i64, upto: i64) -> Result<u64, StoreError> {
        Ok(sqlx::query(&format!(
            "DELETE FROM bloomgate_changes WHERE seq > {} AND seq <= {}",
            self.ph(1),
            self.ph(2)
        ))
        .bind(after)
        .bind(upto)
        .execute(&self.pool)
        .within(&self.limit, self.bg("outbox trim"))
        .await
        .map_err(err("outbox trim"))?
        .rows_affected())
    }

    /// A connection listening on [`super::NOTIFY_CHANNEL`]: PostgreSQL's
    /// only (`None` for the other dialects).
    ///
    /// # Errors
    /// [`StoreError`]: no connection, or `LISTEN` failed.
    pub(crate) async fn outbox_listen(&self) -> Option<Result<Doorbell, StoreError>> {
        let pool = self.listen_pool.0.as_ref()?;
        Some(
            async {
                let mut listener = sqlx::postgres::PgListener::connect_with(pool)
                    .await
                    .map_err(err("outbox listen"))?;
                listener
                    .listen(super::NOTIFY_CHANNEL)
                    .await
                    .map_err(err("outbox listen"))?;
                Ok(Doorbell(listener))
            }
            .await,
        )
    }

    /// Whether this database can listen for outbox notifications.
    pub(crate) fn outbox_listens(&self) -> bool {
        self.listen_pool.0.is_some()
    }
}

/// A `LISTEN`ing PostgreSQL connection ([`Database::outbox_listen`]).
pub(crate) struct Doorbell(sqlx::postgres::PgListener);

impl Doorbell {
    /// The next notification: `Ok(true)` one arrived, `Ok(false)` the
    /// connection was lost and made again (what was sent meanwhile is
    /// gone).
    ///
    /// # Errors
    /// [`StoreError`]: the connection failed and could not be made again.
    pub(crate) async fn recv(&mut self) -> Result<bool, StoreError> {
        self.0
            .try_recv()
            .await
            .map(|n| n.is_some())
            .map_err(err("outbox listen"))
    }
}

/// The outbox-state row of `t`'s last seen triggers: `seen:` and their
/// stem (version and definition tag), within the column's 64 characters.
fn seen_name(t: &super::CaptureTarget) -> String {
    format!("seen:{}", t.stem())
}
