//! `TRUNCATE` (and foreign-key cascades) fire no trigger: the documented
//! remedy is a warm with `rebuild_bloom`. It must drop the deleted rows
//! from every cache as well as rebuild the filter: before, the rows
//! stayed in Redis (an hour) and in L1 (30 s) and were served after the
//! warm answered. Two instances on MariaDB with Redis.

mod common;

use common::{eventually, TestServer};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_warm_after_a_truncate_drops_the_cached_rows_everywhere() {
    let (Some(db), Some(redis)) = (
        common::mysql_database("truncate").await,
        common::redis_url().await,
    ) else {
        return;
    };
    let w = common::sql_pool(&db).await;
    common::users_table(&w, &["u000001", "u000002"]).await;
    let mut c = common::config(&db, Some(&redis), "truncate");
    c.resources.push(common::users_resource("users"));
    common::redis_clear(&redis, &c.cache.redis_prefix).await;
    let a = TestServer::start(c.clone(), 0).await;
    let b = TestServer::start(c.clone(), 0).await;
    for s in [&a, &b] {
        eventually(10, "ready", || async { s.get("/readyz").await.0 == 200 }).await;
        for _ in 0..2 {
            assert_eq!(s.get("/api/users/u000001").await.0, 200);
        }
    }
    let mut conn = common::redis_conn(&redis).await;
    // `{prefix}rv:users:{value identity}:u000001`.
    let key = common::redis_keys(&mut conn, &format!("{}rv:users:", c.cache.redis_prefix))
        .await
        .into_iter()
        .find(|k| k.ends_with(":u000001"))
        .expect("the row's value key");
    let cached: Option<String> = redis::cmd("GET")
        .arg(&key)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(cached.is_some(), "cached in Redis");

    sqlx::query("TRUNCATE TABLE users")
        .execute(&w)
        .await
        .unwrap();
    // No trigger saw it: the caches still answer.
    assert_eq!(a.get("/api/users/u000001").await.0, 200);
    let (status, body) = a
        .send(
            reqwest::Method::POST,
            "/api/users/warm",
            Some(r#"{"limit":0,"rebuild_bloom":true}"#),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        a.get("/api/users/u000001").await.0,
        404,
        "the warm's instance at once"
    );
    let cached: Option<String> = redis::cmd("GET")
        .arg(&key)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(
        cached.as_deref().is_none_or(|v| !v.contains("one")),
        "Redis holds the deleted row: {cached:?}"
    );
    // The other instance adopts the warm's rebuild (announced in the
    // outbox, rung by the doorbell) and drops its L1 with it.
    eventually(2, "B no longer serves the deleted row", || async {
        b.get("/api/users/u000001").await.0 == 404
    })
    .await;
    a.stop().await;
    b.stop().await;
    w.close().await;
}

/// Without Redis, a warm with `rebuild_bloom` shares no epoch: it asks
/// the other instances to rebuild through the SQL outbox, so the remedy
/// reaches the fleet (before, only the instance that got the warm
/// rebuilt, and B served the truncated rows from L1).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn without_redis_a_warms_rebuild_reaches_every_instance() {
    let dir = tempfile::tempdir().unwrap();
    let db = common::sqlite_url(&dir);
    let w = common::sql_pool(&db).await;
    common::users_table(&w, &["u000001", "u000002"]).await;
    let mut c = common::config(&db, None, "truncate-no-redis");
    c.resources.push(common::users_resource("users"));
    let a = TestServer::start(c.clone(), 50).await;
    let b = TestServer::start(c, 0).await;
    for s in [&a, &b] {
        eventually(10, "ready", || async { s.get("/readyz").await.0 == 200 }).await;
        assert_eq!(s.get("/api/users/u000001").await.0, 200);
        assert_eq!(s.get("/api/seckill/7").await.0, 200);
    }
    let rebuilds = |s: &TestServer| {
        (
            s.state.skus.shield().stats().rebuilds,
            s.state.resources[0].shield().stats().rebuilds,
        )
    };
    let before = rebuilds(&b);
    sqlx::query("DELETE FROM users").execute(&w).await.unwrap();
    sqlx::query("DELETE FROM skus").execute(&w).await.unwrap();
    for path in ["/api/users/warm", "/api/cache/warm"] {
        let (status, body) = a
            .send(
                reqwest::Method::POST,
                path,
                Some(r#"{"limit":0,"rebuild_bloom":true}"#),
            )
            .await;
        assert_eq!(status, 200, "{path}: {body}");
    }
    // The next poll (100 ms without a doorbell), then B's rebuilds.
    eventually(3, "B rebuilt both filters and dropped its L1", || async {
        let now = rebuilds(&b);
        now.0 > before.0
            && now.1 > before.1
            && b.get("/api/users/u000001").await.0 == 404
            && b.get("/api/seckill/7").await.0 == 404
    })
    .await;
    a.stop().await;
    b.stop().await;
    w.close().await;
}
