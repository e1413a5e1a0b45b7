//! The golden list: every `/metrics` family (name, type, label names) and
//! every key of `/api/cache/stats`, for a fixed configuration and a fixed
//! set of requests, compared with `tests/golden/*.txt`. A renamed or lost
//! figure fails here instead of exporting 0 or vanishing from a
//! dashboard. After a deliberate change, `BLOOMGATE_BLESS=1 cargo test -p
//! bloomgate-service --test golden` writes the files again; the diff is
//! the list of renames to review.

mod common;

use std::collections::{BTreeMap, BTreeSet};

use common::{eventually, TestServer};

/// Objects whose keys are data (statement names, outcomes), not names.
const OPEN_MAPS: [&str; 3] = ["slow", "requests", "progress"];

fn stats_keys(v: &serde_json::Value, path: &str, out: &mut BTreeSet<String>) {
    match v {
        serde_json::Value::Object(m) if !OPEN_MAPS.iter().any(|k| path.ends_with(k)) => {
            for (k, v) in m {
                let p = if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                };
                stats_keys(v, &p, out);
            }
        }
        serde_json::Value::Array(_) => {
            out.insert(format!("{path}[]"));
        }
        _ => {
            out.insert(path.to_owned());
        }
    }
}

fn metric_families(text: &str) -> BTreeSet<String> {
    let mut types: BTreeMap<String, String> = BTreeMap::new();
    let mut labels: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut parts = rest.split_whitespace();
            if let (Some(name), Some(kind)) = (parts.next(), parts.next()) {
                types.insert(name.to_owned(), kind.to_owned());
            }
            continue;
        }
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let name_end = line.find(['{', ' ']).unwrap_or(line.len());
        let mut name = &line[..name_end];
        for suffix in ["_bucket", "_sum", "_count"] {
            if let Some(base) = name.strip_suffix(suffix) {
                if types.contains_key(base) {
                    name = base;
                }
            }
        }
        let set = labels.entry(name.to_owned()).or_default();
        if let Some(open) = line.find('{') {
            let close = line.rfind('}').unwrap_or(line.len());
            for pair in line[open + 1..close].split("\",") {
                if let Some((k, _)) = pair.split_once('=') {
                    if k != "le" && k != "quantile" {
                        set.insert(k.trim().to_owned());
                    }
                }
            }
        }
    }
    labels
        .into_iter()
        .map(|(name, l)| {
            let kind = types.get(&name).map_or("untyped", String::as_str);
            let l: Vec<String> = l.into_iter().collect();
            format!("{name} {kind} {{{}}}", l.join(","))
        })
        .collect()
}

fn compare(file: &str, now: &BTreeSet<String>) {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(file);
    let text: String = now.iter().map(|l| format!("{l}\n")).collect();
    if std::env::var("BLOOMGATE_BLESS").is_ok_and(|v| v == "1") {
        std::fs::write(&path, &text).unwrap();
        return;
    }
    let golden = std::fs::read_to_string(&path).unwrap_or_default();
    let want: BTreeSet<String> = golden.lines().map(str::to_owned).collect();
    let lost: Vec<&String> = want.difference(now).collect();
    let added: Vec<&String> = now.difference(&want).collect();
    assert!(
        lost.is_empty() && added.is_empty(),
        "{file} changed: lost {lost:#?}, added {added:#?} (BLOOMGATE_BLESS=1 writes it again)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_and_stats_key_is_the_golden_lists() {
    let Some(redis) = common::redis_url().await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let url = common::sqlite_url(&dir);
    let w = common::sql_pool(&url).await;
    common::users_table(&w, &["u1"]).await;
    let mut c = common::config(&url, Some(&redis), "golden");
    c.resources.push(common::users_resource("users"));
    common::redis_clear(&redis, &c.cache.redis_prefix).await;
    let s = TestServer::start(c, 100).await;
    eventually(10, "ready", || async { s.get("/readyz").await.0 == 200 }).await;
    for path in [
        "/api/seckill/1",
        "/api/seckill/1",
        "/api/seckill/200100",
        "/api/seckill/abc",
        "/api/skus/2",
        "/api/users/u1",
        "/api/users/u2",
        "/api/nowhere",
    ] {
        s.get(path).await;
    }
    let mut keys = BTreeSet::new();
    let mut stats = s.stats().await;
    // Values that are absent or null by chance of timing.
    stats["redis"]["keys"] = 0.into();
    stats_keys(&stats, "", &mut keys);
    compare("stats_keys.txt", &keys);
    compare("metrics.txt", &metric_families(&s.metrics_text().await));
    s.stop().await;
    w.close().await;
}
