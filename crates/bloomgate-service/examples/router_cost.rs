//! The service's own cost per request, without the network: the same
//! requests through `router()` and through the bare axum router of
//! `bare_axum.rs`, alternating in rounds on one thread (tower `oneshot`),
//! median ns per request. What `scripts/service_bench.sh` measures with
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

async fn time(router: &Router, path: &str, n: u32, status: u16) -> f64 {
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
    let state = bloomgate_service::AppState::connect(&config).await.unwrap();
    if let Some(build) = bloomgate_service::prepare(&state, &config).await.unwrap() {
        build.await.unwrap();
    }
    let service = bloomgate_service::router(state);
    let bare = Router::new().route(
        "/api/seckill/{sku_id}",
        get(|| async { Json(serde_json::json!({ "code": 404, "error": "not_found" })) }),
    );
    // The L1 hit needs the SKU in L1 first.
    time(&service, "/api/seckill/42", 1, 200).await;
    let (mut b, mut reject, mut hit) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..7 {
        b.push(time(&bare, "/api/seckill/200100", n, 200).await);
        reject.push(time(&service, "/api/seckill/200100", n, 404).await);
        hit.push(time(&service, "/api/seckill/42", n, 200).await);
    }
    let (b, reject, hit) = (median(b), median(reject), median(hit));
    println!("bare axum route     {b:7.0} ns/request");
    println!(
        "filter rejection    {reject:7.0} ns/request  (+{:.0} ns)",
        reject - b
    );
    println!(
        "L1 hit              {hit:7.0} ns/request  (+{:.0} ns)",
        hit - b
    );
}
