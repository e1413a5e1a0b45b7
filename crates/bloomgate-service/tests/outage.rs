//! Redis failing while instances keep serving (issues 8 and 18): a create
//! whose change-log append fails is learned from the change outbox in SQL
//! at once, and its append is queued and sent once Redis answers, so the
//! other instances learn it without a rebuild; when Redis restarts
//! empty (no persistence), the followers see their position gone and
//! rebuild, so nothing created meanwhile is refused. Each test runs its own
//! redis-server on a free port.

mod common;

use bloomgate_service::gate::Verdict;
use common::{counter, eventually, sku_body, OwnServer, TestServer};
use reqwest::Method;

async fn create(server: &TestServer, id: i64) {
    let (s, body) = server
        .send(
            Method::POST,
            "/api/skus",
            Some(&sku_body(Some(id), "outage", 100)),
        )
        .await;
    assert_eq!(s, 201, "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn appends_that_fail_are_queued_and_replayed_and_a_lost_log_means_a_rebuild() {
    let mut redis = OwnServer::redis().await;
    let dir = tempfile::tempdir().unwrap();
    let db = common::sqlite_url(&dir);
    let url = redis.url();
    let a = TestServer::start(common::config(&db, Some(&url), "outage"), 500).await;
    let b = TestServer::start(common::config(&db, Some(&url), "outage"), 500).await;
    let rebuilds = |s: &serde_json::Value| counter(s, &["bloom", "rebuilds"]);
    let b_rebuilds = rebuilds(&b.stats().await);

    // Redis refuses writes (out of memory on this test's own server): A's
    // append fails for certain and is queued; B reads on.
    let mut admin = common::redis_conn(&url).await;
    let maxmemory = |v: &'static str| {
        redis::cmd("CONFIG")
            .arg("SET")
            .arg("maxmemory")
            .arg(v)
            .clone()
    };
    let _: () = maxmemory("1").query_async(&mut admin).await.unwrap();
    create(&a, 5000).await;
    let stats = a.stats().await;
    assert_eq!(counter(&stats, &["changes", "pending"]), 1, "{stats}");
    assert_eq!(
        a.get("/api/seckill/5000").await.0,
        200,
        "A knows its own create"
    );
    // The change committed with the row in SQL: B learns it from the
    // outbox while A's append still waits for Redis.
    eventually(5, "B learns it from the change outbox", || async {
        b.state.reader.gate.check(5000) != Verdict::Reject
    })
    .await;
    assert_eq!(
        counter(&a.stats().await, &["changes", "pending"]),
        1,
        "A's append still waits"
    );
    // B's filter already holds 5000 (from the outbox) and never forgets:
    // what only the replayed append can change is the count of log
    // entries B applied.
    let b_applied = counter(&b.stats().await, &["changes", "applied"]);
    let _: () = maxmemory("0").query_async(&mut admin).await.unwrap();
    eventually(15, "A's queue drains", || async {
        counter(&a.stats().await, &["changes", "pending"]) == 0
    })
    .await;
    assert_eq!(counter(&a.stats().await, &["changes", "replayed"]), 1);
    eventually(15, "the replayed append reaches B", || async {
        counter(&b.stats().await, &["changes", "applied"]) == b_applied + 1
    })
    .await;
    let stats = b.stats().await;
    assert_eq!(
        rebuilds(&stats),
        b_rebuilds,
        "B learned it from the outbox, and the replayed append as one more log entry, with no rebuild: {stats}"
    );
    assert_eq!(counter(&stats, &["changes", "gaps"]), 0);
    assert_eq!(b.get("/api/seckill/5000").await.0, 200);

    // Redis restarted empty: the log and its entries are gone. A create
    // during the outage, and whatever B had not read, can only be known
    // from SQL: B notices its position is gone and rebuilds.
    redis.stop().await;
    create(&a, 6000).await;
    redis.start().await;
    eventually(20, "B rebuilds after the lost log", || async {
        let s = b.stats().await;
        counter(&s, &["changes", "gaps"]) >= 1 && rebuilds(&s) > b_rebuilds
    })
    .await;
    for id in (1..=500).chain([5000, 6000]) {
        assert_ne!(
            b.state.reader.gate.check(id),
            Verdict::Reject,
            "B refuses {id}"
        );
    }
    eventually(15, "A's queue drains", || async {
        counter(&a.stats().await, &["changes", "pending"]) == 0
    })
    .await;
    // And the log works again: a create through B reaches A.
    create(&b, 7000).await;
    eventually(15, "B's create reaches A", || async {
        a.state.reader.gate.check(7000) != Verdict::Reject
    })
    .await;
    a.stop().await;
    b.stop().await;
}
