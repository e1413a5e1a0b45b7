//! Redis failing while instances keep serving (issues 8, 18 and 30): a
//! create whose doorbell ring fails is learned from the change outbox in
//! SQL at the next poll; when Redis restarts empty (no persistence), the
//! followers find their stream position gone, read the outbox and go on:
//! nothing created meanwhile is refused, and nothing is rebuilt. Each test
//! runs its own redis-server on a free port.

mod common;

use bloomgate_service::shield::Verdict;
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
async fn a_failed_ring_or_a_lost_stream_costs_latency_never_a_create() {
    let mut redis = OwnServer::redis().await;
    let dir = tempfile::tempdir().unwrap();
    let db = common::sqlite_url(&dir);
    let url = redis.url();
    let a = TestServer::start(common::config(&db, Some(&url), "outage"), 500).await;
    let b = TestServer::start(common::config(&db, Some(&url), "outage"), 500).await;
    let rebuilds = |s: &serde_json::Value| counter(s, &["bloom", "rebuilds"]);
    let b_rebuilds = rebuilds(&b.stats().await);

    // Redis refuses writes (out of memory on this test's own server): A's
    // ring fails for certain; B reads on.
    let mut admin = common::redis_conn(&url).await;
    let maxmemory = |v: &'static str| {
        redis::cmd("CONFIG")
            .arg("SET")
            .arg("maxmemory")
            .arg(v)
            .clone()
    };
    let _: () = maxmemory("1").query_async(&mut admin).await.unwrap();
    let failures = counter(&a.stats().await, &["changes", "publish_failures"]);
    create(&a, 5000).await;
    assert_eq!(
        counter(&a.stats().await, &["changes", "publish_failures"]),
        failures + 1,
        "the ring failed"
    );
    assert_eq!(
        a.get("/api/seckill/5000").await.0,
        200,
        "A knows its own create"
    );
    // The change committed with the row in SQL: B learns it from the
    // outbox at its next poll, with no ring.
    eventually(5, "B learns it from the change outbox", || async {
        b.state.skus.shield().check(5000) != Verdict::Reject
    })
    .await;
    let _: () = maxmemory("0").query_async(&mut admin).await.unwrap();
    assert_eq!(b.get("/api/seckill/5000").await.0, 200);
    // Rings go out again: B's stream position is now a real entry.
    let heard = counter(&b.stats().await, &["changes", "applied"]);
    create(&a, 5500).await;
    eventually(15, "A's ring reaches B", || async {
        counter(&b.stats().await, &["changes", "applied"]) > heard
    })
    .await;

    // Redis restarted empty: the stream is gone. A create during the
    // outage is in the outbox: B finds its position gone, reads the outbox
    // and goes on, with no rebuild.
    redis.stop().await;
    // A doorbell whose read fails says so at once: B polls at
    // `outbox_poll_ms` from now, not after the 3 s a silent one is given.
    eventually(1, "B knows its doorbell is gone", || async {
        !b.state.outbox.doorbell_healthy()
    })
    .await;
    create(&a, 6000).await;
    redis.start().await;
    eventually(20, "B notices the lost stream", || async {
        counter(&b.stats().await, &["changes", "gaps"]) >= 1
    })
    .await;
    for id in (1..=500).chain([5000, 5500, 6000]) {
        assert_ne!(
            b.state.skus.shield().check(id),
            Verdict::Reject,
            "B refuses {id}"
        );
    }
    // And the doorbell works again: a create through B reaches A within
    // milliseconds, not at A's next idle poll.
    let before = counter(&a.stats().await, &["changes", "applied"]);
    create(&b, 7000).await;
    eventually(15, "B's create reaches A", || async {
        a.state.skus.shield().check(7000) != Verdict::Reject
    })
    .await;
    eventually(15, "B's ring reaches A", || async {
        counter(&a.stats().await, &["changes", "applied"]) > before
    })
    .await;
    let stats = b.stats().await;
    assert_eq!(rebuilds(&stats), b_rebuilds, "nothing rebuilt: {stats}");
    a.stop().await;
    b.stop().await;
}

/// A SKU create's ring names it: B adds it to its filter from the ring
/// alone, while its outbox follower is parked (the outbox still vouches;
/// the name only closes `local` mode's window sooner).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_create_ring_names_the_id_for_the_other_filters() {
    let redis = OwnServer::redis().await;
    let dir = tempfile::tempdir().unwrap();
    let db = common::sqlite_url(&dir);
    let url = redis.url();
    let a = TestServer::start(common::config(&db, Some(&url), "ring-hint"), 100).await;
    let b = TestServer::start(common::config(&db, Some(&url), "ring-hint"), 100).await;
    let parked = b.state.outbox.before_poll.arm(0);
    parked.reached().await;
    create(&a, 4242).await;
    eventually(5, "B's filter learns 4242 from the ring", || async {
        b.state.skus.shield().published().unwrap().contains(4242)
    })
    .await;
    assert!(counter(&b.stats().await, &["changes", "applied"]) >= 1);
    // An older version's entry in a rolling deploy (`c` with `id`) is
    // learned the same way.
    let mut conn = common::redis_conn(&url).await;
    let _: String = redis::cmd("XADD")
        .arg("bgtest:ring-hint:changes")
        .arg("*")
        .arg("id")
        .arg(4343)
        .arg("kind")
        .arg("c")
        .arg("from")
        .arg("an-older-instance")
        .query_async(&mut conn)
        .await
        .unwrap();
    eventually(5, "B's filter learns 4343 from the older entry", || async {
        b.state.skus.shield().published().unwrap().contains(4343)
    })
    .await;
    parked.resume();
    a.stop().await;
    b.stop().await;
}
