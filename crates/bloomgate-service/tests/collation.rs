//! Keys the database calls equal are one key: a text key column's
//! collation decides what the filter holds, what a cache is keyed by and
//! what a read may refuse (`bloomgate_service::key::Fold`). MariaDB's
//! default `utf8mb4_general_ci` (case and trailing spaces ignored, `ü`
//! equal to `u`), SQLite's `NOCASE`, and a nondeterministic PostgreSQL
//! collation.

mod common;

use bloomgate_service::config::Capture;
use bloomgate_service::key::Key;
use bloomgate_service::shield::Verdict;
use common::{counter, eventually, TestServer};
use reqwest::Method;

/// How long another program's committed write may take to reach the
/// instance: the next poll (1 s with a doorbell, 100 ms without), plus a
/// second for a loaded CI machine (as `tests/capture.rs`).
const BOUND: u64 = 2;

/// A key the users filter refuses (`prefix` + n, folded as the table
/// folds keys).
fn refused(s: &TestServer, prefix: &str) -> String {
    let r = s
        .state
        .resources
        .iter()
        .find(|r| &*r.name == "users")
        .unwrap();
    (0..100_000)
        .map(|n| format!("{prefix}{n}"))
        .find(|k| r.shield().probe(Key::Text(k.clone())) == Verdict::Reject)
        .expect("some key is refused")
}

fn rejected(stats: &serde_json::Value) -> i64 {
    counter(stats, &["resources", "users", "filter", "rejected"])
}

async fn post(s: &TestServer, path: &str, keys: &[&str]) -> (u16, serde_json::Value) {
    let body = serde_json::json!({ "keys": keys }).to_string();
    s.send(Method::POST, path, Some(&body)).await
}

async fn exec(pool: &sqlx::AnyPool, q: &str) {
    sqlx::query(q).execute(pool).await.unwrap();
}

async fn bf_exists(addr: std::net::SocketAddr, key: &str) -> i64 {
    let client = redis::Client::open(format!("redis://{addr}/")).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    redis::cmd("BF.EXISTS")
        .arg("users")
        .arg(key)
        .query_async(&mut conn)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_default_collation_every_spelling_is_one_key() {
    let Some(url) = common::mysql_database("collation_ci").await else {
        return;
    };
    let redis = common::redis_url().await;
    let w = common::sql_pool(&url).await;
    common::users_table(&w, &["u000001", "u000002", "u000003"]).await;
    let mut c = common::config(&url, redis.as_deref(), "collation-ci");
    if let Some(r) = &redis {
        common::redis_clear(r, &c.cache.redis_prefix).await;
    }
    c.resp.listen = Some("127.0.0.1:0".parse().unwrap());
    let mut users = common::users_resource("users");
    users.capture = Capture::Triggers;
    c.resources.push(users);
    let s = TestServer::start(c, 0).await;
    eventually(10, "ready", || async { s.get("/readyz").await.0 == 200 }).await;

    // Every spelling the column's collation finds is answered, by the
    // route, `exists`, `batch` and `BF.EXISTS`.
    for k in ["u000001", "U000001", "u000001%20%20", "%C3%BC000001"] {
        let (status, body) = s.get(&format!("/api/users/{k}")).await;
        assert_eq!(
            (status, body["name"].as_str()),
            (200, Some("user u000001")),
            "{k}: {body}"
        );
    }
    let absent = refused(&s, "nobody");
    let (status, body) = post(&s, "/api/users/exists", &["U000002", "ü000002 ", &absent]).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["exists"], serde_json::json!([true, true, false]));
    let (status, body) = post(&s, "/api/users/batch", &["U000002 ", "Ü000003"]).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["found"].as_array().map(Vec::len), Some(2), "{body}");
    let resp = s.resp.unwrap();
    assert_eq!(bf_exists(resp, "U000003").await, 1);
    assert_eq!(bf_exists(resp, "ù000003").await, 1);
    assert_eq!(bf_exists(resp, &absent).await, 0);

    // The filter still refuses what no spelling finds.
    let before = rejected(&s.stats().await);
    assert_eq!(s.get(&format!("/api/users/{absent}")).await.0, 404);
    assert_eq!(rejected(&s.stats().await), before + 1);

    // A row read (and cached) under one spelling is not served stale under
    // it once another program updated it under another.
    for _ in 0..2 {
        assert_eq!(s.get("/api/users/U000002").await.1["name"], "user u000002");
    }
    exec(&w, "UPDATE users SET name = 'renamed' WHERE id = 'u000002'").await;
    eventually(BOUND, "the update under another spelling", || async {
        s.get("/api/users/U000002").await.1["name"] == "renamed"
    })
    .await;

    // A loose key that no row has, told by the key API or `BF.ADD`, marks
    // nothing: the filter still refuses. Before, one such call (a typo, a
    // guess) switched every instance's refusals off until a rebuild.
    let (status, body) = post(&s, "/api/users/keys", &["ø1", "u000001"]).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["added"], 1, "the loose key without a row: {body}");
    let client = redis::Client::open(format!("redis://{resp}/")).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let new: i64 = redis::cmd("BF.ADD")
        .arg("users")
        .arg("é2")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(new, 0, "not added");
    let before = rejected(&s.stats().await);
    assert_eq!(s.get(&format!("/api/users/{absent}")).await.0, 404);
    assert_eq!(
        rejected(&s.stats().await),
        before + 1,
        "refused by the filter after a rowless loose key"
    );
    assert_eq!(bf_exists(resp, &absent).await, 0);

    // A row whose key is outside printable ASCII: the filter cannot fold
    // it, so once it exists the filter's "no" no longer stands, and an
    // ASCII spelling the collation finds is answered.
    exec(&w, "INSERT INTO users VALUES ('é9', 'user é9')").await;
    eventually(BOUND, "E9 found through the row é9", || async {
        let (status, body) = s.get("/api/users/E9").await;
        status == 200 && body["name"] == "user é9"
    })
    .await;
    assert_eq!(bf_exists(resp, "e9").await, 1);
    // A batch's `IN (…)` finds the row under its own spelling, `é9`.
    let (status, body) = post(&s, "/api/users/batch", &["e9", "u000001"]).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["found"].as_array().map(Vec::len), Some(2), "{body}");
    let before = rejected(&s.stats().await);
    let (status, body) = s.get(&format!("/api/users/{absent}")).await;
    assert_eq!(status, 404, "{body}");
    assert_eq!(
        rejected(&s.stats().await),
        before,
        "answered by SQL, not the filter"
    );
    s.stop().await;
    w.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_nocase_keys_fold_ascii_case_only() {
    let dir = tempfile::tempdir().unwrap();
    let url = common::sqlite_url(&dir);
    let w = common::sql_pool(&url).await;
    exec(
        &w,
        "CREATE TABLE users (id TEXT NOT NULL PRIMARY KEY COLLATE NOCASE, name TEXT NOT NULL)",
    )
    .await;
    exec(
        &w,
        "INSERT INTO users VALUES ('Ab01', 'user Ab01'), ('Éa02', 'user Éa02')",
    )
    .await;
    let mut c = common::config(&url, None, "collation-nocase");
    c.resources.push(common::users_resource("users"));
    let s = TestServer::start(c, 0).await;
    eventually(10, "ready", || async { s.get("/readyz").await.0 == 200 }).await;
    for k in ["Ab01", "aB01", "AB01", "%C3%89A02"] {
        assert_eq!(s.get(&format!("/api/users/{k}")).await.0, 200, "{k}");
    }
    // NOCASE folds ASCII only, and does not ignore trailing spaces: these
    // are other keys, refused by the filter (never loose: SQLite folds
    // nothing else).
    let before = rejected(&s.stats().await);
    for k in ["%C3%A9a02", "ab01%20"] {
        assert_eq!(s.get(&format!("/api/users/{k}")).await.0, 404, "{k}");
    }
    assert_eq!(rejected(&s.stats().await), before + 2);
    s.stop().await;
    w.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nondeterministic_postgres_collation_is_never_refused() {
    let Some(url) = common::postgres_database("collation_nd").await else {
        return;
    };
    let w = common::sql_pool(&url).await;
    exec(
        &w,
        "CREATE COLLATION IF NOT EXISTS bg_case_insensitive \
         (provider = icu, locale = 'und-u-ks-level2', deterministic = false)",
    )
    .await;
    exec(
        &w,
        "CREATE TABLE users (id TEXT COLLATE bg_case_insensitive NOT NULL PRIMARY KEY, name TEXT NOT NULL)",
    )
    .await;
    exec(&w, "INSERT INTO users VALUES ('u1', 'user u1')").await;
    let mut c = common::config(&url, None, "collation-nd");
    c.resources.push(common::users_resource("users"));
    let s = TestServer::start(c, 0).await;
    eventually(10, "ready", || async { s.get("/readyz").await.0 == 200 }).await;
    for _ in 0..2 {
        assert_eq!(s.get("/api/users/U1").await.1["name"], "user u1");
    }
    // Nothing is cached under a spelling: another program's update is read
    // at once (no capture here, so only an uncached read sees it).
    exec(&w, "UPDATE users SET name = 'renamed' WHERE id = 'u1'").await;
    assert_eq!(s.get("/api/users/U1").await.1["name"], "renamed");
    assert_eq!(s.get("/api/users/nobody").await.0, 404);
    assert_eq!(rejected(&s.stats().await), 0);
    s.stop().await;
    w.close().await;
}
