//! TLS on every connection (issue 34), against servers of the test's own
//! on other loopback ports, with certificates the test makes with
//! `openssl`; never the machine's own servers:
//! - a PostgreSQL cluster (`initdb` as the `postgres` user, `ssl = on`,
//!   only `hostssl` lines) and a MariaDB (`--require-secure-transport`):
//!   `verify-full` / `VERIFY_IDENTITY` with the test CA creates and reads;
//!   another CA, another host name and a plain-TCP URL are refused with an
//!   error naming `database_url`;
//! - a TLS-only Redis (`--port 0 --tls-port`, client certificates
//!   required, an ACL user): values, leases, the doorbell and strict mode
//!   between two instances; a three-node TLS Cluster passes a
//!   create/read/rebuild round;
//! - passwords in both URLs never reach a log line, an error, the stats,
//!   `/metrics` or the dashboard.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use bloomgate_service::config::BloomMode;
use bloomgate_service::{AppState, Config};
use common::{counter, eventually, OwnCluster, OwnServer, TestServer};

/// A CA, a second CA, and certificates signed by the first: the servers'
/// (naming 127.0.0.1 only) and a client's.
struct Pki {
    dir: tempfile::TempDir,
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("openssl runs");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

impl Pki {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        // Readable by the `postgres` user, which the PostgreSQL test runs as.
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let d = dir.path();
        let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"];
        for ca in ["ca", "other_ca"] {
            let (key, crt) = (format!("{ca}.key"), format!("{ca}.crt"));
            let subj = format!("/CN=bloomgate test {ca}");
            let mut args = vec!["req", "-x509", "-nodes", "-days", "2"];
            args.extend(ec);
            args.extend(["-keyout", &key, "-out", &crt, "-subj", &subj]);
            openssl(d, &args);
        }
        std::fs::write(
            d.join("server.ext"),
            "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=serverAuth,clientAuth\n",
        )
        .unwrap();
        std::fs::write(
            d.join("client.ext"),
            "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=clientAuth\n",
        )
        .unwrap();
        for (name, ext) in [("server", "server.ext"), ("client", "client.ext")] {
            let (key, csr, crt) = (
                format!("{name}.key"),
                format!("{name}.csr"),
                format!("{name}.crt"),
            );
            let subj = format!("/CN=bloomgate test {name}");
            let mut args = vec!["req", "-nodes"];
            args.extend(ec);
            args.extend(["-keyout", &key, "-out", &csr, "-subj", &subj]);
            openssl(d, &args);
            openssl(
                d,
                &[
                    "x509",
                    "-req",
                    "-in",
                    &csr,
                    "-CA",
                    "ca.crt",
                    "-CAkey",
                    "ca.key",
                    "-CAcreateserial",
                    "-days",
                    "2",
                    "-out",
                    &crt,
                    "-extfile",
                    ext,
                ],
            );
        }
        for f in std::fs::read_dir(d).unwrap() {
            let p = f.unwrap().path();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        }
        Self { dir }
    }

    fn path(&self, file: &str) -> PathBuf {
        self.dir.path().join(file)
    }

    fn arg(&self, file: &str) -> String {
        self.path(file).display().to_string()
    }
}

fn uid_of(user: &str) -> Option<(u32, u32)> {
    let id = |flag: &str| -> Option<u32> {
        let out = Command::new("id").args([flag, user]).output().ok()?;
        String::from_utf8_lossy(&out.stdout).trim().parse().ok()
    };
    Some((id("-u")?, id("-g")?))
}

/// A PostgreSQL cluster of the test's own, run as `postgres` (PostgreSQL
/// refuses root), accepting TLS connections only.
struct OwnPostgres {
    port: u16,
    child: Child,
    _dir: tempfile::TempDir,
}

impl OwnPostgres {
    async fn start(pki: &Pki) -> Self {
        use std::os::unix::process::CommandExt;
        let (uid, gid) = uid_of("postgres").expect("a postgres user (the PostgreSQL package)");
        let bin = Command::new("pg_config")
            .arg("--bindir")
            .output()
            .expect("pg_config");
        let bin = PathBuf::from(String::from_utf8_lossy(&bin.stdout).trim());
        let dir = tempfile::tempdir().unwrap();
        std::os::unix::fs::chown(dir.path(), Some(uid), Some(gid)).unwrap();
        let data = dir.path().join("data");
        let out = Command::new(bin.join("initdb"))
            .args(["-D", &data.display().to_string()])
            .args(["-A", "trust", "-U", "postgres", "--no-sync", "-E", "UTF8"])
            .current_dir(dir.path())
            .uid(uid)
            .gid(gid)
            .output()
            .expect("initdb runs");
        assert!(
            out.status.success(),
            "initdb: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        for f in ["server.crt", "server.key"] {
            let to = data.join(f);
            std::fs::copy(pki.path(f), &to).unwrap();
            std::os::unix::fs::chown(&to, Some(uid), Some(gid)).unwrap();
            std::fs::set_permissions(&to, std::fs::Permissions::from_mode(0o600)).unwrap();
        }
        // TLS or nothing over TCP: no `host` line, only `hostssl`.
        std::fs::write(
            data.join("pg_hba.conf"),
            "local all all trust\nhostssl all all 127.0.0.1/32 trust\n",
        )
        .unwrap();
        let port = common::free_port();
        let child = Command::new(bin.join("postgres"))
            .args(["-D", &data.display().to_string(), "-p", &port.to_string()])
            .args(["-c", "listen_addresses=127.0.0.1"])
            .args([
                "-c",
                &format!("unix_socket_directories={}", dir.path().display()),
            ])
            .args(["-c", "ssl=on", "-c", "ssl_cert_file=server.crt"])
            .args(["-c", "ssl_key_file=server.key", "-c", "fsync=off"])
            .current_dir(dir.path())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .uid(uid)
            .gid(gid)
            .spawn()
            .expect("postgres starts");
        let s = Self {
            port,
            child,
            _dir: dir,
        };
        // Up when it answers a TLS login.
        let url = s.url(pki, "require");
        eventually(30, "PostgreSQL accepts TLS logins", || {
            let url = url.clone();
            async move {
                sqlx::any::install_default_drivers();
                sqlx::AnyPool::connect(&url).await.is_ok()
            }
        })
        .await;
        s
    }

    fn url(&self, pki: &Pki, sslmode: &str) -> String {
        format!(
            "postgres://postgres@127.0.0.1:{}/postgres?sslmode={sslmode}&sslrootcert={}",
            self.port,
            pki.arg("ca.crt")
        )
    }
}

impl Drop for OwnPostgres {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A MariaDB of the test's own that requires TLS.
async fn tls_mariadb(pki: &Pki) -> OwnServer {
    OwnServer::mariadb_with(&[
        format!("--ssl-cert={}", pki.arg("server.crt")),
        format!("--ssl-key={}", pki.arg("server.key")),
        format!("--ssl-ca={}", pki.arg("ca.crt")),
        "--require-secure-transport=ON".into(),
    ])
    .await
}

fn sql_config(database_url: &str) -> Config {
    let mut c = common::config(database_url, None, "tls");
    c.cache.bloom_expected = 10_000;
    c
}

/// Start-up's error for `config`, which must fail.
async fn start_error(config: &Config) -> String {
    match AppState::connect(config).await {
        Ok(_) => panic!("the service started"),
        Err(e) => e.to_string(),
    }
}

/// The service on `url` creates a SKU and reads it back, and an unknown
/// id is a 404.
async fn creates_and_reads(url: &str) {
    let s = TestServer::start(sql_config(url), 50).await;
    assert_eq!(s.create(4242, "over-tls").await, 201);
    let (status, body) = s.get("/api/seckill/4242").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["name"], "over-tls");
    assert_eq!(s.get("/api/seckill/7").await.0, 200);
    assert_eq!(s.get("/api/seckill/900000").await.0, 404);
    s.stop().await;
}

/// The start error for another CA, another host name and plain TCP.
async fn refused(url: &str, needle: &str) -> String {
    let e = start_error(&sql_config(url)).await;
    assert!(e.starts_with("database_url: cannot connect: "), "{e}");
    assert!(
        e.to_ascii_lowercase().contains(needle),
        "`{needle}` not in: {e}"
    );
    e
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_over_tls_verifies_the_ca_and_the_host() {
    let pki = Pki::new();
    let pg = OwnPostgres::start(&pki).await;
    // The test CA, the host the certificate names.
    creates_and_reads(&pg.url(&pki, "verify-full")).await;

    // A server whose certificate comes from another CA than the one given.
    let other_ca = pg
        .url(&pki, "verify-full")
        .replace("ca.crt", "other_ca.crt");
    let e = refused(&other_ca, "certificate").await;
    assert!(e.contains("sslrootcert"), "the hint names the key: {e}");
    // A host the certificate does not name (it names 127.0.0.1 only).
    let localhost = pg
        .url(&pki, "verify-full")
        .replace("127.0.0.1", "localhost");
    refused(&localhost, "certificate").await;
    // verify-ca checks the CA (with sqlx 0.8.6 and rustls it checks the
    // host too, sqlx#3793: stricter than libpq, never looser).
    AppState::connect(&sql_config(&pg.url(&pki, "verify-ca")))
        .await
        .expect("verify-ca with the test CA");
    // Plain TCP against a server that allows TLS only.
    let e = refused(&pg.url(&pki, "disable"), "no encryption").await;
    assert!(e.contains("TLS is disabled in the URL"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_over_tls_verifies_the_ca_and_the_host() {
    let pki = Pki::new();
    let db = tls_mariadb(&pki).await;
    let url = |mode: &str, ca: &str, host: &str| {
        format!(
            "mysql://root@{host}:{}/test?ssl-mode={mode}&ssl-ca={}",
            db.port,
            pki.arg(ca)
        )
    };
    creates_and_reads(&url("VERIFY_IDENTITY", "ca.crt", "127.0.0.1")).await;

    let e = refused(
        &url("VERIFY_IDENTITY", "other_ca.crt", "127.0.0.1"),
        "certificate",
    )
    .await;
    assert!(e.contains("ssl-ca"), "the hint names the key: {e}");
    refused(
        &url("VERIFY_IDENTITY", "ca.crt", "localhost"),
        "certificate",
    )
    .await;
    AppState::connect(&sql_config(&url("VERIFY_CA", "ca.crt", "127.0.0.1")))
        .await
        .expect("VERIFY_CA with the test CA");
    // MariaDB 10.11 answers a plain login to a TLS-only server "Access
    // denied"; the hint says why.
    let e = refused(&url("DISABLED", "ca.crt", "127.0.0.1"), "access denied").await;
    assert!(e.contains("TLS is disabled in the URL"), "{e}");
}

const REDIS_USER: &str = "app";

/// A Redis that speaks TLS only (no plain port), asks every client for a
/// certificate and knows one ACL user, `app`, with `password`.
async fn tls_redis(pki: &Pki, password: &str) -> OwnServer {
    let port = common::free_port();
    let acl = format!(">{password}");
    OwnServer::redis_on(
        port,
        &[
            "--port",
            "0",
            "--tls-port",
            &port.to_string(),
            "--tls-cert-file",
            &pki.arg("server.crt"),
            "--tls-key-file",
            &pki.arg("server.key"),
            "--tls-ca-cert-file",
            &pki.arg("ca.crt"),
            "--tls-auth-clients",
            "yes",
            "--user",
            "default",
            "off",
            "--user",
            REDIS_USER,
            "on",
            &acl,
            "~*",
            "&*",
            "+@all",
        ],
    )
    .await
}

fn redis_tls_config(db: &str, redis: &OwnServer, pki: &Pki, password: &str) -> Config {
    let url = format!("rediss://{REDIS_USER}:{password}@127.0.0.1:{}/", redis.port);
    let mut c = common::config(db, Some(&url), "tls");
    c.redis_tls_ca = Some(pki.path("ca.crt"));
    c.redis_tls_cert = Some(pki.path("client.crt"));
    c.redis_tls_key = Some(pki.path("client.key"));
    c.cache.bloom_mode = BloomMode::Strict;
    c.cache.bloom_expected = 10_000;
    c.cache.bloom_fpp = 0.01;
    c.cache.redis_timeout_ms = 500;
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn values_leases_the_doorbell_and_strict_mode_work_over_tls() {
    const PASSWORD: &str = "Acl-Tls-9b1e";
    let pki = Pki::new();
    let redis = tls_redis(&pki, PASSWORD).await;
    let dir = tempfile::tempdir().unwrap();
    let db = common::sqlite_url(&dir);
    let config = redis_tls_config(&db, &redis, &pki, PASSWORD);
    let a = TestServer::start(config.clone(), 100).await;
    let b = TestServer::start(config.clone(), 100).await;

    // Values and leases: A's miss loads SQL and fills Redis under its
    // lease; B reads the value from Redis, not SQL.
    assert_eq!(a.get("/api/seckill/5").await.0, 200);
    let (status, body) = b.get("/api/seckill/5").await;
    assert_eq!(status, 200, "{body}");
    let (sa, sb) = (a.stats().await, b.stats().await);
    assert_eq!(counter(&sa, &["redis", "keys_written"]), 1, "{sa}");
    assert_eq!(counter(&sb, &["redis", "hits"]), 1, "{sb}");
    assert_eq!(counter(&sb, &["sql", "found"]), 0, "{sb}");

    // The doorbell: a create through A rings B, whose outbox follower
    // reads it; strict mode never lets B refuse it meanwhile.
    assert_eq!(a.create(5000, "rung").await, 201);
    for _ in 0..50 {
        assert_eq!(b.get("/api/seckill/5000").await.0, 200, "never 404");
    }
    eventually(5, "B hears the ring", || async {
        counter(&b.stats().await, &["changes", "applied"]) >= 1
    })
    .await;
    assert!(counter(&a.stats().await, &["changes", "published"]) >= 1);

    // Strict mode: B's "no" for an unknown id is confirmed in the shared
    // filter in Redis before the 404.
    assert_eq!(b.get("/api/seckill/900000").await.0, 404);
    let sb = b.stats().await;
    assert!(counter(&sb, &["shared", "checks"]) >= 1, "{sb}");
    for s in [&a.stats().await, &sb] {
        assert_eq!(counter(s, &["shared", "errors"]), 0, "{s}");
        assert_eq!(counter(s, &["redis", "errors"]), 0, "{s}");
        assert_eq!(counter(s, &["changes", "publish_failures"]), 0, "{s}");
    }
    a.stop().await;
    b.stop().await;

    // What fails, fails at start with the key named and no password:
    // plain TCP to a TLS-only port, another CA, no client certificate.
    let plain = Config {
        redis_url: config
            .redis_url
            .as_ref()
            .map(|u| u.replace("rediss://", "redis://")),
        redis_tls_ca: None,
        redis_tls_cert: None,
        redis_tls_key: None,
        ..config.clone()
    };
    let other_ca = Config {
        redis_tls_ca: Some(pki.path("other_ca.crt")),
        ..config.clone()
    };
    let no_client_cert = Config {
        redis_tls_cert: None,
        redis_tls_key: None,
        ..config.clone()
    };
    for (what, c) in [
        ("plain", plain),
        ("other CA", other_ca),
        ("no client certificate", no_client_cert),
    ] {
        let e = tokio::time::timeout(Duration::from_secs(20), start_error(&c))
            .await
            .unwrap_or_else(|_| panic!("{what}: start-up hung"));
        assert!(e.starts_with("redis_url: cannot connect: "), "{what}: {e}");
        assert!(!e.contains(PASSWORD), "{what}: {e}");
        if what == "other CA" {
            assert!(e.contains("redis_tls_ca"), "{what}: {e}");
        }
        if what == "plain" && e.contains("reset by peer") {
            assert!(e.contains("use rediss://"), "{what}: {e}");
        }
        // A server asking for a client certificate is not a CA problem:
        // where the error speaks of certificates, the hint names the
        // client certificate's keys.
        if what == "no client certificate" && e.to_ascii_lowercase().contains("certificate") {
            assert!(e.contains("redis_tls_cert"), "{what}: {e}");
        }
        eprintln!("{what}: {e}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tls_cluster_passes_a_create_read_rebuild_round() {
    let pki = Pki::new();
    let (crt, key, ca) = (
        pki.arg("server.crt"),
        pki.arg("server.key"),
        pki.arg("ca.crt"),
    );
    let cluster = OwnCluster::start_with(
        &[
            "--port",
            "0",
            "--tls-port",
            "{port}",
            "--tls-cluster",
            "yes",
            "--tls-cert-file",
            &crt,
            "--tls-key-file",
            &key,
            "--tls-ca-cert-file",
            &ca,
            "--tls-auth-clients",
            "no",
        ],
        &["--tls", "--cacert", &ca],
        "rediss",
    )
    .await;
    let dir = tempfile::tempdir().unwrap();
    let mut c = common::config(&common::sqlite_url(&dir), None, "tlscluster");
    c.redis_cluster = cluster.urls();
    c.redis_tls_ca = Some(pki.path("ca.crt"));
    c.cache.bloom_mode = BloomMode::Strict;
    c.cache.bloom_expected = 10_000;
    c.cache.bloom_fpp = 0.01;
    c.cache.bloom_segment_bytes = 2048;
    c.cache.redis_timeout_ms = 500;
    let other_ca = Config {
        redis_tls_ca: Some(pki.path("other_ca.crt")),
        ..c.clone()
    };
    let s = TestServer::start(c, 100).await;
    assert_eq!(s.create(777, "clustered").await, 201);
    assert_eq!(s.get("/api/seckill/777").await.0, 200);
    let (status, body) = s.warm(r#"{"limit":1000,"rebuild_bloom":true}"#).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(s.get("/api/seckill/777").await.0, 200);
    assert_eq!(s.get("/api/seckill/42").await.0, 200);
    assert_eq!(s.get("/api/seckill/900000").await.0, 404);
    let st = s.stats().await;
    assert!(counter(&st, &["redis", "keys_written"]) >= 101, "{st}");
    assert_eq!(counter(&st, &["redis", "errors"]), 0, "{st}");
    assert_eq!(counter(&st, &["shared", "errors"]), 0, "{st}");
    let keys: u64 = (0..3).map(|i| cluster.keys_on(i)).sum();
    assert!(
        keys > 100,
        "the warm's values are on the nodes ({keys} keys)"
    );
    s.stop().await;
    // The nodes' certificates checked against another CA: refused at
    // start, naming the key and the CA's setting.
    let e = tokio::time::timeout(Duration::from_secs(20), start_error(&other_ca))
        .await
        .expect("start-up hung");
    assert!(e.starts_with("redis_cluster: cannot connect: "), "{e}");
    assert!(e.contains("redis_tls_ca"), "{e}");
}

/// Every log line of this test binary, at every level.
fn captured_logs() -> Arc<Mutex<Vec<u8>>> {
    static LOGS: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();
    LOGS.get_or_init(|| {
        let logs = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&logs);
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::TRACE)
            .with_ansi(false)
            .with_writer(move || Sink(Arc::clone(&sink)))
            .finish();
        tracing::subscriber::set_global_default(subscriber).expect("one subscriber");
        logs
    })
    .clone()
}

struct Sink(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Sink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn no_password_reaches_a_log_an_error_the_stats_metrics_or_the_dashboard() {
    const DB_PASSWORD: &str = "Db-Secret-5c7d20";
    const REDIS_PASSWORD: &str = "Redis-Secret-8e41f3";
    let logs = captured_logs();
    let pki = Pki::new();
    let db = tls_mariadb(&pki).await;
    let admin = format!("mysql://root@127.0.0.1:{}/test?ssl-mode=REQUIRED", db.port);
    let pool = sqlx::AnyPool::connect(&admin).await.unwrap();
    for stmt in [
        format!("CREATE USER 'app'@'%' IDENTIFIED BY '{DB_PASSWORD}'"),
        "GRANT ALL ON test.* TO 'app'@'%'".into(),
    ] {
        sqlx::query(&stmt).execute(&pool).await.unwrap();
    }
    pool.close().await;
    // The test's own CREATE USER above is logged (sqlx traces statements):
    // what counts is everything from here on.
    let mark = logs.lock().unwrap().len();
    let redis = tls_redis(&pki, REDIS_PASSWORD).await;
    let db_url = format!(
        "mysql://app:{DB_PASSWORD}@127.0.0.1:{}/test?ssl-mode=VERIFY_IDENTITY&ssl-ca={}",
        db.port,
        pki.arg("ca.crt")
    );
    // Both URLs from files, as mounted secrets are.
    let secrets = tempfile::tempdir().unwrap();
    let (db_file, redis_file) = (secrets.path().join("db"), secrets.path().join("redis"));
    std::fs::write(&db_file, format!("{db_url}\n")).unwrap();
    let redis_url = format!(
        "rediss://{REDIS_USER}:{REDIS_PASSWORD}@127.0.0.1:{}/",
        redis.port
    );
    std::fs::write(&redis_file, &redis_url).unwrap();
    let toml = secrets.path().join("bloomgate.toml");
    std::fs::write(
        &toml,
        format!(
            "database_url_file = {:?}\nredis_url_file = {:?}\nredis_tls_ca = {:?}\nredis_tls_cert = {:?}\nredis_tls_key = {:?}\nlisten = \"127.0.0.1:0\"\n[cache]\nredis_prefix = \"bgtest:tlsleak:\"\nbloom_mode = \"strict\"\nbloom_expected = 10000\nredis_timeout_ms = 500\n",
            db_file,
            redis_file,
            pki.path("ca.crt"),
            pki.path("client.crt"),
            pki.path("client.key"),
        ),
    )
    .unwrap();
    let config = Config::load_from(Some(&toml), std::iter::empty()).unwrap();
    assert_eq!(config.database_url, db_url, "read from the file, trimmed");
    assert_eq!(config.redis_url.as_deref(), Some(redis_url.as_str()));

    let s = TestServer::start(config.clone(), 100).await;
    let mut seen = Vec::new();
    assert_eq!(s.create(31337, "secretive").await, 201);
    for path in ["/api/seckill/5", "/api/seckill/5", "/api/seckill/31337"] {
        assert_eq!(s.get(path).await.0, 200);
    }
    assert_eq!(s.get("/api/seckill/900000").await.0, 404);
    let (status, body) = s.warm(r#"{"limit":100,"rebuild_bloom":true}"#).await;
    assert_eq!(status, 200, "{body}");
    seen.push(("stats", s.stats_text().await));
    seen.push(("metrics", s.metrics_text().await));
    let page = s.client.get(s.url("/dashboard")).send().await.unwrap();
    assert_eq!(page.status(), 200);
    seen.push(("dashboard", page.text().await.unwrap()));
    s.stop().await;

    // Errors: the same URLs against servers that are gone or refuse.
    let closed = common::free_port();
    let wrong_db = Config {
        database_url: db_url.replace(&db.port.to_string(), &closed.to_string()),
        ..config.clone()
    };
    let wrong_redis = Config {
        redis_url: Some(redis_url.replace(&redis.port.to_string(), &closed.to_string())),
        ..config.clone()
    };
    // A wrong password is refused by the server: its error (WRONGPASS,
    // Access denied) must not quote the password either.
    let bad_redis_password = Config {
        redis_url: Some(redis_url.replace(REDIS_PASSWORD, "Wrong-Redis-Secret-1")),
        ..config.clone()
    };
    let bad_db_password = Config {
        database_url: db_url.replace(DB_PASSWORD, "Wrong-Db-Secret-1"),
        ..config.clone()
    };
    for c in [&bad_redis_password, &bad_db_password] {
        let e = AppState::connect(c).await.expect_err("refused");
        let text = format!("{e} / {e:?}");
        assert!(!text.contains("Wrong-"), "{text}");
        seen.push(("wrong-password error", text));
    }
    seen.push(("config debug", format!("{config:?}")));
    for c in [&wrong_db, &wrong_redis] {
        let e = AppState::connect(c).await.expect_err("refused");
        seen.push(("start error", format!("{e} / {e:?}")));
    }
    seen.push((
        "log lines",
        String::from_utf8_lossy(&logs.lock().unwrap()[mark..]).into_owned(),
    ));
    assert!(
        seen[seen.len() - 1].1.contains("catalogue seeded"),
        "the log was captured"
    );
    for (what, text) in &seen {
        assert!(!text.is_empty(), "{what} is empty");
        for password in [DB_PASSWORD, REDIS_PASSWORD] {
            assert!(
                !text.contains(password),
                "{what} holds a password: …{}…",
                &text[text.find(password).unwrap().saturating_sub(80)..]
                    [..160.min(text.len() - text.find(password).unwrap().saturating_sub(80))]
            );
        }
    }
}

/// A Redis whose certificate another CA signed, or that names another
/// host, is refused: the service never speaks to it (the TLS tests above
/// only ever gave the right CA).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_certificate_from_another_ca_or_host_is_refused() {
    const PASSWORD: &str = "Acl-Tls-5c2d";
    let pki = Pki::new();
    let redis = tls_redis(&pki, PASSWORD).await;
    let dir = tempfile::tempdir().unwrap();
    let db = common::sqlite_url(&dir);
    let mut other_ca = redis_tls_config(&db, &redis, &pki, PASSWORD);
    other_ca.redis_tls_ca = Some(pki.path("other_ca.crt"));
    let e = start_error(&other_ca).await;
    assert!(e.starts_with("redis_url: cannot connect: "), "{e}");
    assert!(
        e.contains("UnknownIssuer") && e.contains("check redis_tls_ca"),
        "{e}"
    );
    let mut other_host = redis_tls_config(&db, &redis, &pki, PASSWORD);
    other_host.redis_url = other_host
        .redis_url
        .map(|u| u.replace("127.0.0.1", "localhost"));
    let e = start_error(&other_host).await;
    assert!(e.contains("not valid for name \"localhost\""), "{e}");
    // The right CA and host start (the control).
    let ok = redis_tls_config(&db, &redis, &pki, PASSWORD);
    AppState::connect(&ok)
        .await
        .expect("the test CA and 127.0.0.1");
}
