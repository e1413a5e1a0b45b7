//! The service on a Redis Cluster (issue 18, part 5): three instances on
//! MariaDB and a three-master cluster of the test's own (never the
//! machine's Redis), in `strict` mode so every Redis use goes through the
//! cluster client: values and leases, the doorbell stream, the shared filter in
//! segments, and the shared-rebuild epochs in segments. A node restarted
//! empty loses what its slots held; no created SKU is refused with a 404.

mod common;

use bloomgate_service::config::BloomMode;
use common::{counter, eventually, OwnCluster, TestServer};
use reqwest::Method;

/// Every id answers 200 on every server (none refused with a 404).
async fn all_found(servers: &[&TestServer], ids: &[i64], within: u64) {
    for s in servers {
        for &id in ids {
            let path = format!("/api/seckill/{id}");
            eventually(within, "a created SKU answers 200", || async {
                let status = s.get(&path).await.0;
                assert_ne!(status, 404, "{id} refused with a 404 on {}", s.base);
                status == 200
            })
            .await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_fleet_runs_on_a_redis_cluster_and_survives_a_node_restarted_empty() {
    if common::tool("redis-cli").is_none() {
        return;
    }
    let Some(db) = common::mysql_database("cluster").await else {
        return;
    };
    let mut cluster = OwnCluster::start().await;
    let mut config = common::config(&db, None, "cluster");
    config.redis_cluster = cluster.urls();
    config.cache.bloom_mode = BloomMode::Strict;
    config.cache.bloom_expected = 5_000;
    config.cache.bloom_fpp = 0.01;
    // Small segments, so the shared filter and every epoch span several
    // strings on several nodes.
    config.cache.bloom_segment_bytes = 1024;
    let a = TestServer::start(config.clone(), 2_000).await;
    let b = TestServer::start(config.clone(), 0).await;
    let c = TestServer::start(config, 0).await;
    let fleet = [&a, &b, &c];

    // B and C adopted A's start-up epoch from its segments: no SQL scan.
    for s in [&b, &c] {
        let stats = s.stats().await;
        assert_eq!(counter(&stats, &["sql", "id_scans"]), 0, "{stats}");
        assert_eq!(counter(&stats, &["changes", "epoch"]), 1, "{stats}");
    }

    // Creates, an update and a delete through A reach B and C.
    let ids: Vec<i64> = (50_001..=50_020).collect();
    for &id in &ids {
        assert_eq!(a.create(id, "cluster").await, 201);
    }
    all_found(&fleet, &ids, 5).await;
    for s in [&b, &c] {
        assert_eq!(s.get("/api/seckill/50001").await.1["name"], "cluster");
    }
    assert_eq!(a.put_sku(50_001, "renamed", 300).await.0, 200);
    assert_eq!(a.send(Method::DELETE, "/api/skus/50002", None).await.0, 200);
    for s in [&b, &c] {
        eventually(5, "the update reaches every instance", || async {
            s.get("/api/seckill/50001").await.1["name"] == "renamed"
        })
        .await;
        eventually(5, "the delete reaches every instance", || async {
            s.get("/api/seckill/50002").await.0 == 404
        })
        .await;
    }
    // Random ids are refused by the filters (the shared one confirms each
    // local "no"), and what reached SQL is the false positives only.
    let before = counter(&b.stats().await, &["sql", "queries"]);
    for i in 0..2_000u64 {
        let id = 1_000_000 + bloomgate_filter::hash::splitmix64(i) % 1_000_000_000;
        assert_eq!(b.get(&format!("/api/seckill/{id}")).await.0, 404);
    }
    let stats = b.stats().await;
    let sql = counter(&stats, &["sql", "queries"]) - before;
    assert!(sql <= 60, "{sql} SQL lookups for 2000 random ids: {stats}");
    assert!(counter(&stats, &["shared", "checks"]) >= 1_900, "{stats}");
    assert_eq!(counter(&stats, &["shared", "errors"]), 0, "{stats}");
    // The cluster holds the keys on every node: nothing pinned to one slot.
    for i in 0..3 {
        assert!(cluster.keys_on(i) > 0, "node {i} holds no key");
    }

    // A shared rebuild through A: B and C adopt its epoch (segments on
    // several nodes) without scanning SQL.
    let (s, body) = a
        .send(
            Method::POST,
            "/api/cache/warm",
            Some(r#"{"limit":10,"rebuild_bloom":true}"#),
        )
        .await;
    assert_eq!(s, 200, "{body}");
    assert_eq!(body["epoch"], 2, "{body}");
    // Its leases and fills (many keys on many nodes) all landed.
    assert_eq!(body["redis_error"], serde_json::Value::Null, "{body}");
    assert_eq!(body["redis_written"], 10, "{body}");
    for s in [&b, &c] {
        eventually(20, "the other instances adopt the epoch", || async {
            counter(&s.stats().await, &["changes", "rebuilds_adopted"]) == 1
        })
        .await;
        let stats = s.stats().await;
        assert_eq!(counter(&stats, &["sql", "id_scans"]), 0, "{stats}");
        assert_eq!(
            counter(&stats, &["changes", "adopt_failures"]),
            0,
            "{stats}"
        );
    }
    all_found(&fleet, &ids[2..], 5).await;
    let segments = cluster.cli(
        cluster.nodes[0].port,
        &[
            "-c",
            "hget",
            "bgtest:cluster:bloom:epoch:2:meta",
            "segments",
        ],
    );
    assert!(
        segments.trim().parse::<u64>().unwrap() >= 2,
        "the epoch spans segments: {segments}"
    );

    // The node serving the change stream is restarted empty: the stream,
    // the values and the filter segments in its slots are gone. Creates
    // go on through A the whole time; nothing created answers 404 anywhere.
    let stream = "bgtest:cluster:changes";
    let victim = cluster.node_of(stream);
    assert!(cluster.keys_on(victim) > 0, "the victim holds keys before");
    cluster.nodes[victim].stop().await;
    let mut during = Vec::new();
    for id in 60_001..=60_010 {
        assert_eq!(
            a.create(id, "cluster").await,
            201,
            "SQL takes writes with a node down"
        );
        during.push(id);
    }
    // While the node is down: the new ids and every earlier one.
    let so_far: Vec<i64> = ids[2..].iter().chain(&during).copied().collect();
    all_found(&fleet, &so_far, 10).await;
    cluster.nodes[victim].start().await;
    cluster.wait_ok().await;
    assert_eq!(cluster.keys_on(victim), 0, "restarted empty");
    let mut after = Vec::new();
    for id in 60_011..=60_020 {
        assert_eq!(a.create(id, "cluster").await, 201);
        after.push(id);
    }
    let every: Vec<i64> = ids[2..]
        .iter()
        .chain(&during)
        .chain(&after)
        .copied()
        .collect();
    all_found(&fleet, &every, 15).await;
    // The fleet gates again: once the shared filter's lost segments are
    // refilled (the first check that finds one starts it), random ids stay
    // off SQL.
    let mut round = 0u64;
    eventually(20, "random ids stay off SQL after the restart", || {
        round += 1;
        let c = &c;
        async move {
            let before = counter(&c.stats().await, &["sql", "queries"]);
            for i in 0..500u64 {
                let id = 2_000_000_000
                    + bloomgate_filter::hash::splitmix64(round * 1_000 + i) % 1_000_000_000;
                // A 404, answered: not a 503 of a fleet that fails closed.
                assert_eq!(c.get(&format!("/api/seckill/{id}")).await.0, 404);
            }
            let sql = counter(&c.stats().await, &["sql", "queries"]) - before;
            sql <= 20
        }
    })
    .await;
    all_found(&fleet, &every, 5).await;
    for s in fleet {
        if !std::ptr::eq(s, &a) {
            // The followers notice when they next read the stream's node.
            eventually(20, "the lost stream is noticed", || async {
                counter(&s.stats().await, &["changes", "gaps"]) >= 1
            })
            .await;
        }
        eprintln!("after the restart: {}", s.stats().await["changes"]);
    }
    a.stop().await;
    b.stop().await;
    c.stop().await;
}
