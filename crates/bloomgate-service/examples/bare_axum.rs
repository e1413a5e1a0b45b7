//! The HTTP anchors of `scripts/http_anchors.py`: a bare axum app on the
//! same runtime, axum and hyper as the service, with no layers. One route
//! answers a fixed JSON body; with `--redis URL PREFIX` another does one
//! Redis `GET` per request (redis-rs, one multiplexed connection) of the
//! keys the service writes (`{PREFIX}sku:{id}`); with `--sql URL` another
//! does one SQL point read per request (sqlx's MySQL pool, the row as
//! JSON). The service's filter "no" and L1 hit, Redis hit and SQL load are
//! each measured against the one that does the same I/O and nothing else.
//!
//! `cargo run --release -p bloomgate-service --example bare_axum -- 127.0.0.1:18081 [--redis redis://127.0.0.1:6379/ bganchors:] [--sql mysql://root@127.0.0.1:3306/db]`

use axum::extract::{Path, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use sqlx::Row;

#[derive(Clone)]
struct Io {
    redis: Option<(redis::aio::MultiplexedConnection, String)>,
    sql: Option<sqlx::MySqlPool>,
}

async fn redis_get(State(io): State<Io>, Path(id): Path<i64>) -> Response {
    let Some((mut conn, prefix)) = io.redis else {
        return StatusCode::NOT_FOUND.into_response();
    };
    let value: Option<String> = redis::cmd("GET")
        .arg(format!("{prefix}sku:{id}"))
        .query_async(&mut conn)
        .await
        .unwrap_or(None);
    match value {
        Some(body) => ([(header::CONTENT_TYPE, "application/json")], body).into_response(),
        None => StatusCode::NOT_FOUND.into_response(),
    }
}

async fn sql_get(State(io): State<Io>, Path(id): Path<i64>) -> Response {
    let Some(pool) = io.sql else {
        return StatusCode::NOT_FOUND.into_response();
    };
    let row = sqlx::query(
        "SELECT id, name, original_price, seckill_price, stock, seckill_start, seckill_end, updated_at \
         FROM skus WHERE id = ?",
    )
    .bind(id)
    .fetch_optional(&pool)
    .await;
    match row {
        Ok(Some(r)) => Json(serde_json::json!({
            "id": r.get::<i64, _>(0),
            "name": r.get::<String, _>(1),
            "originalPrice": r.get::<i64, _>(2),
            "seckillPrice": r.get::<i64, _>(3),
            "stock": r.get::<i64, _>(4),
            "seckillStart": r.get::<i64, _>(5),
            "seckillEnd": r.get::<i64, _>(6),
            "updatedAt": r.get::<i64, _>(7),
        }))
        .into_response(),
        Ok(None) => StatusCode::NOT_FOUND.into_response(),
        Err(_) => StatusCode::SERVICE_UNAVAILABLE.into_response(),
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let addr = args
        .first()
        .cloned()
        .unwrap_or_else(|| "127.0.0.1:18081".into());
    let mut io = Io {
        redis: None,
        sql: None,
    };
    let mut rest = args.iter().skip(1);
    while let Some(flag) = rest.next() {
        match flag.as_str() {
            "--redis" => {
                let (Some(url), Some(prefix)) = (rest.next(), rest.next()) else {
                    return Err("--redis URL PREFIX".into());
                };
                let client = redis::Client::open(url.as_str())?;
                let conn = client.get_multiplexed_async_connection().await?;
                io.redis = Some((conn, prefix.clone()));
            }
            "--sql" => {
                let url = rest.next().ok_or("--sql URL")?;
                io.sql = Some(
                    sqlx::mysql::MySqlPoolOptions::new()
                        .max_connections(16)
                        .connect(url)
                        .await?,
                );
            }
            other => return Err(format!("unknown argument {other:?}").into()),
        }
    }
    let app = Router::new()
        .route(
            "/api/seckill/{sku_id}",
            get(|| async { Json(serde_json::json!({ "code": 404, "error": "not_found" })) }),
        )
        .route("/redis/{id}", get(redis_get))
        .route("/sql/{id}", get(sql_get))
        .with_state(io);
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    axum::serve(listener, app).await?;
    Ok(())
}
