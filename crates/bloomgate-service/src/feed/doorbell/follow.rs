//! The doorbell's follower: `XREAD BLOCK` on a connection of its own,
//! ringing the outbox follower for other instances' entries, handing the
//! previous release's rebuild announcements to the table it led, and
//! ringing once more after an outage (what was rung meanwhile is in the
//! outbox).

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use redis::streams::StreamReadReply;

use crate::feed::doorbell::{Doorbell, Led, RECORDED};
use crate::shield::Shield;
use crate::wire::kind;

impl Doorbell {
    /// Follows the stream from entry `from` for `table` and its `shield`,
    /// until nothing but the follower holds the shield (the service was
    /// dropped; `table` is held weakly, so it goes too).
    pub fn spawn_follower(&self, from: String, shield: &Arc<Shield>, table: Weak<dyn Led>) {
        let log = self.clone();
        let shield = Arc::clone(shield);
        self.background.spawn(async move {
            let mut last = from;
            let mut conn = None;
            let mut backoff = Duration::from_millis(100);
            let mut resumed = false;
            let _guard = Shield::follow(&shield);
            while !Shield::only_followers_left(&shield) {
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
                                tracing::warn!(error = %e, "doorbell: cannot connect; retrying");
                                back_off(&mut backoff).await;
                                continue;
                            }
                        }
                    }
                };
                // Started without the stream's end (Redis did not answer
                // then): its end now, not its beginning, whose old
                // announcements would be adopted again.
                if last == "$" {
                    match log.newest(c).await {
                        Ok(end) => last = end,
                        Err(_) => {
                            conn = None;
                            back_off(&mut backoff).await;
                            continue;
                        }
                    }
                    log.outbox.ring();
                }
                if resumed {
                    // After an outage: rings may have been missed, so the
                    // outbox follower reads SQL now. A position the stream
                    // no longer holds (trimmed, or lost with a Redis
                    // restart) goes on from its end: a lost ring is only
                    // latency, the outbox holds every write.
                    match log.holds(c, &last).await {
                        Ok(true) => {}
                        Ok(false) => {
                            let Ok(end) = log.newest(c).await else {
                                // Connected, but refused (Redis loading
                                // its data, say): wait as after a failure.
                                conn = None;
                                back_off(&mut backoff).await;
                                continue;
                            };
                            log.counters.gaps.fetch_add(1, Ordering::Relaxed);
                            tracing::info!(%last, %end, "the doorbell stream no longer holds this instance's position: going on from its end");
                            last = end;
                        }
                        Err(_) => {
                            conn = None;
                            back_off(&mut backoff).await;
                            continue;
                        }
                    }
                    log.outbox.ring();
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
                        log.outbox.doorbell_ok();
                        for entry in reply.into_iter().flat_map(|r| r.keys).flat_map(|k| k.ids) {
                            last.clone_from(&entry.id);
                            if entry.get::<String>("from").as_deref() == Some(&log.instance) {
                                continue;
                            }
                            let kind = entry.get::<String>("kind");
                            match kind.as_deref() {
                                // The previous release's announcement of a
                                // shared rebuild (this release's carry
                                // `recorded`: they are read from the outbox).
                                Some(kind::BUILT)
                                    if entry.get::<String>(RECORDED).is_none() =>
                                {
                                    let epoch = entry.get::<u64>("epoch");
                                    if let Some(t) = table.upgrade() {
                                        // Inline: this follower reads no
                                        // other entry until it is adopted.
                                        t.built_by_earlier_release(epoch).await;
                                    }
                                    log.outbox.ring();
                                }
                                // This release's announcement: the outbox
                                // entry it rings for is acted on.
                                Some(kind::BUILT) => log.outbox.ring(),
                                // A ring, or an entry of an older version
                                // (a write, a rebuild request): every
                                // write is in the outbox.
                                _ => {
                                    // A create named: by this version's ring
                                    // (`learn`), or by an older version's
                                    // entry (`c` with `id`) in a rolling deploy.
                                    let named = entry.get::<i64>("learn").or_else(|| {
                                        (kind.as_deref() == Some(kind::CREATED))
                                            .then(|| entry.get::<i64>("id"))
                                            .flatten()
                                    });
                                    if let (Some(id), Some(t)) = (named, table.upgrade()) {
                                        t.created(id);
                                    }
                                    log.outbox.ring();
                                    log.counters.applied.fetch_add(1, Ordering::Relaxed);
                                }
                            }
                        }
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "doorbell: read failed; reconnecting");
                        log.outbox.doorbell_lost();
                        conn = None;
                        resumed = true;
                        back_off(&mut backoff).await;
                    }
                }
            }
        });
    }
}

/// Waits `backoff`, then doubles it (at most 5 s): after a failed connect,
/// command or read.
async fn back_off(backoff: &mut Duration) {
    tokio::time::sleep(*backoff).await;
    *backoff = (*backoff * 2).min(Duration::from_secs(5));
}
