//! Change capture by triggers (issue 31): writes that another program
//! makes (the test's own SQL connection, never the service) reach every
//! instance, on SQLite, MariaDB and PostgreSQL; a transaction held open
//! past `sql.outbox_gap_ms`; a service without the TRIGGER privilege; the
//! PostgreSQL doorbell; the idle cost.

mod common;

use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use bloomgate_service::config::Capture;
use bloomgate_service::Config;
use common::{eventually, sql_pool, TestServer};
use sqlx::Row;

async fn exec(pool: &sqlx::AnyPool, sql: &str) {
    sqlx::query(sql)
        .execute(pool)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
}

/// A `users` table of 20 rows, `u000001`…
async fn users_table(pool: &sqlx::AnyPool) {
    exec(
        pool,
        "CREATE TABLE users (id VARCHAR(32) NOT NULL PRIMARY KEY, name VARCHAR(100) NOT NULL, seq BIGINT NOT NULL)",
    )
    .await;
    let rows: Vec<String> = (1..=20)
        .map(|i| format!("('u{i:06}', 'user {i}', {i})"))
        .collect();
    exec(
        pool,
        &format!("INSERT INTO users VALUES {}", rows.join(", ")),
    )
    .await;
}

/// A SQLite file (kept while the directory lives) holding `users`, its
/// URL and a plain connection to it, as another program would write.
async fn sqlite_users() -> (tempfile::TempDir, String, sqlx::AnyPool) {
    let dir = tempfile::tempdir().unwrap();
    let url = common::sqlite_url(&dir);
    let w = sql_pool(&url).await;
    users_table(&w).await;
    (dir, url, w)
}

/// The SKUs and `users`, both captured by triggers.
fn captured(url: &str, redis: Option<&str>, prefix: &str) -> Config {
    let mut c = common::config(url, redis, prefix);
    c.cache.capture = Capture::Triggers;
    let mut users = common::users_resource("users");
    users.capture = Capture::Triggers;
    c.resources = vec![users];
    c
}

/// How long another program's committed write may take to reach every
/// instance, in seconds: the next poll (`sql.outbox_idle_poll_ms`, 1 s,
/// while a doorbell answers; `sql.outbox_poll_ms`, 100 ms, otherwise; a
/// PostgreSQL `NOTIFY` at once), plus a second for a loaded CI machine.
const BOUND: u64 = 2;

/// The same for a commit whose number was given up as a gap: found by the
/// late check, every 5 s, plus a poll and the margin.
const LATE_BOUND: u64 = 7;

/// The capture target of table `name` keyed by `id`, under its own name.
fn target_of(name: &str) -> bloomgate_service::sql::CaptureTarget {
    bloomgate_service::sql::CaptureTarget {
        resource: name.into(),
        table: name.into(),
        key: "id".into(),
    }
}

async fn status(s: &TestServer, path: &str) -> u16 {
    s.get(path).await.0
}

/// Waits until every server answers `path` with `want`; how long it took.
async fn on_every(servers: &[&TestServer], path: &str, want: u16, secs: u64) -> Duration {
    let started = Instant::now();
    for s in servers {
        eventually(
            secs,
            &format!("{path} answers {want} on {}", s.base),
            || async { status(s, path).await == want },
        )
        .await;
    }
    started.elapsed()
}

async fn entries(pool: &sqlx::AnyPool, resource: &str, key: &str) -> i64 {
    let q = format!(
        "SELECT COUNT(*) FROM bloomgate_changes WHERE resource = '{resource}' AND item_key = '{key}'"
    );
    sqlx::query(&q)
        .fetch_one(pool)
        .await
        .unwrap()
        .get::<i64, _>(0)
}

/// Inserts, updates, deletes, a rollback and a key change made with plain
/// SQL reach both instances with no `keys` or `invalidate` call.
async fn others_writes(url: &str, redis: Option<&str>, label: &str) {
    let w = sql_pool(url).await;
    users_table(&w).await;
    if let Some(r) = redis {
        common::redis_clear(r, &format!("bgtest:capture-{label}:")).await;
    }
    let c = captured(url, redis, &format!("capture-{label}"));
    let a = TestServer::start(c.clone(), 0).await;
    let b = TestServer::start(c, 0).await;
    let both = [&a, &b];
    for s in both {
        // Cached in L1 (and Redis) before the writes.
        for k in ["u000001", "u000002", "u000004"] {
            assert_eq!(
                status(s, &format!("/api/users/{k}")).await,
                200,
                "{label} {k}"
            );
        }
        assert_eq!(status(s, "/api/users/u900001").await, 404);
    }

    if redis.is_some() {
        for s in both {
            eventually(BOUND, "the doorbell answers", || async {
                s.state.outbox.doorbell_healthy()
            })
            .await;
        }
    }
    exec(&w, "INSERT INTO users VALUES ('u900001', 'new', 100)").await;
    let took = on_every(&both, "/api/users/u900001", 200, BOUND).await;
    eprintln!("{label}: another program's insert answered 200 on both after {took:?}");
    exec(&w, "UPDATE users SET name = 'renamed' WHERE id = 'u000001'").await;
    for s in both {
        eventually(BOUND, "the update is served", || async {
            s.get("/api/users/u000001").await.1["name"] == "renamed"
        })
        .await;
    }

    exec(&w, "DELETE FROM users WHERE id = 'u000002'").await;
    on_every(&both, "/api/users/u000002", 404, BOUND).await;

    // A rolled-back insert leaves no entry and no effect.
    let mut tx = w.begin().await.unwrap();
    sqlx::query("INSERT INTO users VALUES ('u900002', 'gone', 101)")
        .execute(&mut *tx)
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    assert_eq!(entries(&w, "users", "u900002").await, 0, "{label}");

    // A change of key: the old one goes, the new one comes.
    exec(&w, "UPDATE users SET id = 'u900003' WHERE id = 'u000004'").await;
    on_every(&both, "/api/users/u900003", 200, BOUND).await;
    on_every(&both, "/api/users/u000004", 404, BOUND).await;
    for s in both {
        assert_eq!(status(s, "/api/users/u900002").await, 404, "{label}");
        let deleted = s.state.resources[0].shield().stats().deleted_since_build;
        assert_eq!(deleted, 2, "{label}: deletes counted once each");
    }
    // A key beyond latin1 is recorded, and the writer's statement stands.
    // (Last among the users' writes: under MariaDB's default collation
    // such a key makes the table's reads go around the caches, see
    // `tests/collation.rs`, and the checks above wait on the caches.)
    exec(&w, "INSERT INTO users VALUES ('ü😀1', 'emoji', 102)").await;
    on_every(&both, "/api/users/%C3%BC%F0%9F%98%801", 200, BOUND).await;
    for s in both {
        let users = s.state.resources[0].shield();
        eventually(BOUND, "the key beyond latin1 is in the filter", || async {
            users.stats().added == 23
        })
        .await;
    }

    // The SKU table too; and the service's own write is recorded by the
    // trigger and by the write itself (which cannot know whether a DBA
    // dropped the trigger since the last check).
    exec(
        &w,
        "INSERT INTO skus (id, name, original_price, seckill_price, stock, seckill_start, seckill_end, updated_at) \
         VALUES (777, 'made elsewhere', 100, 50, 5, 0, 0, 0)",
    )
    .await;
    on_every(&both, "/api/seckill/777", 200, BOUND).await;
    assert_eq!(a.create(778, "ours").await, 201);
    assert_eq!(
        entries(&w, "skus", "778").await,
        2,
        "{label}: the trigger's entry and the write's own"
    );
    on_every(&[&b], "/api/seckill/778", 200, BOUND).await;
    assert_eq!(a.put_sku(778, "ours, renamed", 120).await.0, 200);
    assert_eq!(
        a.send(reqwest::Method::DELETE, "/api/skus/778", None)
            .await
            .0,
        200
    );
    assert_eq!(
        entries(&w, "skus", "778").await,
        6,
        "{label}: create, update, delete, twice each"
    );
    on_every(&[&b], "/api/seckill/778", 404, BOUND).await;
    // The delete counts once toward a rebuild on each instance: through
    // the trigger's entry, and not again by the writer (its triggers
    // fire: so the configuration says until a check finds otherwise).
    // The writer's own count would come before its answer; the wait
    // lets the entry's reach A too.
    for s in both {
        let skus = s.state.skus.shield();
        eventually(BOUND, "the trigger's delete applied", || async {
            skus.stats().deleted_since_build >= 1
        })
        .await;
    }
    tokio::time::sleep(Duration::from_secs(BOUND)).await;
    for s in both {
        let deleted = s.state.skus.shield().stats().deleted_since_build;
        assert_eq!(deleted, 1, "{label}: the SKU delete counted once");
    }
    a.stop().await;
    b.stop().await;
    w.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn others_writes_reach_every_instance_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    others_writes(&common::sqlite_url(&dir), None, "sqlite").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn others_writes_reach_every_instance_mariadb() {
    let (Some(url), Some(redis)) = (
        common::mysql_database("capture").await,
        common::redis_url().await,
    ) else {
        return;
    };
    others_writes(&url, Some(&redis), "mariadb").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn others_writes_reach_every_instance_postgres() {
    let (Some(url), Some(redis)) = (
        common::postgres_database("capture").await,
        common::redis_url().await,
    ) else {
        return;
    };
    others_writes(&url, Some(&redis), "postgres").await;
}

/// A transaction that stays open three times `sql.outbox_gap_ms` (its
/// number given up as a gap by both followers) commits a row: both
/// instances find it.
async fn long_transaction(url: &str, label: &str) {
    let w = sql_pool(url).await;
    users_table(&w).await;
    let mut c = captured(url, None, &format!("capture-long-{label}"));
    c.sql.outbox_gap_ms = 300;
    let a = TestServer::start(c.clone(), 0).await;
    let b = TestServer::start(c, 0).await;
    let both = [&a, &b];
    let mut held = w.begin().await.unwrap();
    sqlx::query("INSERT INTO users VALUES ('u800001', 'slow', 1)")
        .execute(&mut *held)
        .await
        .unwrap();
    // A later number commits first: the held one is a gap.
    exec(&w, "INSERT INTO users VALUES ('u800002', 'quick', 2)").await;
    on_every(&both, "/api/users/u800002", 200, BOUND).await;
    for s in both {
        eventually(10, "the gap given up", || async {
            s.state.outbox.counters.gaps_expired.load(Relaxed) >= 1
        })
        .await;
    }
    tokio::time::sleep(Duration::from_millis(900)).await;
    held.commit().await.unwrap();
    let took = on_every(&both, "/api/users/u800001", 200, LATE_BOUND).await;
    eprintln!("{label}: a commit 3x outbox_gap_ms late answered 200 on both after {took:?}");
    // The first instance to read the old number applies it late and
    // records it again; the other may take the new entry first, but it
    // still reads the old number at its next late check.
    for s in both {
        eventually(
            12,
            "the late entry applied by its own late check",
            || async { s.state.outbox.counters.late_applied.load(Relaxed) >= 1 },
        )
        .await;
    }
    // Recorded again under a new number, for snapshots and epochs whose
    // watermark passed the old one.
    assert!(entries(&w, "users", "u800001").await >= 2, "{label}");
    a.stop().await;
    b.stop().await;
    w.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_after_the_gap_expired_reaches_every_instance_mariadb() {
    let Some(url) = common::mysql_database("capture_long").await else {
        return;
    };
    long_transaction(&url, "mariadb").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_after_the_gap_expired_reaches_every_instance_postgres() {
    let Some(url) = common::postgres_database("capture_long").await else {
        return;
    };
    long_transaction(&url, "postgres").await;
}

/// More given-up runs than are looked up one by one (the limit lowered
/// to two): the oldest, a transaction still open, is watched by its
/// count instead; its commit rebuilds every filter on both instances,
/// and the row answers. Before, the oldest runs were dropped and the row
/// answered 404 until some later rebuild.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_commit_past_the_runs_looked_up_is_found_by_its_count() {
    let Some(url) = common::mysql_database("capture_spans").await else {
        return;
    };
    let w = sql_pool(&url).await;
    users_table(&w).await;
    let mut c = captured(&url, None, "capture-spans");
    c.sql.outbox_gap_ms = 300;
    let a = TestServer::start(c.clone(), 0).await;
    let b = TestServer::start(c, 0).await;
    let both = [&a, &b];
    for s in both {
        s.state.outbox.set_late_limits(2, Duration::from_secs(1));
    }
    let mut held = w.begin().await.unwrap();
    sqlx::query("INSERT INTO users VALUES ('u900001', 'slow', 1)")
        .execute(&mut *held)
        .await
        .unwrap();
    // Three rolled-back numbers after it, each before a commit: four
    // given-up runs, two past the limit.
    for i in 1..=3 {
        let mut t = w.begin().await.unwrap();
        sqlx::query(&format!(
            "INSERT INTO users VALUES ('u91000{i}', 'gone', 1)"
        ))
        .execute(&mut *t)
        .await
        .unwrap();
        t.rollback().await.unwrap();
        exec(
            &w,
            &format!("INSERT INTO users VALUES ('u92000{i}', 'kept', 1)"),
        )
        .await;
    }
    on_every(&both, "/api/users/u920003", 200, BOUND).await;
    for s in both {
        eventually(10, "the oldest runs watched by their count", || async {
            s.state.outbox.counters.late_spanned.load(Relaxed) >= 1
        })
        .await;
    }
    held.commit().await.unwrap();
    // Found by the next count (every 5 s), then a rebuild of a small table.
    on_every(&both, "/api/users/u900001", 200, LATE_BOUND + 3).await;
    // The first instance to count it rebuilt; the other rebuilt on its
    // own count or on the first one's rebuild entry, whichever came first.
    let counted: u64 = both
        .iter()
        .map(|s| s.state.outbox.counters.late_rebuilds.load(Relaxed))
        .sum();
    assert!(counted >= 1);
    // The rebuild entry, for instances that load a filter made before it.
    let q = "SELECT COUNT(*) FROM bloomgate_changes WHERE resource = 'users' AND kind = 'r'";
    let rebuilds: i64 = sqlx::query(q).fetch_one(&w).await.unwrap().get(0);
    assert!(rebuilds >= 1);
    a.stop().await;
    b.stop().await;
}

/// A late transaction of 20,000 rows is applied a page at a time by the
/// late check's own task, while the poll keeps both instances in step
/// (`sql.out_of_step_ms` lowered to 1 s). Before, the late check ran in
/// the poll and recorded the entries again one statement each: the poll
/// stood still and both instances went out of step.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_late_transaction_is_applied_while_in_step() {
    let Some(url) = common::mysql_database("capture_bulk_late").await else {
        return;
    };
    let w = sql_pool(&url).await;
    users_table(&w).await;
    let mut c = captured(&url, None, "capture-bulk-late");
    c.sql.outbox_gap_ms = 300;
    // Each instance re-records the 20,000 late rows under new numbers, and
    // each reads both copies: 40 pages, about 1 s in a debug build on two
    // cores. Before, the poll stood still for the whole late apply.
    c.sql.out_of_step_ms = 2_500;
    let a = TestServer::start(c.clone(), 0).await;
    let b = TestServer::start(c, 0).await;
    let both = [&a, &b];
    const ROWS: u64 = 20_000;
    let mut held = w.begin().await.unwrap();
    sqlx::query(&format!(
        "INSERT INTO users SELECT CONCAT('b', seq), 'bulk', seq FROM seq_1_to_{ROWS}"
    ))
    .execute(&mut *held)
    .await
    .unwrap();
    exec(&w, "INSERT INTO users VALUES ('u930001', 'quick', 1)").await;
    on_every(&both, "/api/users/u930001", 200, BOUND).await;
    for s in both {
        eventually(10, "the bulk numbers given up", || async {
            s.state.outbox.counters.gaps_expired.load(Relaxed) >= ROWS
        })
        .await;
    }
    let out_of_step = |s: &TestServer| s.state.outbox.counters.out_of_step.load(Relaxed);
    let before = [out_of_step(&a), out_of_step(&b)];
    held.commit().await.unwrap();
    for s in both {
        eventually(LATE_BOUND + 5, "the bulk applied late", || async {
            s.state.outbox.counters.late_applied.load(Relaxed) >= ROWS
        })
        .await;
    }
    on_every(&both, &format!("/api/users/b{ROWS}"), 200, BOUND).await;
    assert_eq!(
        [out_of_step(&a), out_of_step(&b)],
        before,
        "an instance went out of step while it applied the late rows"
    );
    a.stop().await;
    b.stop().await;
}

/// A transaction open across the only instance's restart commits after
/// it: the restarted instance finds the row, although its start position
/// is past the transaction's number (the numbers missing before the start
/// position are looked for too).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_across_a_restart_is_found() {
    let Some(url) = common::mysql_database("capture_restart").await else {
        return;
    };
    let w = sql_pool(&url).await;
    users_table(&w).await;
    let mut c = captured(&url, None, "capture-restart");
    c.sql.outbox_gap_ms = 300;
    let a = TestServer::start(c.clone(), 0).await;
    let mut held = w.begin().await.unwrap();
    sqlx::query("INSERT INTO users VALUES ('u500001', 'slow', 1)")
        .execute(&mut *held)
        .await
        .unwrap();
    exec(&w, "INSERT INTO users VALUES ('u500002', 'quick', 2)").await;
    on_every(&[&a], "/api/users/u500002", 200, BOUND).await;
    a.stop().await;
    // Older than twice the gap wait: the next start position is past it.
    tokio::time::sleep(Duration::from_millis(900)).await;
    let a = TestServer::start(c, 0).await;
    assert_eq!(status(&a, "/api/users/u500001").await, 404);
    held.commit().await.unwrap();
    let took = on_every(&[&a], "/api/users/u500001", 200, LATE_BOUND).await;
    eprintln!("a commit across a restart answered 200 after {took:?}");
    a.stop().await;
    w.close().await;
}

/// Redis killed mid-run: another program's insert, update and delete
/// still reach both instances, by polling.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_redis_killed_writes_still_arrive_by_polling() {
    let Some(url) = common::mysql_database("capture_redis_killed").await else {
        return;
    };
    let mut redis = common::OwnServer::redis().await;
    let w = sql_pool(&url).await;
    users_table(&w).await;
    let c = captured(&url, Some(&redis.url()), "capture-killed");
    let a = TestServer::start(c.clone(), 0).await;
    let b = TestServer::start(c, 0).await;
    let both = [&a, &b];
    exec(&w, "INSERT INTO users VALUES ('u910001', 'before', 1)").await;
    on_every(&both, "/api/users/u910001", 200, BOUND).await;
    assert_eq!(status(&a, "/api/users/u000005").await, 200);
    redis.stop().await;
    exec(&w, "INSERT INTO users VALUES ('u910002', 'after', 2)").await;
    exec(&w, "UPDATE users SET name = 'changed' WHERE id = 'u910001'").await;
    exec(&w, "DELETE FROM users WHERE id = 'u000005'").await;
    let took = on_every(&both, "/api/users/u910002", 200, BOUND).await;
    eprintln!("Redis killed: another program's insert answered 200 on both after {took:?}");
    on_every(&both, "/api/users/u000005", 404, BOUND).await;
    for s in both {
        eventually(BOUND, "the update is served", || async {
            s.get("/api/users/u910001").await.1["name"] == "changed"
        })
        .await;
    }
    a.stop().await;
    b.stop().await;
    w.close().await;
}

/// One `INSERT … SELECT` of 100,000 rows by another program: every key is
/// in both instances' filters; how long the followers took.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bulk_insert_of_100000_rows_reaches_every_instance() {
    let Some(url) = common::mysql_database("capture_bulk").await else {
        return;
    };
    let w = sql_pool(&url).await;
    users_table(&w).await;
    exec(&w, "CREATE TABLE digits (d INT NOT NULL)").await;
    exec(
        &w,
        "INSERT INTO digits VALUES (0),(1),(2),(3),(4),(5),(6),(7),(8),(9)",
    )
    .await;
    let c = captured(&url, None, "capture-bulk");
    let a = TestServer::start(c.clone(), 0).await;
    let b = TestServer::start(c, 0).await;
    let started = Instant::now();
    exec(
        &w,
        "INSERT INTO users (id, name, seq) \
         SELECT CONCAT('b', LPAD(a.d + 10 * b.d + 100 * c.d + 1000 * e.d + 10000 * f.d, 6, '0')), 'bulk', 0 \
         FROM digits a, digits b, digits c, digits e, digits f",
    )
    .await;
    let committed = started.elapsed();
    let keys: Vec<bloomgate_service::key::Key> = (0..100_000)
        .map(|i| bloomgate_service::key::Key::Text(format!("b{i:06}")))
        .collect();
    for s in [&a, &b] {
        let gate = s.state.resources[0].shield();
        eventually(60, "every bulk key in the filter", || async {
            gate.check_many(&keys)
                .iter()
                .all(|v| *v != bloomgate_service::shield::Verdict::Reject)
        })
        .await;
    }
    let caught_up = started.elapsed();
    eprintln!(
        "bulk INSERT of 100,000 rows: committed after {committed:?}, in both filters after {caught_up:?} ({:.0} entries/s after the commit)",
        1e5 / (caught_up - committed).as_secs_f64().max(1e-3)
    );
    assert_eq!(status(&b, "/api/users/b099999").await, 200);
    a.stop().await;
    b.stop().await;
    w.close().await;
}

/// A DBA drops a capture trigger while the service runs: the next check
/// (at each outbox trim; a retention of 1 s here) installs it again, and
/// another program's insert is captured.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_trigger_is_installed_again() {
    let (_dir, url, w) = sqlite_users().await;
    let mut c = captured(&url, None, "capture-dropped");
    c.sql.outbox_gap_ms = 200;
    c.sql.outbox_retention_secs = 1;
    let a = TestServer::start(c, 0).await;
    let target = target_of("users");
    let store = a.state.skus.source();
    assert!(store.capture_state(&target).await.unwrap().is_current());
    let insert_trigger = &target.trigger_names(store.backend())[0];
    exec(&w, &format!("DROP TRIGGER \"{insert_trigger}\"")).await;
    assert!(!store.capture_state(&target).await.unwrap().is_current());
    // Rechecked at each trim (every second with a retention of 1 s).
    eventually(3, "the trigger installed again", || async {
        store.capture_state(&target).await.unwrap().is_current()
    })
    .await;
    assert!(a.state.outbox.counters.capture_lost.load(Relaxed) >= 1);
    exec(&w, "INSERT INTO users VALUES ('u920001', 'after', 1)").await;
    on_every(&[&a], "/api/users/u920001", 200, BOUND).await;
    a.stop().await;
    w.close().await;
}

/// A DBA drops the insert trigger `trigger` (SQLite) and another program
/// inserts `users` row `id`, in one transaction: no check falls between,
/// and the row is in no outbox entry.
async fn gap_insert(w: &sqlx::AnyPool, s: &TestServer, id: &str) {
    let target = target_of("users");
    let trigger = &target.trigger_names(s.state.skus.source().backend())[0];
    let mut tx = w.begin().await.unwrap();
    for sql in [
        format!("DROP TRIGGER \"{trigger}\""),
        format!("INSERT INTO users VALUES ('{id}', 'in the gap', 1)"),
    ] {
        sqlx::query(&sql).execute(&mut *tx).await.unwrap();
    }
    tx.commit().await.unwrap();
}

/// A capture gap: a DBA drops a trigger and another program inserts a row
/// before it is back (one transaction here, so no check falls between).
/// The row is in no outbox entry. Once the check installs the trigger
/// again on A, A rebuilds its filter and asks every other instance to:
/// B, which never checks (a long retention), answers 200 for the row too.
/// Before, both answered 404 for it until some unrelated rebuild.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_capture_gap_rebuilds_every_instance() {
    let (_dir, url, w) = sqlite_users().await;
    let mut c = captured(&url, None, "capture-gap");
    c.sql.outbox_gap_ms = 200;
    let mut checks = c.clone();
    checks.sql.outbox_retention_secs = 1;
    let a = TestServer::start(checks, 0).await;
    let b = TestServer::start(c, 0).await;
    on_every(&[&a, &b], "/api/users/u930001", 404, BOUND).await;
    // A's start installed the triggers and asked the running instances
    // to rebuild; B, started after that request, read it again from its
    // start position and skipped it (its scan began after it).
    let polls = b.state.outbox.counters.polls.load(Relaxed);
    eventually(2, "B polled", || async {
        b.state.outbox.counters.polls.load(Relaxed) > polls + 1
    })
    .await;
    assert_eq!(b.state.outbox.counters.rebuilds.load(Relaxed), 0);
    let target = target_of("users");
    let store = a.state.skus.source();
    gap_insert(&w, &a, "u930001").await;
    assert_eq!(entries(&w, "users", "u930001").await, 0, "unrecorded");
    // The check (each second here), the rebuild entry's poll, a scan of
    // 21 rows, and the margin.
    on_every(&[&a, &b], "/api/users/u930001", 200, 4).await;
    assert!(store.capture_state(&target).await.unwrap().is_current());
    a.stop().await;
    b.stop().await;
    w.close().await;
}

/// A gap that opens and closes between two checks: a DBA drops a trigger
/// (or disables it), another program inserts a row, and the trigger is
/// back before any check could find it missing. Only its identity in the
/// catalogue changed. A, which checks each second, notices, rebuilds and
/// asks once; B, which never checks, rebuilds on the request. Before,
/// both answered 404 for the row until some unrelated rebuild.
async fn replaced_between_checks(url: &str, label: &str) {
    let w = sql_pool(url).await;
    users_table(&w).await;
    let mut c = captured(url, None, label);
    c.sql.outbox_gap_ms = 200;
    let mut checks = c.clone();
    checks.sql.outbox_retention_secs = 1;
    let a = TestServer::start(checks, 0).await;
    let b = TestServer::start(c, 0).await;
    let target = target_of("users");
    let store = a.state.skus.source();
    use bloomgate_service::sql::Backend;
    let postgres = store.backend() == Backend::Postgres;
    // DDL is transactional on PostgreSQL and SQLite.
    let transactional = store.backend() != Backend::MySql;
    let trigger = target.trigger_names(store.backend())[0].clone();
    let outbox = store.outbox_for_triggers().await.unwrap();
    // PostgreSQL: the function and the trigger; elsewhere the insert
    // trigger.
    let create: Vec<String> = if postgres {
        store.capture_ddl(&target, &outbox)
    } else {
        store.capture_ddl(&target, &outbox)[..1].to_vec()
    };
    let drop = match store.backend() {
        Backend::Postgres => format!("DROP TRIGGER \"{trigger}\" ON users"),
        Backend::Sqlite => format!("DROP TRIGGER \"{trigger}\""),
        Backend::MySql => format!("DROP TRIGGER `{trigger}`"),
    };
    let mut ids = Vec::new();
    for attempt in 0..5 {
        let id = format!("u94{attempt:04}");
        on_every(&[&a, &b], &format!("/api/users/{id}"), 404, BOUND).await;
        let lost = a.state.outbox.counters.capture_lost.load(Relaxed);
        let insert = format!("INSERT INTO users VALUES ('{id}', 'in the gap', 1)");
        if !transactional && attempt > 0 {
            // `CREATED` counts hundredths of a second: the trigger made
            // again must not share the last one's.
            tokio::time::sleep(Duration::from_millis(30)).await;
        }
        let made = if transactional {
            // No check can see the gap.
            let mut tx = w.begin().await.unwrap();
            sqlx::query(&drop).execute(&mut *tx).await.unwrap();
            sqlx::query(&insert).execute(&mut *tx).await.unwrap();
            for s in &create {
                sqlx::raw_sql(s).execute(&mut *tx).await.unwrap();
            }
            tx.commit().await.unwrap();
            true
        } else {
            exec(&w, &drop).await;
            exec(&w, &insert).await;
            sqlx::raw_sql(&create[0]).execute(&w).await.is_ok()
        };
        ids.push(id);
        // A check that fell between found it missing (the known path; A
        // may then have made the trigger before the insert): try again,
        // so this test exercises the gap no check saw.
        let unrecorded = entries(&w, "users", ids.last().unwrap()).await == 0;
        if made && unrecorded && a.state.outbox.counters.capture_lost.load(Relaxed) == lost {
            break;
        }
        assert!(attempt < 4, "every attempt had a check fall in its gap");
        eventually(5, "the check's own install", || async {
            store.capture_state(&target).await.unwrap().is_current()
        })
        .await;
    }
    let id = ids.last().unwrap().clone();
    assert!(store.capture_state(&target).await.unwrap().is_current());
    // The check (each second), the request's poll, a scan of 21 rows,
    // and the margin.
    on_every(&[&a, &b], &format!("/api/users/{id}"), 200, 4).await;
    if postgres {
        // Disabled and enabled again in one transaction: the trigger's
        // row in the catalogue changed.
        let mut tx = w.begin().await.unwrap();
        for sql in [
            "ALTER TABLE users DISABLE TRIGGER ALL".to_owned(),
            "INSERT INTO users VALUES ('u950001', 'while disabled', 1)".to_owned(),
            format!("ALTER TABLE users ENABLE ALWAYS TRIGGER \"{trigger}\""),
        ] {
            sqlx::query(&sql).execute(&mut *tx).await.unwrap();
        }
        tx.commit().await.unwrap();
        assert_eq!(entries(&w, "users", "u950001").await, 0);
        on_every(&[&a, &b], "/api/users/u950001", 200, 4).await;
        // Its function replaced by one that records nothing, and back, in
        // one transaction: only the function's row changed.
        let mut tx = w.begin().await.unwrap();
        for sql in [
            format!(
                "CREATE OR REPLACE FUNCTION \"{}\"() RETURNS trigger LANGUAGE plpgsql \
                 AS $$ BEGIN RETURN NULL; END $$",
                target.function_name()
            ),
            "INSERT INTO users VALUES ('u950002', 'recorded by nothing', 1)".to_owned(),
            create[0].clone(),
        ] {
            sqlx::raw_sql(&sql).execute(&mut *tx).await.unwrap();
        }
        tx.commit().await.unwrap();
        assert_eq!(entries(&w, "users", "u950002").await, 0);
        on_every(&[&a, &b], "/api/users/u950002", 200, 4).await;
    }
    // Later checks find the same triggers: no more requests (B rebuilds
    // once per request it reads; a copy of one recorded slowly is not
    // acted on again). The request of the last replacement may still be
    // on its way when the row is found (the row can be found first): the
    // count is taken once it has been still for two checks.
    let counter = &b.state.outbox.counters.rebuilds;
    let mut last = counter.load(Relaxed);
    let mut still = 0;
    while still < 2 {
        tokio::time::sleep(Duration::from_millis(1100)).await;
        let now = counter.load(Relaxed);
        still = if now == last { still + 1 } else { 0 };
        last = now;
    }
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(counter.load(Relaxed), last, "a later check asked again");
    on_every(&[&a, &b], "/api/users/u960001", 404, BOUND).await;
    a.stop().await;
    b.stop().await;
    w.close().await;
}

/// SQLite keeps no identity per trigger: the schema's version tells.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn triggers_replaced_between_two_checks_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    replaced_between_checks(&common::sqlite_url(&dir), "capture-replaced-sqlite").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn triggers_replaced_between_two_checks_mariadb() {
    let Some(url) = common::mysql_database("capture_replaced").await else {
        return;
    };
    replaced_between_checks(&url, "capture-replaced-mariadb").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn triggers_replaced_between_two_checks_postgres() {
    let Some(url) = common::postgres_database("capture_replaced").await else {
        return;
    };
    replaced_between_checks(&url, "capture-replaced-postgres").await;
}

/// `captured` in `redis` mode for `users`, its Redis prefix cleared.
async fn shared_mode(url: &str, redis: &str, label: &str) -> Config {
    let mut c = captured(url, Some(redis), label);
    common::redis_clear(redis, &c.cache.redis_prefix).await;
    c.resources[0].bloom_mode = Some(bloomgate_service::config::BloomMode::Redis);
    c
}

/// The same gap in `redis` mode, where the shared filter alone answers:
/// it is filled again from the source once the triggers fire again (the
/// other instance too applies the rebuild entry), and its "no" is not a
/// 404 meanwhile. Before, the row in no entry answered 404 on both for
/// good: the rebuild reached the in-process filters only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_capture_gap_reaches_the_shared_filter_in_redis_mode() {
    let Some(redis) = common::redis_url().await else {
        return;
    };
    let (_dir, url, w) = sqlite_users().await;
    let mut c = shared_mode(&url, &redis, "capture-gap-redis").await;
    c.sql.outbox_gap_ms = 200;
    let mut checks = c.clone();
    checks.sql.outbox_retention_secs = 1;
    let a = TestServer::start(checks, 0).await;
    let b = TestServer::start(c, 0).await;
    on_every(&[&a, &b], "/api/users/u950001", 404, BOUND).await;
    gap_insert(&w, &a, "u950001").await;
    on_every(&[&a, &b], "/api/users/u950001", 200, 4).await;
    // Still found once every fill ended, and an absent key is refused by
    // the shared filter again.
    for s in [&a, &b] {
        let shared = s.state.resources[0].shared().unwrap().clone();
        eventually(5, "the fill ended", || async { !shared.fill_owed() }).await;
    }
    on_every(&[&a, &b], "/api/users/u950001", 200, BOUND).await;
    // Refused by the filter, not by SQL, once A vouches again (a rebuild
    // request read late may leave it not vouching a moment longer).
    eventually(5, "an absent key refused by the filter", || async {
        let before = common::counter(
            &a.stats().await,
            &["resources", "users", "filter", "rejected"],
        );
        let refused = status(&a, "/api/users/u959999").await == 404;
        let after = common::counter(
            &a.stats().await,
            &["resources", "users", "filter", "rejected"],
        );
        refused && after == before + 1
    })
    .await;
    a.stop().await;
    b.stop().await;
    w.close().await;
}

/// A fill of the shared filter asked for while another runs is not
/// absorbed by it: a warm's rebuild starts a slow fill (its scan limited
/// to 400 rows a second over 3,000 rows), a row is written in a capture
/// gap after that scan passed its place, and the gap's fill is asked for
/// while the warm's runs. The row is found once every fill and rebuild
/// ended. Before, the second request returned at once (a fill was
/// running), the running scan ended without the row, and once the gap's
/// in-process rebuild ended the shared filter's "no" was a 404.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fill_asked_for_during_a_running_fill_is_not_absorbed() {
    let Some(redis) = common::redis_url().await else {
        return;
    };
    let (_dir, url, w) = sqlite_users().await;
    // After the gap's row in key order: the scan passes `u000000` first.
    let rows: Vec<String> = (1..=3_000)
        .map(|i| format!("('u5{i:05}', 'bulk {i}', {i})"))
        .collect();
    exec(&w, &format!("INSERT INTO users VALUES {}", rows.join(", "))).await;
    let mut c = shared_mode(&url, &redis, "capture-fill-absorbed").await;
    c.sql.outbox_gap_ms = 200;
    c.sql.outbox_retention_secs = 1;
    c.cache.bloom_scan_rows_per_sec = 400;
    // Sized for the rows: the shared filter's "no" is then exact enough
    // to tell (overfilled, most keys would answer "maybe").
    c.resources[0].bloom_expected = 100_000;
    let s = TestServer::start(c, 0).await;
    // Built (8 s at the limit) and vouching.
    on_every(&[&s], "/api/users/u000000", 404, 30).await;
    let shared = s.state.resources[0].shared().unwrap().clone();
    assert!(!shared.fill_owed());
    // The warm answers once its rebuild ended (8 s at the limit, as its
    // fill's scan).
    let warm = {
        let (base, client) = (s.base.clone(), reqwest::Client::new());
        tokio::spawn(async move {
            let r = client
                .post(format!("{base}/api/users/warm"))
                .body(r#"{"limit":10,"rebuild_bloom":true}"#)
                .header("content-type", "application/json")
                .send()
                .await
                .unwrap();
            (r.status().as_u16(), r.text().await.unwrap())
        })
    };
    eventually(2, "the warm's fill is owed", || async {
        shared.fill_owed()
    })
    .await;
    // Its scan read its first page before this row was written.
    tokio::time::sleep(Duration::from_millis(300)).await;
    gap_insert(&w, &s, "u000000").await;
    let target = target_of("users");
    // The check (at the trims, each second or two) notices the gap and
    // asks for a fill while the warm's scan still runs (its rebuild, as
    // long, has not answered yet: else this test proves nothing).
    eventually(6, "the gap closed", || async {
        s.state
            .skus
            .source()
            .capture_state(&target)
            .await
            .unwrap()
            .is_current()
    })
    .await;
    assert!(!warm.is_finished(), "the gap closed after the warm's scans");
    let (code, body) = warm.await.unwrap();
    assert_eq!(code, 200, "{body}");
    // Every fill and the gap's rebuild ended: the shared filter's "no"
    // stands again.
    let gate = s.state.resources[0].shield().clone();
    eventually(40, "every fill and rebuild ended", || async {
        !shared.fill_owed() && !gate.rebuild_is_owed()
    })
    .await;
    assert_eq!(status(&s, "/api/users/u000000").await, 200);
    // And the filter vouches again: an absent key is refused by it.
    let rejected = |stats: serde_json::Value| {
        common::counter(&stats, &["resources", "users", "filter", "rejected"])
    };
    let before = rejected(s.stats().await);
    assert_eq!(status(&s, "/api/users/u0000001").await, 404);
    assert_eq!(rejected(s.stats().await), before + 1);
    s.stop().await;
    w.close().await;
}

/// Snapshot restores of the `users` filter so far.
fn restores(stats: &serde_json::Value) -> i64 {
    common::counter(
        stats,
        &["resources", "users", "filter", "snapshot_restores"],
    )
}

/// `captured` with a snapshot of `users` in `dir`.
fn snapshotted(url: &str, dir: &tempfile::TempDir, label: &str) -> Config {
    let mut c = captured(url, None, label);
    c.resources[0].bloom_snapshot_path = Some(dir.path().join("users.bgf"));
    c
}

/// Starts, stops, and starts again: the second start restores the
/// snapshot the first one's stop saved. `TestServer::start` waits for the
/// SKU table's build only, and a stop saves no filter that is not built
/// yet, or is owed a rebuild: the stop waits until `users`' filter is
/// ready and owes nothing (before, a stop before that saved nothing and
/// the restart scanned, about one run in three).
async fn restored_after_a_quiet_restart(c: &Config) -> TestServer {
    let a = TestServer::start(c.clone(), 0).await;
    assert_eq!(status(&a, "/api/users/u000001").await, 200);
    let gate = a.state.resources[0].shield().clone();
    eventually(10, "users' filter built, owing nothing", || async {
        gate.is_ready() && !gate.rebuild_is_owed() && !gate.is_rebuilding()
    })
    .await;
    a.stop().await;
    let a = TestServer::start(c.clone(), 0).await;
    assert_eq!(restores(&a.stats().await), 1, "restored at once");
    a
}

/// A start that finds the triggers missing (dropped while no instance
/// ran, a row inserted meanwhile) installs them and scans: the snapshot,
/// positioned in the outbox, lacks the row and no entry names it.
/// Before, the snapshot was restored and the row answered 404.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_after_a_capture_gap_scans_instead_of_restoring() {
    let (dir, url, w) = sqlite_users().await;
    let c = snapshotted(&url, &dir, "capture-gap-start");
    restored_after_a_quiet_restart(&c).await.stop().await;
    let target = target_of("users");
    let store = bloomgate_service::sql::Database::connect_unmigrated(
        &url,
        &bloomgate_service::config::SqlConfig::default(),
    )
    .await
    .unwrap();
    let insert_trigger = &target.trigger_names(store.backend())[0];
    exec(&w, &format!("DROP TRIGGER \"{insert_trigger}\"")).await;
    exec(&w, "INSERT INTO users VALUES ('u940001', 'in the gap', 1)").await;
    let a = TestServer::start(c, 0).await;
    assert_eq!(restores(&a.stats().await), 0, "scanned");
    assert_eq!(status(&a, "/api/users/u940001").await, 200);
    assert!(store.capture_state(&target).await.unwrap().is_current());
    a.stop().await;
    store.close().await;
    w.close().await;
}

/// Triggers replaced while no instance ran (dropped and made again around
/// another program's insert, one transaction, PostgreSQL): they are there
/// and current at the next start, but not the ones the fleet last saw, so
/// the start scans instead of restoring its snapshot (which lacks the row).
/// Before, the snapshot was restored and the row answered 404.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn triggers_replaced_while_no_instance_ran_postgres() {
    let Some(url) = common::postgres_database("capture_replaced_stopped").await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let w = sql_pool(&url).await;
    users_table(&w).await;
    let c = snapshotted(&url, &dir, "capture-replaced-stopped");
    let a = restored_after_a_quiet_restart(&c).await;
    let target = target_of("users");
    let store = a.state.skus.source();
    let create = store.capture_ddl(&target, &store.outbox_for_triggers().await.unwrap());
    let trigger = target.trigger_names(store.backend())[0].clone();
    a.stop().await;
    let mut tx = w.begin().await.unwrap();
    sqlx::query(&format!("DROP TRIGGER \"{trigger}\" ON users"))
        .execute(&mut *tx)
        .await
        .unwrap();
    sqlx::query("INSERT INTO users VALUES ('u940001', 'in the gap', 1)")
        .execute(&mut *tx)
        .await
        .unwrap();
    for s in &create {
        sqlx::raw_sql(s).execute(&mut *tx).await.unwrap();
    }
    tx.commit().await.unwrap();
    assert_eq!(entries(&w, "users", "u940001").await, 0);
    let a = TestServer::start(c.clone(), 0).await;
    assert_eq!(restores(&a.stats().await), 0, "scanned");
    assert_eq!(status(&a, "/api/users/u940001").await, 200);
    assert_eq!(status(&a, "/api/users/u940002").await, 404);
    a.stop().await;
    // The start noted the new triggers: the next one restores again.
    let a = TestServer::start(c, 0).await;
    assert_eq!(restores(&a.stats().await), 1);
    assert_eq!(status(&a, "/api/users/u940001").await, 200);
    a.stop().await;
    w.close().await;
}

/// A start after a capture gap in `redis` mode: the shared filter outlives
/// the instance, so the start fills it again (the start's own rebuild
/// request does not reach it). Before, it lacked the row written while
/// the trigger was gone, and answered 404 for it alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_after_a_capture_gap_fills_the_shared_filter_again() {
    let Some(redis) = common::redis_url().await else {
        return;
    };
    let (_dir, url, w) = sqlite_users().await;
    let c = shared_mode(&url, &redis, "capture-gap-start-redis").await;
    let prefix = c.cache.redis_prefix.clone();
    let a = TestServer::start(c.clone(), 0).await;
    assert_eq!(status(&a, "/api/users/u000001").await, 200);
    assert_eq!(status(&a, "/api/users/u940001").await, 404);
    let target = target_of("users");
    let trigger = target.trigger_names(a.state.skus.source().backend())[0].clone();
    a.stop().await;
    exec(&w, &format!("DROP TRIGGER \"{trigger}\"")).await;
    exec(&w, "INSERT INTO users VALUES ('u940001', 'in the gap', 1)").await;
    let a = TestServer::start(c, 0).await;
    let shared = a.state.resources[0].shared().unwrap().clone();
    eventually(5, "the fill ended", || async { !shared.fill_owed() }).await;
    assert_eq!(status(&a, "/api/users/u940001").await, 200);
    assert_eq!(status(&a, "/api/users/u949999").await, 404);
    a.stop().await;
    common::redis_clear(&redis, &prefix).await;
    w.close().await;
}

/// Tables whose name starts with `bloomgate` in `url`'s database.
async fn bloomgate_tables(pool: &sqlx::AnyPool, postgres: bool) -> i64 {
    let q = if postgres {
        "SELECT COUNT(*) FROM pg_tables WHERE tablename LIKE 'bloomgate%'"
    } else {
        "SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name LIKE 'bloomgate%'"
    };
    sqlx::query(q)
        .fetch_one(pool)
        .await
        .unwrap()
        .get::<i64, _>(0)
}

/// The tables of `pool`'s database (schema), sorted.
async fn tables(pool: &sqlx::AnyPool, postgres: bool) -> Vec<String> {
    let q = if postgres {
        "SELECT CAST(tablename AS TEXT) FROM pg_tables WHERE schemaname = current_schema() ORDER BY 1"
    } else {
        "SELECT CONVERT(table_name USING utf8mb4) FROM information_schema.tables WHERE table_schema = DATABASE() ORDER BY 1"
    };
    sqlx::query(q)
        .fetch_all(pool)
        .await
        .unwrap()
        .iter()
        .map(|r| r.get::<String, _>(0))
        .collect()
}

/// A service user without the TRIGGER privilege: with no triggers the
/// start is refused, naming the key, and nothing is written; once a
/// privileged user installed them, it starts and captures.
async fn without_trigger_privilege(admin_url: &str, postgres: bool) {
    let user = "bg_capture_np";
    let admin = sql_pool(admin_url).await;
    users_table(&admin).await;
    let db = admin_url.rsplit('/').next().unwrap().to_owned();
    let service_url = if postgres {
        for s in [
            format!("DROP ROLE IF EXISTS {user}"),
            format!("CREATE ROLE {user} LOGIN"),
            format!("GRANT SELECT, INSERT, UPDATE, DELETE ON users TO {user}"),
            format!("GRANT USAGE, CREATE ON SCHEMA public TO {user}"),
        ] {
            exec(&admin, &s).await;
        }
        common::as_user(admin_url, user)
    } else {
        for s in [
            format!("DROP USER IF EXISTS '{user}'@'%'"),
            format!("CREATE USER '{user}'@'%' IDENTIFIED BY 'np'"),
            format!("GRANT SELECT, INSERT, UPDATE, DELETE, CREATE, INDEX, ALTER ON {db}.* TO '{user}'@'%'"),
        ] {
            exec(&admin, &s).await;
        }
        common::as_user(admin_url, &format!("{user}:np"))
    };
    let mut c = common::config(&service_url, None, &format!("capture-np-{postgres}"));
    // A user's own database: no demo table.
    c.demo = None;
    let mut users = common::users_resource("users");
    users.capture = Capture::Triggers;
    c.resources = vec![users];
    let refused = bloomgate_service::AppState::connect(&c)
        .await
        .unwrap_err()
        .to_string();
    for part in [
        "resources[0].capture",
        "TRIGGER",
        "bloomgate capture show",
        "--resource users",
    ] {
        assert!(refused.contains(part), "{part:?} in: {refused}");
    }
    assert_eq!(
        bloomgate_tables(&admin, postgres).await,
        0,
        "the database untouched"
    );

    // The DBA installs them with their own rights, as `bloomgate capture
    // install` does: bloomgate's tables, the triggers, and (PostgreSQL,
    // where the DBA now owns bloomgate's tables) plain DML on those for
    // the service's user, named by the service's URL.
    let before = tables(&admin, postgres).await;
    let dba = bloomgate_service::sql::Database::connect_unmigrated(
        admin_url,
        &bloomgate_service::config::SqlConfig::default(),
    )
    .await
    .unwrap();
    let captured = bloomgate_service::feed::capture::targets(&c);
    let service_user = bloomgate_service::text::url_user(&service_url);
    assert_eq!(service_user.as_deref(), Some(user));
    let done =
        bloomgate_service::feed::capture::install_as_dba(&dba, &captured, c.demo(), Some(user))
            .await
            .unwrap();
    assert_eq!(done.tables, [("users".to_string(), true)]);
    assert_eq!(done.granted.is_some(), postgres, "{done:?}");
    let again =
        bloomgate_service::feed::capture::install_as_dba(&dba, &captured, c.demo(), Some(user))
            .await
            .unwrap();
    assert_eq!(again.tables, [("users".to_string(), false)], "idempotent");
    // Triggers checked each second.
    c.sql.outbox_gap_ms = 200;
    c.sql.outbox_retention_secs = 1;
    let a = TestServer::start(c.clone(), 0).await;
    let b = TestServer::start(c.clone(), 0).await;
    exec(&admin, "INSERT INTO users VALUES ('u700001', 'seen', 1)").await;
    on_every(&[&a, &b], "/api/users/u700001", 200, BOUND).await;

    // The DBA drops them while the service runs, which may not install
    // them again: the filter stops vouching (a row another program
    // inserts now is in no entry, and answers 200 from SQL; before, the
    // filter's no answered 404). The DBA installs them again: both
    // instances rebuild, and the row stays found.
    on_every(&[&a, &b], "/api/users/u700002", 404, BOUND).await;
    for t in &captured {
        dba.remove_capture(&t.target).await.unwrap();
    }
    for s in [&a, &b] {
        eventually(3, "the capture found lost", || async {
            s.state.outbox.capture_is_lost("users")
        })
        .await;
    }
    exec(
        &admin,
        "INSERT INTO users VALUES ('u700002', 'in the gap', 2)",
    )
    .await;
    on_every(&[&a, &b], "/api/users/u700002", 200, BOUND).await;
    bloomgate_service::feed::capture::install_as_dba(&dba, &captured, c.demo(), Some(user))
        .await
        .unwrap();
    for s in [&a, &b] {
        eventually(3, "the capture found back", || async {
            !s.state.outbox.capture_is_lost("users")
        })
        .await;
    }
    on_every(&[&a, &b], "/api/users/u700002", 200, BOUND).await;
    on_every(&[&a, &b], "/api/users/u700003", 404, 3).await;
    a.stop().await;
    b.stop().await;
    if postgres {
        // The service may not add a trigger to the outbox the DBA owns
        // (one would run inside the DBA's capture function).
        let service = sql_pool(&service_url).await;
        let refused = sqlx::query(
            "CREATE TRIGGER mine AFTER INSERT ON bloomgate_changes \
             FOR EACH ROW EXECUTE FUNCTION suppress_redundant_updates_trigger()",
        )
        .execute(&service)
        .await
        .unwrap_err()
        .to_string();
        assert!(
            refused.contains("permission denied") || refused.contains("must be owner"),
            "{refused}"
        );
        service.close().await;
    }
    // `capture remove --outbox` leaves the database as it was.
    for t in &captured {
        let triggers = if postgres { 1 } else { 3 };
        assert_eq!(dba.remove_capture(&t.target).await.unwrap(), triggers);
    }
    dba.drop_own_tables().await.unwrap();
    dba.close().await;
    assert_eq!(tables(&admin, postgres).await, before, "as it was");
    if postgres {
        admin.close().await;
        let root = sql_pool(common::POSTGRES_ADMIN_URL).await;
        exec(&root, &format!("DROP DATABASE {db} WITH (FORCE)")).await;
        exec(&root, &format!("DROP ROLE {user}")).await;
        root.close().await;
    } else {
        exec(&admin, &format!("DROP USER '{user}'@'%'")).await;
        admin.close().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_without_the_trigger_privilege_mariadb() {
    let Some(url) = common::mysql_database("capture_np").await else {
        return;
    };
    without_trigger_privilege(&url, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_without_the_trigger_privilege_postgres() {
    let Some(url) = common::postgres_database("capture_np").await else {
        return;
    };
    without_trigger_privilege(&url, true).await;
}

/// PostgreSQL without Redis: the triggers' `NOTIFY` wakes every
/// instance at once (the idle poll is one second), and a listener whose
/// connection is killed catches up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_notify_propagates_without_redis() {
    let Some(url) = common::postgres_database("capture_notify").await else {
        return;
    };
    let w = sql_pool(&url).await;
    users_table(&w).await;
    let mut c = captured(&url, None, "capture-notify");
    c.sql.outbox_idle_poll_ms = 5_000;
    c.sql.out_of_step_ms = 20_000;
    let a = TestServer::start(c.clone(), 0).await;
    let b = TestServer::start(c, 0).await;
    let both = [&a, &b];
    for s in both {
        eventually(5, "the listener answers", || async {
            s.state.outbox.doorbell_healthy()
        })
        .await;
    }
    let mut took = Vec::new();
    for i in 0..20 {
        exec(
            &w,
            &format!("INSERT INTO users VALUES ('u6{i:05}', 'n', {i})"),
        )
        .await;
        took.push(on_every(&both, &format!("/api/users/u6{i:05}"), 200, 10).await);
    }
    took.sort();
    eprintln!(
        "NOTIFY propagation over 20 inserts: p50 {:?}, max {:?}",
        took[10], took[19]
    );
    // Well under the 5 s idle poll: the notification did it.
    assert!(took[19] < Duration::from_millis(2_500), "{took:?}");

    let db = url.rsplit('/').next().unwrap();
    let killed: i64 = sqlx::query(&format!(
        "SELECT COUNT(pg_terminate_backend(pid)) FROM pg_stat_activity \
         WHERE datname = '{db}' AND query LIKE 'LISTEN%'"
    ))
    .fetch_one(&w)
    .await
    .unwrap()
    .get(0);
    assert!(killed >= 2, "both listeners' connections: {killed}");
    exec(&w, "INSERT INTO users VALUES ('u699999', 'after', 1)").await;
    let took = on_every(&both, "/api/users/u699999", 200, 10).await;
    eprintln!("after pg_terminate_backend: {took:?}");
    a.stop().await;
    b.stop().await;
    w.close().await;
}

/// The statements an idle instance sends per second: at most one while
/// the Redis doorbell answers; ten (`outbox_poll_ms`) without it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_statements_with_and_without_the_doorbell() {
    // Counted by the database itself (`Questions`), on a MariaDB of the
    // test's own: the machine's serves other tests at the same time.
    let Some(redis) = common::redis_url().await else {
        return;
    };
    let db = common::OwnServer::mariadb().await;
    let url = db.url();
    let w = sql_pool(&url).await;
    users_table(&w).await;
    w.close().await;
    let admin = sql_pool(&url).await;
    let questions = || async {
        let row = sqlx::query("SHOW GLOBAL STATUS LIKE 'Questions'")
            .fetch_one(&admin)
            .await
            .unwrap();
        row.get::<String, _>(1).parse::<f64>().unwrap()
    };
    let mut rates = Vec::new();
    for redis in [Some(redis.as_str()), None] {
        let s = TestServer::start(captured(&url, redis, "capture-idle"), 0).await;
        if redis.is_some() {
            eventually(5, "the doorbell answers", || async {
                s.state.outbox.doorbell_healthy()
            })
            .await;
        }
        tokio::time::sleep(Duration::from_millis(1_500)).await;
        let before = questions().await;
        tokio::time::sleep(Duration::from_secs(5)).await;
        // Less the one `SHOW` of the second reading.
        let rate = (questions().await - before - 1.0) / 5.0;
        eprintln!(
            "idle SQL statements per second (the server's Questions), redis {}: {rate}",
            redis.is_some()
        );
        rates.push(rate);
        s.stop().await;
    }
    assert!(rates[0] <= 1.2, "doorbell healthy: {rates:?}");
    assert!(
        rates[1] >= 5.0,
        "doorbell broken: polls every outbox_poll_ms: {rates:?}"
    );
    admin.close().await;
}

/// PostgreSQL, a partitioned `users` table: a partitioned table's row
/// trigger fires on the partition, under the partition's name, and the
/// capture function must still record the row under the table (version 1
/// recorded nothing: every row inserted after the build answered 404).
/// Then `ALTER TABLE … DISABLE TRIGGER ALL` (bulk loads, `pg_restore
/// --disable-triggers`): the trigger is not current while it does not
/// fire, the next check enables it again (`ENABLE ALWAYS`), and a row
/// inserted after that is captured, under `session_replication_role =
/// replica` too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_postgres_table_and_a_disabled_trigger() {
    let Some(url) = common::postgres_database("capture_partitions").await else {
        return;
    };
    let w = sql_pool(&url).await;
    exec(
        &w,
        "CREATE TABLE users (id VARCHAR(32) NOT NULL, name VARCHAR(100) NOT NULL, \
         seq BIGINT NOT NULL, PRIMARY KEY (id)) PARTITION BY RANGE (id)",
    )
    .await;
    exec(
        &w,
        "CREATE TABLE users_u PARTITION OF users FOR VALUES FROM ('u') TO ('v')",
    )
    .await;
    exec(&w, "CREATE TABLE users_rest PARTITION OF users DEFAULT").await;
    exec(
        &w,
        "INSERT INTO users VALUES ('u000001', 'one', 1), ('x000001', 'x', 2)",
    )
    .await;
    let mut c = captured(&url, None, "capture-partitions");
    c.sql.outbox_gap_ms = 200;
    c.sql.outbox_retention_secs = 1;
    let a = TestServer::start(c, 0).await;
    assert_eq!(status(&a, "/api/users/u000001").await, 200);
    assert_eq!(status(&a, "/api/users/u777777").await, 404);

    // Inserts into both partitions, by another program.
    exec(
        &w,
        "INSERT INTO users VALUES ('u777777', 'later', 3), ('y777777', 'later', 4)",
    )
    .await;
    assert_eq!(
        entries(&w, "users", "u777777").await,
        1,
        "recorded under the table"
    );
    assert_eq!(
        entries(&w, "users", "y777777").await,
        1,
        "the default partition too"
    );
    on_every(&[&a], "/api/users/u777777", 200, 2).await;
    on_every(&[&a], "/api/users/y777777", 200, 2).await;

    let target = target_of("users");
    let store = a.state.skus.source();
    assert!(store.capture_state(&target).await.unwrap().is_current());
    // A fresh install fires for `session_replication_role = replica`
    // sessions too (ENABLE ALWAYS, on the partitions as well).
    let modes: Vec<String> = sqlx::query(
        "SELECT CAST(tgenabled AS TEXT) FROM pg_trigger \
         WHERE tgname LIKE 'bloomgate%' AND CAST(tgrelid::regclass AS TEXT) LIKE 'users%'",
    )
    .fetch_all(&w)
    .await
    .unwrap()
    .iter()
    .map(|r| r.get::<String, _>(0))
    .collect();
    assert_eq!(modes, ["A", "A", "A"], "the table and its two partitions");
    let mut tx = w.begin().await.unwrap();
    sqlx::query("SET LOCAL session_replication_role = replica")
        .execute(&mut *tx)
        .await
        .unwrap();
    sqlx::query("INSERT INTO users VALUES ('u666666', 'replica role', 6)")
        .execute(&mut *tx)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(entries(&w, "users", "u666666").await, 1);
    on_every(&[&a], "/api/users/u666666", 200, 2).await;
    on_every(&[&a], "/api/users/u555555", 404, 2).await;
    // Disabled, and a row inserted before the check finds it so (one
    // transaction): in no entry, so the filter is rebuilt once the
    // trigger fires again.
    let mut tx = w.begin().await.unwrap();
    for sql in [
        "ALTER TABLE users DISABLE TRIGGER ALL",
        "INSERT INTO users VALUES ('u555555', 'unrecorded', 7)",
    ] {
        sqlx::query(sql).execute(&mut *tx).await.unwrap();
    }
    tx.commit().await.unwrap();
    assert_eq!(entries(&w, "users", "u555555").await, 0);
    let state = store.capture_state(&target).await.unwrap();
    assert!(
        !state.is_current(),
        "a disabled trigger is not current: {state:?}"
    );
    assert_eq!(state.disabled.len(), 1, "{state:?}");
    // The next check (at each outbox trim; a retention of 1 s here)
    // enables it again.
    eventually(5, "the trigger enabled again", || async {
        store.capture_state(&target).await.unwrap().is_current()
    })
    .await;
    assert!(a.state.outbox.counters.capture_lost.load(Relaxed) >= 1);
    let mut tx = w.begin().await.unwrap();
    sqlx::query("SET LOCAL session_replication_role = replica")
        .execute(&mut *tx)
        .await
        .unwrap();
    sqlx::query("INSERT INTO users VALUES ('u888888', 'replica role', 5)")
        .execute(&mut *tx)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(
        entries(&w, "users", "u888888").await,
        1,
        "ENABLE ALWAYS fires for replicas too"
    );
    on_every(&[&a], "/api/users/u888888", 200, 2).await;
    on_every(&[&a], "/api/users/u555555", 200, 2).await;
    a.stop().await;
    w.close().await;
}

/// Two definitions of one table's capture (a rolling deploy that renames
/// the resource): each install keeps the other's triggers, so the two
/// never drop each other in turn; a strictly older version's trigger is
/// dropped at start (`drop_older`), never by the periodic check.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_definitions_do_not_fight_and_older_versions_go_at_start() {
    let (_dir, url, w) = sqlite_users().await;
    let a = TestServer::start(captured(&url, None, "capture-fight"), 0).await;
    let store = a.state.skus.source();
    let mine = target_of("users");
    let renamed = bloomgate_service::sql::CaptureTarget {
        resource: "members".into(),
        ..mine.clone()
    };
    assert!(store.install_capture(&renamed, true).await.unwrap());
    for drop_older in [false, true] {
        assert!(!store.install_capture(&mine, drop_older).await.unwrap());
        let state = store.capture_state(&mine).await.unwrap();
        assert!(state.is_current(), "{state:?}");
        assert_eq!(
            state.others.len(),
            3,
            "the other definition stays: {state:?}"
        );
        assert!(store.capture_state(&renamed).await.unwrap().is_current());
    }
    // A version-1 trigger of this table, as the previous release made it.
    exec(
        &w,
        "CREATE TRIGGER bloomgate_v1_0123abcd_i AFTER INSERT ON users BEGIN SELECT 1; END",
    )
    .await;
    let state = store.capture_state(&mine).await.unwrap();
    assert_eq!(state.stale, ["bloomgate_v1_0123abcd_i"], "{state:?}");
    assert!(
        state.is_current(),
        "older triggers beside do not make it stale"
    );
    assert!(!store.install_capture(&mine, false).await.unwrap());
    assert_eq!(
        store.capture_state(&mine).await.unwrap().stale.len(),
        1,
        "the periodic check keeps it"
    );
    assert!(
        store.install_capture(&mine, true).await.unwrap(),
        "dropped at start"
    );
    let state = store.capture_state(&mine).await.unwrap();
    assert!(state.stale.is_empty() && state.is_current(), "{state:?}");
    assert_eq!(state.others.len(), 3);
    a.stop().await;
    w.close().await;
}

/// A captured SKU table whose insert trigger a DBA dropped: until the
/// next check (a minute away by default) no trigger records the service's
/// own creates, so they must record their own entries, and another
/// instance learns a SKU created through A within its poll bound (it
/// answered 404 there until the check before).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_captured_sku_table_that_lost_its_trigger_still_shares_creates() {
    let (_dir, url, w) = sqlite_users().await;
    let a = TestServer::start(captured(&url, None, "capture-sku-lost"), 20).await;
    let b = TestServer::start(captured(&url, None, "capture-sku-lost"), 0).await;
    let target = target_of("skus");
    let store = a.state.skus.source();
    assert!(store.capture_state(&target).await.unwrap().is_current());
    for name in target.trigger_names(store.backend()) {
        exec(&w, &format!("DROP TRIGGER \"{name}\"")).await;
    }
    assert_eq!(status(&b, "/api/seckill/500001").await, 404);
    assert_eq!(a.create(500_001, "made on A").await, 201);
    // Without Redis: the next poll (100 ms), with a margin.
    on_every(&[&a, &b], "/api/seckill/500001", 200, 2).await;
    a.stop().await;
    b.stop().await;
    w.close().await;
}

/// The outbox's largest seq (SQLite).
async fn outbox_end(w: &sqlx::AnyPool) -> i64 {
    sqlx::query("SELECT MAX(seq) FROM bloomgate_changes")
        .fetch_one(w)
        .await
        .unwrap()
        .get(0)
}

/// The outbox as a restore to `seq` leaves it (SQLite): the entries after
/// it gone, and the sequence where it was then, so writes after the
/// restore take those numbers again.
async fn restore_outbox_to(w: &sqlx::AnyPool, seq: i64) {
    exec(
        w,
        &format!("DELETE FROM bloomgate_changes WHERE seq > {seq}"),
    )
    .await;
    exec(
        w,
        &format!("UPDATE sqlite_sequence SET seq = {seq} WHERE name = 'bloomgate_changes'"),
    )
    .await;
}

/// The database restored to an earlier point (a point-in-time restore, a
/// failover to a lagging replica): the outbox's numbers go back below the
/// follower's position and new writes take them again. Reading on from the
/// position would never see them (404 until some rebuild); the follower
/// notices (the entry at its position gone with nothing after it, or
/// another entry under its number), rebuilds and goes on from the
/// outbox's end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outbox_restored_to_an_earlier_point_is_noticed() {
    let (_dir, url, w) = sqlite_users().await;
    let a = TestServer::start(captured(&url, None, "capture-rewound"), 0).await;
    exec(&w, "INSERT INTO users VALUES ('u910001', 'before', 1)").await;
    on_every(&[&a], "/api/users/u910001", 200, 2).await;
    let restored_to = outbox_end(&w).await;
    for id in ["u910002", "u910003", "u910004"] {
        exec(&w, &format!("INSERT INTO users VALUES ('{id}', 'lost', 1)")).await;
    }
    on_every(&[&a], "/api/users/u910004", 200, 2).await;
    // The restore: the rows and entries written after `restored_to` are
    // gone, and the sequence is where it was then.
    exec(&w, "DELETE FROM users WHERE name = 'lost'").await;
    restore_outbox_to(&w, restored_to).await;
    // Writes after the restore take the numbers again.
    let rows: Vec<String> = (1..=5)
        .map(|i| format!("('u92000{i}', 'after the restore', 1)"))
        .collect();
    exec(&w, &format!("INSERT INTO users VALUES {}", rows.join(", "))).await;
    for i in 1..=5 {
        // The next poll (100 ms) notices, then a rebuild of 25 rows.
        on_every(&[&a], &format!("/api/users/u92000{i}"), 200, 3).await;
    }
    assert!(a.state.outbox.counters.rewound.load(Relaxed) >= 1);
    // And it follows the restored outbox from there.
    exec(&w, "INSERT INTO users VALUES ('u930001', 'later', 1)").await;
    on_every(&[&a], "/api/users/u930001", 200, 2).await;
    a.stop().await;
    w.close().await;
}

/// A rebuild request read from the outbox before a restore belongs to the
/// history the restore undid: its number is given again to the restored
/// database's next writes. The follower's noted request is brought down
/// to the restored outbox's end when it notices. Before, it stayed at the
/// undone number, so every filter shared afterwards (which covers only the
/// restored numbers) was refused as not covering it, and this instance
/// scanned instead of adopting, until the new history passed that number.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_drops_the_rebuild_requests_of_the_history_it_undid() {
    use bloomgate_service::shield::ChangeLog;
    let (_dir, url, w) = sqlite_users().await;
    let mut c = captured(&url, None, "capture-rewound-requests");
    c.sql.outbox_gap_ms = 200;
    let a = TestServer::start(c.clone(), 0).await;
    // B checks the capture each second; A applies what B records.
    let mut checks = c;
    checks.sql.outbox_retention_secs = 1;
    let b = TestServer::start(checks, 0).await;
    exec(&w, "INSERT INTO users VALUES ('u940001', 'before', 1)").await;
    on_every(&[&a, &b], "/api/users/u940001", 200, 2).await;
    let restored_to = outbox_end(&w).await;
    let requested = || a.state.outbox.rebuild_requested("users");
    assert!(requested() <= restored_to);
    // A gap B closes: its rebuild entry, numbered past `restored_to`.
    gap_insert(&w, &a, "u940002").await;
    eventually(5, "A applied B's rebuild entry", || async {
        requested() > restored_to
    })
    .await;
    on_every(&[&a, &b], "/api/users/u940002", 200, 4).await;
    // The restore to `restored_to`.
    exec(&w, "DELETE FROM users WHERE id = 'u940002'").await;
    restore_outbox_to(&w, restored_to).await;
    eventually(3, "A noticed the restore", || async {
        a.state.outbox.counters.rewound.load(Relaxed) >= 1
    })
    .await;
    assert!(
        requested() <= restored_to,
        "the request {} was in the undone history (the outbox ends at {restored_to})",
        requested()
    );
    a.stop().await;
    b.stop().await;
    w.close().await;
}

/// The current schema is written into the capture function's body
/// (quoted text): one that is not a plain identifier is refused with a
/// message, never spliced in (issue 44's smaller holes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schema_name_that_is_no_identifier_is_refused() {
    let Some(url) = common::postgres_database("odd_schema").await else {
        return;
    };
    let admin = sql_pool(&url).await;
    exec(&admin, r#"CREATE SCHEMA "a$$b""#).await;
    exec(
        &admin,
        r#"ALTER DATABASE bg_odd_schema SET search_path TO "a$$b""#,
    )
    .await;
    admin.close().await;
    let store = bloomgate_service::sql::Database::connect(&url)
        .await
        .unwrap();
    let e = store.outbox_for_triggers().await.unwrap_err();
    assert!(e.to_string().contains("is not a plain identifier"), "{e}");
    store.close().await;
    // A plain one is named, quoted.
    let plain = common::postgres_database("plain_schema").await.unwrap();
    let store = bloomgate_service::sql::Database::connect(&plain)
        .await
        .unwrap();
    assert_eq!(
        store.outbox_for_triggers().await.unwrap(),
        "\"public\".bloomgate_changes"
    );
    store.close().await;
}

/// MariaDB: the TRIGGER right held through a schema pattern or a default
/// role counts (the `information_schema` views miss both, and refused a
/// service that held the right); none at all is still refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trigger_right_through_a_role_or_a_schema_pattern_counts_mariadb() {
    let Some(admin_url) = common::mysql_database("capture_rights").await else {
        return;
    };
    let admin = sql_pool(&admin_url).await;
    users_table(&admin).await;
    let db = admin_url.rsplit('/').next().unwrap().to_owned();
    let pattern = format!("{}%", db.replace('_', "\\_").trim_end_matches("rights"));
    let cases = [
        ("bg_rights_none", vec![]),
        (
            "bg_rights_pattern",
            vec![format!(
                "GRANT TRIGGER ON `{pattern}`.* TO 'bg_rights_pattern'@'%'"
            )],
        ),
        (
            "bg_rights_role",
            vec![
                "DROP ROLE IF EXISTS bg_rights_r".to_string(),
                "CREATE ROLE bg_rights_r".to_string(),
                format!("GRANT TRIGGER ON `{db}`.* TO bg_rights_r"),
                "GRANT bg_rights_r TO 'bg_rights_role'@'%'".to_string(),
                "SET DEFAULT ROLE bg_rights_r FOR 'bg_rights_role'@'%'".to_string(),
            ],
        ),
    ];
    for (user, grants) in &cases {
        exec(&admin, &format!("DROP USER IF EXISTS '{user}'@'%'")).await;
        exec(
            &admin,
            &format!("CREATE USER '{user}'@'%' IDENTIFIED BY 'np'"),
        )
        .await;
        exec(&admin, &format!("GRANT SELECT ON `{db}`.* TO '{user}'@'%'")).await;
        for g in grants {
            exec(&admin, g).await;
        }
        let store = bloomgate_service::sql::Database::connect_unmigrated(
            &common::as_user(&admin_url, &format!("{user}:np")),
            &bloomgate_service::config::SqlConfig::default(),
        )
        .await
        .unwrap();
        let may = store.may_create_triggers("users").await.unwrap();
        assert_eq!(may, !grants.is_empty(), "{user}");
        store.close().await;
        exec(&admin, &format!("DROP USER '{user}'@'%'")).await;
    }
    exec(&admin, "DROP ROLE bg_rights_r").await;
    admin.close().await;
}

/// Capture on a table and key column whose names are a reserved word in
/// mixed case (`Order`, `Select`), quoted as each database quotes: the
/// triggers install, and another program's insert, update and delete
/// reach the instance.
async fn reserved_names(url: &str, label: &str) {
    let w = sql_pool(url).await;
    let q = if url.starts_with("mysql") { '`' } else { '"' };
    exec(
        &w,
        &format!(
            "CREATE TABLE {q}Order{q} ({q}Select{q} VARCHAR(32) NOT NULL PRIMARY KEY, {q}Group{q} VARCHAR(100) NOT NULL)"
        ),
    )
    .await;
    exec(
        &w,
        &format!("INSERT INTO {q}Order{q} VALUES ('o1', 'first')"),
    )
    .await;
    let mut c = common::config(url, None, &format!("capture-reserved-{label}"));
    c.demo = Some(false);
    let mut orders = common::users_resource("orders");
    orders.table = "Order".into();
    orders.key = "Select".into();
    orders.capture = Capture::Triggers;
    c.resources = vec![orders];
    let s = TestServer::start(c, 0).await;
    assert_eq!(status(&s, "/api/orders/o1").await, 200, "{label}");
    assert_eq!(status(&s, "/api/orders/o2").await, 404, "{label}");
    exec(
        &w,
        &format!("INSERT INTO {q}Order{q} VALUES ('o2', 'second')"),
    )
    .await;
    on_every(&[&s], "/api/orders/o2", 200, BOUND).await;
    exec(
        &w,
        &format!("UPDATE {q}Order{q} SET {q}Group{q} = 'renamed' WHERE {q}Select{q} = 'o1'"),
    )
    .await;
    eventually(BOUND, "the update is served", || async {
        s.get("/api/orders/o1").await.1["Group"] == "renamed"
    })
    .await;
    exec(
        &w,
        &format!("DELETE FROM {q}Order{q} WHERE {q}Select{q} = 'o2'"),
    )
    .await;
    on_every(&[&s], "/api/orders/o2", 404, BOUND).await;
    s.stop().await;
    w.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reserved_mixed_case_names_are_captured_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    reserved_names(&common::sqlite_url(&dir), "sqlite").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reserved_mixed_case_names_are_captured_mariadb() {
    let Some(url) = common::mysql_database("capture_reserved").await else {
        return;
    };
    reserved_names(&url, "mariadb").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reserved_mixed_case_names_are_captured_postgres() {
    let Some(url) = common::postgres_database("capture_reserved").await else {
        return;
    };
    reserved_names(&url, "postgres").await;
}
