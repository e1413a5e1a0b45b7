//! `GET /metrics`: every value moves exactly as a scripted sequence of
//! reads says it must, the JSON stats and `/metrics` agree, and the output
//! passes `promtool check metrics`. Two instances share Redis, so reads
//! through the second one hit Redis.

mod common;

use common::{prom_value, TestServer};

const READ: &str = "/api/seckill/{sku_id}";

async fn metrics(server: &TestServer) -> String {
    server.metrics_text().await
}

fn requests(text: &str, outcome: &str, status: &str) -> f64 {
    prom_value(
        text,
        "bloomgate_requests_total",
        &[("route", READ), ("outcome", outcome), ("status", status)],
    )
    .unwrap_or(0.0)
}

fn value(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    prom_value(text, name, labels).unwrap_or_else(|| panic!("no {name}{labels:?} in\n{text}"))
}

#[tokio::test]
async fn every_outcome_is_counted_once_and_the_json_agrees() {
    let Some(redis) = common::redis_url().await else {
        return;
    };
    common::redis_clear(&redis, "bgtest:metrics:").await;
    let dir = tempfile::tempdir().unwrap();
    let db = common::sqlite_url(&dir);
    let a = TestServer::start(common::config(&db, Some(&redis), "metrics"), 100).await;
    let b = TestServer::start(common::config(&db, Some(&redis), "metrics"), 100).await;

    // Through A: SQL finds 3; then L1 has it.
    assert_eq!(a.get("/api/seckill/3").await.0, 200);
    assert_eq!(a.get("/api/seckill/3").await.0, 200);
    // Through B: Redis has it (A filled it).
    assert_eq!(b.get("/api/seckill/3").await.0, 200);
    // Far outside the catalogue: the filter answers alone.
    assert_eq!(a.get("/api/seckill/900000000").await.0, 404);
    // Deleted: the filter still says maybe, SQL says no (penetration),
    // and the null sentinel is cached in Redis and L1.
    let applied = common::counter(&b.stats().await, &["outbox", "applied"]);
    let (s, _) = a.send(reqwest::Method::DELETE, "/api/skus/5", None).await;
    assert_eq!(s, 200);
    // B applies A's delete, deleting the key from Redis as every follower
    // does: once done, so that its `DEL` cannot land between A's read and
    // A's fill below (A would then rightly not cache, and count a second
    // `db_missing`).
    common::eventually(5, "B applies the delete", || async {
        common::counter(&b.stats().await, &["outbox", "applied"]) > applied
    })
    .await;
    assert_eq!(a.get("/api/seckill/5").await.0, 404);
    assert_eq!(a.get("/api/seckill/5").await.0, 404);
    assert_eq!(b.get("/api/seckill/5").await.0, 404);
    // Not an id.
    assert_eq!(a.get("/api/seckill/abc").await.0, 400);

    let text = metrics(&a).await;
    let expect = [
        ("db_found", "200", 1.0),
        ("l1_hit", "200", 1.0),
        ("filter_rejected", "404", 1.0),
        ("db_missing", "404", 1.0),
        ("l1_negative_hit", "404", 1.0),
        ("client_error", "400", 1.0),
        ("redis_hit", "200", 0.0),
    ];
    for (outcome, status, n) in expect {
        assert_eq!(requests(&text, outcome, status), n, "A {outcome} {status}");
    }
    let tb = metrics(&b).await;
    assert_eq!(requests(&tb, "redis_hit", "200"), 1.0);
    assert_eq!(requests(&tb, "redis_nil_hit", "404"), 1.0);
    assert_eq!(requests(&tb, "db_found", "200"), 0.0);

    // A's levels below the route.
    assert_eq!(
        value(
            &text,
            "bloomgate_filter_rejected_total",
            &[("resource", "skus")]
        ),
        1.0
    );
    assert_eq!(
        value(
            &text,
            "bloomgate_filter_passed_total",
            &[("resource", "skus")]
        ),
        4.0
    );
    assert_eq!(
        value(
            &text,
            "bloomgate_filter_passed_missing_total",
            &[("resource", "skus")]
        ),
        2.0
    );
    assert_eq!(
        value(
            &text,
            "bloomgate_sql_queries_total",
            &[("resource", "skus"), ("result", "found")]
        ),
        1.0
    );
    assert_eq!(
        value(
            &text,
            "bloomgate_sql_queries_total",
            &[("resource", "skus"), ("result", "missing")]
        ),
        1.0
    );
    // The value of 3 and the sentinel of 5.
    assert_eq!(
        value(
            &text,
            "bloomgate_redis_keys_written_total",
            &[("resource", "skus")]
        ),
        2.0
    );
    assert_eq!(
        value(
            &text,
            "bloomgate_l1_lookups_total",
            &[("resource", "skus"), ("result", "hit")]
        ),
        1.0
    );
    assert_eq!(
        value(
            &text,
            "bloomgate_l1_lookups_total",
            &[("resource", "skus"), ("result", "negative_hit")]
        ),
        1.0
    );
    assert_eq!(
        value(
            &text,
            "bloomgate_l1_lookups_total",
            &[("resource", "skus"), ("result", "miss")]
        ),
        2.0
    );
    assert_eq!(
        value(
            &text,
            "bloomgate_redis_lookups_total",
            &[("resource", "skus"), ("result", "miss")]
        ),
        2.0
    );
    assert_eq!(
        value(&text, "bloomgate_filter_items", &[("resource", "skus")]),
        100.0
    );
    assert_eq!(
        value(&text, "bloomgate_filter_ready", &[("resource", "skus")]),
        1.0
    );
    assert_eq!(
        value(
            &text,
            "bloomgate_filter_rebuilds_total",
            &[("resource", "skus")]
        ),
        1.0
    );
    assert_eq!(
        value(
            &text,
            "bloomgate_filter_target_fpr",
            &[("resource", "skus")]
        ),
        0.001
    );
    assert_eq!(
        value(
            &text,
            "bloomgate_filter_alarm",
            &[("resource", "skus"), ("alarm", "past_capacity")]
        ),
        0.0
    );
    // 2 passed-but-missing of 3 missing ids seen (1 rejected).
    assert!(
        (value(
            &text,
            "bloomgate_filter_observed_fpr",
            &[("resource", "skus")]
        ) - 2.0 / 3.0)
            .abs()
            < 1e-12
    );
    // Every request is timed: A's read histogram holds its 6 reads.
    let timed: f64 = [
        "db_found",
        "l1_hit",
        "filter_rejected",
        "db_missing",
        "l1_negative_hit",
        "client_error",
    ]
    .iter()
    .map(|o| {
        value(
            &text,
            "bloomgate_request_duration_seconds_count",
            &[("route", READ), ("outcome", o)],
        )
    })
    .sum();
    assert_eq!(timed, 6.0);
    assert_eq!(
        value(
            &text,
            "bloomgate_filter_rebuild_duration_seconds_count",
            &[]
        ),
        1.0
    );

    // The JSON reads the same counters.
    let stats = a.stats().await;
    let j = |p: &[&str]| common::counter(&stats, p) as f64;
    let after = metrics(&a).await;
    assert_eq!(
        j(&["bloom", "rejected"]),
        value(
            &after,
            "bloomgate_filter_rejected_total",
            &[("resource", "skus")]
        )
    );
    assert_eq!(
        j(&["bloom", "passed_missing"]),
        value(
            &after,
            "bloomgate_filter_passed_missing_total",
            &[("resource", "skus")]
        )
    );
    assert_eq!(
        j(&["sql", "missing"]),
        value(
            &after,
            "bloomgate_sql_queries_total",
            &[("resource", "skus"), ("result", "missing")]
        )
    );
    assert_eq!(
        j(&["redis", "keys_written"]),
        value(
            &after,
            "bloomgate_redis_keys_written_total",
            &[("resource", "skus")]
        )
    );
    assert_eq!(
        j(&["requests", "db_missing"]),
        requests(&after, "db_missing", "404")
    );
    assert_eq!(
        j(&["requests", "l1_hit"]),
        requests(&after, "l1_hit", "200")
    );
    assert_eq!(stats["rebuild_history"].as_array().unwrap().len(), 1);
    // The SKU table is also the default resource "skus", labelled as every
    // resource is, with the same figures as the flat series.
    assert_eq!(
        j(&["resources", "skus", "sql", "statements"]),
        value(
            &after,
            "bloomgate_sql_statements_total",
            &[("resource", "skus")]
        )
    );
    assert_eq!(
        j(&["sql", "queries"]),
        j(&["resources", "skus", "sql", "statements"])
    );
    for (result, key) in [
        ("hit", "hits"),
        ("negative_hit", "negative_hits"),
        ("miss", "misses"),
    ] {
        assert_eq!(
            j(&["l1", key]),
            value(
                &after,
                "bloomgate_l1_lookups_total",
                &[("resource", "skus"), ("result", result)]
            ),
            "{result}"
        );
    }

    for (who, text) in [("A", &after), ("B", &tb)] {
        common::promtool_check(who, text);
    }
    a.stop().await;
    b.stop().await;
}

#[tokio::test]
async fn slow_statements_are_counted_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = common::config(&common::sqlite_url(&dir), None, "slowsql");
    config.sql.slow_query_ms = 1;
    let server = TestServer::start(config, 50_000).await;
    let slow_range = || async {
        server.stats().await["sql"]["slow"]["range"]
            .as_u64()
            .unwrap_or(0)
    };
    // Each warm reads 50,000 rows in pages of 1000 (each read by "range"),
    // most of them over the 1 ms threshold. Which ones cross it is the
    // machine's business, so the count is not fixed; but every slow page
    // counts, so each warm adds many, and a counter bumped once per warm
    // (or once per statement name) fails here.
    let mut slow = slow_range().await;
    for _ in 0..3 {
        let (s, _) = server
            .send(
                reqwest::Method::POST,
                "/api/cache/warm",
                Some(r#"{"limit":50000}"#),
            )
            .await;
        assert_eq!(s, 200);
        let now = slow_range().await;
        assert!(now - slow >= 2, "one warm's 50 pages added {}", now - slow);
        slow = now;
    }
    let text = metrics(&server).await;
    assert_eq!(
        value(
            &text,
            "bloomgate_sql_slow_queries_total",
            &[("statement", "range")]
        ),
        slow as f64
    );
    server.stop().await;
}
