//! `/dashboard` in headless Chromium, with reads running: the numbers the
//! page renders match `/api/cache/stats` (counters between the stats read
//! just before and just after the page, static values equal), the page
//! refreshes live, and a screenshot is kept as a test artifact.

mod common;

use std::collections::HashMap;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use common::TestServer;
use serde_json::Value;

fn chromium(binary: &std::path::Path, profile: &std::path::Path, args: &[&str]) -> String {
    let out = Command::new(binary)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            "--virtual-time-budget=4000",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "chromium failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// `data-key` → `data-value` of every element the page filled in, and the
/// text of the elements with an id.
fn rendered(dom: &str) -> (HashMap<String, String>, HashMap<String, String>) {
    let mut keyed = HashMap::new();
    for part in dom.split("data-key=\"").skip(1) {
        let key = part.split('"').next().unwrap().to_string();
        let value = part
            .split("data-value=\"")
            .nth(1)
            .filter(|_| part.find("data-value").unwrap() < part.find('>').unwrap())
            .map(|v| v.split('"').next().unwrap().replace("&quot;", "\""));
        keyed.insert(key, value.unwrap_or_default());
    }
    let mut ids = HashMap::new();
    for part in dom.split(" id=\"").skip(1) {
        let id = part.split('"').next().unwrap().to_string();
        if let Some(text) = part
            .split_once('>')
            .map(|(_, t)| t.split('<').next().unwrap())
        {
            ids.insert(id, text.to_string());
        }
    }
    (keyed, ids)
}

/// The page's raw value of `full` is the stats' value.
fn shows_as_stats(keyed: &std::collections::HashMap<String, String>, stats: &Value, full: &str) {
    let raw = keyed
        .get(full)
        .unwrap_or_else(|| panic!("{full} not on the page"));
    let shown: Value = serde_json::from_str(raw).unwrap();
    assert_eq!(&shown, at(stats, full), "{full}");
}

fn at<'a>(v: &'a Value, key: &str) -> &'a Value {
    key.split('.').fold(v, |v, k| match k.parse::<usize>() {
        Ok(i) if v.is_array() => &v[i],
        _ => &v[k],
    })
}

#[tokio::test]
async fn the_dashboard_renders_what_the_stats_say_while_reads_run() {
    let Some(binary) = common::tool("chromium") else {
        return;
    };
    let Some(redis) = common::redis_url().await else {
        return;
    };
    common::redis_clear(&redis, "bgtest:dashboard:").await;
    let dir = tempfile::tempdir().unwrap();
    let config = common::config(&common::sqlite_url(&dir), Some(&redis), "dashboard");
    let server = Arc::new(TestServer::start(config, 10_000).await);

    // Reads: a quarter existing ids, the rest random ids (mostly rejected).
    let stop = Arc::new(AtomicBool::new(false));
    let mut load = Vec::new();
    for worker in 0..4u64 {
        let (server, stop) = (Arc::clone(&server), Arc::clone(&stop));
        load.push(tokio::spawn(async move {
            let mut i = worker;
            while !stop.load(Ordering::Relaxed) {
                let h = bloomgate_filter::hash::splitmix64(i);
                let id = if h.is_multiple_of(4) {
                    h % 10_000 + 1
                } else {
                    h % 1_000_000_000 + 1
                };
                server.get(&format!("/api/seckill/{id}")).await;
                i += 4;
            }
            i / 4
        }));
    }
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;

    let profile = tempfile::tempdir().unwrap();
    let url = server.url("/dashboard?interval=300");
    let before = server.stats().await;
    let b = binary.clone();
    let (p, u) = (profile.path().to_path_buf(), url.clone());
    let dom = tokio::task::spawn_blocking(move || chromium(&b, &p, &["--dump-dom", &u]))
        .await
        .unwrap();
    let after = server.stats().await;

    let shot = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("dashboard.png");
    let _ = std::fs::remove_file(&shot);
    let (b, p, u) = (binary.clone(), profile.path().to_path_buf(), url.clone());
    let arg = format!("--screenshot={}", shot.display());
    tokio::task::spawn_blocking(move || chromium(&b, &p, &["--window-size=1280,1000", &arg, &u]))
        .await
        .unwrap();
    stop.store(true, Ordering::Relaxed);
    let mut sent = 0;
    for l in load {
        sent += l.await.unwrap();
    }
    assert!(sent > 100, "the load ran ({sent} reads)");
    let png = std::fs::read(&shot).expect("chromium wrote the screenshot");
    assert!(
        png.starts_with(b"\x89PNG") && png.len() > 10_000,
        "a real picture"
    );
    eprintln!("screenshot: {}", shot.display());

    let (keyed, ids) = rendered(&dom);
    assert_eq!(
        ids.get("error").map(String::as_str),
        Some(""),
        "no fetch error"
    );
    let refreshes: u64 = ids["refreshes"].parse().unwrap();
    assert!(
        refreshes >= 3,
        "the page refreshed live ({refreshes} times)"
    );
    // Counters grow while the page runs: what it shows lies between.
    for key in [
        "bloom.rejected",
        "bloom.passed_missing",
        "l1.hits",
        "l1.negative_hits",
        "l1.misses",
        "redis.hits",
        "redis.nil_hits",
        "redis.misses",
        "sql.missing",
        "sql.queries",
    ] {
        let shown: u64 = keyed
            .get(key)
            .unwrap_or_else(|| panic!("{key} not on the page"))
            .parse()
            .unwrap_or_else(|_| panic!("{key}: {:?}", keyed[key]));
        let (lo, hi) = (
            at(&before, key).as_u64().unwrap(),
            at(&after, key).as_u64().unwrap(),
        );
        assert!(
            lo <= shown && shown <= hi,
            "{key}: page {shown}, stats {lo}..{hi}"
        );
    }
    assert!(
        keyed["bloom.rejected"].parse::<u64>().unwrap()
            > at(&before, "bloom.rejected").as_u64().unwrap(),
        "the page's numbers are from after it loaded"
    );
    // Nothing writes: these do not move.
    for key in [
        "bloom.added",
        "bloom.capacity",
        "bloom.rebuilds",
        "bloom.target_fpr",
        "bloom.expected_fpr",
        "bloom.fill_ratio",
        "bloom.alarm",
    ] {
        let shown: Value = serde_json::from_str(&keyed[key]).unwrap();
        assert_eq!(&shown, at(&after, key), "{key}");
    }
    // The reject rate is computed from the numbers shown.
    let reads: f64 = ids["reads-total"].replace(',', "").parse().unwrap();
    let rejected: f64 = keyed["bloom.rejected"].parse().unwrap();
    let rate: f64 = ids["reject-rate"].trim_end_matches('%').parse().unwrap();
    assert!(
        (rate - 100.0 * rejected / reads).abs() < 0.01,
        "{rate} vs {rejected}/{reads}"
    );
    Arc::into_inner(server).unwrap().stop().await;
}

/// Every resource is on the page, the SKU table as `skus` beside a
/// configured `users` table: a users resource's 300 reads of missing keys
/// and 50 of existing ones, made just before, appear in its row.
#[tokio::test]
async fn the_dashboard_shows_every_resource() {
    let Some(binary) = common::tool("chromium") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let url = common::sqlite_url(&dir);
    sqlx::any::install_default_drivers();
    let pool = sqlx::AnyPool::connect(&format!("{url}?mode=rwc"))
        .await
        .unwrap();
    sqlx::query(
        "CREATE TABLE users (id VARCHAR(32) NOT NULL PRIMARY KEY, name VARCHAR(100) NOT NULL)",
    )
    .execute(&pool)
    .await
    .unwrap();
    for i in 1..=50 {
        sqlx::query(&format!("INSERT INTO users VALUES ('u{i}', 'user {i}')"))
            .execute(&pool)
            .await
            .unwrap();
    }
    pool.close().await;
    let mut config = common::config(&url, None, "dashboard-res");
    config.resources = vec![common::users_resource("users")];
    // The HTTP gate's check (no proxy listener): its route's row too.
    config
        .gate
        .routes
        .push(toml::from_str("path = \"/api/profiles/{key}\"\nresource = \"users\"\n").unwrap());
    let server = TestServer::start(config, 100).await;
    common::eventually(20, "users' filter built", || async {
        server.stats().await["resources"]["users"]["filter"]["ready"] == true
    })
    .await;
    for n in 0..300 {
        assert_eq!(server.get(&format!("/api/users/x{n}")).await.0, 404);
    }
    for n in 1..=50 {
        assert_eq!(server.get(&format!("/api/users/u{n}")).await.0, 200);
    }
    for id in [1, 2, 3, 999_999_999] {
        server.get(&format!("/api/seckill/{id}")).await;
    }
    for (n, status) in [("x1", 404), ("x2", 404), ("x3", 404), ("u1", 200)] {
        let path = format!("/api/gate/check/api/profiles/{n}");
        assert_eq!(server.get(&path).await.0, status, "{path}");
    }
    let profile = tempfile::tempdir().unwrap();
    let page = server.url("/dashboard?interval=300");
    let dom = tokio::task::spawn_blocking(move || {
        chromium(&binary, profile.path(), &["--dump-dom", &page])
    })
    .await
    .unwrap();
    let stats = server.stats().await;
    let (keyed, _) = rendered(&dom);
    let users = &stats["resources"]["users"];
    assert!(
        users["filter"]["rejected"].as_u64().unwrap() >= 290,
        "{users}"
    );
    for name in ["users", "skus"] {
        for key in [
            "key_type",
            "filter.ready",
            "filter.rejected",
            "filter.passed",
            "l1.hits",
            "l1.misses",
            "sql.statements",
        ] {
            shows_as_stats(&keyed, &stats, &format!("resources.{name}.{key}"));
        }
    }
    for key in [
        "rejected",
        "forwarded",
        "resource",
        "expected_fpr",
        "not_found_cached",
    ] {
        shows_as_stats(&keyed, &stats, &format!("gate.routes.0.{key}"));
    }
    assert_eq!(keyed["gate.routes.0.rejected"], "3");
    assert_eq!(keyed["resources.users.key_type"], "\"text\"");
    assert_eq!(keyed["resources.skus.key_type"], "\"int\"");
    server.stop().await;
}
