//! The metadata's two directions in a rolling upgrade, against fixtures
//! of what the previous release wrote and read (no second build).

use super::*;

fn meta() -> FilterMeta {
    FilterMeta {
        outbox: 41,
        covered: 43,
        capacity: 1_000_000,
        fpp: 0.001,
        layout: BloomLayout::Blocked,
        key_type: KeyType::Text,
        identity: "mysql:3306/shop:users.id:Text".into(),
    }
}

fn as_map(meta: &FilterMeta) -> HashMap<String, String> {
    meta.fields()
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
}

fn map(fields: &[(&str, &str)]) -> HashMap<String, String> {
    fields
        .iter()
        .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
        .collect()
}

/// The SKU table's epoch meta as the previous release wrote it (the
/// doorbell's `publish_epoch`): no `key_type`.
const PREVIOUS_SKU_EPOCH: &[(&str, &str)] = &[
    ("segments", "1"),
    ("bytes", "1200"),
    ("outbox", "17"),
    ("covered", "18"),
    ("capacity", "5000"),
    ("fpp", "0.01"),
    ("layout", "Blocked"),
    ("identity", "sqlite:/tmp/a.db:skus.id:Int"),
];

/// A resource's epoch meta as the previous release wrote it
/// (`Resource::publish_epoch`): no `covered`.
const PREVIOUS_RESOURCE_EPOCH: &[(&str, &str)] = &[
    ("segments", "1"),
    ("bytes", "1200"),
    ("outbox", "17"),
    ("capacity", "5000"),
    ("fpp", "0.01"),
    ("layout", "Classic"),
    ("key_type", "Text"),
    ("identity", "sqlite:/tmp/a.db:users.id:Text"),
];

/// What the previous release required of the SKU table's epoch meta
/// (the doorbell's `adopt_latest`), spelled as it parsed them.
fn previous_sku_reads(
    meta: &HashMap<String, String>,
    fpp: f64,
    layout: BloomLayout,
    identity: &str,
) -> Result<(i64, i64, u64), String> {
    let field = |name: &str| meta.get(name).cloned().ok_or(format!("no {name}"));
    let outbox = field("outbox")?.parse().map_err(|_| "outbox")?;
    let covered = field("covered")?.parse().map_err(|_| "covered")?;
    let capacity = field("capacity")?.parse().map_err(|_| "capacity")?;
    if field("fpp")? != fpp.to_string() || field("layout")? != format!("{layout:?}") {
        return Err("another layout or rate".into());
    }
    if meta.get("identity").map(String::as_str) != Some(identity) {
        return Err("another identity".into());
    }
    Ok((outbox, covered, capacity))
}

/// What the previous release required of a resource's epoch meta
/// (`Resource::adopt_epoch`).
fn previous_resource_reads(
    meta: &HashMap<String, String>,
    fpp: f64,
    layout: BloomLayout,
    key_type: KeyType,
    identity: &str,
) -> Result<(i64, u64), String> {
    let field = |name: &str| meta.get(name).cloned().ok_or(format!("no {name}"));
    if field("fpp")? != fpp.to_string()
        || field("layout")? != format!("{layout:?}")
        || field("key_type")? != format!("{key_type:?}")
    {
        return Err("another layout, rate or key type".into());
    }
    if meta.get("identity").map(String::as_str) != Some(identity) {
        return Err("another identity".into());
    }
    let outbox = field("outbox")?.parse().map_err(|_| "outbox")?;
    let capacity = field("capacity")?.parse().map_err(|_| "capacity")?;
    Ok((outbox, capacity))
}

#[test]
fn the_fields_read_back_as_written() {
    let m = meta();
    let mut fields = as_map(&m);
    fields.insert("segments".into(), "3".into());
    assert_eq!(FilterMeta::from_fields(&fields).unwrap(), m);
    let classic = FilterMeta {
        layout: BloomLayout::Classic,
        key_type: KeyType::Int,
        fpp: 1e-7,
        ..meta()
    };
    assert_eq!(FilterMeta::from_fields(&as_map(&classic)).unwrap(), classic);
}

#[test]
fn an_earlier_release_epoch_is_refused_by_the_field_it_lacks() {
    let sku = FilterMeta::from_fields(&map(PREVIOUS_SKU_EPOCH)).unwrap_err();
    assert!(
        matches!(sku, AdoptError::EarlierRelease("key_type")),
        "{sku}"
    );
    let resource = FilterMeta::from_fields(&map(PREVIOUS_RESOURCE_EPOCH)).unwrap_err();
    assert!(
        matches!(resource, AdoptError::EarlierRelease("covered")),
        "{resource}"
    );
    assert!(matches!(
        FilterMeta::from_fields(&HashMap::new()),
        Err(AdoptError::Gone)
    ));
    let mut bad = map(PREVIOUS_RESOURCE_EPOCH);
    bad.insert("covered".into(), "17".into());
    bad.insert("layout".into(), "Sideways".into());
    assert!(matches!(
        FilterMeta::from_fields(&bad),
        Err(AdoptError::Unreadable("layout"))
    ));
}

#[test]
fn the_previous_release_reads_what_this_one_writes() {
    let sku = FilterMeta {
        key_type: KeyType::Int,
        identity: "sqlite:/tmp/a.db:skus.id:Int".into(),
        ..meta()
    };
    let fields: HashMap<String, String> = as_map(&sku);
    assert_eq!(
        previous_sku_reads(&fields, 0.001, BloomLayout::Blocked, &sku.identity),
        Ok((41, 43, 1_000_000))
    );
    let resource = meta();
    let fields: HashMap<String, String> = as_map(&resource);
    assert_eq!(
        previous_resource_reads(
            &fields,
            0.001,
            BloomLayout::Blocked,
            KeyType::Text,
            &resource.identity
        ),
        Ok((41, 1_000_000))
    );
    // And the fixtures are what it read (the readers are not vacuous).
    assert!(previous_sku_reads(
        &map(PREVIOUS_SKU_EPOCH),
        0.01,
        BloomLayout::Blocked,
        "sqlite:/tmp/a.db:skus.id:Int"
    )
    .is_ok());
    assert!(previous_sku_reads(
        &map(PREVIOUS_SKU_EPOCH),
        0.001,
        BloomLayout::Blocked,
        "sqlite:/tmp/a.db:skus.id:Int"
    )
    .is_err());
}

#[test]
fn a_filter_of_another_shape_or_table_is_refused() {
    let m = meta();
    let want = Want {
        layout: BloomLayout::Blocked,
        fpp: 0.001,
        key_type: KeyType::Text,
        fold: Fold::Exact,
        identity: Some("mysql:3306/shop:users.id:Text"),
    };
    m.check(&want).unwrap();
    let refused = |w: Want<'_>| m.check(&w).unwrap_err();
    assert!(matches!(
        refused(Want {
            identity: None,
            ..want
        }),
        AdoptError::NoIdentity
    ));
    assert!(matches!(
        refused(Want { fpp: 0.01, ..want }),
        AdoptError::OtherShape { .. }
    ));
    assert!(matches!(
        refused(Want {
            layout: BloomLayout::Classic,
            ..want
        }),
        AdoptError::OtherShape { .. }
    ));
    assert!(matches!(
        refused(Want {
            key_type: KeyType::Int,
            ..want
        }),
        AdoptError::OtherShape { .. }
    ));
    let other = refused(Want {
        identity: Some("mysql:3306/staging:users.id:Text"),
        ..want
    });
    assert!(
        other.to_string().contains("another database, table"),
        "{other}"
    );
}

/// An outbox that acted on a rebuild request at 50.
struct Asked;

impl ChangeLog for Asked {
    async fn max_seq(&self) -> Result<i64, StoreError> {
        Ok(60)
    }

    async fn created_keys_after(
        &self,
        _from: i64,
        _resource: &str,
    ) -> Result<Option<Vec<String>>, StoreError> {
        Ok(Some(Vec::new()))
    }

    fn rebuild_requested(&self, _resource: &str) -> i64 {
        50
    }
}

/// A filter whose scan began before a rebuild request this instance
/// acted on (rows no entry names, which no replay adds) is refused
/// before its bytes are read; one that began after it is taken.
#[tokio::test]
async fn a_filter_older_than_a_rebuild_request_acted_on_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let store = crate::sql::Database::connect(&format!("sqlite://{}/a.db", dir.path().display()))
        .await
        .unwrap();
    let shield = Shield::new(
        super::super::ShieldConfig {
            enabled: true,
            layout: BloomLayout::Blocked,
            expected: 1000,
            fpp: 0.001,
            auto_rebuild: false,
            scan_rows_per_sec: 0,
        },
        std::sync::Arc::new(store),
    );
    let mut made = meta();
    made.identity = "db:users.id:Text".into();
    let want = Want {
        layout: BloomLayout::Blocked,
        fpp: 0.001,
        key_type: KeyType::Text,
        fold: Fold::default(),
        identity: Some("db:users.id:Text"),
    };
    let bytes_read = std::sync::atomic::AtomicBool::new(false);
    made.covered = 49;
    let refused = shield
        .adopt(&made, &want, &Asked, "users", How::Adopt, async {
            bytes_read.store(true, std::sync::atomic::Ordering::Relaxed);
            Err(AdoptError::Gone)
        })
        .await
        .unwrap_err();
    assert!(
        matches!(
            refused,
            AdoptError::Uncovered {
                covered: 49,
                asked: 50
            }
        ),
        "{refused}"
    );
    assert!(!bytes_read.load(std::sync::atomic::Ordering::Relaxed));
    // Covering it: the bytes are read (here: gone).
    made.covered = 50;
    let read = shield
        .adopt(&made, &want, &Asked, "users", How::Adopt, async {
            bytes_read.store(true, std::sync::atomic::Ordering::Relaxed);
            Err(AdoptError::Gone)
        })
        .await
        .unwrap_err();
    assert!(matches!(read, AdoptError::Gone), "{read}");
    assert!(bytes_read.load(std::sync::atomic::Ordering::Relaxed));
}
