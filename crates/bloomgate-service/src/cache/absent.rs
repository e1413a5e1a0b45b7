//! Remembered "not found"s of an API bloomgate fronts (the HTTP gate's
//! `cache_not_found_secs`): a key the filter let through ("maybe") that
//! the upstream answered 404 is kept for a while, in L1 and in Redis, so
//! the next request for it is answered without the upstream.
//!
//! A memory must never outlive a change of its key that this instance
//! has applied: it would refuse a row that now exists. The read path's
//! two rules hold it ([`crate::resource::reader`] and the module docs of
//! [`crate::cache`]):
//! - in process, a request notes its shard's change counter before it is
//!   forwarded, and its 404 is stored only if no change of the shard was
//!   applied since (under the shard's lock, which the change takes too);
//! - in Redis, the request leases the key before it is forwarded, and its
//!   404 replaces only its own lease. Every instance that applies a
//!   change of the key deletes it, which takes the lease or the memory
//!   away, whoever else's delete was lost.
//!
//! So a 404 the upstream gave before a create committed is never stored
//! after an instance applied that create, and one stored before is
//! deleted by each instance as it applies it.
//!
//! A memory is the answer to requests for the key's canonical path, no
//! query, no credentials (the gate stores no other), each asked of one
//! `Host`. It answers later requests for those `Host`s only: a virtual
//! host the upstream does not serve must not refuse the key for the
//! others. A request of another `Host` that the upstream answers 404
//! adds its `Host` (at most [`MAX_HOSTS`], the oldest go), so clients
//! that alternate between two names of one API are both answered; the
//! memory then counts its age from its oldest `Host`'s request, so no
//! 404 is kept past the route's `cache_not_found_secs`.
//!
//! A create nobody applied (every instance was down when it committed,
//! and each started past it) deletes nothing, so a memory in Redis
//! carries the change-feed position its request was forwarded at (its
//! instance had applied every change up to it), and an instance trusts
//! only one at or after the position it follows from ([`Positions`]):
//! every change after that it applies, deleting the memory. One from
//! before is deleted and the request forwarded; one from past the
//! position now (an instance ahead of this one) is not trusted here.
//!
//! It also carries the wall-clock time its request was forwarded at, and
//! an instance trusts only one forwarded after it started and after it
//! last lost track of the table ([`AbsentMemory::forget_all_local`]: a
//! rebuild owed for rows no change named, a restored database whose
//! numbers come again, an adopted rebuild), with a margin for the
//! clocks of the fleet ([`CLOCK_MARGIN_MS`]). Positions alone cannot
//! tell a memory made before a restore from one made after it, and the
//! sweep of Redis that follows such an event is neither instant nor
//! sure to succeed.

use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::{Entry, Lease, Reach, RedisLookup, RedisTier, L1};
use crate::sync::lock;

/// Shards of the change counters.
const SHARDS: usize = 64;

/// `Host`s one memory answers at most.
pub const MAX_HOSTS: usize = 8;

/// How far the fleet's clocks may disagree: a memory in Redis is trusted
/// only when forwarded this long after the instance's last loss of track.
pub const CLOCK_MARGIN_MS: u64 = 1_000;

/// Now, in milliseconds since the Unix epoch.
fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// The change feed's positions, as a memory needs them.
pub trait Positions: Send + Sync + std::fmt::Debug {
    /// Every change up to here has been applied here.
    fn watermark(&self) -> i64;
    /// Every change after here is applied here (its start, or where it
    /// jumped to).
    fn since(&self) -> i64;
}

/// What a recall found.
#[derive(Debug)]
pub enum Recall {
    /// Remembered: the upstream answered 404 for this key lately, and no
    /// change of it has been applied here since.
    Absent,
    /// Not remembered: forward, then [`AbsentMemory::remember`] a 404
    /// with this ticket.
    Unknown(Ticket),
}

/// A forwarded request's right to store its 404: the shard's change
/// counter when it started, and its Redis lease (none when Redis failed,
/// another request holds the key, or no Redis is configured).
#[derive(Debug)]
pub struct Ticket {
    changes: u64,
    lease: Option<Lease>,
    /// The change-feed position when it was forwarded.
    at: i64,
    /// The wall-clock time it was forwarded at (ms).
    t: u64,
    /// Other `Host`s the key's memory answered when this request was
    /// forwarded, and when the oldest of them was forwarded: kept with
    /// its 404.
    others: Vec<Box<str>>,
    oldest: u64,
}

/// A memory in Redis: where the change feed was when its request was
/// forwarded, when (ms since the Unix epoch), and the `Host` it was asked
/// of (JSON `{"at":…,"host":…,"t":…}`), with the other `Host`s it
/// answers (`"hosts":[…]`, absent when none; the previous release reads
/// `host` alone; the oldest first). With other `Host`s, `at` and `t` are
/// the oldest request's.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Stamp {
    at: i64,
    host: Box<str>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    hosts: Vec<Box<str>>,
    t: u64,
}

impl Stamp {
    fn answers(&self, host: &str) -> bool {
        *self.host == *host || self.hosts.iter().any(|h| **h == *host)
    }

    /// Every `Host`, the oldest first (`host` asked last).
    fn all(&self) -> impl Iterator<Item = &str> {
        self.hosts
            .iter()
            .map(|h| &**h)
            .chain(std::iter::once(&*self.host))
    }
}

/// A memory in process: when its oldest request was forwarded (ms), then
/// the `Host`s it answers, the oldest first, space-separated (a `Host`
/// it keys on has no space: see the gate's `plain_host`).
fn held<'a>(t: u64, hosts: impl Iterator<Item = &'a str>) -> Entry<Box<str>> {
    let mut s = t.to_string();
    for h in hosts {
        s.push(' ');
        s.push_str(h);
    }
    Entry::Found(super::Cached::new(s.into()))
}

/// [`held`]'s time and `Host`s.
fn holding(held: &str) -> (u64, impl Iterator<Item = &str>) {
    let mut parts = held.split(' ');
    let t = parts.next().and_then(|t| t.parse().ok()).unwrap_or(0);
    (t, parts)
}

/// Counters of one memory.
#[derive(Debug, Default)]
pub struct AbsentCounters {
    /// 404s stored.
    pub remembered: AtomicU64,
    /// 404s not stored: a change of the key (or of its shard) was applied
    /// while the request was forwarded, or its lease was taken or expired
    /// (an upstream slower than the lease's 5 s).
    pub refused: AtomicU64,
    /// Requests answered from the memory.
    pub recalled: AtomicU64,
}

/// One route's memory (see the module docs). Clones share it.
#[derive(Debug, Clone)]
pub struct AbsentMemory<K> {
    inner: Arc<Inner<K>>,
}

#[derive(Debug)]
struct Inner<K> {
    /// Each key's memory: when its oldest request was forwarded and the
    /// `Host`s it answers ([`held`]).
    l1: L1<K, Box<str>>,
    shards: Box<[Mutex<u64>]>,
    redis: Option<RedisTier>,
    positions: Option<Arc<dyn Positions>>,
    /// Memories in Redis forwarded before this (ms) are not trusted: the
    /// start, or the last [`AbsentMemory::forget_all_local`].
    lost_track: AtomicU64,
    ttl: Duration,
    counters: AbsentCounters,
}

impl<K> AbsentMemory<K>
where
    K: Hash + Eq + Clone + std::fmt::Display,
{
    /// Remembers about `capacity` keys in process, each for `ttl`, and in
    /// `redis` (its namespace this memory's own) for `ttl` ± 10%, stamped
    /// with `positions`' watermark (without: every memory in Redis is
    /// trusted, as by a lone instance that never restarts).
    #[must_use]
    pub fn new(
        capacity: u64,
        ttl: Duration,
        redis: Option<RedisTier>,
        positions: Option<Arc<dyn Positions>>,
    ) -> Self {
        let secs = ttl.as_secs().max(1);
        Self {
            inner: Arc::new(Inner {
                l1: L1::new(capacity, ttl, ttl),
                shards: (0..SHARDS).map(|_| Mutex::new(0)).collect(),
                redis: redis.map(|r| RedisTier {
                    value_ttl: secs,
                    nil_ttl: secs,
                    ..r
                }),
                positions,
                lost_track: AtomicU64::new(now_ms()),
                ttl,
                counters: AbsentCounters::default(),
            }),
        }
    }

    /// Whether a memory stamped `stamp` is one this instance may trust:
    /// `Ok` when it is, `Err(true)` when it is stale for every instance
    /// that follows (made before this one's loss of track or start),
    /// `Err(false)` when only this instance cannot vouch for it yet (made
    /// past its position).
    fn trusted(&self, stamp: &Stamp) -> Result<(), bool> {
        let lost = self.inner.lost_track.load(Ordering::Acquire);
        if stamp.t <= lost.saturating_add(CLOCK_MARGIN_MS) {
            return Err(true);
        }
        match &self.inner.positions {
            Some(p) if stamp.at < p.since() => Err(true),
            Some(p) if stamp.at > p.watermark() => Err(false),
            _ => Ok(()),
        }
    }

    fn shard(&self, key: &K) -> &Mutex<u64> {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        key.hash(&mut h);
        &self.inner.shards[(h.finish() as usize) % SHARDS]
    }

    /// How long a 404 is kept.
    #[must_use]
    pub fn ttl(&self) -> Duration {
        self.inner.ttl
    }

    /// The counters.
    #[must_use]
    pub fn counters(&self) -> &AbsentCounters {
        &self.inner.counters
    }

    /// Whether a memory whose oldest request was forwarded at `t` is
    /// still within the route's time.
    fn fresh(&self, t: u64, now: u64) -> bool {
        let ttl = u64::try_from(self.inner.ttl.as_millis()).unwrap_or(u64::MAX);
        t.saturating_add(ttl) > now
    }

    /// Whether the upstream's 404 for `key`, asked of `host`, is
    /// remembered. `lease`: take Redis's lease on a miss, for a request
    /// about to be forwarded (the auth-request check never sees the
    /// upstream's answer, so it takes none).
    pub async fn recall(&self, key: &K, host: &str, lease: bool) -> Recall {
        // The counter first: a change applied after this point stops the
        // store, whatever the lookups below find.
        let changes = *lock(self.shard(key));
        let now = now_ms();
        let mut ticket = Ticket {
            changes,
            lease: None,
            at: self.inner.positions.as_ref().map_or(0, |p| p.watermark()),
            t: now,
            others: Vec::new(),
            oldest: now,
        };
        if let Some(Entry::Found(c)) = self.inner.l1.get(key) {
            let (t, mut hosts) = holding(&c.row);
            if self.fresh(t, now) {
                if hosts.any(|h| h == host) {
                    return self.recalled();
                }
                // Another `Host`'s, kept with this request's 404 when no
                // Redis is shared (no change of the key was applied here
                // since it was stored, and one applied from now on stops
                // that store). With Redis, only what Redis still holds is
                // kept: another instance's change deleted it there.
                if self.inner.redis.is_none() {
                    ticket.others = holding(&c.row).1.map(Into::into).collect();
                    ticket.oldest = t;
                }
            }
        }
        let Some(redis) = &self.inner.redis else {
            return Recall::Unknown(ticket);
        };
        let stamp = if lease {
            // The script alone, in one round trip: most keys asked hold
            // nothing (every real key the filter lets through).
            let looked = redis.lookup_with(key, Reach::Lease, |raw| {
                serde_json::from_slice::<Stamp>(&raw).map(|s| (s, raw))
            });
            match looked.await.map(Option::unwrap_or_default) {
                Ok(RedisLookup::Hit(at)) => Some(Some(at)),
                // Not this format.
                Ok(RedisLookup::Nil) => Some(None),
                Ok(RedisLookup::Miss(l)) => {
                    ticket.lease = l;
                    None
                }
                Err(_) => None,
            }
        } else {
            // The check: no lease, and nothing read of a key whose delete
            // Redis is still owed.
            match redis.peek(key).await {
                Ok(Some(v)) if !v.starts_with(super::LEASE_PREFIX.as_bytes()) => {
                    Some(serde_json::from_slice::<Stamp>(&v).ok().map(|s| (s, v)))
                }
                _ => None,
            }
        };
        let Some(stamp) = stamp else {
            return Recall::Unknown(ticket);
        };
        if let Some((s, raw)) = stamp.as_ref().filter(|(s, _)| !s.answers(host)) {
            // Other hosts' 404 (Redis keeps one memory a key): a forwarded
            // request leases the key, so its own 404 may be stored, with
            // theirs while this instance may trust them and Redis still
            // holds them as read (a change's DEL takes them away); else it
            // deletes them and leases afresh.
            if !lease {
                return Recall::Unknown(ticket);
            }
            if let Ok(Some(l)) = redis.lease_if_holds(key, raw).await {
                ticket.lease = Some(l);
                if self.trusted(s).is_ok() && self.fresh(s.t, now) {
                    ticket.others = s.all().map(Into::into).collect();
                    ticket.oldest = s.t;
                    ticket.at = ticket.at.min(s.at);
                }
            } else if redis.invalidate(key).await.is_ok() {
                let looked = redis.lookup_with(key, Reach::Lease, |raw| {
                    serde_json::from_slice::<Stamp>(&raw)
                });
                if let Ok(Some(RedisLookup::Miss(l))) = looked.await {
                    ticket.lease = l;
                }
            }
            return Recall::Unknown(ticket);
        }
        let trusted = |s: &Stamp| {
            if self.fresh(s.t, now) {
                self.trusted(s)
            } else {
                Err(true)
            }
        };
        let stamp = stamp.map(|(s, _)| s);
        match stamp.as_ref().map_or(Err(true), trusted) {
            Ok(()) => {}
            Err(stale) => {
                if stale {
                    // Made before changes this instance may not have
                    // applied: gone, so the next 404 may be stored afresh.
                    let _ = redis.invalidate(key).await;
                }
                return Recall::Unknown(ticket);
            }
        }
        // Answered and kept here only if no change of the key's shard was
        // applied since the counter was read: Redis's answer may predate
        // it (its delete still on the way).
        let shard = lock(self.shard(key));
        if *shard != changes {
            return Recall::Unknown(ticket);
        }
        if let Some(s) = &stamp {
            self.inner.l1.insert(key.clone(), held(s.t, s.all()));
        }
        drop(shard);
        self.recalled()
    }

    fn recalled(&self) -> Recall {
        self.inner.counters.recalled.fetch_add(1, Ordering::Relaxed);
        Recall::Absent
    }

    /// Stores the upstream's 404 for `key`, asked of `host` with
    /// `ticket`: in Redis if the lease is still there, here if no change
    /// was applied since the ticket was taken (and Redis did not say the
    /// lease was taken).
    pub async fn remember(&self, key: &K, host: &str, ticket: Ticket) {
        let mut stored = true;
        // The newest others, this `Host` not among them.
        let mut others = ticket.others;
        others.retain(|h| **h != *host);
        let drop_oldest = others.len().saturating_sub(MAX_HOSTS - 1);
        others.drain(..drop_oldest);
        let t = ticket.oldest.min(ticket.t);
        if let (Some(redis), Some(lease)) = (&self.inner.redis, &ticket.lease) {
            let stamp = Stamp {
                at: ticket.at,
                host: host.into(),
                hosts: others.clone(),
                t,
            };
            match redis.fill(key, lease, Some(&stamp)).await {
                Ok(true) => {}
                Ok(false) => stored = false,
                Err(e) => {
                    tracing::debug!(%key, error = %e, "storing a remembered 404 in Redis failed");
                }
            }
        }
        let shard = lock(self.shard(key));
        stored &= *shard == ticket.changes;
        if stored {
            let all = others.iter().map(|h| &**h).chain(std::iter::once(host));
            self.inner.l1.insert(key.clone(), held(t, all));
        }
        drop(shard);
        let c = &self.inner.counters;
        if stored {
            c.remembered.fetch_add(1, Ordering::Relaxed);
        } else {
            c.refused.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A change of `key` applied here: its memory dropped in process, and
    /// no 404 asked for before this stored.
    pub fn forget_local(&self, key: &K) {
        let mut shard = lock(self.shard(key));
        *shard += 1;
        self.inner.l1.invalidate(key);
    }

    /// [`AbsentMemory::forget_local`] for every key (this instance may
    /// have missed changes), and no memory in Redis made before now
    /// trusted here.
    pub fn forget_all_local(&self) {
        self.inner.lost_track.fetch_max(now_ms(), Ordering::AcqRel);
        for s in self.inner.shards.iter() {
            *lock(s) += 1;
        }
        self.inner.l1.invalidate_all();
    }

    /// Drops `keys`' memories from Redis (owed when Redis fails). Returns
    /// whether Redis confirmed it (true without Redis).
    pub async fn forget_shared(&self, keys: &[K]) -> bool {
        match &self.inner.redis {
            Some(redis) => redis.invalidate_many(keys).await.is_ok(),
            None => true,
        }
    }

    /// Drops every memory of this route from Redis (a rebuild: rows may
    /// have been written that no change named). `SCAN` and `UNLINK`; not
    /// on a Redis Cluster, where they expire within the TTL.
    pub async fn sweep(&self) {
        if let Some(redis) = &self.inner.redis {
            if let Err(e) = redis.sweep().await {
                tracing::warn!(error = %e, "dropping remembered 404s from Redis failed; they expire within the route's cache_not_found_secs");
            }
        }
    }
}

#[cfg(test)]
mod tests;
