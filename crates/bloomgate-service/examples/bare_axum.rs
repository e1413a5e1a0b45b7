//! The HTTP anchor of `scripts/service_bench.sh`: a bare axum app with one
//! route answering a fixed JSON body, on the same runtime, axum and hyper
//! as the service, and nothing else (no layers, no state). The service's
//! own routes are measured against it.
//!
//! `cargo run --release -p bloomgate-service --example bare_axum -- 127.0.0.1:18081`

use axum::routing::get;
use axum::{Json, Router};

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let addr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:18081".into());
    let app = Router::new().route(
        "/api/seckill/{sku_id}",
        get(|| async { Json(serde_json::json!({ "code": 404, "error": "not_found" })) }),
    );
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    axum::serve(listener, app).await
}
