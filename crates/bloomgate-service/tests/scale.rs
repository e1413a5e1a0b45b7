//! Large tables (issue 32), at CI scale: no full `COUNT(*)` on the way to
//! start-up or readiness, background statements under their own timeout,
//! a failed scan page read again, `/readyz` and a rebuild's progress.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use bloomgate_service::key::{Key, KeyType};
use bloomgate_service::shield::{Shield, ShieldConfig, Verdict};
use bloomgate_service::source::{Row, ScanOf, Source};
use bloomgate_service::sql::StoreError;
use common::{counter, TestServer};
use reqwest::Method;

async fn exec(url: &str, statements: &[String]) {
    sqlx::any::install_default_drivers();
    let url = if url.starts_with("sqlite") {
        format!("{url}?mode=rwc")
    } else {
        url.to_owned()
    };
    let pool = sqlx::AnyPool::connect(&url).await.unwrap();
    for s in statements {
        sqlx::query(s).execute(&pool).await.unwrap();
    }
    pool.close().await;
}

/// A `users` table of `rows` text keys.
async fn users_table(url: &str, rows: usize) {
    let values: Vec<String> = (1..=rows)
        .map(|i| format!("('u{i:06}', 'user {i}')"))
        .collect();
    exec(
        url,
        &[
            "CREATE TABLE users (id VARCHAR(32) NOT NULL PRIMARY KEY, name VARCHAR(100) NOT NULL)"
                .into(),
            format!("INSERT INTO users VALUES {}", values.join(", ")),
        ],
    )
    .await;
}

/// A gate of its own over `keys` (blocked layout, no auto-rebuild), its
/// scans in pages of 100 keys.
fn gate_over(
    keys: Arc<dyn bloomgate_service::source::KeyScan>,
    expected: u64,
    fpp: f64,
) -> Arc<Shield> {
    let gate = Arc::new(Shield::new(
        ShieldConfig {
            enabled: true,
            layout: bloomgate_service::config::BloomLayout::Blocked,
            expected,
            fpp,
            auto_rebuild: false,
            scan_rows_per_sec: 0,
        },
        keys,
    ));
    gate.page_rows.store(100, Ordering::Relaxed);
    gate
}

async fn ready(s: &TestServer) -> (u16, serde_json::Value) {
    s.get("/readyz").await
}

/// Start-up (seeding an empty table), readiness and a rebuild asked for by
/// a warm send no full `COUNT(*)`: emptiness is a `LIMIT 1`, the filter is
/// sized from the database's statistics, the rebuild counts what it scans.
async fn no_full_count(url: &str) {
    users_table(url, 300).await;
    let mut c = common::config(url, None, "scale-count");
    c.resources.push(common::users_resource("users"));
    let s = TestServer::start(c, 2_000).await;
    common::eventually(10, "ready", || async { ready(&s).await.0 == 200 }).await;
    for warm in ["/api/cache/warm", "/api/users/warm"] {
        let (status, body) = s
            .send(
                Method::POST,
                warm,
                Some(r#"{"limit":10,"rebuild_bloom":true}"#),
            )
            .await;
        assert_eq!(status, 200, "{warm}: {body}");
    }
    let stats = s.stats().await;
    assert_eq!(counter(&stats, &["sql", "full_counts"]), 0, "{stats}");
    assert_eq!(counter(&stats, &["bloom", "rebuilds"]), 2, "{stats}");
    assert_eq!(counter(&stats, &["bloom", "added"]), 2_000, "{stats}");
    assert_eq!(
        counter(&stats, &["resources", "users", "filter", "added"]),
        300,
        "{stats}"
    );
    assert_eq!(
        counter(&stats, &["bloom", "rebuild_scanned"]),
        2_000,
        "{stats}"
    );
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sqlite_starts_and_rebuilds_without_a_full_count() {
    let dir = tempfile::tempdir().unwrap();
    no_full_count(&common::sqlite_url(&dir)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mariadb_starts_and_rebuilds_without_a_full_count() {
    let Some(url) = common::mysql_database("bg_scale_count").await else {
        return;
    };
    no_full_count(&url).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_starts_and_rebuilds_without_a_full_count() {
    let Some(url) = common::postgres_database("bg_scale_count").await else {
        return;
    };
    no_full_count(&url).await;
}

/// Another program holds the SKU table locked for longer than the read
/// path's statement timeout while an instance starts: start-up waits for
/// it under the background timeout instead of failing, and is ready after.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_background_statement_past_the_read_timeout_does_not_stop_start_up() {
    let Some(url) = common::postgres_database("bg_scale_slow").await else {
        return;
    };
    // The schema first (an instance migrates), then an empty table to
    // seed, locked by a transaction of another program.
    let mut c = common::config(&url, None, "scale-slow");
    c.sql.statement_timeout_ms = 200;
    c.sql.background_statement_timeout_ms = 20_000;
    TestServer::start(c.clone(), 0).await.stop().await;
    let mut locker = sqlx::PgConnection::connect(&url).await.unwrap();
    use sqlx::Connection;
    sqlx::query("BEGIN").execute(&mut locker).await.unwrap();
    sqlx::query("LOCK TABLE skus IN ACCESS EXCLUSIVE MODE")
        .execute(&mut locker)
        .await
        .unwrap();
    let release = tokio::spawn(async move {
        tokio::time::sleep(std::time::Duration::from_millis(1_000)).await;
        sqlx::query("COMMIT").execute(&mut locker).await.unwrap();
    });
    let started = std::time::Instant::now();
    let s = TestServer::start(c, 500).await;
    assert!(
        started.elapsed() >= std::time::Duration::from_millis(800),
        "start-up waited for the lock"
    );
    release.await.unwrap();
    let (status, body) = ready(&s).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(counter(&s.stats().await, &["bloom", "added"]), 500);
    s.stop().await;
}

/// A source whose second page fails once.
#[derive(Debug, Default)]
struct Flaky {
    failed: AtomicBool,
}

impl Source for Flaky {
    fn key_type(&self) -> KeyType {
        KeyType::Text
    }
    async fn load(&self, _key: &Key) -> Result<Option<Row>, StoreError> {
        Ok(None)
    }
    async fn scan(&self, after: Option<&Key>, limit: usize) -> Result<Vec<Key>, StoreError> {
        if after.is_some() && !self.failed.swap(true, Ordering::SeqCst) {
            return Err(StoreError::new("scan", "connection reset (once)"));
        }
        let after = after.map(ToString::to_string).unwrap_or_default();
        Ok((1..=1_000)
            .map(|i| format!("k{i:05}"))
            .filter(|k| *k > after)
            .take(limit)
            .map(Key::Text)
            .collect())
    }
    async fn count(&self) -> Result<u64, StoreError> {
        Ok(1_000)
    }
}

#[tokio::test]
async fn a_failed_page_is_read_again_and_the_rebuild_succeeds() {
    let source = Arc::new(Flaky::default());
    let gate = gate_over(Arc::new(ScanOf(source.clone())), 1_000, 0.01);
    let report = gate.rebuild().await.expect("the retried page succeeds");
    assert!(source.failed.load(Ordering::SeqCst), "a page did fail");
    assert_eq!(report.added, 1_000);
    let stats = gate.stats();
    assert_eq!((stats.rebuild_page_retries, stats.rebuild_failures), (1, 0));
    for i in 1..=1_000 {
        let k = Key::Text(format!("k{i:05}"));
        assert_eq!(gate.check(&k), Verdict::Pass, "{k}");
    }
}

/// `/readyz`: 503 while the start-up filter is being scanned (held at its
/// third page: the progress shows 300 keys of 1,000, and moves on to all
/// of them once let go), 200 after; 503 again while the instance is out
/// of step with the change feed, 200 once it reads it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn readyz_waits_for_the_filter_and_the_change_feed() {
    let dir = tempfile::tempdir().unwrap();
    let url = common::sqlite_url(&dir);
    let mut c = common::config(&url, None, "scale-ready");
    c.sql.scan_parallel = 1;
    c.sql.outbox_poll_ms = 50;
    c.sql.out_of_step_ms = 300;
    c.cache.bloom_build_on_start = false;
    let s = TestServer::start(c, 1_000).await;
    let (status, body) = ready(&s).await;
    assert_eq!(
        (status, &body["resources"]["skus"]["state"]),
        (200, &"not_built".into()),
        "bloom_build_on_start = false: ready, by choice: {body}"
    );
    let gate = Arc::clone(s.state.skus.shield());
    gate.page_rows.store(100, Ordering::Relaxed);
    let held = gate.scan_page.arm(3);
    let ticket = gate.request_rebuild();
    held.reached().await;
    let (status, body) = ready(&s).await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["error"], "not_ready");
    let skus = &body["resources"]["skus"];
    assert_eq!(skus["state"], "building", "{body}");
    assert_eq!(skus["progress"]["scanned"], 300, "{body}");
    assert_eq!(skus["progress"]["estimated_total"], 1_000, "{body}");
    let stats = s.stats().await;
    assert_eq!(counter(&stats, &["bloom", "rebuild_scanned"]), 300);
    assert!(stats["bloom"]["rebuilding"].as_bool().unwrap());
    held.resume();
    ticket.wait().await.unwrap();
    let (status, body) = ready(&s).await;
    assert_eq!((status, &body["ready"]), (200, &true.into()), "{body}");
    assert_eq!(
        counter(&s.stats().await, &["bloom", "rebuild_scanned"]),
        1_000
    );
    // Out of step: the outbox follower is held.
    let quiet = common::quiet_sql(&s).await;
    common::eventually(5, "out of step", || async {
        let (status, body) = ready(&s).await;
        status == 503 && body["resources"]["skus"]["state"] == "out_of_step"
    })
    .await;
    quiet.resume();
    common::eventually(5, "back in step", || async { ready(&s).await.0 == 200 }).await;
    // Liveness asks none of this.
    assert_eq!(s.get("/healthz").await.0, 200);
    s.stop().await;
}

/// Text keys in mixed case and beyond ASCII, read by two readers: cut at
/// PostgreSQL's quantiles after an `ANALYZE`, or meeting in the middle
/// (MariaDB, whose collation ignores case; PostgreSQL before statistics).
/// Every key reaches the filter whatever order the database sorts them in.
async fn two_readers(url: &str, analyze: bool, expect_meeting: bool) {
    let keys: Vec<String> = (0..2_345)
        .map(|i| match i % 3 {
            0 => format!("u{i:05}"),
            1 => format!("U{i:05}x"),
            _ => format!("ü{i:05}"),
        })
        .collect();
    let values: Vec<String> = keys.iter().map(|k| format!("('{k}', 'n')")).collect();
    let mut ddl = vec![
        "CREATE TABLE users (id VARCHAR(32) NOT NULL PRIMARY KEY, name VARCHAR(100) NOT NULL)"
            .to_string(),
        format!("INSERT INTO users VALUES {}", values.join(", ")),
    ];
    if analyze {
        ddl.push("ANALYZE users".into());
    }
    exec(url, &ddl).await;
    let s = TestServer::start(common::config(url, None, "scale-readers"), 0).await;
    let table = bloomgate_service::sql::table::SqlTable::open(
        s.state.skus.source(),
        &common::users_resource("users"),
        0,
    )
    .await
    .unwrap()
    .unwrap();
    // The filter holds keys folded as the column compares.
    let fold = bloomgate_service::source::DynSource::fold(&table);
    let scan = ScanOf(Arc::new(table));
    let ranges = bloomgate_service::source::KeyScan::ranges(&scan)
        .await
        .unwrap();
    assert_eq!(ranges.len(), 2, "{ranges:?}");
    assert_eq!(ranges[1].descending, expect_meeting, "{ranges:?}");
    let gate = gate_over(Arc::new(scan), 3_000, 0.001);
    let report = gate.rebuild().await.unwrap();
    assert!(report.added >= keys.len() as u64, "{report:?}");
    // Overlap is at most a page or so per reader.
    assert!(report.added <= keys.len() as u64 + 200, "{report:?}");
    for k in &keys {
        let key = fold.apply(Key::Text(k.clone()));
        assert_eq!(gate.check(key), Verdict::Pass, "{k}");
    }
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mariadb_text_keys_meet_in_the_middle() {
    let Some(url) = common::mysql_database("bg_scale_readers").await else {
        return;
    };
    two_readers(&url, false, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_text_keys_meet_in_the_middle_before_statistics() {
    let Some(url) = common::postgres_database("bg_scale_readers").await else {
        return;
    };
    two_readers(&url, false, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_text_keys_cut_at_quantiles_after_analyze() {
    let Some(url) = common::postgres_database("bg_scale_quantiles").await else {
        return;
    };
    two_readers(&url, true, false).await;
}

/// An integer key of a narrow MySQL type (MEDIUMINT, which sqlx's `Any`
/// driver does not decode) is still cut into ranges and read whole; a row
/// whose text key is NULL is skipped, not a failed page.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mariadb_narrow_integer_keys_and_null_text_keys() {
    let Some(url) = common::mysql_database("bg_scale_narrow").await else {
        return;
    };
    let values: Vec<String> = (1..=500).map(|i| format!("({i}, 'n{i}')")).collect();
    exec(
        &url,
        &[
            "CREATE TABLE items (id MEDIUMINT NOT NULL PRIMARY KEY, name VARCHAR(32))".into(),
            format!("INSERT INTO items VALUES {}", values.join(", ")),
            "CREATE TABLE users (id VARCHAR(32) NULL UNIQUE, name VARCHAR(100) NOT NULL)".into(),
            "INSERT INTO users VALUES ('a', 'n'), (NULL, 'no key'), ('b', 'n')".into(),
        ],
    )
    .await;
    let s = TestServer::start(common::config(&url, None, "scale-narrow"), 0).await;
    let store = s.state.skus.source();
    let items = bloomgate_service::config::resources::ResourceConfig {
        table: "items".into(),
        key_type: KeyType::Int,
        ..common::users_resource("items")
    };
    for (config, keys) in [
        (items, (1..=500).map(Key::Int).collect::<Vec<_>>()),
        (
            common::users_resource("users"),
            vec![Key::Text("a".into()), Key::Text("b".into())],
        ),
    ] {
        let table = bloomgate_service::sql::table::SqlTable::open(store, &config, 0)
            .await
            .unwrap()
            .unwrap();
        let scan = ScanOf(Arc::new(table));
        let ranges = bloomgate_service::source::KeyScan::ranges(&scan)
            .await
            .unwrap();
        assert_eq!(ranges.len(), 2, "{ranges:?}");
        let gate = gate_over(Arc::new(scan), 1_000, 0.001);
        let report = gate.rebuild().await.unwrap();
        assert_eq!(report.added, keys.len() as u64, "{report:?}");
        for k in keys {
            assert_eq!(gate.check(&k), Verdict::Pass, "{k}");
        }
    }
    s.stop().await;
}

/// A table twenty times `bloom_expected` is sized from the database's
/// estimate on its first scan (it was capped at 4 x `bloom_expected`, and
/// the filter stopped little until the capacity alarm's second scan):
/// what was sized is read off the gate, not the service's counters.
async fn sized_from_the_estimate(url: &str, analyze: &str) {
    users_table(url, 20_000).await;
    if !analyze.is_empty() {
        exec(url, &[analyze.to_owned()]).await;
    }
    let mut c = common::config(url, None, "scale-sizing");
    c.resources.push(common::users_resource("users"));
    let s = TestServer::start(c, 0).await;
    common::eventually(10, "ready", || async { ready(&s).await.0 == 200 }).await;
    let gate = s.state.resources[0].shield();
    assert!(gate.capacity() >= 20_000, "sized for {}", gate.capacity());
    let stats = s.stats().await;
    assert_eq!(
        counter(&stats, &["resources", "users", "filter", "rebuilds"]),
        1,
        "{stats}"
    );
    // The filter answers at its target: of 2,000 absent keys, about 20 pass.
    let passed = (0..2_000)
        .filter(|i| gate.check(Key::Text(format!("absent-{i}"))) == Verdict::Pass)
        .count();
    assert!(passed < 80, "{passed} of 2,000 absent keys passed");
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_sizes_from_its_estimate() {
    let dir = tempfile::tempdir().unwrap();
    sized_from_the_estimate(&common::sqlite_url(&dir), "").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_sizes_from_its_estimate() {
    let Some(url) = common::mysql_database("bg_scale_sizing").await else {
        return;
    };
    sized_from_the_estimate(&url, "ANALYZE TABLE users").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_sizes_from_its_estimate() {
    let Some(url) = common::postgres_database("bg_scale_sizing").await else {
        return;
    };
    sized_from_the_estimate(&url, "ANALYZE users").await;
}

/// A source whose estimate is far below what it holds (a stale statistic),
/// and whose scans after the first wait to be let go.
#[derive(Debug)]
struct Underestimated {
    scans: std::sync::atomic::AtomicU64,
    go: tokio::sync::Semaphore,
}

impl Source for Underestimated {
    fn key_type(&self) -> KeyType {
        KeyType::Text
    }
    async fn load(&self, _key: &Key) -> Result<Option<Row>, StoreError> {
        Ok(None)
    }
    async fn scan(&self, after: Option<&Key>, limit: usize) -> Result<Vec<Key>, StoreError> {
        if after.is_none() && self.scans.fetch_add(1, Ordering::SeqCst) > 0 {
            self.go.acquire().await.unwrap().forget();
        }
        let after = after.map(ToString::to_string).unwrap_or_default();
        Ok((1..=5_000)
            .map(|i| format!("k{i:05}"))
            .filter(|k| *k > after)
            .take(limit)
            .map(Key::Text)
            .collect())
    }
    async fn count(&self) -> Result<u64, StoreError> {
        Ok(5_000)
    }
    async fn estimate(&self) -> Result<Option<u64>, StoreError> {
        Ok(Some(10))
    }
}

/// A scan that finds fifty times the filter's size publishes the filter
/// (its "no" is exact) and at once asks for a rebuild sized for what it
/// found; until that is done the gate is not ready (`resizing`).
#[tokio::test]
async fn a_filter_found_past_its_size_is_resized_at_once_and_not_ready_meanwhile() {
    let source = Arc::new(Underestimated {
        scans: 0.into(),
        go: tokio::sync::Semaphore::new(0),
    });
    let gate = Arc::new(Shield::new(
        ShieldConfig {
            enabled: true,
            layout: bloomgate_service::config::BloomLayout::Blocked,
            expected: 100,
            fpp: 0.01,
            auto_rebuild: true,
            scan_rows_per_sec: 0,
        },
        Arc::new(ScanOf(source.clone())),
    ));
    let report = gate.rebuild().await.unwrap();
    assert_eq!(report.added, 5_000);
    assert!(gate.capacity() < 5_000);
    let (ready, body) = gate.readiness(true);
    assert!(!ready, "{body}");
    assert_eq!(body["state"], "resizing", "{body}");
    for i in 1..=5_000 {
        assert_eq!(gate.check(Key::Text(format!("k{i:05}"))), Verdict::Pass);
    }
    source.go.add_permits(1);
    common::eventually(10, "the resize is done", || async {
        gate.readiness(true).0
    })
    .await;
    assert!(gate.capacity() >= 5_000, "{}", gate.capacity());
    assert_eq!(source.scans.load(Ordering::SeqCst), 2);
}

/// `cache.bloom_scan_rows_per_sec` holds a start-up scan to its rate over
/// both readers (3,000 keys at 1,000 a second take 3 s at least, where
/// SQLite alone reads them in milliseconds), the progress shows the limit
/// and the wait, and every key is in the filter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scan_rate_limit_holds_the_scan_to_its_rate() {
    let dir = tempfile::tempdir().unwrap();
    let url = common::sqlite_url(&dir);
    users_table(&url, 3_000).await;
    let mut c = common::config(&url, None, "scale-rate");
    c.demo = None;
    c.resources.push(common::users_resource("users"));
    c.cache.bloom_scan_rows_per_sec = 1_000;
    let started = std::time::Instant::now();
    let s = TestServer::start(c, 0).await;
    common::eventually(15, "built", || async { ready(&s).await.0 == 200 }).await;
    assert!(
        started.elapsed() >= std::time::Duration::from_millis(2_900),
        "{:?}",
        started.elapsed()
    );
    let stats = s.stats().await;
    let filter = &stats["resources"]["users"]["filter"];
    assert_eq!(filter["rebuild_scanned"], 3_000, "{filter}");
    assert_eq!(filter["rebuild_rows_per_sec_limit"], 1_000, "{filter}");
    let rate = filter["rebuild_rows_per_sec"].as_f64().unwrap();
    assert!(rate > 0.0 && rate <= 1_010.0, "{filter}");
    assert!(
        filter["rebuild_throttled_ms"].as_u64() > Some(1_000),
        "{filter}"
    );
    for i in [1, 1_500, 3_000] {
        assert_eq!(s.get(&format!("/api/users/u{i:06}")).await.0, 200);
    }
    assert_eq!(s.get("/api/users/u999999").await.0, 404);
    s.stop().await;
}

/// The same limit holds the shared filter's fill (`strict` mode, a new
/// filter filled from SQL at start, a page at a time): with the start-up
/// build after it, 2,000 keys at 1,000 a second take 4 s at least (2 s
/// without the fill's limit), and both filters hold every key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scan_rate_limit_holds_the_shared_filters_fill() {
    let Some(redis) = common::redis_url().await else {
        return;
    };
    let prefix = "scale-rate-shared";
    common::redis_clear(&redis, &format!("bgtest:{prefix}:")).await;
    let dir = tempfile::tempdir().unwrap();
    let url = common::sqlite_url(&dir);
    users_table(&url, 2_000).await;
    let mut c = common::config(&url, Some(&redis), prefix);
    c.demo = None;
    let mut users = common::users_resource("users");
    users.bloom_mode = Some(bloomgate_service::config::BloomMode::Strict);
    c.resources.push(users);
    c.cache.bloom_scan_rows_per_sec = 1_000;
    let started = std::time::Instant::now();
    let s = TestServer::start(c, 0).await;
    common::eventually(15, "built", || async { ready(&s).await.0 == 200 }).await;
    assert!(
        started.elapsed() >= std::time::Duration::from_millis(3_800),
        "{:?}",
        started.elapsed()
    );
    for i in [1, 1_000, 2_000] {
        assert_eq!(s.get(&format!("/api/users/u{i:06}")).await.0, 200);
    }
    assert_eq!(s.get("/api/users/u999999").await.0, 404);
    s.stop().await;
}

async fn run(pool: &sqlx::AnyPool, q: &str) {
    sqlx::query(q)
        .execute(pool)
        .await
        .unwrap_or_else(|e| panic!("{q}: {e}"));
}

/// A `users` table of 1,000 keys on `primary`, once `replica` has it.
async fn users_replicated(primary: &sqlx::AnyPool, replica: &sqlx::AnyPool) {
    let ids: Vec<String> = (1..=1_000).map(|i| format!("u{i:06}")).collect();
    let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
    common::users_table(primary, &ids).await;
    common::eventually(20, "the replica has the table", || async {
        sqlx::query_scalar::<_, i64>("SELECT COUNT(*) FROM users")
            .fetch_one(replica)
            .await
            .is_ok_and(|n| n == 1_000)
    })
    .await;
}

/// A service guarding `users` on `primary` whose scans read `replica`,
/// which is held behind: after 1.5 s it is still building (not ready),
/// and fails open for the row the replica lacks.
async fn waiting_for(primary: &str, replica: &str, prefix: &str) -> TestServer {
    let mut c = common::config(primary, None, prefix);
    c.demo = None;
    c.scan_database_url = Some(replica.into());
    c.resources.push(common::users_resource("users"));
    let s = TestServer::start(c, 0).await;
    tokio::time::sleep(std::time::Duration::from_millis(1_500)).await;
    let (status, body) = ready(&s).await;
    assert_eq!(status, 503, "waiting for the replica: {body}");
    assert_eq!(body["resources"]["users"]["state"], "building", "{body}");
    assert_eq!(
        s.get("/api/users/u_late").await.0,
        200,
        "fail open meanwhile"
    );
    s
}

/// Once the replica caught up: ready, and `exists` of `keys` answers
/// `want` (the late row in the filter).
async fn built_with(s: &TestServer, keys: &str, want: &[bool]) {
    common::eventually(20, "built from the replica", || async {
        ready(s).await.0 == 200
    })
    .await;
    let (status, body) = s.send(Method::POST, "/api/users/exists", Some(keys)).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body["exists"],
        serde_json::json!(want),
        "the late row (and a replica's own) in the filter"
    );
}

/// `scan_database_url`: a MariaDB primary and its replica, both servers
/// of the test. The replica's SQL thread is stopped, so a row committed on
/// the primary has not reached it: the start-up scan waits (not ready)
/// instead of scanning without that row, which would refuse it with a
/// 404. Once the replica applies it, the scan reads the replica (a row
/// written there alone is in the filter) and the late row is found.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scan_of_a_replica_waits_until_it_has_caught_up_mariadb() {
    if common::mysql_database("replica_probe").await.is_none() {
        return;
    }
    let primary =
        common::OwnServer::mariadb_with(&["--log-bin=bin".into(), "--server-id=1".into()]).await;
    let replica = common::OwnServer::mariadb_with(&["--server-id=2".into()]).await;
    let p = common::sql_pool(&primary.url()).await;
    let r = common::sql_pool(&replica.url()).await;
    run(
        &r,
        &format!(
            "CHANGE MASTER TO MASTER_HOST='127.0.0.1', MASTER_PORT={}, MASTER_USER='root', MASTER_PASSWORD='', MASTER_USE_GTID=slave_pos",
            primary.port
        ),
    )
    .await;
    run(&r, "START SLAVE").await;
    users_replicated(&p, &r).await;
    run(&r, "STOP SLAVE SQL_THREAD").await;
    run(&p, "INSERT INTO users (id, name) VALUES ('u_late', 'late')").await;
    run(&r, "INSERT INTO users (id, name) VALUES ('u_replica', 'r')").await;
    let s = waiting_for(&primary.url(), &replica.url(), "scale-replica").await;
    run(&r, "START SLAVE SQL_THREAD").await;
    built_with(
        &s,
        r#"{"keys":["u_late","u_replica","u000500","u_nobody"]}"#,
        &[true, true, true, false],
    )
    .await;
    assert_eq!(s.get("/api/users/u_late").await.0, 200);
    s.stop().await;
    p.close().await;
    r.close().await;
}

/// A primary that reports no GTID position (here the machine's MariaDB,
/// without a binary log) cannot vouch for any replica: the wait for the
/// empty position would pass at once, so the scan never starts (still
/// building, failing open) instead of reading a replica of unknown lag.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scan_replica_of_a_primary_without_gtids_is_never_scanned() {
    let Some(url) = common::mysql_database("replica_no_gtid").await else {
        return;
    };
    let p = common::sql_pool(&url).await;
    let log_bin: i64 = sqlx::query_scalar("SELECT @@log_bin")
        .fetch_one(&p)
        .await
        .unwrap();
    assert_eq!(log_bin, 0, "this test needs a MariaDB without a binary log");
    common::users_table(&p, &["u000001", "u_late"]).await;
    let s = waiting_for(&url, &url, "scale-no-gtid").await;
    s.stop().await;
    p.close().await;
}

/// A scan replica is a server of the primary's kind; SQLite has none.
#[test]
fn a_scan_replica_of_another_kind_is_refused() {
    let with = |primary: &str, replica: &str| bloomgate_service::Config {
        database_url: primary.into(),
        scan_database_url: Some(replica.into()),
        ..bloomgate_service::Config::default()
    };
    for (primary, replica) in [
        ("sqlite://data/a.db", "sqlite://data/b.db"),
        ("mysql://root@a/test", "postgres://b/test"),
        ("postgres://a/test", "redis://b/"),
    ] {
        let e = with(primary, replica).validate().unwrap_err().to_string();
        assert!(e.contains("scan_database_url"), "{primary} {replica}: {e}");
    }
    with("mysql://root@a/test", "mariadb://reader@b/test")
        .validate()
        .unwrap();
    with("postgres://a/test", "postgresql://reader@b/test")
        .validate()
        .unwrap();
}

/// A PostgreSQL server of the test's own (a primary, or a standby made
/// with `pg_basebackup`), run as the `postgres` user (initdb refuses root).
struct OwnPostgres {
    port: u16,
    child: std::process::Child,
    _dir: tempfile::TempDir,
}

impl OwnPostgres {
    fn bin(name: &str) -> std::path::PathBuf {
        let dir = std::process::Command::new("pg_config")
            .arg("--bindir")
            .output()
            .ok()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
            .filter(|d| !d.is_empty())
            .unwrap_or_else(|| "/usr/lib/postgresql/15/bin".into());
        std::path::Path::new(&dir).join(name)
    }

    fn as_postgres(program: &str) -> std::process::Command {
        use std::os::unix::process::CommandExt;
        let mut c = std::process::Command::new(Self::bin(program));
        // The `postgres` account when the test runs as root.
        if nix_is_root() {
            let uid = id_of("-u");
            let gid = id_of("-g");
            c.uid(uid).gid(gid);
        }
        c
    }

    fn run(mut c: std::process::Command) {
        let out = c.output().expect("a PostgreSQL program");
        assert!(
            out.status.success(),
            "{c:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// A primary that ships WAL (`from`: `None`), or a standby of `from`.
    async fn start(from: Option<u16>) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        if nix_is_root() {
            std::process::Command::new("chown")
                .args(["-R", "postgres:postgres", &dir.path().display().to_string()])
                .status()
                .unwrap();
        }
        let mut c = match from {
            None => {
                let mut c = Self::as_postgres("initdb");
                c.args(["-A", "trust", "-U", "postgres", "-D"]).arg(&data);
                c
            }
            Some(primary) => {
                let mut c = Self::as_postgres("pg_basebackup");
                c.args(["-h", "127.0.0.1", "-U", "postgres", "-R", "-X", "stream"])
                    .args(["-p", &primary.to_string(), "-D"])
                    .arg(&data);
                c
            }
        };
        c.stdout(std::process::Stdio::null());
        Self::run(c);
        let port = common::free_port();
        let mut c = Self::as_postgres("postgres");
        c.arg("-D")
            .arg(&data)
            .args(["-p", &port.to_string(), "-c", "listen_addresses=127.0.0.1"])
            .arg("-c")
            .arg(format!("unix_socket_directories={}", dir.path().display()))
            .args(["-c", "wal_level=replica", "-c", "fsync=off"])
            .args(["-c", "shared_buffers=16MB", "-c", "max_connections=40"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null());
        let child = c.spawn().expect("postgres");
        common::wait_port(port, true).await;
        // The port opens before the server accepts connections ("the
        // database system is starting up"): a standby made from it at
        // once would be refused.
        let ready = || {
            std::process::Command::new(Self::bin("pg_isready"))
                .args(["-h", "127.0.0.1", "-p", &port.to_string(), "-q"])
                .status()
                .is_ok_and(|s| s.success())
        };
        for _ in 0..300 {
            if ready() {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        assert!(
            ready(),
            "PostgreSQL on port {port} never accepted connections"
        );
        Self {
            port,
            child,
            _dir: dir,
        }
    }

    fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }
}

impl Drop for OwnPostgres {
    fn drop(&mut self) {
        // SIGQUIT: an immediate shutdown, children included.
        let _ = std::process::Command::new("kill")
            .args(["-QUIT", &self.child.id().to_string()])
            .status();
        let _ = self.child.wait();
    }
}

fn nix_is_root() -> bool {
    std::process::Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.trim_ascii() == b"0")
}

fn id_of(flag: &str) -> u32 {
    let out = std::process::Command::new("id")
        .args([flag, "postgres"])
        .output()
        .expect("id");
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .expect("the postgres account")
}

/// `scan_database_url` on PostgreSQL: a primary and a streaming standby
/// of the test's own. With the standby's replay paused, a row committed on
/// the primary has not reached it: the scan waits (not ready) instead of
/// missing it, and after the replay resumes the row is in the filter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scan_of_a_standby_waits_until_it_has_replayed_postgres() {
    if common::postgres_database("standby_probe").await.is_none() {
        return;
    }
    let primary = OwnPostgres::start(None).await;
    let standby = OwnPostgres::start(Some(primary.port)).await;
    let p = common::sql_pool(&primary.url()).await;
    let r = common::sql_pool(&standby.url()).await;
    users_replicated(&p, &r).await;
    run(&r, "SELECT pg_wal_replay_pause()").await;
    run(&p, "INSERT INTO users (id, name) VALUES ('u_late', 'late')").await;
    let s = waiting_for(&primary.url(), &standby.url(), "scale-standby").await;
    run(&r, "SELECT pg_wal_replay_resume()").await;
    built_with(
        &s,
        r#"{"keys":["u_late","u000500","u_nobody"]}"#,
        &[true, true, false],
    )
    .await;
    s.stop().await;
    p.close().await;
    r.close().await;
}
