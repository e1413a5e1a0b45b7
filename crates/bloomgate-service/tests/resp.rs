//! The Redis-protocol listener (`[resp]`): RedisBloom's `BF.*` answered
//! from the filters, byte for byte as Redis answers where a command exists
//! in both, hostile frames closing only their own connection, pipelines
//! in order, the token on writes, the idle timeout and connection limit,
//! and real clients (redis-cli, redis-py, redis-rs) against a service on
//! MariaDB whose table another program writes.

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bloomgate_service::config::Capture;
use bloomgate_service::Config;
use common::{eventually, TestServer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

fn with_resp(mut c: Config) -> Config {
    c.resp.listen = Some("127.0.0.1:0".parse().unwrap());
    c
}

/// The demo SKU table on SQLite (ids 1..=`seed`), with the listener.
async fn sku_server(
    dir: &tempfile::TempDir,
    seed: u64,
    edit: impl FnOnce(&mut Config),
) -> TestServer {
    let mut c = with_resp(common::config(&common::sqlite_url(dir), None, "resp"));
    edit(&mut c);
    TestServer::start(c, seed).await
}

/// Sends `input` on a new connection and reads until the peer closes or
/// is quiet for `quiet`: the bytes, and whether it closed.
async fn talk(addr: SocketAddr, input: &[u8], quiet: Duration) -> (Vec<u8>, bool) {
    let mut s = TcpStream::connect(addr).await.unwrap();
    // A server may close before it has read everything (a protocol error).
    let _ = s.write_all(input).await;
    read_all(&mut s, quiet).await
}

async fn read_all(s: &mut TcpStream, quiet: Duration) -> (Vec<u8>, bool) {
    let mut got = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match tokio::time::timeout(quiet, s.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return (got, true),
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
            Err(_) => return (got, false),
        }
    }
}

/// Reads exactly `n` bytes (or fails after 10 s).
async fn read_exact(s: &mut TcpStream, n: usize) -> Vec<u8> {
    let mut got = vec![0u8; n];
    tokio::time::timeout(Duration::from_secs(10), s.read_exact(&mut got))
        .await
        .expect("replies within 10 s")
        .expect("the connection stays open");
    got
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replies_match_a_real_redis_where_both_have_the_command() {
    let Some(redis) = common::redis_url().await else {
        return;
    };
    let redis_addr: SocketAddr = redis
        .trim_start_matches("redis://")
        .trim_end_matches('/')
        .parse()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let s = sku_server(&dir, 100, |_| {}).await;
    let ours = s.resp.unwrap();
    let quiet = Duration::from_millis(300);
    for input in [
        &b"PING\r\n"[..],
        b"*1\r\n$4\r\nPING\r\n",
        b"*2\r\n$4\r\nPING\r\n$2\r\nhi\r\n",
        b"*2\r\n$4\r\nECHO\r\n$5\r\na\r\nb\x00\r\n",
        b"*3\r\n$3\r\nFOO\r\n$1\r\na\r\n$1\r\nb\r\n",
        b"*1\r\n$4\r\nECHO\r\n",
        b"*3\r\n$4\r\nPING\r\n$1\r\na\r\n$1\r\nb\r\n",
        b"SELECT 0\r\nSELECT 99\r\n",
        b"AUTH x\r\n",
        b"HELLO 4\r\nHELLO x\r\n",
        b"CLIENT SETNAME \"a b\"\r\nCLIENT SETNAME ok\r\nCLIENT GETNAME\r\n",
        b"*0\r\nPING\r\n\r\nPING\r\n",
        b"RESET\r\n",
        b"AUTH default anything\r\nAUTH someone x\r\n",
        b"QUIT\r\nPING\r\n",
        b"*1\r\n$-5\r\n",
        b"*x\r\n",
        b"*1\r\n:5\r\n",
        b"ECHO \"unbalanced\r\n",
    ] {
        let (want, want_closed) = talk(redis_addr, input, quiet).await;
        let (got, closed) = talk(ours, input, quiet).await;
        assert_eq!(text(&got), text(&want), "{:?}", text(input));
        assert_eq!(closed, want_closed, "closed after {:?}", text(input));
    }
    // HELLO: the same types (a map of 7 in RESP3, 14 elements in RESP2),
    // the same protocol field; the server names itself.
    for (input, head) in [(&b"HELLO 3\r\n"[..], "%7\r\n"), (b"HELLO 2\r\n", "*14\r\n")] {
        let (want, _) = talk(redis_addr, input, quiet).await;
        let (got, _) = talk(ours, input, quiet).await;
        assert!(text(&want).starts_with(head), "{}", text(&want));
        assert!(text(&got).starts_with(head), "{}", text(&got));
        assert!(text(&got).contains("$9\r\nbloomgate\r\n"));
        let proto = if head.starts_with('%') {
            ":3\r\n"
        } else {
            ":2\r\n"
        };
        assert!(text(&got).contains(&format!("$5\r\nproto\r\n{proto}")));
    }
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bf_commands_answer_from_the_filter() {
    let dir = tempfile::tempdir().unwrap();
    let s = sku_server(&dir, 1000, |c| {
        c.resp.keys.insert("bf:skus".into(), "skus".into());
    })
    .await;
    let addr = s.resp.unwrap();
    let quiet = Duration::from_millis(300);
    let ask = |cmd: &'static str| async move { text(&talk(addr, cmd.as_bytes(), quiet).await.0) };
    assert_eq!(ask("BF.EXISTS skus 42\r\n").await, ":1\r\n");
    assert_eq!(ask("BF.EXISTS bf:skus 42\r\n").await, ":1\r\n");
    // Absent ids the filter refuses (checked to be refused, so the test
    // cannot pass on a false positive's luck).
    let absent: Vec<i64> = (5_000_000..5_000_100)
        .filter(|id| {
            s.state.skus.shield().check_many(&[*id])[0]
                == bloomgate_service::shield::Verdict::Reject
        })
        .take(3)
        .collect();
    assert_eq!(absent.len(), 3);
    let a = absent[0];
    assert_eq!(
        ask(Box::leak(
            format!("BF.EXISTS skus {a}\r\n").into_boxed_str()
        ))
        .await,
        ":0\r\n"
    );
    // Keys an integer column cannot hold: 0. A name that is no filter:
    // an error, not RedisBloom's 0 for a missing filter (a typo must not
    // make a table look empty).
    assert_eq!(
        ask("BF.EXISTS skus abc\r\nBF.EXISTS skus -4\r\n").await,
        ":0\r\n:0\r\n"
    );
    for read in ["BF.EXISTS nope 42", "BF.MEXISTS nope 42 43", "BF.CARD nope"] {
        let got = ask(Box::leak(format!("{read}\r\n").into_boxed_str())).await;
        assert!(
            got.starts_with("-ERR no filter named 'nope'"),
            "{read}: {got}"
        );
    }
    assert_eq!(
        ask(Box::leak(
            format!("BF.MEXISTS skus 1 {a} x 2\r\n").into_boxed_str()
        ))
        .await,
        "*4\r\n:1\r\n:0\r\n:0\r\n:1\r\n"
    );
    assert_eq!(ask("BF.CARD skus\r\n").await, ":1000\r\n");
    let info = ask("BF.INFO skus\r\n").await;
    let g = s.state.skus.shield().stats();
    assert_eq!(
        info,
        format!(
            "*10\r\n+Capacity\r\n:{}\r\n+Size\r\n:{}\r\n+Number of filters\r\n:1\r\n+Number of items inserted\r\n:1000\r\n+Expansion rate\r\n$-1\r\n",
            g.capacity,
            g.bits.div_ceil(8)
        )
    );
    assert_eq!(ask("BF.INFO skus items\r\n").await, "*1\r\n:1000\r\n");
    assert_eq!(
        ask("BF.INFO skus nope\r\n").await,
        "-ERR Invalid information value\r\n"
    );
    assert_eq!(ask("BF.INFO nope\r\n").await, "-ERR not found\r\n");
    // RESP3: booleans and a map.
    let r3 = ask(Box::leak(format!("HELLO 3\r\nBF.EXISTS skus 1\r\nBF.MEXISTS skus {a} 1\r\nBF.INFO skus\r\nBF.CARD skus\r\n").into_boxed_str())).await;
    let after_hello = r3.split_once("$7\r\nmodules\r\n*0\r\n").unwrap().1;
    assert!(
        after_hello.starts_with("#t\r\n*2\r\n#f\r\n#t\r\n%5\r\n+Capacity\r\n"),
        "{after_hello}"
    );
    assert!(
        after_hello.contains("+Expansion rate\r\n_\r\n:1000\r\n"),
        "{after_hello}"
    );
    // Writes: the key API's `keys` call (no token, loopback).
    let b = absent[1];
    let add = format!("BF.ADD skus {b}\r\nBF.ADD skus {b}\r\nBF.EXISTS skus {b}\r\n");
    assert_eq!(
        ask(Box::leak(add.into_boxed_str())).await,
        ":1\r\n:0\r\n:1\r\n"
    );
    let c = absent[2];
    let insert = format!(
        "BF.INSERT skus CAPACITY 10 ITEMS {c} 1\r\nBF.INSERT skus NOCREATE ITEMS 7\r\nBF.INSERT nope NOCREATE ITEMS 7\r\nBF.MADD skus x\r\nBF.ADD nope 1\r\n"
    );
    let got = ask(Box::leak(insert.into_boxed_str())).await;
    let lines: Vec<&str> = got.split("\r\n").collect();
    assert_eq!(
        &lines[..6],
        &["*2", ":1", ":0", "*1", ":0", "-ERR not found"],
        "{got}"
    );
    assert!(
        lines[6] == "-ERR 'x' cannot be a key of skus (its keys are positive 64-bit integers)",
        "{got}"
    );
    assert!(lines[7].starts_with("-ERR no filter named 'nope'"), "{got}");
    // Recorded in the outbox for every instance, as the HTTP call does.
    assert_ne!(
        s.state.skus.shield().check_many(&[b])[0],
        bloomgate_service::shield::Verdict::Reject,
        "the filter no longer refuses it"
    );
    let calls = s.stats().await;
    assert_eq!(
        common::counter(&calls, &["resources", "skus", "calls", "keys_added"]),
        5
    );
    assert_eq!(
        ask("BF.RESERVE skus 0.01 10\r\n").await,
        "-ERR BF.RESERVE is not supported: bloomgate's filters are defined by its configuration ([[resources]]) and built from their tables\r\n"
    );
    assert!(ask("BF.SCANDUMP skus 0\r\n")
        .await
        .starts_with("-ERR BF.SCANDUMP is not supported"));
    assert!(ask("COMMAND COUNT\r\n").await.starts_with(':'));
    assert!(ask("COMMAND INFO bf.exists nope\r\n")
        .await
        .starts_with("*2\r\n*10\r\n$9\r\nbf.exists\r\n:3\r\n"));
    assert!(ask("INFO\r\n").await.contains("filter_skus:ready=1,items="));
    // Metrics: by resource and command, checked by promtool.
    let m = s.metrics_text().await;
    let n = common::prom_value(
        &m,
        "bloomgate_resp_commands_total",
        &[("resource", "skus"), ("command", "bf.exists")],
    );
    assert!(n.unwrap_or(0.0) >= 5.0, "{m}");
    assert_eq!(
        common::prom_value(
            &m,
            "bloomgate_resp_errors_total",
            &[("resource", "(none)"), ("command", "bf.info")]
        ),
        Some(1.0)
    );
    assert!(m.contains("bloomgate_resp_command_duration_seconds_bucket{resource=\"skus\",command=\"bf.exists\",le="));
    common::promtool_check("resp", &m);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_filter_that_is_not_built_answers_maybe() {
    let dir = tempfile::tempdir().unwrap();
    let s = sku_server(&dir, 10, |c| c.cache.bloom_build_on_start = false).await;
    let (got, _) = talk(
        s.resp.unwrap(),
        b"BF.EXISTS skus 987654321\r\nBF.MEXISTS skus 1 987654322\r\n",
        Duration::from_millis(300),
    )
    .await;
    assert_eq!(text(&got), ":1\r\n*2\r\n:1\r\n:1\r\n");
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_frames_close_only_their_own_connection() {
    let dir = tempfile::tempdir().unwrap();
    let s = sku_server(&dir, 10, |_| {}).await;
    let addr = s.resp.unwrap();
    let mut good = TcpStream::connect(addr).await.unwrap();
    let quiet = Duration::from_secs(2);
    let mut million = b"*1000000\r\n".to_vec();
    million.extend(std::iter::repeat_n(&b"$1\r\na\r\n"[..], 1000).flatten());
    let garbage: Vec<u8> = (0..100_000u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8 | 1)
        .filter(|&b| b != b'\n')
        .collect();
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "a negative length",
            b"*1\r\n$-5\r\n".to_vec(),
            "-ERR Protocol error: invalid bulk length\r\n",
        ),
        (
            "a bulk over resp.max_bulk_bytes",
            b"*2\r\n$4\r\nECHO\r\n$70000\r\n".to_vec(),
            "-ERR Protocol error: invalid bulk length\r\n",
        ),
        (
            "a command over resp.max_request_bytes",
            {
                let mut big = b"*20\r\n".to_vec();
                for _ in 0..20 {
                    big.extend_from_slice(b"$60000\r\n");
                    big.extend(std::iter::repeat_n(b'k', 60000));
                    big.extend_from_slice(b"\r\n");
                }
                big
            },
            "-ERR Protocol error: request larger than resp.max_request_bytes\r\n",
        ),
        (
            "4097 arguments",
            b"*4097\r\n".to_vec(),
            "-ERR Protocol error: invalid multibulk length\r\n",
        ),
        (
            "512 MB declared",
            b"*2\r\n$9\r\nBF.EXISTS\r\n$536870912\r\nxx".to_vec(),
            "-ERR Protocol error: invalid bulk length\r\n",
        ),
        (
            "10^6 arguments",
            million,
            "-ERR Protocol error: invalid multibulk length\r\n",
        ),
        (
            "binary garbage",
            garbage,
            "-ERR Protocol error: too big inline request\r\n",
        ),
        (
            "a count that is no number",
            b"*\xff\xfe\r\n".to_vec(),
            "-ERR Protocol error: invalid multibulk length\r\n",
        ),
    ];
    for (what, input, want) in cases {
        let (got, closed) = talk(addr, &input, quiet).await;
        assert_eq!(text(&got), want, "{what}");
        assert!(closed, "{what}: the connection is closed");
        good.write_all(b"PING\r\n").await.unwrap();
        assert_eq!(read_exact(&mut good, 7).await, b"+PONG\r\n", "after {what}");
    }
    // A truncated frame waits for the rest; the client going away ends it.
    let mut cut = TcpStream::connect(addr).await.unwrap();
    cut.write_all(b"*2\r\n$9\r\nBF.EXISTS\r\n$4\r\nsk")
        .await
        .unwrap();
    let (got, closed) = read_all(&mut cut, Duration::from_millis(300)).await;
    assert!(got.is_empty() && !closed, "a partial frame is waited for");
    drop(cut);
    good.write_all(b"*3\r\n$9\r\nBF.EXISTS\r\n$4\r\nskus\r\n$1\r\n1\r\n")
        .await
        .unwrap();
    assert_eq!(read_exact(&mut good, 4).await, b":1\r\n");
    let m = s.metrics_text().await;
    assert_eq!(
        common::prom_value(&m, "bloomgate_resp_protocol_errors_total", &[]),
        Some(8.0)
    );
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_request_gets_no_answer() {
    let dir = tempfile::tempdir().unwrap();
    let s = sku_server(&dir, 10, |_| {}).await;
    let addr = s.resp.unwrap();
    let quiet = Duration::from_secs(2);
    let (got, closed) = talk(
        addr,
        b"POST /api HTTP/1.1\r\nHost: x\r\nContent-Length: 15\r\n\r\nBF.ADD skus 99\r\n",
        quiet,
    )
    .await;
    assert!(got.is_empty() && closed, "{}", text(&got));
    // A request line alone is an unknown command; with its Host line the
    // connection is closed before anything is answered.
    let (got, _) = talk(addr, b"GET / HTTP/1.1\r\n", Duration::from_millis(300)).await;
    assert_eq!(
        text(&got),
        "-ERR unknown command 'GET', with args beginning with: '/' 'HTTP/1.1' \r\n"
    );
    let (got, closed) = talk(
        addr,
        b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\nBF.ADD skus 99\r\n",
        quiet,
    )
    .await;
    assert!(got.is_empty() && closed, "{}", text(&got));
    assert_eq!(
        s.state
            .skus
            .counters
            .keys_added
            .load(std::sync::atomic::Ordering::Relaxed),
        0
    );
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_need_the_token_reads_do_not() {
    let dir = tempfile::tempdir().unwrap();
    let s = sku_server(&dir, 10, |c| c.admin_token = Some("s3cret".into())).await;
    let addr = s.resp.unwrap();
    let quiet = Duration::from_millis(300);
    let (got, _) = talk(addr, b"BF.ADD skus 99\r\nBF.MADD skus 99\r\nBF.INSERT skus ITEMS 99\r\nBF.EXISTS skus 1\r\nAUTH nope\r\nAUTH someone s3cret\r\nBF.ADD skus 99\r\n", quiet).await;
    assert_eq!(
        text(&got),
        "-NOAUTH Authentication required.\r\n-NOAUTH Authentication required.\r\n-NOAUTH Authentication required.\r\n:1\r\n-WRONGPASS invalid username-password pair or user is disabled.\r\n-WRONGPASS invalid username-password pair or user is disabled.\r\n-NOAUTH Authentication required.\r\n"
    );
    let (got, _) = talk(addr, b"AUTH s3cret\r\nBF.ADD skus 99\r\nRESET\r\nBF.ADD skus 98\r\nHELLO 2 AUTH default s3cret\r\nBF.ADD skus 97\r\n", quiet).await;
    let got = text(&got);
    assert!(
        got.starts_with("+OK\r\n:1\r\n+RESET\r\n-NOAUTH Authentication required.\r\n*14\r\n"),
        "{got}"
    );
    assert!(
        got.ends_with("\r\n:1\r\n"),
        "HELLO's AUTH lets writes through: {got}"
    );
    // A third wrong password closes the connection (guesses cost one
    // connection each three), and the next command is not answered.
    let (got, closed) = talk(addr, b"AUTH a\r\nAUTH b\r\nAUTH c\r\nPING\r\n", quiet).await;
    assert_eq!(
        text(&got).matches("-WRONGPASS").count(),
        3,
        "{}",
        text(&got)
    );
    assert!(closed && !text(&got).contains("PONG"));
    assert_eq!(
        s.state
            .skus
            .counters
            .keys_added
            .load(std::sync::atomic::Ordering::Relaxed),
        2
    );
    s.stop().await;
}

/// `BF.EXISTS`, `BF.MEXISTS` and HTTP `exists` give the same answers for
/// the same keys: built and in step, and out of step (every "no" becomes
/// "maybe").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resp_and_http_answer_alike() {
    let dir = tempfile::tempdir().unwrap();
    // A short bound, so the parked follower's instance goes out of step
    // by itself and stays so.
    let s = sku_server(&dir, 1000, |c| c.sql.out_of_step_ms = 300).await;
    let addr = s.resp.unwrap();
    let ids: Vec<i64> = (990..1010).chain(7_000_000..7_000_040).collect();
    // Out of step: the gate told it cannot vouch just before each call
    // (the follower, parked, would say so within `out_of_step_ms`; its
    // in-step watchdog may say otherwise between calls).
    let compare = |want_all_maybe: bool| {
        let ids = ids.clone();
        let s = &s;
        let out_of_step = move || {
            if want_all_maybe {
                s.state.skus.shield().set_in_step(false);
            }
        };
        async move {
            out_of_step();
            let body = serde_json::json!({ "keys": ids }).to_string();
            let (status, http) = s
                .send(reqwest::Method::POST, "/api/skus/exists", Some(&body))
                .await;
            assert_eq!(status, 200);
            let http: Vec<bool> = serde_json::from_value(http["exists"].clone()).unwrap();
            let mut one = String::new();
            for id in &ids {
                one.push_str(&format!("BF.EXISTS skus {id}\r\n"));
            }
            let many = format!(
                "BF.MEXISTS skus {}\r\n",
                ids.iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(" ")
            );
            out_of_step();
            let (a, _) = talk(addr, one.as_bytes(), Duration::from_millis(300)).await;
            out_of_step();
            let (b, _) = talk(addr, many.as_bytes(), Duration::from_millis(300)).await;
            let as_int = |v: &bool| if *v { ":1\r\n" } else { ":0\r\n" };
            assert_eq!(text(&a), http.iter().map(as_int).collect::<String>());
            assert_eq!(
                text(&b),
                format!(
                    "*{}\r\n{}",
                    ids.len(),
                    http.iter().map(as_int).collect::<String>()
                )
            );
            if want_all_maybe {
                assert!(http.iter().all(|v| *v), "out of step: no refusals");
            } else {
                assert!(http[..11].iter().all(|v| *v), "ids 990..=1000 exist");
                assert!(
                    http.iter().filter(|v| !**v).count() > 30,
                    "most absent ids refused"
                );
            }
        }
    };
    compare(false).await;
    // Out of step: the follower parked, the gate told it cannot vouch.
    let parked = common::quiet_sql(&s).await;
    eventually(5, "out of step once the follower is parked", || async {
        !s.state.skus.shield().in_step()
    })
    .await;
    compare(true).await;
    s.state.skus.shield().set_in_step(true);
    parked.resume();
    s.stop().await;
}

/// A client that never stops sending does not hold the service open:
/// shutdown ends its connection and `run` returns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_ends_busy_connections() {
    let dir = tempfile::tempdir().unwrap();
    // A grace period longer than the bound asserted below: only a
    // connection that ends on the signal itself (not one cut when the
    // grace runs out) lets the service stop in time.
    let s = sku_server(&dir, 10, |c| c.http.shutdown_grace_secs = 30).await;
    let addr = s.resp.unwrap();
    let mut c = TcpStream::connect(addr).await.unwrap();
    let client = tokio::spawn(async move {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            if c.write_all(b"PING\r\nPING\r\nPING\r\n").await.is_err() {
                return true;
            }
            match tokio::time::timeout(Duration::from_secs(10), c.read(&mut buf)).await {
                Ok(Ok(0)) | Ok(Err(_)) => return true,
                Ok(Ok(_)) => {}
                Err(_) => return false,
            }
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let started = Instant::now();
    tokio::time::timeout(Duration::from_secs(10), s.stop())
        .await
        .expect("the service stops well within the grace period");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    assert!(client.await.unwrap(), "the busy connection was closed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelines_and_many_connections_answer_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let s = sku_server(&dir, 1000, |c| c.resp.max_pipeline = 64).await;
    let addr = s.resp.unwrap();
    let ids: Vec<i64> = (0..4000)
        .map(|i| {
            if i % 2 == 0 {
                i / 2 + 1
            } else {
                10_000_000 + i
            }
        })
        .collect();
    let want: Vec<u8> = s
        .state
        .skus
        .shield()
        .check_many(&ids)
        .iter()
        .flat_map(|v| {
            if *v == bloomgate_service::shield::Verdict::Reject {
                b":0\r\n"
            } else {
                b":1\r\n"
            }
        })
        .copied()
        .collect();
    assert!(
        want.windows(4).filter(|w| w == b":0\r\n").count() > 1900,
        "most absent ids are refused"
    );
    let mut input = Vec::new();
    for id in &ids {
        let id = id.to_string();
        input.extend_from_slice(
            format!(
                "*3\r\n$9\r\nBF.EXISTS\r\n$4\r\nskus\r\n${}\r\n{id}\r\n",
                id.len()
            )
            .as_bytes(),
        );
    }
    let mut tasks = Vec::new();
    for _ in 0..20 {
        let (input, want) = (input.clone(), want.clone());
        tasks.push(tokio::spawn(async move {
            let mut c = TcpStream::connect(addr).await.unwrap();
            // Written in odd-sized pieces, so frames straddle reads.
            for piece in input.chunks(1777) {
                c.write_all(piece).await.unwrap();
            }
            assert_eq!(read_exact(&mut c, want.len()).await, want);
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_close_and_the_connection_limit_holds() {
    let dir = tempfile::tempdir().unwrap();
    let s = sku_server(&dir, 10, |c| {
        c.resp.idle_timeout_secs = 1;
        c.resp.max_connections = 2;
    })
    .await;
    let addr = s.resp.unwrap();
    let mut first = TcpStream::connect(addr).await.unwrap();
    let mut second = TcpStream::connect(addr).await.unwrap();
    for c in [&mut first, &mut second] {
        c.write_all(b"PING\r\n").await.unwrap();
        assert_eq!(read_exact(c, 7).await, b"+PONG\r\n");
    }
    let started = Instant::now();
    let mut third = TcpStream::connect(addr).await.unwrap();
    third.write_all(b"PING\r\n").await.unwrap();
    let (got, _) = read_all(&mut third, Duration::from_millis(400)).await;
    assert!(
        got.is_empty(),
        "a third connection waits while two are open"
    );
    // The two fall idle and are closed; the third is then answered.
    assert_eq!(read_exact(&mut third, 7).await, b"+PONG\r\n");
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(500) && waited < Duration::from_secs(4),
        "{waited:?}"
    );
    for c in [&mut first, &mut second] {
        let (_, closed) = read_all(c, Duration::from_secs(3)).await;
        assert!(closed, "an idle connection is closed");
    }
    s.stop().await;
}

/// A `users` table on MariaDB, captured by triggers, read through the
/// listener by redis-cli, redis-py and redis-rs (RESP2 and RESP3), while
/// another program inserts and deletes rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_clients_on_mariadb_see_another_programs_writes() {
    let Some(url) = common::mysql_database("resp_clients").await else {
        return;
    };
    let w = common::sql_pool(&url).await;
    common::users_table(&w, &["u000001", "u000002", "u000003"]).await;
    let mut c = with_resp(common::config(&url, None, "resp-clients"));
    c.demo = Some(false);
    let mut users = common::users_resource("users");
    users.capture = Capture::Triggers;
    c.resources = vec![users];
    c.resp.keys.insert("bf:users".into(), "users".into());
    c.admin_token = Some("t0ken".into());
    let s = TestServer::start(c, 0).await;
    eventually(10, "ready", || async { s.get("/readyz").await.0 == 200 }).await;
    let addr = s.resp.unwrap();
    let port = addr.port().to_string();

    // redis-rs, RESP2 then RESP3.
    let r2 = redis::Client::open(format!("redis://{addr}/")).unwrap();
    let mut r2 = r2.get_multiplexed_async_connection().await.unwrap();
    let exists = |k: &str| redis::cmd("BF.EXISTS").arg("bf:users").arg(k).to_owned();
    let one: i64 = exists("u000001").query_async(&mut r2).await.unwrap();
    let none: i64 = exists("u999999").query_async(&mut r2).await.unwrap();
    assert_eq!((one, none), (1, 0));
    let r3 = redis::Client::open(format!("redis://{addr}/?protocol=resp3")).unwrap();
    let mut r3 = r3.get_multiplexed_async_connection().await.unwrap();
    let v: redis::Value = exists("u000002").query_async(&mut r3).await.unwrap();
    assert_eq!(v, redis::Value::Boolean(true));
    let info: redis::Value = redis::cmd("BF.INFO")
        .arg("users")
        .query_async(&mut r3)
        .await
        .unwrap();
    let redis::Value::Map(fields) = info else {
        panic!("BF.INFO is a map under RESP3: {info:?}")
    };
    assert_eq!(fields[3].1, redis::Value::Int(3), "{fields:?}");

    // Another program's insert is answered 1 within the propagation
    // bound (the next poll: 100 ms without a doorbell, plus a margin).
    let started = Instant::now();
    sqlx::query("INSERT INTO users VALUES ('u777777', 'late')")
        .execute(&w)
        .await
        .unwrap();
    let none: i64 = exists("u888888").query_async(&mut r2).await.unwrap();
    assert_eq!(none, 0);
    eventually(2, "the captured insert is answered 1", || {
        let mut r2 = r2.clone();
        async move { exists("u777777").query_async::<i64>(&mut r2).await.unwrap() == 1 }
    })
    .await;
    eprintln!("captured insert answered after {:?}", started.elapsed());
    // A deleted row stays "maybe" until a rebuild (a filter cannot forget).
    sqlx::query("DELETE FROM users WHERE id = 'u000003'")
        .execute(&w)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let still: i64 = exists("u000003").query_async(&mut r2).await.unwrap();
    assert_eq!(still, 1);

    // redis-cli.
    if let Some(cli) = common::tool("redis-cli") {
        let out = std::process::Command::new(cli)
            .args([
                "-p",
                &port,
                "BF.MEXISTS",
                "bf:users",
                "u000001",
                "u999999",
                "u777777",
            ])
            .output()
            .unwrap();
        assert_eq!(text(&out.stdout), "1\n0\n1\n", "{}", text(&out.stderr));
    }
    // redis-py, under both protocols (installed by .ci/run).
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../scripts/resp_redis_py.py"
    );
    let has_redis_py = std::process::Command::new("python3")
        .args(["-c", "import redis"])
        .status()
        .is_ok_and(|s| s.success());
    if has_redis_py {
        let out = std::process::Command::new("python3")
            .args([script, &port, "bf:users", "u000001", "u999999", "t0ken"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}{}",
            text(&out.stdout),
            text(&out.stderr)
        );
        assert_eq!(text(&out.stdout), "RESP2 ok\nRESP3 ok\n");
    } else {
        common::unavailable(
            "redis-py",
            "python3 -c 'import redis' failed (pip install redis; .ci/run does)",
        );
    }
    s.stop().await;
}

/// Strict and redis modes answer as the HTTP reads do: a key in the
/// shared filter that the outbox has not brought yet is 1 there, and 0 on
/// a local-mode instance (whose follower is parked).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn strict_and_redis_modes_ask_the_shared_filter() {
    use bloomgate_service::config::BloomMode;
    let Some(redis) = common::redis_url().await else {
        return;
    };
    let prefix = "resp-modes";
    common::redis_clear(&redis, &format!("bgtest:{prefix}:")).await;
    let dir = tempfile::tempdir().unwrap();
    let db = common::sqlite_url(&dir);
    let server = |mode: BloomMode, seed: u64| {
        let mut c = with_resp(common::config(&db, Some(&redis), prefix));
        c.cache.bloom_mode = mode;
        c.cache.bloom_expected = 10_000;
        c.cache.bloom_fpp = 0.01;
        TestServer::start(c, seed)
    };
    let strict = server(BloomMode::Strict, 1000).await;
    let shared_only = server(BloomMode::Redis, 0).await;
    let local = server(BloomMode::Local, 0).await;
    let parked = common::quiet_sql(&local).await;
    let shared = strict.state.skus.shared().cloned().unwrap();
    // Absent from every filter (checked on the replica), then added to the
    // shared one only.
    let id = (2_000_000..2_001_000)
        .find(|id| {
            strict.state.skus.shield().check_many(&[*id])[0]
                == bloomgate_service::shield::Verdict::Reject
        })
        .unwrap();
    let ask = |s: &TestServer, cmd: String| {
        let addr = s.resp.unwrap();
        async move {
            text(
                &talk(addr, cmd.as_bytes(), Duration::from_millis(300))
                    .await
                    .0,
            )
        }
    };
    for s in [&strict, &shared_only] {
        assert_eq!(ask(s, format!("BF.EXISTS skus {id}\r\n")).await, ":0\r\n");
    }
    shared.insert(&id).await;
    for s in [&strict, &shared_only] {
        assert_eq!(
            ask(
                s,
                format!("BF.EXISTS skus {id}\r\nBF.MEXISTS skus {id} 1\r\n")
            )
            .await,
            ":1\r\n*2\r\n:1\r\n:1\r\n",
            "{}",
            s.base
        );
    }
    assert_eq!(
        ask(&local, format!("BF.EXISTS skus {id}\r\n")).await,
        ":0\r\n",
        "the local replica has not heard of it"
    );
    parked.resume();
    for s in [strict, shared_only, local] {
        s.stop().await;
    }
}

/// `http.rate_limit_per_sec` holds on RESP reads too: one unit per item,
/// per client address; writes are not counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_are_rate_limited_per_client() {
    let dir = tempfile::tempdir().unwrap();
    let s = sku_server(&dir, 10, |c| {
        c.http.rate_limit_per_sec = 1;
        c.http.rate_limit_burst = 5;
    })
    .await;
    let addr = s.resp.unwrap();
    let mut input = String::new();
    for _ in 0..8 {
        input.push_str("BF.EXISTS skus 1\r\n");
    }
    input.push_str("BF.MEXISTS skus 1 2 3 4 5 6\r\nBF.ADD skus 77\r\nPING\r\n");
    let (got, _) = talk(addr, input.as_bytes(), Duration::from_millis(300)).await;
    let got = text(&got);
    let lines: Vec<&str> = got.lines().collect();
    assert_eq!(&lines[..5], &[":1"; 5], "{lines:?}");
    for l in &lines[5..8] {
        assert!(
            l.starts_with("-ERR too many requests from this client; retry in "),
            "{l}"
        );
    }
    assert!(
        lines[8].starts_with("-ERR 6 items in one command are more than this client's burst"),
        "{}",
        lines[8]
    );
    assert_eq!(
        &lines[9..],
        &[":1", "+PONG"],
        "writes and PING are not limited"
    );
    s.stop().await;
}

/// A text column may hold what bloomgate's keys refuse (over 255 bytes, a
/// control character, bytes that are not UTF-8), and its rebuild hashed
/// such rows as they are: `BF.EXISTS` and `BF.MEXISTS` answer "maybe" for
/// such an item, never a "no" the filter cannot vouch for, while an
/// absent plain key is still 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_item_no_key_can_spell_is_maybe_in_a_text_column() {
    let dir = tempfile::tempdir().unwrap();
    let url = common::sqlite_url(&dir);
    let w = common::sql_pool(&url).await;
    let long = "x".repeat(300);
    sqlx::query("CREATE TABLE users (id TEXT NOT NULL PRIMARY KEY, name TEXT NOT NULL)")
        .execute(&w)
        .await
        .unwrap();
    for id in ["u000001", long.as_str(), "tab\there"] {
        sqlx::query("INSERT INTO users VALUES (?, 'x')")
            .bind(id)
            .execute(&w)
            .await
            .unwrap();
    }
    let mut c = with_resp(common::config(&url, None, "resp-unjudged"));
    c.demo = Some(false);
    c.resources = vec![common::users_resource("users")];
    let s = TestServer::start(c, 0).await;
    eventually(10, "ready", || async { s.get("/readyz").await.0 == 200 }).await;
    let addr = s.resp.unwrap();
    let bulk = |b: &[u8]| {
        let mut v = format!("${}\r\n", b.len()).into_bytes();
        v.extend_from_slice(b);
        v.extend_from_slice(b"\r\n");
        v
    };
    let exists = |item: &[u8]| {
        let mut v = b"*3\r\n$9\r\nBF.EXISTS\r\n$5\r\nusers\r\n".to_vec();
        v.extend(bulk(item));
        v
    };
    let mut input = Vec::new();
    for item in [
        b"u000001".as_slice(),
        b"u999999",
        long.as_bytes(),
        b"tab\there",
        b"\xff\xfe",
    ] {
        input.extend(exists(item));
    }
    input.extend(b"*5\r\n$10\r\nBF.MEXISTS\r\n$5\r\nusers\r\n");
    for item in [b"u999999".as_slice(), long.as_bytes(), b"u000001"] {
        input.extend(bulk(item));
    }
    let (got, _) = talk(addr, &input, Duration::from_millis(300)).await;
    assert_eq!(
        text(&got),
        ":1\r\n:0\r\n:1\r\n:1\r\n:1\r\n*3\r\n:0\r\n:1\r\n:1\r\n"
    );
    s.stop().await;
}
