//! The HTTP gate's auth-request check behind the proxies people already
//! run, with the configs the docs give (`docs/gate/`), read as files and
//! run against real binaries: nginx (`auth_request`, from Debian's
//! nginx-light) and Caddy (`forward_auth`). An absent key is answered
//! 404 by the front and never reaches the upstream; a present one does.

mod common;

use std::time::Duration;

use bloomgate_service::config::Capture;
use common::upstream::Upstream;
use common::{eventually, TestServer};

/// The addresses the docs' configs name.
const DOC_BLOOMGATE: &str = "127.0.0.1:8080";
const DOC_API: &str = "127.0.0.1:9000";
const DOC_FRONT: &str = "127.0.0.1:8000";

fn doc(name: &str) -> String {
    std::fs::read_to_string(format!(
        "{}/../../docs/gate/{name}",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap()
}

/// `program` if installed; under `CI=true` a missing one fails the test.
fn installed(program: &str) -> Option<String> {
    let found = ["/usr/sbin", "/usr/bin", "/usr/local/bin"]
        .iter()
        .map(|d| format!("{d}/{program}"))
        .find(|p| std::path::Path::new(p).exists());
    if found.is_none() {
        common::unavailable(program, "not installed (.ci/run installs it)");
    }
    found
}

/// A front proxy process, stopped when dropped: SIGTERM, so nginx's
/// master stops its workers too (a SIGKILL would orphan them).
struct Front(std::process::Child);

impl Drop for Front {
    fn drop(&mut self) {
        let _ = std::process::Command::new("kill")
            .args(["-TERM", &self.0.id().to_string()])
            .status();
        let _ = self.0.wait();
    }
}

/// bloomgate with the docs' route over `users` (u1 in it), and the
/// upstream, and the docs' config text with its addresses made real.
async fn setup(config: &str) -> (TestServer, Upstream, String, u16, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let url = common::sqlite_url(&dir);
    let up = Upstream::start().await;
    let writer = common::sql_pool(&url).await;
    common::users_table(&writer, &["u1", "gone"]).await;
    let mut c = common::config(&url, None, "gate-peers");
    c.demo = Some(false);
    let mut users = common::users_resource("users");
    users.capture = Capture::Triggers;
    c.resources.push(users);
    // The gate too, whose forwarded 404s the check answers from.
    c.gate.listen = Some("127.0.0.1:0".parse().unwrap());
    c.gate.upstream = up.url();
    c.gate.routes.push(
        toml::from_str(
            "path = \"/api/profiles/{key}\"\nresource = \"users\"\ncache_not_found_secs = 60\n",
        )
        .unwrap(),
    );
    let s = TestServer::start(c, 0).await;
    eventually(10, "ready", || async { s.get("/readyz").await.0 == 200 }).await;
    // Deleted after the build: still a "maybe", and the API's 404.
    sqlx::query("DELETE FROM users WHERE id = 'gone'")
        .execute(&writer)
        .await
        .unwrap();
    up.seen.set_missing("/api/profiles/gone", true);
    let front = common::free_port();
    let text = config
        .replace(DOC_BLOOMGATE, s.base.trim_start_matches("http://"))
        .replace(DOC_API, &up.addr.to_string())
        .replace(DOC_FRONT, &format!("127.0.0.1:{front}"));
    (s, up, text, front, dir)
}

async fn judged_through(front: u16, up: &Upstream) {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let get = |path: &str| {
        let req = client.get(format!("http://127.0.0.1:{front}{path}"));
        async move {
            let r = req.send().await.unwrap();
            (r.status().as_u16(), r.text().await.unwrap())
        }
    };
    let (status, body) = get("/api/profiles/nobody").await;
    assert_eq!(status, 404, "{body}");
    assert!(body.contains("not_found"), "{body}");
    assert_eq!(
        up.seen.at("/api/profiles/nobody"),
        0,
        "refused before the API"
    );
    let (status, body) = get("/api/profiles/u1?x=1").await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("/api/profiles/u1?x=1"), "{body}");
    assert_eq!(get("/elsewhere").await.0, 200);
    assert_eq!(up.seen.at("/api/profiles/u1"), 1);
    // A client that sends the other proxy's headers, naming an unrouted
    // path, does not get its absent key past the check.
    for (uri, method) in [
        ("x-original-uri", "x-original-method"),
        ("x-forwarded-uri", "x-forwarded-method"),
    ] {
        let r = client
            .get(format!("http://127.0.0.1:{front}/api/profiles/nobody"))
            .header(uri, "/elsewhere")
            .header(method, "GET")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 404, "spoofed {uri}");
    }
    assert_eq!(
        up.seen.at("/api/profiles/nobody"),
        0,
        "refused before the API"
    );
}

/// bloomgate gone: the front lets requests through to the API (each
/// documented config fails open, as a filter that cannot vouch does).
async fn fails_open(s: TestServer, front: u16, up: &Upstream) {
    s.stop().await;
    let r = reqwest::get(format!("http://127.0.0.1:{front}/api/profiles/nobody"))
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "forwarded while bloomgate is down");
    assert_eq!(up.seen.at("/api/profiles/nobody"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nginx_auth_request_with_the_documented_config() {
    let Some(nginx) = installed("nginx") else {
        return;
    };
    let (s, up, site, front, _dir) = setup(&doc("nginx.conf")).await;
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path().display();
    std::fs::write(tmp.path().join("site.conf"), site).unwrap();
    // The main config a distribution ships, reduced: the docs' file is
    // what goes in conf.d.
    let main = format!(
        "worker_processes 1;\npid {t}/nginx.pid;\nerror_log {t}/error.log;\nevents {{ worker_connections 256; }}\n\
         http {{\n access_log off;\n client_body_temp_path {t}/body;\n proxy_temp_path {t}/proxy;\n\
         fastcgi_temp_path {t}/fastcgi;\n uwsgi_temp_path {t}/uwsgi;\n scgi_temp_path {t}/scgi;\n\
         include {t}/site.conf;\n}}\n"
    );
    std::fs::write(tmp.path().join("nginx.conf"), main).unwrap();
    let child = std::process::Command::new(nginx)
        .args([
            "-p",
            &t.to_string(),
            "-c",
            &format!("{t}/nginx.conf"),
            "-g",
            "daemon off;",
        ])
        .spawn()
        .unwrap();
    let _front = Front(child);
    common::wait_port(front, true).await;
    judged_through(front, &up).await;
    // A 404 the API gave the gate for a Host is answered by the check for
    // that Host (the documented config passes the client's on), without
    // the API; another Host's request still reaches it. Before, the
    // subrequest named the upstream block, and every one was forwarded.
    let gone = "/api/profiles/gone";
    let ask = |url: String, host: &'static str| async move {
        let r = reqwest::Client::new().get(url).header("host", host);
        r.send().await.unwrap().status().as_u16()
    };
    let gate = format!("http://{}{gone}", s.gate.unwrap());
    assert_eq!(ask(gate, "api.test").await, 404);
    assert_eq!(up.seen.at(gone), 1, "the gate forwarded it once");
    let via_nginx = format!("http://127.0.0.1:{front}{gone}");
    assert_eq!(ask(via_nginx.clone(), "api.test").await, 404);
    assert_eq!(up.seen.at(gone), 1, "answered from the gate's memory");
    assert_eq!(ask(via_nginx, "other.test").await, 404);
    assert_eq!(up.seen.at(gone), 2, "another Host's request forwarded");
    fails_open(s, front, &up).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn caddy_forward_auth_with_the_documented_config() {
    let Some(caddy) = installed("caddy") else {
        return;
    };
    let (s, up, caddyfile, front, _dir) = setup(&doc("Caddyfile")).await;
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("Caddyfile");
    std::fs::write(&file, caddyfile).unwrap();
    let child = std::process::Command::new(caddy)
        .args(["run", "--adapter", "caddyfile", "--config"])
        .arg(&file)
        .env("HOME", tmp.path())
        .env("XDG_DATA_HOME", tmp.path())
        .env("XDG_CONFIG_HOME", tmp.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let _front = Front(child);
    common::wait_port(front, true).await;
    judged_through(front, &up).await;
    // A query's `é` (as a browser sends it, escaped) is no reason to
    // refuse or fail: the check reads the path alone. Caddy 2.6 answers a
    // request whose target holds the raw bytes with an empty 200 of its
    // own, before any handler: the check's reading of raw bytes is tested
    // in http_gate.rs.
    let client = reqwest::Client::new();
    for (key, want, seen) in [("u1", 200, 2), ("nobody", 404, 0)] {
        let url = format!("http://127.0.0.1:{front}/api/profiles/{key}?q=é");
        let r = client.get(url).send().await.unwrap();
        assert_eq!(r.status(), want, "{key}");
        assert_eq!(up.seen.at(&format!("/api/profiles/{key}")), seen, "{key}");
    }
    fails_open(s, front, &up).await;
}
