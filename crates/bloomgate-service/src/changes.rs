//! The change log that instances sharing one Redis use to stay in step: a
//! Redis Stream (`{prefix}changes`) of SKU writes. Every create, update and
//! delete appends `{id, kind, from}` after its SQL commit; every instance
//! follows the stream and, for entries from other instances, adds created
//! ids to its filter and drops the id from its L1. Without it a SKU created
//! through one instance is refused with a 404 by the others until they
//! rebuild (a false "no"), and their L1 keeps an updated SKU's old state.
//!
//! An instance appends a marker entry at start, notes the stream's last
//! entry before its first filter scan and follows from there, so an id
//! committed before the scan is scanned and one committed after it arrives
//! through the stream. After a Redis outage, if the stream no longer holds
//! the last entry the follower applied (trimmed past it, or lost with a
//! Redis restart), it cannot know what it missed: it rebuilds the filter
//! from SQL and empties its L1 instead of guessing. Appends that fail wait
//! in an in-memory queue (at most [`MAX_PENDING`]) and go out in order when
//! Redis answers; if the queue overflowed, a rebuild request for every
//! instance goes out first.
//!
//! Shared rebuilds: an operator's warm with `rebuild_bloom` scans SQL once
//! for every instance. The instance it reaches takes the lock
//! `{prefix}bloom:rebuild:lock` (`SET NX PX`), notes the stream's last
//! entry, rebuilds, writes its filter (the library's snapshot format,
//! checksummed) under a fresh epoch number (`INCR {prefix}bloom:epoch`),
//! in strings of at most `cache.bloom_segment_bytes` each
//! (`{prefix}bloom:epoch:{n}:seg:{i}`, spread over a cluster's nodes)
//! named by `{prefix}bloom:epoch:{n}:meta`, deletes the previous epoch's keys and
//! appends `{kind: b, epoch, at, capacity}`. Every other instance's
//! follower loads that epoch, verifies it, adds the ids created since
//! `at` from the stream and swaps it in: no SQL scan. A warm that reaches
//! another instance while the lock is held waits for that epoch instead
//! of starting a second rebuild. Whatever fails (no lock, a segment gone,
//! a checksum that does not verify) falls back to each instance
//! rebuilding from SQL.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bloomgate_redis::Conn;
use redis::streams::{StreamRangeReply, StreamReadReply};
use tokio::sync::watch;

use crate::redis_link::{query_each, RedisTarget};
use crate::wire::kind;

use crate::gate::Gate;
use crate::reader::ShieldedReader;

mod epochs;
mod follow;

/// What a write did to a SKU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChangeKind {
    /// A new SKU: other instances add its id to their filter.
    Created,
    /// New contents: other instances drop it from L1.
    Updated,
    /// Gone: other instances drop it from L1.
    Deleted,
}

impl ChangeKind {
    const fn code(self) -> &'static str {
        match self {
            Self::Created => kind::CREATED,
            Self::Updated => kind::UPDATED,
            Self::Deleted => kind::DELETED,
        }
    }
}

/// Counters of the change log.
#[derive(Debug, Default)]
pub struct ChangeCounters {
    /// Entries appended by this instance.
    pub published: AtomicU64,
    /// Appends that failed (other instances learn at their next rebuild).
    pub publish_failures: AtomicU64,
    /// Entries from other instances applied here.
    pub applied: AtomicU64,
    /// Times the follower found a gap and rebuilt instead.
    pub gaps: AtomicU64,
    /// Rebuilds other instances asked this one for (an operator's warm).
    pub rebuilds_requested: AtomicU64,
    /// Appends that failed first and went through from the queue later.
    pub replayed: AtomicU64,
    /// Queued appends dropped because the queue was full (a rebuild
    /// request is appended instead once Redis answers).
    pub dropped: AtomicU64,
    /// Shared rebuilds this instance led (scanned SQL and published).
    pub rebuilds_led: AtomicU64,
    /// Other instances' rebuilds adopted here (no SQL scan).
    pub rebuilds_adopted: AtomicU64,
    /// Warms with `rebuild_bloom` that found another instance's shared
    /// rebuild running and waited for its epoch instead of scanning.
    pub rebuilds_joined: AtomicU64,
    /// Epochs that could not be adopted (a local rebuild ran instead).
    pub adopt_failures: AtomicU64,
}

/// Appends waiting for Redis, oldest first.
#[derive(Debug, Default)]
struct Pending {
    queue: std::collections::VecDeque<(i64, ChangeKind)>,
    /// Some were dropped: followers must rebuild instead.
    overflowed: bool,
    /// A task is draining the queue.
    draining: bool,
}

/// Appends kept while Redis is unreachable; past this, the oldest are
/// dropped and the followers are told to rebuild.
pub const MAX_PENDING: usize = 1_000_000;

/// The shared change log. Cheap to clone.
#[derive(Clone)]
pub struct ChangeLog {
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
    /// The last entry the follower has applied (or started after).
    applied: Arc<std::sync::Mutex<String>>,
    pending: Arc<std::sync::Mutex<Pending>>,
    /// The change outbox in SQL: replays read it, and every entry here
    /// rings its follower.
    outbox: crate::outbox::Outbox,
    /// Counters, shared by clones.
    pub counters: Arc<ChangeCounters>,
    /// The instance's shutdown signal.
    background: crate::tasks::Background,
}

impl std::fmt::Debug for ChangeLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChangeLog")
            .field("key", &self.key)
            .field("instance", &self.instance)
            .finish_non_exhaustive()
    }
}

impl ChangeLog {
    /// A change log under `{prefix}changes`, keeping about `max_len` entries.
    ///
    /// # Errors
    /// The client's error for a bad URL or an unreachable server.
    pub async fn connect(
        target: &RedisTarget,
        prefix: &str,
        max_len: u64,
        timeout: Duration,
        segment_bytes: u64,
        outbox: crate::outbox::Outbox,
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
            applied: Arc::new(std::sync::Mutex::new("0-0".into())),
            pending: Arc::default(),
            outbox,
            counters: Arc::default(),
            background: crate::tasks::Background::new(),
        })
    }

    /// Ends the follower and the queue's drain at `bg`'s signal.
    #[must_use]
    pub fn with_background(mut self, bg: crate::tasks::Background) -> Self {
        self.background = bg;
        self
    }

    /// Appends a write. Never fatal (the write itself has committed): when
    /// Redis does not answer, the entry is queued and a background task
    /// appends it, in order, once Redis answers again.
    pub async fn publish(&self, id: i64, kind: ChangeKind) {
        {
            let mut p = self.lock_pending();
            if !p.queue.is_empty() || p.overflowed {
                // Keep the order: behind what is already waiting.
                Self::enqueue(&mut p, id, kind, &self.counters);
                return;
            }
        }
        if self
            .append(&[("id", id.to_string()), ("kind", kind.code().into())])
            .await
            .is_ok()
        {
            self.counters.published.fetch_add(1, Ordering::Relaxed);
            return;
        }
        self.counters
            .publish_failures
            .fetch_add(1, Ordering::Relaxed);
        tracing::warn!(
            id,
            ?kind,
            "change log append failed; queued until Redis answers"
        );
        let start = {
            let mut p = self.lock_pending();
            Self::enqueue(&mut p, id, kind, &self.counters);
            !std::mem::replace(&mut p.draining, true)
        };
        if start {
            let log = self.clone();
            self.background.spawn(async move { log.drain().await });
        }
    }

    fn lock_pending(&self) -> std::sync::MutexGuard<'_, Pending> {
        crate::sync::lock(&self.pending)
    }

    fn enqueue(p: &mut Pending, id: i64, kind: ChangeKind, counters: &ChangeCounters) {
        if p.queue.len() >= MAX_PENDING {
            p.queue.pop_front();
            p.overflowed = true;
            counters.dropped.fetch_add(1, Ordering::Relaxed);
        }
        p.queue.push_back((id, kind));
    }

    /// Appends waiting for Redis.
    #[must_use]
    pub fn pending(&self) -> usize {
        self.lock_pending().queue.len()
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
                    "change log append timed out",
                )))
            })
    }

    /// Appends the queue, oldest first, retrying with backoff while Redis
    /// does not answer; after an overflow, a rebuild request for every
    /// follower goes first.
    async fn drain(&self) {
        let mut backoff = Duration::from_millis(100);
        loop {
            let (next, overflowed) = {
                let mut p = self.lock_pending();
                match p.queue.front() {
                    Some(&e) => (Some(e), p.overflowed),
                    None if p.overflowed => (None, true),
                    None => {
                        p.draining = false;
                        return;
                    }
                }
            };
            let ok = if overflowed {
                self.append(&[("kind", kind::REBUILD.into())]).await.is_ok()
            } else if let Some((id, kind)) = next {
                self.append(&[("id", id.to_string()), ("kind", kind.code().into())])
                    .await
                    .is_ok()
            } else {
                true
            };
            if ok {
                backoff = Duration::from_millis(100);
                let mut p = self.lock_pending();
                if overflowed {
                    p.overflowed = false;
                    tracing::warn!("change log queue overflowed during the outage: asked every instance to rebuild");
                } else {
                    p.queue.pop_front();
                    self.counters.replayed.fetch_add(1, Ordering::Relaxed);
                    self.counters.published.fetch_add(1, Ordering::Relaxed);
                }
            } else {
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(2));
            }
        }
    }

    /// Rings the other instances' outbox followers (a resource's keys or
    /// invalidations were recorded in the outbox). Best effort: without it
    /// they read the outbox within `sql.outbox_poll_ms` anyway.
    pub async fn ring(&self) {
        if self.append(&[("kind", kind::RING.into())]).await.is_ok() {
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
                "change log: the rebuild request for the other instances was not appended"
            );
        }
    }

    /// Appends a marker entry (no SKU): a position every instance started
    /// after, so a snapshot taken later always names an entry the stream
    /// can be checked to still hold.
    ///
    /// # Errors
    /// Redis errors.
    pub async fn mark(&self) -> redis::RedisResult<String> {
        self.append(&[("kind", kind::MARK.into())]).await
    }

    /// The last entry this instance's follower has applied: every write
    /// up to it is in this instance's filter.
    #[must_use]
    pub fn applied(&self) -> String {
        crate::sync::lock(&self.applied).clone()
    }

    fn set_applied(&self, id: &str) {
        id.clone_into(&mut crate::sync::lock(&self.applied));
    }

    /// The created ids after entry `from`, and the last entry read, if the
    /// stream still holds `from` itself; `None` when it does not (trimmed
    /// past it, or lost with a Redis restart).
    ///
    /// # Errors
    /// Redis errors.
    pub async fn created_since(
        &self,
        from: &str,
    ) -> redis::RedisResult<Option<(Vec<i64>, String)>> {
        let mut conn = self.conn.clone();
        if !self.holds(&mut conn, from).await? {
            return Ok(None);
        }
        let (mut created, mut last) = (Vec::new(), from.to_string());
        loop {
            let page: StreamRangeReply = redis::cmd("XRANGE")
                .arg(&self.key)
                .arg(format!("({last}"))
                .arg("+")
                .arg("COUNT")
                .arg(10_000)
                .query_async(&mut conn)
                .await?;
            if page.ids.is_empty() {
                return Ok(Some((created, last)));
            }
            for entry in &page.ids {
                if entry.get::<String>("kind").as_deref() == Some(kind::CREATED) {
                    if let Some(id) = entry.get::<i64>("id") {
                        created.push(id);
                    }
                }
                last.clone_from(&entry.id);
            }
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
    /// of an empty stream, which a lost stream also looks like; instances
    /// mark the stream at start, so a position they follow or save is
    /// `0-0` only if that marker could not be appended).
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
