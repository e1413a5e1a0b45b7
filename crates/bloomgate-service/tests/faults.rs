//! Dependencies that fail: Redis stopped or frozen, MariaDB stopped or
//! frozen, each a server this test starts on its own port (never the
//! machine's). The service keeps answering correctly, fails fast where it
//! must, and recovers without a restart. Figures go to stderr for
//! RELIABILITY.md (`cargo test -p bloomgate-service --test faults -- --nocapture`).

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::{counter, eventually, OwnServer, TestServer};

/// One request's outcome.
struct Answer {
    status: u16,
    body: serde_json::Value,
    retry_after: Option<String>,
    took: Duration,
}

async fn get(server: &TestServer, id: i64) -> Answer {
    let started = Instant::now();
    let r = server
        .client
        .get(server.url(&format!("/api/seckill/{id}")))
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let retry_after = r
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().to_string());
    let body = r.json().await.unwrap_or(serde_json::Value::Null);
    Answer {
        status,
        body,
        retry_after,
        took: started.elapsed(),
    }
}

/// GETs for `ids`, 50 at a time.
async fn get_all(server: &TestServer, ids: &[i64]) -> Vec<(i64, Answer)> {
    get_all_by(server, ids, 50).await
}

/// GETs for `ids`, `width` at a time.
async fn get_all_by(server: &TestServer, ids: &[i64], width: usize) -> Vec<(i64, Answer)> {
    let mut out = Vec::with_capacity(ids.len());
    for chunk in ids.chunks(width) {
        let answers = futures_util::future::join_all(chunk.iter().map(|&id| get(server, id))).await;
        out.extend(chunk.iter().copied().zip(answers));
    }
    out
}

fn percentile(mut d: Vec<Duration>, p: f64) -> Duration {
    d.sort();
    d[((d.len() - 1) as f64 * p).round() as usize]
}

/// Checks each answer is right for a catalogue of ids `1..=catalogue`:
/// existing ids 200 with their own id, others 404; a bulkhead 503
/// (`overloaded`, with `Retry-After`) is no wrong answer, but at most
/// `max_shed` of them are allowed (a service that shed every read would
/// give no wrong answer either). Returns counts by status.
fn check_answers(
    answers: &[(i64, Answer)],
    catalogue: i64,
    max_shed: usize,
) -> BTreeMap<u16, usize> {
    let mut by_status = BTreeMap::new();
    let mut shed = 0;
    for (id, a) in answers {
        *by_status.entry(a.status).or_default() += 1;
        if a.status == 503 && a.body["error"] == "overloaded" {
            assert_eq!(a.retry_after.as_deref(), Some("1"));
            shed += 1;
        } else if *id <= catalogue {
            assert_eq!(a.status, 200, "id {id}: {}", a.body);
            assert_eq!(a.body["id"], *id, "a wrong SKU for {id}");
        } else {
            assert_eq!(a.status, 404, "id {id}: {}", a.body);
        }
    }
    assert!(
        shed <= max_shed,
        "{shed} of {} reads shed (at most {max_shed} allowed): {by_status:?}",
        answers.len()
    );
    by_status
}

fn fault_config(db: &str, redis: Option<&str>, prefix: &str) -> bloomgate_service::Config {
    let mut c = common::config(db, redis, prefix);
    c.cache.redis_timeout_ms = 50;
    c.cache.redis_breaker_failures = 3;
    c.cache.redis_breaker_open_ms = 200;
    c.cache.redis_breaker_max_open_ms = 1000;
    c.sql.acquire_timeout_ms = 300;
    c.sql.statement_timeout_ms = 500;
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_stopped_during_load_costs_at_most_a_timeout_and_recovers_without_restart() {
    let mut redis = OwnServer::redis().await;
    let dir = tempfile::tempdir().unwrap();
    let mut config = fault_config(
        &common::sqlite_url(&dir),
        Some(&redis.url()),
        "faults-redis",
    );
    // As many bulkhead slots as reads in flight (`get_all` sends 50 at a
    // time): nothing here may be shed, so every existing id must be a 200.
    config.sql.max_concurrent_loads = 50;
    let server = TestServer::start(config, 2000).await;
    // Existing ids and ids past the catalogue (rejected by the filter, or
    // the odd false positive that goes on to SQL).
    let ids: Vec<i64> = (1..=400).map(|i| i * 5).chain(5001..=5100).collect();
    let healthy = get_all(&server, &ids).await;
    check_answers(&healthy, 2000, 0);

    redis.stop().await;
    let stopped_at = Instant::now();
    let mut latencies = Vec::new();
    let mut by_status = BTreeMap::new();
    for _ in 0..3 {
        // Every round misses L1, so every existing id needs Redis or SQL.
        server.state.skus.forget_local();
        let answers = get_all(&server, &ids).await;
        for (s, n) in check_answers(&answers, 2000, 0) {
            *by_status.entry(s).or_insert(0) += n;
        }
        latencies.extend(answers.iter().map(|(_, a)| a.took));
    }
    let stats = server.stats().await;
    let (p50, p99, max) = (
        percentile(latencies.clone(), 0.5),
        percentile(latencies.clone(), 0.99),
        percentile(latencies, 1.0),
    );
    eprintln!(
        "redis stopped: {by_status:?} answers, latency p50 {p50:?} p99 {p99:?} max {max:?}; redis errors {} timeouts {} skipped {} breaker opened {}",
        stats["redis"]["errors"], stats["redis"]["timeouts"], stats["redis"]["skipped"], stats["redis"]["breaker_opened"]
    );
    // RELIABILITY.md's figures: 1,200 × 200, 300 × 404, nothing else.
    assert_eq!(
        by_status,
        BTreeMap::from([(200, 1200), (404, 300)]),
        "answers while Redis was down"
    );
    assert!(counter(&stats, &["redis", "breaker_opened"]) >= 1);
    assert!(
        counter(&stats, &["redis", "skipped"]) > 0,
        "the open breaker spared Redis calls"
    );
    // A miss costs at most one Redis timeout (50 ms) on top of SQL; the
    // limit only has to tell that from an unbounded wait, with room for a
    // loaded 2-core machine (RELIABILITY.md has the measured figures).
    assert!(max < Duration::from_secs(3), "slowest answer {max:?}");

    redis.start().await;
    let restarted = Instant::now();
    let hits_before = counter(&server.stats().await, &["redis", "hits"]);
    eventually(15, "Redis hits resume without a restart", || async {
        server.state.skus.forget_local();
        let _ = get(&server, 7).await;
        counter(&server.stats().await, &["redis", "hits"]) > hits_before
    })
    .await;
    eprintln!(
        "redis restarted after {:?} down: Redis hits resumed {:?} after the restart",
        restarted - stopped_at,
        restarted.elapsed()
    );
    assert_eq!(server.stats().await["redis"]["breaker"], "closed");
    server.stop().await;
}

/// A Redis that answers reads but refuses `DEL` (an ACL without it) keeps
/// an invalidation owed for as long as the test needs: the row's older
/// value stays in Redis, and every read must go around it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_owed_invalidation_keeps_reads_off_the_value_redis_still_holds() {
    let redis = OwnServer::redis().await;
    let mut admin = common::redis_conn(&redis.url()).await;
    let _: () = redis::cmd("ACL")
        .arg(&[
            "SETUSER", "nodel", "on", "nopass", "~*", "&*", "+@all", "-del",
        ])
        .query_async(&mut admin)
        .await
        .unwrap();
    let url = format!("redis://nodel:x@127.0.0.1:{}/", redis.port);
    let dir = tempfile::tempdir().unwrap();
    let config = fault_config(&common::sqlite_url(&dir), Some(&url), "faults-owed");
    let server = TestServer::start(config, 100).await;
    let tier = server.state.skus.redis().cloned().unwrap();
    let (s, old) = server.get("/api/seckill/42").await.clone();
    assert_eq!(s, 200);
    let key = tier.key(42);
    let held = || {
        let mut admin = admin.clone();
        let key = key.clone();
        async move {
            redis::cmd("GET")
                .arg(&key)
                .query_async::<Option<String>>(&mut admin)
                .await
                .unwrap()
        }
    };
    assert!(held().await.is_some(), "42 is cached in Redis");

    let (s, _) = server.put_sku(42, "renamed", 5000).await;
    assert_eq!(s, 200);
    assert_eq!(tier.owed_invalidations(), 1, "the refused DEL is owed");
    // Redis answers GETs and still holds the row as it was before the write.
    let stale = held().await.expect("the refused DEL left the old value");
    assert!(stale.contains(old["name"].as_str().unwrap()), "{stale}");
    // The lookup must not take it: a miss without a lease (reading SQL).
    match tier.lookup::<bloomgate_service::model::Sku>(42).await {
        Ok(bloomgate_service::cache::RedisLookup::Miss(None)) => {}
        other => panic!("an owed key was looked up in Redis: {other:?}"),
    }
    let a = get(&server, 42).await;
    assert_eq!((a.status, a.body["name"].as_str()), (200, Some("renamed")));
    assert_eq!(tier.owed_invalidations(), 1, "DEL is still refused");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_write_while_redis_is_frozen_is_never_served_stale_when_it_thaws() {
    let redis = OwnServer::redis().await;
    let dir = tempfile::tempdir().unwrap();
    let config = fault_config(
        &common::sqlite_url(&dir),
        Some(&redis.url()),
        "faults-frozen",
    );
    let server = TestServer::start(config, 100).await;
    let tier = server.state.skus.redis().cloned().unwrap();
    let (s, old) = server.get("/api/seckill/42").await.clone();
    assert_eq!(s, 200);
    assert!(
        tier.raw(42).await.unwrap().is_some(),
        "42 is cached in Redis"
    );

    redis.pause();
    let started = Instant::now();
    let (s, _) = server.put_sku(42, "renamed", 5000).await;
    assert_eq!(s, 200);
    let write_took = started.elapsed();
    assert_eq!(tier.owed_invalidations(), 1, "the DEL is owed");
    // Reads bypass Redis for 42 (it may still hold the old row) and answer
    // from SQL; other misses cost at most one timeout each.
    let a = get(&server, 42).await;
    assert_eq!((a.status, a.body["name"].as_str()), (200, Some("renamed")));
    // Redis never answers while frozen: without its timeout this read
    // would wait forever, so the outer limit only tells the two apart.
    let b = tokio::time::timeout(Duration::from_secs(10), get(&server, 43))
        .await
        .expect("a read waited on a frozen Redis");
    assert_eq!(b.status, 200);
    eprintln!(
        "redis frozen: the write answered in {write_took:?}, a miss in {:?}",
        b.took
    );

    // Delivery attempts while Redis is frozen must not count as delivered:
    // wait until two rounds were tried (timed out, or skipped by the open
    // breaker), then the DEL is still owed.
    let rounds = || {
        tier.counters
            .owed_rounds
            .load(std::sync::atomic::Ordering::Relaxed)
    };
    let tried = rounds();
    eventually(
        10,
        "two delivery rounds tried against the frozen Redis",
        || async { rounds() >= tried + 2 },
    )
    .await;
    assert_eq!(tier.owed_invalidations(), 1, "delivered to a frozen Redis");
    redis.resume();
    let thawed = Instant::now();
    eventually(15, "the owed DEL is delivered", || async {
        tier.owed_invalidations() == 0
    })
    .await;
    eprintln!(
        "redis thawed: owed DEL delivered after {:?}",
        thawed.elapsed()
    );
    let cached = tier.raw(42).await.unwrap();
    assert!(
        cached
            .as_deref()
            .is_none_or(|v| !v.contains(old["name"].as_str().unwrap())),
        "Redis still holds the old row: {cached:?}"
    );
    server.state.skus.forget_local();
    for _ in 0..2 {
        let a = get(&server, 42).await;
        assert_eq!(a.body["name"], "renamed");
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mariadb_stopped_keeps_cached_ids_fails_fast_keeps_the_filter_and_recovers() {
    let mut db = OwnServer::mariadb().await;
    let mut config = fault_config(&db.url(), None, "faults-mariadb");
    // A slot for every read in flight: after the restart none may be shed.
    config.sql.max_concurrent_loads = 50;
    let server = TestServer::start(config, 2000).await;
    let cached: Vec<i64> = (1..=100).collect();
    check_answers(&get_all(&server, &cached).await, 2000, 0);

    db.stop().await;
    let stopped_at = Instant::now();
    // Cached ids still answer 200; ids past the catalogue are 404 by the
    // filter; other existing ids get a fast JSON 503 with Retry-After.
    check_answers(&get_all(&server, &cached).await, 2000, 0);
    let missing: Vec<i64> = (10_001..=10_050).collect();
    let m = get_all(&server, &missing).await;
    let through_filter = m.iter().filter(|(_, a)| a.status != 404).count();
    assert!(
        through_filter <= 1,
        "{through_filter} missing ids passed the filter"
    );
    let uncached: Vec<i64> = (500..550).collect();
    let answers = get_all(&server, &uncached).await;
    let slowest = answers.iter().map(|(_, a)| a.took).max().unwrap();
    for (id, a) in &answers {
        assert_eq!(a.status, 503, "id {id}: {}", a.body);
        // The database refused (unavailable), or the bulkhead's slots were
        // all waiting for it (overloaded): both fast, both retryable.
        assert!(
            ["unavailable", "overloaded"].contains(&a.body["error"].as_str().unwrap()),
            "{}",
            a.body
        );
        assert_eq!(a.retry_after.as_deref(), Some("1"));
    }
    eprintln!("mariadb stopped: 100 cached ids 200, 50 uncached 503 (slowest {slowest:?})");
    // Bounded by the acquire timeout (300 ms), not by how long MariaDB
    // stays down, plus a second for a loaded machine.
    assert!(
        slowest < Duration::from_millis(300 + 1000),
        "slowest 503 took {slowest:?}"
    );

    // A rebuild while the database is down fails, fast, and keeps the
    // filter.
    let gate = server.state.skus.shield();
    let asked = Instant::now();
    assert!(gate.rebuild().await.is_err());
    let failed_after = asked.elapsed();
    eprintln!("a rebuild with MariaDB down failed after {failed_after:?}");
    // It waits out the acquire timeout three times before it fails (the
    // row estimate, which it goes on without, then the statements that
    // find the key ranges): 900 ms, plus a second for a loaded machine.
    assert!(
        failed_after < Duration::from_millis(3 * 300 + 1000),
        "the failed rebuild took {failed_after:?}"
    );
    let stats = gate.stats();
    assert!(stats.ready && !stats.rebuilding);
    assert_eq!(stats.added, 2000);
    assert_eq!(get(&server, 10_001).await.status, 404);

    db.start().await;
    let restarted = Instant::now();
    eventually(15, "SQL answers again without a restart", || async {
        get(&server, 500).await.status == 200
    })
    .await;
    eprintln!(
        "mariadb restarted after {:?} down: reads recovered {:?} after the restart",
        restarted - stopped_at,
        restarted.elapsed()
    );
    check_answers(&get_all(&server, &uncached).await, 2000, 0);
    assert_eq!(gate.rebuild().await.unwrap().added, 2000);
    let stats = server.stats().await;
    assert_eq!(counter(&stats, &["sql", "bulkhead_in_use"]), 0);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_frozen_database_fills_the_bulkhead_and_excess_loads_get_a_fast_503() {
    let db = OwnServer::mariadb().await;
    let mut config = fault_config(&db.url(), None, "faults-bulkhead");
    config.sql.max_concurrent_loads = 4;
    config.sql.queue_timeout_ms = 50;
    config.sql.statement_timeout_ms = 1500;
    // A pooled connection to the frozen server is checked before use, and
    // that check waits out the acquire timeout: well past the queue's.
    config.sql.acquire_timeout_ms = 1500;
    let server = TestServer::start(config, 500).await;
    let cached: Vec<i64> = (1..=20).collect();
    check_answers(&get_all(&server, &cached).await, 500, 0);

    db.pause();
    let uncached: Vec<i64> = (100..140).collect();
    let (answers, during) = tokio::join!(get_all(&server, &uncached), async {
        tokio::time::sleep(Duration::from_millis(200)).await;
        get_all(&server, &cached).await
    });
    // Cached ids answer while the database hangs.
    check_answers(&during, 500, 0);
    let mut overloaded = Vec::new();
    let mut timed_out = Vec::new();
    for (id, a) in &answers {
        assert_eq!(a.status, 503, "id {id}: {}", a.body);
        assert_eq!(a.retry_after.as_deref(), Some("1"));
        match a.body["error"].as_str() {
            Some("overloaded") => overloaded.push(a.took),
            Some("unavailable") => timed_out.push(a.took),
            other => panic!("id {id}: {other:?}"),
        }
    }
    let slowest_overloaded = overloaded.iter().max().copied().unwrap();
    let first_timed_out = timed_out.iter().min().copied().unwrap();
    eprintln!(
        "database frozen: 40 concurrent loads -> {} overloaded (slowest {slowest_overloaded:?}), {} reached SQL and timed out (first {first_timed_out:?})",
        overloaded.len(),
        timed_out.len()
    );
    assert_eq!(
        timed_out.len(),
        4,
        "exactly the bulkhead's four slots reached SQL"
    );
    assert_eq!(overloaded.len(), 36);
    // The excess was shed after the queue timeout (50 ms), before any of
    // the four loads in SQL gave up (1.5 s): compared with each other, not
    // with a wall-clock limit.
    assert!(
        slowest_overloaded < first_timed_out,
        "a shed answer ({slowest_overloaded:?}) waited as long as a load in SQL ({first_timed_out:?})"
    );
    let stats = server.stats().await;
    assert_eq!(counter(&stats, &["sql", "bulkhead_rejected"]), 36);

    db.resume();
    eventually(15, "loads succeed again", || async {
        get(&server, 100).await.status == 200
    })
    .await;
    // As many at a time as the bulkhead has slots: none may be shed.
    check_answers(&get_all_by(&server, &uncached, 4).await, 500, 0);
    assert_eq!(
        counter(&server.stats().await, &["sql", "bulkhead_in_use"]),
        0
    );
    server.stop().await;
}
