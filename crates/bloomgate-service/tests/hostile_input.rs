//! Hostile input, table-driven: every bad request gets the one JSON error
//! shape with the right status, never a panic, a 500 or an echo of the
//! whole input. Also the admin scheme, the rate limit, the OpenAPI
//! document and the graceful shutdown.

mod common;

use std::time::{Duration, Instant};

use common::{sku_body, TestServer};

async fn server(prefix: &str, f: impl FnOnce(&mut bloomgate_service::Config)) -> TestServer {
    let dir = tempfile::tempdir().unwrap();
    let mut config = common::config(&common::sqlite_url(&dir), None, prefix);
    config.http.body_limit_bytes = 16 * 1024;
    f(&mut config);
    let server = TestServer::start(config, 100).await;
    // The directory lives as long as the test process; SQLite keeps its file.
    std::mem::forget(dir);
    server
}

struct Case {
    method: &'static str,
    path: String,
    content_type: Option<&'static str>,
    body: Vec<u8>,
    status: u16,
    code: &'static str,
}

fn case(
    method: &'static str,
    path: &str,
    content_type: Option<&'static str>,
    body: impl Into<Vec<u8>>,
    status: u16,
    code: &'static str,
) -> Case {
    Case {
        method,
        path: path.to_string(),
        content_type,
        body: body.into(),
        status,
        code,
    }
}

const JSON: Option<&str> = Some("application/json");

#[tokio::test]
async fn every_bad_input_gets_the_json_error_shape_and_the_right_status() {
    let server = server("hostile", |_| {}).await;
    let long = "9".repeat(5000);
    let bomb = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    let deep = format!(r#"{{"limit":{}1{}}}"#, "[".repeat(200), "]".repeat(200));
    let big = format!(r#"{{"limit":1,"x":"{}"}}"#, "a".repeat(20_000));
    let good_sku = sku_body(Some(500), "ok", 100);
    let cases = [
        // Routes and methods.
        case("GET", "/no/such/route", None, "", 404, "not_found"),
        case(
            "DELETE",
            "/api/seckill/1",
            None,
            "",
            405,
            "method_not_allowed",
        ),
        case(
            "PUT",
            "/api/cache/stats",
            None,
            "",
            405,
            "method_not_allowed",
        ),
        case(
            "GET",
            "/api/cache/warm",
            None,
            "",
            405,
            "method_not_allowed",
        ),
        // Path ids.
        case("GET", "/api/seckill/-5", None, "", 400, "bad_request"),
        case("GET", "/api/seckill/0", None, "", 400, "bad_request"),
        case("GET", "/api/seckill/abc", None, "", 400, "bad_request"),
        case("GET", "/api/seckill/1.5", None, "", 400, "bad_request"),
        case(
            "GET",
            &format!("/api/seckill/{long}"),
            None,
            "",
            400,
            "bad_request",
        ),
        case(
            "GET",
            "/api/seckill/9223372036854775808",
            None,
            "",
            400,
            "bad_request",
        ),
        case("GET", "/api/seckill/1%2F2", None, "", 400, "bad_request"),
        case("GET", "/api/seckill/%00", None, "", 400, "bad_request"),
        case("GET", "/api/seckill/%FF%FE", None, "", 400, "bad_request"),
        case("GET", "/api/seckill/%20", None, "", 400, "bad_request"),
        case("DELETE", "/api/skus/-1", None, "", 400, "bad_request"),
        // Bodies.
        case(
            "POST",
            "/api/cache/warm",
            JSON,
            "{not json",
            400,
            "bad_request",
        ),
        case(
            "POST",
            "/api/cache/warm",
            JSON,
            r#"{"limit":"#,
            400,
            "bad_request",
        ),
        case(
            "POST",
            "/api/cache/warm",
            JSON,
            r#"{"limit":"ten"}"#,
            400,
            "bad_request",
        ),
        case(
            "POST",
            "/api/cache/warm",
            JSON,
            r#"{"limit":-1}"#,
            400,
            "bad_request",
        ),
        case(
            "POST",
            "/api/cache/warm",
            JSON,
            r#"{"limitt":5}"#,
            400,
            "bad_request",
        ),
        case(
            "POST",
            "/api/cache/warm",
            JSON,
            r#"[1,2]"#,
            400,
            "bad_request",
        ),
        case("POST", "/api/cache/warm", JSON, "[]", 400, "bad_request"),
        case(
            "POST",
            "/api/skus",
            JSON,
            r#"[1,"x",1,1,1,0,1]"#,
            400,
            "bad_request",
        ),
        case(
            "POST",
            "/api/cache/warm",
            JSON,
            bomb.clone(),
            413,
            "payload_too_large",
        ),
        case("POST", "/api/cache/warm", JSON, deep, 400, "bad_request"),
        case("POST", "/api/skus", JSON, &bomb[..8000], 400, "bad_request"),
        case(
            "POST",
            "/api/skus",
            JSON,
            r#"{"name":"x"}"#,
            400,
            "bad_request",
        ),
        case("POST", "/api/skus", JSON, "", 400, "bad_request"),
        case("PUT", "/api/skus/5", JSON, "\u{0}\u{1}", 400, "bad_request"),
        // Size and type.
        case(
            "POST",
            "/api/cache/warm",
            JSON,
            big,
            413,
            "payload_too_large",
        ),
        case(
            "POST",
            "/api/skus",
            Some("text/plain"),
            good_sku.clone(),
            415,
            "unsupported_media_type",
        ),
        case(
            "POST",
            "/api/skus",
            None,
            good_sku.clone(),
            415,
            "unsupported_media_type",
        ),
        case(
            "PUT",
            "/api/skus/5",
            Some("application/x-www-form-urlencoded"),
            good_sku,
            415,
            "unsupported_media_type",
        ),
    ];
    for c in cases {
        let mut req = server
            .client
            .request(c.method.parse().unwrap(), server.url(&c.path));
        if let Some(t) = c.content_type {
            req = req.header("content-type", t);
        }
        let r = req.body(c.body.clone()).send().await.unwrap();
        let status = r.status().as_u16();
        let content_type = r
            .headers()
            .get("content-type")
            .map(|v| v.to_str().unwrap().to_string());
        let text = r.text().await.unwrap();
        let what = format!(
            "{} {} ({} byte body)",
            c.method,
            &c.path[..c.path.len().min(40)],
            c.body.len()
        );
        assert_eq!(status, c.status, "{what}: {text}");
        assert_eq!(content_type.as_deref(), Some("application/json"), "{what}");
        let body: serde_json::Value =
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("{what}: {e}: {text}"));
        assert_eq!(body["error"], c.code, "{what}: {text}");
        let message = body["message"].as_str().unwrap();
        assert!(
            !message.is_empty() && message.chars().count() <= 300,
            "{what}: {message}"
        );
        assert!(
            !message.contains(&"9".repeat(65)),
            "{what} echoes its input"
        );
    }
    // Defaults are accepted: an empty body or `null` is `{}`.
    for body in ["", "null"] {
        let r = server
            .client
            .post(server.url("/api/cache/warm"))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{body:?}");
    }
    server.stop().await;
}

#[tokio::test]
async fn the_bearer_scheme_is_case_insensitive_and_the_token_exact() {
    let server = server("hostile-auth", |c| c.admin_token = Some("s3cret".into())).await;
    let call = |auth: &'static str| {
        server
            .client
            .post(server.url("/api/cache/warm"))
            .header("authorization", auth)
            .send()
    };
    for ok in [
        "Bearer s3cret",
        "bearer s3cret",
        "BEARER s3cret",
        "Bearer  s3cret ",
    ] {
        assert_eq!(call(ok).await.unwrap().status(), 200, "{ok:?}");
    }
    for (bad, status) in [
        ("Bearer s3cre", 403),
        ("Bearer s3cret2", 403),
        ("Bearer S3CRET", 403),
        ("Basic s3cret", 401),
        ("s3cret", 401),
        ("Bearer", 401),
    ] {
        let r = call(bad).await.unwrap();
        assert_eq!(r.status(), status, "{bad:?}");
        let body: serde_json::Value = r.json().await.unwrap();
        assert!(body["error"] == "unauthorized" || body["error"] == "forbidden");
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_optional_rate_limit_answers_429_json_on_the_read_route_only() {
    let server = server("hostile-rate", |c| {
        c.http.rate_limit_per_sec = 5;
        c.http.rate_limit_burst = 5;
    })
    .await;
    // Seed 000's route and its alias share one bucket per client.
    let mut statuses = Vec::new();
    for i in 0..20 {
        let path = if i % 2 == 0 {
            "/api/seckill/1"
        } else {
            "/api/skus/1"
        };
        let r = server.client.get(server.url(path)).send().await.unwrap();
        statuses.push(r.status().as_u16());
        if r.status() == 429 {
            let wait: u64 = r.headers()["retry-after"]
                .to_str()
                .unwrap()
                .parse()
                .unwrap();
            // 5 a second: the next token is at most a second away.
            assert_eq!(wait, 1, "retry-after");
            let body: serde_json::Value = r.json().await.unwrap();
            assert_eq!(body["error"], "too_many_requests");
        }
    }
    let limited = statuses.iter().filter(|&&s| s == 429).count();
    assert!(statuses[..5].iter().all(|&s| s == 200), "{statuses:?}");
    assert!(limited >= 10, "{statuses:?}");
    // Other routes are not limited.
    for _ in 0..20 {
        assert_eq!(server.get("/api/cache/stats").await.0, 200);
    }
    server.stop().await;
}

#[tokio::test]
async fn the_openapi_document_describes_every_route() {
    let server = server("hostile-openapi", |_| {}).await;
    let (status, doc) = server.get("/openapi.json").await;
    assert_eq!(status, 200);
    assert!(doc["openapi"].as_str().unwrap().starts_with("3."));
    let paths = doc["paths"].as_object().unwrap();
    for (path, method) in [
        ("/api/seckill/{skuId}", "get"),
        ("/api/cache/warm", "post"),
        ("/api/cache/stats", "get"),
        ("/api/skus", "post"),
        ("/api/skus/{skuId}", "get"),
        ("/api/skus/{skuId}", "put"),
        ("/api/skus/{skuId}", "delete"),
        ("/api/ping", "get"),
    ] {
        assert!(paths[path][method].is_object(), "{method} {path} missing");
    }
    for schema in ["Sku", "SkuInput", "ErrorBody", "WarmRequest"] {
        assert!(doc["components"]["schemas"][schema].is_object(), "{schema}");
    }
    server.stop().await;
}

/// Starts `run` on a port-0 listener; returns the base URL, a trigger for
/// the shutdown, and the server task.
async fn run_with_shutdown(
    grace_secs: u64,
) -> (
    String,
    bloomgate_service::AppState,
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<std::io::Result<()>>,
) {
    let dir = tempfile::tempdir().unwrap();
    let mut config = common::config(&common::sqlite_url(&dir), None, "shutdown");
    config.http.shutdown_grace_secs = grace_secs;
    config.seed_if_empty = 100;
    let state = bloomgate_service::AppState::connect(&config).await.unwrap();
    if let Some(t) = bloomgate_service::prepare(&state, &config).await.unwrap() {
        t.await.unwrap();
    }
    std::mem::forget(dir);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(bloomgate_service::run(listener, state.clone(), async {
        let _ = rx.await;
    }));
    (base, state, tx, task)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_drains_in_flight_requests_and_stops_accepting() {
    let (base, state, stop, task) = run_with_shutdown(10).await;
    let pause = state.skus.after_read().arm(7);
    let in_flight = tokio::spawn(reqwest::get(format!("{base}/api/seckill/7")));
    pause.reached().await;
    stop.send(()).unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !task.is_finished(),
        "the server waits for the request in flight"
    );
    // New connections are refused once shutdown began.
    let refused = reqwest::Client::new()
        .get(format!("{base}/api/ping"))
        .timeout(Duration::from_secs(2))
        .send()
        .await;
    assert!(refused.is_err(), "accepted a request after shutdown began");
    pause.resume();
    let answer = in_flight.await.unwrap().unwrap();
    assert_eq!(answer.status(), 200);
    tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .expect("the server stops once drained")
        .unwrap()
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_stops_waiting_for_requests_still_running_after_the_grace_period() {
    let (base, state, stop, task) = run_with_shutdown(1).await;
    let pause = state.skus.after_read().arm(9);
    let stuck = tokio::spawn(reqwest::get(format!("{base}/api/seckill/9")));
    pause.reached().await;
    let started = Instant::now();
    stop.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .expect("the grace period bounds the drain")
        .unwrap()
        .unwrap();
    // The drain waited out the 1 s grace period and no longer (the 5 s
    // timeout above is the upper bound: a drain that waits for the stuck
    // request would never end).
    let took = started.elapsed();
    assert!(took >= Duration::from_millis(900), "{took:?}");
    // `run` gave up on it; the binary then exits, closing the connection.
    // In this process the connection task lives on until its load resumes.
    pause.resume();
    let _ = stuck.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_past_the_timeout_gets_a_json_503() {
    let server = server("hostile-timeout", |c| c.http.request_timeout_ms = 200).await;
    // An earlier request on the same kept connection, which waited on
    // SQL (so its timeout was armed) and whose deadline passes before the
    // next one starts: the next one gets a deadline of its own.
    assert_eq!(server.get("/api/seckill/12").await.0, 200);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let pause = server.state.skus.after_read().arm(11);
    let started = Instant::now();
    // The load stays paused until the end: only the 200 ms request timeout
    // can answer, so the client's own 10 s limit tells the two apart.
    let r = server
        .client
        .get(server.url("/api/seckill/11"))
        .timeout(Duration::from_secs(10))
        .send()
        .await
        .expect("answered by the request timeout");
    let took = started.elapsed();
    assert_eq!(r.status(), 503);
    let body: serde_json::Value = r.json().await.unwrap();
    assert_eq!(body["error"], "unavailable");
    assert!(took >= Duration::from_millis(200), "{took:?}");
    // The load itself was not cancelled: once resumed, the id is cached.
    pause.resume();
    common::eventually(5, "the abandoned load completes and caches", || async {
        server.state.skus.cached_locally(&11)
    })
    .await;
    assert_eq!(server.get("/api/seckill/11").await.0, 200);
    server.stop().await;
}

/// A warm with `rebuild_bloom` whose rebuild outlasts the request timeout
/// (a 10^8-row scan takes longer than 30 s) is not answered 503 "retry":
/// an operator who retried would queue another rebuild. It answers seed
/// 000's 200 with the rebuild once the rebuild is done; a read past the
/// timeout still gets its 503.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_warm_longer_than_the_request_timeout_answers_with_its_rebuild() {
    let server = server("hostile-long-warm", |c| c.http.request_timeout_ms = 200).await;
    for path in ["/api/cache/warm", "/api/skus/warm"] {
        let pause = server.state.skus.shield().after_scan.arm(0);
        let warm = {
            let client = server.client.clone();
            let url = server.url(path);
            tokio::spawn(async move {
                client
                    .post(url)
                    .header("content-type", "application/json")
                    .body(r#"{"limit":10,"rebuild_bloom":true}"#)
                    .timeout(Duration::from_secs(20))
                    .send()
                    .await
            })
        };
        tokio::time::timeout(Duration::from_secs(10), pause.reached())
            .await
            .expect("the warm's rebuild reaches the pause");
        // Three times the request timeout.
        tokio::time::sleep(Duration::from_millis(600)).await;
        assert!(!warm.is_finished(), "{path} answered before its rebuild");
        pause.resume();
        let r = warm.await.unwrap().expect("answered");
        assert_eq!(r.status(), 200, "{path}");
        let body: serde_json::Value = r.json().await.unwrap();
        assert!(
            body["rebuild_bloom"]["added"].as_u64().unwrap() > 0,
            "{body}"
        );
    }
    server.stop().await;
}

/// Without `admin_token`, an admin call reaching loopback from a page
/// elsewhere (DNS rebinding: `Host` is the page's name; a cross-site
/// form: `Origin` is the page's) gets a JSON 403; seed 000's `curl -X POST
/// localhost:8080/api/cache/warm` (Host `localhost:PORT`, no Origin) and
/// the reads are unaffected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_calls_without_a_token_come_from_this_machine_only() {
    let server = server("hostile-host", |_| {}).await;
    let port = server.base.rsplit(':').next().unwrap().to_owned();
    let warm = |host: String, origin: Option<&'static str>| {
        let mut req = server
            .client
            .post(server.url("/api/cache/warm"))
            .header("content-type", "application/json")
            .header("host", host)
            .body(r#"{"limit":1}"#);
        if let Some(o) = origin {
            req = req.header("origin", o);
        }
        req.send()
    };
    let r = warm(format!("localhost:{port}"), None).await.unwrap();
    assert_eq!(r.status(), 200);
    for (host, origin) in [
        (format!("rebound.attacker.example:{port}"), None),
        (format!("127.0.0.1:{port}"), Some("http://attacker.example")),
    ] {
        let r = warm(host.clone(), origin).await.unwrap();
        assert_eq!(r.status(), 403, "{host} {origin:?}");
        let body: serde_json::Value = r.json().await.unwrap();
        assert_eq!(body["error"], "forbidden", "{body}");
    }
    let r = server
        .client
        .get(server.url("/api/seckill/1"))
        .header("host", "rebound.attacker.example")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "reads are not admin calls");
    server.stop().await;
}

/// Slow clients: 300 connections that each send the start of a request
/// and nothing more, against a service allowed 100 connections with a
/// 500 ms header timeout. Each is closed after the timeout, and a real
/// client is answered meanwhile (it waits for a free slot, never for a
/// slow client to finish).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_clients_do_not_hold_the_service() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let server = server("hostile-slow", |c| {
        c.http.header_timeout_ms = 500;
        c.http.max_connections = 100;
    })
    .await;
    let addr = server.base.trim_start_matches("http://").to_owned();
    let mut slow = Vec::new();
    for _ in 0..300 {
        let mut s = tokio::net::TcpStream::connect(&addr).await.unwrap();
        s.write_all(b"GET /api/seckill/1 HTTP/1.1\r\n")
            .await
            .unwrap();
        slow.push(s);
    }
    let started = Instant::now();
    let r = server
        .client
        .get(server.url("/api/seckill/1"))
        .timeout(Duration::from_secs(10))
        .send()
        .await
        .expect("a real client is answered");
    assert_eq!(r.status(), 200);
    let took = started.elapsed();
    eprintln!("a real client beside 300 slow ones answered after {took:?}");
    assert!(took < Duration::from_secs(5), "{took:?}");
    // The slow connections the server took are closed after the header
    // timeout (an EOF, or a 408 first); none is held open.
    let mut closed = 0;
    for s in &mut slow {
        let mut buf = Vec::new();
        if let Ok(Ok(_)) =
            tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut buf)).await
        {
            closed += 1;
        }
    }
    assert_eq!(closed, 300, "every slow connection closed by the server");
    server.stop().await;
}

/// The API listener's connection cap: with `http.max_connections = 100`,
/// 100 held connections leave the 101st unanswered (it waits in the
/// kernel's backlog, taking no descriptor from SQL and Redis), and it is
/// answered once one of them closes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_connection_cap_holds_and_frees_a_place_when_one_closes() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let server = server("hostile-cap", |c| {
        c.http.header_timeout_ms = 30_000;
        c.http.max_connections = 100;
    })
    .await;
    let addr = server.base.trim_start_matches("http://").to_owned();
    let mut held = Vec::new();
    for _ in 0..100 {
        let mut s = tokio::net::TcpStream::connect(&addr).await.unwrap();
        // A whole request, answered: the connection is then held open,
        // idle, as a keep-alive client's is.
        s.write_all(b"GET /api/seckill/1 HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let mut first = [0u8; 12];
        s.read_exact(&mut first).await.unwrap();
        assert_eq!(&first, b"HTTP/1.1 200");
        held.push(s);
    }
    let mut late = tokio::net::TcpStream::connect(&addr).await.unwrap();
    late.write_all(b"GET /api/seckill/1 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut answer = Vec::new();
    let waited =
        tokio::time::timeout(Duration::from_millis(300), late.read_to_end(&mut answer)).await;
    assert!(
        waited.is_err() && answer.is_empty(),
        "the 101st was served past the cap: {}",
        String::from_utf8_lossy(&answer)
    );
    drop(held.pop());
    tokio::time::timeout(Duration::from_secs(5), late.read_to_end(&mut answer))
        .await
        .expect("answered once a place was free")
        .unwrap();
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    drop(held);
    server.stop().await;
}

/// The header timeout counts afresh for each request of a keep-alive
/// connection: requests spaced closer than the timeout are all answered
/// (one comes after the first wait's deadline, which must not close the
/// connection), and the connection is closed once it idles past it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_header_timeout_counts_from_each_request_of_a_kept_connection() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let server = server("hostile-kept", |c| c.http.header_timeout_ms = 1000).await;
    let addr = server.base.trim_start_matches("http://").to_owned();
    let mut s = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let mut answered = Vec::new();
    for i in 0..3 {
        if i > 0 {
            tokio::time::sleep(Duration::from_millis(600)).await;
        }
        s.write_all(b"GET /api/seckill/1 HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut byte))
                .await
                .expect("an answer")
                .unwrap();
            assert_eq!(
                n,
                1,
                "request {i}: closed after {:?}",
                String::from_utf8_lossy(&head)
            );
            head.push(byte[0]);
        }
        let head = String::from_utf8(head).unwrap();
        let length: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length: "))
            .expect("a length")
            .parse()
            .unwrap();
        let mut body = vec![0; length];
        s.read_exact(&mut body).await.unwrap();
        answered.push(head.lines().next().unwrap().to_owned());
    }
    assert_eq!(answered, vec!["HTTP/1.1 200 OK"; 3]);
    let started = Instant::now();
    let mut rest = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut rest))
        .await
        .expect("closed after the header timeout")
        .unwrap();
    // The wait began as the third answer was written, just before
    // `started`: not closed early.
    assert!(
        started.elapsed() >= Duration::from_millis(800),
        "{:?}",
        started.elapsed()
    );
    server.stop().await;
}
