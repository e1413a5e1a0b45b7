//! What the change outbox costs and how fast changes travel (issue 18),
//! on the machine's MariaDB (a database of its own) and a Redis server this
//! program starts on a free port (so it can kill it):
//!
//! 1. A write's cost, side by side in one run: `Database::insert` (the row
//!    and its outbox entry in one transaction) against a bare autocommit
//!    `INSERT` of the same row, alternating in rounds; latency p50/p99 and
//!    serial throughput.
//! 2. Propagation: two instances in this process; creates through A, timed
//!    until B answers 200, with Redis up (the doorbell) and after Redis is
//!    killed (B polls the outbox every `sql.outbox_poll_ms`).
//!
//! `cargo run --release -p bloomgate-service --example outbox_cost -- [writes]`

use std::time::{Duration, Instant};

use bloomgate_service::model::catalogue_sku;
use bloomgate_service::sql::Database;

fn percentile(v: &mut [Duration], p: f64) -> Duration {
    v.sort();
    v[((v.len() - 1) as f64 * p).round() as usize]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

async fn serve(config: bloomgate_service::Config) -> (String, tokio::sync::oneshot::Sender<()>) {
    let state = bloomgate_service::AppState::connect(&config).await.unwrap();
    if let Some(build) = bloomgate_service::prepare(&state, &config).await.unwrap() {
        build.await.unwrap();
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(bloomgate_service::run(listener, state, async {
        let _ = rx.await;
    }));
    (base, tx)
}

async fn propagation(
    client: &reqwest::Client,
    a: &str,
    b: &str,
    ids: std::ops::RangeInclusive<i64>,
) -> Vec<Duration> {
    let mut out = Vec::new();
    for id in ids {
        let body = format!(
            r#"{{"id":{id},"name":"p","original_price":10,"seckill_price":5,"stock":1,"seckill_start":1767225600,"seckill_end":1767232800}}"#
        );
        let r = client
            .post(format!("{a}/api/skus"))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 201);
        let answered = Instant::now();
        loop {
            let s = client
                .get(format!("{b}/api/seckill/{id}"))
                .send()
                .await
                .unwrap()
                .status();
            if s == 200 {
                break;
            }
            assert!(
                answered.elapsed() < Duration::from_secs(10),
                "{id} never arrived"
            );
            tokio::time::sleep(Duration::from_micros(500)).await;
        }
        out.push(answered.elapsed());
    }
    out
}

#[tokio::main]
async fn main() {
    let writes: i64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(2000);
    sqlx::any::install_default_drivers();
    let admin = sqlx::AnyPool::connect("mysql://root@127.0.0.1:3306/test")
        .await
        .expect("MariaDB on 127.0.0.1:3306");
    sqlx::query("DROP DATABASE IF EXISTS bg_outbox_cost")
        .execute(&admin)
        .await
        .unwrap();
    sqlx::query("CREATE DATABASE bg_outbox_cost")
        .execute(&admin)
        .await
        .unwrap();
    let db = "mysql://root@127.0.0.1:3306/bg_outbox_cost";

    // 1. The write's cost.
    let store = Database::connect(db).await.unwrap();
    let bare = sqlx::AnyPool::connect(db).await.unwrap();
    let (mut with, mut without) = (Vec::new(), Vec::new());
    let rounds = 10;
    let per = writes / rounds;
    let (mut t_with, mut t_without) = (Duration::ZERO, Duration::ZERO);
    for round in 0..rounds {
        let base = 1_000_000 + round * per * 2;
        let started = Instant::now();
        for id in base..base + per {
            let t = Instant::now();
            assert!(store.insert(&catalogue_sku(id)).await.unwrap());
            with.push(t.elapsed());
        }
        t_with += started.elapsed();
        let started = Instant::now();
        for id in base + per..base + 2 * per {
            let s = catalogue_sku(id);
            let t = Instant::now();
            sqlx::query("INSERT INTO skus (id, name, original_price, seckill_price, stock, seckill_start, seckill_end, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)")
                .bind(s.id)
                .bind(s.name.clone())
                .bind(s.original_price)
                .bind(s.seckill_price)
                .bind(s.stock)
                .bind(s.seckill_start)
                .bind(s.seckill_end)
                .bind(s.updated_at)
                .execute(&bare)
                .await
                .unwrap();
            without.push(t.elapsed());
        }
        t_without += started.elapsed();
    }
    let n = with.len() as f64;
    println!(
        "### Write cost, MariaDB, {} writes each, serial, alternating rounds",
        with.len()
    );
    println!();
    println!("| write | p50 ms | p99 ms | writes/s | ÷ bare |");
    println!("|---|---|---|---|---|");
    let (p50w, p99w) = (percentile(&mut with, 0.5), percentile(&mut with, 0.99));
    let (p50o, p99o) = (
        percentile(&mut without, 0.5),
        percentile(&mut without, 0.99),
    );
    println!(
        "| bare autocommit INSERT | {:.3} | {:.3} | {:.0} | 1.00 |",
        ms(p50o),
        ms(p99o),
        n / t_without.as_secs_f64()
    );
    println!(
        "| row + outbox entry, one transaction | {:.3} | {:.3} | {:.0} | {:.2} (p50) |",
        ms(p50w),
        ms(p99w),
        n / t_with.as_secs_f64(),
        p50w.as_secs_f64() / p50o.as_secs_f64()
    );
    store.close().await;
    bare.close().await;

    // 2. Propagation, Redis up, then killed.
    let dir = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut redis = std::process::Command::new("redis-server")
        .args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .arg("--dir")
        .arg(dir.path())
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("redis-server");
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut config = bloomgate_service::Config {
        database_url: db.into(),
        redis_url: Some(format!("redis://127.0.0.1:{port}/")),
        seed_if_empty: 1000,
        ..bloomgate_service::Config::default()
    };
    config.listen = "127.0.0.1:0".parse().unwrap();
    config.cache.redis_prefix = "bgbench:outbox:".into();
    config.cache.redis_timeout_ms = 50;
    let poll = config.sql.outbox_poll_ms;
    let (a, _stop_a) = serve(config.clone()).await;
    let (b, _stop_b) = serve(config).await;
    let client = reqwest::Client::new();
    let mut up = propagation(&client, &a, &b, 2_000_001..=2_000_200).await;
    let _ = redis.kill();
    let _ = redis.wait();
    let mut down = propagation(&client, &a, &b, 2_000_201..=2_000_400).await;
    println!();
    println!("### Propagation: a create through A until B answers 200 (200 creates each)");
    println!();
    println!("| Redis | p50 ms | p99 ms | max ms |");
    println!("|---|---|---|---|");
    for (name, v) in [
        ("up (doorbell)", &mut up),
        (&*format!("down (polling every {poll} ms)"), &mut down),
    ] {
        let max = *v.iter().max().unwrap();
        println!(
            "| {name} | {:.2} | {:.2} | {:.2} |",
            ms(percentile(v, 0.5)),
            ms(percentile(v, 0.99)),
            ms(max)
        );
    }
    sqlx::query("DROP DATABASE IF EXISTS bg_outbox_cost")
        .execute(&admin)
        .await
        .unwrap();
}
