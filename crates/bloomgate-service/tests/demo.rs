//! Your database stays yours: with `[[resources]]` configured and no
//! `demo` setting, bloomgate creates, seeds, routes and reports no demo
//! SKU table (it used to create `skus` and insert 200,000 rows into the
//! application's database). On SQLite, MariaDB and PostgreSQL: the tables
//! before and after start, the application's rows untouched, no SKU route,
//! no `bloom` object in the stats, readiness from the resources alone.
//! Without capture it creates nothing at all; a `SELECT`-only user starts,
//! serves and rebuilds, and a feature that needs more names the right.

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
    // With capture, bloomgate's own tables and nothing else; first without.
    for capture in [false, true] {
        users_served(url, &w, &before, capture).await;
    }
    w.close().await;
}

async fn users_served(url: &str, w: &sqlx::AnyPool, before: &[String], capture: bool) {
    let mut c = common::config(url, None, "demo-off");
    c.demo = None;
    c.seed_if_empty = 200_000;
    let mut users = common::users_resource("users");
    if capture {
        users.capture = bloomgate_service::config::Capture::Triggers;
    }
    c.resources.push(users);
    assert!(!c.demo());
    let s = TestServer::start(c, 200_000).await;
    eventually(10, "ready", || async { s.get("/readyz").await.0 == 200 }).await;
    let after = tables(w, url).await;
    let added: Vec<&String> = after.iter().filter(|t| !before.contains(t)).collect();
    assert!(!after.contains(&"skus".to_string()), "{after:?}");
    if capture {
        assert!(
            !added.is_empty() && added.iter().all(|t| t.starts_with("bloomgate_")),
            "only bloomgate's own tables: {added:?}"
        );
    } else {
        assert!(
            added.is_empty(),
            "nothing created without capture: {added:?}"
        );
    }
    assert_eq!(s.stats().await["outbox"]["enabled"], capture);
    let users: i64 = sqlx::query("SELECT COUNT(*) FROM users")
        .fetch_one(w)
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

async fn exists(s: &TestServer, key: &str) -> bool {
    let body = format!(r#"{{"keys":[{key:?}]}}"#);
    let (status, answer) = s
        .send(reqwest::Method::POST, "/api/users/exists", Some(&body))
        .await;
    assert_eq!(status, 200, "{answer}");
    answer["exists"][0].as_bool().unwrap()
}

async fn exec(pool: &sqlx::AnyPool, q: &str) {
    sqlx::query(q)
        .execute(pool)
        .await
        .unwrap_or_else(|e| panic!("{q}: {e}"));
}

/// A user with `SELECT` on `users` and nothing else: two instances start,
/// serve (a real key 200, an absent one refused by the filter), survive a
/// warm with `rebuild_bloom` (which says it reached this instance alone),
/// answer a `keys` call 409 naming `sql.outbox`, and leave the database as
/// it was. Asked for the outbox, the start names the right and the
/// feature, and writes nothing.
async fn select_only(admin_url: &str, postgres: bool) {
    let user = "bg_select_only";
    let admin = common::sql_pool(admin_url).await;
    common::users_table(&admin, &["u1001", "u1002"]).await;
    let db = admin_url.rsplit('/').next().unwrap().to_owned();
    let service_url = if postgres {
        for q in [
            format!("DROP ROLE IF EXISTS {user}"),
            format!("CREATE ROLE {user} LOGIN"),
            format!("GRANT SELECT ON users TO {user}"),
        ] {
            exec(&admin, &q).await;
        }
        common::as_user(admin_url, user)
    } else {
        for q in [
            format!("DROP USER IF EXISTS '{user}'@'%'"),
            format!("CREATE USER '{user}'@'%' IDENTIFIED BY 'np'"),
            format!("GRANT SELECT ON `{db}`.users TO '{user}'@'%'"),
        ] {
            exec(&admin, &q).await;
        }
        common::as_user(admin_url, &format!("{user}:np"))
    };
    let before = tables(&admin, admin_url).await;
    let redis = common::redis_url().await;
    let prefix = format!("select-only-{postgres}");
    if let Some(r) = &redis {
        common::redis_clear(r, &format!("bgtest:{prefix}:")).await;
    }
    let config = || {
        let mut c = common::config(&service_url, redis.as_deref(), &prefix);
        c.demo = None;
        c.resources = vec![common::users_resource("users")];
        c
    };
    let a = TestServer::start(config(), 0).await;
    let b = TestServer::start(config(), 0).await;
    for s in [&a, &b] {
        eventually(10, "ready", || async { s.get("/readyz").await.0 == 200 }).await;
        assert_eq!(s.get("/api/users/u1001").await.0, 200);
        let (status, body) = s.get("/api/users/u9999").await;
        assert_eq!((status, body["error"].as_str()), (404, Some("not_found")));
        assert_eq!(s.stats().await["outbox"]["enabled"], false);
    }
    let rejected = &a.stats().await["resources"]["users"]["filter"]["rejected"];
    assert!(
        rejected.as_u64() >= Some(1),
        "the filter refused: {rejected}"
    );
    // A row another program inserts, then a warm that rebuilds.
    exec(
        &admin,
        "INSERT INTO users (id, name) VALUES ('u2000', 'new')",
    )
    .await;
    let (status, body) = a
        .send(
            reqwest::Method::POST,
            "/api/users/warm",
            Some(r#"{"limit":10,"rebuild_bloom":true}"#),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["reached"], "this_instance", "{body}");
    assert_eq!(body["added"], 3, "{body}");
    assert_eq!(a.get("/api/users/u2000").await.0, 200);
    for (path, keys) in [
        ("/api/users/keys", r#"{"keys":["u3000"]}"#),
        ("/api/users/invalidate", r#"{"keys":["u1001"]}"#),
    ] {
        let (status, body) = a.send(reqwest::Method::POST, path, Some(keys)).await;
        assert_eq!(
            (status, body["error"].as_str()),
            (409, Some("outbox_off")),
            "{path}: {body}"
        );
        let message = body["message"].as_str().unwrap();
        assert!(message.contains("sql.outbox"), "{message}");
    }
    // Refused before anything changed here.
    assert!(!exists(&a, "u3000").await);
    for s in [&a, &b] {
        let stats = s.stats().await;
        assert_eq!(
            stats["outbox"]["poll_failures"], 0,
            "no outbox read: {stats}"
        );
        assert_eq!(stats["outbox"]["enabled"], false);
    }
    assert_eq!(tables(&admin, admin_url).await, before, "nothing created");
    // A feature that needs the outbox names the rights, and writes nothing.
    let mut c = config();
    c.sql.outbox = Some(true);
    let refused = match bloomgate_service::AppState::connect(&c).await {
        Ok(_) => panic!("a SELECT-only user cannot make the outbox"),
        Err(e) => e.to_string(),
    };
    for part in ["CREATE", "sql.outbox", "bloomgate capture install"] {
        assert!(refused.contains(part), "{part:?} in: {refused}");
    }
    assert_eq!(tables(&admin, admin_url).await, before, "still nothing");
    // Another instance, with rights, makes the outbox, and the DBA lets
    // this user write it: the running instances follow it from then on.
    let mut c = common::config(admin_url, redis.as_deref(), &prefix);
    c.demo = None;
    c.resources = vec![common::users_resource("users")];
    c.sql.outbox = Some(true);
    let maker = TestServer::start(c, 0).await;
    let grants = if postgres {
        vec![
            format!("GRANT SELECT, INSERT, UPDATE, DELETE ON bloomgate_changes, bloomgate_outbox_state, bloomgate_migrations TO {user}"),
            format!("GRANT USAGE, SELECT ON SEQUENCE bloomgate_changes_seq_seq TO {user}"),
        ]
    } else {
        vec![format!(
            "GRANT SELECT, INSERT, UPDATE, DELETE ON `{db}`.`bloomgate_changes` TO '{user}'@'%'"
        ), format!(
            "GRANT SELECT, INSERT, UPDATE, DELETE ON `{db}`.`bloomgate_outbox_state` TO '{user}'@'%'"
        )]
    };
    for q in grants {
        exec(&admin, &q).await;
    }
    for s in [&a, &b] {
        eventually(10, "following the outbox made meanwhile", || async {
            s.stats().await["outbox"]["enabled"] == true && s.get("/readyz").await.0 == 200
        })
        .await;
    }
    let (status, body) = a
        .send(
            reqwest::Method::POST,
            "/api/users/keys",
            Some(r#"{"keys":["u3000"]}"#),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    for s in [&b, &maker] {
        eventually(5, "the key told to A", || async {
            exists(s, "u3000").await
        })
        .await;
    }
    assert!(!exists(&b, "u_nobody").await, "B vouches again");
    maker.stop().await;
    a.stop().await;
    b.stop().await;
    admin.close().await;
    if postgres {
        let root = common::sql_pool(common::POSTGRES_ADMIN_URL).await;
        exec(&root, &format!("DROP DATABASE {db} WITH (FORCE)")).await;
        exec(&root, &format!("DROP ROLE {user}")).await;
        root.close().await;
    } else {
        let root = common::sql_pool(common::MYSQL_ADMIN_URL).await;
        exec(&root, &format!("DROP USER '{user}'@'%'")).await;
        root.close().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_select_only_user_starts_serves_and_rebuilds_mariadb() {
    let Some(url) = common::mysql_database("select_only").await else {
        return;
    };
    select_only(&url, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_select_only_user_starts_serves_and_rebuilds_postgres() {
    let Some(url) = common::postgres_database("select_only").await else {
        return;
    };
    select_only(&url, true).await;
}

/// `sql.outbox = false` beside a feature that needs the outbox is refused
/// with both named.
#[test]
fn outbox_off_beside_capture_is_refused() {
    let mut c = Config {
        demo: Some(false),
        ..Config::default()
    };
    let mut users = common::users_resource("users");
    users.capture = bloomgate_service::config::Capture::Triggers;
    c.resources.push(users);
    c.sql.outbox = Some(false);
    let e = c.validate().unwrap_err().to_string();
    assert!(
        e.contains("sql.outbox") && e.contains("resources[0].capture"),
        "{e}"
    );
    c.resources[0].capture = bloomgate_service::config::Capture::None;
    c.validate().unwrap();
    assert!(c.outbox_needs().is_empty());
}
