//! Change capture by triggers (issue 31), measured on the machine's
//! MariaDB and PostgreSQL (a database of each's own) and SQLite, with a
//! Redis server this program starts on a free port:
//!
//! 1. Inserts with and without capture: serial single-row autocommit
//!    `INSERT`s into a captured table against the same into an identical
//!    table without triggers, alternating rounds; then 10^5 rows in
//!    multi-row statements of 1,000 into each.
//! 2. The service's own SKU create on a captured table (one statement,
//!    the trigger records it) against a bare autocommit `INSERT` into an
//!    identical table without triggers (`outbox_cost`'s comparison). No
//!    instance follows during 1 and 2 (each write would wake it).
//! 3. Follower catch-up: 10^5 rows inserted by `INSERT … SELECT` into a
//!    captured table; how long until two instances answer the last key,
//!    and entries per second.
//! 4. Propagation of another program's insert until the other instance
//!    answers 200, by path: PostgreSQL `NOTIFY` (no Redis), polling
//!    (MariaDB, no Redis), MariaDB with Redis (the idle poll); and a
//!    service create through A until B answers (the Redis doorbell).
//! 5. Idle SQL statements per instance per second, doorbell healthy and
//!    broken.
//!
//! `cargo run --release -p bloomgate-service --example capture_cost -- [writes]`

use std::time::{Duration, Instant};

use bloomgate_service::config::Capture;
use bloomgate_service::{AppState, Config};
use sqlx::AnyPool;

fn percentile(v: &mut [Duration], p: f64) -> Duration {
    v.sort();
    v[((v.len() - 1) as f64 * p).round() as usize]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

async fn exec(pool: &AnyPool, sql: &str) {
    sqlx::query(sql)
        .execute(pool)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
}

/// A fresh database `bg_capture_cost` on `admin`'s server; its URL.
async fn fresh(admin: &str, force: &str) -> String {
    let pool = AnyPool::connect(admin).await.expect("the database server");
    exec(
        &pool,
        &format!("DROP DATABASE IF EXISTS bg_capture_cost{force}"),
    )
    .await;
    exec(&pool, "CREATE DATABASE bg_capture_cost").await;
    pool.close().await;
    format!("{}/bg_capture_cost", admin.rsplit_once('/').unwrap().0)
}

struct Instance {
    state: AppState,
    base: String,
    _stop: tokio::sync::oneshot::Sender<()>,
}

async fn start(config: &Config) -> Instance {
    let state = AppState::connect(config).await.unwrap();
    if let Some(build) = bloomgate_service::prepare(&state, config).await.unwrap() {
        build.await.unwrap();
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(bloomgate_service::run(listener, state.clone(), async {
        let _ = rx.await;
    }));
    Instance {
        state,
        base,
        _stop: tx,
    }
}

fn config(url: &str, redis: Option<&str>, prefix: &str) -> Config {
    let mut c = Config {
        database_url: url.into(),
        redis_url: redis.map(Into::into),
        seed_if_empty: 0,
        ..Config::default()
    };
    c.listen = "127.0.0.1:0".parse().unwrap();
    c.cache.redis_prefix = format!("bgbench:{prefix}:");
    c.cache.capture = Capture::Triggers;
    c.resources = vec![bloomgate_service::config::resources::ResourceConfig {
        name: "users".into(),
        table: "users".into(),
        key: "id".into(),
        key_type: bloomgate_service::key::KeyType::Int,
        columns: Vec::new(),
        bloom_expected: 1_000_000,
        bloom_fpp: 0.01,
        bloom_layout: bloomgate_service::config::BloomLayout::Blocked,
        max_batch_keys: 1000,
        watch_column: None,
        watch_every_ms: 1000,
        bloom_snapshot_path: None,
        bloom_mode: None,
        bloom_auto_rebuild: None,
        bloom_segment_bytes: None,
        bloom_rebuild_after_deletes: None,
        capture: Capture::Triggers,
    }];
    c
}

/// Waits until `GET {base}{path}` answers 200; how long.
async fn until_found(client: &reqwest::Client, base: &str, path: &str, since: Instant) -> Duration {
    loop {
        let s = client
            .get(format!("{base}{path}"))
            .send()
            .await
            .unwrap()
            .status();
        if s == 200 {
            return since.elapsed();
        }
        assert!(
            since.elapsed() < Duration::from_secs(30),
            "{path} never arrived"
        );
        tokio::time::sleep(Duration::from_micros(500)).await;
    }
}

fn row(name: &str, v: &mut [Duration]) {
    let max = *v.iter().max().unwrap();
    println!(
        "| {name} | {:.2} | {:.2} | {:.2} |",
        ms(percentile(v, 0.5)),
        ms(percentile(v, 0.99)),
        ms(max)
    );
}

/// 1 and 2 on one backend; returns nothing, prints its rows.
async fn insert_costs(label: &str, url: &str, writes: usize) {
    let (ph, bigint) = if url.starts_with("postgres") {
        ("$1", "BIGINT")
    } else {
        ("?", "BIGINT")
    };
    // No instance follows meanwhile: each write's doorbell would make
    // every follower read the outbox on the same two cores (measured
    // apart, in the propagation rows).
    let c = config(url, None, &format!("capture-cost-{label}"));
    let store = bloomgate_service::sql::Database::connect(url)
        .await
        .unwrap();
    for t in bloomgate_service::feed::capture::targets(&c) {
        store.install_capture(&t.target, true).await.unwrap();
    }
    let pool = AnyPool::connect(&if url.starts_with("sqlite") {
        format!("{url}?mode=rwc")
    } else {
        url.into()
    })
    .await
    .unwrap();
    for t in ["users_plain", "skus_plain"] {
        exec(&pool, &format!("DROP TABLE IF EXISTS {t}")).await;
    }
    exec(&pool, &format!("CREATE TABLE users_plain (id {bigint} NOT NULL PRIMARY KEY, name VARCHAR(100) NOT NULL)")).await;
    exec(
        &pool,
        "CREATE TABLE skus_plain AS SELECT * FROM skus WHERE 1 = 0",
    )
    .await;
    let (mut cap, mut plain) = (Vec::new(), Vec::new());
    let (mut t_cap, mut t_plain) = (Duration::ZERO, Duration::ZERO);
    let rounds = 10;
    let per = writes / rounds;
    let mut next = 10_000_000i64;
    for _ in 0..rounds {
        for (table, lat, total) in [
            ("users", &mut cap, &mut t_cap),
            ("users_plain", &mut plain, &mut t_plain),
        ] {
            let started = Instant::now();
            for _ in 0..per {
                next += 1;
                let t = Instant::now();
                sqlx::query(&format!(
                    "INSERT INTO {table} (id, name) VALUES ({ph}, 'x')"
                ))
                .bind(next)
                .execute(&pool)
                .await
                .unwrap();
                lat.push(t.elapsed());
            }
            *total += started.elapsed();
        }
    }
    let n = cap.len() as f64;
    let (p_cap, p_plain) = (percentile(&mut cap, 0.5), percentile(&mut plain, 0.5));
    println!("| {label} | single-row, serial | {:.0} rows/s | {:.0} rows/s | {:.2} (p50 {:.3} / {:.3} ms) |",
        n / t_cap.as_secs_f64(), n / t_plain.as_secs_f64(),
        p_cap.as_secs_f64() / p_plain.as_secs_f64(), ms(p_cap), ms(p_plain));
    // Bulk: 10^5 rows in statements of 1,000.
    let mut bulk = [Duration::ZERO; 2];
    for (i, table) in ["users", "users_plain"].iter().enumerate() {
        let started = Instant::now();
        for chunk in 0..100 {
            let values: Vec<String> = (0..1000)
                .map(|j| format!("({}, 'b')", 20_000_000 + chunk * 1000 + j))
                .collect();
            exec(
                &pool,
                &format!(
                    "INSERT INTO {table} (id, name) VALUES {}",
                    values.join(", ")
                ),
            )
            .await;
        }
        bulk[i] = started.elapsed();
    }
    println!(
        "| {label} | 10^5 rows, 1,000 per statement | {:.0} rows/s | {:.0} rows/s | {:.2} |",
        1e5 / bulk[0].as_secs_f64(),
        1e5 / bulk[1].as_secs_f64(),
        bulk[0].as_secs_f64() / bulk[1].as_secs_f64()
    );

    // 2. The service's own create against a bare INSERT without triggers.
    let (mut own, mut bare) = (Vec::new(), Vec::new());
    let cols =
        "id, name, original_price, seckill_price, stock, seckill_start, seckill_end, updated_at";
    let phs: Vec<String> = (1..=8)
        .map(|i| {
            if url.starts_with("postgres") {
                format!("${i}")
            } else {
                "?".into()
            }
        })
        .collect();
    for round in 0..rounds as i64 {
        let base = 1_000_000 + round * per as i64 * 2;
        for id in base..base + per as i64 {
            let t = Instant::now();
            assert!(store
                .insert(&bloomgate_service::model::catalogue_sku(id))
                .await
                .unwrap());
            own.push(t.elapsed());
        }
        for id in base + per as i64..base + 2 * per as i64 {
            let s = bloomgate_service::model::catalogue_sku(id);
            let t = Instant::now();
            sqlx::query(&format!(
                "INSERT INTO skus_plain ({cols}) VALUES ({})",
                phs.join(", ")
            ))
            .bind(s.id)
            .bind(s.name.clone())
            .bind(s.original_price)
            .bind(s.seckill_price)
            .bind(s.stock)
            .bind(s.seckill_start)
            .bind(s.seckill_end)
            .bind(s.updated_at)
            .execute(&pool)
            .await
            .unwrap();
            bare.push(t.elapsed());
        }
    }
    let (p_own, p_bare) = (percentile(&mut own, 0.5), percentile(&mut bare, 0.5));
    let (q_own, q_bare) = (percentile(&mut own, 0.99), percentile(&mut bare, 0.99));
    println!("| {label} | the service's SKU create (captured) ÷ bare INSERT | p50 {:.3} / {:.3} ms | p99 {:.3} / {:.3} ms | **{:.2}** (p50) |",
        ms(p_own), ms(p_bare), ms(q_own), ms(q_bare), p_own.as_secs_f64() / p_bare.as_secs_f64());
    pool.close().await;
    store.close().await;
}

/// 3: a bulk `INSERT … SELECT` of 10^5 rows; until both answer the last.
async fn catch_up(label: &str, url: &str, redis: Option<&str>) {
    let c = config(url, redis, &format!("capture-catch-{label}"));
    let (a, b) = (start(&c).await, start(&c).await);
    let pool = AnyPool::connect(url).await.unwrap();
    exec(&pool, "DROP TABLE IF EXISTS digits").await;
    exec(&pool, "CREATE TABLE digits (d BIGINT NOT NULL)").await;
    exec(
        &pool,
        "INSERT INTO digits VALUES (0),(1),(2),(3),(4),(5),(6),(7),(8),(9)",
    )
    .await;
    let started = Instant::now();
    exec(
        &pool,
        "INSERT INTO users (id, name) SELECT 30000000 + a.d + 10 * b.d + 100 * c.d + 1000 * e.d + 10000 * f.d, 'bulk' \
         FROM digits a, digits b, digits c, digits e, digits f",
    )
    .await;
    let committed = started.elapsed();
    let client = reqwest::Client::new();
    let last = "/api/users/30099999";
    let ta = until_found(&client, &a.base, last, started).await;
    let tb = until_found(&client, &b.base, last, started).await;
    let all = ta.max(tb);
    // Every key, through the exists call (1,000 per call), on both.
    for inst in [&a, &b] {
        for chunk in 0..100 {
            let keys: Vec<i64> = (0..1000).map(|j| 30_000_000 + chunk * 1000 + j).collect();
            let r: serde_json::Value = client
                .post(format!("{}/api/users/exists", inst.base))
                .json(&serde_json::json!({ "keys": keys }))
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            assert!(
                r["exists"].as_array().unwrap().iter().all(|x| x == true),
                "{label}: a key missing"
            );
        }
    }
    let after_commit = all.saturating_sub(committed);
    println!(
        "| {label} | {:.2} s | {:.2} s | {:.0} entries/s |",
        committed.as_secs_f64(),
        after_commit.as_secs_f64(),
        1e5 / after_commit.as_secs_f64().max(1e-3)
    );
    let _ = (a.state.outbox.watermark(), b.state.outbox.watermark());
    pool.close().await;
}

/// 4: another program's single inserts until B answers, 200 of them.
async fn foreign_propagation(
    url: &str,
    redis: Option<&str>,
    label: &str,
    from: i64,
) -> Vec<Duration> {
    let c = config(url, redis, &format!("capture-prop-{label}"));
    let (_a, b) = (start(&c).await, start(&c).await);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let pool = AnyPool::connect(url).await.unwrap();
    let ph = if url.starts_with("postgres") {
        "$1"
    } else {
        "?"
    };
    let client = reqwest::Client::new();
    let mut out = Vec::new();
    for id in from..from + 200 {
        sqlx::query(&format!("INSERT INTO users (id, name) VALUES ({ph}, 'p')"))
            .bind(id)
            .execute(&pool)
            .await
            .unwrap();
        let t = Instant::now();
        out.push(until_found(&client, &b.base, &format!("/api/users/{id}"), t).await);
    }
    pool.close().await;
    out
}

/// 5: background statements `inst` sends per second over 10 s.
async fn idle(inst: &Instance) -> f64 {
    let n = &inst.state.skus.source().counters.background;
    let before = n.load(std::sync::atomic::Ordering::Relaxed);
    tokio::time::sleep(Duration::from_secs(10)).await;
    (n.load(std::sync::atomic::Ordering::Relaxed) - before) as f64 / 10.0
}

#[tokio::main]
async fn main() {
    let writes: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(2000);
    sqlx::any::install_default_drivers();
    let maria = fresh("mysql://root@127.0.0.1:3306/test", "").await;
    let pg = fresh("postgres://postgres@127.0.0.1:5432/test", " WITH (FORCE)").await;
    let dir = tempfile::tempdir().unwrap();
    let sqlite = format!("sqlite://{}/capture.db", dir.path().display());
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
    let redis_url = format!("redis://127.0.0.1:{port}/");
    for url in [&maria, &pg, &sqlite] {
        let pool = AnyPool::connect(&if url.starts_with("sqlite") {
            format!("{url}?mode=rwc")
        } else {
            url.to_string()
        })
        .await
        .unwrap();
        exec(
            &pool,
            "CREATE TABLE users (id BIGINT NOT NULL PRIMARY KEY, name VARCHAR(100) NOT NULL)",
        )
        .await;
        pool.close().await;
    }

    println!("### Inserts with and without capture ({writes} single rows each, alternating rounds; then 10^5 rows)\n");
    println!("| backend | insert | captured | no triggers | captured ÷ plain (time) |");
    println!("|---|---|---|---|---|");
    for (label, url) in [
        ("MariaDB", &maria),
        ("PostgreSQL", &pg),
        ("SQLite", &sqlite),
    ] {
        insert_costs(label, url, writes).await;
    }

    println!("\n### Follower catch-up: 10^5 rows by one INSERT … SELECT, two instances\n");
    println!("| backend | the INSERT took | then both answered the last key after | rate |");
    println!("|---|---|---|---|");
    catch_up("MariaDB + Redis", &maria, Some(&redis_url)).await;
    catch_up("PostgreSQL (NOTIFY)", &pg, None).await;

    println!("\n### Propagation until the other instance answers 200 (200 writes each)\n");
    println!("| path | p50 ms | p99 ms | max ms |");
    println!("|---|---|---|---|");
    let mut v = foreign_propagation(&pg, None, "pg-notify", 40_000_000).await;
    row(
        "another program's INSERT, PostgreSQL NOTIFY, no Redis",
        &mut v,
    );
    let mut v = foreign_propagation(&maria, None, "maria-poll", 40_000_000).await;
    row(
        "another program's INSERT, MariaDB, polling (`outbox_poll_ms` 100)",
        &mut v,
    );
    let mut v = foreign_propagation(&maria, Some(&redis_url), "maria-redis", 41_000_000).await;
    row(
        "another program's INSERT, MariaDB with Redis (`outbox_idle_poll_ms` 1000)",
        &mut v,
    );
    {
        let c = config(&maria, Some(&redis_url), "capture-prop-own");
        let (a, b) = (start(&c).await, start(&c).await);
        let client = reqwest::Client::new();
        let mut v = Vec::new();
        for id in 3_000_001..=3_000_200i64 {
            let body = format!(
                r#"{{"id":{id},"name":"p","original_price":10,"seckill_price":5,"stock":1,"seckill_start":1767225600,"seckill_end":1767232800}}"#
            );
            let r = client
                .post(format!("{}/api/skus", a.base))
                .header("content-type", "application/json")
                .body(body)
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 201);
            let t = Instant::now();
            v.push(until_found(&client, &b.base, &format!("/api/seckill/{id}"), t).await);
        }
        row(
            "the service's create through A, MariaDB, Redis doorbell",
            &mut v,
        );
    }

    println!("\n### Idle SQL statements per instance per second (10 s)\n");
    println!("| backend | doorbell | statements/s |");
    println!("|---|---|---|");
    let with_redis = start(&config(&maria, Some(&redis_url), "capture-idle-redis")).await;
    let pg_only = start(&config(&pg, None, "capture-idle-pg")).await;
    let none = start(&config(&maria, None, "capture-idle-none")).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    println!(
        "| MariaDB | Redis doorbell, healthy | {:.1} |",
        idle(&with_redis).await
    );
    println!(
        "| PostgreSQL | LISTEN, no Redis | {:.1} |",
        idle(&pg_only).await
    );
    println!("| MariaDB | none configured | {:.1} |", idle(&none).await);
    let _ = redis.kill();
    let _ = redis.wait();
    tokio::time::sleep(Duration::from_secs(4)).await;
    println!(
        "| MariaDB | Redis killed | {:.1} |",
        idle(&with_redis).await
    );
}
