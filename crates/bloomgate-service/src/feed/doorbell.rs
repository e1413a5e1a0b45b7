//! The Redis stream (`{prefix}changes`) instances sharing one Redis use
//! as a doorbell and an epoch announcer, never as a copy of the changes:
//! the change outbox in SQL holds every write (the row and its entry
//! commit together), and each instance's outbox follower applies them.
//! A write through an instance appends a ring after its commit; every
//! instance's follower (`XREAD BLOCK`) rings its outbox follower, which
//! reads SQL at once instead of at its next idle poll. A lost ring (Redis
//! down, the stream trimmed or lost with a restart) costs latency only:
//! the outbox follower polls every `sql.outbox_idle_poll_ms` while the
//! doorbell is healthy and every `sql.outbox_poll_ms` while it is not,
//! and after an outage the follower rings once, so nothing is rebuilt.
//!
//! Epochs (shared rebuilds, [`crate::resource::Resource`]'s) are stored
//! in Redis through the doorbell's connection ([`epochs`]) and announced
//! in the outbox. The default resource's are also announced here in the
//! previous release's form (`{kind: b, epoch, …, recorded: 1}`), and an
//! entry of that release (`{kind: b, epoch}` unmarked, or `{kind: b}`
//! alone, a request to rebuild from SQL) is handed to the table it led
//! ([`Led`]): in a mixed fleet, each release adopts the other's epochs.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bloomgate_redis::Conn;
use redis::streams::StreamRangeReply;

use crate::redis_link::RedisTarget;
use crate::wire::kind;

use crate::source::BoxFuture;

/// The table the previous release led through the doorbell (the default
/// resource), as the follower hands it what that release's entries and
/// this release's create rings name: the resource implements it, so the
/// feed needs nothing of the read path.
pub trait Led: Send + Sync {
    /// Another instance created `id`: into the filter, out of L1.
    fn created(&self, id: i64);
    /// An instance of the previous release announced a shared rebuild on
    /// the stream: its epoch `epoch`, or, without one, a request to
    /// rebuild from SQL.
    fn built_by_earlier_release(self: Arc<Self>, epoch: Option<u64>) -> BoxFuture<'static, ()>;
}

/// The field that marks an announcement this release also recorded in the
/// outbox (its followers act on that entry; the previous release's ignore
/// fields they do not know).
const RECORDED: &str = "recorded";

mod epochs;
pub use epochs::REBUILD_LOCK_MS;
mod follow;

/// Counters of the doorbell stream.
#[derive(Debug, Default)]
pub struct DoorbellCounters {
    /// Entries appended by this instance (rings and announcements).
    pub published: AtomicU64,
    /// Appends that failed (the outbox followers learn at their next poll).
    pub publish_failures: AtomicU64,
    /// Other instances' entries read here (each rings the outbox follower).
    pub applied: AtomicU64,
    /// Times the follower found its position gone (the stream trimmed, or
    /// lost with a Redis restart) and went on from the end, ringing the
    /// outbox follower: nothing is lost, the outbox holds every write.
    pub gaps: AtomicU64,
}

/// The doorbell stream shared by the instances. Cheap to clone.
#[derive(Clone)]
pub struct Doorbell {
    target: RedisTarget,
    conn: Conn,
    key: String,
    prefix: String,
    max_len: u64,
    timeout: Duration,
    /// An epoch's filter is stored in strings of at most this many bytes.
    segment_bytes: u64,
    instance: String,
    /// The change outbox in SQL: replays read it, and every entry here
    /// rings its follower.
    outbox: crate::feed::outbox::Outbox,
    /// Counters, shared by clones.
    pub counters: Arc<DoorbellCounters>,
    /// The instance's shutdown signal.
    background: crate::tasks::Background,
}

impl std::fmt::Debug for Doorbell {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Doorbell")
            .field("key", &self.key)
            .field("instance", &self.instance)
            .finish_non_exhaustive()
    }
}

impl Doorbell {
    /// The doorbell stream `{prefix}changes`, keeping about `max_len` entries.
    ///
    /// # Errors
    /// The client's error for a bad URL or an unreachable server.
    pub async fn connect(
        target: &RedisTarget,
        prefix: &str,
        max_len: u64,
        timeout: Duration,
        segment_bytes: u64,
        outbox: crate::feed::outbox::Outbox,
    ) -> redis::RedisResult<Self> {
        let conn = target
            .connect(timeout.max(Duration::from_millis(200)), timeout)
            .await?;
        Ok(Self {
            target: target.clone(),
            conn,
            key: crate::wire::changes_key(prefix),
            prefix: prefix.to_string(),
            max_len,
            timeout,
            segment_bytes: segment_bytes.max(1),
            instance: format!("{:016x}", fastrand::u64(..)),
            outbox,
            counters: Arc::default(),
            background: crate::tasks::Background::new(),
        })
    }

    /// Ends the follower at `bg`'s signal.
    #[must_use]
    pub fn with_background(mut self, bg: crate::tasks::Background) -> Self {
        self.background = bg;
        self
    }

    /// One XADD of `fields` (and `from`); the new entry's id, or an error
    /// when Redis failed or did not answer within the timeout.
    async fn append(&self, fields: &[(&str, String)]) -> redis::RedisResult<String> {
        let mut conn = self.conn.clone();
        let mut cmd = redis::cmd("XADD");
        cmd.arg(&self.key)
            .arg("MAXLEN")
            .arg("~")
            .arg(self.max_len)
            .arg("*");
        for (k, v) in fields {
            cmd.arg(*k).arg(v);
        }
        cmd.arg("from").arg(&self.instance);
        tokio::time::timeout(self.timeout, cmd.query_async::<String>(&mut conn))
            .await
            .unwrap_or_else(|_| {
                Err(redis::RedisError::from(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "doorbell append timed out",
                )))
            })
    }

    /// Rings the other instances' outbox followers (a write was recorded
    /// in the outbox). Best effort: without it they read the outbox
    /// within `sql.outbox_idle_poll_ms` anyway.
    pub async fn ring(&self) {
        self.ring_with(&[("kind", kind::RING.into())]).await;
    }

    /// [`Doorbell::ring`] for a SKU just created: the ring names it, and
    /// each follower adds it to its filter (and drops a cached "not
    /// found"), usually before its outbox follower has read the entry: a
    /// hint, always safe for answers (a filter only grows), never the only
    /// copy.
    pub async fn ring_created(&self, id: i64) {
        self.ring_with(&[("kind", kind::RING.into()), ("learn", id.to_string())])
            .await;
    }

    async fn ring_with(&self, fields: &[(&str, String)]) {
        let mut sent = self.append(fields).await;
        // A connection Redis dropped (a restart) is replaced on its first
        // failure: one more try, unless Redis was merely slow.
        if sent.as_ref().is_err_and(|e| !e.is_timeout()) {
            sent = self.append(fields).await;
        }
        if sent.is_ok() {
            self.counters.published.fetch_add(1, Ordering::Relaxed);
        } else {
            self.counters
                .publish_failures
                .fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The id of the newest entry (`0-0` for an empty stream).
    ///
    /// # Errors
    /// Redis errors.
    pub async fn last_id(&self) -> redis::RedisResult<String> {
        self.newest(&mut self.conn.clone()).await
    }

    /// True when the stream holds entry `id` (always for `0-0`, the start
    /// of an empty stream).
    async fn holds(
        &self,
        conn: &mut impl redis::aio::ConnectionLike,
        id: &str,
    ) -> redis::RedisResult<bool> {
        if id == "0-0" {
            return Ok(true);
        }
        let found: StreamRangeReply = redis::cmd("XRANGE")
            .arg(&self.key)
            .arg(id)
            .arg(id)
            .query_async(conn)
            .await?;
        Ok(!found.ids.is_empty())
    }

    /// The id of the newest entry (`0-0` for an empty stream).
    async fn newest(
        &self,
        conn: &mut impl redis::aio::ConnectionLike,
    ) -> redis::RedisResult<String> {
        let newest: StreamRangeReply = redis::cmd("XREVRANGE")
            .arg(&self.key)
            .arg("+")
            .arg("-")
            .arg("COUNT")
            .arg(1)
            .query_async(conn)
            .await?;
        Ok(newest
            .ids
            .first()
            .map_or_else(|| "0-0".to_string(), |e| e.id.clone()))
    }
}
