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
    let key = format!("{}r:users:u000001", c.cache.redis_prefix);
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
