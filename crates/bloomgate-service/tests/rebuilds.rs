//! Rebuilds that never fail because another runs, that outlive the client
//! that asked, that retry after SQL failures, and that keep the previous
//! filter when they fail halfway.

mod common;

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use common::{counter, eventually, sku_body, TestServer};
use reqwest::Method;

async fn sqlite_server(
    dir: &tempfile::TempDir,
    seed: u64,
    wait_for_build: bool,
    f: impl FnOnce(&mut bloomgate_service::Config),
) -> TestServer {
    let mut config = common::config(&common::sqlite_url(dir), None, "rebuilds");
    config.cache.bloom_retry_min_ms = 20;
    config.cache.bloom_retry_max_ms = 80;
    f(&mut config);
    TestServer::start_with(config, seed, wait_for_build).await
}

/// A raw connection to the test's SQLite file, for changes behind the
/// service's back.
async fn raw_sqlite(dir: &tempfile::TempDir) -> sqlx::AnyPool {
    sqlx::any::install_default_drivers();
    sqlx::AnyPool::connect(&common::sqlite_url(dir))
        .await
        .unwrap()
}

async fn exec(pool: &sqlx::AnyPool, sql: &str) {
    sqlx::query(sql).execute(pool).await.unwrap();
}

const WARM_AND_REBUILD: &str = r#"{"limit":1000,"rebuild_bloom":true}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn seed_000s_first_warm_right_after_start_answers_200_and_ready() {
    // `bloomgate serve` in a fresh directory, and the article's first
    // command at once, while the start-up build runs.
    let dir = tempfile::tempdir().unwrap();
    let server = sqlite_server(&dir, 200_000, false, |_| {}).await;
    // The warm lands while the start-up build scans (not before its task
    // has asked: then one rebuild, started after both, rightly serves
    // both, and the count below would be 1).
    let gate = Arc::clone(server.state.skus.shield());
    eventually(10, "the start-up build is scanning", || {
        let gate = Arc::clone(&gate);
        async move { gate.is_rebuilding() }
    })
    .await;
    assert!(
        !server.state.skus.shield().is_ready(),
        "the start-up build is still running"
    );
    let (s, body) = server
        .send(Method::POST, "/api/cache/warm", Some(WARM_AND_REBUILD))
        .await;
    assert_eq!(s, 200, "{body}");
    assert_eq!(body["rebuild_bloom"]["added"], 200_000);
    let stats = server.stats().await;
    assert_eq!(stats["bloom"]["ready"], true);
    assert_eq!(counter(&stats, &["bloom", "added"]), 200_000);
    // The start-up build, then one rebuild that started after the call.
    assert_eq!(counter(&stats, &["bloom", "rebuilds"]), 2);
    assert_eq!(stats["bloom"]["rebuilding"], false);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn warms_during_a_rebuild_share_one_follow_up_that_sees_their_skus() {
    let dir = tempfile::tempdir().unwrap();
    let server = sqlite_server(&dir, 20_000, true, |_| {}).await;
    let gate = Arc::clone(server.state.skus.shield());
    assert_eq!(gate.stats().rebuilds, 1);
    // Rebuild A stops after its scan, before publishing.
    let pause = gate.after_scan.arm(0);
    let a = tokio::spawn({
        let gate = Arc::clone(&gate);
        async move { gate.rebuild().await }
    });
    pause.reached().await;
    // SKUs committed now (behind the service's back, so only a scan can
    // find them) are missing from A's scan.
    let raw = raw_sqlite(&dir).await;
    for id in 50_001..=50_005 {
        let sku = bloomgate_service::model::catalogue_sku(id);
        exec(
            &raw,
            &format!(
                "INSERT INTO skus (id, name, original_price, seckill_price, stock, seckill_start, seckill_end, updated_at) VALUES ({id}, '{}', 100, 50, 1, 0, 10, 0)",
                sku.name
            ),
        )
        .await;
    }
    // Eight warm calls arrive while A is running.
    let requests_before = gate.stats().rebuild_requests;
    let warms: Vec<_> = (0..8)
        .map(|_| {
            let client = server.client.clone();
            let url = server.url("/api/cache/warm");
            tokio::spawn(async move {
                let r = client
                    .post(url)
                    .header("content-type", "application/json")
                    .body(WARM_AND_REBUILD)
                    .send()
                    .await
                    .unwrap();
                (
                    r.status().as_u16(),
                    r.json::<serde_json::Value>().await.unwrap(),
                )
            })
        })
        .collect();
    eventually(10, "eight requests registered", || {
        let gate = Arc::clone(&gate);
        async move { gate.stats().rebuild_requests == requests_before + 8 }
    })
    .await;
    assert!(gate.stats().rebuild_pending);
    pause.resume();
    let a = a.await.unwrap().unwrap();
    assert_eq!(a.added, 20_000, "A scanned before the inserts");
    let mut reports = Vec::new();
    for w in warms {
        let (s, body) = w.await.unwrap();
        assert_eq!(s, 200, "{body}");
        reports.push(body["rebuild_bloom"].clone());
    }
    // One follow-up served all eight, and it holds every SKU committed
    // before they arrived.
    assert!(reports.iter().all(|r| *r == reports[0]), "{reports:?}");
    assert_eq!(reports[0]["added"], 20_005);
    let stats = gate.stats();
    assert_eq!(stats.rebuilds, 3, "start-up, A, and one follow-up");
    assert!(!stats.rebuild_pending && !stats.rebuilding);
    for id in 50_001..=50_005 {
        assert_eq!(server.get(&format!("/api/seckill/{id}")).await.0, 200);
    }
    raw.close().await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_rebuild_outlives_the_client_that_asked_for_it() {
    let dir = tempfile::tempdir().unwrap();
    let server = sqlite_server(&dir, 20_000, true, |_| {}).await;
    let gate = Arc::clone(server.state.skus.shield());
    let pause = gate.after_scan.arm(0);
    // The client gives up after 50 ms (`curl --max-time 0.05`).
    let impatient = server
        .client
        .post(server.url("/api/cache/warm"))
        .header("content-type", "application/json")
        .body(WARM_AND_REBUILD)
        .timeout(Duration::from_millis(50))
        .send();
    let (gone, ()) = tokio::join!(impatient, pause.reached());
    assert!(gone.is_err(), "the client timed out");
    // The server dropped the request's future (counted as cancelled, 499):
    // what goes on from here is the rebuild's own task, not the handler.
    eventually(10, "the server drops the warm request", || async {
        server
            .state
            .metrics
            .requests_by_outcome("/api/cache/warm")
            .get("cancelled")
            == Some(&1)
    })
    .await;
    // A SKU created while the orphaned rebuild is paused goes into the
    // filter it is building and the published one.
    let (s, _) = server
        .send(
            Method::POST,
            "/api/skus",
            Some(&sku_body(Some(70_000), "mid", 100)),
        )
        .await;
    assert_eq!(s, 201);
    pause.resume();
    eventually(10, "the rebuild completes without its client", || {
        let gate = Arc::clone(&gate);
        async move {
            let s = gate.stats();
            s.rebuilds == 2 && !s.rebuilding && !s.rebuild_pending
        }
    })
    .await;
    let stats = server.stats().await;
    assert_eq!(counter(&stats, &["bloom", "added"]), 20_001);
    assert_eq!(
        stats["bloom"]["last_rebuild_error"],
        serde_json::Value::Null
    );
    server.state.skus.forget_local();
    assert_eq!(server.get("/api/seckill/70000").await.0, 200);
    let rejected = counter(&stats, &["bloom", "rejected"]);
    assert_eq!(server.get("/api/seckill/70001").await.0, 404);
    assert_eq!(
        counter(&server.stats().await, &["bloom", "rejected"]),
        rejected + 1
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_start_up_build_that_fails_on_sql_retries_until_it_succeeds() {
    let dir = tempfile::tempdir().unwrap();
    sqlite_server(&dir, 1000, true, |_| {}).await.stop().await;
    // The table is unreachable when the service starts.
    let raw = raw_sqlite(&dir).await;
    exec(&raw, "ALTER TABLE skus RENAME TO skus_away").await;
    let server = sqlite_server(&dir, 0, false, |_| {}).await;
    let gate = Arc::clone(server.state.skus.shield());
    eventually(10, "three failed attempts", || {
        let gate = Arc::clone(&gate);
        async move { gate.stats().rebuild_retries >= 3 }
    })
    .await;
    let stats = server.stats().await;
    assert_eq!(stats["bloom"]["ready"], false);
    let error = stats["bloom"]["last_rebuild_error"].as_str().unwrap();
    assert!(error.contains("skus"), "{error}");
    assert!(counter(&stats, &["bloom", "rebuild_failures"]) >= 3);
    // Meanwhile the server answers, failing open: the filter does not say
    // 404, the request reaches SQL, which fails with a JSON 503.
    let (s, body) = server.get("/api/seckill/5").await;
    assert_eq!((s, body["error"].as_str()), (503, Some("unavailable")));
    // The database comes back: the next retry builds the filter.
    exec(&raw, "ALTER TABLE skus_away RENAME TO skus").await;
    eventually(10, "the filter is built", || {
        let gate = Arc::clone(&gate);
        async move { gate.is_ready() }
    })
    .await;
    let stats = server.stats().await;
    assert_eq!(
        stats["bloom"]["last_rebuild_error"],
        serde_json::Value::Null
    );
    assert_eq!(counter(&stats, &["bloom", "added"]), 1000);
    assert_eq!(server.get("/api/seckill/5").await.0, 200);
    assert_eq!(server.get("/api/seckill/5000").await.0, 404);
    assert_eq!(
        counter(&server.stats().await, &["bloom", "rejected"]),
        counter(&stats, &["bloom", "rejected"]) + 1
    );
    raw.close().await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_rebuild_that_fails_halfway_keeps_the_previous_filter() {
    let dir = tempfile::tempdir().unwrap();
    // One ordered scan (the key bounds of parallel ranges would trip on
    // the bad row before any page).
    let server = sqlite_server(&dir, 25_000, true, |c| c.sql.scan_parallel = 1).await;
    let gate = Arc::clone(server.state.skus.shield());
    gate.page_rows
        .store(10_000, std::sync::atomic::Ordering::Relaxed);
    // A row whose id is not an integer sorts after every integer in SQLite:
    // the scan fails in its third page, after 20,000 ids went into the
    // filter being built, and again each time the page is read again.
    let raw = raw_sqlite(&dir).await;
    exec(&raw, "INSERT INTO skus (id, name, original_price, seckill_price, stock, seckill_start, seckill_end, updated_at) VALUES ('not-a-number', 'bad', 1, 1, 1, 0, 1, 0)").await;
    let err = gate.rebuild().await.unwrap_err();
    assert!(
        matches!(err, bloomgate_service::shield::RebuildError::Store(_)),
        "{err}"
    );
    let stats = gate.stats();
    assert!(stats.ready && !stats.rebuilding && !stats.rebuild_pending);
    assert_eq!(
        stats.added, 25_000,
        "the previous filter is still published"
    );
    assert_eq!((stats.rebuilds, stats.rebuild_failures), (1, 1));
    assert!(stats
        .last_rebuild_error
        .as_deref()
        .is_some_and(|e| e.contains("scan page")));
    assert_eq!(
        stats.rebuild_page_retries,
        u64::from(bloomgate_service::shield::PAGE_RETRIES)
    );
    assert_eq!(server.get("/api/seckill/25001").await.0, 404);
    assert_eq!(gate.stats().rejected, 1);
    assert_eq!(server.get("/api/seckill/7").await.0, 200);
    // The abandoned build is gone: a new SKU goes to the published filter.
    let (s, _) = server
        .send(
            Method::POST,
            "/api/skus",
            Some(&sku_body(Some(30_000), "after", 100)),
        )
        .await;
    assert_eq!(s, 201);
    assert_eq!(gate.stats().added, 25_001);
    // The bad row goes; the next rebuild succeeds and clears the error.
    exec(&raw, "DELETE FROM skus WHERE id = 'not-a-number'").await;
    assert_eq!(gate.rebuild().await.unwrap().added, 25_001);
    assert_eq!(gate.stats().last_rebuild_error, None);
    raw.close().await;
    server.stop().await;
}

/// A rebuild request whose insert was slow is recorded a second time (a
/// follower may have given its number up as a gap), and the other
/// instances act on it once. A records every request twice here (half of
/// `sql.outbox_gap_ms` rounds to no time at all); B reads both copies and
/// rebuilds once. Before, each copy was a fleet-wide rebuild of its own:
/// minutes of scanning per instance on a large table.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_rebuild_request_recorded_twice_rebuilds_each_instance_once() {
    let dir = tempfile::tempdir().unwrap();
    let db = common::sqlite_url(&dir);
    let w = common::sql_pool(&db).await;
    common::users_table(&w, &["u000001", "u000002"]).await;
    let mut c = common::config(&db, None, "rebuild-twice");
    c.resources.push(common::users_resource("users"));
    let mut slow = c.clone();
    slow.sql.outbox_gap_ms = 1;
    let a = TestServer::start(slow, 0).await;
    let b = TestServer::start(c, 0).await;
    for s in [&a, &b] {
        eventually(10, "ready", || async { s.get("/readyz").await.0 == 200 }).await;
    }
    let requests = || async {
        let rows: Vec<(String,)> = sqlx::query_as(
            "SELECT item_key FROM bloomgate_changes WHERE resource = 'users' AND kind = 'r' ORDER BY seq",
        )
        .fetch_all(&w)
        .await
        .unwrap();
        rows.into_iter().map(|r| r.0).collect::<Vec<_>>()
    };
    let before = requests().await.len();
    let rebuilds = b.state.outbox.counters.rebuilds.load(Relaxed);
    let (status, body) = a
        .send(Method::POST, "/api/users/warm", Some(WARM_AND_REBUILD))
        .await;
    assert_eq!(status, 200, "{body}");
    eventually(5, "the request recorded twice", || async {
        requests().await.len() == before + 2
    })
    .await;
    let keys = requests().await;
    let (first, copy) = (&keys[before], &keys[before + 1]);
    assert_eq!(first, copy, "one request, two entries");
    assert!(!first.is_empty(), "the request carries its own key");
    // B read both copies (the next poll, 100 ms without a doorbell).
    let polls = b.state.outbox.counters.polls.load(Relaxed);
    eventually(3, "B polled past both", || async {
        b.state.outbox.counters.polls.load(Relaxed) > polls + 2
    })
    .await;
    assert_eq!(
        b.state.outbox.counters.rebuilds.load(Relaxed),
        rebuilds + 1,
        "B acted on the request once"
    );
    a.stop().await;
    b.stop().await;
    w.close().await;
}

/// A warm finds another instance's rebuild lock taken and waits for it;
/// the leader dies without storing an epoch (its lock goes with nothing
/// new in Redis). The waiting warm does not hang for the lock's lifetime
/// nor answer an older epoch as the rebuild's (one stored before it
/// joined, which this instance did not hold): it rebuilds here and says
/// so. The same for a configured resource's warm, under its own lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_warm_whose_leader_stores_no_epoch_rebuilds_itself() {
    let Some(redis) = common::redis_url().await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let url = common::sqlite_url(&dir);
    let mut config = common::config(&url, Some(&redis), "rebuilds-leader-died");
    let prefix = config.cache.redis_prefix.clone();
    common::redis_clear(&redis, &prefix).await;
    let w = common::sql_pool(&url).await;
    sqlx::query("CREATE TABLE users (id VARCHAR(32) NOT NULL PRIMARY KEY, email VARCHAR(100))")
        .execute(&w)
        .await
        .unwrap();
    sqlx::query("INSERT INTO users VALUES ('u1', 'u1@example.com')")
        .execute(&w)
        .await
        .unwrap();
    config.resources = vec![common::users_resource("users")];
    let a = TestServer::start(config, 500).await;
    let mut conn = common::redis_conn(&redis).await;
    for (path, lock) in [
        (
            "/api/cache/warm",
            bloomgate_service::wire::rebuild_lock_key(&prefix),
        ),
        (
            "/api/users/warm",
            bloomgate_service::wire::rebuild_lock_key(&format!(
                "{prefix}{}",
                bloomgate_service::wire::resource_filter_namespace("users")
            )),
        ),
    ] {
        // An epoch this instance does not hold is in Redis already (one
        // it restored a snapshot past, say): a copy of its newest, stored
        // without an announcement. It is not the leader's.
        let counter = lock.replace("bloom:rebuild:lock", "bloom:epoch");
        let n: u64 = redis::cmd("GET")
            .arg(&counter)
            .query_async(&mut conn)
            .await
            .unwrap();
        let meta = |n| bloomgate_service::wire::epoch_meta_key(&counter, n);
        let seg = |n, i| bloomgate_service::wire::epoch_segment_key(&counter, n, i);
        let segments: usize = redis::cmd("HGET")
            .arg(meta(n))
            .arg("segments")
            .query_async(&mut conn)
            .await
            .unwrap();
        for i in 0..segments {
            let _: i64 = redis::cmd("COPY")
                .arg(seg(n, i))
                .arg(seg(n + 1, i))
                .query_async(&mut conn)
                .await
                .unwrap();
        }
        let _: i64 = redis::cmd("COPY")
            .arg(meta(n))
            .arg(meta(n + 1))
            .query_async(&mut conn)
            .await
            .unwrap();
        let _: u64 = redis::cmd("INCR")
            .arg(&counter)
            .query_async(&mut conn)
            .await
            .unwrap();
        // Another instance leads (its lock), then dies with no epoch.
        let () = redis::cmd("SET")
            .arg(&lock)
            .arg("another-instance")
            .arg("PX")
            .arg(60_000)
            .query_async(&mut conn)
            .await
            .unwrap();
        let warm = a.send(Method::POST, path, Some(WARM_AND_REBUILD));
        let dies = async {
            tokio::time::sleep(Duration::from_millis(500)).await;
            let _: i64 = redis::cmd("DEL")
                .arg(&lock)
                .query_async(&mut conn.clone())
                .await
                .unwrap();
        };
        let ((status, body), ()) =
            tokio::time::timeout(Duration::from_secs(30), async { tokio::join!(warm, dies) })
                .await
                .expect("the warm does not wait for the lock's lifetime");
        assert_eq!(status, 200, "{path}: {body}");
        assert!(
            body["epoch"].is_null(),
            "{path}: no epoch was shared: {body}"
        );
        assert!(
            body["rebuild_bloom"]["added"].as_u64() >= Some(1),
            "{path}: rebuilt here: {body}"
        );
    }
    let s = a.stats().await;
    assert_eq!(counter(&s, &["changes", "rebuilds_joined"]), 1, "{s}");
    a.stop().await;
}
