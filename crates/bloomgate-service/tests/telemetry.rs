//! Request ids: a client's `x-request-id` is echoed, and a request without
//! one gets a fresh id, on every answer including errors. Every request is
//! counted under the pattern of the route it matched.

mod common;

use common::TestServer;

#[tokio::test]
async fn every_answer_carries_a_request_id() {
    let dir = tempfile::tempdir().unwrap();
    let config = common::config(&common::sqlite_url(&dir), None, "telemetry");
    let server = TestServer::start(config, 10).await;
    let given = server
        .client
        .get(server.url("/api/seckill/3"))
        .header("x-request-id", "abc-123")
        .send()
        .await
        .unwrap();
    assert_eq!(given.headers()["x-request-id"], "abc-123");
    let mut seen = std::collections::HashSet::new();
    for path in [
        "/api/seckill/3",
        "/api/seckill/99",
        "/api/seckill/x",
        "/nope",
    ] {
        let r = server.client.get(server.url(path)).send().await.unwrap();
        let id = r.headers()["x-request-id"].to_str().unwrap().to_string();
        assert!(id.starts_with("bg-"), "{path}: {id}");
        assert!(seen.insert(id), "ids are unique");
    }
    server.stop().await;
}

/// The edge names each request's route by the router's own patterns: a
/// path under a pattern counts there whatever its method, one that
/// matches none counts as `(unmatched)`, and no path becomes a label.
#[tokio::test]
async fn requests_count_under_their_route_pattern() {
    let dir = tempfile::tempdir().unwrap();
    let config = common::config(&common::sqlite_url(&dir), None, "telemetry_routes");
    let server = TestServer::start(config, 10).await;
    let c = &server.client;
    for path in ["/api/seckill/3", "/api/seckill/99", "/api/seckill/x"] {
        c.get(server.url(path)).send().await.unwrap();
    }
    c.get(server.url("/api/ping")).send().await.unwrap();
    let wrong_method = c.delete(server.url("/api/ping")).send().await.unwrap();
    assert_eq!(wrong_method.status().as_u16(), 405);
    for path in ["/nope", "/api/seckill/3/extra", "/api/seckill/"] {
        let r = c.get(server.url(path)).send().await.unwrap();
        assert_eq!(r.status().as_u16(), 404, "{path}");
    }
    let text = server.metrics_text().await;
    let count = |route: &str, outcome: &str, status: &str| {
        common::prom_value(
            &text,
            "bloomgate_requests_total",
            &[("route", route), ("outcome", outcome), ("status", status)],
        )
        .unwrap_or(0.0)
    };
    let read = "/api/seckill/{sku_id}";
    assert_eq!(count(read, "db_found", "200"), 1.0, "{text}");
    assert_eq!(count(read, "filter_rejected", "404"), 1.0, "{text}");
    assert_eq!(count(read, "client_error", "400"), 1.0, "{text}");
    assert_eq!(count("/api/ping", "ok", "200"), 1.0, "{text}");
    assert_eq!(count("/api/ping", "client_error", "405"), 1.0, "{text}");
    assert_eq!(count("(unmatched)", "client_error", "404"), 3.0, "{text}");
    assert!(!text.contains("/nope") && !text.contains("extra"), "{text}");
    server.stop().await;
}
