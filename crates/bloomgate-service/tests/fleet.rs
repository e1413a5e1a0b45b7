//! The fleet fault run: three instances on MariaDB with a Redis of the
//! test's own, read without pause on every instance while one writer
//! creates, updates and deletes SKUs through two of them, and while the
//! run kills Redis and starts it again empty, flushes it, stalls it
//! (`DEBUG SLEEP`), rebuilds the filter while creates go on, and restarts
//! an instance. Every answer is checked against what the writes answered:
//! no 404 for a live id, no 200 for a missing one, no body older than the
//! last answered write, once the propagation bound has passed (a write
//! through one instance reaches the others by the next outbox poll: 1 s
//! while a doorbell answers, plus a second for a loaded machine; the
//! instance that made the write has no window at all).

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{sku_body, OwnServer, TestServer};
use reqwest::Method;
use sqlx::Row;

/// A write's propagation bound to the instances that did not make it.
const BOUND: Duration = Duration::from_secs(2);

#[derive(Debug, Clone, PartialEq)]
enum State {
    Row(String),
    Gone,
}

/// One write of an id, as the writer saw it.
#[derive(Debug, Clone)]
struct Version {
    sent: Instant,
    answered: Option<Instant>,
    /// The instance it went through.
    via: usize,
    state: State,
}

/// Every id's writes, in order (one writer: an id's writes never overlap).
#[derive(Default)]
struct Truth {
    ids: Mutex<HashMap<i64, Vec<Version>>>,
}

impl Truth {
    fn begin(&self, id: i64, via: usize, state: State) {
        let mut ids = self.ids.lock().unwrap();
        ids.entry(id).or_default().push(Version {
            sent: Instant::now(),
            answered: None,
            via,
            state,
        });
    }

    /// The write in flight of `id` answered (`ok`) or failed (dropped:
    /// it did not happen, or the test counts it as in flight for ever).
    fn end(&self, id: i64, ok: bool) {
        let mut ids = self.ids.lock().unwrap();
        let v = ids.get_mut(&id).unwrap();
        if ok {
            v.last_mut().unwrap().answered = Some(Instant::now());
        }
    }

    /// The answers a read of `id` on instance `on`, sent at `sent` and
    /// answered at `done`, may give: the state of the last write answered
    /// before the bound (no bound on the instance that made it), and that
    /// of every write sent before the answer.
    fn allowed(&self, id: i64, on: usize, sent: Instant, done: Instant) -> Vec<State> {
        let ids = self.ids.lock().unwrap();
        let Some(versions) = ids.get(&id) else {
            return vec![State::Gone];
        };
        let settled = |v: &Version| {
            v.answered.is_some_and(|a| {
                let bound = if v.via == on { Duration::ZERO } else { BOUND };
                a + bound <= sent
            })
        };
        let base = versions.iter().rposition(settled);
        let mut out = match base {
            Some(i) => vec![versions[i].state.clone()],
            None => vec![State::Gone],
        };
        let from = base.map_or(0, |i| i + 1);
        out.extend(
            versions[from..]
                .iter()
                .filter(|v| v.sent <= done)
                .map(|v| v.state.clone()),
        );
        out
    }

    /// Ids whose last answered write left a row, and one that is gone.
    fn pick(&self, live: bool) -> Option<i64> {
        let ids = self.ids.lock().unwrap();
        let mut matching = ids.iter().filter(|(_, v)| {
            v.last()
                .is_some_and(|v| v.answered.is_some() && (v.state != State::Gone) == live)
        });
        let n = matching.clone().count();
        (n > 0).then(|| *matching.nth(fastrand::usize(..n)).unwrap().0)
    }

    /// Settles each id's write that never answered (a timeout, an
    /// instance restarting) from what SQL holds now, with the writer
    /// stopped: it happened (answered at `at`) if SQL holds its state, it
    /// did not (dropped) if SQL holds the state before it. Otherwise the
    /// id stays unsettled and is counted.
    async fn settle(&self, pool: &sqlx::AnyPool, at: Instant) -> usize {
        let trailing: Vec<i64> = self
            .ids
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, v)| v.last().is_some_and(|v| v.answered.is_none()))
            .map(|(&id, _)| id)
            .collect();
        let mut unsettled = 0;
        for id in trailing {
            let row = sqlx::query("SELECT name FROM skus WHERE id = ?")
                .bind(id)
                .fetch_optional(pool)
                .await
                .unwrap();
            let now = row.map_or(State::Gone, |r| State::Row(r.get(0)));
            let mut ids = self.ids.lock().unwrap();
            let v = ids.get_mut(&id).unwrap();
            // The unanswered tail (one writer may leave several, each
            // timed out): the latest of them SQL holds happened, and those
            // after it did not; if SQL holds none of them but the state
            // before the tail, none happened.
            let tail = v
                .iter()
                .rposition(|v| v.answered.is_some())
                .map_or(0, |i| i + 1);
            let before = tail
                .checked_sub(1)
                .map_or(State::Gone, |i| v[i].state.clone());
            if let Some(j) = (tail..v.len()).rev().find(|&j| v[j].state == now) {
                v.truncate(j + 1);
                v[j].answered = Some(at);
            } else if before == now {
                v.truncate(tail);
            } else {
                unsettled += 1;
            }
        }
        unsettled
    }

    fn known(&self) -> Vec<i64> {
        self.ids.lock().unwrap().keys().copied().collect()
    }
}

#[derive(Default)]
struct Tally {
    reads: AtomicU64,
    found: AtomicU64,
    not_found: AtomicU64,
    other: AtomicU64,
    violations: Mutex<Vec<String>>,
}

/// One read of `id` on instance `on` (at `base`), checked.
async fn read(client: &reqwest::Client, base: &str, on: usize, id: i64, t: &Truth, tally: &Tally) {
    let sent = Instant::now();
    let Ok(r) = client.get(format!("{base}/api/seckill/{id}")).send().await else {
        return; // the instance is restarting
    };
    let status = r.status().as_u16();
    let body: serde_json::Value = r.json().await.unwrap_or_default();
    let done = Instant::now();
    tally.reads.fetch_add(1, Relaxed);
    let got = match status {
        200 => {
            tally.found.fetch_add(1, Relaxed);
            State::Row(body["name"].as_str().unwrap_or("?").to_owned())
        }
        404 => {
            tally.not_found.fetch_add(1, Relaxed);
            State::Gone
        }
        _ => {
            tally.other.fetch_add(1, Relaxed);
            return;
        }
    };
    let allowed = t.allowed(id, on, sent, done);
    if !allowed.contains(&got) {
        let what = match (&got, allowed.contains(&State::Gone)) {
            (State::Gone, _) => "a 404 for a live id",
            (State::Row(_), true) if allowed.len() == 1 => "a 200 for a missing id",
            _ => "a stale body",
        };
        tally.violations.lock().unwrap().push(format!(
            "{what}: id {id} on instance {on} answered {got:?}, allowed {allowed:?} (read took {:?})",
            done - sent
        ));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_instances_through_redis_faults_a_rebuild_and_a_restart_answer_true() {
    let Some(db) = common::mysql_database("fleet_fault_run").await else {
        return;
    };
    let mut redis =
        OwnServer::redis_on(common::free_port(), &["--enable-debug-command", "local"]).await;
    let config = common::config(&db, Some(&redis.url()), "fleet");
    let a = TestServer::start(config.clone(), 2_000).await;
    let b = TestServer::start(config.clone(), 0).await;
    let c = TestServer::start(config.clone(), 0).await;
    let truth = Arc::new(Truth::default());
    {
        let pool = common::sql_pool(&db).await;
        let rows = sqlx::query("SELECT id, name FROM skus")
            .fetch_all(&pool)
            .await
            .unwrap();
        let mut ids = truth.ids.lock().unwrap();
        let now = Instant::now();
        let long_ago = now.checked_sub(Duration::from_secs(60)).unwrap_or(now);
        for r in rows {
            ids.insert(
                r.get::<i64, _>(0),
                vec![Version {
                    sent: long_ago,
                    answered: Some(long_ago),
                    via: 0,
                    state: State::Row(r.get(1)),
                }],
            );
        }
    }
    let bases: Arc<[Mutex<String>; 3]> = Arc::new([
        Mutex::new(a.base.clone()),
        Mutex::new(b.base.clone()),
        Mutex::new(c.base.clone()),
    ]);
    let stop = Arc::new(AtomicBool::new(false));
    let tally = Arc::new(Tally::default());
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();

    // Readers, one per instance: live ids, gone ids, ids never made.
    let mut tasks = Vec::new();
    for on in 0..3 {
        let (t, tally, bases, stop, client) = (
            Arc::clone(&truth),
            Arc::clone(&tally),
            Arc::clone(&bases),
            Arc::clone(&stop),
            client.clone(),
        );
        tasks.push(tokio::spawn(async move {
            while !stop.load(Relaxed) {
                let id = match fastrand::u8(..10) {
                    0..=6 => t.pick(true),
                    7 => t.pick(false),
                    _ => Some(fastrand::i64(3_000..90_000)),
                };
                let Some(id) = id else { continue };
                let base = bases[on].lock().unwrap().clone();
                read(&client, &base, on, id, &t, &tally).await;
            }
        }));
    }
    // The writer: creates, updates and deletes through A and B.
    let writes = Arc::new(AtomicU64::new(0));
    let writer = {
        let (t, bases, stop, client, writes) = (
            Arc::clone(&truth),
            Arc::clone(&bases),
            Arc::clone(&stop),
            client.clone(),
            Arc::clone(&writes),
        );
        tokio::spawn(async move {
            let mut next = 100_000_i64;
            let mut version = 0;
            while !stop.load(Relaxed) {
                let via = fastrand::usize(..2);
                let base = bases[via].lock().unwrap().clone();
                version += 1;
                let name = format!("v{version}");
                let (id, method, path, body, state) = match fastrand::u8(..10) {
                    0..=3 => {
                        next += 1;
                        let body = sku_body(Some(next), &name, 100);
                        (
                            next,
                            Method::POST,
                            "/api/skus".to_owned(),
                            Some(body),
                            State::Row(name),
                        )
                    }
                    4..=7 => {
                        let Some(id) = t.pick(true) else { continue };
                        let body = sku_body(None, &name, 200);
                        (
                            id,
                            Method::PUT,
                            format!("/api/skus/{id}"),
                            Some(body),
                            State::Row(name),
                        )
                    }
                    _ => {
                        let Some(id) = t.pick(true) else { continue };
                        (
                            id,
                            Method::DELETE,
                            format!("/api/skus/{id}"),
                            None,
                            State::Gone,
                        )
                    }
                };
                t.begin(id, via, state);
                let mut req = client
                    .request(method, format!("{base}{path}"))
                    .header("content-type", "application/json");
                if let Some(b) = body {
                    req = req.body(b);
                }
                let ok = match req.send().await {
                    Ok(r) => r.status().is_success(),
                    Err(_) => false,
                };
                t.end(id, ok);
                writes.fetch_add(u64::from(ok), Relaxed);
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
    };

    let phase = |secs: u64| tokio::time::sleep(Duration::from_secs(secs));
    phase(2).await;
    // Redis killed, then started again empty.
    redis.stop().await;
    phase(3).await;
    redis.start().await;
    phase(2).await;
    // Flushed while running.
    let mut conn = common::redis_conn(&redis.url()).await;
    let _: () = redis::cmd("FLUSHALL").query_async(&mut conn).await.unwrap();
    phase(2).await;
    // Stalled for 2 s.
    let stall = tokio::spawn(async move {
        let _: Result<(), _> = redis::cmd("DEBUG")
            .arg("SLEEP")
            .arg(2)
            .query_async::<()>(&mut conn)
            .await;
    });
    phase(3).await;
    stall.await.unwrap();
    // A rebuild asked of B while the creates go on.
    let (status, body) = b.warm(r#"{"limit":0,"rebuild_bloom":true}"#).await;
    assert_eq!(status, 200, "{body}");
    phase(1).await;
    // C restarted.
    *bases[2].lock().unwrap() = "http://127.0.0.1:1".into();
    c.stop().await;
    let c = TestServer::start(config.clone(), 0).await;
    *bases[2].lock().unwrap() = c.base.clone();
    phase(3).await;
    stop.store(true, Relaxed);
    writer.await.unwrap();
    for t in tasks {
        t.await.unwrap();
    }

    // Settled: every id known, on every instance, is what was written last
    // (a write that never answered settled from SQL first).
    let pool = common::sql_pool(&db).await;
    let unsettled = truth.settle(&pool, Instant::now()).await;
    assert_eq!(unsettled, 0, "writes SQL shows neither done nor undone");
    tokio::time::sleep(BOUND).await;
    let servers = [&a, &b, &c];
    for id in truth.known() {
        for (on, s) in servers.iter().enumerate() {
            read(&client, &s.base, on, id, &truth, &tally).await;
        }
    }
    let v = tally.violations.lock().unwrap().clone();
    eprintln!(
        "fleet fault run: {} writes answered; {} reads ({} 200, {} 404, {} other); {} violations",
        writes.load(Relaxed),
        tally.reads.load(Relaxed),
        tally.found.load(Relaxed),
        tally.not_found.load(Relaxed),
        tally.other.load(Relaxed),
        v.len()
    );
    assert!(writes.load(Relaxed) > 100, "the writer wrote");
    assert!(tally.reads.load(Relaxed) > 1_000, "the readers read");
    assert!(
        tally.other.load(Relaxed) * 100 <= tally.reads.load(Relaxed),
        "more than 1% of reads answered neither 200 nor 404"
    );
    assert!(v.is_empty(), "{} violations:\n{}", v.len(), v.join("\n"));
    for s in [a, b, c] {
        s.stop().await;
    }
}
