//! `cache.bloom_mode = "strict"` (issue 8): a "no" from the in-process
//! replica is confirmed against the shared filter in Redis before a 404.
//! A SKU that reached SQL and the shared filter but not this instance's
//! replica (the outbox has not delivered it) answers 200 in strict mode
//! and 404 in local mode; instances configured with another filter shape
//! are refused at start; a shared filter lost from Redis answers "maybe"
//! until it is refilled.

mod common;

use bloomgate_service::config::BloomMode;
use bloomgate_service::model::catalogue_sku;
use bloomgate_service::{AppState, StartError};
use common::{counter, eventually, TestServer};

const PREFIX: &str = "bgtest:strict:";

fn config(db: &str, redis: &str, mode: BloomMode) -> bloomgate_service::Config {
    let mut c = common::config(db, Some(redis), "strict");
    c.cache.bloom_mode = mode;
    c.cache.bloom_expected = 10_000;
    c.cache.bloom_fpp = 0.01;
    // Several segments, so the service's path over them is exercised.
    c.cache.bloom_segment_bytes = 2048;
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_replicas_no_is_confirmed_in_redis_and_a_lost_filter_answers_maybe() {
    let Some(redis) = common::redis_url().await else {
        return;
    };
    common::redis_clear(&redis, PREFIX).await;
    let dir = tempfile::tempdir().unwrap();
    let db = common::sqlite_url(&dir);
    let strict = TestServer::start(config(&db, &redis, BloomMode::Strict), 1000).await;
    let local = TestServer::start(config(&db, &redis, BloomMode::Local), 1000).await;
    let shared = strict
        .state
        .skus
        .shared()
        .cloned()
        .expect("strict has a shared filter");

    // A SKU committed to SQL and added to the shared filter behind both
    // instances' backs (as a create through a third instance whose change
    // has not reached them yet: local's outbox follower is parked).
    let parked = common::quiet_sql(&local).await;
    let sku = catalogue_sku(50_000);
    assert!(strict.state.skus.source().insert(&sku).await.unwrap());
    shared.insert(&sku.id).await;
    assert_eq!(
        strict.get("/api/seckill/50000").await.0,
        200,
        "strict finds it"
    );
    assert_eq!(
        local.get("/api/seckill/50000").await.0,
        404,
        "local refuses it"
    );
    parked.resume();
    let s = strict.stats().await;
    assert_eq!(counter(&s, &["shared", "overruled"]), 1, "{s}");
    assert_eq!(
        counter(&s, &["bloom", "rejected"]),
        0,
        "an overruled no is not a rejection"
    );

    // Ids in neither: both refuse; strict asked Redis once more.
    assert_eq!(strict.get("/api/seckill/900000000").await.0, 404);
    let s = strict.stats().await;
    assert_eq!(counter(&s, &["bloom", "rejected"]), 1);
    assert_eq!(counter(&s, &["shared", "checks"]), 2);
    assert_eq!(
        counter(&s, &["sql", "missing"]),
        0,
        "no SQL for a missing id"
    );

    // The shared filter lost (as with a Redis restart): a check answers
    // maybe (SQL then says 404), never a wrong no; it is refilled from SQL.
    let mut conn = common::redis_conn(&redis).await;
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{PREFIX}bloom*"))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(keys.len() > 3, "meta and several segments: {keys:?}");
    let _: () = redis::cmd("DEL")
        .arg(&keys)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(strict.get("/api/seckill/900000001").await.0, 404);
    assert_eq!(
        counter(&strict.stats().await, &["sql", "missing"]),
        1,
        "went to SQL"
    );
    eventually(10, "the shared filter is refilled", || async {
        counter(&strict.stats().await, &["shared", "refills"]) == 1
    })
    .await;
    assert!(shared.maybe_contains(&50_000i64).await, "refilled from SQL");
    assert_eq!(strict.get("/api/seckill/50000").await.0, 200);
    assert_eq!(strict.get("/api/seckill/900000002").await.0, 404);
    assert_eq!(
        counter(&strict.stats().await, &["sql", "missing"]),
        1,
        "rejected again"
    );
    strict.stop().await;
    local.stop().await;
}

#[tokio::test]
async fn an_instance_with_another_filter_shape_is_refused() {
    let Some(redis) = common::redis_url().await else {
        return;
    };
    common::redis_clear(&redis, "bgtest:strictshape:").await;
    let dir = tempfile::tempdir().unwrap();
    let db = common::sqlite_url(&dir);
    let mut a = config(&db, &redis, BloomMode::Strict);
    a.cache.redis_prefix = "bgtest:strictshape:".into();
    let first = AppState::connect(&a)
        .await
        .expect("the first one creates it");
    let mut b = a.clone();
    b.cache.bloom_expected = 20_000;
    let e = AppState::connect(&b).await.unwrap_err();
    assert!(matches!(e, StartError::Shared(_)), "{e}");
    let text = e.to_string();
    assert!(
        text.contains("bloom_expected") && text.contains("another shape"),
        "{text}"
    );
    first.skus.source().close().await;
}

#[test]
fn strict_without_redis_is_refused() {
    let mut c = bloomgate_service::Config::default();
    c.cache.bloom_mode = BloomMode::Strict;
    let e = c.validate().unwrap_err().to_string();
    assert!(
        e.contains("cache.bloom_mode") && e.contains("redis_url"),
        "{e}"
    );
}

/// `redis` mode, the go-zero/Redisson baseline: every check is one Redis
/// round trip, the replica is not asked; a create through it lands in the
/// shared filter; a lost filter answers maybe.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_mode_asks_redis_for_every_id_and_not_the_replica() {
    let Some(redis) = common::redis_url().await else {
        return;
    };
    let prefix = "bgtest:redismode:";
    common::redis_clear(&redis, prefix).await;
    let dir = tempfile::tempdir().unwrap();
    let db = common::sqlite_url(&dir);
    let mut c = config(&db, &redis, BloomMode::Redis);
    c.cache.redis_prefix = prefix.into();
    let server = TestServer::start(c, 1000).await;
    let shared = server
        .state
        .skus
        .shared()
        .cloned()
        .expect("a shared filter");

    // Seeded ids were added to the shared filter at its creation.
    assert_eq!(server.get("/api/seckill/1").await.0, 200);
    // Behind the replica's back: only the shared filter knows it.
    let sku = catalogue_sku(60_000);
    assert!(server.state.skus.source().insert(&sku).await.unwrap());
    shared.insert(&sku.id).await;
    let replica = server.state.skus.shield().probe(60_000);
    assert_ne!(
        replica,
        bloomgate_service::shield::Verdict::Pass,
        "the replica does not know it"
    );
    assert_eq!(
        server.get("/api/seckill/60000").await.0,
        200,
        "Redis decides"
    );
    // Absent ids: refused on Redis's word, no SQL.
    for id in 900_000_000..900_000_020 {
        assert_eq!(server.get(&format!("/api/seckill/{id}")).await.0, 404);
    }
    let s = server.stats().await;
    assert_eq!(
        counter(&s, &["shared", "checks"]),
        22,
        "one check per lookup: {s}"
    );
    assert_eq!(counter(&s, &["sql", "missing"]), 0, "{s}");
    assert_eq!(counter(&s, &["bloom", "rejected"]), 20, "{s}");
    assert_eq!(
        counter(&s, &["shared", "overruled"]),
        0,
        "nothing to overrule"
    );

    // The shared filter lost: a check answers maybe, SQL says 404.
    let mut conn = common::redis_conn(&redis).await;
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}bloom*"))
        .query_async(&mut conn)
        .await
        .unwrap();
    let _: () = redis::cmd("DEL")
        .arg(&keys)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(server.get("/api/seckill/900000100").await.0, 404);
    assert_eq!(counter(&server.stats().await, &["sql", "missing"]), 1);
    server.stop().await;
}

/// A create another instance recorded without reaching the shared filter
/// (its writer's tries all failed) is added by every follower, so strict
/// and redis modes do not refuse it for long.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_followed_create_reaches_the_shared_filter() {
    let Some(redis) = common::redis_url().await else {
        return;
    };
    common::redis_clear(&redis, PREFIX).await;
    let dir = tempfile::tempdir().unwrap();
    let db = common::sqlite_url(&dir);
    let a = TestServer::start(config(&db, &redis, BloomMode::Strict), 1000).await;
    let b = TestServer::start(config(&db, &redis, BloomMode::Strict), 0).await;
    let shared = a.state.skus.shared().cloned().expect("strict");
    let mut id = 60_000;
    while shared.maybe_contains(&id).await {
        id += 1;
    }
    // B's writer: the row and its entry, but no shared insert.
    assert!(b
        .state
        .skus
        .source()
        .insert(&catalogue_sku(id))
        .await
        .unwrap());
    b.state
        .skus
        .source()
        .record_many("skus", &[id.to_string()], "c")
        .await
        .unwrap();
    eventually(5, "A's follower shares the create", || {
        let shared = shared.clone();
        async move { shared.maybe_contains(&id).await }
    })
    .await;
    assert_eq!(a.get(&format!("/api/seckill/{id}")).await.0, 200);
    a.stop().await;
    b.stop().await;
}

/// `FLUSHALL` in `redis` and `strict` modes, then a create before any
/// check finds the filter gone: its insert must not recreate the lost
/// string as zeros (a plain `BITFIELD SET` did, up to its block, and
/// every older id of that segment then read as a definite "no": a 404
/// for a row that exists). Every seeded id answers 200 throughout; the
/// refill uploads whole segments, and afterwards absent ids are refused
/// again and the create is found.
async fn a_flush_is_never_read_as_no(mode: BloomMode) {
    let redis = common::OwnServer::redis().await;
    let dir = tempfile::tempdir().unwrap();
    let db = common::sqlite_url(&dir);
    let mut c = config(&db, &redis.url(), mode);
    // One segment: the zeros reached every id below the create's block.
    c.cache.bloom_segment_bytes = 16 * 1024;
    let server = TestServer::start(c, 1000).await;
    assert_eq!(server.get("/api/seckill/1").await.0, 200);
    let mut conn = common::redis_conn(&redis.url()).await;
    let _: () = redis::cmd("FLUSHALL").query_async(&mut conn).await.unwrap();
    assert_eq!(server.create(5_000, "after the flush").await, 201);
    // Its insert was refused: the lost string is not there as zeros.
    let exists: bool = redis::cmd("EXISTS")
        .arg(server.state.skus.shared().unwrap().key())
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(!exists, "{mode:?}: an insert recreated the flushed filter");
    for id in (1..=1000).chain([5_000]) {
        assert_eq!(
            server.get(&format!("/api/seckill/{id}")).await.0,
            200,
            "{mode:?}: id {id} after the flush"
        );
    }
    // An absent id: in strict mode the replica's "no" asks Redis, which
    // finds the filter gone (a "maybe": SQL answers) and refills it.
    assert_eq!(server.get("/api/seckill/900000000").await.0, 404);
    let shared = server.state.skus.shared().cloned().unwrap();
    eventually(10, "refilled", || async {
        shared
            .counters
            .refills
            .load(std::sync::atomic::Ordering::Relaxed)
            >= 1
    })
    .await;
    // Refilled: absent ids refused on the shared filter's word again
    // (redis mode asks it alone), and every id, the create too, found.
    eventually(5, "the shared filter answers no again", || async {
        !shared.maybe_contains(&900_000_123_i64).await
    })
    .await;
    for id in (1..=1000).chain([5_000]) {
        assert!(
            shared.maybe_contains(&id).await,
            "{mode:?}: {id} in the refilled filter"
        );
        assert_eq!(server.get(&format!("/api/seckill/{id}")).await.0, 200);
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_flush_is_never_read_as_no_in_redis_mode() {
    a_flush_is_never_read_as_no(BloomMode::Redis).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_flush_is_never_read_as_no_in_strict_mode() {
    a_flush_is_never_read_as_no(BloomMode::Strict).await;
}

/// A shared filter being filled by one instance is never read as "no" by
/// another. Before, the first instance created its segments as zeros and
/// inserted the table's keys a page at a time; a second instance that
/// started meanwhile found a whole filter, served at once, and in
/// `redis` mode answered 404 for every row not inserted yet. Now segments
/// appear only whole (built from the scan, then uploaded), so the second
/// finds them missing and fills them itself before it answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_shared_filter_still_being_filled_is_never_read_as_no() {
    let redis = common::OwnServer::redis().await;
    let dir = tempfile::tempdir().unwrap();
    let db = common::sqlite_url(&dir);
    const ROWS: u64 = 3_000;
    // The table first, by an instance without a shared filter.
    let seeder = TestServer::start(config(&db, &redis.url(), BloomMode::Local), ROWS).await;
    seeder.stop().await;
    let mut c = config(&db, &redis.url(), BloomMode::Redis);
    // A fill of about three seconds.
    c.cache.bloom_scan_rows_per_sec = 1_000;
    let first = tokio::spawn({
        let c = c.clone();
        async move { TestServer::start(c, 0).await }
    });
    let conn = common::redis_conn(&redis.url()).await;
    eventually(10, "the first instance created the filter", || {
        let mut conn = conn.clone();
        async move {
            // `{prefix}bloom:{tag}:meta`, the tag naming what it holds.
            !redis::cmd("KEYS")
                .arg(format!("{PREFIX}bloom:{}:meta", "[0-9a-f]".repeat(8)))
                .query_async::<Vec<String>>(&mut conn)
                .await
                .unwrap()
                .is_empty()
        }
    })
    .await;
    let second = TestServer::start(c, 0).await;
    for id in (1..=ROWS).rev().step_by(37) {
        assert_eq!(
            second.get(&format!("/api/seckill/{id}")).await.0,
            200,
            "id {id}: a 404 from a filter another instance was still filling"
        );
    }
    let first = first.await.unwrap();
    assert_eq!(first.get(&format!("/api/seckill/{ROWS}")).await.0, 200);
    first.stop().await;
    second.stop().await;
}
