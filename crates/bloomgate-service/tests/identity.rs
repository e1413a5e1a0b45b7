//! Snapshots and shared epochs name what their filter holds: the
//! database's identity (a random number its outbox's migration wrote),
//! the table, the key column and the key type. A filter made for anything
//! else is refused and the table scanned, so every existing key is found:
//! before, a snapshot of another key column, or an epoch of another
//! database under the same Redis prefix (staging and production), was
//! restored whenever its outbox position was not ahead of this one's, and
//! every key the other filter lacked answered 404.

mod common;

use common::{counter, eventually, TestServer};
use sqlx::Row;

async fn users_table(url: &str, ids: &[&str]) {
    let w = common::sql_pool(url).await;
    sqlx::query(
        "CREATE TABLE users (id VARCHAR(32) NOT NULL PRIMARY KEY, email VARCHAR(100) NOT NULL)",
    )
    .execute(&w)
    .await
    .unwrap();
    for id in ids {
        sqlx::query(&format!(
            "INSERT INTO users VALUES ('{id}', '{id}@example.com')"
        ))
        .execute(&w)
        .await
        .unwrap();
    }
    w.close().await;
}

/// A snapshot of `users` keyed by `id`, restarted keyed by `email` (same
/// snapshot path): refused, scanned, every email found.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_of_another_key_column_is_not_restored() {
    let dir = tempfile::tempdir().unwrap();
    let url = common::sqlite_url(&dir);
    users_table(&url, &["u1", "u2", "u3"]).await;
    let snap = dir.path().join("users.bgf");
    let config = |key: &str| {
        let mut c = common::config(&url, None, "identity-key");
        let mut users = common::users_resource("users");
        users.key = key.into();
        users.bloom_snapshot_path = Some(snap.clone());
        c.resources.push(users);
        c
    };
    let a = TestServer::start(config("id"), 0).await;
    eventually(10, "ready", || async { a.get("/readyz").await.0 == 200 }).await;
    a.stop().await;
    assert!(snap.is_file(), "saved at shutdown");
    // The same path, restarted by id: restored, no scan.
    let a = TestServer::start(config("id"), 0).await;
    eventually(10, "ready", || async { a.get("/readyz").await.0 == 200 }).await;
    let stats = a.stats().await;
    assert_eq!(
        counter(
            &stats,
            &["resources", "users", "filter", "snapshot_restores"]
        ),
        1,
        "{stats}"
    );
    a.stop().await;
    // Keyed by email now: the snapshot holds ids.
    let b = TestServer::start(config("email"), 0).await;
    eventually(10, "ready", || async { b.get("/readyz").await.0 == 200 }).await;
    let stats = b.stats().await;
    assert_eq!(
        counter(
            &stats,
            &["resources", "users", "filter", "snapshot_restores"]
        ),
        0,
        "{stats}"
    );
    for id in ["u1", "u2", "u3"] {
        assert_eq!(
            b.get(&format!("/api/users/{id}@example.com")).await.0,
            200,
            "{id}"
        );
    }
    b.stop().await;
}

/// Two databases under one Redis prefix (staging and production): the
/// second instance does not adopt the first one's start-up epoch, and
/// finds its own rows; for the SKU table (under the bare prefix) and a
/// resource (under its own).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_epoch_of_another_database_is_not_adopted() {
    let (Some(staging), Some(production), Some(redis)) = (
        common::mysql_database("identity_staging").await,
        common::mysql_database("identity_production").await,
        common::redis_url().await,
    ) else {
        return;
    };
    users_table(&staging, &["u1", "u2"]).await;
    users_table(&production, &["p1", "p2"]).await;
    let config = |url: &str| {
        let mut c = common::config(url, Some(&redis), "identity-shared");
        c.resources.push(common::users_resource("users"));
        c
    };
    common::redis_clear(&redis, &config(&staging).cache.redis_prefix).await;
    let a = TestServer::start(config(&staging), 100).await;
    eventually(10, "staging ready", || async {
        a.get("/readyz").await.0 == 200
    })
    .await;
    // Wait for staging's start-up epochs (the SKUs' and users') in Redis.
    eventually(10, "staging's epochs stored", || async {
        let s = a.stats().await;
        counter(&s, &["resources", "skus", "epochs", "published"]) >= 1
            && counter(&s, &["resources", "users", "epochs", "published"]) >= 1
    })
    .await;
    let b = TestServer::start(config(&production), 0).await;
    eventually(10, "production ready", || async {
        b.get("/readyz").await.0 == 200
    })
    .await;
    let stats = b.stats().await;
    assert_eq!(
        counter(&stats, &["resources", "skus", "epochs", "adopted"]),
        0,
        "{stats}"
    );
    assert_eq!(
        counter(&stats, &["resources", "users", "epochs", "adopted"]),
        0,
        "{stats}"
    );
    for path in ["/api/users/p1", "/api/users/p2"] {
        assert_eq!(b.get(path).await.0, 200, "{path}");
    }
    assert_eq!(b.get("/api/users/u1").await.0, 404);
    // Each database has its own identity.
    let id = |url: String| async move {
        let p = common::sql_pool(&url).await;
        let v: i64 =
            sqlx::query("SELECT value FROM bloomgate_outbox_state WHERE name = 'identity'")
                .fetch_one(&p)
                .await
                .unwrap()
                .get(0);
        v
    };
    assert_ne!(id(staging.clone()).await, id(production.clone()).await);
    a.stop().await;
    b.stop().await;
}

/// A rolling upgrade: an epoch of the SKU table the previous release
/// stored (its meta lacks `key_type`; made here by deleting the field) is
/// refused once at start. The instance scans SQL and stores its own filter
/// in the old one's place, with every field the previous release reads,
/// and the next instance adopts that without a scan.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_earlier_release_epoch_is_refused_once_and_replaced() {
    let Some(redis) = common::redis_url().await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let config = common::config(&common::sqlite_url(&dir), Some(&redis), "identity-upgrade");
    let prefix = config.cache.redis_prefix.clone();
    common::redis_clear(&redis, &prefix).await;
    let a = TestServer::start(config.clone(), 2_000).await;
    assert_eq!(counter(&a.stats().await, &["changes", "epoch"]), 1);
    a.stop().await;
    let counter_key = bloomgate_service::wire::epoch_counter_key(&prefix);
    let meta_key = |n| bloomgate_service::wire::epoch_meta_key(&counter_key, n);
    let mut conn = common::redis_conn(&redis).await;
    let removed: i64 = redis::cmd("HDEL")
        .arg(meta_key(1))
        .arg("key_type")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(removed, 1, "this release writes key_type");

    let b = TestServer::start(config.clone(), 0).await;
    let s = b.stats().await;
    assert_eq!(counter(&s, &["bloom", "adopted"]), 0, "refused: {s}");
    eventually(10, "the scan's filter stored as epoch 2", || async {
        counter(&b.stats().await, &["changes", "epoch"]) == 2
    })
    .await;
    assert_eq!(counter(&b.stats().await, &["sql", "id_scans"]), 1);
    let fields: std::collections::HashMap<String, String> = redis::cmd("HGETALL")
        .arg(meta_key(2))
        .query_async(&mut conn)
        .await
        .unwrap();
    for field in [
        "outbox", "covered", "capacity", "fpp", "layout", "identity", "key_type",
    ] {
        assert!(fields.contains_key(field), "{field} in {fields:?}");
    }

    let c = TestServer::start(config, 0).await;
    let s = c.stats().await;
    assert_eq!(counter(&s, &["bloom", "adopted"]), 1, "adopted: {s}");
    assert_eq!(counter(&s, &["sql", "id_scans"]), 0, "{s}");
    for id in (1..=2_000).step_by(13) {
        assert_eq!(
            c.state.skus.shield().check(id),
            bloomgate_service::shield::Verdict::Pass,
            "id {id}"
        );
    }
    for s in [b, c] {
        s.stop().await;
    }
}

/// The shared filter of `redis` mode names what it holds: two databases
/// under one Redis prefix (staging and production), each served by a
/// `SELECT`-only instance (no outbox, so the identity is the server's own:
/// here the SQLite file's path and inode), get filters of their own, and
/// each finds its own rows. Before, the second opened the first one's
/// filter (`{prefix}rf:users:bloom`) and answered 404 for every row of its
/// own. A restart against the same database finds the same filter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_filter_of_another_database_is_not_read() {
    let Some(redis) = common::redis_url().await else {
        return;
    };
    let (d1, d2) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (staging, production) = (common::sqlite_url(&d1), common::sqlite_url(&d2));
    users_table(&staging, &["u1", "u2"]).await;
    users_table(&production, &["p1", "p2"]).await;
    let config = |url: &str| {
        let mut c = common::config(url, Some(&redis), "identity-shared-filter");
        // A user's own database, read with SELECT alone.
        c.demo = None;
        c.sql.outbox = Some(false);
        let mut users = common::users_resource("users");
        users.bloom_mode = Some(bloomgate_service::config::BloomMode::Redis);
        c.resources.push(users);
        c
    };
    common::redis_clear(&redis, &config(&staging).cache.redis_prefix).await;
    let key = |s: &TestServer| {
        s.state.resources[0]
            .shared()
            .expect("a shared filter")
            .key()
            .to_owned()
    };
    let a = TestServer::start(config(&staging), 0).await;
    let b = TestServer::start(config(&production), 0).await;
    for (s, found, other) in [(&a, "u1", "p1"), (&b, "p2", "u2")] {
        eventually(10, "ready", || async { s.get("/readyz").await.0 == 200 }).await;
        assert_eq!(
            s.get(&format!("/api/users/{found}")).await.0,
            200,
            "{found}"
        );
        assert_eq!(
            s.get(&format!("/api/users/{other}")).await.0,
            404,
            "{other}"
        );
    }
    assert_ne!(key(&a), key(&b));
    let first = key(&b);
    b.stop().await;
    let b = TestServer::start(config(&production), 0).await;
    assert_eq!(key(&b), first, "the same database, the same filter");
    a.stop().await;
    b.stop().await;
}

/// The server's own identity (a `SELECT`-only user has no outbox to hold
/// a random one): the same for two connections to one database, another
/// for another database on the same server, on MariaDB and PostgreSQL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_servers_identity_tells_databases_apart() {
    async fn identity(url: &str) -> String {
        let db = bloomgate_service::sql::Database::connect_unmigrated(
            url,
            &bloomgate_service::config::SqlConfig::default(),
        )
        .await
        .unwrap();
        db.note_server_identity().await;
        let id = db.identity().expect("an identity").to_owned();
        db.close().await;
        id
    }
    let (Some(m1), Some(m2), Some(p1), Some(p2)) = (
        common::mysql_database("identity_server_a").await,
        common::mysql_database("identity_server_b").await,
        common::postgres_database("identity_server_a").await,
        common::postgres_database("identity_server_b").await,
    ) else {
        return;
    };
    for (a, b) in [(&m1, &m2), (&p1, &p2)] {
        let first = identity(a).await;
        assert!(first.starts_with("server-"), "{first}");
        assert_eq!(identity(a).await, first, "{a}");
        assert_ne!(identity(b).await, first, "{a} and {b}");
    }
}

/// A mixed fleet during a rolling upgrade, on one Redis prefix. The
/// previous release led the SKU table's rebuilds through the doorbell: it
/// stored an epoch under `{prefix}bloom:epoch` and announced it on the
/// stream (`{kind: b, epoch, outbox, covered, capacity}`), and asked for a
/// rebuild from SQL with `{kind: b}` alone. This release adopts such an
/// epoch, rebuilds on such a request, and announces its own epochs on the
/// stream too, in that form and marked `recorded`, so an instance of the
/// previous release adopts them while this release's act on the outbox
/// entry once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_mixed_fleet_adopts_each_others_epochs() {
    let Some(redis) = common::redis_url().await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let config = common::config(&common::sqlite_url(&dir), Some(&redis), "identity-mixed");
    let prefix = config.cache.redis_prefix.clone();
    common::redis_clear(&redis, &prefix).await;
    let a = TestServer::start(config.clone(), 2_000).await;
    let b = TestServer::start(config, 0).await;
    let rebuilds = |s: &serde_json::Value| counter(s, &["bloom", "rebuilds"]);
    let before = [rebuilds(&a.stats().await), rebuilds(&b.stats().await)];
    let counter_key = bloomgate_service::wire::epoch_counter_key(&prefix);
    let stream = bloomgate_service::wire::changes_key(&prefix);
    let mut conn = common::redis_conn(&redis).await;
    let meta = |n: u64| bloomgate_service::wire::epoch_meta_key(&counter_key, n);
    let seg = |n: u64, i: usize| bloomgate_service::wire::epoch_segment_key(&counter_key, n, i);

    // An instance of the previous release leads: epoch 2, a copy of the
    // start-up epoch (the one meta format), announced on the stream alone.
    let fields: Vec<(String, String)> = redis::cmd("HGETALL")
        .arg(meta(1))
        .query_async(&mut conn)
        .await
        .unwrap();
    let segments: usize = fields
        .iter()
        .find(|(k, _)| k == "segments")
        .unwrap()
        .1
        .parse()
        .unwrap();
    let n: u64 = redis::cmd("INCR")
        .arg(&counter_key)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(n, 2);
    for i in 0..segments {
        let bytes: Vec<u8> = redis::cmd("GET")
            .arg(seg(1, i))
            .query_async(&mut conn)
            .await
            .unwrap();
        let () = redis::cmd("SET")
            .arg(seg(2, i))
            .arg(bytes)
            .query_async(&mut conn)
            .await
            .unwrap();
    }
    let mut hset = redis::cmd("HSET");
    hset.arg(meta(2));
    for (k, v) in &fields {
        hset.arg(k).arg(v);
    }
    let () = hset.query_async(&mut conn).await.unwrap();
    let old_entry = |extra: &[(&str, String)]| {
        let mut xadd = redis::cmd("XADD");
        xadd.arg(&stream).arg("*").arg("kind").arg("b");
        for (k, v) in extra {
            xadd.arg(*k).arg(v);
        }
        xadd.arg("from").arg("previous-release");
        xadd
    };
    let get = |k: &str| fields.iter().find(|(f, _)| f == k).unwrap().1.clone();
    let _: String = old_entry(&[
        ("epoch", "2".into()),
        ("outbox", get("outbox")),
        ("covered", get("covered")),
        ("capacity", get("capacity")),
    ])
    .query_async(&mut conn)
    .await
    .unwrap();
    for (s, was) in [(&a, before[0]), (&b, before[1])] {
        eventually(10, "the previous release's epoch adopted", || async {
            counter(&s.stats().await, &["changes", "epoch"]) == 2
        })
        .await;
        let st = s.stats().await;
        assert_eq!(counter(&st, &["changes", "rebuilds_adopted"]), 1, "{st}");
        assert_eq!(rebuilds(&st), was, "no scan: {st}");
    }

    // Its rebuild request alone: each instance rebuilds from SQL.
    let _: String = old_entry(&[]).query_async(&mut conn).await.unwrap();
    for s in [&a, &b] {
        eventually(
            10,
            "the previous release's rebuild request acted on",
            || async { counter(&s.stats().await, &["bloom", "rebuilds"]) == 1 },
        )
        .await;
    }

    // This release leads: its epoch is announced in the outbox and on the
    // stream in the previous release's form.
    let (status, body) = a
        .send(
            reqwest::Method::POST,
            "/api/cache/warm",
            Some(r#"{"limit":10,"rebuild_bloom":true}"#),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let epoch = body["epoch"].as_u64().expect("shared as an epoch");
    assert_eq!(epoch, 3, "{body}");
    let entries: redis::streams::StreamRangeReply = redis::cmd("XRANGE")
        .arg(&stream)
        .arg("-")
        .arg("+")
        .query_async(&mut conn)
        .await
        .unwrap();
    let announced: Vec<_> = entries
        .ids
        .iter()
        .filter(|e| e.get::<String>("kind").as_deref() == Some("b"))
        .filter(|e| e.get::<u64>("epoch") == Some(epoch))
        .collect();
    assert_eq!(announced.len(), 1, "one announcement on the stream");
    for field in ["outbox", "covered", "capacity", "from", "recorded"] {
        assert!(announced[0].get::<String>(field).is_some(), "{field}");
    }
    let fields: std::collections::HashMap<String, String> = redis::cmd("HGETALL")
        .arg(meta(epoch))
        .query_async(&mut conn)
        .await
        .unwrap();
    for field in [
        "segments", "bytes", "outbox", "covered", "capacity", "fpp", "layout", "identity",
    ] {
        assert!(fields.contains_key(field), "{field} in {fields:?}");
    }
    eventually(10, "B adopts this release's epoch", || async {
        counter(&b.stats().await, &["changes", "epoch"]) == 3
    })
    .await;
    // Once: from the outbox entry, not again from the stream's.
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let st = b.stats().await;
    assert_eq!(counter(&st, &["changes", "rebuilds_adopted"]), 2, "{st}");
    assert_eq!(counter(&st, &["changes", "rebuilds_requested"]), 3, "{st}");
    assert_eq!(rebuilds(&st), before[1] + 1, "adopted, not scanned: {st}");
    for id in (1..=2_000).step_by(13) {
        assert_eq!(b.get(&format!("/api/seckill/{id}")).await.0, 200, "id {id}");
    }
    for s in [a, b] {
        s.stop().await;
    }
}
