//! Seed 000's three scenarios end to end on MariaDB and Redis, counting SQL
//! work from MariaDB's own `Com_select` and Redis work from `INFO
//! commandstats`, and the contrast with the filter switched off.
//!
//! One test in this binary, so nothing else touches the global counters
//! while it measures.

mod common;

use common::{counter, TestServer};
use sqlx::Row;

async fn com_select(admin: &sqlx::AnyPool) -> i64 {
    let row = sqlx::query("SHOW GLOBAL STATUS LIKE 'Com_select'")
        .fetch_one(admin)
        .await
        .unwrap();
    row.try_get::<String, _>(1).unwrap().parse().unwrap()
}

async fn redis_calls(conn: &mut redis::aio::MultiplexedConnection) -> i64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .unwrap();
    info.lines()
        .filter(|l| {
            ["get", "set", "del", "eval", "evalsha"]
                .iter()
                .any(|c| l.starts_with(&format!("cmdstat_{c}:")))
        })
        .filter_map(|l| {
            l.split("calls=")
                .nth(1)?
                .split(',')
                .next()?
                .parse::<i64>()
                .ok()
        })
        .sum()
}

/// The `"bloom":{…}` object as seed 000's `grep -o '"bloom":{[^}]*}'` finds it:
/// the grep prints one line, as the article shows, so the body holds one
/// `"bloom":{` (a resource's filter object is named `filter`).
fn grep_bloom(body: &str) -> serde_json::Value {
    assert_eq!(
        body.matches("\"bloom\":{").count(),
        1,
        "seed 000's grep prints exactly one line: {body}"
    );
    let start = body.find("\"bloom\":{").expect("a bloom object");
    let rest = &body[start + "\"bloom\":".len()..];
    let end = rest.find('}').expect("flat object") + 1;
    serde_json::from_str(&rest[..end]).expect("the grep finds a complete flat object")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn seed_000_scenarios_on_mariadb_and_redis() {
    let (Some(db), Some(redis_url)) = (
        common::mysql_database("seed_scenarios").await,
        common::redis_url().await,
    ) else {
        return;
    };
    let prefix = "seed";
    common::redis_clear(&redis_url, "bgtest:seed:").await;
    common::redis_clear(&redis_url, "bgtest:seed-off:").await;
    let mut config = common::config(&db, Some(&redis_url), prefix);
    // The outbox follower is parked while SQL statements are counted: it
    // must not count as out of step meanwhile.
    config.sql.out_of_step_ms = 600_000;
    // Scenario 1 starts from an unbuilt filter, as after a restart.
    config.cache.bloom_build_on_start = false;
    let server = TestServer::start(config.clone(), 200_000).await;
    let admin = sqlx::AnyPool::connect(common::MYSQL_ADMIN_URL)
        .await
        .unwrap();
    let mut redis = common::redis_conn(&redis_url).await;

    // Scenario 1: warm + rebuild, then the stats grep shows the filter ready.
    let (status, body) = server
        .send(
            reqwest::Method::POST,
            "/api/cache/warm",
            Some(r#"{"limit":1000,"rebuild_bloom":true}"#),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["warmed"], 1000);
    assert_eq!(body["rebuild_bloom"]["added"], 200_000);
    let bloom = grep_bloom(&server.stats_text().await);
    assert_eq!(bloom["enabled"], true);
    assert_eq!(bloom["ready"], true);
    assert_eq!(bloom["added"], 200_000);
    assert_eq!(bloom["rejected"], 0);
    assert!(bloom["bits"].as_u64().unwrap() > 7_000_000);
    assert!(bloom["hashes"].as_u64().unwrap() >= 8);
    let keys: Vec<&str> = bloom
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(
        &keys[..6],
        ["enabled", "ready", "added", "rejected", "bits", "hashes"],
        "seed 000's order"
    );
    let keys = common::redis_keys(&mut redis, "bgtest:seed:").await;
    // The warm's 1,000 SKUs (the doorbell stream, the rebuilt filter
    // shared as epoch 1, with its metadata and counter, and Redis's
    // identity its number counts in, apart).
    assert!(
        keys.iter().any(|k| k.ends_with(":bloom:epoch:1:seg:0")),
        "{keys:?}"
    );
    let rows: Vec<&String> = keys
        .iter()
        .filter(|k| {
            !k.ends_with(":changes") && !k.contains(":bloom:epoch") && !k.ends_with(":redis:id")
        })
        .collect();
    assert_eq!(
        rows.len(),
        1000,
        "{:?}",
        rows.iter()
            .filter(|k| !k.contains(":sku:"))
            .collect::<Vec<_>>()
    );

    // Scenario 2: 100 requests for 200100: all rejected in process. The
    // change-outbox follower is parked while SQL statements are counted.
    let quiet = common::quiet_sql(&server).await;
    let sql_before = com_select(&admin).await;
    let redis_before = redis_calls(&mut redis).await;
    for _ in 0..100 {
        let (status, body) = server.get("/api/seckill/200100").await;
        assert_eq!(status, 404);
        assert_eq!(body["error"], "not_found");
    }
    let stats = server.stats().await;
    assert_eq!(counter(&stats, &["bloom", "rejected"]), 100);
    assert_eq!(com_select(&admin).await - sql_before, 0, "SQL was queried");
    assert_eq!(
        redis_calls(&mut redis).await - redis_before,
        0,
        "Redis was queried"
    );
    assert_eq!(counter(&stats, &["sql", "queries"]), 0);

    // Scenario 3: 5,000 distinct random missing ids.
    let ids: Vec<u64> = (0..5000u64)
        .map(|i| 200_001 + bloomgate_filter::hash::splitmix64(i) % 9_800_000)
        .collect();
    let keys_before = common::redis_keys(&mut redis, "bgtest:seed:").await.len() as i64;
    let sql_before = com_select(&admin).await;
    for id in &ids {
        assert_eq!(server.get(&format!("/api/seckill/{id}")).await.0, 404);
    }
    let stats = server.stats().await;
    let through = counter(&stats, &["bloom", "passed"]);
    let sql_delta = com_select(&admin).await - sql_before;
    let key_delta = common::redis_keys(&mut redis, "bgtest:seed:").await.len() as i64 - keys_before;
    eprintln!("filter on: 5000 random ids -> {through} passed the filter, {sql_delta} SQL selects, {key_delta} new Redis keys");
    assert!(counter(&stats, &["bloom", "rejected"]) >= 100 + 4980);
    // At most a handful of false positives (expected ~0.01 at this load).
    assert!(sql_delta <= 5, "{sql_delta} SQL selects");
    assert!(key_delta <= 5, "{key_delta} Redis keys");
    assert_eq!(sql_delta, through, "every pass-through is one SQL select");
    quiet.resume();

    // Existing ids still answer 200 (no false negatives through HTTP).
    for id in [1u64, 2, 1000, 1001, 77_777, 199_999, 200_000] {
        let (status, body) = server.get(&format!("/api/seckill/{id}")).await;
        assert_eq!(status, 200, "id {id}");
        assert_eq!(body["id"], id);
    }
    server.stop().await;

    // The contrast: the same stream with the filter off (null caching only).
    let mut off = common::config(&db, Some(&redis_url), "seed-off");
    off.sql.out_of_step_ms = 600_000;
    off.cache.bloom_enabled = false;
    let server = TestServer::start(off, 0).await;
    let quiet = common::quiet_sql(&server).await;
    let keys_before = common::redis_keys(&mut redis, "bgtest:seed-off:")
        .await
        .len() as i64;
    let sql_before = com_select(&admin).await;
    for id in &ids[..1000] {
        assert_eq!(server.get(&format!("/api/seckill/{id}")).await.0, 404);
    }
    let sql_delta = com_select(&admin).await - sql_before;
    let key_delta = common::redis_keys(&mut redis, "bgtest:seed-off:")
        .await
        .len() as i64
        - keys_before;
    eprintln!("filter off: 1000 random ids -> {sql_delta} SQL selects, {key_delta} new Redis keys");
    assert_eq!(sql_delta, 1000);
    assert_eq!(key_delta, 1000, "one __nil__ sentinel per id");
    quiet.resume();
    let bloom = grep_bloom(&server.stats_text().await);
    assert_eq!(bloom["enabled"], false);
    assert_eq!(bloom["ready"], false);
    server.stop().await;
    common::redis_clear(&redis_url, "bgtest:seed:").await;
    common::redis_clear(&redis_url, "bgtest:seed-off:").await;
}
