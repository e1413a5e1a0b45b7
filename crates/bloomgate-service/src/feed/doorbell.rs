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
//! Shared rebuilds: an operator's warm with `rebuild_bloom` scans SQL once
//! for every instance. The instance it reaches takes the lock
//! `{prefix}bloom:rebuild:lock` (`SET NX PX`), notes the outbox watermark,
//! rebuilds, writes its filter (the library's snapshot format,
//! checksummed) under a fresh epoch number (`INCR {prefix}bloom:epoch`),
//! in strings of at most `cache.bloom_segment_bytes` each
//! (`{prefix}bloom:epoch:{n}:seg:{i}`, spread over a cluster's nodes)
//! named by `{prefix}bloom:epoch:{n}:meta`, deletes the previous epoch's keys and
//! appends `{kind: b, epoch, outbox, covered, capacity}`. Every other
//! instance's follower loads that epoch, verifies it, adds the ids
//! created since the watermark from the outbox and swaps it in: no SQL
//! scan. A warm that reaches another instance while the lock is held
//! waits for that epoch instead of starting a second rebuild. Whatever
//! fails (no lock, a segment gone, a checksum that does not verify, a
//! lost announcement) falls back to each instance rebuilding from SQL, or
//! keeping its own filter, which the outbox keeps complete. An instance
//! whose SKU table is watched (`cache.watch_column`) keeps its own
//! rebuilds (`keep_own_builds`): it answers an announced epoch with a
//! rebuild from SQL, since its watch admitted rows no replay could add.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use bloomgate_redis::Conn;
use redis::streams::{StreamRangeReply, StreamReadReply};
use tokio::sync::watch;

use crate::redis_link::{query_each, RedisTarget};
use crate::wire::kind;

use crate::gate::Gate;

/// The table whose rebuilds the doorbell leads (the SKU table), as its
/// follower acts on it beside the gate: the resource implements it, so
/// the feed needs nothing of the read path.
pub trait Led: Send + Sync {
    /// Drops every row this instance caches in process.
    fn forget_all_local(&self);
    /// Another instance created `id`: into the filter, out of L1.
    fn created(&self, id: i64);
}

mod epochs;
pub use epochs::{EpochError, Replace};
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
    /// Rebuilds other instances asked this one for (an operator's warm).
    pub rebuilds_requested: AtomicU64,
    /// Shared rebuilds this instance led (scanned SQL and published).
    pub rebuilds_led: AtomicU64,
    /// Other instances' rebuilds adopted here (no SQL scan).
    pub rebuilds_adopted: AtomicU64,
    /// Warms with `rebuild_bloom` that found another instance's shared
    /// rebuild running and waited for its epoch instead of scanning.
    pub rebuilds_joined: AtomicU64,
    /// Epochs that could not be adopted (a local rebuild ran instead).
    pub adopt_failures: AtomicU64,
    /// Epochs this instance stored: the start-up filter kept for the next
    /// instances, and every rebuild it led.
    pub epochs_stored: AtomicU64,
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
    /// The newest epoch this instance built or adopted.
    epoch: Arc<watch::Sender<u64>>,
    /// The change outbox in SQL: replays read it, and every entry here
    /// rings its follower.
    outbox: crate::feed::outbox::Outbox,
    /// Counters, shared by clones.
    pub counters: Arc<DoorbellCounters>,
    /// The SKU table is watched here: another instance's epoch lacks the
    /// rows this instance's watch admitted, so it rebuilds instead.
    own_builds: Arc<std::sync::atomic::AtomicBool>,
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
            epoch: Arc::new(watch::channel(0).0),
            outbox,
            counters: Arc::default(),
            own_builds: Arc::default(),
            background: crate::tasks::Background::new(),
        })
    }

    /// The SKU table keeps its own rebuilds here (it is watched): another
    /// instance's announced epoch is answered by a rebuild from SQL.
    pub fn keep_own_builds(&self) {
        self.own_builds.store(true, Ordering::Relaxed);
    }

    /// Whether [`Doorbell::keep_own_builds`] was called.
    #[must_use]
    pub fn keeps_own_builds(&self) -> bool {
        self.own_builds.load(Ordering::Relaxed)
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

    /// Asks every other instance to rebuild its filter from SQL (an
    /// operator's warm with `rebuild_bloom` reached one instance behind the
    /// load balancer). Best effort: a failure is logged.
    pub async fn publish_rebuild(&self) {
        if self.append(&[("kind", kind::BUILT.into())]).await.is_ok() {
            self.counters.published.fetch_add(1, Ordering::Relaxed);
        } else {
            self.counters
                .publish_failures
                .fetch_add(1, Ordering::Relaxed);
            tracing::warn!(
                "doorbell: the rebuild request for the other instances was not appended"
            );
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
