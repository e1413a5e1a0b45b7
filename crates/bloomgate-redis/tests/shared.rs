//! The shared filter on a real Redis server.

use bloomgate_filter::{BlockedBloom, Filter};
use bloomgate_redis::{Error, RedisBloom};
use redis::aio::ConnectionManager;

async fn conn() -> Option<ConnectionManager> {
    let url = std::env::var("BLOOMGATE_TEST_REDIS_URL")
        .unwrap_or_else(|_| "redis://127.0.0.1:6379/".into());
    let client = redis::Client::open(url).unwrap();
    match ConnectionManager::new(client).await {
        Ok(c) => Some(c),
        Err(e) if std::env::var("CI").is_ok_and(|v| v == "true") => {
            panic!("Redis unreachable: {e} (CI=true)")
        }
        Err(e) => {
            eprintln!("SKIPPED: Redis unreachable: {e}");
            None
        }
    }
}

async fn fresh(c: &ConnectionManager, key: &str) {
    let mut c = c.clone();
    let _: () = redis::cmd("DEL")
        .arg(key)
        .arg(format!("{key}:meta"))
        .query_async(&mut c)
        .await
        .unwrap();
}

#[tokio::test]
async fn two_instances_share_inserts_and_never_miss_a_key() {
    let Some(c) = conn().await else { return };
    let key = "bgtest:shared:a";
    fresh(&c, key).await;
    let a = RedisBloom::create(c.clone(), key, 20_000, 0.01, 7)
        .await
        .unwrap();
    let b = RedisBloom::open(c.clone(), key).await.unwrap();
    assert_eq!(a.params(), b.params());
    let keys: Vec<u64> = (0..10_000u64).map(|i| i * 7919).collect();
    a.insert_many(&keys[..5000]).await.unwrap();
    for k in &keys[5000..5100] {
        b.insert(k).await.unwrap();
    }
    // Each instance sees the other's inserts.
    assert!(b
        .contains_many(&keys[..5000])
        .await
        .unwrap()
        .iter()
        .all(|&x| x));
    for k in &keys[5000..5100] {
        assert!(a.contains(k).await.unwrap());
    }
    // Absent keys are mostly rejected (1% target; 5,100 of 20,000 loaded).
    let absent: Vec<u64> = (0..5000u64).map(|i| 1_000_000_000 + i).collect();
    let yes = a
        .contains_many(&absent)
        .await
        .unwrap()
        .iter()
        .filter(|&&x| x)
        .count();
    assert!(yes < 50, "{yes} of 5000 absent keys said maybe");
    // Creating again with the same shape opens it, and says it did not
    // create it (the caller must not refill it); every bit survives.
    let bits_before = a.download().await.unwrap();
    let (again, created) = RedisBloom::create_or_open(c.clone(), key, 20_000, 0.01, 7)
        .await
        .unwrap();
    assert!(!created, "an existing filter was reported as new");
    assert_eq!((again.params(), again.seed()), (a.params(), 7));
    assert!(
        again.download().await.unwrap().bitmap().words() == bits_before.bitmap().words(),
        "re-creating changed the bits"
    );
    assert!(again
        .contains_many(&keys[..5100])
        .await
        .unwrap()
        .iter()
        .all(|&x| x));
    // Another shape is refused.
    assert!(matches!(
        RedisBloom::create(c.clone(), key, 40_000, 0.01, 7).await,
        Err(Error::ShapeMismatch { .. })
    ));
    a.destroy().await.unwrap();
}

#[tokio::test]
async fn upload_and_download_match_a_local_filter_bit_for_bit() {
    let Some(c) = conn().await else { return };
    let key = "bgtest:shared:b";
    fresh(&c, key).await;
    let shared = RedisBloom::create(c.clone(), key, 5000, 0.01, 3)
        .await
        .unwrap();
    let mut local = BlockedBloom::new(shared.params(), 3).unwrap();
    for k in 0..5000u64 {
        local.insert(&k);
    }
    shared.upload(&local).await.unwrap();
    // Bits uploaded from the local filter answer in Redis as they do locally.
    for k in (0..5000u64).step_by(97) {
        assert!(shared.contains(&k).await.unwrap());
    }
    // Inserting through Redis sets exactly the bits a local insert sets.
    shared.insert(&123_456_789u64).await.unwrap();
    local.insert(&123_456_789u64);
    let back = shared.download().await.unwrap();
    assert_eq!(back.bitmap().words(), local.bitmap().words());
    assert_eq!(back.count_ones(), local.count_ones());
    // A filter of another shape cannot be uploaded.
    let other = BlockedBloom::with_fpr(100, 0.5).unwrap();
    assert!(matches!(
        shared.upload(&other).await,
        Err(Error::ShapeMismatch { .. })
    ));
    shared.destroy().await.unwrap();
}

#[tokio::test]
async fn opening_something_else_is_an_error() {
    let Some(c) = conn().await else { return };
    let key = "bgtest:shared:c";
    fresh(&c, key).await;
    assert!(matches!(
        RedisBloom::open(c.clone(), key).await,
        Err(Error::Meta { .. })
    ));
    let mut raw = c.clone();
    let _: () = redis::cmd("HSET")
        .arg(format!("{key}:meta"))
        .arg("layout")
        .arg("blocked-v1")
        .arg("blocks")
        .arg("x")
        .query_async(&mut raw)
        .await
        .unwrap();
    assert!(matches!(
        RedisBloom::open(c.clone(), key).await,
        Err(Error::Meta { .. })
    ));
    fresh(&c, key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_upload_racing_inserts_from_another_client_loses_none_of_them() {
    let Some(c) = conn().await else { return };
    let key = "bgtest:shared:race";
    fresh(&c, key).await;
    let shared = RedisBloom::create(c.clone(), key, 50_000, 0.01, 11)
        .await
        .unwrap();
    let other = RedisBloom::open(c.clone(), key).await.unwrap();
    let mut local = BlockedBloom::new(shared.params(), 11).unwrap();
    for k in 0..20_000u64 {
        local.insert(&k);
    }
    // Another instance inserts while this one uploads, many times over.
    let inserter = tokio::spawn(async move {
        for k in 1_000_000..1_002_000u64 {
            other.insert(&k).await.unwrap();
        }
    });
    for _ in 0..20 {
        shared.upload(&local).await.unwrap();
    }
    inserter.await.unwrap();
    shared.upload(&local).await.unwrap();
    let keys: Vec<u64> = (0..20_000u64).chain(1_000_000..1_002_000).collect();
    let found = shared.contains_many(&keys).await.unwrap();
    assert!(
        found.iter().all(|&f| f),
        "an upload dropped a concurrent insert"
    );
    shared.destroy().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_creates_and_opens_never_see_half_written_parameters() {
    let Some(c) = conn().await else { return };
    // What every creator asks for, and so what every open must read back.
    let want = bloomgate_filter::sizing::blocked(10_000, 0.01, 256).unwrap();
    for round in 0..20 {
        let key = format!("bgtest:shared:create{round}");
        fresh(&c, &key).await;
        let tasks: Vec<_> = (0..8)
            .map(|i| {
                let (c, key) = (c.clone(), key.clone());
                tokio::spawn(async move {
                    let opened = if i % 2 == 0 {
                        RedisBloom::create(c, &key, 10_000, 0.01, 5).await
                    } else {
                        // An open may find nothing yet, never half a filter.
                        match RedisBloom::open(c, &key).await {
                            Err(Error::Meta { reason, .. }) => {
                                assert_eq!(reason, "no bloomgate filter metadata");
                                return None;
                            }
                            other => other,
                        }
                    };
                    let f = opened.unwrap();
                    Some((f.params(), f.seed(), f.segments()))
                })
            })
            .collect();
        let mut seen = 0;
        for t in tasks {
            if let Some(got) = t.await.unwrap() {
                assert_eq!(got, (want, 5, 1), "round {round}: parameters read back");
                seen += 1;
            }
        }
        assert!(seen >= 4, "round {round}: {seen} of 8 saw the filter");
        fresh(&c, &key).await;
    }
}

/// go-zero's check, the comparison baseline: `k` `GETBIT`s in one script.
const LUA_GETBITS: &str = r"
for _, offset in ipairs(ARGV) do
  if tonumber(redis.call('getbit', KEYS[1], offset)) == 0 then return 0 end
end
return 1
";

#[tokio::test]
async fn the_one_range_check_answers_as_the_local_filter_and_the_getbit_script() {
    let Some(c) = conn().await else { return };
    let key = "bgtest:shared:range";
    fresh(&c, key).await;
    let shared = RedisBloom::create(c.clone(), key, 20_000, 0.01, 3)
        .await
        .unwrap();
    let mut local = BlockedBloom::new(shared.params(), 3).unwrap();
    let members: Vec<u64> = (0..20_000u64)
        .map(bloomgate_filter::hash::splitmix64)
        .collect();
    shared.insert_many(&members[..10_000]).await.unwrap();
    for m in &members[10_000..] {
        shared.insert(m).await.unwrap();
    }
    local.insert_many(&members);
    assert_eq!(
        shared.download().await.unwrap().bitmap().words(),
        local.bitmap().words(),
        "BITFIELD sets the local filter's bits"
    );
    let probes: Vec<u64> = members[..2_000]
        .iter()
        .copied()
        .chain((0..20_000u64).map(|i| i | (1 << 60)))
        .collect();
    let answers = shared.contains_many(&probes).await.unwrap();
    let script = redis::Script::new(LUA_GETBITS);
    let mut conn = c.clone();
    let mut positives = 0;
    for (i, (probe, &answer)) in probes.iter().zip(&answers).enumerate() {
        assert_eq!(answer, local.contains(probe), "probe {i}");
        if i % 10 == 0 {
            assert_eq!(shared.contains(probe).await.unwrap(), answer, "probe {i}");
            let mut inv = script.key(key);
            for off in shared.offsets_of(probe) {
                inv.arg(off);
            }
            let lua: i64 = inv.invoke_async(&mut conn).await.unwrap();
            assert_eq!(lua == 1, answer, "probe {i}: the GETBIT script disagrees");
        }
        positives += usize::from(answer);
    }
    assert!(answers[..2_000].iter().all(|&a| a), "no false negatives");
    // About 1% of the 20,000 non-members pass, as the local filter does.
    assert!(
        (2_000 + 80..2_000 + 400).contains(&positives),
        "{positives}"
    );
    RedisBloom::open(c, key)
        .await
        .unwrap()
        .destroy()
        .await
        .unwrap();
}

#[tokio::test]
async fn a_segmented_filter_on_one_server_agrees_with_the_local_filter() {
    let Some(c) = conn().await else { return };
    let key = "bgtest:shared:segments";
    if let Ok(old) = RedisBloom::open(c.clone(), key).await {
        old.destroy().await.unwrap();
    }
    fresh(&c, key).await;
    let (shared, created) =
        RedisBloom::create_or_open_segmented(c.clone(), key, 30_000, 0.01, 4, 1024)
            .await
            .unwrap();
    assert!(created);
    assert!(shared.segments() > 30, "{} segments", shared.segments());
    assert_ne!(shared.segment_key(0), key);
    let mut local = BlockedBloom::new(shared.params(), 4).unwrap();
    let members: Vec<u64> = (0..30_000u64).map(|i| i * 7919).collect();
    for m in &members {
        local.insert(m);
    }
    shared.insert_many(&members).await.unwrap();
    let probes: Vec<u64> = (0..30_000u64).map(|i| i * 7919 + 1).collect();
    let want: Vec<bool> = probes.iter().map(|k| local.contains(k)).collect();
    assert_eq!(shared.contains_many(&probes).await.unwrap(), want);
    assert!(shared
        .contains_many(&members)
        .await
        .unwrap()
        .iter()
        .all(|&b| b));
    assert_eq!(
        shared.download().await.unwrap().bitmap().words(),
        local.bitmap().words()
    );
    // An opener reads the segment size from the metadata.
    let opened = RedisBloom::open(c.clone(), key).await.unwrap();
    assert_eq!(opened.segments(), shared.segments());
    assert!(opened.contains(&members[123]).await.unwrap());
    shared.destroy().await.unwrap();
    let mut cc = c.clone();
    let left: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{key}*"))
        .query_async(&mut cc)
        .await
        .unwrap();
    assert!(left.is_empty(), "destroy left {left:?}");
}

#[tokio::test]
async fn bad_keys_and_segment_sizes_are_refused_with_a_reason() {
    let Some(c) = conn().await else { return };
    for (key, seg) in [
        ("bgtest:{tag}", 1024),
        ("", 1024),
        ("bgtest:shared:badseg", 100),
        ("bgtest:shared:badseg", 0),
        ("bgtest:shared:badseg", (512 << 20) + 64),
    ] {
        match RedisBloom::create_or_open_segmented(c.clone(), key, 1000, 0.01, 1, seg).await {
            Err(Error::Invalid { reason, .. }) => assert!(!reason.is_empty()),
            other => panic!("{key:?} {seg}: {other:?}"),
        }
    }
}

/// A lost segment (a flushed or restarted Redis) is never recreated by an
/// insert: a plain `BITFIELD SET` would write zeros up to the key's block,
/// and every key below it would then read as a definite "no". The insert
/// is refused, lookups fail ("maybe" to a caller guarding a database),
/// and an upload brings the segment back whole.
#[tokio::test]
async fn an_insert_into_a_lost_segment_is_refused_and_an_upload_restores_it() {
    let Some(c) = conn().await else { return };
    let key = "bgtest:shared:lost";
    fresh(&c, key).await;
    let f = RedisBloom::create(c.clone(), key, 2_000, 0.01, 0)
        .await
        .unwrap();
    let mut local = BlockedBloom::new(f.params(), 0).unwrap();
    for k in 0..1_000_u64 {
        f.insert(&k).await.unwrap();
        local.insert(&k);
    }
    let _: () = redis::cmd("DEL")
        .arg(key)
        .query_async(&mut c.clone())
        .await
        .unwrap();
    assert!(f.insert(&5_000_u64).await.is_err(), "refused");
    assert!(f.insert_many(&[5_001_u64, 5_002]).await.is_err(), "refused");
    let exists: bool = redis::cmd("EXISTS")
        .arg(key)
        .query_async(&mut c.clone())
        .await
        .unwrap();
    assert!(!exists, "no string of zeros");
    for k in 0..1_000_u64 {
        assert!(f.contains(&k).await.is_err(), "{k}: an error, never a no");
    }
    f.upload(&local).await.unwrap();
    for k in 0..1_000_u64 {
        assert!(f.contains(&k).await.unwrap(), "{k}");
    }
    f.insert(&5_000_u64).await.unwrap();
    assert!(f.contains(&5_000_u64).await.unwrap());
    fresh(&c, key).await;
}

/// A filter created unfilled has no segment until it is uploaded: a
/// reader and an insert meet a missing segment (an error: "maybe" for a
/// guard), never zeros that read as "no", and after the upload every
/// member is found.
#[tokio::test]
async fn an_unfilled_filter_is_never_read_as_zeros() {
    let Some(c) = conn().await else { return };
    let key = "bgtest:shared:unfilled";
    if let Ok(old) = RedisBloom::open(c.clone(), key).await {
        old.destroy().await.unwrap();
    }
    fresh(&c, key).await;
    let (shared, created) =
        RedisBloom::create_or_open_unfilled(c.clone(), key, 10_000, 0.01, 2, 1024)
            .await
            .unwrap();
    assert!(created);
    let members: Vec<u64> = (0..10_000u64).map(|i| i * 31).collect();
    assert!(matches!(
        shared.contains(&members[0]).await,
        Err(bloomgate_redis::Error::Meta { .. })
    ));
    assert!(
        shared.insert(&members[1]).await.is_err(),
        "an insert made zeros"
    );
    // Another opener finds it to fill as well, not a whole filter.
    let (_, again) = RedisBloom::create_or_open_unfilled(c.clone(), key, 10_000, 0.01, 2, 1024)
        .await
        .unwrap();
    assert!(again, "an unfilled filter was reported whole");
    let mut local = BlockedBloom::new(shared.params(), 2).unwrap();
    for m in &members {
        local.insert(m);
    }
    shared.upload(&local).await.unwrap();
    assert!(shared
        .contains_many(&members)
        .await
        .unwrap()
        .iter()
        .all(|&b| b));
    let (_, after) = RedisBloom::create_or_open_unfilled(c.clone(), key, 10_000, 0.01, 2, 1024)
        .await
        .unwrap();
    assert!(!after, "whole once uploaded");
    shared.destroy().await.unwrap();
}
