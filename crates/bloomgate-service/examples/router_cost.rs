//! The service's own cost per request, without the network: the same
//! requests through `router()` and through the bare axum router of
//! `bare_axum.rs`, alternating in rounds on one thread (tower `oneshot`),
//! median ns per request; a configured resource (seed 002's `users`, text
//! keys) beside the SKUs, through the same generic funnel. What `scripts/service_bench.sh` measures with
//! wrk includes the kernel's TCP work, the same for both; this isolates
//! what the service's layers and handlers add to it.
//!
//! `cargo run --release -p bloomgate-service --example router_cost -- [requests per round]`

use std::time::Instant;

use axum::body::Body;
use axum::http::Request;
use axum::routing::get;
use axum::{Json, Router};
use tower::ServiceExt;

async fn time<S>(router: &S, path: &str, n: u32, status: u16) -> f64
where
    S: tower::Service<
            Request<Body>,
            Response = axum::response::Response,
            Error = std::convert::Infallible,
        > + Clone,
{
    let started = Instant::now();
    for _ in 0..n {
        let req = Request::get(path).body(Body::empty()).unwrap();
        let res = router.clone().oneshot(req).await.unwrap();
        assert_eq!(res.status().as_u16(), status, "{path}");
        // Read the body, as hyper would.
        let _ = axum::body::to_bytes(res.into_body(), 1 << 20)
            .await
            .unwrap();
    }
    started.elapsed().as_nanos() as f64 / f64::from(n)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let n: u32 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(200_000);
    let dir = tempfile::tempdir().unwrap();
    let mut config = bloomgate_service::Config {
        database_url: format!("sqlite://{}/skus.db", dir.path().display()),
        seed_if_empty: 1000,
        ..bloomgate_service::Config::default()
    };
    config.listen = "127.0.0.1:0".parse().unwrap();
    let users = sqlx::SqlitePool::connect(&format!("{}?mode=rwc", config.database_url))
        .await
        .unwrap();
    sqlx::query("CREATE TABLE users (id VARCHAR(32) PRIMARY KEY, name TEXT NOT NULL)")
        .execute(&users)
        .await
        .unwrap();
    for i in 0..1000 {
        sqlx::query("INSERT INTO users VALUES (?, ?)")
            .bind(format!("u{i:06}"))
            .bind(format!("user {i}"))
            .execute(&users)
            .await
            .unwrap();
    }
    users.close().await;
    config.resources = vec![bloomgate_service::config::resources::ResourceConfig {
        name: "users".into(),
        table: "users".into(),
        key: "id".into(),
        key_type: bloomgate_service::key::KeyType::Text,
        columns: Vec::new(),
        bloom_expected: 100_000,
        bloom_fpp: 0.001,
        bloom_layout: bloomgate_service::config::BloomLayout::Blocked,
        max_batch_keys: 1000,
        watch_column: None,
        watch_every_ms: 1000,
        bloom_snapshot_path: None,
        bloom_mode: None,
        bloom_auto_rebuild: None,
        bloom_segment_bytes: None,
        bloom_rebuild_after_deletes: None,
        capture: bloomgate_service::config::Capture::None,
    }];
    let state = bloomgate_service::AppState::connect(&config).await.unwrap();
    if let Some(build) = bloomgate_service::prepare(&state, &config).await.unwrap() {
        build.await.unwrap();
    }
    let gate = std::sync::Arc::clone(state.resources[0].shield());
    while !gate.is_ready() {
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let refused = (0..)
        .map(|n| format!("x{n:07}"))
        .find(|k| {
            gate.probe(bloomgate_service::key::Key::Text(k.clone()))
                == bloomgate_service::shield::Verdict::Reject
        })
        .unwrap();
    let refused = format!("/api/users/{refused}");
    {
        let state = std::sync::Arc::new(state.clone());
        let handler = bloomgate_service::http::routes::sku_detail(
            axum::extract::State(std::sync::Arc::clone(&state)),
            axum::extract::Path("42".to_string()),
        );
        let lookup = state.skus.get(42);
        println!(
            "future sizes: sku_detail {} bytes, reader.lookup {} bytes",
            std::mem::size_of_val(&handler),
            std::mem::size_of_val(&lookup)
        );
    }
    let service = bloomgate_service::router(state);
    let bare = Router::new().route(
        "/api/seckill/{sku_id}",
        get(|| async { Json(serde_json::json!({ "code": 404, "error": "not_found" })) }),
    );
    // The L1 hit needs the SKU in L1 first.
    time(&service, "/api/seckill/42", 1, 200).await;
    time(&service, "/api/users/u000042", 1, 200).await;
    let (mut b, mut reject, mut hit) = (Vec::new(), Vec::new(), Vec::new());
    let (mut r_reject, mut r_hit) = (Vec::new(), Vec::new());
    for _ in 0..7 {
        b.push(time(&bare, "/api/seckill/200100", n, 200).await);
        reject.push(time(&service, "/api/seckill/200100", n, 404).await);
        hit.push(time(&service, "/api/seckill/42", n, 200).await);
        r_reject.push(time(&service, &refused, n, 404).await);
        r_hit.push(time(&service, "/api/users/u000042", n, 200).await);
    }
    let (b, reject, hit) = (median(b), median(reject), median(hit));
    let (r_reject, r_hit) = (median(r_reject), median(r_hit));
    println!("bare axum route     {b:7.0} ns/request");
    println!(
        "filter rejection    {reject:7.0} ns/request  (+{:.0} ns)",
        reject - b
    );
    println!(
        "L1 hit              {hit:7.0} ns/request  (+{:.0} ns)",
        hit - b
    );
    println!(
        "users: rejection    {r_reject:7.0} ns/request  (+{:.0} ns)",
        r_reject - b
    );
    println!(
        "users: L1 hit       {r_hit:7.0} ns/request  (+{:.0} ns)",
        r_hit - b
    );
}
