//! The capacity alarm and auto-rebuild (002 §六): a catalogue that grows
//! past the filter's size, or a filter whose observed false-positive rate
//! runs at more than twice its expected rate, raises one alarm per
//! crossing and, with auto-rebuild, gets a filter sized for twice its
//! items.

mod common;

use std::sync::Arc;

use bloomgate_service::shield::Alarm;
use common::{eventually, sku_body, TestServer};
use reqwest::Method;

async fn server(
    seed: u64,
    f: impl FnOnce(&mut bloomgate_service::Config),
) -> (TestServer, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let mut config = common::config(&common::sqlite_url(&dir), None, "alarms");
    // The background monitor stays out of the way; tests step it.
    config.cache.bloom_monitor_ms = 3_600_000;
    f(&mut config);
    (TestServer::start(config, seed).await, dir)
}

async fn create(server: &TestServer, ids: std::ops::RangeInclusive<i64>) {
    for id in ids {
        let (s, body) = server
            .send(
                Method::POST,
                "/api/skus",
                Some(&sku_body(Some(id), "grown", 100)),
            )
            .await;
        assert_eq!(s, 201, "{body}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_catalogue_grown_past_capacity_raises_one_alarm_and_is_rebuilt_under_target() {
    // 800 SKUs: the start-up build sizes for max(1000, 1.25 × 800) = 1000.
    let (server, _dir) = server(800, |c| {
        c.cache.bloom_expected = 1000;
        c.cache.bloom_fpp = 0.01;
    })
    .await;
    let gate = Arc::clone(server.state.skus.shield());
    assert_eq!(gate.stats().capacity, 1000);
    create(&server, 801..=1000).await;
    assert_eq!(gate.alarm(), None, "at capacity, not past it");
    // The 1,001st item crosses; 150 more do not raise it again.
    create(&server, 1001..=1150).await;
    eventually(10, "the auto-rebuild completes", || {
        let gate = Arc::clone(&gate);
        async move {
            let s = gate.stats();
            s.rebuilds == 2 && !s.rebuilding && !s.rebuild_pending
        }
    })
    .await;
    let stats = gate.stats();
    assert_eq!(stats.alarms_raised, 1, "one alarm per crossing");
    assert_eq!(stats.alarm, None, "cleared by the rebuild");
    assert!(
        stats.capacity >= 2000,
        "sized for twice the items: {}",
        stats.capacity
    );
    assert!(
        stats.expected_fpr < 0.01,
        "back under target: {}",
        stats.expected_fpr
    );
    // Creates during the rebuild go to both filters and may be counted
    // twice (`added` counts inserts): at most the 150 made after the
    // crossing started it, however many landed while it ran.
    assert!((1150..=1300).contains(&stats.added), "{}", stats.added);
    for id in [1, 801, 1001, 1150] {
        assert_eq!(server.get(&format!("/api/seckill/{id}")).await.0, 200);
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn without_auto_rebuild_the_alarm_shows_in_stats_and_nothing_is_rebuilt() {
    let (server, _dir) = server(800, |c| {
        c.cache.bloom_expected = 1000;
        c.cache.bloom_auto_rebuild = false;
    })
    .await;
    create(&server, 801..=1010).await;
    let stats = server.stats().await;
    let alarm = stats["bloom"]["alarm"].as_str().unwrap();
    assert!(alarm.starts_with("past_capacity: 1001 items"), "{alarm}");
    assert_eq!(stats["bloom"]["alarms_raised"], 1);
    assert_eq!(stats["bloom"]["rebuilds"], 1);
    // Seed 000's grep still finds the whole, flat bloom object.
    let text = server.stats_text().await;
    let start = text.find("\"bloom\":{").unwrap();
    let end = start + text[start..].find('}').unwrap();
    assert!(
        text[start..end].contains("alarms_raised"),
        "{}",
        &text[start..end]
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_observed_rate_over_twice_the_expected_one_raises_the_alarm_and_rebuilds() {
    let (server, _dir) = server(2000, |c| {
        c.cache.bloom_expected = 2000;
        c.cache.bloom_fpp = 0.001;
    })
    .await;
    let gate = Arc::clone(server.state.skus.shield());
    // 300 deleted SKUs stay "maybe" in the filter (fewer than the
    // delete-triggered rebuild threshold).
    for id in 1..=300 {
        let (s, _) = server
            .send(Method::DELETE, &format!("/api/skus/{id}"), None)
            .await;
        assert_eq!(s, 200);
    }
    gate.monitor_step();
    assert_eq!(gate.alarm(), None);
    for id in (1..=300).chain(1_000_001..=1_000_300) {
        assert_eq!(server.get(&format!("/api/seckill/{id}")).await.0, 404);
    }
    let stats = gate.stats();
    assert!(stats.passed_missing >= 300, "{}", stats.passed_missing);
    assert!(stats.observed_fpr > 0.4, "{}", stats.observed_fpr);
    gate.monitor_step();
    eventually(10, "the rebuild drops the deleted ids", || {
        let gate = Arc::clone(&gate);
        async move { gate.stats().rebuilds == 2 && !gate.stats().rebuilding }
    })
    .await;
    let stats = gate.stats();
    assert_eq!(stats.alarms_raised, 1);
    assert!(stats.last_rebuild_error.is_none());
    assert_eq!(stats.added, 1700);
    // The deleted ids are now rejected by the filter itself.
    let rejected = stats.rejected;
    server.state.skus.forget_local();
    for id in 1..=300 {
        assert_eq!(server.get(&format!("/api/seckill/{id}")).await.0, 404);
    }
    assert!(gate.stats().rejected >= rejected + 299);
    // A quiet window clears nothing that is not there, and raises nothing.
    gate.monitor_step();
    assert!(matches!(
        gate.alarm(),
        None | Some(Alarm::ObservedFpr { .. })
    ));
    // A full window of ordinary missing ids (all rejected by the new
    // filter) raises no second alarm.
    for id in 2_000_001..=2_000_250 {
        assert_eq!(server.get(&format!("/api/seckill/{id}")).await.0, 404);
    }
    gate.monitor_step();
    assert_eq!(gate.alarm(), None);
    assert_eq!(gate.stats().alarms_raised, 1);
    server.stop().await;
}
