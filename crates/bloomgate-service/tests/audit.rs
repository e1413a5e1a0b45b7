//! The promise checked while the service runs (`reader::audit`): a sample
//! of the filter's "no" answers is looked up in the database off the
//! request path. A filter corrupted on purpose (an empty one published
//! over the built one, as a snapshot of another table would be) refuses
//! keys that exist; the audit finds one, counts a false negative, raises
//! the alarm, stops the filter's "no" and rebuilds, and the keys answer
//! 200 again. A true "no" sampled counts nothing.

mod common;

use std::sync::Arc;
use std::time::Duration;

use bloomgate_service::config::BloomLayout;
use bloomgate_service::filter::ShieldFilter;
use bloomgate_service::shield::{Shield, Verdict};
use common::{counter, eventually, TestServer};

/// Publishes an empty filter over `gate`'s: every key is refused.
fn corrupt(gate: &Arc<Shield>) {
    let empty = ShieldFilter::with_fpr(BloomLayout::Blocked, 1_000, 0.01).unwrap();
    let adopting = gate.begin_adopt(empty).expect("no rebuild runs");
    assert!(gate.finish_adopt(&adopting, 1_000));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupted_filter_is_caught_by_the_audit_and_rebuilt() {
    let dir = tempfile::tempdir().unwrap();
    let url = common::sqlite_url(&dir);
    let w = common::sql_pool(&url).await;
    common::users_table(&w, &["u000001", "u000002"]).await;
    let mut c = common::config(&url, None, "audit");
    c.cache.bloom_audit_every_ms = 50;
    c.cache.bloom_monitor_ms = 100;
    // A refused row is judged after max(out_of_step, 5 s) + 1 s.
    c.sql.out_of_step_ms = 1_000;
    c.resources.push(common::users_resource("users"));
    let s = TestServer::start(c, 100).await;
    eventually(10, "ready", || async { s.get("/readyz").await.0 == 200 }).await;

    // A true "no", sampled: nothing is wrong.
    for _ in 0..5 {
        assert_eq!(s.get("/api/seckill/900000").await.0, 404);
        tokio::time::sleep(Duration::from_millis(60)).await;
    }
    eventually(5, "a refusal sampled", || async {
        counter(&s.stats().await, &["resources", "skus", "audit", "sampled"]) >= 1
    })
    .await;
    let stats = s.stats().await;
    assert_eq!(
        counter(&stats, &["resources", "skus", "audit", "false_negatives"]),
        0
    );

    for (name, gate, path) in [
        ("skus", Arc::clone(s.state.skus.shield()), "/api/seckill/42"),
        (
            "users",
            Arc::clone(s.state.resources[0].shield()),
            "/api/users/u000001",
        ),
    ] {
        let rebuilds = gate.stats().rebuilds;
        corrupt(&gate);
        // The false 404 the corruption causes, until the audit finds it.
        assert_eq!(s.get(path).await.0, 404, "{name}: the corruption works");
        eventually(10, &format!("{name}: {path} answers 200 again"), || async {
            s.get(path).await.0 == 200
        })
        .await;
        let stats = s.stats().await;
        assert_eq!(
            counter(&stats, &["resources", name, "audit", "false_negatives"]),
            1,
            "{stats}"
        );
        eventually(
            5,
            &format!("{name}: rebuilt and vouching again"),
            || async { gate.stats().rebuilds > rebuilds && !gate.rebuild_is_owed() },
        )
        .await;
        let metrics = s.metrics_text().await;
        assert_eq!(
            common::prom_value(
                &metrics,
                "bloomgate_filter_false_negatives_total",
                &[("resource", name)]
            ),
            Some(1.0),
            "{name}"
        );
    }
    // The rebuilt filters refuse absent keys again.
    assert_eq!(s.get("/api/seckill/900000").await.0, 404);
    assert_eq!(s.get("/api/users/u999999").await.0, 404);
    assert_eq!(s.state.skus.shield().check(900_000_i64), Verdict::Reject);
    // The alarm was raised, and clears once the rebuild is done.
    let stats = s.stats().await;
    assert!(counter(&stats, &["bloom", "alarms_raised"]) >= 1, "{stats}");
    eventually(5, "the alarm clears", || async {
        s.stats().await["bloom"]["alarm"].is_null()
    })
    .await;
    s.stop().await;
    w.close().await;
}

/// MariaDB's default collation finds `u000001` for `U000001`, and the
/// filter holds keys folded as it compares: a refusal of `U000001` while
/// that row exists is a false 404, and the audit, which looks keys up as
/// the column compares, counts it. (Before keys were folded, the filter
/// refused `U000001` by design and the audit compared bytes.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_audit_looks_keys_up_as_the_column_compares() {
    let Some(url) = common::mysql_database("audit_collation").await else {
        return;
    };
    let w = common::sql_pool(&url).await;
    common::users_table(&w, &["u000001"]).await;
    let mut c = common::config(&url, None, "audit-collation");
    c.cache.bloom_audit_every_ms = 50;
    c.sql.out_of_step_ms = 1_000;
    c.resources.push(common::users_resource("users"));
    let s = TestServer::start(c, 0).await;
    eventually(10, "ready", || async { s.get("/readyz").await.0 == 200 }).await;
    assert_eq!(s.get("/api/users/U000001").await.0, 200);
    corrupt(s.state.resources[0].shield());
    assert_eq!(
        s.get("/api/users/U000001").await.0,
        404,
        "the corruption works"
    );
    // Past the audit's wait (max(out_of_step, 5 s) + 1 s).
    eventually(10, "U000001 answers 200 again", || async {
        s.get("/api/users/U000001").await.0 == 200
    })
    .await;
    let stats = s.stats().await;
    assert_eq!(
        counter(&stats, &["resources", "users", "audit", "false_negatives"]),
        1,
        "{stats}"
    );
    s.stop().await;
    w.close().await;
}
