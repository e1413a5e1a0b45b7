//! The SQL store on all three backends: migrations, CRUD, seeding, id scans.

mod common;

use bloomgate_service::model::catalogue_sku;
use bloomgate_service::source::{KeyBatch, KeyScan};
use bloomgate_service::sql::Database;

async fn exercise(url: &str) {
    let store = Database::connect(url).await.unwrap();
    // Migrations are idempotent.
    let again = Database::connect(url).await.unwrap();
    again.close().await;
    assert_eq!(store.count().await.unwrap(), 0);
    assert!(store.is_empty().await.unwrap());
    assert_eq!(store.seed_range(1, 1234, |_| {}).await.unwrap(), 1234);
    assert!(!store.is_empty().await.unwrap());
    // Seeding again adds nothing and keeps existing rows.
    assert_eq!(store.seed_range(1, 1240, |_| {}).await.unwrap(), 6);
    assert_eq!(store.count().await.unwrap(), 1240);
    assert_eq!(store.get(17).await.unwrap(), Some(catalogue_sku(17)));
    assert_eq!(store.get(5000).await.unwrap(), None);
    // The rebuild's scan: two ranges (sql.scan_parallel), pages of 100.
    assert_eq!(store.ranges().await.unwrap().len(), 2);
    let ids = std::sync::Mutex::new(Vec::new());
    let sink = |b: KeyBatch<'_>| match b {
        KeyBatch::Ints(b) => ids.lock().unwrap().extend_from_slice(b),
        KeyBatch::Keys(_) => panic!("integer keys come as integers"),
    };
    let n = store.scan_keys(100, &sink).await.unwrap();
    assert_eq!(n, 1240);
    assert_eq!(ids.into_inner().unwrap(), (1..=1240).collect::<Vec<i64>>());
    // The database's own figure: SQLite's MAX(rowid) is exact here; the
    // others' statistics may lag a fresh insert (None or a guess).
    let estimate = store.estimate_keys().await.unwrap();
    if url.starts_with("sqlite") {
        assert_eq!(estimate, Some(1240));
    }
    let mut sku = catalogue_sku(9_000_000_000);
    sku.name = "名字 with unicode ✓".into();
    assert!(store.insert(&sku).await.unwrap());
    assert!(
        !store.insert(&sku).await.unwrap(),
        "duplicate id is refused"
    );
    assert_eq!(store.get(9_000_000_000).await.unwrap(), Some(sku.clone()));
    assert_eq!(store.next_id().await.unwrap(), Some(9_000_000_001));
    sku.stock = 1;
    assert!(store.update(&sku).await.unwrap());
    assert_eq!(store.get(sku.id).await.unwrap().unwrap().stock, 1);
    assert!(store.delete(sku.id).await.unwrap());
    assert!(!store.delete(sku.id).await.unwrap());
    assert!(!store.update(&sku).await.unwrap());
    let first = store.range(0, 3).await.unwrap();
    assert_eq!(first.iter().map(|s| s.id).collect::<Vec<_>>(), [1, 2, 3]);
    assert_eq!(first[2], catalogue_sku(3));
    assert_eq!(store.page_ids(0, 3).await.unwrap(), [1, 2, 3]);
    // Keyset pages: after an id, and the last, short page.
    let ids_of = |p: Vec<bloomgate_service::model::Sku>| p.iter().map(|s| s.id).collect::<Vec<_>>();
    assert_eq!(ids_of(store.range(3, 5).await.unwrap()), [4, 5]);
    assert_eq!(ids_of(store.range(1238, 2000).await.unwrap()), [1239, 1240]);
    assert_eq!(store.page_ids(1238, 10).await.unwrap(), [1239, 1240]);
    assert!(store.range(1240, 2000).await.unwrap().is_empty());
    assert!(store.page_ids(1240, 10).await.unwrap().is_empty());
    // The largest id leaves no automatic next one (instead of overflowing).
    assert!(store.insert(&catalogue_sku(i64::MAX)).await.unwrap());
    assert_eq!(store.next_id().await.unwrap(), None);
    assert!(store.delete(i64::MAX).await.unwrap());
    let c = &store.counters;
    use std::sync::atomic::Ordering::Relaxed;
    assert_eq!(
        c.found.load(Relaxed) + c.missing.load(Relaxed),
        c.queries.load(Relaxed)
    );
    store.close().await;
}

#[tokio::test]
async fn sqlite_store() {
    let dir = tempfile::tempdir().unwrap();
    // A nested directory that does not exist yet is created.
    exercise(&format!(
        "sqlite://{}/nested/dir/skus.db",
        dir.path().display()
    ))
    .await;
}

#[tokio::test]
async fn mariadb_store() {
    let Some(url) = common::mysql_database("stores").await else {
        return;
    };
    exercise(&url).await;
}

#[tokio::test]
async fn postgres_store() {
    let Some(url) = common::postgres_database("stores").await else {
        return;
    };
    exercise(&url).await;
}

/// Seed 000's catalogue size: every row lands, and a second seed of the
/// same range adds none (its speed is measured in BENCHMARKS.md, not here).
#[tokio::test]
async fn seeding_200000_on_mariadb_inserts_each_once() {
    let Some(url) = common::mysql_database("seed_speed").await else {
        return;
    };
    let store = Database::connect(&url).await.unwrap();
    let started = std::time::Instant::now();
    assert_eq!(store.seed_range(1, 200_000, |_| {}).await.unwrap(), 200_000);
    eprintln!("seeded 200,000 SKUs on MariaDB in {:?}", started.elapsed());
    assert_eq!(store.count().await.unwrap(), 200_000);
    assert_eq!(
        store.seed_range(199_001, 201_000, |_| {}).await.unwrap(),
        1_000
    );
    assert_eq!(store.count().await.unwrap(), 201_000);
    store.close().await;
}
