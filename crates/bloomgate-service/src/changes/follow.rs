//! The change log's follower: `XREAD BLOCK` on a connection of its own,
//! applying other instances' entries (creates into the filter, every id
//! out of L1, rebuild requests, epochs to adopt, doorbells for the outbox),
//! and noticing a position the stream no longer holds.

use super::*;

impl ChangeLog {
    /// Follows the stream from entry `from`, applying other instances'
    /// writes to `reader`, until nothing but the follower holds the
    /// reader's gate (the service was dropped).
    pub fn spawn_follower(&self, from: String, reader: &ShieldedReader) {
        let log = self.clone();
        let reader = reader.clone();
        log.set_applied(&from);
        self.background.spawn(async move {
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
                        log.outbox.doorbell_ok();
                        for entry in reply.into_iter().flat_map(|r| r.keys).flat_map(|k| k.ids) {
                            last.clone_from(&entry.id);
                            if entry.get::<String>("from").as_deref() == Some(&log.instance) {
                                continue;
                            }
                            let kind = entry.get::<String>("kind");
                            match (kind.as_deref(), entry.get::<i64>("id")) {
                                // An operator's rebuild through another instance.
                                (Some(kind::BUILT), _) => {
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
                                (Some(kind::RING), _) => log.outbox.ring(),
                                // Another instance dropped queued entries.
                                (Some(kind::REBUILD), _) => {
                                    log.counters.gaps.fetch_add(1, Ordering::Relaxed);
                                    tracing::warn!("another instance lost change-log entries: rebuilding the filter");
                                    drop(reader.gate.request_rebuild());
                                    reader.invalidate_all_local();
                                }
                                (Some(kind), Some(id)) => {
                                    // The doorbell: the outbox follower
                                    // reads SQL now.
                                    log.outbox.ring();
                                    if kind == crate::wire::kind::CREATED {
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
