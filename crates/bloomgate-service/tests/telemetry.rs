//! Request ids: a client's `x-request-id` is echoed, and a request without
//! one gets a fresh id, on every answer including errors.

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
