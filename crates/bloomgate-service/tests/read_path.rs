//! The read path and the write endpoints on SQLite and Redis: single flight,
//! the sentinel's NX rule, TTL jitter, invalidation, creation during a
//! rebuild, input errors and admin auth.

mod common;

use std::sync::atomic::Ordering;

use common::{counter, seen, sku_body, TestServer};
use reqwest::Method;

async fn sqlite_server(
    dir: &tempfile::TempDir,
    redis: Option<&str>,
    prefix: &str,
    seed: u64,
    f: impl FnOnce(&mut bloomgate_service::Config),
) -> TestServer {
    let mut config = common::config(&common::sqlite_url(dir), redis, prefix);
    f(&mut config);
    if let Some(url) = redis {
        common::redis_clear(url, &config.cache.redis_prefix).await;
    }
    TestServer::start(config, seed).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_misses_share_one_sql_query() {
    let Some(redis) = common::redis_url().await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let server = sqlite_server(&dir, Some(&redis), "flight", 1000, |_| {}).await;
    let before = server
        .state
        .skus
        .source()
        .counters
        .queries
        .load(Ordering::Relaxed);
    let requests = (0..500).map(|_| server.get("/api/seckill/777"));
    let answers = futures_util::future::join_all(requests).await;
    assert!(answers.iter().all(|(s, b)| *s == 200 && b["id"] == 777));
    let after = server
        .state
        .skus
        .source()
        .counters
        .queries
        .load(Ordering::Relaxed);
    let stats = server.stats().await;
    // (Seen once under CI with 0 queries and every answer 200, not
    // reproduced since: the stats say where the answers came from.)
    assert_eq!(
        after - before,
        1,
        "500 concurrent misses, one SQL query; stats: {stats}"
    );
    assert_eq!(counter(&stats, &["redis", "misses"]), 1);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_misses_of_a_missing_id_share_one_query_and_one_sentinel() {
    let Some(redis) = common::redis_url().await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    // Filter off, so the missing id reaches the caches.
    let server = sqlite_server(&dir, Some(&redis), "flight-nil", 100, |c| {
        c.cache.bloom_enabled = false
    })
    .await;
    let answers =
        futures_util::future::join_all((0..500).map(|_| server.get("/api/seckill/5000"))).await;
    assert!(answers.iter().all(|(s, _)| *s == 404));
    assert_eq!(
        server
            .state
            .skus
            .source()
            .counters
            .queries
            .load(Ordering::Relaxed),
        1
    );
    let mut conn = common::redis_conn(&redis).await;
    let v: String = redis::cmd("GET")
        .arg("bgtest:flight-nil:sku:5000")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(v, "__nil__");
    // Later reads are answered by L1's negative entry, then the sentinel.
    let negative = counter(&server.stats().await, &["l1", "negative_hits"]);
    assert_eq!(server.get("/api/seckill/5000").await.0, 404);
    assert_eq!(
        counter(&server.stats().await, &["l1", "negative_hits"]),
        negative + 1
    );
    server.state.skus.forget_local_key(&5000);
    assert_eq!(counter(&server.stats().await, &["redis", "nil_hits"]), 0);
    assert_eq!(server.get("/api/seckill/5000").await.0, 404);
    assert_eq!(counter(&server.stats().await, &["redis", "nil_hits"]), 1);
    assert_eq!(
        server
            .state
            .skus
            .source()
            .counters
            .queries
            .load(Ordering::Relaxed),
        1
    );
    server.stop().await;
}

#[tokio::test]
async fn only_the_lease_holder_fills_a_key_and_a_delete_revokes_its_lease() {
    use bloomgate_service::cache::RedisLookup;
    use bloomgate_service::model::Sku;
    let Some(redis) = common::redis_url().await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let server = sqlite_server(&dir, Some(&redis), "lease", 10, |_| {}).await;
    let tier = server.state.skus.redis().cloned().unwrap();
    let sku = bloomgate_service::model::catalogue_sku(3);
    // The first miss takes the lease; a second reader gets none.
    let RedisLookup::Miss(Some(lease)) = tier.lookup::<Sku>(3).await.unwrap() else {
        panic!("first miss takes a lease");
    };
    assert!(matches!(
        tier.lookup::<Sku>(3).await.unwrap(),
        RedisLookup::Miss(None)
    ));
    assert!(tier.fill(3, &lease, Some(&sku)).await.unwrap());
    assert!(matches!(tier.lookup::<Sku>(3).await.unwrap(), RedisLookup::Hit(s) if s == sku));
    // A sentinel never overwrites a value: the lease is spent.
    assert!(!tier.fill(3, &lease, None::<&Sku>).await.unwrap());
    assert!(matches!(
        tier.lookup::<Sku>(3).await.unwrap(),
        RedisLookup::Hit(_)
    ));
    // A write's DEL between lookup and fill revokes the lease: nothing is
    // written, and the next reader leases afresh.
    let RedisLookup::Miss(Some(old)) = tier.lookup::<Sku>(4).await.unwrap() else {
        panic!("miss takes a lease");
    };
    tier.invalidate(4).await.unwrap();
    assert!(!tier.fill(4, &old, None::<&Sku>).await.unwrap());
    assert_eq!(tier.raw(4).await.unwrap(), None);
    let RedisLookup::Miss(Some(fresh)) = tier.lookup::<Sku>(4).await.unwrap() else {
        panic!("a new lease after the delete");
    };
    assert!(tier.fill(4, &fresh, None::<&Sku>).await.unwrap());
    assert!(matches!(
        tier.lookup::<Sku>(4).await.unwrap(),
        RedisLookup::Nil
    ));
    assert_eq!(
        tier.counters.fills_refused.load(Ordering::Relaxed),
        2,
        "two refused fills"
    );
    // A key is taken over only while it holds what was read: a change's
    // DEL (or another value) in between refuses the lease.
    let held = tier.raw(4).await.unwrap().unwrap();
    assert_eq!(tier.lease_if_holds(4, b"other").await.unwrap(), None);
    assert_eq!(tier.raw(4).await.unwrap().as_deref(), Some(&*held));
    let taken = tier.lease_if_holds(4, held.as_bytes()).await.unwrap();
    let taken = taken.expect("leased while it holds what was read");
    assert!(tier.fill(4, &taken, Some(&sku)).await.unwrap());
    tier.invalidate(4).await.unwrap();
    assert_eq!(tier.lease_if_holds(4, held.as_bytes()).await.unwrap(), None);
    assert_eq!(tier.raw(4).await.unwrap(), None, "nothing set after a DEL");
    server.stop().await;
}

/// A Redis hit answers the value's own JSON, not encoded again; a value
/// that does not decode as the row (a field this version does not know)
/// is deleted, never served.
#[tokio::test]
async fn a_redis_hit_answers_its_own_json_and_a_foreign_value_is_dropped() {
    use bloomgate_service::cache::{Reach, RedisLookup};
    use bloomgate_service::model::Sku;
    let Some(redis) = common::redis_url().await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let server = sqlite_server(&dir, Some(&redis), "rawjson", 10, |_| {}).await;
    let tier = server.state.skus.redis().cloned().unwrap();
    let mut conn = common::redis_conn(&redis).await;
    let sku = bloomgate_service::model::catalogue_sku(5);
    let written = serde_json::to_string(&sku).unwrap();
    let _: () = redis::cmd("SET")
        .arg(tier.key(5))
        .arg(&written)
        .query_async(&mut conn)
        .await
        .unwrap();
    let Some(RedisLookup::Hit(hit)) = tier.lookup_cached::<Sku>(5, Reach::Get).await.unwrap()
    else {
        panic!("a hit");
    };
    assert_eq!(hit.row, sku);
    assert_eq!(&hit.json[..], written.as_bytes());
    let text = |path: &'static str| {
        let (client, url) = (server.client.clone(), server.url(path));
        async move {
            let r = client.get(url).send().await.unwrap();
            (r.status().as_u16(), r.text().await.unwrap())
        }
    };
    let (status, body) = text("/api/seckill/5").await;
    assert_eq!((status, body.as_str()), (200, written.as_str()));
    // A foreign value: a field the row does not have.
    let foreign = written.replacen('{', r#"{"admin_note":"x","#, 1);
    let _: () = redis::cmd("SET")
        .arg(tier.key(6))
        .arg(&foreign)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(matches!(
        tier.lookup_cached::<Sku>(6, Reach::Get).await.unwrap(),
        Some(RedisLookup::Miss(None))
    ));
    assert_eq!(tier.raw(6).await.unwrap(), None, "deleted");
    let (status, body) = text("/api/seckill/6").await;
    assert_eq!(status, 200);
    assert!(!body.contains("admin_note"), "{body}");
    server.stop().await;
}

#[tokio::test]
async fn warmed_ttls_are_jittered_within_ten_percent() {
    let Some(redis) = common::redis_url().await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let server = sqlite_server(&dir, Some(&redis), "ttl", 500, |c| {
        c.cache.redis_ttl_secs = 1000
    })
    .await;
    let (status, body) = server
        .send(Method::POST, "/api/cache/warm", Some(r#"{"limit":500}"#))
        .await;
    assert_eq!(status, 200, "{body}");
    let mut conn = common::redis_conn(&redis).await;
    let mut ttls = Vec::new();
    for id in 1..=500 {
        let ttl: i64 = redis::cmd("TTL")
            .arg(format!("bgtest:ttl:sku:{id}"))
            .query_async(&mut conn)
            .await
            .unwrap();
        ttls.push(ttl);
    }
    let (min, max) = (*ttls.iter().min().unwrap(), *ttls.iter().max().unwrap());
    assert!(min >= 895 && max <= 1100, "ttls in [{min}, {max}]");
    let distinct: std::collections::HashSet<_> = ttls.iter().collect();
    assert!(distinct.len() > 50, "only {} distinct TTLs", distinct.len());
    assert!(max - min > 100, "spread {}", max - min);
    server.stop().await;
}

/// A warm larger than one round trip can carry within the Redis command
/// timeout still writes every key: the fills go in chunks, as the leases
/// do. (In one pipeline, 200,000 fills outlasted the default 50 ms and
/// the warm wrote nothing.) The timeout here, 250 ms, is five times the
/// default, so a chunk of 1000 meets it on a loaded machine, and still a
/// fraction of what 100,000 fills in one pipeline take (Redis alone runs
/// 100,000 EVALs in about half a second).
#[tokio::test]
async fn a_large_warm_fills_redis_in_round_trips_under_the_timeout() {
    let Some(redis) = common::redis_url().await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let n = 100_000;
    let server = sqlite_server(&dir, Some(&redis), "bigwarm", n, |c| {
        c.cache.redis_timeout_ms = 250;
    })
    .await;
    let (status, body) = server
        .send(
            Method::POST,
            "/api/cache/warm",
            Some(&format!(r#"{{"limit":{n}}}"#)),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert!(body["redis_error"].is_null(), "{body}");
    assert_eq!(body["redis_written"], n, "{body}");
    let mut conn = common::redis_conn(&redis).await;
    let last: Option<String> = redis::cmd("GET")
        .arg(format!("bgtest:bigwarm:sku:{n}"))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(last.is_some_and(|v| v.contains(&format!("\"id\":{n}"))));
    server.stop().await;
}

#[tokio::test]
async fn update_and_delete_invalidate_both_cache_levels() {
    let Some(redis) = common::redis_url().await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let server = sqlite_server(&dir, Some(&redis), "inval", 100, |_| {}).await;
    let (s, before) = server.get("/api/seckill/42").await;
    assert_eq!(s, 200);
    let (s, _) = server.put_sku(42, "renamed", 5000).await;
    assert_eq!(s, 200);
    let (s, after) = server.get("/api/seckill/42").await;
    assert_eq!(s, 200);
    assert_eq!(after["name"], "renamed");
    assert_ne!(before["name"], after["name"]);
    let (s, body) = server.send(Method::DELETE, "/api/skus/42", None).await;
    assert_eq!((s, body["deleted"].as_i64()), (200, Some(42)));
    assert_eq!(server.get("/api/seckill/42").await.0, 404);
    // Deleting or updating what is gone is a 404.
    assert_eq!(
        server.send(Method::DELETE, "/api/skus/42", None).await.0,
        404
    );
    assert_eq!(
        server
            .send(Method::PUT, "/api/skus/42", Some(&sku_body(None, "x", 10)))
            .await
            .0,
        404
    );
    assert_eq!(
        counter(&server.stats().await, &["bloom", "deleted_since_build"]),
        1
    );
    server.stop().await;
}

#[tokio::test]
async fn created_sku_is_visible_at_once_even_after_a_cached_miss() {
    let Some(redis) = common::redis_url().await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    // Filter off first, so a 404 for the id gets cached in L1 and Redis.
    let server = sqlite_server(&dir, Some(&redis), "create", 100, |c| {
        c.cache.bloom_enabled = false
    })
    .await;
    assert_eq!(server.get("/api/seckill/150").await.0, 404);
    let (s, body) = server
        .send(
            Method::POST,
            "/api/skus",
            Some(&sku_body(Some(150), "new", 900)),
        )
        .await;
    assert_eq!(s, 201, "{body}");
    let (s, body) = server.get("/api/seckill/150").await;
    assert_eq!((s, body["name"].as_str()), (200, Some("new")));
    // A duplicate id conflicts; no id picks the next free one.
    assert_eq!(
        server
            .send(
                Method::POST,
                "/api/skus",
                Some(&sku_body(Some(150), "dup", 900))
            )
            .await
            .0,
        409
    );
    let (s, body) = server
        .send(
            Method::POST,
            "/api/skus",
            Some(&sku_body(None, "auto", 900)),
        )
        .await;
    assert_eq!((s, body["id"].as_i64()), (201, Some(151)));
    server.stop().await;

    // With the filter on: the new id enters the filter before the response.
    let dir = tempfile::tempdir().unwrap();
    let server = sqlite_server(&dir, Some(&redis), "create-bloom", 100, |_| {}).await;
    assert_eq!(server.get("/api/seckill/300").await.0, 404);
    assert_eq!(counter(&server.stats().await, &["bloom", "rejected"]), 1);
    assert_eq!(
        server
            .send(
                Method::POST,
                "/api/skus",
                Some(&sku_body(Some(300), "fresh", 900))
            )
            .await
            .0,
        201
    );
    assert_eq!(server.get("/api/seckill/300").await.0, 200);
    assert_eq!(counter(&server.stats().await, &["bloom", "added"]), 101);
    server.stop().await;
}

type RebuildTask = tokio::task::JoinHandle<
    Result<bloomgate_service::shield::RebuildReport, bloomgate_service::shield::RebuildError>,
>;

/// Starts a filter rebuild in the background and returns once it is running.
async fn start_rebuild(server: &TestServer) -> RebuildTask {
    let gate = std::sync::Arc::clone(server.state.skus.shield());
    let rebuild = tokio::spawn(async move { gate.rebuild().await });
    while !server.state.skus.shield().is_rebuilding() {
        tokio::task::yield_now().await;
    }
    rebuild
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn skus_created_during_a_rebuild_are_in_the_published_filter() {
    let dir = tempfile::tempdir().unwrap();
    let server = sqlite_server(&dir, None, "rebuild", 200_000, |_| {}).await;
    let gate = server.state.skus.shield();
    // The rebuild holds after its SQL scan, before it publishes: every
    // create below runs while it is in progress, and none is in its scan.
    let pause = gate.after_scan.arm(0);
    let rebuild = start_rebuild(&server).await;
    pause.reached().await;
    let created: Vec<i64> = (300_000..300_020).collect();
    for &id in &created {
        let (s, body) = server
            .send(
                Method::POST,
                "/api/skus",
                Some(&sku_body(Some(id), "during", 100)),
            )
            .await;
        assert_eq!(s, 201, "{body}");
        assert!(gate.is_rebuilding(), "create {id} after the rebuild ended");
    }
    assert!(
        !rebuild.is_finished(),
        "the rebuild went on without resuming"
    );
    pause.resume();
    let report = rebuild.await.unwrap().unwrap();
    assert_eq!(report.added, 200_000, "the scan ran before the creates");
    // Every id created while the rebuild ran answers 200 from the new filter.
    server.state.skus.forget_local();
    for id in &created {
        assert_eq!(
            server.get(&format!("/api/seckill/{id}")).await.0,
            200,
            "id {id}"
        );
    }
    server.stop().await;
}

#[tokio::test]
async fn bad_input_is_a_json_400() {
    let dir = tempfile::tempdir().unwrap();
    let server = sqlite_server(&dir, None, "bad", 10, |_| {}).await;
    for path in [
        "abc",
        "0",
        "-5",
        "1.5",
        "9223372036854775808",
        "99999999999999999999",
        "%20",
    ] {
        let (s, body) = server.get(&format!("/api/seckill/{path}")).await;
        assert_eq!(s, 400, "{path}");
        assert_eq!(body["error"], "bad_request", "{path}");
    }
    assert_eq!(server.get("/api/seckill/9223372036854775807").await.0, 404);
    let cases = [
        (Method::POST, "/api/cache/warm", "{not json"),
        (Method::POST, "/api/cache/warm", r#"{"limit":-1}"#),
        (Method::POST, "/api/cache/warm", r#"{"limit":"ten"}"#),
        (Method::POST, "/api/cache/warm", r#"{"limit":5000000}"#),
        (Method::POST, "/api/cache/warm", r#"{"limitt":5}"#),
        (Method::POST, "/api/skus", "[]"),
        (Method::POST, "/api/skus", r#"{"name":"x"}"#),
        (Method::POST, "/api/skus", &sku_body(Some(-3), "neg", 100)),
        (Method::POST, "/api/skus", &sku_body(Some(20), "", 100)),
        (Method::PUT, "/api/skus/abc", &sku_body(None, "x", 100)),
        (Method::PUT, "/api/skus/5", &sku_body(Some(6), "x", 100)),
        (Method::DELETE, "/api/skus/0", ""),
    ];
    for (method, path, body) in cases {
        let (s, reply) = server.send(method.clone(), path, Some(body)).await;
        assert_eq!(s, 400, "{method} {path} {body}: {reply}");
        assert_eq!(reply["error"], "bad_request");
        assert!(reply["message"].as_str().is_some_and(|m| !m.is_empty()));
    }
    let (s, body) = server.get("/no/such/route").await;
    assert_eq!((s, body["error"].as_str()), (404, Some("not_found")));

    // Error messages quote at most 64 characters of a bad input.
    let long_id = "9".repeat(5000);
    let long_field = format!(r#"{{"{}":1}}"#, "x".repeat(5000));
    let long_value = format!(r#"{{"limit":"{}"}}"#, "y".repeat(5000));
    for (method, path, body, needle) in [
        (
            Method::GET,
            format!("/api/seckill/{long_id}"),
            String::new(),
            '9',
        ),
        (Method::POST, "/api/cache/warm".into(), long_field, 'x'),
        (Method::POST, "/api/cache/warm".into(), long_value, 'y'),
    ] {
        let (s, reply) = server.send(method, &path, Some(&body)).await;
        assert_eq!(s, 400, "{reply}");
        let message = reply["message"].as_str().unwrap();
        let longest_run = message
            .split(|c| c != needle)
            .map(str::len)
            .max()
            .unwrap_or(0);
        assert_eq!(longest_run, 64, "{message}");
        assert!(message.len() < 200, "{message}");
    }
    server.stop().await;
}

#[tokio::test]
async fn the_largest_id_is_served_and_leaves_no_automatic_next_one() {
    let dir = tempfile::tempdir().unwrap();
    let server = sqlite_server(&dir, None, "maxid", 10, |_| {}).await;
    let (s, body) = server
        .send(
            Method::POST,
            "/api/skus",
            Some(&sku_body(Some(i64::MAX), "last", 100)),
        )
        .await;
    assert_eq!(s, 201, "{body}");
    let (s, body) = server.get(&format!("/api/seckill/{}", i64::MAX)).await;
    assert_eq!((s, body["name"].as_str()), (200, Some("last")));
    // No id follows i64::MAX: a clear 409, and nothing is written.
    let (s, body) = server
        .send(
            Method::POST,
            "/api/skus",
            Some(&sku_body(None, "auto", 100)),
        )
        .await;
    assert_eq!(
        (s, body["error"].as_str()),
        (409, Some("conflict")),
        "{body}"
    );
    assert!(
        body["message"].as_str().unwrap().contains("explicit id"),
        "{body}"
    );
    assert_eq!(server.state.skus.source().count().await.unwrap(), 11);
    // An explicit id still works.
    let (s, _) = server
        .send(
            Method::POST,
            "/api/skus",
            Some(&sku_body(Some(11), "eleven", 100)),
        )
        .await;
    assert_eq!(s, 201);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn classic_layout_gives_seed_000s_exact_stats_line() {
    let dir = tempfile::tempdir().unwrap();
    let server = sqlite_server(&dir, None, "classic", 200_000, |c| {
        c.cache.bloom_layout = bloomgate_service::config::BloomLayout::Classic;
    })
    .await;
    let (s, body) = server
        .send(
            Method::POST,
            "/api/cache/warm",
            Some(r#"{"limit":1000,"rebuild_bloom":true}"#),
        )
        .await;
    assert_eq!(s, 200, "{body}");
    let text = server.stats_text().await;
    assert!(
        text.contains(
            r#""bloom":{"enabled":true,"ready":true,"added":200000,"rejected":0,"bits":7188794,"hashes":10,"layout":"classic""#
        ),
        "{text}"
    );
    for _ in 0..100 {
        assert_eq!(server.get("/api/seckill/200100").await.0, 404);
    }
    assert_eq!(counter(&server.stats().await, &["bloom", "rejected"]), 100);
    for id in [1, 77_777, 200_000] {
        assert_eq!(server.get(&format!("/api/seckill/{id}")).await.0, 200);
    }
    server.stop().await;
}

#[tokio::test]
async fn admin_calls_need_the_token_when_one_is_configured() {
    let dir = tempfile::tempdir().unwrap();
    let server = sqlite_server(&dir, None, "auth", 10, |c| {
        c.admin_token = Some("s3cret".into())
    })
    .await;
    let calls = [
        (
            Method::POST,
            "/api/cache/warm".to_string(),
            r#"{"limit":1}"#.to_string(),
        ),
        (
            Method::POST,
            "/api/skus".into(),
            sku_body(Some(50), "a", 100),
        ),
        (Method::PUT, "/api/skus/3".into(), sku_body(None, "a", 100)),
        (Method::DELETE, "/api/skus/3".into(), String::new()),
    ];
    for (method, path, body) in &calls {
        let send = |auth: Option<&str>| {
            let mut r = server
                .client
                .request(method.clone(), server.url(path))
                .header("content-type", "application/json")
                .body(body.clone());
            if let Some(a) = auth {
                r = r.header("authorization", a);
            }
            r.send()
        };
        assert_eq!(send(None).await.unwrap().status(), 401, "{method} {path}");
        assert_eq!(
            send(Some("Bearer wrong")).await.unwrap().status(),
            403,
            "{method} {path}"
        );
        assert_eq!(
            send(Some("s3cret")).await.unwrap().status(),
            401,
            "{method} {path}: no Bearer scheme"
        );
        let ok = send(Some("Bearer s3cret")).await.unwrap().status().as_u16();
        assert!(ok == 200 || ok == 201, "{method} {path}: {ok}");
    }
    // Reads stay open.
    assert_eq!(server.get("/api/seckill/1").await.0, 200);
    assert_eq!(server.get("/api/cache/stats").await.0, 200);
    server.stop().await;
}

#[tokio::test]
async fn without_redis_the_service_runs_filter_l1_and_sql() {
    let dir = tempfile::tempdir().unwrap();
    let server = sqlite_server(&dir, None, "noredis", 50, |_| {}).await;
    assert_eq!(server.get("/api/seckill/7").await.0, 200);
    assert_eq!(server.get("/api/seckill/7").await.0, 200);
    assert_eq!(server.get("/api/seckill/51").await.0, 404);
    let stats = server.stats().await;
    assert_eq!(stats["redis"]["enabled"], false);
    assert_eq!(counter(&stats, &["l1", "hits"]), 1);
    assert_eq!(counter(&stats, &["sql", "queries"]), 1);
    assert_eq!(counter(&stats, &["bloom", "rejected"]), 1);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fail_open_before_the_filter_is_built() {
    let dir = tempfile::tempdir().unwrap();
    let server = sqlite_server(&dir, None, "failopen", 1000, |c| {
        c.cache.bloom_build_on_start = false
    })
    .await;
    let stats = server.stats().await;
    assert_eq!(stats["bloom"]["ready"], false);
    for id in [1, 500, 1000] {
        assert_eq!(
            server.get(&format!("/api/seckill/{id}")).await.0,
            200,
            "id {id}"
        );
    }
    assert_eq!(server.get("/api/seckill/1001").await.0, 404);
    let stats = server.stats().await;
    assert_eq!(counter(&stats, &["bloom", "rejected"]), 0);
    assert_eq!(counter(&stats, &["bloom", "passed"]), 4);
    assert_eq!(counter(&stats, &["sql", "missing"]), 1);
    server.stop().await;
}

/// The edge answers a filter "no" and an L1 hit itself, and runs a read
/// past L1 itself, without the router (`EdgeLayer::fast_get`). An
/// instance with `http.fast_answers`
/// off routes every request, so the two answer the same requests side by
/// side: the same status, content type and body each time, an id on each,
/// and the same counts after.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_edge_answers_exactly_as_the_router_does() {
    let (da, db) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let fast = sqlite_server(&da, None, "fast", 1000, |_| {}).await;
    let routed = sqlite_server(&db, None, "routed", 1000, |c| {
        c.http.fast_answers = false;
    })
    .await;
    for s in [&fast, &routed] {
        // Created then deleted: the filter keeps its bits, so its reads
        // pass the filter and then hit L1's "not found".
        assert_eq!(s.create(2000, "gone").await, 201);
        assert_eq!(s.send(Method::DELETE, "/api/skus/2000", None).await.0, 200);
    }
    let requests = [
        (Method::GET, "/api/seckill/42"),      // SQL, then L1
        (Method::GET, "/api/seckill/42"),      // L1 hit
        (Method::HEAD, "/api/seckill/42"),     // not a fast answer
        (Method::GET, "/api/seckill/1000001"), // the filter's "no"
        (Method::HEAD, "/api/seckill/1000001"),
        (Method::GET, "/api/seckill/2000"),   // SQL: not found
        (Method::GET, "/api/seckill/2000"),   // L1: not found
        (Method::GET, "/api/seckill/%34%32"), // 42, percent-encoded
        (Method::GET, "/api/seckill/%31%30%30%30%30%30%31"),
        (Method::GET, "/api/seckill/abc"),
        (Method::GET, "/api/seckill/0"),
        (Method::GET, "/api/seckill/-7"),
        (Method::GET, "/api/seckill/99999999999999999999"),
        (Method::GET, "/api/seckill/%ff"),
        (Method::POST, "/api/seckill/42"),
    ];
    for (method, path) in requests {
        let a = seen(&fast, method.clone(), path).await;
        let b = seen(&routed, method.clone(), path).await;
        assert_eq!(a, b, "{method} {path}");
        assert!(a.3, "{method} {path}: no request id");
    }
    // The edge really answered on one side and never on the other: the
    // two SQL reads, the L1 hit, the filter's "no" and L1's "not found",
    // each a plain GET of an id that parses.
    assert_eq!(fast.state.metrics.fast_answers(), 5, "fast answers");
    assert_eq!(routed.state.metrics.fast_answers(), 0, "routed answers");
    let (sa, sb) = (fast.stats().await, routed.stats().await);
    for section in ["requests", "l1"] {
        assert_eq!(sa[section], sb[section], "{section}");
    }
    for field in [
        ["bloom", "rejected"],
        ["bloom", "passed"],
        ["bloom", "passed_missing"],
        ["sql", "queries"],
        ["sql", "found"],
        ["sql", "missing"],
    ] {
        assert_eq!(counter(&sa, &field), counter(&sb, &field), "{field:?}");
    }
    // Each read counted once: rejections by GET, HEAD and percent-encoded
    // GET; L1 hits likewise; the deleted SKU's second read.
    assert_eq!(counter(&sa, &["bloom", "rejected"]), 3);
    assert_eq!(counter(&sa, &["l1", "hits"]), 3);
    assert_eq!(counter(&sa, &["l1", "negative_hits"]), 1);
    assert_eq!(counter(&sa, &["bloom", "passed_missing"]), 2);
    let metric = |text: &str| {
        text.lines()
            .filter(|l| l.starts_with("bloomgate_requests_total{route=\"/api/seckill"))
            .map(str::to_owned)
            .collect::<std::collections::BTreeSet<_>>()
    };
    let text = |s: &TestServer| {
        let url = s.url("/metrics");
        let client = s.client.clone();
        async move { client.get(url).send().await.unwrap().text().await.unwrap() }
    };
    let (ma, mb) = (text(&fast).await, text(&routed).await);
    assert_eq!(metric(&ma), metric(&mb));
    assert!(!metric(&ma).is_empty());
    fast.stop().await;
    routed.stop().await;
}
