//! Several instances behind one load balancer, sharing MariaDB and Redis:
//! a SKU created through one is found through the others (no false "no"
//! from their filters), and an update or delete through one reaches the
//! others' L1, within a bound this test measures.

mod common;

use std::time::{Duration, Instant};

use common::{sku_body, TestServer};
use reqwest::Method;

/// Polls `GET path` on `server` until `done(status, body)`; returns how long
/// it took after `since`.
async fn until(
    server: &TestServer,
    path: &str,
    since: Instant,
    done: impl Fn(u16, &serde_json::Value) -> bool,
) -> Duration {
    loop {
        let (s, body) = server.get(path).await;
        if done(s, &body) {
            return since.elapsed();
        }
        assert!(
            since.elapsed() < Duration::from_secs(5),
            "{path} never converged: {s} {body}"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

fn percentile(mut d: Vec<Duration>, p: f64) -> Duration {
    d.sort();
    d[((d.len() - 1) as f64 * p).round() as usize]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn writes_through_one_instance_reach_the_others_filters_and_caches() {
    let (Some(db), Some(redis)) = (
        common::mysql_database("instances").await,
        common::redis_url().await,
    ) else {
        return;
    };
    let config = common::config(&db, Some(&redis), "instances");
    common::redis_clear(&redis, &config.cache.redis_prefix).await;
    let a = TestServer::start(config.clone(), 5000).await;
    let b = TestServer::start(config.clone(), 0).await;
    let c = TestServer::start(config, 0).await;

    // Creates through A: B and C's filters learn them (they would answer
    // 404 until their next rebuild otherwise).
    let mut delays = Vec::new();
    for id in 10_001..=10_050 {
        assert_eq!(b.get(&format!("/api/seckill/{id}")).await.0, 404);
        let (s, _) = a
            .send(
                Method::POST,
                "/api/skus",
                Some(&sku_body(Some(id), "made on A", 100)),
            )
            .await;
        assert_eq!(s, 201);
        let created = Instant::now();
        for other in [&b, &c] {
            delays.push(
                until(other, &format!("/api/seckill/{id}"), created, |s, _| {
                    s == 200
                })
                .await,
            );
        }
    }
    let (p50, p99, max) = (
        percentile(delays.clone(), 0.5),
        percentile(delays.clone(), 0.99),
        percentile(delays, 1.0),
    );
    eprintln!("create on A -> 200 on B and C: p50 {p50:?} p99 {p99:?} max {max:?} (100 samples)");
    assert!(p99 < Duration::from_secs(1));

    // Updates and deletes through A reach B's and C's L1.
    let mut delays = Vec::new();
    for id in 1..=20 {
        for other in [&b, &c] {
            assert_eq!(other.get(&format!("/api/seckill/{id}")).await.0, 200);
        }
        let (s, _) = a.put_sku(id, "renamed on A", 500).await;
        assert_eq!(s, 200);
        let updated = Instant::now();
        for other in [&b, &c] {
            delays.push(
                until(other, &format!("/api/seckill/{id}"), updated, |_, body| {
                    body["name"] == "renamed on A"
                })
                .await,
            );
        }
        let (s, _) = a
            .send(Method::DELETE, &format!("/api/skus/{id}"), None)
            .await;
        assert_eq!(s, 200);
        let deleted = Instant::now();
        for other in [&b, &c] {
            delays.push(
                until(other, &format!("/api/seckill/{id}"), deleted, |s, _| {
                    s == 404
                })
                .await,
            );
        }
    }
    let (p50, p99) = (percentile(delays.clone(), 0.5), percentile(delays, 0.99));
    eprintln!("update/delete on A -> seen on B and C: p50 {p50:?} p99 {p99:?} (80 samples)");
    assert!(p99 < Duration::from_secs(1));
    let stats = b.stats().await;
    assert!(
        stats["changes"]["applied"].as_u64().unwrap() >= 90,
        "{}",
        stats["changes"]
    );
    assert_eq!(a.stats().await["changes"]["publish_failures"], 0);
    for s in [a, b, c] {
        s.stop().await;
    }
}
