//! The watch of a SQL table's watch column: rows other programs insert
//! are admitted without a call.

use std::collections::{HashSet, VecDeque};
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::{Guarded, Resource};
use crate::sql::table::WatchValue;

/// Rows read per watch statement.
const WATCH_PAGE: usize = 10_000;
/// Each poll reads from the largest value seen this many polls ago, so a
/// row that committed after a row with a larger value (auto ids commit
/// out of order) is still seen if it committed within that many polls.
const WATCH_LAG_POLLS: usize = 5;

/// Polls the table's watch column until the resource is dropped. Keys of
/// rows at or past the low mark go into the filter; keys not seen by the
/// recent polls are also dropped from Redis and L1 (a "not found" may be
/// cached from before the row existed, even where the filter already
/// said "maybe").
///
/// `first`: the column's largest value, read before the filter's build
/// began (rows at or below it are the scan's, rows past it the watch's);
/// `None` when that read failed, and the first poll reads it instead.
pub(super) async fn watch<R: Guarded>(
    resource: std::sync::Weak<Resource<R>>,
    every: Duration,
    first: Option<Option<WatchValue>>,
) {
    let mut maxima: VecDeque<Option<WatchValue>> = VecDeque::new();
    let mut recent: VecDeque<HashSet<R::Key>> = VecDeque::new();
    let started_at_top = first.is_some();
    let mut high: Option<WatchValue> = first.flatten();
    let mut started = started_at_top;
    loop {
        let Some(r) = resource.upgrade() else { return };
        let Some(table) = r.table.clone() else { return };
        let mut seen = HashSet::new();
        if !started {
            // Rows that exist now are the build's; start from the top.
            match table.watched_max().await {
                Ok(m) => {
                    high = m;
                    started = true;
                }
                Err(e) => {
                    tracing::warn!(resource = %r.name, error = %e, "watch: reading the largest value failed")
                }
            }
        } else {
            let mut from = maxima.front().cloned().flatten().or_else(|| high.clone());
            let mut past = false;
            loop {
                let page = match table.watched(from.as_ref(), past, WATCH_PAGE).await {
                    Ok(Some(p)) => p,
                    Ok(None) => return,
                    Err(e) => {
                        tracing::warn!(resource = %r.name, error = %e, "watch: read failed");
                        break;
                    }
                };
                let mut fresh = Vec::new();
                for (key, value) in &page {
                    // The table's key as the resource spells it (a SKU id
                    // is an integer column: it always is one).
                    let Ok(key) = r.reader.store.parse_key(&key.to_string()) else {
                        continue;
                    };
                    let key = &key;
                    r.reader.shield.learn(key);
                    if !recent.iter().any(|s| s.contains(key)) && seen.insert(key.clone()) {
                        fresh.push(key.clone());
                    }
                    if high.as_ref().is_none_or(|h| value > h) {
                        high = Some(value.clone());
                    }
                }
                if !fresh.is_empty() {
                    // Strict and redis modes ask the shared filter too.
                    if let Some(shared) = r.reader.shared() {
                        if let Err(e) = shared.insert_many(&fresh).await {
                            tracing::warn!(resource = %r.name, error = %e, "watch: adding keys to the shared filter failed");
                        }
                    }
                    r.counters
                        .watched
                        .fetch_add(fresh.len() as u64, Ordering::Relaxed);
                    r.reader.invalidate_many(&fresh).await;
                }
                if page.len() < WATCH_PAGE {
                    break;
                }
                let Some((_, last)) = page.into_iter().next_back() else {
                    break;
                };
                // A full page of one value: go on past it.
                past = from.as_ref() == Some(&last);
                from = Some(last);
            }
        }
        maxima.push_back(high.clone());
        recent.push_back(seen);
        if maxima.len() > WATCH_LAG_POLLS {
            maxima.pop_front();
            recent.pop_front();
        }
        drop(r);
        tokio::time::sleep(every).await;
    }
}
