//! Restart without a cold window (issue 8): an instance writes its filter
//! snapshot at shutdown; started again it loads it, replays the ids created
//! meanwhile (through another instance) from the change outbox, and is
//! ready without scanning SQL, with Redis or without, and also when Redis
//! lost its doorbell stream. A snapshot that fails to verify leads to
//! another instance's epoch, or a SQL rebuild, instead.

mod common;

use std::path::Path;

use bloomgate_service::shield::Verdict;
use common::{counter, sku_body, TestServer};
use reqwest::Method;

const PREFIX: &str = "bgtest:restart:";

fn config(db: &str, redis: &str, snapshot: &Path) -> bloomgate_service::Config {
    let mut c = common::config(db, Some(redis), "restart");
    c.cache.bloom_snapshot_path = Some(snapshot.to_path_buf());
    c
}

async fn create(server: &TestServer, id: i64) {
    let (s, body) = server
        .send(
            Method::POST,
            "/api/skus",
            Some(&sku_body(Some(id), "new", 100)),
        )
        .await;
    assert_eq!(s, 201, "{body}");
}

fn meta_file(snapshot: &Path) -> std::path::PathBuf {
    snapshot.with_file_name(format!(
        "{}.json",
        snapshot.file_name().unwrap().to_str().unwrap()
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_restart_loads_its_snapshot_and_the_log_and_scans_no_sql() {
    let Some(redis) = common::redis_url().await else {
        return;
    };
    common::redis_clear(&redis, PREFIX).await;
    let dir = tempfile::tempdir().unwrap();
    let db = common::sqlite_url(&dir);
    let snap = dir.path().join("a").join("filter.bgf");
    let other = dir.path().join("b").join("filter.bgf");

    let a = TestServer::start(config(&db, &redis, &snap), 1000).await;
    assert_eq!(
        counter(&a.stats().await, &["sql", "id_scans"]),
        1,
        "first start scans"
    );
    let b = TestServer::start(config(&db, &redis, &other), 1000).await;
    create(&a, 5000).await;
    a.stop().await;
    assert!(
        snap.is_file() && meta_file(&snap).is_file(),
        "saved at shutdown"
    );
    // While A is down, B creates a SKU: only the outbox tells A.
    create(&b, 6000).await;

    let a = TestServer::start(config(&db, &redis, &snap), 1000).await;
    let stats = a.stats().await;
    assert_eq!(
        counter(&stats, &["sql", "id_scans"]),
        0,
        "no SQL scan: {stats}"
    );
    assert_eq!(counter(&stats, &["bloom", "snapshot_restores"]), 1);
    assert_eq!(counter(&stats, &["bloom", "rebuilds"]), 0);
    assert_eq!(stats["bloom"]["ready"], true);
    let gate = a.state.skus.shield();
    for id in (1..=1000).chain([5000, 6000]) {
        assert_ne!(
            gate.check(id),
            Verdict::Reject,
            "id {id} refused after the restart"
        );
    }
    assert_eq!(a.get("/api/seckill/6000").await.0, 200);
    assert_eq!(a.get("/api/seckill/5000").await.0, 200);
    assert_eq!(a.get("/api/seckill/900000000").await.0, 404);
    assert_eq!(
        counter(&a.stats().await, &["bloom", "rejected"]),
        1,
        "the restored filter gates"
    );
    // Still following: a create through B reaches the restored filter.
    create(&b, 7000).await;
    common::eventually(10, "B's create reaches A", || async {
        a.get("/api/seckill/7000").await.0 == 200
    })
    .await;
    a.stop().await;

    // A snapshot that fails the library's checksum (the metadata made to
    // match it, so only the payload check can catch it): not trusted; the
    // filter the first start stored in Redis is adopted instead.
    let mut bytes = std::fs::read(&snap).unwrap();
    let last = bytes.len() - 100;
    bytes[last] ^= 0x5a;
    std::fs::write(&snap, &bytes).unwrap();
    let mut meta: serde_json::Value =
        serde_json::from_slice(&std::fs::read(meta_file(&snap)).unwrap()).unwrap();
    meta["file_xxh3"] = format!("{:016x}", xxhash_rust::xxh3::xxh3_64(&bytes)).into();
    std::fs::write(meta_file(&snap), serde_json::to_vec(&meta).unwrap()).unwrap();
    let a = TestServer::start(config(&db, &redis, &snap), 1000).await;
    let stats = a.stats().await;
    assert_eq!(
        counter(&stats, &["bloom", "snapshot_restores"]),
        0,
        "{stats}"
    );
    assert_eq!(counter(&stats, &["bloom", "adopted"]), 1, "{stats}");
    assert_eq!(counter(&stats, &["sql", "id_scans"]), 0);
    for id in [1, 500, 1000, 5000, 6000, 7000] {
        assert_ne!(a.state.skus.shield().check(id), Verdict::Reject, "id {id}");
    }
    a.stop().await;

    // The doorbell stream lost (a Redis restart without persistence): the
    // snapshot is positioned in the outbox, which holds every create, so
    // it is still used, with no scan.
    assert!(
        std::fs::read(&snap).unwrap() != bytes,
        "the adopted filter's snapshot replaced it"
    );
    let mut conn = common::redis_conn(&redis).await;
    let _: () = redis::cmd("DEL")
        .arg(format!("{PREFIX}changes"))
        .query_async(&mut conn)
        .await
        .unwrap();
    create(&b, 8000).await;
    let a = TestServer::start(config(&db, &redis, &snap), 1000).await;
    let stats = a.stats().await;
    assert_eq!(
        counter(&stats, &["bloom", "snapshot_restores"]),
        1,
        "{stats}"
    );
    assert_eq!(counter(&stats, &["sql", "id_scans"]), 0, "{stats}");
    for id in [1, 1000, 5000, 6000, 7000, 8000] {
        assert_ne!(a.state.skus.shield().check(id), Verdict::Reject, "id {id}");
    }
    a.stop().await;
    b.stop().await;
}

/// No Redis at all: two instances on one SQLite database. The snapshot
/// and the outbox are enough: A restarts without a scan and holds what B
/// created while it was down.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_snapshot_needs_no_redis() {
    let dir = tempfile::tempdir().unwrap();
    let db = common::sqlite_url(&dir);
    let snap = dir.path().join("a.bgf");
    let mut c = common::config(&db, None, "restart-alone");
    c.cache.bloom_snapshot_path = Some(snap.clone());
    c.validate().unwrap();
    let mut other = c.clone();
    other.cache.bloom_snapshot_path = Some(dir.path().join("b.bgf"));
    let a = TestServer::start(c.clone(), 500).await;
    let b = TestServer::start(other, 0).await;
    create(&a, 5000).await;
    a.stop().await;
    create(&b, 6000).await;
    let a = TestServer::start(c, 0).await;
    let stats = a.stats().await;
    assert_eq!(
        counter(&stats, &["bloom", "snapshot_restores"]),
        1,
        "{stats}"
    );
    assert_eq!(counter(&stats, &["sql", "id_scans"]), 0, "{stats}");
    for id in (1..=500).chain([5000, 6000]) {
        assert_ne!(a.state.skus.shield().check(id), Verdict::Reject, "id {id}");
    }
    assert_eq!(a.get("/api/seckill/900000000").await.0, 404);
    a.stop().await;
    b.stop().await;
}

/// SKUs written to SQL behind the service's back: by `bloomgate seed`
/// (whose batches leave rebuild entries in the outbox) or by a plain SQL
/// client (which leaves nothing). A restart restores its snapshot at once,
/// counting nothing before readiness; the entries, or the background row
/// count that finds more rows than the filter holds, then make it scan
/// SQL, and every such row is in the filter.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rows_written_behind_the_log_make_a_restart_scan_sql() {
    let Some(redis) = common::redis_url().await else {
        return;
    };
    let prefix = "bgtest:restart-behind:";
    common::redis_clear(&redis, prefix).await;
    let dir = tempfile::tempdir().unwrap();
    let db = common::sqlite_url(&dir);
    let snap = dir.path().join("filter.bgf");
    let mut c = config(&db, &redis, &snap);
    c.cache.redis_prefix = prefix.into();
    for plain_sql in [false, true] {
        let a = TestServer::start(c.clone(), 1000).await;
        let ids = if plain_sql {
            40_001..=40_200
        } else {
            30_001..=30_200
        };
        if plain_sql {
            let pool = sqlx::SqlitePool::connect(&db).await.unwrap();
            for id in ids.clone() {
                sqlx::query("INSERT INTO skus VALUES (?, 'behind', 1, 1, 1, 0, 1, 0)")
                    .bind(id)
                    .execute(&pool)
                    .await
                    .unwrap();
            }
            pool.close().await;
        } else {
            let added = a
                .state
                .skus
                .source()
                .seed_range(*ids.start(), *ids.end(), |_| {})
                .await
                .unwrap();
            assert_eq!(added, 200);
        }
        a.stop().await;
        assert!(snap.exists(), "saved at shutdown");
        let a = TestServer::start(c.clone(), 0).await;
        let stats = a.stats().await;
        assert_eq!(
            counter(&stats, &["bloom", "snapshot_restores"]),
            1,
            "{stats}"
        );
        common::eventually(10, "a rebuild after the restore", || async {
            a.state.skus.shield().rebuild_count() >= 1
        })
        .await;
        let stats = a.stats().await;
        assert_eq!(counter(&stats, &["sql", "id_scans"]), 1, "{stats}");
        if plain_sql {
            assert_eq!(stats["bloom"]["row_check"], "unaccounted", "{stats}");
        }
        for id in ids.chain([1, 1000]) {
            assert_eq!(a.state.skus.shield().check(id), Verdict::Pass, "id {id}");
        }
        a.stop().await;
    }
}
