//! Your database stays yours: with `[[resources]]` configured and no
//! `demo` setting, bloomgate creates, seeds, routes and reports no demo
//! SKU table (it used to create `skus` and insert 200,000 rows into the
//! application's database). On SQLite, MariaDB and PostgreSQL: the tables
//! before and after start, the application's rows untouched, no SKU route,
//! no `bloom` object in the stats, readiness from the resources alone.

mod common;

use bloomgate_service::Config;
use common::{eventually, TestServer};
use sqlx::Row;

async fn tables(pool: &sqlx::AnyPool, url: &str) -> Vec<String> {
    let q = if url.starts_with("sqlite") {
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
    } else if url.starts_with("mysql") {
        "SELECT CAST(table_name AS CHAR) FROM information_schema.tables WHERE table_schema = DATABASE()"
    } else {
        "SELECT CAST(table_name AS TEXT) FROM information_schema.tables WHERE table_schema = current_schema()"
    };
    let mut names: Vec<String> = sqlx::query(q)
        .fetch_all(pool)
        .await
        .unwrap()
        .iter()
        .map(|r| r.get::<String, _>(0))
        .collect();
    names.sort();
    names
}

async fn users_only(url: &str) {
    let w = common::sql_pool(url).await;
    common::users_table(&w, &["u1001", "u1002"]).await;
    let before = tables(&w, url).await;
    let mut c = common::config(url, None, "demo-off");
    c.demo = None;
    c.seed_if_empty = 200_000;
    c.resources.push(common::users_resource("users"));
    assert!(!c.demo());
    let s = TestServer::start(c, 200_000).await;
    eventually(10, "ready", || async { s.get("/readyz").await.0 == 200 }).await;
    let after = tables(&w, url).await;
    let added: Vec<&String> = after.iter().filter(|t| !before.contains(t)).collect();
    assert!(!after.contains(&"skus".to_string()), "{after:?}");
    assert!(
        added.iter().all(|t| t.starts_with("bloomgate_")),
        "only bloomgate's own tables: {added:?}"
    );
    let users: i64 = sqlx::query("SELECT COUNT(*) FROM users")
        .fetch_one(&w)
        .await
        .unwrap()
        .get(0);
    assert_eq!(users, 2, "the application's rows untouched");
    // Its own reads, and none of the demo's.
    assert_eq!(s.get("/api/users/u1001").await.0, 200);
    assert_eq!(s.get("/api/users/u9999").await.0, 404);
    for path in ["/api/seckill/1", "/api/skus/1"] {
        let (status, body) = s.get(path).await;
        assert_eq!(
            (status, body["message"].as_str()),
            (404, Some("no such route")),
            "{path}"
        );
    }
    let (status, _) = s
        .send(
            reqwest::Method::POST,
            "/api/cache/warm",
            Some(r#"{"limit":1}"#),
        )
        .await;
    assert_eq!(status, 404);
    let stats = s.stats().await;
    assert!(stats.get("bloom").is_none(), "{stats}");
    let resources: Vec<&String> = stats["resources"].as_object().unwrap().keys().collect();
    assert_eq!(resources, ["users"]);
    let (_, ready) = s.get("/readyz").await;
    let ready: Vec<&String> = ready["resources"].as_object().unwrap().keys().collect();
    assert_eq!(ready, ["users"]);
    let metrics = s.metrics_text().await;
    let skus: Vec<&str> = metrics
        .lines()
        .filter(|l| !l.starts_with('#') && l.contains("resource=\"skus\""))
        .collect();
    assert!(skus.is_empty(), "no SKU series: {skus:?}");
    assert!(metrics.contains("resource=\"users\""));
    s.stop().await;
    w.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_users_table_gets_no_demo_table_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    users_only(&common::sqlite_url(&dir)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_users_table_gets_no_demo_table_mariadb() {
    let Some(url) = common::mysql_database("demo_off").await else {
        return;
    };
    users_only(&url).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_users_table_gets_no_demo_table_postgres() {
    let Some(url) = common::postgres_database("demo_off").await else {
        return;
    };
    users_only(&url).await;
}

/// `demo` defaults on only without resources; `BLOOMGATE_DEMO` and the
/// file's `demo` set it either way.
#[test]
fn the_demo_is_on_by_default_only_without_resources() {
    let env = |pairs: &[(&str, &str)]| {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect::<Vec<_>>()
    };
    assert!(Config::load_from(None, env(&[])).unwrap().demo());
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("b.toml");
    std::fs::write(
        &file,
        "[[resources]]\nname = \"users\"\ntable = \"users\"\nkey = \"id\"\nkey_type = \"text\"\n",
    )
    .unwrap();
    assert!(!Config::load_from(Some(&file), env(&[])).unwrap().demo());
    assert!(
        Config::load_from(Some(&file), env(&[("BLOOMGATE_DEMO", "true")]))
            .unwrap()
            .demo()
    );
    assert!(
        !Config::load_from(None, env(&[("BLOOMGATE_DEMO", "false")]))
            .unwrap()
            .demo()
    );
}
