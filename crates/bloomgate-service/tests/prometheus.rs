//! A real Prometheus scrapes a running instance; after a scripted sequence
//! of reads, README's PromQL (read from README.md) evaluated through
//! Prometheus's HTTP API gives the rates the service's own counters say.

mod common;

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::TestServer;
use serde_json::Value;

const READ: &str = "/api/seckill/{sku_id}";

/// Prometheus on a loopback port, killed on drop.
struct Prometheus {
    child: Child,
    base: String,
    client: reqwest::Client,
    _dir: tempfile::TempDir,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Prometheus {
    async fn start(binary: &std::path::Path, target: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
                 scrape_configs:\n  - job_name: bloomgate\n    static_configs:\n      - targets: ['{target}']\n"
            ),
        )
        .unwrap();
        let port = common::free_port();
        let log = std::fs::File::create(dir.path().join("prometheus.log")).unwrap();
        let child = Command::new(binary)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        let p = Self {
            child,
            base: format!("http://127.0.0.1:{port}"),
            client: reqwest::Client::new(),
            _dir: dir,
        };
        let ready = format!("{}/-/ready", p.base);
        common::eventually(30, "prometheus ready", || async {
            p.client
                .get(&ready)
                .send()
                .await
                .is_ok_and(|r| r.status() == 200)
        })
        .await;
        p
    }

    /// An instant query; the single value of its result, if any.
    async fn value(&self, query: &str) -> Option<f64> {
        let body: Value = self
            .client
            .get(format!("{}/api/v1/query", self.base))
            .query(&[("query", query)])
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(body["status"], "success", "{query}: {body}");
        let result = body["data"]["result"].as_array()?;
        assert!(result.len() <= 1, "{query}: one series expected: {body}");
        result.first()?["value"][1].as_str()?.parse().ok()
    }
}

/// The operations guide's PromQL block: (comment, expression) pairs.
fn readme_queries() -> Vec<(String, String)> {
    let readme = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../docs/operate.md"
    ))
    .unwrap();
    let block = readme
        .split("```promql\n")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .expect("docs/operate.md has a ```promql block");
    let lines: Vec<&str> = block.lines().collect();
    lines
        .chunks(2)
        .map(|pair| {
            let comment = pair[0].strip_prefix("# ").expect("a comment line");
            (comment.to_string(), pair[1].to_string())
        })
        .collect()
}

fn total_reads(stats: &Value) -> i64 {
    stats["requests"]
        .as_object()
        .unwrap()
        .values()
        .map(|v| v.as_i64().unwrap())
        .sum()
}

async fn delete(server: &TestServer, id: i64) -> u16 {
    server
        .send(reqwest::Method::DELETE, &format!("/api/skus/{id}"), None)
        .await
        .0
}

#[tokio::test]
async fn readmes_promql_gives_the_rates_the_service_counted() {
    let Some(binary) = common::tool("prometheus") else {
        return;
    };
    let queries = readme_queries();
    assert_eq!(queries.len(), 3, "{queries:?}");
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(
        common::config(&common::sqlite_url(&dir), None, "prom"),
        1000,
    )
    .await;
    let target = server.base.trim_start_matches("http://").to_string();
    let prom = Prometheus::start(&binary, &target).await;

    // Every series the script moves exists before it starts, so each
    // rate counts only the script's increments.
    for path in ["/api/seckill/1", "/api/seckill/1", "/api/seckill/900000000"] {
        server.get(path).await;
    }
    assert_eq!(delete(&server, 900).await, 200);
    assert_eq!(server.get("/api/seckill/900").await.0, 404);
    common::eventually(30, "two scrapes of the read series", || async {
        prom.value(&format!(
            "count_over_time(bloomgate_requests_total{{route=\"{READ}\",outcome=\"db_missing\"}}[1m])"
        ))
        .await
        .is_some_and(|n| n >= 2.0)
    })
    .await;

    let before = server.stats().await;
    for i in 0..60u64 {
        let id = 1_000_000_000 + bloomgate_filter::hash::splitmix64(i) % 1_000_000_000;
        assert_eq!(server.get(&format!("/api/seckill/{id}")).await.0, 404);
    }
    for id in 901..920 {
        assert_eq!(delete(&server, id).await, 200);
        assert_eq!(server.get(&format!("/api/seckill/{id}")).await.0, 404);
    }
    for _ in 0..21 {
        assert_eq!(server.get("/api/seckill/1").await.0, 200);
    }
    let after = server.stats().await;
    let d = |p: &[&str]| (common::counter(&after, p) - common::counter(&before, p)) as f64;
    let reads = (total_reads(&after) - total_reads(&before)) as f64;
    assert_eq!(reads, 100.0);
    let expected = [
        d(&["requests", "filter_rejected"]) / reads,
        d(&["sql", "missing"]) / reads,
        d(&["bloom", "passed_missing"])
            / (d(&["bloom", "passed_missing"]) + d(&["bloom", "rejected"])),
    ];
    // Sanity: the script did what it says (up to false positives).
    assert!(expected[0] > 0.5 && expected[1] >= 0.19, "{expected:?}");

    // Wait until Prometheus has seen the last read, then a few more
    // scrapes, so every rate covers the whole script.
    let total = total_reads(&after) as f64;
    common::eventually(30, "the scrape after the script", || async {
        prom.value(&format!(
            "sum(bloomgate_requests_total{{route=\"{READ}\"}})"
        ))
        .await
        .is_some_and(|n| n >= total)
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;

    for ((what, query), want) in queries.iter().zip(expected) {
        let got = prom
            .value(query)
            .await
            .unwrap_or_else(|| panic!("{what}: no value for {query}"));
        // rate() extrapolates each series to the window's edges a little
        // differently (by its first value), so ratios agree to a few per
        // cent, not exactly.
        assert!(
            (got - want).abs() <= 0.1 * want,
            "{what}: Prometheus says {got}, the service counted {want} ({query})"
        );
        eprintln!("{what}: Prometheus {got:.4}, service {want:.4}");
    }
    // Gauges come through exactly.
    let fpr = prom.value("bloomgate_filter_target_fpr").await.unwrap();
    assert_eq!(fpr, 0.001);
    let items = prom.value("bloomgate_filter_items").await.unwrap();
    assert_eq!(items, after["bloom"]["added"].as_f64().unwrap());
    drop(prom);
    server.stop().await;
}
