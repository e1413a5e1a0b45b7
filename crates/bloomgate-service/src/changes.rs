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

use crate::gate::Gate;
use crate::reader::ShieldedReader;

/// How long the shared-rebuild lock holds if its owner dies.
const REBUILD_LOCK_MS: u64 = 10 * 60 * 1000;
/// How long an epoch's filter stays in Redis (the next epoch deletes it
/// sooner).
const EPOCH_TTL_SECS: u64 = 3600;

/// The key of an epoch's `i`th segment.
fn epoch_segment(counter: &str, epoch: u64, i: usize) -> String {
    format!("{counter}:{epoch}:seg:{i}")
}

/// Releases the shared-rebuild lock only if this instance still holds it.
const RELEASE: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
";

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
            Self::Created => "c",
            Self::Updated => "u",
            Self::Deleted => "d",
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

/// The kind of an entry that only rings the outbox followers.
const RING: &str = "n";

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
            key: format!("{prefix}changes"),
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
        })
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
            tokio::spawn(async move { log.drain().await });
        }
    }

    fn lock_pending(&self) -> std::sync::MutexGuard<'_, Pending> {
        self.pending
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
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
                self.append(&[("kind", "r".into())]).await.is_ok()
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
        if self.append(&[("kind", RING.into())]).await.is_ok() {
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
        if self.append(&[("kind", "b".into())]).await.is_ok() {
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

    /// A connection for moving whole filters: the shared one answers
    /// within `redis_timeout_ms`, too short for megabytes.
    async fn bulk_conn(&self) -> redis::RedisResult<Conn> {
        self.target
            .connect(
                self.timeout.max(Duration::from_millis(200)),
                Duration::from_secs(60),
            )
            .await
    }

    /// Tries to take the shared-rebuild lock: `Some(true)` when this
    /// instance now leads the rebuild every instance will adopt,
    /// `Some(false)` when another instance holds it, `None` when Redis did
    /// not answer.
    pub async fn try_lead(&self) -> Option<bool> {
        let mut conn = self.conn.clone();
        let set: redis::RedisResult<Option<String>> = redis::cmd("SET")
            .arg(format!("{}bloom:rebuild:lock", self.prefix))
            .arg(&self.instance)
            .arg("NX")
            .arg("PX")
            .arg(REBUILD_LOCK_MS)
            .query_async(&mut conn)
            .await;
        set.ok().map(|s| s.is_some())
    }

    /// Releases the lock if this instance holds it (best effort: it
    /// expires anyway).
    pub async fn release_lead(&self) {
        let mut conn = self.conn.clone();
        let released: redis::RedisResult<i64> = redis::Script::new(RELEASE)
            .key(format!("{}bloom:rebuild:lock", self.prefix))
            .arg(&self.instance)
            .invoke_async(&mut conn)
            .await;
        if let Err(e) = released {
            tracing::warn!(error = %e, "releasing the shared-rebuild lock failed; it expires by itself");
        }
    }

    /// The newest epoch built or adopted here (0: none).
    #[must_use]
    pub fn epoch(&self) -> u64 {
        *self.epoch.borrow()
    }

    /// Waits until an epoch newer than `seen` is built or adopted here.
    pub async fn wait_epoch_after(&self, seen: u64) -> u64 {
        let mut rx = self.epoch.subscribe();
        let newer = rx.wait_for(|&e| e > seen).await.map_or(seen, |e| *e);
        newer
    }

    /// Publishes `gate`'s filter, just rebuilt from a scan that started
    /// after entry `at`, as a new epoch for the other instances. On any
    /// failure they are asked to rebuild from SQL instead.
    ///
    /// # Errors
    /// Why the filter was not shared (already logged).
    pub async fn publish_built(
        &self,
        gate: &Gate,
        at: &str,
        outbox: (i64, i64),
    ) -> Result<u64, String> {
        let result = self.publish_epoch(gate, at, outbox, true).await;
        match &result {
            Ok(epoch) => {
                self.counters.rebuilds_led.fetch_add(1, Ordering::Relaxed);
                self.counters.published.fetch_add(1, Ordering::Relaxed);
                self.epoch.send_replace(*epoch);
                tracing::info!(epoch, "shared rebuild published for the other instances");
            }
            Err(why) => {
                tracing::warn!(%why, "the rebuilt filter was not shared; the other instances rebuild from SQL");
                self.publish_rebuild().await;
            }
        }
        result
    }

    /// After a start-up build from a scan that began after entry `at`:
    /// stores the filter as a new epoch if Redis holds none, or always
    /// when `replace` (this instance seeded the database: an epoch left
    /// from before describes other data), so the next instances to start
    /// adopt it instead of scanning SQL. Not announced: running instances
    /// keep their filters.
    pub async fn publish_first(&self, gate: &Gate, at: &str, outbox: (i64, i64), replace: bool) {
        let mut conn = self.conn.clone();
        let exists: redis::RedisResult<bool> = redis::cmd("EXISTS")
            .arg(format!("{}bloom:epoch", self.prefix))
            .query_async(&mut conn)
            .await;
        if !replace && !matches!(exists, Ok(false)) {
            return;
        }
        match self.publish_epoch(gate, at, outbox, false).await {
            Ok(epoch) => {
                self.epoch.send_replace(epoch);
                tracing::info!(
                    epoch,
                    "start-up filter stored for the next instances to adopt"
                );
            }
            Err(why) => tracing::warn!(%why, "the start-up filter was not stored in Redis"),
        }
    }

    /// At start: adopts the newest epoch (made for this layout and rate)
    /// instead of scanning SQL, replaying the creates since its scan
    /// began. Returns the last change-log entry replayed and the outbox
    /// position the epoch is complete up to.
    ///
    /// # Errors
    /// Why not (the caller scans SQL).
    pub async fn adopt_latest(
        &self,
        gate: &Gate,
        fpp: f64,
        store: &crate::store::SkuStore,
    ) -> Result<(String, i64, i64), String> {
        let mut conn = self.bulk_conn().await.map_err(|e| e.to_string())?;
        let epoch: Option<u64> = redis::cmd("GET")
            .arg(format!("{}bloom:epoch", self.prefix))
            .query_async(&mut conn)
            .await
            .map_err(|e| e.to_string())?;
        let epoch = epoch.ok_or("no epoch in Redis")?;
        let meta: std::collections::HashMap<String, String> = redis::cmd("HGETALL")
            .arg(format!("{}bloom:epoch:{epoch}:meta", self.prefix))
            .query_async(&mut conn)
            .await
            .map_err(|e| e.to_string())?;
        let field = |name: &str| {
            meta.get(name)
                .cloned()
                .ok_or_else(|| format!("epoch {epoch} has no {name}"))
        };
        let (at, capacity) = (field("at")?, field("capacity")?);
        let outbox_at: i64 = field("outbox")?
            .parse()
            .map_err(|_| format!("epoch {epoch} has a bad outbox position"))?;
        let covered: i64 = field("covered")?
            .parse()
            .map_err(|_| format!("epoch {epoch} has a bad rebuild coverage"))?;
        if field("fpp")? != fpp.to_string() || field("layout")? != format!("{:?}", gate.layout()) {
            return Err(format!("epoch {epoch} was made for another layout or rate"));
        }
        let capacity = capacity.parse().map_err(|_| "bad capacity".to_string())?;
        let rows = store.count().await.map_err(|e| e.to_string())?;
        let (replayed, last) = self
            .load_epoch(gate, epoch, &at, Some(outbox_at), capacity, Some(rows))
            .await?;
        self.epoch.send_replace(epoch);
        tracing::info!(
            epoch,
            replayed,
            "filter adopted from Redis at start; no SQL scan"
        );
        Ok((last, outbox_at, covered))
    }

    /// `outbox`: the outbox watermark before the filter's scan (replays
    /// start after it) and the largest seq visible then (the rebuild
    /// requests it covers).
    async fn publish_epoch(
        &self,
        gate: &Gate,
        at: &str,
        outbox: (i64, i64),
        announce: bool,
    ) -> Result<u64, String> {
        let (outbox_at, covered) = outbox;
        let filter = gate.published().ok_or("no filter published")?;
        let bytes = tokio::task::spawn_blocking(move || crate::persist::encode(&filter))
            .await
            .map_err(|e| e.to_string())?;
        let mut conn = self.bulk_conn().await.map_err(|e| e.to_string())?;
        let counter = format!("{}bloom:epoch", self.prefix);
        let epoch: u64 = redis::cmd("INCR")
            .arg(&counter)
            .query_async(&mut conn)
            .await
            .map_err(|e| e.to_string())?;
        // The segments first, one string each (a cluster spreads them over
        // its nodes), then the meta that names them: an epoch whose meta
        // exists has every segment written.
        let chunks: Vec<&[u8]> = bytes.chunks(self.segment_len()).collect();
        for (i, chunk) in chunks.iter().enumerate() {
            let _: () = redis::cmd("SET")
                .arg(epoch_segment(&counter, epoch, i))
                .arg(*chunk)
                .arg("EX")
                .arg(EPOCH_TTL_SECS)
                .query_async(&mut conn)
                .await
                .map_err(|e| e.to_string())?;
        }
        let meta = format!("{counter}:{epoch}:meta");
        let _: () = redis::pipe()
            .cmd("HSET")
            .arg(&meta)
            .arg("segments")
            .arg(chunks.len())
            .arg("bytes")
            .arg(bytes.len())
            .arg("at")
            .arg(at)
            .arg("outbox")
            .arg(outbox_at)
            .arg("covered")
            .arg(covered)
            .arg("capacity")
            .arg(gate.capacity())
            .arg("fpp")
            .arg(gate.fpp().to_string())
            .arg("layout")
            .arg(format!("{:?}", gate.layout()))
            .ignore()
            .cmd("EXPIRE")
            .arg(&meta)
            .arg(EPOCH_TTL_SECS)
            .ignore()
            .query_async(&mut conn)
            .await
            .map_err(|e| e.to_string())?;
        if epoch > 1 {
            self.delete_epoch(&conn, &counter, epoch - 1).await;
        }
        if !announce {
            return Ok(epoch);
        }
        self.append(&[
            ("kind", "b".into()),
            ("epoch", epoch.to_string()),
            ("at", at.to_string()),
            ("outbox", outbox_at.to_string()),
            ("covered", covered.to_string()),
            ("capacity", gate.capacity().to_string()),
        ])
        .await
        .map_err(|e| e.to_string())?;
        Ok(epoch)
    }

    /// Adopts another instance's epoch: load, verify, replay the creates
    /// since `at`, swap in. Falls back to a rebuild from SQL.
    async fn adopt(
        &self,
        gate: &Arc<Gate>,
        epoch: u64,
        at: &str,
        outbox_at: Option<i64>,
        covered: Option<i64>,
        capacity: u64,
    ) {
        match self
            .load_epoch(gate, epoch, at, outbox_at, capacity, None)
            .await
        {
            Ok((replayed, _)) => {
                if let Some(c) = covered {
                    self.outbox.cover(c);
                }
                self.counters
                    .rebuilds_adopted
                    .fetch_add(1, Ordering::Relaxed);
                self.epoch.send_replace(epoch);
                tracing::info!(
                    epoch,
                    replayed,
                    "adopted another instance's rebuild; no SQL scan"
                );
            }
            Err(why) => {
                self.counters.adopt_failures.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(epoch, %why, "cannot adopt another instance's rebuild; rebuilding from SQL");
                drop(gate.request_rebuild());
            }
        }
    }

    async fn load_epoch(
        &self,
        gate: &Gate,
        epoch: u64,
        at: &str,
        outbox_at: Option<i64>,
        capacity: u64,
        rows: Option<u64>,
    ) -> Result<(usize, String), String> {
        let bytes = self.read_epoch(epoch).await?;
        let layout = gate.layout();
        let filter = tokio::task::spawn_blocking(move || crate::persist::decode(layout, &bytes))
            .await
            .map_err(|e| e.to_string())??;
        // From here every insert here reaches the new filter too; the
        // replay adds what was created (anywhere) since the leader's scan
        // began. An own create inserted before and appended after the
        // replay's read is added again after its append (see the create
        // route).
        let filter = gate
            .begin_adopt(filter)
            .ok_or("a rebuild runs here; its filter is as new")?;
        let replay = self.created_since(at).await;
        let (mut created, last) = match replay {
            Ok(Some(found)) => found,
            Ok(None) => {
                gate.abandon_adopt(&filter);
                return Err("the change log no longer holds the rebuild's start".into());
            }
            Err(e) => {
                gate.abandon_adopt(&filter);
                return Err(e.to_string());
            }
        };
        // The outbox in SQL holds every create after the scan began, also
        // those the Redis log never got (a writer that died with its
        // appends queued).
        let from_sql = match outbox_at {
            Some(from) => self.outbox.created_after(from).await,
            None => {
                gate.abandon_adopt(&filter);
                return Err("the epoch predates the change outbox".into());
            }
        };
        match from_sql {
            Ok(Some(ids)) => created.extend(ids),
            Ok(None) => {
                gate.abandon_adopt(&filter);
                return Err("the change outbox was trimmed past the rebuild's start".into());
            }
            Err(e) => {
                gate.abandon_adopt(&filter);
                return Err(e.to_string());
            }
        }
        created.sort_unstable();
        created.dedup();
        if let Some(rows) = rows {
            if let Err(why) = crate::persist::accounts_for(rows, &filter, created.len(), "epoch") {
                gate.abandon_adopt(&filter);
                return Err(why);
            }
        }
        for &id in &created {
            filter.insert(id);
        }
        if !gate.finish_adopt(&filter, capacity) {
            return Err("a rebuild took over; its filter is as new".into());
        }
        Ok((created.len(), last))
    }

    /// Bytes per epoch segment (whole `usize`s; Redis's limit at most).
    fn segment_len(&self) -> usize {
        usize::try_from(self.segment_bytes.min(bloomgate_redis::MAX_SEGMENT_BYTES))
            .unwrap_or(usize::MAX)
    }

    /// Deletes an older epoch's meta, then its segments (best effort:
    /// they expire anyway).
    async fn delete_epoch(&self, conn: &Conn, counter: &str, epoch: u64) {
        let meta = format!("{counter}:{epoch}:meta");
        let segments: redis::RedisResult<Option<usize>> = redis::cmd("HGET")
            .arg(&meta)
            .arg("segments")
            .query_async(&mut conn.clone())
            .await;
        let mut dels = vec![{
            let mut cmd = redis::cmd("DEL");
            cmd.arg(&meta);
            cmd
        }];
        for i in 0..segments.ok().flatten().unwrap_or(0) {
            let mut cmd = redis::cmd("DEL");
            cmd.arg(epoch_segment(counter, epoch, i));
            dels.push(cmd);
        }
        let _: redis::RedisResult<Vec<i64>> = query_each(conn, dels).await;
    }

    /// An epoch's filter bytes, from its segments.
    async fn read_epoch(&self, epoch: u64) -> Result<Vec<u8>, String> {
        let gone = || "the epoch's filter is gone (a newer one replaced it)".to_string();
        let mut conn = self.bulk_conn().await.map_err(|e| e.to_string())?;
        let counter = format!("{}bloom:epoch", self.prefix);
        let (segments, len): (Option<usize>, Option<usize>) = redis::cmd("HMGET")
            .arg(format!("{counter}:{epoch}:meta"))
            .arg("segments")
            .arg("bytes")
            .query_async(&mut conn)
            .await
            .map_err(|e| e.to_string())?;
        let (Some(segments), Some(len)) = (segments, len) else {
            return Err(gone());
        };
        let mut bytes = Vec::with_capacity(len);
        for i in 0..segments {
            let part: Option<Vec<u8>> = redis::cmd("GET")
                .arg(epoch_segment(&counter, epoch, i))
                .query_async(&mut conn)
                .await
                .map_err(|e| e.to_string())?;
            bytes.extend(part.ok_or_else(gone)?);
        }
        if bytes.len() != len {
            return Err(format!(
                "epoch {epoch} holds {} of its {len} bytes",
                bytes.len()
            ));
        }
        Ok(bytes)
    }

    /// Appends a marker entry (no SKU): a position every instance started
    /// after, so a snapshot taken later always names an entry the stream
    /// can be checked to still hold.
    ///
    /// # Errors
    /// Redis errors.
    pub async fn mark(&self) -> redis::RedisResult<String> {
        self.append(&[("kind", "m".into())]).await
    }

    /// The last entry this instance's follower has applied: every write
    /// up to it is in this instance's filter.
    #[must_use]
    pub fn applied(&self) -> String {
        self.applied
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    fn set_applied(&self, id: &str) {
        id.clone_into(
            &mut self
                .applied
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
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
                if entry.get::<String>("kind").as_deref() == Some("c") {
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

    /// Follows the stream from entry `from`, applying other instances'
    /// writes to `reader`, until nothing but the follower holds the
    /// reader's gate (the service was dropped).
    pub fn spawn_follower(&self, from: String, reader: &ShieldedReader) {
        let log = self.clone();
        let reader = reader.clone();
        log.set_applied(&from);
        tokio::spawn(async move {
            let mut last = from;
            let mut conn = None;
            let mut backoff = Duration::from_millis(100);
            let mut resumed = false;
            let _guard = Gate::follow(&reader.gate);
            while !Gate::only_followers_left(&reader.gate) {
                let c = match conn.as_mut() {
                    Some(c) => c,
                    None => {
                        match log
                            .target
                            .connect(
                                log.timeout.max(Duration::from_millis(200)),
                                Duration::from_secs(5),
                            )
                            .await
                        {
                            Ok(c) => conn.insert(c),
                            Err(e) => {
                                tracing::warn!(error = %e, "change log: cannot connect; retrying");
                                tokio::time::sleep(backoff).await;
                                backoff = (backoff * 2).min(Duration::from_secs(5));
                                continue;
                            }
                        }
                    }
                };
                if resumed {
                    // After an outage the stream must still hold `last`:
                    // if it was trimmed past it, or lost with a Redis
                    // restart, what was missed is unknown: rebuild, empty L1.
                    match log.holds(c, &last).await {
                        Ok(true) => {}
                        Ok(false) => {
                            // Go on from the stream's end as it is now, then
                            // ask for the rebuild: its scan starts after
                            // this, so it holds every create logged up to
                            // the end (a commit precedes its entry).
                            let Ok(end) = log.newest(c).await else {
                                conn = None;
                                continue;
                            };
                            log.counters.gaps.fetch_add(1, Ordering::Relaxed);
                            tracing::warn!(%last, %end, "change log no longer holds this instance's position (trimmed or lost): rebuilding the filter");
                            last = end;
                            drop(reader.gate.request_rebuild());
                            reader.invalidate_all_local();
                        }
                        Err(_) => {
                            conn = None;
                            continue;
                        }
                    }
                    resumed = false;
                }
                let read: redis::RedisResult<Option<StreamReadReply>> = redis::cmd("XREAD")
                    .arg("COUNT")
                    .arg(1000)
                    .arg("BLOCK")
                    .arg(1000)
                    .arg("STREAMS")
                    .arg(&log.key)
                    .arg(&last)
                    .query_async(c)
                    .await;
                match read {
                    Ok(reply) => {
                        backoff = Duration::from_millis(100);
                        for entry in reply.into_iter().flat_map(|r| r.keys).flat_map(|k| k.ids) {
                            last.clone_from(&entry.id);
                            if entry.get::<String>("from").as_deref() == Some(&log.instance) {
                                continue;
                            }
                            let kind = entry.get::<String>("kind");
                            match (kind.as_deref(), entry.get::<i64>("id")) {
                                // An operator's rebuild through another instance.
                                (Some("b"), _) => {
                                    log.counters
                                        .rebuilds_requested
                                        .fetch_add(1, Ordering::Relaxed);
                                    let epoch = entry.get::<u64>("epoch");
                                    let at = entry.get::<String>("at");
                                    let outbox_at = entry.get::<i64>("outbox");
                                    let covered = entry.get::<i64>("covered");
                                    let capacity = entry.get::<u64>("capacity");
                                    if let (Some(epoch), Some(at), Some(capacity)) =
                                        (epoch, at, capacity)
                                    {
                                        // Inline: the follower applies nothing
                                        // else until the swap, and the replay
                                        // covers what came before it.
                                        log.adopt(
                                            &reader.gate,
                                            epoch,
                                            &at,
                                            outbox_at,
                                            covered,
                                            capacity,
                                        )
                                        .await;
                                    } else {
                                        tracing::info!(
                                            "another instance asked for a filter rebuild"
                                        );
                                        drop(reader.gate.request_rebuild());
                                    }
                                }
                                // A resource's entries are in the outbox.
                                (Some(RING), _) => log.outbox.ring(),
                                // Another instance dropped queued entries.
                                (Some("r"), _) => {
                                    log.counters.gaps.fetch_add(1, Ordering::Relaxed);
                                    tracing::warn!("another instance lost change-log entries: rebuilding the filter");
                                    drop(reader.gate.request_rebuild());
                                    reader.invalidate_all_local();
                                }
                                (Some(kind), Some(id)) => {
                                    // The doorbell: the outbox follower
                                    // reads SQL now.
                                    log.outbox.ring();
                                    if kind == "c" {
                                        reader.gate.learn(id);
                                    }
                                    reader.invalidate_local(&id);
                                    log.counters.applied.fetch_add(1, Ordering::Relaxed);
                                }
                                // Markers, and anything unknown.
                                _ => {}
                            }
                        }
                        log.set_applied(&last);
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "change log: read failed; reconnecting");
                        conn = None;
                        resumed = true;
                        tokio::time::sleep(backoff).await;
                        backoff = (backoff * 2).min(Duration::from_secs(5));
                    }
                }
            }
        });
    }
}
