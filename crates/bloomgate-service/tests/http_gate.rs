//! The HTTP gate (`[gate]`): bloomgate as a reverse proxy in front of an
//! API of the test's own (`common::upstream`, which counts what reaches
//! it), and as an auth-request check. Real SQLite and MariaDB tables,
//! written by another program (capture triggers).

mod common;

use std::time::Duration;

use bloomgate_service::cache::CLOCK_MARGIN_MS;
use bloomgate_service::config::proxy::ProxyRoute;
use bloomgate_service::config::{Capture, Config};
use common::upstream::{raw, rss, status_of, Upstream};
use common::{eventually, TestServer};

const ROUTE: &str = "/api/profiles/{key}";

fn route() -> ProxyRoute {
    toml::from_str(&format!("path = \"{ROUTE}\"\nresource = \"users\"\n")).unwrap()
}

/// The gate over a `users` table holding `ids`, in front of `up`.
async fn gate_over(
    url: &str,
    ids: &[&str],
    up: &Upstream,
    tweak: impl FnOnce(&mut Config),
) -> (TestServer, sqlx::AnyPool) {
    let writer = common::sql_pool(url).await;
    common::users_table(&writer, ids).await;
    let mut c = gate_config(common::config(url, None, "http-gate"), up);
    tweak(&mut c);
    (started(c).await, writer)
}

/// `c` with the captured `users` resource and the gate over it.
fn gate_config(mut c: Config, up: &Upstream) -> Config {
    c.demo = Some(false);
    let mut users = common::users_resource("users");
    users.capture = Capture::Triggers;
    c.resources.push(users);
    c.gate.listen = Some("127.0.0.1:0".parse().unwrap());
    c.gate.upstream = up.url();
    c.gate.routes.push(route());
    c
}

async fn started(c: Config) -> TestServer {
    let s = TestServer::start(c, 0).await;
    eventually(10, "ready", || async { s.get("/readyz").await.0 == 200 }).await;
    s
}

/// The public name of the API the gates front.
const HOST: &str = "api.test";

fn gate_url(s: &TestServer, path: &str) -> String {
    format!("http://{}{path}", s.gate.unwrap())
}

/// A GET through `s`'s gate, with the `Host` a load balancer in front of
/// every instance would send.
async fn get(s: &TestServer, path: &str) -> (u16, String) {
    let r = s.client.get(gate_url(s, path)).header("host", HOST);
    let r = r.send().await.unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn absent_keys_never_reach_the_upstream_and_real_ones_always_do() {
    let dir = tempfile::tempdir().unwrap();
    let url = common::sqlite_url(&dir);
    let up = Upstream::start().await;
    let (s, writer) = gate_over(&url, &["u1", "u2", "a/b"], &up, |_| {}).await;

    // Absent: the gate answers, the upstream never sees it.
    let (status, body) = get(&s, "/api/profiles/nobody").await;
    assert_eq!(status, 404, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["error"], "not_found");
    assert_eq!(up.seen.total(), 0, "the upstream saw a refused key");
    // HEAD is judged too, and answered without a body.
    let r = s
        .client
        .head(gate_url(&s, "/api/profiles/nobody"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    assert_eq!(up.seen.total(), 0);

    // Present: forwarded with its query string untouched.
    let (status, body) = get(&s, "/api/profiles/u1?x=%2F&y=1").await;
    assert_eq!(status, 200, "{body}");
    let echo: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(echo["target"], "/api/profiles/u1?x=%2F&y=1");
    assert_eq!(up.seen.at("/api/profiles/u1"), 1);

    // Created by another program: admitted through capture, forwarded.
    sqlx::query("INSERT INTO users VALUES ('u9', 'user u9')")
        .execute(&writer)
        .await
        .unwrap();
    eventually(5, "u9 forwarded", || async {
        get(&s, "/api/profiles/u9").await.0 == 200
    })
    .await;
    assert!(up.seen.at("/api/profiles/u9") >= 1);

    // The key is decoded exactly once: `a%2Fb` is the key `a/b`.
    assert_eq!(get(&s, "/api/profiles/a%2Fb").await.0, 200);
    assert_eq!(up.seen.at("/api/profiles/a%2Fb"), 1, "the original target");
    assert_eq!(get(&s, "/api/profiles/u%31").await.0, 200, "u%31 is u1");
    assert_eq!(
        get(&s, "/api/profiles/u%2531").await.0,
        404,
        "u%2531 is u%31"
    );

    // Not judged: other methods, other paths, keys the column cannot
    // hold (a control character), a trailing slash.
    let before = up.seen.total();
    let r = s
        .client
        .post(gate_url(&s, "/api/profiles/nobody"))
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    for path in [
        "/api/other/nobody",
        "/api/profiles/nobody;jsessionid=1",
        "/api/profiles/%01",
        "/api/profiles/nobody/",
        "/api/profiles/%zz",
    ] {
        assert_eq!(get(&s, path).await.0, 200, "{path} is forwarded");
    }
    assert_eq!(up.seen.total(), before + 6);

    // Normalised before matching, so no spelling gets around the gate.
    for path in [
        "//api//profiles/nobody",
        "/api/./profiles/nobody",
        "/api/x/../profiles/nobody",
        "/api/x/%2e%2e/profiles/nobody",
        "/api/profil%65s/nobody",
    ] {
        let (status, _) = get(&s, path).await;
        assert_eq!(status, 404, "{path}");
    }
    assert_eq!(
        up.seen.total(),
        before + 6,
        "no refused spelling got through"
    );

    // The service's own routes are not on the gate's port.
    assert_eq!(get(&s, "/metrics").await.0, 200, "forwarded, not ours");
    assert!(up.seen.at("/metrics") == 1);
    let metrics = s.metrics_text().await;
    assert!(
        metrics.contains(&format!(
            "bloomgate_gate_requests_total{{route=\"{ROUTE}\",outcome=\"rejected\"}}"
        )),
        "{metrics}"
    );
    assert!(metrics.contains("bloomgate_gate_upstream_not_found_total"));
    // The observed rate is the stats' own.
    let stats = s.stats().await;
    let fpr = stats["gate"]["routes"][0]["observed_fpr"]
        .as_f64()
        .unwrap_or(0.0);
    assert!(
        metrics.contains(&format!(
            "bloomgate_gate_observed_fpr{{route=\"{ROUTE}\"}} {fpr}"
        )),
        "{fpr}: {metrics}"
    );
}

/// The threads of this process whose name starts with `prefix`.
fn threads_named(prefix: &str) -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|name| name.starts_with(prefix))
        .count()
}

/// The gate runs on `gate.threads` threads of its own (`gate{port}-{i}`),
/// which answer many connections at once, refusing and forwarding as one
/// gate does, and end with the service.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gate_runs_on_threads_of_its_own_and_ends_with_the_service() {
    let dir = tempfile::tempdir().unwrap();
    let url = common::sqlite_url(&dir);
    let up = Upstream::start().await;
    let (s, _writer) = gate_over(&url, &["u1", "u2"], &up, |c| c.gate.threads = 3).await;
    let name = format!("gate{}-", s.gate.unwrap().port());
    eventually(5, "the gate's threads started", || async {
        threads_named(&name) == 3
    })
    .await;
    // Twenty connections at once (a client each: no pooling between them).
    let answers = futures_util::future::join_all((0..20).map(|i| {
        let url = gate_url(
            &s,
            &format!("/api/profiles/{}", ["u1", "u2", "nobody"][i % 3]),
        );
        async move {
            let r = reqwest::Client::new().get(url).send().await.unwrap();
            r.status().as_u16()
        }
    }))
    .await;
    for (i, code) in answers.into_iter().enumerate() {
        assert_eq!(code, if i % 3 == 2 { 404 } else { 200 }, "request {i}");
    }
    assert_eq!(up.seen.at("/api/profiles/nobody"), 0);
    s.stop().await;
    eventually(5, "the gate's threads ended", || async {
        threads_named(&name) == 0
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_filter_that_cannot_vouch_lets_everything_through() {
    let dir = tempfile::tempdir().unwrap();
    let url = common::sqlite_url(&dir);
    let up = Upstream::start().await;
    let (s, writer) = gate_over(&url, &["u1"], &up, |c| {
        c.sql.out_of_step_ms = 300;
    })
    .await;
    assert_eq!(get(&s, "/api/profiles/nobody").await.0, 404, "vouched");
    // The change feed becomes unreadable: the instance may miss creates,
    // so its filter's "no" no longer stands.
    sqlx::query("ALTER TABLE bloomgate_changes RENAME TO bloomgate_changes_gone")
        .execute(&writer)
        .await
        .unwrap();
    eventually(10, "forwarded once out of step", || async {
        get(&s, "/api/profiles/nobody").await.0 == 200
    })
    .await;
    assert!(up.seen.at("/api/profiles/nobody") >= 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn responses_pass_through_unchanged() {
    let dir = tempfile::tempdir().unwrap();
    let url = common::sqlite_url(&dir);
    let up = Upstream::start().await;
    let (s, _w) = gate_over(&url, &["u1"], &up, |_| {}).await;
    let gate = s.gate.unwrap();
    let within = Duration::from_secs(5);
    // The same request, straight and through the gate: status line,
    // end-to-end headers and body alike (hop-by-hop ones removed).
    for (req, hop) in [
        (
            "GET /exact HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n",
            true,
        ),
        (
            "GET /status/204 HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n",
            false,
        ),
        (
            "GET /status/304 HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n",
            false,
        ),
        (
            "HEAD /download-cl/5 HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n",
            false,
        ),
        (
            "GET /download/70000 HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n",
            false,
        ),
        (
            "GET /download-cl/70000 HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n",
            false,
        ),
    ] {
        let direct = raw(up.addr, req.as_bytes(), within).await;
        let gated = raw(gate, req.as_bytes(), within).await;
        let (d, g) = (clean(&direct, hop, false), clean(&gated, hop, true));
        assert_eq!(d, g, "{req}");
        if hop {
            assert!(!gated.to_ascii_lowercase().contains("x-hop"), "{gated}");
            assert!(
                gated.contains("Thu, 01 Jan 2026"),
                "the upstream's Date kept"
            );
        }
    }

    // The upstream saw the X-Forwarded-* headers and `Forwarded` made by
    // the gate, the client's own replaced (an API that reads the leftmost
    // value would read its spoof), and Host kept.
    let r = s
        .client
        .get(gate_url(&s, "/echo"))
        .header("host", "api.example")
        .header("x-forwarded-for", "10.1.1.1")
        .header("x-forwarded-proto", "https")
        .header("x-forwarded-host", "admin.internal")
        .header("forwarded", "for=10.1.1.1;host=admin.internal;proto=https")
        .header("connection", "x-secret")
        .header("x-secret", "hop")
        .header("te", "trailers")
        .header("proxy-authorization", "Basic eA==")
        .send()
        .await
        .unwrap();
    let echo: serde_json::Value = r.json().await.unwrap();
    let h = &echo["headers"];
    assert_eq!(h["host"][0], "api.example");
    assert_eq!(h["x-forwarded-for"], serde_json::json!(["127.0.0.1"]));
    assert_eq!(h["x-forwarded-proto"], serde_json::json!(["http"]));
    assert_eq!(h["x-forwarded-host"], serde_json::json!(["api.example"]));
    assert_eq!(
        h["forwarded"],
        serde_json::json!(["for=127.0.0.1;proto=http;host=\"api.example\""])
    );
    for hop in ["x-secret", "te", "proxy-authorization"] {
        assert!(h.get(hop).is_none(), "{hop} forwarded: {h}");
    }
}

/// A raw response as (status line, sorted end-to-end headers, decoded
/// body): `Connection` always dropped (each side has its own), `Date`
/// unless `exact` (the upstream sets one there), and the hop-by-hop
/// headers the upstream sent there, on the straight side.
fn clean(r: &str, exact: bool, gated: bool) -> (String, Vec<String>, Vec<u8>) {
    let (head, body) = r.split_once("\r\n\r\n").unwrap();
    let mut lines = head.lines();
    let status = lines.next().unwrap().to_owned();
    let mut headers: Vec<String> = lines
        .map(str::to_ascii_lowercase)
        .filter(|l| !l.starts_with("connection:"))
        .filter(|l| exact || !l.starts_with("date:"))
        .filter(|l| gated || !exact || !(l.starts_with("x-hop:") || l.starts_with("keep-alive:")))
        .collect();
    headers.sort();
    let chunked = headers.iter().any(|h| h == "transfer-encoding: chunked");
    let body = if chunked {
        dechunk(body.as_bytes())
    } else {
        body.as_bytes().to_vec()
    };
    (status, headers, body)
}

fn dechunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let nl = b.windows(2).position(|w| w == b"\r\n").unwrap();
        let size =
            usize::from_str_radix(std::str::from_utf8(&b[..nl]).unwrap().trim(), 16).unwrap();
        b = &b[nl + 2..];
        if size == 0 {
            return out;
        }
        out.extend_from_slice(&b[..size]);
        b = &b[size + 2..];
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hundred_mib_both_ways_streams_in_bounded_memory() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let dir = tempfile::tempdir().unwrap();
    let url = common::sqlite_url(&dir);
    let up = Upstream::start().await;
    let (s, _w) = gate_over(&url, &["u1"], &up, |_| {}).await;
    let gate = s.gate.unwrap();
    const N: u64 = 100 << 20;
    let base = rss();
    let mut peak = base;

    // Download.
    let mut c = tokio::net::TcpStream::connect(gate).await.unwrap();
    c.write_all(
        format!("GET /download/{N} HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await
    .unwrap();
    let mut buf = vec![0u8; 64 * 1024];
    let mut got = 0u64;
    loop {
        let n = c.read(&mut buf).await.unwrap();
        if n == 0 {
            break;
        }
        got += n as u64;
        if got % (8 << 20) < n as u64 {
            peak = peak.max(rss());
        }
    }
    assert!(got > N, "the whole body and its chunk framing: {got}");

    // Upload.
    let mut c = tokio::net::TcpStream::connect(gate).await.unwrap();
    c.write_all(
        format!(
            "POST /upload HTTP/1.1\r\nHost: h\r\nContent-Length: {N}\r\nConnection: close\r\n\r\n"
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let zeros = vec![0u8; 64 * 1024];
    let mut sent = 0u64;
    while sent < N {
        c.write_all(&zeros).await.unwrap();
        sent += zeros.len() as u64;
        if sent.is_multiple_of(8 << 20) {
            peak = peak.max(rss());
        }
    }
    let mut answer = String::new();
    c.read_to_string(&mut answer).await.unwrap();
    assert_eq!(status_of(&answer), 200, "{answer}");
    assert!(answer.ends_with(&N.to_string()), "{answer}");
    assert_eq!(
        up.seen.uploaded.load(std::sync::atomic::Ordering::SeqCst),
        N
    );
    let grew = peak.saturating_sub(base);
    eprintln!("RSS grew by {} MiB while 2 x 100 MiB streamed", grew >> 20);
    assert!(
        grew < 48 << 20,
        "RSS grew by {grew} bytes: a body was buffered"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_failures_are_json_and_a_gone_client_cancels_its_request() {
    let dir = tempfile::tempdir().unwrap();
    let url = common::sqlite_url(&dir);
    let up = Upstream::start().await;
    let (s, _w) = gate_over(&url, &["u1"], &up, |c| {
        c.gate.timeout_ms = 400;
        c.gate.idle_timeout_ms = 400;
    })
    .await;
    // Stalled: no headers within timeout_ms.
    let (status, body) = get(&s, "/stall").await;
    assert_eq!(status, 504, "{body}");
    assert!(body.contains("gateway_timeout"), "{body}");
    // A body that stops moving is cut by the idle timeout.
    let r = s
        .client
        .get(gate_url(&s, "/slow-body"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert!(r.text().await.is_err(), "the stalled body ends in an error");

    // An upload that takes longer than timeout_ms but never stops for
    // idle_timeout_ms is not cut: the header timeout counts from its end.
    {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut c = tokio::net::TcpStream::connect(s.gate.unwrap())
            .await
            .unwrap();
        c.write_all(
            b"POST /upload HTTP/1.1\r\nHost: h\r\nContent-Length: 10\r\nConnection: close\r\n\r\n",
        )
        .await
        .unwrap();
        for _ in 0..10 {
            tokio::time::sleep(Duration::from_millis(150)).await;
            c.write_all(b"x").await.unwrap();
        }
        let mut answer = String::new();
        c.read_to_string(&mut answer).await.unwrap();
        assert_eq!(
            status_of(&answer),
            200,
            "a 1.5 s upload under a 400 ms header timeout: {answer}"
        );
        assert!(answer.ends_with("10"), "{answer}");
    }

    // A client that goes away cancels its upstream request.
    let cancelled = || up.seen.cancelled.load(std::sync::atomic::Ordering::SeqCst);
    let before = cancelled();
    let gate = s.gate.unwrap();
    let _ = raw(
        gate,
        b"GET /stall HTTP/1.1\r\nHost: h\r\n\r\n",
        Duration::from_millis(100),
    )
    .await;
    eventually(5, "the upstream request cancelled", || async {
        cancelled() > before
    })
    .await;

    // Unreachable: 502.
    let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let dead = closed.local_addr().unwrap();
    drop(closed);
    let dir2 = tempfile::tempdir().unwrap();
    let url2 = common::sqlite_url(&dir2);
    let (s2, _w2) = gate_over(&url2, &["u1"], &up, |c| {
        c.gate.upstream = format!("http://{dead}");
    })
    .await;
    let (status, body) = get(&s2, "/api/profiles/u1").await;
    assert_eq!(status, 502, "{body}");
    assert!(body.contains("bad_gateway"), "{body}");
    // A refused key is still answered without the upstream.
    assert_eq!(get(&s2, "/api/profiles/nobody").await.0, 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_is_spliced_through() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let dir = tempfile::tempdir().unwrap();
    let url = common::sqlite_url(&dir);
    let up = Upstream::start().await;
    // One connection at a time: the tunnel holds it.
    let (s, _w) = gate_over(&url, &["u1"], &up, |c| c.gate.max_connections = 1).await;
    let mut c = tokio::net::TcpStream::connect(s.gate.unwrap())
        .await
        .unwrap();
    c.write_all(
        b"GET /ws HTTP/1.1\r\nHost: h\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n",
    )
    .await
    .unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        c.read_exact(&mut byte).await.unwrap();
        head.push(byte[0]);
    }
    let head = String::from_utf8(head).unwrap().to_ascii_lowercase();
    assert!(head.starts_with("http/1.1 101"), "{head}");
    assert!(head.contains("upgrade: echo"), "{head}");
    for msg in [&b"hello"[..], b"\x81\x05frame", b"bye"] {
        c.write_all(msg).await.unwrap();
        let mut back = vec![0u8; msg.len()];
        tokio::time::timeout(Duration::from_secs(5), c.read_exact(&mut back))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(back, msg);
    }
    // An upgraded connection still counts under the limit: another waits
    // until the tunnel ends. Before, hyper's connection ended at the
    // upgrade, and with it the connection's place.
    let mut other = tokio::net::TcpStream::connect(s.gate.unwrap())
        .await
        .unwrap();
    other
        .write_all(b"GET /api/profiles/u1 HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut answer = Vec::new();
    let waited =
        tokio::time::timeout(Duration::from_millis(700), other.read_to_end(&mut answer)).await;
    assert!(
        waited.is_err(),
        "served past the limit: {}",
        String::from_utf8_lossy(&answer)
    );
    drop(c);
    tokio::time::timeout(Duration::from_secs(5), other.read_to_end(&mut answer))
        .await
        .expect("served once the tunnel ended")
        .unwrap();
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
}

/// Only WebSocket is tunnelled: an `h2c` upgrade (or any protocol a
/// client names) would carry requests the gate never judges. It goes on
/// as a plain request without its `Upgrade`, and the connection closes
/// after the answer, so nothing after its head goes unscanned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_websocket_upgrade_is_tunnelled() {
    let dir = tempfile::tempdir().unwrap();
    let url = common::sqlite_url(&dir);
    let up = Upstream::start().await;
    let (s, _w) = gate_over(&url, &["u1"], &up, |_| {}).await;
    for upgrade in ["h2c", "websocket, h2c", "echo"] {
        let request = format!(
            "GET /api/profiles/u1 HTTP/1.1\r\nHost: h\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: {upgrade}\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\r\nGET /api/profiles/nobody HTTP/1.1\r\nHost: h\r\n\r\n"
        );
        let answer = raw(s.gate.unwrap(), request.as_bytes(), Duration::from_secs(5)).await;
        assert_eq!(status_of(&answer), 200, "{upgrade}: {answer}");
        let lower = answer.to_ascii_lowercase();
        assert!(lower.contains("connection: close"), "{upgrade}: {answer}");
        let body = &answer[answer.find("\r\n\r\n").unwrap() + 4..];
        let echo: serde_json::Value = serde_json::from_str(body).unwrap();
        assert!(
            echo["headers"].get("upgrade").is_none(),
            "{upgrade}: {echo}"
        );
        assert!(
            echo["headers"].get("http2-settings").is_none(),
            "named in Connection: dropped ({upgrade}): {echo}"
        );
        assert_eq!(
            lower.matches("http/1.1 ").count(),
            1,
            "the request after the head was not served: {answer}"
        );
    }
    assert_eq!(up.seen.at("/api/profiles/u1"), 3);
    assert_eq!(up.seen.at("/api/profiles/nobody"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn smuggling_open_proxying_and_oversized_requests_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let url = common::sqlite_url(&dir);
    let up = Upstream::start().await;
    let (s, _w) = gate_over(&url, &["u1"], &up, |c| {
        c.gate.max_uri_bytes = 200;
    })
    .await;
    let gate = s.gate.unwrap();
    let within = Duration::from_secs(3);
    let long = format!("GET /{} HTTP/1.1\r\nHost: h\r\n\r\n", "a".repeat(300));
    let big = format!(
        "GET / HTTP/1.1\r\nHost: h\r\nX-Big: {}\r\n\r\n",
        "b".repeat(70 * 1024)
    );
    let cases: Vec<(&str, Vec<u8>, u16)> = vec![
        (
            "CL then TE",
            b"POST /upload HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n".to_vec(),
            400,
        ),
        (
            "TE then CL",
            b"POST /upload HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n0\r\n\r\n".to_vec(),
            400,
        ),
        (
            "two equal lengths",
            b"POST /upload HTTP/1.1\r\nHost: h\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\nx".to_vec(),
            400,
        ),
        (
            "two lengths",
            b"POST /upload HTTP/1.1\r\nHost: h\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nxy".to_vec(),
            400,
        ),
        (
            "obs-fold",
            b"GET / HTTP/1.1\r\nHost: h\r\nX-A: 1\r\n  folded\r\n\r\n".to_vec(),
            400,
        ),
        (
            "CONNECT",
            b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n".to_vec(),
            405,
        ),
        (
            "absolute-form, another host",
            b"GET http://example.com/x HTTP/1.1\r\nHost: h\r\n\r\n".to_vec(),
            400,
        ),
        ("target too long", long.into_bytes(), 414),
        ("head too large", big.into_bytes(), 431),
        (
            "two Host headers",
            b"GET /api/profiles/u1 HTTP/1.1\r\nHost: h\r\nHost: other\r\n\r\n".to_vec(),
            400,
        ),
    ];
    for (what, req, want) in cases {
        let answer = raw(gate, &req, within).await;
        assert_eq!(status_of(&answer), want, "{what}: {answer}");
        json_answer(&answer, what);
    }
    assert_eq!(up.seen.total(), 0, "nothing refused reached the upstream");
    // A clean request after a clean one on the same connection is
    // forwarded (the scan follows bodies to the next head).
    let two = b"POST /upload HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\n\r\nabc\
        GET /api/profiles/u1 HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n";
    let answer = raw(gate, two, within).await;
    assert_eq!(answer.matches("HTTP/1.1 200").count(), 2, "{answer}");
    // A chunked GET keeps its body (hyper's client would drop a GET's
    // body of unknown length).
    let get_body = b"GET /upload HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n3\r\nabc\r\n0\r\n\r\n";
    let answer = raw(gate, get_body, within).await;
    assert_eq!(status_of(&answer), 200, "{answer}");
    assert!(
        answer.ends_with('3'),
        "the body reached the upstream: {answer}"
    );
    // `Connection: host` does not take Host away.
    let named = b"GET /echo HTTP/1.1\r\nHost: api.example\r\nConnection: host, close\r\n\r\n";
    let answer = raw(gate, named, within).await;
    assert!(answer.contains("\"host\":[\"api.example\"]"), "{answer}");
    // Absolute-form for the gate's own host is forwarded as origin-form.
    let same = b"GET http://h/api/profiles/u1 HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n";
    let answer = raw(gate, same, within).await;
    assert_eq!(status_of(&answer), 200, "{answer}");
    assert!(
        answer.contains("\"target\":\"/api/profiles/u1\""),
        "{answer}"
    );
}

/// The error code of the gate's own JSON answer in `raw` (one response,
/// then the connection closed).
fn json_answer(raw: &str, what: &str) -> String {
    let (head, body) = raw
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("{what}: no head in {raw:?}"));
    assert!(
        head.to_ascii_lowercase()
            .contains("content-type: application/json"),
        "{what}: {raw}"
    );
    let v: serde_json::Value =
        serde_json::from_str(body).unwrap_or_else(|e| panic!("{what}: {e}: {raw}"));
    assert!(
        v["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{what}: {raw}"
    );
    v["error"]
        .as_str()
        .unwrap_or_else(|| panic!("{what}: {raw}"))
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_head_hyper_would_refuse_gets_the_gates_json_answer() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let dir = tempfile::tempdir().unwrap();
    let url = common::sqlite_url(&dir);
    let up = Upstream::start().await;
    let (s, _w) = gate_over(&url, &["u1"], &up, |c| {
        c.gate.max_headers = 8;
    })
    .await;
    let gate = s.gate.unwrap();
    let within = Duration::from_secs(3);
    let many: String = (0..12).map(|i| format!("X-{i}: v\r\n")).collect();
    let many = format!("GET / HTTP/1.1\r\nHost: h\r\n{many}\r\n");
    let cases: Vec<(&str, Vec<u8>, u16)> = vec![
        (
            "a space in a header name",
            b"GET / HTTP/1.1\r\nHost: h\r\nBad Name: 1\r\n\r\n".to_vec(),
            400,
        ),
        (
            "a bad version",
            b"GET / HTTP/7.2\r\nHost: h\r\n\r\n".to_vec(),
            400,
        ),
        (
            "a control byte in the target",
            b"GET /a\x01b HTTP/1.1\r\nHost: h\r\n\r\n".to_vec(),
            400,
        ),
        ("too many headers", many.into_bytes(), 431),
        (
            "not HTTP",
            b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03".to_vec(),
            400,
        ),
        (
            "a length hyper takes as a list",
            b"POST /upload HTTP/1.1\r\nHost: h\r\nContent-Length: 1, 1\r\n\r\nx".to_vec(),
            400,
        ),
        (
            "a coding that is not chunked",
            b"POST /upload HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: gzip\r\n\r\n".to_vec(),
            400,
        ),
        (
            "a target the URI parser refuses",
            b"GET http://[::1/x HTTP/1.1\r\nHost: h\r\n\r\n".to_vec(),
            400,
        ),
    ];
    let refused = 8;
    for (what, req, want) in cases {
        let answer = raw(gate, &req, within).await;
        assert_eq!(status_of(&answer), want, "{what}: {answer}");
        let code = json_answer(&answer, what);
        assert_eq!(
            code,
            if want == 431 {
                "header_too_large"
            } else {
                "bad_request"
            },
            "{what}"
        );
    }
    // After clean requests sent with it in one write: each is answered
    // in turn, then the malformed one, and the connection closes.
    let three = b"GET /api/profiles/u1 HTTP/1.1\r\nHost: h\r\n\r\n\
        POST /upload HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\n\r\nabc\
        GET / HTTP/1.1\r\nHost: h\r\nX-A: 1\r\n  folded\r\n\r\n";
    let answer = raw(gate, three, within).await;
    assert_eq!(status_of(&answer), 200, "{answer}");
    assert_eq!(answer.matches("HTTP/1.1 200").count(), 2, "{answer}");
    let last = &answer[answer.rfind("HTTP/1.1 ").unwrap()..];
    assert_eq!(status_of(last), 400, "{answer}");
    assert_eq!(json_answer(last, "after clean requests"), "bad_request");
    assert_eq!(answer.matches("HTTP/1.1 ").count(), 3, "{answer}");
    assert_eq!(up.seen.total(), 2, "only the clean requests went upstream");
    // The same from a client that shuts its half after sending (as `nc`
    // does): its end does not cancel the request before the cut.
    let mut c = tokio::net::TcpStream::connect(gate).await.unwrap();
    c.write_all(b"GET /api/profiles/u1 HTTP/1.1\r\nHost: h\r\n\r\nGET / HTTP/1.1\r\nX: 1\r\n folded\r\n\r\n")
        .await
        .unwrap();
    c.shutdown().await.unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(within, c.read_to_end(&mut out))
        .await
        .expect("answered and closed")
        .unwrap();
    let answer = String::from_utf8_lossy(&out);
    assert_eq!(status_of(&answer), 200, "{answer}");
    let last = &answer[answer.rfind("HTTP/1.1 ").unwrap()..];
    assert_eq!(json_answer(last, "after a half-close"), "bad_request");
    assert_eq!(up.seen.total(), 3);
    // A head whose first part came alone (held back from hyper): the
    // fault in the second part still gets the JSON answer.
    let mut c = tokio::net::TcpStream::connect(gate).await.unwrap();
    c.write_all(b"GET / HTTP/1.1\r\nHost: h\r\n").await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    c.write_all(b"X-A: 1\r\n\tfolded\r\n\r\n").await.unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(within, c.read_to_end(&mut out))
        .await
        .expect("the connection closes after the answer")
        .unwrap();
    let answer = String::from_utf8_lossy(&out);
    assert_eq!(status_of(&answer), 400, "{answer}");
    assert_eq!(json_answer(&answer, "in two parts"), "bad_request");
    // Its end lets the gate close (it awaits it after the answer).
    drop(c);
    // The same after a clean request on that connection, its answer
    // read before the rest of the bad head is sent.
    let mut c = tokio::net::TcpStream::connect(gate).await.unwrap();
    c.write_all(b"GET /api/profiles/u1 HTTP/1.1\r\nHost: h\r\n\r\nGET / HTTP/1.1\r\nHo")
        .await
        .unwrap();
    let mut first = vec![0u8; 4096];
    let n = tokio::time::timeout(within, c.read(&mut first))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status_of(&String::from_utf8_lossy(&first[..n])), 200);
    c.write_all(b"st: h\r\nBad Name: 1\r\n\r\n").await.unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(within, c.read_to_end(&mut out))
        .await
        .expect("the connection closes after the answer")
        .unwrap();
    let answer = String::from_utf8_lossy(&out);
    assert_eq!(status_of(&answer), 400, "{answer}");
    assert_eq!(json_answer(&answer, "after a clean request"), "bad_request");
    // Its end lets the gate close (it awaits it after the answer).
    drop(c);
    assert_eq!(up.seen.total(), 4);
    // A clean request after one that asks to close: hyper never takes
    // it, so no answer is written that would read as its.
    let closing = b"GET /api/profiles/u1 HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n\
        GET /api/profiles/u1 HTTP/1.1\r\nHost: h\r\n\r\n\
        GET / HTTP/7.0\r\n\r\n";
    let answer = raw(gate, closing, within).await;
    assert_eq!(answer.matches("HTTP/1.1 ").count(), 1, "{answer}");
    assert_eq!(status_of(&answer), 200, "{answer}");
    // Clean requests whose heads and bodies arrive in pieces (each head
    // held back until whole) pass byte for byte.
    let mut c = tokio::net::TcpStream::connect(gate).await.unwrap();
    for piece in [
        &b"POST /upload HTTP/1.1\r\nHost: h\r\nContent-Len"[..],
        b"gth: 5\r\n\r\nab",
        b"cdeGET /api/profiles/u1 HTTP/1.1\r\nHo",
        b"st: h\r\nConnection: close\r\n\r\n",
    ] {
        c.write_all(piece).await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut out = Vec::new();
    tokio::time::timeout(within, c.read_to_end(&mut out))
        .await
        .unwrap()
        .unwrap();
    let answer = String::from_utf8_lossy(&out);
    assert_eq!(answer.matches("HTTP/1.1 200").count(), 2, "{answer}");
    assert_eq!(
        up.seen.uploaded.load(std::sync::atomic::Ordering::SeqCst),
        5
    );
    // Every refusal is counted (once its connection has ended).
    let line = format!(
        "bloomgate_gate_requests_total{{route=\"(none)\",outcome=\"bad_request\"}} {}",
        refused + 5
    );
    let mut metrics = String::new();
    for _ in 0..50 {
        metrics = s.metrics_text().await;
        if metrics.contains(&line) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(metrics.contains(&line), "{line} in {metrics}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_auth_request_check_answers_for_the_original_request() {
    let dir = tempfile::tempdir().unwrap();
    let url = common::sqlite_url(&dir);
    let up = Upstream::start().await;
    let (s, _w) = gate_over(&url, &["u1"], &up, |c| {
        c.gate.listen = None;
        c.gate.routes[0].not_found_status = 410;
        c.gate.routes[0].not_found_body = Some("<p>gone</p>".into());
        c.gate.routes[0].not_found_content_type = "text/html".into();
    })
    .await;
    let check = |headers: Vec<(&'static str, &'static str)>, path: &'static str| {
        let mut r = s.client.get(s.url(path));
        for (k, v) in headers {
            r = r.header(k, v);
        }
        async move {
            let r = r.send().await.unwrap();
            (r.status().as_u16(), r.text().await.unwrap())
        }
    };
    let nginx = |uri: &'static str| vec![("x-original-method", "GET"), ("x-original-uri", uri)];
    // nginx reads no body from an auth subrequest: none is sent, so the
    // keep-alive connection to bloomgate stays usable.
    assert_eq!(
        check(nginx("/api/profiles/nobody?q=1"), "/api/gate/check").await,
        (403, String::new())
    );
    assert_eq!(
        check(nginx("/api/profiles/u1"), "/api/gate/check").await.0,
        200
    );
    assert_eq!(
        check(nginx("/elsewhere/nobody"), "/api/gate/check").await.0,
        200
    );
    let caddy = vec![
        ("x-forwarded-method", "GET"),
        ("x-forwarded-uri", "/api/profiles/nobody"),
    ];
    let (status, body) = check(caddy, "/api/gate/check").await;
    assert_eq!(status, 410, "the route's own answer");
    assert_eq!(body, "<p>gone</p>", "as configured, not rewritten as JSON");
    let post = vec![
        ("x-forwarded-method", "POST"),
        ("x-forwarded-uri", "/api/profiles/nobody"),
    ];
    assert_eq!(
        check(post, "/api/gate/check").await.0,
        200,
        "POST is not judged"
    );
    assert_eq!(
        check(vec![], "/api/gate/check/api/profiles/nobody").await.0,
        410
    );
    assert_eq!(
        check(vec![], "/api/gate/check/api/profiles/u1").await.0,
        200
    );
    let (status, body) = check(
        vec![("x-original-uri", "/api/profiles/u1")],
        "/api/gate/check",
    )
    .await;
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("x-original-method"), "{body}");
    assert_eq!(check(vec![], "/api/gate/check").await.0, 400);
    // Both pairs: a client added one; refused, never judged as either.
    let both = vec![
        ("x-original-method", "GET"),
        ("x-original-uri", "/elsewhere"),
        ("x-forwarded-method", "GET"),
        ("x-forwarded-uri", "/api/profiles/nobody"),
    ];
    assert_eq!(check(both, "/api/gate/check").await.0, 400);
    // A value that is not text (Caddy passes a query's `é` on raw): the
    // check never reads the query, so the path is judged; a path, method
    // or host that is not text lets the request through unjudged.
    let raw = |pairs: &[(&'static str, &'static [u8])]| {
        let mut r = s.client.get(s.url("/api/gate/check"));
        for (k, v) in pairs {
            r = r.header(*k, reqwest::header::HeaderValue::from_bytes(v).unwrap());
        }
        async move { r.send().await.unwrap().status().as_u16() }
    };
    let method: (&'static str, &'static [u8]) = ("x-forwarded-method", b"GET");
    for (uri, want) in [
        (b"/api/profiles/u1?q=\xc3\xa9".as_slice(), 200),
        (b"/api/profiles/nobody?q=\xc3\xa9", 410),
        (b"/api/profiles/nobody#\xff", 410),
        (b"/api/profiles/\xc3\xa9", 200),
    ] {
        assert_eq!(
            raw(&[method, ("x-forwarded-uri", uri)]).await,
            want,
            "{}",
            String::from_utf8_lossy(uri)
        );
    }
    let nobody: (&'static str, &'static [u8]) = ("x-forwarded-uri", b"/api/profiles/nobody");
    assert_eq!(
        raw(&[("x-forwarded-method", b"G\xc3\x89T"), nobody]).await,
        200
    );
    assert_eq!(
        raw(&[method, nobody, ("x-forwarded-host", b"h\xc3\xa9.example")]).await,
        200
    );
    assert_eq!(up.seen.total(), 0, "the check never calls the upstream");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_spellings_the_collation_finds_are_forwarded() {
    let Some(url) = common::mysql_database("http_gate").await else {
        return;
    };
    let up = Upstream::start().await;
    let (s, writer) = gate_over(&url, &["p42"], &up, |_| {}).await;
    for path in [
        "/api/profiles/p42",
        "/api/profiles/P42",
        "/api/profiles/p42%20",
    ] {
        assert_eq!(get(&s, path).await.0, 200, "{path}");
    }
    assert_eq!(get(&s, "/api/profiles/q42").await.0, 404);
    // Another program's insert, made in its own transaction.
    sqlx::query("INSERT INTO users VALUES ('Q42', 'user Q42')")
        .execute(&writer)
        .await
        .unwrap();
    eventually(5, "q42 forwarded after the insert", || async {
        get(&s, "/api/profiles/q42").await.0 == 200
    })
    .await;
    assert_eq!(up.seen.at("/api/profiles/q42"), 1);
}

/// Entries of other instances and programs `s` applied.
async fn applied(s: &TestServer) -> u64 {
    s.stats().await["outbox"]["applied"].as_u64().unwrap()
}

/// Runs `sql` with the `mariadb` command-line client, as another program
/// on the database's host would.
fn mariadb_client(url: &str, sql: &str) {
    let db = url.rsplit('/').next().unwrap();
    let out = std::process::Command::new("mariadb")
        .args(["-h", "127.0.0.1", "-P", "3306", "-u", "root", db, "-e", sql])
        .output()
        .expect("the mariadb client runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remembered_404s_are_shared_and_dropped_by_another_programs_create() {
    let Some(url) = common::mysql_database("http_gate_memory").await else {
        return;
    };
    let Some(redis) = common::redis_url().await else {
        return;
    };
    let prefix = "http-gate-memory";
    common::redis_clear(&redis, &format!("bgtest:{prefix}:")).await;
    let up = Upstream::start().await;
    let writer = common::sql_pool(&url).await;
    common::users_table(&writer, &["u1", "gone", "late", "headless"]).await;
    let config = || {
        let mut c = gate_config(common::config(&url, Some(&redis), prefix), &up);
        c.gate.routes[0].cache_not_found_secs = 300;
        c.gate.routes[0].not_found_memory_headers = vec!["X_B3_*".into()];
        c
    };
    let a = started(config()).await;
    let b = started(config()).await;
    // Rows deleted after the build: the filters still hold them (a
    // "maybe"), and the API answers 404 for them.
    sqlx::query("DELETE FROM users WHERE id IN ('gone', 'late', 'headless')")
        .execute(&writer)
        .await
        .unwrap();
    eventually(5, "the deletes applied", || async {
        applied(&a).await >= 2 && applied(&b).await >= 2
    })
    .await;
    // An instance trusts memories in Redis forwarded after it started
    // (by more than the fleet's clock margin).
    tokio::time::sleep(Duration::from_millis(CLOCK_MARGIN_MS + 200)).await;

    // Another spelling of a key that exists may reach another of the
    // API's routes, whose 404 is not the key's: not remembered, and the
    // key's own spelling is forwarded on both instances. Before, a 404
    // for `%75%31` was stored under `u1` and refused it for everyone.
    for spelling in [
        "/api/profiles/%75%31",
        "//api/profiles/u1",
        "/api/profiles/U1",
    ] {
        up.seen.set_missing(spelling, true);
        for _ in 0..2 {
            assert_eq!(get(&a, spelling).await.0, 404, "{spelling}");
        }
        assert_eq!(up.seen.at(spelling), 2, "{spelling} answered from memory");
        for s in [&a, &b] {
            assert_eq!(
                get(s, "/api/profiles/u1").await.0,
                200,
                "refused after {spelling}"
            );
        }
    }

    // A request carrying a header an upstream may route by (here
    // `X-Forwarded-Host`, which the gate appends to) may reach another
    // of its routes: its 404 is not remembered either.
    let u1 = "/api/profiles/u1";
    up.seen.set_missing(u1, true);
    let before = up.seen.at(u1);
    for h in ["x-forwarded-host", "x-original-url", "forwarded"] {
        for _ in 0..2 {
            let r = a.client.get(gate_url(&a, u1)).header("host", HOST);
            let r = r.header(h, "elsewhere.example").send().await.unwrap();
            assert_eq!(r.status(), 404, "{h}");
        }
    }
    assert_eq!(up.seen.at(u1), before + 6, "a rerouted 404 was remembered");
    up.seen.set_missing(u1, false);
    for s in [&a, &b] {
        assert_eq!(get(s, u1).await.0, 200, "refused after a rerouted 404");
    }

    // Remembered once the upstream answered 404 for the key's own
    // spelling without a query, for the Host it was asked of: A and B
    // both answer it from then on, with the route's refusal.
    let gone = "/api/profiles/gone";
    up.seen.set_missing(gone, true);
    for _ in 0..2 {
        let r = a.client.get(format!("{}?v=2", gate_url(&a, gone)));
        let r = r.header("host", HOST).send();
        assert_eq!(r.await.unwrap().status(), 404);
    }
    assert_eq!(up.seen.at(gone), 2, "a request with a query was remembered");
    let evil = || {
        a.client
            .get(gate_url(&a, gone))
            .header("host", "evil.example")
    };
    assert_eq!(evil().send().await.unwrap().status(), 404);
    assert_eq!(evil().send().await.unwrap().status(), 404);
    assert_eq!(up.seen.at(gone), 3, "remembered for its own Host");
    let (status, body) = get(&a, gone).await;
    assert_eq!(
        (status, up.seen.at(gone)),
        (404, 4),
        "another Host's 404 answered this one: {body}"
    );
    assert!(body.contains("no such profile"), "the upstream's own 404");
    for (i, s) in [&a, &b, &a].into_iter().enumerate() {
        let (status, body) = get(s, gone).await;
        assert_eq!(status, 404);
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["error"], "not_found", "the gate's refusal ({i}): {body}");
    }
    assert_eq!(up.seen.at(gone), 4, "answered without the upstream");
    // Both Hosts' 404s are kept, on both instances: clients that
    // alternate between two names are not all forwarded. Before, each
    // request of the other Host took the memory over.
    for s in [&b, &a] {
        let r = s
            .client
            .get(gate_url(s, gone))
            .header("host", "evil.example");
        assert_eq!(r.send().await.unwrap().status(), 404);
        assert_eq!(get(s, gone).await.0, 404);
    }
    assert_eq!(up.seen.at(gone), 4, "one Host's 404 dropped the other's");
    // The auth-request check answers from the memory too.
    let r = b
        .client
        .get(format!("{}/api/gate/check", b.base))
        .header("x-original-method", "GET")
        .header("x-original-uri", gone)
        .header("host", HOST)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    // A request with credentials is the caller's, not the key's: it is
    // forwarded and its 404 is not remembered.
    for (h, v) in [("cookie", "s=1"), ("authorization", "Bearer x")] {
        let r = a.client.get(gate_url(&a, gone)).header(h, v).send().await;
        assert_eq!(r.unwrap().status(), 404);
    }
    assert_eq!(up.seen.at(gone), 6);
    // A header off the allowlist means the 404 may be the caller's (a
    // tenant's key), or the upstream may route by it (an underscore
    // spelling, which CGI and WSGI servers read as the dashed header):
    // forwarded, never answered from memory. A header the route allows
    // (`not_found_memory_headers`, here the `x-b3-*` family) and the
    // browser's `sec-fetch-*` keep the memory.
    for (h, v) in [
        ("x-api-key", "tenant-b"),
        ("x_forwarded_host", "elsewhere.example"),
        ("x_original_url", "/elsewhere"),
    ] {
        let r = a.client.get(gate_url(&a, gone)).header("host", HOST);
        assert_eq!(r.header(h, v).send().await.unwrap().status(), 404, "{h}");
    }
    assert_eq!(
        up.seen.at(gone),
        9,
        "answered from memory despite a header off the list"
    );
    let r = a.client.get(gate_url(&a, gone)).header("host", HOST);
    let r = r
        .header("x-b3-traceid", "1")
        .header("sec-fetch-mode", "cors");
    assert_eq!(r.send().await.unwrap().status(), 404);
    assert_eq!(up.seen.at(gone), 9, "an allowed header was forwarded");
    // A HEAD's 404 is not stored (Gin answers HEAD on a GET route with
    // 404): the GET after it is the API's to answer.
    let headless = "/api/profiles/headless";
    up.seen.set_missing(headless, true);
    for _ in 0..2 {
        let r = a.client.head(gate_url(&a, headless)).header("host", HOST);
        assert_eq!(r.send().await.unwrap().status(), 404);
    }
    up.seen.set_missing(headless, false);
    for s in [&a, &b] {
        let r = s.client.get(gate_url(s, headless)).header("host", HOST);
        assert_eq!(
            r.send().await.unwrap().status(),
            200,
            "a HEAD's 404 answered a GET"
        );
    }
    assert_eq!(up.seen.at(headless), 4);

    // A create by another program (the mariadb client) drops the memory
    // on every instance.
    up.seen.set_missing(gone, false);
    mariadb_client(&url, "INSERT INTO users VALUES ('gone', 'back again')");
    for s in [&a, &b] {
        eventually(3, "the created key forwarded", || async {
            get(s, gone).await.0 == 200
        })
        .await;
    }

    // A 404 the API read before a create committed is not remembered
    // once an instance applied the create: here the upstream decides its
    // 404 for `late`, the row is created and applied by both instances,
    // and only then is the 404 sent.
    let late = "/api/profiles/late";
    up.seen.set_missing(late, true);
    up.seen.hold(late);
    let pending = tokio::spawn({
        let (client, target) = (a.client.clone(), gate_url(&a, late));
        async move { client.get(target).send().await.unwrap().status().as_u16() }
    });
    eventually(5, "the API read late", || async { up.seen.at(late) == 1 }).await;
    let (seen_a, seen_b) = (applied(&a).await, applied(&b).await);
    up.seen.set_missing(late, false);
    mariadb_client(&url, "INSERT INTO users VALUES ('late', 'late again')");
    eventually(5, "the create applied by both", || async {
        applied(&a).await > seen_a && applied(&b).await > seen_b
    })
    .await;
    up.seen.release(late);
    assert_eq!(
        pending.await.unwrap(),
        404,
        "the 404 read before the create"
    );
    for s in [&a, &b] {
        let (status, body) = get(s, late).await;
        assert_eq!(status, 200, "a 404 older than the create answered: {body}");
    }
    assert_eq!(up.seen.at(late), 3);

    // Counted: answered from memory, stored, refused; on /metrics too.
    let stats = a.stats().await;
    let r = &stats["gate"]["routes"][0];
    // Two answers before the create, and more while it was on its way.
    assert!(r["not_found_cached"].as_u64().unwrap() >= 3, "{r}");
    assert_eq!(r["not_found_memory"]["remembered"], 2, "{r}");
    assert_eq!(r["not_found_memory"]["refused"], 1, "{r}");
    let on_b = &b.stats().await["gate"]["routes"][0];
    assert!(on_b["not_found_cached"].as_u64().unwrap() >= 1, "{on_b}");
    assert_eq!(on_b["not_found_memory"]["remembered"], 0, "{on_b}");
    let metrics = a.metrics_text().await;
    assert!(
        metrics.contains(&format!(
            "bloomgate_gate_requests_total{{route=\"{ROUTE}\",outcome=\"not_found_cached\"}} {}",
            r["not_found_cached"]
        )),
        "{metrics}"
    );
}

/// A client that stops reading a large download: once the gate's writes
/// to it make no progress for `gate.idle_timeout_ms`, the connection ends
/// (and the upstream request with it), instead of holding the upstream
/// for as long as the client likes. Before, the transfer waited and then
/// went on: the whole GiB arrived once the client read again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_reading_is_cut_after_the_idle_timeout() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let dir = tempfile::tempdir().unwrap();
    let url = common::sqlite_url(&dir);
    let up = Upstream::start().await;
    let (s, _) = gate_over(&url, &["u1"], &up, |c| c.gate.idle_timeout_ms = 300).await;
    let mut c = tokio::net::TcpStream::connect(s.gate.unwrap())
        .await
        .unwrap();
    c.write_all(b"GET /download/1073741824 HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    // Not read for 2 s: the buffers fill and the gate's writes wait.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (mut n, mut buf) = (0_u64, vec![0_u8; 1 << 16]);
    loop {
        match tokio::time::timeout(Duration::from_secs(10), c.read(&mut buf)).await {
            Ok(Ok(0) | Err(_)) => break,
            Ok(Ok(k)) => n += k as u64,
            Err(_) => panic!("neither data nor an end within 10 s ({n} bytes read)"),
        }
    }
    assert!(
        n < 256 << 20,
        "read {n} bytes: the gate kept streaming to a client that stopped reading"
    );
}

/// A create no instance applied (the only instance was stopped when
/// another program inserted the row, and the next one starts past its
/// entry) deletes no memory. The memory in Redis carries the position it
/// was made at, and an instance trusts none from before the position it
/// follows from: the row is forwarded. Before, the restarted gate
/// answered the stale 404 for a row that exists.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remembered_404_older_than_the_instance_is_not_trusted() {
    let Some(url) = common::mysql_database("http_gate_memory_restart").await else {
        return;
    };
    let Some(redis) = common::redis_url().await else {
        return;
    };
    let prefix = "http-gate-memory-restart";
    common::redis_clear(&redis, &format!("bgtest:{prefix}:")).await;
    let up = Upstream::start().await;
    let writer = common::sql_pool(&url).await;
    common::users_table(&writer, &["u1", "gone"]).await;
    let config = || {
        let mut c = gate_config(common::config(&url, Some(&redis), prefix), &up);
        c.gate.routes[0].cache_not_found_secs = 300;
        c.sql.outbox_gap_ms = 200;
        c
    };
    let a = started(config()).await;
    sqlx::query("DELETE FROM users WHERE id = 'gone'")
        .execute(&writer)
        .await
        .unwrap();
    eventually(5, "the delete applied", || async { applied(&a).await >= 1 }).await;
    let gone = "/api/profiles/gone";
    up.seen.set_missing(gone, true);
    assert_eq!(get(&a, gone).await.0, 404);
    assert_eq!(get(&a, gone).await.0, 404);
    assert_eq!(up.seen.at(gone), 1, "remembered");
    a.stop().await;
    // Created while no instance runs; the next starts past its entry (it
    // finds no stored filter to adopt and replay from: only the memories
    // are left in Redis).
    up.seen.set_missing(gone, false);
    mariadb_client(&url, "INSERT INTO users VALUES ('gone', 'back again')");
    let mut conn = common::redis_conn(&redis).await;
    for k in common::redis_keys(&mut conn, &format!("bgtest:{prefix}:")).await {
        if !k.contains(":gnf:") {
            let _: () = redis::cmd("DEL")
                .arg(k)
                .query_async(&mut conn)
                .await
                .unwrap();
        }
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let b = started(config()).await;
    let seq: i64 = sqlx::query_scalar("SELECT MAX(seq) FROM bloomgate_changes")
        .fetch_one(&writer)
        .await
        .unwrap();
    assert!(
        b.state.outbox.followed_since() >= seq,
        "the new instance starts past the create"
    );
    let (status, body) = get(&b, gone).await;
    assert_eq!(status, 200, "a 404 remembered before the create: {body}");
    assert_eq!(up.seen.at(gone), 2);
}

/// A route says what a key is, so the API's other routes at the key's
/// place are never refused as absent keys: `exclude` (Rails' `/me`,
/// `/search`, `/new`), `key_pattern` (a key that does not look like one),
/// `strip_suffix` (Rails' `(.:format)`: `alice.json` is `alice`'s row).
/// Absent keys in every spelling are still refused, and a create by
/// `PUT` is never judged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn route_shapes_never_refuse_what_the_api_would_answer() {
    let dir = tempfile::tempdir().unwrap();
    let url = common::sqlite_url(&dir);
    let up = Upstream::start().await;
    let (s, _w) = gate_over(&url, &["u1", "alice"], &up, |c| {
        let r = &mut c.gate.routes[0];
        r.exclude = vec!["me".into(), "search".into(), "new".into()];
        r.strip_suffix = vec![".json".into()];
        r.key_pattern = Some("[a-z][a-z0-9]*".into());
    })
    .await;
    for path in [
        "/api/profiles/me",
        "/api/profiles/search",
        "/api/profiles/new",
        "/api/profiles/me.json",
        "/api/profiles/alice.json",
        "/api/profiles/u1.json",
        "/api/profiles/Nobody",
        "/api/profiles/nobody-x",
    ] {
        assert_eq!(get(&s, path).await.0, 200, "{path}");
        assert_eq!(up.seen.at(path), 1, "{path} reached the API");
    }
    for path in ["/api/profiles/nobody", "/api/profiles/nobody.json"] {
        let (status, body) = get(&s, path).await;
        assert_eq!(status, 404, "{path}: {body}");
        assert!(body.contains("not_found"), "the gate's refusal: {body}");
        assert_eq!(up.seen.at(path), 0, "{path} reached the API");
    }
    let r = s.client.put(gate_url(&s, "/api/profiles/newcomer"));
    let r = r.header("host", HOST).body("{}").send().await.unwrap();
    assert_eq!(r.status(), 200, "a create is forwarded");
    assert_eq!(up.seen.at("/api/profiles/newcomer"), 1);
}

/// A peer in `gate.trusted_proxies` (a load balancer in front) keeps its
/// forwarding headers, the gate's own appended; any other peer's are
/// replaced (the test above).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trusted_proxys_forwarding_headers_are_kept() {
    let dir = tempfile::tempdir().unwrap();
    let url = common::sqlite_url(&dir);
    let up = Upstream::start().await;
    // A dual-stack listener: the IPv4 peer arrives as ::ffff:127.0.0.1,
    // and is still the trusted 127.0.0.1.
    let (s, _w) = gate_over(&url, &["u1"], &up, |c| {
        c.gate.listen = Some("[::]:0".parse().unwrap());
        c.gate.trusted_proxies = vec!["10.0.0.0/8".into(), "127.0.0.1".into()];
    })
    .await;
    let port = s.gate.unwrap().port();
    let r = s
        .client
        .get(format!("http://127.0.0.1:{port}/echo"))
        .header("host", "api.example")
        .header("x-forwarded-for", "203.0.113.9")
        .header("x-forwarded-proto", "https")
        .header("x-forwarded-host", "shop.example")
        .header("forwarded", "for=203.0.113.9;proto=https")
        .send()
        .await
        .unwrap();
    let echo: serde_json::Value = r.json().await.unwrap();
    let h = &echo["headers"];
    assert_eq!(h["x-forwarded-for"][0], "203.0.113.9, 127.0.0.1");
    assert_eq!(h["x-forwarded-proto"][0], "https, http");
    assert_eq!(h["x-forwarded-host"][0], "shop.example, api.example");
    assert_eq!(
        h["forwarded"][0],
        "for=203.0.113.9;proto=https, for=127.0.0.1;proto=http;host=\"api.example\""
    );
}

/// The gate's header timeout (`http.header_timeout_ms`) holds for heads
/// its scan keeps back from hyper until they are whole: connections that
/// send part of a head and stop are closed about the timeout after they
/// began, and a real client is answered meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partial_heads_are_closed_at_the_header_timeout() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let dir = tempfile::tempdir().unwrap();
    let url = common::sqlite_url(&dir);
    let up = Upstream::start().await;
    let (s, _w) = gate_over(&url, &["u1"], &up, |c| c.http.header_timeout_ms = 500).await;
    let addr = s.gate.unwrap();
    let started = std::time::Instant::now();
    let mut held = Vec::new();
    for i in 0..50 {
        let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
        let part = format!("GET /api/profiles/u1 HTTP/1.1\r\nHost: {HOST}\r\nX-Slow-{i}: ");
        c.write_all(part.as_bytes()).await.unwrap();
        held.push(c);
    }
    assert_eq!(
        get(&s, "/api/profiles/u1").await.0,
        200,
        "answered meanwhile"
    );
    for (i, c) in held.iter_mut().enumerate() {
        let mut rest = Vec::new();
        // Twice the timeout, and a margin for a loaded machine: a lost
        // timer fails here instead of hanging.
        let ended = tokio::time::timeout(Duration::from_secs(3), c.read_to_end(&mut rest)).await;
        assert!(ended.is_ok(), "connection {i} still open after 3 s");
    }
    let all = started.elapsed();
    assert!(
        all >= Duration::from_millis(450),
        "closed before the timeout: {all:?}"
    );
    eprintln!("50 partial heads closed within {all:?} of the first");
    assert_eq!(up.seen.total(), 1, "no partial head reached the API");
}
