//! A segmented shared filter on a real three-master Redis Cluster, started
//! by the test on loopback ports of its own (never the machine's Redis).

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bloomgate_filter::{BlockedBloom, Filter};
use bloomgate_redis::{Error, RedisBloom};

/// Three `redis-server --cluster-enabled yes` processes, killed on drop.
struct Cluster {
    nodes: Vec<Child>,
    ports: Vec<u16>,
    dir: PathBuf,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for n in &mut self.nodes {
            let _ = n.kill();
            let _ = n.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true")
}

/// A port whose cluster bus port (+10000) is free too.
fn free_port(taken: &[u16]) -> u16 {
    loop {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let p = l.local_addr().unwrap().port();
        if p > 55_000 || taken.contains(&p) {
            continue;
        }
        if TcpListener::bind(("127.0.0.1", p + 10_000)).is_ok() {
            return p;
        }
    }
}

fn cli(port: u16, args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .output()
        .expect("redis-cli runs");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn start_cluster() -> Option<Cluster> {
    if Command::new("redis-server")
        .arg("--version")
        .output()
        .is_err()
    {
        assert!(!ci(), "redis-server not installed (CI=true)");
        eprintln!("SKIPPED: redis-server not installed");
        return None;
    }
    let dir = std::env::temp_dir().join(format!(
        "bloomgate-cluster-{}-{}",
        std::process::id(),
        fastrand_seed()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let mut cluster = Cluster {
        nodes: Vec::new(),
        ports: Vec::new(),
        dir: dir.clone(),
    };
    for _ in 0..3 {
        let port = free_port(&cluster.ports);
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--cluster-enabled", "yes"])
            .args(["--cluster-config-file", &format!("nodes-{port}.conf")])
            .args(["--dir", dir.to_str().unwrap()])
            .args(["--save", "", "--appendonly", "no"])
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        cluster.nodes.push(child);
        cluster.ports.push(port);
    }
    for &p in &cluster.ports {
        wait_for(|| cli(p, &["ping"]).trim() == "PONG", "node answers PING");
    }
    let addrs: Vec<String> = cluster
        .ports
        .iter()
        .map(|p| format!("127.0.0.1:{p}"))
        .collect();
    let out = Command::new("redis-cli")
        .arg("--cluster")
        .arg("create")
        .args(&addrs)
        .args(["--cluster-replicas", "0", "--cluster-yes"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "cluster create failed: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    for &p in &cluster.ports {
        wait_for(
            || cli(p, &["cluster", "info"]).contains("cluster_state:ok"),
            "cluster state ok",
        );
    }
    Some(cluster)
}

fn fastrand_seed() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

fn wait_for(mut ok: impl FnMut() -> bool, what: &str) {
    let until = Instant::now() + Duration::from_secs(20);
    while !ok() {
        assert!(Instant::now() < until, "timed out waiting: {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A deterministic stream of distinct-looking 64-bit ids.
/// True when the shared filter answers "maybe" for every key.
async fn all_present(f: &RedisBloom, keys: &[u64]) -> bool {
    f.contains_many(keys).await.unwrap().iter().all(|&b| b)
}

fn ids(seed: u64, n: usize) -> Vec<u64> {
    let mut x = seed;
    (0..n)
        .map(|_| {
            // splitmix64
            x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn segmented_filter_spreads_over_a_three_master_cluster_and_answers_exactly() {
    let Some(cluster) = start_cluster() else {
        return;
    };
    let urls: Vec<String> = cluster
        .ports
        .iter()
        .map(|p| format!("redis://127.0.0.1:{p}/"))
        .collect();
    let client = redis::cluster::ClusterClient::new(urls).unwrap();
    let conn = client.get_async_connection().await.unwrap();

    let key = "bgtest:cluster";
    let seed = 9;
    let (shared, created) =
        RedisBloom::create_or_open_segmented(conn.clone(), key, 100_000, 0.01, seed, 4096)
            .await
            .unwrap();
    assert!(created);
    assert!(
        shared.segments() >= 12,
        "want many segments, got {}",
        shared.segments()
    );

    // Every master holds some of the segments.
    for &p in &cluster.ports {
        let here = cli(p, &["--raw", "keys", &format!("{key}:seg:*")]);
        assert!(
            here.lines().filter(|l| !l.is_empty()).count() >= 1,
            "node {p} holds no segment"
        );
    }

    // The same members in Redis and in a local filter of the same shape.
    let members = ids(1, 100_000);
    let others = ids(2, 100_000);
    let mut local = BlockedBloom::new(shared.params(), seed).unwrap();
    for m in &members {
        local.insert(m);
    }
    for batch in members.chunks(10_000) {
        shared.insert_many(batch).await.unwrap();
    }

    assert!(all_present(&shared, &members).await, "a member answered no");
    let got = shared.contains_many(&others).await.unwrap();
    let want: Vec<bool> = others.iter().map(|k| local.contains(k)).collect();
    assert_eq!(
        got, want,
        "cluster and local filter disagree on non-members"
    );
    let fp = got.iter().filter(|&&b| b).count();
    // 1% target; 10^5 trials: 3 sigma is about 0.03%.
    assert!(
        (500..=1_400).contains(&fp),
        "false positives {fp} of 100000"
    );
    // Single-key paths agree too.
    for k in others.iter().take(500) {
        assert_eq!(shared.contains(k).await.unwrap(), local.contains(k));
    }
    assert!(shared.contains(&members[0]).await.unwrap());

    // Download is bit for bit the local filter.
    let copy = shared.download().await.unwrap();
    assert_eq!(copy.bitmap().words(), local.bitmap().words());

    // Upload merges per segment (its temporary key shares the segment's slot).
    let extra = ids(3, 5_000);
    let mut more = BlockedBloom::new(shared.params(), seed).unwrap();
    for k in &extra {
        more.insert(k);
    }
    shared.upload(&more).await.unwrap();
    assert!(all_present(&shared, &extra).await);
    assert!(all_present(&shared, &members).await);

    // Another client with another segment size is refused.
    assert!(matches!(
        RedisBloom::create_or_open_segmented(conn.clone(), key, 100_000, 0.01, seed, 8192).await,
        Err(Error::ShapeMismatch { .. })
    ));

    // A segment lost (its node restarted empty) answers an error, never a
    // "no", until create_or_open allocates it again and asks for a fill.
    let lost = shared.segment_of(&members[0]);
    let lost_key = shared.segment_key(lost);
    let mut c = conn.clone();
    let _: () = redis::cmd("DEL")
        .arg(&lost_key)
        .query_async(&mut c)
        .await
        .unwrap();
    assert!(matches!(
        shared.contains(&members[0]).await,
        Err(Error::Meta { .. })
    ));
    let (again, refill) =
        RedisBloom::create_or_open_segmented(conn.clone(), key, 100_000, 0.01, seed, 4096)
            .await
            .unwrap();
    assert!(refill, "a missing segment must ask for a fill");
    again.insert_many(&members).await.unwrap();
    assert!(all_present(&again, &members).await);

    again.destroy().await.unwrap();
    for &p in &cluster.ports {
        assert_eq!(cli(p, &["dbsize"]).trim(), "0", "node {p} left keys");
    }
}
