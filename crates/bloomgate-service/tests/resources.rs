//! Guarding tables named in the configuration (issue 19): seed 002's
//! `users` table keyed by strings like `u000001`, beside the SKUs, on
//! SQLite, MariaDB and PostgreSQL, with two instances sharing the database
//! (and Redis where given).

mod common;

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use bloomgate_service::config::resources::ResourceConfig;
use bloomgate_service::config::BloomMode;
use bloomgate_service::key::{Key, KeyType};
use bloomgate_service::resource::Resource;
use bloomgate_service::shield::Verdict;
use bloomgate_service::Config;
use common::{eventually, seen, TestServer};
use reqwest::Method;

const ROWS: i64 = 200;

async fn exec(url: &str, statements: &[String]) {
    let pool = common::sql_pool(url).await;
    for s in statements {
        sqlx::query(s).execute(&pool).await.unwrap();
    }
    pool.close().await;
}

/// The `users` table, with a column of each kind the API answers.
async fn users_table(url: &str) {
    let (float, boolean) = if url.starts_with("postgres") {
        ("DOUBLE PRECISION", "BOOLEAN")
    } else if url.starts_with("mysql") {
        ("DOUBLE", "BOOLEAN")
    } else {
        ("REAL", "BOOLEAN")
    };
    let mut s = vec![format!(
        "CREATE TABLE users (id VARCHAR(32) NOT NULL PRIMARY KEY, name VARCHAR(100) NOT NULL, \
         age INTEGER, score {float}, active {boolean}, joined DATE, balance DECIMAL(10,2), seq BIGINT NOT NULL)"
    )];
    let values: Vec<String> = (1..=ROWS)
        .map(|i| {
            let active = if url.starts_with("sqlite") {
                (i % 2).to_string()
            } else if i % 2 == 1 {
                "TRUE".into()
            } else {
                "FALSE".into()
            };
            let age = if i == 3 {
                "NULL".into()
            } else {
                (20 + i % 50).to_string()
            };
            format!(
                "('u{i:06}', 'user {i}', {age}, {}.5, {active}, '2026-01-{:02}', {i}.25, {i})",
                i,
                1 + i % 28
            )
        })
        .collect();
    s.push(format!("INSERT INTO users VALUES {}", values.join(", ")));
    exec(url, &s).await;
}

fn resource(name: &str, watch: bool) -> ResourceConfig {
    ResourceConfig {
        watch_column: watch.then(|| "seq".into()),
        watch_every_ms: 50,
        ..common::users_resource(name)
    }
}

fn text(s: &str) -> Key {
    Key::Text(s.into())
}

fn users(s: &TestServer, name: &str) -> std::sync::Arc<Resource> {
    s.state
        .resources
        .iter()
        .find(|r| &*r.name == name)
        .cloned()
        .unwrap()
}

async fn ready(s: &TestServer) {
    for r in &s.state.resources {
        let g = std::sync::Arc::clone(r.shield());
        eventually(20, "resource filter built", || {
            let g = std::sync::Arc::clone(&g);
            async move { g.is_ready() }
        })
        .await;
    }
}

/// A key that every filter of every instance rejects (`prefix` + n).
fn rejected_everywhere(servers: &[&TestServer], prefix: &str) -> Key {
    (0..100_000)
        .map(|n| text(&format!("{prefix}{n}")))
        .find(|k| {
            servers.iter().all(|s| {
                s.state
                    .resources
                    .iter()
                    .all(|r| r.shield().probe(k) == Verdict::Reject)
            })
        })
        .expect("some key is rejected everywhere")
}

async fn post(s: &TestServer, path: &str, keys: &[&str]) -> (u16, serde_json::Value) {
    let body = serde_json::json!({ "keys": keys }).to_string();
    s.send(Method::POST, path, Some(&body)).await
}

async fn guard_users(url: &str, redis: Option<&str>, prefix: &str) {
    users_table(url).await;
    // Empty at start, int keys, watched by a timestamp.
    exec(
        url,
        &["CREATE TABLE events (id BIGINT NOT NULL PRIMARY KEY, title VARCHAR(50), created_at TIMESTAMP NULL)".into()],
    )
    .await;
    let mut config: Config = common::config(url, redis, prefix);
    let mut events = resource("events", true);
    events.table = "events".into();
    events.key_type = KeyType::Int;
    events.watch_column = Some("created_at".into());
    config.resources = vec![resource("users", false), resource("members", true), events];
    // Cached "not found"s outlive every wait below: only an invalidation
    // clears them.
    config.cache.l1_negative_ttl_secs = 300;
    config.sql.outbox_poll_ms = 50;
    let a = TestServer::start(config.clone(), 10).await;
    let b = TestServer::start(config, 10).await;
    ready(&a).await;
    ready(&b).await;

    // Rows answer 200 with each kind of value.
    let (status, row) = a.get("/api/users/u000003").await;
    assert_eq!(status, 200, "{row}");
    assert_eq!(row["id"], "u000003");
    assert_eq!(row["name"], "user 3");
    assert!(row["age"].is_null(), "{row}");
    assert_eq!(row["score"], 3.5);
    assert_eq!(row["active"], true);
    assert_eq!(row["joined"], "2026-01-04");
    assert_eq!(
        row["balance"].as_str().map(|b| b.trim_end_matches('0')),
        Some("3.25")
    );
    assert_eq!(row["seq"], 3);
    assert_eq!(a.get("/api/users/u000004").await.1["active"], false);
    // The SKUs are still seed 000's routes.
    assert_eq!(a.get("/api/seckill/7").await.0, 200);

    // A random-string attack stays off SQL: only the filter's false
    // positives reach it, and only this resource's counters move.
    let ua = users(&a, "users");
    let table = ua.table.as_ref().unwrap();
    let loads_before = table.counters.loads.load(Relaxed);
    let sku_rejected_before = a.state.skus.shield().stats().rejected;
    let before = ua.shield().stats();
    let mut rng = fastrand::Rng::with_seed(19);
    for _ in 0..300 {
        let key: String = (0..12).map(|_| rng.alphanumeric()).collect();
        assert_eq!(a.get(&format!("/api/users/x{key}")).await.0, 404);
    }
    let after = ua.shield().stats();
    let loads = table.counters.loads.load(Relaxed) - loads_before;
    let passed = after.passed - before.passed;
    assert_eq!(loads, passed, "every SQL load is a filter pass");
    assert!(after.rejected - before.rejected >= 285, "{after:?}");
    assert!(passed <= 15, "300 keys at 1% let {passed} through");
    assert_eq!(a.state.skus.shield().stats().rejected, sku_rejected_before);
    let stats = a.stats().await;
    assert!(counter(&stats, &["resources", "users", "filter", "rejected"]) >= 285);
    assert_eq!(
        counter(&stats, &["resources", "members", "filter", "rejected"]),
        0
    );
    let metrics = a.metrics_text().await;
    let rejected = common::prom_value(
        &metrics,
        "bloomgate_filter_rejected_total",
        &[("resource", "users")],
    );
    assert!(rejected.is_some_and(|v| v >= 285.0), "{rejected:?}");
    // One family set: the SKU table is resource "skus" in the same series
    // as "users", with the figures of seed 000's flat keys.
    for family in [
        "bloomgate_filter_ready",
        "bloomgate_filter_fill_ratio",
        "bloomgate_filter_expected_fpr",
        "bloomgate_sql_statements_total",
    ] {
        for name in ["skus", "users"] {
            assert!(
                common::prom_value(&metrics, family, &[("resource", name)]).is_some(),
                "no {family}{{resource={name:?}}}"
            );
        }
    }
    assert_eq!(
        common::prom_value(
            &metrics,
            "bloomgate_filter_rejected_total",
            &[("resource", "skus")],
        ),
        Some(counter(&stats, &["bloom", "rejected"]) as f64)
    );
    for key in ["ready", "rejected", "capacity", "added", "target_fpr"] {
        assert_eq!(
            stats["resources"]["skus"]["filter"][key], stats["bloom"][key],
            "the default resource's filter is seed 000's: {key}"
        );
    }
    // The requests themselves count under the resource's route pattern.
    let attack = common::prom_value(
        &metrics,
        "bloomgate_requests_total",
        &[
            ("route", "/api/users/{key}"),
            ("outcome", "filter_rejected"),
            ("status", "404"),
        ],
    );
    assert!(attack.is_some_and(|v| v >= 285.0), "{attack:?}");
    // The whole exposition, with skus and users in one family set, is
    // valid Prometheus text.
    common::promtool_check("users and skus", &metrics);

    // A row inserted behind the service's back: 404 until `keys`, then 200
    // on every instance; the watched resource admits it without a call.
    let key = rejected_everywhere(&[&a, &b], "u9");
    let path = format!("/api/users/{key}");
    exec(
        url,
        &[format!(
            "INSERT INTO users (id, name, seq) VALUES ('{key}', 'late', 100000)"
        )],
    )
    .await;
    assert_eq!(a.get(&path).await.0, 404);
    assert_eq!(b.get(&path).await.0, 404);
    let (status, body) = post(&a, "/api/users/keys", &[&key.to_string()]).await;
    assert_eq!((status, body["added"].as_i64()), (200, Some(1)), "{body}");
    assert_eq!(a.get(&path).await.0, 200, "the instance that took the call");
    eventually(5, "the other instance admits the key", || async {
        b.get(&path).await.0 == 200
    })
    .await;
    for s in [&a, &b] {
        let members = format!("/api/members/{key}");
        eventually(5, "the watch admits the row", || async {
            s.get(&members).await.0 == 200
        })
        .await;
    }

    // A key both instances' filters pass (a false positive), read on B
    // and cached as missing there (L1, and `__nil__` in Redis); the row
    // then appears and `keys` is called on A: B answers 200.
    let ub = users(&b, "users");
    let both = (0..10_000_000)
        .map(|n| text(&format!("v{n}")))
        .find(|k| ua.shield().probe(k) == Verdict::Pass && ub.shield().probe(k) == Verdict::Pass)
        .expect("a false positive of both filters");
    let both_path = format!("/api/users/{both}");
    assert_eq!(b.get(&both_path).await.0, 404);
    assert_eq!(b.get(&both_path).await.0, 404, "from the cache");
    exec(
        url,
        &[format!(
            "INSERT INTO users (id, name, seq) VALUES ('{both}', 'both', 100002)"
        )],
    )
    .await;
    assert_eq!(
        post(&a, "/api/users/keys", &[&both.to_string()]).await.0,
        200
    );
    eventually(5, "B drops its cached not-found", || async {
        b.get(&both_path).await.0 == 200
    })
    .await;

    // A key the watched filter already passes (a false positive) was
    // read as missing and cached so; the row then appears behind the
    // service's back: the watch drops the cached "not found".
    let members = users(&a, "members");
    let fp = (0..1_000_000)
        .map(|n| text(&format!("w{n}")))
        .find(|k| members.shield().probe(k) == Verdict::Pass)
        .expect("a false positive at 1%");
    let fp_path = format!("/api/members/{fp}");
    assert_eq!(a.get(&fp_path).await.0, 404);
    assert_eq!(a.get(&fp_path).await.0, 404, "from the cache");
    exec(
        url,
        &[format!(
            "INSERT INTO users (id, name, seq) VALUES ('{fp}', 'fp', 100003)"
        )],
    )
    .await;
    eventually(5, "the watch drops the cached not-found", || async {
        a.get(&fp_path).await.0 == 200
    })
    .await;

    // A table empty at start, watched by a timestamp, with integer keys.
    exec(
        url,
        &["INSERT INTO events VALUES (41, 'launch', '2026-12-01 10:00:00'), (42, 'sale', '2026-12-01 10:00:01')".into()],
    )
    .await;
    for s in [&a, &b] {
        eventually(
            5,
            "the watch admits rows of a table empty at start",
            || async { s.get("/api/events/42").await.0 == 200 },
        )
        .await;
    }
    assert_eq!(a.get("/api/events/41").await.1["title"], "launch");
    assert_eq!(a.get("/api/events/x").await.0, 400);

    // `invalidate` drops a row from every instance's caches.
    assert_eq!(b.get("/api/users/u000010").await.1["name"], "user 10");
    exec(
        url,
        &["UPDATE users SET name = 'renamed' WHERE id = 'u000010'".into()],
    )
    .await;
    assert_eq!(
        b.get("/api/users/u000010").await.1["name"],
        "user 10",
        "cached"
    );
    let (status, body) = post(&a, "/api/users/invalidate", &["u000010"]).await;
    assert_eq!(status, 200, "{body}");
    eventually(5, "the other instance drops its copy", || async {
        b.get("/api/users/u000010").await.1["name"] == "renamed"
    })
    .await;

    // `exists`: the filter's answer alone, on either instance.
    let missing = rejected_everywhere(&[&a, &b], "nobody");
    for s in [&a, &b] {
        let (status, body) = post(s, "/api/users/exists", &["u000001", &missing.to_string()]).await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["exists"], serde_json::json!([true, false]));
    }

    // `batch`: found rows, a missing key the filter passes, a key it
    // rejects; one IN (…) statement for what passed.
    let fp = (0..1_000_000)
        .map(|n| text(&format!("fp{n}")))
        .find(|k| ua.shield().probe(k) == Verdict::Pass)
        .expect("a false positive at 1%");
    let batches = table.counters.batch_loads.load(Relaxed);
    let (status, body) = post(
        &a,
        "/api/users/batch",
        &["u000001", "u000002", &fp.to_string(), &missing.to_string()],
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let found: Vec<&str> = body["found"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["key"].as_str().unwrap())
        .collect();
    assert_eq!(found, ["u000001", "u000002"]);
    assert_eq!(body["found"][1]["row"]["name"], "user 2");
    assert_eq!(
        body["missing"],
        serde_json::json!([fp.to_string(), missing.to_string()])
    );
    assert_eq!(table.counters.batch_loads.load(Relaxed), batches + 1);
    let many: Vec<String> = (0..51).map(|i| format!("u{i:06}")).collect();
    let many: Vec<&str> = many.iter().map(String::as_str).collect();
    let (status, body) = post(&a, "/api/users/batch", &many).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (400, Some("bad_request")),
        "{body}"
    );
    let (status, body) = a
        .send(Method::POST, "/api/users/batch", Some(r#"{"keys":[1]}"#))
        .await;
    assert_eq!(status, 400, "{body}");

    // One signal ends every background loop (followers, watchdog, the
    // filters' monitors, the watch) when the server stops.
    let (bg_a, bg_b) = (a.state.background.clone(), b.state.background.clone());
    assert!(bg_a.running() >= 5, "{} loops", bg_a.running());
    a.stop().await;
    b.stop().await;
    assert_eq!((bg_a.running(), bg_b.running()), (0, 0));
}

fn counter(v: &serde_json::Value, path: &[&str]) -> i64 {
    common::counter(v, path)
}

/// A resource's read answers a filter "no" and an L1 entry in the edge,
/// without the router (`http::resources::read_now`). A key spelled with a
/// percent escape is the same key to the handler but always goes through
/// the router, so each answer is compared with the routed one for the
/// same key, and each read is counted once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resources_fast_answers_are_its_routed_answers() {
    let dir = tempfile::tempdir().unwrap();
    let url = common::sqlite_url(&dir);
    users_table(&url).await;
    let mut config: Config = common::config(&url, None, "res-fast");
    config.resources = vec![resource("users", false)];
    let s = TestServer::start(config, 10).await;
    ready(&s).await;
    let users = users(&s, "users");
    let rejected = match rejected_everywhere(&[&s], "nobody") {
        Key::Text(k) => k.to_string(),
        Key::Int(_) | Key::Loose(_) => unreachable!("text keys, printable"),
    };
    // A key that is not a row but passes the filter: its first read
    // caches "not found" in L1.
    let passed = (0..100_000)
        .map(|n| format!("fp{n}"))
        .find(|k| users.shield().probe(text(k)) == Verdict::Pass)
        .expect("a false positive among 100,000 keys at 1%");
    // Each key and the same key with its first character percent-escaped.
    let escaped = |k: &str| format!("%{:02X}{}", k.as_bytes()[0], &k[1..]);
    use bloomgate_service::http::resources::read_now;
    assert!(read_now(&users, "u000007").is_none(), "an L1 miss waits");
    assert_eq!(
        seen(&s, Method::GET, "/api/users/u000007").await.0,
        200,
        "SQL, then L1"
    );
    assert_eq!(
        seen(&s, Method::GET, &format!("/api/users/{passed}"))
            .await
            .0,
        404
    );
    for key in ["u000007", &rejected, &passed] {
        // Each has a fast answer (each call counts a read, as a request
        // would). The escaped spelling never reaches `read_now`: the edge
        // keeps values with a percent escape for the router (its own test,
        // `a_fast_answer_sees_only_plain_values_of_gets`).
        assert!(read_now(&users, key).is_some(), "{key}: no fast answer");
    }
    let l1 = || users.stats().funnel.l1;
    let (hits, negative) = (l1().hits, l1().negative_hits);
    let before = users.shield().stats();
    let answered_fast = s.state.metrics.fast_answers();
    for key in ["u000007", &rejected, &passed] {
        let fast = seen(&s, Method::GET, &format!("/api/users/{key}")).await;
        let routed = seen(&s, Method::GET, &format!("/api/users/{}", escaped(key))).await;
        assert_eq!(fast, routed, "{key}");
        assert!(fast.3, "{key}: no request id");
    }
    assert_eq!(
        s.state.metrics.fast_answers() - answered_fast,
        3,
        "the plain spellings answered by the edge, the escaped ones routed"
    );
    let after = users.shield().stats();
    assert_eq!(
        after.rejected - before.rejected,
        2,
        "the filter's no, twice"
    );
    assert_eq!(l1().hits - hits, 2);
    assert_eq!(l1().negative_hits - negative, 2);
    assert_eq!(after.passed - before.passed, 4);
    // Every request counted once, by route, outcome and status.
    let metrics = s.client.get(s.url("/metrics")).send().await.unwrap();
    let metrics = metrics.text().await.unwrap();
    for (outcome, status) in [
        ("l1_hit", 200),
        ("filter_rejected", 404),
        ("l1_negative_hit", 404),
    ] {
        let series = format!(
            "bloomgate_requests_total{{route=\"/api/users/{{key}}\",outcome=\"{outcome}\",status=\"{status}\"}} "
        );
        let n = metrics.lines().find_map(|l| l.strip_prefix(&series));
        assert_eq!(n.map(str::trim), Some("2"), "{series}");
    }
    // HEAD, a key spelled like a call and a bad key take the router.
    let head = s.client.head(s.url("/api/users/u000007")).send().await;
    assert_eq!(head.unwrap().status(), 200);
    assert_eq!(seen(&s, Method::GET, "/api/users/batch").await.0, 404);
    let long = "k".repeat(300);
    assert_eq!(
        seen(&s, Method::GET, &format!("/api/users/{long}")).await.0,
        400
    );
    assert!(read_now(&users, &long).is_none());
    let body = seen(&s, Method::GET, &format!("/api/users/{rejected}"))
        .await
        .2;
    let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(body["error"], "not_found", "{body}");
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn users_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    guard_users(&common::sqlite_url(&dir), None, "res-sqlite").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn users_on_mariadb() {
    let Some(url) = common::mysql_database("resources").await else {
        return;
    };
    let redis = common::redis_url().await;
    if let Some(r) = &redis {
        common::redis_clear(r, "bgtest:res-maria:").await;
    }
    guard_users(&url, redis.as_deref(), "res-maria").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn users_on_postgres() {
    let Some(url) = common::postgres_database("resources").await else {
        return;
    };
    let redis = common::redis_url().await;
    if let Some(r) = &redis {
        common::redis_clear(r, "bgtest:res-pg:").await;
    }
    guard_users(&url, redis.as_deref(), "res-pg").await;
}

/// Every bad `[[resources]]` entry stops the start with an error naming
/// its key, and leaves the database as it was (no migration ran).
async fn refuse_bad_configs(url: &str) {
    users_table(url).await;
    type Change = Box<dyn Fn(&mut Vec<ResourceConfig>)>;
    let cases: Vec<(&str, Change)> = vec![
        (
            "resources[0].table",
            Box::new(|r| r[0].table = "nope".into()),
        ),
        (
            "resources[0].columns",
            Box::new(|r| r[0].columns = vec!["id".into(), "nope".into()]),
        ),
        ("resources[0].key", Box::new(|r| r[0].key = "nope".into())),
        (
            "resources[0].table",
            // A table that exists: an executed injection would show below.
            Box::new(|r| r[0].table = "users; DROP TABLE users".into()),
        ),
        (
            "resources[1].name",
            Box::new(|r| r.push(resource("users", false))),
        ),
        (
            "resources[0].key_type",
            Box::new(|r| r[0].key_type = KeyType::Int),
        ),
        (
            "resources[0].key_type",
            Box::new(|r| {
                r[0].key = "seq".into();
                r[0].key_type = KeyType::Text;
            }),
        ),
        (
            "resources[0].name",
            Box::new(|r| r[0].name = "seckill".into()),
        ),
        (
            "resources[0].watch_column",
            Box::new(|r| r[0].watch_column = Some("nope".into())),
        ),
    ];
    for (key, change) in cases {
        let mut config = common::config(url, None, "res-bad");
        config.resources = vec![resource("users", false)];
        change(&mut config.resources);
        let err = bloomgate_service::AppState::connect(&config)
            .await
            .expect_err(key)
            .to_string();
        assert!(err.contains(key), "{key}: {err}");
    }
    // Untouched: the users rows are all there and no service table exists.
    let pool = common::sql_pool(url).await;
    let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM users")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(n, ROWS);
    assert!(
        sqlx::query("SELECT COUNT(*) FROM bloomgate_migrations")
            .fetch_one(&pool)
            .await
            .is_err(),
        "no migration ran"
    );
    pool.close().await;
}

#[tokio::test]
async fn bad_resources_stop_the_start_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    refuse_bad_configs(&common::sqlite_url(&dir)).await;
}

#[tokio::test]
async fn bad_resources_stop_the_start_on_mariadb() {
    let Some(url) = common::mysql_database("resources_bad").await else {
        return;
    };
    refuse_bad_configs(&url).await;
}

#[tokio::test]
async fn bad_resources_stop_the_start_on_postgres() {
    let Some(url) = common::postgres_database("resources_bad").await else {
        return;
    };
    refuse_bad_configs(&url).await;
}

/// Waits for `state`'s first resource's filter, then serves `state` on a
/// free port: its base URL, its gate, the stop signal and the server task.
async fn serve_built(
    state: bloomgate_service::AppState,
) -> (
    String,
    std::sync::Arc<bloomgate_service::shield::Shield>,
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<std::io::Result<()>>,
) {
    let g = std::sync::Arc::clone(state.resources[0].shield());
    eventually(20, "filter built", || {
        let g = std::sync::Arc::clone(&g);
        async move { g.is_ready() }
    })
    .await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(bloomgate_service::run(listener, state, async {
        let _ = rx.await;
    }));
    (base, g, tx, task)
}

#[path = "../examples/guard_profiles.rs"]
#[allow(dead_code)]
mod guard_profiles;

/// The README's Rust example, run through its `main` path (`serve`, which
/// `main` calls with the loaded config, a bound listener and the shutdown
/// signal): a directory of JSON files guarded as resource `profiles`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rust_example_guards_a_directory_of_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let profiles = dir.path().join("profiles");
    let config = common::config(&common::sqlite_url(&dir), None, "res-example");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let served = {
        let (config, profiles) = (config.clone(), profiles.clone());
        tokio::spawn(async move {
            guard_profiles::serve(&config, &profiles, listener, async {
                let _ = rx.await;
            })
            .await
        })
    };
    let client = reqwest::Client::new();
    let stats = || async {
        let r = client.get(format!("{base}/api/cache/stats")).send().await;
        match r {
            Ok(r) => r.json::<serde_json::Value>().await.unwrap(),
            Err(_) => serde_json::Value::Null,
        }
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while stats().await["resources"]["profiles"]["filter"]["ready"] != true {
        assert!(!served.is_finished(), "the example stopped");
        assert!(
            std::time::Instant::now() < deadline,
            "profiles' filter not built"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let get = |key: String| client.get(format!("{base}/api/profiles/{key}")).send();
    // The sample the first run writes, read from its file.
    let ada = get("u1001".into()).await.unwrap();
    assert_eq!(ada.status(), 200);
    assert_eq!(
        ada.json::<serde_json::Value>().await.unwrap(),
        serde_json::json!({"id": "u1001", "name": "Ada"})
    );
    // Keys with no file: 404, nearly all refused by the filter.
    let before = stats().await["resources"]["profiles"]["filter"]["rejected"]
        .as_u64()
        .unwrap();
    for n in 0..20 {
        assert_eq!(get(format!("u9{n}")).await.unwrap().status(), 404);
    }
    let rejected = stats().await["resources"]["profiles"]["filter"]["rejected"]
        .as_u64()
        .unwrap()
        - before;
    assert!(rejected >= 18, "{rejected} of 20 refused by the filter");
    // A file written by another program, told with `keys`: found.
    std::fs::write(
        profiles.join("u2002.json"),
        br#"{"id":"u2002","name":"Grace"}"#,
    )
    .unwrap();
    let told = client
        .post(format!("{base}/api/profiles/keys"))
        .json(&serde_json::json!({"keys": ["u2002"]}))
        .send()
        .await
        .unwrap();
    assert_eq!(told.status(), 200);
    let grace = get("u2002".into()).await.unwrap();
    assert_eq!(grace.status(), 200);
    assert_eq!(
        grace.json::<serde_json::Value>().await.unwrap()["name"],
        "Grace"
    );
    // A file whose name is no plain key is neither a row nor a key.
    std::fs::write(profiles.join("john.doe.json"), br#"{"id":"x"}"#).unwrap();
    let scanned = bloomgate_service::source::Source::scan(
        &guard_profiles::Profiles(profiles.clone()),
        None,
        100,
    )
    .await
    .unwrap();
    assert_eq!(
        scanned,
        [Key::Text("u1001".into()), Key::Text("u2002".into())]
    );
    // A key that would leave the directory is no row, never a file read.
    let p = guard_profiles::Profiles(profiles.clone());
    let escape = Key::Text("../profiles/u1001".into());
    assert!(bloomgate_service::source::Source::load(&p, &escape)
        .await
        .unwrap()
        .is_none());
    let _ = tx.send(());
    served.await.unwrap().unwrap();
}

/// A source whose load of `boom` panics.
#[derive(Debug)]
struct Panicky;

impl bloomgate_service::source::Source for Panicky {
    fn key_type(&self) -> KeyType {
        KeyType::Text
    }
    async fn load(
        &self,
        key: &Key,
    ) -> Result<Option<bloomgate_service::source::Row>, bloomgate_service::sql::StoreError> {
        assert!(key.to_string() != "boom", "the source fails hard");
        let mut row = bloomgate_service::source::Row::new();
        row.insert("id".into(), key.to_string().into());
        Ok(Some(row))
    }
    async fn scan(
        &self,
        after: Option<&Key>,
        _limit: usize,
    ) -> Result<Vec<Key>, bloomgate_service::sql::StoreError> {
        Ok(if after.is_none() {
            vec![text("boom"), text("ok")]
        } else {
            Vec::new()
        })
    }
    async fn count(&self) -> Result<u64, bloomgate_service::sql::StoreError> {
        Ok(2)
    }
}

/// A load that panics answers its readers, the one that ran it and those
/// that joined it, with a JSON 503 (it once unwound through the request
/// that ran it and dropped its connection), and the instance serves on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_load_that_panics_answers_503_to_every_reader() {
    let dir = tempfile::tempdir().unwrap();
    let config = common::config(&common::sqlite_url(&dir), None, "res-panic");
    let state = bloomgate_service::AppState::connect(&config).await.unwrap();
    let state = state
        .with_resource(
            "panicky",
            std::sync::Arc::new(Panicky),
            &bloomgate_service::resource::ResourceOptions::default(),
        )
        .await
        .unwrap();
    bloomgate_service::prepare(&state, &config).await.unwrap();
    let (base, _, tx, task) = serve_built(state).await;
    let client = reqwest::Client::new();
    let reads = (0..8).map(|_| {
        let url = format!("{base}/api/panicky/boom");
        let client = client.clone();
        async move {
            let r = client.get(url).send().await.expect("an answer, not a drop");
            let status = r.status().as_u16();
            (status, r.json::<serde_json::Value>().await.unwrap())
        }
    });
    let answers = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        futures_util::future::join_all(reads),
    )
    .await
    .expect("no reader waits forever");
    for (status, body) in answers {
        assert_eq!(status, 503, "{body}");
        assert_eq!(body["error"], "unavailable", "{body}");
    }
    let ok = client.get(format!("{base}/api/panicky/ok")).send().await;
    assert_eq!(ok.unwrap().status(), 200);
    let _ = tx.send(());
    task.await.unwrap().unwrap();
}

/// The watch column's promises (README, `resource.rs`): a row that
/// commits after a row with a larger value is still seen when it commits
/// within five polls; a full page of one value is gone past, not read
/// forever; and the documented gap: a row that commits more than five
/// polls after a larger value is left to `keys` or the next rebuild.
/// Fails with `WATCH_LAG_POLLS = 0` (the first) and without the page's
/// `past` (the second).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_watch_sees_late_commits_within_five_polls_and_pages_past_one_value() {
    let dir = tempfile::tempdir().unwrap();
    let url = common::sqlite_url(&dir);
    users_table(&url).await;
    let mut config = common::config(&url, None, "watch-promises");
    config.cache.bloom_auto_rebuild = false;
    let mut watched = resource("members", true);
    // Room for the page of 10,000 without an alarm (a rebuild would admit
    // every row and hide what the watch did).
    watched.bloom_expected = 30_000;
    // Polls slow enough that "within five polls" (a second) has room on a
    // loaded machine.
    watched.watch_every_ms = 200;
    config.resources = vec![watched];
    let s = TestServer::start(config, 0).await;
    ready(&s).await;
    let members = users(&s, "members");
    let admitted = |k: &str| members.shield().probe(text(k)) != Verdict::Reject;
    let fresh = |prefix: &str| rejected_everywhere(&[&s], prefix).to_string();
    let insert = |key: String, seq: i64| {
        let url = url.clone();
        async move {
            exec(
                &url,
                &[format!(
                    "INSERT INTO users (id, name, seq) VALUES ('{key}', 'watched', {seq})"
                )],
            )
            .await;
        }
    };
    let every = std::time::Duration::from_millis(200);

    // Out of order within five polls: 150,000 commits just after 200,000
    // was seen.
    let (high, late) = (fresh("hi"), fresh("lo"));
    insert(high.clone(), 200_000).await;
    eventually(5, "the watch admits the larger value", || async {
        admitted(&high)
    })
    .await;
    insert(late.clone(), 150_000).await;
    eventually(
        5,
        "a row committed out of order within five polls",
        || async { admitted(&late) },
    )
    .await;

    // A full page (10,000 rows) of one value, then one past it.
    let page: Vec<String> = (0..10_000)
        .map(|i| format!("('pg{i:05}', 'page', 300000)"))
        .collect();
    exec(
        &url,
        &[format!(
            "INSERT INTO users (id, name, seq) VALUES {}",
            page.join(", ")
        )],
    )
    .await;
    let after = fresh("af");
    insert(after.clone(), 300_001).await;
    eventually(10, "the row past a full page of one value", || async {
        admitted(&after)
    })
    .await;
    for i in [0, 4_999, 9_999] {
        assert!(admitted(&format!("pg{i:05}")), "pg{i:05} of the page");
    }

    // The documented gap: a smaller value committed more than five polls
    // after the largest is not admitted by the watch.
    tokio::time::sleep(every * 7).await;
    let missed = fresh("gap");
    insert(missed.clone(), 100).await;
    tokio::time::sleep(every * 7).await;
    assert!(
        !admitted(&missed),
        "the gap README states: left to keys or the next rebuild"
    );
    s.stop().await;
}

/// A resource's `keys` call drops the keys' cached entries from Redis
/// before it records them in the outbox: when Redis does not confirm the
/// `DEL` (an ACL without it, on a Redis of the test's own) the call
/// answers 503 and nothing is recorded; once Redis takes `DEL`s again the
/// same call answers 200 and records one entry. Fails if the outbox were
/// written first (the 503 would leave an entry).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn keys_answers_503_and_records_nothing_when_redis_does_not_confirm() {
    let redis = common::OwnServer::redis().await;
    let mut admin = common::redis_conn(&redis.url()).await;
    let acl = |del: &'static str| {
        redis::cmd("ACL")
            .arg(&["SETUSER", "nodel", "on", "nopass", "~*", "&*", "+@all", del])
            .clone()
    };
    let _: () = acl("-del").query_async(&mut admin).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let url = common::sqlite_url(&dir);
    users_table(&url).await;
    let nodel = format!("redis://nodel:x@127.0.0.1:{}/", redis.port);
    let mut config = common::config(&url, Some(&nodel), "keys-redis-first");
    config.resources = vec![resource("users", false)];
    let s = TestServer::start(config, 0).await;
    ready(&s).await;
    let key = rejected_everywhere(&[&s], "k").to_string();
    exec(
        &url,
        &[format!(
            "INSERT INTO users (id, name, seq) VALUES ('{key}', 'app', 999999)"
        )],
    )
    .await;
    let recorded = || {
        let (url, key) = (url.clone(), key.clone());
        async move {
            let pool = common::sql_pool(&url).await;
            let n: i64 = sqlx::query_scalar(&format!(
                "SELECT COUNT(*) FROM bloomgate_changes WHERE item_key = '{key}'"
            ))
            .fetch_one(&pool)
            .await
            .unwrap();
            pool.close().await;
            n
        }
    };
    let (status, body) = post(&s, "/api/users/keys", &[&key]).await;
    assert_eq!(status, 503, "{body}");
    assert!(body["error"].is_string(), "a JSON error: {body}");
    assert_eq!(
        recorded().await,
        0,
        "nothing recorded before Redis confirmed"
    );

    let _: () = acl("+del").query_async(&mut admin).await.unwrap();
    let (status, body) = post(&s, "/api/users/keys", &[&key]).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(recorded().await, 1);
    assert_eq!(s.get(&format!("/api/users/{key}")).await.0, 200);
    s.stop().await;
}

/// Issue 30's defect: the SKU filter's replay from the outbox
/// (`Outbox::created_after`, behind snapshot restores and adopted
/// rebuilds, and their "does the filter account for SQL's rows" check)
/// took a resource's key that parses as an integer for a SKU id. A users
/// key "42" must not count as SKU 42.
/// A row another program inserts while the start-up scan of a watched
/// table is held (its scan done, its filter not yet published) is in the
/// filter soon after: the watch read the column's largest value before
/// the build began, so the row is past that value (the watch admits it)
/// or was there for the scan.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_inserted_while_the_start_up_scan_is_held_is_found_by_the_watch() {
    let dir = tempfile::tempdir().unwrap();
    let url = common::sqlite_url(&dir);
    users_table(&url).await;
    let mut config = common::config(&url, None, "watch-held-scan");
    config.demo = Some(false);
    config.resources = vec![resource("members", true)];
    let state = bloomgate_service::AppState::connect(&config).await.unwrap();
    let members = state
        .resources
        .iter()
        .find(|r| &*r.name == "members")
        .cloned()
        .unwrap();
    let pause = members.shield().after_scan.arm(0);
    // The table's build runs in the background (no demo table: nothing
    // for the caller to wait on).
    let build = bloomgate_service::prepare(&state, &config).await.unwrap();
    pause.reached().await;
    let row = format!(
        "INSERT INTO users (id, name, seq) VALUES ('u_held', 'held', {})",
        ROWS + 1
    );
    exec(&url, &[row]).await;
    pause.resume();
    if let Some(build) = build {
        build.await.unwrap();
    }
    let gate = std::sync::Arc::clone(members.shield());
    eventually(
        2,
        "the row inserted during the held scan is admitted",
        || {
            let gate = std::sync::Arc::clone(&gate);
            async move { gate.is_ready() && gate.probe(text("u_held")) != Verdict::Reject }
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_resources_integer_looking_key_is_no_sku_create() {
    let dir = tempfile::tempdir().unwrap();
    let url = common::sqlite_url(&dir);
    users_table(&url).await;
    let mut config = common::config(&url, None, "created-after");
    config.resources = vec![resource("users", false)];
    let s = TestServer::start(config, 0).await;
    ready(&s).await;
    exec(
        &url,
        &["INSERT INTO users (id, name, seq) VALUES ('42', 'numeric', 999998)".into()],
    )
    .await;
    let (status, body) = post(&s, "/api/users/keys", &["42"]).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(s.create(7, "a sku").await, 201);
    assert_eq!(
        s.state.outbox.created_keys_after(0, "skus").await.unwrap(),
        Some(vec!["7".to_string()]),
        "the SKU creates after position 0"
    );
    s.stop().await;
}

/// The SKU table is the default resource `skus`: `GET /api/skus/{id}`
/// answers byte for byte as seed 000's `GET /api/seckill/{skuId}`, for a
/// row, a filter "no", an L1 hit and a bad id, and the stats carry it.
#[tokio::test]
async fn the_sku_table_answers_as_the_default_resource() {
    let dir = tempfile::tempdir().unwrap();
    let config = common::config(&common::sqlite_url(&dir), None, "res-skus");
    let s = TestServer::start(config, 100).await;
    let raw = |path: String| {
        let client = s.client.clone();
        let url = s.url(&path);
        async move {
            let r = client.get(url).send().await.unwrap();
            let status = r.status().as_u16();
            let kind = r.headers()["content-type"].to_str().unwrap().to_owned();
            (status, kind, r.bytes().await.unwrap())
        }
    };
    for id in ["1", "50", "50", "100", "101", "999999999", "0", "abc", "-3"] {
        let seckill = raw(format!("/api/seckill/{id}")).await;
        let skus = raw(format!("/api/skus/{id}")).await;
        assert_eq!(seckill, skus, "{id}");
    }
    assert_eq!(raw("/api/skus/7".into()).await.0, 200);
    assert_eq!(raw("/api/skus/999999999".into()).await.0, 404);
    let stats = s.stats().await;
    assert_eq!(stats["resources"]["skus"]["key_type"], "int");
    assert_eq!(
        stats["resources"]["skus"]["filter"]["rejected"],
        stats["bloom"]["rejected"]
    );
    s.stop().await;
}

/// A `users` resource restarted with its snapshot answers every key from
/// the snapshot plus the outbox (a key added through another instance
/// after the save too) and reads no key scan of `users`; without the
/// snapshot the same start scans.
async fn users_restart_from_snapshot(url: &str, redis: Option<&str>, prefix: &str) {
    users_table(url).await;
    if let Some(r) = redis {
        common::redis_clear(r, &format!("bgtest:{prefix}:")).await;
    }
    let dir = tempfile::tempdir().unwrap();
    let snap = dir.path().join("users.snap");
    let config = |snapshot: bool| {
        let mut c = common::config(url, redis, prefix);
        let mut r = resource("users", false);
        r.bloom_snapshot_path = snapshot.then(|| snap.clone());
        c.resources = vec![r];
        c
    };
    let scans = |s: &TestServer| {
        users(s, "users")
            .table
            .as_ref()
            .unwrap()
            .counters
            .scans
            .load(Relaxed)
    };
    // A builds by scanning, learns v1 through `keys`, saves at shutdown.
    let a = TestServer::start(config(true), 0).await;
    ready(&a).await;
    assert!(scans(&a) > 0, "the first start scans");
    exec(
        url,
        &["INSERT INTO users (id, name, seq) VALUES ('v1', 'late', 100001)".into()],
    )
    .await;
    assert_eq!(post(&a, "/api/users/keys", &["v1"]).await.0, 200);
    a.stop().await;
    assert!(snap.exists(), "saved at shutdown");
    // After the save, another instance (no snapshot) learns v2.
    exec(
        url,
        &["INSERT INTO users (id, name, seq) VALUES ('v2', 'later', 100002)".into()],
    )
    .await;
    let b = TestServer::start(config(false), 0).await;
    ready(&b).await;
    assert_eq!(post(&b, "/api/users/keys", &["v2"]).await.0, 200);
    b.stop().await;
    // A again: ready as `prepare` returns, without one page of scan.
    let a = TestServer::start(config(true), 0).await;
    let u = users(&a, "users");
    assert!(u.shield().is_ready(), "restored before serving");
    assert_eq!(u.shield().rebuild_count(), 0, "no build");
    let keys: Vec<String> = (1..=ROWS)
        .map(|i| format!("u{i:06}"))
        .chain(["v1".into(), "v2".into()])
        .collect();
    for k in &keys {
        assert_eq!(a.get(&format!("/api/users/{k}")).await.0, 200, "{k}");
    }
    assert_eq!(scans(&a), 0, "no scan of users");
    a.stop().await;
    // Without the snapshot the same start scans (the check above can
    // fail), or with Redis adopts the newest shared rebuild instead.
    std::fs::remove_file(&snap).unwrap();
    let a = TestServer::start(config(true), 0).await;
    ready(&a).await;
    let adopted = counter(
        &a.stats().await,
        &["resources", "users", "epochs", "adopted"],
    );
    if redis.is_some() {
        assert_eq!((scans(&a), adopted), (0, 1), "no snapshot: an epoch");
    } else {
        assert!(
            scans(&a) > 0 && adopted == 0,
            "no snapshot, no Redis: a scan"
        );
    }
    for k in &keys {
        assert_eq!(a.get(&format!("/api/users/{k}")).await.0, 200, "{k}");
    }
    a.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn users_restart_from_a_snapshot_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    users_restart_from_snapshot(&common::sqlite_url(&dir), None, "res-snap-sqlite").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn users_restart_from_a_snapshot_on_mariadb() {
    let Some(url) = common::mysql_database("res_snap").await else {
        return;
    };
    let redis = common::redis_url().await;
    if let Some(r) = &redis {
        common::redis_clear(r, "bgtest:res-snap-maria:").await;
    }
    users_restart_from_snapshot(&url, redis.as_deref(), "res-snap-maria").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn users_restart_from_a_snapshot_on_postgres() {
    let Some(url) = common::postgres_database("res_snap").await else {
        return;
    };
    let redis = common::redis_url().await;
    if let Some(r) = &redis {
        common::redis_clear(r, "bgtest:res-snap-pg:").await;
    }
    users_restart_from_snapshot(&url, redis.as_deref(), "res-snap-pg").await;
}

/// `strict` mode for a resource: a key told to instance A (its row
/// committed, then `keys`) is never refused by B, even while B's outbox
/// follower is parked and its replica has not learnt it; a local-mode
/// instance, parked the same way, refuses it (the check can fail); a key
/// that exists nowhere is still refused by B.
async fn users_strict(url: &str, redis: &str, prefix: &str) {
    users_table(url).await;
    common::redis_clear(redis, &format!("bgtest:{prefix}:")).await;
    let config = |mode| {
        let mut c = common::config(url, Some(redis), prefix);
        let mut r = resource("users", false);
        r.bloom_mode = Some(mode);
        c.resources = vec![r];
        c
    };
    let a = TestServer::start(config(BloomMode::Strict), 0).await;
    let b = TestServer::start(config(BloomMode::Strict), 0).await;
    let local = TestServer::start(config(BloomMode::Local), 0).await;
    for s in [&a, &b, &local] {
        ready(s).await;
    }
    // A key B's filter lets through (a false positive) before its row
    // exists: B caches its absence in L1 (and Redis its sentinel).
    let ub = users(&b, "users");
    let early = (0..100_000)
        .map(|n| format!("fp{n}"))
        .find(|k| ub.shield().probe(text(k)) == Verdict::Pass)
        .expect("a false positive among 10^5 keys at 1%");
    assert_eq!(b.get(&format!("/api/users/{early}")).await.0, 404);
    let _b_parked = common::quiet_sql(&b).await;
    let _local_parked = common::quiet_sql(&local).await;
    // "bloom" too: a key spelled like the shared filter's own Redis key
    // (it once deleted the filter's bits when its cached entry was dropped).
    let keys: Vec<String> = (0..20)
        .map(|i| format!("w{i:03}"))
        .chain(["bloom".to_string(), early.clone()])
        .collect();
    for (i, k) in keys.iter().enumerate() {
        exec(
            url,
            &[format!(
                "INSERT INTO users (id, name, seq) VALUES ('{k}', 'told', {})",
                200_000 + i
            )],
        )
        .await;
    }
    let spelled: Vec<&str> = keys.iter().map(String::as_str).collect();
    assert_eq!(post(&a, "/api/users/keys", &spelled).await.0, 200);
    let unlearnt = keys
        .iter()
        .filter(|k| ub.shield().probe(text(k)) == Verdict::Reject)
        .count();
    assert!(
        unlearnt >= 15,
        "B's replica has not learnt them ({unlearnt})"
    );
    // The shared filter still holds every row of the table (telling
    // "bloom" left its bits alone).
    let all: Vec<Key> = (1..=ROWS)
        .map(|i| text(&format!("u{i:06}")))
        .chain(keys.iter().map(|k| text(k)))
        .collect();
    let shared = ub.shared().expect("strict");
    let mut lost = 0;
    for k in &all {
        if !shared.maybe_contains(k).await {
            lost += 1;
        }
    }
    assert_eq!(
        lost,
        0,
        "{lost} of {} lost from the shared filter",
        all.len()
    );
    // The many-key reads refuse none of them either.
    let (status, body) = post(&b, "/api/users/exists", &spelled).await;
    assert_eq!(status, 200, "{body}");
    assert!(
        body["exists"].as_array().unwrap().iter().all(|e| e == true),
        "{body}"
    );
    let (status, body) = post(&b, "/api/users/batch", &spelled).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body["found"].as_array().unwrap().len(),
        keys.len(),
        "{body}"
    );
    for k in &keys {
        assert_eq!(b.get(&format!("/api/users/{k}")).await.0, 200, "{k} on B");
    }
    let stats = b.stats().await;
    assert!(
        counter(&stats, &["resources", "users", "shared", "overruled"]) >= unlearnt as i64,
        "{}",
        stats["resources"]["users"]
    );
    let refused = keys
        .iter()
        .filter(|k| users(&local, "users").shield().probe(text(k)) == Verdict::Reject)
        .count();
    let mut local_404 = 0;
    for k in &keys {
        if local.get(&format!("/api/users/{k}")).await.0 == 404 {
            local_404 += 1;
        }
    }
    assert_eq!(
        local_404, refused,
        "local mode refuses what its replica lacks"
    );
    assert!(local_404 >= 15, "{local_404}");
    let (_, body) = post(&local, "/api/users/batch", &spelled).await;
    assert_eq!(body["missing"].as_array().unwrap().len(), refused, "{body}");
    // A key that exists nowhere: both filters say no.
    let missing = rejected_everywhere(&[&b], "zz");
    assert_eq!(b.get(&format!("/api/users/{missing}")).await.0, 404);
    for s in [a, b, local] {
        s.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn users_strict_on_mariadb() {
    let Some(url) = common::mysql_database("res_strict").await else {
        return;
    };
    let Some(redis) = common::redis_url().await else {
        return;
    };
    users_strict(&url, &redis, "res-strict-maria").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn users_strict_on_postgres() {
    let Some(url) = common::postgres_database("res_strict").await else {
        return;
    };
    let Some(redis) = common::redis_url().await else {
        return;
    };
    users_strict(&url, &redis, "res-strict-pg").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn users_strict_on_sqlite() {
    let Some(redis) = common::redis_url().await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    users_strict(&common::sqlite_url(&dir), &redis, "res-strict-sqlite").await;
}

/// Seed 000's warm for a resource: `POST /api/users/warm` with seed 000's
/// body loads its first keys into Redis and L1 (a warmed key then reads
/// with no SQL statement) and, with `rebuild_bloom`, rebuilds its filter
/// from the table, waited for; a bad body is a JSON 400.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resource_warms_as_seed_000_does() {
    let Some(redis) = common::redis_url().await else {
        return;
    };
    common::redis_clear(&redis, "bgtest:res-warm:").await;
    let dir = tempfile::tempdir().unwrap();
    let url = common::sqlite_url(&dir);
    users_table(&url).await;
    let mut config = common::config(&url, Some(&redis), "res-warm");
    config.resources = vec![resource("users", false)];
    let s = TestServer::start(config, 0).await;
    ready(&s).await;
    let u = users(&s, "users");
    let rebuilds = u.shield().rebuild_count();
    let (status, body) = s
        .send(
            Method::POST,
            "/api/users/warm",
            Some(r#"{"limit":100,"rebuild_bloom":true}"#),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["warmed"], 100, "{body}");
    assert_eq!(body["redis_written"], 100, "{body}");
    assert_eq!(body["added"], ROWS, "{body}");
    assert_eq!(body["rebuild_bloom"]["added"], ROWS, "{body}");
    assert_eq!(u.shield().rebuild_count(), rebuilds + 1);
    // A warmed key answers from L1: no statement reaches SQL.
    let table = u.table.as_ref().unwrap();
    let statements = table.counters.statements.load(Relaxed);
    for i in 1..=100 {
        assert_eq!(s.get(&format!("/api/users/u{i:06}")).await.0, 200);
    }
    assert_eq!(table.counters.statements.load(Relaxed), statements);
    // The same body rules as seed 000's warm.
    let (status, body) = s
        .send(Method::POST, "/api/users/warm", Some(r#"{"limit":-1}"#))
        .await;
    assert_eq!((status, body["error"].as_str()), (400, Some("bad_request")));
    let (status, _) = s
        .send(
            Method::POST,
            "/api/users/warm",
            Some(r#"{"limit":2000000}"#),
        )
        .await;
    assert_eq!(status, 400);
    // An empty body is all defaults (1000 keys: all 200 rows here).
    let (status, body) = s.send(Method::POST, "/api/users/warm", None).await;
    assert_eq!(
        (status, body["warmed"].as_i64()),
        (200, Some(ROWS)),
        "{body}"
    );
    s.stop().await;
}

/// The SKU table has the key API every resource has: `exists` and `batch`
/// answer as the read route does, `keys` admits ids another program
/// inserted (on every instance), `invalidate` drops rows another program
/// updated; the bodies are checked as a resource's are.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_skus_answer_keys_exists_and_batch() {
    let redis = common::redis_url().await;
    if let Some(r) = &redis {
        common::redis_clear(r, "bgtest:res-sku-api:").await;
    }
    let dir = tempfile::tempdir().unwrap();
    let url = common::sqlite_url(&dir);
    let config = || common::config(&url, redis.as_deref(), "res-sku-api");
    let a = TestServer::start(config(), 100).await;
    let b = TestServer::start(config(), 0).await;
    let absent = (1_000..1_000_000i64)
        .find(|&id| {
            [&a, &b]
                .iter()
                .all(|s| s.state.skus.shield().probe(id) == Verdict::Reject)
        })
        .unwrap();
    let body = |ids: &[serde_json::Value]| serde_json::json!({ "keys": ids }).to_string();
    let ids = [
        serde_json::json!(1),
        serde_json::json!("50"),
        serde_json::json!(absent),
    ];
    let (status, exists) = call_ids(&a, "/api/skus/exists", &ids).await;
    assert_eq!(status, 200, "{exists}");
    assert_eq!(exists["exists"], serde_json::json!([true, true, false]));
    let (status, batch) = call_ids(&a, "/api/skus/batch", &ids).await;
    assert_eq!(status, 200, "{batch}");
    assert_eq!(batch["missing"], serde_json::json!([absent]));
    assert_eq!(batch["found"][0]["key"], 1);
    assert_eq!(batch["found"][0]["row"], a.get("/api/seckill/1").await.1);
    assert_eq!(batch["found"][1]["row"], a.get("/api/seckill/50").await.1);
    // A key asked twice is found twice.
    let twice = [serde_json::json!(7), serde_json::json!(7)];
    let (_, batch) = call_ids(&a, "/api/skus/batch", &twice).await;
    assert_eq!(batch["found"].as_array().unwrap().len(), 2, "{batch}");
    // A row another program inserted: refused until `keys`, then found on
    // both instances.
    let sku = bloomgate_service::model::catalogue_sku(absent);
    assert!(a.state.skus.source().insert(&sku).await.unwrap());
    let path = format!("/api/seckill/{absent}");
    assert_eq!(a.get(&path).await.0, 404);
    let (status, added) = call_ids(&a, "/api/skus/keys", &[serde_json::json!(absent)]).await;
    assert_eq!((status, added["added"].as_i64()), (200, Some(1)), "{added}");
    assert_eq!(a.get(&path).await.0, 200, "the instance that took the call");
    eventually(5, "the other instance admits the id", || async {
        b.get(&path).await.0 == 200
    })
    .await;
    // A row another program updated, cached on both: fresh after
    // `invalidate`.
    let mut changed = sku.clone();
    changed.stock = 4242;
    assert!(a.state.skus.source().update(&changed).await.unwrap());
    assert_ne!(a.get(&path).await.1["stock"], 4242, "cached");
    let (status, _) = call_ids(&a, "/api/skus/invalidate", &[serde_json::json!(absent)]).await;
    assert_eq!(status, 200);
    assert_eq!(a.get(&path).await.1["stock"], 4242);
    eventually(5, "the other instance drops its copy", || async {
        b.get(&path).await.1["stock"] == 4242
    })
    .await;
    // A delete behind the service's back, told as one.
    assert!(a.state.skus.source().delete(absent).await.unwrap());
    let told = serde_json::json!({ "keys": [absent], "deleted": true }).to_string();
    let (status, answer) = a
        .send(Method::POST, "/api/skus/invalidate", Some(&told))
        .await;
    assert_eq!(
        (status, answer["deleted"].as_bool()),
        (200, Some(true)),
        "{answer}"
    );
    assert_eq!(a.get(&path).await.0, 404);
    let stats = a.stats().await;
    assert_eq!(stats["resources"]["skus"]["calls"]["keys_added"], 1);
    assert_eq!(stats["resources"]["skus"]["calls"]["batch_keys"], 5);
    // Bad bodies are JSON 400s; a GET of a call's path is an id, also 400.
    for bad in [
        body(&[serde_json::json!(0)]),
        body(&[serde_json::json!(-7)]),
        body(&[serde_json::json!("abc")]),
        body(&vec![serde_json::json!(1); 1001]),
        r#"{"ids":[1]}"#.to_string(),
    ] {
        let (status, err) = a.send(Method::POST, "/api/skus/batch", Some(&bad)).await;
        assert_eq!(
            (status, err["error"].as_str()),
            (400, Some("bad_request")),
            "{bad}"
        );
    }
    assert_eq!(a.get("/api/skus/keys").await.0, 400);
    // A bad key is quoted clipped, never echoed whole.
    let long = body(&[serde_json::json!("x".repeat(5_000))]);
    let (status, err) = a.send(Method::POST, "/api/skus/batch", Some(&long)).await;
    let message = err["message"].as_str().unwrap_or_default();
    assert_eq!(status, 400, "{err}");
    assert!(
        message.starts_with("keys[0]: ") && message.len() < 300,
        "{message:.400}"
    );
    // The default resource's warm, as every resource has one, with seed
    // 000's body: the same answer as `/api/cache/warm`.
    if redis.is_some() {
        eventually(5, "A's start-up filter is stored or adopted", || async {
            a.stats().await["resources"]["skus"]["epochs"]["held"].as_u64() > Some(0)
        })
        .await;
    }
    let published_before = a.stats().await["resources"]["skus"]["epochs"]["published"]
        .as_u64()
        .unwrap_or(0);
    let (status, warm) = a
        .send(
            Method::POST,
            "/api/skus/warm",
            Some(r#"{"limit":50,"rebuild_bloom":true}"#),
        )
        .await;
    assert_eq!(status, 200, "{warm}");
    assert_eq!(
        (warm["warmed"].as_u64(), warm["added"].as_u64()),
        (Some(50), Some(100)),
        "{warm}"
    );
    assert_eq!(
        a.get("/api/skus/warm").await.0,
        400,
        "a GET reads it as an id"
    );
    if redis.is_some() {
        // Its shared rebuild, in the shape every resource's stats have:
        // one epoch more stored by A (after its start-up filter, if A
        // stored that one), and held by both.
        let epoch = warm["epoch"].as_u64().expect("a led rebuild is shared");
        let epochs = &a.stats().await["resources"]["skus"]["epochs"];
        assert_eq!(
            (epochs["published"].as_u64(), epochs["held"].as_u64()),
            (Some(published_before + 1), Some(epoch)),
            "{epochs}"
        );
        eventually(5, "the other instance adopts the epoch", || async {
            b.stats().await["resources"]["skus"]["epochs"]["held"].as_u64() == Some(epoch)
        })
        .await;
    }
    a.stop().await;
    b.stop().await;
}

async fn call_ids(
    s: &TestServer,
    path: &str,
    ids: &[serde_json::Value],
) -> (u16, serde_json::Value) {
    let text = serde_json::json!({ "keys": ids }).to_string();
    s.send(Method::POST, path, Some(&text)).await
}

/// The per-client rate limit covers every read: the SKU reads and a
/// resource's, checked where the edge gives its fast answer (which it
/// still gives: a filter "no" under the limit takes no slow path), and
/// `batch`/`exists` at one unit per key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rate_limit_covers_every_read_and_counts_a_batch_by_its_keys() {
    let dir = tempfile::tempdir().unwrap();
    let url = common::sqlite_url(&dir);
    users_table(&url).await;
    let mut config = common::config(&url, None, "res-rate");
    config.resources = vec![resource("users", false)];
    config.http.rate_limit_per_sec = 1;
    config.http.rate_limit_burst = 6;
    let s = TestServer::start(config.clone(), 100).await;
    ready(&s).await;
    let missing = rejected_everywhere(&[&s], "x");
    let fast_before = s.state.metrics.fast_answers();
    // Six reads pass (three of them answered fast by the filter), the
    // seventh, of either kind, is refused.
    for path in [
        format!("/api/users/{missing}"),
        "/api/users/u000001".into(),
        format!("/api/users/{missing}"),
        format!("/api/users/{missing}"),
        "/api/seckill/1".into(),
        "/api/skus/2".into(),
    ] {
        assert_ne!(s.get(&path).await.0, 429, "{path}");
    }
    assert!(
        s.state.metrics.fast_answers() >= fast_before + 3,
        "the limit keeps the fast answer"
    );
    let (status, body) = s.get("/api/users/u000002").await;
    assert_eq!(
        (status, body["error"].as_str()),
        (429, Some("too_many_requests"))
    );
    assert_eq!(s.get("/api/seckill/3").await.0, 429);
    // A batch takes a unit per key: 3 keys fit a full burst of 6 twice,
    // not three times; 7 keys never fit. (A new instance: a full bucket.)
    s.stop().await;
    let s = TestServer::start(config, 0).await;
    ready(&s).await;
    let keys = ["u000001", "u000002", "u000003"];
    assert_eq!(post(&s, "/api/users/batch", &keys).await.0, 200);
    assert_eq!(post(&s, "/api/users/exists", &keys).await.0, 200);
    let (status, body) = post(&s, "/api/users/batch", &keys).await;
    assert_eq!(status, 429, "{body}");
    let seven = ["a", "b", "c", "d", "e", "f", "g"];
    let (status, body) = post(&s, "/api/users/batch", &seven).await;
    assert_eq!(status, 429, "{body}");
    assert!(
        body["message"].as_str().unwrap().contains("burst"),
        "{body}"
    );
    // Admin calls and the stats are not limited.
    assert_eq!(post(&s, "/api/users/keys", &["u000001"]).await.0, 200);
    assert_eq!(s.get("/api/cache/stats").await.0, 200);
    s.stop().await;
}

/// Shared rebuilds for a resource: the first instance scans `users` and
/// stores its filter in Redis; the second adopts it at start without a
/// page of scan; after rows are deleted behind the service's back, a warm
/// with `rebuild_bloom` on A scans once and B adopts that epoch (no scan
/// on B; the deleted keys are refused there), and a key told to A after
/// the epoch's position is still found on B.
async fn users_shared_rebuild(url: &str, redis: &str, prefix: &str) {
    users_table(url).await;
    common::redis_clear(redis, &format!("bgtest:{prefix}:")).await;
    let config = || {
        let mut c = common::config(url, Some(redis), prefix);
        let mut r = resource("users", false);
        r.bloom_rebuild_after_deletes = Some(50);
        c.resources = vec![r];
        c
    };
    let scans = |s: &TestServer| {
        users(s, "users")
            .table
            .as_ref()
            .unwrap()
            .counters
            .scans
            .load(Relaxed)
    };
    let epochs = |v: &serde_json::Value, k: &str| counter(v, &["resources", "users", "epochs", k]);
    let a = TestServer::start(config(), 0).await;
    ready(&a).await;
    assert!(scans(&a) > 0);
    eventually(10, "A stores its start-up filter", || async {
        epochs(&a.stats().await, "published") == 1
    })
    .await;
    let b = TestServer::start(config(), 0).await;
    assert!(
        users(&b, "users").shield().is_ready(),
        "adopted before serving"
    );
    assert_eq!(scans(&b), 0, "B adopted A's filter at start");
    assert_eq!(epochs(&b.stats().await, "adopted"), 1);
    // Rows deleted behind the service's back, then A's warm rebuilds.
    let deleted: Vec<String> = (1..=100).map(|i| format!("u{i:06}")).collect();
    exec(
        url,
        &[format!(
            "DELETE FROM users WHERE id IN ({})",
            deleted
                .iter()
                .map(|k| format!("'{k}'"))
                .collect::<Vec<_>>()
                .join(", ")
        )],
    )
    .await;
    let (status, body) = a
        .send(
            Method::POST,
            "/api/users/warm",
            Some(r#"{"limit":10,"rebuild_bloom":true}"#),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["added"], ROWS - 100, "{body}");
    assert!(body["epoch"].as_u64().is_some(), "shared: {body}");
    // A key told to A after the rebuild: in the outbox after the epoch's
    // position.
    exec(
        url,
        &["INSERT INTO users (id, name, seq) VALUES ('late1', 'late', 300000)".into()],
    )
    .await;
    assert_eq!(post(&a, "/api/users/keys", &["late1"]).await.0, 200);
    eventually(10, "B adopts A's rebuild", || async {
        epochs(&b.stats().await, "adopted") == 2
    })
    .await;
    assert_eq!(scans(&b), 0, "B never scanned");
    let ub = users(&b, "users");
    let still = deleted
        .iter()
        .filter(|k| ub.shield().probe(text(k)) != Verdict::Reject)
        .count();
    assert!(
        still <= 5,
        "B's filter is the rebuilt one ({still} of 100 deleted pass)"
    );
    for k in ["u000101", "u000200", "late1"] {
        assert_eq!(b.get(&format!("/api/users/{k}")).await.0, 200, "{k} on B");
    }
    assert_eq!(epochs(&b.stats().await, "adopt_failures"), 0);
    // Many deletes told with `invalidate` and `"deleted": true`: past
    // bloom_rebuild_after_deletes (50 here), A rebuilds once and B adopts.
    let gone: Vec<String> = (101..=160).map(|i| format!("u{i:06}")).collect();
    exec(
        url,
        &[format!(
            "DELETE FROM users WHERE id IN ({})",
            gone.iter()
                .map(|k| format!("'{k}'"))
                .collect::<Vec<_>>()
                .join(", ")
        )],
    )
    .await;
    let rebuilds = users(&a, "users").shield().rebuild_count();
    for part in gone.chunks(30) {
        let body = serde_json::json!({ "keys": part, "deleted": true }).to_string();
        let (status, answer) = a
            .send(Method::POST, "/api/users/invalidate", Some(&body))
            .await;
        assert_eq!(
            (status, answer["deleted"].as_bool()),
            (200, Some(true)),
            "{answer}"
        );
    }
    eventually(
        10,
        "A rebuilds after the deletes and B adopts it",
        || async {
            users(&a, "users").shield().rebuild_count() == rebuilds + 1
                && epochs(&b.stats().await, "adopted") == 3
        },
    )
    .await;
    assert_eq!(scans(&b), 0, "B never scanned");
    let still = gone
        .iter()
        .filter(|k| ub.shield().probe(text(k)) != Verdict::Reject)
        .count();
    assert!(still <= 5, "{still} of 60 deleted keys pass on B");
    assert_eq!(b.get("/api/users/u000161").await.0, 200);
    // `deleted` belongs to invalidate alone.
    let body = serde_json::json!({ "keys": ["u000161"], "deleted": true }).to_string();
    assert_eq!(
        a.send(Method::POST, "/api/users/keys", Some(&body)).await.0,
        400
    );
    a.stop().await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn users_share_rebuilds_on_sqlite() {
    let Some(redis) = common::redis_url().await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    users_shared_rebuild(&common::sqlite_url(&dir), &redis, "res-epoch-sqlite").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn users_share_rebuilds_on_mariadb() {
    let Some(url) = common::mysql_database("res_epoch").await else {
        return;
    };
    let Some(redis) = common::redis_url().await else {
        return;
    };
    users_shared_rebuild(&url, &redis, "res-epoch-maria").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn users_share_rebuilds_on_postgres() {
    let Some(url) = common::postgres_database("res_epoch").await else {
        return;
    };
    let Some(redis) = common::redis_url().await else {
        return;
    };
    users_shared_rebuild(&url, &redis, "res-epoch-pg").await;
}

/// The capacity alarm and auto-rebuild for a resource (002 §六): `keys`
/// past its filter's capacity raise the alarm once and, with
/// `bloom_auto_rebuild` (from `[cache]`, or its own), a rebuild sized for
/// twice the items clears it; with its own `bloom_auto_rebuild = false`
/// the alarm stays and nothing rebuilds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resource_past_capacity_raises_its_alarm_and_rebuilds() {
    let dir = tempfile::tempdir().unwrap();
    let url = common::sqlite_url(&dir);
    users_table(&url).await;
    let mut config = common::config(&url, None, "res-alarm");
    let mut grows = resource("users", false);
    grows.bloom_expected = 100;
    let mut stays = resource("members", false);
    stays.bloom_expected = 100;
    stays.bloom_auto_rebuild = Some(false);
    config.resources = vec![grows, stays];
    config.cache.bloom_monitor_ms = 3_600_000;
    let s = TestServer::start(config, 0).await;
    ready(&s).await;
    // 200 rows: each filter is sized for max(100, 1.25 × 200) = 250. Then
    // 60 more, committed by the application and told with `keys`.
    let extra: Vec<String> = (0..60).map(|i| format!("n{i:03}")).collect();
    let values: Vec<String> = extra
        .iter()
        .enumerate()
        .map(|(i, k)| format!("('{k}', 'new', {})", 400_000 + i))
        .collect();
    exec(
        &url,
        &[format!(
            "INSERT INTO users (id, name, seq) VALUES {}",
            values.join(", ")
        )],
    )
    .await;
    let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
    for name in ["users", "members"] {
        assert_eq!(users(&s, name).shield().stats().capacity, 250, "{name}");
        for part in extra.chunks(30) {
            let (status, body) = post(&s, &format!("/api/{name}/keys"), part).await;
            assert_eq!(status, 200, "{body}");
        }
    }
    let grows = Arc::clone(users(&s, "users").shield());
    eventually(10, "users' auto-rebuild completes", || {
        let g = Arc::clone(&grows);
        async move {
            let st = g.stats();
            st.rebuilds == 2 && !st.rebuilding && !st.rebuild_pending
        }
    })
    .await;
    let st = grows.stats();
    assert_eq!(st.alarms_raised, 1, "{st:?}");
    assert!(st.alarm.is_none(), "{st:?}");
    assert!(st.capacity >= 400, "sized for twice the items: {st:?}");
    let stays = users(&s, "members").shield().stats();
    assert_eq!(stays.alarms_raised, 1, "{stays:?}");
    assert!(stays.alarm.is_some() && stays.rebuilds == 1, "{stays:?}");
    // Every key still answers: the rebuild scanned the table, which holds
    // the rows told.
    assert_eq!(s.get("/api/users/u000001").await.0, 200);
    let (_, body) = post(&s, "/api/users/exists", &extra[..30]).await;
    assert!(
        body["exists"].as_array().unwrap().iter().all(|e| e == true),
        "{body}"
    );
    s.stop().await;
}

/// The SKU table has the watch every resource has (`cache.watch_column`):
/// a row another program inserts with a plain SQL connection, and names
/// to nobody, is admitted on every watching instance without a call; an
/// instance without the watch still refuses it (so the watch is what
/// admitted it). A watched table keeps its own rebuilds: it stores no
/// start-up epoch, adopts none, and its warm's rebuild shares none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sku_table_has_a_watch_column_too() {
    let Some(url) = common::mysql_database("sku_watch").await else {
        return;
    };
    let redis = common::redis_url().await;
    if let Some(r) = &redis {
        common::redis_clear(r, "bgtest:sku-watch:").await;
    }
    let watched = || {
        let mut c = common::config(&url, redis.as_deref(), "sku-watch");
        c.cache.watch_column = Some("id".into());
        c.cache.watch_every_ms = 50;
        c
    };
    // A column the table lacks stops the start, naming the key.
    let mut bad = watched();
    bad.cache.watch_column = Some("nope".into());
    let err = bloomgate_service::AppState::connect(&bad)
        .await
        .expect_err("no such column")
        .to_string();
    assert!(
        err.contains("cache.watch_column") && err.contains("nope"),
        "{err}"
    );
    let a = TestServer::start(watched(), 100).await;
    let b = TestServer::start(watched(), 0).await;
    let plain = TestServer::start(common::config(&url, redis.as_deref(), "sku-watch"), 0).await;
    let absent = (1_000..1_000_000i64)
        .find(|&id| {
            [&a, &b, &plain]
                .iter()
                .all(|s| s.state.skus.shield().probe(id) == Verdict::Reject)
        })
        .unwrap();
    let path = format!("/api/seckill/{absent}");
    assert_eq!(a.get(&path).await.0, 404);
    exec(
        &url,
        &[format!(
            "INSERT INTO skus (id, name, original_price, seckill_price, stock, seckill_start, seckill_end, updated_at) \
             VALUES ({absent}, 'inserted elsewhere', 100, 50, 7, 0, 0, 0)"
        )],
    )
    .await;
    for s in [&a, &b] {
        eventually(5, "the watch admits the row", || async {
            s.get(&path).await.0 == 200
        })
        .await;
        let stats = s.stats().await;
        assert!(
            stats["resources"]["skus"]["calls"]["watched"].as_u64() >= Some(1),
            "{}",
            stats["resources"]["skus"]
        );
    }
    assert_eq!(
        plain.get(&path).await.0,
        404,
        "without the watch nobody told this instance"
    );
    let asked = |s: serde_json::Value| s["outbox"]["rebuilds"].as_u64().unwrap();
    let asked_before = asked(b.stats().await);
    let (status, warm) = a
        .send(
            Method::POST,
            "/api/skus/warm",
            Some(r#"{"limit":10,"rebuild_bloom":true}"#),
        )
        .await;
    assert_eq!(status, 200, "{warm}");
    assert!(
        warm["epoch"].is_null(),
        "a watched table shares no rebuild: {warm}"
    );
    assert_eq!(a.get(&path).await.0, 200, "the rebuild scanned the row");
    if redis.is_some() {
        // B was asked, through the outbox, to rebuild from SQL instead.
        eventually(5, "B is asked to rebuild", || async {
            asked(b.stats().await) > asked_before
        })
        .await;
        for s in [&a, &b] {
            let stats = s.stats().await;
            assert_eq!(
                (
                    stats["resources"]["skus"]["epochs"]["published"].as_u64(),
                    stats["changes"]["rebuilds_adopted"].as_u64()
                ),
                (Some(0), Some(0)),
                "{}",
                stats["resources"]["skus"]
            );
        }
    }
    for s in [a, b, plain] {
        s.stop().await;
    }
}

/// A value cached under one column set is never served under another:
/// `columns` narrowed to hide a field (a restart with the new config)
/// reads no value the wider set cached, though Redis keeps it for an
/// hour. The column set is part of the values' namespace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_narrowed_column_set_never_serves_a_wider_cached_row() {
    let Some(redis) = common::redis_url().await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let url = common::sqlite_url(&dir);
    users_table(&url).await;
    let mut c = common::config(&url, Some(&redis), "narrowed");
    common::redis_clear(&redis, &c.cache.redis_prefix).await;
    c.resources.push(resource("users", false));
    let wide = TestServer::start(c.clone(), 0).await;
    for _ in 0..2 {
        let (status, body) = wide.get("/api/users/u000001").await;
        assert_eq!((status, body["age"].is_null()), (200, false), "{body}");
    }
    let mut conn = common::redis_conn(&redis).await;
    let cached = common::redis_keys(&mut conn, &c.cache.redis_prefix).await;
    assert!(
        cached.iter().any(|k| k.ends_with(":u000001")),
        "cached in Redis: {cached:?}"
    );
    wide.stop().await;

    c.resources[0].columns = vec!["id".into(), "name".into()];
    let narrow = TestServer::start(c, 0).await;
    for _ in 0..2 {
        let (status, body) = narrow.get("/api/users/u000001").await;
        assert_eq!(status, 200);
        let fields: Vec<&String> = body.as_object().unwrap().keys().collect();
        assert_eq!(fields, ["id", "name"], "{body}");
    }
    narrow.stop().await;
}

/// The epoch `users`'s filter came from or went to, on `s`.
async fn held(s: &TestServer) -> i64 {
    counter(&s.stats().await, &["resources", "users", "epochs", "held"])
}

/// A SQLite `users` table and a config sharing `users`'s rebuilds under
/// `prefix` in `redis` (cleared first); the directory holds the database.
async fn epochs_setup(redis: &str, prefix: &str) -> (tempfile::TempDir, String, Config) {
    let dir = tempfile::tempdir().unwrap();
    let url = common::sqlite_url(&dir);
    users_table(&url).await;
    let full_prefix = format!("bgtest:{prefix}:");
    common::redis_clear(redis, &full_prefix).await;
    let mut c = common::config(&url, Some(redis), prefix);
    assert_eq!(c.cache.redis_prefix, full_prefix);
    c.resources = vec![resource("users", false)];
    (dir, url, c)
}

/// After Redis lost bloomgate's state (a flush of its prefix), epoch
/// numbers start at 1 again: an instance that held a higher one still
/// adopts the next shared rebuild instead of calling it old.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_rebuild_after_redis_lost_its_epochs_reaches_every_instance() {
    let Some(redis) = common::redis_url().await else {
        return;
    };
    let (_dir, url, c) = epochs_setup(&redis, "epochs-flushed").await;
    let full_prefix = c.cache.redis_prefix.clone();
    let a = TestServer::start(c.clone(), 0).await;
    ready(&a).await;
    let b = TestServer::start(c, 0).await;
    ready(&b).await;
    let warm = || async {
        let (status, body) = a
            .send(
                Method::POST,
                "/api/users/warm",
                Some(r#"{"limit":1,"rebuild_bloom":true}"#),
            )
            .await;
        assert_eq!(status, 200, "{body}");
        body["epoch"].as_u64().expect("shared as an epoch")
    };
    for _ in 0..2 {
        let epoch = warm().await as i64;
        eventually(5, "B adopts", || async { held(&b).await == epoch }).await;
    }
    assert!(held(&b).await >= 3, "B holds a high number");

    // Redis loses everything under the prefix; a row arrives behind the
    // service's back, which only a rebuild finds.
    common::redis_clear(&redis, &full_prefix).await;
    exec(
        &url,
        &["INSERT INTO users (id, name, seq) VALUES ('after1', 'after', 400000)".into()],
    )
    .await;
    let ub = users(&b, "users");
    assert_eq!(ub.shield().probe(text("after1")), Verdict::Reject);
    let epoch = warm().await;
    assert!(epoch < 3, "numbered afresh: {epoch}");
    eventually(5, "B adopts the rebuild numbered afresh", || async {
        b.get("/api/users/after1").await.0 == 200
    })
    .await;
    assert_eq!(held(&b).await, epoch as i64);
    a.stop().await;
    b.stop().await;
}

/// The case the counter going back cannot tell: B holds epoch 1 (A's
/// start-up filter), Redis loses bloomgate's state, and the next shared
/// rebuild is numbered 1 again. Redis's identity key (`{prefix}redis:id`)
/// is new, so B follows the numbers afresh and adopts it; before, B
/// called it the epoch it held and answered 404 for a row only that
/// rebuild holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_rebuild_numbered_as_the_held_one_after_a_flush_is_adopted() {
    let Some(redis) = common::redis_url().await else {
        return;
    };
    let (_dir, url, c) = epochs_setup(&redis, "epochs-era").await;
    let full_prefix = c.cache.redis_prefix.clone();
    let a = TestServer::start(c.clone(), 0).await;
    ready(&a).await;
    eventually(5, "A's start-up filter stored as epoch 1", || async {
        held(&a).await == 1
    })
    .await;
    let b = TestServer::start(c, 0).await;
    ready(&b).await;
    assert_eq!(held(&b).await, 1, "B adopted it");

    common::redis_clear(&redis, &full_prefix).await;
    exec(
        &url,
        &["INSERT INTO users (id, name, seq) VALUES ('after2', 'after', 400001)".into()],
    )
    .await;
    let ub = users(&b, "users");
    assert_eq!(ub.shield().probe(text("after2")), Verdict::Reject);
    let (status, body) = a
        .send(
            Method::POST,
            "/api/users/warm",
            Some(r#"{"limit":1,"rebuild_bloom":true}"#),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["epoch"].as_u64(), Some(1), "numbered afresh: {body}");
    eventually(
        5,
        "B adopts the rebuild numbered as the one it held",
        || async { b.get("/api/users/after2").await.0 == 200 },
    )
    .await;
    a.stop().await;
    b.stop().await;
}
