//! Shared test harness: real services (SQLite always; MariaDB, PostgreSQL and
//! Redis on this machine), one isolated database or key prefix per test, and
//! the service started in-process on port 0.
#![allow(dead_code)]

use std::time::Duration;

use bloomgate_service::{AppState, Config};
use tokio::sync::oneshot;

pub mod upstream;

pub const MYSQL_ADMIN_URL: &str = "mysql://root@127.0.0.1:3306/test";
pub const POSTGRES_ADMIN_URL: &str = "postgres://postgres@127.0.0.1:5432/test";
pub const REDIS_URL: &str = "redis://127.0.0.1:6379/";

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_string())
}

/// Under `CI=true` a missing service fails the test; elsewhere the test is
/// skipped with a message.
pub fn unavailable(service: &str, why: &str) -> Option<String> {
    let msg = format!("{service} unreachable: {why}");
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("{msg} (CI=true: services must be up)");
    }
    eprintln!("SKIPPED: {msg}");
    None
}

/// Drops and recreates database `bg_{name}` through the admin URL in
/// `env_var` (default `admin_default`); returns the new database's URL.
async fn fresh_database(
    service: &str,
    env_var: &str,
    admin_default: &str,
    drop_suffix: &str,
    name: &str,
) -> Option<String> {
    use sqlx::Executor;
    sqlx::any::install_default_drivers();
    let admin = env_or(env_var, admin_default);
    let pool = match sqlx::AnyPool::connect(&admin).await {
        Ok(p) => p,
        Err(e) => return unavailable(service, &e.to_string()),
    };
    let db = format!("bg_{name}");
    pool.execute(format!("DROP DATABASE IF EXISTS {db}{drop_suffix}").as_str())
        .await
        .unwrap();
    pool.execute(format!("CREATE DATABASE {db}").as_str())
        .await
        .unwrap();
    pool.close().await;
    let base = admin.rsplit_once('/').map_or(admin.as_str(), |(b, _)| b);
    Some(format!("{base}/{db}"))
}

/// A fresh MariaDB database for this test; returns its URL.
pub async fn mysql_database(name: &str) -> Option<String> {
    fresh_database(
        "MariaDB",
        "BLOOMGATE_TEST_MYSQL_URL",
        MYSQL_ADMIN_URL,
        "",
        name,
    )
    .await
}

/// A fresh PostgreSQL database for this test; returns its URL.
pub async fn postgres_database(name: &str) -> Option<String> {
    fresh_database(
        "PostgreSQL",
        "BLOOMGATE_TEST_POSTGRES_URL",
        POSTGRES_ADMIN_URL,
        " WITH (FORCE)",
        name,
    )
    .await
}

/// A Redis URL if the server answers PING.
pub async fn redis_url() -> Option<String> {
    let url = env_or("BLOOMGATE_TEST_REDIS_URL", REDIS_URL);
    let client = redis::Client::open(url.as_str()).unwrap();
    match client.get_multiplexed_async_connection().await {
        Ok(mut c) => match redis::cmd("PING").query_async::<String>(&mut c).await {
            Ok(_) => Some(url),
            Err(e) => unavailable("Redis", &e.to_string()),
        },
        Err(e) => unavailable("Redis", &e.to_string()),
    }
}

/// A raw Redis connection for inspecting what the service wrote.
pub async fn redis_conn(url: &str) -> redis::aio::MultiplexedConnection {
    redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

/// Keys under `prefix`, by SCAN.
pub async fn redis_keys(conn: &mut redis::aio::MultiplexedConnection, prefix: &str) -> Vec<String> {
    let mut cursor = 0u64;
    let mut keys = Vec::new();
    loop {
        let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(format!("{prefix}*"))
            .arg("COUNT")
            .arg(1000)
            .query_async(conn)
            .await
            .unwrap();
        keys.extend(batch);
        if next == 0 {
            return keys;
        }
        cursor = next;
    }
}

/// Deletes every key under `prefix`.
pub async fn redis_clear(url: &str, prefix: &str) {
    let mut c = redis_conn(url).await;
    for k in redis_keys(&mut c, prefix).await {
        let _: () = redis::cmd("DEL").arg(k).query_async(&mut c).await.unwrap();
    }
}

/// A SQLite database in a fresh temporary directory.
pub fn sqlite_url(dir: &tempfile::TempDir) -> String {
    format!("sqlite://{}/skus.db", dir.path().display())
}

/// A config for tests: the given stores, a unique Redis prefix, seeding off.
pub fn config(database_url: &str, redis_url: Option<&str>, prefix: &str) -> Config {
    let mut c = Config {
        database_url: database_url.into(),
        redis_url: redis_url.map(Into::into),
        seed_if_empty: 0,
        // The demo SKU table beside any resources a test adds (it is off
        // by default once resources are configured).
        demo: Some(true),
        ..Config::default()
    };
    c.listen = "127.0.0.1:0".parse().unwrap();
    c.cache.redis_prefix = format!("bgtest:{prefix}:");
    c
}

/// The service running in-process on an ephemeral port.
pub struct TestServer {
    pub base: String,
    /// The Redis-protocol listener's address, when `resp.listen` was set
    /// (the test binds port 0 instead).
    pub resp: Option<std::net::SocketAddr>,
    /// The HTTP gate's address, when `gate.listen` was set (bound on
    /// port 0 instead).
    pub gate: Option<std::net::SocketAddr>,
    pub state: AppState,
    pub client: reqwest::Client,
    stop: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<std::io::Result<()>>>,
}

impl TestServer {
    /// Connects, seeds `seed` catalogue SKUs if the table is empty, runs the
    /// start-up preparation (filter build if configured) to completion, and
    /// starts serving.
    pub async fn start(config: Config, seed: u64) -> Self {
        Self::start_with(config, seed, true).await
    }

    /// As [`TestServer::start`]; with `wait_for_build` false it serves at
    /// once while the start-up build runs, as `bloomgate serve` does.
    pub async fn start_with(mut config: Config, seed: u64, wait_for_build: bool) -> Self {
        config.seed_if_empty = seed;
        let state = AppState::connect(&config).await.expect("service starts");
        let build = bloomgate_service::prepare(&state, &config).await.unwrap();
        if let (Some(build), true) = (build, wait_for_build) {
            build.await.unwrap();
        }
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let resp = match config.resp.listen {
            // The configured address (tests give port 0).
            Some(addr) => Some(tokio::net::TcpListener::bind(addr).await.unwrap()),
            None => None,
        };
        let resp_addr = resp.as_ref().map(|l| l.local_addr().unwrap());
        let (tx, rx) = oneshot::channel::<()>();
        let gate = match config.gate.listen {
            // The configured address (tests give port 0).
            Some(addr) => Some(tokio::net::TcpListener::bind(addr).await.unwrap()),
            None => None,
        };
        let gate_addr = gate.as_ref().map(|l| l.local_addr().unwrap());
        let task = tokio::spawn(bloomgate_service::run_with(
            listener,
            bloomgate_service::Listeners { resp, gate },
            state.clone(),
            async {
                let _ = rx.await;
            },
        ));
        Self {
            resp: resp_addr,
            gate: gate_addr,
            base: format!("http://{addr}"),
            state,
            client: reqwest::Client::builder()
                .timeout(Duration::from_secs(30))
                .build()
                .unwrap(),
            stop: Some(tx),
            task: Some(task),
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    pub async fn get(&self, path: &str) -> (u16, serde_json::Value) {
        let r = self.client.get(self.url(path)).send().await.unwrap();
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(serde_json::Value::Null))
    }

    /// The stats body as text, for seed 000's grep.
    pub async fn stats_text(&self) -> String {
        let r = self
            .client
            .get(self.url("/api/cache/stats"))
            .send()
            .await
            .unwrap();
        r.text().await.unwrap()
    }

    /// `GET /metrics`: the Prometheus text (checked to be 200 and the
    /// exposition format's content type).
    pub async fn metrics_text(&self) -> String {
        let r = self.client.get(self.url("/metrics")).send().await.unwrap();
        assert_eq!(r.status(), 200);
        let ct = r.headers()["content-type"].to_str().unwrap().to_string();
        assert!(ct.starts_with("text/plain; version=0.0.4"), "{ct}");
        r.text().await.unwrap()
    }

    pub async fn stats(&self) -> serde_json::Value {
        self.get("/api/cache/stats").await.1
    }

    pub async fn send(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<&str>,
    ) -> (u16, serde_json::Value) {
        let mut req = self
            .client
            .request(method, self.url(path))
            .header("content-type", "application/json");
        if let Some(b) = body {
            req = req.body(b.to_string());
        }
        let r = req.send().await.unwrap();
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(serde_json::Value::Null))
    }

    /// `POST /api/cache/warm` with `body` (seed 000's JSON).
    pub async fn warm(&self, body: &str) -> (u16, serde_json::Value) {
        self.send(reqwest::Method::POST, "/api/cache/warm", Some(body))
            .await
    }

    /// `POST /api/skus` of SKU `id` named `name`; the status.
    pub async fn create(&self, id: i64, name: &str) -> u16 {
        self.send(
            reqwest::Method::POST,
            "/api/skus",
            Some(&sku_body(Some(id), name, 100)),
        )
        .await
        .0
    }

    /// `PUT /api/skus/{id}` with a SKU body of `name` and `price`.
    pub async fn put_sku(&self, id: i64, name: &str, price: i64) -> (u16, serde_json::Value) {
        self.send(
            reqwest::Method::PUT,
            &format!("/api/skus/{id}"),
            Some(&sku_body(None, name, price)),
        )
        .await
    }

    /// Stops accepting, drains, and waits for the server task.
    pub async fn stop(mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.task.take() {
            t.await.unwrap().unwrap();
        }
        self.state.skus.source().close().await;
    }
}

/// A SKU body for the write endpoints.
pub fn sku_body(id: Option<i64>, name: &str, price: i64) -> String {
    let id = id.map_or(String::new(), |i| format!("\"id\":{i},"));
    format!(
        "{{{id}\"name\":\"{name}\",\"original_price\":{price},\"seckill_price\":{},\"stock\":10,\"seckill_start\":1767225600,\"seckill_end\":1767232800}}",
        price / 2
    )
}

pub fn counter(v: &serde_json::Value, path: &[&str]) -> i64 {
    path.iter()
        .fold(v, |v, k| &v[*k])
        .as_i64()
        .unwrap_or_else(|| panic!("no counter {path:?} in {v}"))
}

/// Polls `f` every 10 ms until it is true; panics after `secs` seconds.
pub async fn eventually<F, Fut>(secs: u64, what: &str, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = std::time::Instant::now() + Duration::from_secs(secs);
    while !f().await {
        assert!(
            std::time::Instant::now() < deadline,
            "not within {secs} s: {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A loopback port that was free a moment ago.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn signal(pid: u32, sig: &str) {
    let ok = std::process::Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "kill {sig} {pid}");
}

pub async fn wait_port(port: u16, up: bool) {
    for _ in 0..300 {
        let open = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_ok();
        if open == up {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!(
        "port {port} did not become {}",
        if up { "open" } else { "closed" }
    );
}

/// A server process this test owns, on its own loopback port: it can be
/// stopped, restarted, paused (SIGSTOP) and resumed; killed when dropped.
pub struct OwnServer {
    pub port: u16,
    program: String,
    args: Vec<String>,
    child: Option<std::process::Child>,
    _dir: tempfile::TempDir,
}

impl OwnServer {
    fn spawn(&mut self) {
        let child = std::process::Command::new(&self.program)
            .args(&self.args)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", self.program));
        self.child = Some(child);
    }

    /// Starts (again) and waits until the port accepts connections.
    pub async fn start(&mut self) {
        self.spawn();
        wait_port(self.port, true).await;
    }

    /// Kills the process and waits until the port is closed.
    pub async fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        wait_port(self.port, false).await;
    }

    /// Freezes the process (SIGSTOP): connections hang, nothing answers.
    pub fn pause(&self) {
        signal(self.child.as_ref().unwrap().id(), "-STOP");
    }

    /// Thaws it (SIGCONT).
    pub fn resume(&self) {
        signal(self.child.as_ref().unwrap().id(), "-CONT");
    }

    /// A Redis server with no persistence on a free port.
    pub async fn redis() -> Self {
        Self::redis_on(free_port(), &[]).await
    }

    /// A Redis with no persistence on `port`, with `extra` arguments.
    pub async fn redis_on(port: u16, extra: &[&str]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let mut args: Vec<String> = [
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            &dir.path().display().to_string(),
        ]
        .iter()
        .map(|a| (*a).to_string())
        .collect();
        args.extend(extra.iter().map(|a| (*a).to_string()));
        let mut s = Self {
            port,
            program: "redis-server".into(),
            args,
            child: None,
            _dir: dir,
        };
        s.start().await;
        s
    }

    /// A Redis Cluster node (no persistence; its `nodes.conf` kept in
    /// its own directory, so a restart rejoins the cluster empty) on a
    /// free port whose bus port (+10000) is free too.
    async fn redis_cluster_node(taken: &[u16], extra: &[&str]) -> Self {
        let port = loop {
            let p = free_port();
            if p < 55_000
                && !taken.contains(&p)
                && std::net::TcpListener::bind(("127.0.0.1", p + 10_000)).is_ok()
            {
                break p;
            }
        };
        let cluster = [
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-node-timeout",
            "2000",
        ];
        let args: Vec<&str> = cluster.iter().chain(extra).copied().collect();
        // `{port}` in `extra` is this node's port (a TLS node's `--tls-port`).
        let port_text = port.to_string();
        let args: Vec<&str> = args
            .into_iter()
            .map(|a| if a == "{port}" { port_text.as_str() } else { a })
            .collect();
        Self::redis_on(port, &args).await
    }

    /// A MariaDB server with a fresh data directory on a free port, root
    /// without a password, database `test`.
    pub async fn mariadb() -> Self {
        Self::mariadb_with(&[]).await
    }

    /// As [`OwnServer::mariadb`], with `extra` server arguments (TLS,
    /// say); the admin connection prefers TLS, so a server that requires
    /// it is set up too.
    pub async fn mariadb_with(extra: &[String]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        // Two tests installing at once have been seen to fail once under
        // load: try again after a pause, with a fresh directory, and show
        // what it said if that fails too.
        let mut why = String::new();
        for attempt in 0..3 {
            let _ = std::fs::remove_dir_all(&data);
            let out = std::process::Command::new("mariadb-install-db")
                .args([
                    "--no-defaults",
                    &format!("--datadir={}", data.display()),
                    "--user=root",
                    "--auth-root-authentication-method=normal",
                    "--skip-test-db",
                ])
                .output()
                .expect("mariadb-install-db");
            if out.status.success() {
                why.clear();
                break;
            }
            why = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            eprintln!("mariadb-install-db failed (attempt {}): {why}", attempt + 1);
            std::thread::sleep(Duration::from_millis(500));
        }
        assert!(why.is_empty(), "mariadb-install-db failed: {why}");
        let port = free_port();
        let mut s = Self {
            port,
            program: "mariadbd".into(),
            args: vec![
                "--no-defaults".into(),
                format!("--datadir={}", data.display()),
                format!("--port={port}"),
                "--bind-address=127.0.0.1".into(),
                format!("--socket={}", dir.path().join("sock").display()),
                "--user=root".into(),
                "--skip-log-bin".into(),
                "--innodb-buffer-pool-size=32M".into(),
            ]
            .into_iter()
            .chain(extra.iter().cloned())
            .collect(),
            child: None,
            _dir: dir,
        };
        s.start().await;
        sqlx::any::install_default_drivers();
        let admin = format!("mysql://root@127.0.0.1:{port}/mysql");
        let pool = sqlx::AnyPool::connect(&admin).await.unwrap();
        sqlx::query("CREATE DATABASE IF NOT EXISTS test")
            .execute(&pool)
            .await
            .unwrap();
        pool.close().await;
        s
    }

    /// The server's URL (`redis://…` or `mysql://…/test`).
    pub fn url(&self) -> String {
        if self.program == "redis-server" {
            format!("redis://127.0.0.1:{}/", self.port)
        } else {
            format!("mysql://root@127.0.0.1:{}/test", self.port)
        }
    }
}

impl Drop for OwnServer {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = std::process::Command::new("kill")
                .args(["-CONT", &c.id().to_string()])
                .status();
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A program the test needs (promtool, prometheus, chromium): its path,
/// or, when it is not installed, a failure under `CI=true` (`.ci/run`
/// installs them) and a skip elsewhere.
pub fn tool(name: &str) -> Option<std::path::PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    for dir in std::env::split_paths(&path) {
        let candidate = dir.join(name);
        if candidate.is_file() {
            return Some(candidate);
        }
    }
    unavailable(name, "not on PATH (apt-get install it; .ci/run does)");
    None
}

/// One sample of a Prometheus text exposition: the value of `name` with
/// exactly `labels` (in any order), if present.
pub fn prom_value(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            let (metric, rest) = match series.split_once('{') {
                Some((m, r)) => (m, r.strip_suffix('}')?),
                None => (series, ""),
            };
            if metric != name {
                return None;
            }
            let mut got: Vec<(&str, &str)> = if rest.is_empty() {
                vec![]
            } else {
                rest.split("\",")
                    .map(|kv| {
                        let (k, v) = kv.split_once("=\"").expect("label k=\"v\"");
                        (k, v.trim_end_matches('"'))
                    })
                    .collect()
            };
            let mut want = labels.to_vec();
            got.sort_unstable();
            want.sort_unstable();
            (got == want).then(|| value.parse().expect("a number"))
        })
}

/// Parks `server`'s change-outbox follower before its next read, and turns
/// the filter audit off (for good), so no background statement reaches SQL
/// while a test counts statements; the returned pause resumes the follower.
pub async fn quiet_sql(server: &TestServer) -> std::sync::Arc<bloomgate_service::pause::Pause> {
    server.state.skus.set_audit_every(0);
    for r in &server.state.resources {
        r.set_audit_every(0);
    }
    let pause = server.state.outbox.before_poll.arm(0);
    pause.reached().await;
    pause
}

/// A three-master Redis Cluster of the test's own (no replicas), its
/// nodes on loopback ports; killed when dropped.
pub struct OwnCluster {
    pub nodes: Vec<OwnServer>,
    /// What `redis-cli` needs beside the port (TLS options).
    cli_args: Vec<String>,
    /// `redis` or `rediss`.
    scheme: &'static str,
}

impl OwnCluster {
    /// Starts three nodes, joins them with `redis-cli --cluster create`
    /// and waits until every node reports `cluster_state:ok`.
    pub async fn start() -> Self {
        Self::start_with(&[], &[], "redis").await
    }

    /// As [`OwnCluster::start`], with `node_args` for each node (`{port}`
    /// standing for its port) and `cli_args` for `redis-cli`, whose URLs
    /// use `scheme`: a TLS cluster.
    pub async fn start_with(node_args: &[&str], cli_args: &[&str], scheme: &'static str) -> Self {
        let mut nodes: Vec<OwnServer> = Vec::new();
        for _ in 0..3 {
            let taken: Vec<u16> = nodes.iter().map(|n| n.port).collect();
            nodes.push(OwnServer::redis_cluster_node(&taken, node_args).await);
        }
        let addrs: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let out = std::process::Command::new("redis-cli")
            .args(cli_args)
            .args(["--cluster", "create"])
            .args(&addrs)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .output()
            .expect("redis-cli runs");
        assert!(
            out.status.success(),
            "cluster create failed: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let cluster = Self {
            nodes,
            cli_args: cli_args.iter().map(|a| (*a).to_string()).collect(),
            scheme,
        };
        cluster.wait_ok().await;
        cluster
    }

    /// Waits until every node says `cluster_state:ok`.
    pub async fn wait_ok(&self) {
        for n in &self.nodes {
            eventually(30, "cluster_state:ok", || async {
                self.cli(n.port, &["cluster", "info"])
                    .contains("cluster_state:ok")
            })
            .await;
        }
    }

    /// `redis-cli -p port args…`'s output.
    pub fn cli(&self, port: u16, args: &[&str]) -> String {
        let out = std::process::Command::new("redis-cli")
            .args(&self.cli_args)
            .args(["-h", "127.0.0.1", "-p", &port.to_string()])
            .args(args)
            .output()
            .expect("redis-cli runs");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The seed node URLs, for `redis_cluster`.
    pub fn urls(&self) -> Vec<String> {
        self.nodes
            .iter()
            .map(|n| format!("{}://127.0.0.1:{}", self.scheme, n.port))
            .collect()
    }

    /// The index of the node that serves `key`'s slot.
    pub fn node_of(&self, key: &str) -> usize {
        let slot: u16 = self
            .cli(self.nodes[0].port, &["cluster", "keyslot", key])
            .trim()
            .parse()
            .expect("a slot");
        let shards = self.cli(self.nodes[0].port, &["cluster", "slots"]);
        // `CLUSTER SLOTS` lists `start end ip port id` per range.
        let words: Vec<&str> = shards.lines().map(str::trim).collect();
        for w in words.windows(4) {
            let (Ok(lo), Ok(hi)) = (w[0].parse::<u16>(), w[1].parse::<u16>()) else {
                continue;
            };
            if (lo..=hi).contains(&slot) && w[2] == "127.0.0.1" {
                let port: u16 = w[3].parse().expect("a port");
                return self
                    .nodes
                    .iter()
                    .position(|n| n.port == port)
                    .expect("a node");
            }
        }
        panic!("no node serves slot {slot}: {shards}");
    }

    /// Keys on node `i` (`DBSIZE`); panics when the node does not answer
    /// a number (an unreachable node is not an empty one).
    pub fn keys_on(&self, i: usize) -> u64 {
        let out = self.cli(self.nodes[i].port, &["dbsize"]);
        out.trim()
            .parse()
            .unwrap_or_else(|_| panic!("node {i} answered DBSIZE with {out:?}"))
    }
}

/// A request's status, content type and body, and whether it carried a
/// request id (ids differ between requests; their presence is compared).
pub async fn seen(
    server: &TestServer,
    method: reqwest::Method,
    path: &str,
) -> (u16, String, Vec<u8>, bool) {
    let r = server
        .client
        .request(method, server.url(path))
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let header = |name: &str| {
        r.headers()
            .get(name)
            .map(|v| v.to_str().unwrap().to_owned())
    };
    let kind = header("content-type").unwrap_or_default();
    let has_id = header("x-request-id").is_some_and(|id| !id.is_empty());
    (status, kind, r.bytes().await.unwrap().to_vec(), has_id)
}

/// Runs `promtool check metrics` on `text` when promtool is installed
/// (under `CI=true` it must be); panics with promtool's words when it
/// refuses the exposition.
pub fn promtool_check(who: &str, text: &str) {
    let Some(promtool) = tool("promtool") else {
        return;
    };
    use std::io::Write;
    let mut child = std::process::Command::new(&promtool)
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool on {who}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A text-keyed `users` resource (keys `u000001`…) with the defaults the
/// tests start from: sized for 1,000 keys at 1%, no watch, `[cache]`'s
/// mode, snapshot and rebuild settings.
pub fn users_resource(name: &str) -> bloomgate_service::config::resources::ResourceConfig {
    bloomgate_service::config::resources::ResourceConfig {
        name: name.into(),
        table: "users".into(),
        key: "id".into(),
        key_type: bloomgate_service::key::KeyType::Text,
        columns: Vec::new(),
        bloom_expected: 1000,
        bloom_fpp: 0.01,
        bloom_layout: bloomgate_service::config::BloomLayout::Blocked,
        max_batch_keys: 50,
        watch_column: None,
        watch_every_ms: 1000,
        bloom_snapshot_path: None,
        bloom_mode: None,
        bloom_auto_rebuild: None,
        bloom_segment_bytes: None,
        bloom_rebuild_after_deletes: None,
        capture: bloomgate_service::config::Capture::None,
    }
}

/// A plain SQL pool on `url`: the test's own connection, as another
/// program writing the tables would have (SQLite's file made if missing).
pub async fn sql_pool(url: &str) -> sqlx::AnyPool {
    sqlx::any::install_default_drivers();
    let url = if url.starts_with("sqlite") {
        format!("{url}?mode=rwc")
    } else {
        url.to_owned()
    };
    sqlx::AnyPool::connect(&url).await.unwrap()
}

/// A `users (id, name)` table of the application's, with `ids` (each
/// named after itself), made through `pool` as another program would.
pub async fn users_table(pool: &sqlx::AnyPool, ids: &[&str]) {
    sqlx::query(
        "CREATE TABLE users (id VARCHAR(32) NOT NULL PRIMARY KEY, name VARCHAR(100) NOT NULL)",
    )
    .execute(pool)
    .await
    .unwrap();
    for id in ids {
        sqlx::query(&format!("INSERT INTO users VALUES ('{id}', 'user {id}')"))
            .execute(pool)
            .await
            .unwrap();
    }
}

/// `url` with the user (and password) replaced: `user` may be
/// `name:password`.
pub fn as_user(url: &str, user: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap();
    let host = rest.split_once('@').map_or(rest, |(_, h)| h);
    format!("{scheme}://{user}@{host}")
}
